"""Spec hashes: what identifies a deployed model config and a task run. Pure."""

from __future__ import annotations

import hashlib
import json

from reconciler.spec.types import ClusterSpec, ModelSpec, TaskSpec


def stable_hash(data: object) -> str:
    """Return the hex SHA-256 of ``data`` serialised as canonical JSON."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def model_env(model: ModelSpec, cluster: ClusterSpec) -> dict[str, str]:
    """Cluster env with the model's env on top."""
    return {**cluster.env, **model.env}


def model_spec_fields(model: ModelSpec, cluster: ClusterSpec, checkpoint: str | None = None) -> dict[str, object]:
    """Everything that needs a restart when it changes (not ``replicas``), as plain JSON data.

    What :func:`model_spec_hash` hashes, and what a deployed app records so that a later plan
    can say which field changed and how.
    """
    serving = cluster.serving
    fields: dict[str, object] = {
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
    # Only a `served_name:` the file sets travels in the app config (the router derives the
    # default alias from the application name): models without one keep their hash.
    if model.alias_field:
        fields["alias"] = model.alias_field
    return fields


def model_spec_hash(model: ModelSpec, cluster: ClusterSpec, checkpoint: str | None = None) -> str:
    """Hash of everything that needs a restart when it changes (not ``replicas``).

    Uses the ``source`` as written (so an offline plan agrees with the cluster), plus the
    resolved checkpoint for ``task:`` sources (a new successful run redeploys the model).
    """
    memo = model.__dict__.get("_argus_hash")  # (cluster, checkpoint, digest): see _remember
    if memo is not None and memo[0] is cluster and memo[1] == checkpoint:
        return memo[2]  # type: ignore[no-any-return]
    digest = stable_hash(model_spec_fields(model, cluster, checkpoint))[:16]
    _remember(model, (cluster, checkpoint, digest))
    return digest


def task_spec_fields(task: TaskSpec) -> dict[str, object]:
    """The task file's normalised spec without ``suspend``/``kind``: what :func:`task_spec_hash`
    hashes, and what a submitted job records for field-level diffs."""
    return {k: v for k, v in task.raw.items() if k not in ("suspend", "kind")}


def task_spec_hash(task: TaskSpec) -> str:
    """Hash of the task file's normalised spec, ``run`` included, ``suspend`` excluded.

    Cluster settings are deliberately left out: editing cluster.yaml must not re-run
    every finished training task.
    """
    memo = task.__dict__.get("_argus_hash")
    if memo is not None:
        return memo  # type: ignore[no-any-return]
    digest = stable_hash(task_spec_fields(task))[:16]
    _remember(task, digest)
    return digest


def _remember(spec: ModelSpec | TaskSpec, memo: object) -> None:
    """Memoise a hash on the (frozen, immutable) spec object, as functools.cached_property does.

    The loader reuses unchanged objects between plans, so a re-plan after one changed file
    hashes one object, not 10,000. ``dataclasses.replace`` builds a new object: no stale memo.
    """
    object.__setattr__(spec, "_argus_hash", memo)


# Derived names. User and object names never contain "--" nor end with "-" (the loader's
# USER_RE/NAME_RE), so "--" separates their parts unambiguously and every derived name parses
# back to exactly one (user, name): two objects can never share a Serve application, a Ray
# submission id or a run folder (tests/unit/test_names.py proves it over generated names).
SEPARATOR = "--"
SUBMISSION_PREFIX = "argus--"


def submission_id(task: TaskSpec, attempt: int = 1) -> str:
    """Ray Job submission id: ``argus--<user>--<task>--<spechash8>``, ``--<attempt>`` from the 2nd.

    The spec hash covers the file's content only, so the key is part of the id: two tasks with
    identical content have different ids. ``attempt`` > 1 is a fresh id for when a job argus
    cannot prove it submitted already holds the id (see ``reconciler.builders.jobs``).
    """
    base = f"{SUBMISSION_PREFIX}{task.key.user}{SEPARATOR}{task.key.name}{SEPARATOR}{task_spec_hash(task)[:8]}"
    return base if attempt <= 1 else f"{base}{SEPARATOR}{attempt}"


def parse_submission_id(sid: str) -> tuple[str, str, str, int] | None:
    """Return ``(user, task, spechash8, attempt)`` of an id :func:`submission_id` made, else None."""
    if not sid.startswith(SUBMISSION_PREFIX):
        return None
    parts = sid[len(SUBMISSION_PREFIX) :].split(SEPARATOR)
    if len(parts) == 3:
        parts.append("1")
    if len(parts) != 4 or not all(parts[:3]) or not parts[3].isdigit() or parts[3].startswith("0"):
        return None
    return parts[0], parts[1], parts[2], int(parts[3])
