"""The Ray Job builder: exact argv/bodies, and every verl override composes against verl's real config."""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import replace

import pytest

from reconciler.builders.jobs import entrypoint_argv, job_submission, ownership_proof, proof_valid, run_dir, verl_argv
from reconciler.checks.verl_overrides import check_overrides, verl_available
from reconciler.errors import PermanentError
from reconciler.spec.hashing import submission_id, task_spec_fields, task_spec_hash
from reconciler.spec.types import ClusterSpec, Paths, TaskSpec, Training
from tests.support import task_spec

CLUSTER = ClusterSpec(
    paths=Paths(common="/shared/hf", users="/shared/users"),
    training=Training(rollout="vllm", driver_resources={"worker_node": 1.0}),
    env={"HF_HUB_OFFLINE": "1"},
)
MODEL = "/shared/hf/hub/models--Qwen--Qwen2.5-0.5B/snapshots/abc"


def make_task(workload: str, name: str = "t", **kw: object) -> TaskSpec:
    """A resolved TaskSpec as the loader produces it (``raw`` = the normalised file)."""
    trainer = workload != "command"
    base: dict[str, object] = {
        "model": "Qwen/Qwen2.5-0.5B" if trainer else None,
        "model_path": MODEL if trainer else None,
        "data_train": "/shared/users/alice/data/train.parquet" if trainer else None,
        "data_val": "/shared/users/alice/data/val.parquet" if trainer else None,
        "gpus_per_node": 2,
        "created_at": 1764460800,
    }
    base.update(kw)
    return task_spec("alice", name, workload, **base)


def test_ppo_argv_exact() -> None:
    task = make_task("ppo", "ppo", steps=10, overrides=("data.train_batch_size=64",), override_lines=(12,))
    folder = run_dir(task, CLUSTER)
    sid = submission_id(task)
    assert folder == f"/shared/users/alice/jobs/ppo/{sid}"
    assert verl_argv(task, CLUSTER, run_dir=folder, wandb=False) == [
        "python3",
        "-m",
        "verl.trainer.main_ppo",
        f"actor_rollout_ref.model.path={MODEL}",
        "data.train_files=/shared/users/alice/data/train.parquet",
        "data.val_files=/shared/users/alice/data/val.parquet",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
        f"critic.model.path={MODEL}",
        "critic.ppo_micro_batch_size_per_gpu=4",
        "trainer.nnodes=1",
        "trainer.n_gpus_per_node=2",
        # steps alone: as many epochs as steps, so the epochs cannot end before step 10
        "trainer.total_epochs=10",
        "trainer.total_training_steps=10",
        "trainer.project_name=alice",
        "trainer.experiment_name=ppo",
        f"trainer.default_local_dir={folder}/checkpoints",
        "trainer.logger=[console]",
        "trainer.save_freq=50",
        "trainer.max_actor_ckpt_to_keep=2",
        "trainer.max_critic_ckpt_to_keep=2",
        "data.train_batch_size=64",
    ]


def test_grpo_argv_exact() -> None:
    task = make_task("grpo", "grpo", nodes=2, gpus_per_node=8, epochs=3, data_val=None)
    folder = run_dir(task, CLUSTER)
    assert verl_argv(task, CLUSTER, run_dir=folder, wandb=True) == [
        "python3",
        "-m",
        "verl.trainer.main_ppo",
        f"actor_rollout_ref.model.path={MODEL}",
        "data.train_files=/shared/users/alice/data/train.parquet",
        # No validation set: verl's PPO trainer needs one, the train file stands in.
        "data.val_files=/shared/users/alice/data/train.parquet",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.n=4",
        "trainer.nnodes=2",
        "trainer.n_gpus_per_node=8",
        "trainer.total_epochs=3",
        "trainer.project_name=alice",
        "trainer.experiment_name=grpo",
        f"trainer.default_local_dir={folder}/checkpoints",
        "trainer.logger=[console,wandb]",
        "trainer.save_freq=50",
        "trainer.max_actor_ckpt_to_keep=2",
        "trainer.max_critic_ckpt_to_keep=2",
    ]


def test_sft_argv_exact() -> None:
    task = make_task("sft", "sft", gpus_per_node=1, data_val=None, overrides=("optim.lr=1e-5",), override_lines=(9,))
    folder = run_dir(task, CLUSTER)
    assert verl_argv(task, CLUSTER, run_dir=folder, wandb=False) == [
        "python3",
        "-m",
        "verl.trainer.sft_trainer_ray",
        f"model.path={MODEL}",
        "data.train_files=/shared/users/alice/data/train.parquet",
        "data.val_files=null",
        "data.micro_batch_size_per_gpu=4",
        "checkpoint.save_contents=[model,optimizer,extra,hf_model]",
        "trainer.nnodes=1",
        "trainer.n_gpus_per_node=1",
        "trainer.total_epochs=1",
        "trainer.project_name=alice",
        "trainer.experiment_name=sft",
        f"trainer.default_local_dir={folder}/checkpoints",
        "trainer.logger=[console]",
        "trainer.save_freq=50",
        "trainer.max_ckpt_to_keep=2",
        "optim.lr=1e-5",
    ]


