"""Issue 10 §1-2: overrides and engine_kwargs cannot reach what argus derives, counts or confines.

Each attack from issue 10's "Why" is written as bob would write it, against alice's home, and must
be refused at its line with the field to use instead; the legitimate uses beside it still load.
The policy is pure (reconciler.spec.overrides), so these run on the base install.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

import pytest

from reconciler.builders.jobs import derived_overrides, kept_cadence, run_dir
from reconciler.source.localfs import LocalFS
from reconciler.spec.loader import SourceFile, load
from reconciler.spec.overrides import DERIVED_KEYS, check_overrides, normalise_key, protected, split_override
from reconciler.spec.types import ClusterSpec, DesiredState, ObjectKey, Paths
from tests.support import task_spec

CLUSTER = "kind: Cluster\nusers:\n  alice: {gpus: 4}\n  bob: {gpus: 1}\n"
TASK_HEAD = (
    "kind: Task\nworkload: grpo\nmodel: Qwen/Qwen2.5-0.5B-Instruct\n"
    "data:\n  train: $HOME/data/train.parquet\ngpus_per_node: 1\noverrides:\n"
)  # the first override is on line 8
BOB_TASK = ObjectKey("bob", "task", "grpo")
BOB_MODEL = ObjectKey("bob", "model", "chat")


def file(path: str, text: str) -> SourceFile:
    return SourceFile(path, text.encode(), hashlib.sha1(text.encode()).hexdigest())


def load_bob(
    *,
    overrides: list[str] | None = None,
    model: str | None = None,
    cluster: str = CLUSTER,
) -> DesiredState:
    files = [file("cluster.yaml", cluster)]
    if overrides is not None:
        files.append(file(BOB_TASK.path, TASK_HEAD + "".join(f"  - {o!r}\n" for o in overrides)))
    if model is not None:
        files.append(file(BOB_MODEL.path, model))
    return load(files, default_time=1767225600)


def issues_of(state: DesiredState, key: ObjectKey) -> list[tuple[int, str]]:
    return [(i.line, i.message) for i in state.issues if i.path == key.path]


# -- tasks: the attacks of issue 10 ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("trainer.n_gpus_per_node=8", "`trainer.n_gpus_per_node` is derived by argus; set `gpus_per_node` instead"),
        ("trainer.nnodes=4", "`trainer.nnodes` is derived by argus; set `nodes` instead"),
        (
            "data.train_files=/private/users/alice/data/train.parquet",
            "`data.train_files` is derived by argus; set `data.train` instead",
        ),
        ("trainer.default_local_dir=/private/users/alice/jobs", "`trainer.default_local_dir` is derived by argus"),
        (
            "actor_rollout_ref.model.path=/private/users/alice/weights",
            "`actor_rollout_ref.model.path` is derived by argus; set `model` instead",
        ),
        ("critic.model.path=/private/users/alice/weights", "set `model` instead"),
        ("trainer.project_name=alice", "`trainer.project_name` is derived by argus"),
        ("trainer.experiment_name=grpo", "`trainer.experiment_name` is derived by argus"),
        ("trainer.default_hdfs_dir=hdfs://x/alice", "`trainer.default_hdfs_dir` is derived by argus"),
        ("actor_rollout_ref.rollout.n_gpus_per_node=8", "set `gpus_per_node` instead"),
        ("reward_model.enable_resource_pool=true", "a separate resource pool would take GPUs"),
        ("reward_model.nnodes=2", "set `nodes` instead"),
        ("ray_kwargs.ray_init.num_cpus=64", "Ray's settings"),
        ("actor_rollout_ref.actor.checkpoint.async_save_dir=/tmp/x", "run folder"),
        ("actor_rollout_ref.rollout.tensor_model_parallel_size=8", "asks for more GPUs than the task has"),
        ("actor_rollout_ref.rollout.data_parallel_size=2", "asks for more GPUs than the task has"),
        ("hydra.run.dir=/tmp", "hydra's own settings"),
        ("actor_rollout_ref.model.trust_remote_code=true", "serving.allow_trust_remote_code"),
        ("data.trust_remote_code=True", "serving.allow_trust_remote_code"),
        ("custom_reward_function.path=/private/users/alice/reward.py", "outside the allowed roots"),
        ("actor_rollout_ref.model.tokenizer_path=/private/users/alice/tok", "outside the allowed roots"),
        ("trainer.resume_from_path=$HOME/../alice/jobs/x", "outside the allowed roots"),
        ("trainer.resume_from_path=~alice/jobs", "`~` is not expanded"),
        ("trainer.resume_from_path=${oc.env:HOME}/jobs", "reads a value argus cannot check"),
        ("actor_rollout_ref.rollout.prompt_length_dir=rel", "relative paths are not allowed"),
        ("trainer={nnodes: 4}", "holds keys argus derives"),
        ("actor_rollout_ref.rollout={tensor_model_parallel_size: 8}", "asks for more GPUs"),
        ("some.key='$HOME/x, ../../../alice'", "outside the allowed roots"),
        ("some.key=[/private/users/bob/ok,/private/users/alice/x]", "outside the allowed roots"),
    ],
)
def test_bobs_override_is_refused_at_its_line(override: str, message: str) -> None:
    state = load_bob(overrides=["data.max_prompt_length=512", override])
    found = issues_of(state, BOB_TASK)
    assert BOB_TASK not in state.tasks and BOB_TASK in state.invalid
    assert [line for line, _ in found] == [9], found
    assert found[0][1].startswith("overrides[1]: ") and message in found[0][1], found


@pytest.mark.parametrize("prefix", ["", "+", "++", "~"])
@pytest.mark.parametrize("key", sorted(DERIVED_KEYS))
def test_no_spelling_of_a_derived_key_gets_through(prefix: str, key: str) -> None:
    """hydra's prefixes, upper case and spaces around dots do not hide a derived key."""
    for spelling in (key, key.upper(), key.replace(".", " . "), key.title()):
        assert protected(normalise_key(prefix + spelling)), spelling
        _out, refused = check_overrides(
            [f"{prefix}{spelling}=1"], user="bob", nodes=1, gpus_per_node=1, paths=Paths(), fs=None
        )
        assert [i for i, _ in refused] == [0], (spelling, refused)


