"""A private key printed by a job is hidden whole: in log tails, in followed output and when the
tail or the read cut its BEGIN line off. The key is a real one made by ssh-keygen."""

from __future__ import annotations

import io
import subprocess
from types import SimpleNamespace
from typing import Any

import pytest

from reconciler.logs.ray import RayLogs, redactor
from reconciler.plan.actual import ActualJob
from reconciler.plan.assess import ObjectStatus
from reconciler.redact import redact
from reconciler.report import Reporter
from reconciler.spec.types import ObjectKey
from reconciler.status import documents
from reconciler.testing.status_branch import task_doc
from tests.unit.test_logs import PROVEN, SID, JobsAPI


@pytest.fixture(scope="module")
def key(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("key")
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(folder / "id")],
        check=True,
        capture_output=True,
    )
    return (folder / "id").read_text()


def _body(key: str) -> list[str]:
    return [line for line in key.splitlines() if line and "-----" not in line]


def _leaks(key: str, text: str) -> list[str]:
    return [line for line in _body(key) if line in text]


def test_the_key_is_real(key: str) -> None:
    assert key.startswith("-----BEGIN OPENSSH PRIVATE KEY-----\n") and len(_body(key)) >= 3


def test_a_log_tail_hides_the_whole_key(key: str) -> None:
    tail = ["step 1", *key.splitlines(), "done"]
    dash = SimpleNamespace(
        get=lambda _path, **_kw: {"driver_node_id": "n1"},
        stream=lambda _path, **_kw: io.BytesIO("\n".join(tail).encode()),  # the state API's bounded read
    )
    reporter = Reporter(dash, None, None, redact=redact)  # type: ignore[arg-type]
    task = ObjectKey("a", "task", "t")
    job = ActualJob("argus--a--t--1", task, "h", "FAILED")
    statuses = {task: ObjectStatus(task, "FAILED", "Synced", runs=(job,))}
    reporter._fetch_log_tails(SimpleNamespace(actual=SimpleNamespace(jobs=[job]), statuses=statuses))  # type: ignore[arg-type]
    lines = reporter.log_tails["argus--a--t--1"]
    assert lines[0] == "step 1" and lines[-1] == "done"
    assert not _leaks(key, "\n".join(lines)) and "-----BEGIN" not in "\n".join(lines)


def test_a_tail_that_cut_the_begin_line_off_still_hides_the_body(key: str) -> None:
    cut = "\n".join(key.splitlines()[2:]) + "\nafter"
    out = redact(cut)
    assert not _leaks(key, out) and out.endswith("after")


def test_following_holds_an_open_key_until_its_end(key: str) -> None:
    lines = key.splitlines()
    before = "\n".join(["epoch 1", *lines[:2]]) + "\n"
    api = JobsAPI(
        [
            ("RUNNING", before),  # the read stops inside the key block
            ("RUNNING", before + "\n".join(lines[2:]) + "\nepoch 2\n"),
            ("SUCCEEDED", before + "\n".join(lines[2:]) + "\nepoch 2\n"),
        ],
        meta=PROVEN,
    )
    follow = RayLogs(api, redactor([]), poll_s=0.02)  # type: ignore[arg-type]
    chunks = list(follow.follow_task_log("ann", "train", task_doc("ann", "train", "RUNNING"), None))
    # However the reads fall, no chunk carries part of the key (each is redacted on its own).
    assert next(c for c in chunks if c).startswith("epoch 1\n") and not any(_leaks(key, c) for c in chunks)
    text = "".join(chunks)
    assert not _leaks(key, text) and "epoch 2" in text and SID in text


def test_a_status_document_run_hides_the_whole_key(key: str) -> None:
    tails = {"s": ["boom", *key.splitlines()]}
    run: dict[str, Any] = documents._run("s", "FAILED", "", None, None, tails, {}, redact)
    assert run["log_tail"][0] == "boom" and not _leaks(key, "\n".join(run["log_tail"]))
