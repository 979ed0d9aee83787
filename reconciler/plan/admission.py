"""Admission: which new models, scale-ups and task runs start now, and in what order. Pure.

- Order: first come, first served by the time the daemon **first saw** each object (recorded
  on the status branch, so it survives restarts), the commit time only as a tie-break. An
  author cannot move ahead by back-dating commits: a file first seen now is behind every
  object seen before, whatever its commit date says.
- A request larger than the whole cluster (``capacity.total``) or than its user's GPU quota
  can never be admitted as written: it is ``UNSCHEDULABLE`` and blocks nobody.
- Policy (``admission.policy`` in cluster.yaml): ``BestEffortFIFO`` (default, Kueue's) lets a
  later request that fits start while an earlier one waits for more resources;
  ``StrictFIFO`` makes later requests for a resource wait behind the first one that waits for it.
- Quota waits never block other users, under either policy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from reconciler.plan.actions import Action, ActionType, Plan
from reconciler.plan.actual import ActualState, Capacity, sub
from reconciler.plan.demand import model_resources_per_replica, task_resources
from reconciler.plan.diff import summarise
from reconciler.spec.types import ClusterSpec, DesiredState, ObjectKey

EPS = 1e-9


@dataclass(frozen=True)
class Candidate:
    """New work waiting for admission.

    ``order``: (first seen, commit time); ``request``: everything the object holds once the
    action is done (what must fit in the cluster and the quota at all); ``action.demand``:
    what the action adds now (what must fit in free capacity).
    """

    order: tuple[int, int]
    action: Action
    request: Mapping[str, float]


def order_time(key: ObjectKey, created_at: int, first_seen: Mapping[ObjectKey, int], now: int | None) -> int:
    """When ``key`` joined the queue: its recorded first sighting, else ``now``, else (no
    clock given, e.g. a unit test) its commit time."""
    seen = first_seen.get(key)
    if seen is not None:
        return seen
    return now if now is not None else created_at


def fmt(res: Mapping[str, float]) -> str:
    return ", ".join(f"{v:g} {k}" for k, v in sorted(res.items()) if v) or "nothing"


def too_big(request: Mapping[str, float], user: str, cluster: ClusterSpec, total: Mapping[str, float]) -> str | None:
    """Why ``request`` can never be admitted (larger than the cluster or the quota), else None.

    ``total`` empty means the cluster's size is unknown: only the quota is checked.
    """
    gpus = request.get("GPU", 0.0)
    quota = cluster.quota(user)
    if quota is not None and gpus > quota + EPS:
        return f"needs {gpus:g} GPU but {user}'s quota is {quota} GPU{'s' if quota != 1 else ''}"
    if total:
        over = {r: v for r, v in request.items() if v > total.get(r, 0.0) + EPS}
        if over:
            has = ", ".join(f"{total.get(r, 0.0):g} {r}" for r in sorted(over))
            return f"needs {fmt(request)} but the whole cluster has {has}"
    return None


def unschedulable(desired: DesiredState, total: Mapping[str, float] | None = None) -> list[tuple[ObjectKey, str]]:
    """Every valid, active object of ``desired`` that can never be admitted as written, with
    why (for ``argus validate``, which knows the quotas but not, offline, the cluster's size)."""
    out: list[tuple[ObjectKey, str]] = []
    cluster = desired.cluster
    for key, model in sorted(desired.models.items()):
        if model.suspend or model.replicas == 0:
            continue
        per = model_resources_per_replica(model, cluster)
        why = too_big({r: v * model.replicas for r, v in per.items()}, key.user, cluster, total or {})
        if why:
            out.append((key, why))
    for key, task in sorted(desired.tasks.items()):
        if task.suspend:
            continue
        why = too_big(task_resources(task, cluster), key.user, cluster, total or {})
        if why:
            out.append((key, why))
    return out


def accounting(actual: ActualState) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
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
    unplaced, committed, _ = accounting(actual)
    cap = sub(capacity.total, committed)
    return {k: max(0.0, min(v, cap.get(k, v))) for k, v in sub(capacity.available, unplaced).items()}


def admit(
    desired: DesiredState, actual: ActualState, capacity: Capacity, cands: list[Candidate], result: Plan
) -> list[Action]:
    """Admit, queue or mark unschedulable every candidate, oldest first."""
    out: list[Action] = []
    if not cands:  # steady state: nothing waits for admission, no accounting needed
        return out
    known = bool(capacity.total or capacity.available)
    if not known:
        result.notes.append("capacity unknown (no capacity in the actual state): admission not checked")
    strict = desired.cluster.admission.policy == "StrictFIFO"
    unplaced, committed, used = accounting(actual)
    cap = sub(capacity.total, committed)
    free = {k: max(0.0, min(v, cap.get(k, v))) for k, v in sub(capacity.available, unplaced).items()}
    blocked: dict[str, ObjectKey] = {}  # StrictFIFO: resource -> first object queued for lack of it
    for cand in sorted(cands, key=lambda c: (*c.order, *c.action.key)):
        action, user = cand.action, cand.action.key.user
        never = too_big(cand.request, user, desired.cluster, capacity.total)
        if never is not None:
            out.append(_unschedulable(action, never))
            continue
        gpus = action.demand.get("GPU", 0.0)
        quota = desired.cluster.quota(user)
        if quota is not None and gpus and used.get(user, 0.0) + gpus > quota:
            reason = f"user quota: needs {gpus:g} GPU, {user} holds {used.get(user, 0.0):g} of {quota} GPUs"
            out.append(_queued(action, reason))
            continue
        if known:
            short = {r: v - free.get(r, 0.0) for r, v in action.demand.items() if v > free.get(r, 0.0) + EPS}
            behind = sorted(r for r, v in action.demand.items() if v > 0 and r in blocked)
            if short:
                have = ", ".join(f"{free.get(r, 0.0):g} {r}" for r in sorted(short))
                reason = f"insufficient capacity: needs {fmt(action.demand)}, free {have} (short by {fmt(short)})"
                out.append(_queued(action, reason))
                if strict:
                    for r in short:
                        blocked.setdefault(r, action.key)
                continue
            if behind:
                firsts = ", ".join(f"{blocked[r]} ({r})" for r in behind)
                out.append(_queued(action, f"strict first come, first served: waiting behind {firsts}"))
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
    return replace(action, type=ActionType.QUEUE, reason=_with_changes(action, f"{what}: {reason}" if what else reason))


def _unschedulable(action: Action, why: str) -> Action:
    what = {
        ActionType.SCALE_MODEL: "scale-up unschedulable (running replicas are kept)",
        ActionType.UPDATE_MODEL: "update unschedulable (old version keeps running)",
    }.get(action.type, "unschedulable")
    reason = f"{what}: {why}; it blocks nobody: change the file to run it"
    return replace(action, type=ActionType.UNSCHEDULABLE, reason=_with_changes(action, reason))


def _with_changes(action: Action, reason: str) -> str:
    """Keep the field-level diff of an update that waits, so the reviewer still sees it."""
    return f"{reason} ({summarise(action.changed)})" if action.changed else reason
