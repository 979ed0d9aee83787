"""The PR check checks what the cluster checks (issue 21 item 4).

``argus-reconciler[check]`` is the base package plus hydra: verl's config tree and vLLM's
engine-argument table ship inside argus. Here verl and vLLM are hidden from the interpreter (an
import hook), so every check below runs as it does on a CI runner that installed only the extra.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from reconciler.checks import engine_args, snapshots, verl_overrides
from reconciler.scaffold import init_repo, parse_source

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

HIDE = """\
import importlib.abc, sys
class _Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("verl", "vllm"):
            raise ModuleNotFoundError(f"No module named {name!r} (hidden by the test)", name=name)
        return None
sys.meta_path.insert(0, _Hide())
"""

# The mistakes of issue 21, in one repository of the scaffold's cluster (alice's quota: 4 GPUs).
MISTAKES = {
    "users/alice/tasks/gsm8k.yaml": """\
kind: Task
workload: grpo
model: $HOME/models/qwen
data:
  train: $HOME/data/train.parquet
overrides:
  - data.train_batch_size 256
  - trainer.total_epochs=3
  - actor_rollout_ref.rollout.nme=vllm
""",
    "users/alice/models/big.yaml": """\
kind: Model
source: $HOME/models/qwen
engine_kwargs:
  tensor_parallel_size: 2
  trust_remote_code: true
  max_num_seq: 8
  max_model_len: 8k
env:
  HF_HOME: /tmp/hf
""",
    "users/alice/tasks/huge.yaml": """\
kind: Task
workload: sft
model: $HOME/models/qwen
data:
  train: $HOME/data/train.parquet
gpus_per_node: 8
""",
    "users/alice/models/later.yaml": "kind: Model\nsource: $HOME/models/qwen\nreplicas: 8\nmay_wait: true\n",
}
EXPECTED = [
    "users/alice/tasks/gsm8k.yaml:7` overrides[0]: 'data.train_batch_size 256' is not a hydra override",
    "users/alice/tasks/gsm8k.yaml:8` overrides[1]: `trainer.total_epochs` is derived by argus",
    "users/alice/tasks/gsm8k.yaml:9` unknown key `actor_rollout_ref.rollout.nme`",
    "did you mean `actor_rollout_ref.rollout.name`?",
    "users/alice/models/big.yaml:4` engine_kwargs.tensor_parallel_size: is derived by argus",
    "users/alice/models/big.yaml:5` engine_kwargs.trust_remote_code: runs code",
    "users/alice/models/big.yaml:6` engine_kwargs.max_num_seq: unknown engine argument of vLLM 0.29.0; did you mean",
    "users/alice/models/big.yaml:7` engine_kwargs.max_model_len: expected an integer",
    "users/alice/models/big.yaml:9` env.HF_HOME:",
    "users/alice/tasks/huge.yaml:6` needs 8 GPU but alice's quota is 4 GPUs: it can never run as written",
]


def hidden_env(tmp_path: Path) -> dict[str, str]:
    """An environment whose Python cannot import verl or vLLM, with this checkout's argus first."""
    hide = tmp_path / "hide"
    hide.mkdir(exist_ok=True)
    (hide / "sitecustomize.py").write_text(HIDE)
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(hide)]),
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "ARGUS_CACHE_DIR": str(tmp_path / "cache"),  # no engine-argument table cached from an installed vLLM
        "GIT_AUTHOR_NAME": "alice",
        "GIT_AUTHOR_EMAIL": "alice@example.com",
        "GIT_COMMITTER_NAME": "alice",
        "GIT_COMMITTER_EMAIL": "alice@example.com",
        "GIT_CONFIG_GLOBAL": os.devnull,
    }


def test_the_check_extra_is_hydra_only_and_the_hook_installs_the_same() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = sorted(re.split(r"[<>=\[]", d)[0] for d in extras["check"])
    assert names == ["hydra-core", "omegaconf"], "verl and vLLM must not be needed: their tables ship in argus"
    (hook,) = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    assert sorted(hook["additional_dependencies"]) == sorted(extras["check"])


def test_the_snapshots_match_the_pinned_verl_and_vllm() -> None:
    """`python -m reconciler.checks.snapshots --check`: the shipped copies are the installed pins'."""
    if snapshots.installed_verl() is None or not engine_args.vllm_available():
        if os.environ.get("CI"):
            pytest.fail("verl and vLLM must be installed in CI to compare the snapshots", pytrace=False)
        pytest.skip("verl or vLLM not installed")
    assert snapshots.differences() == []


