"""Ray Serve application configs for argus models and the router. Pure: dicts in, dicts out.

Naming (everything argus owns starts with ``argus``):

- one application per model, ``argus--<user>--<name>``, with no HTTP route and one
  deployment ``LLMServer:<served_name>`` (Ray Serve LLM's name for it);
- one router application ``argus-router`` at ``/`` whose code and ``args`` never change; the
  table of models it routes travels in its deployment's ``user_config``, which Serve hands to
  the running replicas in place.

Replica counts live only in the application's ``deployments`` override, never in ``args``:
Serve restarts every replica of an application whose ``args`` change, but scales in place
when only ``num_replicas`` changes.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from reconciler.spec.hashing import model_env, model_spec_fields
from reconciler.spec.types import ClusterSpec, ModelSpec

OWNED_PREFIX = "argus--"  # prefix of every model application argus owns
ROUTER_APP = "argus-router"
MODEL_IMPORT_PATH = "reconciler.serve_apps.model_app:build_app"
ROUTER_IMPORT_PATH = "reconciler.serve_apps.router:build_router"
ROUTER_DEPLOYMENT = "ArgusRouter"  # the deployment name in serve_apps/router.py
# The router's ``args``: the version of the user_config table format. Bump it with the format,
# so that Serve restarts replicas whose code reads the old one (user_config reaches them in place).
# 4: the table alone (keys, access, teams and limits moved to argus's endpoint, out of Ray).
ROUTER_ARGS = {"table": 4}
LLM_DEPLOYMENT_PREFIX = "LLMServer:"
# Serve calls each replica's ``check_health`` (vLLM: is the engine process alive) this often and
# replaces a replica after three failures in a row: a dead engine fails the check at once, so it
# is replaced in ~10 s, not the ~30 s of Ray Serve LLM's defaults. The timeout stays long: a live
# engine starved of CPU (a busy host) answers late, and must not be restarted for it. Set in the
# ``deployments`` override, so Serve applies a change of it to running replicas in place.
HEALTH_CHECK = {"health_check_period_s": 3.0, "health_check_timeout_s": 30.0}


def app_name(user: str, name: str) -> str:
    """The Serve application name of model ``users/<user>/models/<name>``."""
    return f"{OWNED_PREFIX}{user}--{name}"


def parse_app_name(name: str) -> tuple[str, str] | None:
    """Return ``(user, name)`` of an application name :func:`app_name` made, else None.

    Injective because user and model names never contain ``--`` (the loader's name rules).
    """
    if not name.startswith(OWNED_PREFIX):
        return None
    parts = name[len(OWNED_PREFIX) :].split("--")
    return (parts[0], parts[1]) if len(parts) == 2 and all(parts) else None


def is_owned_app(name: str) -> bool:
    """True for every application argus manages (the models and the router)."""
    return name.startswith(OWNED_PREFIX) or name == ROUTER_APP


def llm_deployment_name(model_id: str) -> str:
    """The deployment name Ray Serve LLM 2.60 gives an ``LLMServer`` for ``model_id``.

    Mirrors ``ray.llm._internal.serve.core.server.builder._get_deployment_name``.
    """
    return LLM_DEPLOYMENT_PREFIX + model_id.replace("/", "--").replace(".", "_")


def llm_config(model: ModelSpec, cluster: ClusterSpec, source_path: str) -> dict[str, Any]:
    """The keyword arguments of ``ray.serve.llm.LLMConfig`` for ``model`` (JSON-able).

    GPU mode: ``tensor_parallel_size = gpus_per_replica`` GPU bundles packed on one node,
    ``accelerator_type`` from cluster.yaml when set. CPU mode: one bundle of
    ``serving.cpus_per_replica`` CPUs and ``accelerator_config.kind = cpu``.
    """
    serving = cluster.serving
    engine_kwargs: dict[str, Any] = dict(model.engine_kwargs)
    config: dict[str, Any] = {
        "model_loading_config": {"model_id": model.served_name, "model_source": source_path},
        # num_replicas here (not autoscaling) makes the app-level `deployments` override
        # scale in place; the override carries the real count.
        # num_cpus 0: Ray Serve LLM adds the replica actor's resources to the first
        # bundle; with 0 the reservation is exactly the bundles below, which is what
        # the planner counts (reconciler.plan.demand.model_resources_per_replica).
        "deployment_config": {"num_replicas": 1, "ray_actor_options": {"num_cpus": 0}},
        "runtime_env": {"env_vars": model_env(model, cluster)},
    }
    if serving.accelerator == "cpu":
        config["accelerator_config"] = {"kind": "cpu"}
        config["placement_group_config"] = {
            "bundles": [{"CPU": float(serving.cpus_per_replica)}],
            "strategy": "PACK",
        }
    else:
        engine_kwargs["tensor_parallel_size"] = model.gpus_per_replica
        config["placement_group_config"] = {
            "bundles": [{"GPU": 1.0} for _ in range(model.gpus_per_replica)],
            "strategy": "PACK",
        }
        if serving.accelerator_type:
            config["accelerator_type"] = serving.accelerator_type
    config["engine_kwargs"] = engine_kwargs
    if model.alias_field:
        # Read by the router (serve_apps/router.py); the default alias <user>-<name> is not
        # sent: the router derives it from the application name, and configs stay unchanged.
        config["experimental_configs"] = {"argus_alias": model.alias_field}
    return config


def model_app_config(model: ModelSpec, cluster: ClusterSpec, source_path: str, spec_hash: str) -> dict[str, Any]:
    """The Serve REST application entry that serves ``model`` with ``model.replicas`` replicas.

    ``source_path`` is the resolved local model folder; ``spec_hash`` is
    ``model_spec_hash(model, cluster, checkpoint)`` and is stored in ``args.argus`` for the
    observer, with the spec fields it hashes (``args.argus.spec``: a later plan names each
    changed field). Raises ValueError when ``model.replicas < 1`` (a suspended or zero-replica
    model has no application; Serve rejects ``num_replicas: 0``).
    """
    if model.replicas < 1:
        raise ValueError(f"{model.key}: a Serve application needs at least one replica")
    served = model.served_name
    return {
        "name": app_name(model.key.user, model.key.name),
        "route_prefix": None,  # reached through the router only
        "import_path": MODEL_IMPORT_PATH,
        "args": {
            "argus": {
                "user": model.key.user,
                "name": model.key.name,
                "spec_hash": spec_hash,
                "served_name": served,
                "spec": model_spec_fields(model, cluster, source_path if model.source_task else None),
            },
            "llm_config": llm_config(model, cluster, source_path),
        },
        "deployments": [{"name": llm_deployment_name(served), "num_replicas": model.replicas, **HEALTH_CHECK}],
    }


def router_table(model_apps: Iterable[Mapping[str, Any]]) -> list[list[str]]:
    """The model table the router routes: ``[app name, deployment, model id, alias]`` per argus
    model application in ``model_apps`` (configs :func:`model_app_config` made, or carried as
    deployed), sorted by app name. Pure.

    ``alias`` is the file's ``served_name:`` or ``""`` for the default ``<user>-<name>`` (the
    router derives it from the app name). Entries that are not argus model applications or lack
    a model id are left out. Size: an entry is at most ~450 bytes of JSON (names the loader bounds;
    ~120 typically), less than a quarter of the model's own application entry in the same PUT, so
    the table never binds first:
    the bound is the dashboard's 100 MiB limit on the PUT body (Serve sets none on user_config;
    it reaches each replica over Ray's gRPC, 512 MiB).
    """
    rows: list[list[str]] = []
    for app in model_apps:
        name = app.get("name")
        if not isinstance(name, str) or parse_app_name(name) is None:
            continue
        args = app.get("args")
        llm = args.get("llm_config") if isinstance(args, Mapping) else None
        loading = llm.get("model_loading_config") if isinstance(llm, Mapping) else None
        model_id = loading.get("model_id") if isinstance(loading, Mapping) else None
        if not isinstance(model_id, str) or not model_id:
            continue
        extra = llm.get("experimental_configs") if isinstance(llm, Mapping) else None
        alias = extra.get("argus_alias") if isinstance(extra, Mapping) else None
        rows.append([name, llm_deployment_name(model_id), model_id, alias if isinstance(alias, str) else ""])
    return sorted(rows)


def model_access(models: Iterable[ModelSpec], cluster: ClusterSpec) -> dict[str, list[str] | None]:
    """Who besides its owner may call each model, by application name (None: everyone with an API
    key): the endpoint's ``access`` (:func:`gate_config`). Pure."""
    out: dict[str, list[str] | None] = {}
    for model in models:
        access = model.access_in(cluster)
        out[app_name(model.key.user, model.key.name)] = None if access is None else sorted(access)
    return out


