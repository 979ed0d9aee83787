"""Apply the desired set of Serve applications with one declarative PUT, only when needed. I/O.

``PUT /api/serve/applications/`` replaces the whole set of declarative applications (omitted
ones are deleted), so the body always carries every foreign application exactly as deployed,
plus the router. Nothing is sent when the normalised target equals what runs: even an
identical PUT restarts applications that are still being built (measured with Ray 2.60).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from reconciler.builders.serve import ROUTER_APP, is_owned_app, normalise_app, router_app_config, serve_config
from reconciler.dashboard import Dashboard, DashboardError
from reconciler.errors import ApplyDeferred, ApplyRefused
from reconciler.observe.serve import SERVE_APPS_PATH, ServeObservation
from reconciler.spec.hashing import stable_hash
from reconciler.spec.types import ClusterSpec

log = logging.getLogger(__name__)

# A build (import + builder call) normally takes seconds; past this, stop waiting for it.
BUILD_DEFER_LIMIT_S = 120.0
# Serve's GET can lag a PUT by a few seconds (notably while Serve itself starts); the same
# target is not sent again within this window, since an identical PUT restarts deploying apps.
PUT_SETTLE_S = 30.0


def target_apps(
    desired_owned_apps: list[dict[str, Any]],
    observation: ServeObservation,
    cluster: ClusterSpec,
) -> dict[str, dict[str, Any]]:
    """Every application the PUT must carry, by name: desired owned apps, the router, and every
    foreign declarative app as deployed. Raises ValueError on a foreign or duplicate name in ``desired_owned_apps`` (a
    caller bug: argus never writes apps it does not own)."""
    target: dict[str, dict[str, Any]] = dict(observation.foreign_apps())
    for app in desired_owned_apps:
        name = app["name"]
        if not is_owned_app(name):
            raise ValueError(f"refusing to deploy {name!r}: not an argus application name")
        if name in target and is_owned_app(name):
            raise ValueError(f"application {name!r} is desired twice")
        target[name] = app
    # The router's table lists exactly the model applications this PUT deploys.
    router = router_app_config(cluster, [a for n, a in target.items() if n != ROUTER_APP])
    target[router["name"]] = router
    return target


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
) -> bool:
    """PUT the target set of applications if it differs from what Serve runs.

    Returns True when it sent a PUT, False when nothing needed to change or when the change
    is deferred because another application is still being built (retry on the next tick).
    Foreign applications are carried through exactly as deployed and never altered;
    imperatively deployed ones (``serve.run``) are not part of a PUT and stay untouched.
    ``memo`` (kept by a long-running caller) remembers the last PUT, so the same target is
    not sent twice within PUT_SETTLE_S while Serve's answers catch up.

    Raises ValueError for a non-argus name in ``desired_owned_apps``, ApplyFailed when Serve
    refuses the config (``permanent`` for a 4xx answer), RayUnavailable when unreachable.
    """
    target = target_apps(desired_owned_apps, observation, cluster)
    if not needs_put(target, deployed_apps(observation)):
        return False
    digest = stable_hash({n: normalise_app(a) for n, a in target.items()})
    if memo is not None and memo.get("digest") == digest and clock() - memo.get("time", 0.0) < PUT_SETTLE_S:
        return False
    waiting = blocking_builds(target, observation, clock())
    if waiting:
        log.info("deferring the Serve update: %s still being built", ", ".join(waiting))
        return False
    body = serve_config([target[n] for n in sorted(target)], cluster)
    try:
        dash.put(SERVE_APPS_PATH, body)
    except DashboardError as exc:
        kind = ApplyRefused if 400 <= exc.status < 500 else ApplyDeferred
        raise kind(f"Serve refused the application config: {exc}") from exc
    if memo is not None:
        memo.update(digest=digest, time=clock())
    return True
