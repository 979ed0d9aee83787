"""The one OpenAI-compatible router application: ``reconciler.serve_apps.router:build_router``.

It subclasses Ray Serve LLM's ``OpenAiIngress`` but starts with no models. The daemon pushes
the model table in the router deployment's ``user_config`` (built by
``reconciler.builders.serve.router_app_config`` from the applications it deploys): one entry
``[app name, deployment, model id, alias]`` per argus model application (alias ``""``: the
default one). Serve hands a changed
``user_config`` to ``reconfigure()`` on every replica in place (no restart, no dropped request),
so the router learns of a model when the daemon deploys it and forgets it when the daemon deletes
it, and adding a model never touches another model's replica.

The table says what may be routed; ``serve.status()`` says what can be: an entry is routed once
its application runs a replica of the named deployment whose ``llm_config()`` reports the named
model id. Serve's status is read when the table changes, on a request for a name the table holds
but that is not routable yet, and by a slow safety refresh (``refresh_s``, default
SAFETY_REFRESH_S) that drops applications removed behind the daemon's back. A name the table does
not hold is a 404 at once: unknown names cost no Serve call.

The router runs several replicas, and each learns of a model's replica by its own read. A request
(a completion, or ``/v1/models/<name>``) for a tabled name its replica cannot route yet therefore
waits for a read that *started after the request arrived* before it is answered 404: a model one
replica just listed in ``/v1/models`` is never a 404 from another. One read runs at a time, at
least MISS_REFRESH_MIN_S after the last one ended, shared by every request waiting for it, so a
flood of requests for a model that is still starting (or failed) costs Serve about two reads a
second, not one per request. Such a request is a 503 (clients retry it) when the read failed,
when it waited MISS_WAIT_S, or when MAX_WAITING requests of its replica wait already: a flood
for models that do not run yet cannot hold the router's request slots that running models need.

Each model is also routable under its stable alias: the ``served_name:`` of its file (carried
in ``llm_config.experimental_configs["argus_alias"]``) or else ``<user>-<name>``, derived from
the application name. The loader keeps aliases unique; should two running applications still
claim one (an INVALID file keeps its old application), the earlier-deployed one keeps it, and a
dated model id always wins over an alias. A request by alias reaches vLLM under the dated id
(vLLM only knows that one), so responses name the dated id. A model id two applications claim
is routed to the earlier-deployed one.

Nothing here decides for users. Keys, access rules, rate limits and usage are argus's endpoint's
(reconciler/endpoint), in argus's own processes: any job can call this application, replace it
or read its config, so it holds no secret and authenticates nobody, and it is reached only on
Serve's internal port (``serving.internal_http_port``), where the endpoint forwards requests
without any caller's credential.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any

import ray.serve.context as serve_context
from fastapi import status as http_status
from ray import serve
from ray.llm._internal.serve.core.configs.openai_api_models import OpenAIHTTPException, to_model_metadata
from ray.llm._internal.serve.core.ingress.ingress import DEFAULT_ENDPOINTS, init
from ray.llm._internal.serve.utils.server_utils import replace_prefix
from ray.serve.deployment import Application
from ray.serve.handle import DeploymentHandle
from ray.serve.llm.ingress import OpenAiIngress, make_fastapi_ingress

from reconciler.serve_apps.table import SAFETY_REFRESH_S, Entry, parse_table

logger = logging.getLogger("ray.serve")

ROUTER_APP = "argus-router"
LLM_DEPLOYMENT_PREFIX = "LLMServer:"
MISS_REFRESH_MIN_S = 0.5  # a read of Serve starts at least this long after the last one ended
MISS_WAIT_S = 5.0  # a request waits this long at most for a read of Serve, then it is a 503
MAX_WAITING = 256  # requests of one replica waiting for a read at once; more are a 503 at once
LLM_CONFIG_TIMEOUT_S = 10.0  # bound on asking a new model's replica for its LLMConfig
ALIAS_KEY = "argus_alias"  # in LLMConfig.experimental_configs (reconciler/builders/serve.py)


@dataclass(frozen=True)
class Route:
    """A tabled application seen running: what a request for its names is sent to."""

    entry: Entry
    deployed_at: float
    handle: DeploymentHandle
    card: Any  # ModelCard of the dated id
    alias_card: Any  # ModelCard of the alias, or None


def claim_names(routes: Iterable[Route]) -> tuple[dict[str, Route], dict[str, Route], set[str]]:
    """Return ``(model id -> route, alias -> route, refused app names)``. Pure.

    Earliest-deployed first (ties by app name): a model id or alias two routes claim belongs
    to the earlier one; a dated id always wins over an alias.
    """
    ordered = sorted(routes, key=lambda r: (r.deployed_at, r.entry.app))
    ids: dict[str, Route] = {}
    refused: set[str] = set()
    for route in ordered:
        if route.entry.model_id in ids:
            refused.add(route.entry.app)
        else:
            ids[route.entry.model_id] = route
    aliases: dict[str, Route] = {}
    for route in ordered:
        alias = route.entry.alias
        if alias is None or route.entry.app in refused:
            continue
        if alias in ids or alias in aliases:
            refused.add(route.entry.app)
            continue
        aliases[alias] = route
    return ids, aliases, refused


class ModelNotFound(OpenAIHTTPException):
    """Unknown model id; Ray's error middleware reports the class name as the error type."""


