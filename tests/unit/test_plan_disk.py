"""Per-user disk quotas (issue 31 item 6): a user over hers gets no new run, nothing running changes, and the
status says why. The planner part is pure (the real planner and assessment); the last test runs the real
daemon tick on real folders, with the dashboard stand-in for Ray."""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path
from typing import Any

import pytest

from reconciler.daemon import build_parts
from reconciler.loop import Daemon
from reconciler.observe import observer as observer_module
from reconciler.observe.disk import DiskMeter
from reconciler.plan.actions import ActionType
from reconciler.plan.actual import ActualJob, ActualState
from reconciler.plan.assess import assess
from reconciler.plan.disk import GIB, DiskUsage, explain, held_tasks, hold, measured_users, over_quota
from reconciler.plan.planner import plan
from reconciler.server import Metrics
from reconciler.source.remote import open_source
from reconciler.spec.hashing import submission_id, task_spec_hash
from reconciler.spec.loader import SourceFile, load
from reconciler.spec.types import ClusterSpec, DesiredState, Paths, Storage, TaskSpec
from reconciler.status.branch import read_documents
from reconciler.status.writer import StatusWriter
from tests.support import ConfigRepo, cluster_yaml, task_spec
from tests.unit.fake_ray import FakeRay
from tests.unit.test_fuzz_ticks import AllowAll

CLUSTER = ClusterSpec(
    paths=Paths(common="/shared/hf", users="/shared/users"),
    storage=Storage(user_quota_gb=100, users={"root": None, "carl": 500}),
)


def test_who_is_over() -> None:
    usage = {
        "alice": DiskUsage(int(100.5 * GIB)),  # over 100
        "bob": DiskUsage(100 * GIB),  # exactly at it: fine
        "carl": DiskUsage(400 * GIB),  # his own 500
        "root": DiskUsage(10_000 * GIB),  # no limit
        "dave": DiskUsage(GIB, problem="cannot read 'x': Permission denied"),
    }
    over = over_quota(CLUSTER, usage)
    assert set(over) == {"alice", "dave"}
    assert over["alice"] == (
        "disk quota: /shared/users/alice holds 100.5 GB, over alice's quota of 100 GB (cluster.yaml storage); "
        "no new run starts until it is under: delete files over sftp or rsync (old run folders under jobs/ too); "
        "what runs keeps running"
    )
    assert "could not be measured whole (cannot read 'x': Permission denied; 1.0 GB counted)" in over["dave"]
    assert over_quota(ClusterSpec(), usage) == {}  # no quota set: nobody


def _task(user: str, name: str, **kw: Any) -> TaskSpec:
    return task_spec(user, name, command="python3 train.py", gpus_per_node=0, **kw)


def _desired(*tasks: TaskSpec) -> DesiredState:
    return DesiredState(cluster=CLUSTER, tasks={t.key: t for t in tasks})


def _job(task: TaskSpec, status: str, spec_hash: str | None = None) -> ActualJob:
    return ActualJob(submission_id(task), task.key, spec_hash or task_spec_hash(task), status)


def test_measured_users_are_those_with_tasks_and_a_quota() -> None:
    desired = _desired(_task("alice", "a"), _task("root", "r"), _task("carl", "c"))
    assert measured_users(desired) == {"alice", "carl"}
    assert measured_users(DesiredState(cluster=ClusterSpec(), tasks=desired.tasks)) == frozenset()


def test_an_over_quota_user_gets_no_new_run_and_nothing_running_changes() -> None:
    new = _task("alice", "new")
    done = _task("alice", "done")
    running = _task("alice", "running")
    old = _task("alice", "changed", run=1)
    changed = _task("alice", "changed", run=2)  # a new spec: argus would stop the old run and submit this one
    preempted = _task("alice", "preempted")
    bobs = _task("bob", "new")
    desired = _desired(new, done, running, changed, preempted, bobs)
    actual = ActualState(
        jobs=[
            _job(done, "SUCCEEDED"),
            _job(running, "RUNNING"),
            _job(old, "RUNNING"),
            _job(preempted, "PREEMPTED"),
        ]
    )
    usage = {"alice": DiskUsage(200 * GIB), "bob": DiskUsage(GIB)}
    held = held_tasks(desired, actual, over_quota(CLUSTER, usage))
    assert set(held) == {new.key, changed.key, preempted.key}  # what would be submitted, nothing else

    before = plan(desired, actual)
    assert {a.key for a in before.actions if a.type is ActionType.SUBMIT_TASK} == {*held, bobs.key}
    held_desired = hold(desired, held)
    after = plan(held_desired, actual)
    kinds = {(a.key, a.type) for a in after.actions}
    assert (bobs.key, ActionType.SUBMIT_TASK) in kinds  # bob is under his quota
    assert not any(t is ActionType.SUBMIT_TASK for k, t in kinds if k.user == "alice")
    assert not any(t is ActionType.STOP_TASK for _, t in kinds)  # alice's old run keeps running
    assert desired.tasks[new.key].suspend is False  # the loaded state is not changed

    statuses = explain(assess(held_desired, actual, after), held)
    why = held[new.key]
    assert (statuses[new.key].state, statuses[new.key].sync, statuses[new.key].reason) == ("QUEUED", "OutOfSync", why)
    assert statuses[preempted.key].state == "PREEMPTED" and statuses[preempted.key].reason == why
    assert statuses[changed.key].reason == why
    assert statuses[running.key].state == "RUNNING" and statuses[running.key].sync == "Synced"
    assert statuses[done.key].state == "SUCCEEDED"


