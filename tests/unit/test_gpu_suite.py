"""The GPU suite (tests/gpu, ``make gpu-check``) stays runnable where no GPU is: it is collected, every test in it
is marked ``gpu``, and every job body it submits is argus's own builder's output for the suite's config repository,
holding the checkpoint cadence, the step bound and the resume overrides the GPU tests rely on.

The GPU tests themselves only run on a GPU host; this test is what CPU-only CI sees of them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import reconciler.builders.jobs as builder
from tests.gpu import scenario

ROOT = Path(__file__).resolve().parents[2]
GPU_TESTS = [
    "test_sft_steps_above_one_epoch_trains_to_the_last_step_and_saves_there",
    "test_sft_stopped_after_a_checkpoint_resumes_from_it",
    "test_rl_stopped_after_a_checkpoint_resumes_from_it[ppo-resume]",
    "test_rl_stopped_after_a_checkpoint_resumes_from_it[grpo-resume]",
    "test_task_model_serves_the_checkpoint_and_answers",
]
# Each task's first own override (argus's resume overrides come after it once the run has a checkpoint).
TASK_OVERRIDE = {name: spec["overrides"][0] for name, spec in scenario.TASKS.items()}


def _collect(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args, "tests/gpu"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_gpu_suite_is_collected_and_every_test_in_it_is_marked_gpu() -> None:
    marked = _collect("-m", "gpu")
    assert marked.returncode == 0, marked.stdout + marked.stderr
    ids = [line.split("::")[-1] for line in marked.stdout.splitlines() if "::" in line]
    assert ids == GPU_TESTS, marked.stdout
    unmarked = _collect("-m", "not gpu")
    assert "::" not in unmarked.stdout, f"tests in tests/gpu without the gpu marker:\n{unmarked.stdout}"


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("gpu-suite")
    scenario.write_stub_inputs(root)
    return scenario.load_state(scenario.write_repo(root))


def test_every_body_comes_from_argus_builder_and_holds_the_contract(
    state: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[dict[str, Any]] = []
    real = builder.job_submission

    def spy(*args: Any, **kwargs: Any) -> dict[str, Any]:
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(builder, "job_submission", spy)
    for name, spec in scenario.TASKS.items():
        job = scenario.body(state, name)
        words = scenario.argv(job)
        module = "verl.trainer.sft_trainer_ray" if spec["workload"] == "sft" else "verl.trainer.main_ppo"
        assert words[:3] == ["python3", "-m", module], words[:3]
        assert scenario.contract_problems(state, name, job) == []
        assert job["submission_id"] == scenario.sid(state, name)
        assert "trainer.resume_mode=auto" not in words
    assert len(calls) == len(scenario.TASKS)
    # A task may lower the cluster's cadence with its own trainer.save_freq: it comes after argus's and wins.
    rl = scenario.argv(scenario.body(state, "ppo-resume"))
    freqs = [w for w in rl if w.startswith("trainer.save_freq=")]
    assert freqs == [f"trainer.save_freq={scenario.CADENCE}", f"trainer.save_freq={scenario.RL_SAVE_FREQ}"]
    grpo = scenario.argv(scenario.body(state, "grpo-resume"))
    assert scenario.hydra_value(grpo, "algorithm.adv_estimator") == "grpo"


@pytest.mark.parametrize("name", scenario.RESUMED)
def test_a_resumed_attempt_is_built_as_the_planner_resumes_a_preempted_run(state: Any, name: str) -> None:
    first, second = scenario.body(state, name), scenario.body(state, name, attempt=2, resume_step=scenario.CADENCE)
    assert second["submission_id"] == f"{first['submission_id']}--2"
    assert scenario.contract_problems(state, name, second, attempt=2) == []
    words = scenario.argv(second)
    # verl resumes from, and keeps saving into, the first attempt's checkpoints folder (hydra: the last one wins).
    first_checkpoints = str(scenario.run_folder(first) / "checkpoints")
    assert scenario.hydra_value(words, "trainer.default_local_dir") == first_checkpoints
    # The run has a checkpoint: argus's resume comes after the task's own overrides (a task's resume_from_path
    # must not send a preempted run back to another run's checkpoint); without one, before them.
    assert words.index("trainer.resume_mode=auto") > words.index(TASK_OVERRIDE[name])
    assert words[-1] == "trainer.resume_from_path=null"
    fresh = scenario.argv(scenario.body(state, name, attempt=2, resume_step=None))
    assert fresh.index("trainer.resume_mode=auto") < fresh.index(TASK_OVERRIDE[name])
    assert "trainer.resume_from_path=null" not in fresh
    env = second["runtime_env"]["env_vars"]
    assert env["ARGUS_RESUME"] == "1" and env["ARGUS_RESUME_DIR"] == str(scenario.run_folder(first))


def test_the_suite_parses_verl_output_as_verl_prints_it() -> None:
    sft = "\n".join(
        [
            "Checkpoint tracker file does not exist: /x/checkpoints/latest_checkpointed_iteration.txt",
            "Found latest checkpoint: /x/checkpoints/global_step_8 (step 8)",
            "step:9 - train/loss:5.5 - train/grad_norm:1.0",
            "Saving checkpoint to: /x/checkpoints/global_step_12",
            "step:10 - train/loss:5.25 - train/lr:0.001",
            "step:10 - val/loss:5.0",
        ]
    )
    assert scenario.logged_steps(sft) == [9, 10]
    assert scenario.logged_losses(sft) == {9: 5.5, 10: 5.25}
    assert scenario.logged_saves(sft) == [12]
    assert scenario.resumed_step(sft) == 8
    ppo = "\n".join(
        [
            "(TaskRunner pid=42) Load from checkpoint folder: /x/checkpoints/global_step_2",
            "(TaskRunner pid=42) step:3 - training/global_step:3 - timing_s/step:1.5 - actor/loss:0.1",
            "(TaskRunner pid=42) local_global_step_folder: /x/checkpoints/global_step_4",
        ]
    )
    assert scenario.logged_steps(ppo) == [3]
    assert scenario.logged_saves(ppo) == [4]
    assert scenario.resumed_step(ppo) == 2
    assert scenario.expected_saves(20, 4) == [4, 8, 12, 16, 20]
    assert scenario.expected_saves(5, 2, after=2) == [4, 5]


def test_gpu_check_runs_the_marked_suite() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "gpu-check:" in makefile and "-m gpu tests/gpu" in makefile
