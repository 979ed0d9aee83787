"""Observe Ray Serve through the dashboard's REST API: owned models, every app's config. I/O.

One ``GET /api/serve/applications/`` gives everything: each application's status and
``deployed_app_config`` (exactly what the last PUT sent for it), each deployment's replicas
and the running instance's ``http_options``/``proxy_location``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from reconciler.builders.serve import (
    LLM_DEPLOYMENT_PREFIX,
    MODEL_IMPORT_PATH,
    OWNED_PREFIX,
    ROUTER_APP,
    is_owned_app,
    normalise_app,
    parse_app_name,
)
from reconciler.dashboard import Dashboard
from reconciler.plan.actual import ActualModel
from reconciler.plan.serve_kept import SeenApp
from reconciler.spec.types import ClusterSpec, ObjectKey

SERVE_APPS_PATH = "/api/serve/applications/"


@dataclass(frozen=True)
class ServeObservation:
    """What Serve runs now.

    ``apps``: the ``deployed_app_config`` of every declaratively deployed application
    (owned and foreign), by name; ``statuses``: every application's status (imperative
    ``serve.run`` apps too); ``building``: apps whose code is still being imported and built
    (a PUT that includes them restarts that build, even with an unchanged config);
    ``imperative``: apps deployed with ``serve.run`` (no config; a PUT that names one makes it
    declarative); ``routes``: every application's HTTP route (None: none), imperative ones too;
    ``http_options``/``proxy_location``: those of the running Serve instance (None before
    Serve starts); ``replica_ids``: RUNNING replica ids per application, for tests and logs.
    """

    models: dict[ObjectKey, ActualModel] = field(default_factory=dict)
    apps: dict[str, dict[str, Any]] = field(default_factory=dict)
    statuses: dict[str, str] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)
    building: frozenset[str] = frozenset()
    building_since: dict[str, float] = field(default_factory=dict)
    imperative: frozenset[str] = frozenset()
    routes: dict[str, str | None] = field(default_factory=dict)
    replica_ids: dict[str, tuple[str, ...]] = field(default_factory=dict)
    http_options: dict[str, Any] | None = None
    proxy_location: str | None = None

    @property
    def serve_running(self) -> bool:
        """True once a Serve instance (controller) exists on the cluster."""
        return self.http_options is not None

    def foreign_apps(self) -> dict[str, dict[str, Any]]:
        """Declarative apps argus does not own, as deployed. A PUT carries only those that
        :func:`reconciler.plan.serve_kept.keep_decision` keeps (no route, or allowed)."""
        return {n: a for n, a in self.apps.items() if not is_owned_app(n)}

    def seen_apps(self) -> dict[str, SeenApp]:
        """Every application Serve lists (imperative ones too), as the keep decision reads it:
        route, kind, normalised config and status, by name."""
        return {
            name: SeenApp(
                name=name,
                route=self.routes.get(name),
                imperative=name in self.imperative,
                config=normalise_app(self.apps[name]) if name in self.apps else None,
                status=status,
            )
            for name, status in self.statuses.items()
        }

    @property
    def router_status(self) -> str | None:
        return self.statuses.get(ROUTER_APP)

    def settings_mismatch(self, cluster: ClusterSpec) -> list[str]:
        """Messages for cluster.yaml serving settings the running Serve instance does not use.

        Serve reads ``http_options`` and ``proxy_location`` only when it first starts; changing
        them needs ``serve shutdown`` (which stops every application) by an admin.
        """
        if not self.serve_running:
            return []
        out = []
        port = (self.http_options or {}).get("port")
        if port != cluster.serving.internal_http_port:
            out.append(
                f"serving.internal_http_port is {cluster.serving.internal_http_port} but Serve listens on {port}: "
                "Serve reads it only at first start (restart Serve to change it)"
            )
        if self.proxy_location is not None and self.proxy_location != cluster.serving.proxy_location:
            out.append(
                f"serving.proxy_location is {cluster.serving.proxy_location} but Serve runs with "
                f"{self.proxy_location}: Serve reads it only at first start (restart Serve to change it)"
            )
        return out


def observe_serve(dash: Dashboard) -> ServeObservation:
    """Read Serve's state. Raises RayUnavailable / DashboardError from the dashboard client."""
    return parse_serve_details(dash.get(SERVE_APPS_PATH) or {})


