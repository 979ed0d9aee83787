"""What one tick hands the next: the admission order and the preemptions in flight. Pure values.

Nothing here is a cache: both are facts the status branch records too, and a restarted daemon
rebuilds them from it (the admission order from each document's ``first_seen``; a preemption from
its run record). They are carried between ticks only for the window in which the branch does not
hold them yet. Every function returns a new value and never changes its arguments.
"""

from __future__ import annotations

import operator
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from itertools import compress

from reconciler.spec.hashing import parse_submission_id
from reconciler.spec.types import ObjectKey


@dataclass(frozen=True)
class AdmissionOrder:
    """When each object was first seen *as its file is now* (UTC epoch seconds), and the file blob
    each time was recorded at (``seen_blob``: by the object's path; only objects in ``first_seen``
    have one). ``seeded``: the status branch's record has been read in.

    Every method costs a few C-level passes over its tables (dict copies, key-set differences) and
    Python work only for the objects that changed: at 100,000 objects a per-object Python loop here
    took a third of a second of every push tick."""

    first_seen: Mapping[ObjectKey, int] = field(default_factory=dict)
    seen_blob: Mapping[str, str] = field(default_factory=dict)
    seeded: bool = False
    # What the order was last placed after (:meth:`after`): the desired state's serial and the
    # commit whose file blobs it holds (0 / None: unknown). A next revision that follows both
    # names what may differ since (:meth:`feed`), and only that is looked at.
    serial: int = 0
    commit: str | None = None

    def feed(
        self, serial: int, commit: str, changed: tuple[int, Collection[ObjectKey]] | None,
        paths: tuple[str, Collection[str]] | None,
    ) -> frozenset[ObjectKey] | None:  # fmt: skip
        """The objects whose place may differ from this order's in a revision (``serial``,
        ``commit``) whose desired state ``changed`` (the loader's feed: the state it follows and
        the objects that moved) and whose files ``paths`` (the commit it follows and the paths that
        moved) follow the ones this order was placed after; None when they do not (or this order
        was never placed, or is not seeded yet): then every object is looked at."""
        if not self.seeded or not self.serial or self.commit is None or changed is None or paths is None:
            return None
        if (changed[0], paths[0]) != (self.serial, self.commit):
            # The very revision again (nothing read since): nothing moved.
            return frozenset() if (serial, commit) == (self.serial, self.commit) else None
        keys = (key_of_path(p) for p in paths[1])
        return frozenset(changed[1]).union(k for k in keys if k is not None)

    def seed(self, recorded: Mapping[ObjectKey, int], recorded_blobs: Mapping[ObjectKey, str]) -> AdmissionOrder:
        """This order with the status branch's record under it (what this process saw wins).
        Returns a seeded order."""
        first_seen = {**recorded, **self.first_seen}
        blobs = {k.path: b for k, b in recorded_blobs.items() if k in first_seen}
        blobs.update(self.seen_blob)
        return AdmissionOrder(first_seen=first_seen, seen_blob=blobs, seeded=True)

    def for_files(self, spec_ids: Mapping[str, str], feed: Collection[ObjectKey] | None = None) -> AdmissionOrder:
        """This order without the objects whose file changed since they were placed
        (``spec_ids``: path -> blob). An edited file starts over in line: a user cannot hold a
        place in the queue with a file that asked for nothing and then ask for more.
        ``feed`` (:meth:`feed`): only these objects' files may have changed (None: any).
        The order keeps its serial and commit: only :meth:`after` moves them."""
        recorded = self.seen_blob
        if feed is not None:
            paths: Iterable[str] = (k.path for k in feed)
            moved: Iterable[str] = [p for p in paths if p in recorded and recorded[p] != spec_ids.get(p, recorded[p])]
        else:  # the paths recorded at a blob the tree does not hold (C: one pass, no Python per object)
            moved = compress(recorded, map(operator.ne, map(spec_ids.get, recorded), recorded.values()))
        keys = (key_of_path(p) for p in moved if p in spec_ids)
        edited = [key for key in keys if key is not None and key in self.first_seen]
        if not edited:
            return self
        first_seen, blobs = dict(self.first_seen), dict(self.seen_blob)
        for key in edited:
            del first_seen[key]
            blobs.pop(key.path, None)
        return replace(self, first_seen=first_seen, seen_blob=blobs)

    def after(
        self,
        planned: Mapping[ObjectKey, int],
        spec_ids: Mapping[str, str],
        feed: Collection[ObjectKey] | None = None,
        *,
        serial: int = 0,
        commit: str | None = None,
    ) -> AdmissionOrder:
        """The order once a plan has placed the objects it saw (``planned``: the plan's
        ``first_seen``, one entry per object that exists now). Objects new to the order are
        recorded at their file's blob; blobs of objects gone are dropped. ``feed``: ``planned``
        differs from this order only at these objects (None: anywhere). ``serial`` and
        ``commit``: the revision placed (0 / None: one no later revision may follow)."""
        if feed is None:
            gone: Iterable[ObjectKey] = self.first_seen.keys() - planned.keys()
            new: Iterable[ObjectKey] = planned.keys() - self.first_seen.keys()
        else:
            gone = [k for k in feed if k in self.first_seen and k not in planned]
            new = [k for k in feed if k in planned and k not in self.first_seen]
        blobs = dict(self.seen_blob)
        for key in gone:
            blobs.pop(key.path, None)
        for key in new:
            path = key.path
            if path in spec_ids:
                blobs[path] = spec_ids[path]
        return AdmissionOrder(dict(planned), blobs, self.seeded, serial, commit)


