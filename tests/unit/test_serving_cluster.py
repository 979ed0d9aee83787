"""Models on a Ray cluster of their own (cluster.yaml ``serving.ray_address``): whole ticks against two
stand-in dashboards, the capacity of both, the serving cluster's token, and cluster.yaml's field.
The same against two real Ray heads: tests/e2e/test_serving_cluster.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reconciler.builders.serve import ROUTER_APP, app_name
from reconciler.dashboard import Clusters, Dashboard, serving_token_from_env
from reconciler.errors import ArgusError
from reconciler.observe.capacity import merge_capacity
from reconciler.plan.actual import Capacity, NodeCapacity
from reconciler.source.remote import open_source
from reconciler.spec.loader import SourceFile, load
from tests.support import ConfigRepo, Ticker, cluster_yaml, ticker
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
    other = clusters.serving("http://other-serving:8265")
    assert other.base_url == "http://other-serving:8265" and other._token == "from-a-file"
    token.write_text("")
    with pytest.raises(ArgusError, match="empty"):
        serving_token_from_env()


def test_capacity_of_two_clusters_is_their_sum() -> None:
    a = Capacity({"CPU": 8.0, "GPU": 2.0}, {"CPU": 4.0, "GPU": 1.0}, (NodeCapacity("n1", {"GPU": 2.0}, {"GPU": 1.0}),))
    b = Capacity({"GPU": 4.0, "CPU": 2.0}, {"GPU": 4.0, "CPU": 2.0}, (NodeCapacity("n1", {"GPU": 4.0}, {"GPU": 4.0}),))
    both = merge_capacity(a, b)
    assert both.total == {"CPU": 10.0, "GPU": 6.0} and both.available == {"CPU": 6.0, "GPU": 5.0}
    assert [n.node_id for n in both.nodes] == ["n1", "serving:n1"], "two clusters' node ids never collide"
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
