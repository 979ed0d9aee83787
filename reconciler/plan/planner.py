"""The planner: ``plan(desired, actual) -> Plan``. Pure: no I/O, no clock, no randomness.

Desired and actual are paired per object; the missing side is the action (gitops-engine).
Rules, in the order they apply:

1. A broken ``cluster.yaml`` changes nothing at all.
2. Only owned objects (Serve apps named ``argus--*``, Ray jobs labelled ``managed-by: argus``)
   appear in ``actual``, so only they are ever changed or deleted.
3. An invalid or suspended object is kept exactly as it runs.
4. A task run is identified by its spec hash (``run`` included): never resubmitted,
   whatever its final status, whether Ray or only the status branch remembers it (a run
   Ray forgot while it ran is LOST, final too); a changed spec stops the old run and
   submits the new one, under an id no foreign job holds.
5. ``replicas: 0`` stops a model: its Serve application goes, its name, file and status stay.
   This is the owner's explicit edit, not a removed file: the mass-deletion guard ignores it.
6. New work and scale-ups are admitted first come, first served (by the time the daemon first
   saw the object) within free capacity, per-user caps and team quotas, by priority and fair
   share; the rest is queued, and what can never fit is unschedulable; waiting work may
   preempt running work (:mod:`reconciler.plan.admission`, :mod:`reconciler.plan.preemption`).
   A preempted run resumes as a new attempt of the same run, never from zero.
7. The mass-deletion guard holds back deletions unless the head commit approves them.
"""

from __future__ import annotations

from collections.abc import Collection, Container, Mapping
from dataclasses import dataclass, replace

from reconciler.plan.actions import Action, ActionType, Plan
from reconciler.plan.actual import PREEMPTED, ActualJob, ActualModel, ActualState, Capacity, Resources, scale, sub
from reconciler.plan.admission import Candidate, admit, free_capacity, order_time
from reconciler.plan.demand import model_resources_per_replica, task_resources
from reconciler.plan.diff import field_diff, summarise
from reconciler.spec.hashing import (
    model_spec_fields,
    model_spec_hash,
    parse_submission_id,
    submission_id,
    task_spec_fields,
    task_spec_hash,
)
from reconciler.spec.types import ClusterSpec, DesiredState, ModelSpec, ObjectKey, TaskSpec

__all__ = [
    "APPROVE_HINT",
    "Order",
    "Step",
    "admission_times",
    "first_issue",
    "free_capacity",
    "guard",
    "latest_success",
    "model_step",
    "plan",
    "runs_by_key",
    "task_step",
]

APPROVE_HINT = (
    "push a commit whose message has the trailer `Argus-Approve-Prune: yes` (or run `argus plan --approve-prune`)"
)


@dataclass(frozen=True)
class Order:
    """First-come-first-served inputs: recorded first sightings and the tick's clock."""

    first_seen: Mapping[ObjectKey, int]
    now: int | None

    def of(self, key: ObjectKey, created_at: int) -> tuple[int, int]:
        return (order_time(key, created_at, self.first_seen, self.now), created_at)


