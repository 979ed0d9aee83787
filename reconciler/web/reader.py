"""The page's view of the status branch: the status store (:mod:`reconciler.status.store`), the one
reader of the branch, under the name the page's handler uses."""

from __future__ import annotations

from reconciler.status.store import StatusSnapshot, StatusStore

StatusReader = StatusStore

__all__ = ["StatusReader", "StatusSnapshot"]
