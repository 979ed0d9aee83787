"""`steps`, `epochs` and the checkpoint cadence against verl's real training loops (issue 30).

verl cannot run here (no GPU), so the loops are modelled: :func:`sft_loop` and :func:`ppo_loop` follow
verl 0.9.1's ``SFTTrainer.fit`` and ``RayPPOTrainer.fit`` / v1 ``PPOTrainer.fit`` step for step, and
:func:`test_the_models_follow_verls_source` pins each model to the lines of the installed verl it models
(a new verl that changes them fails here first). Each rendered argv is then run through the model: on a
GPU, argus's SFT task with `steps: 40` over a 16-step epoch ended at step 16 with no checkpoint, which
:func:`test_steps_above_one_epoch_reach_their_last_step_and_save_there` reproduces with the old argv.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from reconciler.builders.jobs import VERL_ENTRY, VERL_SETUP_HOOK, entrypoint_argv, job_submission, run_dir, verl_argv
from reconciler.job_apps import verl_entry
from reconciler.spec.types import ClusterSpec, Paths, Training
from tests.unit.test_builders_jobs import make_task

CLUSTER = ClusterSpec(paths=Paths(common="/shared/hf", users="/shared/users"), training=Training())
WORKLOADS = ("sft", "ppo", "grpo")


@dataclass
class Run:
    """What a modelled verl run did: the steps it trained and the steps it saved at."""

    last: int = 0
    saves: list[int] = field(default_factory=list)
    trained: list[int] = field(default_factory=list)


def trainer_settings(argv: list[str]) -> dict[str, str]:
    """The ``trainer.*`` overrides of an argv as hydra applies them (the last one wins)."""
    out: dict[str, str] = {}
    for arg in argv:
        key, _, value = arg.lstrip("+").partition("=")
        if key.startswith("trainer."):
            out[key[len("trainer.") :]] = value
    return out


def sft_loop(argv: list[str], per_epoch: int, resume: int = 0, stop_after: int | None = None) -> Run:
    """verl 0.9.1 ``SFTTrainer`` (sft_trainer_ray.py): ``_build_dataloader`` sets the step bound,
    ``fit`` loops; a StatefulDataLoader resumes mid-epoch. ``stop_after``: the job is killed then."""
    t = trainer_settings(argv)
    epochs, save_freq = int(t["total_epochs"]), int(t.get("save_freq", "-1"))
    steps = t.get("total_training_steps", "null")
    total = int(steps) if steps != "null" else per_epoch * epochs
    total = _bounded(argv, total, epochs * per_epoch)
    run, step = Run(), resume
    start_epoch = step // per_epoch
    for epoch in range(start_epoch, epochs):
        for _ in range(per_epoch - step % per_epoch if epoch == start_epoch else per_epoch):
            step += 1
            run.trained.append(step)
            run.last = step
            is_last = step >= total
            if is_last or (save_freq > 0 and step % save_freq == 0):
                run.saves.append(step)
            if is_last or step == stop_after:
                return run
    return run


def ppo_loop(argv: list[str], per_epoch: int, resume: int = 0, stop_after: int | None = None) -> Run:
    """verl 0.9.1 ``RayPPOTrainer.fit`` (ppo/ray_trainer.py; the v1 ``PPOTrainer.fit`` has the same
    bounds): steps from 1, ``is_last_step`` before the save, saving only when ``save_freq > 0``."""
    t = trainer_settings(argv)
    epochs, save_freq = int(t["total_epochs"]), int(t.get("save_freq", "-1"))
    steps = t.get("total_training_steps", "null")
    total = int(steps) if steps != "null" else per_epoch * epochs
    total = _bounded(argv, total, epochs * per_epoch)
    run, step = Run(), resume
    current_epoch = step // per_epoch
    step += 1
    for epoch in range(current_epoch, epochs):
        for _ in range(per_epoch - (step - 1) % per_epoch if epoch == current_epoch else per_epoch):
            run.trained.append(step)
            run.last = step
            is_last = step >= total
            if save_freq > 0 and (is_last or step % save_freq == 0):
                run.saves.append(step)
            if is_last or step == stop_after:
                return run
            step += 1
    return run


def _bounded(argv: list[str], total: int, epoch_steps: int) -> int:
    """What argus's entry (reconciler.job_apps.verl_entry.bound) does to the bound before ``fit``."""
    if VERL_ENTRY in argv and 0 < epoch_steps < total:
        return epoch_steps
    return total


