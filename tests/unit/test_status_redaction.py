"""Every byte the status writer puts into git is redacted (issue 18 item 2), on a real git repository.

The attack: a job that prints the daemon's own secret (plain or colour-coded) and fails, so that
Ray's message carries the last 20,000 characters of its log into ``actual.json``, the object's
document, the README, the commit message and the note."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from reconciler.plan.actions import Action, ActionType, Plan
from reconciler.plan.actual import ActualJob, ActualState
from reconciler.plan.assess import ObjectStatus
from reconciler.redact import MASK, RedactingFormatter, Redactor, redact_tree
from reconciler.source.remote import open_source
from reconciler.spec.types import ObjectKey
from reconciler.status.writer import StatusReport, StatusWriter
from tests.support import git, status_test_repo

HF = "hf_DaemonOwnSecretValue0123456789abcd"
WANDB = "wandb-daemon-secret-0123456789"
KEY = ObjectKey("mallory", "task", "leak")
GH = "ghp_abcdefghijklmnopqrstuvwxyz0123456789"
PEM = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAsecretbodyline0123456789\n-----END RSA PRIVATE KEY-----"
PRINTED = [
    f"HF_TOKEN={HF}",
    f"value \x1b[32m{HF}\x1b[0m",
    f"wandb \x1b[1m{WANDB[:8]}\x1b[0m{WANDB[8:]}",
    f"token \x1b[31m{GH}\x1b[0m",
    f"https://alice:{WANDB}@git.example/cfg.git",
    PEM,
]
LEAKS = [HF, WANDB, GH, "secretbodyline", WANDB[8:]]


def _repo(tmp_path: Path) -> tuple[Path, str]:
    return status_test_repo(tmp_path)


def every_blob_and_message(repo: Path) -> str:
    """The text of every blob of every commit on every ref (branches and notes), and every commit
    message: what anyone who can read the repository can read."""
    out = [git(repo, "log", "--all", "--format=%B")]
    objects = git(repo, "rev-list", "--all", "--objects").split("\n")
    for line in objects:
        sha = line.split(" ")[0]
        if sha and git(repo, "cat-file", "-t", sha).strip() == "blob":
            out.append(git(repo, "cat-file", "-p", sha))
    return "\n".join(out)


def test_a_failed_jobs_log_never_reaches_git(tmp_path: Path) -> None:
    bare, sha = _repo(tmp_path)
    writer = StatusWriter(open_source(str(bare), str(tmp_path / "cache")), redact=Redactor([HF, WANDB]))
    log_text = "\n".join(["epoch 1", *PRINTED, "Traceback: boom"])
    message = f"Job entrypoint command failed with exit code 1, last available logs:\n{log_text}"
    sid = "argus--mallory--leak--0001"
    job = ActualJob(sid, KEY, "h", "FAILED", message, {}, spec={"env": {"HF_TOKEN": HF, "X": f"--api-key {HF}"}})
    st = ObjectStatus(KEY, "FAILED", "Synced", reason=message, submission_id=sid, runs=[job])
    plan = Plan([Action(ActionType.SUBMIT_TASK, KEY, f"resubmit: {message}")], notes=[f"note {log_text}"])
    report = StatusReport(
        sha,
        {KEY: st},
        {KEY},
        set(),
        plan,
        [f"users/mallory/tasks/leak.yaml:3: bad {HF}"],
        notes=[f"observe: {log_text}"],
        log_tails={sid: log_text.split("\n")},
        actual=ActualState(jobs=[job]).to_json(),
        spec_ids={KEY.path: "blob-1"},
        resolved={KEY.path: {"command": f"echo {HF}", "env": {"WANDB_API_KEY": WANDB}}},
        subject=f"commit subject {HF}",
        daemon_error=f"boom {GH}",
    )
    assert writer.write(report) is not None
    text = every_blob_and_message(bare)
    for leak in LEAKS:
        assert leak not in text, leak
    assert "\x1b" not in text
    actual = git(bare, "show", "argus/status:actual.json")
    assert "exit code 1" in actual and "Traceback: boom" in actual and MASK in actual  # kept, redacted
    # The next write re-uses the redacted entries of unchanged jobs; a changed one is redacted anew.
    job2 = ActualJob("argus--mallory--leak--0002", KEY, "h", "FAILED", f"again {GH}", {})
    report.actual = ActualState(jobs=[job, job2]).to_json()
    writer.write(report)
    assert GH not in git(bare, "show", "argus/status:actual.json")
    assert len(writer._actual_entries) == 2  # bounded by what the last write held


def test_a_writer_built_without_a_redactor_still_hides_patterns(tmp_path: Path) -> None:
    bare, sha = _repo(tmp_path)
    writer = StatusWriter(open_source(str(bare), str(tmp_path / "cache")))
    job = ActualJob("argus--mallory--leak--0001", KEY, "h", "FAILED", f"HF_TOKEN={HF} {GH}", {})
    report = StatusReport(sha, {}, set(), set(), Plan(), [], actual=ActualState(jobs=[job]).to_json())
    writer.write(report)
    text = every_blob_and_message(bare)
    assert HF not in text and GH not in text


def test_redact_tree_hides_values_of_secret_names_and_redacts_keys() -> None:
    from reconciler.builders.resolved import FROM_DAEMON

    data = {
        "spec": {"WANDB_API_KEY": FROM_DAEMON},  # what argus shows in place of a secret stays
        "env": {"HF_TOKEN": "plainvalue", "api_key": "x", "max_tokens": "256", "tokenizer": "/m", "PWD": "/tmp"},
        "list": [f"a {GH}", ("t", 1)],
        GH: 3,
        "n": None,
    }
    assert redact_tree(data) == {
        "spec": {"WANDB_API_KEY": FROM_DAEMON},
        "env": {"HF_TOKEN": MASK, "api_key": MASK, "max_tokens": "256", "tokenizer": "/m", "PWD": "/tmp"},
        "list": [f"a {MASK}", ["t", 1]],
        MASK: 3,
        "n": None,
    }


def test_everything_logged_is_redacted(caplog: object) -> None:
    formatter = RedactingFormatter(Redactor([WANDB]))
    try:
        raise ValueError(f"failed with {GH}")
    except ValueError:
        import sys

        record = logging.LogRecord("argus", logging.ERROR, __file__, 1, "job said %s", (WANDB,), sys.exc_info())
    out = formatter.format(record)
    assert "job said ***" in out and "ValueError: failed with ***" in out and WANDB not in out and GH not in out


def test_pages_and_api_serve_a_branch_argus_did_not_write_redacted(tmp_path: Path) -> None:
    """A status branch pushed by someone else (or written before redaction covered it) holds a
    secret and escapes: the pages, the API and the notes served show neither."""
    from reconciler.testing.status_branch import commit_files, dump, task_doc
    from reconciler.web.app import daemon_pages

    bare, sha = _repo(tmp_path)
    doc = task_doc("mallory", "t", "FAILED", reason=f"leaked {WANDB} \x1b]0;title\x07")
    doc["runs"][0].update(message=f"HF_TOKEN={HF}", log_tail=[f"token {GH}", "\x1b[2Jclear"])
    actual = {"jobs": [{"submission_id": "s", "user": "mallory", "task": "t", "status": "FAILED", "message": HF}]}
    commit_files(
        str(bare),
        {
            "users/mallory/tasks/t.yaml": dump(doc),
            "actual.json": json.dumps(actual).encode(),
            "README.md": HF.encode(),
            "revision.yaml": dump({"revision": {"last_attempted": sha, "last_applied": sha}}),
        },
    )
    git(bare, "notes", "--ref=argus", "add", "-m", f"note {WANDB}", sha)
    pages = daemon_pages(str(bare), "argus/status", None, secret_values=[WANDB])
    bodies = []
    for path in (
        "/",
        "/users/mallory/tasks/t",
        "/api/v1/summary",
        "/api/v1/objects",
        "/api/v1/objects/mallory/tasks/t",
    ):
        response = pages("GET", path, {})
        assert response is not None and response.status == 200, path
        assert isinstance(response.body, bytes)
        bodies.append(response.body.decode())
    text = "\n".join(bodies)
    assert "leaked ***" in text and "note ***" in text  # the document and the note were served, redacted
    for leak in (WANDB, HF, GH, "\x1b", "\x07"):
        assert leak not in text, leak


def test_the_first_seen_table_in_actual_json_is_redacted_entry_by_entry(tmp_path: Path) -> None:
    """``first_seen`` holds an entry per object (thousands): redacted entry by entry and kept, the
    result is the whole table's redaction, on every write, and the writer holds the last table only."""
    bare, sha = _repo(tmp_path)
    writer = StatusWriter(open_source(str(bare), str(tmp_path / "cache")), redact=Redactor([HF]))
    table: dict[str, Any] = {f"u{i:03d}/tasks/t": 1767225600 + i for i in range(200)}
    table[f"mallory/tasks/{HF}"] = 1
    table["mallory/tasks/flag"] = True  # equal to 1, but not the same JSON
    # Two names that redact alike: the file says it once, with the value a redaction of the whole
    # table keeps (the last).
    table["x/tasks/***"], table[f"x/tasks/{HF}"] = 5, 6
    report = StatusReport(sha, {}, set(), set(), Plan(), [], actual={"models": []}, first_seen=table)
    assert writer.write(report) is not None
    for _round in range(2):
        text = git(bare, "show", "argus/status:actual.json")
        written = json.loads(text)
        assert written["first_seen"] == redact_tree(table, Redactor([HF]))
        assert HF not in text and written["first_seen"]["mallory/tasks/flag"] is True
        # the bytes json.dumps(sort_keys=True) gives for the whole table
        assert json.dumps(written["first_seen"], sort_keys=True) in text
        table = {**{k: v for k, v in table.items() if not k.startswith(f"u00{_round}")}, f"m/tasks/{GH}{_round}": 2}
        report = StatusReport(sha, {}, set(), set(), Plan(), [], actual={"models": []}, first_seen=table)
        assert writer.write(report) is not None
    assert GH not in git(bare, "show", "argus/status:actual.json")
    assert len(writer._seen._entries) == len(table)
