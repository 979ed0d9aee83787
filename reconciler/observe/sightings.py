"""What the daemon itself saw of each run, and Ray's job records believed only within it. Pure.

Ray trusts every job as an administrator: any job's driver can rewrite any job's ``JobInfo``
(status, message, start and end times) in the GCS, and the ownership proof covers none of those.
So a run's times and final status are believed only where they agree with what the daemon saw
with its own clock: when it recorded the run before submitting it (``submitted_at``, on the
status branch), when it first saw it RUNNING, when it last saw it RUNNING and when it first saw it
ended. A run's life is bounded by them:

- it started no earlier than argus submitted it, and no later than argus first saw it in Ray;
- it ended no earlier than argus last saw it RUNNING, and no later than argus first saw it ended.

A time outside its bounds (by more than :data:`CLOCK_SLACK_S`) is a disagreement: the time is
clamped to the bound (that is what is billed), the run's message says what Ray's record claimed
and what argus saw, and one ``{"event": "run_record_disagrees"}`` log line is written per run and
kind. A final status that contradicts a sighting (ended before argus last saw it running) is not
believed: the run is FAILED with that message (argus cannot tell what the run did; it never
claims a success it did not see, and a checkpoint is served only from a believed SUCCEEDED). A run
argus saw end keeps the first final status it saw; Ray turning it RUNNING again or into another
final status is reported the same way.

Memory: one :class:`_Seen` per run Ray lists now (dropped when Ray forgets it), owned by
:class:`RunSightings`, which the observer holds. First sightings of RUNNING and of the end are
transition times, kept in the run record on the status branch (:data:`SEEN_FIELDS
<reconciler.status.documents.SEEN_FIELDS>`, written with the status change they come with, no
commit of their own), so a restarted daemon reads them back (:class:`RunRecord`). The last
RUNNING sighting changes every tick and is not persisted: a restarted daemon bounds an end from
below by the first RUNNING sighting on record (what it can prove), and a run recorded before
``submitted_at`` existed is bounded from below by the earliest sighting it has (an undercount
for such old runs, never an overcount).
"""

from __future__ import annotations

import calendar
import json
import logging
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from reconciler.plan.actual import PREEMPTED, ActualJob

log = logging.getLogger("argus")

# A sighting is taken around a request, and Ray's head stamps its times by its own clock (the
# daemon runs beside it: the same host's, or one NTP keeps within milliseconds): a time within this
# of its bound agrees. Billing is clamped to the bounds all the same; the slack only decides what
# is reported and whether a final status is believed.
CLOCK_SLACK_S = 5.0
# Ray's own message quoted in a disagreement note at most this long (job code writes it).
MAX_QUOTED = 200
# Final statuses Ray reports (PREEMPTED and LOST are argus's own, never Ray's).
RAY_FINAL = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})
DISBELIEVED = "FAILED"  # the status of a run whose final status contradicts what argus saw


@dataclass(frozen=True)
class RunRecord:
    """What the status branch recorded of one run (UTC epoch seconds; None: not recorded)."""

    submitted_at: float | None = None
    seen_running: float | None = None
    seen_ended: float | None = None
    status: str | None = None  # the recorded status, when it is one of Ray's final ones
    end_time: float | None = None  # the end argus believed (and recorded) when it saw the run end


@dataclass
class _Seen:
    """One run as this daemon saw it (its clock)."""

    first: float  # the first sighting of the run in Ray at all (this process, or on record)
    running: float | None = None  # first seen RUNNING
    last_running: float | None = None  # last seen RUNNING (not persisted)
    ended: float | None = None  # first seen in a final state
    status: str | None = None  # the final status first seen
    end: float | None = None  # the end believed then: what a later rewrite cannot move
    submitted: float | None = None  # when argus submitted it, once a record said (kept: the record may go)
    reported: set[str] = field(default_factory=set)  # disagreement kinds already logged


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def _family(status: str | None) -> str | None:
    """A final status as compared with another: argus reports a STOPPED attempt it preempted as
    PREEMPTED (the same end)."""
    return "STOPPED" if status == "PREEMPTED" else status


