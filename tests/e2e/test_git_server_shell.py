"""The git server's argus commands (images/git-server), run for real: Debian's sshd with the image's
``sshd_config``, its ``authorized-keys`` as the AuthorizedKeysCommand and its ``argus-shell`` as the
account's login shell and every key's forced command, git-shell behind it, the real ``ssh``/``git``
clients with real keys, and the daemon's real HTTP server serving a real status branch.

The account: the test makes a system account with a unique name (CI runs as root) whose login shell is
the shipped ``argus-shell`` (the image's `git`), and deletes it, the sshd it started and its folder at the
end. The folder lives under /var/lib: sshd wants the AuthorizedKeysCommand and every folder above it
root's and not writable by others. Logs of real Ray jobs through these commands: tests/e2e/test_compose_stack.py.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from reconciler.observe.api_keys import KeysFile, key_hash
from reconciler.server import start_server
from reconciler.server.core import HttpServer
from reconciler.server.metrics import Metrics
from reconciler.testing.status_branch import commit_files, dump, model_doc, task_doc
from reconciler.web.app import daemon_pages
from reconciler.web.response import CLIENT_USER, PageHandler, Response

pytestmark = pytest.mark.e2e

IMAGE = Path(__file__).resolve().parents[2] / "images" / "git-server"
SSHD = "/usr/sbin/sshd"
GIT_ENV = {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
ALLOWED = "allowed: status [USER[/KIND[/NAME]]], logs USER/tasks/NAME"
REQUEST_S = 5  # argus-shell's bound on one request (a log read: twice that)
MAX_KEYS = 3  # API keys per user (ARGUS_SELF_KEYS_MAX; the image's default is 5)


def require_sshd() -> None:
    """Skip without sshd, git-shell, python3 at the image's path or root; in CI fail instead."""
    needed = (SSHD, "/usr/bin/git-shell", "/usr/bin/python3", "ssh", "ssh-keygen", "useradd", "git")
    missing = [p for p in needed if not shutil.which(p)]
    problem = (
        f"missing {', '.join(missing)} (apt-get install openssh-server openssh-client git python3)" if missing else ""
    )
    if not problem and os.geteuid() != 0:
        problem = "needs root (it creates a system account and runs sshd)"
    if problem:
        if os.environ.get("CI"):
            pytest.fail(problem, pytrace=False)
        pytest.skip(problem)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class LiveLog:
    """A followed log that goes on for a minute, one line every 0.1 s, served on the log API's route of
    alice/tasks/live by the daemon's real HTTP server (which closes it when its reader leaves)."""

    started: threading.Event = field(default_factory=threading.Event)
    closed: threading.Event = field(default_factory=threading.Event)
    quiet_closed: threading.Event = field(default_factory=threading.Event)
    requesters: list[str] = field(default_factory=list)  # the user the server believed, per follow

    def chunks(self) -> Iterator[bytes]:
        try:
            self.started.set()
            for i in range(600):
                yield f"line {i}\n".encode()
                time.sleep(0.1)
        finally:
            self.closed.set()

    def quiet(self) -> Iterator[bytes]:
        """One line, then nothing for a minute but the daemon's heartbeats (empty chunks: the server
        checks its client at each), as a follow of a run that prints nothing does."""
        try:
            yield b"waiting\n"
            for _ in range(600):
                yield b""
                time.sleep(0.1)
        finally:
            self.quiet_closed.set()

    def pages(self, inner: PageHandler) -> PageHandler:
        def handle(method: str, path: str, query: Mapping[str, list[str]]) -> Response | None:
            if path == "/api/v1/logs/alice/tasks/live" and query.get("follow") == ["1"]:
                self.requesters.append(CLIENT_USER.get())
                return Response(200, "text/plain; charset=utf-8", self.chunks())
            if path == "/api/v1/logs/alice/tasks/quiet" and query.get("follow") == ["1"]:
                return Response(200, "text/plain; charset=utf-8", self.quiet())
            if path == "/api/v1/logs/alice/tasks/endless":  # a read that never ends (a stuck daemon)
                return Response(200, "text/plain; charset=utf-8", LiveLog().chunks())
            return inner(method, path, query)

        return handle


