"""reconciler.source.git: blobs at a commit, created times, the approve trailer, incremental reads."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest

from reconciler.errors import SourceUnavailable
from reconciler.source.git import GitRepo
from reconciler.spec.loader import ParseCache, SourceFile, load
from reconciler.spec.types import ObjectKey
from tests.unit.gitrepo import WorkRepo

T1, T2, T3, T4 = 1767225600, 1767312000, 1767398400, 1767484800  # 2026-01-01 .. 01-04, 00:00 UTC


def model(replicas: int = 1) -> str:
    return f"kind: Model\nsource: Qwen/Qwen2.5-0.5B-Instruct\nreplicas: {replicas}\n"


def by_path(files: Iterable[SourceFile]) -> dict[str, SourceFile]:
    return {f.path: f for f in files}


class CountingRepo(GitRepo):
    """A GitRepo that records which blobs it asked git for."""

    requested: list[str]

    def _read_blobs(self, blobs: Iterable[str]) -> dict[str, bytes]:
        wanted = list(blobs)
        self.requested = [*getattr(self, "requested", []), *wanted]
        return super()._read_blobs(wanted)


@pytest.fixture
def repo(tmp_path: Path) -> WorkRepo:
    return WorkRepo(tmp_path / "config")


def test_reads_the_commit_not_the_work_tree(repo: WorkRepo) -> None:
    repo.write("cluster.yaml", "kind: Cluster\n")
    repo.write("users/alice/models/chat.yaml", model(1))
    repo.write("README.md", "ignored\n")
    first = repo.commit("add chat", T1)
    repo.write("users/alice/models/chat.yaml", model(2))
    second = repo.commit("scale chat", T2)
    # Uncommitted edits and untracked files are invisible: the daemon reads commits only.
    repo.write("users/alice/models/chat.yaml", model(9))
    repo.write("users/alice/models/draft.yaml", model(1))

    source = GitRepo(str(repo.root))
    assert source.resolve("HEAD") == second
    files = by_path(source.snapshot(second).files)
    assert sorted(files) == ["cluster.yaml", "users/alice/models/chat.yaml"]  # README.md is not read
    assert files["users/alice/models/chat.yaml"].content == model(2).encode()
    old = by_path(source.snapshot(first).files)
    assert old["users/alice/models/chat.yaml"].content == model(1).encode()
    state = load(source.snapshot(second).files)
    assert state.models[ObjectKey("alice", "model", "chat")].replicas == 2


def test_unknown_ref_is_source_unavailable(repo: WorkRepo) -> None:
    repo.write("cluster.yaml", "kind: Cluster\n")
    repo.commit("init", T1)
    with pytest.raises(SourceUnavailable):
        GitRepo(str(repo.root)).resolve("no-such-branch")


def test_created_time_is_the_first_add_and_survives_edits_and_reclones(repo: WorkRepo, tmp_path: Path) -> None:
    repo.write("users/alice/models/chat.yaml", model(1))
    repo.commit("add chat", T1)
    repo.write("users/alice/models/chat.yaml", model(2))
    repo.write("users/bob/models/coder.yaml", model(1))
    repo.commit("scale chat, add coder", T2)
    repo.write("users/alice/models/chat.yaml", model(3))
    head = repo.commit("scale chat again", T3)

    snap = GitRepo(str(repo.root)).snapshot(head)
    assert snap.created == {"users/alice/models/chat.yaml": T1, "users/bob/models/coder.yaml": T2}
    assert snap.commit_time == T3
    state = load(snap.files, created=snap.created, default_time=snap.commit_time)
    assert state.models[ObjectKey("alice", "model", "chat")].served_name == "alice-202601010000-chat"

    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--bare", str(repo.root), str(clone)], check=True)
    assert GitRepo(str(clone)).snapshot(head).created == snap.created


def test_files_merged_from_a_branch_keep_the_time_of_the_commit_that_introduced_them(repo: WorkRepo) -> None:
    repo.write("users/alice/models/chat.yaml", model(1))
    repo.commit("add chat", T1)
    repo.git("checkout", "-q", "-b", "feature")
    repo.write("users/bob/models/coder.yaml", model(1))
    repo.commit("add coder on a branch", T2)
    repo.git("checkout", "-q", "main")
    repo.write("users/carol/models/qa.yaml", model(1))
    repo.commit("add qa on main", T3)
    repo.git("merge", "-q", "--no-ff", "-m", "merge feature", "feature", when=T4)
    head = repo.git("rev-parse", "HEAD")

    created = GitRepo(str(repo.root)).snapshot(head).created
    # main's first-parent history added coder.yaml in the merge commit; the name keeps the time
    # of the branch commit that introduced it, which is what the pull request's plan showed.
    assert created == {
        "users/alice/models/chat.yaml": T1,
        "users/bob/models/coder.yaml": T2,
        "users/carol/models/qa.yaml": T3,
    }


def test_a_file_deleted_and_added_again_is_a_new_object(repo: WorkRepo) -> None:
    repo.write("users/alice/models/chat.yaml", model(1))
    repo.commit("add", T1)
    repo.remove("users/alice/models/chat.yaml")
    repo.commit("remove", T2)
    repo.write("users/alice/models/chat.yaml", model(1))
    head = repo.commit("add again", T3)
    assert GitRepo(str(repo.root)).snapshot(head).created == {"users/alice/models/chat.yaml": T3}


def test_approve_trailer_is_parsed_from_the_head_commit(repo: WorkRepo) -> None:
    repo.write("users/alice/models/chat.yaml", model(1))
    plain = repo.commit("add chat", T1)
    repo.remove("users/alice/models/chat.yaml")
    approved = repo.commit("remove everything\n\nWhy: moving clusters.\n\nArgus-Approve-Prune: yes", T2)
    mentioned = repo.commit("Argus-Approve-Prune: yes in the subject is not a trailer", T3)

    source = GitRepo(str(repo.root))
    assert source.snapshot(plain).approve_prune is False
    snap = source.snapshot(approved)
    assert snap.approve_prune is True
    assert snap.subject == "remove everything"
    assert source.snapshot(mentioned).approve_prune is False
    state = load(snap.files, approve_prune=snap.approve_prune)
    assert state.approve_prune is True


def test_incremental_snapshot_reads_and_parses_only_changed_blobs(repo: WorkRepo) -> None:
    for user in ("alice", "bob", "carol"):
        for name in ("a", "b", "c"):
            repo.write(f"users/{user}/models/{name}.yaml", model(1) + f"# {user} {name}\n")
    repo.write("cluster.yaml", "kind: Cluster\n")
    first = repo.commit("nine models", T1)
    repo.write("users/bob/models/b.yaml", model(2) + "# bob b\n")
    repo.write("users/dave/models/new.yaml", model(1))
    second = repo.commit("scale bob/b, add dave/new", T2)

    cache = ParseCache()
    source = CountingRepo(str(repo.root))
    snap = source.snapshot(first, cache)
    state = load(snap.files, created=snap.created, default_time=snap.commit_time, cache=cache)
    assert cache.parsed == 10 and state.object_count == 9
    assert len(source.requested) == 10

    source.requested = []
    snap = source.snapshot(second, cache)
    state = load(snap.files, created=snap.created, default_time=snap.commit_time, cache=cache)
    assert cache.parsed == 12  # only bob/b (changed) and dave/new (added) were parsed
    changed = {f.blob for f in snap.files if f.path in ("users/bob/models/b.yaml", "users/dave/models/new.yaml")}
    assert set(source.requested) == changed  # ... and only their blobs were read from git
    assert state.models[ObjectKey("bob", "model", "b")].replicas == 2
    assert snap.created["users/dave/models/new.yaml"] == T2
    assert snap.created["users/alice/models/a.yaml"] == T1
    # The incrementally kept created map equals a fresh walk of the history.
    assert snap.created == GitRepo(str(repo.root)).created_times(second)

    # Re-reading a commit already seen parses nothing at all.
    load(source.snapshot(second, cache).files, cache=cache)
    assert cache.parsed == 12


def test_created_times_recomputed_after_a_force_push(repo: WorkRepo) -> None:
    repo.write("users/alice/models/chat.yaml", model(1))
    base = repo.commit("add chat", T1)
    repo.write("users/bob/models/coder.yaml", model(1))
    old_head = repo.commit("add coder", T2)
    source = GitRepo(str(repo.root))
    assert source.snapshot(old_head).created["users/bob/models/coder.yaml"] == T2
    repo.git("reset", "-q", "--hard", base)
    repo.write("users/bob/models/coder.yaml", model(2))
    new_head = repo.commit("add coder (rewritten)", T3)
    assert source.snapshot(new_head).created == {"users/alice/models/chat.yaml": T1, "users/bob/models/coder.yaml": T3}


def test_prefix_reads_a_sub_folder(repo: WorkRepo) -> None:
    repo.write("infra/argus/cluster.yaml", "kind: Cluster\n")
    repo.write("infra/argus/users/alice/models/chat.yaml", model(1))
    repo.write("users/mallory/models/outside.yaml", model(1))
    head = repo.commit("config in a sub-folder", T1)
    snap = GitRepo(str(repo.root), prefix="infra/argus/").snapshot(head)
    assert sorted(f.path for f in snap.files) == ["cluster.yaml", "users/alice/models/chat.yaml"]
    assert snap.created == {"cluster.yaml": T1, "users/alice/models/chat.yaml": T1}


def test_committed_symlink_is_flagged_and_rejected(repo: WorkRepo) -> None:
    repo.write("users/alice/models/chat.yaml", model(1))
    (repo.root / "users/alice/models/link.yaml").symlink_to("/etc/passwd")
    head = repo.commit("a symlink", T1)
    snap = GitRepo(str(repo.root)).snapshot(head)
    link = by_path(snap.files)["users/alice/models/link.yaml"]
    assert link.symlink and link.content is None
    state = load(snap.files)
    assert [str(i) for i in state.issues] == [
        "users/alice/models/link.yaml: symlinks are not allowed in the config repository"
    ]
    assert ObjectKey("alice", "model", "chat") in state.models


def test_submodule_entry_is_rejected_without_breaking_the_read(repo: WorkRepo) -> None:
    repo.write("users/alice/models/chat.yaml", model(1))
    repo.commit("chat", T1)
    # A gitlink (mode 160000) where a file should be: it names a commit of another repository,
    # which this one does not have (`git cat-file` answers "missing").
    repo.git("update-index", "--add", "--cacheinfo", f"160000,{'ab' * 20},users/alice/models/sub.yaml")
    repo.git("commit", "-q", "-m", "a submodule", when=T2)
    snap = GitRepo(str(repo.root)).snapshot(repo.git("rev-parse", "HEAD"))
    state = load(snap.files)
    assert [str(i) for i in state.issues] == ["users/alice/models/sub.yaml: not a regular file"]
    assert ObjectKey("alice", "model", "chat") in state.models
