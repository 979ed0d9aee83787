"""The status branch and git notes, on a real git repository (no Ray needed)."""

from __future__ import annotations

from pathlib import Path

import yaml

from reconciler.plan.actions import Action, ActionType, Plan
from reconciler.plan.assess import ObjectStatus
from reconciler.source.remote import open_source
from reconciler.spec.types import ObjectKey
from reconciler.status.branch import read_documents
from reconciler.status.writer import StatusReport, StatusWriter
from tests.support import git, status_test_repo

KEY = ObjectKey("alice", "model", "chat")


def _repo(tmp_path: Path) -> tuple[Path, str]:
    return status_test_repo(tmp_path)


def _report(revision: str, state: str, plan: Plan | None = None) -> StatusReport:
    st = ObjectStatus(
        KEY,
        state,
        "Synced",
        served_name="alice-202611291200-chat",
        replicas_desired=1,
        replicas_ready=1 if state == "RUNNING" else 0,
    )
    return StatusReport(revision, {KEY: st}, {KEY}, set(), plan or Plan(), [], spec_ids={KEY.path: "blob-1"})


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


def _statuses(n: int, state: str = "SUSPENDED") -> dict[ObjectKey, ObjectStatus]:
    keys = [ObjectKey(f"u{i:03d}", "task", "t") for i in range(n)]
    return {k: ObjectStatus(k, state, "Suspended", submission_id=None) for k in keys}


def _changed_files(bare: Path, commit: str) -> list[str]:
    return sorted(git(bare, "diff-tree", "--no-commit-id", "--name-only", "-r", f"{commit}^", commit).split())


def test_a_one_file_push_changes_one_document(tmp_path: Path) -> None:
    bare, sha = _repo(tmp_path)
    writer = StatusWriter(open_source(str(bare), str(tmp_path / "cache")))
    statuses = _statuses(50)
    spec_ids = {k.path: "blob-a" for k in statuses}
    actual = {"models": [], "jobs": [], "capacity": {"total": {}, "available": {}}}
    writer.write(StatusReport(sha, statuses, set(), set(), Plan(), [], spec_ids=spec_ids, actual=actual))
    touched = ObjectKey("u007", "task", "t")
    statuses = dict(statuses)
    statuses[touched] = ObjectStatus(touched, "SUBMITTED", "OutOfSync", submission_id="argus-u007-t-1")
    commit = writer.write(
        StatusReport(
            "f" * 40,
            statuses,
            {touched},
            set(),
            Plan(),
            [],
            spec_ids={**spec_ids, touched.path: "blob-b"},
            actual=actual,
        )
    )
    assert commit is not None
    assert _changed_files(bare, commit) == ["README.md", "revision.yaml", touched.path]
    docs = read_documents(str(bare), "argus/status")
    assert docs[touched.path]["revision"]["last_attempted"] == "f" * 40
    assert docs["users/u008/tasks/t.yaml"]["revision"]["last_attempted"] == sha  # untouched by the push
    root = yaml.safe_load(git(bare, "show", "argus/status:revision.yaml"))
    assert root["revision"]["last_attempted"] == "f" * 40 and root["revision"]["last_applied"] == "f" * 40
    # A push that touches no object (a README edit) changes only the root file and the README.
    commit = writer.write(
        StatusReport("e" * 40, statuses, {touched}, set(), Plan(), [], spec_ids={**spec_ids, touched.path: "blob-b"})
    )
    assert commit is not None and _changed_files(bare, commit) == ["README.md", "revision.yaml"]


