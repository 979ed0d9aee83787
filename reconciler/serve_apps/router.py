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

Who may call what (API keys and access rules). With ``keys`` in the table (from the admin's
keys file, ``argus run --api-keys``: the sha256 hex of each key and its user; never a key)
every request names its caller with ``Authorization: Bearer <key>``: :meth:`ArgusIngress.caller`
looks the key's sha256 up in a dict, once per request and in one place (what per-user limits
and usage accounting hook into); no key, or one the table does not hold, is a 401. ``access``
holds, per application, who besides its owner may call it (users or teams; null: everyone with a
key) and ``teams`` each user's team; :func:`may_call` decides. A model the caller may not call is
answered exactly as one that does not exist (404, no Serve read, same message) and is left out of
``/v1/models``: private models' names never reach other users. Without ``keys`` the endpoint is
open, as before keys existed: every model answers every client, and ``access`` is not enforced.
All of it is in memory, rebuilt on each ``reconfigure()``: a request costs dict lookups and one
sha256, never a call to Serve or another actor.

Rate limits and usage (``limits`` in the table; reconciler/serve_apps/limits.py, meter.py,
usage.py). With keys, a caller over her own or her team's requests or tokens per minute is a
429 with ``Retry-After``; the daemon and the open endpoint are never limited. Every request that
reaches a model is counted, with the tokens of its responses' ``usage``, per hour, user and
application; the router application's second deployment, ``ArgusMeter``, adds up every replica's
counts (each replica decides alone and syncs in the background) and answers
``GET /argus/usage`` to the daemon's key only.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi import status as http_status
from ray import serve
from ray.llm._internal.serve.core.configs.openai_api_models import OpenAIHTTPException, to_model_metadata
from ray.llm._internal.serve.core.ingress.ingress import DEFAULT_ENDPOINTS, init
from ray.llm._internal.serve.utils.server_utils import replace_prefix
from ray.serve.deployment import Application
from ray.serve.handle import DeploymentHandle
from ray.serve.llm.ingress import OpenAiIngress, make_fastapi_ingress
from starlette.responses import JSONResponse

from reconciler.serve_apps.limits import DAEMON_USER, OPEN_USER, Limits, parse_limits
from reconciler.serve_apps.meter import (
    METER_DEPLOYMENT,
    ArgusMeter,
    MeterClient,
    RateLimitExceeded,
    rate_limited_response,
)
from reconciler.serve_apps.usage import ask_for_usage

logger = logging.getLogger("ray.serve")

OWNED_PREFIX = "argus--"
ROUTER_APP = "argus-router"
LLM_DEPLOYMENT_PREFIX = "LLMServer:"
SAFETY_REFRESH_S = 30.0  # re-read Serve's status this often even when no table arrives
REFRESH_BOUNDS_S = (1.0, 86400.0)  # the range a user_config ``refresh_s`` is clamped to
MISS_REFRESH_MIN_S = 0.5  # a read of Serve starts at least this long after the last one ended
MISS_WAIT_S = 5.0  # a request waits this long at most for a read of Serve, then it is a 503
MAX_WAITING = 256  # requests of one replica waiting for a read at once; more are a 503 at once
LLM_CONFIG_TIMEOUT_S = 10.0  # bound on asking a new model's replica for its LLMConfig
MAX_TABLE_ENTRIES = 100_000  # entries past this are ignored (and logged)
MAX_FIELD_CHARS = 512  # an entry with a longer field is ignored
ALIAS_KEY = "argus_alias"  # in LLMConfig.experimental_configs (reconciler/builders/serve.py)
MAX_KEYS = 100_000  # keys past this are ignored (and logged)
MAX_ACCESS_NAMES = 1_000  # names past this in one model's access list are ignored (and logged)
EVERYONE = "*"  # in an access list: everyone with a key
BEARER = "bearer "  # the Authorization scheme, compared case-insensitively (RFC 7235)


