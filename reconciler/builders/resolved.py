"""The resolved spec: what argus derives from one object's file, as its status document shows it.

Pure. The status page and ``argus status`` read it from the status branch (one source of truth),
so a user sees the real source folder, engine arguments, tensor parallel size, verl argv or
command and the resources asked for — also for objects that are queued or not deployed yet.
"""

from __future__ import annotations

from typing import Any

from reconciler.builders.jobs import job_env, run_dir, verl_argv
from reconciler.builders.serve import llm_config
from reconciler.errors import ArgusError
from reconciler.plan.demand import model_resources_per_replica, task_resources
from reconciler.spec.hashing import submission_id
from reconciler.spec.types import ClusterSpec, ModelSpec, TaskSpec

# Shown instead of a secret's value: secrets reach jobs from the daemon's environment only.
FROM_DAEMON = "(from the daemon's environment)"


def resolved_spec(
    obj: ModelSpec | TaskSpec, cluster: ClusterSpec, *, secret_names: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Return the JSON-able resolved spec of ``obj``. Never raises for a loaded spec: what
    cannot be derived yet (a ``task:`` source, an unresolved path) is said in place."""
    if isinstance(obj, ModelSpec):
        return _model(obj, cluster)
    return _task(obj, cluster, secret_names)


def _model(model: ModelSpec, cluster: ClusterSpec) -> dict[str, Any]:
    source_path = model.source_path
    if source_path is None:
        pending = (
            f"the newest checkpoint of task {model.source_task} (resolved when it exists)"
            if model.source_task
            else "resolved on the cluster (validated offline)"
        )
    config = llm_config(model, cluster, source_path or model.source)
    engine = dict(config["engine_kwargs"])
    # Ray Serve LLM passes these to vLLM from the model loading config; show them as vLLM sees them.
    engine["model"] = source_path if source_path is not None else pending
    engine["served_model_name"] = model.served_name
    engine.setdefault("tensor_parallel_size", model.gpus_per_replica)
    return {
        "source": model.source,
        "source_path": source_path if source_path is not None else pending,
        "served_name": model.served_name,
        "alias": model.alias,
        "replicas": model.replicas,
        "tensor_parallel_size": model.gpus_per_replica,
        "resources_per_replica": model_resources_per_replica(model, cluster),
        "engine_kwargs": engine,
        "env": dict(config["runtime_env"]["env_vars"]),
    }


def _task(task: TaskSpec, cluster: ClusterSpec, secret_names: tuple[str, ...]) -> dict[str, Any]:
    sid = submission_id(task)
    folder = run_dir(task, cluster, sid)
    out: dict[str, Any] = {"workload": task.workload, "run": task.run, "submission_id": sid, "run_folder": folder}
    if task.workload == "command":
        out["command"] = task.command
        if task.working_dir:
            out["working_dir"] = task.working_dir
    else:
        try:
            out["argv"] = verl_argv(task, cluster, run_dir=folder, wandb="WANDB_API_KEY" in secret_names)
        except ArgusError as exc:
            out["argv"] = f"(not built yet: {exc})"
    out["resources"] = task_resources(task, cluster)
    # What the job's env holds (HOME included), less the secrets' values: their names say where they come from.
    env = job_env(task, cluster, run_folder=folder, secrets_env={})
    env.update(dict.fromkeys(secret_names, FROM_DAEMON))
    out["env"] = env
    return out
