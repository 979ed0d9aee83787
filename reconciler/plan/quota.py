"""Quota accounting, as Kueue's cohort does it: teams' nominal, borrowed and lent usage, users'
caps and the cluster's real free capacity, in one ledger that admission and preemption update. Pure.

The quota resources are GPUs and driver slots (``tasks``: one per active task, whose driver
takes ``training.driver_resources``). Every team is a ClusterQueue in the cluster's one cohort;
users in no team share one queue (``NO_TEAM``) with nominal quota 0, so all it runs is borrowed.

- **Pool**: what can be borrowed: every team's lendable nominal quota (nominal minus what it
  never lends) plus the cluster's capacity in no team's nominal quota (unlimited when the
  cluster's size is unknown). A team's use beyond its never-lent part draws from the pool, so a
  team using its own nominal quota takes back what others borrowed of it (reclaim).
- **Borrowing limit**: a team never uses more than nominal + borrowing limit.
- **Fair share**: a queue's dominant-resource share is its largest use beyond nominal, as a
  fraction of the pool, divided by its weight.
- **Firm work**: GPUs held by work reclaim can never stop (a model's replicas up to its
  ``min_replicas``, every replica of a model that may not be preempted at all). Everything that
  borrows must be reclaimable, so a team's firm work fits its nominal quota and the firm work of
  users in no team fits the capacity in no team's quota: then reclaiming every borrower's
  reclaimable work always gives a team its nominal quota back. Kept only while reclaim is on.
- **Nodes**: when Ray reports resources per node, the ledger also keeps each node's free
  resources, and admitted work takes its parts from specific nodes
  (:mod:`reconciler.plan.placement`), so two objects admitted in one tick are never both
  counted on one node's last GPUs. Work argus was granted that Ray has not placed yet (a job
  Ray reports PENDING, a replica not running yet) is packed in the same way first.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from reconciler.plan.actual import ActualModel, ActualState, Capacity, NodeCapacity, sub
from reconciler.plan.placement import FreeNodes, pack, short_on_nodes, task_parts
from reconciler.plan.pools import Part, pooled, pooled_nodes
from reconciler.spec.hashing import model_spec_hash, task_spec_hash
from reconciler.spec.types import (
    GPU,
    NO_TEAM,
    QUOTA_RESOURCES,
    SLOTS,
    ClusterSpec,
    DesiredState,
    ModelSpec,
    ObjectKey,
    Team,
)

EPS = 1e-9


def fmt(res: Mapping[str, float]) -> str:
    return ", ".join(f"{v:g} {k}" for k, v in sorted(res.items()) if v) or "nothing"


def quota_use(real: Mapping[str, float], task: bool) -> dict[str, float]:
    """The quota resources a workload holding ``real`` Ray resources counts (a task holds one slot)."""
    out = {GPU: real.get(GPU, 0.0)}
    if task:
        out[SLOTS] = 1.0
    return out


def model_gpus(model: ActualModel) -> float:
    """GPUs one replica of a running model counts in quotas: its Ray GPUs, or in CPU serving mode
    the ``gpus_per_replica`` it was deployed with (the CPU profile stands in for a GPU cluster)."""
    gpus = model.resources_per_replica.get(GPU, 0.0)
    if gpus:
        return gpus
    recorded = (model.spec or {}).get("gpus_per_replica")
    return float(recorded) if isinstance(recorded, int | float) and not isinstance(recorded, bool) else 0.0


def protected_replicas(model: ModelSpec | None, replicas: int, cluster: ClusterSpec) -> int:
    """How many of a model's ``replicas`` preemption never stops: those up to its
    ``min_replicas``, or all of them when it may not be preempted at all (``preemption.models``
    off, no ``min_replicas``, a ``source: task:`` model, or no valid file to say)."""
    if model is None or not cluster.preemption.models or model.min_replicas is None or model.source_task:
        return replicas
    return min(replicas, model.min_replicas)


def stale_model(live: ActualModel, spec: ModelSpec | None, cluster: ClusterSpec) -> bool:
    """Whether running model ``live`` runs another spec than its file's ``spec`` (None: the file
    is invalid or gone): its update waits or is applied by this plan, or it is kept as it runs.
    A ``source: task:`` model's spec hash names its checkpoint, which only the planner resolves:
    never stale here."""
    if spec is None:
        return True
    return not spec.source_task and live.spec_hash != model_spec_hash(spec, cluster)


def protection(model: ModelSpec, cluster: ClusterSpec) -> str:
    """Why some of ``model``'s replicas are never preempted, in words."""
    if model.source_task:
        return "a `source: task:` model is never preempted"
    if not cluster.preemption.models:
        return "models are never preempted without `preemption.models: true`"
    if model.min_replicas is None:
        return "a model without `min_replicas` is never preempted"
    return f"its `min_replicas: {model.min_replicas}` are never preempted"


