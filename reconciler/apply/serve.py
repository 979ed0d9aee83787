"""Apply the desired set of Serve applications with one declarative PUT, only when needed. I/O.

``PUT /api/serve/applications/`` replaces the whole set of declarative applications (omitted
ones are deleted), so the body carries argus's applications and the foreign ones that may stay
(no HTTP route, or named by ``serving.allowed_apps``) exactly as deployed. Nothing is sent when
the normalised target equals what runs: even an identical PUT restarts applications that are
still being built (measured with Ray 2.60).

Serve kept as argus declares it (:mod:`reconciler.plan.serve_kept`): a foreign application with
an HTTP route is removed, an argus application someone else changed or replaced is restored. Ray
2.60's dashboard has no per-application delete (``DELETE /api/serve/applications/`` is
``serve.shutdown()``: every application), and a PUT never touches imperative (``serve.run``)
applications it does not name; but a PUT that *names* one turns it into a declarative application
(``ApplicationState.apply_app_config``), and the next PUT, which leaves it out, deletes it
(``apply_app_configs`` deletes every declarative app not in the config). So an imperative app is
removed with two PUTs in one tick (:data:`TAKE_OVER_IMPORT_PATH`), through the same token-only
dashboard API, with no Ray client and no job.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from reconciler.backoff import Backoff
from reconciler.builders.serve import (
    ROUTER_APP,
    is_owned_app,
    normalise_app,
    parse_app_name,
    router_app_config,
    serve_config,
)
from reconciler.dashboard import Dashboard, DashboardError
from reconciler.errors import ApplyDeferred, ApplyRefused
from reconciler.observe.serve import SERVE_APPS_PATH, ServeObservation
from reconciler.plan.serve_kept import KeepDecision, ServeEvent, config_digest, keep_decision, kept_digests
from reconciler.redact import redact
from reconciler.spec.hashing import stable_hash
from reconciler.spec.types import ClusterSpec, ObjectKey

log = logging.getLogger(__name__)

# A build (import + builder call) normally takes seconds; past this, stop waiting for it.
BUILD_DEFER_LIMIT_S = 120.0
# Serve's GET can lag a PUT by a few seconds (notably while Serve itself starts); the same
# target is not sent again within this window, since an identical PUT restarts deploying apps.
PUT_SETTLE_S = 30.0
# What a take-over PUT names an imperative application with: a module that does not exist, so the
# build task Serve starts for it fails at import and runs nothing; the next PUT deletes the app.
TAKE_OVER_IMPORT_PATH = "argus_removed_app:app"
# Each PUT of a removal waits at most this long for the dashboard (the tick is never stalled longer).
TAKE_OVER_TIMEOUT_S = 10.0
# A take-over Serve refused is tried again after the back-off (2 s, doubling, at most this).
TAKE_OVER_BACKOFF_CAP_S = 60.0
_TAKE_OVER = "take-over"  # the back-off key of removals by take-over


def owned_target(
    desired_owned_apps: list[dict[str, Any]],
    observation: ServeObservation,
    cluster: ClusterSpec,
) -> dict[str, dict[str, Any]]:
    """argus's own applications as it declares them, by name: desired owned apps and the router
    (its model table only). Raises ValueError on a foreign or duplicate name in ``desired_owned_apps``
    (a caller bug: argus never writes apps it does not own)."""
    target: dict[str, dict[str, Any]] = {}
    for app in desired_owned_apps:
        name = app["name"]
        if not is_owned_app(name):
            raise ValueError(f"refusing to deploy {name!r}: not an argus application name")
        if name in target:
            raise ValueError(f"application {name!r} is desired twice")
        target[name] = app
    # The router's table lists exactly the model applications this PUT deploys.
    router = router_app_config(cluster, [a for n, a in target.items() if n != ROUTER_APP])
    target[router["name"]] = router
    return target


def decide_kept(
    owned: Mapping[str, Mapping[str, Any]],
    observation: ServeObservation,
    cluster: ClusterSpec,
    kept: Mapping[str, str] | None = None,
) -> KeepDecision:
    """:func:`~reconciler.plan.serve_kept.keep_decision` for what ``observation`` lists against
    argus's ``owned`` target (``kept``: see there). Pure."""
    return keep_decision(
        observation.seen_apps(),
        {n: normalise_app(a) for n, a in owned.items()},
        owned=is_owned_app,
        allowed=cluster.serving.allowed_apps,
        kept=kept,
    )


