"""Dependency checks for tests: skip locally, fail in CI."""

from __future__ import annotations

import importlib
import os


def require(*modules: str) -> None:
    """Import ``modules``; skip the calling test when one is missing, or fail when ``CI`` is set.

    Raises pytest's Skipped or Failed outcome (pytest is imported lazily: only tests call this).
    """
    import pytest

    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            message = f"missing dependency {name!r}: {exc}"
            if os.environ.get("CI"):
                pytest.fail(message, pytrace=False)
            pytest.skip(message)
