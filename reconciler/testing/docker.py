"""A private Docker daemon and local base images for the compose test and bench (no Docker Hub needed).

The daemon gets its own socket, data root, exec root and pid file under one cache folder; the data root
persists between runs on one machine as a layer cache. It is stopped by its pid, never by name. One run at
a time uses a cache folder (an exclusive lock on ``session.lock``, held from :func:`start_daemon` to
:func:`stop_daemon`): a second test or bench on the same machine waits for it, rather than building the
same image tags at once or losing the daemon when the first run stops it. Base images
are made from Debian packages only (debootstrap into ``docker import``), with this machine's CA bundle, so
that apt and pip work inside builds on machines whose TLS goes through a site CA.

Run as ``python -m reconciler.testing.docker up|bases|down`` to prepare the cache by hand.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

CACHE = Path(os.environ.get("ARGUS_TEST_DOCKER_CACHE", "/var/cache/argus-test-docker"))
OS_IMAGE = "debian:bookworm-slim"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
DEBIAN_MIRROR = os.environ.get("ARGUS_DEBIAN_MIRROR", "http://deb.debian.org/debian")
PACKAGES = ("docker.io", "docker-compose", "debootstrap")
LOCK_WAIT_S = float(os.environ.get("ARGUS_TEST_DOCKER_WAIT_S", "3600"))


@dataclass
class Daemon:
    """A dockerd this process started (``started``) or found running on the same socket."""

    root: Path
    pid: int
    started: bool
    lock: int | None = None  # the descriptor holding the cache folder's lock (released by stop_daemon)

    @property
    def socket(self) -> Path:
        return self.root / "docker.sock"

    @property
    def env(self) -> dict[str, str]:
        """The environment for docker and docker-compose clients of this daemon (Debian's own docker first)."""
        env = {**os.environ, "DOCKER_HOST": f"unix://{self.socket}", "DOCKER_BUILDKIT": "1"}
        env["COMPOSE_DOCKER_CLI_BUILD"] = "1"
        env["PATH"] = "/usr/bin:" + env.get("PATH", "")
        return env

    def docker(self, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """Run Debian's ``/usr/bin/docker`` against this daemon; returns the finished process."""
        return subprocess.run(
            ["/usr/bin/docker", *args], env=self.env, capture_output=True, text=True, check=check, timeout=timeout
        )


def missing_packages() -> list[str]:
    """The Debian packages of PACKAGES that are not installed (``dockerd`` etc. not on this machine)."""
    need = {
        "docker.io": "/usr/sbin/dockerd",
        "docker-compose": "/usr/bin/docker-compose",
        "debootstrap": "/usr/sbin/debootstrap",
    }
    return [name for name, path in need.items() if not Path(path).exists()]


def install_packages() -> None:
    """apt-get install the missing PACKAGES (root only). Raises RuntimeError when not root or apt fails."""
    missing = missing_packages()
    if not missing:
        return
    if os.geteuid() != 0:
        raise RuntimeError(f"install the Debian packages {' '.join(missing)} (needs root)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", *missing]):
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if proc.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed: {proc.stderr[-2000:]}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def _take_lock(root: Path, timeout: float) -> int:
    """Take the cache folder's exclusive lock, waiting up to ``timeout`` seconds for another run
    to release it. Returns the descriptor; raises RuntimeError on timeout."""
    fd = os.open(root / "session.lock", os.O_RDWR | os.O_CREAT, 0o600)
    deadline, said = time.monotonic() + timeout, False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                raise RuntimeError(f"{root} stayed in use by another run for {timeout:.0f}s") from None
            if not said:
                print(f"waiting for another run that uses {root} to end", file=sys.stderr, flush=True)
                said = True
            time.sleep(2)


def _release(daemon: Daemon) -> None:
    if daemon.lock is not None:
        os.close(daemon.lock)  # closing the descriptor releases the lock
        daemon.lock = None


def start_daemon(root: Path = CACHE, timeout: float = 60, lock_wait: float = LOCK_WAIT_S) -> Daemon:
    """Take the folder's lock, then start dockerd with its own socket, data root and pid file under
    ``root`` (or reuse one left running there).

    Returns the Daemon (call :func:`stop_daemon` to stop it and release the lock); raises
    RuntimeError when it does not answer within ``timeout`` seconds or another run keeps the
    folder longer than ``lock_wait``.
    """
    root.mkdir(parents=True, exist_ok=True)
    lock = _take_lock(root, lock_wait)
    try:
        return _start(root, timeout, lock)
    except BaseException:
        os.close(lock)
        raise


def _start(root: Path, timeout: float, lock: int) -> Daemon:
    pidfile = root / "docker.pid"
    if pidfile.exists():
        pid = int(pidfile.read_text().strip() or 0)
        if pid and _alive(pid):
            daemon = Daemon(root, pid, started=False, lock=lock)
            if daemon.docker("version", check=False, timeout=20).returncode == 0:
                return daemon
        pidfile.unlink(missing_ok=True)
    log = (root / "dockerd.log").open("ab")
    proc = subprocess.Popen(
        [
            "/usr/sbin/dockerd",
            f"--data-root={root / 'data'}",
            f"--exec-root={root / 'exec'}",
            f"--pidfile={pidfile}",
            f"--host=unix://{root / 'docker.sock'}",
        ],
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    daemon = Daemon(root, proc.pid, started=True)  # no lock: start_daemon releases it on failure
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"dockerd exited ({proc.returncode}); see {root / 'dockerd.log'}")
        if daemon.socket.exists() and daemon.docker("version", check=False, timeout=20).returncode == 0:
            daemon.lock = lock
            return daemon
        time.sleep(0.5)
    stop_daemon(daemon)
    raise RuntimeError(f"dockerd did not answer within {timeout}s; see {root / 'dockerd.log'}")


def stop_daemon(daemon: Daemon, timeout: float = 60) -> None:
    """Stop the daemon by its pid if this process started it (SIGTERM, then SIGKILL after
    ``timeout``), and release the cache folder's lock."""
    try:
        if not daemon.started or not _alive(daemon.pid):
            return
        os.kill(daemon.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(daemon.pid) and time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(daemon.pid, os.WNOHANG)
            time.sleep(0.2)
        if _alive(daemon.pid):
            os.kill(daemon.pid, signal.SIGKILL)
    finally:
        _release(daemon)


def has_image(daemon: Daemon, name: str) -> bool:
    """Whether the daemon has an image of that name."""
    return daemon.docker("image", "inspect", name, check=False, timeout=30).returncode == 0


def add_ca_bundle(rootfs: Path, bundle: str) -> int:
    """Make the image trust every certificate of ``bundle`` (PEM); returns how many there are.

    The bundle goes to /etc/ssl/certs/ca-certificates.crt (what pip's PIP_CERT and OpenSSL read) and each
    certificate to /usr/local/share/ca-certificates/argus-site/, so that a later ``update-ca-certificates``
    (installing Debian's ca-certificates package runs it, and rebuilds the bundle) keeps them.
    """
    certs = re.findall(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", bundle, re.S)
    (rootfs / "etc/ssl/certs").mkdir(parents=True, exist_ok=True)
    (rootfs / "etc/ssl/certs/ca-certificates.crt").write_text("\n".join(certs) + "\n", encoding="ascii")
    site = rootfs / "usr/local/share/ca-certificates/argus-site"
    site.mkdir(parents=True, exist_ok=True)
    for number, cert in enumerate(certs):
        (site / f"site-{number:04d}.crt").write_text(cert + "\n", encoding="ascii")
    return len(certs)


def make_os_image(daemon: Daemon, name: str = OS_IMAGE, suite: str = "bookworm") -> None:
    """Make ``name`` from Debian packages (debootstrap minbase + the machine's CA bundle) unless it exists.

    Raises subprocess.CalledProcessError when debootstrap or the import fails.
    """
    if has_image(daemon, name):
        return
    rootfs = daemon.root / "rootfs"
    shutil.rmtree(rootfs, ignore_errors=True)
    subprocess.run(
        ["debootstrap", "--variant=minbase", suite, str(rootfs), DEBIAN_MIRROR],
        check=True,
        capture_output=True,
        timeout=1200,
    )
    if CA_BUNDLE.exists():
        add_ca_bundle(rootfs, CA_BUNDLE.read_text(encoding="ascii", errors="replace"))
    for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for item in (rootfs / cache).glob("*"):
            if item.is_file():
                item.unlink()
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    subprocess.run(
        ["/usr/bin/docker", "import", "--change", 'CMD ["bash"]', "-", name],
        stdin=tar.stdout,
        env=daemon.env,
        check=True,
        capture_output=True,
        timeout=600,
    )
    tar.wait()
    shutil.rmtree(rootfs, ignore_errors=True)


def main(argv: list[str]) -> int:
    """``up`` (install, start), ``bases`` (up + the OS image) or ``down`` (stop the daemon of the pid file)."""
    what = argv[0] if argv else "up"
    if what == "down":
        pidfile = CACHE / "docker.pid"
        if pidfile.exists():
            stop_daemon(Daemon(CACHE, int(pidfile.read_text()), started=True))
        return 0
    install_packages()
    daemon = start_daemon()
    if what == "bases":
        make_os_image(daemon)
    print(f"DOCKER_HOST=unix://{daemon.socket} pid {daemon.pid}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
