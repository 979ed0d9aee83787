"""What each object asks of the cluster, in Ray resource names. Pure."""

from __future__ import annotations

from reconciler.spec.types import ClusterSpec, ModelSpec, TaskSpec


def model_resources_per_replica(model: ModelSpec, cluster: ClusterSpec) -> dict[str, float]:
    """GPU mode: ``gpus_per_replica`` GPUs; CPU mode: ``serving.cpus_per_replica`` CPUs."""
    if cluster.serving.accelerator == "cpu":
        return {"CPU": float(cluster.serving.cpus_per_replica)}
    return {"GPU": float(model.gpus_per_replica)}


def task_resources(task: TaskSpec, cluster: ClusterSpec) -> dict[str, float]:
    """``nodes * gpus_per_node`` GPUs plus the driver's resources from cluster.yaml."""
    out = {k: float(v) for k, v in cluster.training.driver_resources.items()}
    out["GPU"] = out.get("GPU", 0.0) + float(task.gpus)
    return out