def target_apps(
    desired_owned_apps: list[dict[str, Any]],
    observation: ServeObservation,
    cluster: ClusterSpec,
) -> dict[str, dict[str, Any]]:
    """Every application the PUT must carry, by name: :func:`owned_target` and the foreign
    declarative apps that may stay (no HTTP route, or in ``serving.allowed_apps``) as deployed.
    Raises ValueError as :func:`owned_target` does."""
    owned = owned_target(desired_owned_apps, observation, cluster)
    decision = decide_kept(owned, observation, cluster)
    return _with_carried(owned, observation, decision)


def _with_carried(
    owned: Mapping[str, dict[str, Any]], observation: ServeObservation, decision: KeepDecision
) -> dict[str, dict[str, Any]]:
    carried = {n: a for n, a in observation.foreign_apps().items() if n in decision.carry}
    gone = decision.hold | decision.remove | decision.take_over
    return {**carried, **{n: a for n, a in owned.items() if n not in gone}}


def deployed_apps(observation: ServeObservation) -> dict[str, dict[str, Any]]:
    """The declarative apps Serve is converging to (apps being deleted are gone already)."""
    return {n: a for n, a in observation.apps.items() if observation.statuses.get(n) != "DELETING"}


def needs_put(target: Mapping[str, Mapping[str, Any]], deployed: Mapping[str, Mapping[str, Any]]) -> bool:
    """True when the normalised target differs from the normalised deployed set. Pure."""
    if set(target) != set(deployed):
        return True
    return any(normalise_app(target[n]) != normalise_app(deployed[n]) for n in target)


def blocking_builds(
    target: Mapping[str, Mapping[str, Any]],
    observation: ServeObservation,
    now: float,
) -> list[str]:
    """Apps still being built that the PUT would carry unchanged (it would restart their build).

    Builds older than BUILD_DEFER_LIMIT_S do not block (a hung build must not freeze argus).
    """
    out = []
    for name in sorted(observation.building):
        if name not in target or name not in observation.apps:
            continue
        if normalise_app(target[name]) != normalise_app(observation.apps[name]):
            continue  # it changes anyway: restarting its build is intended
        if now - observation.building_since.get(name, 0.0) < BUILD_DEFER_LIMIT_S:
            out.append(name)
    return out


