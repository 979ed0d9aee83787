"""A new user's first mistakes get ``path:line`` and a plain message with what to do (issue #32).

YAML syntax (tabs, indentation, a missing ``:``, an unclosed quote, duplicate keys), values YAML
reads as something else than the string the field needs (``2026-01-02``, ``yes``, ``1.10``), quota
and file-name errors, and verl overrides whose value has the wrong type. Every message is checked
for its exact line and for what a user must never see: a Python repr or a parser's internals.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from reconciler.spec import yamldoc
from reconciler.spec.loader import STOPPED, SourceFile, load
from reconciler.spec.types import DesiredState

TASK = "users/alice/tasks/x.yaml"
MODEL = "users/alice/models/x.yaml"
HEAD = "kind: Task\nworkload: command\ncommand: python train.py\n"
# What a user must never read: Python's repr of a value or type, a traceback, the parser's state.
NEVER = ("datetime.", "<class", "Traceback", "b'", "while scanning", "while parsing", "could not find expected")


@pytest.fixture(autouse=True, params=["libyaml", "pure-python"])
def yaml_parser(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every case runs with libyaml's C parser and with the pure-Python one: same messages, same lines."""
    if request.param == "libyaml" and not yamldoc.HAS_LIBYAML:
        if os.environ.get("CI"):
            pytest.fail("PyYAML was built without libyaml", pytrace=False)
        pytest.skip("PyYAML was built without libyaml")
    monkeypatch.setattr(yamldoc, "USE_LIBYAML", request.param == "libyaml")
    return str(request.param)


def source_file(path: str, text: str) -> SourceFile:
    data = text.encode()
    return SourceFile(path, data, hashlib.sha1(data).hexdigest())


def shown(state: DesiredState, path: str) -> list[str]:
    """``path``'s issues as ``argus validate`` prints them, each checked for what must never show."""
    out = [str(i) for i in state.issues if i.path == path]
    for text in out:
        assert not any(bad in text for bad in NEVER), text
    return out


def only(path: str, text: str) -> str:
    """The one issue of ``path`` holding ``text``, as printed."""
    (issue,) = shown(load([source_file(path, text)]), path)
    return issue