class RunSightings:
    """The daemon's sightings of the runs Ray lists (see the module's docstring): bounded by Ray's
    list, one entry per run."""

    def __init__(self) -> None:
        self._seen: dict[str, _Seen] = {}

    def size(self) -> int:
        """How many runs' sightings are held."""
        return len(self._seen)

    def see(
        self,
        jobs: Iterable[ActualJob],
        recorded: Mapping[str, RunRecord],
        now: float,
        since: float | None = None,
    ) -> list[ActualJob]:
        """Note one observation of argus's jobs and return them bounded by what the daemon saw.

        ``recorded``: the status branch's records by submission id; ``now``: when Ray's answer
        arrived (first sightings); ``since``: when it was asked (a RUNNING sighting proves the run
        ran then; default ``now``). Each job comes back with ``submitted_at``, ``seen_running``
        and ``seen_ended`` set, its start and end times clamped to its bounds, and, where Ray's
        record disagrees, its status and message as the module's docstring says. Runs Ray no
        longer lists are forgotten."""
        asked = now if since is None else since
        out: list[ActualJob] = []
        kept: dict[str, _Seen] = {}
        for job in jobs:
            sid = job.submission_id
            record = recorded.get(sid, RunRecord())
            seen = self._seen.get(sid) or self._seeded(record, now)
            if sid not in recorded and seen.ended is not None:
                # Its record is gone with its task's file: the end argus saw is kept nowhere a
                # restarted daemon would read it, so Ray's status is believed again, as it would
                # be then (a run Ray calls active is stopped, as its file's deletion asks; the
                # submission bound stays, which bills no more).
                seen.ended = seen.status = seen.end = None
            kept[sid] = seen
            out.append(self._bounded(job, seen, record, now, asked))
        self._seen = kept
        return out

    @staticmethod
    def _seeded(record: RunRecord, now: float) -> _Seen:
        """A run first seen by this process: what the record proves, and this sighting."""
        known = [t for t in (record.seen_running, record.seen_ended) if t is not None]
        # A preempted run is recorded as argus's PREEMPTED: Ray's record of it said STOPPED.
        recorded = "STOPPED" if record.status == PREEMPTED else record.status
        final = recorded if recorded in RAY_FINAL and record.seen_ended is not None else None
        return _Seen(
            first=min([now, *known]),
            running=record.seen_running,
            last_running=record.seen_running,
            ended=record.seen_ended if final else None,
            status=final,
            end=record.end_time if final else None,
        )

    def _bounded(self, job: ActualJob, seen: _Seen, record: RunRecord, now: float, asked: float) -> ActualJob:
        """``job`` after this sighting, within its bounds (see :meth:`see`)."""
        problems: list[tuple[str, str]] = []  # (kind, what argus says about it)
        status = job.status
        ray_status = _family(status)
        overruled = False  # Ray's status is not the one argus saw the run end with
        if seen.ended is not None:
            if ray_status != _family(seen.status):
                overruled = True
                problems.append(
                    (
                        "status",
                        f"Ray's record now says {status}, but argus saw the run end {seen.status} "
                        f"at {_iso(seen.ended)}",
                    )
                )
            status = seen.status or status
        elif status == "RUNNING":
            if seen.running is None:
                seen.running = now
            seen.last_running = max(seen.last_running or asked, asked)
        elif status in RAY_FINAL:
            seen.ended, seen.status = now, status
        # Kept once read: the record goes with its task's file (a user deletes the task to stop it).
        if record.submitted_at is not None:
            seen.submitted = record.submitted_at
        submitted = seen.submitted
        # Started: not before argus submitted it (or, without that record, its earliest sighting),
        # not after argus first saw it in Ray.
        # Without a submission on record (a run recorded before argus kept one, or submitted by a
        # one-off ``argus reconcile``, which records none) only the upper bound holds.
        start_hi = min(t for t in (seen.first, seen.running, seen.ended) if t is not None)
        start_lo = min(submitted, start_hi) if submitted is not None else -math.inf
        ray_start = job.start_time / 1000.0 if job.start_time else None
        start = None if ray_start is None else min(max(ray_start, start_lo), start_hi)
        if ray_start is not None and ray_start < start_lo - CLOCK_SLACK_S:
            problems.append(
                (
                    "start_time",
                    f"Ray's record says it started at {_iso(ray_start)}, before argus submitted it at {_iso(start_lo)}",
                )
            )
        elif ray_start is not None and ray_start > start_hi + CLOCK_SLACK_S:
            problems.append(
                (
                    "start_time",
                    f"Ray's record says it started at {_iso(ray_start)}, after argus saw it at {_iso(start_hi)}",
                )
            )
        end_ms: int | None = None
        final = status in RAY_FINAL or status == "PREEMPTED"
        if final and seen.ended is not None:
            # Ended: not before argus last saw it running, not after argus first saw it ended.
            begun = start if start is not None else start_hi
            end_lo = max(begun, min(seen.last_running or begun, seen.ended))
            end_hi = max(seen.ended, end_lo)
            ray_end = job.end_time / 1000.0 if job.end_time else None
            end = end_lo if ray_end is None else min(max(ray_end, end_lo), end_hi)
            if overruled and seen.end is not None:
                end, ray_end = min(max(seen.end, end_lo), end_hi), None  # the end argus saw stands
            elif seen.end is None:
                seen.end = end
            if ray_end is not None and ray_end > end_hi + CLOCK_SLACK_S:
                problems.append(
                    (
                        "end_time",
                        f"Ray's record says it ended at {_iso(ray_end)}, after argus saw it end by {_iso(end_hi)}",
                    )
                )
            elif ray_end is not None and ray_end < end_lo - CLOCK_SLACK_S:
                problems.append(
                    (
                        "end_time",
                        f"Ray's record says it ended {status} at {_iso(ray_end)}, but argus saw it running at "
                        f"{_iso(end_lo)}",
                    )
                )
                if "status" not in {k for k, _ in problems} and status in RAY_FINAL and status != DISBELIEVED:
                    status = DISBELIEVED  # a final status that contradicts a sighting is not believed
            end_ms = int(end * 1000)
        bounded = replace(
            job,
            status=status,
            start_time=int(start * 1000) if start is not None else None,
            end_time=end_ms if final else None,
            submitted_at=_to_ms(submitted),
            seen_running=_to_ms(seen.running),
            seen_ended=_to_ms(seen.ended),
        )
        if status != "SUCCEEDED":
            bounded = replace(bounded, hf_checkpoint=None)  # served only from a believed success
        if not problems:
            return bounded
        for kind, what in problems:
            if kind not in seen.reported:
                seen.reported.add(kind)
                log.warning(
                    json.dumps(
                        {
                            "event": "run_record_disagrees",
                            "submission_id": job.submission_id,
                            "field": kind,
                            "argus": what,
                        }
                    )
                )
        note = "; ".join(what for _kind, what in problems)
        quoted = f" (Ray's message: {job.message[:MAX_QUOTED]!r})" if job.message else ""
        message = f"argus does not believe Ray's job record: {note}; counted only as argus saw it{quoted}"
        return replace(bounded, message=message)


def _to_ms(value: float | None) -> float | None:
    """``value`` (epoch seconds) to the millisecond a run record keeps (None stays None)."""
    return None if value is None else round(value, 3)


def parse_time(value: object) -> float | None:
    """A run record's time as UTC epoch seconds: ``%Y-%m-%dT%H:%M:%SZ``, or with milliseconds
    (``...:%S.mmmZ``, what the daemon's own sightings are kept in: a bound rounded to the second
    would cut up to a second off a run's GPU-seconds). None: absent or malformed."""
    if not isinstance(value, str) or len(value) not in (20, 24):
        return None
    whole, _, frac = value[:-1].partition(".")
    if len(value) == 24 and not (len(frac) == 3 and frac.isdigit()):
        return None
    try:
        seconds = float(calendar.timegm(time.strptime(whole + "Z", "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return None
    return seconds + (int(frac) / 1000.0 if frac else 0.0)