def parse_serve_details(details: Mapping[str, Any]) -> ServeObservation:
    """Turn a ``GET /api/serve/applications/`` body into a :class:`ServeObservation`. Pure."""
    models: dict[ObjectKey, ActualModel] = {}
    apps: dict[str, dict[str, Any]] = {}
    statuses: dict[str, str] = {}
    messages: dict[str, str] = {}
    building: set[str] = set()
    building_since: dict[str, float] = {}
    imperative: set[str] = set()
    routes: dict[str, str | None] = {}
    replica_ids: dict[str, tuple[str, ...]] = {}
    # Ray writes this body, but every ``deployed_app_config`` holds what a PUT sent, and code on
    # the cluster can PUT anything under any name: each value is type-checked, never trusted.
    for name, app in _mapping(details.get("applications")).items():
        if not isinstance(name, str) or not isinstance(app, Mapping):
            continue
        statuses[name] = str(app.get("status", ""))
        messages[name] = str(app.get("message") or "")
        deployments = _mapping(app.get("deployments"))
        replica_ids[name] = tuple(
            str(r.get("replica_id", ""))
            for d in deployments.values()
            for r in _list(_mapping(d).get("replicas"))
            if isinstance(r, Mapping) and r.get("state") == "RUNNING"
        )
        config = app.get("deployed_app_config")
        live = app.get("route_prefix")
        routes[name] = live if isinstance(live, str) else None
        if app.get("source") == "imperative" or not isinstance(config, Mapping):
            imperative.add(name)
            continue
        if routes[name] is None:
            # Still being built: the route its config asks for (Serve's default "/") is live soon.
            declared = config.get("route_prefix", "/")
            routes[name] = declared if isinstance(declared, str) else None
        if statuses[name] == "DEPLOYING" and not deployments:
            # The build task (import + builder call) has not produced deployments yet.
            building.add(name)
            building_since[name] = _number(app.get("last_deployed_time_s"))
        apps[name] = copy.deepcopy(dict(config))
        if name.startswith(OWNED_PREFIX):
            model = _actual_model(name, app, config)
            if model is not None:
                models[model.key] = model
    return ServeObservation(
        models=models,
        apps=apps,
        statuses=statuses,
        messages=messages,
        building=frozenset(building),
        building_since=building_since,
        imperative=frozenset(imperative),
        routes=routes,
        replica_ids=replica_ids,
        http_options=dict(http) if isinstance(http := details.get("http_options"), Mapping) else None,
        proxy_location=proxy if isinstance(proxy := details.get("proxy_location"), str) else None,
    )


