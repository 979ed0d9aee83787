"""The status branch and git notes, on a real git repository (no Ray needed)."""

from __future__ import annotations

from pathlib import Path

from reconciler.plan.actions import Action, ActionType, Plan
from reconciler.plan.assess import ObjectStatus
from reconciler.source.remote import open_source
from reconciler.spec.types import ObjectKey
from reconciler.status.branch import read_documents
from reconciler.status.writer import StatusReport, StatusWriter
from tests.support import git

KEY = ObjectKey("alice", "model", "chat")


def _repo(tmp_path: Path) -> tuple[Path, str]:
    bare = tmp_path / "config.git"
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(bare))
    work = tmp_path / "work"
    git(tmp_path, "clone", "-q", str(bare), str(work))
    (work / "README.md").write_text("config\n")
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "init")
    git(work, "push", "-q", "origin", "HEAD:main")
    return bare, git(work, "rev-parse", "HEAD").strip()


def _report(revision: str, state: str, plan: Plan | None = None) -> StatusReport:
    st = ObjectStatus(
        KEY,
        state,
        "Synced",
        served_name="alice-202611291200-chat",
        replicas_desired=1,
        replicas_ready=1 if state == "RUNNING" else 0,
    )
    return StatusReport(revision, {KEY: st}, {KEY}, set(), plan or Plan(), [])


def test_commits_only_on_change_and_keeps_history(tmp_path: Path) -> None:
    bare, sha = _repo(tmp_path)
    times = iter(["2026-11-29T12:00:00Z", "2026-11-29T12:00:05Z", "2026-11-29T12:00:10Z", "2026-11-29T12:00:15Z"])
    writer = StatusWriter(open_source(str(bare), str(tmp_path / "cache")), now=lambda: next(times))
    assert writer.write(_report(sha, "DEPLOYING")) is not None
    assert writer.write(_report(sha, "DEPLOYING")) is None  # idle: nothing changed, no commit
    assert writer.write(_report(sha, "RUNNING")) is not None
    assert git(bare, "rev-list", "--count", "argus/status").strip() == "2"
    doc = read_documents(str(bare), "argus/status")[KEY.path]
    assert doc["state"] == "RUNNING" and doc["revision"]["last_applied"] == sha
    assert [e["state"] for e in doc["events"]] == ["DEPLOYING", "RUNNING"]
    assert doc["last_transition"] == "2026-11-29T12:00:10Z"
    message = git(bare, "log", "-1", "--format=%B", "argus/status")
    assert "alice/models/chat: DEPLOYING/Synced -> RUNNING/Synced" in message
    readme = git(bare, "show", "argus/status:README.md")
    assert "| alice | model | chat | RUNNING | Synced | `alice-202611291200-chat` |" in readme


def test_note_on_the_desired_commit(tmp_path: Path) -> None:
    bare, sha = _repo(tmp_path)
    writer = StatusWriter(open_source(str(bare), str(tmp_path / "cache")))
    plan = Plan([Action(ActionType.DEPLOY_MODEL, KEY, "new model alice-202611291200-chat (1 replica)")])
    report = _report(sha, "DEPLOYING", plan)
    report.errors = ["users/bob/models/x.yaml:3: replicas: expected an integer, got 'two'"]
    writer.write(report)
    note = git(bare, "notes", "--ref=argus", "show", sha)
    assert "deploy_model alice/models/chat: new model" in note
    assert "users/bob/models/x.yaml:3: replicas" in note
    writer.write(_report(sha, "RUNNING"))  # an in-sync tick does not overwrite what the push did
    assert "deploy_model" in git(bare, "notes", "--ref=argus", "show", sha)


def test_deleted_objects_lose_their_status_file(tmp_path: Path) -> None:
    bare, sha = _repo(tmp_path)
    writer = StatusWriter(open_source(str(bare), str(tmp_path / "cache")))
    writer.write(_report(sha, "RUNNING"))
    writer.write(StatusReport(sha, {}, set(), set(), Plan(), []))
    assert read_documents(str(bare), "argus/status") == {}
    assert "removed" in git(bare, "log", "-1", "--format=%B", "argus/status")
