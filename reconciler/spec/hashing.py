"""Spec hashes: what identifies a deployed model config and a task run. Pure."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

from reconciler.spec.types import ClusterSpec, ModelSpec, TaskSpec


def stable_hash(data: object) -> str:
    """Return the hex SHA-256 of ``data`` serialised as canonical JSON."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def model_env(model: ModelSpec, cluster: ClusterSpec) -> dict[str, str]:
    """Cluster env with the model's env on top."""
    return {**cluster.env, **model.env}


def model_spec_hash(model: ModelSpec, cluster: ClusterSpec, checkpoint: str | None = None) -> str:
    """Hash of everything that needs a restart when it changes (not ``replicas``).

    Uses the ``source`` as written (so an offline plan agrees with the cluster), plus the
    resolved checkpoint for ``task:`` sources (a new successful run redeploys the model).
    """
    memo = model.__dict__.get("_argus_hash")  # (cluster, checkpoint, digest): see _remember
    if memo is not None and memo[0] is cluster and memo[1] == checkpoint:
        return memo[2]  # type: ignore[no-any-return]
    serving = cluster.serving
    digest = stable_hash(
        {
            "served_name": model.served_name,
            "source": model.source,
            "checkpoint": checkpoint,
            "gpus_per_replica": model.gpus_per_replica,
            "engine_kwargs": dict(model.engine_kwargs),
            "env": model_env(model, cluster),
            "accelerator": serving.accelerator,
            "accelerator_type": serving.accelerator_type if serving.accelerator == "gpu" else None,
            "cpus_per_replica": serving.cpus_per_replica,
        }
    )[:16]
    _remember(model, (cluster, checkpoint, digest))
    return digest


def task_spec_hash(task: TaskSpec) -> str:
    """Hash of the task file's normalised spec, ``run`` included, ``suspend`` excluded.

    Cluster settings are deliberately left out: editing cluster.yaml must not re-run
    every finished training task.
    """
    memo = task.__dict__.get("_argus_hash")
    if memo is not None:
        return memo  # type: ignore[no-any-return]
    spec: Mapping[str, object] = {k: v for k, v in task.raw.items() if k not in ("suspend", "kind")}
    digest = stable_hash(spec)[:16]
    _remember(task, digest)
    return digest


def _remember(spec: ModelSpec | TaskSpec, memo: object) -> None:
    """Memoise a hash on the (frozen, immutable) spec object, as functools.cached_property does.

    The loader reuses unchanged objects between plans, so a re-plan after one changed file
    hashes one object, not 10,000. ``dataclasses.replace`` builds a new object: no stale memo.
    """
    object.__setattr__(spec, "_argus_hash", memo)


def submission_id(task: TaskSpec) -> str:
    """Ray Job submission id: ``argus-<user>-<task>-<spechash8>``."""
    return f"argus-{task.key.user}-{task.key.name}-{task_spec_hash(task)[:8]}"
