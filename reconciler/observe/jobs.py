"""Observe argus's Ray Jobs through the Jobs REST API. I/O.

A job is argus's only when its ``argus-proof`` label verifies under the daemon's ownership
key (:func:`~reconciler.builders.jobs.proof_valid`). Every other job that claims to be argus's
(its labels or its ``argus--`` id) is *foreign*: reported, never adopted, never a run of any
task. The run folder, where a run's checkpoint is looked for, is derived from the proven
submission id and re-checked against the path policy; the labels are never trusted for it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from reconciler.builders.jobs import (
    CHECKPOINT_TRACKER,
    LABEL_RESOURCES,
    LABEL_RESUMED_FROM,
    LABEL_REVISION,
    LABEL_SPEC,
    LABEL_SPEC_HASH,
    LABEL_TASK,
    LABEL_USER,
    MANAGED_BY,
    MANAGER,
    checkpoint_dir,
    proof_valid,
    run_folder,
)
from reconciler.dashboard import Dashboard
from reconciler.logs.tail import job_tail
from reconciler.plan.actual import ActualJob
from reconciler.source.localfs import LocalFS
from reconciler.spec.hashing import SEPARATOR, SUBMISSION_PREFIX, parse_submission_id
from reconciler.spec.paths import PathError, resolve_path
from reconciler.spec.types import ObjectKey, Paths, TaskSpec

# Attempts of one run whose folders a checkpoint lookup scans (each is a preemption: few).
MAX_ATTEMPTS = 16

# Files that make a folder loadable by `from_pretrained` (one is enough, besides config.json).
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
_WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
_GLOBAL_STEP = re.compile(r"global_step_(\d+)")
# verl keeps optimizer shards next to the HF folder; nothing worth finding is deeper.
_MAX_DEPTH = 6
# A run folder is the job's to fill: past this many entries the scan stops (what it found stands).
_MAX_ENTRIES = 20_000
# A status document's log tail: enough for the error, never the whole log.
TAIL_BYTES = 64 * 1024
_ENTRYPOINT_FIELDS = (("entrypoint_num_cpus", "CPU"), ("entrypoint_num_gpus", "GPU"), ("entrypoint_memory", "memory"))
# A checkpoint tracker holds one step number: more than this is not one, and is not read further.
_TRACKER_BYTES = 32
_MAX_STEP = 10**12


@dataclass(frozen=True)
class ForeignJob:
    """A Ray job that claims to be argus's (labels or id) without a valid ownership proof."""

    submission_id: str
    claims: str  # what its labels claim, e.g. "alice/tasks/train" ("" when nothing)
    status: str


@dataclass(frozen=True)
class JobsObservation:
    owned: list[ActualJob]
    foreign: list[ForeignJob]


def observe_jobs(dash: Dashboard, ownership_key: bytes, paths: Paths | None = None) -> list[ActualJob]:
    """Return every Ray Job argus can prove it submitted (all states), sorted by submission id.

    See :func:`observe_job_records`. Raises RayUnavailable / DashboardError from the client.
    """
    return observe_job_records(dash, ownership_key, paths).owned


def observe_job_records(
    dash: Dashboard,
    ownership_key: bytes,
    paths: Paths | None = None,
    memo: dict[str, str | None] | None = None,
) -> JobsObservation:
    """Return argus's jobs (proof valid under ``ownership_key``) and the foreign ones claiming to be.

    ``hf_checkpoint`` is filled for SUCCEEDED owned jobs from a scan of the run folder derived
    from ``paths`` (None: no scan), kept only when it passes the path policy for the job's user.
    ``memo`` (kept by a long-running caller) caches that lookup by submission id: SUCCEEDED is
    final, so the folder is scanned once, not on every tick.
    Raises RayUnavailable / DashboardError from the client.
    """
    data = dash.get("/api/jobs/")
    jobs = data if isinstance(data, list) else []
    owned: list[ActualJob] = []
    foreign: list[ForeignJob] = []
    for info in jobs:
        if not isinstance(info, Mapping):
            continue
        job = _to_actual(info, ownership_key, paths, memo)
        if job is not None:
            owned.append(job)
            continue
        sid = str(info.get("submission_id") or "")
        raw_meta = info.get("metadata")
        meta: Mapping[str, Any] = raw_meta if isinstance(raw_meta, Mapping) else {}
        if sid.startswith(SUBMISSION_PREFIX) or meta.get(MANAGED_BY) == MANAGER:
            user, task = meta.get(LABEL_USER), meta.get(LABEL_TASK)
            claims = f"{user}/tasks/{task}" if user and task else ""
            foreign.append(ForeignJob(sid, claims, str(info.get("status", ""))))
    return JobsObservation(sorted(owned, key=lambda j: j.submission_id), sorted(foreign, key=lambda j: j.submission_id))


