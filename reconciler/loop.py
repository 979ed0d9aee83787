"""The loop that runs ticks: triggers (watchfiles, webhooks, timers), the lease, back-off. I/O.

The loop never ends for anything a tick meets: source and Ray outages back off, another
daemon holding the repository's lease is reported and waited out, and any other exception
(a bug, an input nobody foresaw) is the last line of defence's: logged once with its
traceback, counted, shown in /healthz and the status README, retried with back-off.
"""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from reconciler.backoff import Backoff
from reconciler.errors import RayUnavailable, SourceUnavailable, TemporaryError
from reconciler.observe.serve_watch import ServeWatch
from reconciler.observe.usage import PULL_INTERVAL_S, UsageRecorder
from reconciler.plan.memory import Memory
from reconciler.redact import Redactor
from reconciler.report import Reporter
from reconciler.server import Metrics
from reconciler.status.auth import status_key
from reconciler.status.lease import Lease
from reconciler.status.writer import StatusWriter, default_redaction
from reconciler.tick import Parts, tick

log = logging.getLogger("argus")
MAX_BACKOFF_S = 60.0
LEASE_POLL_S = 5.0
FULL_GC_S = 600.0  # a full collection of everything the daemon holds, at most this often
GC_YOUNG = 100_000  # allocations between two young collections in the daemon (Python's default: 700)
FROZEN_GROWTH = 1.5  # a full collection as soon as the frozen heap is this many times the last one's
FROZEN_FLOOR = 100_000  # objects: below this a small daemon's frozen heap never triggers one
# A push tick leaves a due full collection to the next timer tick (the daemon idle), unless the
# frozen heap grew this many times the last full collection's, or it is overdue by FULL_GC_S.
FROZEN_HARD = 3.0
# A tick (or a timer tick's file-system re-check) slower than this is logged with where its time went.
SLOW_S = 1.0
# A timer tick's file-system re-check gives way to a push, unless none finished for this many
# observe intervals.
REFRESH_STALE = 6
_TICK = "tick"  # the loop's back-off key


def tune_gc() -> None:
    """Set the daemon process's collector: a young collection every :data:`GC_YOUNG` allocations.
    A push tick at 100,000 objects allocates about a million objects; with Python's default it
    ran ~650 young and ~4 full collections of what the tick made (0.4–0.5 s of CPU), with this
    3 young ones (0.2 s). Full collections come from :meth:`Daemon.collect`."""
    gc.set_threshold(GC_YOUNG, 50, 100)


def _log_if_slow(event: str, phases: dict[str, float], pushed: bool) -> None:
    """Log where a slow tick's time went (seconds per phase), so an operator can tell a slow Ray
    from a slow repository or a collection without a profiler."""
    seconds = sum(phases.values())
    if seconds >= SLOW_S:
        spent = {name: round(value, 3) for name, value in phases.items()}
        log.info(json.dumps({"event": event, "seconds": round(seconds, 3), "pushed": pushed, "phases": spent}))


