"""Hostile file names and sizes in real git repositories: reported, never parsed, never a crash.

Names a work tree can hardly hold (newlines, control characters, bytes that are not UTF-8) are
committed with git plumbing (``update-index -z --index-info``, ``write-tree``, ``commit-tree``);
a 400 MB blob is written as a loose object streamed through zlib, so it costs a few hundred KB of
disk and no memory here.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

from reconciler.errors import Issue
from reconciler.plan.actual import ActualState
from reconciler.plan.planner import plan
from reconciler.source.directory import created_times, read_directory
from reconciler.source.git import GitRepo
from reconciler.source.remote import open_source
from reconciler.spec.loader import NAME_RE, USER_RE, ParseCache, load, shown_path
from reconciler.spec.types import ObjectKey
from reconciler.spec.yamldoc import MAX_BYTES
from tests.unit.gitrepo import GIT_ENV, WorkRepo

ROOT = Path(__file__).resolve().parents[2]
T1, T2 = 1767225600, 1767312000
MODEL = b"kind: Model\nsource: Qwen/Qwen2.5-0.5B-Instruct\n"
TASK = b"kind: Task\nworkload: grpo\nmodel: Qwen/Qwen2.5-0.5B-Instruct\ndata:\n  train: $HOME/data/train.parquet\n"
GOOD = {
    b"cluster.yaml": b"kind: Cluster\n",
    b"users/alice/models/chat.yaml": MODEL,
    b"users/alice/tasks/train.yaml": TASK,
    b"users/eve/models/good.yaml": MODEL,
}
GOOD_KEYS = {
    ObjectKey("alice", "model", "chat"),
    ObjectKey("alice", "task", "train"),
    ObjectKey("eve", "model", "good"),
}
# Each a file name no object may have; several imitate what git prints around names (records,
# commit times, NULs are impossible) or what a line-based parser splits on.
HOSTILE = [
    b"users/eve/models/\x01evil\n1767225600\n.yaml",
    b"users/eve/models/chat\n.yaml",  # `$` in a regex matches before a final newline
    b"users/eve/models/caf\xe9.yaml",  # Latin-1, not UTF-8
    b"users/eve/models/caf\xe8.yaml",  # another one: must not collide with the first
    b"users/eve\n/models/x.yaml",
    b"users/eve/models/a b.yaml",
    b"users/eve/models/UPPER.yaml",
    b"users/eve/models/tab\tname.yaml",
    b"users/eve/models/\xe2\x80\xaeevil.yaml",  # U+202E, right-to-left override
    b"users/eve/models/back\\slash.yaml",
    b"users/eve/models/:000000 100644 0000 A.yaml",
    b"users/eve/tasks/1767225600",
    b"users/\n:000000 100644 A/models/x.yaml",
    b"users/eve/models/\r.yaml",
]


def hostile_files(paths: list[bytes]) -> dict[bytes, bytes]:
    """A valid model under each path, each with its own blob (so that reading one would show)."""
    return {p: MODEL + b"# %d\n" % i for i, p in enumerate(paths)}


def git(repo: Path, *args: str, input: bytes | None = None, env: Mapping[str, str] | None = None) -> bytes:
    full = {**os.environ, **GIT_ENV, **(env or {})}
    return subprocess.run(
        ["git", "-C", str(repo), *args], input=input, env=full, capture_output=True, check=True
    ).stdout


def hash_blob(repo: Path, content: bytes) -> str:
    return git(repo, "hash-object", "-w", "--stdin", input=content).decode().strip()


def commit(repo: Path, files: Mapping[bytes, bytes | str], when: int, parent: str | None = None) -> str:
    """Commit exactly ``files`` (path bytes -> content, or a blob id as str) with plumbing; return the id."""
    index = repo / ".git" / "hostile-index"
    index.unlink(missing_ok=True)
    env = {"GIT_INDEX_FILE": str(index)}
    records = []
    for path, content in files.items():
        blob = content if isinstance(content, str) else hash_blob(repo, content)
        records.append(b"100644 " + blob.encode() + b"\t" + path + b"\0")
    git(repo, "update-index", "--add", "-z", "--index-info", input=b"".join(records), env=env)
    tree = git(repo, "write-tree", env=env).decode().strip()
    stamp = {"GIT_AUTHOR_DATE": f"{when} +0000", "GIT_COMMITTER_DATE": f"{when} +0000"}
    out = git(repo, "commit-tree", tree, "-m", "hostile", *(["-p", parent] if parent else []), env=stamp)
    head = out.decode().strip()
    git(repo, "update-ref", "refs/heads/main", head)
    return head


def new_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    return path


def decoded(path: bytes) -> str:
    return path.decode("utf-8", "surrogateescape")


class CountingRepo(GitRepo):
    """A GitRepo that records which blobs it asked git for."""

    requested: list[str]

    def _read_blobs(self, blobs: Iterable[str]) -> dict[str, bytes]:
        wanted = list(blobs)
        self.requested = [*getattr(self, "requested", []), *wanted]
        return super()._read_blobs(wanted)


def assert_reported_once_each(issues: list[Issue], paths: Iterable[bytes]) -> None:
    for path in paths:
        shown = shown_path(decoded(path))
        mine = [i for i in issues if i.path == shown]
        assert len(mine) == 1, (path, [str(i) for i in issues])
    for issue in issues:
        assert str(issue).isprintable(), repr(str(issue))


def test_hostile_names_in_git_are_reported_and_never_read(tmp_path: Path) -> None:
    repo = new_repo(tmp_path / "config")
    first = commit(repo, {**GOOD, **hostile_files(HOSTILE)}, T1)
    source = CountingRepo(str(repo))
    cache = ParseCache()
    snap = source.snapshot(first, cache)
    state = load(snap.files, created=snap.created, default_time=T2, cache=cache)

    assert set(state.models) | set(state.tasks) == GOOD_KEYS, state.issues
    assert_reported_once_each(state.issues, HOSTILE)
    assert len(state.issues) == len(HOSTILE)
    for key in (*state.models, *state.tasks, *state.invalid):
        assert USER_RE.fullmatch(key.user) and NAME_RE.fullmatch(key.name), key
    # The good files' names come from the right commit; every hostile name is one distinct path.
    assert snap.created["users/eve/models/good.yaml"] == T1
    assert {decoded(p) for p in HOSTILE} <= set(snap.created)
    # Never parsed further: not even read (the good files and cluster.yaml are all that was read).
    assert set(source.requested) == {hash_blob(repo, c) for c in GOOD.values()}
    # Shown escaped: one line each, the odd bytes visible.
    shown = {i.path for i in state.issues}
    assert "users/eve/models/\\x01evil\\n1767225600\\n.yaml" in shown
    assert "users/eve/models/caf\\xe9.yaml" in shown
    assert "users/eve/models/\\u202eevil.yaml" in shown
    assert "users/eve/models/back\\\\slash.yaml" in shown
    assert "users/eve/models/a b.yaml" in shown  # printable: shown as it is
    # The plan holds nothing of them and keeps the good objects.
    # (`tasks/1767225600` has no extension but a valid stem: it holds that task, which runs nowhere.)
    result = plan(state, ActualState())
    assert {a.key for a in result.actions if a.type.value != "keep"} == GOOD_KEYS
    assert {a.key for a in result.actions if a.type.value == "keep"} == {ObjectKey("eve", "task", "1767225600")}

    # The next commit is read incrementally (diff-tree) and the history walk resumes: same result.
    more = [b"users/eve/models/\x7f.yaml", b"users/eve/tasks/nul\x1b[31m.yaml"]
    second = commit(repo, {**GOOD, **hostile_files(HOSTILE + more), b"users/eve/models/late.yaml": MODEL}, T2, first)
    snap2 = source.snapshot(second, cache)
    state2 = load(snap2.files, created=snap2.created, default_time=T2, cache=cache)
    assert GOOD_KEYS | {ObjectKey("eve", "model", "late")} == set(state2.models) | set(state2.tasks)
    assert_reported_once_each(state2.issues, HOSTILE + more)
    assert snap2.created["users/eve/models/late.yaml"] == T2
    assert snap2.created["users/eve/models/good.yaml"] == T1
    assert snap2.created == GitRepo(str(repo)).created_times(second)  # incremental == from scratch


def test_validate_and_plan_a_work_tree_with_hostile_names(tmp_path: Path) -> None:
    """``argus validate`` / ``argus plan`` on a checkout of such a repository: exit 1, one escaped line
    per bad name, no traceback (output that is not UTF-8 would raise UnicodeEncodeError)."""
    repo = new_repo(tmp_path / "config")
    commit(repo, {**GOOD, **hostile_files(HOSTILE)}, T1)
    git(repo, "checkout", "-q", "-f", "main")
    assert (repo / decoded(b"users/eve/models/caf\xe9.yaml")).exists()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONIOENCODING": "utf-8"}
    for command in (["validate"], ["plan"]):
        proc = subprocess.run(
            [sys.executable, "-m", "reconciler.cli", *command, str(repo), "--offline"],
            capture_output=True,
            env=env,
            timeout=120,
            check=False,
        )
        err = proc.stderr.decode("utf-8")  # strict: valid UTF-8
        assert proc.returncode == 1, err
        assert "Traceback" not in err
        lines = [line for line in err.splitlines() if line.startswith("users/")]
        assert len(lines) == len(HOSTILE), err
        for path in HOSTILE:
            assert sum(line.startswith(shown_path(decoded(path)) + ": ") for line in lines) == 1, (path, err)
    # The same repository read as a directory by the library: same issues as from git.
    created, now = created_times(str(repo))
    state = load(read_directory(str(repo)), created=created, default_time=now)
    assert set(state.models) | set(state.tasks) == GOOD_KEYS
    assert_reported_once_each(state.issues, HOSTILE)


# --- size before content -----------------------------------------------------------------------

HUGE = 400 * 1024 * 1024


def write_zero_blob(repo: Path, size: int) -> str:
    """Write a blob of ``size`` zero bytes as a loose object, streamed (no ``size`` bytes in memory)."""
    header = b"blob %d\0" % size
    sha, packer = hashlib.sha1(header), zlib.compressobj(1)
    chunk = bytes(1 << 20)
    tmp = repo / ".git" / "objects" / "tmp-zero"
    with open(tmp, "wb") as out:
        out.write(packer.compress(header))
        left = size
        while left:
            piece = chunk[: min(left, len(chunk))]
            sha.update(piece)
            out.write(packer.compress(piece))
            left -= len(piece)
        out.write(packer.flush())
    digest = sha.hexdigest()
    target = repo / ".git" / "objects" / digest[:2] / digest[2:]
    target.parent.mkdir(exist_ok=True)
    tmp.rename(target)
    assert git(repo, "cat-file", "-s", digest).decode().strip() == str(size)
    return digest


PEAK_PROBE = textwrap.dedent(
    """
    import json, sys
    from reconciler.source.directory import read_directory
    from reconciler.source.git import GitRepo
    from reconciler.spec.loader import load
    repo, commit, folder = sys.argv[1:4]
    issues = []
    if commit:
        snap = GitRepo(repo).snapshot(commit)
        issues += [str(i) for i in load(snap.files).issues]
    if folder:
        issues += [str(i) for i in load(read_directory(folder)).issues]
    with open("/proc/self/status") as fh:
        peak = next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:"))
    print(json.dumps({"issues": issues, "peak_kib": peak}))
    """
)


def probe(repo: Path, commit_id: str, folder: Path | None) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-c", PEAK_PROBE, str(repo), commit_id, str(folder or "")]
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300, check=True)
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


@pytest.mark.skipif(
    not Path("/proc/self/status").exists() and not os.environ.get("CI"), reason="reads VmHWM from /proc (Linux)"
)
def test_a_400_mb_file_is_refused_from_its_size_alone(tmp_path: Path) -> None:
    repo = new_repo(tmp_path / "config")
    huge = write_zero_blob(repo, HUGE)
    files = {**GOOD, b"users/eve/models/huge.yaml": huge, b"users/eve/tasks/huge.yaml": huge}
    head = commit(repo, files, T1)
    expected = f"file is {HUGE} bytes; the limit is {MAX_BYTES} (256 KiB)"

    source = CountingRepo(str(repo))
    state = load(source.snapshot(head).files)
    assert huge not in source.requested  # `cat-file --batch` was never asked for it
    assert [str(i) for i in state.issues] == [
        f"users/eve/models/huge.yaml: {expected}",
        f"users/eve/tasks/huge.yaml: {expected}",
    ]
    assert set(state.models) | set(state.tasks) == GOOD_KEYS
    assert {ObjectKey("eve", "model", "huge"), ObjectKey("eve", "task", "huge")} <= set(state.invalid)

    # The same in a directory (`argus validate DIR`): a sparse 400 MB file, never read.
    folder = tmp_path / "dir"
    (folder / "users/eve/models").mkdir(parents=True)
    with open(folder / "users/eve/models/huge.yaml", "wb") as fh:
        fh.truncate(HUGE)
    # Peak RSS of a fresh process that reads both: what Python and the imports take, not 400 MB.
    baseline = probe(repo, "", None)["peak_kib"]
    found = probe(repo, head, folder)
    assert found["issues"] == [
        f"users/eve/models/huge.yaml: {expected}",
        f"users/eve/tasks/huge.yaml: {expected}",
        f"users/eve/models/huge.yaml: {expected}",
    ]
    assert isinstance(baseline, int) and isinstance(found["peak_kib"], int)
    assert found["peak_kib"] - baseline < 30 * 1024, (baseline, found["peak_kib"])


def test_parse_cache_is_bounded_in_bytes() -> None:
    """Files that do not fit the budget are parsed again instead of held; the rest are cached."""
    from reconciler.spec.loader import SourceFile

    filler = b"# " + b"x" * 50_000 + b"\n"
    files = [
        SourceFile(f"users/eve/models/m{i}.yaml", MODEL + filler, hashlib.sha1(MODEL + filler + bytes([i])).hexdigest())
        for i in range(40)
    ]
    cache = ParseCache(max_bytes=1_000_000)
    state = load(files, cache=cache)
    assert len(state.models) == 40
    assert cache.bytes <= cache.max_bytes
    held = len(cache.entries) + len(cache.built)  # parsed documents and built objects share the budget
    assert 15 <= held <= 20, held  # about 1 MB / 50 KB
    parsed = cache.parsed
    load(files, cache=cache)
    assert cache.parsed - parsed == 40 - len(cache.entries)  # only the ones not held are parsed again


def test_a_merge_adding_many_files_is_read(tmp_path: Path) -> None:
    """A merge that adds 50,000 files: their creation times are read without passing every path on
    git's command line (about 2.5 MB of names: `Argument list too long`)."""
    repo = new_repo(tmp_path / "config")
    base = commit(repo, GOOD, T1)
    blob = hash_blob(repo, MODEL)
    many = {b"users/mallory/models/m-%06d-%s.yaml" % (i, b"x" * 30): blob for i in range(50_000)}
    side = commit(repo, {**GOOD, **many}, T2, base)
    head = git(repo, "commit-tree", side + "^{tree}", "-p", base, "-p", side, "-m", "merge").decode().strip()
    created = GitRepo(str(repo)).created_times(head)
    assert len(created) == len(GOOD) + len(many)
    assert created["users/alice/models/chat.yaml"] == T1
    assert created[decoded(next(iter(many)))] == T2


