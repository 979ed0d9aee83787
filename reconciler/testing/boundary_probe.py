"""What code in a job can reach of the daemon's, tried from wherever it runs (the compose test). Stdlib only.

``probe`` tries, each as its own step, what a hostile job tried on the head when the daemon lived there:
read the ownership key, find the daemon's secret in any process's environment (``/proc/*/environ``), read
or write the config repository, read or write the allowed-signers file, signal the daemon, and see the
daemon's volumes mounted. It prints one JSON line per step, ``{"step": ..., "reached": bool, "detail": ...}``,
after a first line saying where it ran. It never prints a secret: the daemon's secret is looked for by its
SHA-256 and reported by process id only.

``submit`` is what a job's own code does with the Ray token every Ray process holds: it submits ``probe`` as a
job of its own through the dashboard's REST API **without entrypoint resources** (Ray then runs the driver on
the head), waits for it to end and prints its output. Run ``python -m reconciler.testing.boundary_probe
submit --help``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import signal
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

# The daemon's files and folders, by the paths its container uses (docker-compose.yaml).
OWNERSHIP_KEY = "/var/cache/argus/state/ownership.key"
STATE_DIR = "/var/cache/argus"
REPO = "/srv/git/config.git"
SIGNERS = "/run/argus/allowed_signers"
DAEMON_MOUNTS = ("/var/cache/argus", "/srv/git", "/keys", "/run/argus")
# File names searched for anywhere on the file system (a copy the daemon might have left somewhere).
NAMES = {"ownership.key": "ownership_key", "allowed_signers": "allowed_signers", "config.git": "git_repository"}
SKIP = ("/proc", "/sys", "/dev")
WALK_LIMIT_S = 120.0
WALK_LIMIT_ENTRIES = 2_000_000
MAX_ENVIRON = 1 << 20


def _report(step: str, reached: bool, detail: str) -> None:
    print(json.dumps({"step": step, "reached": reached, "detail": detail}), flush=True)


def _try_read(path: str) -> str | None:
    """``None`` when ``path`` could be read (a leak); otherwise why not."""
    try:
        with open(path, "rb") as fh:
            fh.read(1)
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    return None


def _try_append(path: str) -> str | None:
    """Open the existing file ``path`` for writing (nothing is written); ``None`` when that worked (a leak)."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    return None


def _try_create(folder: str) -> str | None:
    """Create a new file in the existing ``folder`` and remove it again (a file git ignores, in a repository;
    the way a file there is replaced); ``None`` when that worked (a leak)."""
    path = os.path.join(folder, f".boundary-probe-{os.getpid()}")
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError as exc:
        return f"{folder}: {exc.strerror or exc}"
    os.unlink(path)
    return None


def walk(root: str = "/") -> tuple[dict[str, list[str]], bool]:
    """Paths under ``root`` named as in NAMES, by step, and whether the walk finished within its bounds."""
    found: dict[str, list[str]] = {step: [] for step in NAMES.values()}
    deadline, seen = time.monotonic() + WALK_LIMIT_S, 0
    stack = [root]
    while stack:
        top = stack.pop()
        try:
            entries = list(os.scandir(top))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            if entry.name in NAMES:
                found[NAMES[entry.name]].append(entry.path)
            try:
                if entry.is_dir(follow_symlinks=False) and entry.path not in SKIP:
                    stack.append(entry.path)
            except OSError:
                continue
        if time.monotonic() > deadline or seen > WALK_LIMIT_ENTRIES:
            return found, False
    return found, True


def _processes() -> Iterator[tuple[int, str]]:
    """(pid, command line) of every process this one can see."""
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as fh:
                    yield int(name), fh.read(4096).replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue


def _environ_holders(secret_sha256: str) -> tuple[list[int], int]:
    """Process ids whose environment holds a value with that SHA-256, and how many environments were read."""
    holders, readable = [], 0
    for pid, _ in _processes():
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                raw = fh.read(MAX_ENVIRON)
        except OSError:
            continue
        readable += 1
        for item in raw.split(b"\0"):
            value = item.partition(b"=")[2]
            if value and hashlib.sha256(value).hexdigest() == secret_sha256:
                holders.append(pid)
                break
    return holders, readable


def _mounts() -> list[str]:
    """The mount points of this process's mount namespace."""
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as fh:
        return [line.split()[4] for line in fh if len(line.split()) > 4]


