"""The status page and its JSON API: a read-only :data:`PageHandler` over the status branch.

Routes (GET and HEAD only; every other method is 405: git stays the only input):

=============================================  =============================================
``/``                                          overview (``?user=&state=&kind=&page=``)
``/users/<user>/models/<name>``                one model (spec, Serve status, OpenAI example)
``/users/<user>/tasks/<name>``                 one task (runs, log tail, live log)
``/api/v1/summary``                            revisions, capacity, counts, errors
``/api/v1/objects``                            the documents (same filters, paginated)
``/api/v1/objects/<user>/<kind>s/<name>``      one document
``/api/v1/logs/<user>/tasks/<name>``           a run's output (``?run=&tail=&limit_bytes=&follow=1``)
``/api/v1/logs/<user>/models/<name>``          a model's Serve messages
``/api/v1/deployed/<user>/<kind>s/<name>``     what argus deployed/submitted for it (``?run=``)
``/static/app.css``, ``/static/app.js``        the page's only assets
=============================================  =============================================
"""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any, Protocol
from urllib.parse import unquote

import jinja2
import yaml

from reconciler.errors import ArgusError
from reconciler.web import view
from reconciler.web.reader import StatusReader, StatusSnapshot
from reconciler.web.response import CLIENT_ADDRESS, CLIENT_USER, PageHandler, Response

# Path components are looked up, never joined into a file path; this only keeps junk out.
_COMPONENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_KINDS = {"models": "model", "tasks": "task"}
HTML = "text/html; charset=utf-8"
JSON = "application/json"
TEXT = "text/plain; charset=utf-8"
# The page loads only its own script and style: injected markup could not run a script
# even if escaping ever failed.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
STATIC = {"app.css": "text/css; charset=utf-8", "app.js": "text/javascript; charset=utf-8"}


class Logs(Protocol):
    """What the page needs from the log reader (reconciler.logs implements it).

    Each method raises LookupError (404: no such run/app, or not this object's) or an
    ArgusError (Ray unreachable: 503); ``follow_task_log`` raises before returning its iterator.
    """

    def task_log(
        self,
        user: str,
        name: str,
        doc: Mapping[str, Any],
        run: str | None,
        *,
        tail: int | None = None,
        limit_bytes: int | None = None,
        client: str = "",
        identity: str = "",
    ) -> str: ...

    def follow_task_log(
        self,
        user: str,
        name: str,
        doc: Mapping[str, Any],
        run: str | None,
        *,
        client: str = "",
        identity: str = "",
    ) -> Iterator[str]: ...

    def model_log(self, user: str, name: str, doc: Mapping[str, Any]) -> str: ...

    def deployed_task_spec(self, user: str, name: str, doc: Mapping[str, Any], run: str | None) -> Any: ...

    def deployed_model_spec(self, user: str, name: str, doc: Mapping[str, Any]) -> Any: ...


@dataclass(frozen=True)
class Derived:
    """What one status commit gives the overview, computed once per commit."""

    rows: list[view.Row]
    capacity: view.Capacity
    revisions: view.Revisions
    users: list[str]
    states: Counter[str]
    teams: list[view.TeamRow]