def apply_serve(
    dash: Dashboard,
    desired_owned_apps: list[dict[str, Any]],
    observation: ServeObservation,
    cluster: ClusterSpec,
    *,
    clock: Callable[[], float] = time.time,
    memo: dict[str, Any] | None = None,
    events: list[ServeEvent] | None = None,
) -> bool:
    """PUT the target set of applications if it differs from what Serve runs.

    Returns True when it sent a PUT, False when nothing needed to change or when the change
    is deferred because another application is still being built (retry on the next tick).
    Foreign applications without an HTTP route, or named by ``serving.allowed_apps``, are carried
    through exactly as deployed; every other foreign application is removed (an imperative one by
    a take-over PUT first), and an argus application that runs otherwise than argus declares it is
    deployed again as declared (:mod:`reconciler.plan.serve_kept`). Each such event is appended to
    ``events`` (when given) and logged once, redacted. ``memo`` (kept by a long-running caller)
    remembers the last PUT, so the same target is not sent twice within PUT_SETTLE_S while Serve's
    answers catch up (unless something must be removed or restored), which config of each argus
    app last ran as declared, and the take-over's back-off.

    Raises ValueError for a non-argus name in ``desired_owned_apps``, ApplyFailed when Serve
    refuses the config (``permanent`` for a 4xx answer), RayUnavailable when unreachable. A refused
    take-over is not raised: it is a ``failed`` event, retried after a back-off.
    """
    owned = owned_target(desired_owned_apps, observation, cluster)
    found = memo.get("kept") if memo is not None else None
    kept: dict[str, str] = found if isinstance(found, dict) else {}
    last = memo.get("declared") if memo is not None else None
    owned = _set_back(owned, observation, kept, last if isinstance(last, dict) else {})
    decision = decide_kept(owned, observation, cluster, kept)
    target = _with_carried(owned, observation, decision)
    if memo is not None:
        memo["kept"] = kept_digests(
            observation.seen_apps(), {n: normalise_app(a) for n, a in owned.items()}, memo.get("kept") or {}
        )
    urgent = bool(decision.events)
    for event in decision.events:
        log.warning(
            json.dumps({"event": "serve_kept", "app": event.app, "action": event.kind, "detail": redact(event.detail)})
        )
    if events is not None:
        events.extend(decision.events)
    take_over = _due_take_over(decision, memo, clock(), events)
    if not take_over and not needs_put(target, deployed_apps(observation)):
        if memo is not None:  # it runs as argus declares it
            memo["declared"] = {n: copy.deepcopy(a) for n, a in owned.items()}
        return False
    digest = stable_hash({n: normalise_app(a) for n, a in target.items()})
    if (
        not urgent
        and memo is not None
        and memo.get("digest") == digest
        and clock() - memo.get("time", 0.0) < PUT_SETTLE_S
    ):
        return False
    waiting = blocking_builds(target, observation, clock())
    if waiting and not urgent:
        log.info("deferring the Serve update: %s still being built", ", ".join(waiting))
        return False
    if take_over:
        _take_over(dash, take_over, target, cluster, memo, clock(), events)
    body = serve_config([target[n] for n in sorted(target)], cluster)
    try:
        dash.put(SERVE_APPS_PATH, body)
    except DashboardError as exc:
        kind = ApplyRefused if 400 <= exc.status < 500 else ApplyDeferred
        raise kind(f"Serve refused the application config: {exc}") from exc
    if memo is not None:
        memo.update(digest=digest, time=clock(), declared={n: copy.deepcopy(a) for n, a in owned.items()})
    return True


def _set_back(
    owned: dict[str, dict[str, Any]],
    observation: ServeObservation,
    kept: Mapping[str, str],
    declared: Mapping[str, dict[str, Any]],
) -> dict[str, dict[str, Any]]:
    """``owned`` with each app the caller carries as it runs (its config is the deployed one) set
    back to the config argus last declared for it, when Serve ran that one (``kept``) and someone
    changed it since (a model's ``runtime_env`` or engine arguments under the same spec hash).
    Returns a new dict; ``owned`` is not changed. Pure."""
    out = dict(owned)
    for name, app in owned.items():
        before, running = declared.get(name), observation.apps.get(name)
        if before is None or running is None or normalise_app(app) != normalise_app(running):
            continue  # not carried: argus sends its own config anyway
        good = normalise_app(before)
        if kept.get(name) == config_digest(good) and good != normalise_app(app):
            out[name] = copy.deepcopy(before)
    return out


def take_over_app(name: str) -> dict[str, Any]:
    """The entry a take-over PUT names the imperative application ``name`` with (no route, code
    that cannot be imported: nothing of it ever runs)."""
    return {"name": name, "route_prefix": None, "import_path": TAKE_OVER_IMPORT_PATH}


