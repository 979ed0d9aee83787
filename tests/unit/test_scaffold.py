"""``argus init``: the scaffold validates, never overwrites by accident, and its pre-commit hook runs (offline)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from reconciler import __version__
from reconciler.cli import main
from reconciler.errors import ArgusError
from reconciler.scaffold import (
    GITHUB_WORKFLOW,
    GITLAB_JOB,
    URL_PLACEHOLDER,
    ArgusSource,
    ci_files,
    default_source,
    files,
    init_repo,
    is_user_file,
    parse_source,
)

BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    here = BIN / name
    found = str(here) if here.exists() else shutil.which(name)
    assert found, f"{name} is not installed: pip install -e '.[test]'"
    return found


def env(**extra: str) -> dict[str, str]:
    """This interpreter's scripts (argus) first on PATH, a committer identity, no user git config."""
    return {
        **extra,
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "GIT_AUTHOR_NAME": "alice",
        "GIT_AUTHOR_EMAIL": "alice@example.com",
        "GIT_COMMITTER_NAME": "alice",
        "GIT_COMMITTER_EMAIL": "alice@example.com",
        "GIT_CONFIG_GLOBAL": os.devnull,
    }


def run(
    *args: str, cwd: Path, check: bool = True, extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), cwd=cwd, env=env(**(extra or {})), capture_output=True, text=True, check=check)


