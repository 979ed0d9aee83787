"""``argus render USER/tasks/NAME|USER/models/NAME``: what argus will run for one object, like
``helm template``. Reads the config repository (no cluster, no Ray).

A task shows its verl argv (every override argus adds, then the user's) or its command, the
environment the job gets (``HOME`` and what keeps the job from loading code from it included; secrets
named, never valued), its resources and run folder; a model shows
the resolved source, the engine arguments vLLM gets, the resources per replica and the Serve
application entry argus deploys. Built by :func:`reconciler.builders.resolved.resolved_spec` and
:func:`reconciler.builders.serve.model_app_config`, the same code the daemon submits with.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import yaml

from reconciler.builders.resolved import FROM_DAEMON, resolved_spec
from reconciler.builders.serve import model_app_config
from reconciler.errors import ArgusError
from reconciler.spec.hashing import model_spec_hash
from reconciler.spec.types import DesiredState, ModelSpec, ObjectKey

# The secrets a daemon passes to jobs when its environment sets them (reconciler.tick.SECRET_ENV_NAMES).
SECRETS = ("WANDB_API_KEY", "HF_TOKEN")


def parse_target(text: str) -> ObjectKey:
    """``alice/tasks/x``, ``alice/task/x``, ``users/alice/models/x.yaml`` -> the object's key.
    Raises ArgusError for anything else."""
    parts = text.strip().strip("/").removeprefix("users/").removesuffix(".yaml").split("/")
    kinds = {"models": "model", "model": "model", "tasks": "task", "task": "task"}
    if len(parts) != 3 or parts[1] not in kinds or not parts[0] or not parts[2]:
        raise ArgusError(f"{text!r}: expected USER/tasks/NAME or USER/models/NAME")
    kind = kinds[parts[1]]
    return ObjectKey(parts[0], "model" if kind == "model" else "task", parts[2])


def rendered(state: DesiredState, key: ObjectKey) -> dict[str, Any]:
    """The resolved spec of ``key`` in ``state``. Raises :class:`reconciler.errors.InvalidSpec`
    when cluster.yaml has errors (its issues: nothing would run from this state) or when the object's
    file has errors (that file's issues), ArgusError when there is no such object."""
    from reconciler.errors import InvalidSpec

    if not state.cluster_valid:
        # The daemon applies nothing while cluster.yaml is invalid; what would run is not known either.
        raise InvalidSpec([i for i in state.issues if i.path == "cluster.yaml"])
    if key in state.invalid:
        raise InvalidSpec(state.invalid[key])
    spec = state.models.get(key) if key.kind == "model" else state.tasks.get(key)
    if spec is None:
        raise ArgusError(f"no {key.path} in this repository")
    cluster = state.cluster
    out: dict[str, Any] = {"object": str(key), "file": key.path}
    if isinstance(spec, ModelSpec):
        out.update(resolved_spec(spec, cluster))
        out["gpus"] = spec.replicas * out["resources_per_replica"].get("GPU", 0)
        if spec.replicas > 0 and not spec.suspend:
            source = spec.source_path or out["source_path"]
            checkpoint = source if spec.source_task else None
            out["serve_application"] = model_app_config(
                spec, cluster, source, model_spec_hash(spec, cluster, checkpoint)
            )
        else:
            out["serve_application"] = "(none: replicas 0 or suspended)"
        return out
    if spec.workload != "command" and (spec.model_path is None or spec.data_train is None):
        # Offline (or not yet on the cluster): show the argv with the unresolved paths named in place.
        spec = replace(
            spec,
            model_path=spec.model_path or f"<{spec.model}: resolved on the cluster>",
            data_train=spec.data_train or "<data.train: resolved on the cluster>",
        )
    out.update(resolved_spec(spec, cluster))
    out["gpus"] = spec.gpus
    out["secrets"] = {name: f"{FROM_DAEMON}, when set there" for name in SECRETS}
    if spec.workload != "command":
        out["notes"] = [
            "with WANDB_API_KEY set in the daemon's environment, verl also logs to wandb "
            "(trainer.logger=[console,wandb])"
        ]
    return out


def to_text(doc: dict[str, Any], fmt: str) -> str:
    """``doc`` as YAML (default, block style, keys in build order) or JSON."""
    if fmt == "json":
        return json.dumps(doc, indent=2) + "\n"
    return str(yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, allow_unicode=True, width=1000))