@pytest.mark.parametrize("workload", ["ppo", "grpo", "sft"])
def test_every_key_argus_generates_is_protected_or_a_documented_tunable(workload: str) -> None:
    """A new key in derived_overrides must be decided on here: argus's, or the user's to tune."""
    tunable = {
        "trainer.logger",
        "trainer.save_freq",
        "trainer.max_actor_ckpt_to_keep",
        "trainer.max_critic_ckpt_to_keep",
        "trainer.max_ckpt_to_keep",
        "actor_rollout_ref.rollout.name",
        "actor_rollout_ref.rollout.gpu_memory_utilization",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
        "actor_rollout_ref.actor.checkpoint.save_contents",
        "critic.ppo_micro_batch_size_per_gpu",
        "algorithm.adv_estimator",
        "actor_rollout_ref.rollout.n",
        "data.micro_batch_size_per_gpu",
        "checkpoint.save_contents",
        "actor_rollout_ref.rollout.tensor_model_parallel_size",  # checked against the task's GPUs
    }
    task = task_spec("alice", "t", workload, model="org/m", model_path="/m", data_train="/d", steps=3)
    cluster = ClusterSpec()
    for override in derived_overrides(task, cluster, run_folder=run_dir(task, cluster), wandb=False):
        key = normalise_key(split_override(override)[1])
        assert protected(key) or key in tunable, f"{key}: neither protected nor a listed tunable"


def test_legitimate_overrides_load_with_home_expanded() -> None:
    state = load_bob(
        overrides=[
            "data.max_prompt_length=512",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
            "trainer.resume_from_path=$HOME/jobs/grpo/old",
            "+trainer.rollout_dump=${oc.env:ARGUS_RUN_DIR}/rollouts",
            "actor_rollout_ref.model.trust_remote_code=false",
            "data.tokenizer=Qwen/Qwen2.5-0.5B-Instruct",
            "trainer.logger=[console,wandb]",
            "custom_reward_function.path=/private/hf/rewards/gsm8k.py",
            "reward_model.reward_manager=http://scorer:8000/v1",
        ]
    )
    assert issues_of(state, BOB_TASK) == []
    task = state.tasks[BOB_TASK]
    assert task.overrides[2] == "trainer.resume_from_path=/private/users/bob/jobs/grpo/old"
    assert task.override_lines[2] == 10


