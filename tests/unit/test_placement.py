"""Per-node capacity and placement: the dashboard's answers parsed (real Ray 2.60 answers stored in
``tests/cases/ray/``), ``actual.json``'s node list, the packing and its reasons, and a property of
admission over generated clusters: what one tick admits fits the nodes, what it calls
unschedulable never could."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.observe.capacity import observe_capacity, parse_capacity
from reconciler.plan import placement
from reconciler.plan.actions import Action, ActionType
from reconciler.plan.actual import ActualState, Capacity, NodeCapacity
from reconciler.plan.admission import unschedulable
from reconciler.plan.placement import (
    FreeNodes,
    demand_parts,
    model_parts,
    never_fits,
    pack,
    placed_count,
    short_on_nodes,
    task_parts,
)
from reconciler.plan.planner import plan
from reconciler.spec.types import ClusterSpec, DesiredState, ModelSpec, ObjectKey, Serving, TaskSpec
from tests import support

RAY = Path(__file__).resolve().parents[1] / "cases" / "ray"
NOW = 1_767_225_600


class StoredDashboard:
    """Answers the two capacity requests with a stored answer of a real Ray head."""

    def __init__(self, name: str) -> None:
        self.stored = json.loads((RAY / name).read_text())

    def get(self, path: str) -> Any:
        return self.stored["cluster_status" if path.startswith("/api/cluster_status") else "nodes"]


def observed(name: str) -> Capacity:
    return observe_capacity(StoredDashboard(name))  # type: ignore[arg-type]


def gpu_nodes(cap: Capacity) -> list[tuple[float, float, float]]:
    """(total GPUs, free GPUs, free worker_node) of each node that has GPUs, largest free first."""
    rows = [
        (n.total.get("GPU", 0.0), n.available.get("GPU", 0.0), n.available.get("worker_node", 0.0))
        for n in cap.nodes
        if n.total.get("GPU")
    ]
    return sorted(rows, reverse=True)


# -- the dashboard's answers -------------------------------------------------------------------


def test_idle_cluster_reports_each_node() -> None:
    cap = observed("two-workers-idle.json")
    assert cap.total["GPU"] == 4.0 and cap.available["GPU"] == 4.0
    assert len(cap.nodes) == 3  # the head and two workers
    assert gpu_nodes(cap) == [(2.0, 2.0, 1.0), (2.0, 2.0, 1.0)]
    head = [n for n in cap.nodes if not n.total.get("GPU")]
    assert head[0].total == {"CPU": 2.0} and head[0].available == {"CPU": 2.0}
    # The node ids are the dashboard's own, and each node's totals add up to the sums.
    ids = {n["node_id"] for n in StoredDashboard("two-workers-idle.json").stored["nodes"]["data"]["result"]["result"]}
    assert {n.node_id for n in cap.nodes} == ids
    for resource, total in cap.total.items():
        assert sum(n.total.get(resource, 0.0) for n in cap.nodes) == pytest.approx(total)


def test_a_placement_group_counts_on_its_node() -> None:
    cap = observed("placement-group-on-one-node.json")
    assert cap.available["GPU"] == 2.0
    # The STRICT_PACK group holds both GPUs of one worker; a task holds the other's worker_node.
    assert gpu_nodes(cap) == [(2.0, 2.0, 0.0), (2.0, 0.0, 1.0)]
    assert not any("_group_" in r for n in cap.nodes for r in n.total)


def test_a_command_jobs_driver_counts_on_its_node() -> None:
    cap = observed("command-job-on-one-node.json")
    assert gpu_nodes(cap) == [(2.0, 2.0, 1.0), (2.0, 0.0, 0.0)]


def test_a_dead_node_is_left_out() -> None:
    cap = observed("one-worker-dead.json")
    assert cap.total["GPU"] == 2.0
    assert gpu_nodes(cap) == [(2.0, 0.0, 0.0)]
    assert len(cap.nodes) == 2


def test_per_node_view_is_unknown_when_the_dashboard_does_not_give_it() -> None:
    stored = StoredDashboard("two-workers-idle.json").stored
    nodes = stored["nodes"]["data"]["result"]["result"]
    report = stored["cluster_status"]["data"]["clusterStatus"]["loadMetricsReport"]
    assert parse_capacity(nodes, report["usage"]).nodes == ()  # no usageByNode: summed only
    assert parse_capacity(nodes, report["usage"], "odd").nodes == ()  # type: ignore[arg-type]
    assert (
        parse_capacity(nodes, report["usage"], report["usageByNode"]).total
        == parse_capacity(nodes, report["usage"]).total
    )
    nameless = [dict(n) for n in nodes]
    del nameless[1]["node_id"]
    assert parse_capacity(nameless, report["usage"], report["usageByNode"]).nodes == ()  # a partial view would lie
    twice = [*nodes, dict(nodes[1])]
    assert parse_capacity(twice, report["usage"], report["usageByNode"]).nodes == ()


def test_odd_usage_by_node_entries_count_as_unused() -> None:
    nodes = [
        {"state": "ALIVE", "node_id": "a", "resources_total": {"GPU": 4, "worker_node": 1, "node:1.2.3.4": 1}},
        {"state": "ALIVE", "node_id": "b", "resources_total": {"GPU": 4, "CPU": "x"}},
        {"state": "ALIVE", "node_id": "c", "resources_total": {"GPU": 2}},
        {"state": "DEAD", "node_id": "d", "resources_total": {"GPU": 8}},
    ]
    by_node = {"a": {"GPU": [3, 4], "workerNode": "busy"}, "b": ["GPU"], "c": {"GPU": []}, "d": {"GPU": [8, 8]}}
    cap = parse_capacity(nodes, {"GPU": [3, 10]}, by_node)
    assert [(n.node_id, dict(n.total), dict(n.available)) for n in cap.nodes] == [
        ("a", {"GPU": 4.0, "worker_node": 1.0}, {"GPU": 1.0, "worker_node": 1.0}),
        ("b", {"GPU": 4.0, "CPU": 0.0}, {"GPU": 4.0, "CPU": 0.0}),
        ("c", {"GPU": 2.0}, {"GPU": 2.0}),
    ]


# -- actual.json ---------------------------------------------------------------------------------


def test_actual_json_carries_the_nodes() -> None:
    cap = observed("placement-group-on-one-node.json")
    state = ActualState(capacity=cap)
    data = json.loads(json.dumps(state.to_json()))
    assert len(data["capacity"]["nodes"]) == 3
    assert ActualState.from_json(data).capacity == cap


def test_actual_json_without_nodes_is_summed_only() -> None:
    old = {"capacity": {"total": {"GPU": 8}, "available": {"GPU": 8}}}
    state = ActualState.from_json(old)
    assert state.capacity.nodes == ()
    assert "nodes" not in state.to_json()["capacity"]  # what older readers expect stays as it was


def test_actual_json_with_a_bad_node_is_an_error() -> None:
    from reconciler.errors import PermanentError

    with pytest.raises(PermanentError, match="node_id"):
        ActualState.from_json({"capacity": {"total": {}, "available": {}, "nodes": [{"total": {}}]}})


# -- parts and packing ---------------------------------------------------------------------------


def task(name: str, workload: str, nodes: int, gpus: int, user: str = "alice") -> TaskSpec:
    return support.task_spec(user, name, workload, nodes=nodes, gpus_per_node=gpus, command="sleep 1")


def model(name: str, gpus: int, replicas: int = 1) -> ModelSpec:
    return ModelSpec(
        key=ObjectKey("alice", "model", name),
        source="Qwen/Qwen2.5-0.5B-Instruct",
        source_path="/hf/qwen",
        source_task=None,
        replicas=replicas,
        gpus_per_replica=gpus,
        engine_kwargs={},
        env={},
        suspend=False,
        created_at=0,
    )


def test_parts_of_each_kind_of_request() -> None:
    cluster = ClusterSpec()
    assert task_parts(task("c", "command", 1, 4), cluster) == ({"worker_node": 1.0, "GPU": 4.0},)
    assert task_parts(task("g", "grpo", 2, 4), cluster) == ({"worker_node": 1.0}, {"GPU": 4.0}, {"GPU": 4.0})
    assert task_parts(task("z", "command", 1, 0), cluster) == ({"worker_node": 1.0},)
    assert model_parts(model("m", 2), cluster, 3) == ({"GPU": 2.0},) * 3
    cpu = ClusterSpec(serving=Serving(accelerator="cpu", cpus_per_replica=4))
    assert model_parts(model("m", 2), cpu, 1) == ({"CPU": 4.0},)
    desired = DesiredState(cluster=cluster, models={model("m", 2, replicas=3).key: model("m", 2, replicas=3)})
    scale_up = Action(ActionType.SCALE_MODEL, ObjectKey("alice", "model", "m"), "", demand={"GPU": 4.0})
    assert demand_parts(desired, scale_up) == ({"GPU": 2.0},) * 2


def test_best_fit_keeps_whole_nodes_for_larger_parts() -> None:
    free = {"a": {"GPU": 4.0}, "b": {"GPU": 2.0}}
    assert pack([{"GPU": 2.0}], free) == {"b": {"GPU": 2.0}}
    assert pack([{"GPU": 2.0}, {"GPU": 4.0}], free) == {"a": {"GPU": 4.0}, "b": {"GPU": 2.0}}
    assert pack([{"GPU": 4.0}, {"GPU": 4.0}], free) is None
    # A driver that takes no GPU goes where it leaves the GPU-rich node to GPU parts.
    wn = {"a": {"GPU": 4.0, "worker_node": 1.0}, "b": {"GPU": 0.0, "worker_node": 1.0}}
    assert pack([{"worker_node": 1.0}], wn) == {"b": {"worker_node": 1.0}}


NODES_4_4 = [
    NodeCapacity("head", {"CPU": 8.0}, {"CPU": 8.0}),
    NodeCapacity("a", {"GPU": 4.0, "worker_node": 1.0}, {}),
    NodeCapacity("b", {"GPU": 4.0, "worker_node": 1.0}, {}),
]


def test_never_fits_names_the_node_sizes() -> None:
    grpo8 = task_parts(task("g", "grpo", 1, 8), ClusterSpec())
    assert never_fits(grpo8, NODES_4_4, "node") == (
        "needs 1 node x 8 GPUs but the largest node has 4 GPUs (nodes: 4, 4 GPUs)"
    )
    assert never_fits(task_parts(task("g", "grpo", 2, 4), ClusterSpec()), NODES_4_4, "node") is None
    assert never_fits(task_parts(task("g", "grpo", 3, 4), ClusterSpec()), NODES_4_4, "node") == (
        "needs 3 nodes x 4 GPUs but the nodes hold only 2 of them (nodes: 4, 4 GPUs)"
    )
    odd = [NodeCapacity("a", {"GPU": 4.0}), NodeCapacity("b", {"GPU": 2.0, "worker_node": 1.0})]
    assert never_fits(task_parts(task("c", "command", 1, 4), ClusterSpec()), odd, "node") == (
        "needs 1 node x 4 GPUs + 1 worker_node but no node has them all together "
        "(nodes: 4 GPUs + 0 worker_node; 2 GPUs + 1 worker_node)"
    )
    assert never_fits(grpo8, [], "node") is None  # nodes unknown: not checked here
    many = [NodeCapacity(f"n{i}", {"GPU": 8.0 if i < 10 else 4.0}) for i in range(12)]
    why = never_fits(({"GPU": 16.0},), many, "replica")
    assert why == "needs 1 replica x 16 GPUs but the largest node has 8 GPUs (nodes: 10 x 8, 2 x 4 GPUs)"


def test_short_on_nodes_says_what_each_node_has_free() -> None:
    totals = {n.node_id: n.total for n in NODES_4_4}
    free = {"head": {"CPU": 8.0}, "a": {"GPU": 2.0, "worker_node": 1.0}, "b": {"GPU": 2.0, "worker_node": 1.0}}
    parts = task_parts(task("c", "command", 1, 4), ClusterSpec())
    assert short_on_nodes(parts, free, totals, "node") == (
        "insufficient capacity per node: needs 1 node x 4 GPUs, each on one node; free per node: 2, 2 GPUs",
        ("GPU",),
    )
    slots = {"head": {"CPU": 8.0}, "a": {"GPU": 4.0, "worker_node": 0.0}, "b": {"GPU": 0.0, "worker_node": 1.0}}
    assert short_on_nodes(parts, slots, totals, "node") == (
        "insufficient capacity per node: needs 1 node x 4 GPUs + 1 worker_node, each on one node; "
        "free per node: 4 GPUs + 0 worker_node; 0 GPUs + 1 worker_node",
        ("GPU", "worker_node"),
    )
    assert short_on_nodes(task_parts(task("c", "command", 1, 2), ClusterSpec()), free, totals, "node") is None


def test_validate_with_nodes_flags_what_never_fits() -> None:
    big, ok = task("big", "grpo", 1, 8), task("ok", "grpo", 2, 4)
    desired = DesiredState(cluster=ClusterSpec(), tasks={big.key: big, ok.key: ok})
    total = {"GPU": 8.0, "worker_node": 2.0}
    assert unschedulable(desired, total) == []  # the sums alone say it fits
    assert unschedulable(desired, total, NODES_4_4) == [
        (big.key, "needs 1 node x 8 GPUs but the largest node has 4 GPUs (nodes: 4, 4 GPUs)")
    ]


# -- admission over generated clusters -----------------------------------------------------------


def fits_exactly(parts: Sequence[Mapping[str, float]], free: Mapping[str, Mapping[str, float]]) -> bool:
    """Whether some assignment of ``parts`` to nodes fits ``free`` (exhaustive search)."""
    left = {n: dict(r) for n, r in free.items()}
    ordered = sorted(parts, key=lambda p: -sum(p.values()))

    def place(i: int) -> bool:
        if i == len(ordered):
            return True
        for res in left.values():
            if all(res.get(r, 0.0) + 1e-9 >= v for r, v in ordered[i].items()):
                for r, v in ordered[i].items():
                    res[r] = res.get(r, 0.0) - v
                if place(i + 1):
                    return True
                for r, v in ordered[i].items():
                    res[r] += v
        return False

    return place(0)


NODE = st.tuples(st.sampled_from([0, 1, 2, 4, 8]), st.integers(0, 8), st.booleans())
TASK = st.tuples(st.sampled_from(["command", "grpo"]), st.integers(1, 3), st.sampled_from([1, 2, 3, 4, 8]))


@settings(max_examples=150, deadline=None, database=None)
@given(st.lists(NODE, min_size=1, max_size=4), st.lists(TASK, min_size=1, max_size=5))
def test_one_tick_never_admits_more_than_the_nodes_hold(nodes: list[Any], tasks: list[Any]) -> None:
    cluster = ClusterSpec()
    caps = []
    for i, (gpus, used, slot) in enumerate(nodes):
        total = {"GPU": float(gpus), "worker_node": float(slot)}
        caps.append(NodeCapacity(f"n{i}", total, {"GPU": float(max(0, gpus - used)), "worker_node": float(slot)}))
    total, avail = {}, {}
    for n in caps:
        for r, v in n.total.items():
            total[r] = total.get(r, 0.0) + v
        for r, v in n.available.items():
            avail[r] = avail.get(r, 0.0) + v
    specs = {}
    for i, (workload, count, gpus) in enumerate(tasks):
        spec = support.task_spec(
            "alice", f"t{i}", workload, nodes=1 if workload == "command" else count, gpus_per_node=gpus,
            command="sleep 1", created_at=NOW + i,
        )  # fmt: skip
        specs[spec.key] = spec
    desired = DesiredState(cluster=cluster, tasks=specs)
    result = plan(desired, ActualState(capacity=Capacity(total, avail, tuple(caps))), now=NOW + 100)
    free = {n.node_id: n.available for n in caps}
    admitted = [a for a in result.actions if a.type is ActionType.SUBMIT_TASK]
    assert fits_exactly([p for a in admitted for p in task_parts(specs[a.key], cluster)], free)
    for action in result.actions:
        parts = task_parts(specs[action.key], cluster)
        fits_empty = fits_exactly(parts, {n.node_id: n.total for n in caps})
        if action.type is ActionType.UNSCHEDULABLE:
            assert not fits_empty, action.reason
        else:
            assert fits_empty, action.reason


# -- the grouped packing against the packing it replaced ------------------------------------------
# Until 2026-12, pack copied every node per call and scanned every node per part, and never_fits
# packed the node totals again for every request. What follows is that code as it was: the grouped
# packing (FreeNodes), the remembered never_fits and the remembered per-node listing must answer
# exactly as it did, texts included.


def old_best_node(part: Mapping[str, float], left: Mapping[str, Mapping[str, float]]) -> str | None:
    main = placement._main(part)
    best: tuple[float, float, str] | None = None
    for node, res in left.items():
        if all(res.get(r, 0.0) + 1e-9 >= v for r, v in part.items()):
            rank = (res.get(main, 0.0) - part.get(main, 0.0), res.get("GPU", 0.0) - part.get("GPU", 0.0), node)
            if best is None or rank < best:
                best = rank
    return best[2] if best is not None else None


def old_pack(
    parts: Sequence[Mapping[str, float]], free: Mapping[str, Mapping[str, float]]
) -> dict[str, dict[str, float]] | None:
    left = {node: dict(res) for node, res in free.items()}
    taken: dict[str, dict[str, float]] = {}
    for part in placement._largest_first(parts):
        node = old_best_node(part, left)
        if node is None:
            return None
        for r, v in part.items():
            left[node][r] = left[node].get(r, 0.0) - v
            taken.setdefault(node, {})[r] = taken.get(node, {}).get(r, 0.0) + v
    return taken


def old_placed_count(parts: Sequence[Mapping[str, float]], free: Mapping[str, Mapping[str, float]]) -> int:
    left = {node: dict(res) for node, res in free.items()}
    count = 0
    for part in placement._largest_first(parts):
        node = old_best_node(part, left)
        if node is not None:
            count += 1
            for r, v in part.items():
                left[node][r] = left[node].get(r, 0.0) - v
    return count


def old_never_fits(parts: Sequence[Mapping[str, float]], nodes: Sequence[NodeCapacity], unit: str) -> str | None:
    if not parts or not nodes:
        return None
    totals = {n.node_id: n.total for n in nodes}
    if old_pack(parts, totals) is not None:
        return None
    main = placement._main_of(parts)
    sized = [p for p in parts if p.get(main, 0.0) > 0]
    biggest = max((p.get(main, 0.0) for p in sized), default=0.0)
    largest = max((n.total.get(main, 0.0) for n in nodes), default=0.0)
    listing = placement._listing([n.total for n in nodes], [main])
    described = placement.describe(parts, unit, [main])
    if biggest > largest + 1e-9:
        return f"needs {described} but the largest node has {placement._amount(largest, main)} ({listing})"
    bare = [{main: p[main]} for p in sized]
    if old_pack(bare, totals) is None:
        held = old_placed_count(bare, totals)
        return f"needs {described} but the nodes hold only {held} of them ({listing})"
    names = placement._names(parts)
    listing = placement._listing([n.total for n in nodes], names)
    return f"needs {placement.describe(parts, unit, names)} but no node has them all together ({listing})"


def old_short_on_nodes(
    parts: Sequence[Mapping[str, float]],
    free: Mapping[str, Mapping[str, float]],
    totals: Mapping[str, Mapping[str, float]],
    unit: str,
) -> tuple[str, tuple[str, ...]] | None:
    if not parts or old_pack(parts, free) is not None:
        return None
    main = placement._main_of(parts)
    bare = [{main: p[main]} for p in parts if p.get(main, 0.0) > 0]
    names = [main] if bare and old_pack(bare, free) is None else placement._names(parts)
    shown = [res for node, res in free.items() if totals.get(node, {}).get(main, 0.0) > 0]
    why = (
        f"insufficient capacity per node: needs {placement.describe(parts, unit, names)}, each on one node; "
        f"free per node: {placement._listing(shown, names, zeros=True)}"
    )
    return why, tuple(sorted(names))


# Few distinct values, so that many nodes share a shape (and differ only by id); a resource a node
# lacks, or has 0 of, and a 0.5 that leaves fractions.
GEN_NODE = st.fixed_dictionaries(
    {"GPU": st.sampled_from([0.0, 1.0, 2.0, 4.0, 8.0])},
    optional={"worker_node": st.sampled_from([0.0, 1.0, 2.0]), "CPU": st.sampled_from([0.0, 4.0, 8.5])},
)
GEN_PART = st.one_of(
    st.fixed_dictionaries({"GPU": st.sampled_from([0.5, 1.0, 2.0, 4.0, 8.0])}),
    st.just({"worker_node": 1.0}),
    st.fixed_dictionaries({"GPU": st.sampled_from([1.0, 4.0]), "worker_node": st.just(1.0)}),
    st.fixed_dictionaries({"CPU": st.sampled_from([1.0, 4.0])}, optional={"worker_node": st.just(1.0)}),
    st.just({"GPU": 1.0, "CPU": -8.0}),  # argus asks for none, but pack gives back as it always did
)
GEN_FREE = st.dictionaries(st.text("abcdefghij", min_size=1, max_size=2), GEN_NODE, min_size=1, max_size=12)


@settings(max_examples=300, deadline=None, database=None)
@given(GEN_FREE, st.lists(st.lists(GEN_PART, min_size=1, max_size=6), min_size=1, max_size=6), st.data())
def test_grouped_packing_answers_as_the_scan_of_every_node(
    free: dict[str, dict[str, float]], requests: list[list[dict[str, float]]], data: st.DataObject
) -> None:
    """Requests placed one after another (as a tick admits them): the grouped packing, its count,
    the per-node reason and the never-fits reason are the old ones, on a plain mapping and on
    FreeNodes as :meth:`FreeNodes.take` changes it."""
    totals = {node: dict(res) for node, res in free.items()}
    nodes = tuple(NodeCapacity(node, res) for node, res in totals.items())
    old_left = {node: dict(res) for node, res in free.items()}
    grouped = FreeNodes({node: dict(res) for node, res in free.items()})
    for parts in requests:
        unit = data.draw(st.sampled_from(["node", "replica"]))
        expected = old_pack(parts, old_left)
        assert pack(parts, old_left) == expected
        assert pack(parts, grouped) == expected
        assert placed_count(parts, grouped) == old_placed_count(parts, old_left) == placed_count(parts, old_left)
        assert short_on_nodes(parts, grouped, totals, unit) == old_short_on_nodes(parts, old_left, totals, unit)
        assert short_on_nodes(parts, old_left, totals, unit) == old_short_on_nodes(parts, old_left, totals, unit)
        assert never_fits(parts, nodes, unit) == old_never_fits(parts, nodes, unit)
        assert never_fits(parts, list(nodes), unit) == old_never_fits(parts, nodes, unit)
        if expected is not None:  # admitted: Ledger.place takes it from the nodes
            for node, res in expected.items():
                for r, v in res.items():
                    old_left[node][r] = old_left[node].get(r, 0.0) - v
            grouped.take(expected)
        assert dict(grouped) == old_left and list(grouped) == list(old_left)
        # The groups hold every node once, under its own free resources.
        groups = grouped._groups
        assert sorted(n for _, ids in groups.values() for n in ids) == sorted(old_left)
        assert all(placement._shape(old_left[n]) == shape for shape, (_, ids) in groups.items() for n in ids)


def test_never_fits_is_remembered_per_nodes_and_parts() -> None:
    nodes = (NodeCapacity("a", {"GPU": 4.0}), NodeCapacity("b", {"GPU": 4.0}))
    three = ({"GPU": 4.0},) * 3
    why = "needs 3 replicas x 4 GPUs but the nodes hold only 2 of them (nodes: 4, 4 GPUs)"
    assert never_fits(three, nodes, "replica") == why
    hits = placement._never_fits.cache_info().hits
    # Equal parts and nodes given as other objects: answered from memory, the same.
    again = tuple(NodeCapacity(n.node_id, dict(n.total)) for n in nodes)
    assert never_fits([{"GPU": 4.0}] * 3, again, "replica") == why
    assert placement._never_fits.cache_info().hits == hits + 1
    # Other totals, ids, units or parts are other questions.
    assert never_fits(three, (NodeCapacity("a", {"GPU": 4.0}), NodeCapacity("b", {"GPU": 8.0})), "replica") is None
    assert never_fits(three, nodes, "node") == why.replace("replicas", "nodes")
    assert never_fits(({"GPU": 4.0},) * 2, nodes, "replica") is None
    # A list of nodes may change between calls: it is read each time.
    listed = list(nodes)
    assert never_fits(three, listed, "replica") == why
    listed.append(NodeCapacity("c", {"GPU": 4.0}))
    assert never_fits(three, listed, "replica") is None


def test_the_remembered_listing_follows_the_totals_and_the_takes() -> None:
    free = FreeNodes({"a": {"GPU": 2.0}, "b": {"GPU": 1.0}, "head": {"CPU": 8.0}})
    both = {"a": {"GPU": 4.0}, "b": {"GPU": 4.0}, "head": {"CPU": 8.0}}
    only_a = {"a": {"GPU": 4.0}, "b": {"CPU": 1.0}, "head": {"CPU": 8.0}}
    assert free.shown(both, ["GPU"]) == "2, 1 GPUs"
    assert free.shown(only_a, ["GPU"]) == "2 GPUs"
    assert free.shown(both, ["GPU"]) == "2, 1 GPUs"
    free.take({"a": {"GPU": 2.0}})
    assert free.shown(both, ["GPU"]) == "1, 0 GPUs"
    assert free == {"a": {"GPU": 0.0}, "b": {"GPU": 1.0}, "head": {"CPU": 8.0}}
