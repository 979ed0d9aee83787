"""Models on a Ray cluster of their own (cluster.yaml ``serving.ray_address``): whole ticks against two
stand-in dashboards, the capacity of both, the serving cluster's token, and cluster.yaml's field.
The same against two real Ray heads: tests/e2e/test_serving_cluster.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from reconciler.builders.serve import ROUTER_APP, app_name
from reconciler.dashboard import Clusters, Dashboard, serving_token_from_env
from reconciler.errors import ArgusError, RayUnavailable
from reconciler.observe.capacity import merge_capacity, parse_capacity
from reconciler.plan.actual import ActualState, Capacity, NodeCapacity
from reconciler.plan.placement import model_parts, never_fits, pack, short_on_nodes, task_parts
from reconciler.plan.pools import MODEL_POOL, TASK_POOL, pooled_nodes
from reconciler.source.remote import open_source
from reconciler.spec.loader import SourceFile, load
from reconciler.spec.types import ClusterSpec, ModelSpec, ObjectKey, Serving
from tests.support import ConfigRepo, Ticker, cluster_yaml, task_spec, ticker
from tests.unit.fake_ray import FakeRay
from tests.unit.test_fuzz_ticks import AllowAll

SERVING_URL = "http://serving-ray:8265"
BOB_APP = app_name("bob", "chat")


def _repo(tmp_path: Path, ray_address: str | None) -> ConfigRepo:
    repo = ConfigRepo(tmp_path)
    doc = cluster_yaml(tmp_path / "hf", tmp_path / "users", 8000)
    doc["serving"]["proxy_location"] = "EveryNode"  # FakeRay's
    if ray_address is not None:
        doc["serving"]["ray_address"] = ray_address
    repo.write("cluster.yaml", doc)
    repo.write("users/bob/models/chat.yaml", {"kind": "Model", "source": "$HOME/models/chat", "replicas": 1})
    repo.write("users/bob/tasks/prep.yaml", {"kind": "Task", "workload": "command", "command": "true"})
    repo.commit_push("a model and a task")
    return repo


def _ticker(repo: ConfigRepo, jobs: FakeRay, serving: FakeRay, made: list[tuple[str, str | None]]) -> Ticker:
    def make(address: str, token: str | None) -> Dashboard:
        made.append((address, token))
        assert address == SERVING_URL
        return serving

    source = open_source(str(repo.bare), str(repo.bare) + "-cache")
    return ticker(
        source, "main", jobs, fs=AllowAll(), secrets_env={}, task_check=lambda t, c: [], serving_dashboard=make
    )


def test_models_go_to_the_serving_cluster_and_tasks_to_the_jobs_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ARGUS_SERVING_RAY_TOKEN", "serving-token")
    monkeypatch.setenv("ARGUS_SERVING_RAY", SERVING_URL)
    jobs = FakeRay(gpus=2, base_url="http://jobs-ray:8265")
    serving = FakeRay(gpus=6, base_url=SERVING_URL)
    made: list[tuple[str, str | None]] = []
    t = _ticker(_repo(tmp_path, SERVING_URL), jobs, serving, made)
    result = t.tick()
    assert set(serving.apps) == {ROUTER_APP, BOB_APP} and jobs.apps == {}
    assert [j["submission_id"].startswith("argus--bob--prep--") for j in jobs.jobs.values()] == [True]
    assert serving.jobs == {} and serving.submits == 0
    assert made == [(SERVING_URL, "serving-token")], "one serving dashboard, with the serving token only"
    # Admission saw both clusters: 2 + 6 GPUs.
    assert result.actual.capacity.total["GPU"] == pytest.approx(8.0)
    # Observed from the serving cluster: the model's application is as declared, nothing to do.
    puts = serving.puts
    again = t.tick()
    assert serving.puts == puts and jobs.puts == 0
    assert again.statuses[next(k for k in again.statuses if k.kind == "model")].state != "FAILED"
    assert len(made) == 1, "the serving dashboard is kept between ticks"


def test_without_a_serving_cluster_everything_is_on_one(tmp_path: Path) -> None:
    jobs, serving = FakeRay(gpus=2, base_url="http://jobs-ray:8265"), FakeRay(gpus=6, base_url=SERVING_URL)
    made: list[tuple[str, str | None]] = []
    t = _ticker(_repo(tmp_path, None), jobs, serving, made)
    result = t.tick()
    assert set(jobs.apps) == {ROUTER_APP, BOB_APP} and len(jobs.jobs) == 1
    assert serving.apps == {} and serving.puts == 0 and made == []
    assert result.actual.capacity.total["GPU"] == pytest.approx(2.0)


def test_the_serving_cluster_never_gets_the_jobs_token(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The jobs cluster's token is what every job holds: a cluster of its own has another, or none."""
    for name in ("ARGUS_SERVING_RAY_TOKEN", "ARGUS_SERVING_RAY_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ARGUS_RAY_TOKEN", "jobs-token")
    clusters = Clusters(Dashboard("http://jobs:8265"))
    assert clusters.jobs._token == "jobs-token"
    assert clusters.serving(None) is clusters.jobs and clusters.serving("http://jobs:8265/") is clusters.jobs
    assert clusters.serving(SERVING_URL)._token is None
    token = tmp_path / "serving-token"
    token.write_text("from-a-file\n")
    monkeypatch.setenv("ARGUS_SERVING_RAY_TOKEN_PATH", str(token))
    assert serving_token_from_env() == "from-a-file"
    # The token goes only where the daemon's environment pins it: a commit naming another address
    # (a host a job listens on) gets nothing.
    with pytest.raises(RayUnavailable, match="ARGUS_SERVING_RAY"):
        Clusters(Dashboard("http://jobs:8265")).serving("http://job-listens-here:8265")
    monkeypatch.setenv("ARGUS_SERVING_RAY", "http://other-serving:8265/")
    clusters = Clusters(Dashboard("http://jobs:8265"))
    with pytest.raises(RayUnavailable, match="only to ARGUS_SERVING_RAY"):
        clusters.serving("http://job-listens-here:8265")
    other = clusters.serving("http://other-serving:8265")
    assert other.base_url == "http://other-serving:8265" and other._token == "from-a-file"
    token.write_text("")
    with pytest.raises(ArgusError, match="empty"):
        serving_token_from_env()
    # A token that cannot be read is the serving cluster unavailable: the tick backs off, nothing is applied.
    with pytest.raises(RayUnavailable, match=r"other-serving-2.*empty"):
        clusters.serving("http://other-serving-2:8265")