# (name, file text, the printed issue: path:line[:column]: message)
SYNTAX = [
    (
        "tab-indents-a-key",
        "kind: Task\nworkload: command\nenv:\n\tA: b\ncommand: x\n",
        f"{TASK}:4:1: invalid YAML: a tab indents this line; YAML indents with spaces only: replace the tab with "
        f"spaces{STOPPED}",
    ),
    (
        "tab-after-a-value",
        "kind: Task\nworkload: command\ncommand: a\tb\n",
        f"{TASK}:3:11: invalid YAML: a tab here is not allowed outside quotes; use spaces, or quote the value{STOPPED}",
    ),
    (
        "key-indented-too-far",
        "kind: Task\nworkload: command\nenv:\n  A: b\n    B: c\ncommand: x\n",
        f"{TASK}:5:6: invalid YAML: this key is indented more than the keys above it: indent it like the keys it "
        f"belongs with (or, if it belongs under the key above, that key must have no value on its own line){STOPPED}",
    ),
    (
        "key-indented-to-no-level",
        "kind: Task\nworkload: command\nenv:\n  A: b\n B: c\ncommand: x\n",
        f"{TASK}:5:2: invalid YAML: bad indentation: this line is indented to a level no line above it uses; indent "
        f"it like the keys (or list items) it belongs with{STOPPED}",
    ),
    (
        "list-item-where-a-key-goes",
        "kind: Task\nworkload: command\ncommand: x\n- nodes: 1\n",
        f"{TASK}:4:1: invalid YAML: a list item (`- `) where a key was expected: indent the items under their "
        f"key{STOPPED}",
    ),
    (
        # PyYAML notices on the next line; the mistake is on line 2.
        "missing-colon",
        "kind: Task\nworkload command\ncommand: x\n",
        f"{TASK}:2:1: invalid YAML: this line is not `key: value`: a `:` is missing (write `key: value`, a space "
        f"after the colon){STOPPED}",
    ),
    (
        "colon-without-a-space",
        "kind: Task\nworkload: command\nnodes:1\ncommand: x\n",
        f"{TASK}:3:1: invalid YAML: a `:` must be followed by a space (`key: value`){STOPPED}",
    ),
    (
        "colon-and-space-in-an-unquoted-value",
        "kind: Task\nworkload: command\ncommand: python x.py --note: hi\n",
        f"{TASK}:3:28: invalid YAML: a value holds `: ` (a colon and a space); quote the value{STOPPED}",
    ),
    (
        # Reported where the quote opens, not at the end of the file where PyYAML gives up.
        "unclosed-double-quote",
        'kind: Task\nworkload: command\ncommand: "python x.py\nnodes: 1\ngpus_per_node: 1\n',
        f'{TASK}:3:10: invalid YAML: the " quote opened here is never closed; add the closing " at the end of the '
        f"value{STOPPED}",
    ),
    (
        "unclosed-single-quote",
        "kind: Task\nworkload: command\ncommand: 'python x.py\nnodes: 1\n",
        f"{TASK}:3:10: invalid YAML: the ' quote opened here is never closed; add the closing ' at the end of the "
        f"value{STOPPED}",
    ),
    (
        "text-after-a-closing-quote",
        'kind: Task\nworkload: command\ncommand: "python" x.py\n',
        f"{TASK}:3:19: invalid YAML: text follows a quoted value; quote the whole value, or remove the quotes{STOPPED}",
    ),
    (
        "unclosed-list",
        "kind: Task\nworkload: command\ncommand: x\noverrides: [a=1, b=2\nnodes: 1\n",
        f"{TASK}:4:12: invalid YAML: the [ opened here is not closed with ] (or its items are not separated by `,`); "
        f"if the value is not a YAML list or mapping, quote it{STOPPED}",
    ),
    (
        "a-value-starting-with-a-reserved-character",
        "kind: Task\nworkload: command\ncommand: @echo hi\n",
        f"{TASK}:3:10: invalid YAML: a value cannot start with @ unless it is quoted; quote the value "
        f'("@..."){STOPPED}',
    ),
    (
        "a-windows-path-in-double-quotes",
        'kind: Task\nworkload: command\ncommand: "C:\\data\\x"\n',
        f"{TASK}:3:14: invalid YAML: 'd' after a backslash is not an escape in a \"double-quoted\" value; write the "
        f"value in 'single quotes' (or write \\\\ for a backslash){STOPPED}",
    ),
    (
        "template-braces",
        "kind: Task\nworkload: command\ncommand: {{ run }}\n",
        f"{TASK}:3: a key must be a plain name, not a mapping or list (a value that starts with `{{` or `[` must be "
        f"quoted){STOPPED}",
    ),
    (
        # An error at the second key's line, never last-one-wins.
        "duplicate-key",
        "kind: Task\nworkload: command\ncommand: x\nnodes: 1\ngpus_per_node: 2\nnodes: 2\n",
        f"{TASK}:6:1: duplicate key 'nodes' (first defined on line 4); YAML would silently keep only the last one: "
        f"delete one of them{STOPPED}",
    ),
    (
        "duplicate-nested-key",
        "kind: Task\nworkload: command\ncommand: x\nenv:\n  A: '1'\n  B: '2'\n  A: '3'\n",
        f"{TASK}:7:3: duplicate key 'A' (first defined on line 5); YAML would silently keep only the last one: "
        f"delete one of them{STOPPED}",
    ),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in SYNTAX], ids=[c[0] for c in SYNTAX])
def test_a_yaml_syntax_error_is_said_plainly_at_the_line_that_holds_it(text: str, expected: str) -> None:
    assert only(TASK, text) == expected