def _backoff(memo: dict[str, Any] | None) -> Backoff:
    """The take-over's back-off, kept in ``memo`` (a fresh one without a memo)."""
    if memo is None:
        return Backoff(cap=TAKE_OVER_BACKOFF_CAP_S)
    found = memo.get("backoff")
    if not isinstance(found, Backoff):
        found = memo["backoff"] = Backoff(cap=TAKE_OVER_BACKOFF_CAP_S)
    return found


def _due_take_over(
    decision: KeepDecision, memo: dict[str, Any] | None, now: float, events: list[ServeEvent] | None
) -> list[str]:
    """The imperative apps to take over now (sorted); none while the back-off waits (a ``failed``
    event per app says when it is tried again)."""
    names = sorted(decision.take_over)
    if not names:
        _backoff(memo).succeeded(_TAKE_OVER)
        return []
    backoff = _backoff(memo)
    if backoff.due(_TAKE_OVER, now):
        return names
    wait = backoff.retry_in(_TAKE_OVER, now) or 0.0
    if events is not None:
        events.extend(ServeEvent(n, "failed", f"removal retried in {wait:.0f}s") for n in names)
    return []


def _take_over(
    dash: Dashboard,
    names: list[str],
    target: Mapping[str, dict[str, Any]],
    cluster: ClusterSpec,
    memo: dict[str, Any] | None,
    now: float,
    events: list[ServeEvent] | None,
) -> None:
    """PUT ``target`` with the imperative apps ``names`` named too (they become declarative; the
    PUT that follows leaves them out, which deletes them). A refusal is a ``failed`` event per app
    and a back-off, never raised: the PUT of ``target`` goes on. Raises RayUnavailable."""
    apps = {**target, **{n: take_over_app(n) for n in names}}
    body = serve_config([apps[n] for n in sorted(apps)], cluster)
    backoff = _backoff(memo)
    try:
        dash.put(SERVE_APPS_PATH, body, timeout=TAKE_OVER_TIMEOUT_S)
    except DashboardError as exc:
        delay = backoff.failed(_TAKE_OVER, now)
        why = redact(str(exc))[:200]
        log.warning(json.dumps({"event": "serve_kept", "action": "failed", "apps": names, "detail": why}))
        if events is not None:
            events.extend(
                ServeEvent(n, "failed", f"Serve refused the take-over ({why}); retried in {delay:.0f}s") for n in names
            )
        return
    backoff.succeeded(_TAKE_OVER)


# An event stays on its object's status (or in the status notes) this long after it happened, so
# that a status write superseded by a later tick's cannot lose it; the log has it once.
SERVE_EVENT_KEEP_S = 600.0
# At most this many events are kept (the newest): a job deploying apps in a loop cannot grow it.
SERVE_EVENT_MAX = 50


class ServeEventLog:
    """The recent Serve-kept events, one per application (its latest), newest SERVE_EVENT_MAX, each
    for SERVE_EVENT_KEEP_S seconds."""

    def __init__(self) -> None:
        self._events: dict[str, tuple[float, ServeEvent]] = {}

    def record(self, events: list[ServeEvent], now: float) -> tuple[tuple[ObjectKey | None, str], ...]:
        """Add ``events`` (happened at ``now``, epoch seconds); return every kept event as
        (model key, or None for the router and other apps; its line with its UTC time), oldest
        first."""
        for event in events:
            self._events.pop(event.app, None)
            self._events[event.app] = (now, event)
        fresh = [(n, e) for n, e in self._events.items() if now - e[0] < SERVE_EVENT_KEEP_S]
        self._events = dict(fresh[-SERVE_EVENT_MAX:])
        out: list[tuple[ObjectKey | None, str]] = []
        for name, (when, event) in self._events.items():
            parsed = parse_app_name(name)
            key = ObjectKey(parsed[0], "model", parsed[1]) if parsed else None
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))
            out.append((key, redact(f"{event.text()} (at {stamp})")))
        return tuple(out)

    def __len__(self) -> int:
        return len(self._events)
