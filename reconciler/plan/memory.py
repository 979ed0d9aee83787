"""What one tick hands the next: the admission order and the preemptions in flight. Pure values.

Nothing here is a cache: both are facts the status branch records too, and a restarted daemon
rebuilds them from it (the admission order from each document's ``first_seen``; a preemption from
its run record). They are carried between ticks only for the window in which the branch does not
hold them yet. Every function returns a new value and never changes its arguments.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from reconciler.spec.hashing import parse_submission_id
from reconciler.spec.types import ObjectKey


@dataclass(frozen=True)
class AdmissionOrder:
    """When each object was first seen *as its file is now* (UTC epoch seconds), and the file blob
    each time was recorded at. ``seeded``: the status branch's record has been read in."""

    first_seen: Mapping[ObjectKey, int] = field(default_factory=dict)
    seen_blob: Mapping[ObjectKey, str] = field(default_factory=dict)
    seeded: bool = False

    def seed(self, recorded: Mapping[ObjectKey, int], recorded_blobs: Mapping[ObjectKey, str]) -> AdmissionOrder:
        """This order with the status branch's record under it (what this process saw wins).
        Returns a seeded order."""
        return AdmissionOrder(
            first_seen={**recorded, **self.first_seen},
            seen_blob={**recorded_blobs, **self.seen_blob},
            seeded=True,
        )

    def for_files(self, spec_ids: Mapping[str, str]) -> AdmissionOrder:
        """This order without the objects whose file changed since they were placed
        (``spec_ids``: path -> blob). An edited file starts over in line: a user cannot hold a
        place in the queue with a file that asked for nothing and then ask for more."""
        edited = {
            key
            for key in self.first_seen
            if key.path in spec_ids and self.seen_blob.get(key, spec_ids[key.path]) != spec_ids[key.path]
        }
        if not edited:
            return self
        return AdmissionOrder(
            first_seen={k: v for k, v in self.first_seen.items() if k not in edited},
            seen_blob={k: v for k, v in self.seen_blob.items() if k not in edited},
            seeded=self.seeded,
        )

    def after(self, planned: Mapping[ObjectKey, int], spec_ids: Mapping[str, str]) -> AdmissionOrder:
        """The order once a plan has placed the objects it saw (``planned``: the plan's
        ``first_seen``, one entry per object that exists now). Objects new to the order are
        recorded at their file's blob; blobs of objects gone are dropped."""
        blobs = {k: b for k, b in self.seen_blob.items() if k in planned}
        for key in planned:
            if key not in self.first_seen and key.path in spec_ids:
                blobs[key] = spec_ids[key.path]
        return AdmissionOrder(first_seen=dict(planned), seen_blob=blobs, seeded=self.seeded)


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
