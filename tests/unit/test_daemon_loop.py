"""The loop's promises, with real git and the dashboard stand-in (no Ray needed):
a tick that raises is the last line of defence's, two daemons never both apply, and the
status write never holds up the next push."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from reconciler import loop as loop_module
from reconciler.daemon import build_parts
from reconciler.loop import Daemon
from reconciler.observe import observer as observer_module
from reconciler.server import Metrics
from reconciler.source.remote import open_source
from reconciler.status.branch import read_documents
from reconciler.status.lease import Lease
from reconciler.status.writer import StatusReport, StatusWriter
from tests.support import ConfigRepo, cluster_yaml, git
from tests.unit.fake_ray import FakeRay
from tests.unit.test_fuzz_ticks import AllowAll

TASK = {"kind": "Task", "workload": "command", "command": "true"}


def _repo(tmp_path: Path) -> ConfigRepo:
    repo = ConfigRepo(tmp_path)
    repo.write("cluster.yaml", cluster_yaml(tmp_path / "hf", tmp_path / "users", 8000))
    repo.write("users/alice/tasks/a.yaml", TASK)
    repo.commit_push("alice: a")
    return repo


def _daemon(
    repo: ConfigRepo, ray: FakeRay, *, lease: Lease | None = None, background: bool = False, **kw: Any
) -> Daemon:
    source = open_source(str(repo.bare), str(repo.bare) + "-cache")
    parts = build_parts(source, "main", ray, fs=AllowAll(), secrets_env={}, task_check=lambda t, c: [])
    writer = StatusWriter(source)
    return Daemon(parts, writer, lease=lease, background_status=background, metrics=Metrics(), **kw)


def _readme(repo: ConfigRepo) -> str:
    return git(repo.bare, "show", "argus/status:README.md")


def test_an_unexpected_exception_is_logged_once_counted_shown_and_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    repo = _repo(tmp_path)
    ray = FakeRay()
    daemon = _daemon(repo, ray)
    assert daemon.run_once() == 0.0

    def broken(*args: object, **kwargs: object) -> object:
        raise RuntimeError("a bug nobody foresaw")

    # The observation step is not per object: an exception there is the loop's to contain.
    # (Serve is observed on every tick; capacity may be reused from a recent observation.)
    monkeypatch.setattr(observer_module, "observe_serve", broken)
    with caplog.at_level(logging.ERROR, logger="argus"):
        first, second = daemon.run_once(), daemon.run_once()
    assert 0 < first < second  # backs off, and keeps backing off
    logged = [r for r in caplog.records if "tick_exception" in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info is not None  # once, with its traceback
    health = daemon.health()
    assert health["ok"] is False and "a bug nobody foresaw" in health["tick_exception"]
    metrics = daemon.metrics.render()
    assert "argus_tick_exceptions_total 2.0" in metrics or 'argus_errors_total{kind="tick"} 2' in metrics
    assert "The daemon's last tick failed" in _readme(repo) and "a bug nobody foresaw" in _readme(repo)
    assert read_documents(str(repo.bare), "argus/status")["users/alice/tasks/a.yaml"]["state"] == "SUBMITTED"

    monkeypatch.undo()
    assert daemon.run_once() == 0.0  # recovers by itself
    assert daemon.health()["ok"] is True and "tick_exception" not in daemon.health()
    assert "The daemon's last tick failed" not in _readme(repo)


def test_run_keeps_going_after_exceptions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = _repo(tmp_path)
    daemon = _daemon(repo, FakeRay(), observe_interval=0.05)
    calls = []

    def flaky(*args: object, **kwargs: object) -> object:
        calls.append(1)
        raise ValueError("boom")

    monkeypatch.setattr(loop_module, "tick", flaky)
    thread = threading.Thread(target=daemon.run)
    thread.start()
    # Wait for the retry itself, not a fixed time: on a loaded machine the first tick starts late.
    deadline = time.monotonic() + 60
    while len(calls) < 2 and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = thread.is_alive()
    daemon.stop.set()
    daemon.wake.set()
    thread.join(10)
    assert alive and len(calls) >= 2  # retried after its back-off (1 s), never ended
    assert not thread.is_alive()


def test_two_daemons_on_one_repository_one_applies(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    repo = _repo(tmp_path)
    now = [1000.0]
    first_ray, second_ray = FakeRay(), FakeRay()
    first = _daemon(repo, first_ray, lease=Lease(open_source(str(repo.bare), ""), "one", ttl=30, clock=lambda: now[0]))
    second = _daemon(
        repo, second_ray, lease=Lease(open_source(str(repo.bare), ""), "two", ttl=30, clock=lambda: now[0])
    )
    assert first.run_once() == 0.0 and first_ray.submits == 1
    with caplog.at_level(logging.WARNING, logger="argus"):
        assert second.run_once() > 0
        assert second.run_once() > 0
    assert second_ray.submits == 0 and second_ray.puts == 0  # applies nothing
    health = second.health()
    assert health["ok"] is False and health["lease"]["other"] == "one"
    assert "another daemon (one) holds the lease" in health["last_error"]
    assert sum("lease_held_elsewhere" in r.getMessage() for r in caplog.records) == 1  # reported once
    # The holder renews; when it stops renewing (killed), the lease expires and the other takes over.
    now[0] += 29
    assert first.lease is not None and first.lease.acquire()
    now[0] += 31
    assert second.run_once() == 0.0 and second.health()["lease"]["other"] is None
    assert first.lease.acquire() is False and first.lease.other == "two"
    # A clean shutdown releases it at once.
    second.close()
    assert first.lease.acquire() is True


def test_lease_is_compare_and_swap(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    a = Lease(open_source(str(repo.bare), ""), "a", ttl=30)
    b = Lease(open_source(str(repo.bare), ""), "b", ttl=30)
    stale = git(repo.bare, "rev-parse", "--verify", "--quiet", "refs/argus/lease", check=False).strip() or None
    assert a.acquire()
    # b read the ref before a wrote it: its swap from the old value must fail.
    assert not b._swap(b._commit({"holder": "b", "expires": time.time() + 30}), stale)
    assert json.loads(git(repo.bare, "log", "-1", "--format=%B", "refs/argus/lease"))["holder"] == "a"


def test_a_push_is_applied_while_the_status_write_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = _repo(tmp_path)
    ray = FakeRay()
    daemon = _daemon(repo, ray, background=True)
    assert daemon.run_once() == 0.0 and daemon.reporter.flush(30)
    release = threading.Event()
    writes: list[StatusReport] = []
    real_write = daemon.writer.write

    def slow_write(report: StatusReport) -> str | None:
        writes.append(report)
        release.wait(30)
        return real_write(report)

    monkeypatch.setattr(daemon.writer, "write", slow_write)
    for i in range(3):  # three pushes while the first status write is stuck
        repo.write(f"users/bob/tasks/t{i}.yaml", TASK)
        repo.commit_push(f"bob: t{i}")
        started = time.monotonic()
        assert daemon.run_once() == 0.0
        assert time.monotonic() - started < 5  # the tick did not wait for the write
        assert ray.submits == 2 + i
    release.set()
    assert daemon.reporter.flush(30)
    # Coalesced: the stuck write, then only the newest of the two that waited behind it.
    assert len(writes) == 2
    docs = read_documents(str(repo.bare), "argus/status")
    assert {f"users/bob/tasks/t{i}.yaml" for i in range(3)} <= set(docs)
    root = yaml.safe_load(git(repo.bare, "show", "argus/status:revision.yaml"))
    assert root["revision"]["last_attempted"] == git(repo.bare, "rev-parse", "main").strip()
    daemon.close()


class _Cycle:
    me: Any = None


def test_ticks_freeze_what_the_daemon_keeps_and_collect_everything_now_and_then(tmp_path: Path) -> None:
    """The cyclic GC scans only what the last tick made (a full collection took 1–2 s of every push
    tick at 100,000 objects); a tick's own cyclic garbage is collected before the freeze, and cyclic
    garbage among frozen objects waits for the full collection made every FULL_GC_S or when the
    frozen heap grew by half, no longer (after a push, until the next timer tick, within a bound)."""
    import gc
    import weakref

    daemon = _daemon(_repo(tmp_path), FakeRay())
    assert daemon.run_once() == 0.0
    assert gc.get_freeze_count() > 0

    def cycle() -> weakref.ref[_Cycle]:
        made = _Cycle()
        made.me = made
        return weakref.ref(made)

    young = cycle()  # garbage a tick made (an exception and its traceback's frames, say)
    was_enabled = gc.isenabled()
    gc.disable()  # only the tick's own collection may free it
    try:
        assert daemon.run_once() == 0.0
    finally:
        if was_enabled:
            gc.enable()
    assert young() is None
    old = cycle()
    gc.freeze()  # garbage among what earlier ticks froze
    assert daemon.run_once() == 0.0  # no full collection due
    assert old() is not None
    daemon._full_gc_at = 0.0  # FULL_GC_S later
    assert daemon.run_once() == 0.0
    assert old() is None
    counted = daemon._frozen
    kept = [[] for _ in range(1000)]  # what a tick keeps is counted, without walking the frozen heap
    assert daemon.run_once() == 0.0
    assert daemon._frozen >= counted + len(kept)
    grown = cycle()
    gc.freeze()
    daemon._frozen = 2 * daemon._frozen_after_full  # the ticks froze as much again since
    assert daemon.run_once() == 0.0
    assert grown() is None
    # After a push tick a due full collection waits for the next timer tick (no push waiting)...
    waiting = cycle()
    gc.freeze()
    daemon._full_gc_at = time.monotonic()  # due now, not overdue
    assert daemon.run_once(pushed=True) == 0.0
    assert waiting() is not None
    assert daemon.run_once() == 0.0
    assert waiting() is None
    # ...within a bound: a heap grown FROZEN_HARD times is collected even after a push.
    bound = cycle()
    gc.freeze()
    daemon._frozen = int(loop_module.FROZEN_HARD * daemon._frozen_after_full) + 1
    assert daemon.run_once(pushed=True) == 0.0
    assert bound() is None
    before = gc.get_threshold()
    try:  # what Daemon.run sets for the process: young collections every GC_YOUNG allocations
        loop_module.tune_gc()
        assert gc.get_threshold()[0] == loop_module.GC_YOUNG
    finally:
        gc.set_threshold(*before)


def test_the_first_tick_collects_everything_even_when_woken_as_a_push(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop's first tick is woken like a push; its full collection is the baseline the growth
    bounds are measured from, so it is made then, however long the host has been up."""
    import gc
    import weakref

    daemon = _daemon(_repo(tmp_path), FakeRay())
    made = _Cycle()
    made.me = made
    frozen = weakref.ref(made)
    del made
    gc.freeze()  # cyclic garbage only a full collection frees
    monkeypatch.setattr(loop_module.time, "monotonic", lambda: 5.0)  # a host up for five seconds
    assert daemon.run_once(pushed=True) == 0.0
    assert frozen() is None
    assert daemon._full_gc_at == 5.0 + loop_module.FULL_GC_S
    # The baseline is what was frozen then (frozen objects freed since lower the live count).
    assert daemon._frozen_after_full >= loop_module.FROZEN_FLOOR


