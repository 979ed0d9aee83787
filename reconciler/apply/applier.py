"""Apply one tick's plan: records, stops, one Serve PUT, submissions. I/O.

:meth:`Applier.apply` returns an :class:`Applied` value: one :class:`~reconciler.plan.outcome.Outcome`
per object it touched, and what Ray holds now that it did not when the tick observed it. The
applier owns its requeue memory (controller-runtime's rate limiter): the refusals of specs Ray
rejected for good (not retried until the file changes, kopf's rule), the temporary failures with
their back-off, and the last Serve PUT. Each holds one entry per task in the repository at most.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from reconciler import faults
from reconciler.apply.jobs import stop_job, submit_job
from reconciler.apply.serve import ServeEventLog, apply_serve
from reconciler.backoff import Backoff
from reconciler.builders.jobs import job_submission
from reconciler.builders.serve import app_name, gate_config, model_access, model_app_config
from reconciler.dashboard import Clusters, Dashboard
from reconciler.errors import (
    ApplyDeferred,
    ArgusError,
    PermanentError,
    RayUnavailable,
    StatusBranchBlocked,
    TemporaryError,
)
from reconciler.observe.api_keys import known_users
from reconciler.observe.jobs import resume_point
from reconciler.observe.serve import ServeObservation
from reconciler.plan.actions import Action, ActionType, Plan
from reconciler.plan.actual import PREEMPTED, ActualJob, ActualState
from reconciler.plan.outcome import Outcome
from reconciler.plan.serve_kept import ServeEvent
from reconciler.spec.hashing import task_spec_hash
from reconciler.spec.types import ClusterSpec, DesiredState, ObjectKey, TaskSpec

log = logging.getLogger("argus")

# (key, submission id, spec hash) of each run about to be submitted; returns whether they are
# recorded durably (False: submit nothing this tick). Raises StatusBranchBlocked when no record can
# be made at all; called with no runs, it only checks that (before a preemption is applied).
RecordRuns = Callable[[list[tuple[ObjectKey, str, str]]], bool]
_Attempt = tuple[ObjectKey, str | None]  # a task under one spec hash


@dataclass
class Applied:
    """What one apply did. ``outcomes``: one per object touched; ``serve_put``: a PUT was sent;
    ``stopped``: attempts stopped for preemption (submission id -> why) and ``preempted``: the
    objects preempted, each with its preemptor; ``submitted``: the runs Ray holds now."""

    outcomes: dict[ObjectKey, Outcome] = field(default_factory=dict)
    serve_put: bool = False
    stopped: dict[str, str] = field(default_factory=dict)
    preempted: dict[ObjectKey, ObjectKey] = field(default_factory=dict)
    submitted: list[ActualJob] = field(default_factory=list)
    # Serve applications removed or restored lately: (model key, or None: a status note; the line).
    serve_events: tuple[tuple[ObjectKey | None, str], ...] = ()

    def note(self, key: ObjectKey, error: Outcome | None) -> None:
        """Record one step for ``key``: succeeded (None) or failed as ``error`` says."""
        prev = self.outcomes.get(key, Outcome())
        self.outcomes[key] = (
            prev.succeeded()
            if error is None
            else prev.failing(error.error or "", permanent=error.permanent, retry_in=error.retry_in)
        )

    def fail(self, key: ObjectKey, why: str, *, permanent: bool = False, retry_in: float | None = None) -> None:
        self.note(key, Outcome(error=why, permanent=permanent, retry_in=retry_in))

    def actual_after(self, actual: ActualState) -> ActualState:
        """``actual`` with what this apply did in it: a stopped attempt is PREEMPTED (it resumes, it
        is not over) and a submitted run is PENDING (this tick's status write keeps it among the
        task's runs). Returns a new value."""
        jobs = [
            replace(j, status=PREEMPTED, message=self.stopped[j.submission_id])
            if j.submission_id in self.stopped
            else j
            for j in actual.jobs
        ]
        return replace(actual, jobs=jobs + self.submitted)


class Applier:
    """Applies plans to one Ray cluster (``secrets_env`` reach jobs; ``ownership_key`` signs them;
    ``api_keys`` returns the keys files' keys, sha256 hex -> user, for the endpoint: None, an open endpoint; the
    keys of users cluster.yaml's ``users:`` does not declare are left out; ``gate`` takes the endpoint's gate
    config each tick, reconciler/endpoint/hub.py)."""

    def __init__(
        self,
        dash: Dashboard,
        *,
        secrets_env: Mapping[str, str],
        ownership_key: bytes,
        api_keys: Callable[[], Mapping[str, str]] | None = None,
        gate: Callable[[dict[str, Any], ClusterSpec], None] | None = None,
        clusters: Clusters | None = None,
    ) -> None:
        self.dash = dash
        # Models are deployed on cluster.yaml's serving.ray_address when it names one.
        self.clusters = clusters if clusters is not None else Clusters(dash)
        self.api_keys = api_keys
        self.gate = gate  # hands the endpoint its gate config (reconciler/endpoint/hub.py); None: none
        self._gate_access: dict[str, list[str] | None] = {}  # the last gate config's access rules
        self.secrets_env = dict(secrets_env)
        self.ownership_key = ownership_key
        self._refused: dict[_Attempt, str] = {}
        self._retrying: dict[_Attempt, str] = {}
        self._backoff = Backoff()
        self._put_memo: dict[str, Any] = {}
        self._put_to: Dashboard | None = None  # the dashboard _put_memo is of
        self._serve_events = ServeEventLog()

    def apply(
        self,
        plan: Plan,
        desired: DesiredState,
        actual: ActualState,
        serve: ServeObservation,
        revision: str,
        record_runs: RecordRuns | None = None,
    ) -> Applied:
        """Apply ``plan``: record the runs about to be submitted (``record_runs``; None: not
        recorded ahead), then stops, then the Serve PUT, then submissions. A preemption (a stop or
        scale-down that makes room for another object) is applied only once what it makes room for
        is on record: never when the records cannot be written, never for a task whose run is not
        submitted this tick. Returns what it did, one outcome per object. Raises RayUnavailable
        (Ray went away mid-apply: the tick stops); any other failure is that object's outcome."""
        out = Applied()
        submits = self._due(out, plan, actual)
        unrecorded = self._record(submits, plan, record_runs)
        held = self._held(plan, submits, unrecorded)
        for key, why in held.items():
            out.fail(key, why, retry_in=0.0)
        for action in plan.of(ActionType.STOP_TASK):
            if action.preempted_by is not None and action.key in held:
                continue
            sid = action.submission_id or ""
            error = _try(partial(stop_job, self.dash, sid))
            out.note(action.key, error)
            if error is None and action.preempted_by is not None:
                out.stopped[sid] = action.reason
                out.preempted[action.key] = action.preempted_by
        self._apply_serve(out, plan, desired, actual, serve, held)
        if unrecorded is not None:
            for action in submits:
                out.fail(action.key, f"not submitted: {unrecorded}", retry_in=0.0)
        else:
            self._submit_all(out, submits, desired, revision)
        self._forget_gone(desired.tasks.keys() | desired.invalid.keys())
        return out

    def memo_sizes(self) -> dict[str, int]:
        """How many entries each memo holds (the soak checks they stay bounded)."""
        return {
            "refused": len(self._refused),
            "retrying": len(self._retrying),
            "backoff": len(self._backoff),
            "serve_events": len(self._serve_events),
        }

    def _due(self, out: Applied, plan: Plan, actual: ActualState) -> list[Action]:
        """The submissions of ``plan`` to send now; the others (refused for good, in back-off, or
        under a submission id another object holds) fail in ``out``."""
        now = time.monotonic()
        submits = []
        # A submission id Ray already holds for another object would be taken as "submitted".
        owner = {j.submission_id: j.key for j in actual.jobs}
        for action in plan.of(ActionType.SUBMIT_TASK):
            attempt = (action.key, action.spec_hash)
            refused = self._refused.get(attempt)
            if refused is not None:  # permanent: not retried until the spec changes (kopf's rule)
                out.fail(action.key, refused, permanent=True)
            elif owner.setdefault(action.submission_id or "", action.key) != action.key:
                holder = owner[action.submission_id or ""]
                out.fail(
                    action.key, f"submission id {action.submission_id} is already used by {holder}", permanent=True
                )
            elif not self._backoff.due(attempt, now):
                wait = self._backoff.retry_in(attempt, now) or 0.0
                why = f"{self._retrying.get(attempt, '')} (temporary: retried in {wait:.0f}s)"
                out.fail(action.key, why, retry_in=wait)
            else:
                submits.append(action)
        return submits

    @staticmethod
    def _record(submits: list[Action], plan: Plan, record_runs: RecordRuns | None) -> str | None:
        """Record ``submits``' runs before anything is applied (with none, when ``plan`` preempts,
        check that records can be written). Returns None when they are on record (or nothing needs
        one), else why not: then nothing is submitted and no preemption is applied."""
        if record_runs is None or not (submits or plan.preemptions):
            return None
        try:
            recorded = record_runs([(a.key, a.submission_id or "", a.spec_hash or "") for a in submits])
        except StatusBranchBlocked as exc:
            return str(exc)
        return None if recorded else "could not record the run on the status branch first (retried)"

    @staticmethod
    def _held(plan: Plan, submits: list[Action], unrecorded: str | None) -> dict[ObjectKey, str]:
        """The preemptions not applied this tick, victim -> why: every one when the runs could not
        be recorded (``unrecorded``; a stopped attempt could not be recorded PREEMPTED either, so it
        would never resume), and each one for a task whose run is not submitted this tick (stopping
        work for it would free room nothing takes). A model that the held preemptions made room for
        is held as well (model -> why): deployed beside the work it was to replace, it would count
        as admitted and never get that room."""
        sent = {a.key for a in submits}
        held: dict[ObjectKey, str] = {}
        for action in plan.preemptions:
            preemptor = action.preempted_by
            if preemptor is None:
                continue
            if unrecorded is not None:
                held[action.key] = f"not preempted for {preemptor}: {unrecorded}"
                if preemptor.kind == "model":
                    held[preemptor] = f"waits for the room its preemptions make, held: {unrecorded}"
            elif preemptor.kind == "task" and preemptor not in sent:
                held[action.key] = f"not preempted for {preemptor}: its run is not submitted this tick (see its status)"
        return held

    def _submit_all(self, out: Applied, submits: list[Action], desired: DesiredState, revision: str) -> None:
        """Send ``submits`` (on record already), each failing alone."""
        for action in submits:
            task = desired.tasks[action.key]
            sid = action.submission_id or ""
            resume = (action.resume_from, action.first_attempt)
            error = _try(partial(self._submit, task, desired, revision, sid, resume))
            out.note(action.key, error)
            if error is None:
                out.submitted.append(
                    ActualJob(sid, action.key, action.spec_hash or "", "PENDING", revision=revision or None)
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
            # The attempt it resumes from and that one's newest checkpoint, read just before submitting.
            source, step = resume_point(desired.cluster.paths, task, *resume)
            body = job_submission(
                task,
                desired.cluster,
                revision=revision,
                secrets_env=self.secrets_env,
                sid=sid,
                ownership_key=self.ownership_key,
                resume_from=source if task.workload == "command" else resume[0],
                first_attempt=resume[1],
                resume_step=step,
            )
            submit_job(self.dash, body)
        except PermanentError as exc:
            self._refused[attempt] = f"{exc} (not retried until the file changes)"
            raise
        except TemporaryError as exc:
            delay = self._backoff.failed(attempt, time.monotonic(), at_least=exc.delay)
            self._retrying[attempt] = str(exc)
            raise ApplyDeferred(f"{exc} (temporary: retried in {delay:.0f}s)", delay=delay) from exc
        self._backoff.succeeded(attempt)
        self._retrying.pop(attempt, None)

    def _apply_serve(
        self,
        out: Applied,
        plan: Plan,
        desired: DesiredState,
        actual: ActualState,
        serve: ServeObservation,
        held: Mapping[ObjectKey, str] | None = None,
    ) -> None:
        """Send the whole owned app set in one PUT, only when it differs from what runs.

        A model whose application cannot be built (or sent as JSON, or whose name another
        object already takes) fails alone: what runs for it is carried as it runs, and the
        PUT carries every other application."""
        changing = (ActionType.UPDATE_MODEL, ActionType.SCALE_MODEL, ActionType.DEPLOY_MODEL)
        held = held or {}
        # A preempted model runs fewer replicas than its file asks for until there is room again;
        # preempted down to none, its application leaves Serve (as a stop does), or its GPUs are
        # never freed. One whose preemption is held keeps running as it runs (carried through below).
        preempted = {
            a.key: a.replicas
            for a in plan.of(ActionType.SCALE_MODEL)
            if a.preempted_by and a.replicas is not None and a.key not in held
        }
        apps: dict[str, dict[str, Any]] = {}
        holders: dict[str, ObjectKey] = {}
        touched: list[ObjectKey] = []
        changes: list[tuple[ObjectKey, Any]] = []
        for key in sorted(set(actual.models) | {a.key for a in plan.of(*changing)}):
            by_type = {a.type: a for a in plan.for_key(key)}
            if ActionType.DELETE_MODEL in by_type or ActionType.STOP_MODEL in by_type or preempted.get(key) == 0:
                touched.append(key)
                continue
            change = next((by_type[t] for t in changing if t in by_type), None)
            if change is not None and key in held:
                change = None  # a held preemption's victim or preemptor: left as it runs
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
                out.fail(key, f"Serve application name {name} is already used by {holders[name]}", permanent=True)
                continue
            try:
                model = desired.models[key]
                if key in preempted:
                    model = replace(model, replicas=preempted[key])
                app = model_app_config(model, desired.cluster, change.source_path, change.spec_hash or "")
                json.dumps(app)  # what the PUT sends must be JSON: fail this model, not the PUT
            except Exception as exc:
                log.warning("cannot build the application of %s: %r", key, exc)
                out.fail(key, f"cannot build its Serve application: {exc}", permanent=True)
                continue
            apps[name], holders[name] = app, key
            touched.append(key)

        events: list[ServeEvent] = []

        def put() -> None:
            dash = self.clusters.serving(desired.cluster.serving.ray_address)
            if dash is not self._put_to:
                # Another cluster: what was put, kept and backed off on the last one says nothing of it.
                self._put_memo, self._put_to = {}, dash
            out.serve_put = apply_serve(
                dash,
                list(apps.values()),
                serve,
                desired.cluster,
                memo=self._put_memo,
                events=events,
            )

        error = _try(put)
        out.serve_events = self._serve_events.record(events, time.time())
        self._publish_gate(desired, list(apps.values()))
        if out.serve_put:
            faults.point("serve_put")
        for key in touched:
            out.note(key, error)
        if error is None:
            for action in plan.of(ActionType.SCALE_MODEL):
                if action.preempted_by is not None and action.key in preempted:
                    out.preempted[action.key] = action.preempted_by

    def _publish_gate(self, desired: DesiredState, model_apps: list[dict[str, Any]]) -> None:
        """Hand the endpoint this tick's gate config: the model table, and with keys files their
        keys (read on every tick: a new or revoked key takes effect within one), access rules,
        teams and limits. Built from the repository and the keys files only, never from what Ray
        reports (any job can rewrite a Serve config)."""
        if self.gate is None:
            return
        keys = known_users(self.api_keys(), desired.cluster.users) if self.api_keys is not None else None
        config = gate_config(
            desired.cluster,
            model_apps,
            keys=keys,
            access=model_access(desired.models.values(), desired.cluster),
            before=self._gate_access,
        )
        self._gate_access = dict(config.get("access", {}))
        self.gate(config, desired.cluster)

    def _forget_other_specs(self, attempt: _Attempt) -> None:
        """Forget the refusals, retries and back-off of ``attempt``'s task under other specs."""
        for memo in (self._refused, self._retrying):
            for old in [a for a in memo if a[0] == attempt[0] and a != attempt]:
                del memo[old]
        self._backoff.prune(
            lambda other: not (isinstance(other, tuple) and other[0] == attempt[0] and other != attempt)
        )

    def _forget_gone(self, tasks: Collection[ObjectKey]) -> None:
        """Drop refusals, retries and back-off of tasks no longer in the repository (one entry per
        task that exists: a new spec replaces its predecessor's in :meth:`_submit`)."""
        for memo in (self._refused, self._retrying):
            for attempt in [a for a in memo if a[0] not in tasks]:
                del memo[attempt]
        self._backoff.prune(lambda attempt: isinstance(attempt, tuple) and attempt[0] in tasks)


def _try(fn: Callable[[], object]) -> Outcome | None:
    """Run one apply step; return None on success or the failure as an outcome. Ray being
    unreachable is not an apply failure: it propagates and the tick stops. Anything else (an
    error nobody foresaw included) fails this step only: permanent or temporary by its class."""
    try:
        fn()
    except RayUnavailable:
        raise
    except ArgusError as exc:
        log.warning("apply failed: %s", exc)
        delay = exc.delay if isinstance(exc, TemporaryError) else None
        return Outcome(error=str(exc), permanent=isinstance(exc, PermanentError), retry_in=delay)
    except Exception as exc:
        log.error("apply failed unexpectedly", exc_info=exc)
        return Outcome(error=f"internal error: {exc!r}")
    return None
