"""Log serving logic: ownership checks, whole-line redaction while following, the CLI's status text.

The Ray side is a stand-in answering like the Jobs REST API (pure logic); the real job is
followed in tests/e2e/test_web_page.py.
"""

from __future__ import annotations

import io
import json
import subprocess
import time
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
    """Answers ``GET /api/jobs/<id>`` from a script of (status, log text so far) steps, and streams
    the log as the state API does: each status read moves to the next step, and the stream sends
    what the log gained (a bounded ``lines=`` read of the whole text when not following)."""

    def __init__(self, steps: list[tuple[str, str]], meta: dict[str, str] | None = None) -> None:
        self.steps, self.i = steps, 0
        self.meta = PROVEN if meta is None else meta
        self.paths: list[str] = []

    def get(self, path: str, **_: Any) -> Any:
        if path == f"/api/jobs/{SID}":
            status = self.steps[self.i][0]
            self.i = min(self.i + 1, len(self.steps) - 1)
            return {"status": status, "metadata": self.meta, "driver_node_id": "n1"}
        raise DashboardError("GET", path, 404, "not found")

    def stream(self, path: str, **_: Any) -> Any:
        self.paths.append(path)
        if f"filename=job-driver-{SID}.log" not in path or "node_id=n1" not in path:
            raise DashboardError("GET", path, 500, "not found")
        if path.startswith("/api/v0/logs/file"):
            return io.BytesIO(self.steps[self.i][1].encode())
        return _Growing(self)


class _Growing:
    """A followed stream: blocks until the script's log grew, then sends the new bytes."""

    def __init__(self, api: JobsAPI) -> None:
        self.api, self.sent, self.closed = api, 0, False

    def read1(self, n: int) -> bytes:
        while not self.closed:
            text = self.api.steps[self.api.i][1].encode()
            if len(text) > self.sent:
                out = text[self.sent : self.sent + n]
                self.sent += len(out)
                return out
            time.sleep(0.005)
        return b""

    def close(self) -> None:
        self.closed = True

    def __enter__(self) -> _Growing:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def logs(api: JobsAPI) -> RayLogs:
    return RayLogs(api, redactor([SECRET]), ownership_key=KEY, poll_s=0.02)  # type: ignore[arg-type]


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
    assert next(c for c in chunks if c).startswith("line 1\n")  # whole lines only while the run goes on
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


def test_status_json_is_every_document_by_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``argus status --format json``: an object of path -> document, in path order (the store's
    map is no dict and iterates in no particular order)."""
    origin = tmp_path / "origin.git"
    subprocess.run(["git", "init", "-q", "--bare", str(origin)], check=True)
    files = {f"users/{u}/tasks/{n}.yaml": task_doc(u, n) for u in ("zed", "ann", "bob") for n in ("b", "a")}
    commit_files(str(origin), {path: dump(doc) for path, doc in files.items()})
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(origin), str(clone)], check=True, capture_output=True)
    assert main(["status", "--repo", str(clone), "--format", "json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert list(shown) == sorted(files) and shown == json.loads(json.dumps(files, default=str))


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
