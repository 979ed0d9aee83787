"""When a router replica reads Serve on a request's behalf (reconciler/serve_apps/router.py).

The router runs several replicas, each with its own view of which tabled models run. These tests
drive two ``ArgusIngress`` objects (the class Serve wraps, not a Serve replica) against a stand-in
for ``serve.status()`` and the model replica's ``llm_config()``, so the order of reads and model
start-ups can be set exactly; tests/e2e/test_model_alias.py sends the same requests through a
real Serve with two router replicas.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from ray.llm._internal.serve.core.configs.openai_api_models import OpenAIHTTPException

from reconciler.serve_apps import router
from reconciler.serve_apps.router import MISS_REFRESH_MIN_S, ArgusIngress

APP, MODEL_ID, ALIAS = "argus--ivy--chat", "ivy-202612012216-chat", "ivy-chat"
DEPLOYMENT = f"LLMServer:{MODEL_ID}"
TABLE = {"models": [[APP, DEPLOYMENT, MODEL_ID, ""]]}


@dataclass
class FakeServe:
    """``serve.status()`` and ``serve.get_deployment_handle()`` for one model application.

    ``status()`` reads whether the model runs when it is called and answers ``delay_s`` later,
    as the controller does; ``reads`` counts the calls.
    """

    running: bool = False
    delay_s: float = 0.0
    reads: int = 0
    started: threading.Event = field(default_factory=threading.Event)

    def status(self) -> Any:
        self.reads += 1
        running = self.running  # what the controller knew when asked
        self.started.set()
        time.sleep(self.delay_s)
        if not running:
            return SimpleNamespace(applications={})
        deployment = SimpleNamespace(replica_states={"RUNNING": 1})
        app = SimpleNamespace(deployments={DEPLOYMENT: deployment}, last_deployed_time_s=1.0)
        return SimpleNamespace(applications={APP: app})

    def get_deployment_handle(self, deployment: str, app_name: str) -> Any:
        config = SimpleNamespace(model_id=MODEL_ID, input_modality="text", max_request_context_length=256)

        async def llm_config() -> Any:
            return config

        return SimpleNamespace(llm_config=SimpleNamespace(remote=llm_config))


@pytest.fixture
def serve(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeServe]:
    fake = FakeServe()
    monkeypatch.setattr(router, "serve", fake)
    yield fake


async def replica(table: Any = TABLE) -> ArgusIngress:
    """A router replica that has taken ``table`` and finished its first read of Serve."""
    return await settled(ArgusIngress(), table)


async def settled(ingress: ArgusIngress, table: Any) -> ArgusIngress:
    """``ingress`` once it has taken ``table`` and finished a read of Serve, its background refresh
    stopped (each test makes every further read itself)."""
    await ingress.reconfigure(table)
    assert ingress._task is not None
    ingress._task.cancel()
    await asyncio.gather(ingress._task, return_exceptions=True)
    await ingress._read_since(time.monotonic())
    return ingress


async def card(ingress: ArgusIngress, name: str) -> str | None:
    """``/v1/models/<name>``: the card's id, or None for a 404."""
    try:
        return str((await ingress.model_data(name)).id)
    except OpenAIHTTPException as exc:
        assert exc.status_code == 404
        return None


def test_a_model_one_replica_lists_is_no_404_from_the_other(serve: FakeServe) -> None:
    """The failure seen in CI: replica A listed the new model; replica B, which had read Serve
    while the model was still starting, answered ``/v1/models/ivy-chat`` 404 without reading again."""

    async def scenario() -> None:
        a, b = await replica(), await replica()
        assert await card(a, MODEL_ID) is None and await card(b, ALIAS) is None  # still starting
        serve.running = True
        await asyncio.sleep(MISS_REFRESH_MIN_S)
        listing = await a.models()
        assert [m.id for m in listing.data] == [MODEL_ID, ALIAS]
        # B's last read said "not running": /v1/models/<name> must read again, not answer from it.
        assert await card(b, ALIAS) == ALIAS
        assert await card(b, MODEL_ID) == MODEL_ID
        assert await b._get_model_id(MODEL_ID) == MODEL_ID  # the completion path asks the same

    asyncio.run(scenario())


def test_a_request_during_a_read_waits_for_a_read_that_started_after_it(serve: FakeServe) -> None:
    """A read in flight began before the model ran; a request that arrives meanwhile is answered
    from the next read, not from that one."""

    async def scenario() -> None:
        b = await replica()
        serve.delay_s, serve.started = 0.3, threading.Event()
        in_flight = asyncio.ensure_future(b._read_since(time.monotonic()))  # as the background refresh does
        await asyncio.to_thread(serve.started.wait, 5)
        serve.running = True  # the model starts while that read is on its way back
        assert await b._get_model_id(MODEL_ID) == MODEL_ID
        await in_flight

    asyncio.run(scenario())