def test_a_refusal_names_the_serving_clusters_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """The serving cluster refusing its token says which variables to set (not the jobs cluster's)."""
    monkeypatch.setenv("ARGUS_SERVING_RAY_TOKEN", "t")
    monkeypatch.setenv("ARGUS_SERVING_RAY", SERVING_URL)
    dash = Clusters(Dashboard("http://jobs:8265")).serving(SERVING_URL)
    assert dash.token_names == "ARGUS_SERVING_RAY_TOKEN or ARGUS_SERVING_RAY_TOKEN_PATH"


def test_capacity_of_two_clusters_is_their_sum() -> None:
    a = Capacity({"CPU": 8.0, "GPU": 2.0}, {"CPU": 4.0, "GPU": 1.0}, (NodeCapacity("n1", {"GPU": 2.0}, {"GPU": 1.0}),))
    b = Capacity({"GPU": 4.0, "CPU": 2.0}, {"GPU": 4.0, "CPU": 2.0}, (NodeCapacity("n2", {"GPU": 4.0}, {"GPU": 4.0}),))
    both = merge_capacity(a, b)
    assert both.total == {"CPU": 10.0, "GPU": 6.0} and both.available == {"CPU": 6.0, "GPU": 5.0}
    assert [n.node_id for n in both.nodes] == ["n1", "serving:n2"], "the serving cluster's nodes are marked"
    # Per node unknown on either: unknown for both (a partial view would shrink the clusters).
    assert merge_capacity(a, Capacity({"GPU": 4.0}, {"GPU": 4.0})).nodes == ()


def _cluster(serving: str) -> Any:
    return load([SourceFile("cluster.yaml", f"kind: Cluster\nserving:\n{serving}".encode(), "b")])


def test_ray_address_is_checked_at_its_line() -> None:
    ok = _cluster("  ray_address: http://serving-head:8265\n")
    assert ok.cluster_valid and ok.cluster.serving.ray_address == "http://serving-head:8265"
    assert _cluster("  accelerator: cpu\n").cluster.serving.ray_address is None
    for bad in ("file:///etc/passwd", "http://host/path?x=1", "serving-head:8265", "http://a b:1"):
        loaded = _cluster(f"  ray_address: {bad!r}\n")
        assert not loaded.cluster_valid, bad
        assert loaded.issues[0].line == 3 and "ray_address" in str(loaded.issues[0]), loaded.issues


