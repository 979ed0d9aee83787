"""Read the desired state at one commit of the tracked branch into a :class:`Revision`. I/O.

:class:`RevisionReader` owns what reading remembers between commits, each bounded by the tree
that exists now: the parse cache (one entry per blob of the tree), the incremental loader (one
entry per user folder) and the signature verifier's verdicts. A push reads only what it changed
(``reconciler/spec/incremental.py``); a loader bug is contained to the files it raises for.
"""

from __future__ import annotations

import hashlib
import logging
import os
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from reconciler.contain import culprits, raises
from reconciler.errors import Issue
from reconciler.source.git import Snapshot
from reconciler.source.remote import RepoSource
from reconciler.source.signatures import SignatureVerifier, SigningPolicy
from reconciler.spec.incremental import IncrementalLoader
from reconciler.spec.loader import ModelCheck, ParseCache, SourceFile, TaskCheck, classify, load
from reconciler.spec.paths import FileSystem
from reconciler.spec.types import ClusterSpec, DesiredState, ObjectKey

log = logging.getLogger("argus")


@dataclass(frozen=True)
class Revision:
    """The desired state at ``commit`` and what reading it found: ``rejections`` (unverified
    changes kept out), ``trust_notes``, the commit's ``subject`` and ``commit_time``, and
    ``spec_ids`` (path -> blob of every object file) and, when they were patched from the
    revision read before, ``changed``: (that revision's commit, the paths whose blob may differ)."""

    commit: str
    desired: DesiredState
    commit_time: int = 0
    subject: str = ""
    spec_ids: dict[str, str] = field(default_factory=dict)
    rejections: tuple[str, ...] = ()
    trust_notes: tuple[str, ...] = ()
    changed: tuple[str, frozenset[str]] | None = None

    @property
    def notes(self) -> list[str]:
        """What the status says about reading this revision."""
        return [*self.trust_notes, *(f"unverified change kept out: {r}" for r in self.rejections)]