class Daemon:
    """Runs ticks when triggered (a push seen by watchfiles or a webhook, the fetch interval
    for remotes) and every ``observe_interval`` seconds to keep status fresh and fix drift.
    Writes status once per tick, and only when something changed."""

    def __init__(
        self,
        parts: Parts,
        writer: StatusWriter,
        *,
        observe_interval: float = 5.0,
        fetch_interval: float = 15.0,
        serve_watch: float = 0.0,
        usage_interval: float = PULL_INTERVAL_S,
        metrics: Metrics | None = None,
        lease: Lease | None = None,
        redact: Callable[[str], str] | None = None,
        background_status: bool = False,
    ) -> None:
        self.writer = writer
        self.observe_interval = observe_interval
        self.serve_watch = serve_watch  # seconds between Serve reads between ticks (0: none; run() only)
        self.fetch_interval = fetch_interval
        self.metrics = metrics or Metrics()
        self.lease = lease
        # What the daemon passes to jobs as secrets never reaches git or the logs.
        self.redact = redact or Redactor(parts.secrets_env.values())
        if writer.redact is default_redaction:
            writer.redact = self.redact
        # Usage accounting (docs/design/usage.md): the endpoint's meter is read in this process, and
        # the ledger continues from the usage documents of the status branch.
        self.usage = UsageRecorder(
            parts.endpoint.usage if parts.endpoint is not None else None,
            writer.usage_documents,
            interval=usage_interval,
        )
        self.usage.on_error = self.metrics.error
        self.metrics.usage = lambda: self.usage.totals
        self.reporter = Reporter(
            parts.dash,
            writer,
            self.metrics,
            redact=self.redact,
            secret_names=tuple(sorted(parts.secrets_env)),
            usage=self.usage,
        )
        if background_status:
            self.reporter.start()
        # The status branch is the durable record of runs: read them from it, and record a
        # run there before submitting it (reconciler/tick.py, "Exactly once").
        self.parts = replace(parts, status_docs=writer.documents, record_runs=writer.record_runs)
        self.memory = Memory()  # what each tick hands the next
        # Only records argus authenticated are read back: its status commits, notes and lease
        # (reconciler/status/auth.py), anchored in the state folder (reconciler/status/trust.py).
        key = status_key(parts.ownership_key)
        if writer.auth_key is None:
            writer.auth_key = key
        if writer.anchor_file is None and parts.state_dir:
            digest = hashlib.sha256(f"{parts.source.url}\0{writer.branch}".encode()).hexdigest()[:16]
            writer.anchor_file = os.path.join(parts.state_dir, f"status-{digest}.json")
        if lease is not None and lease.key is None:
            lease.key = key
        self.wake = threading.Event()
        self.stop = threading.Event()
        self.last_tick_ok = 0.0
        self.last_error: str | None = None
        self._error_kind: str | None = None  # what last_error is about: source, ray, lease, tick
        self.tick_exception: str | None = None  # the last tick's unexpected exception, until one succeeds
        self._last_fetch = 0.0
        # When the next full collection is due (:meth:`collect`); -inf: none made yet, so the first
        # tick makes one whatever woke it (the baseline the growth bounds are measured from).
        self._full_gc_at = -math.inf
        self._refreshed_at = time.monotonic()  # the first load asked the file system
        self._frozen_after_full = FROZEN_FLOOR  # objects frozen right after the last full collection
        # Objects frozen since, counted tick by tick: gc.get_freeze_count() walks the whole frozen
        # heap (~30 ms at 10,000 objects, ten times that at 100,000), too dear to ask every tick.
        self._frozen = FROZEN_FLOOR
        self._backoff = Backoff(first=1.0, cap=MAX_BACKOFF_S)  # one key: the loop's own ticks
        self._lease_until = 0.0

    def on_push(self, ref: str | None) -> bool:
        """Webhook/watch trigger. Returns whether ``ref`` is the tracked branch (None = unknown)."""
        if ref is not None and ref != f"refs/heads/{self.parts.branch}":
            return False
        self._last_fetch = 0.0
        self.wake.set()
        return True

    def health(self) -> dict[str, Any]:
        age = time.monotonic() - self.last_tick_ok if self.last_tick_ok else None
        ok = age is not None and age < max(60.0, 6 * self.observe_interval)
        out: dict[str, Any] = {"ok": ok, "last_tick_age_s": age, "last_error": self.last_error}
        if self.tick_exception:
            out["ok"], out["tick_exception"] = False, self.tick_exception
        if self.lease is not None:
            out["lease"] = {"holder": self.lease.holder, "held": self.lease.other is None, "other": self.lease.other}
            if self.lease.other is not None:
                out["ok"] = False
            if self.lease.ignored:
                out["lease"]["ignored"] = self.lease.ignored
        if self.writer.alerts:
            out["integrity"] = list(self.writer.alerts)  # forged records ignored (status/trust.py)
        blocked = self.writer.blocked  # a ref that keeps the status branch from being created or published
        if blocked is not None:
            out["ok"], out["status_branch"] = False, blocked
        return out

    def close(self) -> None:
        """At shutdown: write the pending status, stop measuring folders and give the lease up."""
        self.reporter.stop()
        self.parts.observer.close()
        if self.parts.endpoint is not None:
            self.parts.endpoint.close()
        if self.lease is not None:
            try:
                self.lease.release()
            except Exception as exc:  # shutting down: the lease expires by itself
                log.debug("lease release failed: %s", exc)

    def watch_local(self) -> threading.Thread | None:
        """Watch a local repository's branch refs with watchfiles, so a push ticks at once."""
        if not self.parts.source.local:
            return None
        import watchfiles

        from reconciler import git

        git_dir = git.text(self.parts.source.repo.path, "rev-parse", "--absolute-git-dir")
        status_ref = f"refs/heads/{self.writer.branch}"

        def relevant(change: watchfiles.Change, path: str) -> bool:
            rel = os.path.relpath(path, git_dir)
            return (rel.startswith("refs/heads") and not rel.startswith(status_ref)) or rel.startswith("packed-refs")

        def loop() -> None:
            for _changes in watchfiles.watch(
                git_dir, watch_filter=relevant, debounce=50, step=20, stop_event=self.stop, raise_interrupt=False
            ):
                self.on_push(None)

        thread = threading.Thread(target=loop, name="argus-watch", daemon=True)
        thread.start()
        return thread

    def run(self) -> None:
        """Tick until ``stop`` is set. Never raises for source or Ray outages: backs off."""
        tune_gc()
        backoff = 0.0
        if self.serve_watch > 0:
            observer = self.parts.observer
            ServeWatch(lambda: observer.serving_dash, self.wake.set, self.stop, self.serve_watch).start()
        self.wake.set()
        while not self.stop.is_set():
            pushed = self.wake.wait(timeout=backoff or self.observe_interval)
            self.wake.clear()
            if self.stop.is_set():
                break
            if not pushed:  # timer ticks re-check the file system and capacity; pushes reuse them
                self.refresh_fs()
                self.parts.observer.forget_capacity()
            backoff = self.run_once(pushed=pushed)

    def refresh_fs(self) -> None:
        """Re-check the file-system answers the loads rely on. A push that arrives meanwhile stops
        the re-check (it is made again on the next timer tick), unless the last one that finished
        is older than :data:`REFRESH_STALE` observe intervals: a steady stream of pushes cannot
        keep the file system from being looked at."""
        began = time.monotonic()
        stale = began - self._refreshed_at > REFRESH_STALE * self.observe_interval
        done = self.parts.revisions.refresh_fs(interrupted=None if stale else self.wake.is_set)
        if done:
            self._refreshed_at = time.monotonic()
        _log_if_slow("slow file-system re-check", {"refresh_fs": time.monotonic() - began}, False)

    def run_once(self, *, pushed: bool = False) -> float:
        """One tick; its status write follows (in the background writer when started).
        ``pushed``: a push woke the loop (a full collection due waits for a timer tick).
        Returns the back-off delay (0 when healthy). Never raises for anything a tick meets."""
        try:
            return self._run_once(pushed)
        except Exception as exc:
            return self._tick_failed(exc)

    def _run_once(self, pushed: bool = False) -> float:
        started = time.monotonic()
        if not self._hold_lease():
            # A standby daemon polls at a steady pace (not a back-off): it takes over as soon as
            # the holder's lease expires.
            return min(MAX_BACKOFF_S, max(self.observe_interval, LEASE_POLL_S))
        parts = self.parts
        fetch = not parts.source.local and started - self._last_fetch >= self.fetch_interval
        phases: dict[str, float] = {}
        mark = started

        def lap(name: str) -> None:
            nonlocal mark
            now = time.monotonic()
            phases[name], mark = now - mark, now

        try:
            if fetch or parts.source.local:
                self._last_fetch = started
                parts.source.fetch()
            lap("fetch")
            revision = parts.revisions.read(fetch=False)
            lap("read")
            observation = parts.observe(revision)
            lap("observe")
            result, self.memory = tick(parts, revision, observation, self.memory)
            lap("tick")
        except SourceUnavailable as exc:
            self.reporter.source_error(self._fail("source", str(exc)))
            return self._delay(exc, floor=self.observe_interval)
        except RayUnavailable as exc:
            self._fail("ray", str(exc))
            return self._delay(exc)
        self._backoff.succeeded(_TICK)
        self.last_error = self._error_kind = None
        self.tick_exception = None
        self.collect(pushed=pushed)
        lap("collect")
        self.reporter.report(result)
        lap("report")
        _log_if_slow("slow tick", phases, pushed)
        self.metrics.tick(time.monotonic() - started)
        self.last_tick_ok = time.monotonic()
        return 0.0

    def collect(self, *, pushed: bool = False) -> None:
        """Keep the cyclic GC off the state the daemon holds between ticks, with a bound.

        Every tick's survivors (the desired tree, the memos: millions of objects at 100,000) are
        frozen, so the automatic collections scan only what the next tick makes; without it full
        collections took 1–2 s of every push tick at 100,000 objects. Before freezing, the young
        generations are collected, so the tick's own cyclic garbage (an exception and the frames
        its traceback holds, with whatever they reference) is freed now and never frozen. What
        can still wait is cyclic garbage among objects frozen earlier: everything is collected
        once every :data:`FULL_GC_S`, and sooner when the frozen heap grew by half since.

        A full collection takes seconds at 100,000 objects (3.4 s after the first status commit,
        the heap having grown by the documents of every object): after a push tick (``pushed``)
        it waits for the next timer tick, when no push is waiting, within a bound
        (:data:`FROZEN_HARD`, or overdue by :data:`FULL_GC_S`)."""
        now = time.monotonic()
        due = now >= self._full_gc_at or self._frozen > FROZEN_GROWTH * self._frozen_after_full
        if due and pushed:
            overdue = self._full_gc_at == -math.inf or now >= self._full_gc_at + FULL_GC_S
            due = overdue or self._frozen > FROZEN_HARD * self._frozen_after_full
        if due:
            gc.unfreeze()
            gc.collect()
            self._full_gc_at = now + FULL_GC_S
            gc.freeze()
            self._frozen = self._frozen_after_full = max(gc.get_freeze_count(), FROZEN_FLOOR)
            return
        gc.collect(1)
        # What survived since the last freeze is all in the oldest generation now: counting it
        # costs what this tick kept, not the whole heap.
        self._frozen += len(gc.get_objects(generation=2))
        gc.freeze()

    def _hold_lease(self) -> bool:
        """Take or renew the repository's lease (renewed at half its time to live). Returns
        False when another daemon holds it: this one applies nothing and says so."""
        if self.lease is None:
            return True
        now = time.time()
        if self.lease.other is None and now < self._lease_until - self.lease.ttl / 2:
            return True
        if self.lease.acquire():
            self._lease_until = now + self.lease.ttl
            if self._error_kind == "lease":
                self.last_error = self._error_kind = None
            return True
        message = f"another daemon ({self.lease.other}) holds the lease on this repository; applying nothing"
        self._lease_until = 0.0
        self._fail("lease", message)
        return False

    def _tick_failed(self, exc: Exception) -> float:
        """The last line of defence: log once with the traceback, count, show, back off."""
        message = self.redact(f"{type(exc).__name__}: {exc}")
        tick_exception = getattr(self.metrics, "tick_exception", None)
        if callable(tick_exception):
            tick_exception()
        else:
            self.metrics.error("tick")
        if message != self.tick_exception:
            log.error(json.dumps({"event": "tick_exception", "error": message}), exc_info=exc)
        self.tick_exception = self.last_error = message
        self._error_kind = "tick"
        try:
            self.reporter.tick_error(message)
        except Exception as write_exc:  # the status branch may be what fails
            log.debug("status write after a failed tick failed: %s", write_exc)
        return self._delay(exc)

    def _delay(self, exc: Exception, floor: float = 0.0) -> float:
        """The next try's delay after ``exc``: the loop's back-off, never below the failure's own
        delay (a TemporaryError's) nor ``floor``."""
        at_least = max(floor, exc.delay if isinstance(exc, TemporaryError) else 0.0)
        return self._backoff.failed(_TICK, time.monotonic(), at_least=min(at_least, MAX_BACKOFF_S))

    def _fail(self, kind: str, message: str) -> str:
        """Count, log once and show a failure of ``kind``; returns the redacted message."""
        self.metrics.error(kind)
        message = self.redact(message)
        if self.last_error != message:
            event = "lease_held_elsewhere" if kind == "lease" else f"{kind}_unavailable"
            log.warning(json.dumps({"event": event, "error": message}))
        self.last_error, self._error_kind = message, kind
        return message