def test_rollout_parallelism_up_to_the_tasks_gpus() -> None:
    four = TASK_HEAD.replace("gpus_per_node: 1", "gpus_per_node: 4")
    ok = "  - actor_rollout_ref.rollout.tensor_model_parallel_size=4\n"
    state = load([file("cluster.yaml", CLUSTER), file(BOB_TASK.path, four + ok)], default_time=0)
    assert BOB_TASK in state.tasks, state.issues
    state = load([file("cluster.yaml", CLUSTER), file(BOB_TASK.path, four + ok.replace("=4", "=5"))], default_time=0)
    assert issues_of(state, BOB_TASK) == [
        (
            8,
            "overrides[0]: `actor_rollout_ref.rollout.tensor_model_parallel_size=5` asks for more GPUs than the task "
            "has (`gpus_per_node` = 4); argus counts GPUs from `nodes` x `gpus_per_node` (admission and quota)",
        )
    ]


def test_trust_remote_code_when_the_cluster_allows_it() -> None:
    allowed = CLUSTER + "serving:\n  allow_trust_remote_code: true\n"
    state = load_bob(overrides=["actor_rollout_ref.model.trust_remote_code=true"], cluster=allowed)
    assert BOB_TASK in state.tasks, state.issues
    model = "kind: Model\nsource: Qwen/Qwen2.5-0.5B-Instruct\nengine_kwargs:\n  trust_remote_code: true\n"
    assert BOB_MODEL in load_bob(model=model, cluster=allowed).models
    assert ClusterSpec().serving.allow_trust_remote_code is False


def test_a_bad_override_never_blocks_alices_task() -> None:
    alice = file(
        "users/alice/tasks/ok.yaml",
        TASK_HEAD.replace("gpus_per_node: 1\noverrides:\n", "") + "overrides:\n  - data.max_prompt_length=256\n",
    )
    files = [file("cluster.yaml", CLUSTER), file(BOB_TASK.path, TASK_HEAD + "  - trainer.n_gpus_per_node=8\n"), alice]
    state = load(files, default_time=0)
    assert ObjectKey("alice", "task", "ok") in state.tasks
    assert [i.path for i in state.issues] == [BOB_TASK.path]


# -- models: engine_kwargs -------------------------------------------------------------------------

MODEL_HEAD = "kind: Model\nsource: Qwen/Qwen2.5-0.5B-Instruct\nengine_kwargs:\n"  # first kwarg on line 4


@pytest.mark.parametrize(
    ("kwarg", "message"),
    [
        ("tokenizer: /private/users/alice/tokenizer", "engine_kwargs.tokenizer: '/private/users/alice/tokenizer'"),
        ("download_dir: /private/users/alice/cache", "engine_kwargs.download_dir: '/private/users/alice/cache'"),
        ("download_dir: ~/cache", "`~` is not expanded"),
        ("download_dir: cache", "engine_kwargs.download_dir: 'cache': relative paths are not allowed"),
        ("trust_remote_code: true", "engine_kwargs.trust_remote_code: runs code from the model's folder"),
        ("reasoning_parser_plugin: $HOME/parser.py", "allow_trust_remote_code"),
        ("pipeline_parallel_size: 2", "set `gpus_per_replica` instead"),
        ("data_parallel_size: 2", "set `replicas` instead"),
        ("allowed_local_media_path: /", "engine_kwargs.allowed_local_media_path: '/' resolves to /"),
        ("speculative_config: {model: /private/users/alice/draft}", "engine_kwargs.speculative_config.model"),
        ("default_mm_loras: {image: /private/users/alice/lora}", "engine_kwargs.default_mm_loras.image"),
        ("hf_overrides: {x: $HOME/../alice}", "outside the allowed roots"),
        ("hf_overrides: {x: ../../../private/users/alice}", "`..` is not allowed in a path"),
        ("chat_template: /etc/passwd", "outside the allowed roots"),
    ],
)
def test_bobs_engine_kwarg_is_refused_at_its_line(kwarg: str, message: str) -> None:
    state = load_bob(model=MODEL_HEAD + "  max_model_len: 1024\n  " + kwarg + "\n")
    found = issues_of(state, BOB_MODEL)
    assert BOB_MODEL not in state.models
    assert [line for line, _ in found] == [5], found
    assert message in found[0][1], found


def test_engine_kwargs_paths_in_the_home_load_expanded() -> None:
    kwargs = (
        "  max_model_len: 1024\n  download_dir: $HOME/cache\n  tokenizer: Qwen/Qwen2.5-0.5B-Instruct\n"
        "  generation_config: auto\n  chat_template: '{{ messages | length / 2 }}'\n  trust_remote_code: false\n"
    )
    state = load_bob(model=MODEL_HEAD + kwargs)
    assert issues_of(state, BOB_MODEL) == []
    engine = state.models[BOB_MODEL].engine_kwargs
    assert engine["download_dir"] == "/private/users/bob/cache"
    assert engine["tokenizer"] == "Qwen/Qwen2.5-0.5B-Instruct"