def firm_limit(cluster: ClusterSpec, group: str, total: Mapping[str, float]) -> float | None:
    """The most GPUs work of queue ``group`` that reclaim cannot stop may hold: a team's nominal
    quota; for users in no team the capacity in no team's quota (None: the cluster's size is
    unknown)."""
    team = cluster.teams.get(group)
    if team is not None:
        return team.nominal.get(GPU, 0.0)
    size = total.get(GPU) if total else None
    return None if size is None else max(0.0, size - sum(t.nominal.get(GPU, 0.0) for t in cluster.teams.values()))


def firm_over(cluster: ClusterSpec, user: str, firm: float, why: str, total: Mapping[str, float]) -> str | None:
    """Why ``firm`` GPUs of ``user``'s that reclaim cannot stop (``why``: :func:`protection`)
    can never run, else None (and None whenever the rule is off: :func:`firm_rule`)."""
    if not firm_rule(cluster) or firm <= EPS:
        return None
    group = cluster.team_of(user)
    limit = firm_limit(cluster, group, total)
    if limit is None or firm <= limit + EPS:
        return None
    where = (
        f"team {group}'s nominal quota is {limit:g} GPU"
        if group
        else f"users in no team hold such work only on the capacity in no team's quota ({limit:g} GPU)"
    )
    return f"needs {firm:g} GPU that cannot be preempted ({why}) but {where}: only work that can be preempted borrows"


def firm_rule(cluster: ClusterSpec) -> bool:
    """Whether work that cannot be preempted is kept within nominal quota: teams share GPUs and
    reclaim is on (with ``reclaim: Never`` nothing borrowed comes back by preemption anyway)."""
    return cluster.preemption.reclaim != "Never" and any(GPU in t.nominal for t in cluster.teams.values())


def driver_slots(cluster: ClusterSpec, total: Mapping[str, float]) -> float | None:
    """How many drivers the cluster can hold at once; None when unknown or unlimited."""
    per = {r: v for r, v in cluster.training.driver_resources.items() if v > 0}
    if not per or not total:
        return None
    return float(min(math.floor(total.get(r, 0.0) / v + EPS) for r, v in per.items()))


@dataclass(frozen=True)
class Short:
    """Why a request does not fit now: ``kind`` is user | borrowing | pool | capacity | node
    (the summed free resources suffice, but not on single nodes) | firm (work that cannot be
    preempted beyond what its queue may hold of it)."""

    kind: str
    reason: str
    resources: tuple[str, ...] = ()  # the resources it is short of (capacity and pool)