def test_init_output_validates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo = tmp_path / "config"
    assert main(["init", str(repo)]) == 0
    out = capsys.readouterr().out
    assert f"created {repo / 'cluster.yaml'}" in out
    for rel in (
        "cluster.yaml",
        "users/alice/models/chat.yaml",
        "users/alice/tasks/gsm8k-grpo.yaml",
        "README.md",
        ".pre-commit-config.yaml",
        ".github/workflows/argus.yaml",
        ".argus/schemas/model.schema.json",
    ):
        assert (repo / rel).is_file(), rel
    assert main(["validate", "--offline", str(repo)]) == 0
    assert "ok: 2 object(s) valid" in capsys.readouterr().out
    proc = run(tool("argus"), "validate", "--offline", str(repo), cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stderr


def test_init_refuses_to_overwrite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo = tmp_path / "config"
    repo.mkdir()
    (repo / "README.md").write_text("ours\n")
    with pytest.raises(ArgusError, match=r"would overwrite README\.md"):
        init_repo(str(repo))
    assert sorted(p.name for p in repo.iterdir()) == ["README.md"], "a refused init writes nothing"
    assert main(["init", str(repo)]) == 1
    assert "--force" in capsys.readouterr().err
    assert (repo / "README.md").read_text() == "ours\n"
    # --force writes the generated files only: the README is the users' (kept), and no example objects or
    # cluster.yaml appear in a repository that did not have them.
    created = init_repo(str(repo), force=True)
    assert (repo / "README.md").read_text() == "ours\n" and str(repo / "README.md") not in created
    assert not (repo / "cluster.yaml").exists() and not (repo / "users").exists()
    assert (repo / ".argus/schemas/model.schema.json").is_file() and (repo / ".pre-commit-config.yaml").is_file()


def test_force_refreshes_generated_files_and_never_user_files(tmp_path: Path) -> None:
    """`argus init --force`, the documented schema refresh, once overwrote cluster.yaml and model files."""
    repo = tmp_path / "config"
    init_repo(str(repo))
    user_files = {
        "cluster.yaml": "kind: Cluster\nusers: {alice: {gpus: 8}}\n",
        "users/alice/models/chat.yaml": "kind: Model\nsource: $HOME/mine\n",
        "users/alice/tasks/gsm8k-grpo.yaml": "kind: Task\nworkload: command\n",
        "README.md": "# our cluster\n",
    }
    for rel, text in user_files.items():
        (repo / rel).write_text(text)
    (repo / "users/alice/models/chat.yaml").unlink()  # a user deleted the example: it must not come back
    (repo / ".argus/schemas/model.schema.json").write_text("{}")  # stale schema
    (repo / ".github/workflows/argus.yaml").write_text("stale\n")
    source = parse_source("git+https://git.example.com/org/argus.git@0123456789abcdef0123456789abcdef01234567")
    assert main(["init", "--force", "--argus-source", f"git+{source.url}@{source.rev}", str(repo)]) == 0
    for rel, text in user_files.items():
        if rel != "users/alice/models/chat.yaml":
            assert (repo / rel).read_text() == text, rel
    assert not (repo / "users/alice/models/chat.yaml").exists()
    generated = files(source=source)
    for rel in (".argus/schemas/model.schema.json", ".github/workflows/argus.yaml", ".pre-commit-config.yaml"):
        assert (repo / rel).read_text() == generated[rel], rel
    assert all(not is_user_file(rel) for rel in (".vscode/settings.json", ".argus/schemas/task.schema.json"))
    # A later refresh without --argus-source keeps the source set before (set in one place, once).
    (repo / ".argus/schemas/model.schema.json").write_text("{}")
    assert main(["init", "--force", str(repo)]) == 0
    assert (repo / ".github/workflows/argus.yaml").read_text() == generated[".github/workflows/argus.yaml"]
    assert (repo / ".argus/schemas/model.schema.json").read_text() == generated[".argus/schemas/model.schema.json"]
    assert all(is_user_file(rel) for rel in user_files)


def test_argus_is_installed_from_the_pinned_source_set_in_one_place(tmp_path: Path) -> None:
    """The workflow and README once installed `argus-reconciler==0.1.0` from PyPI (not published there: a name
    anyone could claim) and pre-commit named the tag v0.1.0 (which does not exist)."""
    rev = "0123456789abcdef0123456789abcdef01234567"
    source = parse_source(f"git+ssh://git@git.example.com/org/argus.git@{rev}")
    assert (source.url, source.rev) == ("ssh://git@git.example.com/org/argus.git", rev)
    init_repo(str(tmp_path), source=source)
    workflow = yaml.safe_load((tmp_path / ".github/workflows/argus.yaml").read_text())
    assert (
        workflow["env"]["ARGUS_PACKAGE"]
        == f"argus-reconciler[check] @ git+ssh://git@git.example.com/org/argus.git@{rev}"
    )
    assert f'pip install "{source.pip}"' in (tmp_path / "README.md").read_text()
    pre_commit = (tmp_path / ".pre-commit-config.yaml").read_text()
    assert f"#   - repo: {source.url}\n#     rev: {rev}\n" in pre_commit
    for path in tmp_path.rglob("*"):
        if path.is_file() and path.suffix != ".json":
            text = path.read_text()
            assert "argus-reconciler==" not in text and f"v{__version__}" not in text, path
    for bad in (
        "argus-reconciler==0.1.0",
        "git+https://git.example.com/org/argus.git",  # not pinned
        "git+ssh://git@git.example.com/org/argus.git",  # the @ belongs to the URL: still not pinned
        "git+https://git.example.com/org/argus.git@main branch",
        "https://git.example.com/org/argus.git@v1",
    ):
        with pytest.raises(ArgusError, match="expected git"):
            parse_source(bad)
    assert parse_source("argus-reconciler @ git+https://h/o/argus.git@v1.2.3").rev == "v1.2.3"
    assert parse_source("argus-reconciler[check] @ git+https://h/o/argus.git@v1.2.3").rev == "v1.2.3"


def test_default_source_pins_a_commit_that_exists_and_installs(tmp_path: Path) -> None:
    """The default names no tag: it pins the commit this argus runs from, and pip installs from that form."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        if os.environ.get("CI"):
            pytest.fail("not a git checkout: argus init needs --argus-source here", pytrace=False)
        pytest.skip("not a git checkout: argus init needs --argus-source here")
    source = default_source()
    assert source.placeholder and re.fullmatch(r"[0-9a-f]{40}", source.rev)
    assert run("git", "-C", str(root), "cat-file", "-e", f"{source.rev}^{{commit}}", cwd=tmp_path).returncode == 0
    # The workflow's install step with the URL pointed at this checkout: pip accepts and installs the pinned form.
    local = f"argus-reconciler @ git+file://{root}@{source.rev}"
    proc = run(
        sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
        "--target", str(tmp_path / "site"), local, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "site" / "reconciler" / "scaffold.py").is_file()


def test_init_user_name_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ArgusError, match="must match"):
        init_repo(str(tmp_path), user="../bob")
    assert list(tmp_path.iterdir()) == []
    init_repo(str(tmp_path / "r"), user="bob")
    assert main(["validate", "--offline", str(tmp_path / "r")]) == 0
    assert "bob: {gpus: 4}" in (tmp_path / "r" / "cluster.yaml").read_text()


def test_modelines_point_at_the_copied_schemas(tmp_path: Path) -> None:
    init_repo(str(tmp_path))
    for rel in ("cluster.yaml", "users/alice/models/chat.yaml", "users/alice/tasks/gsm8k-grpo.yaml"):
        first = (tmp_path / rel).read_text().splitlines()[0]
        match = re.fullmatch(r"# yaml-language-server: \$schema=(\S+)", first)
        assert match, first
        target = (tmp_path / rel).parent / match.group(1)
        schema = json.loads(target.read_text())
        kind = yaml.safe_load((tmp_path / rel).read_text())["kind"]
        assert schema["properties"]["kind"]["const"] == kind
    root = Path(__file__).resolve().parents[2]
    for name in ("cluster", "model", "task"):
        copied = (tmp_path / ".argus" / "schemas" / f"{name}.schema.json").read_text()
        assert copied == (root / "schemas" / f"{name}.schema.json").read_text()
    settings = json.loads((tmp_path / ".vscode" / "settings.json").read_text())
    assert all((tmp_path / p).is_file() for p in settings["yaml.schemas"])


def test_workflow_follows_the_github_schema_and_handles_plan_exit_codes(tmp_path: Path) -> None:
    init_repo(str(tmp_path))
    workflow = tmp_path / ".github" / "workflows" / "argus.yaml"
    proc = run(tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows", str(workflow), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout
    doc = yaml.safe_load(workflow.read_text())
    assert "pull_request" in doc[True]  # YAML 1.1 reads the key `on` as True
    steps = doc["jobs"]["plan"]["steps"]
    script = "\n".join(s.get("run", "") for s in steps)
    assert 'pip install --quiet "$ARGUS_PACKAGE"' in script
    assert doc["env"]["ARGUS_PACKAGE"].startswith("argus-reconciler[check] @ git+")
    assert "[gpu]" not in script and "[cpu]" not in script, "CI installs the check extra only"
    assert "argus validate --offline ." in script
    assert "--format markdown" in script and "gh pr comment" in script
    assert '"$code" -ne 2' in script, "exit 2 (changes pending) is not a failure"


def test_workflow_plan_step_runs_as_written(tmp_path: Path) -> None:
    """The workflow's actual-state and plan steps, run here with bash as the runner would."""
    repo = tmp_path / "config"
    init_repo(str(repo))
    run("git", "init", "-q", "-b", "main", cwd=repo)
    run("git", "add", "-A", cwd=repo)
    run("git", "commit", "-q", "-m", "init", cwd=repo)
    steps = {
        s.get("name"): s
        for s in yaml.safe_load((repo / ".github/workflows/argus.yaml").read_text())["jobs"]["plan"]["steps"]
    }
    temp, output, summary = tmp_path / "runner", tmp_path / "output", tmp_path / "summary"
    temp.mkdir()
    runner_env = {
        **env(),
        "RUNNER_TEMP": str(temp),
        "GITHUB_OUTPUT": str(output),
        "GITHUB_STEP_SUMMARY": str(summary),
        "ARGUS_STATUS_BRANCH": "argus/status",
        "ARGUS_ACTUAL_FILE": ".argus/actual.json",
    }
    for name in ("Actual state", "Plan"):
        proc = subprocess.run(
            ["bash", "-e", "-c", steps[name]["run"]], cwd=repo, env=runner_env, capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert output.read_text().strip() == "exit_code=2"
    plan = (temp / "plan.md").read_text()
    assert "deploy_model" in plan and "alice/models/chat" in plan
    assert summary.read_text() == plan


def test_pre_commit_hook_runs_offline(tmp_path: Path) -> None:
    repo = tmp_path / "config"
    init_repo(str(repo))
    run("git", "init", "-q", "-b", "main", cwd=repo)
    pre_commit = tool("pre-commit")
    home = {"PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home")}
    run(pre_commit, "validate-config", ".pre-commit-config.yaml", cwd=repo, extra=home)
    run("git", "add", "-A", cwd=repo)
    ok = run(pre_commit, "run", "--all-files", cwd=repo, check=False, extra=home)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert re.search(r"argus validate --offline\.+Passed", ok.stdout), ok.stdout

    bad = repo / "users" / "alice" / "models" / "broken.yaml"
    bad.write_text("kind: Model\nsource: /etc/passwd\nreplicas: 99\n")
    run("git", "add", "-A", cwd=repo)
    failed = run(pre_commit, "run", "--all-files", cwd=repo, check=False, extra=home)
    assert failed.returncode == 1, failed.stdout
    assert "users/alice/models/broken.yaml:" in failed.stdout

    # As a git hook: the broken commit is refused, the fixed one goes through.
    run(pre_commit, "install", cwd=repo, extra=home)
    assert run("git", "commit", "-q", "-m", "broken", cwd=repo, check=False, extra=home).returncode != 0
    bad.unlink()
    run("git", "add", "-A", cwd=repo)
    committed = run("git", "commit", "-q", "-m", "init", cwd=repo, check=False, extra=home)
    assert committed.returncode == 0, committed.stdout + committed.stderr


def test_scaffold_hook_matches_the_shipped_manifest() -> None:
    root = Path(__file__).resolve().parents[2]
    (shipped,) = yaml.safe_load((root / ".pre-commit-hooks.yaml").read_text())
    (local,) = yaml.safe_load(files()[".pre-commit-config.yaml"])["repos"][0]["hooks"]
    for key in ("id", "entry", "pass_filenames", "files"):
        assert local[key] == shipped[key], key


def test_init_next_line_runs_only_commands_this_machine_has(tmp_path: Path) -> None:
    """The base install has no pre-commit: the "next:" line must not end in `pre-commit: not found` (rc 127)."""
    bare = tmp_path / "bin"
    bare.mkdir()
    for name in ("git", "sh", "bash"):
        found = shutil.which(name)
        assert found
        (bare / name).symlink_to(found)
    (bare / "argus").symlink_to(BIN / "argus")
    repo = tmp_path / "config"
    root = Path(__file__).resolve().parents[2]
    no_pre_commit = {**env(), "PATH": str(bare), "PYTHONPATH": str(root)}
    out = subprocess.run(
        [sys.executable, "-m", "reconciler.cli", "init", str(repo), "--argus-source", "git+https://h/o/argus.git@v1"],
        env=no_pre_commit, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    (next_line,) = [line for line in out.splitlines() if line.startswith("next: ")]
    assert "pre-commit" not in next_line and "pip install pre-commit && pre-commit install" in out
    proc = subprocess.run(
        ["sh", "-c", next_line.removeprefix("next: ")], env=no_pre_commit, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok: 2 object(s) valid" in proc.stdout


def test_init_writes_the_chosen_ci(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--ci gitlab` writes a GitLab job (its own file, included from .gitlab-ci.yml, which is the
    project's and never rewritten), `--ci none` no CI; `--force` keeps the CI the repository has."""
    gitlab, plain = tmp_path / "gitlab", tmp_path / "plain"
    assert main(["init", "--ci", "gitlab", str(gitlab)]) == 0
    assert main(["init", "--ci", "none", str(plain)]) == 0
    capsys.readouterr()
    assert not (gitlab / ".github").exists() and not (plain / ".github").exists()
    assert not (plain / ".gitlab-ci.yml").exists() and not (plain / ".gitlab").exists()
    assert yaml.safe_load((gitlab / ".gitlab-ci.yml").read_text()) == {
        "include": [{"local": ".gitlab/argus.gitlab-ci.yml"}]
    }
    job = gitlab / ".gitlab" / "argus.gitlab-ci.yml"
    proc = run(tool("check-jsonschema"), "--builtin-schema", "vendor.gitlab-ci", str(job), cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = yaml.safe_load(job.read_text())
    assert doc["argus-plan"]["rules"][0]["if"] == '$CI_PIPELINE_SOURCE == "merge_request_event"'
    assert doc["variables"]["ARGUS_PACKAGE"].startswith("argus-reconciler[check] @ git+")
    # A refresh: the job file comes back, the project's .gitlab-ci.yml is kept, no GitHub workflow appears.
    (gitlab / ".gitlab-ci.yml").write_text("include: [{local: .gitlab/argus.gitlab-ci.yml}]\nmine: {script: [x]}\n")
    job.write_text("stale\n")
    rev = "0123456789abcdef0123456789abcdef01234567"
    assert (
        main(["init", "--force", "--argus-source", f"git+https://git.example.com/o/argus.git@{rev}", str(gitlab)]) == 0
    )
    assert "mine:" in (gitlab / ".gitlab-ci.yml").read_text() and not (gitlab / ".github").exists()
    assert f"git.example.com/o/argus.git@{rev}" in job.read_text()
    # ... and its source is kept by the next refresh, read back from the GitLab job.
    job.write_text(job.read_text().replace("timeout: 10 minutes", "timeout: 1 minutes"))
    assert main(["init", "--force", str(gitlab)]) == 0
    assert "timeout: 10 minutes" in job.read_text() and f"@{rev}" in job.read_text()


def test_gitlab_job_plan_runs_as_written(tmp_path: Path) -> None:
    """The GitLab job's script, run here with bash as a runner would (without the install line)."""
    repo = tmp_path / "config"
    init_repo(str(repo), ci="gitlab")
    run("git", "init", "-q", "-b", "main", cwd=repo)
    run("git", "add", "-A", cwd=repo)
    run("git", "commit", "-q", "-m", "init", cwd=repo)
    doc = yaml.safe_load((repo / ".gitlab" / "argus.gitlab-ci.yml").read_text())
    script = [line for line in doc["argus-plan"]["script"] if "pip install" not in line]
    runner_env = {**env(), **doc["variables"], "PATH": f"{BIN}:{os.environ['PATH']}"}
    proc = subprocess.run(
        ["bash", "-eo", "pipefail", "-c", "\n".join(script)], cwd=repo, env=runner_env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (repo / "plan.exit").read_text().strip() == "2"
    assert "deploy_model" in (repo / "plan.md").read_text() and "alice/models/chat" in proc.stdout
    # A broken file fails the job.
    (repo / "users/alice/models/chat.yaml").write_text("kind: Model\nreplicas: many\n")
    proc = subprocess.run(
        ["bash", "-eo", "pipefail", "-c", "\n".join(script)], cwd=repo, env=runner_env, capture_output=True, text=True
    )
    assert proc.returncode != 0 and "users/alice/models/chat.yaml:" in proc.stderr


def test_the_ci_examples_are_what_init_writes() -> None:
    source = ArgusSource(URL_PLACEHOLDER, "<tag or commit>")
    examples = Path(__file__).resolve().parents[2] / "examples" / "ci"
    assert (examples / "github-actions.yaml").read_text() == ci_files("github", source)[GITHUB_WORKFLOW]
    assert (examples / "gitlab-ci.yml").read_text() == ci_files("gitlab", source)[GITLAB_JOB]
    with pytest.raises(ArgusError, match="--ci 'jenkins'"):
        ci_files("jenkins", source)
