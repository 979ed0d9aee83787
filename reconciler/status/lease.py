"""One daemon per repository: a lease on ``refs/argus/lease``, taken and renewed with
compare-and-swap. I/O.

The ref points at a parentless commit whose message is ``{"holder": ..., "expires": ...}``.
A daemon that finds the lease held by another, unexpired holder applies nothing and
reports it; a lease nobody renews (its daemon was killed) expires and is taken over. Every
write is a compare-and-swap on the ref (``git update-ref <new> <old>`` in a local repository,
``git push --force-with-lease`` to a remote), so two daemons can never both hold it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from reconciler.source.remote import RepoSource
from reconciler.status.branch import AUTHOR

LEASE_REF = "refs/argus/lease"
ZERO = "0" * 40


def holder_id() -> str:
    """A name for this daemon that no other daemon shares: host, process and a random part.

    ``argus run`` names its lease by host and listen address instead, which no two live
    daemons share either, and which survives a restart."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass
class Lease:
    """The lease of ``source`` as ``holder`` sees it. ``ttl``: seconds a renewal lasts."""

    source: RepoSource
    holder: str = field(default_factory=holder_id)
    ttl: float = 60.0
    clock: Callable[[], float] = time.time
    other: str | None = None  # the holder seen last time the lease was not ours

    def acquire(self) -> bool:
        """Take or renew the lease. Returns True when this daemon holds it now; False when
        another daemon does (``other`` names it) or a concurrent writer won the race."""
        current, data = self._read()
        now = self.clock()
        if data is not None and data.get("holder") != self.holder and _expires(data) > now:
            self.other = str(data.get("holder"))
            return False
        commit = self._commit({"holder": self.holder, "expires": now + self.ttl})
        if not self._swap(commit, current):
            _, data = self._read()
            self.other = str((data or {}).get("holder", "unknown"))
            return False
        self.other = None
        return True

    def release(self) -> None:
        """Give the lease up (at shutdown) so another daemon need not wait for it to expire."""
        current, data = self._read()
        if current and data is not None and data.get("holder") == self.holder:
            self._swap(self._commit({"holder": self.holder, "expires": 0}), current)

    # -- git ------------------------------------------------------------------------------
    def _git(self, *args: str, input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        env = {**os.environ, **AUTHOR}
        return subprocess.run(
            ["git", "-C", self.source.repo.path, *args], input=input, capture_output=True, env=env, check=False
        )

    def _read(self) -> tuple[str | None, dict[str, object] | None]:
        if not self.source.local:
            self._git("fetch", "--quiet", "--force", "origin", f"+{LEASE_REF}:{LEASE_REF}")
        sha = self._git("rev-parse", "--verify", "--quiet", LEASE_REF).stdout.decode().strip() or None
        if sha is None:
            return None, None
        message = self._git("log", "-1", "--format=%B", sha).stdout.decode()
        try:
            data = json.loads(message)
        except ValueError:
            return sha, {"holder": "unreadable lease", "expires": 0}
        return sha, data if isinstance(data, dict) else {"holder": "unreadable lease", "expires": 0}

    def _commit(self, data: dict[str, object]) -> str:
        empty = self._git("hash-object", "-t", "tree", "-w", "--stdin", input=b"").stdout.decode().strip()
        out = self._git("commit-tree", empty, "-F", "-", input=json.dumps(data, sort_keys=True).encode())
        return out.stdout.decode().strip()

    def _swap(self, new: str, old: str | None) -> bool:
        if self.source.local:
            return self._git("update-ref", LEASE_REF, new, old or ZERO).returncode == 0
        push = self._git(
            "push", "--quiet", f"--force-with-lease={LEASE_REF}:{old or ''}", "origin", f"{new}:{LEASE_REF}"
        )
        if push.returncode != 0:
            return False
        self._git("update-ref", LEASE_REF, new)
        return True


def _expires(data: dict[str, object]) -> float:
    value = data.get("expires", 0)
    return float(value) if isinstance(value, (int, float)) else 0.0
