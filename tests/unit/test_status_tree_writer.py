"""TreeWriter: each commit's tree holds exactly the files asked for, whatever commit the index
held before (two threads share it: the run records and the background status write, whose
commits land on each other's parents), and a warm index is never rebuilt with ``read-tree``."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconciler import git
from reconciler.errors import ConcurrentWrite
from reconciler.status import branch as branch_module
from reconciler.status.branch import TreeWriter, hash_blobs, tree_blobs

PATHS = ["README.md", "users/a/tasks/t.yaml", "users/a/models/m.yaml", "users/b/tasks/t.yaml", "x/y/z.yaml"]
edit = st.dictionaries(st.sampled_from(PATHS), st.one_of(st.none(), st.sampled_from([b"1", b"2", b"3"])), max_size=3)
commit_op = st.tuples(st.integers(0, 20), edit, st.booleans())  # (parent index, edits, name what changed)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(commit_op, min_size=1, max_size=8))
def test_every_commit_holds_its_files_and_a_warm_index_is_never_read_again(
    ops: list[tuple[int, dict[str, bytes | None], bool]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    repo = str(tmp_path_factory.mktemp("repo"))
    subprocess.run(["git", "init", "-q", "--bare", repo], check=True)
    writer = TreeWriter(repo)
    first = hash_blobs(repo, {"README.md": b"0", "users/a/tasks/t.yaml": b"0"})
    made = writer.commit("status", first, "first\n", None)
    assert made is not None
    history: list[tuple[str, dict[str, str]]] = [(made, first)]
    reads: list[tuple[str, ...]] = []
    real_run = git.run

    def counting(repo_: str | None, *args: str, **kw: object) -> bytes:
        if "read-tree" in args:
            reads.append(args)
        return real_run(repo_, *args, **kw)  # type: ignore[arg-type]

    git.run = counting  # type: ignore[assignment]
    try:
        for at, edits, name_changed in ops:
            parent, files = history[at % len(history)]
            blobs = dict(files)
            written = hash_blobs(repo, {p: c for p, c in edits.items() if c is not None})
            for path in edits:
                if edits[path] is None:
                    blobs.pop(path, None)
                else:
                    blobs[path] = written[path]
            tip = git.text(repo, "rev-parse", "refs/heads/status").strip()
            try:
                # The ref moves from wherever it is: a commit on an older parent is a lost race's.
                commit = writer.commit(
                    "status", blobs, "c\n", parent, files, expected=tip, changed=set(edits) if name_changed else None
                )
            except ConcurrentWrite:
                continue
            if commit is None:  # nothing changed: the parent holds it
                assert blobs == files
                continue
            assert tree_blobs(repo, commit) == blobs
            history.append((commit, blobs))
    finally:
        git.run = real_run  # type: ignore[assignment]
    assert reads == []  # the index followed every parent by the files that differ


def test_a_cold_index_reads_its_parent(tmp_path: Path) -> None:
    repo = str(tmp_path)
    subprocess.run(["git", "init", "-q", "--bare", repo], check=True)
    blobs = hash_blobs(repo, {"a.yaml": b"1", "b.yaml": b"2"})
    first = TreeWriter(repo).commit("status", blobs, "first\n", None)
    assert first is not None
    later = TreeWriter(repo)  # a restarted daemon: its index holds nothing yet
    more = {**blobs, **hash_blobs(repo, {"c.yaml": b"3"})}
    commit = later.commit("status", more, "more\n", first, blobs, changed={"c.yaml"})
    assert commit is not None and tree_blobs(repo, commit) == more


def test_two_indexes_on_one_repository_each_recover_from_the_other(tmp_path: Path) -> None:
    """Split indexes keep their shared part in the repository, and each write expires the others'
    (``splitIndex.sharedIndexExpire=now``): a warm index whose shared part is gone is read again."""
    repo = str(tmp_path)
    subprocess.run(["git", "init", "-q", "--bare", repo], check=True)
    files = hash_blobs(repo, {f"users/u/tasks/t{i}.yaml": str(i).encode() for i in range(40)})
    ours, theirs = TreeWriter(repo), TreeWriter(repo)
    tip = ours.commit("status", files, "first\n", None)
    for i, writer in enumerate([theirs, ours, theirs, ours]):
        assert tip is not None
        more = {**files, **hash_blobs(repo, {f"users/u/tasks/n{i}.yaml": b"x"})}
        tip = writer.commit("status", more, f"{i}\n", tip, files, changed=set(more) - set(files))
        assert tip is not None and tree_blobs(repo, tip) == more
        files = more


@pytest.mark.parametrize("pack_at", [3, 10_000])
def test_blobs_are_written_with_the_ids_git_gives_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pack_at: int
) -> None:
    """Many blobs at once go through fast-import's packs, a few through hash-object: same ids."""
    monkeypatch.setattr(branch_module, "PACK_AT", pack_at)
    repo = str(tmp_path)
    subprocess.run(["git", "init", "-q", "--bare", repo], check=True)
    contents = {f"users/u/tasks/t{i}.yaml": b"x\n" * i + b"\0\nend" * (i % 2) for i in range(8)}
    contents["README.md"] = b""
    ids = hash_blobs(repo, contents)
    assert set(ids) == set(contents)
    for path, data in contents.items():
        want = subprocess.run(["git", "hash-object", "--stdin"], input=data, capture_output=True, check=True)
        assert ids[path] == want.stdout.decode().strip()
        assert git.run(repo, "cat-file", "blob", ids[path]) == data
