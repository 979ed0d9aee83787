"""``argus status`` in a user's clone reads the status branch from the remote the daemon writes to
(issue 21 item 7): the current branch's upstream remote, or ``--remote``, never a stale local copy."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from reconciler.cli import main
from reconciler.testing.status_branch import commit_files, dump, task_doc

GIT_ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "a",
    "GIT_AUTHOR_EMAIL": "a@x",
    "GIT_COMMITTER_NAME": "a",
    "GIT_COMMITTER_EMAIL": "a@x",
    "GIT_CONFIG_GLOBAL": os.devnull,
}


def git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", *args], cwd=cwd, env=GIT_ENV, check=True, capture_output=True)


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """A clone whose remote is named `cluster` (as the README sets it up), tracking cluster/main."""
    bare = tmp_path / "cluster.git"
    git("init", "-q", "--bare", "-b", "main", str(bare), cwd=tmp_path)
    work = tmp_path / "seed"
    git("init", "-q", "-b", "main", str(work), cwd=tmp_path)
    (work / "README.md").write_text("x\n")
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", "x", cwd=work)
    git("push", "-q", str(bare), "main", cwd=work)
    commit_files(str(bare), {"users/ann/tasks/train.yaml": dump(task_doc("ann", "train", "SUCCEEDED"))})
    out = tmp_path / "clone"
    git("clone", "-q", "-o", "cluster", str(bare), str(out), cwd=tmp_path)
    return out


def test_status_follows_the_current_branch_upstream(clone: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--repo", str(clone)]) == 0
    assert "ann/tasks/train" in capsys.readouterr().out


def test_a_stale_local_status_branch_does_not_hide_the_remote_one(
    clone: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    git("branch", "argus/status", "cluster/argus/status", cwd=clone)  # a local copy, then the daemon moves on
    commit_files(str(tmp_path / "cluster.git"), {"users/ann/tasks/new.yaml": dump(task_doc("ann", "new", "RUNNING"))})
    assert main(["status", "--repo", str(clone)]) == 0
    assert "ann/tasks/new" in capsys.readouterr().out


def test_several_remotes_without_an_upstream_need_remote(clone: Path, capsys: pytest.CaptureFixture[str]) -> None:
    git("remote", "add", "fork", str(clone), cwd=clone)
    git("checkout", "-q", "--detach", cwd=clone)
    assert main(["status", "--repo", str(clone)]) == 1
    err = capsys.readouterr().err
    assert "several remotes (cluster, fork)" in err and "pass --remote NAME" in err
    assert main(["status", "--repo", str(clone), "--remote", "cluster"]) == 0
    assert "ann/tasks/train" in capsys.readouterr().out
    assert main(["status", "--repo", str(clone), "--remote", "nope"]) == 1
    assert "no remote 'nope'" in capsys.readouterr().err


def test_a_remote_without_a_status_branch_is_an_error_not_an_empty_table(
    clone: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    git("remote", "add", "other", str(clone), cwd=clone)
    assert main(["status", "--repo", str(clone), "--remote", "other"]) == 1
    err = capsys.readouterr().err
    assert "no status branch 'argus/status' on remote 'other'" in err
