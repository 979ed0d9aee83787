"""File-system answers are reused by push ticks and re-read by timer ticks (reconciler.fscache)."""

from __future__ import annotations

from pathlib import Path

from reconciler.fscache import CachedFS
from reconciler.plan.actions import ActionType
from reconciler.source.localfs import LocalFS
from reconciler.source.remote import open_source
from reconciler.spec.types import ObjectKey
from tests.support import ConfigRepo, cluster_yaml, ticker
from tests.unit.fake_ray import FakeRay


def test_answers_are_kept_until_refresh(tmp_path: Path) -> None:
    fs = CachedFS(LocalFS())
    folder = tmp_path / "m"
    assert not fs.exists(str(folder)) and fs.listdir(str(tmp_path)) == []
    folder.mkdir()
    assert not fs.exists(str(folder))  # remembered
    generation = fs.generation
    fs.refresh()
    assert fs.exists(str(folder)) and fs.listdir(str(tmp_path)) == ["m"] and fs.generation == generation + 1


def test_a_folder_created_between_pushes_is_seen_at_the_next_refresh(tmp_path: Path) -> None:
    users = tmp_path / "users"
    (users / "alice").mkdir(parents=True)
    repo = ConfigRepo(tmp_path)
    repo.write("cluster.yaml", cluster_yaml(tmp_path / "hf", users, 8000))
    repo.write("users/alice/models/chat.yaml", {"kind": "Model", "source": "$HOME/models/chat"})
    repo.commit_push("alice: chat")
    reconciler = ticker(
        open_source(str(repo.bare), str(tmp_path / "cache")),
        "main",
        FakeRay(),
        secrets_env={},
        task_check=lambda t, c: [],
    )
    key = ObjectKey("alice", "model", "chat")
    first = reconciler.tick()
    assert key in first.desired.invalid and "does not exist" in str(first.desired.invalid[key][0])
    (users / "alice" / "models" / "chat").mkdir(parents=True)
    assert key in reconciler.tick().desired.invalid  # a push tick reuses what the file system said
    reconciler.timer()  # a timer tick
    again = reconciler.tick()
    assert key not in again.desired.invalid
    assert [a.type for a in again.plan.for_key(key)] == [ActionType.DEPLOY_MODEL]


def test_capacity_is_observed_on_timer_ticks_and_reused_by_pushes(tmp_path: Path) -> None:
    repo = ConfigRepo(tmp_path)
    repo.write("cluster.yaml", cluster_yaml(tmp_path / "hf", tmp_path / "users", 8000))
    repo.commit_push("cluster")
    asked: list[str] = []

    class Counting(FakeRay):
        def request(self, method: str, path: str, body: object = None, *, timeout: float | None = None) -> object:
            asked.append(f"{method} {path}")
            return super().request(method, path, body, timeout=timeout)

    source = open_source(str(repo.bare), str(tmp_path / "cache"))
    reconciler = ticker(source, "main", Counting(gpus=4), secrets_env={}, task_check=lambda t, c: [])
    reconciler.tick()
    reconciler.tick()  # a push soon after: Serve and Jobs again, capacity reused
    assert sum(p == "GET /api/cluster_status" for p in asked) == 1
    assert sum(p == "GET /api/serve/applications/" for p in asked) == 2
    reconciler.timer()  # a timer tick observes it again
    reconciler.tick()
    assert sum(p == "GET /api/cluster_status" for p in asked) == 2
