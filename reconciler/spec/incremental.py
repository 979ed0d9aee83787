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
The result equals a full :func:`load` of the same files (``tests/unit/test_incremental_load.py``).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from reconciler.errors import Issue
from reconciler.spec.aliases import clashes
from reconciler.spec.loader import ModelCheck, ParseCache, SourceFile, TaskCheck, check_ids, drop_clashes, load
from reconciler.spec.paths import FileSystem, ScopedFileSystem, scoped
from reconciler.spec.types import DesiredState, ModelSpec, ObjectKey, TaskSpec

CLUSTER = "cluster.yaml"
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
    _changed: int | None = None  # the scoped file system's ``changed`` as of the last load

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
    ) -> DesiredState:
        """Return what ``load(files, ...)`` returns (with this loader's cache). A new object each
        time: the caller may change it. Raises what :func:`load` raises (then nothing is kept)."""
        created = created or {}
        cluster_file = next((f for f in files if f.path == CLUSTER), None)
        scopes = scoped(fs)
        # Scoped: a folder's own answers move only its generation (see _reload_changed).
        generation = scopes.generation_of(None) if scopes is not None else getattr(fs, "generation", None)
        changed = scopes.changed if scopes is not None else None
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
        try:
            if self._cluster is None:
                base = [cluster_file] if cluster_file is not None else []
                every = dict(kw, fs=scopes.scope(None)) if scopes is not None else kw
                self._cluster = load(base, default_time=default_time, prune=False, **every)
            grouped: dict[str, dict[str, _Signature]] = {}
            for file in files:
                path = file.path
                if path.startswith("users/"):
                    name = path.split("/", 2)[1]
                    group = grouped.get(name)
                    if group is None:
                        group = grouped[name] = {}
                    group[path] = (file, created.get(path, default_time))
            for name in [n for n in self._folders if n not in grouped]:
                self._drop(name)
            for name, sigs in grouped.items():
                old = self._folders.get(name)
                if old is not None and old.files == sigs:
                    continue
                if old is not None:
                    self._drop(name)
                self._add(name, sigs, default_time, kw)
            if scopes is not None and changed != self._changed:
                self._reload_changed(scopes, default_time, kw)
            result = self._merge(revision, approve_prune)
        except Exception:
            self._reset()
            raise
        self._basis, self._changed = basis, changed
        if rebased:  # every folder was built again: what was built on the old basis is dead
            self.cache.keep_basis(cluster_file.blob if cluster_file else None, basis[3])
        if len(self.cache.entries) > 2 * len(files) + 1024 or len(self.cache.built) > 2 * len(files) + 1024:
            self._prune(files)
        return result

    def _reset(self) -> None:
        self._basis, self._cluster, self._changed = None, None, None
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