def loop(workload: str) -> type:
    return sft_loop if workload == "sft" else ppo_loop  # type: ignore[return-value]


def argv_of(workload: str, **kw: object) -> list[str]:
    task = make_task(workload, "t", **kw)
    return verl_argv(task, CLUSTER, run_dir=run_dir(task, CLUSTER), wandb=False)


# -- the models against verl's source --------------------------------------------------------------------


def verl_source(module: str) -> str:
    """The installed verl's source of ``module``, found without importing verl (its imports need a GPU stack)."""
    spec = importlib.util.find_spec("verl")
    assert spec is not None and spec.submodule_search_locations, "verl is not installed (make venv installs it)"
    path = Path(next(iter(spec.submodule_search_locations)), *module.split(".")[1:]).with_suffix(".py")
    return path.read_text(encoding="utf-8")


# Lines of verl 0.9.1 each model above follows (whitespace-normalised).
VERL_LINES = {
    "verl.trainer.sft_trainer_ray": [
        "self.total_training_steps = self.config.trainer.total_training_steps",
        "self.total_training_steps = len(self.train_dataloader) * self.config.trainer.total_epochs",
        "start_epoch = global_step // self.steps_per_epoch",
        "for epoch in range(start_epoch, self.config.trainer.total_epochs):",
        "global_step += 1",
        "is_last_step = global_step >= self.total_training_steps",
        "is_save_step = global_step % self.save_freq == 0",
        "if is_last_step or (self.save_freq > 0 and is_save_step):",
        "self.ckpt_handler.save_checkpoint(step=global_step)",
    ],
    "verl.trainer.ppo.ray_trainer": [
        "total_training_steps = len(self.train_dataloader) * self.config.trainer.total_epochs",
        "total_training_steps = self.config.trainer.total_training_steps",
        "current_epoch = self.global_steps // len(self.train_dataloader)",
        "for epoch in range(current_epoch, self.config.trainer.total_epochs):",
        "is_last_step = self.global_steps >= self.total_training_steps",
        "if self.config.trainer.save_freq > 0 and (",
        "self.global_steps += 1",
    ],
    "verl.trainer.ppo.v1.trainer_base": [
        "total_training_steps = self.steps_per_epoch * self.config.trainer.total_epochs",
        "total_training_steps = self.config.trainer.total_training_steps",
        "while current_epoch < self.config.trainer.total_epochs and self.global_steps <= self.total_training_steps:",
        "is_last_step = self.global_steps >= self.total_training_steps",
        "if self.config.trainer.save_freq > 0 and (",
    ],
}


@pytest.mark.parametrize("module", sorted(VERL_LINES))
def test_the_models_follow_verls_source(module: str) -> None:
    source = {" ".join(line.split()) for line in verl_source(module).splitlines()}
    missing = [line for line in VERL_LINES[module] if line not in source]
    assert not missing, f"{module} no longer has these lines the loop model follows: {missing}"


@pytest.mark.parametrize("module", sorted(verl_entry.TRAINERS))
def test_argus_entry_finds_what_it_wraps_in_verl(module: str) -> None:
    """reconciler.job_apps.verl_entry wraps these classes' fit and reads these attributes."""
    tree = ast.parse(verl_source(module))
    classes = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    for name in verl_entry.TRAINERS[module]:
        assert name in classes, f"{module} has no class {name}"
        methods = {n.name for n in classes[name].body if isinstance(n, ast.FunctionDef)}
        assert "fit" in methods, f"{module}.{name} has no fit()"
        assigned = {
            t.attr
            for n in ast.walk(classes[name])
            if isinstance(n, ast.Assign)
            for t in n.targets
            if isinstance(t, ast.Attribute)
        }
        assert "total_training_steps" in assigned, f"{module}.{name} sets no total_training_steps"
        assert assigned & {"steps_per_epoch", "train_dataloader"}, f"{module}.{name}: no step count per epoch"


