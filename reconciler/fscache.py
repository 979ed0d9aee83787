"""File-system answers remembered between ticks and checked again on timer ticks. I/O.

The path policy asks the file system about every object's paths (does the model folder exist,
where does it resolve to). At 10,000 objects that is most of a load's time. :class:`CachedFS`
remembers the answers, so a push tick asks only about paths it has not seen. The loop's timer
ticks (``--observe-interval``, 5 s by default) call :meth:`CachedFS.refresh`: it asks the file
system every remembered question again, and only the user folders that asked a question whose
answer changed get a new generation; the incremental loader
(:mod:`reconciler.spec.incremental`) loads those folders again and reuses every other one, so a
timer tick on an unchanged file system loads nothing. What this trades: a folder created or
removed on the cluster is noticed by the next timer tick, not by a push in between (the same
delay as any other change made outside git).

Who asked what: the loader asks through :meth:`CachedFS.scope` — ``scope(user)`` while it loads
one user folder, ``scope(None)`` for what every folder depends on (a change there re-loads every
folder). A question many folders asked (the Hugging Face cache folder of a popular model) counts
for each of them. Questions asked on the :class:`CachedFS` itself (a full
:func:`~reconciler.spec.loader.load`) count for nobody: its ``generation`` moves on every refresh,
and their answers are forgotten by the next one.

Bounds: a question is kept while a folder that asked it has not changed since (its objects may have
been built on the answer). Questions of objects since deleted or edited stay until their folder
changes; when those make the table more than twice what a load from scratch asked (plus 1,024),
a refresh starts every folder over, and the table holds again only what the loads ask.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from reconciler.spec.paths import FileSystem

Question = tuple[str, str]  # (method, path)
Scope = str | None  # a user folder's name; None: every folder
# The table may hold GROWTH times what a load from scratch asked, plus SLACK, before it starts over.
GROWTH, SLACK = 2, 1024
CHECK_EVERY = 256  # questions asked again between two looks at whether a refresh is to stop


@dataclass(frozen=True, order=True, slots=True)
class ScopeGeneration:
    """A folder's generation (:meth:`CachedFS.generation_of`): the refresh in which its answers
    last changed. Never equal to a :class:`CachedFS`'s own ``generation`` (an int), so an object
    built on answers nobody tracked is never taken for one a folder's load built."""

    refresh: int


class _Answers:
    """The :class:`~reconciler.spec.paths.FileSystem` methods, answered by ``_get``."""

    __slots__ = ()

    def _get(self, what: str, path: str) -> object:
        raise NotImplementedError

    def exists(self, path: str) -> bool:
        return bool(self._get("exists", path))

    def realpath(self, path: str) -> str:
        return str(self._get("realpath", path))

    def listdir(self, path: str) -> list[str]:
        value = self._get("listdir", path)
        return [str(v) for v in value] if isinstance(value, list) else []

    def mtime(self, path: str) -> float:
        value = self._get("mtime", path)
        return float(value) if isinstance(value, (int, float)) else 0.0

    def read_text(self, path: str) -> str | None:
        value = self._get("read_text", path)
        return None if value is None else str(value)