def plan(
    desired: DesiredState,
    actual: ActualState,
    capacity: Capacity | None = None,
    *,
    first_seen: Mapping[ObjectKey, int] | None = None,
    now: int | None = None,
    recheck: Collection[ObjectKey] | None = None,
) -> Plan:
    """Return the ordered :class:`Plan` that makes ``actual`` match ``desired``.

    ``capacity`` defaults to ``actual.capacity``; empty capacity means "unknown" and admits
    everything (noted in the plan). ``first_seen`` (default ``actual.first_seen``) is when the
    daemon first saw each object, the admission order; objects it lacks were first seen
    ``now`` (the caller's clock: the planner has none), or at their commit time when ``now``
    is None. ``recheck``: see :func:`admission_times`. Raises nothing for bad input: it was
    reported by the loader.
    """
    capacity = capacity if capacity is not None else actual.capacity
    seen = first_seen if first_seen is not None else actual.first_seen
    result = Plan()
    result.first_seen = admission_times(desired, seen, now, recheck)
    if not desired.cluster_valid:
        result.frozen = True
        result.notes.append("cluster.yaml is invalid: nothing will be applied until it is fixed")
        for key in sorted(_owned_keys(actual)):
            result.actions.append(Action(ActionType.KEEP, key, "kept as it runs: cluster.yaml is invalid"))
        return result

    order = Order(seen, now)
    direct: list[Action] = []
    candidates: list[Candidate] = []
    deletions: list[Action] = []
    _plan_models(desired, actual, direct, candidates, deletions, order)
    _plan_tasks(desired, actual, direct, candidates, deletions, order)
    # The guard first: a deletion it holds keeps its object running, and preemptible as it runs,
    # or removing files until the guard trips would shield borrowed GPUs.
    deletions = guard(desired, actual, deletions, result)
    busy = frozenset(a.key for a in (*direct, *deletions) if a.type is not ActionType.KEEP)
    busy |= frozenset(c.action.key for c in candidates)
    direct.extend(admit(desired, actual, capacity, candidates, result, now=now, busy=busy))
    direct.extend(deletions)
    result.actions = sorted(direct, key=lambda a: a.sort_key)
    return result


def admission_times(
    desired: DesiredState,
    seen: Mapping[ObjectKey, int],
    now: int | None,
    recheck: Collection[ObjectKey] | None = None,
) -> dict[ObjectKey, int]:
    """The admission order time of every desired object (:attr:`Plan.first_seen`); empty when
    neither a clock nor recorded sightings are given.

    ``recheck`` (the admission order's change feed, :meth:`AdmissionOrder.feed`): the caller
    knows that ``seen`` already is this result except at these objects, so only they are looked
    up (O(changed) instead of a pass over every object). None: every object is."""
    if now is None and not seen:
        return {}
    if recheck is not None:
        times = dict(seen)  # C-speed
        for key in recheck:
            times.pop(key, None)
            spec = desired.models.get(key) if key.kind == "model" else desired.tasks.get(key)
            if spec is not None:
                times[key] = order_time(key, spec.created_at, seen, now)
            elif key in desired.invalid and key in seen:
                times[key] = seen[key]
        return times
    # C-level passes over the sighted objects (at 100,000 a Python call per object took 0.1 s a
    # tick); Python only for the objects never seen before, which take ``now`` (or their time).
    out: dict[ObjectKey, int] = {}
    for specs in (desired.models, desired.tasks):
        known = specs.keys() & seen.keys()
        out.update(zip(known, map(seen.__getitem__, known), strict=True))
        if len(known) < len(specs):
            out.update({k: order_time(k, specs[k].created_at, seen, now) for k in specs.keys() - known})
    out.update({k: seen[k] for k in desired.invalid if k in seen})
    return out


def first_issue(desired: DesiredState, key: ObjectKey) -> str:
    """The first issue of ``key``'s invalid file, as the plan's reasons quote it."""
    issues = desired.invalid.get(key, [])
    return str(issues[0]) if issues else "invalid"


@dataclass(frozen=True)
class Step:
    """One object's share of a plan, before admission and the mass-deletion guard.

    ``out``: actions that need no admission; ``deletions``: what the guard may hold back;
    ``action``/``request``: the candidate for admission (its order is the caller's: it depends
    on the clock), made from a spec committed at ``created_at``.
    """

    out: tuple[Action, ...] = ()
    deletions: tuple[Action, ...] = ()
    action: Action | None = None
    request: Mapping[str, float] | None = None
    created_at: int = 0

    @property
    def busy(self) -> bool:
        """True when the plan changes this object (admission never preempts it on top)."""
        return self.action is not None or any(a.type is not ActionType.KEEP for a in (*self.out, *self.deletions))


_IN_SYNC = Step()


