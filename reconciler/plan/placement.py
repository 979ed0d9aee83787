"""Per-node placement: whether the parts of a request fit on the cluster's nodes. Pure.

Ray places each part of a request whole on one node, so summed free GPUs are not enough:

- a **verl task**: its driver (``training.driver_resources``) on one node, and each of its
  ``nodes`` as one placement group of ``gpus_per_node`` one-GPU bundles with strategy
  STRICT_PACK (verl's ``RayResourcePool.get_placement_groups``): ``gpus_per_node`` GPUs on one
  node. Two of them may share a node that has room for both;
- a **command task**: one process, whose driver takes ``gpus_per_node`` GPUs
  (``entrypoint_num_gpus``) and the driver's resources, on one node;
- a **model replica**: ``gpus_per_replica`` one-GPU bundles with strategy PACK (tensor
  parallelism). PACK would spread them over nodes when no node has room, but vLLM's tensor
  parallelism across nodes is what argus's placement means to avoid: argus asks for them on one
  node. In CPU mode a replica is one bundle of ``serving.cpus_per_replica`` CPUs.

Packing is best fit, largest part first (Kueue's topology-aware scheduling packs the same way):
each part goes to the node it leaves the least free on, then to the node with the fewest free
GPUs (a driver that takes no GPU leaves the GPU-rich nodes to GPU parts), then by node id. The
parts of one request are all of one size, besides a driver that asks for other resources, and
any order of placing equal parts places as many as any packing could: so "never fits on the
nodes" is exact for every request argus makes.

Every queued request is checked each tick, so the packing does not look at every node per part:
:class:`FreeNodes` keeps the nodes grouped by identical free resources (best fit looks at each
distinct shape's first node by id, which is the node a scan of every node picks), a packing copies
only the nodes its parts land on, and :func:`never_fits` is remembered per request shape and node
totals (the same for a whole tick).
"""

from __future__ import annotations

import functools
import math
from bisect import insort
from collections.abc import Iterable, Iterator, Mapping, Sequence

from reconciler.plan.actions import Action
from reconciler.plan.actual import NodeCapacity
from reconciler.plan.demand import model_resources_per_replica
from reconciler.plan.pools import POOL_WORDS, POOLS, Part, pool_of, pooled, unpooled
from reconciler.spec.types import GPU, ClusterSpec, DesiredState, ModelSpec, ObjectKey, TaskSpec

# A node's free resources in hashable form: nodes with equal shapes are interchangeable but for their ids.
Shape = tuple[tuple[str, float], ...]
EPS = 1e-9
# Packings remembered per state of the nodes (FreeNodes.fit): more distinct requests start afresh.
PACKED_KEPT = 256
# Past this many nodes a reason counts node sizes ("2 x 8, 3 x 4 GPUs") instead of listing each.
LISTED_NODES = 8


def task_parts(task: TaskSpec, cluster: ClusterSpec) -> tuple[dict[str, float], ...]:
    """What a run of ``task`` places, each part on one node: a command task's driver with its
    GPUs; a verl task's driver, then one part of ``gpus_per_node`` GPUs per node it asks for."""
    driver = {k: float(v) for k, v in cluster.training.driver_resources.items() if v > 0}
    gpus = {GPU: float(task.gpus_per_node)} if task.gpus_per_node > 0 else {}
    if task.workload == "command":
        # One process on one node (a multi-node command task is refused when it is submitted).
        first = dict(driver)
        first[GPU] = first.get(GPU, 0.0) + gpus.get(GPU, 0.0)
        return pooled(_nonempty([first, *(dict(gpus) for _ in range(task.nodes - 1))]), "task", cluster)
    return pooled(_nonempty([driver, *(dict(gpus) for _ in range(task.nodes))]), "task", cluster)


def model_parts(model: ModelSpec, cluster: ClusterSpec, replicas: int) -> tuple[dict[str, float], ...]:
    """What ``replicas`` replicas of ``model`` place: each replica's resources on one node."""
    per = {k: v for k, v in model_resources_per_replica(model, cluster).items() if v > 0}
    return pooled(_nonempty([dict(per) for _ in range(max(0, replicas))]), "model", cluster)


def request_parts(desired: DesiredState, key: ObjectKey) -> tuple[dict[str, float], ...]:
    """The parts of everything ``key`` holds once admitted (what must fit the empty nodes); ()
    when its spec is not in ``desired`` (nothing is checked per node then)."""
    if key.kind == "model":
        model = desired.models.get(key)
        return model_parts(model, desired.cluster, model.replicas) if model is not None else ()
    task = desired.tasks.get(key)
    return task_parts(task, desired.cluster) if task is not None else ()