# -- placement per cluster -------------------------------------------------------------------------

SEPARATE = ClusterSpec(serving=Serving(ray_address=SERVING_URL))
# The tasks' cluster has a 2-GPU node, the serving cluster a 4-GPU one (and both a CPU head).
GPU_NODE = {"GPU": 2.0, "worker_node": 2.0}
TWO = merge_capacity(
    Capacity({"GPU": 2.0}, {"GPU": 2.0}, (NodeCapacity("a", GPU_NODE, GPU_NODE),)),
    Capacity({"GPU": 4.0}, {"GPU": 4.0}, (NodeCapacity("b", {"GPU": 4.0}, {"GPU": 4.0}),)),
)


def model_spec(gpus: int) -> ModelSpec:
    return ModelSpec(
        key=ObjectKey("alice", "model", "m"),
        source="Qwen/Qwen2.5-0.5B-Instruct",
        source_path="/hf/qwen",
        source_task=None,
        replicas=1,
        gpus_per_replica=gpus,
        engine_kwargs={},
        env={},
        suspend=False,
        created_at=0,
    )


POOLED = pooled_nodes(TWO.nodes, SEPARATE)


def _parts_on(parts: Any) -> dict[str, dict[str, float]] | None:
    return pack(parts, {n.node_id: n.available for n in POOLED})


def test_tasks_are_placed_on_the_tasks_cluster_and_models_on_the_serving_cluster() -> None:
    task = task_spec("alice", "t", gpus_per_node=2, command="true")
    model = model_spec(4)
    assert task_parts(task, SEPARATE) == ({"worker_node": 1.0, "GPU": 2.0, TASK_POOL: 1.0},)
    assert model_parts(model, SEPARATE, 1) == ({"GPU": 4.0, MODEL_POOL: 1.0},)
    assert _parts_on(task_parts(task, SEPARATE)) == {"a": {"worker_node": 1.0, "GPU": 2.0}}
    assert _parts_on(model_parts(model, SEPARATE, 1)) == {"serving:b": {"GPU": 4.0}}
    # Each fits the other cluster's nodes by size, but not by cluster.
    assert _parts_on(model_parts(model_spec(2), SEPARATE, 2)) == {"serving:b": {"GPU": 4.0}}
    # A third 2-GPU replica has no room on the serving cluster, whatever the tasks' node has free.
    assert _parts_on(model_parts(model_spec(2), SEPARATE, 3)) is None
    assert never_fits(model_parts(model_spec(8), SEPARATE, 1), POOLED, "replica") == (
        "needs 1 replica x 8 GPUs but the largest node has 4 GPUs (nodes: 4 GPUs) on the serving Ray cluster"
    )
    big = task_spec("alice", "big", gpus_per_node=4, command="true")
    assert never_fits(task_parts(big, SEPARATE), POOLED, "node") == (
        "needs 1 node x 4 GPUs but the largest node has 2 GPUs (nodes: 2 GPUs) on the tasks' Ray cluster"
    )
    # The pool is where a part goes, not something it uses up: many parts share a node.
    small = task_spec("alice", "s", gpus_per_node=0, command="true")
    assert _parts_on(task_parts(small, SEPARATE) * 2) == {"a": {"worker_node": 2.0}}
    # Without a serving cluster nothing changes.
    assert task_parts(task, ClusterSpec()) == ({"worker_node": 1.0, "GPU": 2.0},)


def test_short_on_nodes_speaks_of_the_objects_cluster() -> None:
    totals = {n.node_id: n.total for n in POOLED}
    free = {n.node_id: n.available for n in POOLED}
    free["serving:b"] = {**free["serving:b"], "GPU": 1.0}
    why = short_on_nodes(model_parts(model_spec(2), SEPARATE, 1), free, totals, "replica")
    assert why == (
        "insufficient capacity per node: needs 1 replica x 2 GPUs, each on one node; "
        "free per node of the serving Ray cluster: 1 GPUs",
        ("GPU",),
    )


