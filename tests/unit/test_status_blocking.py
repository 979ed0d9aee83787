"""A ref that keeps the status branch from being created (``argus`` for ``argus/status``, or
``argus/status/x``), present although the bundled hook refuses it (created in the repository directly,
or a repository without the hook): the daemon reports it on /healthz, in its log and on every object it
cannot submit, submits nothing and preempts nothing until it is gone, then carries on. Real git, whole
daemon ticks; Ray is the dashboard stand-in (tests/e2e/test_status_blocked.py runs it on a real head)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from reconciler.apply.applier import Applier
from reconciler.daemon import build_parts
from reconciler.loop import Daemon
from reconciler.plan.actions import Action, ActionType, Plan
from reconciler.server import Metrics
from reconciler.source.remote import open_source
from reconciler.spec.types import ObjectKey
from reconciler.status import blocking
from reconciler.status.branch import read_documents
from reconciler.status.writer import StatusWriter
from tests.support import ConfigRepo, git, two_teams
from tests.unit.fake_ray import FakeRay
from tests.unit.test_fuzz_ticks import AllowAll
from tests.unit.test_preemption_loop import TASK, _alice_borrows, _reclaim

BOB_TASK = "users/bob/tasks/job.yaml"


def _daemon(repo: ConfigRepo, ray: FakeRay, url: str | None = None) -> Daemon:
    source = open_source(url or str(repo.bare), str(repo.bare) + "-cache")
    parts = build_parts(source, "main", ray, fs=AllowAll(), secrets_env={}, task_check=lambda t, c: [])
    return Daemon(parts, StatusWriter(source), metrics=Metrics(), fetch_interval=0.0)


def _block(bare: Path, name: str) -> None:
    """Create ``refs/heads/<name>`` in the repository itself, as an admin (or a server without the
    hook) could; the status branch, if it exists, is deleted first (a renamed or deleted one)."""
    git(bare, "update-ref", "-d", "refs/heads/argus/status", check=False)
    git(bare, "update-ref", f"refs/heads/{name}", git(bare, "rev-parse", "main").strip())


def _events(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    out = []
    for record in caplog.records:
        try:
            entry = json.loads(record.getMessage())
        except ValueError:
            continue
        if isinstance(entry, dict):
            out.append(entry)
    return out


def _errors_of(caplog: pytest.LogCaptureFixture, obj: str) -> list[str]:
    return [e["error"] for e in _events(caplog) if e.get("object") == obj and "error" in e]


def _status_branch(bare: Path) -> str:
    return git(bare, "rev-parse", "-q", "--verify", "refs/heads/argus/status", check=False).strip()


def test_patterns_list_the_branch_what_lies_under_it_and_each_folder_above_alone(tmp_path: Path) -> None:
    repo = ConfigRepo(tmp_path)
    repo.commit_push("init")
    head = git(repo.bare, "rev-parse", "main").strip()
    names = ["ops", "opsx", "ops/argus", "ops/argus/status", "ops/argus/status/x", "ops/other", "x/ops/argus"]
    for name in names:
        git(repo.bare, "update-ref", f"refs/heads/{name}", head, check=False)  # some cannot coexist
    present = git(repo.bare, "for-each-ref", "--format=%(refname)").split()
    listed = git(repo.bare, "for-each-ref", "--format=%(refname)", *blocking.patterns("ops/argus/status")).split()
    assert sorted(listed) == sorted(
        r
        for r in present
        if r in blocking.folders_above("ops/argus/status") or r.startswith("refs/heads/ops/argus/status")
    )
    assert "refs/heads/opsx" not in listed and "refs/heads/ops/other" not in listed
    assert blocking.blocking(listed, "ops/argus/status") == [
        r for r in sorted(listed) if r != "refs/heads/ops/argus/status"
    ]


@pytest.mark.parametrize(
    ("name", "how"), [("argus", "named like a folder above it"), ("argus/status/x", "lying under it")]
)
def test_a_fresh_install_with_a_blocking_branch_reports_it_and_submits_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str, how: str
) -> None:
    caplog.set_level(logging.INFO, "argus")
    repo = ConfigRepo(tmp_path)
    repo.write("cluster.yaml", two_teams(tmp_path / "hf", tmp_path / "users", 8000))
    repo.write(TASK, {"kind": "Task", "workload": "command", "command": "true", "gpus_per_node": 1})
    repo.commit_push("alice's first task")
    _block(repo.bare, name)
    ray = FakeRay(gpus=2)
    daemon = _daemon(repo, ray)
    for _ in range(3):
        assert daemon.run_once() == 0.0  # the loop carries on: ticks succeed, nothing stalls
    assert ray.submits == 0 and not ray.jobs
    health = daemon.health()
    assert health["ok"] is False
    why = health["status_branch"]
    assert f"the status branch argus/status cannot be created in the repository: the branch {name} ({how})" in why
    assert "Nothing is submitted and nothing preempted" in why
    blocked = [e for e in _events(caplog) if e.get("event") == "status_branch_blocked"]
    assert len(blocked) == 1 and blocked[0]["error"] == why  # logged once, when it began
    errors = _errors_of(caplog, "alice/tasks/train")
    assert errors and errors[0] == f"not submitted: {why}"
    assert not _status_branch(repo.bare)

    git(repo.bare, "update-ref", "-d", f"refs/heads/{name}")
    for _ in range(2):
        daemon.run_once()
    daemon.reporter.flush()
    assert "status_branch" not in daemon.health() and daemon.health()["ok"] is True
    assert any(e.get("event") == "status_branch_unblocked" for e in _events(caplog))
    assert ray.submits == 1 and len(ray.jobs) == 1  # recorded first, submitted once
    runs = read_documents(str(repo.bare), "argus/status")[TASK]["runs"]
    assert [r["submission_id"] for r in runs] == list(ray.jobs)


@pytest.mark.parametrize("preemptor", ["task", "model"])
def test_no_preemption_is_applied_while_the_status_branch_is_blocked(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, preemptor: str
) -> None:
    caplog.set_level(logging.INFO, "argus")
    repo, ray = _alice_borrows(tmp_path)
    ray.lag = 0
    daemon = _daemon(repo, ray)
    for _ in range(3):
        daemon.run_once()
    daemon.reporter.flush()
    assert read_documents(str(repo.bare), "argus/status")[TASK]["state"] == "RUNNING"
    (alice,) = ray.jobs

    _block(repo.bare, "argus")  # the status branch renamed away, a branch `argus` in its place
    if preemptor == "task":
        repo.write(BOB_TASK, {"kind": "Task", "workload": "command", "command": "true", "gpus_per_node": 1})
        repo.commit_push("bob's in-quota task reclaims product's GPU")
        bob = "bob/tasks/job"
    else:
        _reclaim(repo, tmp_path)
        bob = "bob/models/chat"
    for _ in range(4):
        daemon.run_once()
    assert not ray.stopping and ray.jobs[alice]["status"] == "RUNNING", ray.jobs  # never stopped
    assert list(ray.jobs) == [alice]  # bob's task is not submitted either
    health = daemon.health()
    assert health["ok"] is False and "cannot be created" in health["status_branch"]
    held = _errors_of(caplog, "alice/tasks/train")
    assert held and held[0].startswith(f"not preempted for {bob}: the status branch argus/status cannot be created")
    if preemptor == "task":
        assert _errors_of(caplog, bob)[0].startswith("not submitted: the status branch argus/status")
    else:  # not deployed beside alice's run either: it would count as admitted and never get her GPU
        assert "argus--bob--chat" not in ray.apps, ray.apps
        assert _errors_of(caplog, bob)[0].startswith("waits for the room its preemptions make, held: the status")

    git(repo.bare, "update-ref", "-d", "refs/heads/argus")
    for _ in range(4):
        daemon.run_once()
    daemon.reporter.flush()
    assert ray.jobs[alice]["status"] == "STOPPED"  # preempted once the records can follow
    doc = read_documents(str(repo.bare), "argus/status")[TASK]
    assert (doc["state"], doc.get("preempted_by")) == ("PREEMPTED", bob), doc


def test_a_preemption_is_held_unless_what_it_makes_room_for_is_on_record() -> None:
    alice, carol = ObjectKey("alice", "task", "train"), ObjectKey("carol", "model", "chat")
    bob_task, bob_model = ObjectKey("bob", "task", "job"), ObjectKey("bob", "model", "chat")
    plan = Plan(
        [
            Action(ActionType.STOP_TASK, alice, "reclaim", submission_id="a", preempted_by=bob_task),
            Action(ActionType.SCALE_MODEL, carol, "reclaim", replicas=1, preempted_by=bob_model),
            Action(ActionType.STOP_TASK, ObjectKey("dan", "task", "x"), "spec changed", submission_id="d"),
        ]
    )
    submit = Action(ActionType.SUBMIT_TASK, bob_task, "new run", submission_id="b")
    assert Applier._held(plan, [submit], None) == {}
    # bob's run is not submitted this tick (refused, in back-off): alice keeps running; a model needs no record
    assert set(Applier._held(plan, [], None)) == {alice}
    assert "its run is not submitted this tick" in Applier._held(plan, [], None)[alice]
    # no record can be written: no preemption at all (a stopped attempt could not be recorded PREEMPTED)
    held = Applier._held(plan, [submit], "the status branch is blocked")
    assert held == {
        alice: "not preempted for bob/tasks/job: the status branch is blocked",
        carol: "not preempted for bob/models/chat: the status branch is blocked",
        # deployed beside carol's replicas it would count as admitted and never get their room
        bob_model: "waits for the room its preemptions make, held: the status branch is blocked",
    }


def test_a_remote_without_the_hook_blocks_publishing_only(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A remote (another git host, no argus hook) holds `argus`: the daemon's own copy takes the status
    branch and its records, so tasks run; that it cannot be published is reported until it can."""
    caplog.set_level(logging.INFO, "argus")
    repo = ConfigRepo(tmp_path)
    repo.write("cluster.yaml", two_teams(tmp_path / "hf", tmp_path / "users", 8000))
    repo.write(TASK, {"kind": "Task", "workload": "command", "command": "true", "gpus_per_node": 1})
    repo.commit_push("alice's first task")
    _block(repo.bare, "argus")
    ray = FakeRay(gpus=2)
    daemon = _daemon(repo, ray, url=f"file://{repo.bare}")
    for _ in range(3):
        assert daemon.run_once() == 0.0
    daemon.reporter.flush()
    assert ray.submits == 1
    health = daemon.health()
    assert health["ok"] is False
    assert health["status_branch"].startswith(
        f"the status branch argus/status cannot be published to the remote file://{repo.bare}: the remote holds "
        "the branch argus (named like a folder above it)"
    )
    mirror = daemon.parts.source.repo.path
    assert read_documents(mirror, "argus/status")[TASK]["runs"], "recorded in the daemon's own copy"
    assert not _status_branch(repo.bare)

    git(repo.bare, "update-ref", "-d", "refs/heads/argus")
    for _ in range(3):
        daemon.run_once()
    daemon.reporter.flush()
    assert daemon.health()["ok"] is True and "status_branch" not in daemon.health()
    assert read_documents(str(repo.bare), "argus/status")[TASK]["runs"], "published once the remote can take it"
    assert ray.submits == 1


def test_the_writer_alone_reports_a_branch_under_the_status_branch(tmp_path: Path) -> None:
    """Without the daemon's key (a writer as tests and old set-ups use it) the check is the same."""
    repo = ConfigRepo(tmp_path)
    repo.commit_push("init")
    _block(repo.bare, "argus/status/x")
    writer = StatusWriter(open_source(str(repo.bare), str(tmp_path / "cache")))
    assert writer.documents() == {}
    assert writer.blocked is not None and "the branch argus/status/x (lying under it)" in writer.blocked
    with pytest.raises(Exception, match="cannot be created"):
        writer.record_runs([])
    git(repo.bare, "update-ref", "-d", "refs/heads/argus/status/x")
    assert writer.record_runs([]) is True and writer.blocked is None
