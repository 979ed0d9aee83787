"""Where argus's dashboard client takes the Ray auth token from (the real heads: tests/e2e/test_ray_auth.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.dashboard import token_from_env
from reconciler.errors import ArgusError


def test_token_sources_and_a_broken_token_file(tmp_path: Path) -> None:
    assert token_from_env({}) is None
    assert token_from_env({"RAY_AUTH_TOKEN": " t1 ", "RAY_AUTH_TOKEN_PATH": "/nonexistent"}) == "t1"
    assert token_from_env({"ARGUS_RAY_TOKEN": "a", "RAY_AUTH_TOKEN": "b"}) == "a"
    with pytest.raises(ArgusError, match="cannot read"):
        token_from_env({"RAY_AUTH_TOKEN_PATH": str(tmp_path / "missing")})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ArgusError, match="empty"):
        token_from_env({"RAY_AUTH_TOKEN_PATH": str(tmp_path / "empty")})