def test_a_slow_tick_logs_where_its_time_went(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    daemon = _daemon(_repo(tmp_path), FakeRay())
    caplog.set_level(logging.INFO, logger="argus")
    # Below the threshold nothing is logged (a threshold no tick reaches: a loaded CI machine made a
    # small repository's tick take 1.4 s, past the real one).
    monkeypatch.setattr(loop_module, "SLOW_S", 3600.0)
    assert daemon.run_once() == 0.0
    assert not [r for r in caplog.records if "slow tick" in r.getMessage()]
    monkeypatch.setattr(loop_module, "SLOW_S", 0.0)
    assert daemon.run_once(pushed=True) == 0.0
    slow = [json.loads(r.getMessage()) for r in caplog.records if "slow tick" in r.getMessage()]
    assert len(slow) == 1
    assert slow[0]["pushed"] is True
    assert list(slow[0]["phases"]) == ["fetch", "read", "observe", "tick", "collect", "report"]
    assert slow[0]["seconds"] == pytest.approx(sum(slow[0]["phases"].values()), abs=0.01)


def test_a_timer_ticks_file_system_recheck_gives_way_to_a_push_within_a_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon = _daemon(_repo(tmp_path), FakeRay())
    revisions = daemon.parts.revisions
    real = revisions.refresh_fs
    calls: list[bool | None] = []

    def spy(interrupted: Any = None) -> bool:
        calls.append(None if interrupted is None else interrupted())
        return real(interrupted) if interrupted is None else not interrupted()

    monkeypatch.setattr(revisions, "refresh_fs", spy)
    daemon.wake.set()  # a push is waiting
    at = daemon._refreshed_at
    daemon.refresh_fs()
    assert calls == [True] and daemon._refreshed_at == at  # stopped: made again next timer tick
    daemon.wake.clear()
    daemon.refresh_fs()
    assert calls[-1] is False and daemon._refreshed_at > at
    # None finished for REFRESH_STALE intervals: a push waits for it.
    daemon._refreshed_at -= loop_module.REFRESH_STALE * daemon.observe_interval + 1
    daemon.wake.set()
    daemon.refresh_fs()
    assert calls[-1] is None


def test_the_daemon_records_a_tasks_gpu_seconds_on_the_status_branch(tmp_path: Path) -> None:
    """The wiring of usage accounting (reconciler/loop.py): a finished GPU run's record becomes a
    usage document of its day on the status branch, written once; a restarted daemon adds nothing."""
    repo = ConfigRepo(tmp_path)
    repo.write("cluster.yaml", cluster_yaml(tmp_path / "hf", tmp_path / "users", 8000))
    repo.write("users/alice/tasks/g.yaml", {**TASK, "gpus_per_node": 1})
    repo.commit_push("alice: g")
    ray = FakeRay(gpus=8)
    daemon = _daemon(repo, ray)
    daemon.usage.interval = 0.0  # read every report, not once a minute
    # argus records the run (by its own clock) 100 s before now: Ray's record is believed within
    # that run's life as argus saw it, from its submission to when argus first saw it ended.
    daemon.writer.now = lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 100))
    daemon.run_once()
    (sid,) = ray.jobs
    start = int(time.time()) - 100
    ray.jobs[sid].update(status="SUCCEEDED", start_time=start * 1000, end_time=(start + 90) * 1000)
    daemon.run_once()
    path = f"usage/{time.strftime('%Y-%m-%d', time.gmtime(start))}.json"
    doc = json.loads(git(repo.bare, "show", f"argus/status:{path}"))
    assert [(r["object"], r["gpu_seconds"]) for r in doc["gpu"]] == [("alice/tasks/g", 90.0)]
    again = _daemon(repo, ray)
    again.usage.interval = 0.0
    again.run_once()
    assert json.loads(git(repo.bare, "show", f"argus/status:{path}")) == doc
    assert len(git(repo.bare, "log", "--format=%H", "argus/status", "--", path).split()) == 1  # written once
