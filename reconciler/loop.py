"""The loop that runs ticks: triggers (watchfiles, webhooks, timers) and back-off. I/O."""

from __future__ import annotations

import gc
import json
import logging
import os
import threading
import time
from typing import Any

from reconciler.errors import RayUnavailable, SourceUnavailable
from reconciler.report import Reporter
from reconciler.server import Metrics
from reconciler.status.writer import StatusWriter
from reconciler.tick import Reconciler

log = logging.getLogger("argus")


class Daemon:
    """Runs ticks when triggered (a push seen by watchfiles or a webhook, the fetch interval
    for remotes) and every ``observe_interval`` seconds to keep status fresh and fix drift.
    Writes status once per tick, and only when something changed."""

    def __init__(
        self,
        reconciler: Reconciler,
        writer: StatusWriter,
        *,
        observe_interval: float = 5.0,
        fetch_interval: float = 15.0,
        metrics: Metrics | None = None,
    ) -> None:
        self.reconciler = reconciler
        self.writer = writer
        self.observe_interval = observe_interval
        self.fetch_interval = fetch_interval
        self.metrics = metrics or Metrics()
        self.reporter = Reporter(reconciler.dash, writer, self.metrics)
        # The status branch is the durable record of runs: read them from it, and record a
        # run there before submitting it (reconciler/tick.py, "Exactly once").
        reconciler.status_docs = writer.documents
        reconciler.record_runs = writer.record_runs
        self.wake = threading.Event()
        self.stop = threading.Event()
        self.last_tick_ok = 0.0
        self.last_error: str | None = None
        self._last_fetch = 0.0
        self._backoff = 0.0

    def on_push(self, ref: str | None) -> bool:
        """Webhook/watch trigger. Returns whether ``ref`` is the tracked branch (None = unknown)."""
        if ref is not None and ref != f"refs/heads/{self.reconciler.branch}":
            return False
        self._last_fetch = 0.0
        self.wake.set()
        return True

    def health(self) -> dict[str, Any]:
        age = time.monotonic() - self.last_tick_ok if self.last_tick_ok else None
        ok = age is not None and age < max(60.0, 6 * self.observe_interval)
        return {"ok": ok, "last_tick_age_s": age, "last_error": self.last_error}

    def watch_local(self) -> threading.Thread | None:
        """Watch a local repository's branch refs with watchfiles, so a push ticks at once."""
        if not self.reconciler.source.local:
            return None
        import subprocess

        import watchfiles

        git_dir = subprocess.run(
            ["git", "-C", self.reconciler.source.repo.path, "rev-parse", "--absolute-git-dir"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
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
        backoff = 0.0
        self.wake.set()
        while not self.stop.is_set():
            self.wake.wait(timeout=backoff or self.observe_interval)
            self.wake.clear()
            if self.stop.is_set():
                break
            backoff = self.run_once()

    def run_once(self) -> float:
        """One tick plus its status write. Returns the back-off delay (0 when healthy)."""
        started = time.monotonic()
        fetch = not self.reconciler.source.local and started - self._last_fetch >= self.fetch_interval
        try:
            if fetch or self.reconciler.source.local:
                self._last_fetch = started
                self.reconciler.source.fetch()
            desired, revision, commit_time = self.reconciler.load(fetch=False)
            result = self.reconciler.tick(desired, revision)
            result.commit_time = commit_time
        except SourceUnavailable as exc:
            self._fail("source", str(exc))
            self.reporter.source_error(str(exc))
            return min(60.0, max(self.observe_interval, 5.0))
        except RayUnavailable as exc:
            self._fail("ray", str(exc))
            return min(60.0, max(1.0, 2 * (self._backoff or 0.5)))
        self._backoff = 0.0
        self.last_error = None
        if not self.last_tick_ok:
            # The desired tree and caches live as long as the daemon: keep the cyclic GC from
            # re-scanning them on every tick (10,000 objects made full collections dominate).
            gc.collect()
            gc.freeze()
        self.reporter.report(result)
        self.metrics.tick(time.monotonic() - started)
        self.last_tick_ok = time.monotonic()
        return 0.0

    def _fail(self, kind: str, message: str) -> None:
        self.metrics.error(kind)
        self._backoff = min(60.0, max(1.0, 2 * (self._backoff or 0.5)))
        if self.last_error != message:
            log.warning(json.dumps({"event": f"{kind}_unavailable", "error": message}))
        self.last_error = message