@dataclass(frozen=True)
class Entry:
    """One argus model application the daemon deployed (a ``user_config`` table row)."""

    app: str
    deployment: str
    model_id: str
    alias: str | None  # None: no alias is routed (the file's lies outside its user's namespace)


@dataclass(frozen=True)
class Route:
    """A tabled application seen running: what a request for its names is sent to."""

    entry: Entry
    deployed_at: float
    handle: DeploymentHandle
    card: Any  # ModelCard of the dated id
    alias_card: Any  # ModelCard of the alias, or None


@dataclass(frozen=True)
class Caller:
    """Whose key a request carries: the key file's user and her team (None: in no team)."""

    user: str
    team: str | None
    daemon: bool = False  # the daemon's own key (it probes every model): may call every model


@dataclass(frozen=True)
class Auth:
    """The table's access part. ``keys``: sha256 hex of a key -> its user (None: no keys file, the
    endpoint is open); ``access``: app name -> who besides its owner may call it (None: everyone
    with a key; an app absent here: its owner only); ``teams``: user -> team."""

    keys: dict[str, str] | None = None
    access: dict[str, frozenset[str] | None] = field(default_factory=dict)
    teams: dict[str, str] = field(default_factory=dict)
    daemon: str | None = None  # sha256 hex of the daemon's own key


DAEMON = Caller("", None, daemon=True)


def may_call(caller: Caller, owner: str, access: frozenset[str] | None) -> bool:
    """True when ``caller`` may call a model of ``owner`` whose access list is ``access``. Pure.

    The owner and the daemon always may; ``access`` None (or holding EVERYONE) lets every caller;
    else the caller's user name or team must be in it.
    """
    if caller.daemon or access is None or caller.user == owner or caller.user in access:
        return True
    return (caller.team is not None and caller.team in access) or EVERYONE in access


def parse_auth(config: Any) -> tuple[Auth, list[str]]:
    """Return ``(auth, problems)`` of a router ``user_config``'s ``keys``, ``access`` and ``teams``.

    Pure. Fails closed: a malformed ``keys`` (present but not a mapping) admits no key at all, a
    malformed access list lets the owner only, a malformed key or team row is skipped; each is
    described in ``problems``. Never raises.
    """
    if not isinstance(config, dict):
        return Auth(), []
    problems: list[str] = []
    keys: dict[str, str] | None = None
    raw_keys = config.get("keys")
    if raw_keys is not None:
        keys = {}
        if not isinstance(raw_keys, dict):
            problems.append("keys is not a mapping: every request is refused")
        else:
            for digest, user in list(raw_keys.items())[:MAX_KEYS]:
                if _is_sha256(digest) and isinstance(user, str) and 0 < len(user) <= MAX_FIELD_CHARS:
                    keys[digest] = user
                else:
                    problems.append(f"keys: an entry of {str(user)[:40]!r} is not a sha256 hex and a user: skipped")
            if len(raw_keys) > MAX_KEYS:
                problems.append(f"{len(raw_keys)} keys: only the first {MAX_KEYS} are accepted")
    access: dict[str, frozenset[str] | None] = {}
    raw_access = config.get("access", {})
    if not isinstance(raw_access, dict):
        problems.append("access is not a mapping: every model is its owner's only")
        raw_access = {}
    for app, names in raw_access.items():
        if names is None:
            access[str(app)] = None
        elif isinstance(names, list) and all(isinstance(n, str) for n in names):
            if len(names) > MAX_ACCESS_NAMES:
                problems.append(f"access of {app}: only the first {MAX_ACCESS_NAMES} names are read")
            access[str(app)] = frozenset(names[:MAX_ACCESS_NAMES])
        else:
            problems.append(f"access of {app} is not a list of names: its owner's only")
    teams: dict[str, str] = {}
    raw_teams = config.get("teams", {})
    if isinstance(raw_teams, dict):
        teams = {u: t for u, t in raw_teams.items() if isinstance(u, str) and isinstance(t, str)}
        if len(teams) != len(raw_teams):
            problems.append("teams: entries that are not user -> team names skipped")
    else:
        problems.append("teams is not a mapping: nobody is in a team")
    daemon = config.get("daemon")
    if daemon is not None and not _is_sha256(daemon):
        problems.append("daemon is not a sha256 hex: the daemon's probes are refused")
        daemon = None
    return Auth(keys, access, teams, daemon), problems


