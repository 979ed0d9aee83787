"""Running aiohttp sites in a thread of their own: the endpoint in the daemon's process
(``argus run``) and the daemon's private link. I/O.

A :class:`SiteThread` owns one event loop and one aiohttp runner: ``start`` returns once its
site is bound (raising what binding raised), ``stop`` cleans the runner up and waits for the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable

from aiohttp import web

from reconciler.endpoint.server import Endpoint

log = logging.getLogger("argus")

START_TIMEOUT_S = 30.0  # binding the site and starting the loop
STOP_TIMEOUT_S = 10.0  # cleaning the runner up (requests in flight get this long)
BACKLOG = 1024  # the listening socket's backlog


def new_loop() -> asyncio.AbstractEventLoop:
    """An event loop for the endpoint: uvloop's when it is installed (it comes with Ray Serve's
    uvicorn[standard]; a faster loop is less CPU per forwarded chunk), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


async def start_site(endpoint: Endpoint, host: str, port: int) -> web.AppRunner:
    """Bind ``endpoint``'s application on ``host:port``; returns its runner (``cleanup()`` stops
    it). Raises OSError when the port cannot be bound."""
    # Access logs off: one line per request would be the daemon's log volume.
    runner = web.AppRunner(endpoint.application(), access_log=None, handle_signals=False)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, backlog=BACKLOG, reuse_address=True).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner


class SiteThread:
    """Runs the runner ``setup()`` makes on an event loop in a thread named ``name``."""

    def __init__(self, setup: Callable[[], Awaitable[web.AppRunner]], name: str) -> None:
        self._setup = setup
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping: asyncio.Event | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None

    def start(self) -> None:
        """Start serving; returns once the site is bound. Raises what binding raised (OSError),
        TimeoutError when the loop did not start within START_TIMEOUT_S."""
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()
        if not self._started.wait(START_TIMEOUT_S):
            raise TimeoutError(f"{self._name} did not start within {START_TIMEOUT_S} s")
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        loop = self._loop = new_loop()
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._main())
        except BaseException as exc:  # a failed bind: start() raises it
            self._error = exc
        finally:
            self._started.set()
            loop.close()

    async def _main(self) -> None:
        self._stopping = asyncio.Event()
        runner = await self._setup()
        self._started.set()
        try:
            await self._stopping.wait()
        finally:
            await runner.cleanup()

    def stop(self) -> None:
        """Stop serving and wait for the thread (at most STOP_TIMEOUT_S)."""
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # closed meanwhile
                loop.call_soon_threadsafe(stopping.set)
        if self._thread is not None:
            self._thread.join(STOP_TIMEOUT_S)