def test_model_env_paths_and_code_loading() -> None:
    head = "kind: Model\nsource: Qwen/Qwen2.5-0.5B-Instruct\nenv:\n"  # first variable on line 4
    state = load_bob(model=head + "  HF_HUB_OFFLINE: '1'\n  VLLM_LOGGING_LEVEL: INFO\n")
    assert state.models[BOB_MODEL].env == {"HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "INFO"}
    # HF_HOME in bob's home is where transformers caches a model's code: trusted only.
    state = load_bob(model=head + "  HF_HOME: $HOME/hf\n")
    assert [(line, m.split(":")[0]) for line, m in issues_of(state, BOB_MODEL)] == [(4, "env.HF_HOME")]
    state = load_bob(model=head + "  PYTHONPATH: $HOME/code\n  HF_HOME: /private/users/alice/hf\n")
    assert [(line, m.split(":")[0]) for line, m in issues_of(state, BOB_MODEL)] == [
        (4, "env.PYTHONPATH"),
        (5, "env.HF_HOME"),
    ]
    allowed = CLUSTER + "serving:\n  allow_trust_remote_code: true\n"
    assert BOB_MODEL in load_bob(model=head + "  PYTHONPATH: $HOME/code\n", cluster=allowed).models
    trusted = load_bob(model=head + "  HF_HOME: $HOME/hf\n", cluster=allowed).models[BOB_MODEL]
    assert trusted.env == {"HF_HOME": "/private/users/bob/hf"}


CODE_CASES = ["model-env-logging-config", "engine-kwargs-logging-config", "model-env-code-caches"]
CODE_CASES += ["model-env-plugins", "engine-kwargs-code-classes", "model-env-ld-preload"]


@pytest.mark.parametrize("case", CODE_CASES)
def test_code_loading_env_and_engine_kwargs_pass_when_the_cluster_trusts_code(case: str) -> None:
    """The hostile cases that refuse code-loading variables and engine arguments load once the admin
    sets `serving.allow_trust_remote_code`: the refusal is that flag's, not a blanket ban."""
    text = (Path(__file__).resolve().parents[1] / "cases" / "hostile" / f"{case}.yaml").read_text()
    text = text.replace("/private/users/eve/", "/private/users/bob/")
    refused = load_bob(model=text)
    assert BOB_MODEL not in refused.models and issues_of(refused, BOB_MODEL)
    allowed = CLUSTER + "serving:\n  allow_trust_remote_code: true\n"
    state = load_bob(model=text, cluster=allowed)
    assert issues_of(state, BOB_MODEL) == [] and BOB_MODEL in state.models


# -- with the cluster's file system ----------------------------------------------------------------


def test_symlinks_in_override_and_engine_paths_are_followed(tmp_path: Path) -> None:
    common, users = tmp_path / "hf", tmp_path / "users"
    for user in ("alice", "bob"):
        (users / user / "data").mkdir(parents=True)
        (users / user / "data" / "train.parquet").write_bytes(b"PAR1")
    (users / "bob" / "model").mkdir()
    common.mkdir()
    (users / "bob" / "alices").symlink_to(users / "alice")
    cluster = CLUSTER + f"paths:\n  common: {common}\n  users: {users}\n"
    head = TASK_HEAD.replace("model: Qwen/Qwen2.5-0.5B-Instruct", "model: $HOME/model")
    task = file(BOB_TASK.path, head + "  - trainer.resume_from_path=$HOME/alices/jobs\n")
    model = file(BOB_MODEL.path, "kind: Model\nsource: $HOME/model\nengine_kwargs:\n  download_dir: $HOME/alices\n")
    state = load([file("cluster.yaml", cluster), task, model], fs=LocalFS(), default_time=0)
    real = str((users / "alice").resolve())
    assert [(i.line, "is a symlink to " + real in i.message) for i in state.issues if i.path == BOB_TASK.path] == [
        (8, True)
    ]
    assert [(i.line, "is a symlink to " + real in i.message) for i in state.issues if i.path == BOB_MODEL.path] == [
        (4, True)
    ]


# -- property: however a foreign path is wrapped, it is found ---------------------------------------

_FOREIGN = [
    "/private/users/alice/x",
    "$HOME/../alice/x",
    "$HOME/a/../../alice",
    "/private/users/bob/../alice/x",
    "/etc/passwd",
    "file:///private/users/alice/x",
    "~alice/x",
    "$OTHER/x",
    "../../../../private/users/alice/x",
    "y/../../../alice",
    "/private/users/bob/x, y/../../../alice",
]
_WRAPS = [
    "{p}",
    "'{p}'",
    '"{p}"',
    "[{p}]",
    "[/private/users/bob/ok,{p}]",
    "['/private/users/bob/ok', '{p}']",
    "{{a: {p}}}",
    "{{a: 1, b: '{p}'}}",
    "{{a:{p}}}",
    "--flag={p}",
    "x {p}",
]


# Unquoted, a comma splits the value: each part is a path of its own (not this test's case).
_CASES = [
    (p, w) for p in _FOREIGN for w in _WRAPS if not ("," in p and not w.startswith(("'", '"')) and "'{p}'" not in w)
]


@pytest.mark.parametrize(("path", "wrap"), _CASES)
@pytest.mark.parametrize("key", ["some.tool.arg", "actor_rollout_ref.rollout.custom.path", "+new.key"])
def test_a_foreign_path_is_found_however_it_is_wrapped(key: str, path: str, wrap: str) -> None:
    value = wrap.format(p=path)
    _out, refused = check_overrides([f"{key}={value}"], user="bob", nodes=1, gpus_per_node=1, paths=Paths(), fs=None)
    assert [i for i, _ in refused] == [0], (value, refused)


@pytest.mark.parametrize("wrap", _WRAPS)
def test_a_path_in_the_home_is_accepted_however_it_is_wrapped(wrap: str) -> None:
    value = wrap.format(p="$HOME/data/x")
    out, refused = check_overrides(
        [f"some.tool.arg={value}"], user="bob", nodes=1, gpus_per_node=1, paths=Paths(), fs=None
    )
    assert refused == [], (value, refused)
    assert "$HOME" not in out[0] and "/private/users/bob/data/x" in out[0]


# -- the checkpoint cadence (issue 30): a task may save more often, never less ----------------------------


@pytest.mark.parametrize(
    "override",
    [
        "trainer.save_freq=500",
        "trainer.save_freq=-1",
        "~trainer.save_freq=50",
        "trainer.save_freq='5'",
        "trainer.save_freq=10",
    ],
)
def test_a_tasks_save_freq_loads_and_the_job_keeps_the_clusters_cadence(override: str) -> None:
    """Capped where the job is built, never refused: an admin who lowers the cadence must not turn
    running tasks invalid (an invalid task's preempted run would never resume)."""
    state = load_bob(overrides=[override])
    assert issues_of(state, BOB_TASK) == []
    task, cluster = replace(state.tasks[BOB_TASK], model_path="/m"), state.cluster  # offline: unresolved
    argv = derived_overrides(task, cluster, run_folder=run_dir(task, cluster), wandb=False) + list(task.overrides)
    argv += kept_cadence(task, cluster)
    effective = [a.split("=", 1)[1] for a in argv if a.lstrip("+~").split("=")[0] == "trainer.save_freq"]
    assert effective[-1] == ("10" if override.endswith("=10") else "50"), argv


@pytest.mark.parametrize("value", ["0", "-5", "1.5", "'50'"])
def test_the_cadence_is_a_positive_number_of_steps(value: str) -> None:
    state = load_bob(overrides=[], cluster=CLUSTER + f"training: {{checkpoint_every_steps: {value}}}\n")
    errors = [(i.path, i.line, i.message) for i in state.issues if i.path == "cluster.yaml"]
    assert errors and errors[0][1] == 5 and "training.checkpoint_every_steps" in errors[0][2], errors


@pytest.mark.parametrize(
    "override", ["actor_rollout_ref.actor.checkpoint.async_save=true", "+critic.checkpoint.async_save=True"]
)
def test_asynchronous_saves_that_leave_no_tracker_are_refused(override: str) -> None:
    found = issues_of(load_bob(overrides=[override]), BOB_TASK)
    assert [line for line, _ in found] == [8] and "would resume from step 0" in found[0][1], found
    assert issues_of(load_bob(overrides=["actor_rollout_ref.actor.checkpoint.async_save=false"]), BOB_TASK) == []