# (name, file, file text, the printed issue)
NOT_A_STRING = [
    (
        "an-unquoted-date",
        TASK,
        HEAD + "env:\n  START: 2026-01-02\n",
        f'{TASK}:5: env.START: expected a string, got 2026-01-02, which YAML reads as a date; quote it: "2026-01-02"',
    ),
    (
        "an-unquoted-date-and-time",
        TASK,
        HEAD + "env:\n  START: 2026-01-02 10:00:00\n",
        f"{TASK}:5: env.START: expected a string, got 2026-01-02 10:00:00, which YAML reads as a date and time; "
        'quote it: "2026-01-02 10:00:00"',
    ),
    (
        # YAML 1.1 reads 12:30:00 as a base-60 number: the message shows what was written.
        "an-unquoted-time",
        TASK,
        HEAD + "env:\n  AT: 12:30:00\n",
        f"{TASK}:5: env.AT: expected a string, got 12:30:00, which YAML reads as the number 45000; "
        'quote it: "12:30:00"',
    ),
    (
        "yes-is-a-boolean",
        MODEL,
        "kind: Model\nsource: org/name\nserved_name: yes\n",
        f'{MODEL}:3: served_name: expected a string, got yes, which YAML reads as the boolean true; quote it: "yes"',
    ),
    (
        "a-version-is-a-number",
        TASK,
        HEAD + "env:\n  VERSION: 1.10\n",
        f'{TASK}:5: env.VERSION: expected a string, got 1.10, which YAML reads as the number 1.1; quote it: "1.10"',
    ),
    (
        "a-number-where-a-command-goes",
        TASK,
        "kind: Task\nworkload: command\ncommand: 42\n",
        f'{TASK}:3: command: expected a string, got 42, which YAML reads as the number 42; quote it: "42"',
    ),
    (
        "a-date-as-an-override",
        TASK,
        "kind: Task\nworkload: grpo\nmodel: org/m\ndata:\n  train: $HOME/t.parquet\noverrides:\n  - 2026-01-02\n",
        f"{TASK}:7: overrides[0]: expected a string, got 2026-01-02, which YAML reads as a date; "
        'quote it: "2026-01-02"',
    ),
    (
        "an-empty-value",
        TASK,
        HEAD + "env:\n  HF_TOKEN:\n",
        f"{TASK}:5: env.HF_TOKEN: expected a string, got an empty value; write one (a string), or remove the key",
    ),
    (
        "a-date-where-an-integer-goes",
        TASK,
        HEAD + "nodes: 2026-01-02\n",
        f"{TASK}:4: nodes: expected an integer, got 2026-01-02 (a date)",
    ),
]


@pytest.mark.parametrize(("path", "text", "expected"), [c[1:] for c in NOT_A_STRING], ids=[c[0] for c in NOT_A_STRING])
def test_a_value_yaml_reads_as_no_string_says_what_was_written_and_to_quote_it(
    path: str, text: str, expected: str
) -> None:
    assert only(path, text) == expected


def test_yes_where_a_workload_goes_is_shown_as_written_everywhere() -> None:
    state = load([source_file(TASK, "kind: Task\nworkload: yes\ncommand: x\n")])
    issues = shown(state, TASK)
    assert f"{TASK}:2: workload: yes (read as true) is not one of: ppo, grpo, sft, command" in issues
    assert f"{TASK}:3: command: not allowed with workload: yes (read as true)" in issues


def test_a_quoted_value_is_a_string_and_loads() -> None:
    text = HEAD + "env:\n  START: '2026-01-02'\n  AT: \"12:30:00\"\n  VERSION: '1.10'\n  FLAG: 'yes'\n"
    state = load([source_file(TASK, text)])
    assert state.issues == []
    env = next(iter(state.tasks.values())).env
    assert env == {"START": "2026-01-02", "AT": "12:30:00", "VERSION": "1.10", "FLAG": "yes"}


def test_the_written_text_is_recorded_only_where_yaml_read_something_else() -> None:
    doc = yamldoc.parse("f.yaml", b"a: yes\nb: true\nc: 1.10\nd: 1.5\ne: 12:30\nf: 3\ng: 0x10\nh: ~\ni:\nj: 'x'\n")
    assert doc.written == {("a",): "yes", ("c",): "1.10", ("e",): "12:30", ("g",): "0x10", ("h",): "~", ("i",): ""}


CLUSTER = "users:\n  alice:\n    gpus: 2\n"
GRPO = "kind: Task\nworkload: grpo\nmodel: org/m\ndata:\n  train: $HOME/t.parquet\n"


