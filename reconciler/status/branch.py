"""Write the status branch with git plumbing: one commit per change, never the work tree. I/O."""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from collections.abc import Collection, Iterable, Mapping
from typing import Any

import yaml

from reconciler import faults, git
from reconciler.errors import ConcurrentWrite, GitError
from reconciler.plan.moved import moved
from reconciler.status.auth import note_verifies, sign_commit_message, sign_note, split_trailer
from reconciler.status.documents import LOADER
from reconciler.status.store import StatusStore, decode_path, tip

# ``tip`` lives with the reader (reconciler.status.store); callers of this module keep it.
__all__ = [
    "AUTHOR",
    "SAME",
    "TreeWriter",
    "commit_tree",
    "hash_blobs",
    "read_documents",
    "read_file",
    "tip",
    "tree_blobs",
    "write_note",
]

SAME = "same as parent"  # TreeWriter.commit's default ``expected``: the ref is at the parent

AUTHOR = {
    "GIT_AUTHOR_NAME": "argus",
    "GIT_AUTHOR_EMAIL": "argus@localhost",
    "GIT_COMMITTER_NAME": "argus",
    "GIT_COMMITTER_EMAIL": "argus@localhost",
}
PACK_AT = 5_000  # blobs written at once from which hash_blobs writes packs, this many a pack
# The writer's index holds every status document (100,000 entries, ~10 MB at the largest scale
# measured) and each commit changes a few: split (git's split index), a commit rewrites only the
# small index of what changed, not the whole file (about 210 -> 105 ms of git per commit at
# 100,000 entries). The shared part lies in the repository's git folder, one per tree read: each
# one no index uses any more is removed when the next is written (the repository's index is the
# writer's alone; another index on it finds its shared part gone, and TreeWriter reads its tree
# again). Given as options, not GIT_CONFIG_* variables, which would replace a deployment's own.
SPLIT_INDEX = ("-c", "core.splitIndex=true", "-c", "splitIndex.sharedIndexExpire=now")


def read_documents(
    repo: str, branch: str, *, remote_too: bool | str = False, commit: str | None = None
) -> dict[str, dict[str, Any]]:
    """The object documents (path -> mapping, in path order) on ``branch`` (or at ``commit``), read
    once by a one-off :class:`~reconciler.status.store.StatusStore`; empty when the branch does not exist.
    Raises GitError when git cannot read them."""
    docs = StatusStore(repo, branch, remote_too=remote_too).documents(commit)
    return {path: dict(docs[path]) for path in sorted(docs)}


def hash_blobs(repo: str, contents: Mapping[str, bytes]) -> dict[str, str]:
    """Write ``contents`` as blobs in one git process; return path -> blob id. Many at once (a
    first status write, a ``cluster.yaml`` change) go into packs (:func:`_pack_blobs`)."""
    if not contents:
        return {}
    paths = sorted(contents)
    if len(paths) >= PACK_AT:
        return _pack_blobs(repo, paths, contents)
    with tempfile.TemporaryDirectory() as tmp:
        names = []
        for i, path in enumerate(paths):
            name = os.path.join(tmp, str(i))
            with open(name, "wb") as fh:
                fh.write(contents[path])
            names.append(name)
        out = git.run(
            repo, "hash-object", "-w", "--no-filters", "--stdin-paths", input=("\n".join(names) + "\n").encode()
        )
    return dict(zip(paths, out.decode().split(), strict=True))


def _pack_blobs(repo: str, paths: list[str], contents: Mapping[str, bytes]) -> dict[str, str]:
    """:func:`hash_blobs` through ``git fast-import``: one pack per :data:`PACK_AT` blobs instead
    of a temporary file and a loose object for each (100,000 documents: 4.8 s against 36.8 s, and
    no 100,000 files in the repository). The stream is sent a batch at a time, so it holds a batch's bytes twice."""
    out: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        marks = os.path.join(tmp, "marks")
        for start in range(0, len(paths), PACK_AT):
            batch = paths[start : start + PACK_AT]
            stream = bytearray()
            for mark, path in enumerate(batch, 1):
                data = contents[path]
                stream += b"blob\nmark :%d\ndata %d\n" % (mark, len(data))
                stream += data
                stream += b"\n"
            stream += b"done\n"
            git.run(repo, "fast-import", "--quiet", "--done", f"--export-marks={marks}", input=bytes(stream))
            with open(marks, encoding="ascii") as fh:
                ids = dict(line.split() for line in fh if line.strip())
            out.update((path, ids[f":{mark}"]) for mark, path in enumerate(batch, 1))
    return out


def tree_blobs(repo: str, commit: str) -> dict[str, str]:
    """path -> blob id of every file in ``commit``."""
    listing = git.run(repo, "ls-tree", "-r", "-z", commit).split(b"\0")
    return {decode_path(r.partition(b"\t")[2]): r.split()[2].decode() for r in listing if r}