class CachedFS(_Answers):
    """A :class:`~reconciler.spec.paths.ScopedFileSystem`: remembers ``inner``'s answers and
    which folder asked each; :meth:`refresh` finds the answers that changed. Thread-safe."""

    def __init__(self, inner: FileSystem) -> None:
        self.inner = inner
        # What callers that do not scope their questions key built objects by: every refresh
        # may have changed any answer they got.
        self.generation = 0
        self.changed = 0  # the generation of the last refresh that gave some folder a new one
        self._lock = threading.Lock()
        self._refreshing = threading.Lock()
        self._answers: dict[Question, object] = {}
        # Question -> who asked it since their answers last changed: one scope (most paths are one
        # user's) or a set of them. A question nobody tracks is answered for one refresh period.
        self._askers: dict[Question, Scope | set[Scope]] = {}
        # Scope -> the generation in which its answers last changed (absent: before any change).
        self._stamps: dict[Scope, int] = {}
        self._baseline: int | None = None  # the table's size after a load from scratch

    def scope(self, folder: Scope) -> FolderView:
        """Return a view whose questions count as ``folder``'s (None: every folder's), with
        ``generation`` as :meth:`generation_of` returns it now."""
        return FolderView(self, folder, self.generation_of(folder))

    def generation_of(self, folder: Scope) -> ScopeGeneration:
        """Return ``folder``'s generation: it changes exactly when a refresh found a changed answer
        to a question ``folder`` (or, for every folder, ``None``) asked."""
        with self._lock:
            shared = self._stamps.get(None, 0)
            # Stamps are refresh generations, which only grow: the max moves when either does.
            return ScopeGeneration(shared if folder is None else max(shared, self._stamps.get(folder, 0)))

    def held(self) -> int:
        """Return how many answers and generations it holds (the soak checks they stay bounded)."""
        with self._lock:
            return len(self._answers) + len(self._askers) + len(self._stamps)

    def refresh(self, interrupted: Callable[[], bool] | None = None) -> bool:
        """Ask ``inner`` again every question some folder asked; give a new generation to every
        folder whose answer changed (to every folder when one asked by ``None`` did, or when the
        table outgrew its bound) and start a new ``generation``. Answers nobody asked through a
        scope are forgotten. Never raises for ``inner``: a question it raises for counts as changed.

        ``interrupted`` is called every :data:`CHECK_EVERY` questions: when it returns True the
        refresh stops and changes nothing (a push waiting: at 100,000 objects a refresh took 12 s
        beside the first status write). Returns whether the refresh was made."""
        with self._refreshing:
            with self._lock:
                before = {key: self._answers.get(key, _GONE) for key in self._askers}
            # The file system is asked outside the lock: other threads' questions are not held up.
            fresh: dict[Question, object] = {}
            failed: list[Question] = []
            for n, key in enumerate(before, 1):
                try:
                    fresh[key] = getattr(self.inner, key[0])(key[1])
                except Exception:
                    failed.append(key)
                if interrupted is not None and not n % CHECK_EVERY and interrupted():
                    return False
            with self._lock:
                self.generation += 1
                # Askers as they are now: a scope may have asked (and got the old answer) meanwhile.
                bumped: set[Scope] = set()
                for key in [*failed, *(k for k, v in fresh.items() if v != before[k])]:
                    if key in self._askers:
                        askers = self._askers[key]
                        if isinstance(askers, set):
                            bumped.update(askers)
                        else:
                            bumped.add(askers)
                size = len(self._askers) + len(self._stamps)
                if self._baseline is None and self._askers:
                    self._baseline = size
                grown = self._baseline is not None and size > GROWTH * self._baseline + SLACK
                if None in bumped or grown:
                    # Every folder is loaded again from scratch and asks again what it still needs.
                    self._stamps = {None: self.generation}
                    self._askers = {}
                    self._baseline = None
                    self.changed = self.generation
                elif bumped:
                    for folder in bumped:
                        self._stamps[folder] = self.generation
                    # Their next load builds every object of theirs again, asking what it needs.
                    kept = ((k, _without(a, bumped)) for k, a in self._askers.items())
                    self._askers = {k: a for k, a in kept if not isinstance(a, _Gone)}
                    self.changed = self.generation
                answers = dict(fresh)
                for key in self._askers:
                    if key not in answers and key in self._answers:
                        answers[key] = self._answers[key]  # first asked during this refresh
                self._answers = answers
        return True

    def _get(self, what: str, path: str) -> object:
        return self._ask(what, path, None, False)

    def _ask(self, what: str, path: str, folder: Scope, tracked: bool) -> object:
        key = (what, path)
        with self._lock:
            if key in self._answers:
                if tracked:
                    self._track(key, folder)
                return self._answers[key]
        value = getattr(self.inner, what)(path)
        with self._lock:
            # Another thread may have asked meanwhile: everyone gets the one answer kept.
            value = self._answers.setdefault(key, value)
            if tracked:
                self._track(key, folder)
        return value

    def _track(self, key: Question, folder: Scope) -> None:
        if key not in self._askers:
            self._askers[key] = folder
            return
        askers = self._askers[key]
        if isinstance(askers, set):
            askers.add(folder)
        elif askers != folder:
            self._askers[key] = {askers, folder}


class _Gone:
    """No asker is left."""


_GONE = _Gone()


def _without(askers: Scope | set[Scope], bumped: set[Scope]) -> Scope | set[Scope] | _Gone:
    """Return ``askers`` less ``bumped`` (one scope as itself), or ``_GONE`` when none is left."""
    if not isinstance(askers, set):
        return _GONE if askers in bumped else askers
    left = askers - bumped
    if len(left) > 1:
        return left
    return left.pop() if left else _GONE


class FolderView(_Answers):
    """A :class:`CachedFS`'s answers, asked on behalf of one user folder's load (``folder`` None:
    every folder's). ``generation``: the folder's when the view was made."""

    __slots__ = ("_fs", "folder", "generation")

    def __init__(self, fs: CachedFS, folder: Scope, generation: ScopeGeneration) -> None:
        self._fs = fs
        self.folder = folder
        self.generation = generation

    def _get(self, what: str, path: str) -> object:
        return self._fs._ask(what, path, self.folder, True)