def router_app_config(cluster: ClusterSpec, model_apps: Iterable[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """The router application entry routing ``model_apps`` (see :func:`router_table`).

    Its code and ``args`` are the same for every cluster and model set (a change there would
    restart the router). The ``deployments`` override follows ``serving.router`` (Serve applies
    an autoscaling change to running replicas in place, like Ray Serve LLM's own ingress) and
    carries the model table as ``user_config``, which Serve hands to every running replica's
    ``reconfigure()`` in place: it changes only when the set of models does.

    Nothing that decides for users travels here: keys, access rules, teams and limits are the
    endpoint's (:func:`gate_config`), in argus's own processes. Any job can read and rewrite a
    Serve application's config; the router in Ray authenticates nobody and is reached only on
    Serve's internal port.
    """
    router = cluster.serving.router
    return {
        "name": ROUTER_APP,
        "route_prefix": "/",
        "import_path": ROUTER_IMPORT_PATH,
        "args": dict(ROUTER_ARGS),
        "deployments": [
            {
                "name": ROUTER_DEPLOYMENT,
                "autoscaling_config": {
                    "min_replicas": router.min_replicas,
                    "max_replicas": router.max_replicas,
                    "target_ongoing_requests": router.target_ongoing_requests,
                },
                "user_config": {"models": router_table(model_apps)},
            }
        ],
    }


def gate_config(
    cluster: ClusterSpec,
    model_apps: Iterable[Mapping[str, Any]] = (),
    *,
    keys: Mapping[str, str] | None = None,
    access: Mapping[str, list[str] | None] | None = None,
    before: Mapping[str, list[str] | None] | None = None,
) -> dict[str, Any]:
    """The endpoint's gate config (reconciler/endpoint/gate.py) for ``model_apps``. Pure.

    ``models``: the router's table rows (whose model a name is). ``keys`` (sha256 hex of a key ->
    user, from the keys files; None: no keys file, the endpoint is open) and, with keys only,
    ``access`` per application (:func:`model_access`), each user's team and ``limits``
    (:func:`router_limits`, when cluster.yaml sets any rate limit): hashes, never keys. An
    application ``access`` does not name (a model carried as it runs: its file is invalid now)
    keeps the access ``before`` (the last gate config this daemon made) gave it, else only its
    owner may call it: never what a Serve config says, which any job can rewrite.
    """
    config: dict[str, Any] = {"models": router_table(model_apps)}
    if keys is not None:
        config["keys"] = dict(sorted(keys.items()))
        limits = router_limits(cluster)
        if limits is not None:
            config["limits"] = limits
        given, old = access or {}, before or {}
        config["access"] = {
            row[0]: given[row[0]] if row[0] in given else old.get(row[0], [])  # [] : its owner only
            for row in config["models"]
        }
        config["teams"] = {m: t.name for t in sorted(cluster.teams.values(), key=lambda t: t.name) for m in t.members}
    return config


def router_limits(cluster: ClusterSpec) -> dict[str, Any] | None:
    """The router's ``limits``: ``{"default": [rpm, tpm], "users": {u: [rpm, tpm]}, "teams":
    {t: [rpm, tpm]}}`` (null: unlimited; a user or team without a limit of its own is left out),
    or None when cluster.yaml sets no rate limit at all. Pure.

    The router takes a user's entry whole, in place of the default; cluster.yaml overrides key by
    key, so a key the user's entry leaves out is filled from the default here."""
    default = cluster.serving.limits
    users = {
        u: [
            p.requests_per_minute if p.requests_per_minute is not None else default.requests_per_minute,
            p.tokens_per_minute if p.tokens_per_minute is not None else default.tokens_per_minute,
        ]
        for u, p in sorted((cluster.users or {}).items())
        if p.requests_per_minute is not None or p.tokens_per_minute is not None
    }
    teams = {
        t.name: [t.requests_per_minute, t.tokens_per_minute]
        for t in sorted(cluster.teams.values(), key=lambda t: t.name)
        if t.requests_per_minute is not None or t.tokens_per_minute is not None
    }
    pair = [default.requests_per_minute, default.tokens_per_minute]
    if pair == [None, None] and not users and not teams:
        return None
    return {"default": pair, "users": users, "teams": teams}


def serve_config(apps: list[dict[str, Any]], cluster: ClusterSpec) -> dict[str, Any]:
    """The body of ``PUT /api/serve/applications/`` deploying exactly ``apps``.

    ``http_options`` and ``proxy_location`` only take effect when Serve first starts on
    the cluster; later changes are ignored by Serve (the observer reports a mismatch).
    """
    return {
        "proxy_location": cluster.serving.proxy_location,
        "http_options": {"host": "0.0.0.0", "port": cluster.serving.internal_http_port},
        "applications": [copy.deepcopy(a) for a in apps],
    }


# Defaults Ray Serve 2.60 fills into an application's `deployed_app_config` (as returned
# by GET /api/serve/applications/) when the PUT body left them out.
_APP_DEFAULTS: Mapping[str, Any] = {
    "route_prefix": "/",
    "runtime_env": {},
    "deployments": [],
    "args": {},
}
# Fields Serve echoes with their default value; dropped when they equal it.
_APP_DROP_IF: Mapping[str, Any] = {
    "host": "0.0.0.0",
    "port": 8000,
    "autoscaling_policy": None,
    "logging_config": None,
    "external_scaler_enabled": False,
}


def normalise_app(app: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``app`` in a canonical form for comparing desired and deployed configs.

    Fills Serve's defaults for missing fields, drops fields equal to their default, and
    sorts the deployment overrides by name, so a desired entry and the
    ``deployed_app_config`` Serve reports for it compare equal. Does not modify ``app``.
    """
    out: dict[str, Any] = copy.deepcopy(dict(app))
    for key, default in _APP_DEFAULTS.items():
        if key not in out:
            out[key] = copy.deepcopy(default)
    if "route_prefix" in app and app["route_prefix"] is None:
        out["route_prefix"] = None
    for key, default in _APP_DROP_IF.items():
        if key in out and out[key] == default:
            del out[key]
    # A deployed app can hold anything its author PUT: odd entries compare as they are.
    if isinstance(out["deployments"], list):
        out["deployments"] = sorted(
            (dict(d) if isinstance(d, Mapping) else d for d in out["deployments"]),
            key=lambda d: str(d.get("name", "")) if isinstance(d, dict) else str(d),
        )
    return out
