"""``argus logs``' client (reconciler.logs.client): which way it reads logs, and the ssh command it runs.

The push remote is read from real clones (git config, pushurl, pushInsteadOf); the ssh command is run for
real with a program in its place that prints the arguments it got, as git's own tests do for ssh. The
command through a real sshd and git server: tests/e2e/test_git_server_shell.py and the compose test.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from reconciler.cli import main
from reconciler.errors import ArgusError
from reconciler.logs.client import (
    DEFAULT_SERVER,
    SshRemote,
    log_url,
    push_url,
    ssh_argv,
    ssh_command,
    ssh_logs,
    ssh_remote,
)

GIT_ENV = {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("ssh://git@gpu-1.lab:2222/srv/git/config.git", SshRemote("gpu-1.lab", 2222)),
        ("ssh://git@10.0.0.5/srv/git/config.git", SshRemote("10.0.0.5")),
        ("git+ssh://git@host:22/x.git", SshRemote("host", 22)),
        ("ssh+git://git@host/x.git", SshRemote("host")),
        ("ssh://git@[::1]:2222/srv/git/config.git", SshRemote("[::1]", 2222)),
        ("git@gpu-1.lab:srv/git/config.git", SshRemote("gpu-1.lab")),
        ("git@gpu-1.lab:/srv/git/config.git", SshRemote("gpu-1.lab")),
    ],
)
def test_the_git_servers_ssh_urls_name_its_login(url: str, expected: SshRemote) -> None:
    assert ssh_remote(url) == expected


@pytest.mark.parametrize(
    "url",
    [
        "https://github.com/org/config.git",
        "http://git@host/x.git",
        "file:///srv/git/config.git",
        "/srv/git/config.git",
        "./config.git",
        "ssh://alice@host:2222/srv/git/config.git",  # another login: not the bundled git server
        "ssh://host:2222/srv/git/config.git",
        "alice@host:config.git",
        "ssh://git@-oProxyCommand=id/x.git",  # a host that would be an ssh option
        "git@-oProxyCommand=id:x.git",
        "ssh://git@host:99999/x.git",
        "ssh://git@host:0/x.git",
        "ssh://git@ho st/x.git",
        "ssh://git@host;id/x.git",
        "git@host/dir:path",  # a slash before the colon: a local path to git
        "",
    ],
)
def test_anything_else_is_not_an_ssh_remote(url: str) -> None:
    assert ssh_remote(url) is None


def test_ssh_argv_is_the_git_servers_logs_command() -> None:
    remote = SshRemote("gpu-1.lab", 2222)
    assert ssh_argv(["ssh"], remote, "alice/tasks/grpo") == [
        "ssh",
        "-p",
        "2222",
        "git@gpu-1.lab",
        "logs",
        "alice/tasks/grpo",
        "--raw",
    ]
    assert ssh_argv(["ssh", "-i", "k"], SshRemote("[::1]"), "/alice/task/grpo/", run="argus--a--b--1", follow=True) == [
        "ssh",
        "-i",
        "k",
        "git@::1",
        "logs",
        "alice/tasks/grpo",
        "--run",
        "argus--a--b--1",
        "--follow",
        "--raw",
    ]
    assert ssh_argv(["ssh"], SshRemote("h"), "alice/model/chat")[-3:] == ["logs", "alice/models/chat", "--raw"]


@pytest.mark.parametrize(
    ("target", "run", "follow", "message"),
    [
        ("alice/tasks/x; id", None, False, "expected USER/tasks/NAME"),
        ("alice/tasks", None, False, "expected USER/tasks/NAME"),
        ("alice/tasks/x", "a b", False, "not a run id"),
        ("alice/tasks/x", "-oProxyCommand=id", False, "not a run id"),
        ("alice/tasks/x", "x'y", False, "not a run id"),
        ("alice/models/chat", None, True, "--run and --follow are for tasks"),
    ],
)
def test_bad_targets_and_runs_never_reach_ssh(target: str, run: str | None, follow: bool, message: str) -> None:
    with pytest.raises(ArgusError, match=message):
        ssh_argv(["ssh"], SshRemote("h"), target, run=run, follow=follow)
    with pytest.raises(ArgusError, match=message):
        log_url(DEFAULT_SERVER, target, run=run, follow=follow)


def test_the_web_default_is_the_address_that_serves_logs() -> None:
    # The compose install publishes the pages and /api/v1 on 127.0.0.1:8081; 8080 serves no logs.
    assert DEFAULT_SERVER == "http://127.0.0.1:8081"
    assert log_url(DEFAULT_SERVER, "a/tasks/b") == "http://127.0.0.1:8081/api/v1/logs/a/tasks/b"


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, **GIT_ENV}
    return subprocess.run(["git", "-C", str(repo), *args], env=env, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def clone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for key, value in GIT_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("GIT_SSH_COMMAND", raising=False)
    repo = tmp_path / "work"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    return repo


def test_push_url_follows_the_branch_and_gits_rewrites(clone: Path) -> None:
    assert push_url(str(clone)) is None  # no remote
    git(clone, "remote", "add", "origin", "https://github.com/org/config.git")
    assert push_url(str(clone)) == "https://github.com/org/config.git"
    git(clone, "remote", "add", "cluster", "ssh://git@gpu-1:2222/srv/git/config.git")
    assert push_url(str(clone)) == "https://github.com/org/config.git", "origin among several"
    git(clone, "config", "branch.main.remote", "cluster")
    assert push_url(str(clone)) == "ssh://git@gpu-1:2222/srv/git/config.git", "the branch's upstream"
    git(clone, "config", "remote.pushDefault", "origin")
    assert push_url(str(clone)) == "https://github.com/org/config.git", "remote.pushDefault before the upstream"
    git(clone, "config", "branch.main.pushRemote", "cluster")
    assert push_url(str(clone)) == "ssh://git@gpu-1:2222/srv/git/config.git", "pushRemote first"
    git(clone, "remote", "set-url", "--push", "cluster", "git@gpu-2:srv/git/config.git")
    assert push_url(str(clone)) == "git@gpu-2:srv/git/config.git", "the push URL, not the fetch URL"
    git(clone, "config", "url.ssh://git@gpu-3:2222/.insteadOf", "git@gpu-2:")
    assert push_url(str(clone)) == "ssh://git@gpu-3:2222/srv/git/config.git", "as git rewrites it"
    git(clone, "remote", "add", "mirror", "https://example.com/config.git")
    git(clone, "config", "url.git@gpu-4:.pushInsteadOf", "https://example.com/")
    assert push_url(str(clone), "mirror") == "git@gpu-4:config.git", "pushInsteadOf for a remote without pushurl"
    assert push_url(str(clone), "origin") == "https://github.com/org/config.git"
    with pytest.raises(ArgusError, match="no remote 'nope'"):
        push_url(str(clone), "nope")


def test_push_url_outside_a_clone_is_none(tmp_path: Path) -> None:
    assert push_url(str(tmp_path)) is None


def test_ssh_command_is_gits(clone: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert ssh_command(str(clone)) == ["ssh"]
    git(clone, "config", "core.sshCommand", "ssh -i '/home/a b/key' -o IdentitiesOnly=yes")
    assert ssh_command(str(clone)) == ["ssh", "-i", "/home/a b/key", "-o", "IdentitiesOnly=yes"]
    monkeypatch.setenv("GIT_SSH_COMMAND", "ssh -F /dev/null -p 1")
    assert ssh_command(str(clone)) == ["ssh", "-F", "/dev/null", "-p", "1"], "the environment first"
    monkeypatch.setenv("GIT_SSH_COMMAND", "ssh -i 'unclosed")
    with pytest.raises(ArgusError, match="cannot split the ssh command"):
        ssh_command(str(clone))


def fake_ssh(tmp_path: Path, code: int = 0) -> Path:
    """A program in ssh's place: prints each argument on a line, a line on stderr, exits ``code``."""
    path = tmp_path / "fake-ssh"
    path.write_text(
        textwrap.dedent(
            f"""\
            #!{sys.executable}
            import sys
            for arg in sys.argv[1:]:
                print(arg, flush=True)
            print("from stderr", file=sys.stderr)
            sys.exit({code})
            """
        )
    )
    path.chmod(0o755)
    return path


