"""A ``refs/replace/*`` in the repository does not change what argus reads (GIT_NO_REPLACE_OBJECTS=1).

Real git: alice's model file and a status commit are replaced (``git replace``) by forged objects; plain git
then shows the forgery, argus's readers (the desired-state source, the status branch reader, the CLI in a
fresh process) still read the real content.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from reconciler import git as gitmodule
from reconciler.source.git import GitRepo
from reconciler.status.branch import read_file
from tests.unit.gitrepo import GIT_ENV, WorkRepo

ROOT = Path(__file__).resolve().parents[2]
REAL = "name: m\nmodel: /private/hf/real\n"
FORGED = "name: m\nmodel: /private/hf/forged\n"


def plain_git(repo: Path, *args: str, input: str | None = None) -> str:
    """git without argus's environment: what replace refs do to every reader that does not opt out."""
    env = {k: v for k, v in os.environ.items() if k != "GIT_NO_REPLACE_OBJECTS"}
    env.update(GIT_ENV)
    proc = subprocess.run(["git", *args], cwd=repo, env=env, input=input, capture_output=True, text=True, check=True)
    return proc.stdout.strip()


def replaced_repo(tmp_path: Path) -> tuple[WorkRepo, str]:
    repo = WorkRepo(tmp_path / "repo")
    repo.write("users/alice/models/m.yaml", REAL)
    commit = repo.commit("alice's model", when=1_700_000_000)
    blob = plain_git(repo.root, "rev-parse", f"{commit}:users/alice/models/m.yaml")
    forged = plain_git(repo.root, "hash-object", "-w", "--stdin", input=FORGED)
    plain_git(repo.root, "replace", blob, forged)
    # The forgery is live for plain git: the test would pass for the wrong reason without this check.
    assert plain_git(repo.root, "show", f"{commit}:users/alice/models/m.yaml") == FORGED.strip()
    return repo, commit


def test_the_package_sets_it_for_every_child_process() -> None:
    assert os.environ["GIT_NO_REPLACE_OBJECTS"] == "1"
    assert gitmodule.GIT_ENV == {"GIT_NO_REPLACE_OBJECTS": "1"}


def test_the_source_reads_the_real_blob(tmp_path: Path) -> None:
    repo, commit = replaced_repo(tmp_path)
    snapshot = GitRepo(str(repo.root)).snapshot(commit)
    (model,) = [f for f in snapshot.files if f.path == "users/alice/models/m.yaml"]
    assert model.content is not None and model.content.decode() == REAL


def test_a_replaced_status_document_is_read_as_written(tmp_path: Path) -> None:
    repo = WorkRepo(tmp_path / "repo")
    repo.write("lease.json", json.dumps({"expires": 1}))
    commit = repo.commit("status", when=1_700_000_000)
    blob = plain_git(repo.root, "rev-parse", f"{commit}:lease.json")
    forged = plain_git(repo.root, "hash-object", "-w", "--stdin", input=json.dumps({"expires": 99_999_999_999}))
    plain_git(repo.root, "replace", blob, forged)
    assert read_file(str(repo.root), commit, "lease.json") == {"expires": 1}


def test_a_fresh_argus_process_ignores_replace_refs(tmp_path: Path) -> None:
    """Any entry point (here the CLI's module, in a process that never set the variable itself)."""
    repo, commit = replaced_repo(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "GIT_NO_REPLACE_OBJECTS"}
    env["PYTHONPATH"] = str(ROOT)
    code = (
        "import sys; from reconciler.source.git import GitRepo; "
        "s = GitRepo(sys.argv[1]).snapshot(sys.argv[2]); "
        "print([f.content.decode() for f in s.files if f.path.endswith('m.yaml')][0], end='')"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(repo.root), commit], env=env, capture_output=True, text=True, check=True
    )
    assert proc.stdout == REAL
