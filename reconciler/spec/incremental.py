"""Load a tree again after a push at the cost of what the push changed. Pure.

:func:`~reconciler.spec.loader.load` reads every file of the tree. Everything it decides about
one file depends on cluster.yaml, on the file itself and on files of the same user folder (a
model's ``source: task:<name>``, an invalid file's claim on its object's path), with one
exception: served-name clashes, which are resolved over all models at once. So the tree is
loaded per user folder; a later load re-loads only the folders whose files (path, blob, kind,
size, creation time) changed, and resolves clashes again among the models that share a name.
On a :class:`~reconciler.spec.paths.ScopedFileSystem` (the daemon's) each folder is loaded through
its own scope and re-loaded also when its generation moves (an answer it was given changed); a
change of what every folder asked, of cluster.yaml, of the checks, of another file system's
generation or of the cache starts over.
Told which paths changed since the revision it loaded last (``changed``, from git's
``diff-tree``), it looks only at those paths' folders: a push costs what it changed, not a pass
over every file of the tree. The result equals a full :func:`load` of the same files
(``tests/unit/test_incremental_load.py``).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from reconciler.errors import Issue
from reconciler.spec.aliases import clashes
from reconciler.spec.loader import ModelCheck, ParseCache, SourceFile, TaskCheck, check_ids, drop_clashes, load
from reconciler.spec.paths import FileSystem, ScopedFileSystem, scoped
from reconciler.spec.types import DesiredState, ModelSpec, ObjectKey, TaskSpec

CLUSTER = "cluster.yaml"
_SERIALS = itertools.count(1)  # the serials of loaded states (DesiredState.serial), one sequence
# What a folder's load depends on, per file: the file (same object when unchanged) and its time.
_Signature = tuple[SourceFile, int]


@dataclass
class _Folder:
    """One user folder's files and what loading them alone gave (clashes not resolved)."""

    files: dict[str, _Signature]
    models: dict[ObjectKey, ModelSpec]
    tasks: dict[ObjectKey, TaskSpec]
    invalid: dict[ObjectKey, list[Issue]]
    issues: list[Issue]
    generation: object = None  # its scope's file-system generation when loaded (None: not scoped)


