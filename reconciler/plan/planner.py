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
5. New work and scale-ups are admitted first come, first served (by the time the file first
   appeared in git) within free capacity and per-user GPU quotas; the rest is queued.
6. The mass-deletion guard holds back deletions unless the head commit approves them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from reconciler.plan.actions import Action, ActionType, Plan
from reconciler.plan.actual import ActualJob, ActualState, Capacity, Resources, scale, sub
from reconciler.plan.demand import model_resources_per_replica, task_resources
from reconciler.spec.hashing import model_spec_hash, submission_id, task_spec_hash
from reconciler.spec.types import DesiredState, ObjectKey, TaskSpec

APPROVE_HINT = (
    "push a commit whose message has the trailer `Argus-Approve-Prune: yes` (or run `argus plan --approve-prune`)"
)


@dataclass(frozen=True)
class _Candidate:
    """New work waiting for admission."""

    created_at: int
    action: Action


def plan(desired: DesiredState, actual: ActualState, capacity: Capacity | None = None) -> Plan:
    """Return the ordered :class:`Plan` that makes ``actual`` match ``desired``.

    ``capacity`` defaults to ``actual.capacity``; empty capacity means "unknown" and admits
    everything (noted in the plan). Raises nothing for bad input: it was reported by the loader.
    """
    capacity = capacity if capacity is not None else actual.capacity
    result = Plan()
    if not desired.cluster_valid:
        result.notes.append("cluster.yaml is invalid: nothing is changed until it is fixed")
        for key in sorted(_owned_keys(actual)):
            result.actions.append(Action(ActionType.KEEP, key, "kept as it runs: cluster.yaml is invalid"))
        return result

    direct: list[Action] = []
    candidates: list[_Candidate] = []
    deletions: list[Action] = []
    _plan_models(desired, actual, direct, candidates, deletions)
    _plan_tasks(desired, actual, direct, candidates, deletions)
    direct.extend(_admit(desired, actual, capacity, candidates, result))
    direct.extend(_guard(desired, actual, deletions, result))
    result.actions = sorted(direct, key=lambda a: a.sort_key)
    return result


def _first_issue(desired: DesiredState, key: ObjectKey) -> str:
    issues = desired.invalid.get(key, [])
    return str(issues[0]) if issues else "invalid"


def _plan_models(
    desired: DesiredState, actual: ActualState, out: list[Action], cands: list[_Candidate], deletions: list[Action]
) -> None:
    cluster = desired.cluster
    invalid = {k for k in desired.invalid if k.kind == "model"}
    jobs_by_key = _jobs_by_key(actual)
    for key in sorted(set(desired.models) | set(actual.models) | invalid, key=_by_name):
        live = actual.models.get(key)
        if key in invalid:
            why = "kept as it runs" if live else "not deployed"
            out.append(Action(ActionType.KEEP, key, f"{why}: the file is invalid ({_first_issue(desired, key)})"))
            continue
        spec = desired.models.get(key)
        if spec is None:
            assert live is not None
            deletions.append(Action(ActionType.DELETE_MODEL, key, "file removed from the repository"))
            continue
        if spec.suspend:
            out.append(Action(ActionType.KEEP, key, "suspended: left exactly as it is"))
            continue
        checkpoint, source_path = None, spec.source_path
        if spec.source_task:
            task_key = ObjectKey(key.user, "task", spec.source_task)
            job = latest_success(jobs_by_key.get(task_key, []), task_key)
            if job is None or not job.hf_checkpoint:
                if live:
                    out.append(
                        Action(ActionType.KEEP, key, f"kept as it runs: no checkpoint of task {spec.source_task} yet")
                    )
                else:
                    out.append(Action(ActionType.QUEUE, key, f"waiting for task {spec.source_task}"))
                continue
            checkpoint = source_path = job.hf_checkpoint
        digest = model_spec_hash(spec, cluster, checkpoint)
        per_replica = model_resources_per_replica(spec, cluster)
        kind, demand = ActionType.SCALE_MODEL, {}
        if live is None:
            kind, demand = ActionType.DEPLOY_MODEL, scale(per_replica, spec.replicas)
            reason = f"new model {spec.served_name} ({spec.replicas} replica{'s' if spec.replicas > 1 else ''})"
        elif live.spec_hash != digest:
            kind, demand = ActionType.UPDATE_MODEL, _positive(sub(scale(per_replica, spec.replicas), live.committed()))
            reason = "spec changed (source, engine_kwargs, GPUs or env): restart with the new config"
        elif live.replicas != spec.replicas:
            demand = scale(per_replica, max(0, spec.replicas - live.replicas))
            reason = f"replicas {live.replicas} -> {spec.replicas} (in place)"
        else:
            continue  # in sync
        action = Action(kind, key, reason, digest, spec.replicas, source_path, demand=demand)
        if demand:
            cands.append(_Candidate(spec.created_at, action))
        else:
            out.append(action)  # scale-down: frees capacity, needs no admission


