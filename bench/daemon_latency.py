"""Daemon latencies and memory, measured on this machine with a real Ray head and git.

1. push -> action applied: ``git push`` of a new task file to the bare repository the
   daemon watches (watchfiles) until the Ray Jobs API lists the submitted job.
2. Ray state change -> status commit: a job's end time (Ray's clock) until the status
   branch shows SUCCEEDED (the daemon observes every 5 s by default).
3. daemon RSS with 10,000 objects (1,000 users x 5 models + 5 tasks, all suspended so
   nothing is deployed): peak RSS of the daemon process after its first status commit.

Usage: .venv/bin/python bench/daemon_latency.py [--pushes 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reconciler.dashboard import Dashboard  # noqa: E402
from reconciler.status.branch import read_documents  # noqa: E402
from reconciler.testing.ray_head import free_port, start_head  # noqa: E402
from tests.support import ConfigRepo, cluster_yaml, git  # noqa: E402


def daemon(repo: ConfigRepo, dash_url: str, log: Path, interval: float = 5.0) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "reconciler.cli",
            "run",
            "--repo",
            str(repo.bare),
            "--ray",
            dash_url,
            "--listen",
            f"127.0.0.1:{free_port()}",
            "--observe-interval",
            str(interval),
        ],
        stdout=open(log, "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def rss_peak_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def latency(root: Path, dash_url: str, pushes: int) -> tuple[list[float], list[float]]:
    (root / "lat").mkdir()
    repo = ConfigRepo(root / "lat")
    users = root / "lat-users"
    (users / "bench").mkdir(parents=True)
    repo.write("cluster.yaml", cluster_yaml(root / "hf", users, free_port()))
    repo.commit_push("cluster")
    proc = daemon(repo, dash_url, root / "lat-daemon.log")
    dash = Dashboard(dash_url)
    applied: list[float] = []
    reported: list[float] = []
    try:
        time.sleep(3)
        for i in range(pushes):
            name = f"t{i:03d}"
            repo.write(
                f"users/bench/tasks/{name}.yaml",
                {"kind": "Task", "workload": "command", "command": "true", "gpus_per_node": 1},
            )
            repo.commit(f"task {name}")
            start = time.time()
            git(repo.work, "push", "-q", "origin", "HEAD:main")
            job = None
            while job is None and time.time() - start < 30:
                jobs = [j for j in dash.get("/api/jobs/") if f"-{name}-" in str(j.get("submission_id"))]
                job = jobs[0] if jobs else None
                if job is None:
                    time.sleep(0.01)
            applied.append(time.time() - start)
            path = f"users/bench/tasks/{name}.yaml"
            while time.time() - start < 120:
                doc = read_documents(str(repo.bare), "argus/status").get(path) or {}
                if doc.get("state") == "SUCCEEDED":
                    break
                time.sleep(0.05)
            seen = time.time()
            info = dash.get(f"/api/jobs/{job['submission_id']}") if job else {}
            if info.get("end_time"):
                reported.append(seen - info["end_time"] / 1000)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return applied, reported


def memory(root: Path, dash_url: str) -> tuple[float, float]:
    (root / "mem").mkdir()
    repo = ConfigRepo(root / "mem")
    users = root / "mem-users"
    users.mkdir()
    repo.write("cluster.yaml", cluster_yaml(root / "hf", users, free_port()))
    for u in range(1000):
        user = f"user{u:04d}"
        for i in range(5):
            (users / user / "models" / f"m{i}").mkdir(parents=True)
            repo.write(
                f"users/{user}/models/m{i}.yaml", {"kind": "Model", "source": f"$HOME/models/m{i}", "suspend": True}
            )
            repo.write(
                f"users/{user}/tasks/t{i}.yaml",
                {"kind": "Task", "workload": "command", "command": "true", "suspend": True},
            )
    repo.commit_push("10,000 objects")
    start = time.time()
    proc = daemon(repo, dash_url, root / "mem-daemon.log")
    try:
        while time.time() - start < 600:
            if git(repo.bare, "rev-parse", "--verify", "--quiet", "argus/status", check=False).strip():
                break
            time.sleep(0.2)
        first = time.time() - start
        time.sleep(6)  # one more observe tick
        return rss_peak_mb(proc.pid), first
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pushes", type=int, default=20)
    args = parser.parse_args()
    head = start_head(num_cpus=8, num_gpus=2, resources={"worker_node": 4}, env={"PYTHONPATH": str(ROOT)})
    try:
        with tempfile.TemporaryDirectory(prefix="argus-bench-") as tmp:
            root = Path(tmp)
            (root / "hf").mkdir()
            applied, reported = latency(root, head.dashboard_url, args.pushes)
            rss, first = memory(root, head.dashboard_url)
    finally:
        head.stop()
    print(f"| measurement (n={len(applied)}) | p50 | p95 | max |")
    print("|---|---|---|---|")
    p50, p95 = statistics.median(applied), pct(applied, 0.95)
    print(f"| push -> job submitted (s) | {p50:.2f} | {p95:.2f} | {max(applied):.2f} |")
    if reported:
        print(
            f"| job ended -> status commit (s) | {statistics.median(reported):.2f} | {pct(reported, 0.95):.2f} | "
            f"{max(reported):.2f} |"
        )
    print(f"\n10,000 objects: daemon peak RSS {rss:.0f} MB; first status commit {first:.1f} s after start")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    sys.exit(main())
