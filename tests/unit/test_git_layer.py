"""reconciler/git.py is the one module that runs git: a source check over reconciler/, and the
module itself on real git (its error type, the environment every call gets, replace refs ignored,
stdin never inherited, timeouts)."""

from __future__ import annotations

import ast
import os
import subprocess
import time
from pathlib import Path

import pytest

from reconciler import git
from reconciler.errors import GitError, SourceUnavailable
from tests.support import GIT_ENV

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "reconciler"
EMPTY_BLOB = "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"


def _is_git(node: ast.AST) -> bool:
    """A string that names the git program: ``"git"``, ``"/usr/bin/git"``, ``"git status"``."""
    if not isinstance(node, ast.Constant) or not isinstance(node.value, str):
        return False
    program = node.value.strip().split(" ", 1)[0]
    return program == "git" or program.endswith("/git")


def _has_space(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and " " in str(node.value)


def spawns_git(source: str) -> list[int]:
    """Lines of ``source`` that start git: an argv list or tuple whose program is git, or a
    command string naming git handed to a call (``os.system("git ...")``, ``shell=True``)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        argv = isinstance(node, (ast.List, ast.Tuple)) and bool(node.elts) and _is_git(node.elts[0])
        command = isinstance(node, ast.Call) and bool(node.args) and _is_git(node.args[0]) and _has_space(node.args[0])
        if argv or command:
            lines.append(getattr(node, "lineno", 0))
    return sorted(set(lines))


def test_the_check_finds_every_way_of_spawning_git() -> None:
    """The check itself can fail: each spelling below is found."""
    assert spawns_git('import subprocess\nsubprocess.run(["git", "-C", r, "status"])\n') == [2]
    assert spawns_git('subprocess.Popen(("/usr/bin/git", "log"))\n') == [1]
    assert spawns_git('os.system("git fetch origin")\n') == [1]
    assert spawns_git('subprocess.run("git push", shell=True)\n') == [1]
    assert spawns_git('subprocess.run(["ls", "git"])\nx = "git"\nredact("git")\n') == []


def test_no_module_but_the_git_module_spawns_git() -> None:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "git.py":
            continue
        lines = spawns_git(path.read_text(encoding="utf-8"))
        if lines:
            found[str(path.relative_to(ROOT))] = lines
    assert found == {}, f"git runs only through reconciler/git.py (run, probe, stream): {found}"


# -- the module, on real git ----------------------------------------------------------------------
@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    env = {**os.environ, **GIT_ENV}
    subprocess.run(["git", "init", "-q", "-b", "main", str(path)], check=True, env=env)
    (path / "m.yaml").write_text("real\n")
    subprocess.run(["git", "add", "-A"], cwd=path, check=True, env=env)
    subprocess.run(["git", "commit", "-q", "-m", "one"], cwd=path, check=True, env=env)
    return path


def test_a_failing_command_raises_one_error_type_with_what_git_said(repo: Path) -> None:
    with pytest.raises(GitError) as caught:
        git.run(str(repo), "show", "main:absent.yaml")
    exc = caught.value
    assert isinstance(exc, SourceUnavailable)  # every `except SourceUnavailable` still holds
    assert exc.returncode == 128 and exc.command == ("show", "main:absent.yaml")
    assert "absent.yaml" in exc.stderr and "absent.yaml" in str(exc) and str(repo) in str(exc)
    assert git.run(str(repo), "show", "main:absent.yaml", check=False) == b""


def test_the_message_is_redacted(repo: Path) -> None:
    secret = "ghp_" + "a1B2" * 9
    with pytest.raises(GitError) as caught:
        git.run(str(repo), "fetch", f"https://argus:{secret}@127.0.0.1:9/x.git", timeout=30)
    assert secret not in str(caught.value)


def test_every_call_gets_the_environment_even_when_the_process_lacks_it(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GIT_NO_REPLACE_OBJECTS", raising=False)
    monkeypatch.setenv("LC_ALL", "de_DE.UTF-8")
    # An alias that runs a shell prints the environment git hands its children.
    extra = {"GIT_NO_REPLACE_OBJECTS": "0", "ARGUS_EXTRA": "kept"}
    out = git.run(str(repo), "-c", "alias.env=!env", "env", env=extra).decode()
    seen = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    assert seen["GIT_NO_REPLACE_OBJECTS"] == "1"  # the caller cannot turn it off
    assert seen["GIT_TERMINAL_PROMPT"] == "0" and seen["GIT_PAGER"] == "cat" and seen["LC_ALL"] == "C"
    assert seen["ARGUS_EXTRA"] == "kept"


def test_replace_refs_are_ignored_without_the_process_environment(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GIT_NO_REPLACE_OBJECTS", raising=False)
    plain = {k: v for k, v in os.environ.items() if k != "GIT_NO_REPLACE_OBJECTS"}

    def plain_git(*args: str, input: str | None = None) -> str:
        proc = subprocess.run(["git", *args], cwd=repo, env=plain, input=input, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip()

    blob = plain_git("rev-parse", "main:m.yaml")
    forged = plain_git("hash-object", "-w", "--stdin", input="forged\n")
    plain_git("replace", blob, forged)
    assert plain_git("show", "main:m.yaml") == "forged"  # the forgery is live for plain git
    assert git.run(str(repo), "show", "main:m.yaml") == b"real\n"
    assert [c for _oid, _size, c in git.read_objects(str(repo), [blob], 1024)] == [b"real\n"]


def test_stdin_is_never_the_callers(repo: Path) -> None:
    """Without ``input`` git reads nothing (not the daemon's stdin: it would wait forever)."""
    # This process's stdin is a pipe nobody writes to: a git that inherited it would never return.
    reader, writer = os.pipe()
    saved = os.dup(0)
    os.dup2(reader, 0)
    try:
        assert git.text(str(repo), "hash-object", "--stdin", timeout=10) == EMPTY_BLOB
    finally:
        os.dup2(saved, 0)
        for fd in (reader, writer, saved):
            os.close(fd)


def test_probe_returns_the_exit_status_and_rev_the_id(repo: Path) -> None:
    assert git.probe(str(repo), "rev-parse", "--verify", "--quiet", "refs/heads/absent").returncode == 1
    head = git.rev(str(repo), "main")
    assert head is not None and len(head) == 40
    assert git.rev(str(repo), "refs/heads/absent") is None


def test_a_command_past_its_timeout_raises(repo: Path) -> None:
    started = time.monotonic()
    with pytest.raises(GitError, match="did not finish"):
        git.run(str(repo), "-c", "alias.slow=!sleep 5", "slow", timeout=0.5)
    assert time.monotonic() - started < 4


def test_network_commands_get_a_timeout_by_default(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert git.command(("-c", "k=v", "-C", "x", "fetch", "origin")) == "fetch"
    assert git.command(("-c", "alias.fetch=x", "log")) == "log"
    monkeypatch.setattr(git, "NETWORK_TIMEOUT", 0.5)
    started = time.monotonic()
    with pytest.raises(GitError, match="did not finish"):  # a server that never answers
        git.run(str(repo), "fetch", "ssh://argus@127.0.0.1/x.git", env={"GIT_SSH_COMMAND": "sleep 3 #"})
    assert time.monotonic() - started < 3


def test_read_objects_skips_what_is_over_the_limit_and_reports_what_is_missing(repo: Path) -> None:
    blob = git.text(str(repo), "rev-parse", "main:m.yaml")
    empty = git.run(str(repo), "hash-object", "-w", "--stdin", input=b"").decode().strip()
    got = list(git.read_objects(str(repo), [blob, "0" * 40, empty, blob], 3))
    assert got == [(blob, 5, None), ("0" * 40, -1, None), (empty, 0, b""), (blob, 5, None)]
    assert [c for _o, _s, c in git.read_objects(str(repo), [blob], 5)] == [b"real\n"]