def _plan_tasks(
    desired: DesiredState, actual: ActualState, out: list[Action], cands: list[_Candidate], deletions: list[Action]
) -> None:
    invalid = {k for k in desired.invalid if k.kind == "task"}
    jobs_by_key = _jobs_by_key(actual)  # one pass: actual.jobs_of() per task is quadratic
    ray_keys = {j.key for j in actual.jobs}
    for key in sorted(set(desired.tasks) | invalid | ray_keys, key=_by_name):
        jobs = jobs_by_key.get(key, [])
        if key in invalid:
            running = any(j.active for j in jobs)
            why = "kept as it runs" if running else "not submitted"
            out.append(Action(ActionType.KEEP, key, f"{why}: the file is invalid ({_first_issue(desired, key)})"))
            continue
        spec = desired.tasks.get(key)
        if spec is None:
            for job in jobs:
                if job.active:
                    deletions.append(
                        Action(
                            ActionType.STOP_TASK,
                            key,
                            "file removed from the repository",
                            submission_id=job.submission_id,
                        )
                    )
            continue
        if spec.suspend:
            out.append(Action(ActionType.KEEP, key, "suspended: left exactly as it is"))
            continue
        digest, sid = task_spec_hash(spec), _free_submission_id(spec, actual.foreign_ids)
        for job in jobs:
            if job.active and job.spec_hash != digest and job.submission_id != sid:
                out.append(
                    Action(
                        ActionType.STOP_TASK,
                        key,
                        f"spec changed: stopping the old run {job.submission_id}",
                        submission_id=job.submission_id,
                    )
                )
        if any(j.submission_id == sid or j.spec_hash == digest for j in jobs):
            continue  # this spec already ran or runs (in Ray or on the status branch): never resubmitted
        demand = task_resources(spec, desired.cluster)
        reason = f"new run {sid} ({spec.workload}, {spec.gpus} GPU{'s' if spec.gpus != 1 else ''})"
        if sid != submission_id(spec):
            reason += f"; {submission_id(spec)} is held by a job argus did not submit"
        action = Action(ActionType.SUBMIT_TASK, key, reason, spec_hash=digest, submission_id=sid, demand=demand)
        cands.append(_Candidate(spec.created_at, action))


def _by_name(key: ObjectKey) -> tuple[str, str, str]:
    """ObjectKey's own order as a plain tuple (sorting 10,000 dataclasses by __lt__ is slow)."""
    return (key.user, key.kind, key.name)


def _free_submission_id(spec: TaskSpec, foreign: frozenset[str]) -> str:
    """The first submission id of ``spec`` no foreign job holds. Deterministic: a restarted
    daemon that sees the same foreign jobs picks the same id (and the status branch records it)."""
    attempt = 1
    while (sid := submission_id(spec, attempt)) in foreign:
        attempt += 1
    return sid


def _jobs_by_key(actual: ActualState) -> dict[ObjectKey, list[ActualJob]]:
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


def _fmt(res: Mapping[str, float]) -> str:
    return ", ".join(f"{v:g} {k}" for k, v in sorted(res.items()) if v) or "nothing"


