"""Preemption: which running work a waiting object may stop, as Kueue chooses it. Pure.

Rules, in order (``preemption:`` in cluster.yaml):

1. **Reclaim** (Kueue's ``reclaimWithinCohort``): an object whose team stays within its nominal
   quota once admitted, counting its own lower-priority work that stops for it, may stop work of
   *other* queues that borrow (use more than their nominal quota; users in no team always
   borrow) — of any priority (``Any``, the default), only of lower priority (``LowerPriority``),
   or never. Its own victims and the borrowers' are chosen together, as Kueue preempts in every
   ClusterQueue of the cohort at once: when both must stop for it, both do.
2. **Within the team** (``withinClusterQueue``): lower-priority work of the object's own queue
   (the only victims of an object that borrows once admitted).
3. Never: work of another team within its nominal quota, whatever its priority; work of equal
   or higher priority of the same team; a task that has run less than ``min_run_seconds``
   (hysteresis); a model's replicas up to its ``min_replicas`` (and models at all unless the
   admin allows it); the object that preempted the waiting object (no loops).

Victims are tried reclaim first, then lowest priority, then most recently started (the least
work lost), and only as many as needed: once the object fits, each victim is put back if the
object still fits without stopping it. Admission lets only reclaimable work borrow
(:attr:`reconciler.plan.quota.Ledger.firm`), so reclaim can always give a team its nominal quota.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from reconciler.plan.actions import Action, ActionType
from reconciler.plan.actual import ActualState
from reconciler.plan.quota import Ledger, model_gpus, protected_replicas, quota_use, stale_model
from reconciler.spec.hashing import model_spec_hash, task_spec_hash
from reconciler.spec.types import GPU, NO_TEAM, ClusterSpec, DesiredState, ObjectKey

RECLAIM = "reclaim"
WITHIN_TEAM = "within team"


@dataclass(frozen=True)
class Running:
    """Running work that could be preempted: what it holds and what stopping it frees."""

    key: ObjectKey
    group: str
    priority: int
    amount: Mapping[str, float]  # quota resources freed
    real: Mapping[str, float]  # Ray resources freed
    started: float | None  # epoch seconds the run started (tasks); None: unknown
    submission_id: str | None = None  # a task's run
    replicas: int | None = None  # a model: replicas it keeps (its min_replicas)
    spec_hash: str | None = None
    source_path: str | None = None
    # A model's replica its file protects that its queue's nominal quota does not
    # (:meth:`reconciler.plan.quota.Ledger._cap_firm`): only reclaim may stop it.
    beyond: bool = False
    # A model running another spec than its file's, past its queue's limit: removed whole.
    stale: bool = False


def may_preempt(cluster: ClusterSpec) -> bool:
    """Whether any preemption is possible: teams to reclaim for, or priorities to preempt by."""
    policy = cluster.preemption
    reclaim = bool(cluster.teams) and policy.reclaim != "Never"
    within = len(set(cluster.priority_classes.values())) > 1 and policy.within_team != "Never"
    return reclaim or within


def running_work(
    desired: DesiredState,
    actual: ActualState,
    busy: frozenset[ObjectKey],
    floors: Mapping[ObjectKey, int] | None = None,
) -> list[Running]:
    """Every owned object running as its file says that preemption may stop (or scale down).
    ``floors``: models whose protected replicas are capped (:attr:`Ledger.floors`).

    ``busy``: objects the plan already changes (not preempted on top). A task whose file is
    invalid, or gone while the mass-deletion guard holds its stop back, counts at its kind's
    default priority: breaking or removing a file does not shield borrowed GPUs. Suspended
    objects count too: suspending holds a file's changes back, not the admin's quotas.
    """
    cluster = desired.cluster
    out: list[Running] = []
    teamed = bool(cluster.teams)
    for job in actual.jobs:
        if not job.active or job.key in busy:
            continue
        spec = desired.tasks.get(job.key)
        if spec is not None and job.spec_hash != task_spec_hash(spec):
            continue  # an old spec's run, stopped by the plan
        out.append(
            Running(
                key=job.key,
                group=cluster.team_of(job.key.user) if teamed else "",
                priority=cluster.priority_value("task", spec.priority if spec is not None else None),
                amount=quota_use(job.resources, task=True),
                real=dict(job.resources),
                started=job.start_time / 1000 if job.start_time is not None else None,
                submission_id=job.submission_id,
            )
        )
    if not cluster.preemption.models:
        return out
    for key, live in actual.models.items():
        model = desired.models.get(key)
        if key in busy:
            continue
        if stale_model(live, model, cluster):
            # Its replicas are all protected (:func:`stale_model`): only one its queue cannot
            # hold them for (floor 0) is reclaimable, and only whole.
            if (floors or {}).get(key) == 0 and live.replicas > 0:
                out.append(
                    Running(
                        key=key,
                        group=cluster.team_of(key.user) if teamed else "",
                        priority=cluster.priority_value("model", model.priority if model is not None else None),
                        amount={GPU: model_gpus(live) * live.replicas},
                        real={r: v * live.replicas for r, v in live.resources_per_replica.items() if v},
                        started=None,
                        replicas=0,
                        spec_hash=live.spec_hash,
                        beyond=True,
                        stale=True,
                    )
                )
            continue
        assert model is not None  # a model without a file is stale
        protected = protected_replicas(model, live.replicas, cluster)
        floor = min(protected, (floors or {}).get(key, protected))
        if floor >= live.replicas or live.spec_hash != model_spec_hash(model, cluster):
            continue
        # One entry per spare replica, the last one first: a model loses only the replicas needed.
        one = {r: v for r, v in live.resources_per_replica.items() if v}
        for keep in range(live.replicas - 1, floor - 1, -1):
            out.append(
                Running(
                    key=key,
                    group=cluster.team_of(key.user) if teamed else "",
                    priority=cluster.priority_value("model", model.priority),
                    amount={GPU: model_gpus(live)},
                    real=one,
                    started=None,
                    replicas=keep,
                    spec_hash=live.spec_hash,
                    source_path=model.source_path,
                    beyond=keep < protected,
                )
            )
    return out


def choose_victims(
    ledger: Ledger,
    key: ObjectKey,
    priority: int,
    amount: Mapping[str, float],
    demand: Mapping[str, float],
    work: list[Running],
    taken: set[ObjectKey],
    now: int | None,
    preempted: Mapping[ObjectKey, ObjectKey],
) -> list[tuple[Running, str]] | None:
    """The fewest running objects to stop so that ``key`` fits, with why each may be stopped;
    None when no allowed set makes it fit (the ledger is then unchanged). The victims' resources
    are given back to ``ledger``."""
    cluster = ledger.cluster
    group = cluster.team_of(key.user) if cluster.teams else ""
    own: list[Running] = []
    others: list[Running] = []
    for w in eligible(ledger, key, priority, work, taken, now, preempted):
        (own if w.group == group else others).append(w)
    options = [(1, w, WITHIN_TEAM) for w in own]
    if others:
        freed: dict[str, float] = {}
        for w in own:
            for r, v in w.amount.items():
                freed[r] = freed.get(r, 0.0) + v
        # Reclaim only for an object its team holds within its nominal quota once its own
        # victims stop: both kinds are searched together (Kueue's "preempt from all
        # ClusterQueues in cohort"), and the object must end within its nominal quota.
        if ledger.within_nominal(group, amount, freed):
            found = _search(ledger, key.user, amount, demand, [(0, w, RECLAIM) for w in others] + options, group)
            if found is not None:
                return found
    return _search(ledger, key.user, amount, demand, options, None) if options else None


def eligible(
    ledger: Ledger,
    key: ObjectKey,
    priority: int,
    work: list[Running],
    taken: set[ObjectKey],
    now: int | None,
    preempted: Mapping[ObjectKey, ObjectKey],
) -> list[Running]:
    """The running work the rules let ``key`` (of ``priority``) stop: lower-priority work of its
    own queue, and work of other queues that borrow now (reclaim; whether ``key`` may reclaim at
    all depends on its team's nominal quota, :func:`choose_victims`)."""
    cluster = ledger.cluster
    policy = cluster.preemption
    group = cluster.team_of(key.user) if cluster.teams else ""
    reclaim = bool(cluster.teams) and policy.reclaim != "Never" and group != NO_TEAM
    out = []
    for w in work:
        if w.key in taken or w.key == key or preempted.get(key) == w.key:
            continue
        if w.submission_id is not None and not _old_enough(w, now, policy.min_run_seconds):
            continue
        if w.group == group:
            if policy.within_team != "Never" and w.priority < priority and not w.beyond:
                out.append(w)
        elif reclaim and ledger.borrowing(w.group) and (policy.reclaim == "Any" or w.priority < priority):
            out.append(w)
    return out


def _search(
    ledger: Ledger,
    user: str,
    amount: Mapping[str, float],
    demand: Mapping[str, float],
    options: list[tuple[int, Running, str]],
    nominal: str | None,
) -> list[tuple[Running, str]] | None:
    """Stop ``options`` in order until ``user``'s request fits (within queue ``nominal``'s nominal
    quota too, unless None), then put back each victim it fits without; None (ledger unchanged)
    when even all of them are not enough."""

    def fits() -> bool:
        if ledger.short(user, amount, demand) is not None:
            return False
        return nominal is None or ledger.within_nominal(nominal, amount)

    options = sorted(options, key=lambda o: (o[0], o[1].priority, -_started(o[1]), o[1].key, -(o[1].replicas or 0)))
    chosen: list[tuple[Running, str]] = []
    found = False
    for rank, w, why in options:
        if rank == 0 and not ledger.borrowing(w.group):
            continue  # earlier victims brought its queue back within its nominal quota
        ledger.give_back(w.key.user, w.amount, w.real)
        chosen.append((w, why))
        if fits():
            found = True
            break
    if not found:
        for w, _why in chosen:
            ledger.take(w.key.user, w.amount, w.real)
        return None
    for item in reversed(list(chosen)):  # keep only the victims it cannot fit without
        w = item[0]
        ledger.take(w.key.user, w.amount, w.real)
        if fits():
            chosen.remove(item)
        else:
            ledger.give_back(w.key.user, w.amount, w.real)
    # A model's replicas were tried one at a time: it keeps the fewest replicas any chosen entry keeps.
    models: dict[ObjectKey, tuple[Running, str]] = {}
    for w, why in chosen:
        if w.replicas is not None and (w.key not in models or w.replicas < (models[w.key][0].replicas or 0)):
            models[w.key] = (w, why)
    return [(w, why) for w, why in chosen if w.replicas is None] + sorted(models.values(), key=lambda m: m[0].key)


def reclaim_outlook(
    ledger: Ledger,
    key: ObjectKey,
    priority: int,
    work: list[Running],
    taken: set[ObjectKey],
    now: int | None,
) -> str:
    """What becomes of the idle quota of ``key``'s team that others borrow, when reclaiming it
    did not make room this tick: never a promise of a reclaim the rules rule out."""
    cluster = ledger.cluster
    policy = cluster.preemption
    if policy.reclaim == "Never":
        return "`preemption.reclaim: Never`: it comes back as their work ends"
    group = cluster.team_of(key.user)
    # ``work`` is what preemption may ever stop: a borrower's work missing from it never is.
    lent = [w for w in work if w.group != group and w.key not in taken and ledger.borrowing(w.group)]
    if policy.reclaim == "LowerPriority":
        lower = [w for w in lent if w.priority < priority]
        if lent and not lower:
            why = "`preemption.reclaim: LowerPriority` and their work is not of lower priority"
            return f"{why}: it comes back as it ends"
        lent = lower
    if not lent:
        return "what they run on it cannot be preempted: it comes back only when that work stops"
    if any(w.submission_id is not None and not _old_enough(w, now, policy.min_run_seconds) for w in lent):
        return f"reclaimed once their tasks have run `preemption.min_run_seconds` ({policy.min_run_seconds} s)"
    return "it comes back as their work ends"


def _started(w: Running) -> float:
    """When ``w`` started; unknown counts as just now (stopping it loses the least)."""
    return w.started if w.started is not None else math.inf


def _old_enough(w: Running, now: int | None, min_run_seconds: int) -> bool:
    """Hysteresis: a task is preemptible once it has run ``min_run_seconds`` (unknown: not yet)."""
    if min_run_seconds <= 0:
        return True
    if now is None or w.started is None:
        return False
    return now - w.started >= min_run_seconds


def victim_action(w: Running, by: ObjectKey, why: str) -> Action:
    """The stop (task) or scale-down to ``min_replicas`` (model) that preempts ``w`` for ``by``."""
    if w.submission_id is not None:
        reason = f"Preempted by {by} ({why}): stopping run {w.submission_id}; it resumes when there is room"
        return Action(
            ActionType.STOP_TASK, w.key, reason, submission_id=w.submission_id, preempted_by=by, preemption=why
        )
    floor = (
        "its team holds more work that cannot be preempted than its nominal quota: only what fits it is protected"
        if w.beyond
        else "its min_replicas is the floor"
    )
    reason = f"Preempted by {by} ({why}): scaled down to {w.replicas} replicas ({floor})"
    if w.stale:
        reason = (
            f"Preempted by {by} ({why}): removed from Serve until there is room (it runs another spec than its "
            "file's: its file is invalid or removed, or its update waits, so it cannot be scaled down; its team "
            "holds more work that cannot be preempted than its nominal quota: only what fits it is protected)"
        )
    return Action(
        ActionType.SCALE_MODEL,
        w.key,
        reason,
        spec_hash=w.spec_hash,
        replicas=w.replicas,
        source_path=w.source_path,
        preempted_by=by,
        preemption=why,
    )
