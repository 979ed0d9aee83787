"""Observe the cluster's total and available Ray resources through the dashboard. I/O.

Ray 2.60's dashboard has no single JSON endpoint with both in raw resource names:
``GET /api/v0/nodes`` lists each alive node's ``resources_total`` (raw names), and
``GET /api/cluster_status`` reports ``[used, total]`` per resource with placement-group
reservations counted as used, but with keys camel-cased (``worker_node`` -> ``workerNode``).
Used amounts are matched back to raw names by camel-casing the raw names the same way.

Per node: ``loadMetricsReport.usageByNode`` maps each node id (as ``/api/v0/nodes`` reports it)
to the same camel-cased ``[used, total]`` table (checked against a Ray 2.60 head with two worker
raylets: tests/cases/ray/). ``/nodes?view=summary`` carries only totals, so it is not asked.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from reconciler.dashboard import Dashboard
from reconciler.errors import RayUnavailable
from reconciler.plan.actual import Capacity, NodeCapacity
from reconciler.plan.pools import POOL_PREFIX, SERVING_NODE_PREFIX

NODES_PATH = "/api/v0/nodes?detail=1&limit=10000"
CLUSTER_STATUS_PATH = "/api/cluster_status"
# Bookkeeping resources that no argus object asks for.
_IGNORED = frozenset({"memory", "object_store_memory"})


def observe_capacity(dash: Dashboard) -> Capacity:
    """Return total and available resources of all alive nodes (placement groups count as used),
    summed and per node (per node empty when the dashboard does not report usage by node).

    Raises RayUnavailable when the dashboard cannot be reached or answers without data,
    DashboardError on an HTTP error.
    """
    nodes = dash.get(NODES_PATH)
    status = dash.get(CLUSTER_STATUS_PATH)
    try:
        node_list = nodes["data"]["result"]["result"]
        report = status["data"]["clusterStatus"]["loadMetricsReport"]
        usage = report["usage"]
    except (KeyError, TypeError) as exc:
        raise RayUnavailable(f"dashboard answered without cluster resources: {exc!r}") from exc
    by_node = report.get("usageByNode") if isinstance(report, Mapping) else None
    return parse_capacity(node_list, usage, by_node)


def merge_capacity(jobs: Capacity, serving: Capacity) -> Capacity:
    """The capacity of two clusters as one (the jobs cluster's and the serving cluster's, when
    cluster.yaml's ``serving.ray_address`` names one): totals and available summed, nodes listed
    together, the serving cluster's ids prefixed
    :data:`~reconciler.plan.pools.SERVING_NODE_PREFIX` (the planner places tasks on the
    first's nodes and models on the second's: :func:`~reconciler.plan.pools.pooled_nodes`).
    Per node it stays unknown (empty) if either cluster's is: a partial view would make a request
    look larger than the clusters. Two that share a node id are one cluster under two addresses:
    ``jobs`` alone then (counted twice, its resources would be admitted twice). Pure."""
    if {n.node_id for n in jobs.nodes} & {n.node_id for n in serving.nodes}:
        return jobs

    def add(a: Mapping[str, float], b: Mapping[str, float]) -> dict[str, float]:
        return {k: a.get(k, 0.0) + b.get(k, 0.0) for k in sorted({*a, *b})}

    nodes: tuple[NodeCapacity, ...] = ()
    if jobs.nodes and serving.nodes:
        nodes = jobs.nodes + tuple(replace(n, node_id=SERVING_NODE_PREFIX + n.node_id) for n in serving.nodes)
    return Capacity(add(jobs.total, serving.total), add(jobs.available, serving.available), nodes)


def parse_capacity(
    nodes: list[Mapping[str, Any]], usage: Mapping[str, Any], usage_by_node: Mapping[str, Any] | None = None
) -> Capacity:
    """Combine node totals and camel-cased ``[used, total]`` usage (summed, and ``usage_by_node``:
    node id -> the same table) into a Capacity. Pure.

    Never raises on odd types (a custom resource is anyone's to name and size): an entry of
    an unexpected shape is skipped and a value that is not a number counts 0 (unknown). The
    per-node view is left empty (unknown) when ``usage_by_node`` is not a mapping or an alive
    node has no id: a partial view would make a request look larger than the cluster. A node
    the usage table does not list yet (it just joined) counts as unused, as in the sums.
    """
    total: dict[str, float] = {}
    per_node: list[tuple[object, dict[str, float]]] = []
    for node in nodes if isinstance(nodes, list) else []:
        if not isinstance(node, Mapping) or node.get("state") != "ALIVE":
            continue
        resources = node.get("resources_total")
        mine: dict[str, float] = {}
        for name, value in (resources if isinstance(resources, Mapping) else {}).items():
            if isinstance(name, str) and _counted(name):
                total[name] = total.get(name, 0.0) + _number(value)
                mine[name] = mine.get(name, 0.0) + _number(value)
        per_node.append((node.get("node_id"), mine))
    available = _available(total, usage)
    node_view: tuple[NodeCapacity, ...] = ()
    ids = [node_id for node_id, _ in per_node]
    if isinstance(usage_by_node, Mapping) and all(isinstance(i, str) and i for i in ids) and len(set(ids)) == len(ids):
        node_view = tuple(
            NodeCapacity(str(node_id), mine, _available(mine, usage_by_node.get(str(node_id))))
            for node_id, mine in sorted(per_node, key=lambda n: str(n[0]))
        )
    return Capacity(total=total, available=available, nodes=node_view)


def _available(total: Mapping[str, float], usage: object) -> dict[str, float]:
    """``total`` less the used amounts of a camel-cased ``[used, total]`` table (absent: unused)."""
    table = usage if isinstance(usage, Mapping) else {}
    available: dict[str, float] = {}
    for name, value in total.items():
        used_total = table.get(_camel(name)) or table.get(name)
        used = _number(used_total[0]) if isinstance(used_total, list) and used_total else 0.0
        available[name] = max(0.0, round(value - used, 6))
    return available


def _number(value: object) -> float:
    """``value`` as a float when it is a finite number, else 0.0 (unknown)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return 0.0


def _counted(name: str) -> bool:
    # node:<ip> / node:__internal_head__ are per-node markers; *_group_* are placement-group
    # resources already counted in the base resource's usage.
    # argus's pools (reconciler/plan/placement.py) are argus's marks: a node that names one itself
    # (any job can start a raylet with any custom resource) is not believed.
    return not (name in _IGNORED or name.startswith(("node:", POOL_PREFIX)) or "_group_" in name)


def _camel(name: str) -> str:
    """The dashboard's key conversion (``ray.dashboard.utils.to_camel_case``)."""
    first, *rest = name.split("_")
    return first + "".join(part.title() for part in rest)