@dataclass
class IncrementalLoader:
    """Loads successive trees, reusing each user folder's result while its inputs are unchanged.

    Holds one entry per user folder of the last tree loaded (dropped with the folder) and the
    inputs that every folder depends on; ``folders_loaded`` counts folder loads (benchmarks, tests).
    """

    cache: ParseCache = field(default_factory=ParseCache)
    folders_loaded: int = 0
    _basis: tuple[Any, ...] | None = None
    _cluster: DesiredState | None = None
    _cluster_source: SourceFile | None = None
    _folders: dict[str, _Folder] = field(default_factory=dict)
    _order: list[str] = field(default_factory=list)  # folder names, sorted
    # Served name or alias -> the one model holding it; names held by several models (clashes
    # to resolve) are in _shared instead. Two tables, not a set per name: 100,000 one-element
    # sets took ~20 MB.
    _names: dict[str, ObjectKey] = field(default_factory=dict)
    _shared: dict[str, set[ObjectKey]] = field(default_factory=dict)
    _revision: str | None = None  # what the last load was of (``changed`` is relative to it)
    _serial: int = 0  # the serial of the last state returned (0: none since the last reset)
    _moved: set[ObjectKey] = field(default_factory=set)  # objects a load may have changed (DesiredState.changed)
    # Folders with a file that has no creation time: its time is the commit's, which every
    # commit moves, so they are looked at on every load.
    _defaulted: set[str] = field(default_factory=set)
    _fs_changed: int | None = None  # the scoped file system's ``changed`` as of the last load
    _gone: dict[str, _Folder] = field(default_factory=dict)  # folders a load dropped, until it ends

    def load(
        self,
        files: Sequence[SourceFile],
        *,
        created: Mapping[str, int] | None = None,
        default_time: int = 0,
        fs: FileSystem | None = None,
        task_check: TaskCheck | None = None,
        model_check: ModelCheck | None = None,
        revision: str | None = None,
        approve_prune: bool = False,
        changed: tuple[str, Collection[str]] | None = None,
    ) -> DesiredState:
        """Return what ``load(files, ...)`` returns (with this loader's cache): a new object each
        time, carrying the change feed (``serial``, ``changed``), so the caller must not change it
        (a changed copy is made with ``dataclasses.replace``, which drops the feed). Raises what
        :func:`load` raises (then nothing is kept).

        ``changed``: (a revision, the paths whose file or creation time differs between it and
        this one); when the revision is the one this loader loaded last, ``files`` must be in
        path order, and only the folders of those paths are looked at."""
        created = created or {}
        cluster_file = next((f for f in files if f.path == CLUSTER), None)
        scopes = scoped(fs)
        # Scoped: a folder's own answers move only its generation (see _reload_changed).
        generation = scopes.generation_of(None) if scopes is not None else getattr(fs, "generation", None)
        fs_changed = scopes.changed if scopes is not None else None
        basis = (cluster_file, id(fs) if fs is not None else None, generation, check_ids(task_check, model_check))
        kw: dict[str, Any] = dict(fs=fs, cache=self.cache, task_check=task_check, model_check=model_check)
        if fs is not None and generation is None:  # it answers anew every time: nothing can be reused
            self._reset()
            return load(
                files, created=created, default_time=default_time, revision=revision, approve_prune=approve_prune, **kw
            )
        rebased = basis != self._basis
        if rebased:
            self._reset()
        self._cluster_source = cluster_file
        follows = self._serial
        # A model that shared a name may lose or win it back by another folder's change.
        self._moved = {key for keys in self._shared.values() for key in keys}
        self._gone = {}
        try:
            if self._cluster is None:
                base = [cluster_file] if cluster_file is not None else []
                every = dict(kw, fs=scopes.scope(None)) if scopes is not None else kw
                self._cluster = load(base, default_time=default_time, prune=False, **every)
            if not rebased and changed is not None and changed[0] == self._revision and self._revision is not None:
                looked = {p.split("/", 2)[1] for p in changed[1] if p.startswith("users/")} | self._defaulted
                grouped = {name: _folder_files(files, name, created, default_time) for name in looked}
                gone = [n for n, sigs in grouped.items() if not sigs and n in self._folders]
                grouped = {n: sigs for n, sigs in grouped.items() if sigs}
            else:
                grouped = {}
                for file in files:
                    path = file.path
                    if path.startswith("users/"):
                        name = path.split("/", 2)[1]
                        group = grouped.get(name)
                        if group is None:
                            group = grouped[name] = {}
                        group[path] = (file, created.get(path, default_time))
                gone = [n for n in self._folders if n not in grouped]
                self._defaulted = set()
            for name in gone:
                self._drop(name)
                self._defaulted.discard(name)
            for name, sigs in grouped.items():
                if any(path not in created for path in sigs):
                    self._defaulted.add(name)
                else:
                    self._defaulted.discard(name)
                old = self._folders.get(name)
                if old is not None and old.files == sigs:
                    continue
                if old is not None:
                    self._drop(name)
                self._add(name, sigs, default_time, kw)
            if scopes is not None and fs_changed != self._fs_changed:
                self._reload_changed(scopes, default_time, kw)
            for folder in self._gone.values():  # not replaced
                _note_moved(self._moved, folder, None)
            self._gone = {}
            result = self._merge(revision, approve_prune)
        except Exception:
            self._reset()
            raise
        self._serial = result.serial = next(_SERIALS)
        if follows and not rebased:
            result.changed = (follows, frozenset(self._moved))
        self._moved = set()
        self._basis, self._revision, self._fs_changed = basis, revision, fs_changed
        if rebased:  # every folder was built again: what was built on the old basis is dead
            self.cache.keep_basis(cluster_file.blob if cluster_file else None, basis[3])
        # The bound a full load keeps (loader.load): a pass over the tree every n/8 + 64 new entries.
        limit = len(files) + len(files) // 8 + 64
        cache = self.cache
        if len(cache.entries) > limit or len(cache.built) > limit or len(cache.keys) > limit:
            self._prune(files)
        return result

    def _reset(self) -> None:
        self._basis, self._cluster, self._revision, self._defaulted, self._serial = None, None, None, set(), 0
        self._fs_changed = None
        self._gone, self._moved = {}, set()
        self._folders, self._order, self._names, self._shared = {}, [], {}, {}

    def _add(self, name: str, sigs: dict[str, _Signature], default_time: int, kw: dict[str, Any]) -> None:
        files = [f for f, _when in sigs.values()]
        created = {path: when for path, (_f, when) in sigs.items()}
        cluster_file = self._cluster_source
        scopes = scoped(kw["fs"])
        fs = scopes.scope(name) if scopes is not None else kw["fs"]
        part = load(
            [*([cluster_file] if cluster_file is not None else []), *files],
            created=created,
            default_time=default_time,
            resolve_clashes=False,
            prune=False,
            **dict(kw, fs=fs),
        )
        self.folders_loaded += 1
        issues = [i for i in part.issues if i.path != CLUSTER]
        generation = getattr(fs, "generation", None) if scopes is not None else None
        folder = _Folder(sigs, part.models, part.tasks, part.invalid, issues, generation)
        self._folders[name] = folder
        _note_moved(self._moved, self._gone.pop(name, None), folder)
        bisect.insort(self._order, name)
        for key, model in folder.models.items():
            for served in dict.fromkeys((model.served_name, model.alias)):
                shared = self._shared.get(served)
                holder = self._names.get(served)
                if shared is not None:
                    shared.add(key)
                elif holder is not None and holder != key:
                    self._shared[served] = {holder, key}
                    del self._names[served]
                else:
                    self._names[served] = key

    def _reload_changed(self, fs: ScopedFileSystem, default_time: int, kw: dict[str, Any]) -> None:
        """Load again, with the same files, every folder whose generation on ``fs`` moved since it
        was loaded (an answer it was given changed)."""
        for name in [n for n, f in self._folders.items() if f.generation != fs.generation_of(n)]:
            sigs = self._folders[name].files
            self._drop(name)
            self._add(name, sigs, default_time, kw)

    def _drop(self, name: str) -> None:
        folder = self._folders.pop(name)
        self._gone[name] = folder  # compared with what replaces it, if anything does (_add)
        del self._order[bisect.bisect_left(self._order, name)]
        for key, model in folder.models.items():
            for served in dict.fromkeys((model.served_name, model.alias)):
                shared = self._shared.get(served)
                if shared is not None:
                    shared.discard(key)
                    if len(shared) == 1:
                        self._names[served] = shared.pop()
                        del self._shared[served]
                elif self._names.get(served) == key:
                    del self._names[served]

    def _merge(self, revision: str | None, approve_prune: bool) -> DesiredState:
        assert self._cluster is not None
        base = self._cluster
        state = DesiredState(
            cluster=base.cluster, cluster_valid=base.cluster_valid, revision=revision, approve_prune=approve_prune
        )
        issues: list[Issue] = list(base.issues)
        for name in self._order:
            folder = self._folders[name]
            state.models.update(folder.models)
            state.tasks.update(folder.tasks)
            state.invalid.update(folder.invalid)
            issues.extend(folder.issues)
        # Only a model some other model shares a name with can lose it (see aliases.clashes).
        contended = {key for keys in self._shared.values() for key in keys}
        self._moved |= contended
        if contended:
            issues.extend(drop_clashes(state, clashes(state.models[k] for k in contended)))
        state.issues = sorted(set(issues))
        return state

    def _prune(self, files: Sequence[SourceFile]) -> None:
        """Forget parses and built objects of files no longer in the tree."""
        live = {(f.path, f.blob) for f in files}
        self.cache.keep_only(live, {k for k in self.cache.built if (k[0], k[1]) in live})
        paths = {f.path for f in files}
        self.cache.keys = {p: k for p, k in self.cache.keys.items() if p in paths}