def test_verl_submission_body() -> None:
    task = make_task("grpo", "grpo", env={"FOO": "task", "HF_HUB_OFFLINE": "0"})
    key = b"k" * 32
    body = job_submission(task, CLUSTER, revision="deadbeef", secrets_env={"WANDB_API_KEY": "k"}, ownership_key=key)
    sid = submission_id(task)
    folder = f"/shared/users/alice/jobs/grpo/{sid}"
    assert body["submission_id"] == sid
    assert sid.startswith("argus--alice--grpo--") and len(sid.rsplit("--", 1)[1]) == 8
    assert entrypoint_argv(body["entrypoint"]) == verl_argv(task, CLUSTER, run_dir=folder, wandb=True)
    assert "trainer.logger=[console,wandb]" in entrypoint_argv(body["entrypoint"])
    assert body["entrypoint_resources"] == {"worker_node": 1.0}
    assert "entrypoint_num_gpus" not in body  # verl's workers take the GPUs, not the driver
    scratch = "/tmp/argus-cache/alice"  # outside alice's folder, where her uploads land
    assert body["runtime_env"] == {
        "env_vars": {
            # nothing in HOME is loaded as code by itself (builders/isolation.py)
            "XDG_CACHE_HOME": f"{scratch}/cache",
            "XDG_CONFIG_HOME": f"{scratch}/config",
            "MPLCONFIGDIR": f"{scratch}/config/matplotlib",
            "TRITON_HOME": scratch,
            "TRITON_CACHE_DIR": f"{scratch}/.triton/cache",
            "FLASHINFER_WORKSPACE_BASE": scratch,
            "CUDA_CACHE_PATH": f"{scratch}/.nv/ComputeCache",
            "CUPY_CACHE_DIR": f"{scratch}/.cupy/kernel_cache",
            "WANDB_CONFIG_DIR": f"{scratch}/config/wandb",
            "GIT_CONFIG_GLOBAL": "/dev/null",
            "PYTHONNOUSERSITE": "1",
            "HF_HUB_OFFLINE": "0",  # task env wins over cluster env
            # verl's loggers write into the run folder, not the Ray actor's working directory
            "TENSORBOARD_DIR": f"{folder}/tensorboard",
            "WANDB_DIR": folder,
            "SWANLAB_LOG_DIR": f"{folder}/swanlog",
            "VERL_FILE_LOGGER_ROOT": folder,
            "FOO": "task",
            "HOME": "/shared/users/alice",
            "ARGUS_RUN_DIR": folder,
            "ARGUS_CHECKPOINT_DIR": f"{folder}/checkpoints",
            "WANDB_API_KEY": "k",
        }
    }
    assert body["metadata"] == {
        "managed-by": "argus",
        "argus-user": "alice",
        "argus-task": "grpo",
        "argus-spec-hash": task_spec_hash(task),
        "argus-revision": "deadbeef",
        "argus-run-dir": folder,
        "argus-resources": '{"GPU":2.0,"worker_node":1.0}',
        "argus-workload": "grpo",
        "argus-proof": ownership_proof(key, sid, body),
        "argus-spec": body["metadata"]["argus-spec"],
    }
    recorded = json.loads(body["metadata"]["argus-spec"])  # for field-level diffs
    assert recorded == json.loads(json.dumps(task_spec_fields(task)))
    assert all(isinstance(v, str) for v in body["metadata"].values())
    assert proof_valid(key, sid, body)


def test_command_submission_body() -> None:
    task = make_task(
        "command",
        "ft",
        gpus_per_node=2,
        command='python train.py --out "$ARGUS_CHECKPOINT_DIR"',
        working_dir="/shared/users/alice/code",
    )
    body = job_submission(task, CLUSTER, revision=None, secrets_env={})
    folder = run_dir(task, CLUSTER)
    assert body["entrypoint"] == 'python train.py --out "$ARGUS_CHECKPOINT_DIR"'
    assert body["entrypoint_num_gpus"] == 2
    assert body["entrypoint_resources"] == {"worker_node": 1.0}
    assert body["runtime_env"]["working_dir"] == "local:///shared/users/alice/code"
    assert body["runtime_env"]["env_vars"]["ARGUS_CHECKPOINT_DIR"] == f"{folder}/checkpoints"
    assert body["runtime_env"]["env_vars"]["HOME"] == "/shared/users/alice"
    assert body["metadata"]["argus-revision"] == ""
    assert check_overrides(task, CLUSTER) == []


def test_command_multi_node_refused() -> None:
    task = make_task("command", "ft", nodes=2, command="true")
    with pytest.raises(PermanentError, match="one node"):
        job_submission(task, CLUSTER, revision=None, secrets_env={})