def test_nobody_over_plans_exactly_as_before() -> None:
    desired = _desired(_task("alice", "new"))
    assert held_tasks(desired, ActualState(), over_quota(CLUSTER, {"alice": DiskUsage(GIB)})) == {}
    assert held_tasks(desired, ActualState(), {}) == {}


# -- the daemon's tick, on real folders --------------------------------------------------------------


def _daemon(repo: ConfigRepo, ray: FakeRay) -> Daemon:
    source = open_source(str(repo.bare), str(repo.bare) + "-cache")
    parts = build_parts(source, "main", ray, fs=AllowAll(), secrets_env={}, task_check=lambda t, c: [])
    return Daemon(parts, StatusWriter(source), metrics=Metrics())


def _status(repo: ConfigRepo, user: str) -> dict[str, Any]:
    return read_documents(str(repo.bare), "argus/status")[f"users/{user}/tasks/train.yaml"]


def _submitted(ray: FakeRay) -> set[str]:
    return {str(j["metadata"]["argus-user"]) for j in ray.jobs.values()}


def test_the_daemon_holds_an_over_quota_users_new_runs_until_she_deletes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(observer_module, "DiskMeter", functools.partial(DiskMeter, pause_s=0.0, rest_s=0.2))
    users = tmp_path / "users"
    for user in ("alice", "bob"):
        (users / user / "data").mkdir(parents=True)
    upload = users / "alice" / "data" / "big.bin"
    upload.write_bytes(os.urandom(3 << 20))  # 3 MiB against a 1 MiB quota
    repo = ConfigRepo(tmp_path)
    repo.write("cluster.yaml", cluster_yaml(tmp_path / "hf", users, 8000, storage={"user_quota_gb": 1 / 1024}))
    for user in ("alice", "bob"):
        repo.write(f"users/{user}/tasks/train.yaml", {"kind": "Task", "workload": "command", "command": "true"})
    repo.commit_push("two tasks")
    ray = FakeRay()
    daemon = _daemon(repo, ray)
    paths = Paths(common=str(tmp_path / "hf"), users=str(users))
    try:
        # A daemon just started has measured nothing and holds nothing back: let its meter measure first.
        deadline = time.monotonic() + 30
        while len(daemon.parts.observer.observe({}, paths, None, disk_users={"alice", "bob"}).disk) < 2:
            assert time.monotonic() < deadline, "the folders were not measured"
            time.sleep(0.05)
        daemon.run_once()
        assert _submitted(ray) == {"bob"}
        status = _status(repo, "alice")
        assert status["state"] == "QUEUED" and status["sync"] == "OutOfSync"
        assert f"disk quota: {users / 'alice'} holds 0.0 GB, over alice's quota of 0.000976562 GB" in status["reason"]
        upload.unlink()  # she deletes it over sftp
        deadline = time.monotonic() + 30
        while "alice" not in _submitted(ray):
            assert time.monotonic() < deadline, "alice's task was not submitted after she deleted her file"
            time.sleep(0.1)
            daemon.run_once()
    finally:
        daemon.close()


def test_cluster_yaml_storage() -> None:
    text = b"kind: Cluster\nstorage:\n  user_quota_gb: 200\n  users: {alice: 1000.5, root: null}\n"
    state = load([SourceFile("cluster.yaml", text, "a")])
    assert state.cluster_valid and state.cluster.storage == Storage(200, {"alice": 1000.5, "root": None})
    assert [state.cluster.storage.quota_gb(u) for u in ("alice", "root", "bob")] == [1000.5, None, 200]
    bad = load([SourceFile("cluster.yaml", b"kind: Cluster\nstorage:\n  user_quota_gb: -1\n  user: {}\n", "b")])
    assert not bad.cluster_valid
    assert {(i.line, i.message.split(":")[0]) for i in bad.issues} >= {(3, "storage.user_quota_gb")}
    assert any(i.line == 4 and "user" in i.message for i in bad.issues), bad.issues
    assert load([SourceFile("cluster.yaml", b"kind: Cluster\n", "c")]).cluster.storage == Storage()
