"""The real console entry (``python -m reconciler.cli``) in a subprocess: exit codes, streams, formats."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reconciler.plan.actual import ActualModel, ActualState, Capacity
from reconciler.source.directory import created_times, read_directory
from reconciler.spec.hashing import model_spec_hash
from reconciler.spec.loader import load
from tests.unit.gitrepo import WorkRepo

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "desired-state"
COMMIT_TIME = 1767225600  # 2026-01-01 00:00 UTC


def argus(*args: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """Run ``python -m reconciler.cli ARGS`` as a user would (its own process, no TTY)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    return subprocess.run(
        [sys.executable, "-m", "reconciler.cli", *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def example_objects(root: Path = EXAMPLE) -> int:
    return load(read_directory(str(root))).object_count


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """The first push of ``make demo`` (desired-state/ without the fine-tune task and its model)
    committed in its own git repository (fixed commit time, so fixed served names)."""
    root = tmp_path / "config"
    shutil.copytree(EXAMPLE, root, ignore=shutil.ignore_patterns("tune.yaml", "tuned.yaml"))
    WorkRepo(root).commit("example", COMMIT_TIME)
    return root


def break_copy(root: Path) -> None:
    """Add a broken file for alice, one for an undeclared user, and a .yml file."""
    (root / "users/alice/models/broken.yaml").write_text("kind: Model\nsource: argus-test/tiny-llama\nreplica: 2\n")
    (root / "users/alice/models/escape.yaml").write_text("kind: Model\nsource: /etc/passwd\n")
    (root / "users/alice/models/typo.yml").write_text("kind: Model\n")


BROKEN = [
    ("users/alice/models/broken.yaml", 3, "replica: unknown key (did you mean 'replicas'?)"),
    ("users/alice/models/escape.yaml", 2, "source: '/etc/passwd' resolves to /etc/passwd, outside the allowed roots"),
    ("users/alice/models/typo.yml", 0, "use the .yaml extension (.yml files are not loaded)"),
]


def test_validate_the_example_passes() -> None:
    proc = argus("validate", EXAMPLE, "--offline")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"ok: {example_objects()} object(s) valid\n"
    # Issue 12: a check that did not run is named, never silent.
    assert proc.stderr == (
        "note: --offline: checks that need the cluster's file system (path existence, symlinks, Hugging Face cache) "
        "were skipped\n"
    )


def test_validate_the_example_json() -> None:
    proc = argus("validate", EXAMPLE, "--offline", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out.pop("not_checked")[0].startswith("--offline: ")
    assert out == {"errors": [], "objects": example_objects(), "warnings": []}


def test_validate_without_offline_falls_back_when_the_roots_are_absent(tmp_path: Path) -> None:
    root = tmp_path / "config"
    shutil.copytree(EXAMPLE, root)
    missing = tmp_path / "nowhere"
    cluster = root / "cluster.yaml"
    text = (
        cluster.read_text()
        .replace("/tmp/argus-demo/hf", f"{missing}/hf")
        .replace("/tmp/argus-demo/users", f"{missing}/users")
    )
    cluster.write_text(text)
    proc = argus("validate", root)
    assert proc.returncode == 0, proc.stderr
    assert "not found on this machine" in proc.stderr


def test_validate_a_broken_copy_fails_with_path_and_line(config: Path) -> None:
    break_copy(config)
    proc = argus("validate", config, "--offline")
    assert proc.returncode == 1
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    for path, line, message in BROKEN:
        where = f"{path}:{line}: " if line else f"{path}: "
        assert any(line.startswith(f"{where}{message}") for line in lines), proc.stderr
    assert lines[-1] == f"{len(BROKEN)} error(s); {example_objects(config)} valid object(s)"


def test_validate_json_shape(config: Path) -> None:
    break_copy(config)
    proc = argus("validate", config, "--offline", "--format", "json")
    assert proc.returncode == 1
    assert proc.stderr == ""
    out = json.loads(proc.stdout)
    assert set(out) == {"errors", "objects", "warnings", "not_checked"}
    assert out["objects"] == example_objects(config)
    assert all(set(e) == {"path", "line", "message"} for e in out["errors"])
    assert all(isinstance(e["line"], int) for e in out["errors"])
    got = [(e["path"], e["line"]) for e in out["errors"]]
    assert got == [(p, line) for p, line, _ in BROKEN]
    for error, (_p, _l, message) in zip(out["errors"], BROKEN, strict=True):
        assert message in error["message"]


def test_validate_missing_directory() -> None:
    proc = argus("validate", "/nonexistent/argus-config")
    assert proc.returncode == 1
    assert proc.stderr.startswith("argus: error: /nonexistent/argus-config: not a directory")


def matching_actual(root: Path, path: Path, capacity: Capacity | None = None) -> None:
    """Write an actual state in which every model of ``root`` runs exactly as declared."""
    created, now = created_times(str(root))
    desired = load(read_directory(str(root)), created=created, default_time=now)
    actual = ActualState(capacity=capacity or Capacity({"CPU": 8.0}, {"CPU": 4.0}))
    for key, model in desired.models.items():
        digest = model_spec_hash(model, desired.cluster)
        actual.models[key] = ActualModel(key, model.served_name, digest, model.replicas, model.replicas, "RUNNING")
    path.write_text(json.dumps(actual.to_json()))


def test_plan_exit_0_when_in_sync(config: Path, tmp_path: Path) -> None:
    actual = tmp_path / "actual.json"
    matching_actual(config, actual)
    proc = argus("plan", config, "--offline", "--actual", actual)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "No changes: the cluster matches the repository." in proc.stdout


def test_plan_exit_2_when_changes_pending(config: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"models": [], "jobs": [], "capacity": {"total": {"CPU": 8}, "available": {"CPU": 8}}}))
    proc = argus("plan", config, "--offline", "--actual", empty)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "deploy_model" in proc.stdout and "alice/models/chat" in proc.stdout
    assert "alice-202601010000-chat" in proc.stdout  # the served name from the commit time

    data = json.loads(argus("plan", config, "--offline", "--actual", empty, "--format", "json").stdout)
    assert data["changes"] is True and data["errors"] == []
    assert data["actions"][0]["action"] == "deploy_model"
    assert data["actions"][0]["object"] == "alice/models/chat"


def test_plan_exit_1_on_errors_and_markdown(config: Path, tmp_path: Path) -> None:
    actual = tmp_path / "actual.json"
    matching_actual(config, actual)
    break_copy(config)
    proc = argus("plan", config, "--offline", "--actual", actual)
    assert proc.returncode == 1
    assert "users/alice/models/broken.yaml:3: replica: unknown key" in proc.stderr

    md = argus("plan", config, "--offline", "--actual", actual, "--format", "markdown")
    assert md.returncode == 1
    text = md.stdout
    assert text.startswith("### argus plan\n")
    assert "| | action | object | reason |" in text
    assert "|---|---|---|---|" in text
    assert "`keep` | `alice/models/broken`" in text  # an invalid file is kept, and the table says why
    assert "**3 validation errors** (these objects are kept as they run):" in text
    assert "- `users/alice/models/broken.yaml:3` replica: unknown key (did you mean 'replicas'?)" in text


def test_plan_markdown_with_changes(config: Path) -> None:
    md = argus("plan", config, "--offline", "--format", "markdown")
    assert md.returncode == 2
    assert "| + | `deploy_model` | `alice/models/chat` | new model alice-202601010000-chat (1 replica) |" in md.stdout
    assert "> **Note:** capacity unknown" in md.stdout


def test_plan_mass_deletion_is_held_then_approved(config: Path, tmp_path: Path) -> None:
    actual = tmp_path / "actual.json"
    state = {
        "models": [
            {"user": "alice", "name": n, "spec_hash": "x", "replicas": 1, "ready_replicas": 1, "status": "RUNNING"}
            for n in ("a", "b", "c", "d", "e")
        ],
        "capacity": {"total": {"CPU": 8}, "available": {"CPU": 3}},
    }
    actual.write_text(json.dumps(state))
    held = argus("plan", config, "--offline", "--actual", actual, "--format", "json")
    data = json.loads(held.stdout)
    assert held.returncode == 2  # the new example model is still to deploy
    assert data["deletions_held"] is True
    assert not [a for a in data["actions"] if a["action"] == "delete_model"]
    approved = json.loads(
        argus("plan", config, "--offline", "--actual", actual, "--format", "json", "--approve-prune").stdout
    )
    assert approved["deletions_held"] is False
    assert len([a for a in approved["actions"] if a["action"] == "delete_model"]) == 5


def test_plan_held_deletions_exit_2_with_a_headline_naming_them(tmp_path: Path) -> None:
    """Only held deletions pending: not "No changes" and exit 0, but a headline and exit 2."""
    root = tmp_path / "config"
    (root / "users").mkdir(parents=True)
    (root / "cluster.yaml").write_text("kind: Cluster\n")
    actual = tmp_path / "actual.json"
    running = [{"user": "alice", "name": n, "spec_hash": "x", "replicas": 1, "status": "RUNNING"} for n in ("a", "b")]
    actual.write_text(json.dumps({"models": running}))
    for fmt in ("text", "markdown"):
        proc = argus("plan", root, "--offline", "--actual", actual, "--format", fmt)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "No changes" not in proc.stdout
        assert (
            "Deletions held by the mass-deletion guard: alice/models/a, alice/models/b will not be deleted "
            "until a commit approves it." in proc.stdout
        )
    data = json.loads(argus("plan", root, "--offline", "--actual", actual, "--format", "json").stdout)
    assert data["deletions_held"] is True and all(a.get("held") for a in data["actions"])


def test_plan_with_an_invalid_cluster_yaml_says_nothing_will_be_applied(config: Path, tmp_path: Path) -> None:
    actual = tmp_path / "actual.json"
    matching_actual(config, actual)
    (config / "cluster.yaml").write_text("kind: Cluster\nserving: {http_port: 0}\n")
    for fmt in ("text", "markdown"):
        proc = argus("plan", config, "--offline", "--actual", actual, "--format", fmt)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "No changes" not in proc.stdout
        assert "Nothing will be applied: cluster.yaml is invalid" in proc.stdout
    assert "cluster.yaml:2:" in argus("plan", config, "--offline", "--actual", actual).stderr


def test_a_folder_that_is_not_a_config_repository_is_an_error(config: Path) -> None:
    for command in ("validate", "plan"):
        proc = argus(command, "--offline", cwd=config / "users" / "alice")
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert proc.stdout == ""
        assert "not a config repository (no cluster.yaml and no users/ folder)" in proc.stderr
    (config / "cluster.yaml").unlink()  # users/ alone is a config repository (cluster.yaml is optional)
    assert argus("validate", "--offline", cwd=config).returncode == 0


def test_validate_fails_a_request_above_the_quota_unless_it_may_wait(config: Path) -> None:
    (config / "users/alice/tasks").mkdir(exist_ok=True)
    big = config / "users/alice/tasks/big.yaml"
    big.write_text("kind: Task\nworkload: command\ncommand: python train.py\ngpus_per_node: 4\n")
    proc = argus("validate", config, "--offline")
    assert proc.returncode == 1, proc.stderr  # it can never run as written: the PR check fails
    assert (
        "users/alice/tasks/big.yaml:4: needs 4 GPU but alice's quota is 2 GPUs: it can never run as written "
        "(UNSCHEDULABLE); ask for less, or set `may_wait: true`" in proc.stderr
    )
    data = json.loads(argus("validate", config, "--offline", "--format", "json").stdout)
    assert len(data["errors"]) == 1 and data["warnings"] == []
    big.write_text(big.read_text() + "may_wait: true\n")  # the author says it should wait: a warning
    proc = argus("validate", config, "--offline")
    assert proc.returncode == 0, proc.stderr
    assert (
        "warning: users/alice/tasks/big.yaml:4: needs 4 GPU but alice's quota is 2 GPUs: it will be UNSCHEDULABLE"
        in proc.stderr
    )
    data = json.loads(argus("validate", config, "--offline", "--format", "json").stdout)
    assert data["errors"] == [] and len(data["warnings"]) == 1
    assert argus("plan", config, "--offline").returncode == 2  # changes pending, no error


def test_plan_with_a_malformed_actual_state(config: Path, tmp_path: Path) -> None:
    bad = tmp_path / "actual.json"
    bad.write_text('{"models": [{"name": "no-user"}]}')
    proc = argus("plan", config, "--offline", "--actual", bad)
    assert proc.returncode == 1
    assert proc.stderr.startswith("argus: error: ") and "actual.json: cannot read the actual state: " in proc.stderr
    assert "actual-state JSON is malformed: missing field 'user'" in proc.stderr
    bad.write_text("not json")
    proc = argus("plan", config, "--offline", "--actual", bad)
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"argus: error: {bad}: cannot read the actual state")