# -- steps and epochs --------------------------------------------------------------------------------------


def test_steps_above_one_epoch_reach_their_last_step_and_save_there() -> None:
    """The H200 finding: SFT `steps: 40`, 16 steps an epoch. The argv argus rendered before
    (total_epochs=1) ended at step 16 and saved nothing; the model reproduces that."""
    old = ["trainer.total_epochs=1", "trainer.total_training_steps=40", "trainer.save_freq=-1"]
    assert sft_loop(old, per_epoch=16) == Run(last=16, saves=[], trained=list(range(1, 17)))
    for workload in WORKLOADS:
        run = loop(workload)(argv_of(workload, steps=40), per_epoch=16)
        assert run.last == 40 and run.saves[-1] == 40, (workload, run)


@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.parametrize("per_epoch", [1, 3, 16, 1000])
@pytest.mark.parametrize("steps", [1, 7, 40])
def test_steps_alone_run_exactly_that_many_steps(workload: str, per_epoch: int, steps: int) -> None:
    """An epoch may be a single step: the argv still lets verl's loop reach `steps`."""
    run = loop(workload)(argv_of(workload, steps=steps), per_epoch=per_epoch)
    assert run.trained == list(range(1, steps + 1)) and run.saves[-1] == steps


@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.parametrize("per_epoch", [1, 5, 16])
@pytest.mark.parametrize("epochs", [None, 1, 3])
def test_epochs_alone_run_that_many_passes_and_save_at_the_end(
    workload: str, per_epoch: int, epochs: int | None
) -> None:
    run = loop(workload)(argv_of(workload, epochs=epochs), per_epoch=per_epoch)
    assert run.last == (epochs or 1) * per_epoch and run.saves[-1] == run.last


@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.parametrize(("steps", "epochs", "per_epoch"), [(40, 2, 16), (40, 3, 16), (5, 2, 16), (7, 7, 1)])
def test_both_end_at_whichever_comes_first_and_save_there(
    workload: str, steps: int, epochs: int, per_epoch: int
) -> None:
    argv = argv_of(workload, steps=steps, epochs=epochs)
    assert argv[:3] == ["python3", "-m", VERL_ENTRY], "both bounds run through argus's entry"
    run = loop(workload)(argv, per_epoch=per_epoch)
    assert run.last == min(steps, epochs * per_epoch) and run.saves[-1] == run.last, run
    # Without argus's entry verl's loop just runs out when the epochs come first: no last save.
    plain = loop(workload)(argv[3:], per_epoch=per_epoch)
    if epochs * per_epoch < steps:
        assert plain.saves == [s for s in plain.saves if s % 50 == 0] and plain.last not in plain.saves


def test_only_verl_tasks_bounded_both_ways_use_argus_entry() -> None:
    for kw in ({"steps": 10}, {"epochs": 2}, {}):
        argv = argv_of("sft", **kw)
        assert argv[:3] == ["python3", "-m", "verl.trainer.sft_trainer_ray"], kw
        body = job_submission(make_task("sft", "t", **kw), CLUSTER, revision=None, secrets_env={})
        assert "worker_process_setup_hook" not in body["runtime_env"], kw
    body = job_submission(make_task("grpo", "t", steps=10, epochs=2), CLUSTER, revision=None, secrets_env={})
    # verl's PPO trainer runs in a Ray actor: the step bound must reach that process too.
    assert body["runtime_env"]["worker_process_setup_hook"] == VERL_SETUP_HOOK
    assert entrypoint_argv(body["entrypoint"])[:4] == ["python3", "-m", VERL_ENTRY, "verl.trainer.main_ppo"]


# -- the checkpoint cadence --------------------------------------------------------------------------------


