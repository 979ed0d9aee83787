"""Pure tests of the Serve config builders, the observer's parsing and the apply decision."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from typing import Any

import pytest

from reconciler.apply.serve import blocking_builds, needs_put, target_apps
from reconciler.builders.serve import (
    HEALTH_CHECK,
    app_name,
    is_owned_app,
    llm_deployment_name,
    model_app_config,
    normalise_app,
    router_app_config,
    serve_config,
)
from reconciler.observe.serve import parse_serve_details, resources_per_replica
from reconciler.plan.demand import model_resources_per_replica
from reconciler.spec.hashing import model_spec_fields, model_spec_hash
from reconciler.spec.types import ClusterSpec, ModelSpec, ObjectKey, RouterSettings, Serving

CPU = ClusterSpec(serving=Serving(accelerator="cpu", cpus_per_replica=2.0, http_port=8124, internal_http_port=8123))
GPU = ClusterSpec(serving=Serving(accelerator="gpu", accelerator_type="H100"))


def spec(replicas: int = 1, gpus: int = 2, name: str = "chat", **engine: Any) -> ModelSpec:
    return ModelSpec(
        key=ObjectKey("alice", "model", name),
        source="hf:org/model",
        source_path="/hf/model",
        source_task=None,
        replicas=replicas,
        gpus_per_replica=gpus,
        engine_kwargs={"max_model_len": 4096, **engine},
        env={"A": "1"},
        suspend=False,
        created_at=1764417600,
    )


def test_names() -> None:
    assert app_name("alice", "chat") == "argus--alice--chat"
    assert llm_deployment_name("org/Qwen2.5-0.5B") == "LLMServer:org--Qwen2_5-0_5B"
    assert is_owned_app("argus--a--b") and is_owned_app("argus-router")
    assert not is_owned_app("argus") and not is_owned_app("someone")


def test_gpu_mode_config() -> None:
    m = spec(replicas=3, gpus=2)
    app = model_app_config(m, GPU, "/hf/snap", "h1")
    assert app["name"] == "argus--alice--chat"
    assert app["route_prefix"] is None
    assert app["import_path"] == "reconciler.serve_apps.model_app:build_app"
    assert app["deployments"] == [{"name": "LLMServer:alice-202511291200-chat", "num_replicas": 3, **HEALTH_CHECK}]
    meta = app["args"]["argus"]
    assert {k: v for k, v in meta.items() if k != "spec"} == {
        "user": "alice",
        "name": "chat",
        "spec_hash": "h1",
        "served_name": m.served_name,
    }
    assert meta["spec"] == model_spec_fields(m, GPU)  # what the hash covers, for field-level diffs
    llm = app["args"]["llm_config"]
    assert llm["model_loading_config"] == {"model_id": m.served_name, "model_source": "/hf/snap"}
    assert llm["engine_kwargs"] == {"max_model_len": 4096, "tensor_parallel_size": 2}
    assert llm["placement_group_config"] == {"bundles": [{"GPU": 1.0}, {"GPU": 1.0}], "strategy": "PACK"}
    assert llm["accelerator_type"] == "H100"
    assert "accelerator_config" not in llm
    assert llm["deployment_config"]["num_replicas"] == 1  # the override carries the count
    assert llm["runtime_env"] == {"env_vars": {"HF_HUB_OFFLINE": "1", "A": "1"}}
    json.dumps(app)  # a REST body: JSON only


def test_cpu_mode_config() -> None:
    llm = model_app_config(spec(), CPU, "/hf/snap", "h")["args"]["llm_config"]
    assert llm["accelerator_config"] == {"kind": "cpu"}
    assert llm["placement_group_config"]["bundles"] == [{"CPU": 2.0}]
    assert "accelerator_type" not in llm
    assert "tensor_parallel_size" not in llm["engine_kwargs"]


@pytest.mark.parametrize("cluster", [CPU, GPU])
def test_reserved_resources_match_the_planners_demand(cluster: ClusterSpec) -> None:
    m = spec(gpus=2)
    llm = model_app_config(m, cluster, "/p", "h")["args"]["llm_config"]
    assert resources_per_replica(llm) == model_resources_per_replica(m, cluster)


def test_args_do_not_depend_on_replicas() -> None:
    one = model_app_config(spec(replicas=1), GPU, "/p", model_spec_hash(spec(replicas=1), GPU))
    four = model_app_config(spec(replicas=4), GPU, "/p", model_spec_hash(spec(replicas=4), GPU))
    assert one["args"] == four["args"]
    assert one["deployments"] != four["deployments"]


def test_zero_replicas_rejected() -> None:
    with pytest.raises(ValueError):
        model_app_config(spec(replicas=0), GPU, "/p", "h")


def test_router_and_serve_config() -> None:
    router = router_app_config(CPU)
    assert router == router_app_config(GPU)  # only serving.router matters: same code and args everywhere
    assert router["name"] == "argus-router" and router["route_prefix"] == "/" and router["args"] == {"table": 4}
    # Two replicas by default (losing one drops no request), autoscaled like Ray Serve LLM's ingress.
    assert router["deployments"] == [
        {
            "name": "ArgusRouter",
            "autoscaling_config": {"min_replicas": 2, "max_replicas": 8, "target_ongoing_requests": 16.0},
            "user_config": {"models": []},
        }
    ]
    bigger = replace(CPU, serving=replace(CPU.serving, router=RouterSettings(min_replicas=3, max_replicas=12)))
    changed = router_app_config(bigger)
    # A settings change touches only the deployments override, which Serve applies in place.
    assert {k: v for k, v in changed.items() if k != "deployments"} == {
        k: v for k, v in router.items() if k != "deployments"
    }
    assert changed["deployments"][0]["autoscaling_config"]["min_replicas"] == 3
    body = serve_config([router], CPU)
    # Serve's own proxy listens on the internal port: clients call argus's endpoint at http_port.
    assert body["http_options"] == {"host": "0.0.0.0", "port": 8123}
    assert body["proxy_location"] == "HeadOnly"
    assert body["applications"] == [router] and body["applications"][0] is not router


def test_normalise_round_trip() -> None:
    app = model_app_config(spec(), CPU, "/p", "h")
    # What GET /api/serve/applications/ returns for it (Ray 2.60 echoes the set fields; JSON floats).
    deployed = json.loads(json.dumps(app))
    assert normalise_app(app) == normalise_app(deployed)
    router = router_app_config(CPU)
    # Ray 2.60 echoes the override exactly (measured against a real head), floats as floats.
    assert normalise_app(router) == normalise_app({**json.loads(json.dumps(router)), "runtime_env": {}, "port": 8000})
    assert normalise_app({"name": "x", "import_path": "m:a"})["route_prefix"] == "/"
    assert normalise_app({"name": "x", "import_path": "m:a", "route_prefix": None})["route_prefix"] is None
    scaled = copy.deepcopy(app)
    scaled["deployments"][0]["num_replicas"] = 2
    assert normalise_app(scaled) != normalise_app(app)
    assert app == model_app_config(spec(), CPU, "/p", "h")  # not modified


def details(apps: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A minimal GET /api/serve/applications/ body with RUNNING apps of one replica each."""
    out: dict[str, Any] = {"http_options": {"host": "0.0.0.0", "port": 8000}, "proxy_location": "HeadOnly"}
    out["applications"] = {
        name: {
            "status": "RUNNING",
            "message": "",
            "source": "declarative",
            "last_deployed_time_s": 100.0,
            "deployed_app_config": cfg,
            "deployments": {
                (cfg.get("deployments") or [{"name": "D"}])[0]["name"]: {
                    "status": "HEALTHY",
                    "message": "",
                    "replicas": [{"replica_id": f"{name}-r1", "state": "RUNNING"}],
                }
            },
        }
        for name, cfg in apps.items()
    }
    return out


