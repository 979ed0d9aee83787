"""File-system answers remembered between ticks, so a push is not held up by 10,000 path checks. I/O.

The path policy asks the file system about every object's paths on every load (does the
model folder exist, where does it resolve to). At 10,000 objects that is most of a push's
load time. :class:`CachedFS` remembers the answers; the loop clears them on every timer
tick (``refresh``), so a push tick reuses what the last timer tick saw and checks only
paths it has not seen. What this trades: a folder created or removed on the cluster is
noticed by the next timer tick (``--observe-interval``, 5 s by default), not by a push in
between — the same delay as any other change made outside git.
"""

from __future__ import annotations

import threading

from reconciler.spec.paths import FileSystem


class CachedFS:
    """A :class:`~reconciler.spec.paths.FileSystem` that remembers ``inner``'s answers until ``refresh()``."""

    def __init__(self, inner: FileSystem) -> None:
        self.inner = inner
        # The loader keys the objects it built by generation: within one, the answers (and so
        # every object built from unchanged files) are the same, and nothing is rebuilt.
        self.generation = 0
        self._lock = threading.Lock()
        self._answers: dict[tuple[str, str], object] = {}

    def refresh(self) -> None:
        """Forget every answer: the next questions go to the file system."""
        with self._lock:
            self._answers = {}
            self.generation += 1

    def _ask(self, what: str, path: str) -> object:
        key = (what, path)
        answers = self._answers
        if key in answers:
            return answers[key]
        value = getattr(self.inner, what)(path)
        with self._lock:
            answers[key] = value
        return value

    def exists(self, path: str) -> bool:
        return bool(self._ask("exists", path))

    def realpath(self, path: str) -> str:
        return str(self._ask("realpath", path))

    def listdir(self, path: str) -> list[str]:
        value = self._ask("listdir", path)
        return [str(v) for v in value] if isinstance(value, list) else []

    def mtime(self, path: str) -> float:
        value = self._ask("mtime", path)
        return float(value) if isinstance(value, (int, float)) else 0.0

    def read_text(self, path: str) -> str | None:
        value = self._ask("read_text", path)
        return None if value is None else str(value)