def _plan_models(
    desired: DesiredState,
    actual: ActualState,
    out: list[Action],
    cands: list[Candidate],
    deletions: list[Action],
    order: Order,
) -> None:
    invalid = {k for k in desired.invalid if k.kind == "model"}
    jobs_by_key = runs_by_key(actual)
    for key in sorted(set(desired.models) | set(actual.models) | invalid, key=_by_name):
        spec = desired.models.get(key)
        issue = first_issue(desired, key) if key in invalid else None
        checkpoint = source_checkpoint(spec, jobs_by_key) if spec is not None else None
        _collect(
            model_step(key, spec, actual.models.get(key), issue, desired.cluster, checkpoint),
            out,
            cands,
            deletions,
            order,
            key,
        )


def _collect(
    step: Step, out: list[Action], cands: list[Candidate], deletions: list[Action], order: Order, key: ObjectKey
) -> None:
    out.extend(step.out)
    deletions.extend(step.deletions)
    if step.action is not None:
        assert step.request is not None
        cands.append(Candidate(order.of(key, step.created_at), step.action, step.request))


def source_checkpoint(spec: ModelSpec, jobs_by_key: Mapping[ObjectKey, list[ActualJob]]) -> str | None:
    """The checkpoint a ``source: task:<name>`` model deploys (its task's latest success), else None."""
    if not spec.source_task:
        return None
    task_key = ObjectKey(spec.key.user, "task", spec.source_task)
    job = latest_success(jobs_by_key.get(task_key, []), task_key)
    return job.hf_checkpoint if job is not None else None


def model_step(
    key: ObjectKey,
    spec: ModelSpec | None,
    live: ActualModel | None,
    issue: str | None,
    cluster: ClusterSpec,
    checkpoint: str | None,
) -> Step:
    """What the plan does with model ``key``: ``issue`` is its file's first issue when the file
    is invalid (else None), ``checkpoint`` what :func:`source_checkpoint` found for it."""
    if issue is not None:
        why = "kept as it runs" if live else "not deployed"
        return Step((Action(ActionType.KEEP, key, f"{why}: the file is invalid ({issue})"),))
    if spec is None:
        assert live is not None
        return Step(deletions=(Action(ActionType.DELETE_MODEL, key, "file removed from the repository"),))
    if spec.suspend:
        return Step((Action(ActionType.KEEP, key, "suspended: left exactly as it is"),))
    if spec.replicas == 0:
        if live is not None:
            reason = f"replicas: 0: stopping {spec.served_name} (its name, file and status are kept)"
            return Step((Action(ActionType.STOP_MODEL, key, reason, replicas=0),))
        return _IN_SYNC  # stopped: nothing to resolve, nothing to admit
    source_path = spec.source_path
    if spec.source_task:
        if not checkpoint:
            if live:
                return Step(
                    (Action(ActionType.KEEP, key, f"kept as it runs: no checkpoint of task {spec.source_task} yet"),)
                )
            return Step((Action(ActionType.QUEUE, key, f"waiting for task {spec.source_task}"),))
        source_path = checkpoint
    else:
        checkpoint = None
    digest = model_spec_hash(spec, cluster, checkpoint)
    per_replica = model_resources_per_replica(spec, cluster)
    kind, demand = ActionType.SCALE_MODEL, {}
    changed: tuple[str, ...] = ()
    plural = "s" if spec.replicas > 1 else ""
    if live is None:
        kind, demand = ActionType.DEPLOY_MODEL, scale(per_replica, spec.replicas)
        reason = f"new model {spec.served_name} ({spec.replicas} replica{plural})"
    elif live.spec_hash != digest:
        kind, demand = ActionType.UPDATE_MODEL, _positive(sub(scale(per_replica, spec.replicas), live.committed()))
        changed = _model_changes(live.spec, model_spec_fields(spec, cluster, checkpoint))
        if live.replicas != spec.replicas:
            changed = (*changed, f"replicas: {live.replicas} → {spec.replicas}")
        what = summarise(changed) if changed else "source, engine_kwargs, GPUs or env (not recorded by the app)"
        reason = f"spec changed: {what}: restart with the new config"
    elif live.replicas != spec.replicas:
        demand = scale(per_replica, max(0, spec.replicas - live.replicas))
        reason = f"replicas {live.replicas} → {spec.replicas} (in place)"
    else:
        return _IN_SYNC
    action = Action(kind, key, reason, digest, spec.replicas, source_path, demand=demand, changed=changed)
    if demand:
        return Step(action=action, request=scale(per_replica, spec.replicas), created_at=spec.created_at)
    return Step((action,))  # scale-down: frees capacity, needs no admission