def test_observer_parses_owned_foreign_and_imperative() -> None:
    m = spec(replicas=2)
    app = json.loads(json.dumps(model_app_config(m, CPU, "/p", "h")))
    foreign = {"name": "other", "import_path": "x:y"}
    body = details({app["name"]: app, "argus-router": router_app_config(CPU), "other": foreign})
    body["applications"]["manual"] = {"status": "RUNNING", "source": "imperative", "deployed_app_config": None}
    obs = parse_serve_details(body)
    actual = obs.models[m.key]
    assert (actual.replicas, actual.ready_replicas, actual.status) == (2, 1, "RUNNING")
    assert actual.spec_hash == "h" and actual.served_name == m.served_name
    assert actual.spec == model_spec_fields(m, CPU)  # read back for field-level diffs
    assert dict(actual.resources_per_replica) == {"CPU": 2.0}
    assert obs.foreign_apps() == {"other": foreign}
    assert obs.imperative == {"manual"} and "manual" not in obs.apps
    assert obs.settings_mismatch(CPU)[0].startswith("serving.internal_http_port is 8123")


def test_apply_decision() -> None:
    app = model_app_config(spec(), CPU, "/p", "h")
    foreign = {"name": "other", "import_path": "x:y", "route_prefix": None}  # no HTTP route: carried
    running = {app["name"]: app, "argus-router": router_app_config(CPU, [app]), "other": foreign}
    obs = parse_serve_details(details(running))
    target = target_apps([app], obs, CPU)
    assert set(target) == {app["name"], "argus-router", "other"}
    assert not needs_put(target, obs.apps)
    # With a route (Serve's default "/" when unset) it goes, unless cluster.yaml allows it.
    routed = parse_serve_details(details({**running, "other": {"name": "other", "import_path": "x:y"}}))
    assert set(target_apps([app], routed, CPU)) == {app["name"], "argus-router"}
    allowing = replace(CPU, serving=replace(CPU.serving, allowed_apps=("other",)))
    assert set(target_apps([app], routed, allowing)) == {app["name"], "argus-router", "other"}
    assert needs_put(target_apps([], obs, CPU), obs.apps)  # removing the model
    with pytest.raises(ValueError):
        target_apps([foreign], obs, CPU)