def never_runs_as_printed(files: dict[str, str]) -> list[str]:
    """What ``argus validate`` prints for objects above their user's quota (errors, then warnings)."""
    from reconciler.cli import never_runs

    state = load([source_file(p, t) for p, t in files.items()])
    assert state.issues == []
    errors, warnings = never_runs(state)
    for text in [*map(str, errors), *warnings]:
        assert not any(bad in text for bad in NEVER), text
    return [str(e) for e in errors] + [f"warning: {w}" for w in warnings]


@pytest.mark.parametrize(
    ("path", "text", "line"),
    [
        (TASK, GRPO + "nodes: 2\ngpus_per_node: 2\n", 6),  # the first size key written
        (TASK, HEAD + "gpus_per_node: 4\nenv: {}\n", 4),
        (TASK, "kind: Task\nworkload: command\ngpus_per_node: 3\ncommand: x\n", 3),
        (MODEL, "kind: Model\nsource: org/name\ngpus_per_replica: 1\nreplicas: 3\n", 3),
        (MODEL, "kind: Model\nsource: org/name\nengine_kwargs: {}\nreplicas: 3\n", 4),
    ],
    ids=["task-nodes", "task-gpus-per-node", "task-size-before-command", "model-gpus-per-replica", "model-replicas"],
)
def test_a_request_above_the_quota_is_reported_at_the_line_of_its_size(path: str, text: str, line: int) -> None:
    (printed,) = never_runs_as_printed({"cluster.yaml": CLUSTER, path: text})
    assert printed.startswith(f"{path}:{line}: needs "), printed
    assert "but alice's quota is 2 GPUs: it can never run as written (UNSCHEDULABLE)" in printed


def test_a_request_of_the_default_size_above_a_zero_quota_points_at_kind_or_source() -> None:
    cluster = "users:\n  alice:\n    gpus: 0\n"
    printed = never_runs_as_printed(
        {"cluster.yaml": cluster, TASK: HEAD, MODEL: "kind: Model\nengine_kwargs: {}\nsource: org/name\n"}
    )
    assert [p.split(" needs ")[0] for p in printed] == [f"{MODEL}:3:", f"{TASK}:1:"]


def test_a_request_that_may_wait_is_a_warning_at_the_same_line() -> None:
    (printed,) = never_runs_as_printed({"cluster.yaml": CLUSTER, TASK: GRPO + "may_wait: true\nnodes: 3\n"})
    assert printed.startswith(f"warning: {TASK}:7: needs 3 GPU but alice's quota is 2 GPUs: it will be UNSCHEDULABLE")


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (
            "users/alice/tasks/" + "a" * 70 + ".yaml",
            "must match lowercase letters and digits, parts joined by single '-', <= 63: it is 70 characters",
        ),
        ("users/alice/tasks/Train.yaml", "file name 'Train'.yaml must match {rule}: it has capital letters"),
        ("users/alice/tasks/my_task.yaml", "file name 'my_task'.yaml must match {rule}: use '-' instead of '_'"),
        ("users/alice/tasks/my task.yaml", "file name 'my task'.yaml must match {rule}: it has a space"),
        (
            "users/alice/tasks/v1.2.yaml",
            "file name 'v1.2'.yaml must match {rule}: it has a '.' (only the final .yaml may)",
        ),
        ("users/Alice/tasks/x.yaml", "user folder 'Alice' must match {user_rule}: it has capital letters"),
        ("users/alice/tasks/x.yml", "use the .yaml extension (.yml files are not loaded)"),
        ("users/alice/tasks/x.json", "only <name>.yaml files are allowed in tasks/"),
        ("users/alice/task/x.yaml", "unknown folder 'task' under users/alice/; only models/ and tasks/ are allowed"),
        (
            "users/alice/x.yaml",
            "files directly under users/alice/ are not allowed; put models in models/ and tasks in tasks/",
        ),
    ],
    ids=["too-long", "capitals", "underscore", "space", "dot", "user-capitals", "yml", "json", "folder", "no-folder"],
)
def test_a_bad_file_name_is_reported_with_its_path_and_why(path: str, expected: str) -> None:
    from reconciler.spec.loader import NAME_RULE, USER_RULE

    (printed,) = shown(load([source_file(path, HEAD)]), path)
    assert printed.startswith(f"{path}: ")  # a path, no line: the name is the problem, not a line of it
    assert expected.format(rule=NAME_RULE, user_rule=USER_RULE) in printed


