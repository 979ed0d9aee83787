"""Start a private Ray head node in its own process group, on free ports. I/O.

Other Ray clusters may share the machine, so nothing here uses ``ray stop`` or the
default ports: the head runs as ``ray start --head --block`` in a new session and is
stopped by killing exactly that process group.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

# Ports a head node listens on, besides the worker range (names of `ray start` options).
_PORT_OPTIONS = (
    "port",
    "dashboard-port",
    "ray-client-server-port",
    "node-manager-port",
    "object-manager-port",
    "dashboard-agent-listen-port",
    "dashboard-agent-grpc-port",
    "metrics-export-port",
    "runtime-env-agent-port",
)


def free_port() -> int:
    """Return a TCP port that was free a moment ago (the kernel's choice)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port_range(
    size: int, low: int = 20000, high: int = 60000, tries: int = 50, exclude: Collection[int] = ()
) -> tuple[int, int]:
    """Return ``(first, last)`` of ``size`` consecutive ports that are all free now and none
    of them in ``exclude`` (ports already picked for something else: Ray refuses overlaps).

    Raises RuntimeError when no such range is found in ``tries`` random attempts.
    """
    for _ in range(tries):
        first = random.randrange(low, high - size)
        if all(p not in exclude and _port_free(p) for p in range(first, first + size)):
            return first, first + size - 1
    raise RuntimeError(f"no {size} consecutive free ports found")


@dataclass
class RayHead:
    """A running head node: its addresses and the process to kill."""

    process: subprocess.Popen[bytes]
    temp_dir: str
    ports: Mapping[str, int]
    serve_port: int
    log_path: str
    env: Mapping[str, str] = field(default_factory=dict)
    auth_token: str | None = None
    worker_ports: tuple[int, int] = (0, 0)
    options: Mapping[str, object] = field(default_factory=dict)  # start_head's arguments, for restart()

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['dashboard-port']}"

    @property
    def gcs_address(self) -> str:
        return f"127.0.0.1:{self.ports['port']}"

    @property
    def serve_url(self) -> str:
        """Base URL of the Serve HTTP proxy, once Serve is started with ``serve_port``."""
        return f"http://127.0.0.1:{self.serve_port}"

    def logs_dir(self) -> Path:
        """The head's log folder (Ray's ``session_latest/logs``)."""
        return Path(self.temp_dir) / "session_latest" / "logs"

    def engine_log_tails(self, lines: int = 40, max_files: int = 6, since: float = 0.0) -> str:
        """The last ``lines`` of the Serve replica logs and of the worker output files that
        mention a vLLM engine, newest first, at most ``max_files`` of them, modified after
        ``since`` (epoch s): what a failing serving test prints to explain itself."""
        return engine_log_tails(self.logs_dir(), lines=lines, max_files=max_files, since=since)

    def save_logs(self, dest: Path, max_bytes: int = 64 << 20) -> Path:
        """Copy the head's logs to ``dest`` (newest files first, at most ``max_bytes``); return it."""
        return copy_logs(self.logs_dir(), dest, max_bytes)

    def stop(self) -> None:
        """Kill the head and every process it started, Serve replicas and vLLM engines included.

        Ray workers call setsid(), so killing the head's process group is not enough, and
        once the raylet dies they are re-parented away from it. The whole process tree is
        therefore frozen (SIGSTOP, so nothing new is spawned), collected, then killed.
        """
        _kill_tree(self.process)


def _kill_tree(process: subprocess.Popen[bytes]) -> None:
    """Kill ``process``, every process it started and its process group, and wait for the kills
    to land (see :meth:`RayHead.stop` for why the tree is frozen first)."""
    frozen: set[int] = set()
    while True:
        tree = _descendants(process.pid) | {process.pid}
        new = tree - frozen
        if not new:
            break
        for pid in new:
            _signal(pid, signal.SIGSTOP)
        frozen |= new
    for pid in frozen:
        _signal(pid, signal.SIGKILL)
    _signal_group(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10)
    # Wait for the kills to land, so the caller can delete temp_dir without a race.
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in frozen) and time.monotonic() < deadline:
        time.sleep(0.1)


def restart_head(head: RayHead, timeout_s: float = 120.0) -> RayHead:
    """Stop ``head`` (every process of it) and start a new, empty head on the same ports.

    What a head restart without GCS fault tolerance looks like to clients: same addresses,
    no jobs, no Serve applications. Returns the new :class:`RayHead`.
    """
    head.stop()
    return start_head(
        **head.options,  # type: ignore[arg-type]
        temp_dir=head.temp_dir,
        ports=head.ports,
        serve_port=head.serve_port,
        worker_ports=head.worker_ports,
        timeout_s=timeout_s,
    )


_ENGINE_MARKERS = ("EngineCore", "EngineDeadError", "VLLM::", "vllm")


