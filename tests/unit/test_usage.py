"""Token usage read from the responses passing the router (reconciler/endpoint/usage.py):
streamed SSE chunks (alone and batched in lists), non-streaming response objects, and the
``stream_options.include_usage`` the router adds for clients who did not ask for usage."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

from ray.llm._internal.serve.core.configs.openai_api_models import ChatCompletionRequest, CompletionRequest

from reconciler.endpoint import usage
from reconciler.endpoint.usage import ask_for_usage, metered, scan


def sse(chunk: dict[str, Any]) -> str:
    return f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n"


TEXT = sse({"id": "1", "choices": [{"index": 0, "delta": {"content": 'say "usage": {now}'}}]})
USAGE = sse({"id": "1", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}})


def test_a_chunk_without_usage_passes_untouched_and_unparsed(monkeypatch: Any) -> None:
    def no_parse(_: str) -> Any:
        raise AssertionError("parsed")

    monkeypatch.setattr(usage.json, "loads", no_parse)
    assert '\\"usage\\":' in TEXT  # generated text holds the mark only with escaped quotes
    assert scan(TEXT, True) == (None, TEXT)
    assert scan("data: [DONE]\n\n", True) == (None, "data: [DONE]\n\n")


def test_the_usage_chunk_is_read_and_dropped_unless_the_client_asked_for_it() -> None:
    assert scan(USAGE, True) == ((7, 3), None)
    assert scan(USAGE, False) == ((7, 3), USAGE)
    assert scan(TEXT + USAGE, True) == ((7, 3), TEXT)  # one string holding two events
    assert scan([TEXT, USAGE], True) == ((7, 3), [TEXT])  # a batch of chunks
    assert scan([USAGE], True) == ((7, 3), None)  # nothing left to send: no empty batch
    with_choices = sse({"choices": [{"delta": {}}], "usage": {"prompt_tokens": 7, "completion_tokens": 1}})
    assert scan(with_choices, True) == ((7, 1), with_choices)  # continuous stats: kept, read


def test_non_streaming_responses_carry_their_usage() -> None:
    chat = SimpleNamespace(choices=[1], usage=SimpleNamespace(prompt_tokens=12, completion_tokens=4))
    assert scan(chat, True) == ((12, 4), chat)
    embedding = SimpleNamespace(data=[], usage=SimpleNamespace(prompt_tokens=9, completion_tokens=None))
    assert scan(embedding, False) == ((9, 0), embedding)
    assert scan({"usage": {"prompt_tokens": 2, "completion_tokens": 2}}, False)[0] == (2, 2)
    assert scan(SimpleNamespace(tokens=[1]), False) == (None, scan(SimpleNamespace(tokens=[1]), False)[1])
    assert scan(None, False) == (None, None)


def test_a_streamed_request_asks_for_usage_on_the_clients_behalf() -> None:
    messages = [{"role": "user", "content": "hi"}]
    plain = ChatCompletionRequest(model="m", messages=messages, stream=True)
    asked, strip = ask_for_usage(plain, "chat")
    assert strip and asked.stream_options.include_usage and not asked.stream_options.continuous_usage_stats
    assert plain.stream_options is None  # a copy
    own = ChatCompletionRequest(model="m", messages=messages, stream=True, stream_options={"include_usage": True})
    assert ask_for_usage(own, "chat") == (own, False)
    declined = CompletionRequest(model="m", prompt="x", stream=True, stream_options={"include_usage": False})
    asked, strip = ask_for_usage(declined, "completions")
    assert strip and asked.stream_options.include_usage
    unary = ChatCompletionRequest(model="m", messages=messages)
    assert ask_for_usage(unary, "chat") == (unary, False)  # vLLM refuses stream_options without stream
    assert ask_for_usage(plain, "embeddings") == (plain, False)


def test_metered_counts_the_request_once_and_cumulative_usage_as_increments() -> None:
    events: list[Any] = []
    closed: list[bool] = []

    async def model() -> Any:
        try:
            yield TEXT
            yield sse({"choices": [{"delta": {}}], "usage": {"prompt_tokens": 5, "completion_tokens": 1}})
            yield [TEXT, sse({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 4}})]
        finally:
            closed.append(True)

    async def scenario() -> list[Any]:
        out = metered(model(), True, lambda: events.append("start"), lambda p, c: events.append((p, c)))
        return [item async for item in out]

    items = asyncio.run(scenario())
    assert events == ["start", (5, 1), (0, 3)]
    assert items[0] == TEXT and items[-1] == [TEXT] and closed == [True]


def test_a_stream_left_early_counts_what_it_saw_and_closes_the_models_stream() -> None:
    events: list[Any] = []
    closed: list[bool] = []

    async def model() -> Any:
        try:
            yield SimpleNamespace(choices=[1], usage=SimpleNamespace(prompt_tokens=8, completion_tokens=2))
            yield TEXT
        finally:
            closed.append(True)

    async def scenario() -> None:
        out = metered(model(), False, lambda: events.append("start"), lambda p, c: events.append((p, c)))
        await out.__anext__()  # Ray answers a non-streaming request from its first item
        assert events == ["start", (8, 2)]  # counted at once, not when the stream ends
        await out.aclose()

    asyncio.run(scenario())
    assert closed == [True]


def test_a_stream_that_ends_without_usage_is_charged_a_token_per_chunk() -> None:
    """The client hung up before vLLM's final usage chunk: not free."""
    events: list[Any] = []

    async def model() -> Any:
        yield TEXT
        yield [TEXT, TEXT]
        yield TEXT

    async def scenario() -> None:
        out = metered(model(), True, lambda: events.append("start"), lambda p, c: events.append((p, c)))
        await out.__anext__()
        await out.__anext__()
        await out.aclose()  # what the client's hang-up does to the stream

    asyncio.run(scenario())
    assert events == ["start", (0, 3)]