def demand_parts(desired: DesiredState, action: Action) -> tuple[dict[str, float], ...]:
    """The parts of what ``action`` adds now (what must fit the nodes' free resources): a task's
    run whole; a model's new replicas, as many as its added resources make (an update that
    changes ``gpus_per_replica`` adds its new replicas' size); () when ``desired`` lacks its spec."""
    key = action.key
    if key.kind != "model":
        return request_parts(desired, key)
    model = desired.models.get(key)
    if model is None:
        return ()
    per = {k: v for k, v in model_resources_per_replica(model, desired.cluster).items() if v > 0}
    if not per:
        return ()
    main = _main(per)
    count = math.ceil(action.demand.get(main, 0.0) / per[main] - EPS)
    return model_parts(model, desired.cluster, count)


def unit_of(key: ObjectKey) -> str:
    """What one part of ``key``'s request is called in a reason: a task's node, a model's replica."""
    return "replica" if key.kind == "model" else "node"


class FreeNodes(Mapping[str, Mapping[str, float]]):
    """The nodes' free resources (node id -> free), grouped by identical free resources so that
    best fit looks at each distinct shape once, not at every node. Read as a mapping; changed only
    by :meth:`take`, which replaces a node's mapping (the mappings given are never changed, and
    must not be changed while this holds them)."""

    __slots__ = ("_free", "_groups", "_most", "_packed", "_shown")

    def __init__(self, free: Mapping[str, Mapping[str, float]]) -> None:
        self._free: dict[str, Mapping[str, float]] = dict(free)
        # shape -> (the free resources of its nodes, their ids sorted)
        self._groups: dict[Shape, tuple[Mapping[str, float], list[str]]] = {}
        for node in sorted(self._free):
            res = self._free[node]
            group = self._groups.setdefault(_shape(res), (res, []))
            group[1].append(node)
        # Until the next take: the most any node has free of each resource, what each request
        # packed to (queued requests of one shape ask again and again; an admitted one packs twice),
        # and the totals last shown against with what each list of names showed.
        self._most: dict[str, float] = {}
        self._packed: dict[tuple[bool, tuple[Shape, ...]], tuple[dict[str, dict[str, float]] | None, int]] = {}
        self._shown: tuple[Mapping[str, Mapping[str, float]], dict[tuple[str, ...], str]] | None = None

    def __getitem__(self, node: str) -> Mapping[str, float]:
        return self._free[node]

    def __iter__(self) -> Iterator[str]:
        return iter(self._free)

    def __len__(self) -> int:
        return len(self._free)

    def __repr__(self) -> str:
        return f"FreeNodes({self._free!r})"

    def take(self, taken: Mapping[str, Mapping[str, float]]) -> None:
        """Take ``taken`` (node id -> resources, what :func:`pack` returns) from the nodes."""
        for node, res in taken.items():
            old = self._free[node]
            new = dict(old)
            for r, v in res.items():
                new[r] = new.get(r, 0.0) - v
            self._free[node] = new
            shape = _shape(old)
            ids = self._groups[shape][1]
            ids.remove(node)
            if not ids:
                del self._groups[shape]
            insort(self._groups.setdefault(_shape(new), (new, []))[1], node)
        self._most, self._packed, self._shown = {}, {}, None

    def fit(self, parts: Iterable[Part], skip: bool) -> tuple[dict[str, dict[str, float]] | None, int]:
        """:func:`_best_fit` of ``parts``, remembered until the next :meth:`take`."""
        parts = list(parts)
        key = (skip, tuple(tuple(p.items()) for p in parts))
        fitted = self._packed.get(key)
        if fitted is None:
            fitted = _best_fit(parts, self, skip)
            if len(self._packed) >= PACKED_KEPT:
                self._packed.clear()
            self._packed[key] = fitted
        taken, count = fitted
        return ({node: dict(res) for node, res in taken.items()} if taken is not None else None), count

    def most(self, resource: str) -> float:
        """The most any node has free of ``resource`` (0 when none has it)."""
        most = self._most.get(resource)
        if most is None:
            most = self._most[resource] = max((res.get(resource, 0.0) for res, _ in self._groups.values()), default=0.0)
        return most

    def shown(self, totals: Mapping[str, Mapping[str, float]], names: Sequence[str]) -> str:
        """The free amounts of ``names`` (zeros too) of the nodes whose total (``totals``: node id
        -> total, not changed while this holds it) has some of the first name, as
        :func:`_listing` words them; remembered until the next :meth:`take`."""
        if self._shown is None or self._shown[0] is not totals:
            self._shown = (totals, {})
        texts = self._shown[1]
        key = tuple(names)
        text = texts.get(key)
        if text is None:
            main = names[0] if names else GPU
            shown = [res for node, res in self._free.items() if totals.get(node, {}).get(main, 0.0) > 0]
            text = texts[key] = _listing(shown, names, zeros=True)
        return text