def _to_actual(
    info: Mapping[str, Any], ownership_key: bytes, paths: Paths | None, memo: dict[str, str | None] | None
) -> ActualJob | None:
    """One ``JobDetails`` entry as an :class:`ActualJob`, or None when argus cannot prove it owns it."""
    meta = info.get("metadata") or {}
    sid = info.get("submission_id")
    if not isinstance(meta, Mapping) or not isinstance(sid, str) or meta.get(MANAGED_BY) != MANAGER:
        return None
    if not proof_valid(ownership_key, sid, info):
        return None
    user, task = str(meta[LABEL_USER]), str(meta[LABEL_TASK])
    status = str(info.get("status", "PENDING"))
    # The newest checkpoint of a running run, read afresh each observation: one small file per
    # running task (the cluster's GPUs bound how many run), never a walk of the run folder.
    step = run_checkpoint_step(paths, user, task, sid) if status == "RUNNING" and paths is not None else None
    checkpoint = None
    if status == "SUCCEEDED" and paths is not None:
        if memo is not None and sid in memo:
            checkpoint = memo[sid]
        else:
            checkpoint = checkpoint_of(paths, user, task, sid)
            if memo is not None:
                memo[sid] = checkpoint
    return ActualJob(
        submission_id=sid,
        key=ObjectKey(user, "task", task),
        spec_hash=str(meta.get(LABEL_SPEC_HASH, "")),
        status=status,
        message=str(info.get("message") or ""),
        resources=job_resources(info),
        hf_checkpoint=checkpoint,
        start_time=info.get("start_time") or None,
        end_time=info.get("end_time") or None,
        revision=meta.get(LABEL_REVISION) or None,
        spec=_recorded_spec(meta.get(LABEL_SPEC)),
        checkpoint_step=step,
        resumed_from_step=_step_label(meta.get(LABEL_RESUMED_FROM)),
    )


def _step_label(value: object) -> int | None:
    """The ``argus-resumed-from`` label as a step (None: absent or not a step). The proof covers it."""
    if isinstance(value, str) and value.isdigit() and len(value) <= 12:
        return int(value)
    return None


