"""The admission order cannot be reserved: a request waits from when the daemon first saw it
as it is now (an edited file starts over), and an untouched object keeps its place across
pushes and restarts."""

from __future__ import annotations

import time
import types
from pathlib import Path

import pytest

from reconciler import tick as tick_module
from reconciler.daemon import build_parts
from reconciler.source.remote import open_source
from reconciler.spec.types import ObjectKey
from reconciler.status.writer import StatusWriter
from tests.support import ConfigRepo, Ticker, cluster_yaml, ticker
from tests.unit.fake_ray import FakeRay
from tests.unit.test_fuzz_ticks import AllowAll

ALICE = ObjectKey("alice", "task", "big")
BOB = ObjectKey("bob", "task", "small")


def task(gpus: int, suspend: bool = False) -> dict[str, object]:
    return {"kind": "Task", "workload": "command", "command": "true", "gpus_per_node": gpus, "suspend": suspend}


def test_a_suspended_placeholder_does_not_keep_a_place_in_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = {"now": 1_800_000_000}
    monkeypatch.setattr(tick_module, "time", types.SimpleNamespace(time=lambda: clock["now"], monotonic=time.monotonic))
    repo = ConfigRepo(tmp_path)
    repo.write("cluster.yaml", cluster_yaml(tmp_path / "hf", tmp_path / "users", 8000))
    repo.write("users/alice/tasks/big.yaml", task(1, suspend=True))  # asks for nothing, for now
    repo.commit_push("alice: a placeholder")
    source = open_source(str(repo.bare), str(repo.bare) + "-cache")

    def reconciler() -> Ticker:
        return ticker(source, "main", FakeRay(), fs=AllowAll(), secrets_env={}, task_check=lambda t, c: [])

    r = reconciler()
    r.tick()
    assert r.first_seen[ALICE] == 1_800_000_000

    clock["now"] += 100
    repo.write("users/bob/tasks/small.yaml", task(1))
    repo.commit_push("bob asks for one GPU")
    r.tick()
    assert r.first_seen[BOB] == 1_800_000_100
    assert r.first_seen[ALICE] == 1_800_000_000  # untouched: keeps its place

    clock["now"] += 100
    repo.write("users/alice/tasks/big.yaml", task(8))  # the placeholder becomes a big request
    repo.commit_push("alice: now for real")
    result = r.tick()
    assert r.first_seen[ALICE] == 1_800_000_200 > r.first_seen[BOB]
    assert result.statuses[ALICE].first_seen == 1_800_000_200


def test_the_order_survives_a_restart_until_the_file_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from reconciler.loop import Daemon
    from reconciler.server import Metrics

    clock = {"now": 1_800_000_000}
    monkeypatch.setattr(tick_module, "time", types.SimpleNamespace(time=lambda: clock["now"], monotonic=time.monotonic))
    repo = ConfigRepo(tmp_path)
    repo.write("cluster.yaml", cluster_yaml(tmp_path / "hf", tmp_path / "users", 8000))
    repo.write("users/alice/tasks/big.yaml", task(1, suspend=True))
    repo.commit_push("alice")
    source = open_source(str(repo.bare), str(repo.bare) + "-cache")

    def daemon() -> Daemon:
        parts = build_parts(source, "main", FakeRay(), fs=AllowAll(), secrets_env={}, task_check=lambda t, c: [])
        return Daemon(parts, StatusWriter(source), metrics=Metrics())

    assert daemon().run_once() == 0.0
    clock["now"] += 500
    restarted = daemon()
    assert restarted.run_once() == 0.0
    assert restarted.memory.order.first_seen[ALICE] == 1_800_000_000  # read back from the status branch
    repo.write("users/alice/tasks/big.yaml", task(8))
    repo.commit_push("alice edits it while the daemon is down")
    clock["now"] += 500
    again = daemon()
    assert again.run_once() == 0.0
    assert again.memory.order.first_seen[ALICE] == 1_800_001_000
