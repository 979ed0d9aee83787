"""The router's meter: one ``ArgusMeter`` replica holding the global rate windows and usage rows,
and each router replica's :class:`MeterClient` that decides locally and syncs with it in the
background (the design and its overshoot bound: reconciler/serve_apps/limits.py).

A request never waits on the meter: admission and counting are local (:class:`Counters`), and a
sync that fails or takes longer than SYNC_TIMEOUT_S leaves its deltas pending for the next one
(logged once until a sync succeeds again). A sync that timed out after the meter applied it is
counted twice: limits err towards refusing, never towards a free ride. Only ``GET /argus/usage``
waits for the meter (a flush of the answering replica's counts, then the rows): the daemon polls
it, no user does. Other router replicas' counts reach the meter within their sync period
(SYNC_BUSY_S). Each sync's answer holds the windows of every subject counted in the last two
minutes (at most MAX_SUBJECTS): small for the users of one cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi import status as http_status
from ray.llm._internal.serve.core.configs.openai_api_models import OpenAIHTTPException
from ray.llm._internal.serve.core.ingress.middleware import get_request_id
from ray.llm._internal.serve.utils.server_utils import get_response_for_error
from ray.serve.handle import DeploymentHandle
from starlette.responses import JSONResponse

from reconciler.serve_apps.limits import Counters, Limits, MeterState
from reconciler.serve_apps.usage import metered

logger = logging.getLogger("ray.serve")

SYNC_BUSY_S = 0.5  # a replica that had traffic in the last BUSY_FOR_S syncs this often
BUSY_FOR_S = 10.0  # then an idle replica stops syncing (its next limited request syncs first: STALE_S)
SYNC_TIMEOUT_S = 2.0  # bound on one sync or usage call to the meter
STALE_S = 2 * SYNC_BUSY_S  # windows older than this are refreshed before a limited request is decided
FRESHEN_TIMEOUT_S = 0.25  # bound on that refresh: past it, the request is decided with what is known
METER_DEPLOYMENT = "ArgusMeter"


class RateLimitExceeded(OpenAIHTTPException):
    """Over a per-minute limit (429); ``retry_after``: whole seconds until one is admitted again."""

    def __init__(self, retry_after: int, message: str) -> None:
        super().__init__(status_code=http_status.HTTP_429_TOO_MANY_REQUESTS, message=message, type="RateLimitExceeded")
        self.retry_after = retry_after


async def rate_limited_response(request: Request, exc: Exception) -> JSONResponse:
    """The 429 of a RateLimitExceeded: Ray's OpenAI error body plus ``Retry-After``.

    Registered as the FastAPI app's handler of RateLimitExceeded: Ray's error middleware would
    answer the same body without the header."""
    retry_after = getattr(exc, "retry_after", 1)
    error = get_response_for_error(exc, get_request_id(request))
    return JSONResponse(
        content=error.model_dump(), status_code=error.error.code, headers={"Retry-After": str(retry_after)}
    )


class ArgusMeter:
    """The meter deployment (one replica): adds the router replicas' deltas to the global windows
    and answers them with the windows; answers ``/argus/usage``'s rows. Its epoch is random at
    start: rows are cumulative since then."""

    def __init__(self) -> None:
        self._state = MeterState(uuid.uuid4().hex, time.time())
        self._refused_logged = 0

    async def sync(self, deltas: Any) -> dict[str, Any]:
        """Add ``deltas`` (:meth:`Counters.take`); return the windows of every active subject."""
        answer = self._state.sync(deltas, time.time())
        if self._state.refused_subjects > self._refused_logged:
            logger.warning("argus meter: more than the subjects it counts at once: some are not limited")
            self._refused_logged = self._state.refused_subjects * 2  # ever rarer, never silent
        return answer

    async def usage(self) -> dict[str, Any]:
        """The ``GET /argus/usage`` JSON (reconciler/serve_apps/limits.py MeterState.usage)."""
        return self._state.usage(time.time())


class MeterClient:
    """A router replica's side: local admission and counting, and the background sync with the
    meter (``handle``: the ArgusMeter deployment; None: nothing is synced, each replica limits
    alone and ``/argus/usage`` is a 503)."""

    def __init__(self, handle: DeploymentHandle | None) -> None:
        self.counters = Counters()
        self._handle = handle
        self._busy_until = float("-inf")  # monotonic
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._failing = False
        self._synced_at = float("-inf")  # monotonic end of the last sync the meter answered

    def stale(self, limits: Limits | None) -> bool:
        """True when requests are limited and this replica's copy of the meter's windows is older
        than STALE_S: a replica waking from idle (it stops syncing then) would otherwise decide its
        first requests without the counts other replicas sent meanwhile."""
        return limits is not None and self._handle is not None and time.monotonic() - self._synced_at > STALE_S

    async def freshen(self) -> None:
        """One sync, waited for at most FRESHEN_TIMEOUT_S (the request is decided either way)."""
        self._traffic()  # a sync loop runs from now on, as for any request
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.sync(), timeout=FRESHEN_TIMEOUT_S)

    def admit(self, limits: Limits | None, user: str, team: str | None) -> list[str]:
        """Count one request of ``user`` (of ``team``) and return the subjects it counts under;
        raises RateLimitExceeded (429) when over a limit (then nothing is counted)."""
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
        self, stream: AsyncIterator[Any], strip: bool, user: str, app: Any, subjects: list[str]
    ) -> AsyncIterator[Any]:
        """``stream`` passed on while its request (``app()``: its application) and tokens are
        counted: a usage row for ``user``, tokens also against ``subjects``."""
        app_name = ""

        def on_start() -> None:
            nonlocal app_name
            app_name = app()
            self.counters.record(time.time(), user, app_name, 1, 0, 0)
            self._traffic()  # the open endpoint's and the daemon's requests are synced too

        def on_usage(prompt: int, completion: int) -> None:
            self.counters.record(time.time(), user, app_name, 0, prompt, completion)
            self.counters.add_tokens(subjects, prompt + completion)
            self._traffic()

        return metered(stream, strip, on_start, on_usage)

    def _traffic(self) -> None:
        now = time.monotonic()
        if now > self._busy_until:
            self._wake.set()
        self._busy_until = now + BUSY_FOR_S
        if self._handle is not None and (self._task is None or self._task.done()):
            # Outside the replica's event loop (unit tests calling it plainly) nothing syncs.
            with contextlib.suppress(RuntimeError):
                self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            if time.monotonic() > self._busy_until:
                self._wake.clear()
                await self._wake.wait()  # idle: no sync, no wake-up until the next request
            try:
                await self.sync()
            except Exception:  # never ends the loop; sync() logs its own failures
                logger.exception("argus router: the meter sync loop failed")
            await asyncio.sleep(SYNC_BUSY_S)

    async def sync(self) -> bool:
        """Send the unsynced counts to the meter and take its windows; returns whether it answered
        within SYNC_TIMEOUT_S. One sync at a time; on failure the counts stay pending."""
        if self._handle is None:
            return False
        async with self._lock:
            deltas = self.counters.take()
            answer: dict[str, Any] | None = None
            try:
                answer = await asyncio.wait_for(self._handle.sync.remote(deltas), timeout=SYNC_TIMEOUT_S)
            except Exception as exc:
                if not self._failing:
                    logger.warning("argus router: the meter did not answer (%r): limiting with local counts", exc)
                self._failing = True
            finally:
                self.counters.settle(answer)
            if answer is not None:
                self._synced_at = time.monotonic()
            if answer is not None and self._failing:
                logger.info("argus router: the meter answers again")
                self._failing = False
            return answer is not None

    async def usage(self) -> dict[str, Any]:
        """The meter's usage rows after flushing this replica's counts; raises OpenAIHTTPException
        (503) when the meter does not answer."""
        if self._handle is None or not await self.sync():
            raise _meter_unavailable()
        try:
            answer: dict[str, Any] = await asyncio.wait_for(self._handle.usage.remote(), timeout=SYNC_TIMEOUT_S)
        except Exception as exc:
            logger.warning("argus router: the meter's usage did not come: %r", exc)
            raise _meter_unavailable() from None
        return answer


def _meter_unavailable() -> OpenAIHTTPException:
    return OpenAIHTTPException(
        status_code=http_status.HTTP_503_SERVICE_UNAVAILABLE,
        message="Usage is not available right now; retry.",
        type="ServiceUnavailable",
    )
