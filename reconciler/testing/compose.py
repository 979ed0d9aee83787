"""The compose stack's CPU profile, brought up on free ports by a private Docker daemon (tests, bench). I/O.

:func:`prepare` installs Debian's docker.io/docker-compose/debootstrap when missing, starts the private
daemon (:mod:`reconciler.testing.docker`), makes the Debian base and offers pip's local wheels to the build.
:class:`Stack` is one compose project (its own name, folder, keys, env file and ports) driven with Debian's
``docker-compose`` 1.29 exactly as docs/compose.md tells an admin to; :meth:`Stack.down` removes exactly its
containers, networks and volumes.
"""

from __future__ import annotations

import json
import os
import resource
import secrets
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from reconciler.testing import docker
from reconciler.testing.ray_head import free_port

ROOT = Path(__file__).resolve().parents[2]
FILES = ("docker-compose.yaml", "docker-compose.cpu.yaml")
PORTS = ("ARGUS_HTTP_PORT", "ARGUS_WEB_PORT", "ARGUS_OPENAI_PORT", "ARGUS_GIT_SSH_PORT", "ARGUS_SFTP_PORT")
USERS = ("admin", "alice", "bob")
T = TypeVar("T")


def pip_find_links() -> list[Path]:
    """The local wheel folders pip's own configuration offers ($PIP_FIND_LINKS, ``pip config``)."""
    found = os.environ.get("PIP_FIND_LINKS", "").split()
    proc = subprocess.run(["python3", "-m", "pip", "config", "list"], capture_output=True, text=True, check=False)
    for line in proc.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.endswith("find-links"):
            found.extend(value.strip("'\"").split())
    return [Path(p) for p in found if Path(p).is_dir()]


def offer_wheels() -> list[str]:
    """Hard-link (or copy) the local wheels into images/wheels/ (git-ignored); returns their names."""
    dest = ROOT / "images" / "wheels"
    names = []
    for folder in pip_find_links():
        for wheel in folder.glob("*.whl"):
            target = dest / wheel.name
            if not target.exists():
                try:
                    os.link(wheel, target)
                except OSError:
                    shutil.copy(wheel, target)
            names.append(wheel.name)
    return names


def prepare() -> docker.Daemon:
    """Packages, the private daemon, the Debian base and the wheels. Raises RuntimeError when impossible."""
    docker.install_packages()
    daemon = docker.start_daemon()
    docker.make_os_image(daemon)
    offer_wheels()
    return daemon


def wait_for(what: Callable[[], T | None], message: str, timeout: float, every: float = 2.0) -> T:
    """Poll ``what`` until it returns something truthy; returns it. Raises AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = what()
            if value:
                return value
        except Exception as exc:  # a service that is not up yet
            last_error = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {message} (last error: {last_error})")
        time.sleep(every)


def http_get(url: str, timeout: float = 10, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """GET ``url``; returns (status, body), also for HTTP errors."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def limits() -> list[str]:
    """ARGUS_NOFILE/ARGUS_MEMLOCK settings within this process's hard limits (the private dockerd's: a
    container cannot raise its limits above the daemon's)."""
    out = []
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if nofile != resource.RLIM_INFINITY and nofile < 65536:
        out.append(f"ARGUS_NOFILE={nofile}")
    memlock = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    if memlock != resource.RLIM_INFINITY:
        out.append(f"ARGUS_MEMLOCK={memlock}")
    return out


