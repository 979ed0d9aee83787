"""Runs recorded on the status branch: the durable record of what has run. I/O (file system).

Ray forgets every job when its head restarts without GCS fault tolerance; the status branch
does not. Each task document lists its runs (submission id, spec hash, status); these become
``ActualState.recorded_runs``, which the planner treats as runs (never resubmitted) and which
are ``LOST`` when they were still running when Ray forgot them.

Nothing recorded is trusted for a path: a recorded run's id must be one argus derives for the
document's own task, and its checkpoint is looked up again in the run folder derived from the
id, under the path policy (:func:`reconciler.observe.jobs.checkpoint_of`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reconciler.observe.jobs import checkpoint_of
from reconciler.observe.sightings import RunRecord, parse_time
from reconciler.plan.actual import PREEMPTED, ActualJob
from reconciler.spec.hashing import parse_submission_id
from reconciler.spec.types import ObjectKey, Paths


def recorded_runs(
    docs: Mapping[str, Mapping[str, Any]],
    paths: Paths | None,
    *,
    skip: frozenset[str] | set[str] = frozenset(),
    memo: dict[str, str | None] | None = None,
) -> list[ActualJob]:
    """Return every run recorded in the task documents ``docs`` (status-branch path -> document).

    ``skip``: submission ids Ray still knows (their record adds nothing). ``memo`` caches the
    checkpoint lookups of SUCCEEDED runs by submission id (a finished run's folder is final).
    Malformed entries are ignored.
    """
    out: list[ActualJob] = []
    for path, doc in docs.items():
        parts = path.split("/")
        if len(parts) != 4 or parts[0] != "users" or parts[2] != "tasks" or not parts[3].endswith(".yaml"):
            continue
        user, task = parts[1], parts[3].removesuffix(".yaml")
        runs = doc.get("runs") if isinstance(doc, Mapping) else None
        for run in runs if isinstance(runs, list) else []:
            if not isinstance(run, Mapping):
                continue
            sid, status = run.get("submission_id"), run.get("status")
            if not isinstance(sid, str) or not isinstance(status, str) or sid in skip:
                continue
            parsed = parse_submission_id(sid)
            if parsed is None or parsed[:2] != (user, task):
                continue  # not an id argus derives for this task: a hand-edited record
            spec_hash = run.get("spec_hash")
            checkpoint = None
            if status == "SUCCEEDED" and paths is not None:
                if memo is not None and sid in memo:
                    checkpoint = memo[sid]
                else:
                    checkpoint = checkpoint_of(paths, user, task, sid)
                    if memo is not None:
                        memo[sid] = checkpoint
            out.append(
                ActualJob(
                    submission_id=sid,
                    key=ObjectKey(user, "task", task),
                    spec_hash=spec_hash if isinstance(spec_hash, str) else "",
                    status=status,
                    message=str(run.get("message") or ""),
                    hf_checkpoint=checkpoint,
                )
            )
    return out


def preemptions(docs: Mapping[str, Mapping[str, Any]]) -> tuple[frozenset[str], dict[ObjectKey, ObjectKey]]:
    """What the status branch recorded about preemption: the submission ids of preempted
    attempts, and which object each preempted object was preempted for. Entries that do not
    belong to their document's own object are ignored. A record only ever makes argus *resume*
    a run Ray reports STOPPED (never re-run one Ray reports finished) and order the queue."""
    sids: set[str] = set()
    by: dict[ObjectKey, ObjectKey] = {}
    for path, doc in docs.items():
        parts = path.split("/")
        if not isinstance(doc, Mapping) or len(parts) != 4 or parts[0] != "users" or not parts[3].endswith(".yaml"):
            continue
        user, kinds, name = parts[1], parts[2], parts[3].removesuffix(".yaml")
        runs = doc.get("runs") if kinds == "tasks" else None
        for run in runs if isinstance(runs, list) else []:
            sid = run.get("submission_id") if isinstance(run, Mapping) else None
            parsed = parse_submission_id(sid) if isinstance(sid, str) else None
            if parsed is not None and parsed[:2] == (user, name) and run.get("status") == PREEMPTED:
                sids.add(str(sid))
        preemptor = doc.get("preempted_by")
        if isinstance(preemptor, str) and kinds in ("models", "tasks"):
            try:
                by[ObjectKey(user, "model" if kinds == "models" else "task", name)] = ObjectKey.parse(preemptor)
            except ValueError:
                continue
    return frozenset(sids), by


def recorded_times(docs: Mapping[str, Mapping[str, Any]]) -> dict[str, RunRecord]:
    """What the task documents ``docs`` recorded of each run's life by the daemon's own clock
    (submitted, first seen running, first seen ended) and its final status, by submission id:
    what a restarted daemon bounds Ray's job records with (:mod:`reconciler.observe.sightings`).
    Entries that are not the document's own task's runs, or carry none of these times, are left out."""
    out: dict[str, RunRecord] = {}
    for path, doc in docs.items():
        parts = path.split("/")
        if len(parts) != 4 or parts[0] != "users" or parts[2] != "tasks" or not parts[3].endswith(".yaml"):
            continue
        user, task = parts[1], parts[3].removesuffix(".yaml")
        runs = doc.get("runs") if isinstance(doc, Mapping) else None
        for run in runs if isinstance(runs, list) else []:
            sid = run.get("submission_id") if isinstance(run, Mapping) else None
            parsed = parse_submission_id(sid) if isinstance(sid, str) else None
            if parsed is None or parsed[:2] != (user, task):
                continue
            submitted, running, ended = (parse_time(run.get(f)) for f in ("submitted_at", "seen_running", "seen_ended"))
            if submitted is None and running is None and ended is None:
                continue
            status = run.get("status")
            out[str(sid)] = RunRecord(
                submitted,
                running,
                ended,
                status=status if isinstance(status, str) else None,
                end_time=parse_time(run.get("end_time")),
            )
    return out