def _model_changes(old: Mapping[str, object] | None, new: Mapping[str, object]) -> tuple[str, ...]:
    """Field-level diff against what the app recorded; () when it recorded nothing."""
    if old is None:
        return ()
    return field_diff(old, new)


def _plan_tasks(
    desired: DesiredState,
    actual: ActualState,
    out: list[Action],
    cands: list[Candidate],
    deletions: list[Action],
    order: Order,
) -> None:
    invalid = {k for k in desired.invalid if k.kind == "task"}
    jobs_by_key = runs_by_key(actual)  # one pass: actual.jobs_of() per task is quadratic
    ray_keys = {j.key for j in actual.jobs}
    for key in sorted(set(desired.tasks) | invalid | ray_keys, key=_by_name):
        issue = first_issue(desired, key) if key in invalid else None
        step = task_step(
            key, desired.tasks.get(key), jobs_by_key.get(key, []), issue, desired.cluster, actual.foreign_ids
        )
        _collect(step, out, cands, deletions, order, key)


def task_step(
    key: ObjectKey,
    spec: TaskSpec | None,
    jobs: list[ActualJob],
    issue: str | None,
    cluster: ClusterSpec,
    foreign: Container[str],
) -> Step:
    """What the plan does with task ``key``, whose runs are ``jobs``: ``issue`` is its file's first
    issue when the file is invalid (else None); ``foreign``: submission ids argus may not use."""
    if issue is not None:
        running = any(j.active for j in jobs)
        why = "kept as it runs" if running else "not submitted"
        return Step((Action(ActionType.KEEP, key, f"{why}: the file is invalid ({issue})"),))
    if spec is None:
        stops = tuple(
            Action(ActionType.STOP_TASK, key, "file removed from the repository", submission_id=job.submission_id)
            for job in jobs
            if job.active
        )
        return Step(deletions=stops) if stops else _IN_SYNC
    if spec.suspend:
        return Step((Action(ActionType.KEEP, key, "suspended: left exactly as it is"),))
    out: list[Action] = []
    digest, sid = task_spec_hash(spec), _free_submission_id(spec, foreign)
    for job in jobs:
        if job.active and job.spec_hash != digest and job.submission_id != sid:
            changed = field_diff(job.spec, task_spec_fields(spec)) if job.spec is not None else ()
            what = f" ({summarise(changed)})" if changed else ""
            out.append(
                Action(
                    ActionType.STOP_TASK,
                    key,
                    f"spec changed: stopping the old run {job.submission_id}{what}",
                    submission_id=job.submission_id,
                    changed=changed,
                )
            )
    attempts = [j for j in jobs if j.submission_id == sid or j.spec_hash == digest]
    resume = _preempted_attempt(attempts)
    if attempts and resume is None:
        # this spec already ran or runs (in Ray or on the status branch): never resubmitted
        return Step(tuple(out)) if out else _IN_SYNC
    demand = task_resources(spec, cluster)
    plural = "s" if spec.gpus != 1 else ""
    if resume is not None:
        sid = _next_attempt(spec, attempts, foreign)
        reason = f"resume run {sid} ({spec.workload}, {spec.gpus} GPU{plural}) from preempted {resume}"
    else:
        reason = f"new run {sid} ({spec.workload}, {spec.gpus} GPU{plural})"
        if sid != submission_id(spec):
            reason += f"; {submission_id(spec)} is held by a job argus did not submit"
    action = Action(
        ActionType.SUBMIT_TASK,
        key,
        reason,
        spec_hash=digest,
        submission_id=sid,
        demand=demand,
        resume_from=resume,
        first_attempt=min(attempts, key=lambda j: _attempt_of(j.submission_id)).submission_id if resume else None,
    )
    return Step(tuple(out), action=action, request=demand, created_at=spec.created_at)