def _accounting(actual: ActualState) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """One pass over owned objects: (granted but not placed, committed, GPUs held per user).

    Written with plain loops: at 10,000 owned objects, building per-object dicts dominated
    the re-plan time.
    """
    unplaced: dict[str, float] = {}
    committed: dict[str, float] = {}
    used: dict[str, float] = {}
    for model in actual.models.values():
        waiting = max(0, model.replicas - model.ready_replicas)
        for r, v in model.resources_per_replica.items():
            committed[r] = committed.get(r, 0.0) + v * model.replicas
            if waiting:
                unplaced[r] = unplaced.get(r, 0.0) + v * waiting
        gpus = model.resources_per_replica.get("GPU", 0.0) * model.replicas
        used[model.key.user] = used.get(model.key.user, 0.0) + gpus
    for job in actual.jobs:
        if not job.active:
            continue
        for r, v in job.resources.items():
            committed[r] = committed.get(r, 0.0) + v
            if job.status != "RUNNING":
                unplaced[r] = unplaced.get(r, 0.0) + v
        used[job.key.user] = used.get(job.key.user, 0.0) + job.resources.get("GPU", 0.0)
    return unplaced, committed, used


def free_capacity(actual: ActualState, capacity: Capacity) -> dict[str, float]:
    """What new work may take: Ray's available resources minus what owned objects were
    granted but have not placed yet, capped by total minus everything owned objects hold."""
    unplaced, committed, _ = _accounting(actual)
    cap = sub(capacity.total, committed)
    return {k: max(0.0, min(v, cap.get(k, v))) for k, v in sub(capacity.available, unplaced).items()}


def _admit(
    desired: DesiredState, actual: ActualState, capacity: Capacity, cands: list[_Candidate], result: Plan
) -> list[Action]:
    out: list[Action] = []
    if not cands:  # steady state: nothing waits for admission, no accounting needed
        return out
    known = bool(capacity.total or capacity.available)
    if not known:
        result.notes.append("capacity unknown (no capacity in the actual state): admission not checked")
    unplaced, committed, used = _accounting(actual)
    cap = sub(capacity.total, committed)
    free = {k: max(0.0, min(v, cap.get(k, v))) for k, v in sub(capacity.available, unplaced).items()}
    blocked: dict[str, ObjectKey] = {}  # resource -> first object queued for lack of it
    for cand in sorted(cands, key=lambda c: (c.created_at, *_by_name(c.action.key))):
        action, user = cand.action, cand.action.key.user
        gpus = action.demand.get("GPU", 0.0)
        quota = desired.cluster.quota(user)
        if quota is not None and gpus and used.get(user, 0.0) + gpus > quota:
            reason = f"user quota: needs {gpus:g} GPU, {user} holds {used.get(user, 0.0):g} of {quota} GPUs"
            out.append(_queued(action, reason))
            continue
        if known:
            short = {r: v - free.get(r, 0.0) for r, v in action.demand.items() if v > free.get(r, 0.0) + 1e-9}
            behind = sorted(r for r, v in action.demand.items() if v > 0 and r in blocked)
            if short:
                have = ", ".join(f"{free.get(r, 0.0):g} {r}" for r in sorted(short))
                reason = f"insufficient capacity: needs {_fmt(action.demand)}, free {have} (short by {_fmt(short)})"
                out.append(_queued(action, reason))
                for r in short:
                    blocked.setdefault(r, action.key)
                continue
            if behind:
                firsts = ", ".join(f"{blocked[r]} ({r})" for r in behind)
                out.append(_queued(action, f"first come, first served: waiting behind {firsts}"))
                continue
            free = sub(free, action.demand)
        used[user] = used.get(user, 0.0) + gpus
        out.append(action)
    return out


def _queued(action: Action, reason: str) -> Action:
    what = {
        ActionType.SCALE_MODEL: "scale-up queued",
        ActionType.UPDATE_MODEL: "update queued (old version keeps running)",
    }.get(action.type)
    return replace(action, type=ActionType.QUEUE, reason=f"{what}: {reason}" if what else reason)


def _guard(desired: DesiredState, actual: ActualState, deletions: list[Action], result: Plan) -> list[Action]:
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
        replace(a, type=ActionType.KEEP, reason=f"deletion held by the mass-deletion guard ({why})") for a in deletions
    ]