def test_a_concurrent_writer_is_built_upon_never_overwritten(tmp_path: Path) -> None:
    bare, sha = _repo(tmp_path)
    ours = StatusWriter(open_source(str(bare), str(tmp_path / "cache")))
    theirs = StatusWriter(open_source(str(bare), str(tmp_path / "cache")))
    ours.write(_report(sha, "DEPLOYING"))
    other = ObjectKey("bob", "task", "t")
    theirs_commit = theirs.write(
        StatusReport(sha, {other: ObjectStatus(other, "RUNNING", "Synced")}, {other}, set(), Plan(), [])
    )
    assert theirs_commit is not None
    # Ours still believes the branch is at its own commit: the compare-and-swap fails, it
    # re-reads the branch and commits on top of the other writer's commit.
    mine = ours.write(_report(sha, "RUNNING"))
    assert mine is not None
    assert git(bare, "rev-parse", f"{mine}^").strip() == theirs_commit
    assert read_documents(str(bare), "argus/status")[KEY.path]["state"] == "RUNNING"


def test_every_text_written_is_redacted(tmp_path: Path) -> None:
    bare, sha = _repo(tmp_path)
    secret = "s3cr3t-v4lue-123"
    writer = StatusWriter(open_source(str(bare), str(tmp_path / "cache")), redact=lambda t: t.replace(secret, "***"))
    task = ObjectKey("alice", "task", "t")
    from reconciler.plan.actual import ActualJob

    run = ActualJob("argus-alice-t-1", task, "h", "FAILED", message=f"exit 1 ({secret})")
    st = ObjectStatus(task, "FAILED", "Synced", reason=f"failed: {secret}", submission_id=run.submission_id, runs=[run])
    report = StatusReport(
        sha,
        {task: st},
        set(),
        set(),
        Plan(),
        [f"users/x.yaml:1: {secret}"],
        notes=[f"note {secret}"],
        log_tails={run.submission_id: [f"WANDB_API_KEY={secret}"]},
    )
    writer.write(report)
    everything = git(bare, "grep", "-h", "", "argus/status") + git(bare, "notes", "--ref=argus", "show", sha)
    assert secret not in everything and "WANDB_API_KEY=***" in everything


def test_the_readme_lists_a_bounded_table_and_says_how_many_more(tmp_path: Path) -> None:
    """At 100,000 objects a README of every row would be megabytes rewritten on every status
    commit: it lists the first README_ROWS by path, says how many more, and the documents stay."""
    from reconciler.status.documents import README_MESSAGES, README_ROWS

    bare, sha = _repo(tmp_path)
    writer = StatusWriter(open_source(str(bare), str(tmp_path / "cache")))
    statuses = {
        k: ObjectStatus(k, "SUSPENDED", "Suspended")
        for k in (ObjectKey(f"u{i:04d}", "task", "t") for i in range(README_ROWS + 5))
    }
    errors = [f"users/x/tasks/e{i}.yaml:1: bad" for i in range(README_MESSAGES + 3)]
    assert writer.write(StatusReport(sha, statuses, set(), set(), Plan(), errors)) is not None
    text = git(bare, "show", "argus/status:README.md")
    assert sum(line.startswith("| u0") or line.startswith("| u1") for line in text.splitlines()) == README_ROWS
    assert "| u0000 | task | t |" in text and "| u1004 |" not in text
    assert f"5 more objects are not listed here ({README_ROWS + 5:,} in all)" in text
    assert "… and 3 more" in text and "e202.yaml" not in text
    assert len(read_documents(str(bare), "argus/status")) == README_ROWS + 5
    # Rows come and go in order: the first object gone, one added before every other.
    del statuses[ObjectKey("u0000", "task", "t")]
    first = ObjectKey("a", "task", "t")
    statuses[first] = ObjectStatus(first, "QUEUED", "OutOfSync")
    assert writer.write(StatusReport(sha, statuses, set(), set(), Plan(), [])) is not None
    text = git(bare, "show", "argus/status:README.md")
    table = [line for line in text.splitlines() if line.startswith(("| a |", "| u0", "| u1"))]
    assert table[0].startswith("| a | task | t | QUEUED") and table[1].startswith("| u0001 |")
    assert len(table) == README_ROWS and "| u0000 |" not in text