@dataclass
class Server:
    root: Path
    port: int
    account: str
    status_repo: str
    web: HttpServer
    sshd: subprocess.Popen[bytes]
    live: LiveLog

    @property
    def repo(self) -> Path:
        return self.root / "srv" / "config.git"

    @property
    def self_keys(self) -> Path:
        """The self-service API keys file (ARGUS_SELF_KEYS), in a folder of the account's, as the entrypoint has it."""
        return self.root / "api-keys" / "keys"

    def key(self, who: str) -> Path:
        return self.root / "client" / who

    def ssh_options(self, who: str) -> list[str]:
        return [
            "-F",
            "/dev/null",
            "-i",
            str(self.key(who)),
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

    def ssh(self, who: str, *command: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """``ssh -p PORT ACCOUNT@127.0.0.1 COMMAND...`` as ``who`` (her key), as a user types it."""
        return subprocess.run(
            ["ssh", *self.ssh_options(who), "-p", str(self.port), f"{self.account}@127.0.0.1", *command],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def git(self, who: str, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            **GIT_ENV,
            "GIT_SSH_COMMAND": " ".join(["ssh", *self.ssh_options(who)]),
            "GIT_AUTHOR_NAME": who,
            "GIT_AUTHOR_EMAIL": f"{who}@example.com",
            "GIT_COMMITTER_NAME": who,
            "GIT_COMMITTER_EMAIL": f"{who}@example.com",
        }
        return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)

    def url(self) -> str:
        return f"ssh://{self.account}@127.0.0.1:{self.port}{self.repo}"

    def log(self) -> str:
        return (self.root / "sshd.log").read_text(errors="replace")


def sshd_config(root: Path, port: int, account: str) -> str:
    """The image's sshd_config with this test's port, host key, account and paths (nothing else changed)."""
    lines = []
    for line in (IMAGE / "sshd_config").read_text().splitlines():
        key = line.split(None, 1)[0] if line.strip() and not line.startswith("#") else ""
        if key == "Port":
            line = f"Port {port}\nListenAddress 127.0.0.1\nPidFile {root / 'sshd.pid'}"
        elif key == "HostKey":
            line = f"HostKey {root / 'host_key'}"
        elif key == "AllowUsers":
            line = f"AllowUsers {account}"
        elif key == "AuthorizedKeysCommand":
            bin_ = root / "bin"
            line = f"AuthorizedKeysCommand {bin_}/authorized-keys %u {root / 'keys'} {bin_}/argus-shell {account}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def seed_status(repo: str) -> None:
    failed = task_doc(
        "bob",
        "eval",
        "FAILED",
        reason="the run failed",
        runs=[
            {
                "submission_id": "argus--bob--eval--0123abcd",
                "status": "FAILED",
                "message": "exit code 3",
                "log_tail": ["loading", "Traceback: boom\rspoof \x1b[2J"],
            }
        ],
    )
    commit_files(
        repo,
        {
            "users/alice/tasks/train.yaml": dump(task_doc("alice", "train")),
            "users/alice/models/chat.yaml": dump(model_doc("alice", "chat")),
            "users/bob/tasks/eval.yaml": dump({**failed, "submission_id": "argus--bob--eval--0123abcd"}),
            "revision.yaml": dump(
                {"revision": {"last_attempted": "a" * 40, "last_applied": "a" * 40}, "subject": "alice: a task"}
            ),
        },
    )


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    require_sshd()
    account = f"argusgit{secrets.token_hex(3)}"
    root = Path(tempfile.mkdtemp(prefix="argus-git-shell-", dir="/var/lib"))
    root.chmod(0o755)
    sshd: subprocess.Popen[bytes] | None = None
    web: HttpServer | None = None
    try:
        for sub in ("bin", "keys", "client", "srv"):
            (root / sub).mkdir()
            (root / sub).chmod(0o755)
        for name in ("authorized-keys", "argus-shell"):  # sshd wants root-owned, non-writable commands
            shutil.copy(IMAGE / name, root / "bin" / name)
            (root / "bin" / name).chmod(0o755)
        for who in ("alice", "bob"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", who, "-f", str(root / "client" / who)])
            shutil.copy(root / "client" / f"{who}.pub", root / "keys" / f"{who}.pub")
        # The image's `git`: its login shell is argus-shell, its password `*` (no password, not locked).
        shell = str(root / "bin" / "argus-shell")
        subprocess.run(
            ["useradd", "--home-dir", str(root / "srv"), "--no-create-home", "--shell", shell, "--user-group", account],
            check=True,
        )
        subprocess.run(["usermod", "--password", "*", account], check=True)
        shutil.chown(root / "srv", account, account)
        (root / "api-keys").mkdir(mode=0o755)
        shutil.chown(root / "api-keys", account, account)
        # The bare repository and its hook, as the entrypoint makes them (as the account).
        repo = root / "srv" / "config.git"
        setup = (
            f"git init --quiet --bare --shared=group --initial-branch=main {repo} && "
            f"git -C {repo} config receive.denyNonFastForwards true && "
            f"git -C {repo} config argus.statusBranch argus/status"
        )
        subprocess.run(["su", "-s", "/bin/sh", account, "-c", setup], check=True, env={**os.environ, **GIT_ENV})
        shutil.copy(IMAGE / "pre-receive", repo / "hooks" / "pre-receive")
        (repo / "hooks" / "pre-receive").chmod(0o755)
        shutil.chown(repo / "hooks" / "pre-receive", account, account)
        # The daemon's read-only pages over a real status branch (no Ray: logs answer 503).
        status_repo = str(root / "status.git")
        subprocess.run(["git", "init", "-q", "--bare", status_repo], check=True)
        seed_status(status_repo)
        live = LiveLog()
        pages = live.pages(daemon_pages(status_repo, "argus/status", None))
        # As compose runs it: the key owner argus-shell names is believed from the git server's address.
        web = start_server(
            "127.0.0.1:0",
            metrics=Metrics(),
            on_push=None,
            secret=None,
            health=lambda: {"ok": True},
            pages=pages,
            user_header="X-Argus-User",
            user_header_from=("127.0.0.1",),
        )
        port = free_port()
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / "host_key")], check=True)
        (root / "sshd_config").write_text(sshd_config(root, port, account))
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation folder (the image has it)
        host, web_port = web.server_address
        # The entrypoint's variable, and a shorter request bound than the image's 60 s for the test of it.
        session_env = (
            f"ARGUS_SERVER=http://{host}:{web_port} ARGUS_SHELL_REQUEST_S={REQUEST_S} "
            f"ARGUS_SELF_KEYS={root / 'api-keys' / 'keys'} ARGUS_SELF_KEYS_MAX={MAX_KEYS}"
        )
        # As the image's entrypoint starts it: in the foreground, the daemon's address handed to sessions.
        sshd = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(root / "sshd_config"), "-o", f"SetEnv={session_env}"],
            stdout=open(root / "sshd.log", "wb"),  # noqa: SIM115 - closed with the process
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert sshd.poll() is None and time.monotonic() < deadline, (root / "sshd.log").read_text()
                time.sleep(0.2)
        yield Server(root, port, account, status_repo, web, sshd, live)
    finally:
        if sshd is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(sshd.pid, signal.SIGTERM)
            try:
                sshd.wait(timeout=10)
            except subprocess.TimeoutExpired:
                sshd.kill()
                sshd.wait()
        if web is not None:
            web.shutdown()
        subprocess.run(["userdel", account], capture_output=True)
        subprocess.run(["groupdel", account], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def test_push_and_fetch_go_through_git_shell_and_the_hook(server: Server) -> None:
    work = server.root / "client" / "alice-work"
    work.mkdir()
    assert server.git("alice", work, "init", "-q", "-b", "main").returncode == 0
    (work / "README.md").write_text("hello\n")
    server.git("alice", work, "add", "-A")
    assert server.git("alice", work, "commit", "-q", "-m", "first").returncode == 0
    pushed = server.git("alice", work, "push", server.url(), "main")
    assert pushed.returncode == 0, pushed.stderr + server.log()
    # The pre-receive hook still runs (git-shell runs receive-pack, which runs it).
    refused = server.git("alice", work, "push", server.url(), "main:refs/notes/argus")
    assert refused.returncode != 0 and "argus: refused refs/notes/argus" in refused.stderr, refused.stderr
    clone = server.root / "client" / "bob-clone"
    cloned = server.git("bob", server.root / "client", "clone", "-q", server.url(), str(clone))
    assert cloned.returncode == 0, cloned.stderr
    assert (clone / "README.md").read_text() == "hello\n"
    # The pusher is still named by sshd's log: the fingerprint of alice's key file.
    fingerprint = subprocess.run(
        ["ssh-keygen", "-lf", str(server.root / "keys" / "alice.pub")], capture_output=True, text=True, check=True
    ).stdout.split()[1]
    accepted = [line for line in server.log().splitlines() if f"Accepted publickey for {server.account}" in line]
    assert any(fingerprint in line for line in accepted), server.log()


def test_status_prints_the_table_of_every_user(server: Server) -> None:
    proc = server.ssh("alice", "status")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["OBJECT", "STATE", "SYNC", "ENDPOINT/JOB", "UPDATED"]
    rows = {line.split()[0]: line.split()[1] for line in lines[1:] if not line.startswith(" ")}
    assert rows == {"alice/models/chat": "RUNNING", "alice/tasks/train": "SUCCEEDED", "bob/tasks/eval": "FAILED"}
    # What needs attention, as `argus status` prints it; the daemon serves no escape sequence (it removes
    # them), and what is left (a carriage return, which could overwrite a line) is escaped here.
    assert "  bob/tasks/eval: the run failed" in lines
    assert "    run argus--bob--eval--0123abcd: FAILED: exit code 3" in lines
    assert "      | Traceback: boom^Mspoof " in lines, proc.stdout
    assert "\x1b" not in proc.stdout and "\r" not in proc.stdout


def test_status_of_one_user_kind_or_object(server: Server) -> None:
    bob = server.ssh("alice", "status", "bob").stdout
    assert "bob/tasks/eval" in bob and "alice/" not in bob
    models = server.ssh("bob", "status", "alice/models").stdout
    assert "alice/models/chat" in models and "alice/tasks/train" not in models
    one = server.ssh("alice", "status", "alice/task/train")
    assert one.returncode == 0 and "argus--alice--train--0123abcd" in one.stdout, one.stderr
    missing = server.ssh("alice", "status", "alice/tasks/nope")
    assert missing.returncode == 1 and "no task alice/nope on the status branch" in missing.stderr
    raw = server.ssh("alice", "status", "bob", "--raw")
    assert "boom^M" not in raw.stdout and "boom\nspoof" in raw.stdout  # the \r as it is (text mode reads \n)


def test_plan_shows_the_revision_and_counts(server: Server) -> None:
    proc = server.ssh("bob", "plan")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"last attempted: {'a' * 40}  alice: a task\nlast applied:   {'a' * 40}\n")
    assert "objects: 3 of 2 user(s)" in proc.stdout


