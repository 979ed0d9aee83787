"""Log serving logic: ownership checks, whole-line redaction while following, the CLI's status text.

The Ray side is a stand-in answering like the Jobs REST API (pure logic); the real job is
followed in tests/e2e/test_web_page.py.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from reconciler.builders.jobs import ownership_proof
from reconciler.cli import main
from reconciler.dashboard import DashboardError
from reconciler.errors import ArgusError
from reconciler.logs.client import log_url
from reconciler.logs.ray import LogNotFound, RayLogs, redactor
from reconciler.testing.status_branch import commit_files, dump, task_doc

SECRET = "s3cr3t-value-xyz"
SID = "argus--ann--train--0123abcd"
KEY = b"daemon-ownership-key-for-tests!!"
_LABELS = {"managed-by": "argus", "argus-user": "ann", "argus-task": "train", "argus-spec-hash": "abc"}
PROVEN = {**_LABELS, "argus-proof": ownership_proof(KEY, SID, {"metadata": _LABELS})}


class JobsAPI:
    """Answers ``GET /api/jobs/<id>`` and ``.../logs`` from a script of (status, log text) steps."""

    def __init__(self, steps: list[tuple[str, str]], meta: dict[str, str] | None = None) -> None:
        self.steps, self.i = steps, 0
        self.meta = PROVEN if meta is None else meta

    def get(self, path: str, **_: Any) -> Any:
        if path == f"/api/jobs/{SID}":
            return {"status": self.steps[self.i][0], "metadata": self.meta}
        if path == f"/api/jobs/{SID}/logs":
            text = self.steps[self.i][1]
            self.i = min(self.i + 1, len(self.steps) - 1)
            return {"logs": text}
        raise DashboardError("GET", path, 404, "not found")


def logs(api: JobsAPI) -> RayLogs:
    return RayLogs(api, redactor([SECRET]), ownership_key=KEY, poll_s=0, sleep=lambda _s: None)  # type: ignore[arg-type]


def test_follow_sends_whole_redacted_lines_until_the_run_ends() -> None:
    half = SECRET[:7]
    api = JobsAPI(
        [
            ("RUNNING", "line 1\nkey " + half),  # the secret is cut in two by the read
            ("RUNNING", "line 1\nkey " + SECRET + " end\nline 3"),
            ("SUCCEEDED", "line 1\nkey " + SECRET + " end\nline 3\nlast"),
        ]
    )
    chunks = list(logs(api).follow_task_log("ann", "train", task_doc("ann", "train", "RUNNING"), None))
    assert chunks[0] == "line 1\n"
    text = "".join(chunks)
    assert SECRET not in text and half not in text and "key *** end" in text
    assert text.endswith("line 3\nlast[argus: run argus--ann--train--0123abcd SUCCEEDED]\n")


def test_only_the_objects_own_runs_resolve() -> None:
    doc = task_doc("ann", "train")
    with pytest.raises(LogNotFound, match="not a run of"):
        logs(JobsAPI([("RUNNING", "")])).task_log("ann", "train", doc, "argus--bob--train--0123abcd")
    for meta in (
        {**PROVEN, "argus-user": "bob"},  # another user's job
        {k: v for k, v in PROVEN.items() if k != "argus-proof"},  # labels without a proof: forged
        {**PROVEN, "argus-proof": "0" * 64},
    ):
        with pytest.raises(LogNotFound, match="Ray does not hold"):
            logs(JobsAPI([("RUNNING", "x")], meta=meta)).task_log("ann", "train", doc, None)
    assert logs(JobsAPI([("SUCCEEDED", f"a {SECRET}\n")])).task_log("ann", "train", doc, SID) == "a ***\n"


def test_log_url_checks_the_target() -> None:
    assert log_url("http://d:8080/", "ann/tasks/train", run="r1", follow=True) == (
        "http://d:8080/api/v1/logs/ann/tasks/train?run=r1&follow=1"
    )
    assert log_url("http://d", "ann/model/chat").endswith("/api/v1/logs/ann/models/chat")
    for bad in ("ann/train", "../x/tasks/y", "ann/tasks/a?b"):
        with pytest.raises(ArgusError):
            log_url("http://d", bad)


def test_status_text_shows_failed_runs_and_warns_when_stale(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    origin = tmp_path / "origin.git"
    subprocess.run(["git", "init", "-q", "--bare", str(origin)], check=True)
    doc = task_doc("ann", "train", "FAILED", reason="Job entrypoint command failed with exit code 3")
    doc["runs"][0].update(message=doc["reason"], log_tail=[f"line {i}" for i in range(30)] + ["Traceback: boom"])
    commit_files(str(origin), {"users/ann/tasks/train.yaml": dump(doc)})
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(origin), str(clone)], check=True, capture_output=True)
    assert main(["status", "--repo", str(clone)]) == 0
    out = capsys.readouterr()
    assert "exit code 3" in out.out and "| Traceback: boom" in out.out and "| line 21" in out.out
    assert "| line 19" not in out.out  # the last 10 lines only
    origin.rename(tmp_path / "gone.git")
    assert main(["status", "--repo", str(clone)]) == 1
    out = capsys.readouterr()
    assert "FAILED" in out.out and "may be stale" in out.err


def test_the_deployed_spec_of_a_run_hides_secret_values() -> None:
    class WithSpec(JobsAPI):
        def get(self, path: str, **kw: Any) -> Any:
            data = super().get(path, **kw)
            if path == f"/api/jobs/{SID}":
                env = {"WANDB_API_KEY": "not-matching-any-pattern", "MODE": f"x{SECRET}y", "PLAIN": "1"}
                data |= {"entrypoint": "python3 train.py", "entrypoint_num_gpus": 1, "runtime_env": {"env_vars": env}}
                data["metadata"] = {**_LABELS, "argus-proof": ownership_proof(KEY, SID, {**data, "metadata": _LABELS})}
            return data

    spec = logs(WithSpec([("RUNNING", "")])).deployed_task_spec("ann", "train", task_doc("ann", "train"), None)
    assert spec["entrypoint"] == "python3 train.py" and spec["submission_id"] == SID
    env = spec["runtime_env"]["env_vars"]
    assert env == {"WANDB_API_KEY": "***", "MODE": "x***y", "PLAIN": "1"}