def _folder_files(
    files: Sequence[SourceFile], name: str, created: Mapping[str, int], default_time: int
) -> dict[str, _Signature]:
    """The files of user folder ``name`` (``users/<name>`` itself and everything under it) among
    ``files``, which are in path order: found by bisection, O(log n + the folder's files)."""
    out: dict[str, _Signature] = {}
    exact = f"users/{name}"
    at = bisect.bisect_left(files, exact, key=_path)
    if at < len(files) and files[at].path == exact:
        out[exact] = (files[at], created.get(exact, default_time))
    # "/" sorts right before "0": the folder's paths are the ones in [users/<name>/, users/<name>0).
    low = bisect.bisect_left(files, exact + "/", key=_path)
    high = bisect.bisect_left(files, exact + "0", lo=low, key=_path)
    for file in files[low:high]:
        out[file.path] = (file, created.get(file.path, default_time))
    return out


def _path(file: SourceFile) -> str:
    return file.path


def _note_moved(moved: set[ObjectKey], old: _Folder | None, new: _Folder | None) -> None:
    """Add to ``moved`` the objects whose spec (by identity: unchanged files give the very same
    objects), invalidity or issues differ between folder ``old`` and folder ``new``."""
    if old is None or new is None:
        for folder in (old, new):
            if folder is not None:
                moved.update(folder.models, folder.tasks, folder.invalid)
        return
    for table_old, table_new in ((old.models, new.models), (old.tasks, new.tasks)):
        moved.update(k for k in table_old.keys() | table_new.keys() if table_old.get(k) is not table_new.get(k))
    moved.update(k for k in old.invalid.keys() | new.invalid.keys() if old.invalid.get(k) != new.invalid.get(k))