class RevisionReader:
    """Reads ``branch`` of ``source``. ``fs`` answers the loader's file-system checks;
    ``task_check``/``model_check`` validate overrides and engine arguments (None: not checked);
    ``signing``: which commits are trusted; ``state_dir``: where the verifier keeps its anchor."""

    def __init__(
        self,
        source: RepoSource,
        branch: str,
        *,
        fs: FileSystem,
        task_check: TaskCheck | None = None,
        model_check: ModelCheck | None = None,
        signing: SigningPolicy | None = None,
        state_dir: str | None = None,
    ) -> None:
        self.source = source
        self.branch = branch
        self.fs = fs
        self.task_check = task_check
        self.model_check = model_check
        self.signing = signing or SigningPolicy()
        self._cache = ParseCache()
        self._loader = IncrementalLoader(self._cache)
        state_file = None
        if state_dir:
            digest = hashlib.sha256(f"{source.url}\0{branch}".encode()).hexdigest()[:16]
            state_file = os.path.join(state_dir, f"trust-{digest}.json")
        self._verifier = SignatureVerifier(source.repo, self.signing, state_file)
        self._ids: tuple[str | None, dict[str, str]] = (None, {})  # the last snapshot's spec ids

    def read(self, commit: str | None = None, *, fetch: bool = True) -> Revision:
        """Fetch (unless ``fetch`` is False) and read the branch head (or ``commit``).
        Raises SourceUnavailable."""
        if fetch:
            self.source.fetch()
        commit = commit or self.source.repo.resolve(f"refs/heads/{self.branch}")
        trusted = self._verifier.trusted(commit)
        snap = self.source.repo.snapshot(commit, self._cache, trusted.entries)
        signed = trusted.entries is not None
        inputs: dict[str, Any] = dict(
            created=trusted.created if signed else snap.created,
            default_time=snap.commit_time,
            fs=self.fs,
            task_check=self.task_check,
            model_check=self.model_check,
            revision=commit,
            approve_prune=trusted.approve_prune if signed else snap.approve_prune,
        )
        changed = (snap.since, snap.changed) if snap.since is not None and snap.changed is not None else None
        try:
            desired = self._loader.load(snap.files, changed=changed, **inputs)
        except Exception:  # the loader's bug: contain it per file (the loader keeps nothing then)
            desired = load_contained(snap.files, partial(load, cache=self._cache, **inputs))
        notes = list(trusted.notes)
        if desired.cluster.security.require_signed_commits and not self.signing.required:
            notes.append(
                "cluster.yaml's security settings are ignored: the daemon's own configuration decides "
                "(--require-signed-commits, --allowed-signers)"
            )
        spec_ids, patched = self._spec_ids(snap)
        return Revision(
            commit=commit,
            desired=desired,
            commit_time=snap.commit_time,
            subject=snap.subject,
            spec_ids=spec_ids,
            rejections=tuple(str(r) for r in trusted.rejections),
            trust_notes=tuple(notes),
            changed=patched,
        )

    def _spec_ids(self, snap: Snapshot) -> tuple[dict[str, str], tuple[str, frozenset[str]] | None]:
        """path -> blob of every file under ``users/`` in ``snap``, and (the commit read last, the
        paths that may differ from its) when patched (else None). Returns a new dict (a revision
        keeps it): the last one patched at the paths the snapshot names as changed since the one
        it follows, when that is the last one read (a full pass otherwise)."""
        last_commit, last = self._ids
        patched = None
        if snap.since is None or snap.changed is None or snap.since != last_commit:
            ids = {f.path: f.blob for f in snap.files if f.path.startswith("users/")}
        else:
            patched = (snap.since, snap.changed)
            ids = dict(last)  # C-speed
            files = snap.files  # in path order
            for path in snap.changed:
                if not path.startswith("users/"):
                    continue
                at = bisect_left(files, path, key=_file_path)
                if at < len(files) and files[at].path == path:
                    ids[path] = files[at].blob
                else:
                    ids.pop(path, None)
        self._ids = (snap.commit, ids)
        return ids, patched

    def refresh_fs(self, interrupted: Callable[[], bool] | None = None) -> bool:
        """Check remembered file-system answers again (the loop does it on timer ticks, not on
        pushes): the next read re-loads the user folders whose answers changed. ``interrupted``:
        see :meth:`reconciler.fscache.CachedFS.refresh`. Returns False when it was interrupted."""
        refresh = getattr(self.fs, "refresh", None)
        if callable(refresh):
            return bool(refresh(interrupted))
        return True

    def memo_sizes(self) -> dict[str, int]:
        """How many entries each memo holds (the soak checks they stay bounded)."""
        cache, loader, repo = self._cache, self._loader, self.source.repo
        sizes = {
            "parse_cache": len(cache.entries) + len(cache.built) + len(cache.keys),
            "loader": len(loader._folders) + len(loader._names),
            "git_created": len(repo._created),
            "git_sizes": len(repo._sizes),
        }
        held = getattr(self.fs, "held", None)
        if callable(held):
            sizes["fs_answers"] = held()
        return sizes


def load_contained(files: list[SourceFile], loader: Callable[[list[SourceFile]], DesiredState]) -> DesiredState:
    """``loader(files)``; when it raises, the files it raises for become invalid objects (kept as
    they run, INVALID with the error) and every other file is loaded as usual.

    Raises the loader's exception only when it cannot be pinned on object files."""
    try:
        return loader(files)
    except Exception as exc:
        first = exc
    base = [f for f in files if not f.path.startswith("users/")]
    objects = [f for f in files if f.path.startswith("users/")]
    if raises(lambda: loader(base)) is not None:
        # cluster.yaml itself: nothing can be planned safely, keep everything as it runs.
        log.error("loading cluster.yaml failed", exc_info=first)
        issue = Issue("cluster.yaml", 0, f"internal error while loading: {first!r}")
        return DesiredState(cluster=ClusterSpec(), cluster_valid=False, issues=[issue])
    bad = culprits(objects, lambda sub: raises(lambda: loader(base + list(sub))) is not None)
    if not bad:
        raise first
    bad_paths = {f.path for f in bad}
    desired = loader(base + [f for f in objects if f.path not in bad_paths])
    for file in bad:
        error = raises(partial(loader, [*base, file]))
        log.error("loading %r failed", file.path, exc_info=error)
        issue = Issue(file.path, 0, f"internal error while loading: {error!r}")
        desired.issues.append(issue)
        key = _key_of(file.path)
        if key is not None:
            desired.invalid[key] = [issue]
    desired.issues.sort()
    return desired


def _key_of(path: str) -> ObjectKey | None:
    """The object a path under ``users/`` names, or None (not an object path, or unparseable)."""
    try:
        return classify(path)[0]
    except Exception:
        return None


def _file_path(file: SourceFile) -> str:
    return file.path