def _newest(logs: Path, since: float) -> list[Path]:
    files = [p for p in logs.rglob("*") if p.is_file() and not p.is_symlink()] if logs.is_dir() else []
    return sorted((p for p in files if p.stat().st_mtime >= since), key=lambda p: p.stat().st_mtime, reverse=True)


def _tail_lines(path: Path, lines: int, chunk: int = 256 << 10) -> list[str]:
    with path.open("rb") as fh:
        fh.seek(0, os.SEEK_END)
        fh.seek(max(0, fh.tell() - chunk))
        return fh.read().decode(errors="replace").splitlines()[-lines:]


def engine_log_tails(logs: Path, lines: int = 40, max_files: int = 6, since: float = 0.0) -> str:
    """See :meth:`RayHead.engine_log_tails`; reads at most 256 KiB of each file."""
    picked: list[tuple[Path, list[str]]] = []
    for path in _newest(logs, since):
        serve_replica = path.parent.name == "serve" and path.name.startswith("replica_")
        worker_output = path.name.startswith("worker-") and path.suffix in (".out", ".err")
        if not (serve_replica or worker_output):
            continue
        tail = _tail_lines(path, lines)
        if worker_output and not any(m in line for line in tail for m in _ENGINE_MARKERS):
            continue
        picked.append((path, tail))
        if len(picked) >= max_files:
            break
    return "\n".join(f"--- {p.relative_to(logs)} (last {len(t)} lines)\n" + "\n".join(t) for p, t in picked)


def copy_logs(logs: Path, dest: Path, max_bytes: int = 64 << 20) -> Path:
    """See :meth:`RayHead.save_logs`."""
    total = 0
    for path in _newest(logs, 0.0):
        size = path.stat().st_size
        if total + size > max_bytes:
            continue
        target = dest / path.relative_to(logs)
        target.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            shutil.copyfile(path, target)
            total += size
    return dest


def engine_core_pids(replica_pid: int) -> list[int]:
    """PIDs of the vLLM engine processes (``VLLM::EngineCore``) a Serve replica started."""
    out = []
    for pid in sorted(_descendants(replica_pid)):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "EngineCore" in cmdline:
            out.append(pid)
    return out


