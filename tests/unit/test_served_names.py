"""Stable served names: the time a pull request's plan shows is the time after the merge.

A served model is named ``<user>-<YYYYMMDDHHMM>-<name>`` from the time of the commit that
introduced its file. These properties run real git: a pull request is planned on its branch
(and on the synthetic merge ref a forge checks out), merged with a merge commit, by rebase or
fast-forward, re-cloned, and edited afterwards; the time never moves.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.source.git import GitRepo
from tests.unit.gitrepo import GIT_ENV, WorkRepo

T0 = 1767225600  # 2026-01-01 00:00 UTC
HOUR = 3600
NEW = "users/alice/models/new.yaml"


def model(replicas: int = 1) -> str:
    return f"kind: Model\nsource: Qwen/Qwen2.5-0.5B-Instruct\nreplicas: {replicas}\n"


def created(root: Path, ref: str = "HEAD") -> int:
    repo = GitRepo(str(root))
    return repo.created_times(repo.resolve(ref))[NEW]


@settings(max_examples=12, deadline=None)
@given(
    style=st.sampled_from(["merge", "rebase", "ff"]),
    pr_commits=st.integers(min_value=1, max_value=3),
    base_moves=st.integers(min_value=0, max_value=2),
    later_edits=st.integers(min_value=0, max_value=2),
)
def test_pr_plan_time_is_the_time_after_merge(style: str, pr_commits: int, base_moves: int, later_edits: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        _merge_scenario(Path(tmp), style, pr_commits, base_moves, later_edits)


def _merge_scenario(root: Path, style: str, pr_commits: int, base_moves: int, later_edits: int) -> None:
    repo = WorkRepo(root / "config")
    repo.write("users/bob/models/old.yaml", model())
    repo.commit("base", T0)
    repo.git("checkout", "-q", "-b", "pr")
    repo.write(NEW, model())
    when = T0 + 5 * HOUR
    repo.commit("add new", when)
    for i in range(1, pr_commits):
        repo.write(NEW, model(i + 1))
        repo.commit(f"edit {i}", when + i * HOUR)
    in_pr = created(repo.root)
    assert in_pr == when
    repo.git("checkout", "-q", "main")
    for i in range(base_moves):
        repo.write(f"users/bob/models/b{i}.yaml", model())
        repo.commit(f"base moves {i}", T0 + (10 + i) * HOUR)
    # What a forge's pull-request check sees: a synthetic merge of the PR into the base.
    repo.git("checkout", "-q", "-b", "synthetic", "main")
    repo.git("merge", "-q", "--no-ff", "-m", "synthetic merge", "pr", when=T0 + 20 * HOUR)
    assert created(repo.root) == when
    repo.git("checkout", "-q", "main")
    if style == "merge":
        repo.git("merge", "-q", "--no-ff", "-m", "Merge pull request", "pr", when=T0 + 30 * HOUR)
    elif style == "rebase":
        repo.git("checkout", "-q", "pr")
        # A rebase writes new commits with new committer times; author times are kept.
        env = {**os.environ, **GIT_ENV, "GIT_COMMITTER_DATE": f"{T0 + 30 * HOUR} +0000"}
        subprocess.run(["git", "rebase", "-q", "main"], cwd=repo.root, env=env, check=True, capture_output=True)
        repo.git("checkout", "-q", "main")
        repo.git("merge", "-q", "--ff-only", "pr")
    else:
        if base_moves:
            repo.git("merge", "-q", "--no-ff", "-m", "merge", "pr", when=T0 + 30 * HOUR)
        else:
            repo.git("merge", "-q", "--ff-only", "pr")
    assert created(repo.root) == when
    # Later edits of the file and unrelated renames do not move it.
    old = "users/bob/models/old.yaml"
    for i in range(later_edits):
        repo.write(NEW, model(5 + i))
        repo.git("mv", old, f"users/bob/models/old{i}.yaml")
        old = f"users/bob/models/old{i}.yaml"
        repo.commit(f"later {i}", T0 + (40 + i) * HOUR)
    assert created(repo.root) == when
    # A re-clone (a restarted daemon, another machine) computes the same.
    clone = root / "clone"
    repo.git("clone", "-q", "--bare", str(repo.root), str(clone))
    assert created(clone, "main") == when


def test_delete_and_re_add_is_a_new_model(tmp_path: Path) -> None:
    repo = WorkRepo(tmp_path / "config")
    repo.write(NEW, model())
    repo.commit("add", T0)
    repo.remove(NEW)
    repo.commit("delete", T0 + HOUR)
    repo.write(NEW, model())
    repo.commit("add again", T0 + 2 * HOUR)
    assert created(repo.root) == T0 + 2 * HOUR


def test_incremental_walk_agrees_with_a_fresh_one_across_a_merge(tmp_path: Path) -> None:
    repo = WorkRepo(tmp_path / "config")
    repo.write("users/bob/models/old.yaml", model())
    first = repo.commit("base", T0)
    source = GitRepo(str(repo.root))
    source.created_times(first)
    repo.git("checkout", "-q", "-b", "pr")
    repo.write(NEW, model())
    repo.commit("add new", T0 + HOUR)
    repo.git("checkout", "-q", "main")
    repo.git("merge", "-q", "--no-ff", "-m", "merge", "pr", when=T0 + 9 * HOUR)
    head = repo.git("rev-parse", "HEAD")
    assert source.created_times(head) == GitRepo(str(repo.root)).created_times(head)
    assert source.created_times(head)[NEW] == T0 + HOUR


def test_a_file_name_with_pathspec_magic_matches_only_itself(tmp_path: Path) -> None:
    repo = WorkRepo(tmp_path / "config")
    repo.write("users/bob/models/old.yaml", model())
    repo.commit("base", T0)
    repo.git("checkout", "-q", "-b", "pr")
    repo.write("users/alice/models/abc.yaml", model())
    repo.commit("a plain name, early", T0 + HOUR)
    repo.write("users/alice/models/a*c.yaml", model())
    repo.commit("a name that is also a glob", T0 + 2 * HOUR)
    repo.git("checkout", "-q", "main")
    repo.git("merge", "-q", "--no-ff", "-m", "merge", "pr", when=T0 + 9 * HOUR)
    times = GitRepo(str(repo.root)).created_times(repo.git("rev-parse", "HEAD"))
    assert times["users/alice/models/a*c.yaml"] == T0 + 2 * HOUR  # not abc.yaml's earlier add
    assert times["users/alice/models/abc.yaml"] == T0 + HOUR