def pack(parts: Iterable[Part], free: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, float]] | None:
    """Best-fit packing of ``parts`` into ``free`` (node id -> free resources): what each node
    gives (node id -> resources), or None when some part fits on no node. ``free`` is not changed."""
    return _grouped(free).fit(parts, skip=False)[0]


def placed_count(parts: Sequence[Part], free: Mapping[str, Mapping[str, float]]) -> int:
    """How many of ``parts`` best-fit packing places in ``free``, skipping those that fit nowhere."""
    return _grouped(free).fit(parts, skip=True)[1]


def _grouped(free: Mapping[str, Mapping[str, float]]) -> FreeNodes:
    return free if isinstance(free, FreeNodes) else FreeNodes(free)


def _best_fit(parts: Iterable[Part], nodes: FreeNodes, skip: bool) -> tuple[dict[str, dict[str, float]] | None, int]:
    """Best fit of ``parts`` on ``nodes`` (not changed): (what each node gives, how many parts were
    placed); (None, 0) when a part fits on no node, unless ``skip`` (then it is skipped).

    Each part goes to the node ranked lowest by (free main resource left, free GPUs left, node id)
    among those it fits: nodes of one shape rank alike but for the id, so each shape's first node
    by id stands for them all. Only the shapes the parts land on are copied."""
    ordered = _largest_first(parts)
    growing = any(v < 0 for p in ordered for v in p.values())
    if not skip and not growing and any(v > nodes.most(r) + EPS for p in ordered for r, v in p.items()):
        return None, 0  # a part asks for more than any node has free, and free only shrinks
    groups = nodes._groups
    changed: dict[str, Mapping[str, float]] = {}  # node -> its free resources after the parts placed on it
    taken: dict[str, dict[str, float]] = {}
    count = 0
    for part in ordered:
        main = _main(part)
        need_main, need_gpu = part.get(main, 0.0), part.get(GPU, 0.0)
        best: tuple[float, float, str] | None = None
        where: Shape = ()
        for shape, (res, ids) in groups.items():
            if all(res.get(r, 0.0) + EPS >= v for r, v in part.items()):
                rank = (res.get(main, 0.0) - need_main, res.get(GPU, 0.0) - need_gpu, ids[0])
                if best is None or rank < best:
                    best, where = rank, shape
        if best is None:
            if skip:
                continue
            return None, 0
        node = best[2]
        count += 1
        left = dict(changed.get(node, nodes._free[node]))
        gives = taken.setdefault(node, {})
        for r, v in part.items():
            if r in POOLS:
                continue  # a pool is where a part may go, not something it takes
            left[r] = left.get(r, 0.0) - v
            gives[r] = gives.get(r, 0.0) + v
        changed[node] = left
        if groups is nodes._groups:
            groups = dict(groups)  # copy on write: the shapes, not the nodes
        res, ids = groups[where]
        if len(ids) > 1:
            groups[where] = (res, ids[1:])  # ``node`` is the first by id of its shape
        else:
            del groups[where]
        shape = _shape(left)
        joined = groups.get(shape)
        if joined is None:
            groups[shape] = (left, [node])
        else:
            ids = list(joined[1])
            insort(ids, node)
            groups[shape] = (joined[0], ids)
    return taken, count


def never_fits(parts: Sequence[Part], nodes: Sequence[NodeCapacity], unit: str) -> str | None:
    """Why ``parts`` cannot be packed onto ``nodes`` even with nothing else running, e.g. "needs 1
    node x 8 GPUs but the largest node has 4 GPUs (nodes: 4, 4 GPUs)"; None when they fit, or
    when ``nodes`` is empty (not known). Remembered per (parts, node ids and totals): every queued
    request asks again each tick, about the same nodes and a few shapes of request."""
    if not parts or not nodes:
        return None
    return _never_fits(tuple(tuple(p.items()) for p in parts), _totals_of(nodes), unit)


class _Totals:
    """Node ids and totals in hashable form (in order), hashed once: a tick asks about the same
    nodes for every queued request."""

    __slots__ = ("_hash", "key")

    def __init__(self, nodes: Sequence[NodeCapacity]) -> None:
        self.key = tuple((n.node_id, tuple(n.total.items())) for n in nodes)
        self._hash = hash(self.key)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, _Totals) and self._hash == other._hash and self.key == other.key)


