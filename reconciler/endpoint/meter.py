"""The endpoint's meter: the global rate windows and usage rows in the daemon's process, and each
endpoint process's :class:`MeterClient` that decides locally and syncs with it in the background.
No Ray: both sides are argus processes, so no job can send the meter a count or read one.

:class:`Meter` (the daemon's, one per daemon) wraps the pure :class:`MeterState`
(reconciler/endpoint/limits.py, where the design and its overshoot bound are) behind a lock:
endpoint processes sync with it (in the daemon's own process directly; from an ``argus endpoint``
process over the daemon's private socket, reconciler/endpoint/link.py) and the daemon's usage
recorder reads its rows. A request never waits on the meter: admission and counting are local
(:class:`Counters`), and a sync that fails or takes longer than SYNC_TIMEOUT_S leaves its deltas
pending for the next one (logged once until a sync succeeds again). A sync that timed out after
the meter applied it is counted twice: limits err towards refusing, never towards a free ride.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from reconciler.endpoint.limits import Counters, Limits, MeterState
from reconciler.endpoint.usage import metered

log = logging.getLogger("argus")

SYNC_BUSY_S = 0.5  # a process that had traffic in the last BUSY_FOR_S syncs this often
BUSY_FOR_S = 10.0  # then an idle process stops syncing (its next limited request syncs first: STALE_S)
SYNC_TIMEOUT_S = 2.0  # bound on one sync with the meter
STALE_S = 2 * SYNC_BUSY_S  # windows older than this are refreshed before a limited request is decided
FRESHEN_TIMEOUT_S = 0.25  # bound on that refresh: past it, the request is decided with what is known

MAX_TOKENS = 10_000_000  # tokens one request is billed at most, of each kind (when it sets no bound)
TEMPLATE_TOKENS = 4096  # a chat template's own tokens a prompt may add beyond its bytes

# deltas (Counters.take) -> the meter's windows (MeterState.sync's answer); raises on failure.
SyncLink = Callable[[Any], Awaitable[dict[str, Any]]]


def usage_cap(body: dict[str, Any], body_bytes: int) -> tuple[int, int]:
    """The most (prompt, completion) tokens a request can have used, whatever its answer says. Pure.

    An answer is data: within the seconds a job's shadow application holds a route (the daemon
    removes it) it could answer a user's request with any ``usage``. A prompt is at most a token per
    byte of the request plus a chat template's own (TEMPLATE_TOKENS); a completion at most the
    request's ``max_tokens`` (or ``max_completion_tokens``, times ``n``), else MAX_TOKENS."""
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    n = body.get("n", 1)
    choices = n if isinstance(n, int) and not isinstance(n, bool) and 0 < n <= 128 else 1
    if isinstance(limit, int) and not isinstance(limit, bool) and limit >= 0:
        completion = min(limit * choices, MAX_TOKENS)
    else:
        completion = MAX_TOKENS
    return min(body_bytes + TEMPLATE_TOKENS, MAX_TOKENS), completion


class RateLimitExceeded(Exception):
    """Over a per-minute limit (the endpoint's 429); ``retry_after``: whole seconds until one is
    admitted again."""

    def __init__(self, retry_after: int, message: str) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.message = message


