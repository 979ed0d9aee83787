"""A long-lived GitRepo and loader give what a fresh one gives, after any sequence of pushes.

The daemon keeps one :class:`~reconciler.source.git.GitRepo` (whose snapshot after a push looks
only at the paths ``diff-tree`` says changed) and one
:class:`~reconciler.spec.incremental.IncrementalLoader`. Here a real repository receives random
commits (files added, changed, deleted, turned into symlinks, cluster.yaml edits) and history
rewrites (the branch reset to an older commit, then new commits on it: the old tip is no longer
an ancestor), with the blob cache sometimes so small that it is cleared while reading. After
each commit both paths read the same commit: the long-lived one and a fresh repository object
with a fresh full load (a restarted daemon). Their files and desired states must be equal.
"""

from __future__ import annotations

import os

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from reconciler.source import git as git_module
from reconciler.source.git import GitRepo
from reconciler.spec.incremental import IncrementalLoader
from reconciler.spec.loader import ParseCache, load
from tests.unit.gitrepo import WorkRepo

PATHS = [
    "users/alice/models/m1.yaml",
    "users/alice/models/m2.yaml",
    "users/alice/tasks/t1.yaml",
    "users/bob/models/m1.yaml",
    "users/bob/tasks/t1.yaml",
    "users/bob/notes.txt",
]
MODEL = {"kind": "Model", "source": "$HOME/models/m"}
TASK = {"kind": "Task", "workload": "command", "command": "true"}
CLUSTER = {"kind": "Cluster", "paths": {"common": "/hf", "users": "/home"}}

op = st.one_of(
    st.tuples(st.just("write"), st.sampled_from(PATHS), st.integers(1, 3)),
    st.tuples(st.just("remove"), st.sampled_from(PATHS), st.just(0)),
    st.tuples(st.just("symlink"), st.sampled_from(PATHS), st.just(0)),
    st.tuples(st.just("cluster"), st.just("cluster.yaml"), st.integers(0, 2)),
    st.tuples(st.just("rewrite"), st.just(""), st.integers(0, 5)),
)


def _apply(repo: WorkRepo, kind: str, path: str, n: int, history: list[str]) -> None:
    target = repo.root / path
    if kind in ("remove", "symlink", "write") and (target.exists() or target.is_symlink()):
        target.unlink()
    if kind == "write":
        doc = dict(MODEL if "/models/" in path else TASK)
        doc["replicas" if "/models/" in path else "run"] = n
        repo.write(path, yaml.safe_dump(doc))
    elif kind == "symlink":
        target.parent.mkdir(parents=True, exist_ok=True)
        os.symlink("/etc/passwd", target)
    elif kind == "cluster":
        repo.write("cluster.yaml", yaml.safe_dump({**CLUSTER, "users": {"alice": {}}} if n == 1 else CLUSTER))
    elif kind == "rewrite":
        repo.git("reset", "-q", "--hard", history[n % len(history)])


@pytest.mark.parametrize("small_blob_cache", [False, True])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pushes=st.lists(st.lists(op, min_size=1, max_size=4), min_size=1, max_size=6))
# A new file whose blob the cache held, read beside a blob that made the cache clear: its content
# must be taken before the read (it was lost, and the file loaded as "not a regular file").
@example(pushes=[[("write", PATHS[0], 1)], [("write", PATHS[0], 2), ("write", PATHS[1], 1)]])
def test_a_long_lived_snapshot_and_load_equal_a_fresh_one(
    pushes: list[list[tuple[str, str, int]]], small_blob_cache: bool, tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = tmp_path_factory.mktemp("repo")
    repo = WorkRepo(root)
    repo.write("cluster.yaml", yaml.safe_dump(CLUSTER))
    repo.write(PATHS[0], yaml.safe_dump(MODEL))
    history = [repo.commit("first", when=1767225600)]
    saved = git_module.BLOB_CACHE_BYTES
    git_module.BLOB_CACHE_BYTES = 150 if small_blob_cache else saved
    try:
        lived, cache = GitRepo(str(root)), ParseCache()
        loader = IncrementalLoader(cache)
        fed = IncrementalLoader()  # told by the snapshot which paths changed, as the daemon's reader
        before: dict[str, tuple[object, ...]] = {}
        for i, ops in enumerate([[], *pushes]):
            for kind, path, n in ops:
                _apply(repo, kind, path, n, history)
            history.append(repo.commit(f"push {i}", when=1767225600 + 60 * (i + 1)))
            commit = history[-1]
            snap = lived.snapshot(commit, cache)
            fresh = GitRepo(str(root)).snapshot(commit, ParseCache())
            seen = [(f.path, f.blob, f.symlink, f.size) for f in snap.files]
            assert seen == [(f.path, f.blob, f.symlink, f.size) for f in fresh.files]
            assert snap.created == fresh.created
            kw = dict(created=snap.created, default_time=snap.commit_time, revision=commit)
            want = load(fresh.files, **kw)  # type: ignore[arg-type]
            assert loader.load(snap.files, **kw) == want  # type: ignore[arg-type]
            now = {f.path: (f.blob, f.symlink, f.size, snap.created.get(f.path)) for f in snap.files}
            if snap.changed is not None:  # what it says changed covers every difference
                assert snap.since == history[-2]
                assert {p for p in now.keys() | before.keys() if now.get(p) != before.get(p)} <= snap.changed
            before = now
            changed = (snap.since, snap.changed) if snap.since is not None and snap.changed is not None else None
            assert fed.load(snap.files, changed=changed, **kw) == want  # type: ignore[arg-type]
            # A timer tick reads the same commit again: a feed that names nothing.
            again = lived.snapshot(commit, cache)
            assert [f.blob for f in again.files] == [f.blob for f in fresh.files]
            if not small_blob_cache:
                assert (again.since, again.changed) == (commit, frozenset())
            changed = (again.since, again.changed) if again.since is not None and again.changed is not None else None
            assert fed.load(again.files, changed=changed, **kw) == want  # type: ignore[arg-type]
    finally:
        git_module.BLOB_CACHE_BYTES = saved