def test_requests_for_a_model_that_never_starts_share_few_reads_and_get_a_404(serve: FakeServe) -> None:
    """A flood of requests for a tabled model that is not running costs Serve a read every
    MISS_REFRESH_MIN_S at most, all of them answered 404 within about one such period; a name the
    table does not hold costs no read at all."""

    async def scenario() -> None:
        b = await replica()
        before = serve.reads
        start = time.monotonic()
        answers = await asyncio.gather(*(card(b, MODEL_ID) for _ in range(200)))
        took = time.monotonic() - start
        assert answers == [None] * 200
        assert serve.reads - before <= 2, serve.reads - before
        assert took < 3 * MISS_REFRESH_MIN_S + 1.0, took
        before = serve.reads
        assert await asyncio.gather(*(card(b, f"mallory-{i}") for i in range(200))) == [None] * 200
        assert serve.reads == before

    asyncio.run(scenario())


def test_a_failed_read_is_a_503_for_those_waiting_and_the_next_request_reads_again(
    serve: FakeServe, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While Serve's controller does not answer, requests for a tabled model this replica cannot
    route share one failed read each period and get a 503 (the model may run: clients retry), not
    a queue of one read per request; once Serve answers, the next request is routed."""

    async def scenario() -> None:
        b = await replica()
        real, failing = serve.status, True
        calls = 0

        def flaky() -> Any:
            nonlocal calls
            calls += 1
            if failing:
                raise ConnectionError("controller unreachable")
            return real()

        monkeypatch.setattr(serve, "status", flaky)
        serve.running = True
        start = time.monotonic()
        answers = await asyncio.gather(*(b._get_model_id(MODEL_ID) for _ in range(100)), return_exceptions=True)
        assert time.monotonic() - start < 3 * MISS_REFRESH_MIN_S + 1.0
        assert all(isinstance(a, OpenAIHTTPException) and a.status_code == 503 for a in answers), answers[:3]
        assert calls <= 2, calls
        failing = False
        assert await b._get_model_id(MODEL_ID) == MODEL_ID
        assert await card(b, ALIAS) == ALIAS

    asyncio.run(scenario())


def test_a_client_that_hangs_up_does_not_cancel_the_read_others_wait_for(serve: FakeServe) -> None:
    """Requests share one read; cancelling any of them (a client disconnect), before or during
    the read, leaves it running: the others are answered from it, not with a 503."""

    async def scenario() -> None:
        b = await replica()
        serve.delay_s, serve.started, serve.running = 0.3, threading.Event(), True
        before = serve.reads
        waiting = [asyncio.ensure_future(b._get_model_id(MODEL_ID)) for _ in range(10)]
        await asyncio.sleep(0.05)
        waiting[0].cancel()  # while the read waits for its turn
        await asyncio.to_thread(serve.started.wait, 5)
        waiting[1].cancel()  # while it asks Serve
        answers = await asyncio.gather(*waiting, return_exceptions=True)
        assert all(isinstance(a, asyncio.CancelledError) for a in answers[:2])
        assert answers[2:] == [MODEL_ID] * 8
        assert serve.reads - before == 1

    asyncio.run(scenario())


def test_requests_waiting_for_a_read_are_bounded_in_number_and_time(
    serve: FakeServe, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past MAX_WAITING waiting requests a request for a model this replica cannot route is a
    503 at once, and none waits longer than MISS_WAIT_S for a slow controller: a flood for models
    that do not run cannot hold the router's request slots."""
    monkeypatch.setattr(router, "MAX_WAITING", 5)
    monkeypatch.setattr(router, "MISS_WAIT_S", 0.5)

    async def scenario() -> None:
        b = await replica()
        serve.delay_s = 1.5  # the controller answers slowly
        start = time.monotonic()
        answers = await asyncio.gather(*(b.model_data(MODEL_ID) for _ in range(20)), return_exceptions=True)
        took = time.monotonic() - start
        assert all(isinstance(a, OpenAIHTTPException) and a.status_code == 503 for a in answers), answers[:3]
        assert b._waiting == 0
        assert took < MISS_REFRESH_MIN_S + 0.5 + 1.0, took
        serve.delay_s, serve.running = 0.0, True
        await asyncio.sleep(1.5 + MISS_REFRESH_MIN_S)  # the slow read ends; the next is due
        assert await card(b, MODEL_ID) == MODEL_ID

    asyncio.run(scenario())


def test_a_reconfigure_sent_through_a_deployment_handle_is_refused(serve: FakeServe) -> None:
    """Any job can call ``handle.reconfigure.remote({"models": []})`` on the router's replicas: that is
    a request (Serve sets its request context) and changes nothing; Serve's own call still does."""
    import ray.serve.context as serve_context

    async def scenario() -> None:
        ingress = await replica()
        serve.running = True
        await ingress._read_since(time.monotonic())
        assert await card(ingress, ALIAS) == ALIAS

        async def forged() -> None:
            serve_context._serve_request_context.set(serve_context._RequestContext(request_id="job-1"))
            await ingress.reconfigure({"models": []})

        await asyncio.create_task(forged())  # its own context, as a request's
        assert await card(ingress, ALIAS) == ALIAS, "a job's table was taken"
        await ingress.reconfigure({"models": []})  # the controller's: taken
        assert await card(ingress, ALIAS) is None

    asyncio.run(scenario())