@dataclass
class Ledger:
    """Usage per queue and per user, and real free capacity, updated as work is admitted or preempted."""

    cluster: ClusterSpec
    known: bool  # the cluster's capacity is known
    avail: dict[str, float]  # Ray's available minus what owned objects hold but have not placed
    cap: dict[str, float]  # total minus everything owned objects hold
    total: Mapping[str, float]
    use: dict[str, dict[str, float]] = field(default_factory=dict)  # queue -> quota resource -> amount
    user_gpus: dict[str, float] = field(default_factory=dict)
    user_tasks: dict[str, float] = field(default_factory=dict)
    pool: dict[str, float | None] = field(default_factory=dict)
    # The quota resources some team's quota names: the others are not managed by teams (a team
    # that declares only GPUs neither borrows nor lends driver slots).
    managed: tuple[str, ...] = ()
    # Free resources per node (node id -> resources); None: Ray did not report nodes.
    nodes: FreeNodes | None = None
    node_totals: dict[str, dict[str, float]] = field(default_factory=dict)
    # GPUs of work reclaim cannot stop, per queue and per running model (:func:`firm_rule`; empty when off).
    firm: dict[str, float] = field(default_factory=dict)
    firm_models: dict[ObjectKey, float] = field(default_factory=dict)
    # Running models whose protected replicas were capped to fit their queue (:meth:`_cap_firm`):
    # the replicas preemption may not stop.
    floors: dict[ObjectKey, int] = field(default_factory=dict)

    @classmethod
    def of(
        cls, cluster: ClusterSpec, actual: ActualState, capacity: Capacity, desired: DesiredState | None = None
    ) -> Ledger:
        """The ledger of what ``actual`` runs on ``capacity``. ``desired``: the tasks' specs, which
        say how a pending job's resources split over nodes (without it, or for a job of another
        spec, a pending job counts as one part)."""
        unplaced: dict[str, float] = {}
        committed: dict[str, float] = {}
        ledger = cls(cluster, bool(capacity.total or capacity.available), {}, {}, capacity.total)
        pending: list[Part] = []
        per_node = bool(capacity.nodes)
        guard = firm_rule(cluster)
        cappable: list[tuple[ActualModel, ModelSpec | None, int]] = []
        # Plain loops: at 10,000 owned objects, building per-object dicts dominated the re-plan time.
        for model in actual.models.values():
            waiting = max(0, model.replicas - model.ready_replicas)
            for r, v in model.resources_per_replica.items():
                committed[r] = committed.get(r, 0.0) + v * model.replicas
                if waiting:
                    unplaced[r] = unplaced.get(r, 0.0) + v * waiting
            if waiting and per_node:
                pending.extend(pooled((model.resources_per_replica for _ in range(waiting)), "model", cluster))
            ledger._count(model.key.user, {GPU: model_gpus(model) * model.replicas}, 1.0)
            if guard:
                ledger._count_firm(model, desired.models.get(model.key) if desired is not None else None, cappable)
        for job in actual.jobs:
            if not job.active:
                continue
            for r, v in job.resources.items():
                committed[r] = committed.get(r, 0.0) + v
                if job.status != "RUNNING":
                    unplaced[r] = unplaced.get(r, 0.0) + v
            if job.status != "RUNNING" and per_node:
                spec = desired.tasks.get(job.key) if desired is not None else None
                same = spec is not None and task_spec_hash(spec) == job.spec_hash
                pending.extend(
                    task_parts(spec, cluster) if spec is not None and same else pooled([job.resources], "task", cluster)
                )
            ledger._count(job.key.user, quota_use(job.resources, task=True), 1.0)
        ledger.avail = sub(capacity.available, unplaced)
        ledger.cap = sub(capacity.total, committed)
        ledger.pool = ledger._pool()
        if cappable:
            ledger._cap_firm(cappable)
        ledger.managed = tuple(r for r in QUOTA_RESOURCES if any(r in t.nominal for t in cluster.teams.values()))
        if per_node:
            ledger._nodes_of(tuple(pooled_nodes(capacity.nodes, cluster)), pending)
        return ledger

    def _count_firm(
        self, model: ActualModel, spec: ModelSpec | None, cappable: list[tuple[ActualModel, ModelSpec | None, int]]
    ) -> None:
        """Count the GPUs of running ``model`` (``spec``: its file's) that reclaim cannot stop; a
        model preemption can stop goes to ``cappable`` too (:meth:`_cap_firm`)."""
        # A model running another spec than its file's (its update waits, its file is invalid,
        # or gone while the mass-deletion guard holds its deletion) is never scaled down, so all
        # of it is firm; past its queue's limit it can still be removed whole.
        stale = stale_model(model, spec, self.cluster)
        replicas = protected_replicas(None if stale else spec, model.replicas, self.cluster)
        firm = replicas * model_gpus(model)
        if firm:
            self.firm_models[model.key] = firm
            group = self.cluster.team_of(model.key.user)
            self.firm[group] = self.firm.get(group, 0.0) + firm
            if self.cluster.preemption.models and (stale or (spec is not None and not spec.source_task)):
                cappable.append((model, spec, replicas))

    def _cap_firm(self, cappable: list[tuple[ActualModel, ModelSpec | None, int]]) -> None:
        """Keep each queue's firm GPUs within what it may hold (:func:`firm_limit`). Admission
        keeps them there, but a file may raise or drop ``min_replicas`` without a restart (it
        is not in the spec hash), and the admin may lower a quota: protection past the limit
        would shield borrowed GPUs for good. Of the models preemption can scale down, the
        highest priority, then the oldest, keep their protected replicas first; the others'
        are left to reclaim (never to their own team's preemption). A model running another spec
        than its file's (:func:`stale_model`) comes last and keeps all its replicas or none: it
        cannot be scaled down, only removed (breaking a file, or holding an update back, would
        otherwise shield what it borrows)."""
        groups: dict[str, list[tuple[ActualModel, ModelSpec | None, int]]] = {}
        for item in cappable:
            groups.setdefault(self.cluster.team_of(item[0].key.user), []).append(item)

        def order(item: tuple[ActualModel, ModelSpec | None, int]) -> tuple[bool, int, int, ObjectKey]:
            model, spec = item[0], item[1]
            stale = stale_model(model, spec, self.cluster)
            priority = self.cluster.priority_value("model", spec.priority if spec is not None else None)
            return stale, -priority, spec.created_at if spec is not None else 0, model.key

        for group, items in groups.items():
            limit = firm_limit(self.cluster, group, self.total)
            held = self.firm.get(group, 0.0)
            if limit is None or held <= limit + EPS:
                continue
            left = limit - (held - sum(n * model_gpus(m) for m, _s, n in items))
            items.sort(key=order)
            for model, spec, replicas in items:
                per = model_gpus(model)
                keep = min(replicas, max(0, math.floor(left / per + EPS)))
                if keep < replicas and stale_model(model, spec, self.cluster):
                    keep = 0
                left -= keep * per
                self.floors[model.key] = keep
                self.firm_models[model.key] = keep * per
                self.firm[group] -= (replicas - keep) * per

    def _nodes_of(self, nodes: tuple[NodeCapacity, ...], pending: list[Part]) -> None:
        self.nodes = FreeNodes({n.node_id: dict(n.available) for n in nodes})
        self.node_totals = {n.node_id: dict(n.total) for n in nodes}
        # Ray has not said where pending work goes: each part takes room where argus would put
        # it, and a part that fits nowhere is left out (Ray may already count it, as a replica
        # whose placement group is reserved while its engine starts, or it waits for room).
        for part in pending:
            self.place([{r: v for r, v in part.items() if v > 0}])

    def _pool(self) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        teams = self.cluster.teams.values()
        for r in QUOTA_RESOURCES:
            lendable = sum(t.nominal.get(r, 0.0) - t.guaranteed(r) for t in teams)
            size = self.total.get(GPU) if r == GPU and self.total else None
            if r == SLOTS:
                size = driver_slots(self.cluster, self.total)
            assigned = sum(t.nominal.get(r, 0.0) for t in teams)
            out[r] = None if size is None else lendable + max(0.0, size - assigned)
        return out

    def _count(self, user: str, amount: Mapping[str, float], sign: float) -> None:
        group = self.cluster.team_of(user)
        use = self.use.setdefault(group, {})
        for r, v in amount.items():
            use[r] = use.get(r, 0.0) + sign * v
        self.user_gpus[user] = self.user_gpus.get(user, 0.0) + sign * amount.get(GPU, 0.0)
        self.user_tasks[user] = self.user_tasks.get(user, 0.0) + sign * amount.get(SLOTS, 0.0)

    # -- queries ------------------------------------------------------------------------
    def team(self, group: str) -> Team:
        return self.cluster.teams.get(group) or Team(NO_TEAM)

    def free(self) -> dict[str, float]:
        return {k: max(0.0, min(v, self.cap.get(k, v))) for k, v in self.avail.items()}

    def pool_use(self, resource: str, group: str | None = None, extra: float = 0.0) -> float:
        """What the cohort's pool holds, with ``extra`` more of ``resource`` used by ``group``."""
        total = 0.0
        for g in {*self.use, *([group] if group is not None else [])}:
            used = self.use.get(g, {}).get(resource, 0.0) + (extra if g == group else 0.0)
            total += max(0.0, used - self.team(g).guaranteed(resource))
        return total

    def borrowing(self, group: str) -> bool:
        """True when ``group`` uses more than its nominal quota of a managed resource."""
        use, team = self.use.get(group, {}), self.team(group)
        return any(use.get(r, 0.0) > team.nominal.get(r, 0.0) + EPS for r in self.managed)

    def within_nominal(self, group: str, amount: Mapping[str, float], freed: Mapping[str, float] | None = None) -> bool:
        """True when ``group`` stays within its nominal quota after taking ``amount`` (once it
        has given back ``freed``)."""
        if group == NO_TEAM or not self.managed:
            return False
        use, team, less = self.use.get(group, {}), self.team(group), freed or {}
        return all(
            use.get(r, 0.0) - less.get(r, 0.0) + amount.get(r, 0.0) <= team.nominal.get(r, 0.0) + EPS
            for r in self.managed
        )

    def firm_short(self, user: str, firm: float, why: str) -> Short | None:
        """Why ``firm`` more GPUs of ``user``'s that reclaim cannot stop (``why``:
        :func:`protection`) do not fit what its queue may hold of such work now, else None."""
        if firm <= EPS or not firm_rule(self.cluster):
            return None
        group = self.cluster.team_of(user)
        limit = firm_limit(self.cluster, group, self.total)
        held = self.firm.get(group, 0.0)
        if limit is None or held + firm <= limit + EPS:
            return None
        if group:
            where = f"team {group} holds {held:g} GPU of such work of nominal {limit:g}"
        else:
            where = f"users in no team hold {held:g} GPU of such work of the {limit:g} GPU in no team's quota"
        why = (
            f"WaitingForQuota: needs {firm:g} GPU that cannot be preempted ({why}), and only work that can "
            f"be preempted borrows: {where}"
        )
        return Short("firm", why, (GPU,))

    def share(self, group: str, amount: Mapping[str, float] | None = None) -> float:
        """Dominant-resource share of ``group`` (with ``amount`` more), divided by its weight."""
        use, team = self.use.get(group, {}), self.team(group)
        best = 0.0
        for r in self.managed:
            over = use.get(r, 0.0) + (amount or {}).get(r, 0.0) - team.nominal.get(r, 0.0)
            if over > EPS:
                size = self.pool.get(r)
                best = max(best, over / size if size else over)
        return best / team.weight

    def short(self, user: str, amount: Mapping[str, float], demand: Mapping[str, float]) -> Short | None:
        """Why ``user``'s request (``amount`` of quota, ``demand`` of Ray resources) does not fit now."""
        cluster = self.cluster
        gpus, tasks = amount.get(GPU, 0.0), amount.get(SLOTS, 0.0)
        quota, limit = cluster.quota(user), cluster.task_limit(user)
        held = self.user_gpus.get(user, 0.0)
        if quota is not None and gpus and held + gpus > quota + EPS:
            why = f"WaitingForQuota: user quota: needs {gpus:g} GPU, {user} holds {held:g} of {quota} GPUs"
            return Short("user", why)
        running = self.user_tasks.get(user, 0.0)
        if limit is not None and tasks and running + tasks > limit + EPS:
            why = (
                f"WaitingForQuota: user quota: {user} runs {running:g} of {limit} task"
                f"{'s' if limit != 1 else ''} at once (each task's driver takes a driver slot)"
            )
            return Short("user", why)
        group = cluster.team_of(user)
        team, use = self.team(group), self.use.get(group, {})
        for r, v in sorted(amount.items()):
            most = team.max_quota(r)
            if v and most is not None and use.get(r, 0.0) + v > most + EPS:
                why = (
                    f"BorrowingLimitReached: team {group} uses {use.get(r, 0.0):g} {_unit(r)} of nominal "
                    f"{team.nominal.get(r, 0.0):g} + borrowing limit {team.borrowing_limit.get(r, 0.0):g}"
                )
                return Short("borrowing", why, (r,))
        if cluster.teams:
            dry = [r for r, v in sorted(amount.items()) if v and r in self.managed and self._pool_short(r, group, v)]
            if dry:
                r = dry[0]
                who = f"team {group}" if group else f"{user} (in no team: runs only on lent capacity)"
                nominal = team.nominal.get(r, 0.0)
                why = f"WaitingForQuota: {who} uses {use.get(r, 0.0):g} {_unit(r)} of nominal {nominal:g}; "
                if self.within_nominal(group, amount):
                    # What becomes of the lent quota is the caller's to say (:func:`reclaim_outlook`).
                    lenders = [g or "users in no team" for g in sorted(self.use) if g != group and self.borrowing(g)]
                    why += f"its idle quota is lent to {', '.join(lenders) or 'others'}"
                else:
                    why += (
                        f"nothing left to borrow in the cohort ({self.pool_use(r):g} of "
                        f"{self.pool.get(r) or 0:g} lendable {_unit(r)} in use)"
                    )
                return Short("pool", why, tuple(dry))
        if self.known:
            free = self.free()
            short = {r: v - free.get(r, 0.0) for r, v in demand.items() if v > free.get(r, 0.0) + EPS}
            if short:
                have = ", ".join(f"{free.get(r, 0.0):g} {r}" for r in sorted(short))
                why = f"insufficient capacity: needs {fmt(demand)}, free {have} (short by {fmt(short)})"
                slot = sorted(r for r in short if r in cluster.training.driver_resources and r != GPU)
                if slot and tasks:
                    why += f"; {', '.join(slot)} is the driver slot every task's driver takes"
                return Short("capacity", why, tuple(sorted(short)))
        return None

    def node_short(self, parts: list[Part] | tuple[Part, ...], unit: str) -> Short | None:
        """Why ``parts`` (:mod:`reconciler.plan.placement`) do not fit the nodes' free resources
        now, else None (and always None when Ray did not report nodes)."""
        if self.nodes is None or not parts:
            return None
        short = short_on_nodes(parts, self.nodes, self.node_totals, unit)
        return Short("node", *short) if short is not None else None

    def _pool_short(self, resource: str, group: str, amount: float) -> bool:
        size = self.pool.get(resource)
        if size is None:
            return False
        return self.pool_use(resource, group, amount) > size + EPS

    # -- updates ------------------------------------------------------------------------
    def take(self, user: str, amount: Mapping[str, float], demand: Mapping[str, float], firm: float = 0.0) -> None:
        """Count ``amount`` of quota (``firm`` GPUs of it reclaim cannot stop) and ``demand`` of Ray
        resources as ``user``'s."""
        self._count(user, amount, 1.0)
        if firm:
            group = self.cluster.team_of(user)
            self.firm[group] = self.firm.get(group, 0.0) + firm
        for r, v in demand.items():
            self.avail[r] = self.avail.get(r, 0.0) - v
            self.cap[r] = self.cap.get(r, 0.0) - v

    def place(self, parts: list[Part] | tuple[Part, ...]) -> bool:
        """Take ``parts`` from the nodes they pack onto; False (nothing taken) when they do not all
        fit, or Ray did not report nodes. Kept apart from :meth:`take`: preemption takes and gives
        back summed resources only, as it does not know on which node a victim runs."""
        if self.nodes is None:
            return False
        taken = pack(parts, self.nodes)
        if taken is None:
            return False
        self.nodes.take(taken)
        return True

    def give_back(self, user: str, amount: Mapping[str, float], real: Mapping[str, float]) -> None:
        self._count(user, amount, -1.0)
        for r, v in real.items():
            self.avail[r] = self.avail.get(r, 0.0) + v
            self.cap[r] = self.cap.get(r, 0.0) + v

    def summary(self) -> dict[str, dict[str, object]]:
        """Per queue (team name, "" for users in no team): nominal, used, borrowed, lent, share."""
        out: dict[str, dict[str, object]] = {}
        managed = self.managed
        groups = sorted({*self.cluster.teams, *(g for g, u in self.use.items() if any(u.values()))})
        nominal_of = {g: {r: self.team(g).nominal.get(r, 0.0) for r in managed} for g in groups}
        borrowed = {
            g: {r: max(0.0, self.use.get(g, {}).get(r, 0.0) - nominal_of[g][r]) for r in managed} for g in groups
        }
        teams = self.cluster.teams.values()
        lendable = {r: sum(t.nominal.get(r, 0.0) - t.guaranteed(r) for t in teams) for r in managed}
        assigned = {r: sum(t.nominal.get(r, 0.0) for t in teams) for r in managed}
        for group in groups:
            use, team = self.use.get(group, {}), self.team(group)
            nominal = nominal_of[group]
            used = {r: use.get(r, 0.0) for r in managed}
            lent = {}
            for r in managed:
                # Borrowers take the capacity in no team's quota first, then teams' idle lendable quota.
                size = self.pool.get(r)
                unassigned = 0.0 if size is None else max(0.0, size - lendable[r])
                others = sum(b[r] for g, b in borrowed.items() if g != group) - unassigned
                idle = max(0.0, min(nominal[r] - team.guaranteed(r), nominal[r] - used[r]))
                lent[r] = max(0.0, min(idle, others)) if assigned[r] else 0.0
            out[group] = {
                "nominal": _named(nominal),
                "used": _named(used),
                "borrowed": _named(borrowed[group]),
                "lent": _named(lent),
                "share": round(self.share(group), 4),
                "weight": team.weight,
            }
        return out


def _unit(resource: str) -> str:
    return "GPU" if resource == GPU else "driver slots"


def _named(res: Mapping[str, float]) -> dict[str, float]:
    return {"gpus" if r == GPU else "tasks": v for r, v in res.items()}
