"""Fixtures of the GPU suite (``make gpu-check``; docs/admins/gpu-and-cpu-modes.md#checking-a-new-gpu-host).

Every test here is marked ``gpu``. Without a CUDA device (this check runs ``nvidia-smi -L`` once at collection and
imports nothing heavy) each one is skipped with the reason, so ``make test`` on CPU-only machines and CI collects the
suite and skips it. With a GPU, a missing ray/verl/vLLM skips the tests that need it, except under ``CI``, where it
fails them (reconciler.testing.deps.require).

One private Ray head for the session, with the machine's GPUs and ``worker_node`` slots for job drivers, started by
:func:`reconciler.testing.ray_head.start_head` on free ports (other Ray clusters on the host are left alone); the
tiny model and data are written into a temporary user's home; argus's rendered job bodies are submitted to the head's
Jobs API (tests/gpu/runner.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler.dashboard import Dashboard
from reconciler.spec.types import DesiredState
from reconciler.testing.deps import require
from reconciler.testing.ray_head import RayHead, start_head
from tests.gpu import scenario
from tests.gpu.runner import SFT_JOB_S, JobRun, artifacts_dir, run_job, say, shims_folder

REPO_ROOT = Path(__file__).resolve().parents[2]
HINT = "the GPU suite runs on a host with an NVIDIA GPU: `make gpu-check` (docs/admins/gpu-and-cpu-modes.md)"


def visible_gpus() -> tuple[int, str]:
    """``(count, why)``: the CUDA devices this process may use, from ``nvidia-smi -L`` and CUDA_VISIBLE_DEVICES.
    ``why`` says what was found (the skip reason when the count is 0)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return 0, f"no CUDA device: CUDA_VISIBLE_DEVICES={visible!r} hides every GPU"
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0, "no CUDA device: nvidia-smi is not on PATH"
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 0, f"no CUDA device: nvidia-smi -L failed ({exc})"
    gpus = [line for line in out.stdout.splitlines() if line.startswith("GPU ")]
    if out.returncode != 0 or not gpus:
        detail = (out.stderr or out.stdout).strip().splitlines()[-1:] or ["no output"]
        return 0, f"no CUDA device: nvidia-smi -L lists none (exit {out.returncode}: {detail[0]})"
    count = len(gpus)
    if visible is not None:
        count = min(count, len([v for v in visible.split(",") if v.strip()]))
    return count, "; ".join(gpus[:count])


GPUS, GPU_INFO = visible_gpus()


def pytest_configure(config: pytest.Config) -> None:
    # Known whether or not pytest-timeout is installed (--strict-markers); the runner's own deadlines hold anyway.
    config.addinivalue_line("markers", "timeout(seconds): per-test limit (pytest-timeout)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if GPUS:
        return
    skip = pytest.mark.skip(reason=f"{GPU_INFO}; {HINT}")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def gpu_stack() -> str:
    """The installed training stack (skips, or fails under CI, when it is missing); returns its versions."""
    require("torch", "transformers", "pyarrow", "ray", "verl", "hydra")
    import ray
    import torch
    import transformers
    import verl

    if not torch.cuda.is_available():
        message = f"torch {torch.__version__} sees no CUDA device although nvidia-smi lists: {GPU_INFO}"
        pytest.fail(message, pytrace=False)
    versions = (
        f"{GPU_INFO} | torch {torch.__version__} (CUDA {torch.version.cuda}) | ray {ray.__version__} | "
        f"verl {getattr(verl, '__version__', '?')} | transformers {transformers.__version__}"
    )
    say(versions)
    return versions


@pytest.fixture(scope="session")
def suite_root(gpu_stack: str) -> Iterator[Path]:
    """A short temporary folder for the users' homes and the config repository (kept with ARGUS_KEEP_GPU_RUNS)."""
    root = Path(tempfile.mkdtemp(prefix="argus-gpu-"))
    try:
        yield root
    finally:
        if not os.environ.get("ARGUS_KEEP_GPU_RUNS"):
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def inputs(suite_root: Path) -> str:
    """The tiny model and the data, written into the user's home (tests/gpu/tiny.py)."""
    from tests.gpu.tiny import write_inputs

    started = time.monotonic()
    what = write_inputs(suite_root)
    say(f"model and data in {time.monotonic() - started:.0f}s: {what}")
    return what


@pytest.fixture(scope="session")
def gpu_head(suite_root: Path) -> Iterator[RayHead]:
    """A private Ray head with the visible GPUs, ``worker_node`` slots for drivers, Serve on a free port."""
    shims = shims_folder(suite_root / "bin")
    path = os.pathsep.join([str(shims), os.environ.get("PATH", "")])
    pythonpath = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    # A job without a working_dir runs in the raylet's working directory, where verl's hydra writes outputs/<date>/:
    # the suite's folder, not this checkout.
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(suite_root)
        head = start_head(
            num_cpus=min(os.cpu_count() or 8, 32),
            num_gpus=GPUS,
            resources={"worker_node": 4},
            env={
                "PATH": path,
                "PYTHONPATH": pythonpath,
                "HF_HUB_OFFLINE": "1",
                "PYTHONUNBUFFERED": "1",
                "VLLM_NO_USAGE_STATS": "1",
                "DO_NOT_TRACK": "1",
                "RAY_DEDUP_LOGS": "0",  # every worker's lines reach the job's log as they were printed
            },
            timeout_s=180,
        )
    say(f"Ray head up: dashboard {head.dashboard_url}, Serve {head.serve_url}, {GPUS} GPU(s)")
    try:
        yield head
    finally:
        head.stop()
        kept = head.save_logs(artifacts_dir() / "ray-logs")
        say(f"Ray head stopped; its logs are in {kept}")
        shutil.rmtree(head.temp_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def dash(gpu_head: RayHead) -> Dashboard:
    return Dashboard(gpu_head.dashboard_url, token=None)


@pytest.fixture(scope="session")
def state(suite_root: Path, inputs: str, gpu_head: RayHead) -> DesiredState:
    """The suite's config repository as argus's loader reads it (tests/gpu/scenario.py)."""
    repo = scenario.write_repo(suite_root, serve_port=gpu_head.serve_port, gpus=GPUS)
    return scenario.load_state(repo)


@pytest.fixture(scope="session")
def sft_steps_run(dash: Dashboard, state: DesiredState) -> JobRun:
    """Task ``sft-steps`` run once to its end (tests (a) and (d) both read it)."""
    return run_job(dash, state, scenario.body(state, "sft-steps"), timeout_s=SFT_JOB_S)