def index_records(entries: Iterable[tuple[str, str | None]]) -> bytes:
    """``git update-index -z --index-info`` input for ``(path, blob id)`` pairs (None: remove the
    path). NUL-terminated, so a path may hold any byte: one decoded with ``surrogateescape`` (a name
    that is not UTF-8, on a branch someone else pushed) encodes back to git's bytes, and a newline
    in a name cannot end a record early."""
    return b"".join(
        (f"100644 {blob}\t" if blob is not None else f"0 {'0' * 40}\t").encode()
        + path.encode("utf-8", "surrogateescape")
        + b"\0"
        for path, blob in entries
    )


def commit_tree(repo: str, branch: str, blobs: Mapping[str, str], message: str, parent: str | None) -> str | None:
    """Make ``blobs`` (path -> blob id) the whole tree of ``branch`` in one commit on ``parent``.

    Returns the new commit, or None when the tree equals the parent's (no empty commits).
    The ref moves with compare-and-swap from ``parent``: a concurrent writer is never
    overwritten. Raises ConcurrentWrite when the ref is no longer at ``parent`` (the caller
    re-reads the branch and retries from the new tip).
    """
    with tempfile.TemporaryDirectory() as tmp:
        env = {**AUTHOR, "GIT_INDEX_FILE": os.path.join(tmp, "index")}
        records = index_records(sorted(blobs.items()))
        git.run(repo, "update-index", "-z", "--add", "--index-info", input=records, env=env)
        tree = git.run(repo, "write-tree", env=env).decode().strip()
        if parent is not None and git.text(repo, "rev-parse", f"{parent}^{{tree}}") == tree:
            return None
        args = ["commit-tree", tree, "-F", "-"] + (["-p", parent] if parent else [])
        commit = git.run(repo, *args, input=message.encode(), env=env).decode().strip()
    faults.point("status_commit")  # objects written, ref not yet moved
    _move(repo, branch, commit, parent)
    return commit


def _move(repo: str, branch: str, commit: str, expected: str | None) -> None:
    """``refs/heads/<branch>`` := ``commit`` if it is at ``expected`` (None: absent). Raises
    ConcurrentWrite when it is not."""
    moved = git.probe(repo, "update-ref", f"refs/heads/{branch}", commit, expected or "0" * 40)
    if moved.returncode != 0:
        why = moved.stderr.decode(errors="replace").strip()
        raise ConcurrentWrite(f"{branch} is no longer at {expected}: {why}")


