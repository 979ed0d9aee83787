"""The daemon's private link to ``argus endpoint`` processes (reconciler/endpoint/link.py), over a real
Unix socket: an endpoint takes each new gate, a restarted daemon's gates included (its count starts
again), and its counts reach the daemon's meter."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from reconciler.endpoint.hub import EndpointHub
from reconciler.endpoint.link import LinkClient, serve_link
from reconciler.endpoint.meter import Meter
from reconciler.endpoint.server import Endpoint
from reconciler.spec.types import ClusterSpec

KEYS_A = {"models": [], "keys": {"a" * 64: "alice"}}
KEYS_B = {"models": [], "keys": {"b" * 64: "bob"}}


def test_an_endpoint_follows_the_daemons_gates_across_a_daemon_restart(tmp_path: Path) -> None:
    async def scenario() -> None:
        path = str(tmp_path / "daemon.sock")
        first = EndpointHub(lambda _c: "http://serve:8001", listen=None, link=path)
        first.publish(KEYS_A, ClusterSpec())
        first.publish({**KEYS_A, "teams": {}}, ClusterSpec())  # its count: 2
        runner = await serve_link(first.meter, first.gate, path)
        endpoint = Endpoint("http://serve:8001", None)
        client = LinkClient(path)
        follow = asyncio.ensure_future(client.follow(endpoint))
        try:
            await asyncio.sleep(0.5)
            assert endpoint._gate is not None and endpoint._gate.keys == {"a" * 64: "alice"}
            await runner.cleanup()
            # The daemon restarts: a new hub counts from 1 again, with other keys.
            again = EndpointHub(lambda _c: "http://serve:8001", listen=None, link=path)
            again.publish(KEYS_B, ClusterSpec())
            assert again.gate()[0].endswith(".1")
            runner = await serve_link(again.meter, again.gate, path)
            for _ in range(40):
                if endpoint._gate.keys == {"b" * 64: "bob"}:
                    break
                await asyncio.sleep(0.1)
            assert endpoint._gate.keys == {"b" * 64: "bob"}, "a restarted daemon's gate was not taken"
            answer: dict[str, Any] = await client.sync({"s": {"u:bob": [1, 5]}, "u": []})
            assert answer["w"]["u:bob"][2:] == [1, 0, 5]
            assert await client.gate(again.gate()[0]) is None  # the same version: nothing sent
        finally:
            follow.cancel()
            await client.close()
            await runner.cleanup()

    asyncio.run(scenario())


def test_a_malformed_sync_is_refused_and_the_meter_unchanged(tmp_path: Path) -> None:
    async def scenario() -> None:
        path = str(tmp_path / "daemon.sock")
        meter = Meter()
        runner = await serve_link(meter, lambda: ("e.1", {"models": []}), path)
        client = LinkClient(path)
        try:
            answer = await client.sync({"s": {"u:bob": ["x", -5]}, "u": "junk"})
            assert "u:bob" not in answer["w"]
            assert meter.usage()["rows"] == []
        finally:
            await client.close()
            await runner.cleanup()

    asyncio.run(scenario())
