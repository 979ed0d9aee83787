"""The GPU suite's config repository and the Ray Job bodies argus renders for it.

Light on purpose: no torch, Ray or verl import. The CPU unit test (tests/unit/test_gpu_suite.py) imports it and
checks every body the GPU tests submit, so a change to the builder or to this file cannot break the suite unseen
on CPU-only CI. Everything a GPU test submits goes through :func:`body`, which loads the repository with argus's own
loader (as ``argus render`` does) and renders it with argus's own builder
(:func:`reconciler.builders.jobs.job_submission`, as the applier submits it).

The repository: one user (:data:`USER`), cluster.yaml with ``training.checkpoint_every_steps: CADENCE`` and these
tasks, all on a tiny random-weight Llama with SmolLM2's tokenizer (tests/gpu/tiny.py writes it and the data):

- ``sft-steps``: SFT with ``steps`` above one epoch (16 steps an epoch, 20 steps): must train to step 20 and save
  there, with saves on the cluster's cadence before it;
- ``sft-resume``: SFT stopped after its first cadence save, then resumed the way the planner resumes a preempted run;
- ``ppo-resume``, ``grpo-resume``: the same for PPO and GRPO (3 steps an epoch, 5 steps, the task's own lower
  ``trainer.save_freq``);
- model ``served``: ``source: task:sft-steps`` with Ray Serve LLM on the GPU.
"""

from __future__ import annotations

import inspect
import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from reconciler.spec.types import DesiredState, ModelSpec, TaskSpec

USER = "vera"
# cluster.yaml training.checkpoint_every_steps: every verl task's trainer.save_freq (a task may lower it).
CADENCE = 4
# verl's keep-limit argus sets (trainer.max_ckpt_to_keep, max_actor_ckpt_to_keep, max_critic_ckpt_to_keep).
KEEP = 2
OWNERSHIP_KEY = b"argus-gpu-suite-ownership-key-0123456789abcdef"
REVISION = "gpu-suite"

SFT_ROWS, SFT_BATCH = 512, 32  # 16 steps an epoch
SFT_VAL_ROWS = 32
RL_ROWS, RL_BATCH = 24, 8  # 3 steps an epoch
RL_SAVE_FREQ = 2  # the RL tasks' own trainer.save_freq: lower than the cluster's cadence, which a task may do

MODEL_DIR = "models/tiny-smollm2"  # under the user's home ($HOME of every job)
SFT_TRAIN, SFT_VAL = "data/sft/train.parquet", "data/sft/val.parquet"
RL_TRAIN = "data/rl/train.parquet"

# verl 0.9.1's SFT trainer on one GPU without flash-attn (the H200 run of /work/shared/gpu used the same).
SFT_OVERRIDES = [
    f"data.train_batch_size={SFT_BATCH}",
    "data.max_length=256",
    "data.num_workers=2",
    "optim.lr=1e-3",
    "+model.override_config.attn_implementation=sdpa",
]
# PPO/GRPO kept small: 8 prompts a step, 16 response tokens, vLLM without CUDA graphs (starts faster), one agent
# loop worker and one reward worker, no validation before training.
RL_OVERRIDES = [
    f"data.train_batch_size={RL_BATCH}",
    "data.max_prompt_length=128",
    "data.max_response_length=16",
    f"actor_rollout_ref.actor.ppo_mini_batch_size={RL_BATCH}",
    "actor_rollout_ref.rollout.enforce_eager=True",
    "actor_rollout_ref.rollout.agent.num_workers=1",
    "reward.num_workers=1",
    "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
    "trainer.val_before_train=False",
    f"trainer.save_freq={RL_SAVE_FREQ}",
]
PPO_OVERRIDES = [*RL_OVERRIDES, "+critic.model.override_config.attn_implementation=sdpa"]

