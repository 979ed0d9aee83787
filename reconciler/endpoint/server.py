"""argus's OpenAI endpoint: the one place clients call, in argus's own process. I/O.

Ray trusts every job as an administrator: a job can deploy a Serve application at any route,
replace any application, call any deployment handle. So the endpoint's decisions (whose key a
request carries, whether she may call the model, her rate limits, what she used) are made here,
in a process no job can deploy, replace, call or read (the daemon's, or ``argus endpoint``'s own
service), and what reaches Ray carries none of it: a request is forwarded to Ray Serve's own
proxy (``serving.internal_http_port``, on the cluster's internal network) with its body and
``Content-Type``/``Accept`` only: never the caller's ``Authorization``, cookies or any other
header, and no argus credential (the Ray-side router authenticates nobody).

Routes (the OpenAI API Ray Serve LLM's ingress serves): ``GET /v1/models`` (filtered to what the
caller may call), ``GET /v1/models/<name>``, and the JSON calls of FORWARDED (completions, chat,
embeddings, score, tokenize, detokenize). Everything else is a 404. Answers: 401 without a valid
key, 404 for a model the caller may not call exactly as for one that does not exist, 429 with
``Retry-After`` over a limit, 413 for a body over MAX_BODY_BYTES, 503 while the daemon has not
handed the endpoint its first gate config or when Serve does not answer. Error bodies have the
OpenAI shape (``{"error": {"message", "type", "param", "code"}}``).

Usage: every forwarded request is counted with the tokens of its response's ``usage``; a streamed
chat or completion is asked for its usage chunk (``stream_options.include_usage``), which is
dropped again when the client did not ask for it (reconciler/endpoint/usage.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from aiohttp import web

from reconciler.endpoint.gate import Caller, Gate, Unauthorized, parse_gate
from reconciler.endpoint.limits import OPEN_USER
from reconciler.endpoint.meter import MeterClient, RateLimitExceeded, SyncLink, usage_cap
from reconciler.endpoint.usage import STREAMED_METHODS, _tokens

log = logging.getLogger("argus")

FORWARDED = {
    "/v1/completions": "completions",
    "/v1/chat/completions": "chat",
    "/v1/embeddings": "embeddings",
    "/v1/score": "score",
    "/tokenize": "tokenize",
    "/detokenize": "detokenize",
}
MAX_BODY_BYTES = 32 * 1024 * 1024  # a request body past this is a 413 (prompts, embeddings' inputs)
MAX_ANSWER_BYTES = 256 * 1024 * 1024  # a non-streamed answer past this is cut off (a 502)
MAX_LISTING_BYTES = 64 * 1024 * 1024  # /v1/models' answer from Serve
MAX_REQUEST_ID_CHARS = 128  # an X-Request-Id longer than this is not passed on
CONNECT_TIMEOUT_S = 5.0  # to Serve's proxy
READ_TIMEOUT_S = 600.0  # between two chunks of an answer (a long prompt's first token included)
UPSTREAM_CONNECTIONS = 1024  # open connections to Serve's proxy at once
MAX_PROBLEMS_LOGGED = 10  # lines a malformed gate config logs


def error_body(status: int, message: str, kind: str) -> dict[str, Any]:
    """An OpenAI-shaped error document."""
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


def _error(status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(error_body(status, message, kind), status=status, headers=headers)


def _not_found(model: str) -> web.Response:
    return _error(404, f"The model `{model}` does not exist or is not ready.", "ModelNotFound")


def ask_for_usage(body: dict[str, Any], method: str) -> bool:
    """Ask a streamed chat or completion for its final usage chunk when the client did not;
    returns whether that chunk is to be dropped again (``body`` is changed in place)."""
    if method not in STREAMED_METHODS or body.get("stream") is not True:
        return False
    options = body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return False
    # continuous_usage_stats off: usage in every chunk would reach a client who asked for none.
    body["stream_options"] = {"include_usage": True, "continuous_usage_stats": False}
    return True


async def sse_events(chunks: AsyncIterator[bytes]) -> AsyncIterator[str]:
    """Whole server-sent events of a byte stream, as text (several events joined when they came in
    one read; a usage event is never split across two items). What follows the last blank line
    is passed on at the end as it is."""
    pending = b""
    async for chunk in chunks:
        pending += chunk
        cut = pending.rfind(b"\n\n")
        if cut < 0:
            continue
        whole, pending = pending[: cut + 2], pending[cut + 2 :]
        yield whole.decode("utf-8", "replace")
    if pending:
        yield pending.decode("utf-8", "replace")


class Endpoint:
    """The endpoint of one cluster: forwards to Serve's proxy at ``upstream`` (``http://host:port``),
    syncs its counts through ``link`` (None: limits in this process alone, usage nowhere).
    :meth:`publish` (any thread) hands it the daemon's gate config."""

    def __init__(self, upstream: str, link: SyncLink | None) -> None:
        self.upstream = upstream.rstrip("/")
        self.meter = MeterClient(link)
        self._gate: Gate | None = None  # None until the first publish: every request is a 503
        self._problems: list[str] = []
        self._session: aiohttp.ClientSession | None = None

    def publish(self, config: Any) -> None:
        """Take a new gate config (reconciler/endpoint/gate.py); problems are logged once each.
        Thread-safe: the endpoint's loop sees the old gate or the new one, never half of one."""
        gate, problems = parse_gate(config)
        if problems != self._problems:
            for problem in problems[:MAX_PROBLEMS_LOGGED]:
                log.warning("argus endpoint: %s", problem)
            self._problems = problems
        self._gate = gate

    @property
    def ready(self) -> bool:
        return self._gate is not None

    def application(self) -> web.Application:
        """The aiohttp application (one catch-all route: the paths are dispatched here)."""
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_route("*", "/{path:.*}", self.handle)
        app.on_cleanup.append(self._close)
        return app

    async def _close(self, _app: web.Application) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        await self.meter.close()

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=UPSTREAM_CONNECTIONS, ttl_dns_cache=60),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S, sock_read=READ_TIMEOUT_S),
                auto_decompress=False,
                skip_auto_headers=("User-Agent",),
            )
        return self._session

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Answer one request (see the module docstring)."""
        gate = self._gate
        if gate is None:
            return _error(503, "The endpoint is starting; retry.", "ServiceUnavailable")
        path = request.path
        known = path in FORWARDED or path == "/v1/models" or path.startswith("/v1/models/")
        if not known:
            return _error(404, f"No route {path[:200]!r}.", "NotFound")
        try:
            caller = gate.caller(request.headers.get("Authorization"))
        except Unauthorized as exc:
            return _error(401, str(exc), "InvalidApiKey")
        if path == "/v1/models":
            if request.method != "GET":
                return _error(405, "Method not allowed.", "MethodNotAllowed")
            return await self._models(gate, caller, request)
        if path.startswith("/v1/models/"):
            if request.method != "GET":
                return _error(405, "Method not allowed.", "MethodNotAllowed")
            name = path[len("/v1/models/") :].replace("--", "/")  # as Ray's ingress reads it
            if not gate.visible(caller, name):
                return _not_found(name)
            return await self._forward_plain(request)
        if request.method != "POST":
            return _error(405, "Method not allowed.", "MethodNotAllowed")
        return await self._call(gate, caller, request, FORWARDED[path])

    def _headers(self, request: web.Request, json_body: bool) -> dict[str, str]:
        """What of a client's headers reaches Serve: the content's type and what it accepts, and a
        short request id. Never ``Authorization``, cookies or anything else."""
        headers = {"Accept": request.headers.get("Accept", "*/*")[:200]}
        if json_body:
            headers["Content-Type"] = "application/json"
        rid = request.headers.get("X-Request-Id")
        if rid and len(rid) <= MAX_REQUEST_ID_CHARS and rid.isprintable():
            headers["X-Request-Id"] = rid
        return headers

    async def _models(self, gate: Gate, caller: Caller | None, request: web.Request) -> web.StreamResponse:
        try:
            async with self._client().get(self.upstream + "/v1/models", headers=self._headers(request, False)) as up:
                raw = await up.content.read(MAX_LISTING_BYTES + 1)
                status = up.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            return _unavailable(exc)
        if status != 200 or len(raw) > MAX_LISTING_BYTES:
            if caller is None:
                return web.Response(body=raw[:MAX_LISTING_BYTES], status=status, content_type="application/json")
            return web.json_response({"object": "list", "data": []})  # nothing of Serve's error reaches a caller
        try:
            listing = json.loads(raw)
            data = listing["data"]
            if not isinstance(data, list):
                raise TypeError(data)
        except (ValueError, KeyError, TypeError):
            return _error(502, "Serve's model listing is not one.", "BadGateway")
        if caller is not None:
            listing["data"] = [c for c in data if isinstance(c, dict) and gate.visible(caller, str(c.get("id", "")))]
        return web.json_response(listing)

    async def _call(self, gate: Gate, caller: Caller | None, request: web.Request, method: str) -> web.StreamResponse:
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _error(413, f"The request body is over {MAX_BODY_BYTES} bytes.", "RequestTooLarge")
        try:
            body = json.loads(raw)
        except ValueError:
            return _error(400, "The request body is not JSON.", "BadRequest")
        if not isinstance(body, dict):
            return _error(400, "The request body is not a JSON object.", "BadRequest")
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            return _error(400, "`model` is not a string.", "BadRequest")
        if model is None and caller is not None:
            # Serve's default picks the only model or lists them all in its error: neither may
            # happen for a caller who may not see them.
            return _error(400, "The `model` field is required.", "BadRequest")
        if model is not None and not gate.visible(caller, model):
            return _not_found(model)
        subjects: list[str] = []
        if caller is not None:
            if self.meter.stale(gate.limits):
                await self.meter.freshen()
            try:
                subjects = self.meter.admit(gate.limits, caller.user, caller.team)
            except RateLimitExceeded as exc:
                return _error(429, exc.message, "RateLimitExceeded", {"Retry-After": str(exc.retry_after)})
        cap = usage_cap(body, len(raw))
        strip = ask_for_usage(body, method)
        user = caller.user if caller is not None else OPEN_USER
        app = gate.app_of(model)
        data = json.dumps(body).encode() if strip else raw
        try:
            up = await self._client().post(
                self.upstream + request.path, data=data, headers=self._headers(request, True)
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            return _unavailable(exc)
        if up.headers.get("Content-Type", "").startswith("text/event-stream"):
            try:
                return await self._stream(request, up, strip, user, app, subjects, cap)
            finally:
                up.release()
        try:
            answer = await up.content.read(MAX_ANSWER_BYTES + 1)
        except (aiohttp.ClientError, TimeoutError) as exc:
            return _unavailable(exc)
        finally:
            up.release()
        if len(answer) > MAX_ANSWER_BYTES:
            return _error(502, "The model's answer is too large.", "BadGateway")
        out = web.Response(body=answer, status=up.status, headers=_answer_headers(up))
        try:  # sent here, not by aiohttp after the handler: what the client never got is not billed
            await out.prepare(request)
            await out.write_eof()
        except ConnectionResetError:  # the client left first (aiohttp's ClientConnectionResetError too)
            return out
        self._count_answer(answer, up.status, user, app, subjects, cap)
        return out

    def _count_answer(
        self, answer: bytes, status: int, user: str, app: str, subjects: list[str], cap: tuple[int, int]
    ) -> None:
        """Count a non-streamed answer that reached a model: one request and its usage's tokens (at
        most ``cap``: an answer is data)."""
        if not 200 <= status < 300:
            return  # refused or failed (Serve's 404, a bad request, an engine error): nothing served
        tokens = None
        if b'"usage"' in answer:
            try:
                doc = json.loads(answer)
            except ValueError:
                doc = None
            tokens = _tokens(doc.get("usage")) if isinstance(doc, dict) else None
        self.meter.count(user, app, subjects, *(tokens or (0, 0)), cap=cap)

    async def _stream(
        self,
        request: web.Request,
        up: aiohttp.ClientResponse,
        strip: bool,
        user: str,
        app: str,
        subjects: list[str],
        cap: tuple[int, int],
    ) -> web.StreamResponse:
        """Pass a streamed answer on. Once its first bytes are sent it is the client's 200: a client
        that leaves (the openai client closes at ``[DONE]``) ends it quietly, and so does Serve
        breaking off mid-stream (logged); metered() charges what was passed on either way."""
        out = web.StreamResponse(status=up.status, headers=_answer_headers(up))
        await out.prepare(request)
        events = self.meter.metered(sse_events(up.content.iter_any()), strip, user, app, subjects, cap)
        try:
            async for text in events:
                await out.write(text.encode())
            await out.write_eof()
        except ConnectionResetError:  # the client left (aiohttp's ClientConnectionResetError is one too)
            pass
        except (aiohttp.ClientError, TimeoutError) as exc:  # Serve broke off: nothing more to send
            log.warning("argus endpoint: a streamed answer from Serve broke off: %r", exc)
        finally:
            await events.aclose()  # type: ignore[attr-defined]
        return out

    async def _forward_plain(self, request: web.Request) -> web.StreamResponse:
        try:
            async with self._client().get(self.upstream + request.path, headers=self._headers(request, False)) as up:
                raw = await up.content.read(MAX_LISTING_BYTES + 1)
                return web.Response(body=raw[:MAX_LISTING_BYTES], status=up.status, headers=_answer_headers(up))
        except (aiohttp.ClientError, TimeoutError) as exc:
            return _unavailable(exc)


def _answer_headers(up: aiohttp.ClientResponse) -> dict[str, str]:
    """What of Serve's answer headers reaches the client: its content type and request id."""
    out = {"Content-Type": up.headers.get("Content-Type", "application/json")}
    rid = up.headers.get("X-Request-Id")
    if rid and len(rid) <= MAX_REQUEST_ID_CHARS:
        out["X-Request-Id"] = rid
    return out


def _unavailable(exc: BaseException) -> web.Response:
    log.warning("argus endpoint: Serve's proxy did not answer: %r", exc)
    return _error(503, "The model server is not reachable right now; retry.", "ServiceUnavailable")
