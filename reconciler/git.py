"""The one place argus runs git. I/O.

Every git child process argus starts goes through :func:`run`, :func:`probe` or
:func:`stream` (``tests/unit/test_git_layer.py`` fails when any other module under
``reconciler/`` spawns git), so every one gets the same environment, :data:`ENV`:

- ``GIT_NO_REPLACE_OBJECTS=1``: git ignores ``refs/replace/*``. Without it, anyone who can create a
  replace ref in the repository (a push to a server that allows it, or an admin pointing argus at a
  repository that has some) changes what every ``show``, ``cat-file`` and ``log`` returns: another
  user's signed file read with different content, a lease commit read with a different expiry.
- ``GIT_TERMINAL_PROMPT=0`` and no pager: a daemon never waits on a prompt or a pager.
- ``LC_ALL=C``: output argus parses (and the messages it reports) do not depend on the locale.

Network commands (``fetch``, ``ls-remote``, ``push``, ``clone``) get :data:`NETWORK_TIMEOUT` unless
the caller passes a timeout: a server that stops answering never stalls the daemon.
:data:`GIT_ENV` is also put into ``os.environ`` when the ``reconciler`` package is imported
(:func:`apply`), for any git that a library or a user's hook starts on its own.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from typing import IO

from reconciler.errors import GitError
from reconciler.redact import redact

GIT_ENV = {"GIT_NO_REPLACE_OBJECTS": "1"}
ENV = {**GIT_ENV, "GIT_TERMINAL_PROMPT": "0", "GIT_PAGER": "cat", "PAGER": "cat", "LC_ALL": "C"}
NETWORK = frozenset({"fetch", "ls-remote", "push", "clone"})
NETWORK_TIMEOUT = 300.0  # seconds; a first clone of a large repository fits, a hung server does not stall


def apply() -> None:
    """Put GIT_ENV into ``os.environ`` (overriding any other value). Returns nothing."""
    os.environ.update(GIT_ENV)


def environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a git child: this process's, then ``env``, then :data:`ENV` (which wins)."""
    return {**os.environ, **(env or {}), **ENV}


def _argv(repo: str | None, args: tuple[str, ...]) -> list[str]:
    return ["git", *(["-C", repo] if repo is not None else []), *args]


def _timeout(args: tuple[str, ...], timeout: float | None) -> float | None:
    if timeout is not None:
        return timeout
    return NETWORK_TIMEOUT if command(args) in NETWORK else None


def command(args: tuple[str, ...]) -> str:
    """The git command in ``args`` (``fetch`` in ``-c k=v fetch origin``); "" when there is none."""
    words = iter(args)
    for word in words:
        if word in ("-c", "-C"):
            next(words, None)
        elif not word.startswith("-"):
            return word
    return ""


def _what(repo: str | None, args: tuple[str, ...]) -> str:
    return f"git {' '.join(args[:3])}" + (f" in {repo}" if repo else "")


def probe(
    repo: str | None,
    *args: str,
    input: bytes | None = None,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """Run ``git -C repo args`` (no ``-C`` when ``repo`` is None) for a caller that reads the exit
    status itself (``rev-parse --verify``, ``merge-base --is-ancestor``). Returns the finished
    process (stdout and stderr as bytes). Raises GitError only when git cannot be started or runs
    past ``timeout``."""
    try:
        return subprocess.run(
            _argv(repo, args),
            input=input,
            stdin=subprocess.DEVNULL if input is None else None,  # never the daemon's own stdin
            capture_output=True,
            check=False,
            timeout=_timeout(args, timeout),
            env=environment(env),
        )
    except subprocess.TimeoutExpired as exc:
        raise GitError(redact(f"{_what(repo, args)} did not finish in {exc.timeout:.0f}s"), args) from exc
    except OSError as exc:
        raise GitError(redact(f"{_what(repo, args)} cannot run: {exc}"), args) from exc


def run(
    repo: str | None,
    *args: str,
    input: bytes | None = None,
    check: bool = True,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
) -> bytes:
    """Run ``git -C repo args``; return its stdout. Raises GitError when git fails (exit status not
    0, with ``check``), cannot be started, or runs past ``timeout``; the message (redacted) has
    git's own."""
    proc = probe(repo, *args, input=input, timeout=timeout, env=env)
    if check and proc.returncode != 0:
        stderr = proc.stderr.decode(errors="replace").strip()
        raise GitError(
            redact(f"{_what(repo, args)} failed: {stderr[-2000:] or f'exit {proc.returncode}'}"),
            args,
            proc.returncode,
            stderr,
        )
    return proc.stdout


def text(repo: str | None, *args: str, check: bool = True, timeout: float | None = None) -> str:
    """:func:`run`'s stdout as text, stripped (ids, ref names). Raises GitError like :func:`run`."""
    return run(repo, *args, check=check, timeout=timeout).decode(errors="replace").strip()


def rev(repo: str, ref: str) -> str | None:
    """The object id ``ref`` names (``rev-parse --verify --quiet``); None when it names nothing."""
    out = probe(repo, "rev-parse", "--verify", "--quiet", ref)
    return (out.stdout.decode().strip() or None) if out.returncode == 0 else None


def stream(repo: str, *args: str, stdin: IO[bytes]) -> subprocess.Popen[bytes]:
    """Start ``git -C repo args`` reading ``stdin``, its stdout a pipe to read as it comes (stderr
    discarded). The caller closes stdout and kills and waits for the process. Raises GitError when
    git cannot be started."""
    try:
        return subprocess.Popen(
            _argv(repo, args), stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=environment()
        )
    except OSError as exc:
        raise GitError(redact(f"{_what(repo, args)} cannot run: {exc}"), args) from exc


def read_objects(repo: str, ids: Iterable[str], max_bytes: int) -> Iterator[tuple[str, int, bytes | None]]:
    """``(id, size, content)`` of each object in ``ids``, in order, from one ``cat-file --batch``
    read as a stream: content is None for an object over ``max_bytes`` (skipped, never held) and
    size is -1 for a missing one. Raises GitError when git's output is not what was asked."""
    todo = list(ids)
    if not todo:
        return
    with tempfile.TemporaryFile() as request:
        request.write(("\n".join(todo) + "\n").encode())
        request.seek(0)
        proc = stream(repo, "cat-file", "--batch", stdin=request)
        assert proc.stdout is not None
        try:
            for oid in todo:
                fields = proc.stdout.readline().split()
                if len(fields) == 2 and fields[1] == b"missing":
                    yield oid, -1, None
                    continue
                if len(fields) != 3 or not fields[2].isdigit():
                    raise GitError(f"object {oid} cannot be read in {repo}", ("cat-file", "--batch"))
                size = int(fields[2])
                if size > max_bytes:
                    _discard(proc.stdout, size + 1)
                    yield oid, size, None
                    continue
                content = proc.stdout.read(size)
                proc.stdout.read(1)  # the newline after the content
                yield oid, size, content
        finally:
            proc.stdout.close()
            proc.kill()
            proc.wait()


def _discard(stream: IO[bytes], count: int) -> None:
    while count > 0:
        chunk = stream.read(min(count, 1 << 16))
        if not chunk:
            return
        count -= len(chunk)
