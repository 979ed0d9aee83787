"""Token usage read from the responses a model returns through the endpoint (no Ray, no I/O).

Non-streaming responses (chat, completion, embedding, score) are objects with a ``usage`` field.
Streamed ones are SSE strings ``data: {...}\\n\\n`` (or lists of them when Ray batches chunks);
vLLM sends a stream's usage only in a final chunk (``"choices": []``) and only when the request
asked for it, so :func:`ask_for_usage` asks on the client's behalf and :func:`scan` drops that
chunk again when the client did not ask: clients see what they asked for. A chunk is parsed only
when it holds ``"usage":`` with unescaped quotes, which generated text cannot (JSON escapes its
quotes): one ``json.loads`` per stream, not per chunk.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any, get_args

USAGE_MARK = '"usage":'
STREAMED_METHODS = ("chat", "completions")  # the calls whose streams can carry a usage chunk
_options_classes: dict[type, Any] = {}


def _options_class(body_type: type) -> Any:
    """The ``stream_options`` model class of a request class (vLLM's StreamOptions), else None."""
    if body_type not in _options_classes:
        found = None
        fields = getattr(body_type, "model_fields", {})
        if "stream_options" in fields:
            annotation = fields["stream_options"].annotation
            found = next((a for a in get_args(annotation) or (annotation,) if a is not type(None)), None)
        _options_classes[body_type] = found
    return _options_classes[body_type]


def ask_for_usage(body: Any, call_method: str) -> tuple[Any, bool]:
    """Return ``(body, strip)``: for a streamed chat or completion request that does not ask for
    the final usage chunk, a copy asking for it (``stream_options.include_usage``) and True (the
    chunk is to be dropped again); else ``body`` itself and False. Never raises for a body it
    cannot change (that stream's tokens go uncounted)."""
    if call_method not in STREAMED_METHODS or getattr(body, "stream", False) is not True:
        return body, False
    options = getattr(body, "stream_options", None)
    if options is not None and getattr(options, "include_usage", False):
        return body, False
    options_class = _options_class(type(body))
    if options_class is None:
        return body, False
    # continuous_usage_stats off: usage in every chunk would reach a client who asked for none.
    options = options_class(include_usage=True, continuous_usage_stats=False)
    return body.model_copy(update={"stream_options": options}), True


def _tokens(usage: Any) -> tuple[int, int] | None:
    """``(prompt_tokens, completion_tokens)`` of a usage object or dict (None: not one)."""
    if usage is None:
        return None
    if isinstance(usage, dict):
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    else:
        prompt, completion = getattr(usage, "prompt_tokens", None), getattr(usage, "completion_tokens", None)
    if not isinstance(prompt, int) and not isinstance(completion, int):
        return None
    return (
        max(prompt, 0) if isinstance(prompt, int) else 0,
        max(completion, 0) if isinstance(completion, int) else 0,
    )


def _scan_sse(text: str, strip: bool) -> tuple[tuple[int, int] | None, str | None]:
    found: tuple[int, int] | None = None
    kept: list[str] = []
    for event in text.split("\n\n"):
        if USAGE_MARK in event and event.startswith("data: "):
            try:
                chunk = json.loads(event[len("data: ") :])
            except ValueError:
                chunk = None
            if isinstance(chunk, dict):
                tokens = _tokens(chunk.get("usage"))
                if tokens is not None:
                    found = tokens
                    if strip and chunk.get("choices") == []:
                        continue
        kept.append(event)
    if len(kept) == 1 and not kept[0]:
        return found, None  # only the dropped chunk
    return found, "\n\n".join(kept)


def scan(item: Any, strip: bool) -> tuple[tuple[int, int] | None, Any]:
    """Return ``(usage, item)`` of one item of a model's response stream: usage is ``(prompt
    tokens, completion tokens)`` when the item reports it (the last one of a list), else None;
    item is what to pass on (None: nothing, it was only the usage chunk ``strip`` drops)."""
    if isinstance(item, str):
        if USAGE_MARK not in item:
            return None, item
        return _scan_sse(item, strip)
    if isinstance(item, list):
        found = None
        kept = []
        for part in item:
            tokens, part = scan(part, strip)
            found = tokens or found
            if part is not None:
                kept.append(part)
        return found, (kept or None)
    usage = item.get("usage") if isinstance(item, dict) else getattr(item, "usage", None)
    tokens = _tokens(usage)
    if tokens is not None and strip:
        choices = item.get("choices") if isinstance(item, dict) else getattr(item, "choices", None)
        if choices == []:
            return tokens, None
    return tokens, item


async def metered(
    stream: AsyncIterator[Any],
    strip: bool,
    on_start: Callable[[], None],
    on_usage: Callable[[int, int], None],
) -> AsyncIterator[Any]:
    """Pass ``stream`` on, calling ``on_start()`` at its first item (the request reached a model)
    and ``on_usage(prompt, completion)`` with the tokens each reported usage adds (reports may be
    cumulative, as vLLM's continuous usage stats are). Counted as they arrive, not at the end: a
    non-streaming response's stream is never exhausted (Ray answers from its first item).

    A stream that ends without any usage (the client hung up before vLLM's final usage chunk, or
    a request it could not be asked for) is charged one completion token per streamed chunk it
    passed on (vLLM streams about a token a chunk): hanging up early does not make a long
    generation free. Its prompt tokens stay uncounted.
    """
    started = usage_seen = False
    chunks = 0
    seen_prompt = seen_completion = 0
    try:
        async for item in stream:
            if not started:
                started = True
                on_start()
            if isinstance(item, str):
                chunks += 1
            elif isinstance(item, list):
                chunks += len(item)
            tokens, item = scan(item, strip)
            if tokens is not None:
                usage_seen = True
                prompt, completion = max(tokens[0] - seen_prompt, 0), max(tokens[1] - seen_completion, 0)
                seen_prompt, seen_completion = max(tokens[0], seen_prompt), max(tokens[1], seen_completion)
                if prompt or completion:
                    on_usage(prompt, completion)
            if item is not None:
                yield item
    finally:
        if chunks and not usage_seen:
            on_usage(0, chunks)
        close = getattr(stream, "aclose", None)
        if close is not None:
            await close()