@pytest.mark.parametrize("workload", WORKLOADS)
def test_every_verl_workload_saves_on_the_cluster_cadence(workload: str) -> None:
    cluster = ClusterSpec(paths=CLUSTER.paths, training=Training(checkpoint_every_steps=4))
    task = make_task(workload, "t", steps=18)
    argv = verl_argv(task, cluster, run_dir=run_dir(task, cluster), wandb=False)
    keep = "trainer.max_ckpt_to_keep=2" if workload == "sft" else "trainer.max_actor_ckpt_to_keep=2"
    assert "trainer.save_freq=4" in argv and keep in argv
    assert loop(workload)(argv, per_epoch=5).saves == [4, 8, 12, 16, 18]


@pytest.mark.parametrize("workload", WORKLOADS)
def test_a_task_may_save_more_often(workload: str) -> None:
    run = loop(workload)(argv_of(workload, steps=9, overrides=("trainer.save_freq=3",)), per_epoch=4)
    assert run.saves == [3, 6, 9]


@pytest.mark.parametrize("workload", WORKLOADS)
def test_a_preempted_run_resumes_from_its_newest_checkpoint_and_loses_at_most_the_cadence(workload: str) -> None:
    """Killed after step 10 with a save every 4: the resumed attempt (verl's resume_mode=auto in the
    first attempt's folder) loads step 8 and trains 9..16; steps 1..8 are never trained again."""
    cluster = ClusterSpec(paths=CLUSTER.paths, training=Training(checkpoint_every_steps=4))
    task = make_task(workload, "t", steps=16)
    first = job_submission(task, cluster, revision=None, secrets_env={})
    argv = entrypoint_argv(first["entrypoint"])
    killed = loop(workload)(argv, per_epoch=5, stop_after=10)
    newest = max(killed.saves)
    assert newest == 8 and killed.last - newest < 4
    second = job_submission(
        task, cluster, revision=None, secrets_env={}, sid=f"{first['submission_id']}--2",
        resume_from=first["submission_id"], first_attempt=first["submission_id"], resume_step=newest,
    )  # fmt: skip
    resumed_argv = entrypoint_argv(second["entrypoint"])
    settings = trainer_settings(resumed_argv)
    assert settings["resume_mode"] == "auto"
    assert settings["default_local_dir"] == first["runtime_env"]["env_vars"]["ARGUS_CHECKPOINT_DIR"]
    assert second["metadata"]["argus-resumed-from"] == "8"
    run = loop(workload)(resumed_argv, per_epoch=5, resume=newest)
    assert run.trained == list(range(9, 17)) and run.saves == [12, 16]


def test_a_command_task_learns_where_it_resumes() -> None:
    task = make_task("command", "c", command="python train.py")
    body = job_submission(
        task, CLUSTER, revision=None, secrets_env={}, sid="argus--alice--c--x--2", resume_from="argus--alice--c--x",
        resume_step=None,
    )  # fmt: skip
    env = body["runtime_env"]["env_vars"]
    assert env["ARGUS_RESUME_DIR"] == "/shared/users/alice/jobs/c/argus--alice--c--x"
    assert env["ARGUS_RESUME_STEP"] == "0" and body["metadata"]["argus-resumed-from"] == "0"
    fresh = job_submission(task, CLUSTER, revision=None, secrets_env={})
    assert "ARGUS_RESUME_STEP" not in fresh["runtime_env"]["env_vars"]
    assert "argus-resumed-from" not in fresh["metadata"]


# -- argus's entry, on stand-in trainers with verl's loop shape ------------------------------------------

