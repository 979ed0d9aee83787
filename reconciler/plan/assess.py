"""Health and sync of every object after a tick. Pure.

Two separate questions, as in Argo CD: ``state`` is health (what runs: QUEUED, DEPLOYING,
RUNNING, FAILED, DELETING, STOPPED (``replicas: 0``) for models; QUEUED, SUBMITTED, PENDING,
RUNNING, SUCCEEDED, FAILED, STOPPED, LOST (Ray forgot it while it ran), PREEMPTED (stopped to
make room; it resumes as the next attempt of the same run) for tasks;
INVALID/SUSPENDED/UNSCHEDULABLE when nothing
runs), ``sync`` is whether what runs matches git (Synced, OutOfSync, Invalid, Suspended, Held).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from reconciler.plan.actions import Action, ActionType, Plan
from reconciler.plan.actual import FINAL_JOB_STATES, PREEMPTED, ActualJob, ActualState
from reconciler.spec.hashing import task_spec_hash
from reconciler.spec.types import DesiredState, ObjectKey

SERVE_TO_STATE = {
    "RUNNING": "RUNNING",
    "DEPLOYING": "DEPLOYING",
    "NOT_STARTED": "DEPLOYING",
    "DEPLOY_FAILED": "FAILED",
    "UNHEALTHY": "FAILED",
    "DELETING": "DELETING",
}


# Ray's message for a failed entrypoint: this header, then the log's last lines (its first ones
# are Ray's own: "Runtime env is setting up.", "Running entrypoint for job ...").
_LOGS_HEADER = ", last available logs (truncated to 20,000 chars):"
# The line of a log that names the error: a Python exception (`ValueError: ...`, `torch.OutOfMemoryError`),
# or a line that says it is one.
_ERROR_LINE = re.compile(
    r"^(?:[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Failure)\b|(?:error|fatal|killed)\b)", re.IGNORECASE
)
_ACTOR_PREFIX = re.compile(r"^\([^()]{1,200}\)\s*")
_RAY_NOISE = ("Runtime env is setting up", "Running entrypoint for job")
REASON_CHARS = 500


def failure_reason(message: str) -> str:
    """A failed run's reason: the error its log ends with (``ValueError: ...``), then Ray's first
    line (``Job entrypoint command failed with exit code 1``); ``message`` itself when it is not
    Ray's log-tail form. At most :data:`REASON_CHARS` characters (the whole message stays in the run)."""
    head, found, logs = message.partition(_LOGS_HEADER)
    if not found:
        return message[:REASON_CHARS]
    # Ray prefixes a worker's lines with its actor and pid: `(TaskRunner pid=4711) ValueError: ...`.
    lines = [_ACTOR_PREFIX.sub("", line.strip()) for line in logs.splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith(_RAY_NOISE)]
    errors = [line for line in lines if _ERROR_LINE.match(line)]
    error = errors[-1] if errors else (lines[-1] if lines else "")
    reason = f"{error} ({head.strip()})" if error else head.strip()
    return reason[:REASON_CHARS]


@dataclass(frozen=True)
class ObjectStatus:
    """What the status branch and ``argus reconcile`` report for one object: a value (the
    incremental assessment hands the same status to every tick until its inputs change;
    :func:`dataclasses.replace` makes an amended one)."""

    key: ObjectKey
    state: str
    sync: str
    reason: str = ""
    served_name: str | None = None
    alias: str | None = None  # the stable OpenAI name (models only)
    replicas_desired: int | None = None
    replicas_ready: int | None = None
    gpus: float = 0.0
    submission_id: str | None = None
    runs: tuple[ActualJob, ...] = ()
    first_seen: int | None = None  # when the daemon first saw it (UTC epoch s): the admission order
    preempted_by: str | None = None  # the object this tick stops (or scales down) this one for

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "object": str(self.key),
            "kind": self.key.kind,
            "state": self.state,
            "sync": self.sync,
        }
        if self.reason:
            out["reason"] = self.reason
        if self.key.kind == "model":
            out.update(
                served_name=self.served_name,
                alias=self.alias,
                replicas={"desired": self.replicas_desired, "ready": self.replicas_ready},
            )
        else:
            out["submission_id"] = self.submission_id
            out["runs"] = [_run_json(j) for j in self.runs]
        out["gpus"] = self.gpus
        if self.preempted_by:
            out["preempted_by"] = self.preempted_by
        return out


