"""The GPU suite's harness (tests/gpu) on this CPU machine: a real private Ray head and Jobs API, argus's real bodies,
observer and checkpoint lookup, with a stand-in for verl's trainer loops (tests/gpu/standin) in place of verl.

What it proves: the GPU tests' own machinery (submitting, stopping after a checkpoint as argus preempts, resuming as the
planner does, reading verl's log lines and checkpoint folders) works, and their checks pass against a loop that behaves
as verl 0.9.1's do. What it cannot prove: anything about verl, vLLM or the GPU (that is `make gpu-check`'s).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler.dashboard import Dashboard
from reconciler.spec.types import DesiredState
from reconciler.testing.deps import require
from reconciler.testing.ray_head import start_head
from tests.gpu import scenario
from tests.gpu import test_training_and_serving as gpu_tests
from tests.gpu.runner import preempt_and_resume, run_job, shims_folder

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "tests" / "gpu" / "standin"


@pytest.fixture(scope="module")
def harness() -> Iterator[tuple[Dashboard, DesiredState]]:
    """Its own head (1 logical GPU): the jobs' ``python3`` must be this interpreter (runner.shims_folder)."""
    require("ray")
    root = Path(tempfile.mkdtemp(prefix="argus-gpuh-"))
    scenario.write_stub_inputs(root)
    shims = shims_folder(root / "bin")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)  # the jobs' working directory (tests/gpu/conftest.py's gpu_head)
        head = start_head(
            num_cpus=4,
            num_gpus=1,
            resources={"worker_node": 4},
            env={"PATH": os.pathsep.join([str(shims), os.environ.get("PATH", "")]), "PYTHONPATH": str(REPO)},
        )
    try:
        jobs_env = {"PYTHONPATH": f"{STANDIN}{os.pathsep}{REPO}"}
        state = scenario.load_state(scenario.write_repo(root, serve_port=head.serve_port, env=jobs_env))
        yield Dashboard(head.dashboard_url, token=None), state
    finally:
        head.stop()
        shutil.rmtree(head.temp_dir, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)


def test_the_sft_checks_pass_against_verls_loop(
    harness: tuple[Dashboard, DesiredState], monkeypatch: pytest.MonkeyPatch
) -> None:
    dash, state = harness
    monkeypatch.setattr(gpu_tests, "_generate", lambda folder: "(no GPU here)")
    run = run_job(dash, state, scenario.body(state, "sft-steps"), timeout_s=180)
    gpu_tests.test_sft_steps_above_one_epoch_trains_to_the_last_step_and_saves_there(run, state)


@pytest.mark.parametrize("name", ["sft-resume", "ppo-resume"])
def test_the_resume_checks_pass_against_verls_loop(harness: tuple[Dashboard, DesiredState], name: str) -> None:
    dash, state = harness
    gpu_tests._check_resumed(state, name, preempt_and_resume(dash, state, name, timeout_s=180))