FAKE_SFT = '''
class _Cfg:
    def __init__(self, **kw):
        self.__dict__.update(kw)

class SFTTrainer:
    """verl 0.9.1's SFTTrainer.fit shape: step bound from the config, epochs of steps_per_epoch."""
    def __init__(self, epochs, steps, per_epoch, save_freq):
        self.config = _Cfg(trainer=_Cfg(total_epochs=epochs, total_training_steps=steps))
        self.steps_per_epoch = per_epoch
        self.total_training_steps = steps if steps is not None else per_epoch * epochs
        self.save_freq, self.saves, self.last = save_freq, [], 0
    def fit(self):
        step = 0
        for _ in range(self.config.trainer.total_epochs):
            for _ in range(self.steps_per_epoch):
                step += 1
                self.last = step
                if step >= self.total_training_steps or step % self.save_freq == 0:
                    self.saves.append(step)
                if step >= self.total_training_steps:
                    return

def main():
    import sys
    epochs, steps, per_epoch = (int(a.split("=")[1]) for a in sys.argv[1:4])
    t = SFTTrainer(epochs, steps, per_epoch, save_freq=4)
    t.fit()
    print("RESULT", t.last, t.saves)
'''


def test_argus_entry_ends_verl_at_the_epochs_end_with_its_last_save(tmp_path: Path) -> None:
    pkg = tmp_path / "verl" / "trainer"
    pkg.mkdir(parents=True)
    (tmp_path / "verl" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "sft_trainer_ray.py").write_text(textwrap.dedent(FAKE_SFT))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(Path(__file__).parents[2])])}
    args = ["verl.trainer.sft_trainer_ray", "trainer.total_epochs=2", "trainer.total_training_steps=40", "p=5"]
    bounded = subprocess.run(
        [sys.executable, "-m", VERL_ENTRY, *args], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    assert "RESULT 10 [4, 8, 10]" in bounded.stdout, bounded.stdout + bounded.stderr
    assert "step 10 is the last (whichever comes first)" in bounded.stdout
    plain = subprocess.run(
        [sys.executable, "-c", "import sys; sys.argv[1:] = sys.argv[2:]; import verl.trainer.sft_trainer_ray as m; "
         "m.main()", "x", *args[1:]],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert "RESULT 10 [4, 8]" in plain.stdout, plain.stdout  # verl alone: no save at its last step


def test_argus_entry_is_installed_once_and_wraps_late_imports(tmp_path: Path) -> None:
    code = textwrap.dedent(
        """
        import sys
        from reconciler.job_apps import verl_entry
        verl_entry.install(); verl_entry.install()
        assert sum(isinstance(f, verl_entry._TrainerFinder) for f in sys.meta_path) == 1
        import verl.trainer.sft_trainer_ray as m
        assert getattr(m.SFTTrainer.fit, "_argus_bounded", False)
        t = m.SFTTrainer(epochs=3, steps=None, per_epoch=2, save_freq=100)
        assert verl_entry.bound(t) == 6  # epochs alone: nothing to lower
        print("OK")
        """
    )
    pkg = tmp_path / "verl" / "trainer"
    pkg.mkdir(parents=True)
    (tmp_path / "verl" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "sft_trainer_ray.py").write_text(textwrap.dedent(FAKE_SFT))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(Path(__file__).parents[2])])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "OK" in out.stdout, out.stdout + out.stderr