# id of a tuple of nodes -> (the tuple, its _Totals): a tuple of frozen nodes is read once.
_SEEN: dict[int, tuple[Sequence[NodeCapacity], _Totals]] = {}
_SEEN_MAX = 8


def _totals_of(nodes: Sequence[NodeCapacity]) -> _Totals:
    if not isinstance(nodes, tuple):
        return _Totals(nodes)
    seen = _SEEN.get(id(nodes))
    if seen is not None and seen[0] is nodes:
        return seen[1]
    totals = _Totals(nodes)
    if len(_SEEN) >= _SEEN_MAX:
        _SEEN.clear()
    _SEEN[id(nodes)] = (nodes, totals)  # held, so its id is not reused while remembered
    return totals


@functools.lru_cache(maxsize=256)
def _never_fits(shapes: tuple[Shape, ...], totals: _Totals, unit: str) -> str | None:
    parts = [dict(s) for s in shapes]
    nodes = [NodeCapacity(node, dict(total)) for node, total in totals.key]
    free = FreeNodes({n.node_id: n.total for n in nodes})
    if pack(parts, free) is not None:
        return None
    pool = pool_of(parts)
    if pool is not None:
        # Said of the pool's cluster alone: its nodes, and the parts as Ray sees them.
        nodes = [NodeCapacity(n.node_id, unpooled(n.total)) for n in nodes if n.total.get(pool, 0.0) > 0]
        parts = [unpooled(p) for p in parts]
        if not nodes:
            return f"{POOL_WORDS[pool]} reports no nodes"
        free = FreeNodes({n.node_id: n.total for n in nodes})
        why = _never_fits_on(parts, nodes, free, unit)
        return f"{why} on {POOL_WORDS[pool]}" if why else None
    return _never_fits_on(parts, nodes, free, unit)


def _never_fits_on(parts: list[dict[str, float]], nodes: list[NodeCapacity], free: FreeNodes, unit: str) -> str | None:
    """Why ``parts`` cannot be packed onto ``nodes`` (``free``: their totals); None when they fit."""
    if pack(parts, free) is not None:
        return None
    main = _main_of(parts)
    sized = [p for p in parts if p.get(main, 0.0) > 0]
    biggest = max((p.get(main, 0.0) for p in sized), default=0.0)
    largest = max((n.total.get(main, 0.0) for n in nodes), default=0.0)
    listing = _listing([n.total for n in nodes], [main])
    if biggest > largest + EPS:
        return f"needs {describe(parts, unit, [main])} but the largest node has {_amount(largest, main)} ({listing})"
    bare = [{main: p[main]} for p in sized]
    if pack(bare, free) is None:
        held = placed_count(bare, free)
        return f"needs {describe(parts, unit, [main])} but the nodes hold only {held} of them ({listing})"
    names = _names(parts)
    listing = _listing([n.total for n in nodes], names)
    return f"needs {describe(parts, unit, names)} but no node has them all together ({listing})"


def short_on_nodes(
    parts: Sequence[Part], free: Mapping[str, Mapping[str, float]], totals: Mapping[str, Mapping[str, float]], unit: str
) -> tuple[str, tuple[str, ...]] | None:
    """Why ``parts`` do not fit the nodes' ``free`` resources now (node id -> free; ``totals``:
    node id -> total, to leave out nodes that have none of what is asked), e.g. "insufficient
    capacity per node: needs 1 node x 4 GPUs, each on one node; free per node: 2, 2 GPUs", with
    the resources it is short of (the main one alone when it is short by itself); None when they fit."""
    if not parts:
        return None
    free = _grouped(free)
    if pack(parts, free) is not None:
        return None
    pool = pool_of(parts)
    if pool is not None:
        # Said of the pool's cluster alone: its nodes, and the parts as Ray sees them.
        inside = [n for n in free if free[n].get(pool, 0.0) > 0]
        parts = [unpooled(p) for p in parts]
        free = FreeNodes({n: unpooled(free[n]) for n in inside})
        totals = {n: totals.get(n, {}) for n in inside}
    main = _main_of(parts)
    bare = [{main: p[main]} for p in parts if p.get(main, 0.0) > 0]
    names = [main] if bare and pack(bare, free) is None else _names(parts)
    why = (
        f"insufficient capacity per node: needs {describe(parts, unit, names)}, each on one node; "
        f"free per node{f' of {POOL_WORDS[pool]}' if pool else ''}: {free.shown(totals, names)}"
    )
    return why, tuple(sorted(names))


