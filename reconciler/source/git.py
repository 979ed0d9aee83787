"""Read the desired state from a git repository at a commit (blobs, never the work tree). I/O.

:class:`GitRepo` keeps caches between calls so that a re-plan after a push reads only the
blobs it has not seen and walks only the new commits.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from reconciler import git
from reconciler.errors import SourceUnavailable
from reconciler.spec.loader import ParseCache, SourceFile, classify
from reconciler.spec.yamldoc import MAX_BYTES

APPROVE_TRAILER = "Argus-Approve-Prune"
_RELEVANT = ("users/", "cluster.yaml")
BLOB_CACHE_BYTES = 32 * 1024 * 1024
PATHSPEC_BYTES = 64 * 1024  # beyond this, paths are not passed on git's command line (E2BIG at ~2 MB)


def decode_path(raw: bytes) -> str:
    """A path from git's ``-z`` output as text. Bytes that are not UTF-8 become lone surrogates
    (``surrogateescape``): two different names never decode to the same text, and the loader
    reports such a name (escaped) instead of reading it."""
    return raw.decode("utf-8", "surrogateescape")


@dataclass
class Snapshot:
    """The relevant files of one commit, with what the loader needs besides them."""

    commit: str
    files: list[SourceFile]
    created: dict[str, int]
    commit_time: int
    approve_prune: bool
    subject: str = ""
    # Where ``files`` and ``created`` can differ from the snapshot of commit ``since`` that this
    # repository read last: None when unknown (a first or a full read, a rewritten history, a
    # tree of the signature verifier's), then every path may have changed.
    since: str | None = None
    changed: frozenset[str] | None = None


@dataclass
class GitRepo:
    """A local git repository (bare or not) read at commits. ``prefix`` selects a sub-folder."""

    path: str
    prefix: str = ""
    blobs: dict[str, bytes] = field(default_factory=dict)  # bounded: at most BLOB_CACHE_BYTES of content
    _blob_bytes: int = 0
    _sizes: dict[str, int] = field(default_factory=dict)  # blob -> bytes, from `cat-file --batch-check`
    _created: dict[str, int] = field(default_factory=dict)
    _created_at: str | None = None  # commit the _created map is valid for
    # The last move of _created: (the commit it moved from, or None when it was read anew; the paths added).
    _created_moved: tuple[str | None, set[str]] = (None, set())
    _listed: dict[str, tuple[str, str]] = field(default_factory=dict)
    _listed_at: str | None = None  # commit the _listed map is valid for
    _files: dict[tuple[str, str, str], SourceFile] = field(default_factory=dict)  # (path, mode, blob) of the last read
    # What the last listing changed: (the commit it was listed from, or None for a full listing; paths).
    _changed: tuple[str | None, set[str]] = (None, set())
    # The last snapshot of a commit's own tree, which the next one patches: its commit, cache,
    # blob-cache clears, and its files in path order (as kept: see _kept) with their modes.
    _snap_at: str | None = None
    _snap_cache: ParseCache | None = None
    _snap_clears: int = -1
    _clears: int = 0  # how many times the blob cache was cleared
    _order: list[str] = field(default_factory=list)
    _kept_files: list[SourceFile] = field(default_factory=list)
    _modes: dict[str, tuple[str, str]] = field(default_factory=dict)
    _unsettled: set[str] = field(default_factory=set)  # kept without content: looked at again each time

    def resolve(self, ref: str) -> str:
        """Return the commit id of ``ref``. Raises SourceUnavailable when it does not exist."""
        out = git.rev(self.path, f"{ref}^{{commit}}")
        if not out:
            raise SourceUnavailable(f"{ref!r} does not exist in {self.path}")
        return out

    def snapshot(
        self, commit: str, cache: ParseCache | None = None, tree: Mapping[str, tuple[str, str]] | None = None
    ) -> Snapshot:
        """Read ``commit``'s relevant files. Blobs already parsed (in ``cache``) are not read again.

        ``tree`` (path -> (mode, blob)) replaces the commit's own tree: the signature
        verifier's trusted tree, where unverified changes are left out. After a snapshot of the
        commit's own tree, the next one of a descendant looks only at the paths that changed.
        """
        since: str | None = None
        changed: set[str] = set()
        if tree is None:
            tree = self._listing(commit)
            since, changed = self._changed
        fast = (
            since is not None
            and since == self._snap_at
            and tree is self._listed
            and cache is self._snap_cache
            and self._clears == self._snap_clears
        )
        files = self._patch(tree, changed, cache) if fast else self._read_all(tree, cache)
        self._snap_at = commit if tree is self._listed else None
        self._snap_cache, self._snap_clears = cache, self._clears
        meta = git.run(
            self.path, "log", "-1", f"--format=%ct%x00%(trailers:key={APPROVE_TRAILER},valueonly)%x00%s", commit
        )
        ctime, trailer, subject = meta.decode(errors="replace").split("\0", 2)
        approve = trailer.strip().lower() in {"yes", "true", "1"}
        created = self.created_times(commit)
        delta: frozenset[str] | None = None
        if fast and since is not None and self._created_at == commit and self._created_moved[0] == since:
            delta = frozenset(changed | self._created_moved[1])
        return Snapshot(commit, files, created, int(ctime), approve, subject.strip(), since, delta)

    def _read_all(self, tree: Mapping[str, tuple[str, str]], cache: ParseCache | None) -> list[SourceFile]:
        """Every relevant file of ``tree``, in path order (and the state :meth:`_patch` starts from)."""
        entries = [(p, m, b) for p, (m, b) in sorted(tree.items()) if p.startswith(_RELEVANT)]
        got = self._file_objects(entries, cache)
        files = [got[p] for p, _m, _b in entries]
        # Unchanged files are the same objects next time: no 10,000 new objects (and GC work) per
        # re-plan. They keep their content only while the bounded blob cache does.
        self._files = {(p, m, b): self._kept(got[p]) for p, m, b in entries}
        self._order = [p for p, _m, _b in entries]
        self._kept_files = [self._files[e] for e in entries]
        self._modes = {p: (m, b) for p, m, b in entries}
        self._unsettled = {p for p, m, b in entries if self._needs_content(p, m, self._files[(p, m, b)])}
        if len(self._sizes) > 2 * len(entries) + 1024:
            self._sizes = {b: self._sizes[b] for _p, m, b in entries if b in self._sizes}
        return files

    def _patch(
        self, tree: Mapping[str, tuple[str, str]], changed: set[str], cache: ParseCache | None
    ) -> list[SourceFile]:
        """The files of ``tree`` from the last snapshot's, looking only at ``changed`` paths (and
        at files whose content was dropped from memory, which may have to be read again)."""
        look = sorted(p for p in changed | self._unsettled if p.startswith(_RELEVANT))
        entries = [(p, *tree[p]) for p in look if p in tree]
        got = self._file_objects(entries, cache)
        order, kept = self._order, self._kept_files
        shown: dict[int, SourceFile] = {}
        for path in look:
            old = self._modes.pop(path, None)
            if old is not None:
                self._files.pop((path, *old), None)
            i = bisect.bisect_left(order, path)
            present = i < len(order) and order[i] == path
            if path not in got:
                if present:
                    del order[i], kept[i]
                continue
            mode, blob = tree[path]
            file = got[path]
            keep = self._files[(path, mode, blob)] = self._kept(file)
            self._modes[path] = (mode, blob)
            if present:
                kept[i] = keep
            else:
                order.insert(i, path)
                kept.insert(i, keep)
            if self._needs_content(path, mode, keep):
                self._unsettled.add(path)
            else:
                self._unsettled.discard(path)
            if keep is not file:
                shown[i] = file
        if len(self._sizes) > 2 * len(order) + 1024:
            self._sizes = {b: self._sizes[b] for _m, b in self._modes.values() if b in self._sizes}
        files = list(kept)
        for path, file in ((f.path, f) for f in shown.values()):
            files[bisect.bisect_left(order, path)] = file
        return files

    def _file_objects(self, entries: list[tuple[str, str, str]], cache: ParseCache | None) -> dict[str, SourceFile]:
        """path -> SourceFile of ``entries`` ((path, mode, blob)), reading only the blobs needed."""
        known = cache.entries if cache is not None else {}
        # Symlinks (120000) and gitlinks (160000: a submodule's commit, absent here) are not read.
        regular = [(p, b) for p, m, b in entries if m != "120000" and not m.startswith("160")]
        sizes = self._blob_sizes(b for _p, b in regular)
        # Size before content: a file over the limit is reported from its size alone, and a file
        # that can never be an object (a bad name, a stray file) is never read at all.
        wanted = [
            b
            for p, b in regular
            if sizes[b] <= MAX_BYTES
            and (p, b) not in known
            and b not in self.blobs
            and (p == "cluster.yaml" or classify(p)[0] is not None)
        ]
        # Taken before the read: reading the wanted blobs may clear the bounded cache.
        cached = {b: self.blobs[b] for _p, b in regular if b in self.blobs}
        fresh = self._read_blobs(wanted)
        out = {}
        for p, m, b in entries:
            file = self._files.get((p, m, b))
            special = m == "120000" or m.startswith("160")
            content = None if special else fresh.get(b, cached.get(b))
            if file is None or (file.content is None and content is not None):
                file = SourceFile(p, content, b, symlink=m == "120000", size=None if special else sizes[b])
            out[p] = file
        return out

    def _kept(self, file: SourceFile) -> SourceFile:
        """``file`` as it is kept between snapshots: without content once the blob cache dropped it."""
        if file.content is None or file.blob in self.blobs:
            return file
        return dataclasses.replace(file, content=None)

    def _needs_content(self, path: str, mode: str, file: SourceFile) -> bool:
        """Whether a kept file may have to be read again (its content was dropped)."""
        return file.content is None and mode != "120000" and not mode.startswith("160") and not file.symlink

    def _listing(self, commit: str) -> dict[str, tuple[str, str]]:
        """path -> (mode, blob) of the relevant files at ``commit``.

        After the first commit only the difference to the previous one is read (``diff-tree``),
        so a re-plan after a push costs what the push changed, not the size of the tree.
        """
        if self._listed_at == commit:
            self._changed = (commit, set())
            return self._listed
        if self._listed_at is not None:
            proc = git.probe(
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
            )
            if proc.returncode == 0:  # else (e.g. the old commit was garbage-collected): list it all
                listed = dict(self._listed)
                changed: set[str] = set()
                tokens = proc.stdout.split(b"\0")
                for meta, path_b in zip(tokens[0::2], tokens[1::2], strict=False):
                    if not meta:
                        continue
                    _old_mode, mode, _old_blob, blob, status = meta.decode().lstrip(":").split()
                    path = self._relative(decode_path(path_b))
                    changed.add(path)
                    if status == "D":
                        listed.pop(path, None)
                    else:
                        listed[path] = (mode, blob)
                self._changed = (self._listed_at, changed)
                self._listed, self._listed_at = listed, commit
                return listed
        listing = git.run(self.path, "ls-tree", "-r", "-z", "--full-tree", commit, "--", *self._pathspecs())
        listed = {}
        for record in listing.split(b"\0"):
            if not record:
                continue
            meta, _, path_b = record.partition(b"\t")
            mode, _type, blob = meta.decode().split()
            listed[self._relative(decode_path(path_b))] = (mode, blob)
        self._changed = (None, set())
        self._listed, self._listed_at = listed, commit
        return listed

    def _relative(self, path: str) -> str:
        return path[len(self.prefix) :] if self.prefix else path

    def _pathspecs(self) -> list[str]:
        return [f"{self.prefix}users", f"{self.prefix}cluster.yaml"]

    def _blob_sizes(self, blobs: Iterable[str]) -> dict[str, int]:
        """blob -> size in bytes for (at least) ``blobs``, asking git (``cat-file --batch-check``:
        headers only) for the ones not seen before. Raises SourceUnavailable when a blob is missing."""
        todo = sorted({b for b in blobs if b not in self._sizes})
        if todo:
            out = git.run(self.path, "cat-file", "--batch-check", input=("\n".join(todo) + "\n").encode())
            for blob, line in zip(todo, out.split(b"\n"), strict=False):
                fields = line.split()
                if len(fields) != 3 or not fields[2].isdigit():
                    raise SourceUnavailable(
                        f"blob {blob} cannot be read in {self.path}: {line.decode(errors='replace')}"
                    )
                self._sizes[blob] = int(fields[2])
        return self._sizes

    def _read_blobs(self, blobs: Iterable[str]) -> dict[str, bytes]:
        """Return the content of ``blobs`` (read with one ``cat-file --batch``, streamed, so that only
        what is returned is held) and keep it in the blob cache while that stays under its bound.
        Raises SourceUnavailable when git cannot give one."""
        todo = sorted(set(blobs))
        if not todo:
            return {}
        got: dict[str, bytes] = {}
        for blob, size, content in git.read_objects(self.path, todo, MAX_BYTES):
            if size < 0:
                raise SourceUnavailable(f"blob {blob} cannot be read in {self.path}")
            if content is not None:  # None: over the limit, asked by mistake (skipped, never held)
                got[blob] = content
        for blob, content in got.items():
            if self._blob_bytes + len(content) > BLOB_CACHE_BYTES:
                self.blobs.clear()
                self._blob_bytes = 0
                self._clears += 1
            self.blobs[blob] = content
            self._blob_bytes += len(content)
        return got

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
            self._created_moved = (commit, set())  # read again: nothing moved since itself
            return self._created
        rev_range = commit
        base = dict(self._created)
        if self._created_at is not None:
            is_ancestor = git.probe(self.path, "merge-base", "--is-ancestor", self._created_at, commit).returncode == 0
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
        if self._listed_at == commit and len(base) > len(self._listed) + 1024:
            # Paths deleted since are never asked for again (a re-added file is a new add).
            base = {p: t for p, t in base.items() if p in self._listed}
        moved_from = self._created_at if rev_range != commit else None
        self._created_moved = (moved_from, set(added) if moved_from is not None else set())
        self._created, self._created_at = base, commit
        return base

    def introduction_times(self, parents: list[str], paths: list[str]) -> dict[str, int]:
        """For a merge with ``parents``: path -> author time of the oldest commit on the merged
        side (``parents[0]..parents[1:]``) that added it. Paths added by the merge itself are absent."""
        wanted = set(paths)
        out: dict[str, int] = {}
        side = [f"^{parents[0]}", *parents[1:]]
        # Literal pathspecs: a name with `*`, `?` or `[` must not match other files as a pattern.
        specs: list[str] | None = [f":(literal){self.prefix}{p}" for p in paths]
        if sum(len(p) + 1 for p in paths) > PATHSPEC_BYTES:
            specs = None  # a merge adding many files: all relevant paths, filtered here (argv has a limit)
        for _parents, when, added in self._adds(*side, pathspecs=specs):
            for path in added:
                if path in wanted:
                    out[path] = when  # newest first: the last one seen is the oldest add
        return out

    def _adds(self, *rev_args: str, pathspecs: list[str] | None = None) -> list[tuple[list[str], int, list[str]]]:
        """(parents, author time, added paths) of each commit in ``rev_args`` that added a
        relevant file, newest first. Paths are NUL-separated (-z): any byte in a name is safe,
        and a header token cannot be a path (paths start with users/ or cluster.yaml)."""
        out = git.run(
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
                commits[-1][2].append(self._relative(decode_path(raw)))
        return commits
