"""Slots for the log reads one page thread each holds: bounded in all and per requester.

A requester is who asks, not whose log it is: the user an authenticating proxy vouched for
(``argus run --web-user-header``), else the client address. Counting per log owner would let a
stranger lock a user out of her own logs (two follows of bob's task held, and renewed, by anyone);
counted per requester, a stranger holds at most her own share, and a user following her own
objects' log (vouched for) takes the slot of someone following another user's when all are taken.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from reconciler.errors import ArgusError


@dataclass(frozen=True)
class Requester:
    """Who asks for a log: ``identity``, the user an authenticating proxy vouched for ("" when
    none), else ``address``, the client's address ("" when unknown: counted in the total only)."""

    identity: str = ""
    address: str = ""

    @property
    def key(self) -> str:
        """What the slots are counted by: one identity, else one address ("" : nobody in particular)."""
        if self.identity:
            return f"user {self.identity}"
        return f"client {self.address}" if self.address else ""

    def owns(self, user: str) -> bool:
        """True when the requester is ``user`` herself (vouched for; an address owns nothing)."""
        return bool(self.identity) and self.identity == user


@dataclass(eq=False)
class Slot:
    """One slot taken: by ``requester`` (a :attr:`Requester.key`), ``own`` when for her own
    objects. ``cut`` is set when the slot is to go to an owner: the holder ends and releases it."""

    requester: str
    own: bool
    taken: float = field(default_factory=time.monotonic)
    cut: threading.Event = field(default_factory=threading.Event)


@dataclass
class Slots:
    """``total`` slots, at most ``per_requester`` held by one requester. With ``to_owner``, a
    requester vouched for as the owner of the log asked for, finding every slot taken, cuts the slot
    of one holder reading another user's log (the requester holding the most, then the oldest) and
    waits up to ``cut_wait_s`` for it to be released: nobody can lock a user out of her own logs,
    and the total still holds.

    The slots held are all that is kept: at most ``total`` entries.
    """

    total: int
    per_requester: int
    what: str = "log reads"
    to_owner: bool = False
    cut_wait_s: float = 5.0
    max_waiting: int = 1
    _cond: threading.Condition = field(default_factory=threading.Condition, repr=False)
    _held: list[Slot] = field(default_factory=list, repr=False)
    _waiting: dict[str, int] = field(default_factory=dict, repr=False)

    def take(self, requester: Requester, owner: str) -> Slot:
        """Take a slot for ``requester`` reading ``owner``'s object's log. Returns it (give it back
        with :meth:`release`). Raises ArgusError saying why when none can be had now."""
        key, own = requester.key, requester.owns(owner)
        deadline = time.monotonic() + self.cut_wait_s
        with self._cond:
            # A request waiting for a cut slot counts in its requester's share: many at once would
            # otherwise each wait, each take one, and hold more than the share between them.
            if key and self._count(key) + self._waiting.get(key, 0) >= self.per_requester:
                who = requester.identity or requester.address
                each = f"at most {self.per_requester} each"
                raise ArgusError(f"too many {self.what} by {who} now ({each}); retry shortly")
            full = ArgusError(f"too many {self.what} now (at most {self.total}); retry shortly")
            if len(self._held) < self.total:
                return self._add(key, own)
            # Each waiter holds a page thread: few wait at once, the others are told to retry.
            if not (own and self.to_owner) or sum(self._waiting.values()) >= self.max_waiting:
                raise full
            self._waiting[key] = self._waiting.get(key, 0) + 1
            try:
                while len(self._held) >= self.total:
                    victim = self._victim(key)
                    left = deadline - time.monotonic()
                    if victim is None or left <= 0:
                        raise full
                    victim.cut.set()
                    self._cond.wait(left)
                return self._add(key, own)
            finally:
                self._waiting[key] -= 1
                if not self._waiting[key]:
                    del self._waiting[key]

    def _count(self, key: str) -> int:
        """Slots held by the requester ``key`` (call under the lock)."""
        return sum(1 for s in self._held if s.requester == key)

    def _add(self, key: str, own: bool) -> Slot:
        slot = Slot(key, own)
        self._held.append(slot)
        return slot

    def _victim(self, taker: str) -> Slot | None:
        """The slot to cut for an owner, the requester ``taker`` (call under the lock): one held for
        another user's log, else one held for her own log by a requester holding at least two more
        than ``taker`` (she keeps one; two owners holding as many never cut each other in turn); among
        them one already being cut first, then the requester holding the most, then the oldest."""
        counts: dict[str, int] = {}
        for slot in self._held:
            counts[slot.requester] = counts.get(slot.requester, 0) + 1
        mine = counts.get(taker, 0)
        others = [s for s in self._held if not s.own]
        if not others:
            others = [s for s in self._held if s.requester != taker and counts[s.requester] >= mine + 2]
        if not others:
            return None
        return min(others, key=lambda s: (not s.cut.is_set(), -counts[s.requester], s.taken))

    def release(self, slot: Slot) -> None:
        """Give ``slot`` back (again: no effect)."""
        with self._cond:
            if slot in self._held:
                self._held.remove(slot)
                self._cond.notify_all()

    @property
    def free(self) -> int:
        """Slots not taken now."""
        with self._cond:
            return self.total - len(self._held)

    def holders(self) -> int:
        """How many requesters hold a slot (bounded by ``total``)."""
        with self._cond:
            return len({s.requester for s in self._held})
