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
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from reconciler.plan.actions import Action
from reconciler.plan.actual import NodeCapacity
from reconciler.plan.demand import model_resources_per_replica
from reconciler.spec.types import GPU, ClusterSpec, DesiredState, ModelSpec, ObjectKey, TaskSpec

Part = Mapping[str, float]
EPS = 1e-9
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
        return _nonempty([first, *(dict(gpus) for _ in range(task.nodes - 1))])
    return _nonempty([driver, *(dict(gpus) for _ in range(task.nodes))])


def model_parts(model: ModelSpec, cluster: ClusterSpec, replicas: int) -> tuple[dict[str, float], ...]:
    """What ``replicas`` replicas of ``model`` place: each replica's resources on one node."""
    per = {k: v for k, v in model_resources_per_replica(model, cluster).items() if v > 0}
    return _nonempty([dict(per) for _ in range(max(0, replicas))])


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


def pack(parts: Iterable[Part], free: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, float]] | None:
    """Best-fit packing of ``parts`` into ``free`` (node id -> free resources): what each node
    gives (node id -> resources), or None when some part fits on no node. ``free`` is not changed."""
    left = {node: dict(res) for node, res in free.items()}
    taken: dict[str, dict[str, float]] = {}
    for part in _largest_first(parts):
        node = _best_node(part, left)
        if node is None:
            return None
        for r, v in part.items():
            left[node][r] = left[node].get(r, 0.0) - v
            taken.setdefault(node, {})[r] = taken.get(node, {}).get(r, 0.0) + v
    return taken


def placed_count(parts: Sequence[Part], free: Mapping[str, Mapping[str, float]]) -> int:
    """How many of ``parts`` best-fit packing places in ``free``, skipping those that fit nowhere."""
    left = {node: dict(res) for node, res in free.items()}
    count = 0
    for part in _largest_first(parts):
        node = _best_node(part, left)
        if node is not None:
            count += 1
            for r, v in part.items():
                left[node][r] = left[node].get(r, 0.0) - v
    return count


def never_fits(parts: Sequence[Part], nodes: Sequence[NodeCapacity], unit: str) -> str | None:
    """Why ``parts`` cannot be packed onto ``nodes`` even with nothing else running, e.g. "needs 1
    node x 8 GPUs but the largest node has 4 GPUs (nodes: 4, 4 GPUs)"; None when they fit, or
    when ``nodes`` is empty (not known)."""
    if not parts or not nodes:
        return None
    totals = {n.node_id: n.total for n in nodes}
    if pack(parts, totals) is not None:
        return None
    main = _main_of(parts)
    sized = [p for p in parts if p.get(main, 0.0) > 0]
    biggest = max((p.get(main, 0.0) for p in sized), default=0.0)
    largest = max((n.total.get(main, 0.0) for n in nodes), default=0.0)
    listing = _listing([n.total for n in nodes], [main])
    if biggest > largest + EPS:
        return f"needs {describe(parts, unit, [main])} but the largest node has {_amount(largest, main)} ({listing})"
    bare = [{main: p[main]} for p in sized]
    if pack(bare, totals) is None:
        held = placed_count(bare, totals)
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
    if not parts or pack(parts, free) is not None:
        return None
    main = _main_of(parts)
    bare = [{main: p[main]} for p in parts if p.get(main, 0.0) > 0]
    names = [main] if bare and pack(bare, free) is None else _names(parts)
    shown = [res for node, res in free.items() if totals.get(node, {}).get(main, 0.0) > 0]
    why = (
        f"insufficient capacity per node: needs {describe(parts, unit, names)}, each on one node; "
        f"free per node: {_listing(shown, names, zeros=True)}"
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
    return max(sorted(res), key=lambda r: res[r], default=GPU)


def _largest_first(parts: Iterable[Part]) -> list[Part]:
    return sorted(parts, key=lambda p: (-p.get(GPU, 0.0), -sum(p.values()), sorted(p.items())))


def _best_node(part: Part, left: Mapping[str, Mapping[str, float]]) -> str | None:
    """The node ``part`` fits on that it leaves the least of its main resource free, then the
    fewest free GPUs, then the first by id; None when it fits on none."""
    main = _main(part)
    best: tuple[float, float, str] | None = None
    for node, res in left.items():
        if all(res.get(r, 0.0) + EPS >= v for r, v in part.items()):
            rank = (res.get(main, 0.0) - part.get(main, 0.0), res.get(GPU, 0.0) - part.get(GPU, 0.0), node)
            if best is None or rank < best:
                best = rank
    return best[2] if best is not None else None


def _nonempty(parts: list[dict[str, float]]) -> tuple[dict[str, float], ...]:
    return tuple(p for p in ({r: v for r, v in part.items() if v > 0} for part in parts) if p)
