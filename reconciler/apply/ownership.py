"""The daemon's ownership key: the secret that signs every job argus submits. I/O.

Taken from ``ARGUS_OWNERSHIP_KEY`` when set (compose: a secret shared by nothing else), else
from ``<state dir>/ownership.key``, generated on first start with mode 0600. It is never
written to git nor passed to jobs: whoever holds it can make a job look like argus's.
"""

from __future__ import annotations

import contextlib
import os
import secrets

from reconciler.errors import PermanentError

ENV_KEY = "ARGUS_OWNERSHIP_KEY"
KEY_FILE = "ownership.key"
_KEY_BYTES = 32


def load_or_create_key(state_dir: str, env: dict[str, str] | None = None) -> bytes:
    """Return the ownership key (see the module docstring), creating the key file if needed.

    Raises PermanentError when the key file is unreadable, too short, or readable by others.
    """
    environ = os.environ if env is None else env
    if environ.get(ENV_KEY):
        value = environ[ENV_KEY].encode()
        if len(value) < 16:
            raise PermanentError(f"{ENV_KEY} is too short: use at least 16 characters (e.g. `openssl rand -hex 32`)")
        return value
    path = os.path.join(state_dir, KEY_FILE)
    if os.path.exists(path):
        return _read_key(path)
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    # Written whole under a private name, then linked into place: link() fails when the key
    # exists, so two daemons starting at once agree on one key and never read a half-written one.
    tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(_KEY_BYTES) + "\n")
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
    finally:
        os.unlink(tmp)
    return _read_key(path)


def _read_key(path: str) -> bytes:
    try:
        mode = os.stat(path).st_mode & 0o777
        with open(path, "rb") as f:
            value = f.read().strip()
    except OSError as exc:
        raise PermanentError(f"cannot read the ownership key {path}: {exc}") from exc
    if mode & 0o077:
        raise PermanentError(f"the ownership key {path} is readable by others (mode {mode:o}): chmod 600 it")
    if len(value) < 16:
        raise PermanentError(f"the ownership key {path} is too short (delete it to generate a new one)")
    return value