# name -> task file (the model and data paths are filled in by task_docs()).
TASKS: dict[str, dict[str, Any]] = {
    "sft-steps": {"workload": "sft", "steps": 20, "overrides": SFT_OVERRIDES},
    "sft-resume": {"workload": "sft", "steps": 24, "overrides": SFT_OVERRIDES},
    "ppo-resume": {"workload": "ppo", "steps": 5, "overrides": PPO_OVERRIDES},
    "grpo-resume": {"workload": "grpo", "steps": 5, "overrides": RL_OVERRIDES},
}
# The tasks the suite stops after a checkpoint and resumes.
RESUMED = ("sft-resume", "ppo-resume", "grpo-resume")
SERVED_MODEL = "served"
SERVED_TASK = "sft-steps"
MODEL_DOC: dict[str, Any] = {
    "kind": "Model",
    "source": f"task:{SERVED_TASK}",
    "replicas": 1,
    "gpus_per_replica": 1,
    "engine_kwargs": {"max_model_len": 512, "gpu_memory_utilization": 0.3, "enforce_eager": True},
}
# What each rendered verl argv must hold (the builder's contract the suite relies on).
SAVE_FREQ = "trainer.save_freq"
TRACKER = "latest_checkpointed_iteration.txt"


def steps_per_epoch(name: str) -> int:
    """Optimizer steps in one pass over task ``name``'s training data (verl drops the last partial batch)."""
    if TASKS[name]["workload"] == "sft":
        return SFT_ROWS // SFT_BATCH
    return RL_ROWS // RL_BATCH


def save_freq(name: str) -> int:
    """The checkpoint cadence task ``name`` runs with: the cluster's, or the task's own lower one."""
    own = [int(o.split("=", 1)[1]) for o in TASKS[name]["overrides"] if o.startswith(f"{SAVE_FREQ}=")]
    return min([CADENCE, *own])


def expected_saves(steps: int, every: int, after: int = 0) -> list[int]:
    """The steps verl saves at when it runs steps ``after + 1 .. steps``: the cadence's and the last one."""
    return sorted({s for s in range(after + 1, steps + 1) if s % every == 0} | {steps})


