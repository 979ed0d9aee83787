"""Ray Job submissions for training tasks. Pure: no I/O, no ``ray`` import.

A task becomes one ``POST /api/jobs/`` body (:func:`job_submission`). Ownership and
identity travel in the job's ``metadata`` (Ray keeps it with the job), so the observer
can rebuild everything from Ray alone:

=====================  ===================================================
``managed-by``         ``argus`` (only such jobs are ever touched)
``argus-user``         task owner
``argus-task``         task name
``argus-spec-hash``    :func:`~reconciler.spec.hashing.task_spec_hash`
``argus-revision``     git revision that submitted it ("" when unknown)
``argus-run-dir``      absolute run folder (checkpoints live below it)
``argus-resources``    JSON of :func:`~reconciler.plan.demand.task_resources`
                       (Ray 2.60's job listing does not return the entrypoint
                       resources, and verl's GPUs are claimed by its workers)
``argus-workload``     ppo | grpo | sft | command
``argus-proof``        :func:`ownership_proof`: HMAC-SHA256 over the submission
                       id, every other label and what runs (entrypoint and
                       runtime environment), keyed by a secret only the daemon
                       holds
``argus-spec``         compact JSON of :func:`~reconciler.spec.hashing.task_spec_fields`
                       (a later plan names each changed field when it stops this run)
``argus-resumed-from`` a resumed attempt only: the checkpoint step it resumes
                       from (read from the folder it resumes from just before
                       it was submitted; "0": there was none)
=====================  ===================================================

Labels prove nothing by themselves: code running on the cluster can reach the Jobs API and
submission ids are predictable from the public repository. Only a job whose ``argus-proof``
verifies under the daemon's key is argus's; any other job is foreign, whatever its labels say.
The proof covers what the job runs, not only its labels: job code holding the Ray token can
delete a finished job and resubmit its id with the labels copied (``/api/v1/deployed``
publishes them), but not with the proof of a different entrypoint or runtime environment.
The run folder (and so the checkpoint a ``task:`` model serves) is derived from the proven
submission id (:func:`run_folder`), never read from the labels.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import posixpath
import re
import shlex
from collections.abc import Mapping
from typing import Any

from reconciler.builders.isolation import isolation_env
from reconciler.errors import PermanentError
from reconciler.plan.demand import task_resources
from reconciler.spec.hashing import submission_id, task_spec_fields, task_spec_hash
from reconciler.spec.overrides import SAVE_FREQ_KEY, normalise_key, split_override
from reconciler.spec.types import ClusterSpec, TaskSpec

MANAGED_BY = "managed-by"
MANAGER = "argus"
LABEL_USER = "argus-user"
LABEL_TASK = "argus-task"
LABEL_SPEC_HASH = "argus-spec-hash"
LABEL_REVISION = "argus-revision"
LABEL_RUN_DIR = "argus-run-dir"
LABEL_RESOURCES = "argus-resources"
LABEL_WORKLOAD = "argus-workload"
LABEL_PROOF = "argus-proof"
_PROOF_CONTEXT = b"argus-ownership-v2"

LABEL_SPEC = "argus-spec"
LABEL_RESUMED_FROM = "argus-resumed-from"

ENV_RUN_DIR = "ARGUS_RUN_DIR"
ENV_CHECKPOINT_DIR = "ARGUS_CHECKPOINT_DIR"
# Every job's $HOME is its user's folder <paths.users>/<user>, set after cluster.yaml's and the task's env:
# nobody's job can point it into another user's folder (the loader refuses env.HOME in a task file).
ENV_HOME = "HOME"
# A preempted run resumes in a new attempt: ARGUS_RESUME=1 and the previous attempt's run folder.
ENV_RESUME = "ARGUS_RESUME"
ENV_RESUME_DIR = "ARGUS_RESUME_DIR"
# ... and the step of the newest checkpoint found there (0: none), as the status reports it.
ENV_RESUME_STEP = "ARGUS_RESUME_STEP"
# verl's tracker of its newest checkpoint in a checkpoints folder (verl.utils.checkpoint.checkpoint_manager
# get_checkpoint_tracker_filename): the step number, written after the global_step_<N> folder is complete.
# A command task that writes checkpoints keeps the same layout, so argus reports (and resumes) it alike.
CHECKPOINT_TRACKER = "latest_checkpointed_iteration.txt"

PPO_MODULE = "verl.trainer.main_ppo"
SFT_MODULE = "verl.trainer.sft_trainer_ray"
# argus's own entry around verl's, for tasks bounded by both steps and epochs (epoch_bounds); its
# install() also runs in every worker of such a job (Ray's worker_process_setup_hook): PPO's trainer
# runs in a Ray actor, not in the driver.
VERL_ENTRY = "reconciler.job_apps.verl_entry"
VERL_SETUP_HOOK = f"{VERL_ENTRY}.install"

# Small enough for any model on one GPU; verl refuses to start without them
# (unless use_dynamic_bsz). Users tune them through `overrides`.
MICRO_BATCH_PER_GPU = 4
# GRPO's advantage is relative within a group of samples per prompt: n=1 learns nothing.
GRPO_ROLLOUT_N = 4
# verl keeps this many checkpoints (older ones are deleted as new ones land): the newest one, plus the one
# before it in case the job dies while writing the newest (verl moves its tracker file only after a save).
CKPT_TO_KEEP = 2
# `hf_model` makes verl write a servable HF folder (global_step_N/actor/huggingface).
SAVE_CONTENTS = "[model,optimizer,extra,hf_model]"

# A whole number of steps as hydra reads an int (no sign, no leading zero, no quotes).
_STEPS = re.compile(r"^[1-9][0-9]{0,11}$")
# A hydra override value that needs no quoting (paths, numbers, names).
_PLAIN_VALUE = re.compile(r"^[A-Za-z0-9_./~+:@%-]+$")


def run_dir(task: TaskSpec, cluster: ClusterSpec, sid: str | None = None) -> str:
    """Return the run folder ``<paths.users>/<user>/jobs/<task>/<submission-id>`` (absolute).

    ``sid`` defaults to the task's first-choice :func:`~reconciler.spec.hashing.submission_id`.
    """
    return run_folder(cluster.paths.users, task.key.user, task.key.name, sid or submission_id(task))


def run_folder(users_root: str, user: str, task: str, sid: str) -> str:
    """The run folder of submission ``sid`` of ``users/<user>/tasks/<task>``: ``<users_root>/<user>/jobs/<task>/<sid>``.

    Injective like its parts (user and task names cannot contain ``/``; ``sid`` names its key).
    """
    return posixpath.join(users_root, user, "jobs", task, sid)


def proof_fields(job: Mapping[str, Any]) -> bytes:
    """The canonical bytes a proof covers: the labels (without the proof), the entrypoint and
    the runtime environment of ``job`` (a submission body or Ray's ``JobDetails``, which name
    them alike and which Ray returns as submitted). Not the entrypoint resources: Ray's job
    details do not return them (they decide where the driver is placed, not what it runs; the
    ``argus-resources`` label argus counts is covered). Raises TypeError/ValueError for values
    that are not JSON."""
    raw_meta = job.get("metadata")
    meta = raw_meta if isinstance(raw_meta, Mapping) else {}
    covered = {
        "labels": {str(k): v for k, v in meta.items() if k != LABEL_PROOF},
        "entrypoint": job.get("entrypoint"),
        "runtime_env": job.get("runtime_env") or {},
    }
    return json.dumps(covered, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def ownership_proof(key: bytes, sid: str, job: Mapping[str, Any]) -> str:
    """Return the hex HMAC-SHA256 that marks ``job`` (a submission body) as argus's job ``sid``.

    It covers the id and :func:`proof_fields` (NUL-separated: an id contains no NUL)."""
    return hmac.new(key, b"\0".join([_PROOF_CONTEXT, sid.encode(), proof_fields(job)]), hashlib.sha256).hexdigest()


def proof_valid(key: bytes, sid: str, job: Mapping[str, Any]) -> bool:
    """True when ``job`` (Ray's ``JobDetails``, or a submission body) carries a valid
    :func:`ownership_proof` for job ``sid`` (constant-time compare)."""
    raw_meta = job.get("metadata")
    meta = raw_meta if isinstance(raw_meta, Mapping) else {}
    claimed = meta.get(LABEL_PROOF)
    fields = [meta.get(LABEL_USER), meta.get(LABEL_TASK), meta.get(LABEL_SPEC_HASH)]
    if not key or not isinstance(claimed, str) or not all(isinstance(f, str) and f for f in fields):
        return False
    try:
        expected = ownership_proof(key, sid, job)
    except (TypeError, ValueError):
        return False
    return hmac.compare_digest(expected, claimed)


def checkpoint_dir(run_folder: str) -> str:
    """Return the checkpoints folder of a run folder."""
    return posixpath.join(run_folder, "checkpoints")


def hydra_value(value: object) -> str:
    """Render ``value`` for a hydra override: plain when safe, else a quoted hydra string."""
    text = str(value)
    if _PLAIN_VALUE.match(text):
        return text
    escaped = text.replace("\\", "\\\\").replace("'", "\\'")
    return f"'{escaped}'"


def derived_overrides(task: TaskSpec, cluster: ClusterSpec, *, run_folder: str, wandb: bool) -> list[str]:
    """Return argus's hydra overrides for a verl task (without the user's ``overrides``).

    Raises PermanentError for ``command`` tasks or a task without model/data paths.
    """
    if task.workload == "command":
        raise PermanentError(f"{task.key}: command tasks have no verl overrides")
    if not task.model_path or not task.data_train:
        raise PermanentError(f"{task.key}: model and data.train must be resolved before building the job")
    ckpt = checkpoint_dir(run_folder)
    logger = "[console,wandb]" if wandb else "[console]"
    epochs, steps = epoch_bounds(task)
    trainer = [
        f"trainer.nnodes={task.nodes}",
        f"trainer.n_gpus_per_node={task.gpus_per_node}",
        f"trainer.total_epochs={epochs}",
        *([f"trainer.total_training_steps={steps}"] if steps is not None else []),
        f"trainer.project_name={hydra_value(task.key.user)}",
        f"trainer.experiment_name={hydra_value(task.key.name)}",
        f"trainer.default_local_dir={hydra_value(ckpt)}",
        f"trainer.logger={logger}",
        # verl saves on this cadence and at its last step (both loops: `is_last_step or step % save_freq == 0`);
        # with save_freq <= 0 the PPO loop never saves, not even at its end.
        f"trainer.save_freq={cluster.training.checkpoint_every_steps}",
    ]
    # verl's data loader takes a list or a single file; an absent val set falls back to
    # the train file for PPO (its config requires one) and to null for SFT.
    if task.workload == "sft":
        return [
            f"model.path={hydra_value(task.model_path)}",
            f"data.train_files={hydra_value(task.data_train)}",
            f"data.val_files={hydra_value(task.data_val) if task.data_val else 'null'}",
            f"data.micro_batch_size_per_gpu={MICRO_BATCH_PER_GPU}",
            f"checkpoint.save_contents={SAVE_CONTENTS}",
            *trainer,
            f"trainer.max_ckpt_to_keep={CKPT_TO_KEEP}",
        ]
    out = [
        f"actor_rollout_ref.model.path={hydra_value(task.model_path)}",
        f"data.train_files={hydra_value(task.data_train)}",
        f"data.val_files={hydra_value(task.data_val or task.data_train)}",
        f"actor_rollout_ref.rollout.name={hydra_value(cluster.training.rollout)}",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={MICRO_BATCH_PER_GPU}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={MICRO_BATCH_PER_GPU}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={MICRO_BATCH_PER_GPU}",
        f"actor_rollout_ref.actor.checkpoint.save_contents={SAVE_CONTENTS}",
    ]
    if task.workload == "grpo":
        out += ["algorithm.adv_estimator=grpo", f"actor_rollout_ref.rollout.n={GRPO_ROLLOUT_N}"]
    else:  # ppo: a value model (critic) initialised from the same base model
        out += [
            f"critic.model.path={hydra_value(task.model_path)}",
            f"critic.ppo_micro_batch_size_per_gpu={MICRO_BATCH_PER_GPU}",
        ]
    out += [
        *trainer,
        f"trainer.max_actor_ckpt_to_keep={CKPT_TO_KEEP}",
        f"trainer.max_critic_ckpt_to_keep={CKPT_TO_KEEP}",
    ]
    return out


def epoch_bounds(task: TaskSpec) -> tuple[int, int | None]:
    """Return ``(trainer.total_epochs, trainer.total_training_steps)`` for a verl task.

    verl's loops (SFT's ``SFTTrainer.fit``, PPO's ``RayPPOTrainer.fit`` and v1 ``PPOTrainer.fit``) run
    ``for epoch in range(total_epochs)`` over the data loader and stop early, saving, once the step
    reaches ``total_training_steps`` (default: epochs x steps per epoch). So:

    - ``steps: N`` alone: ``total_epochs = N`` as well. Every epoch is at least one step, so the epochs
      cannot run out before step N, whatever the data set's size: the run reaches N and saves there.
    - ``epochs: E`` alone: ``total_epochs = E`` and no step bound: the last step is E's last batch.
    - both: ``E`` and ``N``; whichever comes first ends the run. When the epochs come first verl's loop
      ends without reaching its last step (and so without its last save): :func:`job_submission` then
      runs verl through :mod:`reconciler.job_apps.verl_entry`, which lowers the step bound to the
      epochs' steps once the data loader is built.
    - neither: one pass (``total_epochs = 1``).
    """
    if task.steps is not None and task.epochs is None:
        return task.steps, task.steps
    return task.epochs or 1, task.steps


def bounded_by_both(task: TaskSpec) -> bool:
    """True when a verl task gives both ``steps`` and ``epochs`` (whichever comes first ends it)."""
    return task.workload != "command" and task.steps is not None and task.epochs is not None


def verl_overrides(task: TaskSpec, cluster: ClusterSpec, *, run_folder: str, wandb: bool) -> list[str]:
    """Return every hydra override: argus's first, the user's ``overrides`` after them (they win), then
    the cluster's checkpoint cadence again when the user's ``trainer.save_freq`` would save less often
    (:func:`kept_cadence`)."""
    return [
        *derived_overrides(task, cluster, run_folder=run_folder, wandb=wandb),
        *task.overrides,
        *kept_cadence(task, cluster),
    ]


def kept_cadence(task: TaskSpec, cluster: ClusterSpec) -> list[str]:
    """``["trainer.save_freq=<cadence>"]`` when the task's own ``trainer.save_freq`` (the last one it
    sets; hydra: last wins) is not a whole number of steps from 1 to cluster.yaml's
    ``training.checkpoint_every_steps``: larger, ``-1``/``0`` (never), removed (``~``), or a value hydra
    reads as a string (``'5'``, ``0050``: verl's ``step % save_freq`` fails on it). The cadence bounds
    what a preempted run loses; a task may only save more often. Capped rather than refused: an admin
    who lowers the cadence must not turn running tasks' files invalid. ``[]`` when the task keeps it."""
    cadence = cluster.training.checkpoint_every_steps
    last: str | None = None
    touched = False
    for text in task.overrides:
        prefix, key, value = split_override(text)
        if normalise_key(key) == SAVE_FREQ_KEY:
            touched = True
            last = None if "~" in prefix else value
    if not touched or (last is not None and _STEPS.match(last) and int(last) <= cadence):
        return []
    return [f"{SAVE_FREQ_KEY}={cadence}"]


def verl_module(task: TaskSpec) -> str:
    """Return the verl entry module of a ppo/grpo/sft task."""
    return SFT_MODULE if task.workload == "sft" else PPO_MODULE


def verl_config_name(task: TaskSpec) -> str:
    """Return the hydra config name verl's entry module composes for this task."""
    return "sft_trainer_engine" if task.workload == "sft" else "ppo_trainer"


def verl_argv(task: TaskSpec, cluster: ClusterSpec, *, run_dir: str, wandb: bool) -> list[str]:
    """Return the argv of a verl task: ``python3 -m <module> <overrides...>``, or, for a task bounded by
    both ``steps`` and ``epochs``, ``python3 -m reconciler.job_apps.verl_entry <module> <overrides...>``.

    Raises PermanentError for ``command`` tasks or unresolved model/data paths.
    """
    entry = ["-m", VERL_ENTRY, verl_module(task)] if bounded_by_both(task) else ["-m", verl_module(task)]
    return ["python3", *entry, *verl_overrides(task, cluster, run_folder=run_dir, wandb=wandb)]


def in_run_folder(folder: str, argv: list[str]) -> str:
    """The shell entrypoint that runs ``argv`` from the run folder ``folder`` (made first).

    A Ray Job without a ``working_dir`` starts in the Ray node's own working directory, and verl writes
    relative paths there: hydra's ``outputs/<date>/<time>/`` (the job's composed config and log), and
    ``wandb/`` or ``tensorboard_log/`` when a user turns those loggers on. Every user's job would share
    that one folder, and fill the node's disk; from the run folder they stay with the run."""
    quoted = shlex.quote(folder)
    return f"mkdir -p {quoted} && cd {quoted} && exec {shlex.join(argv)}"


def entrypoint_argv(entrypoint: str) -> list[str]:
    """The argv a verl entrypoint (:func:`in_run_folder`) runs: the words after ``exec``."""
    words = shlex.split(entrypoint)
    return words[words.index("exec") + 1 :] if "exec" in words else words


def logger_dirs(run_folder: str) -> dict[str, str]:
    """Where verl 0.9.1's loggers write (verl.utils.tracking), inside ``run_folder``: tensorboard
    (``TENSORBOARD_DIR``), wandb's local files (``WANDB_DIR``), swanlab (``SWANLAB_LOG_DIR``) and the
    file logger (``VERL_FILE_LOGGER_ROOT``); each defaults to a path relative to the working directory."""
    return {
        "TENSORBOARD_DIR": posixpath.join(run_folder, "tensorboard"),
        "WANDB_DIR": run_folder,
        "SWANLAB_LOG_DIR": posixpath.join(run_folder, "swanlog"),
        "VERL_FILE_LOGGER_ROOT": run_folder,
    }


def set_secrets(secrets_env: Mapping[str, str]) -> dict[str, str]:
    """The secrets that are set: an empty (or blank) value is unset, not a key. ``.env`` files ship
    ``WANDB_API_KEY=``; passing it on would turn wandb logging on with an empty key."""
    return {k: str(v) for k, v in secrets_env.items() if str(v).strip()}


def job_env(
    task: TaskSpec,
    cluster: ClusterSpec,
    *,
    run_folder: str,
    secrets_env: Mapping[str, str],
    resume_folder: str | None = None,
    resume_step: int | None = None,
) -> dict[str, str]:
    """Return the job's env: :func:`isolation_env` < cluster env < verl's logger folders < task env < HOME (the
    user's folder) and run folders < secrets that are set (later wins). ``resume_folder``: the preempted
    attempt's run folder this attempt resumes from; ``resume_step``: the newest checkpoint step found there
    (None: not looked up)."""
    resume = {ENV_RESUME: "1", ENV_RESUME_DIR: resume_folder} if resume_folder else {}
    if resume_folder and resume_step is not None:
        resume[ENV_RESUME_STEP] = str(resume_step)
    # verl's loggers write relative to their process's working directory, and PPO's run in a Ray actor,
    # which starts in the Ray node's (shared by every user's jobs): these put them in the run folder. A
    # task's own env may still point them elsewhere.
    loggers = {} if task.workload == "command" else logger_dirs(run_folder)
    return {
        **isolation_env(task),
        **{k: str(v) for k, v in cluster.env.items()},
        **loggers,
        **{k: str(v) for k, v in task.env.items()},
        ENV_HOME: posixpath.join(cluster.paths.users, task.key.user),
        ENV_RUN_DIR: run_folder,
        ENV_CHECKPOINT_DIR: checkpoint_dir(run_folder),
        **resume,
        **set_secrets(secrets_env),
    }


def job_metadata(
    task: TaskSpec,
    cluster: ClusterSpec,
    *,
    run_folder: str,
    revision: str | None,
    resumed_from: int | None = None,
) -> dict[str, str]:
    """Return the labels stored with the job (all values are strings), without the ownership
    proof (:func:`job_submission` adds it). ``run_folder`` is informational: the observer derives it.
    ``resumed_from``: a resumed attempt's checkpoint step (None: not a resumed attempt)."""
    resources = {k: v for k, v in task_resources(task, cluster).items() if v}
    digest = task_spec_hash(task)
    out = {
        MANAGED_BY: MANAGER,
        LABEL_USER: task.key.user,
        LABEL_TASK: task.key.name,
        LABEL_SPEC_HASH: digest,
        LABEL_REVISION: revision or "",
        LABEL_RUN_DIR: run_folder,
        LABEL_RESOURCES: json.dumps(resources, sort_keys=True, separators=(",", ":")),
        LABEL_WORKLOAD: task.workload,
        LABEL_SPEC: json.dumps(task_spec_fields(task), sort_keys=True, separators=(",", ":"), default=str),
    }
    if resumed_from is not None:
        out[LABEL_RESUMED_FROM] = str(resumed_from)
    return out


def working_dir_uri(path: str) -> str:
    """An absolute path becomes ``local://<path>``: Ray uses it in place (shared storage,
    no upload, no size limit). A URI (``s3://``, ``gs://``, ``https://...zip``) is kept."""
    return path if "://" in path else f"local://{path}"


def job_submission(
    task: TaskSpec,
    cluster: ClusterSpec,
    *,
    revision: str | None,
    secrets_env: Mapping[str, str],
    sid: str | None = None,
    ownership_key: bytes = b"",
    resume_from: str | None = None,
    first_attempt: str | None = None,
    resume_step: int | None = None,
) -> dict[str, Any]:
    """Return the JSON body of ``POST /api/jobs/`` for one run of ``task``.

    ``resume_from``: the submission id of the preempted attempt this one resumes. A ``command``
    task then gets ``ARGUS_RESUME=1`` and ``ARGUS_RESUME_DIR`` (that attempt's run folder); a verl
    task gets ``trainer.resume_mode=auto`` with that attempt's ``default_local_dir``, so verl
    continues from its latest checkpoint (and saves the next ones there). verl keeps every
    attempt's checkpoints in the run folder of ``first_attempt`` (the run's first attempt;
    default ``resume_from``), which is where a resumed attempt's checkpoints are looked up.
    ``resume_step``: the newest checkpoint step in the folder the attempt resumes from (the caller
    reads it just before submitting; None: none found, recorded as step 0): the ``argus-resumed-from``
    label the status reports, and ``ARGUS_RESUME_STEP`` for a command task.

    A verl task bounded by both ``steps`` and ``epochs`` also names argus's
    ``worker_process_setup_hook`` (:data:`VERL_SETUP_HOOK`): verl's PPO trainer runs in a Ray actor
    of the job, where the step bound must be lowered too (:func:`epoch_bounds`).

    ``sid``: the submission id the planner chose (default: the first choice); ``ownership_key``
    signs the run (:func:`ownership_proof`); without it the job is foreign to every daemon.

    The driver asks for ``cluster.training.driver_resources`` (a custom resource only
    worker nodes have) so it never lands on the head. A ``command`` task's driver also
    takes the task's GPUs (``entrypoint_num_gpus``): Ray then admits it only when they are
    free. verl drivers take no GPUs; verl's workers claim them through placement groups.

    Raises PermanentError for a multi-node ``command`` task or a verl task with
    unresolved paths.
    """
    sid = sid or submission_id(task)
    folder = run_dir(task, cluster, sid)
    resume_folder = run_dir(task, cluster, resume_from) if resume_from else None
    resumed_from = (resume_step or 0) if resume_from else None
    wandb = "WANDB_API_KEY" in set_secrets(secrets_env)
    env = job_env(
        task, cluster, run_folder=folder, secrets_env=secrets_env, resume_folder=resume_folder, resume_step=resumed_from
    )
    runtime_env: dict[str, Any] = {"env_vars": env}
    if bounded_by_both(task):
        runtime_env["worker_process_setup_hook"] = VERL_SETUP_HOOK
    body: dict[str, Any] = {
        "submission_id": sid,
        "metadata": job_metadata(task, cluster, run_folder=folder, revision=revision, resumed_from=resumed_from),
        "entrypoint_resources": {k: float(v) for k, v in cluster.training.driver_resources.items()},
    }
    if task.workload == "command":
        if not task.command:
            raise PermanentError(f"{task.key}: workload command needs `command`")
        if task.nodes != 1:
            # One entrypoint process on one node: Ray cannot spread it over nodes.
            raise PermanentError(f"{task.key}: command tasks run on one node (nodes: {task.nodes})")
        body["entrypoint"] = task.command
        body["entrypoint_num_gpus"] = task.gpus_per_node
        if task.working_dir:
            runtime_env["working_dir"] = working_dir_uri(task.working_dir)
    else:
        argv = verl_argv(task, cluster, run_dir=folder, wandb=wandb)
        if resume_folder:
            root = run_dir(task, cluster, first_attempt or resume_from)
            resume = ["trainer.resume_mode=auto", f"trainer.default_local_dir={hydra_value(checkpoint_dir(root))}"]
            if resume_step:
                # The run has a checkpoint of its own: it resumes from it whatever the task's overrides say
                # (last: hydra's last wins). A task's `trainer.resume_from_path` (continuing a failed run, say)
                # would make verl load that one again, losing all the preempted attempts trained since.
                argv = [*argv, *resume, "trainer.resume_from_path=null"]
            else:
                # None yet: right after argus's own overrides, so a task's resume_mode/resume_from_path still
                # decides where its run starts (hydra: last wins).
                at = len(argv) - len(task.overrides) - len(kept_cadence(task, cluster))
                argv = [*argv[:at], *resume, *argv[at:]]
        body["entrypoint"] = in_run_folder(folder, argv)
    body["runtime_env"] = runtime_env
    if ownership_key:  # last: the proof covers everything above
        body["metadata"][LABEL_PROOF] = ownership_proof(ownership_key, sid, body)
    return body
