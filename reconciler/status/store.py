"""The one reader of the status branch: documents by blob id, re-read only where the tip moved. I/O.

The daemon commits to the status branch every few seconds while things change, and at 10,000
objects re-reading every document on each commit would cost seconds. A :class:`StatusStore`
holds the files of the one commit it read last (path -> blob id and parsed content) and, for
the next commit, reads only the paths ``git diff-tree`` names between the two (O(changed)); a
cold start (or a commit git cannot diff against, a rewritten branch) lists the tree once. It
holds one commit's files, never a history. The status writer hands it what it just committed
(:meth:`StatusStore.adopt`), so its own commits are never read back and there is one cache.
A snapshot is never changed (a page request may still render an older one): the next shares
all but what changed with it (:class:`~reconciler.status.persistent.PersistentMap`, no copy of
every document per commit), and names the snapshot it follows and the paths that changed since
(``since``, ``changed``), so a consumer that follows the store (the page's rows) does O(changed).

Every reader goes through it: the page and its API (the branch tip, redacted), ``argus
status`` and the demo (one-off), the trusted one-off read (:func:`reconciler.status.trust.
trusted_documents`, at the commit argus trusts) and the writer (its documents, at its base).
Documents are read defensively: a field may be missing or of an unexpected type, a file that
is not what its name says is None, a file over :data:`MAX_FILE_BYTES` is not read.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from reconciler import git
from reconciler.errors import GitError
from reconciler.redact import redact_tree
from reconciler.status.persistent import PersistentMap

# libyaml's C parser is ten times faster; the documents are the daemon's own output.
_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

NOTES_REF = "refs/notes/argus"
MAX_FILE_BYTES = 64 * 1024 * 1024  # a status file larger than this (a forged tip) is not read
_MAX_NOTES = 256


@dataclass(frozen=True)
class StatusSnapshot:
    """The status branch at one commit.

    ``docs``: ``users/<user>/<kind>s/<name>.yaml`` -> document; ``root``: every other file at the
    top of the tree, parsed (``actual.json`` and any revision file as mappings, ``README.md`` as
    text); ``blobs``: path -> blob id of every file in the commit; ``error``: why the branch could
    not be read (then everything else is empty). Never changed once made.

    ``since`` and ``changed``: the tip of the snapshot the store held before this one, and every
    path where this one's files differ from it (added, changed, removed; a path the writer wrote
    again with the same content may be named too); both None when the store read this commit in
    full. A consumer that last saw the snapshot at ``since`` need look only at ``changed``.
    """

    tip: str | None
    docs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    root: Mapping[str, Any] = field(default_factory=dict)
    read_at: float = 0.0
    error: str | None = None
    blobs: Mapping[str, str] = field(default_factory=dict)
    since: str | None = None
    changed: frozenset[str] | None = None

    @property
    def actual(self) -> Mapping[str, Any]:
        value = self.root.get("actual.json")
        return value if isinstance(value, Mapping) else {}

    @property
    def readme(self) -> str:
        value = self.root.get("README.md")
        return value if isinstance(value, str) else ""


def parse_blob(path: str, data: bytes) -> Any:
    """Parse one status-branch file by its name; None when it is not what its name says."""
    try:
        if path.endswith(".json"):
            return json.loads(data)
        if path.endswith((".yaml", ".yml")):
            return yaml.load(data, Loader=_Loader)  # a safe loader
        return data.decode("utf-8", errors="replace")
    except (ValueError, yaml.YAMLError):
        return None


def decode_path(raw: bytes) -> str:
    """A path from git's ``-z`` output; bytes that are not UTF-8 become lone surrogates, so the
    writer writes back exactly the name it read (such a name is never served: :func:`_place`)."""
    return raw.decode("utf-8", "surrogateescape")


def tip(repo: str, branch: str, *, remote_too: bool | str = False) -> str | None:
    """The commit of ``branch`` (or, with ``remote_too``, of ``origin/<branch>``); None if absent.

    ``remote_too`` a remote's name: ``<remote>/<branch>`` first (the copy just fetched from where the
    daemon writes), then the local branch."""
    if isinstance(remote_too, str):
        refs = [f"refs/remotes/{remote_too}/{branch}", f"refs/heads/{branch}"]
    else:
        refs = [f"refs/heads/{branch}"] + ([f"refs/remotes/origin/{branch}"] if remote_too else [])
    for ref in refs:
        sha = git.rev(repo, f"{ref}^{{commit}}")
        if sha:
            return sha
    return None


class StatusStore:
    """``StatusStore(repo, "argus/status")``: the status branch's files, read incrementally.

    :meth:`snapshot` (never raises) and :meth:`read` / :meth:`documents` (raise GitError) read
    the branch tip, or ``commit`` when given. ``remote_too`` picks the tip as :func:`tip` does.
    ``redact``: applied to every file and note as it is read (:func:`reconciler.redact.
    redact_tree`), so what the page serves is redacted even when argus did not write the branch.
    Thread-safe: page requests run in the server's threads, the writer in two.
    """

    def __init__(
        self,
        repo: str,
        branch: str = "argus/status",
        *,
        remote_too: bool | str = False,
        redact: Callable[[str], str] | None = None,
    ) -> None:
        self.repo = repo
        self.branch = branch
        self.remote_too = remote_too
        self.redact = redact
        self.blobs_read = 0  # how many blobs were parsed in total (tests and the bench read it)
        self._lock = threading.Lock()
        self._snapshot = StatusSnapshot(tip=None)
        # path -> (blob id, parsed content) at the tip: changed in place (only under the lock, and
        # only once every read a move needs succeeded); the snapshot's maps are never changed.
        self._files: dict[str, tuple[str, Any]] = {}
        self._docs: PersistentMap[str, Mapping[str, Any]] = PersistentMap()
        self._blobs: PersistentMap[str, str] = PersistentMap()
        self._notes: dict[tuple[str, str], str | None] = {}

    def tip(self) -> str | None:
        """The branch's commit now (None when it does not exist)."""
        return tip(self.repo, self.branch, remote_too=self.remote_too)

    def snapshot(self, commit: str | None = None) -> StatusSnapshot:
        """The branch at its tip (or at ``commit``). Never raises: a git failure is ``error``."""
        try:
            return self.read(commit)
        except GitError as exc:
            return StatusSnapshot(tip=None, read_at=time.time(), error=f"cannot read {self.branch}: {exc}")

    def documents(self, commit: str | None = None) -> Mapping[str, Mapping[str, Any]]:
        """The object documents (path -> mapping) at the tip (or ``commit``); empty when there is
        no branch. Raises GitError when git cannot read them."""
        return self.read(commit).docs

    def read(self, commit: str | None = None) -> StatusSnapshot:
        """The files at ``commit`` (default: the branch tip; no branch: an empty snapshot).
        Raises GitError when git cannot read them."""
        with self._lock:
            head = commit or self.tip()
            if head is None:  # no branch (deleted): nothing is held
                self._forget()
                return self._snapshot
            if head != self._snapshot.tip:
                self._advance(head)
            return self._snapshot

    def files_under(self, prefix: str, commit: str | None = None) -> dict[str, Any]:
        """The parsed files whose path starts with ``prefix`` (``usage/``) at the tip (or
        ``commit``): path -> content. O(files held): for a start-up or a one-off read, not a
        tick. Raises GitError when git cannot read them."""
        self.read(commit)  # the store's lock is not re-entrant: read first, then copy under it
        with self._lock:
            return {p: v for p, (_b, v) in self._files.items() if p.startswith(prefix)}

    def adopt(
        self,
        commit: str,
        blobs: Mapping[str, str],
        values: Mapping[str, Any],
        *,
        parent: str | None = None,
        paths: Collection[str] | None = None,
    ) -> StatusSnapshot:
        """Take ``commit`` as read without reading it: its tree is ``blobs`` (path -> blob id),
        and ``values`` (path -> parsed content) are what the writer just wrote there. Any other
        file keeps the content the store holds for it when its blob is the same, and is read
        otherwise. ``paths``: the only paths where ``commit`` differs from ``parent`` (removed
        ones included); while the store holds ``parent``, only they are looked at (O(changed)).
        Returns the snapshot. Raises GitError when a file must be read and cannot."""
        with self._lock:
            old = self._files if self._snapshot.tip is not None else {}
            if paths is not None and parent is not None and self._snapshot.tip == parent:
                gone = [p for p in paths if p not in blobs and p in old]
                looked: Mapping[str, str] = {p: blobs[p] for p in paths if p in blobs}
            else:
                gone, looked = list(old.keys() - blobs.keys()), blobs
            files: dict[str, tuple[str, Any]] = {}
            missing: dict[str, str] = {}
            for path, blob in looked.items():
                have = old.get(path)
                if path in values:
                    value = values[path]
                    if self.redact is not None:
                        value = redact_tree(value, self.redact)
                    if have is None or have[0] != blob or have[1] is not value:
                        files[path] = (blob, value)
                elif have is None or have[0] != blob:
                    missing[path] = blob
            read = self._read_blobs(sorted(set(missing.values())), missing)
            for path, blob in missing.items():
                files[path] = (blob, read.get(blob))
            self._move(commit, files, gone)
            return self._snapshot

    def _forget(self) -> None:
        """Hold nothing: the branch does not exist (or could not be listed)."""
        self._snapshot = StatusSnapshot(tip=None, read_at=time.time())
        self._files, self._docs, self._blobs = {}, PersistentMap(), PersistentMap()

    def _advance(self, head: str) -> None:
        old = self._snapshot.tip
        if old is not None and self._advance_by_diff(old, head):
            return
        listing = git.probe(self.repo, "ls-tree", "-r", "-z", head)
        if listing.returncode != 0:
            why = listing.stderr.decode(errors="replace").strip()
            self._forget()
            raise GitError(f"cannot list {self.branch} at {head[:12]}: {why}", ("ls-tree",), listing.returncode, why)
        entries: dict[str, str] = {}
        for row in listing.stdout.split(b"\0"):
            meta, _, raw_path = row.partition(b"\t")
            parts = meta.split()
            if len(parts) == 3 and parts[1] == b"blob":
                entries[decode_path(raw_path)] = parts[2].decode()
        known = {blob: value for blob, value in self._files.values()}
        values = self._read_blobs(sorted({b for b in entries.values() if b not in known}), entries)
        known.update(values)
        self._files = {path: (blob, known.get(blob)) for path, blob in entries.items()}
        docs: dict[str, Mapping[str, Any]] = {}
        root: dict[str, Any] = {}
        for path, (_blob, value) in self._files.items():
            _place(docs, root, path, value)
        self._docs, self._blobs = PersistentMap(docs), PersistentMap(entries)
        self._snapshot = StatusSnapshot(tip=head, docs=self._docs, root=root, read_at=time.time(), blobs=self._blobs)

    def _advance_by_diff(self, old: str, head: str) -> bool:
        """Move from ``old`` to ``head`` reading only the paths that differ. False when git cannot
        diff them (the old tip is gone: a rewritten branch), then the caller reads everything."""
        diff = git.probe(self.repo, "diff-tree", "-r", "-z", "--no-renames", old, head)
        if diff.returncode != 0:
            return False
        changed: dict[str, str] = {}
        deleted: list[str] = []
        fields = diff.stdout.split(b"\0")
        # -z: ":<old mode> <new mode> <old blob> <new blob> <status>" NUL "<path>" NUL, repeated
        for meta, raw_path in zip(fields[0::2], fields[1::2], strict=False):
            parts = meta.split()
            if not meta.startswith(b":") or len(parts) < 5:
                continue
            path = decode_path(raw_path)
            if parts[4].startswith(b"D") or parts[1] == b"160000":  # a gitlink is no file (as in _advance)
                deleted.append(path)
            elif self._blobs.get(path) != (blob := parts[3].decode()):  # not a change of mode alone
                changed[path] = blob
        values = self._read_blobs(sorted(set(changed.values())), changed)
        self._move(head, {path: (blob, values.get(blob)) for path, blob in changed.items()}, deleted)
        return True

    def _move(self, head: str, files: Mapping[str, tuple[str, Any]], removed: Collection[str]) -> None:
        """Hold ``head``: the held commit's files with ``files`` (path -> (blob id, parsed
        content)) set and ``removed`` gone. Only what they touch is changed (O(changed)); the
        snapshot names them as what changed since the one it follows."""
        gone = [p for p in removed if p in self._files and p not in files]
        before = self._snapshot
        root: Mapping[str, Any] = before.root
        root_changes: dict[str, Any] = {}
        doc_changes: dict[str, Mapping[str, Any]] = {}
        doc_removed: list[str] = []
        for path in gone:
            del self._files[path]
            doc_removed.append(path)
            if path in root:
                root_changes[path] = _ABSENT
        self._files.update(files)
        for path, (_blob, value) in files.items():
            slot = _slot(path, value)
            if slot == "doc":
                doc_changes[path] = value
            else:
                doc_removed.append(path)
            if slot == "root":
                root_changes[path] = value
            elif path in root:
                root_changes[path] = _ABSENT
        if root_changes:  # a new map (a handful of files) so the last snapshot's stays as it was
            root = {p: v for p, v in {**root, **root_changes}.items() if v is not _ABSENT}
        self._docs = self._docs.evolve(doc_changes, doc_removed)
        self._blobs = self._blobs.evolve({path: blob for path, (blob, _v) in files.items()}, gone)
        since = before.tip
        self._snapshot = StatusSnapshot(
            tip=head,
            docs=self._docs,
            root=root,
            read_at=time.time(),
            blobs=self._blobs,
            since=since,
            changed=frozenset([*gone, *files]) if since is not None else None,
        )

    def _read_blobs(self, blobs: list[str], paths: Mapping[str, str]) -> dict[str, Any]:
        """Parse ``blobs``, read in one ``git cat-file --batch`` (streamed: a file over
        :data:`MAX_FILE_BYTES` is skipped, never held); ``paths`` (path -> blob) names them."""
        if not blobs:
            return {}
        by_blob: dict[str, str] = {}
        for path, blob in paths.items():
            by_blob.setdefault(blob, path)
        result: dict[str, Any] = {}
        for blob, size, data in git.read_objects(self.repo, blobs, MAX_FILE_BYTES):
            if size < 0:  # the tree names a blob the repository lacks: broken, not empty
                raise GitError(f"{by_blob[blob]} (blob {blob}) is missing from {self.repo}", ("cat-file",))
            if data is None:
                continue
            value = parse_blob(by_blob[blob], data)
            result[blob] = value if self.redact is None else redact_tree(value, self.redact)
        self.blobs_read += len(result)
        return result

    def note(self, revision: str) -> str | None:
        """The git note (``refs/notes/argus``) of ``revision``; None when it has none (or git
        cannot read it)."""
        if not revision or not all(c in "0123456789abcdef" for c in revision):
            return None
        try:
            key = (git.rev(self.repo, NOTES_REF) or "", revision)
            with self._lock:
                if key in self._notes:
                    return self._notes[key]
            out = git.probe(self.repo, "notes", "--ref=argus", "show", revision)
        except GitError:
            return None
        text = out.stdout.decode("utf-8", errors="replace") if out.returncode == 0 else None
        if text is not None and self.redact is not None:
            text = self.redact(text)
        with self._lock:
            if len(self._notes) >= _MAX_NOTES:
                self._notes.clear()
            self._notes[key] = text
        return text


_ABSENT = object()  # a root file removed (in _move's changes)


def _slot(path: str, value: Any) -> str | None:
    """Where file ``path`` with parsed ``value`` belongs: ``"doc"`` (an object document),
    ``"root"`` (a file at the top of the tree) or None (neither; a name that is not UTF-8 is never
    an object's)."""
    if not path.isascii() and not _is_text(path):
        return None
    if path.startswith("users/"):
        return "doc" if isinstance(value, Mapping) and _is_object_path(path) else None
    return "root" if "/" not in path else None


def _place(docs: dict[str, Mapping[str, Any]], root: dict[str, Any], path: str, value: Any) -> None:
    """File ``path``'s parsed ``value`` as an object document, a root file, or nothing (:func:`_slot`)."""
    slot = _slot(path, value)
    if slot == "doc":
        docs[path] = value
    elif slot == "root":
        root[path] = value


def _is_text(path: str) -> bool:
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_object_path(path: str) -> bool:
    parts = path.split("/")
    return len(parts) == 4 and parts[2] in ("models", "tasks") and parts[3].endswith(".yaml")