def test_hydra_quoting_of_odd_paths() -> None:
    task = make_task("sft", "sft", data_train="/shared/my data/it's,odd.parquet")
    argv = verl_argv(task, CLUSTER, run_dir=run_dir(task, CLUSTER), wandb=False)
    assert "data.train_files='/shared/my data/it\\'s,odd.parquet'" in argv
    body = job_submission(task, CLUSTER, revision=None, secrets_env={})
    assert entrypoint_argv(body["entrypoint"])[1:] == argv[1:]


# In CI verl is installed (make test): there a missing verl fails instead of skipping.
needs_verl = pytest.mark.skipif(not verl_available() and not os.environ.get("CI"), reason="verl/hydra not installed")


@needs_verl
@pytest.mark.parametrize("workload", ["ppo", "grpo", "sft"])
def test_derived_overrides_compose_with_verl(workload: str) -> None:
    overrides = {
        "ppo": ("data.train_batch_size=64", "+ray_kwargs.ray_init.num_cpus=4"),
        "grpo": ("actor_rollout_ref.rollout.n=8", "actor_rollout_ref.actor.use_kl_loss=true"),
        "sft": ("optim.lr=1e-5", "data.max_length=2048"),
    }[workload]
    task = make_task(workload, workload, steps=5, overrides=overrides, override_lines=(10, 11))
    assert check_overrides(task, CLUSTER) == []


@needs_verl
def test_typo_override_reported_with_line() -> None:
    task = make_task(
        "grpo",
        "grpo",
        overrides=("data.train_batch_size=64", "actor_rollout_ref.rollout.nme=vllm", "trainer.nnodess=2"),
        override_lines=(14, 15, 16),
    )
    issues = check_overrides(task, CLUSTER)
    assert [line for line, _ in issues] == [15, 16]
    assert "actor_rollout_ref.rollout.nme" in issues[0][1]
    assert "did you mean `actor_rollout_ref.rollout.name`" in issues[0][1]
    assert "trainer.nnodes" in issues[1][1]


@needs_verl
def test_bad_override_syntax_and_sft_typo() -> None:
    task = make_task("sft", "sft", overrides=("optim.lr=[1", "model.pth=/x"), override_lines=(7, 8))
    issues = check_overrides(task, CLUSTER)
    assert [line for line, _ in issues] == [7, 8]
    assert "hydra syntax" in issues[0][1]
    assert "model.pth" in issues[1][1] and "model.path" in issues[1][1]


def test_unresolved_paths_refused() -> None:
    task = replace(make_task("ppo"), model_path=None)
    with pytest.raises(PermanentError):
        job_submission(task, CLUSTER, revision=None, secrets_env={})


@pytest.mark.parametrize("empty", ["", "  "])
def test_an_empty_secret_is_unset_not_an_empty_key(empty: str) -> None:
    """`.env` files ship `WANDB_API_KEY=`: the job gets no key and verl logs to the console only."""
    task = make_task("grpo", "grpo")
    body = job_submission(task, CLUSTER, revision=None, secrets_env={"WANDB_API_KEY": empty, "HF_TOKEN": "t"})
    argv = entrypoint_argv(body["entrypoint"])
    assert "trainer.logger=[console]" in argv and not any("wandb" in a for a in argv)
    env = body["runtime_env"]["env_vars"]
    assert "WANDB_API_KEY" not in env and env["HF_TOKEN"] == "t"


def test_home_is_the_users_folder_whatever_the_env_says() -> None:
    # A task (or cluster.yaml) pointing HOME into bob's folder must not give alice's job bob's home.
    cluster = ClusterSpec(paths=CLUSTER.paths, training=CLUSTER.training, env={"HOME": "/shared/users/bob"})
    for workload in ("command", "grpo"):
        task = make_task(workload, "ft", command="true" if workload == "command" else None, env={"HOME": "/tmp"})
        body = job_submission(task, cluster, revision=None, secrets_env={})
        assert body["runtime_env"]["env_vars"]["HOME"] == "/shared/users/alice", workload


def test_a_verl_job_runs_from_its_own_run_folder() -> None:
    """verl and hydra write relative paths (hydra's outputs/<date>/, wandb/): from the Ray node's working
    directory every user's would share one folder. The driver starts in the run folder instead."""
    task = make_task("sft", "a b", data_val=None)  # a name that needs quoting
    body = job_submission(task, CLUSTER, revision=None, secrets_env={})
    folder = body["runtime_env"]["env_vars"]["ARGUS_RUN_DIR"]
    words = shlex.split(body["entrypoint"])
    assert words[:6] == ["mkdir", "-p", folder, "&&", "cd", folder] and words[6:8] == ["&&", "exec"]
    assert entrypoint_argv(body["entrypoint"]) == verl_argv(task, CLUSTER, run_dir=folder, wandb=False)