def test_logs_are_the_key_owners_only(server: Server) -> None:
    refused = server.ssh("alice", "logs", "bob/tasks/eval")
    assert refused.returncode == 1, refused
    assert refused.stderr == "argus: you may read only your own logs (alice/...), not bob's\n"
    # Her own: the daemon's answer (this one has no Ray: its message, passed on, and exit 1).
    own = server.ssh("alice", "logs", "alice/tasks/train")
    assert own.returncode == 1 and "logs are not available: the daemon has no Ray client (HTTP 503)" in own.stderr
    for bad in (["logs", "alice/tasks/train", "--run", "../../x"], ["logs", "alice/models/chat", "--follow"]):
        proc = server.ssh("alice", *bad)
        assert proc.returncode == 1 and proc.stderr.startswith("argus: logs: "), (bad, proc.stderr)


@pytest.mark.parametrize(
    "command",
    [
        ["ls"],
        ["logs alice/tasks/x; id"],
        ["logs", "alice/tasks/x", "&&", "id"],
        ["status", "$(id)"],
        ["sh", "-c", "id"],
        ["git-receive-pack"],
        ["/usr/bin/git-shell", "-c", "id"],
        ["logs\nid"],
        [],
    ],
    ids=["ls", "semicolon", "and", "substitution", "sh", "bare-git", "path", "newline", "nothing"],
)
def test_anything_else_is_refused_in_one_line(server: Server, command: list[str]) -> None:
    proc = server.ssh("bob", *command)
    assert proc.returncode == 1, proc
    assert proc.stdout == "" and "uid=" not in proc.stderr
    assert proc.stderr.startswith("argus: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert ALLOWED in proc.stderr, proc.stderr


def test_help_names_the_commands(server: Server) -> None:
    proc = server.ssh("alice", "help")
    assert proc.returncode == 0 and "logs USER/tasks/NAME [--follow]" in proc.stdout


def test_a_key_file_that_is_no_user_name_opens_nothing(server: Server) -> None:
    shutil.copy(server.key("bob").with_suffix(".pub"), server.root / "keys" / "Bad_Name.pub")
    (server.root / "keys" / "bob.pub").rename(server.root / "keys" / "bob.pub.off")
    try:
        proc = server.ssh("bob", "status")
        assert proc.returncode == 255 and "Permission denied" in proc.stderr, proc
    finally:
        (server.root / "keys" / "bob.pub.off").rename(server.root / "keys" / "bob.pub")
        (server.root / "keys" / "Bad_Name.pub").unlink()


def test_a_followed_log_streams_and_ends_when_the_client_leaves(server: Server) -> None:
    login = [*server.ssh_options("alice"), "-p", str(server.port), f"{server.account}@127.0.0.1"]
    client = subprocess.Popen(
        ["ssh", *login, "logs", "alice/tasks/live", "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    try:
        assert client.stdout is not None
        first = [client.stdout.readline() for _ in range(3)]  # line by line, while the log goes on
        assert first == [b"line 0\n", b"line 1\n", b"line 2\n"], first
        assert not server.live.closed.is_set()
        assert server.live.requesters == ["alice"]  # her slots, not the git server's shared address
    finally:
        client.kill()  # the user's ssh is gone (a closed laptop, ^C)
        client.wait()
    # argus-shell notices within a second or two and leaves, which ends the daemon's stream.
    assert server.live.closed.wait(15), "the daemon kept streaming to a client that had left"


def test_a_log_read_that_does_not_end_is_cut_off(server: Server) -> None:
    started = time.monotonic()
    proc = server.ssh("alice", "logs", "alice/tasks/endless")
    took = time.monotonic() - started
    assert proc.returncode == 0 and proc.stdout.startswith("line 0\nline 1\n"), proc
    assert proc.stdout.endswith(f"[argus: stopped after {2 * REQUEST_S} s; run the command again to go on]\n")
    assert 2 * REQUEST_S <= took < 2 * REQUEST_S + 10, took


def test_a_quiet_follow_ends_when_the_client_leaves(server: Server) -> None:
    """Nothing is written while the run prints nothing: argus-shell watches its client itself."""
    login = [*server.ssh_options("alice"), "-p", str(server.port), f"{server.account}@127.0.0.1"]
    client = subprocess.Popen(
        ["ssh", *login, "logs", "alice/tasks/quiet", "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    try:
        assert client.stdout is not None
        assert client.stdout.readline() == b"waiting\n"
        time.sleep(1)
        assert not server.live.quiet_closed.is_set()
    finally:
        client.kill()
        client.wait()
    assert server.live.quiet_closed.wait(15), "the daemon kept a follower for a client that had left"


# --- `key new|list|revoke`: the key owner's own API keys ---------------------------------------------------


def key_ids(server: Server, who: str) -> list[str]:
    proc = server.ssh(who, "key", "list")
    assert proc.returncode == 0 and proc.stdout.splitlines()[0].split() == ["ID", "CREATED"], proc
    return [line.split()[0] for line in proc.stdout.splitlines()[1:-1]]


def test_a_user_makes_lists_and_revokes_her_own_api_keys(server: Server) -> None:
    made = server.ssh("alice", "key", "new")
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    assert made.stdout == key + "\n" and key.startswith("argus-alice-"), made.stdout  # alone on stdout
    digest = key_hash(key)
    assert f"your new API key {digest[:12]} (shown this once" in made.stderr
    # The daemon's reader finds her key's hash, hers, and the file holds no key.
    text = server.self_keys.read_text()
    assert key not in text and KeysFile(str(server.self_keys)).read()[digest] == "alice"
    assert (server.self_keys.stat().st_mode & 0o777) == 0o644
    assert digest[:12] in key_ids(server, "alice") and digest[:12] not in key_ids(server, "bob")
    assert key not in server.log()  # sshd never sees what a command prints
    revoked = server.ssh("alice", "key", "revoke", digest[:12])
    assert revoked.returncode == 0 and f"revoked {digest[:12]}" in revoked.stdout, revoked
    assert digest not in server.self_keys.read_text() and digest[:12] not in key_ids(server, "alice")


def test_a_hostile_user_can_neither_see_nor_revoke_nor_make_anothers_key(server: Server) -> None:
    made = server.ssh("alice", "key", "new")
    digest = key_hash(made.stdout.strip())
    before = server.self_keys.read_text()
    try:
        for command in (
            ["key", "revoke", digest[:12]],  # her id, from somewhere
            ["key", "revoke", digest],  # her whole hash
            ["key", "revoke", digest[:8].upper()],
        ):
            proc = server.ssh("bob", *command)
            assert proc.returncode == 1 and "none of your keys has the id" in proc.stderr, (command, proc)
        for command in (
            ["key", "new", "alice"],  # the owner is the SSH key's, never an argument
            ["key", "list", "alice"],
            ["key", "new", "--user=alice"],
            ["key", "revoke"],
            ["key", "revoke", "*"],
            ["key", "revoke", "../alice"],
            ["key"],
            ["key", "new;", "id"],
            ["key", "new", "&&", "id"],
        ):
            proc = server.ssh("bob", *command)
            assert proc.returncode == 1 and proc.stdout == "" and "uid=" not in proc.stderr, (command, proc)
            assert proc.stderr.startswith("argus: ") and proc.stderr.count("\n") == 1, (command, proc.stderr)
        assert server.self_keys.read_text() == before  # nothing changed, nothing of bob's either
        assert digest[:12] not in server.ssh("bob", "key", "list").stdout
    finally:
        server.ssh("alice", "key", "revoke", digest[:12])


def test_each_user_holds_at_most_the_limit(server: Server) -> None:
    ids = [key_hash(server.ssh("bob", "key", "new").stdout.strip())[:12] for _ in range(MAX_KEYS)]
    try:
        assert key_ids(server, "bob") == ids
        refused = server.ssh("bob", "key", "new")
        assert refused.returncode == 1 and refused.stdout == "", refused
        assert f"you have {MAX_KEYS} keys, the most one user may have" in refused.stderr
        assert f"({MAX_KEYS} of at most {MAX_KEYS} keys)" in server.ssh("bob", "key", "list").stdout
        made = server.ssh("alice", "key", "new")  # his limit is not hers
        assert made.returncode == 0, made.stderr
        server.ssh("alice", "key", "revoke", key_hash(made.stdout.strip())[:12])
    finally:
        for key_id in ids:
            server.ssh("bob", "key", "revoke", key_id)
    assert key_ids(server, "bob") == []