def resumed(step: int) -> str:
    """How a resumed attempt's status says where it started (step 0: there was no checkpoint)."""
    if step:
        return f"resumed from step {step}"
    return "resumed from step 0: the preempted attempt left no checkpoint"


def _run_json(job: ActualJob) -> dict[str, object]:
    """One run of a task as ``argus reconcile --format json`` reports it."""
    run: dict[str, object] = {"submission_id": job.submission_id, "status": job.status}
    if job.message:
        run["message"] = job.message
    if job.hf_checkpoint:
        run["checkpoint"] = job.hf_checkpoint
    if job.resumed_from_step is not None:
        run["resumed_from_step"] = job.resumed_from_step
    if job.checkpoint_step is not None:
        run["checkpoint_step"] = job.checkpoint_step
    return run


def assess(
    desired: DesiredState, actual: ActualState, plan: Plan, applied: set[ObjectKey] | None = None
) -> dict[ObjectKey, ObjectStatus]:
    """Return the status of every object in desired or actual.

    ``applied``: keys whose actions were applied this tick (None = all of them were);
    an action that failed leaves the object in its observed state.
    """
    out: dict[ObjectKey, ObjectStatus] = {}
    keys = desired.keys() | set(actual.models) | {j.key for j in actual.jobs if j.active}
    by_key: dict[ObjectKey, list[Action]] = {}
    for action in plan.actions:  # one pass: plan.for_key() per object is quadratic
        by_key.setdefault(action.key, []).append(action)
    jobs: dict[ObjectKey, list[ActualJob]] = {}
    for job in actual.runs():  # Ray's jobs and the recorded runs it forgot (LOST while running)
        jobs.setdefault(job.key, []).append(job)
    for key in sorted(keys):
        done = applied is None or key in applied
        out[key] = object_status(key, desired, actual, by_key.get(key, []), done, jobs.get(key, []), plan)
    return out


def object_status(
    key: ObjectKey,
    desired: DesiredState,
    actual: ActualState,
    actions: list[Action],
    done: bool,
    runs: list[ActualJob],
    plan: Plan,
) -> ObjectStatus:
    """The status of ``key``, given its ``actions`` in ``plan`` (applied when ``done``) and, for a
    task, its ``runs`` (:meth:`ActualState.runs`). Reads of ``desired`` and ``actual`` only the
    entries of ``key``, ``actual.stopping`` and ``plan.first_seen``."""
    if key.kind == "model":
        status = _model(key, desired, actual, actions, done, plan.first_seen.get(key))
    else:
        status = _task(key, desired, runs, actions, done, actual.stopping, plan.first_seen.get(key))
    preemptor = next((a.preempted_by for a in actions if a.preempted_by is not None and done), None)
    if preemptor is None and _waiting(status):
        preemptor = actual.preempted.get(key)
    return status if preemptor is None else replace(status, preempted_by=str(preemptor))


def _waiting(status: ObjectStatus) -> bool:
    """Still waiting to get back what preemption took (a task's run, a model's replicas)."""
    if status.key.kind == "task":
        return status.state in ("PREEMPTED", "QUEUED")
    return (status.replicas_ready or 0) < (status.replicas_desired or 0)


def _sync(key: ObjectKey, desired: DesiredState, actions: list[Action]) -> str:
    if key in desired.invalid:
        return "Invalid"
    spec = desired.models.get(key) or desired.tasks.get(key)
    if spec is not None and spec.suspend:
        return "Suspended"
    if any(a.held for a in actions):
        return "Held"
    return "OutOfSync" if any(a.type is not ActionType.KEEP for a in actions) else "Synced"