def _actual_model(name: str, app: Mapping[str, Any], config: Mapping[str, Any]) -> ActualModel | None:
    """The :class:`ActualModel` of one owned app; None when the name has no user/model part.

    Never raises: args of an unexpected type (an app someone else PUT under argus's name)
    read as an owned app with an unknown spec (empty hash, no spec, resources counted 0),
    so the planner replaces it with the desired config, or deletes it when no file declares
    it. An ``argus--`` name that does not parse is in no model but is still argus's: the
    PUT leaves it out (deletes it), as the namespace is argus's alone.
    """
    args = _mapping(config.get("args"))
    meta = _mapping(args.get("argus"))
    llm = _mapping(args.get("llm_config"))
    # The key comes from the application name (injective, and one Serve app per name), never
    # from the args: a hand-made app whose args claim another object must not stand in for it.
    # Missing metadata (hand-made or older app) leaves an empty spec hash: the planner redeploys it.
    parsed = parse_app_name(name)
    if parsed is None:
        return None
    user, model_name = parsed
    served = meta.get("served_name") or _mapping(llm.get("model_loading_config")).get("model_id", "")
    spec_hash = meta.get("spec_hash", "")
    if config.get("import_path") != MODEL_IMPORT_PATH or config.get("route_prefix", "/") is not None:
        # Not the code or the route argus gives a model (someone else PUT it): whatever its args
        # claim, the planner deploys argus's config again (reconciler/plan/serve_kept.py reports it).
        spec_hash = ""
    deployments = _mapping(app.get("deployments"))
    llm_dep = _llm_deployment(deployments)
    ready = 0
    message = str(app.get("message") or "")
    if llm_dep is not None:
        dep = _mapping(deployments[llm_dep])
        ready = sum(1 for r in _list(dep.get("replicas")) if isinstance(r, Mapping) and r.get("state") == "RUNNING")
        dep_message = str(dep.get("message") or "")
        if dep_message and dep_message not in message:
            # e.g. "...replicas that have taken more than 30s to be scheduled..." (no resources)
            message = f"{message}\n{dep_message}".strip()
    return ActualModel(
        key=ObjectKey(user, "model", model_name),
        served_name=served if isinstance(served, str) else "",
        spec_hash=spec_hash if isinstance(spec_hash, str) else "",
        replicas=_target_replicas(config, llm),
        ready_replicas=ready,
        status=str(app.get("status", "")),
        message=message,
        resources_per_replica=resources_per_replica(llm),
        spec=meta.get("spec") if isinstance(meta.get("spec"), Mapping) else None,
    )


def _llm_deployment(deployments: Mapping[str, Any]) -> str | None:
    for dep_name in deployments:
        if isinstance(dep_name, str) and dep_name.startswith(LLM_DEPLOYMENT_PREFIX):
            return dep_name
    return next(iter(deployments)) if len(deployments) == 1 else None


def _target_replicas(config: Mapping[str, Any], llm: Mapping[str, Any]) -> int:
    """``num_replicas`` of the app-level override, else of the LLMConfig, else 1."""
    for dep in _list(config.get("deployments")):
        if not isinstance(dep, Mapping):
            continue
        value = dep.get("num_replicas")
        if str(dep.get("name", "")).startswith(LLM_DEPLOYMENT_PREFIX) and _is_number(value):
            return int(_number(value))
    value = _mapping(llm.get("deployment_config")).get("num_replicas", 1)
    return int(_number(value)) if _is_number(value) else 1


def resources_per_replica(llm_config: Mapping[str, Any]) -> dict[str, float]:
    """Ray resources one replica reserves, from its LLMConfig arguments. Pure; never raises.

    Ray Serve LLM reserves the placement-group bundles plus the replica actor's own
    resources (``ray_actor_options``, 1 CPU unless set; argus sets 0). Zero entries are dropped;
    a value that is not a number counts 0 (unknown), a non-string key is skipped.
    """
    out: dict[str, float] = {}
    pg = _mapping(llm_config.get("placement_group_config"))
    for bundle in _list(pg.get("bundles")):
        _add(out, _mapping(bundle))
    actor = _mapping(_mapping(llm_config.get("deployment_config")).get("ray_actor_options"))
    out["CPU"] = out.get("CPU", 0.0) + _number(actor.get("num_cpus", 1))
    out["GPU"] = out.get("GPU", 0.0) + _number(actor.get("num_gpus", 0))
    _add(out, _mapping(actor.get("resources")))
    return {k: v for k, v in out.items() if v}


def _add(out: dict[str, float], resources: Mapping[Any, Any]) -> None:
    for key, value in resources.items():
        if isinstance(key, str):
            out[key] = out.get(key, 0.0) + _number(value)


def _mapping(value: object) -> Mapping[Any, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _number(value: object) -> float:
    """``value`` as a float when it is a finite number, else 0.0 (unknown)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return 0.0
