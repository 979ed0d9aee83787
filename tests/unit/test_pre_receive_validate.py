"""``examples/ci/pre-receive-validate``: a plain git server's hook that refuses a push to the deployed
branch whose tree fails ``argus validate --offline``. A real bare repository, the hook installed as a
server would install it, real ``git push`` and the real ``argus`` command."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reconciler.scaffold import init_repo, parse_source

HOOK = Path(__file__).resolve().parents[2] / "examples" / "ci" / "pre-receive-validate"
ARGUS = Path(sys.executable).parent / "argus"
SOURCE = parse_source("git+https://git.example.com/o/argus.git@v1")


def argus() -> str:
    found = str(ARGUS) if ARGUS.exists() else shutil.which("argus")
    assert found, "argus is not installed: pip install -e '.[test]'"
    return found


def git(*args: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@x",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@x",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
        "ARGUS": argus(),
    }
    return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=check)


@pytest.fixture
def server(tmp_path: Path) -> tuple[Path, Path]:
    """A bare repository with the hook, and a clone holding `argus init`'s valid scaffold."""
    bare, work = tmp_path / "config.git", tmp_path / "work"
    git("init", "-q", "--bare", "-b", "main", str(bare), cwd=tmp_path)
    shutil.copy(HOOK, bare / "hooks" / "pre-receive")
    (bare / "hooks" / "pre-receive").chmod(0o755)
    git("init", "-q", "-b", "main", str(work), cwd=tmp_path)
    init_repo(str(work), ci="none", source=SOURCE)
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", "init", cwd=work)
    git("remote", "add", "origin", str(bare), cwd=work)
    return bare, work


def test_a_valid_push_is_accepted_and_an_invalid_one_refused_with_its_errors(server: tuple[Path, Path]) -> None:
    bare, work = server
    ok = git("push", "-q", "origin", "main", cwd=work, check=False)
    assert ok.returncode == 0, ok.stderr
    assert "argus: " in ok.stderr and "ok: 2 object(s) valid" in ok.stderr
    good = git("rev-parse", "main", cwd=bare).stdout.strip()
    # A broken model file: refused, the error at its path and line, the branch unchanged.
    model = work / "users" / "alice" / "models" / "chat.yaml"
    model.write_text(model.read_text() + "replicas: many\n")
    git("commit", "-q", "-am", "broken", cwd=work)
    refused = git("push", "origin", "main", cwd=work, check=False)
    assert refused.returncode != 0
    assert "push to main refused" in refused.stderr
    remote = "\n".join(line for line in refused.stderr.splitlines() if line.startswith("remote:"))
    assert "\nremote:   users/alice/models/chat.yaml:" in remote, remote
    assert "/tmp" not in remote, "errors name the repository's paths, not the hook's temporary folder"
    assert git("rev-parse", "main", cwd=bare).stdout.strip() == good
    assert git("cat-file", "-e", git("rev-parse", "HEAD", cwd=work).stdout.strip(), cwd=bare, check=False).returncode
    # Another branch (a pull-request branch) is not checked; a fixed push is accepted again.
    assert git("push", "-q", "origin", "main:refs/heads/wip", cwd=work, check=False).returncode == 0
    model.write_text(model.read_text().replace("replicas: many\n", ""))
    git("commit", "-q", "-am", "fixed", cwd=work)
    assert git("push", "-q", "origin", "main", cwd=work, check=False).returncode == 0


def test_the_deployed_branch_is_configurable_and_deletions_pass(server: tuple[Path, Path]) -> None:
    bare, work = server
    (bare / "cluster.yaml").write_text("")  # not read: the hook reads the pushed tree, never the server's files
    (work / "cluster.yaml").write_text("kind: Cluster\nusers: nope\n")
    git("commit", "-q", "-am", "broken cluster.yaml", cwd=work)
    assert git("push", "-q", "origin", "main:refs/heads/deploy", cwd=work, check=False).returncode == 0
    # A server whose config branch is `deploy` calls the hook with ARGUS_BRANCH set.
    (bare / "hooks" / "pre-receive").write_text(f"#!/bin/sh\nARGUS_BRANCH=deploy exec {HOOK}\n")
    git("commit", "-q", "--allow-empty", "-m", "again", cwd=work)
    refused = git("push", "origin", "main:refs/heads/deploy", cwd=work, check=False)
    assert refused.returncode != 0 and "cluster.yaml:" in refused.stderr
    assert git("push", "-q", "origin", ":refs/heads/deploy", cwd=work, check=False).returncode == 0