def probe(secret_sha256: str, signers: str = SIGNERS) -> int:
    """Try every step and print one line each; returns 0 (the caller judges the lines)."""
    print(json.dumps({"ran_on": socket.gethostname(), "uid": os.getuid(), "pid": os.getpid()}), flush=True)
    found, finished = walk()
    walked = "" if finished else " (file-system search cut short by its bounds)"

    why = _try_read(OWNERSHIP_KEY)
    copies = found["ownership_key"]
    _report(
        "ownership_key",
        why is None or bool(copies),
        f"read {OWNERSHIP_KEY}: {'ok' if why is None else why}; copies found: {copies[:5]}{walked}",
    )

    holders, readable = _environ_holders(secret_sha256)
    _report(
        "daemon_environment",
        bool(holders),
        f"{readable} process environments readable; the daemon's secret found in pids {holders[:10]}",
    )

    reads = [_try_read(os.path.join(REPO, name)) for name in ("HEAD", "config")]
    writes = [_try_create(REPO), _try_create(os.path.join(REPO, "refs", "heads"))]
    repos = found["git_repository"]
    reached = any(r is None for r in reads + writes) or bool(repos)
    _report(
        "git_repository",
        reached,
        f"reads: {[r or 'ok' for r in reads]}; writes: {[w or 'ok' for w in writes]}; "
        f"repositories found: {repos[:5]}{walked}",
    )

    read, append, create = _try_read(signers), _try_append(signers), _try_create(os.path.dirname(signers))
    lists = found["allowed_signers"]
    _report(
        "allowed_signers",
        read is None or append is None or create is None or bool(lists),
        f"read: {read or 'ok'}; write: {append or 'ok'}; replace: {create or 'ok'}; files found: {lists[:5]}{walked}",
    )

    daemons = [(pid, cmd) for pid, cmd in _processes() if "argus run" in cmd or "argus-node daemon" in cmd]
    signalled = []
    for pid, _ in daemons:
        try:
            os.kill(pid, 0)  # the same permission check as SIGTERM or SIGKILL, without their effect
            signalled.append(pid)
        except OSError:
            continue
    _report(
        "signal_daemon",
        bool(signalled),
        f"daemon processes visible: {[p for p, _ in daemons][:10]}; signal allowed to: {signalled[:10]}",
    )

    mounted = [m for m in _mounts() if m in DAEMON_MOUNTS]
    state = _try_read(STATE_DIR + "/state")
    _report("daemon_volumes", bool(mounted), f"mounted here: {mounted}; {STATE_DIR}: {state or 'ok'}")
    return 0


def _token() -> str:
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or "/run/secrets/ray_auth_token"
    with open(path, encoding="utf-8") as fh:
        return fh.read().strip()


def _call(base: str, token: str, method: str, path: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method=method)
    request.add_header("Authorization", f"Bearer {token}")
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=30) as resp:
        return json.loads(resp.read() or b"null")


def submit(dashboard: str, submission_id: str, secret_sha256: str, signers: str, timeout: float) -> int:
    """Submit ``probe`` as a job without entrypoint resources, wait, print its output; returns 0 when it ran."""
    token = _token()
    entrypoint = shlex.join(
        [
            "python3",
            "-m",
            "reconciler.testing.boundary_probe",
            "probe",
            "--secret-sha256",
            secret_sha256,
            "--signers",
            signers,
        ]
    )
    _call(dashboard, token, "POST", "/api/jobs/", {"entrypoint": entrypoint, "submission_id": submission_id})
    print(f"submitted {submission_id} from {socket.gethostname()}", flush=True)
    deadline = time.monotonic() + timeout
    status = "PENDING"
    while time.monotonic() < deadline:
        status = _call(dashboard, token, "GET", f"/api/jobs/{submission_id}").get("status", "?")
        if status in ("SUCCEEDED", "FAILED", "STOPPED"):
            break
        time.sleep(2)
    logs = _call(dashboard, token, "GET", f"/api/jobs/{submission_id}/logs").get("logs", "")
    print(logs, flush=True)
    print(f"probe job {submission_id}: {status}", flush=True)
    return 0 if status == "SUCCEEDED" else 1


def main(argv: list[str] | None = None) -> int:
    """``probe`` or ``submit`` (see the module's docstring); returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m reconciler.testing.boundary_probe")
    sub = parser.add_subparsers(dest="command", required=True)
    pr = sub.add_parser("probe", help="try each step here")
    pr.add_argument("--secret-sha256", required=True, help="SHA-256 (hex) of a secret only the daemon holds")
    pr.add_argument("--signers", default=SIGNERS)
    sm = sub.add_parser("submit", help="submit `probe` as a job without entrypoint resources")
    sm.add_argument("--dashboard", default="http://head:8265")
    sm.add_argument("--submission-id", required=True)
    sm.add_argument("--secret-sha256", required=True)
    sm.add_argument("--signers", default=SIGNERS)
    sm.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    if args.command == "probe":
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        return probe(args.secret_sha256, args.signers)
    try:
        return submit(args.dashboard, args.submission_id, args.secret_sha256, args.signers, args.timeout)
    except (OSError, urllib.error.URLError, ValueError) as exc:
        print(f"submit failed: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