def test_help_is_complete() -> None:
    top = argus("--help")
    assert top.returncode == 0
    for needle in ("validate", "plan", "exit codes:", "0 no changes, 2 changes pending or deletions held, 1 errors"):
        assert needle in top.stdout
    validate = argus("validate", "--help").stdout
    for needle in ("--offline", "--format", "path:line"):
        assert needle in validate
    plan_help = argus("plan", "--help").stdout
    for needle in ("--actual", "markdown", "--approve-prune"):
        assert needle in plan_help


def test_validate_and_plan_do_not_import_ray_or_vllm() -> None:
    """The base install (a config repository's PR check) has no ray or vllm: the CLI must not need them."""
    code = (
        "import sys, runpy; sys.argv = ['argus', 'validate', sys.argv[1], '--offline'];\n"
        "try:\n    runpy.run_module('reconciler.cli', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'vllm', 'torch'))\n"
        "print('HEAVY', heavy)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(EXAMPLE)], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert "HEAVY []" in proc.stdout, proc.stdout + proc.stderr


def readme_actual_example() -> str:
    """The actual-state JSON example the manual documents for `argus plan --actual`."""
    text = (ROOT / "docs/users/pr-workflow.md").read_text()
    after = text[text.index("The actual-state JSON `argus plan --actual` reads") :]
    body = after[after.index("```json\n") + len("```json\n") :]
    return body[: body.index("\n```")]


def test_the_readme_actual_state_example_admits_a_task(tmp_path: Path) -> None:
    """The manual's actual.json has the capacity the default driver resources need: a task that
    fits is submitted, not queued or unschedulable for lack of `worker_node`."""
    root = tmp_path / "config"
    (root / "users/bob/tasks").mkdir(parents=True)
    (root / "cluster.yaml").write_text("kind: Cluster\n")
    (root / "users/bob/tasks/train.yaml").write_text(
        "kind: Task\nworkload: command\ncommand: python train.py\ngpus_per_node: 1\n"
    )
    actual = tmp_path / "actual.json"
    actual.write_text(readme_actual_example())
    proc = argus("plan", root, "--offline", "--actual", actual, "--format", "json")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    actions = {a["object"]: a for a in json.loads(proc.stdout)["actions"]}
    assert actions["bob/tasks/train"]["action"] == "submit_task", actions


def test_run_refuses_a_status_branch_name_git_cannot_store(tmp_path: Path) -> None:
    """The daemon could never write its status (nor record a run, so submit one) under it: refused at start-up."""
    bare = tmp_path / "config.git"
    subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True)
    proc = argus("run", "--repo", bare, "--status-branch", "argus..status", "--listen", "127.0.0.1:0")
    assert proc.returncode == 1
    assert "the status branch 'argus..status' is not a valid branch name" in proc.stderr