class ArgusIngress(OpenAiIngress):
    """``OpenAiIngress`` whose model handles and cards follow the table the daemon pushes."""

    def __init__(self) -> None:
        super().__init__(llm_deployments={}, model_cards={})
        self._table: dict[str, Entry] = {}  # app name -> entry (the last user_config)
        self._tabled_names: set[str] = set()  # every model id and alias the table holds
        self._routes: dict[str, Route] = {}  # app name -> route, for tabled apps seen running
        self._aliases: dict[str, str] = {}  # alias -> model id
        self._alias_cards: dict[str, Any] = {}  # alias -> ModelCard
        self._refused: set[str] = set()  # apps whose model id or alias another app holds
        self._app_of: dict[str, str] = {}  # routed model id or alias -> app name
        self._tabled_apps: dict[str, set[str]] = {}  # every tabled model id and alias -> the apps claiming it
        self._refresh_s = SAFETY_REFRESH_S
        self._read: _Read | None = None  # the last read of Serve started (or waiting for its turn)
        self._read_ended = float("-inf")  # monotonic end of the last read, whether it succeeded or not
        self._table_at = float("-inf")  # monotonic time the last table arrived
        self._waiting = 0  # requests waiting for a read now
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._ensure_refresh_task()

    async def reconfigure(self, user_config: Any) -> None:
        """Take a new table: drop what it no longer holds at once, find the rest in the background.

        Serve calls this on every replica in place when the router's ``user_config`` changes.
        Runs on the replica's event loop without awaiting anything: no request sees half a table,
        and the update never waits on the Serve controller.

        Any job can also call it through a deployment handle (``handle.reconfigure.remote(...)``),
        with a table that routes nothing: such a call is a request (Serve sets its request
        context, which the controller's own call has not) and is refused, so the table is only
        ever the deployed ``user_config``.
        """
        if called_as_request():
            logger.warning("argus router: a reconfigure() sent as a request (a deployment handle) was refused")
            return
        table, refresh, problems = parse_table(user_config)
        for problem in problems[:10]:  # bounded: a huge bad table logs ten lines, not one per row
            logger.warning("argus router: %s", problem)
        self._table, self._refresh_s = table, refresh
        self._tabled_names = {e.model_id for e in table.values()} | {e.alias for e in table.values() if e.alias}
        self._tabled_apps = {}
        for entry in table.values():
            for name in (entry.model_id, entry.alias):
                if name:
                    self._tabled_apps.setdefault(name, set()).add(entry.app)
        for app in [a for a, r in self._routes.items() if table.get(a) != r.entry]:
            self._routes.pop(app)
            logger.info("argus router: dropped application %s (no longer in the table)", app)
        self._claim()
        self._table_at = time.monotonic()  # the next listing reads Serve afresh
        self._wake.set()
        self._ensure_refresh_task()

    def _ensure_refresh_task(self) -> None:
        """Start the background refresh on the replica's event loop (once it runs)."""
        if self._task is not None and not self._task.done():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # constructed outside the loop: check_health() or reconfigure() starts it
        self._task = loop.create_task(self._refresh_loop())

    async def check_health(self) -> None:
        self._ensure_refresh_task()

    async def _refresh_loop(self) -> None:
        while True:
            self._wake.clear()  # before reading: a table that arrives meanwhile wakes the next round
            try:
                await self._read_since(time.monotonic())
            except Exception:  # keep serving the last known models; log and retry
                logger.exception("argus router: refreshing models failed")
            with contextlib.suppress(TimeoutError):  # a new table wakes it early; else the safety refresh
                async with asyncio.timeout(self._refresh_s):
                    await self._wake.wait()

    async def _read_since(self, since: float) -> bool:
        """Wait until a read of Serve that started at or after ``since`` (monotonic) has ended,
        starting one when none is due. Returns whether that read succeeded.

        One read runs at a time, at least MISS_REFRESH_MIN_S after the last one ended, and every
        caller due for it shares it, failed or not: a flood of requests, or an unreachable
        controller, costs Serve about two reads a second. The read is a task of its own, so a
        caller that is cancelled (a client that hangs up) does not cancel it for the others.
        """
        while True:
            read = self._read
            if read is None or (read.task.done() and (read.started is None or read.started < since)):
                read = self._read = _Read(self._spaced_read)
            elif read.started is not None and read.started < since:
                await asyncio.wait([read.task])  # began before the caller asked: the next one, then
                continue
            return await asyncio.shield(read.task)

    async def _spaced_read(self, read: _Read) -> bool:
        pause = self._read_ended + MISS_REFRESH_MIN_S - time.monotonic()
        if pause > 0:
            await asyncio.sleep(pause)
        read.started = time.monotonic()
        try:
            await self._read_serve()
            return True
        except Exception as exc:  # the callers' answers say so; the next caller reads again
            logger.warning("argus router: reading Serve's status failed: %r", exc)
            return False
        finally:
            self._read_ended = time.monotonic()

    async def _read_serve(self) -> None:
        """Route every tabled application Serve runs; drop the rest. Runs in one ``_Read`` at a time."""
        # serve.status() blocks on the controller: keep it off the event loop.
        serve_status = await asyncio.to_thread(serve.status)
        table = self._table  # reconfigure() may swap it while we await below
        seen: set[str] = set()
        for app_name, app in serve_status.applications.items():
            entry = table.get(app_name)
            if entry is None or entry.deployment not in app.deployments:
                continue
            states: dict[Any, int] = dict(app.deployments[entry.deployment].replica_states)
            if not states.get("RUNNING", 0):  # keys are ReplicaState, a str enum
                continue  # not routable yet (or any more); dropped below
            seen.add(app_name)
            cached = self._routes.get(app_name)
            if cached and cached.entry == entry and cached.deployed_at == app.last_deployed_time_s:
                continue
            try:
                route = await self._route(entry, app.last_deployed_time_s)
            except Exception:  # this one stays unrouted until a later refresh; the others go on
                logger.exception("argus router: asking %s for its model failed", app_name)
                seen.discard(app_name)
                continue
            if route is not None and self._table.get(app_name) == entry:
                self._routes[app_name] = route
                logger.info("argus router: serving %s from application %s", entry.model_id, app_name)
        for app_name in set(self._routes) - seen:
            self._routes.pop(app_name)
            logger.info("argus router: dropped application %s (not running)", app_name)
        self._claim()

    async def _route(self, entry: Entry, deployed_at: float) -> Route | None:
        """A route to ``entry`` once its replica confirms the model id (None: it names another)."""
        handle: DeploymentHandle = serve.get_deployment_handle(entry.deployment, app_name=entry.app)
        # Bounded: a replica that does not answer must not stall the refresh (and requests).
        async with asyncio.timeout(LLM_CONFIG_TIMEOUT_S):
            llm_config = await handle.llm_config.remote()
        if llm_config is None or llm_config.model_id != entry.model_id:
            return None  # being redeployed under another id: the next refresh sees it settled
        alias_card = to_model_metadata(entry.alias, llm_config) if entry.alias else None
        return Route(entry, deployed_at, handle, to_model_metadata(entry.model_id, llm_config), alias_card)

    def _claim(self) -> None:
        """Rebuild the handle, card and alias maps from the routes (the claim rules)."""
        ids, aliases, refused = claim_names(self._routes.values())
        for model_id in list(self._configured_serve_handles):
            route = ids.get(model_id)
            if route is None or self._default_serve_handles.get(model_id) is not route.handle:
                self._configured_serve_handles.pop(model_id)  # rebuilt from the new handle
        self._default_serve_handles = {m: r.handle for m, r in ids.items()}
        self._model_cards = {m: r.card for m, r in ids.items()}
        self._aliases = {a: r.entry.model_id for a, r in aliases.items()}
        self._alias_cards = {a: r.alias_card for a, r in aliases.items()}
        self._app_of = {m: r.entry.app for m, r in ids.items()} | {a: r.entry.app for a, r in aliases.items()}
        for app in refused - self._refused:  # once, not every refresh
            logger.warning("argus router: a model id or alias of %s is taken; not routed", app)
        self._refused = refused

    async def _known(self, model: str) -> bool:
        """True when ``model`` is routable; when the table holds it but this replica cannot route it
        yet, only after a read of Serve that started after this call (another replica may route it).
        Raises OpenAIHTTPException (503: the model may run, clients retry) when that read failed
        or took longer than MISS_WAIT_S, or MAX_WAITING requests wait already."""
        if model in self._model_cards or model in self._aliases:
            return True
        if model not in self._tabled_names:
            return False
        if self._waiting >= MAX_WAITING:  # a flood for starting models holds no more request slots
            raise _unavailable(model)
        self._waiting += 1
        try:
            async with asyncio.timeout(MISS_WAIT_S):
                read = await self._read_since(time.monotonic())
        except TimeoutError:
            read = False
        finally:
            self._waiting -= 1
        known = model in self._model_cards or model in self._aliases
        if not read and not known:
            raise _unavailable(model)
        return known

    def _get_response(self, *, body: Any, call_method: str, raw_request: Any = None) -> AsyncIterator[Any]:
        """Route a request by alias as if it named the dated id (vLLM serves only that name). A
        name not routable yet is decided when the stream is first read, after a read of Serve."""
        model = body.model
        if model is None or model in self._model_cards or model in self._aliases:
            if model in self._aliases:
                body = body.model_copy(update={"model": self._aliases[model]})
            return super()._get_response(body=body, call_method=call_method, raw_request=raw_request)
        return self._get_response_after_refresh(body=body, call_method=call_method, raw_request=raw_request)

    async def _get_response_after_refresh(self, *, body: Any, call_method: str, raw_request: Any) -> AsyncIterator[Any]:
        if not await self._known(body.model):
            raise _not_found(body.model)  # here, not in _get_model_id: that would wait for a second read
        target = self._aliases.get(body.model, body.model)
        if target != body.model:
            body = body.model_copy(update={"model": target})
        async for response in super()._get_response(body=body, call_method=call_method, raw_request=raw_request):
            yield response

    async def model(self, model_id: str) -> Any:
        """The card of a dated id or alias (``/v1/models/<name>``; None: not routable, a 404)."""
        await self._known(model_id)
        if model_id in self._alias_cards:
            return self._alias_cards[model_id]
        return await super().model(model_id)

    async def _get_model_id(self, model: str | None) -> str:
        """The dated id a request names (or its alias's); raises ModelNotFound (404) when not routable."""
        if model is not None and not await self._known(model):
            raise _not_found(model)
        return await super()._get_model_id(model)

    async def model_data(self, model: str) -> Any:
        """``/v1/models/<name>``: the card of a dated id or alias. Raises ModelNotFound (404) for a
        name not routable."""
        name = replace_prefix(model)  # as Ray's own: `--` in a URL segment stands for `/`
        card = await self.model(name)
        if card is None:
            raise _not_found(name)
        return card

    async def models(self) -> Any:
        """Every dated model id, then every alias (``/v1/models``); a tabled model not listed yet
        (its replica starting) costs one Serve read at most every MISS_REFRESH_MIN_S."""
        if len(self._routes) < len(self._table):  # a failed read lists what this replica knows
            await self._read_since(max(time.monotonic() - MISS_REFRESH_MIN_S, self._table_at))
        listing = await super().models()
        listing.data.extend(self._alias_cards.values())
        return listing


