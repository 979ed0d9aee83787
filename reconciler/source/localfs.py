"""The real file system behind :class:`reconciler.spec.paths.FileSystem`. I/O."""

from __future__ import annotations

import os


class LocalFS:
    """Answers the path policy's questions about this machine's file system."""

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def realpath(self, path: str) -> str:
        return os.path.realpath(path)

    def listdir(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except OSError:
            return []

    def mtime(self, path: str) -> float:
        try:
            return os.stat(path).st_mtime
        except OSError:
            return 0.0

    def read_text(self, path: str) -> str | None:
        try:
            with open(path, encoding="utf-8") as fh:
                return fh.read()
        except (OSError, UnicodeDecodeError):
            return None