def environment() -> jinja2.Environment:
    """Jinja2 with autoescape on for every template (all of them are HTML)."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("reconciler.web", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["yaml"] = lambda value: yaml.safe_dump(
        _plain(value), sort_keys=False, allow_unicode=True, default_flow_style=False, width=100
    )
    env.filters["gpus"] = lambda value: f"{value:g}"
    env.filters["short"] = lambda value: str(value or "")[:12]
    env.filters["clip"] = _clip
    return env


def _clip(value: Any, lines: int = 3, chars: int = 280) -> str:
    """A long reason cut for the overview's table (the object's page shows all of it)."""
    text = str(value or "")
    kept = "\n".join(text.splitlines()[:lines])[:chars]
    return kept if kept == text else kept.rstrip() + " …"


def _plain(value: Any) -> Any:
    """A document as plain YAML-able data (dates and odd scalars as text)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def build_handler(
    reader: StatusReader,
    *,
    logs: Logs | None = None,
    refresh_s: float = 5.0,
    endpoint: str = "",
) -> PageHandler:
    """Return the page handler over ``reader``'s status branch.

    ``logs``: live logs from Ray (None: the page shows only the tails the documents hold and
    the log API answers 503); ``endpoint``: the OpenAI base URL when a document has none.
    """
    env = environment()
    lock = threading.Lock()
    cache: dict[str, Derived] = {}
    overview_rows = view.Overview()
    held: list[tuple[Mapping[str, Any], view.Capacity]] = []  # actual.json's capacity, by parsed object

    def derived(snap: StatusSnapshot) -> Derived:
        key = snap.tip or ""
        with lock:  # one request derives a new commit; the others wait and reuse it
            if key not in cache:
                cache.clear()  # only the newest commit is ever asked for again
                cache[key] = derive(snap)
            return cache[key]

    def derive(snap: StatusSnapshot) -> Derived:
        # A new commit changes a few documents: only their rows move (view.Overview, from the
        # paths the store says changed); the copies below are what requests rendering an older
        # commit keep (C-speed list copies).
        overview_rows.follow(snap.tip, snap.docs, snap.since, snap.changed)
        if not held or held[0][0] is not snap.actual:
            held[:] = [(snap.actual, view.held_capacity(snap.actual))]
        return Derived(
            rows=list(overview_rows.rows),
            capacity=view.queued_capacity(held[0][1], overview_rows.queued),
            revisions=view.revisions(snap.root, snap.docs),
            users=list(overview_rows.users),
            states=Counter(overview_rows.states),
            teams=view.teams(snap.root),
        )

    def page(template: str, status: int = 200, **context: Any) -> Response:
        body = env.get_template(template).render(refresh_ms=int(refresh_s * 1000), **context)
        return Response(status, HTML, body.encode(), SECURITY_HEADERS)

    def not_found(what: str, api: bool) -> Response:
        if api:
            return Response(404, JSON, json.dumps({"error": what}).encode(), SECURITY_HEADERS)
        return page("error.html", 404, title="Not found", message=what, snap=None)

    def summary(snap: StatusSnapshot, d: Derived) -> dict[str, Any]:
        return {
            "status_commit": snap.tip,
            "error": snap.error,
            "revision": {
                "last_attempted": d.revisions.attempted or None,
                "last_applied": d.revisions.applied or None,
                "subject": d.revisions.subject or None,
                "note": reader.note(d.revisions.attempted) if d.revisions.attempted else None,
            },
            "errors": list(d.revisions.errors),
            "notes": list(d.revisions.notes),
            "problems": list(d.revisions.problems),
            "capacity": {
                "known": d.capacity.known,
                "total": dict(d.capacity.total),
                "available": dict(d.capacity.available),
                "models": dict(d.capacity.models),
                "jobs": dict(d.capacity.jobs),
                "queued": dict(d.capacity.queued),
                "queued_objects": d.capacity.queued_objects,
            },
            "teams": [t.__dict__ for t in d.teams],
            "objects": len(d.rows),
            "states": dict(d.states),
            "users": len(d.users),
        }

    def filters(query: Mapping[str, list[str]]) -> view.Filters:
        def one(name: str) -> str:
            return (query.get(name) or [""])[0].strip()[:200]

        try:
            page_no = max(1, min(10**6, int(one("page") or 1)))
        except ValueError:
            page_no = 1
        try:
            per_page = max(1, min(1000, int(one("per_page") or view.PER_PAGE)))
        except ValueError:
            per_page = view.PER_PAGE
        kind = one("kind")
        kind = _KINDS.get(kind, kind) if kind in ("model", "task", "models", "tasks") else ""
        return view.Filters(user=one("user"), state=one("state"), kind=kind, page=page_no, per_page=per_page)

    def overview(query: Mapping[str, list[str]]) -> Response:
        snap = reader.snapshot()
        d = derived(snap)
        f = filters(query)
        chosen = view.paginate(d.rows, f)
        note = reader.note(d.revisions.attempted) if d.revisions.attempted else None
        return page(
            "overview.html",
            title="argus status",
            snap=snap,
            d=d,
            f=f,
            chosen=chosen,
            note=note,
            attention_states=view.ATTENTION,
        )

    def object_page(user: str, kind: str, name: str) -> Response:
        snap = reader.snapshot()
        path = f"users/{user}/{kind}s/{name}.yaml"
        doc = snap.docs.get(path)
        if doc is None:
            return not_found(f"no {kind} {user}/{name} on the status branch", api=False)
        r = view.row(path, doc)
        context: dict[str, Any] = {
            "title": f"{user}/{kind}s/{name}",
            "snap": snap,
            "doc": doc,
            "row": r,
            "events": list(reversed(view.listing(doc.get("events"))))[:20],
            "runs": view.object_runs(doc),
            "current": view.current_run(doc),
            "python": "",
            "curl": "",
            "endpoint": "",
            "log_url": f"/api/v1/logs/{user}/{kind}s/{name}",
            "deployed_url": f"/api/v1/deployed/{user}/{kind}s/{name}",
            "live": logs is not None,
            "spec": doc.get("spec"),
        }
        if kind == "model":
            served = view.text(doc.get("served_name"))
            context["endpoint"] = view.text(doc.get("endpoint")) or endpoint
            if served:
                context["python"], context["curl"] = view.openai_example(served, context["endpoint"])
        return page("object.html", **context)

    def api_objects(query: Mapping[str, list[str]]) -> Response:
        snap = reader.snapshot()
        d = derived(snap)
        f = filters(query)
        chosen = view.paginate(d.rows, f)
        body = {
            "status_commit": snap.tip,
            "total": chosen.total,
            "page": chosen.page,
            "pages": chosen.pages,
            "objects": [{"path": r.path, **_plain(snap.docs[r.path])} for r in chosen.rows],
        }
        return _json(body)

    def api_object(user: str, kind: str, name: str) -> Response:
        snap = reader.snapshot()
        doc = snap.docs.get(f"users/{user}/{kind}s/{name}.yaml")
        if doc is None:
            return not_found(f"no {kind} {user}/{name} on the status branch", api=True)
        return _json(_plain(doc))

    def api_logs(user: str, kind: str, name: str, query: Mapping[str, list[str]]) -> Response:
        snap = reader.snapshot()
        doc = snap.docs.get(f"users/{user}/{kind}s/{name}.yaml")
        if doc is None:
            return not_found(f"no {kind} {user}/{name} on the status branch", api=True)
        if logs is None:
            return Response(503, JSON, b'{"error": "logs are not available: the daemon has no Ray client"}')
        run = (query.get("run") or [""])[0] or None
        follow = (query.get("follow") or [""])[0] in ("1", "true", "yes")
        client, identity = CLIENT_ADDRESS.get(), CLIENT_USER.get()
        try:
            tail, limit_bytes = _count(query, "tail"), _count(query, "limit_bytes")
        except ValueError as exc:
            return Response(400, JSON, json.dumps({"error": str(exc)}).encode(), SECURITY_HEADERS)
        try:
            if kind == "model":
                return Response(200, TEXT, logs.model_log(user, name, doc).encode(), SECURITY_HEADERS)
            if follow:
                # Ownership is checked when the iterator is made, before any status line is sent.
                chunks = logs.follow_task_log(user, name, doc, run, client=client, identity=identity)
                return Response(200, TEXT, _encoded(chunks), {**SECURITY_HEADERS, "X-Accel-Buffering": "no"})
            text = logs.task_log(
                user, name, doc, run, tail=tail, limit_bytes=limit_bytes, client=client, identity=identity
            )
            return Response(200, TEXT, text.encode(), SECURITY_HEADERS)
        except LookupError as exc:
            return not_found(str(exc.args[0] if exc.args else exc), api=True)
        except ArgusError as exc:
            return Response(503, JSON, json.dumps({"error": str(exc)}).encode(), SECURITY_HEADERS)

    def api_deployed(user: str, kind: str, name: str, query: Mapping[str, list[str]]) -> Response:
        snap = reader.snapshot()
        doc = snap.docs.get(f"users/{user}/{kind}s/{name}.yaml")
        if doc is None:
            return not_found(f"no {kind} {user}/{name} on the status branch", api=True)
        if logs is None:
            return Response(503, JSON, b'{"error": "not available: the daemon has no Ray client"}')
        run = (query.get("run") or [""])[0] or None
        try:
            if kind == "model":
                return _json(logs.deployed_model_spec(user, name, doc))
            return _json(logs.deployed_task_spec(user, name, doc, run))
        except LookupError as exc:
            return not_found(str(exc.args[0] if exc.args else exc), api=True)
        except ArgusError as exc:
            return Response(503, JSON, json.dumps({"error": str(exc)}).encode(), SECURITY_HEADERS)

    def static(name: str) -> Response | None:
        if name not in STATIC:
            return None
        data = resources.files("reconciler.web").joinpath("static", name).read_bytes()
        return Response(200, STATIC[name], data, {**SECURITY_HEADERS, "Cache-Control": "max-age=300"})

    def handle(method: str, raw_path: str, query: Mapping[str, list[str]]) -> Response | None:
        if method not in ("GET", "HEAD"):
            return Response(
                405, JSON, b'{"error": "read-only: git is the only input"}', {**SECURITY_HEADERS, "Allow": "GET, HEAD"}
            )
        raw_path = raw_path.split("?", 1)[0]
        parts = [unquote(p) for p in raw_path.split("/") if p]
        api = parts[:2] == ["api", "v1"]
        if any(not _COMPONENT.match(p) for p in parts):
            return not_found("no such page", api)
        if not parts:
            return overview(query)
        if parts[0] == "static" and len(parts) == 2:
            return static(parts[1]) or not_found("no such file", False)
        if parts[0] == "users" and len(parts) == 2:
            return Response(302, HTML, b"", {"Location": f"/?user={parts[1]}"})
        if parts[0] == "users" and len(parts) == 4 and parts[2] in _KINDS:
            return object_page(parts[1], _KINDS[parts[2]], parts[3])
        if api:
            rest = parts[2:]
            if rest == ["summary"]:
                snap = reader.snapshot()
                return _json(summary(snap, derived(snap)))
            if rest == ["objects"]:
                return api_objects(query)
            if len(rest) == 4 and rest[0] == "objects" and rest[2] in _KINDS:
                return api_object(rest[1], _KINDS[rest[2]], rest[3])
            if len(rest) == 4 and rest[0] == "logs" and rest[2] in _KINDS:
                return api_logs(rest[1], _KINDS[rest[2]], rest[3], query)
            if len(rest) == 4 and rest[0] == "deployed" and rest[2] in _KINDS:
                return api_deployed(rest[1], _KINDS[rest[2]], rest[3], query)
        return not_found("no such page", api)

    return handle


def _count(query: Mapping[str, list[str]], name: str) -> int | None:
    """The positive whole number ``?name=`` gives (None when absent). Raises ValueError otherwise."""
    raw = (query.get(name) or [""])[0].strip()
    if not raw:
        return None
    if not raw.isdigit() or len(raw) > 12 or int(raw) < 1:
        raise ValueError(f"{name} must be a whole number of at least 1")
    return int(raw)


def _json(body: Any) -> Response:
    return Response(200, JSON, (json.dumps(body, indent=1, default=str) + "\n").encode(), SECURITY_HEADERS)


def _encoded(chunks: Iterable[str]) -> Iterator[bytes]:
    for chunk in chunks:
        yield chunk.encode()


def wsgi_like(handler: PageHandler) -> Callable[[str], Response | None]:
    """``GET path?query`` through ``handler`` (tests and the bench call pages this way)."""
    from urllib.parse import parse_qs, urlsplit

    def get(url: str) -> Response | None:
        parts = urlsplit(url)
        return handler("GET", parts.path or "/", parse_qs(parts.query))

    return get
