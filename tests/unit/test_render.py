"""``argus render``: what argus will run for one object, before it runs (issue 21 item 5)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from reconciler.errors import ArgusError
from reconciler.render import parse_target
from reconciler.scaffold import init_repo, parse_source

ROOT = Path(__file__).resolve().parents[2]


def argus(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reconciler.cli", *map(str, args)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "config"
    init_repo(str(root), source=parse_source("git+https://h/o/argus.git@v1"))
    task = root / "users/alice/tasks/gsm8k-grpo.yaml"
    task.write_text(task.read_text().replace("overrides: []", 'overrides: ["actor_rollout_ref.actor.optim.lr=1e-6"]'))
    (root / "users/alice/tasks/shell.yaml").write_text(
        "kind: Task\nworkload: command\ncommand: python train.py --lr 1e-4\nworking_dir: $HOME/code\n"
        "gpus_per_node: 2\nenv:\n  FOO: bar\n"
    )
    return root


def test_a_verl_task_renders_its_argv_env_secrets_and_resources(repo: Path) -> None:
    proc = argus("render", "alice/tasks/gsm8k-grpo", repo, "--offline", env={"WANDB_API_KEY": "s3cret"})
    assert proc.returncode == 0, proc.stderr
    assert "s3cret" not in proc.stdout  # the local environment's secret is never printed (nor is the daemon's)
    doc = yaml.safe_load(proc.stdout)
    argv = doc["argv"]
    assert argv[:3] == ["python3", "-m", "verl.trainer.main_ppo"]
    # What argus adds, shown before it runs (issue 21: rollout.n, memory, micro-batches, save_freq, ckpts) ...
    for derived in ("actor_rollout_ref.rollout.n=4", "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
                    "trainer.save_freq=50", "trainer.max_actor_ckpt_to_keep=2", "trainer.total_training_steps=10",
                    "data.train_files=/private/users/alice/data/gsm8k/train.parquet"):  # fmt: skip
        assert derived in argv, derived
    # ... then the user's own override, last (it wins).
    assert argv[-1] == "actor_rollout_ref.actor.optim.lr=1e-6"
    assert any("resolved on the cluster" in a for a in argv if a.startswith("actor_rollout_ref.model.path="))
    assert doc["resources"] == {"worker_node": 1.0, "GPU": 1.0} and doc["gpus"] == 1
    assert doc["env"]["ARGUS_RUN_DIR"] == doc["run_folder"]
    assert set(doc["secrets"]) == {"WANDB_API_KEY", "HF_TOKEN"}
    assert all("daemon's environment" in v for v in doc["secrets"].values())


def test_a_command_task_renders_its_command_and_working_dir(repo: Path) -> None:
    doc = json.loads(argus("render", "alice/tasks/shell", repo, "--offline", "--format", "json").stdout)
    assert doc["command"] == "python train.py --lr 1e-4"
    assert doc["working_dir"] == "/private/users/alice/code" and doc["gpus"] == 2 and doc["env"]["FOO"] == "bar"
    assert "argv" not in doc


def test_a_model_renders_its_engine_arguments_and_serve_application(repo: Path) -> None:
    doc = yaml.safe_load(argus("render", "users/alice/models/chat.yaml", repo, "--offline").stdout)
    assert doc["engine_kwargs"]["max_model_len"] == 4096 and doc["engine_kwargs"]["tensor_parallel_size"] == 1
    app = doc["serve_application"]
    assert app["name"] == "argus--alice--chat"
    ((deployment),) = app["deployments"]
    assert deployment["name"] == f"LLMServer:{doc['served_name']}" and deployment["num_replicas"] == 1
    assert app["args"]["llm_config"]["placement_group_config"]["bundles"] == [{"GPU": 1.0}]
    assert doc["gpus"] == 1


def test_an_invalid_object_prints_its_errors_and_fails(repo: Path) -> None:
    (repo / "users/alice/models/chat.yaml").write_text("kind: Model\nsource: /etc/passwd\nreplicas: many\n")
    proc = argus("render", "alice/models/chat", repo, "--offline")
    assert proc.returncode == 1 and proc.stdout == ""
    assert "users/alice/models/chat.yaml:2: source:" in proc.stderr
    assert "users/alice/models/chat.yaml:3: replicas:" in proc.stderr
    missing = argus("render", "alice/models/nope", repo, "--offline")
    assert missing.returncode == 1 and "no users/alice/models/nope.yaml" in missing.stderr


def test_targets() -> None:
    assert str(parse_target("alice/tasks/x")) == str(parse_target("users/alice/tasks/x.yaml")) == "alice/tasks/x"
    for bad in ("alice", "alice/jobs/x", "alice/models/", "a/b/c/d"):
        with pytest.raises(ArgusError, match="expected USER/tasks/NAME"):
            parse_target(bad)


def test_the_text_plan_shows_gpus_and_resolved_paths(repo: Path) -> None:
    (repo / "users/alice/tasks/gsm8k-grpo.yaml").write_text(
        (repo / "users/alice/tasks/gsm8k-grpo.yaml").read_text().replace("suspend: true", "")
    )
    out = argus("plan", repo, "--offline").stdout
    assert "    1 GPU (1 replicas x 1) · source Qwen/Qwen2.5-0.5B-Instruct (resolved on the cluster)" in out
    assert "    2 GPU (1 nodes x 2) · working_dir /private/users/alice/code" in out
    assert "data /private/users/alice/data/gsm8k/train.parquet, /private/users/alice/data/gsm8k/test.parquet" in out


def test_a_task_renders_the_home_its_job_gets(repo: Path) -> None:
    for target in ("alice/tasks/gsm8k-grpo", "alice/tasks/shell"):
        doc = yaml.safe_load(argus("render", target, repo, "--offline").stdout)
        env = doc["env"]
        assert env["HOME"] == "/private/users/alice", target  # where her uploads are: `cat $HOME/x`
        # ... and what keeps the job from running code it finds there (issue 31 item 6)
        assert env["PYTHONNOUSERSITE"] == "1" and env["XDG_CACHE_HOME"] == "/tmp/argus-cache/alice/cache", target


def test_an_invalid_cluster_yaml_renders_nothing_and_says_why(repo: Path) -> None:
    cluster = repo / "cluster.yaml"
    cluster.write_text(cluster.read_text().replace("http_port: 8000", "http_port: eighty") + "bogus: 1\n")
    lines = cluster.read_text().splitlines()
    for target in ("alice/tasks/gsm8k-grpo", "alice/models/chat"):
        proc = argus("render", target, repo, "--offline")
        assert proc.returncode == 1 and proc.stdout == "", (target, proc.stdout)
        errors = [line for line in proc.stderr.splitlines() if line.startswith("cluster.yaml:")]
        assert any(f"cluster.yaml:{len(lines)}:" in e and "bogus" in e for e in errors), proc.stderr
        assert any("http_port" in e for e in errors), proc.stderr
        assert "cluster.yaml: " in proc.stderr and "nothing to render" in proc.stderr
