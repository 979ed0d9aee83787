"""Usage accounting, the daemon's side: read the endpoint's meter, sample GPU use.

:class:`UsageRecorder` is called with every tick's observation, off the tick's path (the
status reporter's thread): it samples the models' running replicas each call, and at most every
:data:`PULL_INTERVAL_S` reads the endpoint's meter (held in the daemon's own process,
reconciler/endpoint/meter.py: no request, no credential, nothing a job can answer), recomputes
the tasks' GPU-seconds from their job records, and hands back the usage documents that changed
(:class:`~reconciler.status.usage.Ledger`) for the status writer's next commit. A failed read is
logged and counted and retried next time; it never fails or stalls a tick.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from reconciler.plan.actual import ActualState
from reconciler.spec.types import GPU, ClusterSpec, DesiredState
from reconciler.status.usage import SPECIAL_USERS, Job, Ledger, Replicas, Totals

log = logging.getLogger("argus")

PULL_INTERVAL_S = 60.0  # the router's meter is read, and usage documents written, at most this often
# A model sample adds at most this much time: after a daemon stall or restart the gap is not
# counted (an undercount, documented), rather than usage nobody saw.
SAMPLE_CAP_S = 120.0
# A document whose only change is model GPU samples (they grow while a model runs) is written at
# most this often: a running model makes a status commit every 10 minutes, not every minute. A
# daemon restart loses at most this much of the models' GPU-seconds (documented undercount).
SAMPLE_FLUSH_S = 600.0
# () -> the meter's usage document (MeterState.usage), or None when there is no meter to read.
UsageReader = Callable[[], Mapping[str, Any] | None]


OTHER = "(other)"  # a metrics label for every user or model the repository does not know


def known_users(desired: DesiredState) -> set[str]:
    """The users of the repository: cluster.yaml's ``users:`` when it declares them, else the
    owners of its objects."""
    if desired.cluster.users is not None:
        return set(desired.cluster.users)
    return {k.user for k in desired.models} | {k.user for k in desired.tasks}


def known_models(desired: DesiredState) -> set[str]:
    """The repository's models as ``<user>/models/<name>``."""
    return {f"{k.user}/models/{k.name}" for k in desired.models}


def bounded_totals(totals: Totals, users: set[str], models: set[str], teams: set[str] | None = None) -> Totals:
    """``totals`` with every user not in ``users`` (nor :data:`SPECIAL_USERS`), every model
    object not in ``models`` and every team not in ``teams`` (None: any) summed under
    :data:`OTHER`: the label sets of the metrics stay as small as the repository (a removed
    model's usage still counts, under ``(other)``). Pure."""

    def user(u: str) -> str:
        return u if u in users or u in SPECIAL_USERS else OTHER

    out = Totals()
    for mine, theirs in (
        (out.requests, totals.requests),
        (out.prompt_tokens, totals.prompt_tokens),
        (out.completion_tokens, totals.completion_tokens),
    ):
        for (u, m), v in theirs.items():
            key = (user(u), m if m in models else OTHER)
            mine[key] = mine.get(key, 0) + v
    for (u, team, kind), s in totals.gpu_seconds.items():
        if u not in users:
            team = ""
        elif team and teams is not None and team not in teams:
            team = OTHER
        g = (user(u), team, kind)
        out.gpu_seconds[g] = out.gpu_seconds.get(g, 0.0) + s
    return out


def team_map(cluster: ClusterSpec) -> dict[str, str]:
    """user -> team name (users in no team are absent)."""
    return {m: t.name for t in cluster.teams.values() for m in t.members}


def jobs_of(actual: ActualState) -> list[Job]:
    """The GPU-holding task runs of ``actual``, with their times in unix seconds.

    The times are the job's as the observer left them: bounded by what the daemon saw of the run
    (:mod:`reconciler.observe.sightings`). They are bounded here again by the run's life as argus
    recorded it, where the job carries it: never before argus submitted it (``submitted_at``),
    never past when argus first saw it ended (``seen_ended``)."""
    out = []
    for j in actual.jobs:
        gpus = float(j.resources.get(GPU, 0.0))
        if gpus <= 0 or not j.start_time:
            continue
        start = j.start_time / 1000.0
        # A job that ended has its end time; one still active is counted up to now. A finished
        # job without an end time (Ray lost it) counts nothing past its start.
        end = j.end_time / 1000.0 if j.end_time else (None if j.active else start)
        if j.submitted_at is not None:
            start = max(start, float(j.submitted_at))
        if j.seen_ended is not None and not j.active:
            end = min(end if end is not None else float(j.seen_ended), float(j.seen_ended))
        if end is not None:
            end = max(end, start)
        out.append(Job(j.submission_id, j.key.user, j.key.name, gpus, start, end))
    return out


