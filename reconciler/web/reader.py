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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

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

    ``remote_too``: fall back to ``refs/remotes/origin/<branch>`` (a user's clone). Thread-safe:
    page requests run in the server's threads.
    """

    def __init__(self, repo: str, branch: str = "argus/status", *, remote_too: bool = False) -> None:
        self.repo = repo
        self.branch = branch
        self.remote_too = remote_too
        self.blobs_read = 0  # how many blobs were parsed in total (tests and the bench read it)
        self._lock = threading.Lock()
        self._snapshot = StatusSnapshot(tip=None)
        self._entries: dict[str, str] = {}  # path -> blob id at the snapshot's tip
        self._parsed: dict[str, Any] = {}  # blob id -> parsed content (only blobs of the tip)
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
                    self._snapshot, self._entries, self._parsed = StatusSnapshot(tip=None, read_at=time.time()), {}, {}
                    return self._snapshot
                if head != self._snapshot.tip or self._snapshot.error:
                    self._advance(head)
            except OSError as exc:
                return StatusSnapshot(tip=None, read_at=time.time(), error=f"cannot read {self.branch}: {exc}")
            return self._snapshot

    def _advance(self, head: str) -> None:
        old = self._snapshot.tip
        entries = dict(self._entries)
        changed: set[str] = set()
        if old is not None and not self._snapshot.error:
            diff = _git(self.repo, "diff-tree", "-r", "-z", "--no-renames", old, head)
            if diff.returncode != 0:
                old = None  # the old tip is gone (a rewritten branch): read everything
            else:
                fields = diff.stdout.split(b"\0")
                # -z: ":<modes> <old> <new> <status>" NUL "<path>" NUL, repeated
                for meta, raw_path in zip(fields[0::2], fields[1::2], strict=False):
                    if not meta.startswith(b":"):
                        continue
                    parts = meta.split()
                    path = raw_path.decode("utf-8", errors="replace")
                    if parts[4].startswith(b"D"):
                        entries.pop(path, None)
                    else:
                        entries[path] = parts[3].decode()
                        changed.add(path)
        if old is None or self._snapshot.error:
            listing = _git(self.repo, "ls-tree", "-r", "-z", head)
            if listing.returncode != 0:
                self._snapshot = StatusSnapshot(
                    tip=head, read_at=time.time(), error=f"cannot list {self.branch}: {listing.stderr.decode().strip()}"
                )
                return
            entries = {}
            for row in listing.stdout.split(b"\0"):
                if not row:
                    continue
                meta, _, raw_path = row.partition(b"\t")
                parts = meta.split()
                if len(parts) == 3 and parts[1] == b"blob":
                    entries[raw_path.decode("utf-8", errors="replace")] = parts[2].decode()
        wanted = sorted({blob for blob in entries.values() if blob not in self._parsed})
        parsed = {blob: self._parsed[blob] for blob in set(entries.values()) if blob in self._parsed}
        by_blob: dict[str, str] = {}
        for path, blob in entries.items():
            by_blob.setdefault(blob, path)
        parsed.update(self._read_blobs(wanted, by_blob))
        docs: dict[str, Mapping[str, Any]] = {}
        root: dict[str, Any] = {}
        for path, blob in entries.items():
            value = parsed.get(blob)
            if path.startswith("users/"):
                if isinstance(value, Mapping) and _is_object_path(path):
                    docs[path] = value
            elif "/" not in path:
                root[path] = value
        self._entries, self._parsed = entries, parsed
        self._snapshot = StatusSnapshot(tip=head, docs=docs, root=root, read_at=time.time())

    def _read_blobs(self, blobs: list[str], by_blob: Mapping[str, str]) -> dict[str, Any]:
        """Parse ``blobs`` read in one ``git cat-file --batch``; name each by one path that holds it."""
        if not blobs:
            return {}
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
            result[blob] = parse_blob(by_blob[blob], data[end + 1 : end + 1 + size])
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
        with self._lock:
            if len(self._notes) > 256:
                self._notes.clear()
            self._notes[key] = text
        return text


def _is_object_path(path: str) -> bool:
    parts = path.split("/")
    return len(parts) == 4 and parts[2] in ("models", "tasks") and parts[3].endswith(".yaml")