def _is_sha256(digest: object) -> bool:
    return isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)


def parse_table(config: Any) -> tuple[dict[str, Entry], float, list[str]]:
    """Return ``(entries by app name, refresh period, problems)`` of a router ``user_config``.

    Pure. Malformed rows are skipped and described in ``problems``; so is everything past
    MAX_TABLE_ENTRIES. A config that is not a mapping yields an empty table. Never raises.
    """
    problems: list[str] = []
    if not isinstance(config, dict):
        return {}, SAFETY_REFRESH_S, ["user_config is not a mapping: no models routed"] if config is not None else []
    refresh = config.get("refresh_s", SAFETY_REFRESH_S)
    if isinstance(refresh, bool) or not isinstance(refresh, (int, float)) or refresh != refresh:
        problems.append(f"refresh_s {refresh!r} is not a number: {SAFETY_REFRESH_S} s")
        refresh = SAFETY_REFRESH_S
    refresh = min(max(float(refresh), REFRESH_BOUNDS_S[0]), REFRESH_BOUNDS_S[1])
    rows = config.get("models", [])
    if not isinstance(rows, list):
        return {}, refresh, [*problems, "models is not a list: no models routed"]
    if len(rows) > MAX_TABLE_ENTRIES:
        problems.append(f"{len(rows)} models: only the first {MAX_TABLE_ENTRIES} are routed")
        rows = rows[:MAX_TABLE_ENTRIES]
    entries: dict[str, Entry] = {}
    for i, row in enumerate(rows):
        if (
            not isinstance(row, list)
            or len(row) != 4
            or not all(isinstance(f, str) and len(f) <= MAX_FIELD_CHARS for f in row)
            or not all(row[:3])
        ):
            problems.append(f"models[{i}] is not four short strings: skipped")
            continue
        app, deployment, model_id, alias = row
        if not app.startswith(OWNED_PREFIX) or app in entries:
            problems.append(f"models[{i}]: {app!r} is not an argus application or listed twice: skipped")
            continue
        entries[app] = Entry(app, deployment, model_id, _alias(app, alias))
    return entries, refresh, problems


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

    def __init__(self, meter: DeploymentHandle | None = None) -> None:
        super().__init__(llm_deployments={}, model_cards={})
        self._meter = MeterClient(meter)  # limits and usage (reconciler/serve_apps/meter.py)
        self._limits: Limits | None = None
        self._table: dict[str, Entry] = {}  # app name -> entry (the last user_config)
        self._tabled_names: set[str] = set()  # every model id and alias the table holds
        self._routes: dict[str, Route] = {}  # app name -> route, for tabled apps seen running
        self._aliases: dict[str, str] = {}  # alias -> model id
        self._alias_cards: dict[str, Any] = {}  # alias -> ModelCard
        self._refused: set[str] = set()  # apps whose model id or alias another app holds
        self._app_of: dict[str, str] = {}  # routed model id or alias -> app name
        self._tabled_apps: dict[str, set[str]] = {}  # every tabled model id and alias -> the apps claiming it
        self._auth = Auth()
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
        """
        table, refresh, problems = parse_table(user_config)
        auth, auth_problems = parse_auth(user_config)
        limits, limit_problems = parse_limits(user_config)
        problems += auth_problems + limit_problems
        for problem in problems[:10]:  # bounded: a huge bad table logs ten lines, not one per row
            logger.warning("argus router: %s", problem)
        self._table, self._refresh_s = table, refresh
        self._tabled_names = {e.model_id for e in table.values()} | {e.alias for e in table.values() if e.alias}
        self._tabled_apps = {}
        for entry in table.values():
            for name in (entry.model_id, entry.alias):
                if name:
                    self._tabled_apps.setdefault(name, set()).add(entry.app)
        self._auth, self._limits = auth, limits
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
                await asyncio.wait_for(self._wake.wait(), timeout=self._refresh_s)

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
        llm_config = await asyncio.wait_for(handle.llm_config.remote(), timeout=LLM_CONFIG_TIMEOUT_S)
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
            read = await asyncio.wait_for(self._read_since(time.monotonic()), timeout=MISS_WAIT_S)
        except TimeoutError:
            read = False
        finally:
            self._waiting -= 1
        known = model in self._model_cards or model in self._aliases
        if not read and not known:
            raise _unavailable(model)
        return known

    def caller(self, request: Any) -> Caller | None:
        """Whose key ``request`` (a Starlette request; None: not an HTTP call) carries: the one
        place a request's user and team are known. Returns None when the endpoint is open (no keys
        file). Raises InvalidApiKey (401) for no key or one the table does not hold.

        Cost: one sha256 of the key and two dict lookups (the key is random, so looking its hash up
        in a dict leaks nothing a constant-time comparison would hide)."""
        keys = self._auth.keys
        if keys is None:
            return None
        digest = _digest(request)
        if digest is None:
            raise _unauthorized("No API key provided: send `Authorization: Bearer <key>`.")
        user = keys.get(digest)
        if user is None:
            if digest == self._auth.daemon:
                return DAEMON
            raise _unauthorized("Incorrect API key provided.")
        return Caller(user, self._auth.teams.get(user))

    def _may_call_app(self, caller: Caller | None, app: str) -> bool:
        if caller is None:
            return True  # no keys file: open, as before keys existed
        owner = _owner(app)
        return owner is not None and may_call(caller, owner, self._auth.access.get(app, frozenset()))

    def _visible(self, caller: Caller | None, model: str) -> bool:
        """True when ``caller`` may call what ``model`` names: the app it is routed to, else (not
        routable yet) one tabled app claiming it. A name nothing tables is not visible either."""
        if caller is None:
            return True
        app = self._app_of.get(model)
        if app is not None:
            return self._may_call_app(caller, app)
        return any(self._may_call_app(caller, a) for a in self._tabled_apps.get(model, ()))

    def _get_response(self, *, body: Any, call_method: str, raw_request: Any = None) -> AsyncIterator[Any]:
        """Check the caller's key, access and rate limits, then route a request by alias as if it
        named the dated id (vLLM serves only that name). Raises InvalidApiKey (401);
        ModelNotFound (404) for a model the caller may not call, exactly as for one that does not
        exist; RateLimitExceeded (429) over the caller's or her team's per-minute limits.

        A plain function returning the stream, wrapped once to count its request and the tokens
        of its responses' usage (reconciler/serve_apps/usage.py). A name not routable yet, or a
        limited caller on a replica whose rate windows are stale (it was idle), is decided when the
        stream is first read, after that read of Serve or that one sync with the meter.
        """
        caller = self.caller(raw_request)
        model = body.model
        if model is None and caller is not None:
            # Ray's default picks the only model or lists them all in its error: neither may
            # happen for a caller who may not see them.
            raise _model_required()
        if model is not None and not self._visible(caller, model):
            raise _not_found(model)
        body, strip = ask_for_usage(body, call_method)
        user = self._usage_user(caller, raw_request)
        limited = caller is not None and not caller.daemon
        if (model is None or model in self._model_cards or model in self._aliases) and not (
            limited and self._meter.stale(self._limits)
        ):
            subjects = self._admit(caller)
            if model in self._aliases:
                body = body.model_copy(update={"model": self._aliases[model]})
            stream = super()._get_response(body=body, call_method=call_method, raw_request=raw_request)
        else:
            subjects = []  # admitted (and counted) once the name is routable and the windows fresh
            stream = self._get_response_after_refresh(
                body=body, call_method=call_method, raw_request=raw_request, caller=caller, subjects=subjects
            )
        return self._meter.metered(stream, strip, user, lambda: self._app_name(model), subjects)

    def _admit(self, caller: Caller | None) -> list[str]:
        """The limit subjects a request counts under (none for the open endpoint and the daemon);
        raises RateLimitExceeded (429)."""
        if caller is None or caller.daemon:
            return []
        return self._meter.admit(self._limits, caller.user, caller.team)

    def _usage_user(self, caller: Caller | None, raw_request: Any) -> str:
        """The ``user`` of a request's usage rows: the key's user, DAEMON_USER (the daemon's key,
        also on the open endpoint) or OPEN_USER."""
        if caller is not None:
            return DAEMON_USER if caller.daemon else caller.user
        if self._auth.daemon is not None and _digest(raw_request) == self._auth.daemon:
            return DAEMON_USER
        return OPEN_USER

    def _app_name(self, model: str | None) -> str:
        """The application a request for ``model`` went to (None: Ray's pick, the only model)."""
        if model is None and len(self._model_cards) == 1:
            model = next(iter(self._model_cards))
        return self._app_of.get(model, "") if model is not None else ""

    async def argus_usage(self, request: Request) -> JSONResponse:
        """``GET /argus/usage``: the meter's usage rows (the daemon's key only; anyone else gets the
        401 of a wrong key). Raises InvalidApiKey (401); OpenAIHTTPException (503) when the meter
        does not answer."""
        digest = _digest(request)
        if digest is None:  # the answers of the other routes' 401s: nothing tells this route apart
            raise _unauthorized("No API key provided: send `Authorization: Bearer <key>`.")
        if digest != self._auth.daemon:
            raise _unauthorized("Incorrect API key provided.")
        return JSONResponse(await self._meter.usage())

    async def _get_response_after_refresh(
        self, *, body: Any, call_method: str, raw_request: Any, caller: Caller | None, subjects: list[str]
    ) -> AsyncIterator[Any]:
        # Visible again after the read: the name may now route to an app the caller may not call.
        if body.model is not None and (not await self._known(body.model) or not self._visible(caller, body.model)):
            raise _not_found(body.model)  # here, not in _get_model_id: that would wait for a second read
        if caller is not None and not caller.daemon and self._meter.stale(self._limits):
            await self._meter.freshen()
        subjects.extend(self._admit(caller))
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

    async def model_data(self, model: str, request: Request) -> Any:
        """``/v1/models/<name>``: the card of a dated id or alias the caller may call. Raises
        InvalidApiKey (401), ModelNotFound (404) for a name not routable or not the caller's to
        call (one answer for both: a private model's name is never confirmed)."""
        caller = self.caller(request)
        name = replace_prefix(model)  # as Ray's own: `--` in a URL segment stands for `/`
        card = await self.model(name) if self._visible(caller, name) else None
        if card is None or not self._visible(caller, name):
            raise _not_found(name)
        return card

    async def models(self, request: Request) -> Any:
        """Every dated model id, then every alias (``/v1/models``) the caller may call; a tabled
        model not listed yet (its replica starting) costs one Serve read at most every
        MISS_REFRESH_MIN_S. Raises InvalidApiKey (401)."""
        caller = self.caller(request)
        if len(self._routes) < len(self._table):  # a failed read lists what this replica knows
            await self._read_since(max(time.monotonic() - MISS_REFRESH_MIN_S, self._table_at))
        listing = await super().models()
        listing.data.extend(self._alias_cards.values())
        if caller is not None:
            listing.data = [card for card in listing.data if self._visible(caller, card.id)]
        return listing


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


class InvalidApiKey(OpenAIHTTPException):
    """No key, or one the keys file does not hold; the class name is the error's type."""


def _digest(request: Any) -> str | None:
    """The sha256 hex of the Bearer key of a Starlette request (None: no Bearer key, or no request)."""
    header = request.headers.get("authorization", "") if request is not None else ""
    if header[: len(BEARER)].lower() != BEARER:
        return None
    key = header[len(BEARER) :].strip()
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()


def _unauthorized(message: str) -> InvalidApiKey:
    return InvalidApiKey(status_code=http_status.HTTP_401_UNAUTHORIZED, message=message, type="InvalidApiKey")


def _model_required() -> OpenAIHTTPException:
    return OpenAIHTTPException(
        status_code=http_status.HTTP_400_BAD_REQUEST,
        message="The `model` field is required.",
        type="BadRequest",
    )


def _owner(app_name: str) -> str | None:
    """The user of an argus application name (``argus--<user>--<name>``), else None."""
    parts = app_name[len(OWNED_PREFIX) :].split("--") if app_name.startswith(OWNED_PREFIX) else []
    return parts[0] if len(parts) == 2 and all(parts) else None


def _not_found(model: str) -> ModelNotFound:
    return ModelNotFound(
        status_code=http_status.HTTP_404_NOT_FOUND,
        message=f"The model `{model}` does not exist or is not ready.",
        type="ModelNotFound",
    )


def _alias(app_name: str, alias: str | None) -> str | None:
    """The alias a table entry may route: ``alias`` (the file's ``served_name:``) when it lies in
    the application's own user's namespace, else None; ``<user>-<name>`` when ``alias`` is empty."""
    parts = app_name[len(OWNED_PREFIX) :].split("--")
    if len(parts) != 2 or not all(parts):
        return None
    if alias:
        # Only in the app's own user's namespace: an application PUT by code on the cluster under
        # alice's app name can never take bob's alias (the loader's rule, enforced here again).
        return alias if alias.startswith(f"{parts[0]}-") else None
    return f"{parts[0]}-{parts[1]}"


def build_router(args: dict[str, Any] | None = None) -> Application:
    """Return the router application.

    ``args`` (``{"table": <format version>}``) is not read: it changes only when the table's
    format does, so that Serve restarts replicas whose code cannot read the new one (a change of
    ``user_config`` alone reaches running replicas in place, old code included).
    """
    return router_application(ArgusIngress)


def router_application(ingress: type[ArgusIngress], *args: Any) -> Application:
    """The router application of ``ingress`` (ArgusIngress, or a subclass such as the profiled one
    of bench/router_profile.py), each replica built with the meter's handle and then ``args``."""
    # Our own FastAPI app (Ray's, plus a handler): Ray's error middleware answers a 429 without
    # its Retry-After header.
    app = init()
    app.add_exception_handler(RateLimitExceeded, rate_limited_response)
    endpoints = {**DEFAULT_ENDPOINTS, "argus_usage": lambda fastapi_app: fastapi_app.get("/argus/usage")}
    ingress_cls = make_fastapi_ingress(ingress, endpoint_map=endpoints, app=app)
    # One meter replica holds the global rate windows and usage rows (reconciler/serve_apps/meter.py);
    # it does little, so it reserves no CPU either.
    meter = serve.deployment(
        ArgusMeter, name=METER_DEPLOYMENT, num_replicas=1, max_ongoing_requests=1000, ray_actor_options={"num_cpus": 0}
    ).bind()
    # The replica count is not set here: the application config's `deployments` override
    # carries an autoscaling_config (min 2 by default), which Serve changes in place.
    # No CPU reservation: a router replica only forwards requests; its CPU would otherwise
    # be missing from the capacity argus plans models against.
    return serve.deployment(
        ingress_cls,
        name="ArgusRouter",
        max_ongoing_requests=1000,
        ray_actor_options={"num_cpus": 0},
    ).bind(meter, *args)  # type: ignore[attr-defined]
