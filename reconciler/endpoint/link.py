"""The daemon's private link to ``argus endpoint`` processes: a Unix socket. I/O.

The endpoint service of the compose stack is a process of its own (several may run), and it
needs two things only the daemon has: the gate config of each tick (keys' hashes, access rules,
teams, limits, the model table) and the meter's global windows (so that limits hold across
endpoint processes). Both travel over HTTP on a Unix socket in a folder that only the daemon's
and the endpoints' containers mount (compose volume ``argus-link``): no Ray job can reach it, and
nothing on it is ever sent into Ray.

- ``GET /gate?have=V``: ``{"version", "config"}`` when the daemon's gate version is not ``V``, else
  ``204`` at once (endpoints poll every GATE_POLL_S). A version is ``<daemon epoch>.<count>``: a
  restarted daemon's first gate is new to every endpoint, whatever it counted before;
- ``POST /sync``: the endpoint's deltas (``Counters.take``), answered with the meter's windows.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web

from reconciler.endpoint.meter import Meter
from reconciler.endpoint.server import Endpoint

log = logging.getLogger("argus")

GATE_POLL_S = 1.0  # how often an endpoint process asks for a newer gate config
LINK_TIMEOUT_S = 5.0  # bound on one call over the link
MAX_SYNC_BYTES = 64 * 1024 * 1024  # one sync's deltas (rows of 100,000 (hour, user, app) at most)
MAX_GATE_BYTES = 256 * 1024 * 1024  # one gate config (100,000 keys and models)
SOCKET_MODE = 0o660  # the daemon's and the endpoints' uid (and group) only


def link_application(meter: Meter, gate: Callable[[], tuple[str, Any]]) -> web.Application:
    """The daemon's side: ``meter`` syncs, ``gate()`` returns ``(version, config)``."""

    async def get_gate(request: web.Request) -> web.Response:
        version, config = gate()
        if config is None or request.query.get("have") == version:
            return web.Response(status=204)
        return web.json_response({"version": version, "config": config})

    async def post_sync(request: web.Request) -> web.Response:
        try:
            deltas = json.loads(await request.read())
            answer = meter.sync(deltas)
        except Exception as exc:  # a malformed sync is that endpoint's problem, never the daemon's
            log.warning("argus link: a sync was refused: %r", exc)
            return web.json_response({"error": "malformed deltas"}, status=400)
        return web.json_response(answer)

    app = web.Application(client_max_size=MAX_SYNC_BYTES)
    app.router.add_get("/gate", get_gate)
    app.router.add_post("/sync", post_sync)
    return app


async def serve_link(meter: Meter, gate: Callable[[], tuple[str, Any]], path: str) -> web.AppRunner:
    """Serve the link on the Unix socket ``path`` (a stale socket file there is replaced); returns
    the runner. Raises OSError when the socket cannot be made."""
    if os.path.exists(path):
        os.unlink(path)
    runner = web.AppRunner(link_application(meter, gate), access_log=None, handle_signals=False)
    await runner.setup()
    await web.UnixSite(runner, path).start()
    os.chmod(path, SOCKET_MODE)
    log.info("argus link: serving endpoint processes on %s", path)
    return runner


class LinkClient:
    """An endpoint process's side of the link at the Unix socket ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=self.path),
                timeout=aiohttp.ClientTimeout(total=LINK_TIMEOUT_S),
            )
        return self._session

    async def sync(self, deltas: Any) -> dict[str, Any]:
        """:data:`~reconciler.endpoint.meter.SyncLink` over the link; raises on any failure."""
        async with self._client().post("http://daemon/sync", json=deltas) as resp:
            resp.raise_for_status()
            answer = await resp.json()
        if not isinstance(answer, dict):
            raise ValueError("the meter's answer is not a mapping")
        return answer

    async def gate(self, have: str) -> tuple[str, Any] | None:
        """The daemon's gate config when its version is not ``have`` (None: the same). Raises on any
        failure."""
        async with self._client().get("http://daemon/gate", params={"have": have}) as resp:
            if resp.status == 204:
                return None
            resp.raise_for_status()
            body = await resp.content.read(MAX_GATE_BYTES + 1)
        if len(body) > MAX_GATE_BYTES:
            raise ValueError("the gate config is too large")
        doc = json.loads(body)
        return str(doc["version"]), doc["config"]

    async def follow(self, endpoint: Endpoint) -> None:
        """Publish each newer gate config to ``endpoint``, for ever (failures logged, retried)."""
        version, failing = "", False
        while True:
            try:
                got = await self.gate(version)
                if got is not None:
                    version, config = got
                    endpoint.publish(config)
                    log.info("argus endpoint: took the daemon's gate %s", version)
                if failing:
                    log.info("argus endpoint: the daemon's link answers again")
                failing = False
            except Exception as exc:
                if not failing:
                    log.warning("argus endpoint: the daemon's link did not answer (%r): keeping the last gate", exc)
                failing = True
            await asyncio.sleep(GATE_POLL_S)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
