"""A soak: 2,000 push ticks of the real reconciler and reporter with objects coming and going.

Every tick sees a new commit of a real git repository, read as the daemon reads it (its cached file
system, so the loader and the planner follow the change feed), and every seventh is followed by a
timer tick's refresh: each commit adds a task and a model and deletes the oldest ones, so about 30
objects live at any time while 4,000 pass through. Some tasks are refused by Ray for
good (HTTP 400), some fail for a while (HTTP 503, retried with back-off); jobs finish and print a
log; a foreign job that claims to be argus's appears every tick and goes away later. Ray is the
stand-in of ``fake_ray`` (a soak may use one: what is soaked is argus's own memory), and it forgets
the jobs of tasks deleted long ago, as a head restart would.

The properties: every memo the daemon keeps between ticks is bounded by what exists now (never by
what passed through), and the process's resident memory after the warm-up stays flat (within 10%).
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from reconciler.dashboard import DashboardError
from reconciler.fscache import CachedFS
from reconciler.report import Reporter
from reconciler.server.metrics import Metrics
from reconciler.source.remote import open_source
from reconciler.status.writer import StatusReport
from tests.support import Ticker, ticker
from tests.unit.fake_ray import FakeRay
from tests.unit.test_fuzz_ticks import AllowAll

TICKS = int(os.environ.get("ARGUS_SOAK_TICKS", "2000"))
LIVE_TASKS = 20
LIVE_MODELS = 10
KEPT_JOBS = 20  # Ray's stand-in forgets jobs of tasks deleted this many commits ago
TICKS_PER_COMMIT = 1


def _fast_import(root: Path, ticks: int) -> tuple[str, list[str]]:
    """A bare repository with one commit per tick (made in one `git fast-import`); its commit ids."""
    repo = str(root / "config.git")
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", repo], check=True)
    cluster = {
        "kind": "Cluster",
        "paths": {"common": str(root / "hf"), "users": str(root / "users")},
        "serving": {"accelerator": "cpu", "http_port": 8000, "cpus_per_replica": 1},
        "training": {"driver_resources": {"worker_node": 1}},
        "prune": {"max_fraction": 1.0, "min_deletions": 1000},
    }
    out: list[bytes] = []

    def data(blob: bytes) -> None:
        out.append(b"data %d\n%s\n" % (len(blob), blob))

    for i in range(1, ticks + 1):
        out.append(b"commit refs/heads/main\nmark :%d\ncommitter t <t@x> %d +0000\n" % (i, 1_700_000_000 + i))
        data(b"tick %d" % i)
        if i > 1:
            out.append(b"from :%d\n" % (i - 1))
        else:
            out.append(b"M 100644 inline cluster.yaml\n")
            data(yaml.safe_dump(cluster).encode())
        kind = "bad" if i % 7 == 0 else "flaky" if i % 5 == 0 else "ok"
        task = {"kind": "Task", "workload": "command", "command": f"echo {i}"}
        model = {"kind": "Model", "source": "$HOME/models/m", "replicas": 1}
        out.append(b"M 100644 inline users/u%d/tasks/%s-%d.yaml\n" % (i % 9, kind.encode(), i))
        data(yaml.safe_dump(task).encode())
        out.append(b"M 100644 inline users/u%d/models/m-%d.yaml\n" % (i % 9, i))
        data(yaml.safe_dump(model).encode())
        gone = i - LIVE_TASKS
        if gone >= 1:
            old = "bad" if gone % 7 == 0 else "flaky" if gone % 5 == 0 else "ok"
            out.append(b"D users/u%d/tasks/%s-%d.yaml\n" % (gone % 9, old.encode(), gone))
        if i - LIVE_MODELS >= 1:
            out.append(b"D users/u%d/models/m-%d.yaml\n" % ((i - LIVE_MODELS) % 9, i - LIVE_MODELS))
    subprocess.run(["git", "-C", repo, "fast-import", "--quiet"], input=b"".join(out), check=True)
    marks = subprocess.run(
        ["git", "-C", repo, "rev-list", "--reverse", "main"], capture_output=True, check=True, text=True
    ).stdout.split()
    return repo, marks


class SoakRay(FakeRay):
    """Refuses ``bad-*`` tasks (400), fails ``flaky-*`` ones (503); jobs finish at the next look;
    foreign jobs come and go; jobs of tasks deleted long ago are forgotten."""

    def __init__(self) -> None:
        super().__init__()
        self.tick = 0

    def _submit(self, body: dict[str, Any]) -> dict[str, Any]:
        sid = str(body.get("submission_id"))
        if "--bad-" in sid:
            raise DashboardError("POST", "/api/jobs/", 400, "Request failed with status code 400: bad runtime_env")
        if "--flaky-" in sid:
            raise DashboardError("POST", "/api/jobs/", 503, "No available agent to submit job, please try again later")
        answer = super()._submit(body)
        self.jobs[sid]["born"] = self.tick
        self.logs[sid] = "".join(f"step {n} of {sid}\n" for n in range(30))
        return answer

    def advance(self, commit: int) -> None:
        self.tick = commit
        for sid, job in list(self.jobs.items()):
            if job.get("status") == "PENDING":
                job["status"] = "SUCCEEDED"
            if self.tick - int(job.get("born", self.tick)) > KEPT_JOBS + LIVE_TASKS:
                del self.jobs[sid]
                self.logs.pop(sid, None)
        foreign = f"argus--mallory--x--{self.tick:08x}"
        self.jobs[foreign] = {"submission_id": foreign, "status": "RUNNING", "metadata": {}, "born": self.tick - 35}


class NoWriter:
    """Takes the reports (the status writer has its own tests); keeps only the last one."""

    last: StatusReport | None = None
    records = 0  # runs recorded (none: this writer records nothing)

    def write(self, report: StatusReport) -> str | None:
        self.last = report
        return None


def _rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS in /proc/self/status")


def _memo_sizes(rec: Ticker, reporter: Reporter) -> dict[str, int]:
    return {
        **rec.parts.applier.memo_sizes(),
        **rec.parts.observer.memo_sizes(),
        **rec.parts.revisions.memo_sizes(),
        "first_seen": len(rec.memory.order.first_seen),
        "seen_blob": len(rec.memory.order.seen_blob),
        "preempted": len(rec.memory.preemptions.by) + len(rec.memory.preemptions.runs),
        "log_tails": len(reporter.log_tails),
        "logged": len(reporter._logged),
        "resolved": len(reporter._resolved),
    }


@pytest.fixture
def argus_logs_dropped() -> Iterator[None]:
    """pytest keeps every captured log record in memory for the report: over 2,000 ticks the
    daemon's warnings (retries, refusals) would be the growth the soak measures. The daemon's own
    logging (a stream handler) keeps nothing, so the soak drops the records instead."""
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


@pytest.mark.usefixtures("argus_logs_dropped")
def test_two_thousand_ticks_keep_memory_flat(tmp_path: Path) -> None:
    repo, commits = _fast_import(tmp_path, TICKS // TICKS_PER_COMMIT)
    ray = SoakRay()
    source = open_source(repo, str(tmp_path / "cache"))
    rec = ticker(
        source,
        "main",
        ray,
        fs=CachedFS(AllowAll()),
        secrets_env={},
        task_check=lambda t, c: [],
        model_check=lambda m, c: [],
        ownership_key=b"soak-ownership-key-0123456789abc",
        status_docs=dict,
    )
    reporter = Reporter(ray, NoWriter(), Metrics())  # type: ignore[arg-type]
    warm = max(1, TICKS // 5)
    rss: list[int] = []
    peak: dict[str, int] = {}
    started = time.monotonic()
    for n in range(1, TICKS + 1):
        index = (n - 1) // TICKS_PER_COMMIT
        ray.advance(index + 1)
        result = rec.tick(commits[index], fetch=False)
        reporter.report(result)
        if n % 7 == 0:  # a timer tick: the loop forgets file-system answers and capacity
            rec.timer()
        sizes = _memo_sizes(rec, reporter)
        peak = {k: max(v, peak.get(k, 0)) for k, v in sizes.items()}
        if n >= warm and n % 50 == 0:
            rss.append(_rss_kb())
    elapsed = time.monotonic() - started
    live = LIVE_TASKS + LIVE_MODELS
    # Bounded by what exists now, never by the 2 x TICKS objects that passed through.
    for name in ("refused", "retrying", "backoff", "first_seen", "seen_blob", "preempted", "logged", "resolved"):
        assert peak[name] <= live + 2, (name, peak)
    assert peak["checkpoints"] <= KEPT_JOBS + 2 * LIVE_TASKS + 2, peak
    assert peak["log_tails"] <= LIVE_TASKS + 1, peak
    assert peak["foreign_logged"] <= 10 and peak["records"] <= live + 2 and peak["verdicts"] <= LIVE_MODELS, peak
    assert peak["git_created"] <= 2 * live + 1024 + 2 and peak["git_sizes"] <= 4 * live + 1024, peak
    assert peak["parse_cache"] <= 3 * (live + live // 8 + 64) + 2 * live + 1024, peak
    applied = rec.parts.applier.memo_sizes()
    assert ray.submits > 0 and applied["refused"] and applied["backoff"], "the run exercised refusals and retries"
    first, last = rss[0], max(rss)
    assert last <= first * 1.10, f"RSS grew from {first} kB to {last} kB over {TICKS} ticks ({elapsed:.0f}s): {rss}"
