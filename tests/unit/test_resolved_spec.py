"""The resolved spec in status documents: what argus derived, from the status branch alone
(the status page shows it), rebuilt only for objects whose file or cluster.yaml changed."""

from __future__ import annotations

from pathlib import Path

from reconciler.builders.resolved import FROM_DAEMON, resolved_spec
from reconciler.daemon import build_parts
from reconciler.loop import Daemon
from reconciler.server import Metrics
from reconciler.source.remote import open_source
from reconciler.spec.types import ClusterSpec, Serving
from reconciler.status.branch import read_documents
from reconciler.status.writer import StatusWriter
from tests.support import ConfigRepo, cluster_yaml, git, task_spec
from tests.unit.fake_ray import FakeRay
from tests.unit.test_fuzz_ticks import AllowAll


def test_resolved_task_and_model_say_what_argus_derives(tmp_path: Path) -> None:
    repo = ConfigRepo(tmp_path)
    repo.write("cluster.yaml", cluster_yaml(tmp_path / "hf", tmp_path / "users", 8000))
    repo.write(
        "users/alice/tasks/a.yaml",
        {"kind": "Task", "workload": "command", "command": "echo hi", "env": {"X": "1"}, "suspend": True},
    )
    (tmp_path / "users" / "alice" / "m").mkdir(parents=True)
    repo.write(
        "users/alice/models/chat.yaml",
        {
            "kind": "Model",
            "source": "$HOME/m",
            "gpus_per_replica": 1,
            "engine_kwargs": {"max_model_len": 256},
            "suspend": True,
        },
    )
    repo.commit_push("alice: a task and a model")
    source = open_source(str(repo.bare), str(repo.bare) + "-cache")
    parts = build_parts(
        source,
        "main",
        FakeRay(),
        fs=AllowAll(),
        secrets_env={"WANDB_API_KEY": "wandb-s3cret-value"},
        task_check=lambda t, c: [],
    )
    daemon = Daemon(parts, StatusWriter(source), metrics=Metrics())
    assert daemon.run_once() == 0.0
    docs = read_documents(str(repo.bare), "argus/status")
    task = docs["users/alice/tasks/a.yaml"]["spec"]
    assert task["command"] == "echo hi" and task["workload"] == "command"
    assert task["run_folder"].endswith(f"/alice/jobs/a/{task['submission_id']}")
    assert task["env"]["X"] == "1" and task["env"]["WANDB_API_KEY"] == FROM_DAEMON
    assert task["resources"]["worker_node"] == 1.0
    model = docs["users/alice/models/chat.yaml"]["spec"]
    assert model["source_path"] == str(tmp_path / "users" / "alice" / "m")
    assert model["engine_kwargs"]["max_model_len"] == 256
    assert model["engine_kwargs"]["served_model_name"] == model["served_name"]
    assert model["tensor_parallel_size"] == 1
    status = git(repo.bare, "log", "-p", "argus/status")
    assert "wandb-s3cret-value" not in status

    # A push that touches another object leaves these documents (and their specs) alone.
    repo.write("users/bob/tasks/b.yaml", {"kind": "Task", "workload": "command", "command": "true"})
    repo.commit_push("bob: b")
    assert daemon.run_once() == 0.0
    changed = git(repo.bare, "diff", "--name-only", "argus/status~1", "argus/status").split()
    assert "users/alice/tasks/a.yaml" not in changed and "users/alice/models/chat.yaml" not in changed
    assert "users/bob/tasks/b.yaml" in changed


def test_verl_argv_and_pending_sources_never_raise() -> None:
    cluster = ClusterSpec(serving=Serving(accelerator="gpu"))
    unresolved = task_spec("bob", "t", "grpo", model="Qwen/Qwen2.5-0.5B-Instruct", model_path=None)
    spec = resolved_spec(unresolved, cluster)
    assert isinstance(spec["argv"], str) and spec["argv"].startswith("(not built yet")