def _descendants(root: int) -> set[int]:
    """PIDs of all living descendants of ``root`` (from /proc; Linux only)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name may contain spaces or parentheses: parse after the last ')'.
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def _alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def start_head(
    *,
    num_cpus: int = 8,
    num_gpus: int = 0,
    resources: Mapping[str, float] | None = None,
    env: Mapping[str, str] | None = None,
    temp_dir: str | None = None,
    timeout_s: float = 120.0,
    auth_token: str | None = None,
    ports: Mapping[str, int] | None = None,
    serve_port: int | None = None,
    worker_ports: tuple[int, int] | None = None,
) -> RayHead:
    """Start ``ray start --head --block`` in a new session and wait for its dashboard.

    ``env`` is added to the head's environment (workers and Serve replicas inherit it).
    ``auth_token`` turns on Ray's token authentication (``RAY_AUTH_MODE=token``) with that token; without it
    the head runs with authentication explicitly disabled, whatever token files this machine holds.
    ``ports``/``serve_port``/``worker_ports`` pin the ports (default: free ones), as
    :func:`restart_head` does.
    Returns the :class:`RayHead`; raises RuntimeError (after killing it) when the
    dashboard does not answer within ``timeout_s`` or the process exits early.
    """
    # A short temp dir: Ray's Unix socket paths must stay under ~107 bytes.
    temp_dir = temp_dir or tempfile.mkdtemp(prefix="argr", dir="/tmp")
    ports = dict(ports) if ports else {name: free_port() for name in _PORT_OPTIONS}
    serve_port = serve_port or free_port()
    first, last = worker_ports or free_port_range(200, exclude={*ports.values(), serve_port})
    ray_bin = Path(sys.executable).with_name("ray")
    cmd = [
        str(ray_bin) if ray_bin.exists() else "ray",
        "start",
        "--head",
        "--block",
        "--disable-usage-stats",
        "--include-dashboard=true",
        "--dashboard-host=127.0.0.1",
        "--node-ip-address=127.0.0.1",
        f"--temp-dir={temp_dir}",
        f"--num-cpus={num_cpus}",
        f"--num-gpus={num_gpus}",
        f"--min-worker-port={first}",
        f"--max-worker-port={last}",
        *(f"--{name}={port}" for name, port in ports.items()),
    ]
    if resources:
        cmd.append(f"--resources={json.dumps(dict(resources))}")
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": auth_token} if auth_token else {"RAY_AUTH_MODE": "disabled"}
    full_env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **auth, **(env or {})}
    log_path = os.path.join(temp_dir, "ray-start.log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, env=full_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    options = {"num_cpus": num_cpus, "num_gpus": num_gpus, "resources": resources, "env": env, "auth_token": auth_token}
    head = RayHead(proc, temp_dir, ports, serve_port, log_path, dict(env or {}), auth_token, (first, last), options)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            head.stop()
            raise RuntimeError(f"ray start exited with {proc.returncode}:\n{_tail(log_path)}")
        if _dashboard_ready(head.dashboard_url, auth_token):
            return head
        time.sleep(1.0)
    head.stop()
    raise RuntimeError(f"Ray dashboard did not answer within {timeout_s:.0f} s:\n{_tail(log_path)}")


# Ports a worker node (a raylet joining a head) listens on, besides the worker range.
_WORKER_PORT_OPTIONS = (
    "node-manager-port",
    "object-manager-port",
    "dashboard-agent-listen-port",
    "dashboard-agent-grpc-port",
    "metrics-export-port",
    "runtime-env-agent-port",
)


@dataclass
class RayWorker:
    """A running worker node (an extra raylet of a private head): the process to kill."""

    process: subprocess.Popen[bytes]
    node_name: str  # the value of its ``argus_test_node`` resource: tells it apart in the dashboard
    ports: Mapping[str, int]
    log_path: str

    def stop(self) -> None:
        """Kill this raylet and every process it started (exactly its tree and process group)."""
        _kill_tree(self.process)


def start_worker(
    head: RayHead,
    *,
    num_cpus: int = 2,
    num_gpus: int = 0,
    resources: Mapping[str, float] | None = None,
    timeout_s: float = 120.0,
) -> RayWorker:
    """Start ``ray start --address=<head's GCS> --block`` in a new session: one more node of
    ``head``'s cluster on this machine, with ``num_gpus`` logical GPUs and ``resources``, on free
    ports (every port option and its own worker range), in the head's environment and auth mode.

    The node also gets a resource ``argus_test_node_<n>: 1`` (its ``node_name``) so that a test
    tells it apart. Returns the :class:`RayWorker` once the head's dashboard lists it alive;
    raises RuntimeError (after killing it) when that takes longer than ``timeout_s`` or the
    process exits early.
    """
    taken = {*head.ports.values(), head.serve_port, *range(head.worker_ports[0], head.worker_ports[1] + 1)}
    ports: dict[str, int] = {}
    for name in _WORKER_PORT_OPTIONS:
        port = free_port()
        while port in taken:
            port = free_port()
        ports[name] = port
        taken.add(port)
    first, last = free_port_range(100, exclude=taken)
    node_name = f"argus_test_node_{ports['node-manager-port']}"
    ray_bin = Path(sys.executable).with_name("ray")
    cmd = [
        str(ray_bin) if ray_bin.exists() else "ray",
        "start",
        f"--address={head.gcs_address}",
        "--block",
        "--disable-usage-stats",
        "--node-ip-address=127.0.0.1",
        f"--num-cpus={num_cpus}",
        f"--num-gpus={num_gpus}",
        f"--min-worker-port={first}",
        f"--max-worker-port={last}",
        *(f"--{name}={port}" for name, port in ports.items()),
        f"--resources={json.dumps({**dict(resources or {}), node_name: 1})}",
    ]
    token = head.auth_token
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token} if token else {"RAY_AUTH_MODE": "disabled"}
    full_env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **auth, **head.env}
    log_path = os.path.join(head.temp_dir, f"ray-start-{node_name}.log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, env=full_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    worker = RayWorker(proc, node_name, ports, log_path)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            worker.stop()
            raise RuntimeError(f"ray start (worker) exited with {proc.returncode}:\n{_tail(log_path)}")
        if _node_alive(head, node_name):
            return worker
        time.sleep(1.0)
    worker.stop()
    raise RuntimeError(f"worker node did not join within {timeout_s:.0f} s:\n{_tail(log_path)}")


def _node_alive(head: RayHead, resource: str) -> bool:
    """True when the head's dashboard lists an alive node offering ``resource``."""
    headers = {"Authorization": f"Bearer {head.auth_token}"} if head.auth_token else {}
    url = head.dashboard_url + "/api/v0/nodes?detail=1&limit=10000"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5) as resp:
            nodes = json.load(resp)["data"]["result"]["result"]
    except (urllib.error.URLError, OSError, ValueError, KeyError, TypeError):
        return False
    return any(n.get("state") == "ALIVE" and resource in (n.get("resources_total") or {}) for n in nodes)


def _dashboard_ready(url: str, token: str | None = None) -> bool:
    """True when both the dashboard and its Serve REST module answer."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        for path in ("/api/version", "/api/serve/applications/"):
            with urllib.request.urlopen(urllib.request.Request(url + path, headers=headers), timeout=5) as resp:
                if resp.status != 200:
                    return False
    except (urllib.error.URLError, OSError, ValueError):
        return False
    return True


def _tail(path: str, n: int = 4000) -> str:
    try:
        return Path(path).read_text(errors="replace")[-n:]
    except OSError:
        return ""
