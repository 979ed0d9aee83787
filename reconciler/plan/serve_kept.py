"""Serve kept as argus declares it: which applications go, which are restored. Pure.

Ray trusts every job as an administrator: code in any job can ``serve.run`` an application (an
*imperative* one) or PUT declarative ones, and Serve routes HTTP by the longest route prefix, so an
application at ``/v1`` or ``/argus`` receives the requests meant for argus's router. Every tick
:func:`keep_decision` compares what Serve runs with what argus declares:

- a **foreign** application (not in argus's namespace) that has an HTTP route is removed, unless
  cluster.yaml's ``serving.allowed_apps`` names it; one without a route is left as it runs;
- an application in **argus's namespace** that argus did not deploy as it runs now is restored:
  replaced by an imperative ``serve.run`` under the same name, moved to a route argus never gave it,
  or changed since it last ran as argus declared it (``kept``: the digest of each app's config the
  last time Serve ran it as declared); one that argus does not declare and that has a route is removed.

The caller (:mod:`reconciler.apply.serve`) turns the decision into PUTs and records
:attr:`KeepDecision.events` on the statuses and in the log. Configs are compared normalised
(:func:`reconciler.builders.serve.normalise_app`); this module imports no builder (the layers: plan
is below builders), so ownership comes in as a predicate.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from reconciler.plan.assess import ObjectStatus
from reconciler.plan.diff import field_diff, summarise
from reconciler.spec.hashing import stable_hash
from reconciler.spec.types import ObjectKey

# One event's text is cut to this many characters (what changed is summarised, not dumped).
MAX_EVENT_CHARS = 400
# At most this many changed fields are listed in one "restored" event (the rest are counted).
MAX_EVENT_FIELDS = 6
EventKind = Literal["removed", "restored", "failed"]


@dataclass(frozen=True)
class SeenApp:
    """One application as ``GET /api/serve/applications/`` lists it: its live ``route`` (None: no
    HTTP route), whether it was deployed with ``serve.run`` (``imperative``), its ``config``
    (normalised ``deployed_app_config``; None for an imperative app) and its ``status``."""

    name: str
    route: str | None
    imperative: bool
    config: Mapping[str, Any] | None = None
    status: str = ""


@dataclass(frozen=True)
class ServeEvent:
    """What the daemon did to one application, and why (``detail``: what changed)."""

    app: str
    kind: EventKind
    detail: str

    def text(self) -> str:
        """One line for the status and the log, at most MAX_EVENT_CHARS characters."""
        verb = {"removed": "removed", "restored": "restored", "failed": "could not keep"}[self.kind]
        line = f"Serve application {self.app!r} {verb}: {self.detail}".replace("\n", " ")
        return line if len(line) <= MAX_EVENT_CHARS else line[: MAX_EVENT_CHARS - 1] + "…"


@dataclass(frozen=True)
class KeepDecision:
    """``carry``: foreign declarative apps a PUT carries as deployed; ``remove``: declarative apps
    the PUT leaves out (Serve deletes them); ``take_over``: imperative apps to remove (a PUT names
    them, which makes them declarative, and the next PUT leaves them out); ``restore``: argus apps
    that run otherwise than argus declares (the PUT sends argus's config, in place); ``hold``: argus
    apps the PUT leaves out this tick: being deleted, or running someone else's code, which a PUT of
    argus's config would leave serving until argus's build is done (Serve keeps an app's old
    deployments while it builds new ones), so they are removed first and deployed again once Serve
    has deleted them; ``events``: one per app removed or restored, in name order."""

    carry: frozenset[str] = frozenset()
    remove: frozenset[str] = frozenset()
    take_over: frozenset[str] = frozenset()
    restore: frozenset[str] = frozenset()
    hold: frozenset[str] = frozenset()
    events: tuple[ServeEvent, ...] = field(default_factory=tuple)


def keep_decision(
    seen: Mapping[str, SeenApp],
    target: Mapping[str, Mapping[str, Any]],
    *,
    owned: Callable[[str], bool],
    allowed: Collection[str] = (),
    kept: Mapping[str, str] | None = None,
) -> KeepDecision:
    """Decide which of the ``seen`` applications go and which are restored. Pure; never raises.

    ``target``: argus's own applications as it declares them this tick (normalised configs, by
    name); ``owned``: whether a name is in argus's namespace; ``allowed``: cluster.yaml's
    ``serving.allowed_apps``; ``kept``: digest (:func:`config_digest`) of each argus app's config
    when Serve last ran it as argus declared it. Applications being deleted are skipped. An allowed
    name is never removed, an argus app never removed while argus declares it, and an app without
    an HTTP route is never removed unless it is in argus's namespace and argus declares it otherwise.
    """
    carry: set[str] = set()
    remove: set[str] = set()
    take_over: set[str] = set()
    restore: set[str] = set()
    hold: set[str] = set()
    events: list[ServeEvent] = []
    allowed_names = set(allowed)
    for name in sorted(seen):
        app = seen[name]
        if app.status == "DELETING":
            if owned(name) and name in target:
                hold.add(name)  # deployed again once Serve has deleted it
            continue
        where = f"route {app.route}" if app.route is not None else "no route"
        how = "an imperative serve.run app" if app.imperative else "a declarative app"
        if not owned(name):
            if app.route is None or name in allowed_names:
                if not app.imperative:
                    carry.add(name)
                continue
            (take_over if app.imperative else remove).add(name)
            events.append(
                ServeEvent(name, "removed", f"{how} at {where} not deployed by argus nor in serving.allowed_apps")
            )
            continue
        wanted = target.get(name)
        if wanted is None:
            if app.route is not None:  # argus's own names never hold a route it did not give
                (take_over if app.imperative else remove).add(name)
                events.append(ServeEvent(name, "removed", f"{how} at {where} in argus's namespace, not declared"))
            continue
        why = _tampered(app, wanted, kept or {})
        if why is None:
            continue
        if app.imperative or _code(app.config or {}) != _code(wanted):
            # Someone else's code runs under argus's name: removed now, deployed again when gone.
            (take_over if app.imperative else remove).add(name)
            hold.add(name)
            why += " (removed first: deployed again once Serve has deleted it)"
        else:
            restore.add(name)  # the same code: Serve applies argus's config to it in place
        events.append(ServeEvent(name, "restored", why))
    return KeepDecision(
        frozenset(carry),
        frozenset(remove),
        frozenset(take_over),
        frozenset(restore),
        frozenset(hold),
        tuple(events),
    )


# The fields of an application config that Ray 2.60's code version covers (get_app_code_version):
# a change of any of them makes Serve build the application anew, keeping the old deployments
# serving until the build is done.
CODE_FIELDS = ("import_path", "runtime_env", "args")


def _code(config: Mapping[str, Any]) -> dict[str, Any]:
    return {k: config.get(k) for k in CODE_FIELDS}


def _tampered(app: SeenApp, wanted: Mapping[str, Any], kept: Mapping[str, str]) -> str | None:
    """Why the argus app ``app`` runs otherwise than argus declares it (``wanted``), or None when
    it does (or when the difference is argus's own change: the config argus last saw running is
    not the one it declares now)."""
    if app.imperative:
        return f"replaced by an imperative serve.run app at {_route(app.route)}"
    config = app.config or {}
    declared_route = wanted.get("route_prefix")
    if app.route is not None and app.route != declared_route:
        return f"found at route {app.route} (argus gives it {_route(declared_route)})"
    digest = config_digest(wanted)
    if kept.get(app.name) == digest and config_digest(config) != digest:
        changes = field_diff(config, wanted)
        return f"changed by someone else ({summarise(changes, MAX_EVENT_FIELDS) or 'config differs'}); set back"
    return None


def _route(route: object) -> str:
    return "no route" if route is None else f"route {route}"


def config_digest(config: Mapping[str, Any]) -> str:
    """A digest of one normalised application config (what :func:`keep_decision`'s ``kept`` holds)."""
    return stable_hash(dict(config))


def kept_digests(
    seen: Mapping[str, SeenApp], target: Mapping[str, Mapping[str, Any]], before: Mapping[str, str]
) -> dict[str, str]:
    """The ``kept`` digests for the next tick: each app of ``target`` that Serve runs exactly as
    declared now gets its digest; one that runs otherwise keeps its old entry (``before``) while
    argus still declares the same config. Bounded by ``target``. Pure."""
    out: dict[str, str] = {}
    for name, wanted in target.items():
        digest = config_digest(wanted)
        app = seen.get(name)
        runs_as_declared = app is not None and not app.imperative and app.config is not None
        if (runs_as_declared and app is not None and config_digest(app.config or {}) == digest) or before.get(
            name
        ) == digest:
            out[name] = digest
    return out


def with_serve_events(
    statuses: Mapping[ObjectKey, ObjectStatus], events: Iterable[tuple[ObjectKey | None, str]]
) -> tuple[dict[ObjectKey, ObjectStatus], list[str]]:
    """Each event on its model's status (its reason gains the line), the others (the router, foreign
    apps, models no status is reported for) as status notes. Returns new statuses and the notes;
    ``statuses`` is not changed. Pure."""
    out = dict(statuses)
    notes: list[str] = []
    for key, line in events:
        status = out.get(key) if key is not None else None
        if key is None or status is None:
            notes.append(line)
            continue
        out[key] = replace(status, reason=f"{status.reason}; {line}" if status.reason else line)
    return out, notes
