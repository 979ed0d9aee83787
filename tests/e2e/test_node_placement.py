"""Issue 30, item 3, end to end: admission places a task's GPUs on single Ray nodes.

A private Ray cluster: a head with no GPUs and two worker raylets with 2 logical GPUs and the
``worker_node`` driver slot each (4 GPUs in sum, 2 per node), driven by the real daemon with real
git and real Ray Jobs. A ``command`` task's driver takes its ``gpus_per_node`` GPUs on one node:

- ``gpus_per_node: 4`` fits the summed GPUs but no node: UNSCHEDULABLE, naming the node sizes,
  never submitted, and it blocks nobody;
- two 2-GPU tasks are admitted and Ray runs them one per node;
- a third 2-GPU task waits (QUEUED) while both nodes are busy and starts on the node the first
  one leaves when it finishes.

Each task waits for a file of its own to exist, so the test decides when it finishes.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.apply.jobs import stop_job
from reconciler.dashboard import Dashboard
from reconciler.status.branch import read_documents
from reconciler.testing.ray_head import RayHead, RayWorker, start_head, start_worker
from tests.conftest import REPO_ROOT
from tests.e2e.test_daemon import DaemonProc
from tests.support import ConfigRepo, cluster_yaml, wait_for

pytestmark = pytest.mark.e2e


def doc(repo: ConfigRepo, name: str) -> dict[str, Any]:
    return read_documents(str(repo.bare), "argus/status").get(f"users/alice/tasks/{name}.yaml") or {}


def task(release: Path, gpus: int) -> dict[str, Any]:
    """A command task that runs until ``release`` exists."""
    wait = f"while [ ! -e {release} ]; do sleep 0.5; done"
    return {"kind": "Task", "workload": "command", "command": f"sh -c '{wait}'", "gpus_per_node": gpus}


class Cluster:
    """The private head, its two GPU workers and the daemon watching a config repository."""

    def __init__(self, root: Path) -> None:
        pythonpath = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
        self.workers: list[RayWorker] = []
        self.head: RayHead = start_head(num_cpus=2, num_gpus=0, env={"PYTHONPATH": pythonpath})
        self.daemon: DaemonProc | None = None
        try:
            for _ in range(2):
                self.workers.append(start_worker(self.head, num_cpus=2, num_gpus=2, resources={"worker_node": 1}))
            self.repo = ConfigRepo(root)
            self.daemon = DaemonProc(self.repo, self.head, root)
        except BaseException:
            self.stop()
            raise
        self.dash = Dashboard(self.head.dashboard_url)

    def jobs(self) -> dict[str, dict[str, Any]]:
        """Ray's jobs of alice's tasks, by task name."""
        out = {}
        for job in self.dash.get("/api/jobs/"):
            meta = job.get("metadata") or {}
            if meta.get("argus-user") == "alice":
                out[str(meta.get("argus-task"))] = job
        return out

    def stop(self) -> None:
        """Stop the daemon, then exactly the raylets and the head this test started."""
        if self.daemon is not None:
            self.daemon.stop()
        for worker in self.workers:
            worker.stop()
        self.head.stop()
        shutil.rmtree(self.head.temp_dir, ignore_errors=True)


@pytest.fixture()
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    if not os.environ.get("CI"):  # in CI Ray is installed: a missing one fails below, never skips
        pytest.importorskip("ray")
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        try:
            for job in c.jobs().values():
                if job.get("status") in ("PENDING", "RUNNING"):
                    stop_job(c.dash, str(job["submission_id"]))
        finally:
            c.stop()


def test_a_tasks_gpus_go_on_one_node(cluster: Cluster, hf_cache: Path, tmp_path: Path) -> None:
    repo, users, gate = cluster.repo, tmp_path / "users", tmp_path / "gate"
    (users / "alice").mkdir(parents=True)
    gate.mkdir()
    repo.write("cluster.yaml", cluster_yaml(hf_cache, users, cluster.head.serve_port))
    repo.write("users/alice/tasks/big.yaml", task(gate / "big", 4))
    repo.write("users/alice/tasks/a.yaml", task(gate / "a", 2))
    repo.write("users/alice/tasks/b.yaml", task(gate / "b", 2))
    repo.commit_push("one task larger than any node, two that fill one node each")
    assert cluster.daemon is not None
    cluster.daemon.start()

    big = wait_for(lambda: (d := doc(repo, "big")).get("state") == "UNSCHEDULABLE" and d, "big UNSCHEDULABLE", 120)
    assert "needs 1 node x 4 GPUs but the largest node has 2 GPUs (nodes: 2, 2 GPUs)" in big["reason"], big
    for name in ("a", "b"):
        wait_for(lambda n=name: doc(repo, n).get("state") == "RUNNING", f"task {name} RUNNING", 120)  # type: ignore[misc]
    jobs = cluster.jobs()
    assert "big" not in jobs, jobs  # never submitted: it would wait in Ray forever
    nodes = {name: jobs[name].get("driver_node_id") for name in ("a", "b")}
    assert all(nodes.values()) and nodes["a"] != nodes["b"], nodes  # one per node

    repo.write("users/alice/tasks/c.yaml", task(gate / "c", 2))
    repo.commit_push("a third 2-GPU task while both nodes are busy")
    queued = wait_for(lambda: (d := doc(repo, "c")).get("state") == "QUEUED" and d, "task c QUEUED", 60)
    assert "insufficient capacity" in queued["reason"], queued
    assert "c" not in cluster.jobs()
    assert doc(repo, "big")["state"] == "UNSCHEDULABLE"  # and it blocked nobody: a and b ran

    (gate / "a").touch()  # a finishes: its node is free again
    wait_for(lambda: doc(repo, "a").get("state") == "SUCCEEDED", "task a SUCCEEDED", 60)
    wait_for(lambda: doc(repo, "c").get("state") == "RUNNING", "task c RUNNING once a node is free", 120)
    assert cluster.jobs()["c"].get("driver_node_id") == nodes["a"]  # the node a left
    for name in ("b", "c"):
        (gate / name).touch()
    for name in ("b", "c"):
        wait_for(lambda n=name: doc(repo, n).get("state") == "SUCCEEDED", f"task {name} SUCCEEDED", 60)  # type: ignore[misc]
    assert doc(repo, "big")["state"] == "UNSCHEDULABLE"
