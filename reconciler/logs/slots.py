"""Slots for the log reads one page thread each holds: bounded in all, per user and per client."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Slots:
    """``total`` reads at once, at most ``per_user`` for one user's objects and ``per_client`` for one
    client address, so one client (or one user's big log) cannot take them all.

    The counters hold only keys with a slot taken: their size is bounded by ``total``.
    """

    total: int
    per_user: int
    per_client: int
    what: str = "log reads"
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _users: Counter[str] = field(default_factory=Counter, repr=False)
    _clients: Counter[str] = field(default_factory=Counter, repr=False)
    _taken: int = 0

    def refusal(self, user: str, client: str) -> str | None:
        """Take a slot for ``user``'s object and ``client``: None when taken, else why not."""
        with self._lock:
            if self._taken >= self.total:
                return f"too many {self.what} now (at most {self.total}); retry shortly"
            if self._users[user] >= self.per_user:
                return f"too many {self.what} of {user}'s objects now (at most {self.per_user}); retry shortly"
            if client and self._clients[client] >= self.per_client:
                return f"too many {self.what} from {client} now (at most {self.per_client}); retry shortly"
            self._taken += 1
            self._users[user] += 1
            if client:
                self._clients[client] += 1
            return None

    def release(self, user: str, client: str) -> None:
        with self._lock:
            self._taken -= 1
            for counter, key in ((self._users, user), (self._clients, client)):
                if key:
                    counter[key] -= 1
                    if counter[key] <= 0:
                        del counter[key]

    @property
    def free(self) -> int:
        """Slots not taken now."""
        with self._lock:
            return self.total - self._taken

    def holders(self) -> int:
        """How many users and clients hold a slot (bounded by twice ``total``)."""
        with self._lock:
            return len(self._users) + len(self._clients)
