"""What the daemon hands its OpenAI endpoint from several API keys files (reconciler/apply/applier.py with
reconciler/observe/api_keys.py and reconciler/endpoint/hub.py): the admin's and the git server's
self-service file united, the keys of users cluster.yaml's ``users:`` does not declare left out, and
nothing of it in what Serve is sent (any job reads and rewrites Serve's configs). Real git, the
dashboard stand-in."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from reconciler.daemon import build_parts
from reconciler.loop import Daemon
from reconciler.server import Metrics
from reconciler.source.remote import open_source
from reconciler.status.writer import StatusWriter
from tests.support import ConfigRepo, cluster_yaml, model_yaml
from tests.unit.fake_ray import FakeRay
from tests.unit.test_fuzz_ticks import AllowAll


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def router_keys(ray: FakeRay, parts: Any) -> dict[str, Any]:
    """The keys of the daemon's gate config, after checking Serve was sent only the model table."""
    for app in ray.apps.values():
        for deployment in app.get("deployments") or []:
            config = deployment.get("user_config") or {}
            assert set(config) <= {"models"}, f"{app['name']} carries {sorted(config)} into Ray"
    _version, gate = parts.endpoint.gate()
    assert gate is not None, "no gate config was published"
    return dict(gate.get("keys") or {})


def test_the_endpoint_gets_the_union_of_the_files_without_undeclared_users(tmp_path: Path) -> None:
    (tmp_path / "users" / "alice").mkdir(parents=True)
    repo = ConfigRepo(tmp_path)
    repo.write("cluster.yaml", cluster_yaml(tmp_path / "hf", tmp_path / "users", 8000, users={"alice": {}, "bob": {}}))
    repo.write("users/alice/models/chat.yaml", model_yaml("$HOME/m"))
    (tmp_path / "users" / "alice" / "m").mkdir()
    repo.commit_push("alice: a model")
    admin, own = tmp_path / "admin-keys", tmp_path / "self-keys"
    admin.write_text(f"bob {sha('bob-key')}\n")
    own.write_text(f"alice {sha('alice-key')}  # 2026-12-05T02:50:00Z\nmallory {sha('mallory-key')}\n")
    source = open_source(str(repo.bare), str(repo.bare) + "-cache")
    ray = FakeRay()
    parts = build_parts(
        source,
        "main",
        ray,
        fs=AllowAll(),
        secrets_env={},
        task_check=lambda t, c: [],
        api_keys=[str(admin), str(own)],
        endpoint_link=str(tmp_path / "link.sock"),  # an endpoint elsewhere: no port bound here
    )
    daemon = Daemon(parts, StatusWriter(source), metrics=Metrics())
    daemon.run_once()
    assert router_keys(ray, parts) == {sha("bob-key"): "bob", sha("alice-key"): "alice"}  # mallory: not a user
    own.write_text("mallory x\n")  # alice revoked hers (and a bad line): read again at the next tick
    daemon.run_once()
    assert router_keys(ray, parts) == {sha("bob-key"): "bob"}
