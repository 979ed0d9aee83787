"""``argus logs``: read logs through the daemon's HTTP API (users need no dashboard access), or through
the git server's ``logs`` command over the SSH remote the user pushes to (the compose install). I/O.

Without ``--server``/``ARGUS_SERVER``, a clone whose push remote is the bundled git server's
(``ssh://git@HOST[:PORT]/...`` or ``git@HOST:...``) runs ``ssh [-p PORT] git@HOST logs ...`` with the
ssh command git itself uses there (``GIT_SSH_COMMAND``, ``core.sshCommand``, else ``ssh``), as an argument
list, never through a shell; anything else reads the daemon's web address, :data:`DEFAULT_SERVER`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, BinaryIO

from reconciler import git
from reconciler.errors import ArgusError

# The daemon's pages and /api/v1 where it runs beside them: the compose install publishes them on
# 127.0.0.1:8081 (ARGUS_WEB_PORT); its 8080 serves the webhook, /metrics and /healthz only.
DEFAULT_SERVER = "http://127.0.0.1:8081"
_TARGET = re.compile(r"^([a-z0-9][a-z0-9-]*)/(models?|tasks?)/([a-z0-9][a-z0-9-]*)$")
# A Ray submission id as the daemon's routes accept one (reconciler.web.handler's path component).
_RUN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# The login of the bundled git server (images/git-server): every user's key logs in as `git`.
GIT_LOGIN = "git"
# A host name, an IPv4 address or a bracketed IPv6 address: never an ssh option (no leading "-").
_HOST = r"(?:[A-Za-z0-9][A-Za-z0-9.-]{0,252}|\[[0-9A-Fa-f:.]{2,45}\])"
_SSH_URL = re.compile(rf"^(?:ssh|git\+ssh|ssh\+git)://{GIT_LOGIN}@({_HOST})(?::([0-9]{{1,5}}))?/")
# scp-like `git@host:path`, which git reads as SSH only when no slash comes before the first colon.
_SCP_LIKE = re.compile(rf"^{GIT_LOGIN}@({_HOST}):")


@dataclass(frozen=True)
class SshRemote:
    """The git server a clone pushes to over SSH: ``git@host``, on ``port`` (None: ssh's default)."""

    host: str
    port: int | None = None

    @property
    def destination(self) -> str:
        """``git@HOST`` as ssh takes it (an IPv6 address without its brackets)."""
        return f"{GIT_LOGIN}@{self.host.strip('[]')}"


def ssh_remote(url: str) -> SshRemote | None:
    """The bundled git server's login in the push URL ``url``: ``ssh://git@HOST[:PORT]/PATH``
    (also ``git+ssh://``, ``ssh+git://``) or ``git@HOST:PATH``. Returns None for any other URL
    (https, a local path, another login, a host that is not a plain host name or address)."""
    found = _SSH_URL.match(url)
    if found:
        port = int(found.group(2)) if found.group(2) else None
        if port is not None and not 0 < port < 65536:
            return None
        return SshRemote(found.group(1), port)
    found = _SCP_LIKE.match(url)
    if found and "/" not in url[: found.end()]:
        return SshRemote(found.group(1))
    return None


def push_url(repo: str, remote: str | None = None) -> str | None:
    """The push URL of ``remote`` in the clone at ``repo``, else of the remote its current branch pushes
    to (``branch.<b>.pushRemote``, ``remote.pushDefault``, ``branch.<b>.remote``, ``origin``, the only
    remote), as git rewrites it (``pushInsteadOf``). Returns None outside a clone or without such a
    remote. Raises ArgusError for an unknown ``remote``."""

    def out(*args: str) -> str:
        proc = git.probe(repo, *args)
        return proc.stdout.decode(errors="replace").strip() if proc.returncode == 0 else ""

    remotes = out("remote").split()
    if remote is not None and remote not in remotes:
        raise ArgusError(f"no remote {remote!r} in {repo} (remotes: {', '.join(remotes) or 'none'})")
    name = remote
    if name is None:
        branch = out("symbolic-ref", "-q", "--short", "HEAD")
        keys = [f"branch.{branch}.pushRemote"] if branch else []
        keys.append("remote.pushDefault")
        keys += [f"branch.{branch}.remote"] if branch else []
        candidates = [out("config", "--get", key) for key in keys] + ["origin"]
        name = next((c for c in candidates if c in remotes), remotes[0] if len(remotes) == 1 else None)
    if name is None:
        return None
    return out("remote", "get-url", "--push", name) or None


def ssh_command(repo: str) -> list[str]:
    """The ssh program and options git uses in ``repo``: ``GIT_SSH_COMMAND``, else ``core.sshCommand``,
    split into words as a shell would (without expanding anything), else ``ssh``. Raises ArgusError
    when the setting cannot be split."""
    setting = os.environ.get("GIT_SSH_COMMAND", "").strip()
    if not setting:
        proc = git.probe(repo, "config", "--get", "core.sshCommand")
        setting = proc.stdout.decode(errors="replace").strip() if proc.returncode == 0 else ""
    try:
        words = shlex.split(setting) if setting else ["ssh"]
    except ValueError as exc:
        raise ArgusError(f"cannot split the ssh command {setting!r}: {exc}") from exc
    return words or ["ssh"]


def check_target(target: str, *, run: str | None = None, follow: bool = False) -> tuple[str, str, str]:
    """Returns ``(user, "tasks"|"models", name)`` of ``USER/tasks/NAME`` or ``USER/models/NAME``.
    Raises ArgusError on a bad target or run id, or on --run/--follow for a model."""
    found = _TARGET.match(target.strip("/"))
    if not found:
        raise ArgusError(f"{target!r}: expected USER/tasks/NAME or USER/models/NAME")
    user, kind, name = found.groups()
    kinds = kind if kind.endswith("s") else kind + "s"
    if kinds == "models" and (run or follow):
        raise ArgusError("--run and --follow are for tasks; a model's log is its Serve status messages")
    if run is not None and not _RUN.match(run):
        raise ArgusError(f"--run {run!r}: not a run id (a submission id, as `argus status` shows it)")
    return user, kinds, name


def log_url(server: str, target: str, *, run: str | None = None, follow: bool = False) -> str:
    """The log API URL of ``USER/tasks/NAME`` or ``USER/models/NAME``. Raises ArgusError on a bad target."""
    user, kinds, name = check_target(target, run=run, follow=follow)
    query = {k: v for k, v in (("run", run or ""), ("follow", "1" if follow else "")) if v}
    url = f"{server.rstrip('/')}/api/v1/logs/{user}/{kinds}/{name}"
    return url + ("?" + urllib.parse.urlencode(query) if query else "")


def ssh_argv(
    ssh: Sequence[str], remote: SshRemote, target: str, *, run: str | None = None, follow: bool = False
) -> list[str]:
    """Returns ``SSH [-p PORT] git@HOST logs USER/KIND/NAME [--run ID] [--follow] --raw``: the git
    server's ``logs`` command (``--raw``: this process escapes what it prints for its own terminal).
    Raises ArgusError like :func:`check_target`."""
    user, kinds, name = check_target(target, run=run, follow=follow)
    port = ["-p", str(remote.port)] if remote.port is not None else []
    options = [*(["--run", run] if run else []), *(["--follow"] if follow else []), "--raw"]
    return [*ssh, *port, remote.destination, "logs", f"{user}/{kinds}/{name}", *options]


def stream_logs(url: str, out: BinaryIO, *, timeout: float = 60.0) -> None:
    """Copy the log at ``url`` to ``out`` as it arrives (a followed run streams until it ends).

    Raises ArgusError with the daemon's message (404: no such object or run; 503: Ray
    unreachable) or when the daemon cannot be reached.
    """
    request = urllib.request.Request(url, headers={"Accept": "text/plain"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            while True:
                chunk = resp.read1(65536)
                if not chunk:
                    break
                out.write(chunk)
                out.flush()
    except urllib.error.HTTPError as exc:
        text = exc.read().decode(errors="replace")
        try:
            message = json.loads(text).get("error", text)
        except (ValueError, AttributeError):
            message = text
        raise ArgusError(f"{url}: HTTP {exc.code}: {message}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise ArgusError(
            f"cannot reach the argus daemon at {url}: {exc} (set --server or ARGUS_SERVER to its web address)"
        ) from exc


def ssh_logs(argv: Sequence[str], out: BinaryIO, err: BinaryIO) -> int:
    """Run ``argv`` (:func:`ssh_argv`; no shell) and copy its output to ``out`` and ``err`` as it arrives.
    Returns its exit status (1 when the git server refused or the daemon answered an error: the
    message is on ``err``). Raises ArgusError when ssh cannot start or reach the server (status 255)."""
    try:
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as exc:
        raise ArgusError(f"cannot run {argv[0]}: {exc} (or pass --server, the daemon's web address)") from exc
    assert proc.stdout is not None and proc.stderr is not None
    side = threading.Thread(target=_copy, args=(proc.stderr, err), daemon=True)
    side.start()
    try:
        _copy(proc.stdout, out)
    except BaseException:  # we stop reading (a closed pipe, ^C): the remote command ends with ssh
        proc.terminate()
        proc.wait()
        raise
    code = proc.wait()
    side.join(timeout=5)
    if code == 255:
        raise ArgusError(
            f"{shlex.join(argv)}: ssh could not reach the git server (exit 255); check the remote and your key, "
            "or pass --server (the daemon's web address) to read logs over HTTP"
        )
    return code


def _copy(src: IO[bytes], dest: BinaryIO) -> None:
    """Copy ``src`` to ``dest`` chunk by chunk, flushing each, until ``src`` ends."""
    while chunk := os.read(src.fileno(), 65536):
        dest.write(chunk)
        dest.flush()
