"""Ray token authentication (``RAY_AUTH_MODE=token``), as the compose deployment runs it, against a real head.

One head with auth on: the dashboard's Jobs, Serve and cluster APIs refuse a caller without the token (and a
wrong one), and argus's dashboard client gets through with the token from its argument, ``ARGUS_RAY_TOKEN``
or the file ``RAY_AUTH_TOKEN_PATH`` names. The session's no-auth head shows the client still works where
the cluster has no auth, with a token configured or not.
"""

from __future__ import annotations

import secrets
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler.dashboard import Dashboard, DashboardError
from reconciler.errors import RayUnavailable
from reconciler.testing.deps import require
from reconciler.testing.ray_head import RayHead

pytestmark = pytest.mark.e2e

TOKEN = secrets.token_hex(32)


@pytest.fixture(scope="module")
def auth_head() -> Iterator[RayHead]:
    require("ray", "ray.serve")
    from reconciler.testing.ray_head import start_head

    head = start_head(num_cpus=1, auth_token=TOKEN)
    try:
        yield head
    finally:
        head.stop()
        shutil.rmtree(head.temp_dir, ignore_errors=True)


def status_of(url: str, headers: dict[str, str] | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_token_auth_refuses_callers_without_the_token(
    auth_head: RayHead, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    base = auth_head.dashboard_url
    for path in ("/api/jobs/", "/api/serve/applications/", "/api/version"):
        assert status_of(base + path) == 401, path
        assert status_of(base + path, {"Authorization": "Bearer not-the-token"}) == 403, path
        assert status_of(base + path, {"Authorization": f"Bearer {TOKEN}"}) == 200, path

    for name in ("ARGUS_RAY_TOKEN", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    # Refused credentials are the daemon's configuration problem: an outage to back off from (never an
    # object's permanent failure), with a message saying what to set.
    with pytest.raises(RayUnavailable, match=r"HTTP 401.*RAY_AUTH_TOKEN_PATH"):
        Dashboard(base).get("/api/jobs/")
    with pytest.raises(RayUnavailable, match="HTTP 403"):
        Dashboard(base, token="not-the-token").get("/api/jobs/")
    # A submission without the token is refused before anything runs.
    with pytest.raises(RayUnavailable, match="HTTP 401"):
        Dashboard(base).post("/api/jobs/", {"entrypoint": "echo should-not-run"})
    assert Dashboard(base, token=TOKEN).get("/api/jobs/") == []
    # Other refusals stay DashboardErrors with their status.
    with pytest.raises(DashboardError) as missing:
        Dashboard(base, token=TOKEN).get("/api/jobs/no-such-job")
    assert missing.value.status == 404

    monkeypatch.setenv("ARGUS_RAY_TOKEN", TOKEN)
    assert "ray_version" in Dashboard(base).get("/api/version")
    monkeypatch.delenv("ARGUS_RAY_TOKEN")
    token_file = tmp_path / "ray_auth_token"
    token_file.write_text(TOKEN + "\n")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(token_file))
    apps = Dashboard(base).get("/api/serve/applications/")
    assert isinstance(apps, dict) and "applications" in apps


def test_client_works_against_a_head_without_auth(ray_head: RayHead, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ARGUS_RAY_TOKEN", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    assert "ray_version" in Dashboard(ray_head.dashboard_url).get("/api/version")
    monkeypatch.setenv("ARGUS_RAY_TOKEN", TOKEN)
    assert "ray_version" in Dashboard(ray_head.dashboard_url).get("/api/version")
