"""The status store (reconciler/status/store.py), the one reader of the status branch, on real git:
reads at a commit, the writer's own commits are never read back, bounds, a broken tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler import git
from reconciler.errors import GitError
from reconciler.plan.actions import Plan
from reconciler.plan.assess import ObjectStatus
from reconciler.source.remote import open_source
from reconciler.spec.types import ObjectKey
from reconciler.status import store as store_module
from reconciler.status.store import StatusSnapshot, StatusStore
from reconciler.status.writer import StatusReport, StatusWriter
from reconciler.testing.status_branch import commit_files, dump, model_doc, task_doc

BRANCH = "argus/status"
AUTHOR = {"GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@x", "GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@x"}
A = "users/alice/models/chat.yaml"
B = "users/bob/tasks/train.yaml"


@pytest.fixture
def repo(tmp_path: Path) -> str:
    path = str(tmp_path / "config.git")
    git.run(None, "init", "-q", "--bare", "-b", "main", path)
    return path


def test_documents_at_a_commit_read_only_what_differs(repo: str) -> None:
    first = commit_files(repo, {A: dump(model_doc("alice", "chat")), B: dump(task_doc("bob", "train"))})
    second = commit_files(repo, {B: dump(task_doc("bob", "train", "FAILED"))})
    store = StatusStore(repo, BRANCH)
    assert store.documents()[B]["state"] == "FAILED" and store.blobs_read == 2
    old = store.documents(first)  # an older commit: only bob's file differs
    assert old[B]["state"] == "SUCCEEDED" and old[A]["state"] == "RUNNING" and store.blobs_read == 3
    assert store.read(second).tip == second and store.blobs_read == 4
    assert dict(store.read(second).blobs) == {p: git.text(repo, "rev-parse", f"{second}:{p}") for p in (A, B)}


def test_a_one_off_store_holds_one_commit_only(repo: str) -> None:
    """Bounded: after a document is deleted the store holds nothing of it (files of one tip)."""
    commit_files(repo, {A: dump(model_doc("alice", "chat")), B: dump(task_doc("bob", "train"))})
    store = StatusStore(repo, BRANCH)
    store.documents()
    commit_files(repo, {B: None})
    assert list(store.documents()) == [A]
    assert set(store._files) == {A} and set(store.read().blobs) == {A}


def _report(revision: str, state: str) -> StatusReport:
    key = ObjectKey("alice", "model", "chat")
    st = ObjectStatus(key, state, "Synced", served_name="alice-chat", replicas_desired=1, replicas_ready=1)
    return StatusReport(revision, {key: st}, {key}, set(), Plan(), [], spec_ids={key.path: "blob-1"}, actual={})


def test_the_writer_never_reads_its_own_commits_back(tmp_path: Path, repo: str) -> None:
    work = tmp_path / "work"
    git.run(None, "clone", "-q", repo, str(work))
    (work / "README.md").write_text("config\n")
    git.run(str(work), "add", "-A")
    git.run(str(work), "commit", "-q", "-m", "init", env=AUTHOR)
    git.run(str(work), "push", "-q", "origin", "HEAD:main")
    sha = git.text(str(work), "rev-parse", "HEAD")
    writer = StatusWriter(open_source(repo, str(tmp_path / "cache")))
    for state in ("DEPLOYING", "RUNNING", "FAILED"):
        assert writer.write(_report(sha, state)) is not None
        assert writer.documents()[A]["state"] == state
    store = writer._store
    assert store.blobs_read == 0, "the writer's commits are handed to the store, not re-read"
    # What the store holds is what the branch holds: a fresh reader agrees, document for document.
    fresh = StatusStore(repo, BRANCH)
    assert dict(fresh.documents()) == dict(store.documents(writer._tip))
    assert dict(fresh.read().blobs) == dict(store.read(writer._tip).blobs)
    assert fresh.read().root["revision.yaml"] == store.read(writer._tip).root["revision.yaml"]
    # Someone else moves the branch: the writer's store reads only what that commit changed.
    commit_files(repo, {B: dump(task_doc("bob", "train"))})
    assert B in writer.documents() and store.blobs_read == 1


def test_a_file_over_the_limit_is_not_read(repo: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pusher's huge file on the branch the page reads is skipped, never held in memory."""
    monkeypatch.setattr(store_module, "MAX_FILE_BYTES", 4096)
    commit_files(repo, {A: dump(model_doc("alice", "chat")), B: dump(task_doc("bob", "train", reason="x" * 8192))})
    store = StatusStore(repo, BRANCH)
    assert list(store.documents()) == [A]