class TreeWriter:
    """:func:`commit_tree` in O(changed files): keeps one index file that matches the last tree
    it wrote, so a commit updates only the entries that changed and ``write-tree`` rebuilds only
    the sub-trees they are in (git's cache-tree). At 10,000 files a one-file commit takes a few
    git calls on a small input instead of re-indexing every file. Thread-safe."""

    def __init__(self, repo: str, auth_key: bytes | None = None) -> None:
        self.repo = repo
        self.auth_key = auth_key  # signs every commit (reconciler.status.auth); None: unsigned
        self._dir = tempfile.mkdtemp(prefix="argus-index-")
        self._env = {**AUTHOR, "GIT_INDEX_FILE": os.path.join(self._dir, "index")}
        self._lock = threading.Lock()
        self._tree: str | None = None  # the tree the index holds
        self._blobs: dict[str, str] = {}  # and its files
        self._commit_tree: tuple[str, str] | None = None  # (commit, tree) of the last commit made
        self._warm: str | None = None  # see _write_tree

    def _git(self, *args: str, input: bytes | None = None) -> str:
        return git.run(self.repo, *SPLIT_INDEX, *args, input=input, env=self._env).decode().strip()

    def _write_tree(
        self,
        blobs: Mapping[str, str],
        parent: str | None,
        parent_tree: str | None,
        parent_blobs: Mapping[str, str] | None,
        changed: Collection[str] | None,
        *,
        cold: bool = False,
    ) -> None:
        """Make the index hold ``blobs`` and ``self._tree`` its tree (call under the lock).
        ``self._warm``: the tree the index held when it was used as it was (None: it was read
        from the parent or started empty). Raises GitError."""
        self._warm = None
        drift: set[str] = set()  # paths where the index's files differ from the parent's
        if parent_tree is None or parent_tree != self._tree:
            if parent is None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._env["GIT_INDEX_FILE"])
                self._blobs = {}
                self._tree = None
            elif parent_blobs is not None and self._tree is not None and not cold:
                # The index holds another commit's tree (the other thread's run record, a
                # commit whose ref move lost): it is moved to the parent's where the two
                # differ. A read-tree of 100,000 files took a push 1-2 s.
                drift = moved(dict(parent_blobs.items()), self._blobs)  # items: C speed
                self._warm, self._tree = self._tree, None  # written again below
            else:
                self._git("read-tree", parent)
                # dict(a mapping) reads a PersistentMap key by key in Python; its items, at C speed
                known = parent_blobs.items() if parent_blobs is not None else None
                self._blobs = dict(known) if known is not None else tree_blobs(self.repo, parent)
                self._tree = parent_tree
        else:
            self._warm = self._tree
        # ``self._blobs`` are the index's files: the parent's, but at ``drift``.
        if changed is not None:
            edits = {p: blobs.get(p) for p in {*changed, *drift} if blobs.get(p) != self._blobs.get(p)}
        else:
            edits = {p: b for p, b in blobs.items() if self._blobs.get(p) != b}
            edits.update((p, None) for p in self._blobs.keys() - blobs.keys())
        if edits or self._tree is None:
            try:
                self._git("update-index", "-z", "--add", "--remove", "--index-info", input=index_records(edits.items()))
                self._tree = self._git("write-tree")
            except BaseException:
                self._tree, self._blobs = None, {}  # the index is in doubt: read again next time
                raise
            for path, blob in edits.items():
                if blob is None:
                    self._blobs.pop(path, None)
                else:
                    self._blobs[path] = blob

    def commit(
        self,
        branch: str,
        blobs: Mapping[str, str],
        message: str,
        parent: str | None,
        parent_blobs: Mapping[str, str] | None = None,
        expected: str | None = SAME,
        changed: Collection[str] | None = None,
    ) -> str | None:
        """Like :func:`commit_tree`; ``parent_blobs`` (the parent's files, when the caller
        knows them) spares reading the parent's tree when the index does not hold it.

        ``expected``: where the ref is now, when that is not ``parent`` (a tip argus does not
        trust: the ref moves from it to a commit on ``parent``, even with an unchanged tree).
        ``changed``: the only paths where ``blobs`` may differ from the parent's files (removed
        ones included): then a commit costs O(changed), not O(files), while the index holds the
        parent's tree (the common case: the writer builds on its own last commit)."""
        expected = parent if expected == SAME else expected
        with self._lock:
            if parent is None:
                parent_tree = None
            elif self._commit_tree is not None and self._commit_tree[0] == parent:
                parent_tree = self._commit_tree[1]
            else:
                parent_tree = self._git("rev-parse", f"{parent}^{{tree}}")
            try:
                self._write_tree(blobs, parent, parent_tree, parent_blobs, changed)
            except GitError:
                if self._warm is None:
                    raise
                # The warm index could not be used (another index on this repository expired
                # its shared part): once more from the parent's tree.
                self._tree = None
                self._write_tree(blobs, parent, parent_tree, parent_blobs, changed, cold=True)
            tree = self._tree
            if parent is not None and tree == parent_tree and expected == parent:
                return None
            assert tree is not None
            if self.auth_key is not None:
                message = sign_commit_message(self.auth_key, tree, [parent] if parent else [], message)
            commit = self._git(
                "commit-tree", tree, "-F", "-", *(["-p", parent] if parent else []), input=message.encode()
            )
            self._commit_tree = (commit, tree)
        faults.point("status_commit")  # objects written, ref not yet moved
        _move(self.repo, branch, commit, expected)
        return commit


def read_file(repo: str, commit: str, path: str) -> dict[str, Any]:
    """The YAML mapping in ``path`` at ``commit``; {} when absent or not a mapping."""
    proc = git.probe(repo, "show", f"{commit}:{path}")
    if proc.returncode != 0:
        return {}
    try:
        data = yaml.load(proc.stdout, Loader=LOADER)
    except yaml.YAMLError:
        return {}
    return data if isinstance(data, dict) else {}


def write_note(
    repo: str, commit: str, text: str, ref: str = "argus", *, replace: bool = True, auth_key: bytes | None = None
) -> bool:
    """Attach ``text`` as the note of ``commit`` under refs/notes/<ref>, authenticated with
    ``auth_key`` when given (:func:`reconciler.status.auth.sign_note`).

    Returns False when nothing was written: the note is unchanged, or one exists and
    ``replace`` is False. With ``auth_key``, a note that does not verify (someone else wrote
    it) counts as absent: it is replaced.
    """
    current = git.probe(repo, "notes", f"--ref={ref}", "show", commit)
    existing = current.stdout.decode(errors="replace") if current.returncode == 0 else None
    if existing is not None and auth_key is not None:
        existing = split_trailer(existing)[0] if note_verifies(auth_key, commit, existing) else None
    if existing is not None and (not replace or existing.rstrip("\n") == text.rstrip("\n")):
        return False
    if auth_key is not None:
        text = sign_note(auth_key, commit, text)
    git.run(repo, "notes", f"--ref={ref}", "add", "-f", "-F", "-", commit, input=text.encode(), env=AUTHOR)
    return True