def replicas_of(actual: ActualState) -> list[Replicas]:
    """Each model's running replicas and GPUs per replica."""
    return [
        Replicas(m.key.user, m.key.name, m.ready_replicas, float(m.resources_per_replica.get(GPU, 0.0)))
        for m in actual.models.values()
        if m.ready_replicas > 0
    ]


class UsageRecorder:
    """The daemon's usage ledger and what feeds it. ``read``: the endpoint meter's usage document
    (None: no meter; reconciler/endpoint/hub.py ``EndpointHub.usage``); ``load``: reads the status
    branch's usage documents (path -> parsed) once, before the first update. Thread-safe: the
    metrics scrape reads :attr:`totals` while the reporter updates."""

    def __init__(
        self,
        read: UsageReader | None,
        load: Callable[[], Mapping[str, Any]],
        *,
        clock: Callable[[], float] = time.time,
        interval: float = PULL_INTERVAL_S,
    ) -> None:
        self.read = read
        self._load = load
        self._clock = clock
        self.interval = interval
        self.ledger = Ledger()
        self._loaded = False
        self._last_pull: float | None = None
        self._last_flush: float | None = None
        self.flush_interval = SAMPLE_FLUSH_S
        self._lock = threading.Lock()
        self._totals = Totals()
        self.pull_errors = 0  # failed pulls so far (the metrics' argus_errors{kind="usage_pull"} too)
        self.on_error: Callable[[str], None] | None = None

    @property
    def totals(self) -> Totals:
        """The merged totals as of the last update, users and models the repository does not
        know folded into ``(other)`` (:func:`bounded_totals`; replaced, never changed in place)."""
        with self._lock:
            return self._totals

    def update(self, desired: DesiredState, actual: ActualState) -> dict[str, dict[str, Any]]:
        """Sample the models; when the last pull is :attr:`interval` old, read the endpoint's meter
        and recompute the tasks. Returns the usage documents that changed (path -> document),
        empty between pulls. Never raises for a meter or a document problem (logged)."""
        cluster = desired.cluster
        now = self._clock()
        # Every bound of the ledger counts from the daemon's clock, told before anything is read.
        self.ledger.tell(now)
        if not self._loaded:
            try:
                self.ledger.load(self._load(), now)
            except Exception as exc:  # the branch unreadable now: start empty, documents merge later
                log.warning("cannot read the usage documents back: %r", exc)
                return {}
            self._loaded = True
        teams = team_map(cluster)
        self.ledger.sample_models(replicas_of(actual), teams, now, SAMPLE_CAP_S)
        if self._last_pull is not None and now - self._last_pull < self.interval:
            return {}
        self._last_pull = now
        self._pull()
        self.ledger.record_tasks(jobs_of(actual), teams, now)
        samples = self._last_flush is None or now - self._last_flush >= self.flush_interval
        if samples:
            self._last_flush = now
        docs = self.ledger.take_documents(samples, now)
        totals = bounded_totals(self.ledger.totals(), known_users(desired), known_models(desired), set(cluster.teams))
        with self._lock:
            self._totals = totals
        return docs

    def _pull(self) -> None:
        if self.read is None:
            return
        try:
            answer = self.read()
        except Exception as exc:  # the meter's problem is logged and counted; the next read retries
            self._failed(f"the endpoint's meter could not be read: {exc!r}")
            return
        if answer is not None:
            self.ledger.merge_tokens(answer)

    def _failed(self, why: str) -> None:
        self.pull_errors += 1
        log.warning("usage: %s; retried in %.0f s", why, self.interval)
        if self.on_error is not None:
            self.on_error("usage_pull")