def needs_verl() -> None:
    """hydra and verl's config tree (installed, or the copy argus ships): here, or the CI run is broken."""
    from reconciler.checks.verl_overrides import verl_available

    if verl_available():
        return
    if os.environ.get("CI"):
        pytest.fail("hydra or verl's config tree missing", pytrace=False)
    pytest.skip("hydra or verl's config tree missing")


def with_overrides(*overrides: str) -> str:
    return GRPO + "overrides:\n" + "".join(f"  - {o!r}\n" if "'" not in o else f'  - "{o}"\n' for o in overrides)


def verl_issues(*overrides: str) -> list[str]:
    """The printed issues of a GRPO task with ``overrides`` (lines 7 on), checked against verl's config."""
    from reconciler.checks.verl_overrides import check_overrides

    needs_verl()
    return shown(load([source_file(TASK, with_overrides(*overrides))], task_check=check_overrides), TASK)


def test_an_override_value_of_the_wrong_type_is_reported_at_its_line_with_verl_s_default() -> None:
    assert verl_issues(
        "trainer.val_before_train=false",
        "data.train_batch_size=two-hundred",
        "actor_rollout_ref.actor.optim.lr=fast",
        "trainer.val_before_train=maybe",
        "data.max_prompt_length=",
        "++data.max_response_length=true",
    ) == [
        f"{TASK}:8: data.train_batch_size expects an integer (verl default 1024), got 'two-hundred'; "
        "write e.g. `data.train_batch_size=1024`",
        f"{TASK}:9: actor_rollout_ref.actor.optim.lr expects a number (verl default 1e-06), got 'fast'; "
        "write e.g. `actor_rollout_ref.actor.optim.lr=1e-06`",
        f"{TASK}:10: trainer.val_before_train expects true or false (verl default true), got 'maybe'; "
        "write e.g. `trainer.val_before_train=true`",
        f"{TASK}:11: data.max_prompt_length expects an integer (verl default 512), got an empty value; "
        "write e.g. `data.max_prompt_length=512`",
        f"{TASK}:12: data.max_response_length expects an integer (verl default 512), got true; "
        "write e.g. `data.max_response_length=512`",
    ]


def test_override_values_hydra_and_verl_accept_are_never_flagged() -> None:
    assert (
        verl_issues(
            "data.train_batch_size=256",
            "data.max_prompt_length=null",  # null: verl decides
            "data.max_response_length=${data.max_prompt_length}",  # an interpolation, resolved at run time
            "data.val_batch_size='64'",  # quoted, but reads as the type
            "actor_rollout_ref.actor.optim.lr=1e-6",
            "actor_rollout_ref.actor.optim.weight_decay=0",  # an int where the default is a float
            "actor_rollout_ref.rollout.top_p=0.9",  # a float where verl's default is the int 1
            "actor_rollout_ref.rollout.temperature=0.7",
            "trainer.val_before_train=False",
            "trainer.log_val_generations=0",
            "trainer.logger=[console,wandb]",  # a list, where lists belong
            "actor_rollout_ref.rollout.name=sglang",  # a string default: any text
            "+trainer.my_new_key=anything",  # a new key has no default to judge by
        )
        == []
    )


def test_an_unknown_key_is_reported_once_not_also_as_a_wrong_type() -> None:
    (issue,) = verl_issues("data.train_batch_sise=two-hundred")
    assert issue.startswith(f"{TASK}:7: unknown key `data.train_batch_sise`")