def called_as_request() -> bool:
    """True when the running code serves a request (an HTTP call or a deployment handle's): Serve
    sets the request context for those, not for its controller's calls (``reconfigure``)."""
    context = serve_context._serve_request_context.get()
    return bool(context is not None and (context.request_id or context._internal_request_id))


class _Read:
    """One read of Serve that callers share: its task runs ``read(self)``; ``started`` is when it
    asked Serve (None while it waits for its turn)."""

    __slots__ = ("started", "task")

    def __init__(self, read: Callable[[_Read], Coroutine[Any, Any, bool]]) -> None:
        self.started: float | None = None
        self.task: asyncio.Task[bool] = asyncio.get_running_loop().create_task(read(self))


def _unavailable(model: str) -> OpenAIHTTPException:
    return OpenAIHTTPException(
        status_code=http_status.HTTP_503_SERVICE_UNAVAILABLE,
        message=f"The router cannot tell yet whether `{model}` is ready; retry.",
        type="ServiceUnavailable",
    )


def _not_found(model: str) -> ModelNotFound:
    return ModelNotFound(
        status_code=http_status.HTTP_404_NOT_FOUND,
        message=f"The model `{model}` does not exist or is not ready.",
        type="ModelNotFound",
    )


def build_router(args: dict[str, Any] | None = None) -> Application:
    """Return the router application.

    ``args`` (``{"table": <format version>}``) is not read: it changes only when the table's
    format does, so that Serve restarts replicas whose code cannot read the new one (a change of
    ``user_config`` alone reaches running replicas in place, old code included).
    """
    return router_application(ArgusIngress)


def router_application(ingress: type[ArgusIngress], *args: Any) -> Application:
    """The router application of ``ingress`` (ArgusIngress, or a subclass such as the profiled one
    of bench/router_profile.py), each replica built with ``args``."""
    ingress_cls = make_fastapi_ingress(ingress, endpoint_map=DEFAULT_ENDPOINTS, app=init())
    # The replica count is not set here: the application config's `deployments` override
    # carries an autoscaling_config (min 2 by default), which Serve changes in place.
    # No CPU reservation: a router replica only forwards requests; its CPU would otherwise
    # be missing from the capacity argus plans models against.
    return serve.deployment(
        ingress_cls,
        name="ArgusRouter",
        max_ongoing_requests=1000,
        ray_actor_options={"num_cpus": 0},
    ).bind(*args)  # type: ignore[attr-defined]