def cluster_doc(
    root: Path, *, serve_port: int = 8000, gpus: int = 1, env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """cluster.yaml of the suite's repository: paths under ``root``, GPU serving, the checkpoint cadence; ``env`` is
    added to every job's environment (the CPU harness test points PYTHONPATH at its verl stand-in)."""
    return {
        "kind": "Cluster",
        "users": {USER: {"gpus": gpus}},
        "paths": {"common": str(root / "hf"), "users": str(root / "users")},
        "serving": {"accelerator": "gpu", "internal_http_port": serve_port},
        "training": {"rollout": "vllm", "checkpoint_every_steps": CADENCE},
        "env": {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "VLLM_NO_USAGE_STATS": "1", **(env or {})},
    }


def task_docs() -> dict[str, dict[str, Any]]:
    """The task files, by name."""
    out = {}
    for name, spec in TASKS.items():
        data = {"train": f"$HOME/{SFT_TRAIN}", "val": f"$HOME/{SFT_VAL}"}
        if spec["workload"] != "sft":
            data = {"train": f"$HOME/{RL_TRAIN}"}
        out[name] = {
            "kind": "Task",
            "workload": spec["workload"],
            "model": f"$HOME/{MODEL_DIR}",
            "data": data,
            "gpus_per_node": 1,
            "steps": spec["steps"],
            "overrides": list(spec["overrides"]),
        }
    return out


def home(root: Path) -> Path:
    """The user's home folder (``<paths.users>/<user>``): $HOME of every job."""
    return root / "users" / USER


def write_repo(root: Path, *, serve_port: int = 8000, gpus: int = 1, env: Mapping[str, str] | None = None) -> Path:
    """Write the config repository into ``root / "repo"`` (the user's files live under ``root / "users"``).

    Returns the repository folder.
    """
    repo = root / "repo"
    (root / "hf").mkdir(parents=True, exist_ok=True)  # paths.common: the loader's file-system checks need it
    (repo / "users" / USER / "tasks").mkdir(parents=True, exist_ok=True)
    (repo / "users" / USER / "models").mkdir(parents=True, exist_ok=True)
    _dump(repo / "cluster.yaml", cluster_doc(root, serve_port=serve_port, gpus=gpus, env=env))
    for name, doc in task_docs().items():
        _dump(repo / "users" / USER / "tasks" / f"{name}.yaml", doc)
    _dump(repo / "users" / USER / "models" / f"{SERVED_MODEL}.yaml", MODEL_DOC)
    return repo


def write_stub_inputs(root: Path) -> None:
    """Placeholder model and data files, enough for the loader's path checks (the CPU unit test's stand-in for
    tests/gpu/tiny.py, which writes the real ones)."""
    model = home(root) / MODEL_DIR
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    (model / "model.safetensors").write_bytes(b"")
    for rel in (SFT_TRAIN, SFT_VAL, RL_TRAIN):
        path = home(root) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")


def _dump(path: Path, doc: Mapping[str, Any]) -> None:
    path.write_text(yaml.safe_dump(dict(doc), sort_keys=False))


def load_state(repo: Path) -> DesiredState:
    """The repository as the daemon reads it (argus's loader with the file-system checks, as ``argus render``).

    Raises AssertionError naming every issue when a file of the suite is refused.
    """
    from reconciler.cli import load_dir

    state = load_dir(str(repo), offline=False, quiet=True)
    if state.invalid or state.issues:
        problems = [str(i) for i in state.issues] or [f"{k}: {v}" for k, v in state.invalid.items()]
        raise AssertionError("argus refuses the suite's repository:\n" + "\n".join(problems))
    return state


def task(state: DesiredState, name: str) -> TaskSpec:
    from reconciler.spec.types import ObjectKey

    return state.tasks[ObjectKey(USER, "task", name)]


def served_model(state: DesiredState) -> ModelSpec:
    from reconciler.spec.types import ObjectKey

    return state.models[ObjectKey(USER, "model", SERVED_MODEL)]


def sid(state: DesiredState, name: str, attempt: int = 1) -> str:
    """The submission id of attempt ``attempt`` of task ``name`` (the planner's choice for a free id)."""
    from reconciler.spec.hashing import submission_id

    return submission_id(task(state, name), attempt)


def body(state: DesiredState, name: str, *, attempt: int = 1, resume_step: int | None = None) -> dict[str, Any]:
    """The ``POST /api/jobs/`` body argus submits for ``attempt`` of task ``name``.

    Attempt 1 is a new run; attempt 2 resumes the preempted attempt 1 as the planner builds it
    (reconciler.plan.planner: ``resume_from`` the preempted attempt, ``first_attempt`` the run's first) and the
    applier submits it (``resume_step``: the newest checkpoint step it found there, where the builder takes one).
    """
    from reconciler.builders.jobs import job_submission

    spec = task(state, name)
    kwargs: dict[str, Any] = {}
    if attempt > 1:
        first = sid(state, name, 1)
        kwargs = {"resume_from": sid(state, name, attempt - 1), "first_attempt": first}
        if resume_step is not None and "resume_step" in inspect.signature(job_submission).parameters:
            kwargs["resume_step"] = resume_step
    return job_submission(
        spec,
        state.cluster,
        revision=REVISION,
        secrets_env={},
        sid=sid(state, name, attempt),
        ownership_key=OWNERSHIP_KEY,
        **kwargs,
    )


def argv(job: Mapping[str, Any]) -> list[str]:
    """The rendered entrypoint as a list of words."""
    from reconciler.builders.jobs import entrypoint_argv

    return entrypoint_argv(str(job["entrypoint"]))


def hydra_value(words: Sequence[str], key: str) -> str | None:
    """The value hydra ends up with for ``key`` in ``words`` (the last ``key=`` wins), or None."""
    found = None
    for word in words:
        if word.startswith(f"{key}="):
            found = word.split("=", 1)[1]
    return found


def run_folder(job: Mapping[str, Any]) -> Path:
    """The run folder argus derived for ``job`` (its ``ARGUS_RUN_DIR``)."""
    return Path(job["runtime_env"]["env_vars"]["ARGUS_RUN_DIR"])


def contract_problems(state: DesiredState, name: str, job: Mapping[str, Any], *, attempt: int = 1) -> list[str]:
    """What the rendered ``job`` of task ``name`` lacks of the builder's contract the GPU tests rely on (empty: none).

    - the cadence: ``trainer.save_freq`` = the cluster's ``checkpoint_every_steps`` or the task's lower one;
    - the keep-limit: ``trainer.max_ckpt_to_keep`` (sft) or ``max_actor_ckpt_to_keep``/``max_critic_ckpt_to_keep``;
    - ``steps: N`` alone: ``trainer.total_training_steps=N`` and ``trainer.total_epochs=N`` (cannot end first);
    - a resumed attempt: ``trainer.resume_mode=auto`` and ``trainer.default_local_dir`` = the first attempt's
      ``checkpoints`` folder; a first attempt saves into its own.
    """
    words = argv(job)
    spec = TASKS[name]
    problems = []
    want: dict[str, str] = {
        SAVE_FREQ: str(save_freq(name)),
        "trainer.total_training_steps": str(spec["steps"]),
        "trainer.total_epochs": str(spec["steps"]),
    }
    if spec["workload"] == "sft":
        want["trainer.max_ckpt_to_keep"] = str(KEEP)
    else:
        want["trainer.max_actor_ckpt_to_keep"] = str(KEEP)
        want["trainer.max_critic_ckpt_to_keep"] = str(KEEP)
    first = run_folder(body(state, name)) if attempt > 1 else run_folder(job)
    want["trainer.default_local_dir"] = str(first / "checkpoints")
    if attempt > 1:
        want["trainer.resume_mode"] = "auto"
    for key, value in want.items():
        got = hydra_value(words, key)
        if got != value:
            problems.append(f"{name} attempt {attempt}: {key}={got} (want {value})")
    derived = [w for w in words if w.startswith(f"{SAVE_FREQ}=")]
    if not derived or derived[0] != f"{SAVE_FREQ}={CADENCE}":
        problems.append(f"{name}: argus's own {SAVE_FREQ} is not the cluster's cadence {CADENCE}: {derived}")
    return problems


# verl's console logger prints one line per step: "step:N - train/loss:... - ..." (PPO's, forwarded from its
# TaskRunner actor, behind a "(TaskRunner pid=...)" prefix).
_STEP_LINE = re.compile(r"(?:^|[\s)])step:(\d+) - ", re.M)
_LOSS = re.compile(r"train/loss:([-+0-9.eE]+)")
# verl's SFT trainer: "Saving checkpoint to: <dir>/global_step_N"; PPO's: "local_global_step_folder: <dir>/...".
_SAVE_LINE = re.compile(r"(?:Saving checkpoint to|local_global_step_folder):\s*\S*global_step_(\d+)")
# verl's SFT trainer: "Found latest checkpoint: <dir>/global_step_N (step N)"; PPO's: "Resuming from <dir>/...".
_RESUME_LINE = re.compile(
    r"(?:Found latest checkpoint:|Resuming from|Load from checkpoint folder:)\s*\S*global_step_(\d+)"
)


def logged_steps(log: str) -> list[int]:
    """The training steps a job's log reports, in order (each once)."""
    seen: list[int] = []
    for match in _STEP_LINE.finditer(log):
        step = int(match.group(1))
        if step not in seen:
            seen.append(step)
    return seen


def logged_losses(log: str) -> dict[int, float]:
    """``train/loss`` by step, as verl's SFT console logger prints it."""
    out: dict[int, float] = {}
    for line in log.splitlines():
        step, loss = _STEP_LINE.search(line), _LOSS.search(line)
        if step and loss:
            out.setdefault(int(step.group(1)), float(loss.group(1)))
    return out


def logged_saves(log: str) -> list[int]:
    """The checkpoint steps a job's log says verl saved, in order (each once)."""
    return list(dict.fromkeys(int(m.group(1)) for m in _SAVE_LINE.finditer(log)))


def resumed_step(log: str) -> int | None:
    """The checkpoint step verl says it resumed from, or None."""
    match = _RESUME_LINE.search(log)
    return int(match.group(1)) if match else None


def tracker_step(checkpoints: Path) -> int | None:
    """The step in verl's ``latest_checkpointed_iteration.txt`` of a checkpoints folder, or None."""
    try:
        text = (checkpoints / TRACKER).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def saved_folders(checkpoints: Path) -> list[int]:
    """The ``global_step_N`` folders in a checkpoints folder, by step."""
    if not checkpoints.is_dir():
        return []
    found = (re.fullmatch(r"global_step_(\d+)", p.name) for p in checkpoints.iterdir() if p.is_dir())
    return sorted(int(m.group(1)) for m in found if m)


def describe(folder: Path, depth: int = 4) -> str:
    """A short listing of ``folder`` for a failing assertion's message."""
    lines = []
    for path, dirs, files in os.walk(folder):
        rel = os.path.relpath(path, folder)
        if rel.count(os.sep) >= depth:
            dirs[:] = []
            continue
        lines.append(f"{rel}/ {' '.join(sorted(files)[:8])}")
        if len(lines) > 40:
            break
    return "\n".join(lines) or f"{folder}: empty or missing"
