"""The one back-off of argus: per-key exponential delays for temporary failures. Pure.

Used by the loop (a tick that met an unreachable Ray, an unreadable source, an exception) and
by the applier (one task's submission that Ray could not take). ``now`` is passed in
(monotonic seconds), so tests drive it without sleeping.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable


class Backoff:
    """Per-key retry schedule: ``first``, 2x, 4x ... up to ``cap`` seconds, never sooner than
    the failure's own ``at_least`` (:attr:`reconciler.errors.TemporaryError.delay`).

    ``due(key, now)`` says whether to try again; ``failed`` schedules the next try and returns
    the delay; ``succeeded`` forgets the key; ``prune`` drops the keys of objects that are gone
    (the owner's bound: one entry per failing key it still has).
    """

    def __init__(self, first: float = 2.0, cap: float = 60.0) -> None:
        self.first, self.cap = first, cap
        self._next: dict[Hashable, tuple[float, float]] = {}  # key -> (not before, last delay)

    def due(self, key: Hashable, now: float) -> bool:
        entry = self._next.get(key)
        return entry is None or now >= entry[0]

    def failed(self, key: Hashable, now: float, at_least: float = 0.0) -> float:
        """Schedule the next try of ``key``; returns the delay in seconds."""
        last = self._next.get(key, (0.0, 0.0))[1]
        delay = min(self.cap, max(at_least, 2 * last if last else self.first))
        self._next[key] = (now + delay, delay)
        return delay

    def succeeded(self, key: Hashable) -> None:
        self._next.pop(key, None)

    def prune(self, keep: Callable[[Hashable], bool]) -> None:
        """Forget every key for which ``keep(key)`` is false (the caller's objects that are gone)."""
        for key in [k for k in self._next if not keep(k)]:
            del self._next[key]

    def __len__(self) -> int:
        return len(self._next)

    def retry_in(self, key: Hashable, now: float) -> float | None:
        """Seconds until the next try of ``key`` (None when it is not backing off)."""
        entry = self._next.get(key)
        return None if entry is None else max(0.0, entry[0] - now)
