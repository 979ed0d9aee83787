"""Every independent problem of every file in one validation run (issue 21 item 3).

A structural (schema) error of one field never hides the other fields' problems: argus's own
rules, the path policy, verl's config and vLLM's engine arguments are all checked in the same run.
Only an error that makes the rest meaningless (YAML that does not parse, a file of the wrong kind)
stops a file, and its message says so.
"""

from __future__ import annotations

import hashlib
import os

import pytest

from reconciler.checks.engine_args import check_engine_kwargs, engine_arg_table
from reconciler.checks.verl_overrides import check_overrides, verl_available
from reconciler.spec.loader import STOPPED, SourceFile, load
from reconciler.spec.types import DesiredState, ObjectKey

TASK = "users/carol/tasks/gsm8k.yaml"
# Six mistakes of six kinds, as the issue's user made them (line numbers are the file's).
TASK_TEXT = """\
kind: Task
workload: grpo
model: /private/users/bob/models/qwen
data:
  train: $HOME/data/train.parquet
epochs: 0
env:
  1BAD: x
overrides:
  - data.train_batch_size 256
  - trainer.total_epochs=3
  - actor_rollout_ref.rollout.nme=vllm
  - data.max_prompt_length=512
"""
TASK_EXPECTED = [
    (3, "model: '/private/users/bob/models/qwen' resolves to"),
    (6, "epochs: 0 is less than the minimum of 1"),
    (8, "env.1BAD: invalid name '1BAD'"),
    (10, "overrides[0]: 'data.train_batch_size 256' is not a hydra override"),
    (11, "overrides[1]: `trainer.total_epochs` is derived by argus; set `epochs` instead"),
    (12, "unknown key `actor_rollout_ref.rollout.nme`"),
]

MODEL = "users/carol/models/qwen.yaml"
MODEL_TEXT = """\
kind: Model
source: /private/users/bob/weights
replicas: many
engine_kwargs:
  tensor_parallel_size: 2
  trust_remote_code: true
  max_num_seq: 8
  max_model_len: 8k
env:
  HF_HOME: /tmp/hf
"""
MODEL_EXPECTED = [
    (2, "source: '/private/users/bob/weights' resolves to"),
    (3, "replicas: expected an integer, got 'many'"),
    (5, "engine_kwargs.tensor_parallel_size: is derived by argus"),
    (6, "engine_kwargs.trust_remote_code: runs code from the model's folder"),
    (7, "engine_kwargs.max_num_seq: unknown engine argument of vLLM"),
    (8, "engine_kwargs.max_model_len: expected an integer"),
    (10, "env.HF_HOME:"),
]


def source_file(path: str, text: str) -> SourceFile:
    data = text.encode()
    return SourceFile(path, data, hashlib.sha1(data).hexdigest())


def issues_of(state: DesiredState, path: str) -> list[tuple[int, str]]:
    return [(i.line, i.message) for i in state.issues if i.path == path]


def assert_exactly(found: list[tuple[int, str]], expected: list[tuple[int, str]]) -> None:
    """``found`` holds one issue per expectation (same line, message containing the text), no more."""
    shown = "\n".join(f"  {line}: {message}" for line, message in found)
    assert len(found) == len(expected), f"expected {len(expected)} issues, got:\n{shown}"
    for line, text in expected:
        assert any(f_line == line and text in message for f_line, message in found), f"no {line}: {text!r} in\n{shown}"


def needs_checks() -> None:
    """verl's config and vLLM's engine-argument table: installed here, or the CI run is broken."""
    if verl_available() and engine_arg_table() is not None:
        return
    if os.environ.get("CI"):
        pytest.fail("verl/hydra or vLLM's engine-argument table missing", pytrace=False)
    pytest.skip("verl/hydra or vLLM's engine-argument table missing")


def test_a_task_with_six_mistakes_reports_all_six_in_one_run() -> None:
    needs_checks()
    state = load([source_file(TASK, TASK_TEXT)], task_check=check_overrides, model_check=check_engine_kwargs)
    assert_exactly(issues_of(state, TASK), TASK_EXPECTED)
    assert ObjectKey("carol", "task", "gsm8k") in state.invalid
    assert not state.tasks


def test_a_model_forbidden_key_hides_neither_policy_nor_vllm_problems() -> None:
    needs_checks()
    state = load([source_file(MODEL, MODEL_TEXT)], model_check=check_engine_kwargs)
    assert_exactly(issues_of(state, MODEL), MODEL_EXPECTED)
    assert not state.models


def test_without_the_optional_checks_argus_own_rules_still_all_report() -> None:
    """The base install: schema, policy and path errors together (verl and vLLM not consulted)."""
    state = load([source_file(TASK, TASK_TEXT), source_file(MODEL, MODEL_TEXT)])
    assert_exactly(issues_of(state, TASK), TASK_EXPECTED[:5])
    assert_exactly(issues_of(state, MODEL), [e for e in MODEL_EXPECTED if "vLLM" not in e[1] and e[0] != 8])


def test_a_malformed_size_does_not_invent_a_parallel_size_error() -> None:
    """`gpus_per_node` is malformed: the parallel size is not judged against a made-up default of 1."""
    text = (
        "kind: Task\nworkload: grpo\nmodel: $HOME/m\ndata:\n  train: $HOME/t.parquet\ngpus_per_node: four\n"
        "overrides:\n  - actor_rollout_ref.rollout.tensor_model_parallel_size=4\n  - trainer.nnodes=2\n"
    )
    state = load([source_file(TASK, text)])
    assert_exactly(
        issues_of(state, TASK),
        [(6, "gpus_per_node: expected an integer, got 'four'"), (9, "`trainer.nnodes` is derived by argus")],
    )


def test_yaml_that_does_not_parse_stops_the_file_and_says_so_with_a_column() -> None:
    path = "users/carol/models/broken.yaml"
    state = load([source_file(path, "kind: Model\nsource: [unclosed\nreplicas: 2\n"), source_file(MODEL, MODEL_TEXT)])
    (issue,) = [i for i in state.issues if i.path == path]
    assert issue.message.endswith(STOPPED)
    assert issue.line > 0 and issue.column > 0
    assert str(issue).startswith(f"{path}:{issue.line}:{issue.column}: invalid YAML")
    assert issue.to_json()["column"] == issue.column
    # The neighbour in the same run still reports all of its own problems.
    assert len(issues_of(state, MODEL)) >= 5


def test_a_file_of_the_wrong_kind_stops_and_says_so() -> None:
    path = "users/carol/models/wrong.yaml"
    state = load([source_file(path, "kind: Task\nworkload: sft\nreplicas: x\nnonsense: 1\n")])
    assert issues_of(state, path) == [(1, f"kind: must be 'Model' for a file in models/, got 'Task'{STOPPED}")]


def test_every_error_is_reported_once_and_by_line() -> None:
    state = load([source_file(TASK, TASK_TEXT)])
    lines = [line for line, _ in issues_of(state, TASK)]
    assert lines == sorted(lines) and len(set(issues_of(state, TASK))) == len(lines)
