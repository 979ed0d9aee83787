"""One tick = load -> observe -> plan -> apply -> assess.

The tick is a straight line (Flux's kustomize-controller): fetch the source, build the
desired state, observe Ray, plan (pure), apply (stops, one Serve PUT, submissions), assess
health and sync. Nothing is stored outside git and Ray: a restarted daemon rebuilds
everything from the repository, the status branch's run records, Ray's proven jobs and app names.

Exactly once: before a tick submits, the runs it is about to submit are recorded on the status
branch (``record_runs``); a run recorded there is never submitted again, even when Ray forgets it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from reconciler import faults
from reconciler.apply.jobs import stop_job, submit_job
from reconciler.apply.ownership import load_or_create_key
from reconciler.apply.serve import apply_serve
from reconciler.backoff import Backoff
from reconciler.builders.jobs import job_submission
from reconciler.builders.serve import app_name, model_app_config
from reconciler.contain import culprits, raises
from reconciler.dashboard import Dashboard
from reconciler.errors import ApplyDeferred, ArgusError, Issue, PermanentError, RayUnavailable, TemporaryError
from reconciler.fscache import CachedFS
from reconciler.observe.capacity import observe_capacity
from reconciler.observe.jobs import ForeignJob, observe_job_records
from reconciler.observe.probe import ModelProber
from reconciler.observe.records import StatusRecords
from reconciler.observe.serve import ServeObservation, observe_serve
from reconciler.plan.actions import ActionType, Plan
from reconciler.plan.actual import FINAL_JOB_STATES, PREEMPTED, ActualJob, ActualState, Capacity
from reconciler.plan.assess import ObjectStatus, assess
from reconciler.plan.planner import plan as make_plan
from reconciler.source.localfs import LocalFS
from reconciler.source.remote import RepoSource
from reconciler.source.signatures import SignatureVerifier, SigningPolicy
from reconciler.spec.hashing import parse_submission_id, task_spec_hash
from reconciler.spec.incremental import IncrementalLoader
from reconciler.spec.loader import ModelCheck, ParseCache, SourceFile, TaskCheck, classify, load
from reconciler.spec.paths import FileSystem
from reconciler.spec.types import ClusterSpec, DesiredState, ObjectKey, Paths, TaskSpec
from reconciler.status.documents import first_seen_of
from reconciler.status.trust import trusted_documents

log = logging.getLogger("argus")

# Secrets reach jobs from the daemon's environment, never from git.
SECRET_ENV_NAMES = ("WANDB_API_KEY", "HF_TOKEN")
STATUS_BRANCH = "argus/status"
# (key, submission id, spec hash) of each run about to be submitted; returns whether they are
# recorded durably (False: submit nothing this tick).
RecordRuns = Callable[[list[tuple[ObjectKey, str, str]]], bool]


def default_state_dir() -> str:
    """The daemon's state folder (``<argus --cache-dir>/state``): where the ownership key lives."""
    return os.path.join(os.environ.get("ARGUS_CACHE_DIR") or os.path.expanduser("~/.cache/argus"), "state")


def default_task_check() -> TaskCheck | None:
    try:
        from reconciler.checks.verl_overrides import check_overrides, verl_available
    except ImportError:
        return None
    return check_overrides if verl_available() else None


def default_model_check() -> ModelCheck | None:
    """vLLM's engine-argument check when vLLM is installed (its table is read in a child process)."""
    from reconciler.checks.engine_args import check_engine_kwargs, vllm_available

    return check_engine_kwargs if vllm_available() else None