def _model(
    key: ObjectKey,
    desired: DesiredState,
    actual: ActualState,
    actions: list[Action],
    done: bool,
    first_seen: int | None,
) -> ObjectStatus:
    live = actual.models.get(key)
    spec = desired.models.get(key)
    state, reason, gpus = "RUNNING", "", 0.0
    if live:
        gpus = live.committed().get("GPU", 0.0)
        state = SERVE_TO_STATE.get(live.status, live.status)
        reason = live.message
        if state == "RUNNING" and live.awaiting_answer:
            state = "DEPLOYING"
            why = f": {live.answer_error}" if live.answer_error else ""
            reason = f"replicas started, waiting for the first answer{why}"
        elif state == "RUNNING" and live.answer_error:
            # Serve's health check has not caught it yet: the endpoint's error is the truth.
            state = "FAILED"
            reason = f"does not answer ({live.answer_error}); Serve replaces a replica whose engine died"
    reasons = [a.reason for a in actions]
    kinds = {a.type for a in actions}
    if done and kinds & {ActionType.DELETE_MODEL, ActionType.STOP_MODEL}:
        state = "DELETING"
    elif done and kinds & {ActionType.DEPLOY_MODEL, ActionType.UPDATE_MODEL}:
        state = "DEPLOYING"
    elif ActionType.QUEUE in kinds and live is None:
        state = "QUEUED"
    elif ActionType.UNSCHEDULABLE in kinds and live is None:
        state = "UNSCHEDULABLE"
    elif live is None and spec is not None and spec.replicas == 0 and not spec.suspend:
        state = "STOPPED"
        reason = reason or "replicas: 0 (stopped; raise replicas to deploy it again under the same name)"
    elif live is None and key in desired.invalid:
        state = "INVALID"
    elif live is None and spec is not None and spec.suspend:
        state = "SUSPENDED"
    if reasons:
        reason = "; ".join(r for r in [*reasons, reason if live and live.message else ""] if r)
    return ObjectStatus(
        key,
        state,
        _sync(key, desired, actions),
        reason=reason,
        served_name=spec.served_name if spec else (live.served_name if live else None),
        alias=spec.alias if spec else None,
        replicas_desired=spec.replicas if spec else (live.replicas if live else None),
        replicas_ready=live.ready_replicas if live else 0,
        gpus=gpus,
        first_seen=first_seen,
    )


def _task(
    key: ObjectKey,
    desired: DesiredState,
    runs: list[ActualJob],
    actions: list[Action],
    done: bool,
    stopping: frozenset[str] = frozenset(),
    first_seen: int | None = None,
) -> ObjectStatus:
    # An attempt being stopped for preemption is PREEMPTED from the tick that stopped it, so its
    # record on the status branch never goes back to RUNNING while Ray's stop lands.
    jobs = tuple(
        sorted(
            (replace(j, status=PREEMPTED) if j.submission_id in stopping and j.active else j for j in runs),
            key=lambda j: (j.start_time or 0, j.submission_id),
        )
    )
    spec = desired.tasks.get(key)
    state, reason, gpus, submission = "STOPPED", "", 0.0, None
    kinds = {a.type for a in actions}
    submit = next((a for a in actions if a.type is ActionType.SUBMIT_TASK), None)
    current = None
    if spec is not None:
        digest = task_spec_hash(spec)
        current = next((j for j in reversed(jobs) if j.spec_hash == digest), None)
    elif jobs:
        current = jobs[-1]
    if current is not None:
        state, submission = current.status, current.submission_id
        reason = failure_reason(current.message) if current.status == "FAILED" else current.message
        if current.resumed_from_step is not None and current.status not in FINAL_JOB_STATES:
            reason = "; ".join(r for r in (reason, resumed(current.resumed_from_step)) if r)
        gpus = current.committed().get("GPU", 0.0)
    if submit is not None and done:
        state, submission = "SUBMITTED", submit.submission_id
        gpus = submit.demand.get("GPU", 0.0)
    elif ActionType.QUEUE in kinds and current is None:
        state = "QUEUED"
    elif ActionType.UNSCHEDULABLE in kinds and current is None:
        state = "UNSCHEDULABLE"
    elif current is None and key in desired.invalid:
        state = "INVALID"
    elif current is None and spec is not None and spec.suspend:
        state = "SUSPENDED"
    if actions:
        reason = "; ".join(a.reason for a in actions)
    sync = _sync(key, desired, actions)
    return ObjectStatus(
        key, state, sync, reason=reason, gpus=gpus, submission_id=submission, runs=jobs, first_seen=first_seen
    )
