"""Bounded log reads (pure logic over stand-in streams): a tail keeps only its last bytes however
much Ray sends, one endless line is never held whole while following, and a task's log is read
through the state API's ``lines=`` endpoint, never the Jobs API's whole-log answer."""

from __future__ import annotations

import io
from typing import Any

from reconciler.builders.jobs import ownership_proof
from reconciler.logs.ray import MAX_HELD_CHARS, RayLogs, _sendable, redactor
from reconciler.logs.tail import MAX_TAIL_LINES, Tail, read_last
from reconciler.observe.jobs import TAIL_BYTES, job_log_tail

SID = "argus--ann--train--0123abcd"
KEY = b"daemon-ownership-key-for-tests!!"
LABELS = {
    "managed-by": "argus",
    "argus-user": "ann",
    "argus-task": "train",
    "argus-spec-hash": "abc",
}
# The jobs below hold only labels (no entrypoint or runtime env): the proof covers exactly that.
META = {**LABELS, "argus-proof": ownership_proof(KEY, SID, {"metadata": LABELS})}
DOC = {"submission_id": SID, "runs": [{"submission_id": SID}]}


class Endless(io.RawIOBase):
    """``size`` bytes of ``line`` repeated, produced as read (never held)."""

    def __init__(self, line: bytes, size: int) -> None:
        self.line, self.left, self.read_bytes = line, size, 0

    def read1(self, n: int = -1) -> bytes:
        n = min(n, self.left)
        out = (self.line * (n // len(self.line) + 1))[:n]
        self.left -= n
        self.read_bytes += n
        return out


class StateAPI:
    """``GET /api/jobs/<id>`` and the state API's log file, which records the paths asked for."""

    def __init__(self, log: bytes) -> None:
        self.log, self.paths = log, []  # type: ignore[var-annotated]

    def get(self, path: str, **_: Any) -> Any:
        assert not path.endswith("/logs"), "the whole-log endpoint is never used"
        return {"status": "SUCCEEDED", "metadata": META, "driver_node_id": "n1"}

    def stream(self, path: str, **_: Any) -> Any:
        self.paths.append(path)
        return io.BytesIO(self.log)


def test_a_tail_keeps_only_the_last_bytes_from_a_line_start() -> None:
    source = Endless(b"0123456789abcdef\n", 20 * 1024 * 1024)
    tail = read_last(source, 1000)  # type: ignore[arg-type]
    assert source.read_bytes == 20 * 1024 * 1024 and tail.cut and not tail.gave_up
    assert len(tail.text) <= 1000 and tail.text.startswith("0123456789abcdef\n")
    assert "left out" in tail.note(1000)


def test_a_tail_gives_up_on_endless_lines_after_its_read_bound() -> None:
    source = Endless(b"x", 10**9)
    tail = read_last(source, 4096, max_read=2 * 1024 * 1024)  # type: ignore[arg-type]
    assert tail.gave_up and source.read_bytes <= 2 * 1024 * 1024 + 64 * 1024 and len(tail.text) <= 4096
    assert Tail("x").note(10) == ""


def test_the_status_tail_is_read_with_a_line_count_and_a_byte_bound() -> None:
    api = StateAPI(b"".join(b"line %d\n" % i for i in range(100_000)))
    lines = job_log_tail(api, SID)  # type: ignore[arg-type]
    assert lines[-1] == "line 99999" and len(lines) == 50
    assert api.paths == [f"/api/v0/logs/file?node_id=n1&filename=job-driver-{SID}.log&lines=50&timeout=10"]
    big = StateAPI(b"y" * (TAIL_BYTES * 3) + b"\nend\n")
    assert job_log_tail(big, SID) == ["end"]  # type: ignore[arg-type]


def test_task_log_honours_tail_and_limit_bytes_and_caps_them() -> None:
    api = StateAPI(b"".join(b"line %d\n" % i for i in range(5000)))
    logs = RayLogs(api, lambda s: s, ownership_key=KEY)  # type: ignore[arg-type]
    text = logs.task_log("ann", "train", DOC, None, tail=10**9, limit_bytes=100)
    assert f"lines={MAX_TAIL_LINES}" in api.paths[-1]
    assert text.startswith("[argus: output before the last 100 bytes left out]\n") and text.endswith("line 4999\n")
    assert len(text.encode()) < 200
    logs.task_log("ann", "train", DOC, None)
    assert "lines=1000" in api.paths[-1]
    assert logs.readers.free == logs.readers.total  # every read gave its slot back


def test_following_never_holds_an_endless_line_whole() -> None:
    pending = "z" * (MAX_HELD_CHARS + 1)
    assert _sendable(pending) == (pending, "")
    head, rest = _sendable("done\n" + "z" * (MAX_HELD_CHARS + 1))
    assert rest == "" and head.startswith("done\n")
    assert _sendable("a\nb") == ("a\n", "b")


class NeverStarted:
    """A run whose driver never started (no driver node, no log file): pending, then failed."""

    def __init__(self) -> None:
        self.reads = 0

    def get(self, path: str, **_: Any) -> Any:
        self.reads += 1
        return {"status": "PENDING" if self.reads < 4 else "FAILED", "metadata": META}

    def stream(self, path: str, **_: Any) -> Any:
        raise AssertionError("no stream is opened without a driver node")


def test_following_a_run_that_never_started_ends_with_its_state() -> None:
    logs = RayLogs(NeverStarted(), lambda s: s, ownership_key=KEY, poll_s=0.02)  # type: ignore[arg-type]
    text = "".join(logs.follow_task_log("ann", "train", DOC, None))
    assert text == f"[argus: run {SID} FAILED]\n"
    assert logs.followers.free == logs.max_followers
    # A plain read says plainly that Ray has no log for it.
    assert logs.task_log("ann", "train", DOC, None).startswith(f"[argus: Ray has no log for {SID} now")


def test_a_tail_over_the_redactors_cap_is_redacted_whole_in_pieces() -> None:
    secret = "s3cr3t-value-xyz"
    pad = b"x" * 580
    # The last 10,000 lines (what the state API answers), ~6 MB: over the redactor's 1 Mi cap.
    body = b"".join(b"line %07d %s key %s\n" % (i, pad, secret.encode()) for i in range(MAX_TAIL_LINES))
    api = StateAPI(body)
    logs = RayLogs(api, redactor([secret]), ownership_key=KEY)  # type: ignore[arg-type]
    text = logs.task_log("ann", "train", DOC, None, tail=MAX_TAIL_LINES, limit_bytes=8 * 1024 * 1024)
    lines = text.splitlines()
    assert secret not in text and "characters cut" not in text
    assert len(lines) == MAX_TAIL_LINES and lines[-1] == f"line 0009999 {'x' * 580} key ***"