def test_branches_named_in_any_bytes_or_renamed_into_folders_never_hold_back_a_fetch(tmp_path: Path) -> None:
    """Anyone who may push a branch can name it in bytes that are not UTF-8, or rename ``a`` to
    ``a/b`` in one push. The daemon's mirror of the branches must still take every push to the
    config branch: each name is kept exactly (two names never collapse into one), and a ref that
    cannot be stored beside another is no reason to keep back the rest."""
    bare = tmp_path / "config.git"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(bare)], check=True)
    work = WorkRepo(tmp_path / "work")
    work.write("cluster.yaml", "kind: Cluster\n")
    first = work.commit("first", 1767225600)
    subprocess.run(["git", "-C", str(work.root), "push", "-q", str(bare), "HEAD:refs/heads/main"], check=True)
    source = open_source(bare.as_uri(), str(tmp_path / "cache"))  # a URL: mirrored, as a remote is
    assert not source.local
    for name in (b"a", b"x\xff", b"x\xfe/b"):  # decoded with "replace", the last two would clash
        subprocess.run(
            [b"git", b"-C", os.fsencode(bare), b"update-ref", b"refs/heads/" + name, first.encode()], check=True
        )
    source.fetch()
    mirror = source.repo.path

    def refs() -> set[bytes]:
        out = subprocess.run(
            ["git", "-C", mirror, "for-each-ref", "--format=%(refname)", "refs/heads/"], capture_output=True, check=True
        )
        return set(out.stdout.split())

    assert refs() >= {b"refs/heads/main", b"refs/heads/a", b"refs/heads/x\xff", b"refs/heads/x\xfe/b"}
    subprocess.run(["git", "-C", str(bare), "update-ref", "-d", "refs/heads/a"], check=True)
    subprocess.run(["git", "-C", str(bare), "update-ref", "refs/heads/a/b", first], check=True)  # a renamed to a/b
    work.write("users/alice/models/chat.yaml", "kind: Model\nsource: Qwen/Qwen2.5-0.5B-Instruct\n")
    second = work.commit("second", 1767312000)
    subprocess.run(["git", "-C", str(work.root), "push", "-q", str(bare), "HEAD:refs/heads/main"], check=True)
    source.fetch()
    assert source.repo.resolve("refs/heads/main") == second
    assert b"refs/heads/a/b" in refs() and b"refs/heads/a" not in refs()  # deleted first, then created
    # Branches named like folders above or below the status branch are never mirrored (they could
    # not be stored beside it), and no fetch fails for them.
    git_status = subprocess.run(["git", "-C", mirror, "update-ref", "refs/heads/argus/status", first], check=True)
    assert git_status.returncode == 0
    for name in ("argus/status/x1", "argus/status/x2"):
        subprocess.run(["git", "-C", str(bare), "update-ref", f"refs/heads/{name}", first], check=True)
    source.fetch()
    assert b"refs/heads/argus/status" in refs() and not any(r.startswith(b"refs/heads/argus/status/") for r in refs())