def test_without_verl_the_shipped_config_still_catches_a_misspelt_key(monkeypatch: pytest.MonkeyPatch) -> None:
    from reconciler.spec.loader import SourceFile, load

    monkeypatch.setattr(verl_overrides, "installed_verl_config_dir", lambda: None)
    verl_overrides._check.cache_clear()
    verl_overrides._base_config.cache_clear()
    try:
        text = MISTAKES["users/alice/tasks/gsm8k.yaml"].encode()
        state = load([SourceFile("users/alice/tasks/gsm8k.yaml", text, "x")], task_check=verl_overrides.check_overrides)
    finally:
        verl_overrides._check.cache_clear()
        verl_overrides._base_config.cache_clear()
    assert "shipped" in verl_overrides.verl_source()
    found = [i for i in state.issues if "nme" in i.message]
    assert (
        len(found) == 1 and found[0].line == 9 and "did you mean `actor_rollout_ref.rollout.name`" in found[0].message
    )


def test_the_scaffolded_workflow_run_by_hand_fails_with_every_mistake_in_one_comment(tmp_path: Path) -> None:
    """The workflow's own steps (actual state, plan, comment, validate) run with bash as the runner
    would, argus installed with the check extra only (verl and vLLM hidden), `gh` recording the comment."""
    repo = tmp_path / "config"
    init_repo(str(repo), source=parse_source("git+https://git.example/argus.git@v0.1.0"))
    workflow = yaml.safe_load((repo / ".github/workflows/argus.yaml").read_text())
    assert workflow["env"]["ARGUS_PACKAGE"].startswith("argus-reconciler[check] @ git+")
    for rel, text in MISTAKES.items():
        (repo / rel).write_text(text)
    base = hidden_env(tmp_path)
    for cmd in (["git", "init", "-q", "-b", "main"], ["git", "add", "-A"], ["git", "commit", "-q", "-m", "x"]):
        subprocess.run(cmd, cwd=repo, env=base, check=True, capture_output=True)
    fake = tmp_path / "fake-bin"
    fake.mkdir()
    comment = tmp_path / "comment.md"
    # `gh pr comment ... --body-file F`: --edit-last fails (no earlier comment), the fallback posts.
    (fake / "gh").write_text(
        '#!/bin/sh\ncase "$*" in *--edit-last*) exit 1;; esac\n'
        f'while [ "$1" != --body-file ]; do shift; done; cp "$2" {comment}\n'
    )
    (fake / "gh").chmod(0o755)
    temp, output, summary = tmp_path / "runner", tmp_path / "output", tmp_path / "summary"
    temp.mkdir()
    runner = {
        **base,
        **{k: str(v) for k, v in workflow["env"].items()},
        "PATH": f"{fake}{os.pathsep}{base['PATH']}",
        "RUNNER_TEMP": str(temp),
        "GITHUB_OUTPUT": str(output),
        "GITHUB_STEP_SUMMARY": str(summary),
        "GH_TOKEN": "x",
        "PR": "7",
    }
    steps = {s.get("name"): s for s in workflow["jobs"]["plan"]["steps"]}
    codes = {}
    for name in ("Actual state", "Plan", "Comment the plan on the pull request", "Validate"):
        script = steps[name]["run"]
        code = dict(line.split("=", 1) for line in output.read_text().split()) if output.exists() else {}
        script = script.replace("${{ steps.plan.outputs.exit_code }}", code.get("exit_code", ""))
        assert "${{" not in script, script
        proc = subprocess.run(["bash", "-e", "-c", script], cwd=repo, env=runner, capture_output=True, text=True)
        codes[name] = proc.returncode
        if name == "Validate":
            validate_out = proc.stdout + proc.stderr
    assert output.read_text().strip() == "exit_code=1"
    assert codes["Comment the plan on the pull request"] == 0
    assert codes["Validate"] != 0, "the check must fail"
    posted = comment.read_text()
    for text in EXPECTED:
        assert text in posted, f"{text!r} not in the comment:\n{posted}"
    assert f"**{len(EXPECTED) - 1} validation errors**" in posted, posted
    assert "later.yaml:3: needs 8 GPU" in posted and "may_wait: true" in posted  # a warning, not an error
    assert "**Not checked by this run:**" in posted and "the cluster's verl may differ" in posted
    assert "(the table shipped with argus for serving.accelerator: gpu)" in posted  # the scaffold's: vLLM 0.29.0
    assert "users/alice/tasks/huge.yaml" in validate_out and "gsm8k.yaml:9: unknown key" in validate_out
