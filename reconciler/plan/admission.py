"""Admission: which new models, scale-ups and task runs start now, and in what order. Pure.

- Order: first come, first served by the time the daemon **first saw** each object (recorded
  on the status branch, so it survives restarts), the commit time only as a tie-break. An
  author cannot move ahead by back-dating commits: a file first seen now is behind every
  object seen before, whatever its commit date says.
- A request larger than the whole cluster (``capacity.total``) or than its user's GPU quota
  can never be admitted as written: it is ``UNSCHEDULABLE`` and blocks nobody. So is one whose
  parts (a task's ``nodes`` x ``gpus_per_node``, a model's replicas) cannot be packed onto the
  nodes' total resources, when Ray reports nodes (``capacity.nodes``).
- Per node: a request that fits the summed free resources but not the nodes' free resources is
  queued, and never preempts (argus does not observe on which node running work is); one that
  is admitted takes its parts from specific nodes (:mod:`reconciler.plan.placement`).
- Policy (``admission.policy`` in cluster.yaml): ``BestEffortFIFO`` (default, Kueue's) lets a
  later request that fits start while an earlier one waits for more resources;
  ``StrictFIFO`` makes later requests for a resource wait behind the first one that waits for it.
- Quota waits never block other users, under either policy.
- Teams, priorities and fair share (:mod:`reconciler.plan.quota`): each team is a queue; the
  next object admitted is the head of the queue that stays within its nominal quota, then has
  the lowest fair share, then the highest priority, then was first seen first. Within a queue:
  highest priority first, then first seen. An object that does not fit may preempt running work
  (:mod:`reconciler.plan.preemption`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from reconciler.plan.actions import Action, ActionType, Plan
from reconciler.plan.actual import ActualState, Capacity, NodeCapacity
from reconciler.plan.demand import model_resources_per_replica, task_resources
from reconciler.plan.diff import summarise
from reconciler.plan.placement import (
    demand_parts,
    model_parts,
    never_fits,
    request_parts,
    task_parts,
    unit_of,
)
from reconciler.plan.pools import pooled_nodes
from reconciler.plan.preemption import choose_victims, may_preempt, reclaim_outlook, running_work, victim_action
from reconciler.plan.quota import EPS, Ledger, firm_over, firm_rule, fmt, protected_replicas, protection, quota_use
from reconciler.spec.types import GPU, NO_TEAM, ClusterSpec, DesiredState, ObjectKey

SHOWN_POSITIONS = 50


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

    @property
    def task(self) -> bool:
        return self.action.type is ActionType.SUBMIT_TASK


def order_time(key: ObjectKey, created_at: int, first_seen: Mapping[ObjectKey, int], now: int | None) -> int:
    """When ``key`` joined the queue: its recorded first sighting, else ``now``, else (no
    clock given, e.g. a unit test) its commit time."""
    seen = first_seen.get(key)
    if seen is not None:
        return seen
    return now if now is not None else created_at


def too_big(
    request: Mapping[str, float], user: str, cluster: ClusterSpec, total: Mapping[str, float], task: bool = False
) -> str | None:
    """Why ``request`` can never be admitted (larger than the cluster or the quota), else None.

    ``total`` empty means the cluster's size is unknown: only the quota is checked.
    """
    return over_quota(quota_use(request, task), user, cluster, task) or over_cluster(request, total)


def over_quota(amount: Mapping[str, float], user: str, cluster: ClusterSpec, task: bool) -> str | None:
    """Why a request of ``amount`` (quota resources: GPUs and driver slots) exceeds its user's cap
    or its team's nominal quota plus borrowing limit (Kueue's ExceedsMaxQuota), else None."""
    gpus = amount.get(GPU, 0.0)
    quota = cluster.quota(user)
    if quota is not None and gpus > quota + EPS:
        return f"needs {gpus:g} GPU but {user}'s quota is {quota} GPU{'s' if quota != 1 else ''}"
    if task and cluster.task_limit(user) == 0:
        return f"{user} may run no task (tasks: 0 in cluster.yaml)"
    group = cluster.team_of(user)
    team = cluster.teams.get(group)
    for r, v in sorted(amount.items()):
        most = team.max_quota(r) if team is not None else None
        if most is not None and v > most + EPS:
            what = "GPU" if r == GPU else "driver slots"
            return f"needs {v:g} {what} but team {group}'s nominal quota plus borrowing limit is {most:g}"
    return None


def quota_amount(desired: DesiredState, action: Action, resources: Mapping[str, float]) -> dict[str, float]:
    """The quota resources an action taking Ray ``resources`` counts. A model in CPU serving mode
    counts its ``gpus_per_replica`` per replica: the CPU profile stands in for a GPU cluster, and
    its quotas must hold as they would there."""
    cluster = desired.cluster
    if action.key.kind == "model" and cluster.serving.accelerator == "cpu":
        spec = desired.models.get(action.key)
        cpus = cluster.serving.cpus_per_replica
        if spec is not None and cpus > 0:
            return {GPU: resources.get("CPU", 0.0) / cpus * spec.gpus_per_replica}
    return quota_use(resources, task=action.type is ActionType.SUBMIT_TASK)


def over_cluster(request: Mapping[str, float], total: Mapping[str, float]) -> str | None:
    """Why ``request`` exceeds the whole cluster (``total``; empty: unknown), else None."""
    if total:
        over = {r: v for r, v in request.items() if v > total.get(r, 0.0) + EPS}
        if over:
            has = ", ".join(f"{total.get(r, 0.0):g} {r}" for r in sorted(over))
            return f"needs {fmt(request)} but the whole cluster has {has}"
    return None


def unschedulable(
    desired: DesiredState, total: Mapping[str, float] | None = None, nodes: Sequence[NodeCapacity] = ()
) -> list[tuple[ObjectKey, str]]:
    """Every valid, active object of ``desired`` that can never be admitted as written, with
    why (for ``argus validate``, which knows the quotas but not, offline, the cluster's size;
    ``argus plan --actual`` passes the cluster's ``total`` and its ``nodes``)."""
    out: list[tuple[ObjectKey, str]] = []
    cluster = desired.cluster
    nodes = pooled_nodes(nodes, cluster)
    for key, model in sorted(desired.models.items()):
        if model.suspend or model.replicas == 0:
            continue
        per = model_resources_per_replica(model, cluster)
        request = {r: v * model.replicas for r, v in per.items()}
        amount = {GPU: float(model.gpus_per_replica * model.replicas)}
        firm = protected_replicas(model, model.replicas, cluster) * float(model.gpus_per_replica)
        why = over_quota(amount, key.user, cluster, False)
        why = why or firm_over(cluster, key.user, firm, protection(model, cluster), total or {})
        why = why or over_cluster(request, total or {})
        why = why or never_fits(model_parts(model, cluster, model.replicas), nodes, "replica")
        if why:
            out.append((key, why))
    for key, task in sorted(desired.tasks.items()):
        if task.suspend:
            continue
        why = too_big(task_resources(task, cluster), key.user, cluster, total or {}, task=True)
        why = why or never_fits(task_parts(task, cluster), nodes, "node")
        if why:
            out.append((key, why))
    return out


def free_capacity(actual: ActualState, capacity: Capacity) -> dict[str, float]:
    """What new work may take: Ray's available resources minus what owned objects were
    granted but have not placed yet, capped by total minus everything owned objects hold."""
    return Ledger.of(ClusterSpec(), actual, capacity).free()


def admit(
    desired: DesiredState,
    actual: ActualState,
    capacity: Capacity,
    cands: list[Candidate],
    result: Plan,
    *,
    now: int | None = None,
    busy: frozenset[ObjectKey] = frozenset(),
) -> list[Action]:
    """Admit, queue or mark unschedulable every candidate; preempt running work where the
    rules allow (``busy``: objects this plan already changes, never preempted)."""
    out: list[Action] = []
    cluster = desired.cluster
    if not cands and not cluster.teams:  # steady state: nothing waits for admission, no accounting needed
        return out
    ledger = Ledger.of(cluster, actual, capacity, desired)
    if cands and not ledger.known:
        result.notes.append("capacity unknown (no capacity in the actual state): admission not checked")
    strict = cluster.admission.policy == "StrictFIFO"
    preempting = may_preempt(cluster)
    # A model whose scale-up or update waits keeps running its replicas: they stay preemptible,
    # or a change that never fits would shield the replicas the model borrows with.
    scaling = {c.action.key for c in cands if c.action.type in (ActionType.SCALE_MODEL, ActionType.UPDATE_MODEL)}
    work = running_work(desired, actual, busy - scaling, ledger.floors) if preempting and cands else []
    taken: set[ObjectKey] = set()  # preempted or admitted in this plan: not preempted (again)
    held: dict[ObjectKey, int] = {}  # a waiting scale-up: the index of its action in out
    dropped: set[int] = set()  # the actions of waiting scale-ups whose model was preempted since
    priority = {c.action.key: _priority(desired, c.action.key) for c in cands}
    amounts = {c.action.key: quota_amount(desired, c.action, c.action.demand) for c in cands}
    queues: dict[str, deque[Candidate]] = {}
    for cand in sorted(cands, key=lambda c: (-priority[c.action.key], *c.order, *c.action.key)):
        group = cluster.team_of(cand.action.key.user) if cluster.teams else NO_TEAM
        queues.setdefault(group, deque()).append(cand)
    pending = {c.action.key for c in cands}
    deferred: list[Candidate] = []
    waiting: list[int] = []  # indexes into out of queued actions, in queue order
    blocked: dict[str, ObjectKey] = {}  # StrictFIFO: resource -> first object queued for lack of it
    while queues or deferred:
        if queues:
            group = _next_queue(queues, ledger, priority, amounts) if len(queues) > 1 else next(iter(queues))
            cand = queues[group].popleft()
            if not queues[group]:
                del queues[group]
            preemptor = actual.preempted.get(cand.action.key)
            if preemptor is not None and preemptor in pending and (queues or deferred):
                deferred.append(cand)  # never readmitted ahead of the object it was preempted for
                continue
        else:
            cand = deferred.pop(0)
        action, user = cand.action, cand.action.key.user
        pending.discard(action.key)
        if action.key in taken:
            continue  # a scale-up or update whose model was preempted this tick: it waits for the next
        firm, firm_total, firm_why = firm_of(desired, action.key, ledger)
        never = over_quota(quota_amount(desired, action, cand.request), user, cluster, cand.task)
        never = never or firm_over(cluster, user, firm_total, firm_why, capacity.total)
        never = f"ExceedsMaxQuota: {never}" if never else over_cluster(cand.request, capacity.total)
        unit = unit_of(action.key)
        if never is None and capacity.nodes:
            never = never_fits(request_parts(desired, action.key), pooled_nodes(capacity.nodes, cluster), unit)
        if never is not None:
            held[action.key] = len(out)
            out.append(_unschedulable(action, never))
            continue
        amount = amounts[action.key]
        parts = demand_parts(desired, action) if ledger.nodes is not None else ()
        # Work reclaim could never stop borrows nothing, so no preemption makes room for it.
        short = ledger.firm_short(user, firm, firm_why) or ledger.short(user, amount, action.demand)
        short = short or ledger.node_short(parts, unit)
        behind = sorted(r for r, v in action.demand.items() if v > 0 and r in blocked) if ledger.known else []
        # A shortage on single nodes only never preempts: argus does not observe on which node
        # running work is, so it cannot tell whose stop would make room on one node.
        if short is not None and short.kind not in ("user", "node", "firm") and preempting and not behind:
            # With models on a cluster of their own, stopping a task frees nothing a model can
            # use, and the other way round: only work of the request's own kind may make room.
            mine = work if cluster.serving.ray_address is None else [w for w in work if w.key.kind == action.key.kind]
            victims = choose_victims(
                ledger, action.key, priority[action.key], amount, action.demand, mine, taken, now, actual.preempted
            )
            for victim, why in victims or []:
                taken.add(victim.key)
                if victim.key in held:
                    dropped.add(held.pop(victim.key))  # one action per object: the preemption
                out.append(victim_action(victim, action.key, why))
            if victims:
                short = None
        if short is not None:
            reason = short.reason
            if short.kind == "pool" and ledger.within_nominal(cluster.team_of(user), amount):
                # Its team's idle quota is lent: say what becomes of it, never promising a
                # reclaim the rules rule out.
                if behind:
                    tail = f"strict first come, first served: waiting behind {_firsts(blocked, behind)}"
                else:
                    tail = reclaim_outlook(ledger, action.key, priority[action.key], work, taken, now)
                reason = f"{reason}; {tail}"
            waiting.append(len(out))
            held[action.key] = len(out)
            out.append(_queued(action, reason))
            if strict and short.kind in ("capacity", "node"):
                for r in short.resources:
                    blocked.setdefault(r, action.key)
            continue
        if behind:
            waiting.append(len(out))
            held[action.key] = len(out)
            out.append(_queued(action, f"strict first come, first served: waiting behind {_firsts(blocked, behind)}"))
            continue
        ledger.take(user, amount, action.demand, firm)
        taken.add(action.key)
        # Admitted after preemption, its parts may not fit the nodes' free resources yet: the
        # victims' resources come back on nodes argus does not observe, so none are taken then.
        ledger.place(parts)
        out.append(action)
    for place, index in enumerate((i for i in waiting if i not in dropped), start=1):
        queued = out[index]
        # Exact places only near the head: further back a moving queue would rewrite every
        # waiting object's status document on every admission.
        where = f"queue position {place}" if place <= SHOWN_POSITIONS else f"behind {SHOWN_POSITIONS}+ in the queue"
        out[index] = replace(queued, position=place, reason=f"{queued.reason} [{where}]")
    if dropped:
        out = [a for i, a in enumerate(out) if i not in dropped]
    if cluster.teams:
        result.teams = ledger.summary()
    return out


def _firsts(blocked: Mapping[str, ObjectKey], behind: Sequence[str]) -> str:
    return ", ".join(f"{blocked[r]} ({r})" for r in behind)


def firm_of(desired: DesiredState, key: ObjectKey, ledger: Ledger) -> tuple[float, float, str]:
    """The GPUs that reclaim could never stop which admitting ``key`` adds to its queue, all
    ``key`` holds of them once admitted, and why they cannot be preempted ((0, 0, "") for a task,
    and whenever :func:`firm_rule` is off)."""
    model = desired.models.get(key) if key.kind == "model" else None
    if model is None or not firm_rule(desired.cluster):
        return 0.0, 0.0, ""
    total = protected_replicas(model, model.replicas, desired.cluster) * float(model.gpus_per_replica)
    return total - ledger.firm_models.get(key, 0.0), total, protection(model, desired.cluster)


def _priority(desired: DesiredState, key: ObjectKey) -> int:
    spec = desired.models.get(key) if key.kind == "model" else desired.tasks.get(key)
    return desired.cluster.priority_value(key.kind, spec.priority if spec is not None else None)


def _next_queue(
    queues: Mapping[str, deque[Candidate]],
    ledger: Ledger,
    priority: Mapping[ObjectKey, int],
    amounts: Mapping[ObjectKey, Mapping[str, float]],
) -> str:
    """The queue whose head goes next: within its nominal quota first (Kueue admits work that
    needs no borrowing first), then the lowest fair share with the head admitted, then the head's
    priority and first sighting."""

    def rank(group: str) -> tuple[bool, float, int, int, int, tuple[str, str, str]]:
        head = queues[group][0]
        amount = amounts[head.action.key]
        share = ledger.share(group, amount)
        return (
            not ledger.within_nominal(group, amount),
            share,
            -priority[head.action.key],
            *head.order,
            head.action.key,
        )

    return min(queues, key=rank)


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