class Meter:
    """The daemon's meter: global windows and usage rows since its random epoch. Thread-safe (the
    endpoint's event loop syncs, the status reporter's thread reads usage)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._state = MeterState(uuid.uuid4().hex, clock())
        self._lock = threading.Lock()
        self._refused_logged = 0

    def sync(self, deltas: Any) -> dict[str, Any]:
        """Add ``deltas`` (:meth:`Counters.take`); return the windows of every active subject."""
        with self._lock:
            answer = self._state.sync(deltas, self._clock())
            refused = self._state.refused_subjects
        if refused > self._refused_logged:
            log.warning("argus meter: more than the subjects it counts at once: some are not limited")
            self._refused_logged = refused * 2  # ever rarer, never silent
        return answer

    def usage(self) -> dict[str, Any]:
        """The usage rows (MeterState.usage's document: epoch, hours, rows)."""
        with self._lock:
            return self._state.usage(self._clock())

    async def link(self, deltas: Any) -> dict[str, Any]:
        """:data:`SyncLink` of an endpoint in this process."""
        return self.sync(deltas)


class MeterClient:
    """An endpoint process's side: local admission and counting, and the background sync with the
    meter (``link``: how deltas reach it; None: nothing is synced, the process limits alone)."""

    def __init__(self, link: SyncLink | None) -> None:
        self.counters = Counters()
        self._link = link
        self._busy_until = float("-inf")  # monotonic
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._failing = False
        self._synced_at = float("-inf")  # monotonic end of the last sync the meter answered
        self._closed = False

    def stale(self, limits: Limits | None) -> bool:
        """True when requests are limited and this process's copy of the meter's windows is older
        than STALE_S: a process waking from idle (it stops syncing then) would otherwise decide its
        first requests without the counts other processes sent meanwhile."""
        return limits is not None and self._link is not None and time.monotonic() - self._synced_at > STALE_S

    async def freshen(self) -> None:
        """One sync, waited for at most FRESHEN_TIMEOUT_S (the request is decided either way)."""
        self._traffic()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(FRESHEN_TIMEOUT_S):
                await self.sync()

    def admit(self, limits: Limits | None, user: str, team: str | None) -> list[str]:
        """Count one request of ``user`` (of ``team``) and return the subjects it counts under;
        raises RateLimitExceeded when over a limit (then nothing is counted)."""
        self._traffic()
        if limits is None:
            return []
        subject_limits = limits.of(user, team)
        if not subject_limits:
            return []
        refused = self.counters.admit(subject_limits, time.time())
        if refused is not None:
            wait, which = refused
            whose = "your team's" if which.startswith("t:") else "your"
            kind = "tokens" if which.endswith(" tokens") else "requests"
            raise RateLimitExceeded(wait, f"Rate limit exceeded ({whose} {kind} per minute): retry in {wait} s.")
        return [subject for subject, _, _ in subject_limits]

    def metered(
        self,
        stream: AsyncIterator[Any],
        strip: bool,
        user: str,
        app: str,
        subjects: list[str],
        cap: tuple[int, int] = (MAX_TOKENS, MAX_TOKENS),
    ) -> AsyncIterator[Any]:
        """``stream`` passed on while its request and tokens are counted: a usage row for ``user``
        and ``app``, tokens also against ``subjects``; at most ``cap`` (prompt, completion) tokens in
        all, whatever the stream reports (:func:`usage_cap`)."""
        billed = [0, 0]

        def on_start() -> None:
            self.counters.record(time.time(), user, app, 1, 0, 0)
            self._traffic()

        def on_usage(prompt: int, completion: int) -> None:
            prompt = max(min(prompt, cap[0] - billed[0]), 0)
            completion = max(min(completion, cap[1] - billed[1]), 0)
            billed[0] += prompt
            billed[1] += completion
            self.counters.record(time.time(), user, app, 0, prompt, completion)
            self.counters.add_tokens(subjects, prompt + completion)
            self._traffic()

        return metered(stream, strip, on_start, on_usage)

    def count(
        self,
        user: str,
        app: str,
        subjects: list[str],
        prompt: int,
        completion: int,
        cap: tuple[int, int] = (MAX_TOKENS, MAX_TOKENS),
    ) -> None:
        """Count one answered, non-streamed request of ``user`` to ``app`` and its tokens (at most ``cap``)."""
        prompt, completion = min(max(prompt, 0), cap[0]), min(max(completion, 0), cap[1])
        now = time.time()
        self.counters.record(now, user, app, 1, prompt, completion)
        if prompt or completion:
            self.counters.add_tokens(subjects, prompt + completion)
        self._traffic()

    def _traffic(self) -> None:
        now = time.monotonic()
        if now > self._busy_until:
            self._wake.set()
        self._busy_until = now + BUSY_FOR_S
        if self._link is not None and not self._closed and (self._task is None or self._task.done()):
            with contextlib.suppress(RuntimeError):  # outside an event loop (plain unit tests) nothing syncs
                self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            if time.monotonic() > self._busy_until:
                self._wake.clear()
                await self._wake.wait()  # idle: no sync, no wake-up until the next request
            try:
                await self.sync()
            except Exception:  # never ends the loop; sync() logs its own failures
                log.exception("argus endpoint: the meter sync loop failed")
            await asyncio.sleep(SYNC_BUSY_S)

    async def sync(self) -> bool:
        """Send the unsynced counts to the meter and take its windows; returns whether it answered
        within SYNC_TIMEOUT_S. One sync at a time; on failure the counts stay pending."""
        if self._link is None:
            return False
        async with self._lock:
            deltas = self.counters.take()
            answer: dict[str, Any] | None = None
            try:
                async with asyncio.timeout(SYNC_TIMEOUT_S):
                    answer = await self._link(deltas)
            except Exception as exc:
                if not self._failing:
                    log.warning("argus endpoint: the meter did not answer (%r): limiting with local counts", exc)
                self._failing = True
            finally:
                self.counters.settle(answer if isinstance(answer, dict) else None)
            if answer is not None:
                self._synced_at = time.monotonic()
                if self._failing:
                    log.info("argus endpoint: the meter answers again")
                    self._failing = False
            return answer is not None

    async def flush(self) -> bool:
        """Sync now (tests that read usage right after requests); returns whether the meter answered."""
        return await self.sync()

    async def close(self) -> bool:
        """Stop the background sync, then send what is still unsynced (the endpoint's shutdown);
        returns whether the meter answered that last sync."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._closed = True  # a straggling request's count is synced by nobody: no new loop after this
        return await self.sync()