def checkpoint_step(paths: Paths, user: str, task: str, sid: str) -> int | None:
    """The step of the newest checkpoint in the checkpoints folder of run ``sid`` alone (its
    ``latest_checkpointed_iteration.txt``, verl's tracker, which a command task writes alike), or
    None when there is none or it cannot be trusted.

    A bounded read: one file of at most a few bytes, opened without following a link, and only when
    the checkpoints folder's real path stays in the user's real home (a job may plant links)."""
    folder = checkpoint_dir(run_folder(paths.users, user, task, sid))
    home = os.path.realpath(os.path.join(paths.users, user))
    real = os.path.realpath(folder)
    if os.path.commonpath([real, home]) != home:
        return None
    try:
        fd = os.open(os.path.join(real, CHECKPOINT_TRACKER), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None  # a FIFO or device a job put there: never read
        raw = os.read(fd, _TRACKER_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    text = raw.decode("ascii", "replace").strip()
    if len(raw) > _TRACKER_BYTES or not text.isdigit() or int(text) >= _MAX_STEP:
        return None
    return int(text)


def run_checkpoint_step(paths: Paths, user: str, task: str, sid: str) -> int | None:
    """The step of the newest checkpoint of the run that attempt ``sid`` belongs to: its own
    folder's, else the earlier attempts' (newest attempt first; at most MAX_ATTEMPTS reads). A
    resumed verl attempt saves into its run's first attempt's folder, and a command attempt that has
    not saved yet stands at the checkpoint it resumed from."""
    for attempt in _attempts_back(sid):
        found = checkpoint_step(paths, user, task, attempt)
        if found is not None:
            return found
    return None


def resume_point(
    paths: Paths, task: TaskSpec, resume_from: str | None, first_attempt: str | None
) -> tuple[str | None, int | None]:
    """Where an attempt resuming the preempted attempt ``resume_from`` resumes: ``(attempt, step)``.

    A verl task resumes in the run's first attempt's folder (verl saves every attempt there): that
    attempt and its newest checkpoint step. A command task resumes from an attempt's own folder (its
    ``ARGUS_RESUME_DIR``): the newest attempt from ``resume_from`` back that left a checkpoint tracker,
    so an attempt preempted before its first save does not hide the one before it; ``resume_from``
    itself when none did (a command that keeps checkpoints its own way still finds its last folder).
    The step is None when there is no checkpoint (or no ``resume_from``)."""
    if not resume_from:
        return None, None
    user, name = task.key.user, task.key.name
    if task.workload != "command":
        root = first_attempt or resume_from
        return root, checkpoint_step(paths, user, name, root)
    for sid in _attempts_back(resume_from):
        step = checkpoint_step(paths, user, name, sid)
        if step is not None:
            return sid, step
    return resume_from, None


def _attempts_back(sid: str) -> list[str]:
    """``sid`` and the earlier attempts of its run, newest first (at most MAX_ATTEMPTS)."""
    parsed = parse_submission_id(sid)
    if parsed is None or not 1 < parsed[3] <= MAX_ATTEMPTS:
        return [sid]
    base = sid.rsplit(SEPARATOR, 1)[0]
    return [sid, *(base if n == 1 else f"{base}{SEPARATOR}{n}" for n in range(parsed[3] - 1, 0, -1))]


def checkpoint_of(paths: Paths, user: str, task: str, sid: str) -> str | None:
    """The newest HF checkpoint in the run folder of ``sid``, when it passes ``user``'s path policy.

    A checkpoint whose real path leaves the user's home (a symlink the job made) is not served.
    A run folder that is itself a symlink, or whose real path is outside the user's real home,
    is not scanned at all (None): a job could point it at ``/`` or at other users' homes.
    """
    found = _checkpoint_in(paths, user, task, sid)
    parsed = parse_submission_id(sid)
    if found is None and parsed is not None and 1 < parsed[3] <= MAX_ATTEMPTS:
        # A resumed verl attempt saves into its run's first attempt's folder (builders.jobs.job_submission).
        base = sid.rsplit(SEPARATOR, 1)[0]
        for attempt in range(parsed[3] - 1, 0, -1):
            found = _checkpoint_in(paths, user, task, base if attempt == 1 else f"{base}{SEPARATOR}{attempt}")
            if found is not None:
                break
    if found is None:
        return None
    try:
        return resolve_path(found, user, paths, LocalFS())
    except PathError:
        return None


def _checkpoint_in(paths: Paths, user: str, task: str, sid: str) -> str | None:
    """The newest HF checkpoint folder in the run folder of ``sid`` (unresolved), or None when
    the folder is a symlink or leaves the user's real home."""
    folder = run_folder(paths.users, user, task, sid)
    home = os.path.realpath(os.path.join(paths.users, user))
    real = os.path.realpath(folder)
    if os.path.islink(folder) or os.path.commonpath([real, home]) != home:
        return None
    return find_hf_checkpoint(folder)


def _recorded_spec(text: object) -> dict[str, Any] | None:
    """The task spec a run was submitted with (``argus-spec``), for field-level diffs; None
    when absent or unreadable (older runs): a diff is a courtesy, never a reason to fail."""
    if not isinstance(text, str):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def job_resources(info: Mapping[str, Any]) -> dict[str, float]:
    """Resources a job holds while active, in the shape of ``plan.demand.task_resources``.

    Read from the ``argus-resources`` label written at submission: Ray 2.60's job listing
    does not return the entrypoint resources, and a verl driver takes no GPUs itself (its
    workers claim them) although the task uses them. Entrypoint fields, where a Ray
    version reports them, are the fallback.
    """
    meta = info.get("metadata")
    try:
        labelled = json.loads((meta if isinstance(meta, Mapping) else {}).get(LABEL_RESOURCES) or "{}")
    except (TypeError, ValueError):
        labelled = None
    if isinstance(labelled, dict) and labelled:
        return {str(k): _number(v) for k, v in labelled.items() if _number(v)}
    # Values of an unexpected type count 0 (unknown): one odd job must not fail the observation.
    raw = info.get("entrypoint_resources")
    out: dict[str, float] = {str(k): _number(v) for k, v in (raw if isinstance(raw, Mapping) else {}).items()}
    for field, name in _ENTRYPOINT_FIELDS:
        value = _number(info.get(field))
        if value:
            out[name] = out.get(name, 0.0) + value
    return out


def _number(value: object) -> float:
    """``value`` as a float when it is a finite number, else 0.0 (unknown)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return 0.0


def job_log_tail(dash: Dashboard, submission_id: str, lines: int = 50) -> list[str]:
    """Return the last ``lines`` lines of a job's driver log ([] when there are none), at most
    :data:`TAIL_BYTES` of them, read through Ray's bounded state API (never the whole log).

    Raises DashboardError (404 for an unknown job) / RayUnavailable from the client.
    """
    if lines <= 0:
        return []
    tail = job_tail(dash, submission_id, lines=lines, limit_bytes=TAIL_BYTES)
    return tail.text.splitlines()[-lines:]


def find_hf_checkpoint(run_dir: str) -> str | None:
    """Return the newest Hugging Face model folder under ``run_dir``, or None.

    A HF folder holds ``config.json`` plus weights (``*.safetensors``/``*.bin`` or an
    index). verl writes ``checkpoints/global_step_N/actor/huggingface`` (PPO/GRPO) or
    ``checkpoints/global_step_N/huggingface`` (SFT); a command task may write any folder.
    Newest = highest ``global_step_N`` in the path, then latest modification time.
    """
    best: tuple[int, float, str] | None = None
    for folder, files in _walk(run_dir):
        if "config.json" not in files or not _has_weights(files):
            continue
        steps = [int(m) for m in _GLOBAL_STEP.findall(folder)]
        rank = (steps[-1] if steps else -1, _mtime(folder, files), folder)
        if best is None or rank > best:
            best = rank
    return os.path.abspath(best[2]) if best else None


def _walk(root: str) -> Iterator[tuple[str, set[str]]]:
    """Yield ``(folder, file names)`` under ``root`` down to ``_MAX_DEPTH`` levels and about
    ``_MAX_ENTRIES`` entries in all. Links below ``root`` are not followed (``os.walk``'s default)."""
    if not os.path.isdir(root):
        return
    base_depth = root.rstrip(os.sep).count(os.sep)
    seen = 0
    for folder, dirs, files in os.walk(root, onerror=lambda _e: None):
        seen += len(dirs) + len(files)
        if folder.count(os.sep) - base_depth >= _MAX_DEPTH or seen >= _MAX_ENTRIES:
            dirs[:] = []
        # Hidden folders (.cache, .staging) are scratch space, never a finished model.
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        yield folder, set(files)
        if seen >= _MAX_ENTRIES:
            return


def _has_weights(files: set[str]) -> bool:
    return any(f in files for f in _WEIGHT_INDEXES) or any(
        f.endswith(_WEIGHT_SUFFIXES) and not f.startswith(("optim", "extra", "data_")) for f in files
    )


def _mtime(folder: str, files: set[str]) -> float:
    """Latest modification time of the folder's files (0 when unreadable)."""
    times = []
    for name in files:
        with contextlib.suppress(OSError):  # a file removed meanwhile (checkpoint rotation)
            times.append(os.path.getmtime(os.path.join(folder, name)))
    return max(times, default=0.0)