def test_argus_validate_exits_non_zero_and_prints_each_first_mistake_at_its_line(tmp_path: Path) -> None:
    from tests.unit.test_cli import argus

    needs_verl()
    root = tmp_path / "config"
    (root / "users/alice/tasks").mkdir(parents=True)
    (root / "cluster.yaml").write_text("users:\n  alice:\n    gpus: 2\n")
    files = {
        "users/alice/tasks/tabs.yaml": "kind: Task\nworkload: command\nenv:\n\tA: b\ncommand: x\n",
        "users/alice/tasks/quote.yaml": 'kind: Task\nworkload: command\ncommand: "python x.py\nnodes: 1\n',
        "users/alice/tasks/dup.yaml": HEAD + "run: 1\nrun: 2\n",
        "users/alice/tasks/date.yaml": HEAD + "env:\n  START: 2026-01-02\n",
        "users/alice/tasks/big.yaml": GRPO + "nodes: 3\n",
        "users/alice/tasks/batch.yaml": with_overrides("data.train_batch_size=two-hundred"),
        "users/alice/tasks/My_Task.yaml": HEAD,
    }
    for path, text in files.items():
        (root / path).write_text(text)
    proc = argus("validate", root, "--offline")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout == ""
    errors = [line for line in proc.stderr.splitlines() if not line.startswith("note: ")]
    assert not any(bad in proc.stderr for bad in NEVER), proc.stderr
    expected = [
        "users/alice/tasks/My_Task.yaml: file name 'My_Task'.yaml must match",
        "users/alice/tasks/batch.yaml:7: data.train_batch_size expects an integer (verl default 1024), got "
        "'two-hundred'",
        "users/alice/tasks/big.yaml:6: needs 3 GPU but alice's quota is 2 GPUs: it can never run as written",
        "users/alice/tasks/date.yaml:5: env.START: expected a string, got 2026-01-02, which YAML reads as a date; "
        'quote it: "2026-01-02"',
        "users/alice/tasks/dup.yaml:5:1: duplicate key 'run' (first defined on line 4)",
        'users/alice/tasks/quote.yaml:3:10: invalid YAML: the " quote opened here is never closed',
        "users/alice/tasks/tabs.yaml:4:1: invalid YAML: a tab indents this line; YAML indents with spaces only",
    ]
    assert len(errors) == len(expected) + 1, proc.stderr
    for line, start in zip(errors, expected, strict=False):
        assert line.startswith(start), f"{line!r} does not start with {start!r}"
    assert errors[-1] == f"{len(expected)} error(s); 0 valid object(s)"


def test_a_kind_yaml_reads_as_no_string_is_shown_as_written() -> None:
    assert only(TASK, "kind: 2026-01-02\n") == (
        f"{TASK}:1: kind: must be 'Task' for a file in tasks/, got 2026-01-02 (a date){STOPPED}"
    )


ODD_VALUES = ("2026-01-02", "2026-01-02 10:00:00", "yes", "1.10", "12:30", "~", "", "!!binary aGk=", ".nan", "0x1F")


@pytest.mark.parametrize("value", ODD_VALUES)
def test_no_field_shows_a_value_as_python_writes_it(value: str) -> None:
    """Every field of every kind of file, set to a value YAML reads as no string: no message shows
    ``datetime.date(...)``, ``True``, ``None`` or ``b'...'``."""
    files = [source_file("cluster.yaml", f"users:\n  alice:\n    gpus: {value}\npriority_classes:\n  high: {value}\n")]
    for i, name in enumerate(("kind", "workload", "command", "model", "priority", "nodes", "run", "suspend", "steps")):
        fields = {"kind": "Task", "workload": "grpo", "model": "org/m", name: value}
        text = "".join(f"{k}: {v}\n" for k, v in fields.items()) + f"data:\n  train: {value}\noverrides:\n  - {value}\n"
        files.append(source_file(f"users/alice/tasks/t{i}.yaml", text))
    for i, name in enumerate(("kind", "source", "served_name", "replicas", "priority", "min_replicas")):
        fields = {"kind": "Model", "source": "org/m", name: value}
        extra = f"engine_kwargs:\n  max_model_len: {value}\nenv:\n  A: {value}\n"
        files.append(
            source_file(f"users/alice/models/m{i}.yaml", "".join(f"{k}: {v}\n" for k, v in fields.items()) + extra)
        )
    state = load(files)
    assert state.issues
    for issue in state.issues:
        text = str(issue)
        assert not any(bad in text for bad in (*NEVER, "True", "False", "None", "internal error")), text