@dataclass
class TickResult:
    """Everything one tick learned and did (the status writers and the CLI read it)."""

    revision: str
    desired: DesiredState
    actual: ActualState
    serve: ServeObservation
    plan: Plan
    statuses: dict[ObjectKey, ObjectStatus]
    applied: set[ObjectKey] = field(default_factory=set)
    failures: dict[ObjectKey, str] = field(default_factory=dict)
    serve_put: bool = False
    notes: list[str] = field(default_factory=list)
    subject: str = ""
    commit_time: int = 0
    spec_ids: dict[str, str] = field(default_factory=dict)  # path -> blob of every object file

    def to_json(self) -> dict[str, Any]:
        return {
            "revision": self.revision,
            "plan": self.plan.to_json(),
            "errors": [i.to_json() for i in self.desired.issues],
            "failures": {str(k): v for k, v in self.failures.items()},
            "notes": self.notes,
            "objects": [s.to_json() for s in self.statuses.values()],
        }


class Reconciler:
    """Reconciles one branch of one config repository with one Ray cluster."""

    def __init__(
        self,
        source: RepoSource,
        branch: str,
        dash: Dashboard,
        *,
        fs: FileSystem | None = None,
        secrets_env: Mapping[str, str] | None = None,
        task_check: TaskCheck | None = None,
        model_check: ModelCheck | None = None,
        signing: SigningPolicy | None = None,
        state_dir: str | None = None,
        ownership_key: bytes | None = None,
        status_docs: Callable[[], Mapping[str, Mapping[str, Any]]] | None = None,
        record_runs: RecordRuns | None = None,
        serve_url: str | None = None,
    ) -> None:
        """``ownership_key`` signs and proves argus's jobs (default: ``load_or_create_key`` in
        :func:`default_state_dir`); ``status_docs`` returns the status branch's documents (the run
        records; default: read the branch); ``record_runs`` records runs before they are submitted
        (the daemon's status writer; None: not recorded ahead, as in a one-off ``argus reconcile``);
        ``serve_url``: the Serve HTTP proxy where models are asked for a real answer before they count as
        RUNNING ("": the dashboard's host at ``serving.http_port``; None: Serve's status alone)."""
        self.source = source
        self.branch = branch
        self.dash = dash
        self.fs = fs if fs is not None else CachedFS(LocalFS())
        self.secrets_env = (
            dict(secrets_env)
            if secrets_env is not None
            else {k: os.environ[k] for k in SECRET_ENV_NAMES if os.environ.get(k, "").strip()}  # empty = unset
        )
        self.task_check = task_check if task_check is not None else default_task_check()
        self.model_check = model_check if model_check is not None else default_model_check()
        self.cache = ParseCache()
        # Re-loads only the user folders a push changed (owns one entry per folder of the tree).
        self.loader = IncrementalLoader(self.cache)
        self.signing = signing or SigningPolicy()
        state_file = None
        if state_dir:
            digest = hashlib.sha256(f"{source.url}\0{branch}".encode()).hexdigest()[:16]
            state_file = os.path.join(state_dir, f"trust-{digest}.json")
        self.verifier = SignatureVerifier(source.repo, self.signing, state_file)
        self.trust_notes: list[str] = []
        self.rejections: list[str] = []
        self._put_memo: dict[str, Any] = {}
        self._subject = ""
        self._spec_ids: dict[str, str] = {}
        self._capacity_seen: tuple[float, Capacity] | None = None
        self._refused: dict[tuple[ObjectKey, str | None], str] = {}
        self.ownership_key = (
            ownership_key if ownership_key is not None else load_or_create_key(state_dir or default_state_dir())
        )
        self.state_dir = state_dir  # the daemon keeps its status anchor there (reconciler/loop.py)
        self.status_docs = status_docs or partial(
            trusted_documents, source.repo.path, STATUS_BRANCH, self.ownership_key
        )
        self.record_runs = record_runs
        self.serve_url = serve_url
        self._prober: ModelProber | None = None
        self.backoff = Backoff()
        self._retrying: dict[tuple[ObjectKey, str | None], str] = {}
        self._checkpoints: dict[str, str | None] = {}
        self.records = StatusRecords()  # the status documents' run records, by document
        self._foreign_seen: set[str] = set()
        self.foreign: list[ForeignJob] = []
        # When each object was first seen (admission order), seeded once from the status branch
        # documents and carried from tick to tick.
        self.first_seen: dict[ObjectKey, int] = {}
        self._first_seen_seeded = False
        self._seen_blob: dict[ObjectKey, str] = {}  # the file blob each first_seen was recorded at
        # Preemptions applied but not yet on the status branch (pruned once it records them).
        self._preempted_runs: set[str] = set()
        self._preempted: dict[ObjectKey, ObjectKey] = {}

    # -- load ---------------------------------------------------------------------------
    def load(self, commit: str | None = None, *, fetch: bool = True) -> tuple[DesiredState, str, int]:
        """Fetch (unless ``fetch`` is False) and read the branch head (or ``commit``).

        Raises SourceUnavailable."""
        if fetch:
            self.source.fetch()
        commit = commit or self.source.repo.resolve(f"refs/heads/{self.branch}")
        trusted = self.verifier.trusted(commit)
        snap = self.source.repo.snapshot(commit, self.cache, trusted.entries)
        signed = trusted.entries is not None
        self.rejections = [str(r) for r in trusted.rejections]
        self.trust_notes = list(trusted.notes)
        inputs: dict[str, Any] = dict(
            created=trusted.created if signed else snap.created,
            default_time=snap.commit_time,
            fs=self.fs,
            task_check=self.task_check,
            model_check=self.model_check,
            revision=commit,
            approve_prune=trusted.approve_prune if signed else snap.approve_prune,
        )
        try:
            desired = self.loader.load(snap.files, **inputs)
        except Exception:  # the loader's bug: contain it per file (the loader keeps nothing then)
            desired = self._load_contained(snap.files, partial(load, cache=self.cache, **inputs))
        if desired.cluster.security.require_signed_commits and not self.signing.required:
            self.trust_notes.append(
                "cluster.yaml's security settings are ignored: the daemon's own configuration decides "
                "(--require-signed-commits, --allowed-signers)"
            )
        self._subject = snap.subject
        self._spec_ids = {f.path: f.blob for f in snap.files if f.path.startswith("users/")}
        return desired, commit, snap.commit_time

    @staticmethod
    def _load_contained(files: list[SourceFile], loader: Callable[[list[SourceFile]], DesiredState]) -> DesiredState:
        """``loader(files)``; when it raises, the files it raises for become invalid objects
        (kept as they run, INVALID with the error) and every other file is loaded as usual.

        Raises the loader's exception only when it cannot be pinned on object files."""
        try:
            return loader(files)
        except Exception as exc:
            first = exc
        base = [f for f in files if not f.path.startswith("users/")]
        objects = [f for f in files if f.path.startswith("users/")]
        if raises(lambda: loader(base)) is not None:
            # cluster.yaml itself: nothing can be planned safely, keep everything as it runs.
            log.error("loading cluster.yaml failed", exc_info=first)
            issue = Issue("cluster.yaml", 0, f"internal error while loading: {first!r}")
            return DesiredState(cluster=ClusterSpec(), cluster_valid=False, issues=[issue])
        bad = culprits(objects, lambda sub: raises(lambda: loader(base + list(sub))) is not None)
        if not bad:
            raise first
        bad_paths = {f.path for f in bad}
        desired = loader(base + [f for f in objects if f.path not in bad_paths])
        for file in bad:
            error = raises(partial(loader, [*base, file]))
            log.error("loading %r failed", file.path, exc_info=error)
            issue = Issue(file.path, 0, f"internal error while loading: {error!r}")
            desired.issues.append(issue)
            key = _key_of(file.path)
            if key is not None:
                desired.invalid[key] = [issue]
        desired.issues.sort()
        return desired

    def refresh_fs(self) -> None:
        """Forget remembered file-system answers and capacity (the loop does it on timer ticks,
        not on pushes)."""
        refresh = getattr(self.fs, "refresh", None)
        if callable(refresh):
            refresh()
        self._capacity_seen = None

    # A push tick reuses the capacity the last timer tick observed (two dashboard calls off the
    # push path) for at most this long. Admission stays safe: Serve and Jobs are observed fresh
    # every tick, and the planner caps free capacity by total minus everything argus holds, so
    # argus's own work since then is always counted; only others' use can be this old.
    CAPACITY_MAX_AGE_S = 10.0

    def _capacity(self) -> Capacity:
        now = time.monotonic()
        seen = self._capacity_seen
        if seen is not None and now - seen[0] < self.CAPACITY_MAX_AGE_S:
            return seen[1]
        capacity = observe_capacity(self.dash)
        self._capacity_seen = (now, capacity)
        return capacity

    # -- observe ------------------------------------------------------------------------
    def _model_prober(self, http_port: int) -> ModelProber | None:
        """The prober of this Serve endpoint (one, kept between ticks: it owns the verdicts)."""
        if self.serve_url is None:
            return None
        url = self.serve_url or _serve_url_beside(self.dash.base_url, http_port)
        if self._prober is None or self._prober.serve_url != url.rstrip("/"):
            self._prober = ModelProber(url)
        return self._prober

    def observe(self, paths: Paths | None = None, http_port: int | None = None) -> tuple[ActualState, ServeObservation]:
        """Observe Serve, Jobs (argus's proven ones), capacity, and the runs the status branch
        recorded. ``paths``: the cluster's paths, to find checkpoints (None: not looked up);
        ``http_port``: Serve's port, where models Serve calls RUNNING are asked for an answer
        (None: not asked). Raises RayUnavailable (apply nothing then)."""
        serve = observe_serve(self.dash)
        prober = self._model_prober(http_port) if http_port is not None else None
        models = prober.check(serve.models, serve.apps, serve.replica_ids) if prober else dict(serve.models)
        jobs = observe_job_records(self.dash, self.ownership_key, paths, self._checkpoints)
        capacity = self._capacity()
        self.foreign = jobs.foreign
        for job in jobs.foreign:
            if job.submission_id not in self._foreign_seen:  # reported once; the status note stays
                self._foreign_seen.add(job.submission_id)
                log.warning(
                    json.dumps({"event": "foreign_job", "submission_id": job.submission_id, "claims": job.claims})
                )
        known = {j.submission_id for j in jobs.owned}
        docs = self.status_docs()
        records, recorded_sids, recorded_by = self.records.read(docs, paths, skip=known, checkpoints=self._checkpoints)
        # What this daemon preempted and the status branch does not hold yet (a report may be
        # superseded before it is written): kept here until the branch records it and Ray has
        # stopped it (until then each status write must keep saying PREEMPTED).
        stopped = {j.submission_id for j in jobs.owned if j.status in FINAL_JOB_STATES}
        self._preempted_runs -= recorded_sids & stopped
        # The preemptor is kept as long as the attempt it stopped is: a status write made while Ray
        # still reports that attempt RUNNING carries no preemptor, and the next one must have it again.
        pending = {_task_of_run(s) for s in self._preempted_runs}
        self._preempted = {k: v for k, v in self._preempted.items() if recorded_by.get(k) != v or k in pending}
        preempted_runs = recorded_sids | self._preempted_runs
        preempted_by = {**recorded_by, **self._preempted}
        # Ray reports a preempted attempt as STOPPED; the status branch knows argus stopped it to
        # resume it. Until the stop lands Ray still says RUNNING, and the run counts as running
        # (its resources are held; no second attempt starts beside it).
        owned = [
            replace(j, status=PREEMPTED) if j.status == "STOPPED" and j.submission_id in preempted_runs else j
            for j in jobs.owned
        ]
        actual = ActualState(
            models=models,
            jobs=owned,
            capacity=capacity,
            recorded_runs=records,
            foreign_ids=frozenset(j.submission_id for j in jobs.foreign),
            preempted=preempted_by,
            stopping=frozenset(j.submission_id for j in owned if j.active and j.submission_id in preempted_runs),
        )
        return actual, serve

    # -- tick ---------------------------------------------------------------------------
    def tick(self, desired: DesiredState | None = None, revision: str | None = None) -> TickResult:
        """Run one reconcile. Raises SourceUnavailable / RayUnavailable before applying anything.

        One object's failure (loading, hashing, building, applying, assessing it) is that
        object's status; every other object is planned and applied in the same tick."""
        commit_time = 0
        if desired is None:
            desired, revision, commit_time = self.load()
        actual, serve = self.observe(desired.cluster.paths, desired.cluster.serving.http_port)
        if not self._first_seen_seeded:  # a restart keeps the admission order the branch recorded
            docs = self.status_docs()
            self.first_seen = {**first_seen_of(docs), **self.first_seen}
            for doc in docs.values():
                with contextlib.suppress(ValueError, TypeError):
                    if isinstance(doc.get("spec_id"), str):
                        self._seen_blob[ObjectKey.parse(str(doc.get("object")))] = doc["spec_id"]
            self._first_seen_seeded = True
        # A request waits in line from when the daemon first saw it *as it is now*: an edited file
        # (un-suspending a placeholder, asking for more GPUs) starts over, so no user can hold a
        # place in the queue with a file that asked for nothing.
        for key in [k for k in self.first_seen if k.path in self._spec_ids]:
            if self._seen_blob.get(key, self._spec_ids[key.path]) != self._spec_ids[key.path]:
                del self.first_seen[key]
        now = int(time.time())
        plan = self._plan_contained(desired, lambda d: make_plan(d, actual, first_seen=self.first_seen, now=now))
        for key in plan.first_seen:
            if key not in self.first_seen and key.path in self._spec_ids:
                self._seen_blob[key] = self._spec_ids[key.path]
        self.first_seen = actual.first_seen = plan.first_seen  # published in actual.json for PR plans
        result = TickResult(
            revision=revision or "",
            desired=desired,
            actual=actual,
            serve=serve,
            plan=plan,
            statuses={},
            subject=self._subject,
            commit_time=commit_time,
            spec_ids=self._spec_ids,
        )
        result.notes.extend(self.trust_notes)
        result.notes.extend(f"unverified change kept out: {r}" for r in self.rejections)
        result.notes.extend(serve.settings_mismatch(desired.cluster))
        result.notes.extend(plan.notes)
        result.notes.extend(
            # repr: the id and claims are the job's metadata, anyone with the cluster's token writes them.
            f"foreign job {j.submission_id!r} ({'claims ' + repr(j.claims) if j.claims else 'argus-like id'}) "
            "has no valid ownership proof: ignored, never counted as a run"
            for j in self.foreign
        )
        self._apply(result)
        self._prune(desired, actual)
        result.statuses = self._assess_contained(result)
        for key, why in result.failures.items():
            status = result.statuses.get(key)
            if status is None:
                continue
            if key not in result.applied and key not in desired.invalid:
                # Nothing of this spec reached Ray: the object failed (what runs, if anything, is kept).
                status.state = "FAILED" if status.state not in ("RUNNING", "DEPLOYING") else status.state
            status.reason = f"{status.reason}; apply failed: {why}" if status.reason else f"apply failed: {why}"
        return result

    def _prune(self, desired: DesiredState, actual: ActualState) -> None:
        """Drop what the memos hold for objects and runs that are gone, so that a daemon running for
        months with objects coming and going holds memory for what exists now, not for all it saw.

        Refusals, retries and back-off are kept for tasks still in the repository (one entry per task:
        a new spec replaces its predecessor's in :meth:`_submit`); checkpoint answers for runs Ray or
        the status branch still lists; foreign ids for jobs Ray still holds; first-seen blobs for
        objects still queued by their first-seen time.
        """
        tasks = desired.tasks.keys() | desired.invalid.keys()
        for memo in (self._refused, self._retrying):
            for attempt in [a for a in memo if a[0] not in tasks]:
                del memo[attempt]
        self.backoff.prune(lambda attempt: isinstance(attempt, tuple) and attempt[0] in tasks)
        runs = {j.submission_id for j in actual.jobs} | {j.submission_id for j in actual.recorded_runs}
        for sid in [s for s in self._checkpoints if s not in runs]:
            del self._checkpoints[sid]
        self._foreign_seen &= actual.foreign_ids
        for key in [k for k in self._seen_blob if k not in self.first_seen]:
            del self._seen_blob[key]
        # Preemptions not yet on the status branch: those of tasks deleted meanwhile are never written.
        self._preempted = {k: v for k, v in self._preempted.items() if k in tasks or k in desired.models}
        self._preempted_runs = {s for s in self._preempted_runs if _task_of_run(s) in tasks}

    def _forget_other_specs(self, attempt: tuple[ObjectKey, str | None]) -> None:
        """Forget the refusals, retries and back-off of ``attempt``'s task under other specs."""
        for memo in (self._refused, self._retrying):
            for old in [a for a in memo if a[0] == attempt[0] and a != attempt]:
                del memo[old]
        self.backoff.prune(lambda other: not (isinstance(other, tuple) and other[0] == attempt[0] and other != attempt))

    def _plan_contained(self, desired: DesiredState, planner: Callable[[DesiredState], Plan]) -> Plan:
        """``planner(desired)``; when it raises for some objects, they become invalid (kept as
        they run, with the error) and everything else is planned as usual."""
        try:
            return planner(desired)
        except Exception as exc:
            first = exc
        keys = sorted(set(desired.models) | set(desired.tasks))

        def subset(chosen: Iterable[ObjectKey]) -> DesiredState:
            wanted = set(chosen)
            return replace(
                desired,
                models={k: v for k, v in desired.models.items() if k in wanted},
                tasks={k: v for k, v in desired.tasks.items() if k in wanted},
            )

        bad = culprits(keys, lambda sub: raises(partial(planner, subset(sub))) is not None)
        if not bad:
            raise first
        for key in bad:
            error = raises(partial(planner, subset([key])))
            log.error("planning %s failed", key, exc_info=error)
            spec = desired.models.get(key) or desired.tasks.get(key)
            line = getattr(spec, "line", 0) if key.kind == "model" else 0
            issue = Issue(key.path, line, f"internal error while planning: {error!r}")
            desired.models.pop(key, None)
            desired.tasks.pop(key, None)
            desired.invalid[key] = [issue]
            desired.issues.append(issue)
        desired.issues.sort()
        return planner(desired)

    def _assess_contained(self, result: TickResult) -> dict[ObjectKey, ObjectStatus]:
        """Assess every object; one whose assessment raises is FAILED with the error."""
        desired, actual, plan, applied = result.desired, result.actual, result.plan, result.applied
        try:
            return assess(desired, actual, plan, applied)
        except Exception as exc:
            log.error("assessing the objects failed; assessing them one by one", exc_info=exc)
        out: dict[ObjectKey, ObjectStatus] = {}
        keys = desired.keys() | set(actual.models) | {j.key for j in actual.jobs if j.active}
        for key in sorted(keys):
            one_desired = replace(
                desired,
                models={key: desired.models[key]} if key in desired.models else {},
                tasks={key: desired.tasks[key]} if key in desired.tasks else {},
                invalid={key: desired.invalid[key]} if key in desired.invalid else {},
            )
            one_actual = replace(
                actual,
                models={key: actual.models[key]} if key in actual.models else {},
                jobs=[j for j in actual.jobs if j.key == key],
            )
            one_plan = Plan([a for a in plan.actions if a.key == key])
            try:
                out.update(assess(one_desired, one_actual, one_plan, applied))
            except Exception as exc:
                out[key] = ObjectStatus(key, "FAILED", "Unknown", reason=f"internal error while assessing: {exc!r}")
        return out

    def _apply(self, result: TickResult) -> None:
        plan, desired = result.plan, result.desired
        for action in plan.of(ActionType.STOP_TASK):
            sid = action.submission_id or ""
            error = self._try(partial(stop_job, self.dash, sid))
            self._record(result, [action.key], error)
            if error is None and action.preempted_by is not None:
                self._preempted_runs.add(sid)
                self._preempted[action.key] = action.preempted_by
                # Recorded PREEMPTED by this tick's status write: the run resumes, it is not over.
                result.actual.jobs = [
                    replace(j, status=PREEMPTED, message=action.reason) if j.submission_id == sid else j
                    for j in result.actual.jobs
                ]
        self._apply_serve(result)
        now = time.monotonic()
        submits = []
        # A submission id Ray already holds for another object would be taken as "submitted".
        owner = {j.submission_id: j.key for j in result.actual.jobs}
        for action in plan.of(ActionType.SUBMIT_TASK):
            attempt = (action.key, action.spec_hash)
            refused = self._refused.get(attempt)
            if refused is not None:  # permanent: not retried until the spec changes (kopf's rule)
                result.failures[action.key] = refused
            elif owner.setdefault(action.submission_id or "", action.key) != action.key:
                holder = owner[action.submission_id or ""]
                result.failures[action.key] = f"submission id {action.submission_id} is already used by {holder}"
            elif not self.backoff.due(attempt, now):
                wait = self.backoff.retry_in(attempt, now) or 0.0
                result.failures[action.key] = f"{self._retrying.get(attempt, '')} (temporary: retried in {wait:.0f}s)"
            else:
                submits.append(action)
        if submits and self.record_runs is not None:
            runs = [(a.key, a.submission_id or "", a.spec_hash or "") for a in submits]
            if not self.record_runs(runs):
                for action in submits:
                    result.failures[action.key] = "could not record the run on the status branch first (retried)"
                return
        for action in submits:
            task = desired.tasks[action.key]
            sid = action.submission_id or ""
            resume = (action.resume_from, action.first_attempt)
            error = self._try(partial(self._submit, task, desired, result.revision, sid, resume))
            self._record(result, [action.key], error)
            if error is None:
                # Ray holds it now: this tick's status write keeps it among the task's runs.
                result.actual.jobs.append(
                    ActualJob(sid, action.key, action.spec_hash or "", "PENDING", revision=result.revision or None)
                )
            faults.point("after_submit")

    def _submit(
        self,
        task: TaskSpec,
        desired: DesiredState,
        revision: str,
        sid: str,
        resume: tuple[str | None, str | None] = (None, None),
    ) -> None:
        """Build and submit one run under ``sid`` (``resume``: the preempted attempt it resumes and
        the run's first attempt). Raises PermanentError (cannot be built) or ApplyFailed; a
        temporary failure is retried with back-off, and the status says why."""
        attempt = (task.key, task_spec_hash(task))
        self._forget_other_specs(attempt)
        try:
            body = job_submission(
                task,
                desired.cluster,
                revision=revision,
                secrets_env=self.secrets_env,
                sid=sid,
                ownership_key=self.ownership_key,
                resume_from=resume[0],
                first_attempt=resume[1],
            )
            submit_job(self.dash, body)
        except PermanentError as exc:
            self._refused[attempt] = f"{exc} (not retried until the file changes)"
            raise
        except TemporaryError as exc:
            delay = self.backoff.failed(attempt, time.monotonic(), at_least=exc.delay)
            self._retrying[attempt] = str(exc)
            raise ApplyDeferred(f"{exc} (temporary: retried in {delay:.0f}s)", delay=delay) from exc
        self.backoff.succeeded(attempt)
        self._retrying.pop(attempt, None)

    def _apply_serve(self, result: TickResult) -> None:
        """Send the whole owned app set in one PUT, only when it differs from what runs.

        A model whose application cannot be built (or sent as JSON, or whose name another
        object already takes) fails alone: what runs for it is carried as it runs, and the
        PUT carries every other application."""
        plan, desired, serve = result.plan, result.desired, result.serve
        changing = (ActionType.UPDATE_MODEL, ActionType.SCALE_MODEL, ActionType.DEPLOY_MODEL)
        # A preempted model runs fewer replicas than its file asks for until there is room again.
        preempted = {a.key: a.replicas for a in plan.of(ActionType.SCALE_MODEL) if a.preempted_by and a.replicas}
        apps: dict[str, dict[str, Any]] = {}
        holders: dict[str, ObjectKey] = {}
        touched: list[ObjectKey] = []
        changes: list[tuple[ObjectKey, Any]] = []
        for key in sorted(set(result.actual.models) | {a.key for a in plan.of(*changing)}):
            by_type = {a.type: a for a in plan.for_key(key)}
            if ActionType.DELETE_MODEL in by_type or ActionType.STOP_MODEL in by_type:
                touched.append(key)
                continue
            change = next((by_type[t] for t in changing if t in by_type), None)
            if change is not None and change.source_path:
                changes.append((key, change))
                continue
            name = app_name(key.user, key.name)
            deployed = serve.apps.get(name)
            if deployed is not None and name not in apps:
                apps[name], holders[name] = deployed, key  # carried through exactly as it runs
        # Oldest first: a name two objects derive belongs to the one that had it first.
        changes.sort(key=lambda kc: (desired.models[kc[0]].created_at, kc[0]))
        for key, change in changes:
            name = app_name(key.user, key.name)
            if holders.get(name, key) != key:
                result.failures[key] = f"Serve application name {name} is already used by {holders[name]}"
                continue
            try:
                model = desired.models[key]
                if key in preempted:
                    model = replace(model, replicas=preempted[key] or model.replicas)
                app = model_app_config(model, desired.cluster, change.source_path, change.spec_hash or "")
                json.dumps(app)  # what the PUT sends must be JSON: fail this model, not the PUT
            except Exception as exc:
                log.warning("cannot build the application of %s: %r", key, exc)
                result.failures[key] = f"cannot build its Serve application: {exc}"
                continue
            apps[name], holders[name] = app, key
            touched.append(key)
        error = self._try(
            lambda: setattr(
                result,
                "serve_put",
                apply_serve(self.dash, list(apps.values()), serve, desired.cluster, memo=self._put_memo),
            )
        )
        if result.serve_put:
            faults.point("serve_put")
        self._record(result, touched, error)
        if error is None:
            for action in plan.of(ActionType.SCALE_MODEL):
                if action.preempted_by is not None and action.key in preempted:
                    self._preempted[action.key] = action.preempted_by

    @staticmethod
    def _record(result: TickResult, keys: list[ObjectKey], error: str | None) -> None:
        for key in keys:
            if error is None:
                result.applied.add(key)
            else:
                result.failures[key] = error

    @staticmethod
    def _try(fn: Callable[[], object]) -> str | None:
        """Run one apply step; return None on success or the error text. Ray being
        unreachable is not an apply failure: it propagates and the tick stops. Anything
        else (an error nobody foresaw included) fails this step only."""
        try:
            fn()
        except RayUnavailable:
            raise
        except ArgusError as exc:
            log.warning("apply failed: %s", exc)
            return str(exc)
        except Exception as exc:
            log.error("apply failed unexpectedly", exc_info=exc)
            return f"internal error: {exc!r}"
        return None


def _serve_url_beside(dashboard_url: str, http_port: int) -> str:
    """The Serve proxy on the dashboard's host: ``http://<host>:<http_port>``."""
    parts = urllib.parse.urlsplit(dashboard_url)
    host = parts.hostname or "127.0.0.1"
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme or 'http'}://{host}:{http_port}"


def _task_of_run(sid: str) -> ObjectKey | None:
    """The task a submission id argus derives names (None when it is not one)."""
    parsed = parse_submission_id(sid)
    return ObjectKey(parsed[0], "task", parsed[1]) if parsed is not None else None


def _key_of(path: str) -> ObjectKey | None:
    """The object a path under ``users/`` names, or None (not an object path, or unparseable)."""
    try:
        return classify(path)[0]
    except Exception:
        return None