def key_of_path(path: str) -> ObjectKey | None:
    """The object ``users/<user>/<kind>s/<name>.yaml`` names (the inverse of
    :attr:`ObjectKey.path`); None for any other path."""
    parts = path.split("/")
    if len(parts) != 4 or parts[0] != "users" or parts[2] not in ("models", "tasks") or not parts[3].endswith(".yaml"):
        return None
    return ObjectKey(parts[1], "model" if parts[2] == "models" else "task", parts[3][: -len(".yaml")])


@dataclass(frozen=True)
class Preemptions:
    """Preemptions applied that the status branch may not hold yet.

    ``runs``: attempts stopped for preemption until the branch records them *and* Ray reports
    them stopped (until then every status write must keep saying PREEMPTED); ``by``: which object
    each preempted object was preempted for, kept as long as its attempt is pending."""

    runs: frozenset[str] = frozenset()
    by: Mapping[ObjectKey, ObjectKey] = field(default_factory=dict)

    def merged(
        self, recorded_runs: frozenset[str], recorded_by: Mapping[ObjectKey, ObjectKey], stopped: Collection[str]
    ) -> tuple[Preemptions, frozenset[str], dict[ObjectKey, ObjectKey]]:
        """Fold in what the status branch records (``recorded_runs``, ``recorded_by``) and the
        attempts Ray reports ``stopped``. Returns the preemptions still pending, every preempted
        attempt, and every preempted object's preemptor."""
        runs = self.runs - (recorded_runs & frozenset(stopped))
        pending = {task_of_run(s) for s in runs}
        by = {k: v for k, v in self.by.items() if recorded_by.get(k) != v or k in pending}
        return Preemptions(runs, by), recorded_runs | runs, {**recorded_by, **by}

    def added(self, runs: Collection[str], by: Mapping[ObjectKey, ObjectKey]) -> Preemptions:
        """These preemptions plus attempts ``runs`` stopped and objects ``by`` preempted."""
        return Preemptions(self.runs | frozenset(runs), {**self.by, **by})

    def kept(self, tasks: Collection[ObjectKey], models: Collection[ObjectKey]) -> Preemptions:
        """Only what belongs to objects still in the repository: the preemptions of objects
        deleted meanwhile are never written."""
        return Preemptions(
            frozenset(s for s in self.runs if task_of_run(s) in tasks),
            {k: v for k, v in self.by.items() if k in tasks or k in models},
        )


@dataclass(frozen=True)
class Memory:
    """Everything one tick hands the next (a fresh ``Memory()`` is a restarted daemon's)."""

    order: AdmissionOrder = field(default_factory=AdmissionOrder)
    preemptions: Preemptions = field(default_factory=Preemptions)


def task_of_run(sid: str) -> ObjectKey | None:
    """The task an argus-derived submission id names (None when it is not one)."""
    parsed = parse_submission_id(sid)
    return ObjectKey(parsed[0], "task", parsed[1]) if parsed is not None else None