def test_building_apps_defer_unrelated_changes() -> None:
    a = model_app_config(spec(name="a"), CPU, "/p", "h")
    b = model_app_config(spec(name="b"), CPU, "/p", "h")
    body = details({a["name"]: a, "argus-router": router_app_config(CPU)})
    body["applications"][a["name"]].update(status="DEPLOYING", deployments={})
    obs = parse_serve_details(body)
    assert obs.building == {a["name"]}
    target = target_apps([a, b], obs, CPU)
    assert blocking_builds(target, obs, now=110.0) == [a["name"]]
    assert blocking_builds(target, obs, now=1000.0) == []  # a hung build does not block forever
    changed = copy.deepcopy(a)
    changed["args"]["argus"]["spec_hash"] = "h2"
    assert blocking_builds(target_apps([changed, b], obs, CPU), obs, now=110.0) == []


def test_router_settings_are_checked_at_their_line() -> None:
    from reconciler.spec.loader import SourceFile, load

    text = b"kind: Cluster\nserving:\n  router:\n    min_replicas: 4\n    max_replicas: 2\n"
    state = load([SourceFile("cluster.yaml", text, "b1")])
    assert [str(i) for i in state.issues] == [
        "cluster.yaml:5: serving.router.max_replicas: 2 is below min_replicas (4)"
    ]
    assert not state.cluster_valid
    ok = load([SourceFile("cluster.yaml", b"kind: Cluster\nserving: {router: {min_replicas: 3}}\n", "b2")])
    assert ok.cluster.serving.router == RouterSettings(min_replicas=3, max_replicas=8, target_ongoing_requests=16.0)