def describe(parts: Sequence[Part], unit: str, names: Sequence[str]) -> str:
    """``parts`` in words, counting only the resources ``names``: "2 nodes x 4 GPUs", "1 node x
    4 GPUs + 1 worker_node", with the parts that ask for none of the first name after ("and 1
    worker_node for the driver")."""
    main = names[0] if names else GPU
    groups: dict[tuple[tuple[str, float], ...], int] = {}
    rest: dict[str, float] = {}
    for part in parts:
        if part.get(main, 0.0) > 0:
            shape = tuple((r, part[r]) for r in sorted(names, key=lambda r: (r != main, r)) if part.get(r, 0.0) > 0)
            groups[shape] = groups.get(shape, 0) + 1
        else:
            for r in names:
                if part.get(r, 0.0) > 0:
                    rest[r] = rest.get(r, 0.0) + part[r]
    words = [
        f"{n} {unit}{'s' if n != 1 else ''} x " + " + ".join(_amount(v, r) for r, v in shape)
        for shape, n in sorted(groups.items(), key=lambda g: (-g[0][0][1], g[0]))
    ]
    text = ", ".join(words) or "nothing"
    if rest:
        text += " and " + " + ".join(_amount(v, r) for r, v in sorted(rest.items())) + " for the driver"
    return text


def _listing(nodes: Sequence[Mapping[str, float]], names: Sequence[str], zeros: bool = False) -> str:
    """The nodes' amounts of ``names``, largest first: "nodes: 4, 4 GPUs" (one name; nodes with
    none of it left out unless ``zeros``, and then without the "nodes:" label), "nodes: 4 GPUs +
    0 worker_node; 2 GPUs + 1 worker_node" (several names)."""
    main = names[0] if names else GPU
    label = "" if zeros else "nodes: "
    if len(names) <= 1:
        amounts = sorted((n.get(main, 0.0) for n in nodes), reverse=True)
        amounts = amounts if zeros else [a for a in amounts if a > 0]
        return f"{label}{_counted(amounts)} {_unit(main, 2)}" if amounts else "no nodes"
    rows = sorted(
        (tuple(n.get(r, 0.0) for r in names) for n in nodes if zeros or any(n.get(r, 0.0) > 0 for r in names)),
        reverse=True,
    )
    counts: dict[tuple[float, ...], int] = {}
    for row in rows:
        counts[row] = counts.get(row, 0) + 1
    many = len(rows) > LISTED_NODES
    texts = [
        (f"{n} x " if many and n > 1 else "") + " + ".join(_amount(v, r) for r, v in zip(names, row, strict=True))
        for row, n in (counts.items() if many else ((row, 1) for row in rows))
    ]
    return label + "; ".join(texts) if texts else "no nodes"


def _counted(amounts: Sequence[float]) -> str:
    """``4, 4`` or, past LISTED_NODES nodes, ``16 x 8, 2 x 4``."""
    if len(amounts) <= LISTED_NODES:
        return ", ".join(f"{a:g}" for a in amounts)
    counts: dict[float, int] = {}
    for a in amounts:
        counts[a] = counts.get(a, 0) + 1
    return ", ".join(f"{n} x {a:g}" if n > 1 else f"{a:g}" for a, n in counts.items())


def _amount(value: float, resource: str) -> str:
    return f"{value:g} {_unit(resource, value)}"


def _unit(resource: str, value: float) -> str:
    return ("GPU" if value == 1 else "GPUs") if resource == GPU else resource


def _names(parts: Iterable[Part]) -> list[str]:
    """The resources ``parts`` ask for, the main one first."""
    parts = list(parts)
    main = _main_of(parts)
    return [main, *sorted({r for p in parts for r, v in p.items() if v > 0 and r != main})]


def _main_of(parts: Iterable[Part]) -> str:
    """GPU when any part asks for GPUs, else the resource asked for most (CPU mode: CPU)."""
    sums: dict[str, float] = {}
    for part in parts:
        for r, v in part.items():
            sums[r] = sums.get(r, 0.0) + v
    return _main(sums)


def _main(res: Mapping[str, float]) -> str:
    if res.get(GPU, 0.0) > 0:
        return GPU
    return max(sorted(r for r in res if r not in POOLS), key=lambda r: res[r], default=GPU)


def _largest_first(parts: Iterable[Part]) -> list[Part]:
    return sorted(parts, key=lambda p: (-p.get(GPU, 0.0), -sum(p.values()), sorted(p.items())))


def _shape(res: Mapping[str, float]) -> Shape:
    return tuple(sorted(res.items()))


def _nonempty(parts: list[dict[str, float]]) -> tuple[dict[str, float], ...]:
    return tuple(p for p in ({r: v for r, v in part.items() if v > 0} for part in parts) if p)