def test_argus_entry_fails_loudly_on_a_verl_it_does_not_know(tmp_path: Path) -> None:
    pkg = tmp_path / "verl" / "trainer"
    pkg.mkdir(parents=True)
    (tmp_path / "verl" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "sft_trainer_ray.py").write_text("class Renamed:\n    pass\n\ndef main():\n    print('TRAINED')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(Path(__file__).parents[2])])}
    out = subprocess.run(
        [sys.executable, "-m", VERL_ENTRY, "verl.trainer.sft_trainer_ray"], env=env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert out.returncode != 0 and "TRAINED" not in out.stdout
    assert re.search(r"has no class SFTTrainer", out.stderr), out.stderr


def test_argus_entry_refuses_other_modules() -> None:
    assert verl_entry.main(["os"]) == 2
    assert verl_entry.main([]) == 2


# -- what a task's own overrides can do to its resume and cadence (hostile review of issue 30) ------------


@pytest.mark.parametrize("workload", WORKLOADS)
def test_a_tasks_resume_path_starts_its_run_but_never_sends_a_preempted_attempt_back(workload: str) -> None:
    """docs/users/tasks.md: continue a failed run with resume_mode=resume_path + resume_from_path. The new
    run's first attempt starts there; once it has checkpoints of its own, a resumed attempt loads its own
    newest one (what the status says), not the old run's again (verl's SFT CheckpointHandler and PPO
    _load_checkpoint both prefer a resume_from_path)."""
    old = "/shared/users/alice/jobs/t/argus--alice--t--0ld/checkpoints/global_step_5"
    task = make_task(
        workload, "t", steps=200, overrides=("trainer.resume_mode=resume_path", f"trainer.resume_from_path={old}")
    )
    first = job_submission(task, CLUSTER, revision=None, secrets_env={})
    assert trainer_settings(entrypoint_argv(first["entrypoint"]))["resume_from_path"] == old
    resumed = {"sid": f"{first['submission_id']}--2", "resume_from": first["submission_id"]}
    second = job_submission(task, CLUSTER, revision=None, secrets_env={}, **resumed, resume_step=150)  # type: ignore[arg-type]
    assert second["metadata"]["argus-resumed-from"] == "150"
    effective = trainer_settings(entrypoint_argv(second["entrypoint"]))
    assert (effective["resume_mode"], effective["resume_from_path"]) == ("auto", "null")
    # Preempted before its first save: the run starts where the task says, as its first attempt did.
    early = job_submission(task, CLUSTER, revision=None, secrets_env={}, **resumed, resume_step=None)  # type: ignore[arg-type]
    assert trainer_settings(entrypoint_argv(early["entrypoint"]))["resume_from_path"] == old


def test_a_task_that_turns_resuming_off_still_resumes_after_a_preemption() -> None:
    task = make_task("grpo", "t", steps=20, overrides=("trainer.resume_mode=disable",))
    body = job_submission(
        task, CLUSTER, revision=None, secrets_env={}, sid="argus--alice--t--x--2", resume_from="argus--alice--t--x",
        resume_step=10,
    )  # fmt: skip
    assert trainer_settings(entrypoint_argv(body["entrypoint"]))["resume_mode"] == "auto"


@pytest.mark.parametrize(
    ("override", "effective"),
    [
        ("trainer.save_freq=10", "10"),
        ("trainer.save_freq=50", "50"),
        ("trainer.save_freq=51", "50"),
        ("trainer.save_freq=100", "50"),  # argus's own former PPO value: a task that copied it loads, capped
        ("trainer.save_freq=-1", "50"),
        ("trainer.save_freq=0", "50"),
        ("~trainer.save_freq=50", "50"),
        ("++Trainer.Save_Freq=500", "50"),
        # hydra reads these as strings (verl's `step % save_freq` fails on them) or refuses them
        ("trainer.save_freq=0050", "50"),
        ("trainer.save_freq='5'", "50"),
        ('trainer.save_freq="5"', "50"),
        ("trainer.save_freq=٥", "50"),
        ("trainer.save_freq=after_each_epoch", "50"),
    ],
)
def test_a_tasks_save_freq_may_only_lower_the_cadence(override: str, effective: str) -> None:
    argv = argv_of("sft", steps=100, overrides=(override,))
    assert trainer_settings(argv)["save_freq"] == effective, argv
    if effective != override.split("=")[-1]:
        assert argv[-1] == "trainer.save_freq=50"  # argus's cap comes after the task's own


def test_the_cadence_cap_of_a_resumed_attempt_stays_last_among_the_tasks_settings() -> None:
    task = make_task("sft", "t", steps=20, overrides=("trainer.save_freq=500", "optim.lr=1e-5"))
    body = job_submission(
        task, CLUSTER, revision=None, secrets_env={}, sid="argus--alice--t--x--2", resume_from="argus--alice--t--x"
    )
    argv = entrypoint_argv(body["entrypoint"])
    assert trainer_settings(argv)["save_freq"] == "50" and argv[-1] == "trainer.save_freq=50"
    assert argv.index("trainer.resume_mode=auto") < argv.index("trainer.save_freq=500")
