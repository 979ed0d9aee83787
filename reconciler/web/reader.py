"""Read the status branch incrementally, for the web page and its API. I/O (git plumbing).

The status branch is the one source of truth the page shows. The daemon commits to it every
few seconds while things change, and at 10,000 objects re-reading every document on each
commit would cost seconds. So documents are cached by blob id and, when the tip moves, only
the paths ``git diff-tree`` names are read again: the cost of a new tip is O(changed).
Documents are read defensively: a field may be missing or of an unexpected type.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from reconciler.redact import redact_tree

# libyaml's C parser is ten times faster; the documents are the daemon's own output.
_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

NOTES_REF = "refs/notes/argus"


@dataclass(frozen=True)
class StatusSnapshot:
    """The status branch at one commit.

    ``docs``: ``users/<user>/<kind>s/<name>.yaml`` -> document; ``root``: every other file at the
    top of the tree, parsed (``actual.json`` and any revision file as mappings, ``README.md`` as
    text); ``error``: why the branch could not be read (then everything else is empty).
    """

    tip: str | None
    docs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    root: Mapping[str, Any] = field(default_factory=dict)
    read_at: float = 0.0
    error: str | None = None

    @property
    def actual(self) -> Mapping[str, Any]:
        value = self.root.get("actual.json")
        return value if isinstance(value, Mapping) else {}

    @property
    def readme(self) -> str:
        value = self.root.get("README.md")
        return value if isinstance(value, str) else ""


def _git(repo: str, *args: str, input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", repo, *args], input=input, capture_output=True, check=False)


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


class StatusReader:
    """``StatusReader(repo, "argus/status").snapshot()``: the branch now, re-reading only what changed.

    ``remote_too``: fall back to ``refs/remotes/origin/<branch>`` (a user's clone). ``redact``:
    applied to every file and note as it is read (:func:`reconciler.redact.redact_tree`), so what
    is served is redacted even when the branch was not written by this daemon. Thread-safe:
    page requests run in the server's threads.
    """

    def __init__(
        self,
        repo: str,
        branch: str = "argus/status",
        *,
        remote_too: bool = False,
        redact: Callable[[str], str] | None = None,
    ) -> None:
        self.repo = repo
        self.branch = branch
        self.remote_too = remote_too
        self.redact = redact
        self.blobs_read = 0  # how many blobs were parsed in total (tests and the bench read it)
        self._lock = threading.Lock()
        self._snapshot = StatusSnapshot(tip=None)
        self._files: dict[str, tuple[str, Any]] = {}  # path -> (blob id, parsed content) at the tip
        self._notes: dict[tuple[str, str], str | None] = {}

    def tip(self) -> str | None:
        """The branch's commit now (None when it does not exist)."""
        refs = [f"refs/heads/{self.branch}"] + ([f"refs/remotes/origin/{self.branch}"] if self.remote_too else [])
        for ref in refs:
            out = _git(self.repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.decode().strip()
        return None

    def snapshot(self) -> StatusSnapshot:
        """Return the branch at its current tip. Never raises: a git failure is ``error``."""
        with self._lock:
            try:
                head = self.tip()
                if head is None:
                    self._snapshot, self._files = StatusSnapshot(tip=None, read_at=time.time()), {}
                    return self._snapshot
                if head != self._snapshot.tip or self._snapshot.error:
                    self._advance(head)
            except OSError as exc:
                return StatusSnapshot(tip=None, read_at=time.time(), error=f"cannot read {self.branch}: {exc}")
            return self._snapshot

    def _advance(self, head: str) -> None:
        old = self._snapshot.tip
        if old is not None and not self._snapshot.error and self._advance_by_diff(old, head):
            return
        listing = _git(self.repo, "ls-tree", "-r", "-z", head)
        if listing.returncode != 0:
            self._snapshot = StatusSnapshot(
                tip=head, read_at=time.time(), error=f"cannot list {self.branch}: {listing.stderr.decode().strip()}"
            )
            return
        entries: dict[str, str] = {}
        for row in listing.stdout.split(b"\0"):
            meta, _, raw_path = row.partition(b"\t")
            parts = meta.split()
            if len(parts) == 3 and parts[1] == b"blob":
                entries[raw_path.decode("utf-8", errors="replace")] = parts[2].decode()
        known = {blob: value for blob, value in self._files.values()}
        values = self._read_blobs(sorted({b for b in entries.values() if b not in known}), entries)
        known.update(values)
        self._files = {path: (blob, known.get(blob)) for path, blob in entries.items()}
        docs: dict[str, Mapping[str, Any]] = {}
        root: dict[str, Any] = {}
        for path, (_blob, value) in self._files.items():
            _place(docs, root, path, value)
        self._snapshot = StatusSnapshot(tip=head, docs=docs, root=root, read_at=time.time())

    def _advance_by_diff(self, old: str, head: str) -> bool:
        """Move from ``old`` to ``head`` reading only the paths that differ. False when git cannot
        diff them (the old tip is gone: a rewritten branch), then the caller reads everything."""
        diff = _git(self.repo, "diff-tree", "-r", "-z", "--no-renames", old, head)
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
            path = raw_path.decode("utf-8", errors="replace")
            if parts[4].startswith(b"D"):
                deleted.append(path)
            else:
                changed[path] = parts[3].decode()
        # Copies of the previous maps (C-speed for 10,000 entries), then only the differences.
        files = dict(self._files)
        docs = dict(self._snapshot.docs)
        root = dict(self._snapshot.root)
        for path in deleted:
            files.pop(path, None)
            docs.pop(path, None)
            root.pop(path, None)
        values = self._read_blobs(sorted(set(changed.values())), changed)
        for path, blob in changed.items():
            files[path] = (blob, values.get(blob))
            docs.pop(path, None)
            root.pop(path, None)
            _place(docs, root, path, values.get(blob))
        self._files = files
        self._snapshot = StatusSnapshot(tip=head, docs=docs, root=root, read_at=time.time())
        return True

    def _read_blobs(self, blobs: list[str], paths: Mapping[str, str]) -> dict[str, Any]:
        """Parse ``blobs`` read in one ``git cat-file --batch``; ``paths`` (path -> blob) names them."""
        if not blobs:
            return {}
        by_blob: dict[str, str] = {}
        for path, blob in paths.items():
            by_blob.setdefault(blob, path)
        out = _git(self.repo, "cat-file", "--batch", input=("\n".join(blobs) + "\n").encode())
        data = out.stdout
        result: dict[str, Any] = {}
        pos = 0
        for blob in blobs:
            end = data.index(b"\n", pos)
            header = data[pos:end].split()
            if len(header) < 3 or header[1] == b"missing":
                pos = end + 1
                continue
            size = int(header[2])
            value = parse_blob(by_blob[blob], data[end + 1 : end + 1 + size])
            result[blob] = value if self.redact is None else redact_tree(value, self.redact)
            pos = end + 1 + size + 1
        self.blobs_read += len(result)
        return result

    def note(self, revision: str) -> str | None:
        """The git note (``refs/notes/argus``) of ``revision``; None when it has none."""
        if not revision or not all(c in "0123456789abcdef" for c in revision):
            return None
        notes_tip = _git(self.repo, "rev-parse", "--verify", "--quiet", NOTES_REF).stdout.decode().strip()
        key = (notes_tip, revision)
        with self._lock:
            if key in self._notes:
                return self._notes[key]
        out = _git(self.repo, "notes", "--ref=argus", "show", revision)
        text = out.stdout.decode("utf-8", errors="replace") if out.returncode == 0 else None
        if text is not None and self.redact is not None:
            text = self.redact(text)
        with self._lock:
            if len(self._notes) > 256:
                self._notes.clear()
            self._notes[key] = text
        return text


def _place(docs: dict[str, Mapping[str, Any]], root: dict[str, Any], path: str, value: Any) -> None:
    """File ``path``'s parsed ``value`` as an object document, a root file, or nothing."""
    if path.startswith("users/"):
        if isinstance(value, Mapping) and _is_object_path(path):
            docs[path] = value
    elif "/" not in path:
        root[path] = value


def _is_object_path(path: str) -> bool:
    parts = path.split("/")
    return len(parts) == 4 and parts[2] in ("models", "tasks") and parts[3].endswith(".yaml")