@dataclass
class Stack:
    """One compose project of the CPU profile on free ports, with its own folder, keys and env file."""

    daemon: docker.Daemon
    root: Path
    project: str = field(default_factory=lambda: f"argus-e2e-{secrets.token_hex(3)}")
    ports: dict[str, int] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    # A secret only the daemon holds (its .env): the compose test looks for it where jobs run.
    webhook_secret: str = field(default_factory=lambda: secrets.token_hex(24))

    def __post_init__(self) -> None:
        if not self.ports:
            self.ports = {name: free_port() for name in (*PORTS, "ARGUS_DASHBOARD_PORT")}

    @property
    def env_file(self) -> Path:
        return self.root / "stack.env"

    def key(self, user: str) -> Path:
        return self.root / "client" / user

    def setup(self, admins: str = "admin") -> None:
        """The admin's first run, as docs/compose.md says: env file, keys, then images/first-run."""
        (self.root / "client").mkdir(parents=True, exist_ok=True)
        (self.root / "keys").mkdir(exist_ok=True)
        for user in USERS:
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", user, "-f", str(self.key(user))], check=True
            )
            shutil.copy(self.key(user).with_suffix(".pub"), self.root / "keys" / f"{user}.pub")
        lines = [
            f"ARGUS_ENV_FILE={self.env_file}",
            f"ARGUS_PRIVATE_DIR={self.root / 'private'}",
            f"ARGUS_KEYS_DIR={self.root / 'keys'}",
            f"ARGUS_RAY_TOKEN_FILE={self.root / 'secrets' / 'ray_auth_token'}",
            f"ARGUS_ADMINS={admins}",
            f"ARGUS_WEBHOOK_SECRET={self.webhook_secret}",
            f"ARGUS_PUBLIC_ENDPOINT=http://127.0.0.1:{self.ports['ARGUS_OPENAI_PORT']}/v1",
            "ARGUS_SHM_SIZE=1gb",
            "ARGUS_CPU_WORKER_GPUS=2",
            "ARGUS_CPU_WORKER_CPUS=3",
            *limits(),
            *(f"{name}={port}" for name, port in self.ports.items()),
        ]
        self.env_file.write_text("\n".join(lines) + "\n")
        self.env_file.chmod(0o600)
        # images/first-run reads its settings from the environment, in a folder holding the compose file.
        shutil.copy(ROOT / "docker-compose.yaml", self.root / "docker-compose.yaml")
        shutil.copy(ROOT / ".env.example", self.root / ".env.example")
        env = {**os.environ, **dict(line.split("=", 1) for line in lines)}
        subprocess.run(["sh", str(ROOT / "images" / "first-run")], cwd=self.root, env=env, check=True)

    def compose(self, *args: str, check: bool = True, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
        """Debian's docker-compose 1.29 on both files, this project, this env file."""
        files = [a for f in FILES for a in ("-f", str(ROOT / f))]
        cmd = ["/usr/bin/docker-compose", "-p", self.project, "--env-file", str(self.env_file), *files, *args]
        proc = subprocess.run(cmd, env=self.daemon.env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        if check and proc.returncode != 0:
            raise AssertionError(f"docker-compose {' '.join(args)} failed ({proc.returncode}): {proc.stderr[-4000:]}")
        return proc

    def up(self, *extra: str) -> float:
        """``up -d --build`` (or with ``extra``); returns the seconds it took."""
        started = time.monotonic()
        self.compose("up", "-d", *extra)
        return time.monotonic() - started

    def exec(self, service: str, *cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.compose("exec", "-T", service, *cmd, check=check, timeout=120)

    def container_id(self, service: str) -> str:
        return self.compose("ps", "-q", service).stdout.strip()

    def url(self, port: str, path: str = "") -> str:
        return f"http://127.0.0.1:{self.ports[port]}{path}"

    def healthy(self) -> bool:
        """The daemon's /healthz is 200: its last tick read the repository and reached Ray."""
        return http_get(self.url("ARGUS_HTTP_PORT", "/healthz"), timeout=5)[0] == 200

    def answers(self) -> bool:
        """The daemon's /healthz answers at all (503 before the first push: the branch does not exist yet)."""
        status, body = http_get(self.url("ARGUS_HTTP_PORT", "/healthz"), timeout=5)
        return status in (200, 503) and body.startswith(b"{")

    def token(self) -> str:
        return (self.root / "secrets" / "ray_auth_token").read_text().strip()

    def dashboard(self, path: str) -> Any:
        status, body = http_get(
            self.url("ARGUS_DASHBOARD_PORT", path), headers={"Authorization": f"Bearer {self.token()}"}
        )
        assert status == 200, (status, body[:500])
        return json.loads(body)

    def ssh_command(self, user: str) -> str:
        return (
            f"ssh -F /dev/null -i {self.key(user)} -o IdentitiesOnly=yes -o BatchMode=yes "
            "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o ConnectTimeout=20"
        )

    def git_url(self) -> str:
        return f"ssh://git@127.0.0.1:{self.ports['ARGUS_GIT_SSH_PORT']}/srv/git/config.git"

    def logs(self) -> str:
        return self.compose("logs", "--no-color", "--tail=200", check=False).stdout

    def down(self) -> None:
        """Remove exactly this project's containers, networks and volumes (its images stay: the layer cache)."""
        self.compose("down", "--volumes", "--remove-orphans", "--timeout", "20", check=False, timeout=600)