def test_a_tree_that_names_a_missing_blob_is_an_error_not_an_empty_branch(repo: str) -> None:
    """The writer builds on what it reads: a broken commit must not read as "no records" (reruns)."""
    missing = "1" * 40
    inner = git.run(repo, "mktree", "--missing", input=f"100644 blob {missing}\tchat.yaml\n".encode()).decode().strip()
    models = git.run(repo, "mktree", input=f"040000 tree {inner}\tmodels\n".encode()).decode().strip()
    alice = git.run(repo, "mktree", input=f"040000 tree {models}\talice\n".encode()).decode().strip()
    root = git.run(repo, "mktree", input=f"040000 tree {alice}\tusers\n".encode()).decode().strip()
    commit = git.run(repo, "commit-tree", root, "-m", "broken", env=AUTHOR).decode().strip()
    git.run(repo, "update-ref", f"refs/heads/{BRANCH}", commit)
    store = StatusStore(repo, BRANCH)
    with pytest.raises(GitError, match="missing"):
        store.documents()
    snap = store.snapshot()  # the page: never raises, says why
    assert snap.error is not None and "missing" in snap.error and not snap.docs


def test_a_name_that_is_not_utf8_is_never_served(repo: str) -> None:
    data = dump(model_doc("alice", "chat"))
    blob = git.run(repo, "hash-object", "-w", "--stdin", input=data).decode().strip()
    index = {"GIT_INDEX_FILE": str(Path(repo) / "tmp-index")}
    for path in (A.encode(), b"users/alice/models/ch\xffat.yaml"):
        entry = b"100644 " + blob.encode() + b"\t" + path + b"\n"
        git.run(repo, "update-index", "--add", "--index-info", input=entry, env=index)
    tree = git.run(repo, "write-tree", env=index).decode().strip()
    commit = git.run(repo, "commit-tree", tree, "-m", "odd", env=AUTHOR).decode().strip()
    git.run(repo, "update-ref", f"refs/heads/{BRANCH}", commit)
    store = StatusStore(repo, BRANCH)
    assert list(store.documents()) == [A]
    assert len(store.read().blobs) == 2  # held (the writer writes back exactly what it read)


def _differs(old: StatusSnapshot, new: StatusSnapshot) -> frozenset[str]:
    """The paths whose file two full reads show different (added, changed or removed)."""
    return frozenset(p for p in old.blobs.keys() | new.blobs.keys() if old.blobs.get(p) != new.blobs.get(p))


def _fresh(repo: str, commit: str) -> StatusSnapshot:
    return StatusStore(repo, BRANCH).read(commit)