def test_ssh_logs_copies_both_streams_and_returns_the_status(tmp_path: Path) -> None:
    out, err = io.BytesIO(), io.BytesIO()
    assert ssh_logs([str(fake_ssh(tmp_path, 1)), "a b", "c"], out, err) == 1
    assert out.getvalue() == b"a b\nc\n" and err.getvalue() == b"from stderr\n"


def test_ssh_logs_that_cannot_connect_says_so(tmp_path: Path) -> None:
    with pytest.raises(ArgusError, match=r"could not reach the git server \(exit 255\).*--server"):
        ssh_logs([str(fake_ssh(tmp_path, 255))], io.BytesIO(), io.BytesIO())
    with pytest.raises(ArgusError, match="cannot run"):
        ssh_logs([str(tmp_path / "no-such-ssh")], io.BytesIO(), io.BytesIO())


def test_argus_logs_runs_ssh_for_the_git_servers_remote(
    clone: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfdbinary: pytest.CaptureFixture[bytes]
) -> None:
    git(clone, "remote", "add", "origin", "ssh://git@gpu-1.lab:2222/srv/git/config.git")
    monkeypatch.delenv("ARGUS_SERVER", raising=False)
    monkeypatch.setenv("GIT_SSH_COMMAND", f"{fake_ssh(tmp_path)} -o BatchMode=yes")
    code = main(["logs", "alice/tasks/grpo", "--follow", "--repo", str(clone)])
    out = capfdbinary.readouterr().out.decode().splitlines()
    assert code == 0
    assert out == [
        "-o",
        "BatchMode=yes",
        "-p",
        "2222",
        "git@gpu-1.lab",
        "logs",
        "alice/tasks/grpo",
        "--follow",
        "--raw",
    ]


def test_argus_logs_with_a_remote_that_is_not_the_git_servers(
    clone: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    git(clone, "remote", "add", "origin", "https://github.com/org/config.git")
    monkeypatch.delenv("ARGUS_SERVER", raising=False)
    assert main(["logs", "alice/tasks/grpo", "--repo", str(clone), "--remote", "origin"]) == 1
    assert "is not the argus git server's" in capsys.readouterr().err
