"""The compose file service (images/sftp), run for real: Debian's sshd on a loopback port with the config the
image renders (``sshd-config``), accounts made by the image's ``sync-accounts`` from key files, keys served by
its ``sftp-authorized-keys``, rsync put into the chroot by its ``rsync-chroot`` and served through its
``rsync-shell``, and the real ``sftp``/``scp``/``ssh``/``rsync`` clients with real keys.

Accounts: the test makes real system accounts (CI runs as root) with unique names through the image's own
``sync-accounts``, and deletes them, their groups, the sshd it started and its folder at the end.
The chroot lives under /var/lib (sshd refuses a chroot below a world-writable folder such as /tmp).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

IMAGE = Path(__file__).resolve().parents[2] / "images" / "sftp"
SCRIPTS = ("entrypoint", "sshd-config", "sync-accounts", "sftp-authorized-keys", "rsync-chroot", "rsync-shell")
SSHD = "/usr/sbin/sshd"
RAY_UID = RAY_GID = 1000


def require_sshd() -> None:
    """Skip without sshd, the clients or root; in CI fail instead (the test must run there)."""
    missing = [p for p in (SSHD, "sftp", "scp", "ssh", "ssh-keygen", "useradd", "rsync") if not shutil.which(p)]
    problem = f"missing {', '.join(missing)} (apt-get install openssh-server openssh-client rsync)" if missing else ""
    if not problem and os.geteuid() != 0:
        problem = "needs root (it creates system accounts and chroots)"
    if problem:
        if os.environ.get("CI"):
            pytest.fail(problem, pytrace=False)
        pytest.skip(problem)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Service:
    root: Path
    port: int
    env: dict[str, str]
    users: dict[str, str] = field(default_factory=dict)  # short name -> account name
    sshd: subprocess.Popen[bytes] | None = None  # the image's entrypoint, exec'd into sshd

    @property
    def chroot(self) -> Path:
        return self.root / "chroot"

    def home(self, who: str) -> Path:
        return self.chroot / "users" / self.users[who]

    def key(self, who: str, name: str = "id") -> Path:
        return self.root / "client" / who / name

    def new_key(self, who: str, name: str = "id") -> Path:
        path = self.key(who, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", who, "-f", str(path)], check=True)
        return path

    def authorize(self, who: str, key: Path) -> None:
        """Put ``who``'s public key where the git server reads it: keys/<user>.pub."""
        (self.root / "keys" / f"{self.users[who]}.pub").write_text(key.with_suffix(".pub").read_text())

    def until_login(self, who: str, timeout: float = 20.0) -> subprocess.CompletedProcess[str]:
        """Retry ``pwd`` as ``who`` until it works (the image's sync loop makes accounts every second)."""
        deadline = time.monotonic() + timeout
        while True:
            proc = self.sftp(who, "pwd")
            if proc.returncode == 0 or time.monotonic() > deadline:
                return proc
            time.sleep(0.5)

    def login(self, who: str) -> str:
        return f"{self.users[who]}@127.0.0.1"

    def ssh_options(self, who: str, key: Path | None) -> list[str]:
        return [
            "-F",
            "/dev/null",
            "-i",
            str(key or self.key(who)),
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "LogLevel=ERROR",
            "-o",
            "ConnectTimeout=10",
        ]

    def rsync(self, who: str, *args: str) -> subprocess.CompletedProcess[str]:
        """The real rsync client over ssh, as docs/users/uploading-data.md writes it
        (``-e "ssh -p PORT"``, plus the test's key)."""
        return subprocess.run(
            ["rsync", "-e", shlex.join(["ssh", "-p", str(self.port), *self.ssh_options(who, None)]), *args],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=self.root / "client",
        )

    def ssh(self, who: str, command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ssh", *self.ssh_options(who, None), "-p", str(self.port), self.login(who), command],
            capture_output=True,
            text=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
        )

    def sftp(self, who: str, *commands: str, key: Path | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``commands`` as one ``sftp -b -`` batch on stdin (it stops at the first failing command)."""
        return subprocess.run(
            ["sftp", *self.ssh_options(who, key), "-P", str(self.port), "-b", "-", self.login(who)],
            input="\n".join(commands) + "\n",
            capture_output=True,
            text=True,
            timeout=60,
            cwd=self.root / "client",
        )


@pytest.fixture(scope="module")
def service() -> Iterator[Service]:
    require_sshd()
    tag = secrets.token_hex(3)
    users = {who: f"{who}-{tag}" for who in ("alice", "bob", "carol")}
    group = f"argus-sftp-{tag}"
    root = Path(tempfile.mkdtemp(prefix="argus-sftp-", dir="/var/lib"))
    root.chmod(0o755)
    sshd: subprocess.Popen[bytes] | None = None
    try:
        for sub in ("bin", "keys", "client", "chroot/users", "chroot/cache/hub/models--org--m/snapshots/r1"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        for name in SCRIPTS:  # sshd wants root-owned, non-writable commands: copies of the shipped scripts
            shutil.copy(IMAGE / name, root / "bin" / f"{name}")
            (root / "bin" / name).chmod(0o755)
        (root / "keys").chmod(0o755)
        cache = root / "chroot" / "cache"
        (cache / "hub/models--org--m/snapshots/r1/config.json").write_text('{"model_type": "llama"}\n')
        for path in (cache, *cache.rglob("*")):
            os.chown(path, RAY_UID, RAY_GID)
            path.chmod(0o755 if path.is_dir() else 0o644)
        port = free_port()
        env = {
            **os.environ,
            "SFTP_ROOT": str(root / "chroot"),
            "SFTP_KEYS_DIR": str(root / "keys"),
            "SFTP_BIN": str(root / "bin"),
            "SFTP_GROUP": group,
            "SFTP_PORT": str(port),
            "SFTP_LISTEN": "127.0.0.1",
            "SFTP_HOST_KEY": str(root / "host_key"),
            "SFTP_PID_FILE": str(root / "sshd.pid"),
        }
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation folder (the image has it)
        env["SFTP_CONFIG"] = str(root / "sshd_config")
        env["SFTP_SYNC_INTERVAL"] = "1"
        env["PATH"] = f"{root / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
        svc = Service(root, port, env, users)
        for who in ("alice", "bob"):
            svc.authorize(who, svc.new_key(who))
        # The image's entrypoint itself: host key, config, account sync loop, then sshd in the foreground.
        # In its own session, so that teardown stops exactly it, its sync loop and sshd's sessions.
        sshd = subprocess.Popen(
            [str(root / "bin" / "entrypoint")],
            env=env,
            stdout=open(root / "sshd.log", "wb"),  # noqa: SIM115 - closed with the process
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        svc.sshd = sshd
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert sshd.poll() is None and time.monotonic() < deadline, (root / "sshd.log").read_text()
                time.sleep(0.2)
        yield svc
    finally:
        if sshd is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(sshd.pid, signal.SIGTERM)
            try:
                sshd.wait(timeout=10)
            except subprocess.TimeoutExpired:
                sshd.kill()
                sshd.wait()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(sshd.pid, signal.SIGKILL)  # the sync loop, if it outlived sshd
        for account in users.values():
            subprocess.run(["userdel", account], capture_output=True)
            subprocess.run(["groupdel", account], capture_output=True)
        subprocess.run(["groupdel", group], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def as_ray_worker(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), user=RAY_UID, group=RAY_GID, extra_groups=[], capture_output=True, text=True)


def test_user_uploads_into_her_home_and_reads_the_cache(service: Service) -> None:
    client = service.root / "client"
    (client / "train.jsonl").write_text('{"q": 1}\n')
    (client / "train.jsonl").chmod(0o644)
    (client / "qwen").mkdir()  # a model folder, as `hf download ... --local-dir qwen` leaves it (README)
    (client / "qwen" / "config.json").write_text("{}\n")
    proc = service.sftp(
        "alice",
        "pwd",
        "mkdir data",
        "put train.jsonl data/train.jsonl",
        "-mkdir models",  # as in the README: "-" lets the batch go on when the folder exists
        "put -R qwen models/qwen",
        "get /cache/hub/models--org--m/snapshots/r1/config.json config.json",
        "ls /",
    )
    assert proc.returncode == 0, proc.stderr
    assert f"/users/{service.users['alice']}" in proc.stdout  # she starts in her home
    assert (client / "config.json").read_text() == '{"model_type": "llama"}\n'
    uploaded = service.home("alice") / "data" / "train.jsonl"
    assert uploaded.read_text() == '{"q": 1}\n'
    # Ray workers (uid/gid 1000) read what users upload, and write into their homes.
    assert as_ray_worker("cat", str(uploaded)).stdout == '{"q": 1}\n'
    made = as_ray_worker("mkdir", str(service.home("alice") / "runs"))
    assert made.returncode == 0, made.stderr
    assert service.home("alice").stat().st_mode & 0o7777 == 0o2770
    assert as_ray_worker("cat", str(service.home("alice") / "models/qwen/config.json")).stdout == "{}\n"


def test_user_cannot_reach_another_users_home(service: Service) -> None:
    secret = service.home("bob") / "secret.txt"
    secret.write_text("bob's\n")
    os.chown(secret, RAY_UID, service.home("bob").stat().st_gid)
    (service.root / "client" / "x.txt").write_text("x\n")
    bob = f"/users/{service.users['bob']}"
    for command in (
        f"ls {bob}",
        f"get {bob}/secret.txt stolen.txt",
        f"put x.txt {bob}/x.txt",
        f"mkdir {bob}/new",
        f"rm {bob}/secret.txt",
        "ls /users",  # not even who has a home
        f"get ../{service.users['bob']}/secret.txt stolen.txt",
    ):
        proc = service.sftp("alice", command)
        assert proc.returncode != 0, (command, proc.stdout)
    # `cd` only stats the folder (its name is all it shows); nothing in it can be listed from there.
    listed = service.sftp("alice", f"cd {bob}", "ls")
    assert "Permission denied" in listed.stderr and "secret.txt" not in listed.stdout  # sftp's ls exits 0 here
    assert not (service.root / "client" / "stolen.txt").exists()
    assert secret.read_text() == "bob's\n" and not (service.home("bob") / "x.txt").exists()


def test_user_cannot_write_the_cache(service: Service) -> None:
    (service.root / "client" / "x.txt").write_text("x\n")
    config = "/cache/hub/models--org--m/snapshots/r1/config.json"
    for command in ("put x.txt /cache/x.txt", "mkdir /cache/new", f"rm {config}", f"put x.txt {config}"):
        assert service.sftp("alice", command).returncode != 0, command
    assert not (service.chroot / "cache" / "x.txt").exists() and not (service.chroot / "cache" / "new").exists()
    assert (service.chroot / config.lstrip("/")).read_text() == '{"model_type": "llama"}\n'


def test_user_cannot_escape_the_chroot(service: Service) -> None:
    listing = service.sftp("alice", "cd /", "ls -1", "cd ../../..", "pwd")
    assert listing.returncode == 0, listing.stderr
    names = {line.strip() for line in listing.stdout.splitlines() if line.strip() and not line.startswith("sftp>")}
    # Besides the homes and the cache, only what rsync-chroot copied for rsync (bin/, the library folders),
    # all root's and read-only to users.
    system = {path.name for path in service.chroot.iterdir()} - {"cache", "users"}
    assert "bin" in system and names - {"Remote working directory: /"} == {"cache", "users"} | system, listing.stdout
    for top in system:
        for path in (service.chroot / top, *(service.chroot / top).rglob("*")):
            st = path.lstat()
            assert st.st_uid == 0 and not st.st_mode & 0o022, path
    for command in ("get ../../../../etc/passwd passwd", "get /etc/hostname hostname", "symlink /etc/passwd pw"):
        assert service.sftp("alice", command).returncode != 0, command
    assert not (service.home("alice") / "pw").exists()
    # Links a Ray job (or anyone outside) left in her home resolve inside the chroot, to nothing of anybody's.
    home = service.home("alice")
    (home / "to-bob-abs").symlink_to(service.home("bob") / "secret.txt")
    (home / "to-bob-rel").symlink_to(Path("..") / service.users["bob"] / "secret.txt")
    (home / "to-etc").symlink_to("/etc/passwd")
    for link in ("to-bob-abs", "to-bob-rel", "to-etc"):
        proc = service.sftp("alice", f"get {link} got-{link}")
        assert proc.returncode != 0, link
        assert not (service.root / "client" / f"got-{link}").exists()


def test_no_shell_and_no_legacy_scp(service: Service) -> None:
    user = f"{service.users['alice']}@127.0.0.1"
    opts = service.ssh_options("alice", None)
    shell = subprocess.run(
        ["ssh", *opts, "-p", str(service.port), user, "id; cat /etc/passwd"],
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    assert "uid=" not in shell.stdout and "root:" not in shell.stdout, shell.stdout
    assert shell.returncode != 0 and "argus file service: command not allowed: id" in shell.stderr
    (service.root / "client" / "s.txt").write_text("scp\n")
    scp = subprocess.run(
        ["scp", *opts, "-P", str(service.port), "s.txt", f"{user}:s.txt"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=service.root / "client",
    )
    assert scp.returncode == 0, scp.stderr  # scp speaks SFTP (OpenSSH >= 9.0)
    assert (service.home("alice") / "s.txt").read_text() == "scp\n"
    legacy = subprocess.run(
        ["scp", "-O", *opts, "-P", str(service.port), "s.txt", f"{user}:legacy.txt"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=service.root / "client",
    )
    assert legacy.returncode != 0 and not (service.home("alice") / "legacy.txt").exists()


def test_keys_are_per_user_and_take_effect_without_restart(service: Service) -> None:
    assert service.sshd is not None
    pid = service.sshd.pid
    # bob's key does not open alice's account.
    assert service.sftp("alice", "pwd", key=service.key("bob")).returncode != 0
    # A new user: a key file, then the image's periodic sync; sshd keeps running.
    assert service.sftp("carol", "pwd", key=service.new_key("carol")).returncode != 0
    service.authorize("carol", service.key("carol"))
    proc = service.until_login("carol")
    assert proc.returncode == 0, proc.stderr
    assert f"/users/{service.users['carol']}" in proc.stdout
    # A replaced key works at once, the old one no longer does.
    new = service.new_key("alice", "id2")
    service.authorize("alice", new)
    assert service.sftp("alice", "pwd", key=new).returncode == 0
    assert service.sftp("alice", "pwd").returncode != 0
    service.authorize("alice", service.key("alice"))
    assert service.sshd.poll() is None and service.sshd.pid == pid


def test_rsync_uploads_a_tree_and_downloads_the_cache(service: Service) -> None:
    client = service.root / "client"
    tree = client / "proj"
    (tree / "sub").mkdir(parents=True)
    (tree / "a.txt").write_text("a\n")
    (tree / "my file.txt").write_text("spaced\n")
    (tree / "sub" / "private.bin").write_bytes(b"\0\1")
    (tree / "sub" / "private.bin").chmod(0o600)  # private on the laptop: Ray must still read it
    (tree / "sub").chmod(0o700)
    (tree / "tool").write_text("#!/bin/sh\n")
    (tree / "tool").chmod(0o4755)  # setuid: not kept
    # As in the README.
    up = service.rsync("alice", "-a", "proj", f"{service.login('alice')}:data/")
    assert up.returncode == 0, up.stderr
    home = service.home("alice")
    assert (home / "data/proj/a.txt").read_text() == "a\n"
    assert (home / "data/proj/my file.txt").read_text() == "spaced\n"
    assert as_ray_worker("cat", str(home / "data/proj/sub/private.bin")).stdout == "\0\1"
    assert (home / "data/proj/tool").stat().st_mode & 0o7777 == 0o755
    alice_uid = pwd.getpwnam(service.users["alice"]).pw_uid
    assert (home / "data/proj/a.txt").stat().st_uid == alice_uid  # her own uid: no chown to anybody else
    # Again, changed: only the change moves, and --delete works inside her home.
    (tree / "a.txt").write_text("a2\n")
    (tree / "my file.txt").unlink()
    again = service.rsync("alice", "-a", "--delete", "proj/", f"{service.login('alice')}:data/proj/")
    assert again.returncode == 0, again.stderr
    assert (home / "data/proj/a.txt").read_text() == "a2\n" and not (home / "data/proj/my file.txt").exists()
    # Downloads: her own files, and the shared cache (read-only, by its path in the chroot).
    down = service.rsync("alice", "-a", f"{service.login('alice')}:/cache/hub/models--org--m", "got/")
    assert down.returncode == 0, down.stderr
    assert (client / "got/models--org--m/snapshots/r1/config.json").read_text() == '{"model_type": "llama"}\n'
    back = service.rsync("alice", "-a", f"{service.login('alice')}:data/proj/sub/private.bin", "back.bin")
    assert back.returncode == 0 and (client / "back.bin").read_bytes() == b"\0\1", back.stderr
    # A model folder into a folder that does not exist yet (README: `rsync -a --mkpath ... qwen ...:models/`).
    (client / "qwen").mkdir(exist_ok=True)
    (client / "qwen" / "config.json").write_text("{}\n")
    mk = service.rsync("alice", "-a", "--mkpath", "qwen", f"{service.login('alice')}:new/models/")
    assert mk.returncode == 0 and (home / "new/models/qwen/config.json").read_text() == "{}\n", mk.stderr
    # Remote wildcards are not expanded (the command never reaches a shell): the README says so.
    glob = service.rsync("alice", f"{service.login('alice')}:data/proj/*.txt", "glob/")
    assert glob.returncode != 0 and not (client / "glob").exists()


def test_rsync_cannot_write_the_cache_or_reach_another_home(service: Service) -> None:
    client = service.root / "client"
    (client / "x.txt").write_text("x\n")
    secret = service.home("bob") / "secret.txt"
    secret.write_text("bob's\n")
    os.chown(secret, RAY_UID, service.home("bob").stat().st_gid)
    alice, bob = service.login("alice"), service.users["bob"]
    for args in (
        ["x.txt", f"{alice}:/cache/"],
        ["x.txt", f"{alice}:/cache/hub/models--org--m/snapshots/r1/config.json"],
        ["-r", "--delete", "--existing", "--ignore-existing", "stolen/", f"{alice}:/cache/"],
        [f"{alice}:../{bob}/secret.txt", "stolen.txt"],
        [f"{alice}:/users/{bob}/secret.txt", "stolen.txt"],
        ["-r", f"{alice}:/users/{bob}/", "stolen/"],
        ["x.txt", f"{alice}:../{bob}/"],
        ["x.txt", f"{alice}:/users/{bob}/x.txt"],
        ["--list-only", f"{alice}:/users/"],  # not even who has a home
        [f"{alice}:/etc/passwd", "stolen.txt"],
        [f"{alice}:../../../../etc/passwd", "stolen.txt"],
    ):
        (client / "stolen").mkdir(exist_ok=True)
        proc = service.rsync("alice", *args)
        assert proc.returncode != 0, (args, proc.stdout)
        assert bob not in proc.stdout, (args, proc.stdout)
    assert not (client / "stolen.txt").exists() and not any((client / "stolen").iterdir())
    assert not (service.chroot / "cache" / "x.txt").exists() and not (service.home("bob") / "x.txt").exists()
    assert (service.chroot / "cache/hub/models--org--m/snapshots/r1/config.json").exists()
    assert secret.read_text() == "bob's\n"


def test_rsync_symlinks_are_munged_and_specials_refused(service: Service) -> None:
    client = service.root / "client"
    links = client / "links"
    links.mkdir()
    (links / "pw").symlink_to("/etc/passwd")
    (links / "bob-abs").symlink_to(service.home("bob") / "secret.txt")
    (links / "bob-rel").symlink_to(Path("..") / ".." / service.users["bob"] / "secret.txt")
    (links / "cache").symlink_to("/cache")
    os.mkfifo(links / "fifo")
    up = service.rsync("alice", "-a", "--specials", "links", f"{service.login('alice')}:")
    assert up.returncode == 0, up.stderr
    home = service.home("alice") / "links"
    for name in ("pw", "bob-abs", "bob-rel", "cache"):
        target = os.readlink(home / name)
        # Not a working link outside the chroot: Ray's workers (and root) find nothing behind it.
        assert target.startswith("/rsyncd-munged/"), (name, target)
        assert not (home / name).exists() and as_ray_worker("cat", str(home / name)).returncode != 0
    assert not os.path.lexists(home / "fifo")
    # Her own links come back as she made them; following them (-L) finds nothing inside the chroot.
    back = service.rsync("alice", "-a", f"{service.login('alice')}:links/", "links-back/")
    assert back.returncode == 0, back.stderr
    assert os.readlink(client / "links-back/pw") == "/etc/passwd"
    followed = service.rsync("alice", "-L", f"{service.login('alice')}:links/pw", "pw-copy")
    assert followed.returncode != 0 and not (client / "pw-copy").exists()


def test_only_the_rsync_server_runs(service: Service) -> None:
    for command in (
        "id",
        "sh",
        "sh -c id",
        "rsync --daemon",
        "rsync --server --daemon .",
        "rsync --version",
        "rsync --server -vlogDtpre.iLsfxCIvu --no-munge-links . x",
        "rsync --server -slogDtpre.iLsfxCIvu . x",  # --secluded-args: options would follow unchecked
        "rsync --server -vlogDtpre.iLsfxCIvu x; id",
        "/bin/rsync --server -vlogDtpre.iLsfxCIvu . x",
        "",  # a login shell
    ):
        proc = service.ssh("alice", command)
        assert proc.returncode != 0, (command, proc.stdout)
        assert "argus file service:" in proc.stderr and "uid=" not in proc.stdout, (command, proc.stderr)
    # The same through the rsync client: daemon mode over ssh, and secluded args.
    (service.root / "client" / "d.txt").write_text("d\n")
    daemon = service.rsync("alice", "d.txt", f"{service.login('alice')}::module/")
    assert daemon.returncode != 0 and "option not allowed: --daemon" in daemon.stderr, daemon.stderr
    secluded = service.rsync("alice", "-s", "d.txt", f"{service.login('alice')}:")
    assert secluded.returncode != 0 and "--secluded-args" in secluded.stderr, secluded.stderr
    assert not (service.home("alice") / "d.txt").exists()