def test_a_snapshot_names_the_paths_that_changed_since_the_one_before(repo: str) -> None:
    """What a consumer following the store touches (O(changed)) is what full re-reads show changed:
    a change, an addition, a deletion, a root file, an older commit, a forced push, a pruned tip."""
    C = "users/carol/models/x.yaml"
    first = commit_files(repo, {A: dump(model_doc("alice", "chat")), B: dump(task_doc("bob", "train"))})
    store = StatusStore(repo, BRANCH)
    one = store.read()
    assert (one.since, one.changed) == (None, None)  # read in full: no change feed
    commit_files(repo, {A: dump(model_doc("alice", "chat", "FAILED")), B: None, C: dump(model_doc("carol", "x"))})
    two = store.read()
    assert two.since == first and two.changed == _differs(_fresh(repo, first), _fresh(repo, two.tip or "")) == {A, B, C}
    commit_files(repo, {"README.md": b"# status\n", A: dump(model_doc("alice", "chat", "FAILED"))})  # A: same bytes
    three = store.read()
    assert three.since == two.tip and three.changed == {"README.md"} and three.root["README.md"] == "# status\n"
    assert two.root == {} and B not in two.blobs and C in two.docs, "an older snapshot is never changed"
    back = store.read(first)  # an older commit: the store moves back by the same diff
    assert back.since == three.tip and back.changed == _differs(three, _fresh(repo, first)) == {A, B, C, "README.md"}
    assert dict(back.docs) == dict(one.docs)
    store.read()
    # A forced push: a commit that does not descend from the tip; the old tip is still there to diff.
    old_tip = store.read().tip or ""
    git.run(repo, "update-ref", "-d", f"refs/heads/{BRANCH}")
    rewritten = commit_files(repo, {B: dump(task_doc("bob", "train", "QUEUED")), "actual.json": b"{}"})
    forced = store.read()
    assert forced.tip == rewritten and forced.since == old_tip
    assert (
        forced.changed
        == _differs(_fresh(repo, old_tip), _fresh(repo, rewritten))
        == {A, B, C, "README.md", "actual.json"}
    )
    assert dict(forced.docs) == dict(_fresh(repo, rewritten).docs) and dict(forced.root) == {"actual.json": {}}
    # Rewritten again, and the tip the store holds pruned: it cannot diff, it reads in full.
    git.run(repo, "update-ref", "-d", f"refs/heads/{BRANCH}")
    commit_files(repo, {A: dump(model_doc("alice", "chat"))})
    git.run(repo, "reflog", "expire", "--expire=now", "--all")
    git.run(repo, "gc", "-q", "--prune=now")
    assert git.probe(repo, "cat-file", "-e", rewritten).returncode != 0
    full = store.read()
    assert (full.since, full.changed) == (None, None) and list(full.docs) == [A]


def test_an_adopted_commit_names_the_paths_that_changed(repo: str) -> None:
    """adopt(): fed the paths (O(changed)) or comparing every file (its parent is not what the store
    holds), the snapshot names what a full re-read shows changed since the store's last one."""
    C = "users/carol/models/x.yaml"
    first = commit_files(repo, {A: dump(model_doc("alice", "chat")), B: dump(task_doc("bob", "train"))})
    second = commit_files(
        repo, {A: dump(model_doc("alice", "chat", "FAILED")), B: None, C: dump(model_doc("carol", "x"))}
    )
    third = commit_files(repo, {"README.md": b"# status\n", C: None})

    def blobs(commit: str) -> dict[str, str]:
        return dict(_fresh(repo, commit).blobs)

    store = StatusStore(repo, BRANCH)
    assert store.read(first).tip == first
    values = {A: model_doc("alice", "chat", "FAILED"), C: model_doc("carol", "x")}
    fed = store.adopt(second, blobs(second), values, parent=first, paths=[A, B, C])
    assert fed.since == first and fed.changed == _differs(_fresh(repo, first), _fresh(repo, second)) == {A, B, C}
    assert dict(fed.docs) == dict(_fresh(repo, second).docs) and store.blobs_read == 2
    # Its parent is not the commit the store holds (first, not second): every file is compared.
    store.read(first)
    compared = store.adopt(third, blobs(third), {"README.md": "# status\n"}, parent=second, paths=["README.md", C])
    assert compared.since == first and compared.changed == _differs(_fresh(repo, first), _fresh(repo, third))
    assert compared.changed == {A, B, "README.md"} and dict(compared.docs) == dict(_fresh(repo, third).docs)
    # A store that holds nothing yet: the adopted commit is all new, no change feed.
    empty = StatusStore(repo, BRANCH).adopt(second, blobs(second), values, parent=first, paths=[A, B, C])
    assert (empty.since, empty.changed) == (None, None) and dict(empty.docs) == dict(_fresh(repo, second).docs)
