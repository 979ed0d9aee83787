"""The API keys files (``argus run --api-keys FILE[,FILE...]``, ``ARGUS_API_KEYS``). I/O.

One line per key: ``<user> <sha256 hex of the key>``; blank lines and ``#`` comments are allowed.
The file holds hashes, never keys: a user makes her key herself and sends the admin its line (as
with an SSH public key, see docs/admins/api-keys.md), and the daemon passes only hashes and users
to the router (reconciler/serve_apps/router.py), which hashes the key each request carries.

Like the allowed-signers file, it lives outside the repository and is read again when it changes
(:class:`KeysFile` looks at its size, modification time and inode on every tick): an admin adds or
revokes a key without restarting the daemon. Bad lines are reported with ``file:line`` (once per
change of the file) and skipped; the other keys still work. A file that cannot be read, or is
larger than MAX_BYTES, admits none of its keys (the only file: every request is a 401) until it is
fixed: a broken file fails closed, never open.

Several files may be given (:class:`KeysFiles`): the admin's and the git server's self-service file, where
``ssh git@HOST key new`` stores the hash of a key a user made for herself (images/git-server/argus-shell). Their
lines are united; a hash already in an earlier file stays that file's. Each file fails on its own: a broken
file admits none of its keys, the others still work (fewer keys, never more). A file that does not exist yet
(the admin's, before there is one) holds no key. With any file configured the endpoint is closed: a request
needs a key one of them lists. :func:`known_users` drops the keys of users ``cluster.yaml`` does not declare
(when it declares ``users:``), so that removing a user there ends her self-made keys too.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

log = logging.getLogger("argus")

MAX_BYTES = 8 * 1024 * 1024  # ~100,000 keys at ~80 bytes a line
USER_RE = re.compile(r"^(?=.{1,31}$)[a-z][a-z0-9]*(?:-[a-z][a-z0-9]*)*$")  # the loader's user names
SHA256_RE = re.compile(r"^[0-9a-fA-F]{64}$")


def key_hash(key: str) -> str:
    """The sha256 hex of ``key``: what the keys file and the endpoint hold of it."""
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()


@dataclass(frozen=True)
class KeyProblem:
    """A line of the keys file that was skipped (``line`` 0: the whole file)."""

    path: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}" if self.line else f"{self.path}: {self.message}"


def parse_keys(text: str, path: str) -> tuple[dict[str, str], list[KeyProblem]]:
    """Return ``(sha256 hex (lowercase) -> user, problems)`` of a keys file's ``text``. Pure.

    A line that is not ``<user> <sha256 hex>`` (``#`` starts a comment), names an invalid user,
    or repeats a hash already read is skipped and reported at its line (``path:line``): the first
    line holding a hash owns it, so a later line can never take another user's key over.
    """
    keys: dict[str, str] = {}
    problems: list[KeyProblem] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        if len(fields) != 2:
            problems.append(KeyProblem(path, number, "expected `<user> <sha256 hex of the key>`: line skipped"))
            continue
        user, digest = fields
        if not USER_RE.fullmatch(user):
            problems.append(KeyProblem(path, number, f"{user[:40]!r} is not a user name: line skipped"))
            continue
        if not SHA256_RE.fullmatch(digest):
            why = "looks like a key, not its sha256: never put keys here" if len(digest) != 64 else "is not hex"
            problems.append(KeyProblem(path, number, f"the second field {why}: line skipped"))
            continue
        digest = digest.lower()
        if digest in keys:
            problems.append(KeyProblem(path, number, f"the same key hash is already {keys[digest]}'s: line skipped"))
            continue
        keys[digest] = user
    return keys, problems


class KeysFile:
    """The keys file at ``path``, parsed again whenever it changes (size, mtime or inode).

    :meth:`read` is cheap on an unchanged file (one ``stat``): the daemon calls it every tick.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self._keys: dict[str, str] = {}
        self.problems: list[KeyProblem] = []  # of the last parse

    def read(self) -> dict[str, str]:
        """Return sha256 hex -> user of the file as it is now (a new dict only when it changed).

        Never raises: an unreadable or oversized file admits no key (reported once per change).
        """
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return self._absent()
        except OSError as exc:
            return self._failed((-1, -1, -1), f"cannot read the API keys file: {exc.strerror}")
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp == self._stamp:
            return self._keys
        if st.st_size > MAX_BYTES:
            return self._failed(stamp, f"the API keys file is {st.st_size} bytes; the limit is {MAX_BYTES}")
        try:
            with open(self.path, "rb") as fh:
                data = fh.read(MAX_BYTES + 1)
        except OSError as exc:
            return self._failed(stamp, f"cannot read the API keys file: {exc.strerror}")
        if len(data) > MAX_BYTES:  # grew between stat and read
            return self._failed(stamp, f"the API keys file is over {MAX_BYTES} bytes")
        keys, problems = parse_keys(data.decode("utf-8", errors="replace"), self.path)
        for problem in problems[:20]:  # bounded: a pasted binary logs 20 lines, not thousands
            log.warning("%s", problem)
        if len(problems) > 20:
            log.warning("%s: %d more bad lines skipped", self.path, len(problems) - 20)
        log.info("API keys: %d key(s) of %d user(s) from %s", len(keys), len(set(keys.values())), self.path)
        self._stamp, self._keys, self.problems = stamp, keys, problems
        return keys

    def _absent(self) -> dict[str, str]:
        stamp = (-2, -2, -2)
        if stamp == self._stamp:
            return self._keys  # the same dict: KeysFiles rebuilds nothing
        log.warning("%s: no such API keys file (yet): no key from it", self.path)
        self._stamp, self._keys, self.problems = stamp, {}, []
        return self._keys

    @property
    def absent(self) -> bool:
        """Whether the last read found no file at the path."""
        return self._stamp == (-2, -2, -2)

    def _failed(self, stamp: tuple[int, int, int], message: str) -> dict[str, str]:
        if stamp == self._stamp:
            return self._keys
        log.error("%s: %s: no API key from it is accepted until it is fixed", self.path, message)
        self._stamp, self._keys, self.problems = stamp, {}, [KeyProblem(self.path, 0, message)]
        return self._keys


def split_paths(values: Iterable[str] | str | None) -> list[str]:
    """The keys files of ``--api-keys`` (given once or more, each a comma-separated list) or ARGUS_API_KEYS,
    absolute, in order, each once. Pure but for the current directory."""
    items = [values] if isinstance(values, str) else list(values or [])
    out: list[str] = []
    for item in items:
        for part in item.split(","):
            path = os.path.abspath(part.strip()) if part.strip() else ""
            if path and path not in out:
                out.append(path)
    return out


class KeysFiles:
    """Several keys files read as one: the union of their keys, a hash owned by the first file that holds it
    (a later file's line for it is a problem at its ``file:line``)."""

    def __init__(self, paths: Sequence[str]) -> None:
        self.files = [KeysFile(p) for p in paths]
        self._parts: list[dict[str, str]] = []
        self._keys: dict[str, str] = {}
        self._clashes: list[KeyProblem] = []

    def read(self) -> dict[str, str]:
        """Return sha256 hex -> user of every file as it is now (a new dict only when one changed). Never raises."""
        parts = [f.read() for f in self.files]
        if len(parts) == len(self._parts) and all(a is b for a, b in zip(parts, self._parts, strict=True)):
            return self._keys
        keys: dict[str, str] = {}
        clashes: list[KeyProblem] = []
        for file, part in zip(self.files, parts, strict=True):
            for digest, user in part.items():
                if digest in keys:
                    clashes.append(KeyProblem(file.path, 0, f"a key hash of {user}'s is already {keys[digest]}'s"))
                    continue
                keys[digest] = user
        for clash in clashes[:20]:
            log.warning("%s: skipped", clash)
        self._parts, self._keys, self._clashes = parts, keys, clashes
        return keys

    @property
    def problems(self) -> list[KeyProblem]:
        """Every file's skipped lines and failures of the last read, then the hashes two files hold."""
        return [p for f in self.files for p in f.problems] + self._clashes


def known_users(keys: Mapping[str, str], users: Collection[str] | None) -> dict[str, str]:
    """``keys`` without the keys of users not in ``users`` (None: cluster.yaml declares no ``users:``, every
    key counts). Pure."""
    if users is None:
        return dict(keys)
    return {digest: user for digest, user in keys.items() if user in users}
