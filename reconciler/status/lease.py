"""One daemon per repository: a lease on ``refs/argus/lease``, taken and renewed with
compare-and-swap. I/O.

The ref points at a parentless commit whose message is ``{"holder": ..., "expires": ...}``.
A daemon that finds the lease held by another, unexpired holder applies nothing and
reports it; a lease nobody renews (its daemon was killed) expires and is taken over. Every
write is a compare-and-swap on the ref (``git update-ref <new> <old>`` in a local repository,
``git push --force-with-lease`` to a remote), so two daemons can never both hold it.

A lease is argus's only when its ``auth`` verifies under the status key
(:func:`reconciler.status.auth.lease_verifies`; the daemon sets ``key``): a lease anyone else
pushed — a far-future expiry that would stop every daemon — is ignored (taken over at once)
and reported (``ignored``). Daemons sharing a repository must share the ownership key. A
remote's lease is fetched into a tracking ref, never over argus's own.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from reconciler import git
from reconciler.errors import GitError
from reconciler.source.remote import RepoSource, tracking_ref
from reconciler.status.auth import lease_mac, lease_verifies
from reconciler.status.branch import AUTHOR

log = logging.getLogger("argus")

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
    key: bytes | None = None  # the status key (reconciler.status.auth); None: leases are not authenticated
    ignored: str | None = None  # the last lease ignored because it does not verify (reported)

    def acquire(self) -> bool:
        """Take or renew the lease. Returns True when this daemon holds it now; False when
        another daemon does (``other`` names it) or a concurrent writer won the race."""
        current, data = self._read()
        now = self.clock()
        if data is not None and data.get("holder") != self.holder and _expires(data) > now:
            self.other = str(data.get("holder"))
            return False
        commit = self._commit({"holder": self.holder, "expires": float(now + self.ttl)})
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
            self._swap(self._commit({"holder": self.holder, "expires": 0.0}), current)

    @property
    def _repo(self) -> str:
        return self.source.repo.path

    def _read(self) -> tuple[str | None, dict[str, object] | None]:
        """(the lease commit, its data); data None when there is none or it is not argus's."""
        ref = LEASE_REF
        if not self.source.local:
            ref = tracking_ref(LEASE_REF)
            with contextlib.suppress(GitError):  # unreachable: judged from the last copy fetched
                git.probe(
                    self._repo,
                    "fetch",
                    "--quiet",
                    "--prune",
                    "--force",
                    "origin",
                    f"+refs/argus/*:{ref.rsplit('/', 1)[0]}/*",
                )
        sha = git.rev(self._repo, ref)
        if sha is None:
            return None, None
        message = git.probe(self._repo, "log", "-1", "--format=%B", sha).stdout.decode(errors="replace")
        try:
            data = json.loads(message)
        except ValueError:
            data = None
        if not isinstance(data, dict) or not _well_formed(data):
            data = {"holder": "unreadable lease", "expires": 0}
        if self.key is not None and not lease_verifies(self.key, data):
            report = f"lease {sha[:12]} (holder {str(data.get('holder'))[:80]!r}) was not written by argus: ignored"
            if report != self.ignored:
                log.warning(json.dumps({"event": "lease_forged", "error": report}))
            self.ignored = report
            return sha, None
        return sha, data

    def _commit(self, data: dict[str, object]) -> str:
        if self.key is not None:
            data = {**data, "auth": lease_mac(self.key, str(data["holder"]), float(str(data["expires"])))}
        empty = git.run(self._repo, "hash-object", "-t", "tree", "-w", "--stdin", input=b"").decode().strip()
        message = json.dumps(data, sort_keys=True).encode()
        return git.run(self._repo, "commit-tree", empty, "-F", "-", input=message, env=AUTHOR).decode().strip()

    def _swap(self, new: str, old: str | None) -> bool:
        if self.source.local:
            return git.probe(self._repo, "update-ref", LEASE_REF, new, old or ZERO).returncode == 0
        lease = f"--force-with-lease={LEASE_REF}:{old or ''}"
        try:
            push = git.probe(self._repo, "push", "--quiet", lease, "origin", f"{new}:{LEASE_REF}")
        except GitError:  # the remote did not answer in time: not taken
            return False
        if push.returncode != 0:
            return False
        git.probe(self._repo, "update-ref", LEASE_REF, new)
        git.probe(self._repo, "update-ref", tracking_ref(LEASE_REF), new)
        return True


def _well_formed(data: dict[str, object]) -> bool:
    """Whether a lease's fields are what argus writes: a holder that is text (no lone surrogate
    from a ``\\udcff`` escape) and an expiry that is a finite number (a 400-digit integer does
    not fit a float). Anything else, pushed by someone, is read as an expired, unreadable lease."""
    holder, expires = data.get("holder"), data.get("expires")
    if not isinstance(holder, str) or isinstance(expires, bool) or not isinstance(expires, (int, float)):
        return False
    try:
        holder.encode()
        return math.isfinite(float(expires))
    except (UnicodeEncodeError, OverflowError):
        return False


def _expires(data: dict[str, object]) -> float:
    value = data.get("expires", 0)
    return float(value) if isinstance(value, (int, float)) else 0.0