def test_one_cluster_named_for_serving_too_offers_both_pools() -> None:
    """cluster.yaml names the tasks' own cluster for serving (or an actual.json of one cluster is
    planned against): no node is the serving cluster's, so every node takes both kinds."""
    node = {"GPU": 4.0, "worker_node": 1.0}
    one = pooled_nodes((NodeCapacity("a", node, node),), SEPARATE)
    job = task_spec("a", "t", gpus_per_node=2, command="true")
    both = model_parts(model_spec(2), SEPARATE, 1) + task_parts(job, SEPARATE)
    assert pack(both, {n.node_id: n.available for n in one}) == {"a": {"GPU": 4.0, "worker_node": 1.0}}
    assert pooled_nodes(TWO.nodes, ClusterSpec()) is TWO.nodes, "no serving cluster: the nodes as they are"


def test_pools_stay_out_of_the_record_and_one_cluster_is_never_counted_twice() -> None:
    """actual.json carries Ray's resources only (the pools are the planner's); the same cluster named
    under a second address is counted once (its node ids are the same)."""
    doc = ActualState(capacity=TWO).to_json()
    assert "argus.pool" not in json.dumps(doc) and "serving:b" in json.dumps(doc)
    same = Capacity({"GPU": 2.0}, {"GPU": 2.0}, (NodeCapacity("a", {"GPU": 2.0}, {"GPU": 2.0}),))
    assert merge_capacity(same, same) is same


def test_a_whole_tick_waits_for_the_right_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tasks' cluster has no GPU, the serving cluster has 8: a 1-GPU task is unschedulable (it
    could never run where tasks run), although the two clusters together have GPUs to spare."""
    monkeypatch.delenv("ARGUS_SERVING_RAY_TOKEN", raising=False)
    jobs = FakeRay(gpus=0, base_url="http://jobs-ray:8265", per_node=True)
    serving = FakeRay(gpus=8, base_url=SERVING_URL, per_node=True)
    repo = _repo(tmp_path, SERVING_URL)
    repo.write(
        "users/bob/tasks/gpu.yaml", {"kind": "Task", "workload": "command", "command": "true", "gpus_per_node": 1}
    )
    repo.commit_push("a GPU task")
    t = _ticker(repo, jobs, serving, [])
    result = t.tick()
    status = next(s for k, s in result.statuses.items() if k.name == "gpu")
    assert "tasks' Ray cluster" in status.reason and not any("--gpu--" in sid for sid in jobs.jobs), status
    assert result.actual.capacity.total["GPU"] == pytest.approx(8.0)
    # GPUs where tasks run: the same task is submitted there.
    jobs.gpus, serving.gpus = 2, 0
    t.timer()
    result = t.tick()
    status = next(s for k, s in result.statuses.items() if k.name == "gpu")
    assert any("--gpu--" in sid for sid in jobs.jobs), status  # now it fits where tasks run


def test_a_node_naming_an_argus_pool_is_not_believed() -> None:
    node = {"state": "ALIVE", "node_id": "n", "resources_total": {"GPU": 1.0, MODEL_POOL: 1e9, "argus.pool/x": 1.0}}
    capacity = parse_capacity([node], {}, {"n": {}})
    assert capacity.total == {"GPU": 1.0} and capacity.nodes[0].total == {"GPU": 1.0}


def test_before_serve_is_observed_model_logs_and_the_watch_read_nothing() -> None:
    """Until the daemon has read cluster.yaml and observed Serve, it does not know which cluster
    models run on: the jobs cluster may not be it, and any job could deploy a look-alike of a
    model's application there. Model logs are refused and the Serve watch reads nothing."""
    from reconciler.errors import LogNotFound
    from reconciler.logs.ray import RayLogs
    from reconciler.observe.serve_watch import ServeWatch

    jobs = FakeRay(gpus=2, base_url="http://jobs-ray:8265")
    jobs.apps[BOB_APP] = {"name": BOB_APP, "route_prefix": None, "import_path": "x:y"}  # a look-alike
    logs = RayLogs(jobs, lambda text: text, serving=lambda: None)
    with pytest.raises(LogNotFound, match="not observed Serve yet"):
        logs.model_log("bob", "chat", {})
    with pytest.raises(LogNotFound, match="not observed Serve yet"):
        logs.deployed_model_spec("bob", "chat", {})
    woken: list[int] = []
    import threading

    watch = ServeWatch(lambda: None, lambda: woken.append(1), threading.Event(), 1.0)
    assert watch.check() is False and woken == []
