"""Pools: which Ray cluster's nodes a part may go to, when models run on a Ray cluster of their own
(cluster.yaml ``serving.ray_address``). Pure.

Each node offers the pool of its cluster (:func:`pooled_nodes`: the serving cluster's node ids
carry SERVING_NODE_PREFIX, reconciler/observe/capacity.py) and each part asks for its kind's: a
task's parts land on the tasks' cluster's nodes, a model's replicas on the serving cluster's. Only the planner's packing
sees them (never Ray, never the sums, never actual.json); a part's pool is not used up.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from reconciler.plan.actual import NodeCapacity
from reconciler.spec.types import ClusterSpec

Part = Mapping[str, float]  # what one part of a request places on one node (reconciler/plan/placement.py)

SERVING_NODE_PREFIX = "serving:"
POOL_PREFIX = "argus.pool/"
TASK_POOL = POOL_PREFIX + "tasks"
MODEL_POOL = POOL_PREFIX + "models"
POOLS = frozenset({TASK_POOL, MODEL_POOL})
POOL_SIZE = 1e9  # what a marked node offers of its pool
POOL_WORDS = {TASK_POOL: "the tasks' Ray cluster", MODEL_POOL: "the serving Ray cluster"}
_REMEMBERED = 8  # node lists whose pooled copies are kept


def pooled_nodes(nodes: Sequence[NodeCapacity], cluster: ClusterSpec) -> Sequence[NodeCapacity]:
    """``nodes`` each offering the pools of its cluster when ``cluster`` runs models on a cluster of
    their own: a node whose id carries :data:`SERVING_NODE_PREFIX` the models' pool, the others the
    tasks'; when none does (the daemon sees one cluster: cluster.yaml names the tasks' own, or an
    ``actual.json`` of one cluster), every node offers both. ``nodes`` itself otherwise. Remembered
    for the last few node lists (a tick asks about the same nodes for every queued request)."""
    if cluster.serving.ray_address is None or not nodes:
        return nodes
    seen = _POOLED.get(id(nodes))
    if seen is not None and seen[0] is nodes:
        return seen[1]
    two = any(n.node_id.startswith(SERVING_NODE_PREFIX) for n in nodes)
    both = {TASK_POOL: POOL_SIZE, MODEL_POOL: POOL_SIZE}
    out = []
    for n in nodes:
        offer = {MODEL_POOL if n.node_id.startswith(SERVING_NODE_PREFIX) else TASK_POOL: POOL_SIZE} if two else both
        out.append(NodeCapacity(n.node_id, {**n.total, **offer}, {**n.available, **offer}))
    marked = tuple(out)
    if len(_POOLED) >= _REMEMBERED:
        _POOLED.clear()
    _POOLED[id(nodes)] = (nodes, marked)  # held, so its id is not reused while remembered
    return marked


_POOLED: dict[int, tuple[Sequence[NodeCapacity], tuple[NodeCapacity, ...]]] = {}


def pooled(parts: Iterable[Part], kind: str, cluster: ClusterSpec) -> tuple[dict[str, float], ...]:
    """``parts`` of a ``kind`` ("task" or "model") object, each asking for its kind's pool when
    ``cluster`` runs models on a Ray cluster of their own (:data:`TASK_POOL`); else as they are."""
    if cluster.serving.ray_address is None:
        return tuple(dict(p) for p in parts)
    pool = MODEL_POOL if kind == "model" else TASK_POOL
    return tuple({**p, pool: 1.0} for p in parts)


def pool_of(parts: Iterable[Part]) -> str | None:
    """The pool ``parts`` ask for (:data:`POOLS`), None when none."""
    return next((r for p in parts for r in p if r in POOLS), None)


def unpooled(res: Mapping[str, float]) -> dict[str, float]:
    return {r: v for r, v in res.items() if r not in POOLS}
