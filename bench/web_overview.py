"""Benchmark: server time of the status page's overview at 10,000 objects vs an almost empty cluster.

Writes two real git status branches (``argus/status``): one with ``--users`` users x (``--models``
models + ``--tasks`` tasks) status documents in the daemon's format (a few FAILED/QUEUED ones
spread through it, ``README.md`` and ``actual.json``), and one with 10 objects. Then, for each, in
the same run, measures the page handler (the server's time for a request: reading the status
branch, filtering, sorting, rendering; no network):

- ``first request``: a fresh handler (every document read and parsed once);
- ``overview``: ``GET /`` (first page of 200), median of ``--rounds``;
- ``filtered``: ``GET /?user=<one user>`` and ``GET /?state=FAILED``, median of ``--rounds``;
- ``after a status commit``: one document changes on the branch (as the daemon commits every few
  seconds), then ``GET /``: the reader re-reads only the changed blob; median of ``--rounds`` commits.

Usage: ``.venv/bin/python bench/web_overview.py [--users 1000] [--models 5] [--tasks 5] [--rounds 20]``.
Target (issue 11): the overview stays fast at 10,000 objects (pagination, incremental reads).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reconciler.testing.status_branch import commit_files, dump, model_doc, task_doc  # noqa: E402
from reconciler.web.handler import build_handler, wsgi_like  # noqa: E402
from reconciler.web.reader import StatusReader  # noqa: E402


def make_branch(repo: str, users: int, models: int, tasks: int) -> int:
    """Write the status branch; return the number of objects."""
    subprocess.run(["git", "init", "-q", "--bare", repo], check=True)
    files: dict[str, bytes | None] = {}
    actual: dict[str, Any] = {"models": [], "jobs": [], "capacity": {"total": {"GPU": 64, "CPU": 512}}}
    n = 0
    for u in range(users):
        user = f"user{u:04d}"
        for i in range(models):
            state = "FAILED" if (u * 7 + i) % 97 == 0 else "RUNNING"
            files[f"users/{user}/models/model-{i}.yaml"] = dump(model_doc(user, f"model-{i}", state))
            actual["models"].append(
                {"user": user, "name": f"model-{i}", "replicas": 1, "resources_per_replica": {"GPU": 1, "CPU": 1}}
            )
            n += 1
        for i in range(tasks):
            state = "QUEUED" if (u * 5 + i) % 89 == 0 else "SUCCEEDED"
            extra = {"reason": "insufficient capacity: needs 2 GPU, free 0 GPU"} if state == "QUEUED" else {}
            files[f"users/{user}/tasks/task-{i}.yaml"] = dump(task_doc(user, f"task-{i}", state, **extra))
            n += 1
    files["README.md"] = b"# argus status\n\nDesired revision: `" + b"a" * 40 + b"`\n"
    # The branch-level record the daemon writes (reconciler/status/writer.py, ROOT_FILE).
    files["revision.yaml"] = dump({"revision": {"last_attempted": "a" * 40, "last_applied": "a" * 40}, "subject": "b"})
    files["actual.json"] = json.dumps(actual).encode()
    commit_files(repo, files)
    return n


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    resp = fn()
    elapsed = time.perf_counter() - start
    assert resp is not None and resp.status == 200
    return elapsed


def measure(repo: str, rounds: int) -> dict[str, float]:
    get = wsgi_like(build_handler(StatusReader(repo)))
    out: dict[str, float] = {"first request": timed(lambda: get("/"))}
    out["overview"] = statistics.median(timed(lambda: get("/")) for _ in range(rounds))
    out["filtered by user"] = statistics.median(timed(lambda: get("/?user=user0001")) for _ in range(rounds))
    out["filtered by state"] = statistics.median(timed(lambda: get("/?state=FAILED")) for _ in range(rounds))
    after = []
    for i in range(rounds):
        commit_files(
            repo, {"users/user0001/models/model-1.yaml": dump(model_doc("user0001", "model-1", reason=str(i)))}
        )
        after.append(timed(lambda: get("/")))
    out["after a status commit"] = statistics.median(after)
    out["after a status commit (max)"] = max(after)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--models", type=int, default=5)
    parser.add_argument("--tasks", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="argus-web-bench-") as tmp:
        big, small = os.path.join(tmp, "big.git"), os.path.join(tmp, "small.git")
        t0 = time.perf_counter()
        n_big = make_branch(big, args.users, args.models, args.tasks)
        print(f"wrote {n_big} status documents in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        n_small = make_branch(small, 1, args.models, args.tasks)
        results = {n_small: measure(small, args.rounds), n_big: measure(big, args.rounds)}
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"| measurement (server time, median of {args.rounds}) | {n_small} objects | {n_big:,} objects |")
    print("|---|---|---|")
    for name in results[n_big]:
        small_v, big_v = results[n_small][name], results[n_big][name]
        print(f"| {name} | {small_v * 1000:.1f} ms | {big_v * 1000:.1f} ms |")
    print(f"\npeak RSS of the bench process: {rss:.0f} MB", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
