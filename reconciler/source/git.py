"""Read the desired state from a git repository at a commit (blobs, never the work tree). I/O.

:class:`GitRepo` keeps caches between calls so that a re-plan after a push reads only the
blobs it has not seen and walks only the new commits.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from reconciler.errors import SourceUnavailable
from reconciler.redact import redact
from reconciler.spec.loader import ParseCache, SourceFile

APPROVE_TRAILER = "Argus-Approve-Prune"
_RELEVANT = ("users/", "cluster.yaml")


def git(repo: str, *args: str, input: bytes | None = None, check: bool = True) -> bytes:
    """Run ``git -C repo args``; return stdout. Raises SourceUnavailable on failure."""
    proc = subprocess.run(["git", "-C", repo, *args], input=input, capture_output=True, check=False)
    if check and proc.returncode != 0:
        raise SourceUnavailable(
            redact(f"git {' '.join(args[:3])} failed in {repo}: {proc.stderr.decode(errors='replace').strip()}")
        )
    return proc.stdout


@dataclass
class Snapshot:
    """The relevant files of one commit, with what the loader needs besides them."""

    commit: str
    files: list[SourceFile]
    created: dict[str, int]
    commit_time: int
    approve_prune: bool
    subject: str = ""


@dataclass
class GitRepo:
    """A local git repository (bare or not) read at commits. ``prefix`` selects a sub-folder."""

    path: str
    prefix: str = ""
    blobs: dict[str, bytes] = field(default_factory=dict)
    _created: dict[str, int] = field(default_factory=dict)
    _created_at: str | None = None  # commit the _created map is valid for
    _listed: dict[str, tuple[str, str]] = field(default_factory=dict)
    _listed_at: str | None = None  # commit the _listed map is valid for
    _files: dict[tuple[str, str, str], SourceFile] = field(default_factory=dict)  # (path, mode, blob) of the last read

    def resolve(self, ref: str) -> str:
        """Return the commit id of ``ref``. Raises SourceUnavailable when it does not exist."""
        out = git(self.path, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False).decode().strip()
        if not out:
            raise SourceUnavailable(f"{ref!r} does not exist in {self.path}")
        return out

    def snapshot(
        self, commit: str, cache: ParseCache | None = None, tree: Mapping[str, tuple[str, str]] | None = None
    ) -> Snapshot:
        """Read ``commit``'s relevant files. Blobs already parsed (in ``cache``) are not read again.

        ``tree`` (path -> (mode, blob)) replaces the commit's own tree: the signature
        verifier's trusted tree, where unverified changes are left out.
        """
        if tree is None:
            tree = self._listing(commit)
        entries = [(p, m, b) for p, (m, b) in sorted(tree.items()) if p.startswith(_RELEVANT)]
        known = cache.entries if cache is not None else {}
        # Symlinks (120000) and gitlinks (160000: a submodule's commit, absent here) are not read.
        readable = [(p, b) for p, m, b in entries if m != "120000" and not m.startswith("160")]
        wanted = [b for p, b in readable if (p, b) not in known and b not in self.blobs]
        self._read_blobs(wanted)
        files = []
        for p, m, b in entries:
            file = self._files.get((p, m, b))
            if file is None or (file.content is None and b in self.blobs):
                content = None if m == "120000" or m.startswith("160") else self.blobs.get(b)
                file = SourceFile(path=p, content=content, blob=b, symlink=m == "120000")
            files.append(file)
        # Unchanged files are the same objects next time: no 10,000 new objects (and GC work) per re-plan.
        self._files = {(f.path, m, f.blob): f for f, (_p, m, _b) in zip(files, entries, strict=True)}
        meta = git(self.path, "log", "-1", f"--format=%ct%x00%(trailers:key={APPROVE_TRAILER},valueonly)%x00%s", commit)
        ctime, trailer, subject = meta.decode(errors="replace").split("\0", 2)
        approve = trailer.strip().lower() in {"yes", "true", "1"}
        return Snapshot(commit, files, self.created_times(commit), int(ctime), approve, subject.strip())

    def _listing(self, commit: str) -> dict[str, tuple[str, str]]:
        """path -> (mode, blob) of the relevant files at ``commit``.

        After the first commit only the difference to the previous one is read (``diff-tree``),
        so a re-plan after a push costs what the push changed, not the size of the tree.
        """
        if self._listed_at == commit:
            return self._listed
        if self._listed_at is not None:
            proc = subprocess.run(
                [
                    "git",
                    "-C",
                    self.path,
                    "diff-tree",
                    "-r",
                    "-z",
                    "--no-renames",
                    "--no-commit-id",
                    self._listed_at,
                    commit,
                    "--",
                    *self._pathspecs(),
                ],
                capture_output=True,
                check=False,
            )
            if proc.returncode == 0:  # else (e.g. the old commit was garbage-collected): list it all
                listed = dict(self._listed)
                tokens = proc.stdout.split(b"\0")
                for meta, path_b in zip(tokens[0::2], tokens[1::2], strict=False):
                    if not meta:
                        continue
                    _old_mode, mode, _old_blob, blob, status = meta.decode().lstrip(":").split()
                    path = self._relative(path_b.decode(errors="replace"))
                    if status == "D":
                        listed.pop(path, None)
                    else:
                        listed[path] = (mode, blob)
                self._listed, self._listed_at = listed, commit
                return listed
        listing = git(self.path, "ls-tree", "-r", "-z", "--full-tree", commit, "--", *self._pathspecs())
        listed = {}
        for record in listing.split(b"\0"):
            if not record:
                continue
            meta, _, path_b = record.partition(b"\t")
            mode, _type, blob = meta.decode().split()
            listed[self._relative(path_b.decode(errors="replace"))] = (mode, blob)
        self._listed, self._listed_at = listed, commit
        return listed

    def _relative(self, path: str) -> str:
        return path[len(self.prefix) :] if self.prefix else path

    def _pathspecs(self) -> list[str]:
        return [f"{self.prefix}users", f"{self.prefix}cluster.yaml"]

    def _read_blobs(self, blobs: Iterable[str]) -> None:
        todo = sorted(set(blobs))
        if not todo:
            return
        out = git(self.path, "cat-file", "--batch", input=("\n".join(todo) + "\n").encode())
        pos = 0
        for blob in todo:
            header_end = out.index(b"\n", pos)
            header = out[pos:header_end].split()
            size = int(header[2])
            self.blobs[blob] = out[header_end + 1 : header_end + 1 + size]
            pos = header_end + 1 + size + 1
        # Only the current tree's blobs are worth keeping; bound the cache.
        if len(self.blobs) > 50_000:
            self.blobs.clear()

    def created_times(self, commit: str) -> dict[str, int]:
        """Map each path to the time that names its object: the author time of the commit that
        introduced the file.

        The introducing commit is the newest first-parent commit that added the path; when that
        is a merge commit, the file came from the merged branch, and the oldest commit there
        that added it counts. So a pull request's plan, its merge (merge commit or rebase, which
        keeps author times), a re-clone and a restart all give the same time; later edits and
        unrelated changes never move it. (A squash merge writes a new commit: the time is
        assigned at merge.) Incremental: after the first call only new commits are walked.
        """
        if self._created_at == commit:
            return self._created
        rev_range = commit
        base = dict(self._created)
        if self._created_at is not None:
            is_ancestor = (
                subprocess.run(
                    ["git", "-C", self.path, "merge-base", "--is-ancestor", self._created_at, commit],
                    capture_output=True,
                ).returncode
                == 0
            )
            rev_range = f"{self._created_at}..{commit}" if is_ancestor else commit
            if not is_ancestor:
                base = {}
        added: dict[str, int] = {}
        for parents, when, paths in self._adds("--first-parent", rev_range):
            fresh = [p for p in paths if p not in added]  # log is newest first: keep the newest add
            if not fresh:
                continue
            merged = self.introduction_times(parents, fresh) if len(parents) > 1 else {}
            for path in fresh:
                added[path] = merged.get(path, when)
        base.update(added)
        self._created, self._created_at = base, commit
        return base

    def introduction_times(self, parents: list[str], paths: list[str]) -> dict[str, int]:
        """For a merge with ``parents``: path -> author time of the oldest commit on the merged
        side (``parents[0]..parents[1:]``) that added it. Paths added by the merge itself are absent."""
        wanted = set(paths)
        out: dict[str, int] = {}
        side = [f"^{parents[0]}", *parents[1:]]
        for _parents, when, added in self._adds(*side, pathspecs=[self.prefix + p for p in paths]):
            for path in added:
                if path in wanted:
                    out[path] = when  # newest first: the last one seen is the oldest add
        return out

    def _adds(self, *rev_args: str, pathspecs: list[str] | None = None) -> list[tuple[list[str], int, list[str]]]:
        """(parents, author time, added paths) of each commit in ``rev_args`` that added a
        relevant file, newest first. Paths are NUL-separated (-z): any byte in a name is safe,
        and a header token cannot be a path (paths start with users/ or cluster.yaml)."""
        out = git(
            self.path,
            "log",
            "--diff-filter=A",
            "--no-renames",
            "--name-only",
            "-z",
            "--format=%x01%at %P",
            *rev_args,
            "--",
            *(pathspecs if pathspecs is not None else self._pathspecs()),
        )
        commits: list[tuple[list[str], int, list[str]]] = []
        for token in out.split(b"\0"):
            raw = token.lstrip(b"\n")
            if not raw:
                continue
            if raw.startswith(b"\x01"):
                stamp, *parents = raw[1:].decode().split()
                commits.append((parents, int(stamp), []))
            elif commits:
                commits[-1][2].append(self._relative(raw.decode(errors="replace")))
        return commits
