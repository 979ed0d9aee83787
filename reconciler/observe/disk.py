"""Measures users' folders for the disk quotas (cluster.yaml ``storage``), off the tick.

A folder can hold millions of files, and the tick must never wait on a file system. So one background
thread (:class:`DiskMeter`) walks one user's folder at a time (:class:`Walk`), a batch of entries at a
time with a pause between batches, and publishes a folder's total only when its walk is complete; the
tick reads the last published totals (a dict copy under a lock, O(users)). Bounds:

- time: at most :data:`BATCH` entries per :data:`PAUSE_S` (about 20,000 a second: a fraction of one core
  and of the disk); a pass over every folder is followed by :data:`REST_S` of rest before the next;
  the folder measured longest ago (or never) goes first, so one huge folder delays the others by one
  walk at most;
- memory and descriptors: one open directory per level of the folder being walked, at most
  :data:`MAX_DEPTH`; one total per user measured (users no longer asked for are dropped);
- one walk counts at most :data:`MAX_ENTRIES` entries, so one user's folder delays the others by a few
  minutes at most.

A walk counts allocated blocks (``st_blocks``, as ``du`` does) of every entry, without following symbolic
links or crossing into another file system. A hard link is counted at each of its names (the file
service makes none; rsync -H can: it only counts against its own user). What a walk cannot count (a
folder the daemon may not read, a tree deeper than :data:`MAX_DEPTH`, more than :data:`MAX_ENTRIES`
entries, a user folder replaced by a symbolic link) makes the measurement incomplete:
the quota check then holds the user's new runs (reconciler.plan.disk), so neither hides data from it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Collection

from reconciler.plan.disk import DiskUsage

log = logging.getLogger("argus")

BATCH = 2_000
PAUSE_S = 0.1
REST_S = 60.0
MAX_DEPTH = 64
# Entries one walk counts at most (about 4 minutes at BATCH per PAUSE_S): folders are measured one at a
# time, so without it one user's millions of small files would hold back everyone else's measurement.
MAX_ENTRIES = 5_000_000
_SHOWN = 200  # characters of a path quoted in a problem


def _shown(path: str, top: str) -> str:
    """``path`` relative to ``top``, quoted (control characters and undecodable bytes escaped), bounded."""
    rel = os.path.relpath(path, top) if path != top else "."
    return repr(rel[:_SHOWN] + ("..." if len(rel) > _SHOWN else ""))


class Walk:
    """One measurement of the folder ``top``, made :meth:`step` by :meth:`step`. Keeps one open
    directory per level it is inside (at most ``max_depth``); :meth:`close` releases them. Stops,
    incomplete, after ``max_entries`` entries."""

    def __init__(self, top: str, max_depth: int = MAX_DEPTH, max_entries: int = MAX_ENTRIES) -> None:
        self.top = top
        self.max_depth = max_depth
        self.max_entries = max_entries
        self.used = 0
        self.entries = 0
        self.problem: str | None = None
        self._stack: list[os._ScandirIterator[str]] = []
        self._dev = 0
        try:
            st = os.lstat(top)
        except FileNotFoundError:
            return  # no folder yet: nothing uploaded, nothing written
        except OSError as exc:
            self._note(f"cannot read {top}: {exc.strerror}")
            return
        self.used += st.st_blocks * 512
        if stat.S_ISLNK(st.st_mode):
            # Not followed (its target may be anywhere, another user's folder included); what the user
            # keeps there is then not counted, so the measurement is not whole.
            self._note("it is a symbolic link, not a folder; make it the user's folder again")
        elif stat.S_ISDIR(st.st_mode):
            self._dev = st.st_dev
            self._enter(top)

    @property
    def done(self) -> bool:
        return not self._stack

    @property
    def result(self) -> DiskUsage:
        return DiskUsage(self.used, self.problem)

    def _note(self, problem: str) -> None:
        if self.problem is None:  # the first one is what the user fixes first
            self.problem = problem

    def _enter(self, path: str) -> None:
        try:
            self._stack.append(os.scandir(path))
        except FileNotFoundError:
            pass  # removed since it was listed
        except OSError as exc:
            self._note(
                f"cannot read {_shown(path, self.top)}: {exc.strerror}; make it readable (chmod 755) or remove it"
            )

    def step(self, budget: int) -> bool:
        """Count up to ``budget`` more entries. Returns whether the walk is complete. Never raises for
        what it finds: each problem is noted (the first one is kept in :attr:`problem`)."""
        while self._stack and budget > 0:
            if self.entries >= self.max_entries:
                self._note(
                    f"it holds more than {self.max_entries:,} files and folders; "
                    "remove some (old run folders under jobs/)"
                )
                self.close()
                break
            try:
                entry = next(self._stack[-1])
            except StopIteration:
                self._stack.pop().close()
                continue
            except OSError as exc:
                self._note(f"cannot read a folder below {self.top}: {exc.strerror}")
                self._stack.pop().close()
                continue
            budget -= 1
            self.entries += 1
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            except OSError as exc:
                self._note(f"cannot read {_shown(entry.path, self.top)}: {exc.strerror}")
                continue
            self.used += st.st_blocks * 512
            if stat.S_ISDIR(st.st_mode) and st.st_dev == self._dev:
                if len(self._stack) >= self.max_depth:
                    self._note(
                        f"{_shown(entry.path, self.top)} is more than {self.max_depth} folder levels deep; "
                        "move what is below it higher up or remove it"
                    )
                    continue
                self._enter(entry.path)
        return not self._stack

    def close(self) -> None:
        while self._stack:
            self._stack.pop().close()


class DiskMeter:
    """Measures the folders :meth:`want` names in a background thread (started on the first folder);
    :meth:`usage` returns the last complete measurement of each. ``clock`` is wall time in seconds."""

    def __init__(
        self,
        *,
        batch: int = BATCH,
        pause_s: float = PAUSE_S,
        rest_s: float = REST_S,
        max_depth: int = MAX_DEPTH,
        max_entries: int = MAX_ENTRIES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.batch, self.pause_s, self.rest_s, self.max_depth = batch, pause_s, rest_s, max_depth
        self.max_entries = max_entries
        self._clock = clock
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._root: str | None = None
        self._users: frozenset[str] = frozenset()
        self._results: dict[str, tuple[DiskUsage, float]] = {}  # user -> (usage, when its walk ended)
        self._thread: threading.Thread | None = None

    def want(self, root: str | None, users: Collection[str]) -> None:
        """Measure the folders ``<root>/<user>`` of ``users`` from now on (and no others: the totals of
        the others are dropped). ``root`` None, or no users: measure nothing."""
        wanted = frozenset(users) if root is not None else frozenset()
        with self._lock:
            if root != self._root:
                self._results.clear()  # other folders
            self._root = root
            changed = wanted != self._users
            self._users = wanted
            self._results = {u: r for u, r in self._results.items() if u in wanted}
            start = bool(wanted) and self._thread is None and not self._stop.is_set()
            if start:
                self._thread = threading.Thread(target=self._run, name="argus-disk-meter", daemon=True)
        if start and self._thread is not None:
            self._thread.start()
        if changed:
            self._wake.set()

    def usage(self) -> dict[str, DiskUsage]:
        """The last complete measurement of each wanted user's folder measured so far."""
        with self._lock:
            return {u: r[0] for u, r in self._results.items()}

    def close(self) -> None:
        """Stop the thread (within one batch) and wait for it."""
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=10)

    def _next(self) -> tuple[tuple[str, str] | None, float]:
        """The folder to measure now (root, user), or None and how long to rest first."""
        with self._lock:
            if self._root is None or not self._users:
                return None, self.rest_s
            user = min(self._users, key=lambda u: (self._results[u][1] if u in self._results else -1.0, u))
            measured = self._results.get(user)
            wait = 0.0 if measured is None else self.rest_s - (self._clock() - measured[1])
            return ((self._root, user), 0.0) if wait <= 0 else (None, wait)

    def _run(self) -> None:
        while not self._stop.is_set():
            folder, wait = self._next()
            if folder is None:
                self._wake.wait(wait)
                self._wake.clear()
                continue
            root, user = folder
            try:
                usage = self._measure(root, user)
            except Exception as exc:  # a bug here must not stop the measurements of everyone else
                log.exception("measuring %s failed", os.path.join(root, user))
                usage = DiskUsage(0, f"the measurement failed: {type(exc).__name__}")
            if usage is None:
                continue
            with self._lock:
                if self._root == root and user in self._users:
                    self._results[user] = (usage, self._clock())

    def _measure(self, root: str, user: str) -> DiskUsage | None:
        """Walk ``<root>/<user>`` to the end, pausing between batches. None when abandoned (stopped, or
        the folder is no longer wanted)."""
        walk = Walk(os.path.join(root, user), self.max_depth, self.max_entries)
        try:
            while not walk.step(self.batch):
                if self._stop.wait(self.pause_s):
                    return None
                with self._lock:
                    if self._root != root or user not in self._users:
                        return None
            return walk.result
        finally:
            with contextlib.suppress(OSError):
                walk.close()