def _by_name(key: ObjectKey) -> tuple[str, str, str]:
    """ObjectKey's own order as a plain tuple (sorting 10,000 dataclasses by __lt__ is slow)."""
    return (key.user, key.kind, key.name)


def _free_submission_id(spec: TaskSpec, foreign: Container[str]) -> str:
    """The first submission id of ``spec`` no foreign job holds. Deterministic: a restarted
    daemon that sees the same foreign jobs picks the same id (and the status branch records it)."""
    attempt = 1
    while (sid := submission_id(spec, attempt)) in foreign:
        attempt += 1
    return sid


def _preempted_attempt(attempts: list[ActualJob]) -> str | None:
    """The submission id of the run's latest attempt when argus preempted it (and none is
    active): the run resumes in a new attempt. None otherwise (it runs, or it ended)."""
    if not attempts or any(j.active for j in attempts):
        return None
    latest = max(attempts, key=lambda j: (_attempt_of(j.submission_id), j.submission_id))
    return latest.submission_id if latest.status == PREEMPTED else None


def _attempt_of(sid: str) -> int:
    parsed = parse_submission_id(sid)
    return parsed[3] if parsed is not None else 0


def _next_attempt(spec: TaskSpec, attempts: list[ActualJob], foreign: Container[str]) -> str:
    """The next attempt's submission id: after every attempt so far, none a foreign job holds."""
    attempt = max(_attempt_of(j.submission_id) for j in attempts) + 1
    while (sid := submission_id(spec, attempt)) in foreign:
        attempt += 1
    return sid


def runs_by_key(actual: ActualState) -> dict[ObjectKey, list[ActualJob]]:
    """Every run by task: Ray's jobs and the recorded runs Ray forgot (:meth:`ActualState.runs`)."""
    out: dict[ObjectKey, list[ActualJob]] = {}
    for job in actual.runs():
        out.setdefault(job.key, []).append(job)
    return out


def latest_success(jobs: list[ActualJob], key: ObjectKey) -> ActualJob | None:
    """The most recently finished SUCCEEDED run of task ``key`` that left a checkpoint."""
    done = [j for j in jobs if j.key == key and j.status == "SUCCEEDED" and j.hf_checkpoint]
    return max(done, key=lambda j: (j.end_time or 0, j.submission_id), default=None)


def _owned_keys(actual: ActualState) -> set[ObjectKey]:
    return set(actual.models) | {j.key for j in actual.jobs if j.active}


def _positive(res: Resources) -> dict[str, float]:
    return {k: v for k, v in res.items() if v > 0}


def guard(desired: DesiredState, actual: ActualState, deletions: list[Action], result: Plan) -> list[Action]:
    """Hold back mass deletions (Flux/Argo CD's most-reported disaster) unless approved."""
    if not deletions:
        return []
    owned = len(_owned_keys(actual))
    doomed = len({a.key for a in deletions})
    prune = desired.cluster.prune
    empty = not desired.keys()
    too_many = doomed > prune.max_fraction * owned and doomed > prune.min_deletions
    if not (too_many or (empty and doomed > 1)) or desired.approve_prune:
        if desired.approve_prune and (too_many or empty):
            result.notes.append(f"mass deletion of {doomed} of {owned} owned objects approved by the head commit")
        return deletions
    why = (
        "the desired tree has no objects under users/"
        if empty
        else f"it would delete {doomed} of {owned} owned objects "
        f"(more than {prune.max_fraction:.0%} and more than {prune.min_deletions})"
    )
    result.deletions_held = True
    result.notes.append(f"mass-deletion guard: no deletion applied because {why}; to approve, {APPROVE_HINT}")
    return [
        replace(a, type=ActionType.KEEP, reason=f"deletion held by the mass-deletion guard ({why})", held=True)
        for a in deletions
    ]
