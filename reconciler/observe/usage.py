"""Usage accounting, the daemon's side: pull the router's meter, sample GPU use. I/O (HTTP).

:class:`UsageRecorder` is called with every tick's observation, off the tick's path (the
status reporter's thread): it samples the models' running replicas each call, and at most every
:data:`PULL_INTERVAL_S` pulls ``GET /argus/usage`` from the router (with the daemon's key),
recomputes the tasks' GPU-seconds from their job records, and hands back the usage documents
that changed (:class:`~reconciler.status.usage.Ledger`) for the status writer's next commit.
A failed pull is logged and counted and retried next time; it never fails or stalls a tick
(a bounded read: :data:`PULL_TIMEOUT_S`, :data:`MAX_ANSWER_BYTES`).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from reconciler.plan.actual import ActualState
from reconciler.spec.types import GPU, ClusterSpec, DesiredState
from reconciler.status.usage import SPECIAL_USERS, Job, Ledger, Replicas, Totals

log = logging.getLogger("argus")

PULL_INTERVAL_S = 60.0  # the router's meter is read, and usage documents written, at most this often
PULL_TIMEOUT_S = 5.0
# The meter's answer: at most 100,000 rows of ~150 bytes. Past this it is not read (and logged).
MAX_ANSWER_BYTES = 32 * 1024 * 1024
# A model sample adds at most this much time: after a daemon stall or restart the gap is not
# counted (an undercount, documented), rather than usage nobody saw.
SAMPLE_CAP_S = 120.0
# A document whose only change is model GPU samples (they grow while a model runs) is written at
# most this often: a running model makes a status commit every 10 minutes, not every minute. A
# daemon restart loses at most this much of the models' GPU-seconds (documented undercount).
SAMPLE_FLUSH_S = 600.0
USAGE_PATH = "/argus/usage"

# (url, api key, timeout, max bytes) -> (HTTP status or 0 when nothing answered, body)
Getter = Callable[[str, str, float, int], tuple[int, bytes]]


def get_usage(url: str, api_key: str, timeout: float, max_bytes: int) -> tuple[int, bytes]:
    """GET ``url`` with ``Authorization: Bearer <api_key>``; returns ``(status, body)``, status 0
    when nothing answered (connection refused: no router). Reads at most ``max_bytes + 1`` bytes.
    Raises TimeoutError when the server accepted the request but did not answer in time."""
    req = urllib.request.Request(url, method="GET")
    req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return int(resp.status), resp.read(max_bytes + 1)
    except urllib.error.HTTPError as exc:
        return int(exc.code), b""
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            raise exc.reason from exc
        return 0, b""
    except OSError:
        return 0, b""


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
    """The daemon's usage ledger and what feeds it. ``router_url``: the Serve endpoint's base URL
    (None: no router to ask); ``api_key``: the daemon's own key; ``load``: reads the status
    branch's usage documents (path -> parsed) once, before the first update. Thread-safe: the
    metrics scrape reads :attr:`totals` while the reporter updates."""

    def __init__(
        self,
        router_url: Callable[[ClusterSpec], str | None],
        api_key: str,
        load: Callable[[], Mapping[str, Any]],
        *,
        get: Getter = get_usage,
        clock: Callable[[], float] = time.time,
        interval: float = PULL_INTERVAL_S,
    ) -> None:
        self.router_url = router_url
        self.api_key = api_key
        self._load = load
        self._get = get
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
        """Sample the models; when the last pull is :attr:`interval` old, pull the router's meter
        and recompute the tasks. Returns the usage documents that changed (path -> document),
        empty between pulls. Never raises for a router or a document problem (logged)."""
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
        self._pull(cluster)
        self.ledger.record_tasks(jobs_of(actual), teams, now)
        samples = self._last_flush is None or now - self._last_flush >= self.flush_interval
        if samples:
            self._last_flush = now
        docs = self.ledger.take_documents(samples, now)
        totals = bounded_totals(self.ledger.totals(), known_users(desired), known_models(desired), set(cluster.teams))
        with self._lock:
            self._totals = totals
        return docs

    def _pull(self, cluster: ClusterSpec) -> None:
        base = self.router_url(cluster)
        if base is None:
            return
        try:
            status, body = self._get(base.rstrip("/") + USAGE_PATH, self.api_key, PULL_TIMEOUT_S, MAX_ANSWER_BYTES)
        except TimeoutError:
            self._failed("the router's usage endpoint did not answer in time")
            return
        if status in (0, 404):
            return  # no router (no models deployed): nothing to record
        if status != 200:
            self._failed(f"the router's usage endpoint answered HTTP {status}")
            return
        if len(body) > MAX_ANSWER_BYTES:
            self._failed(f"the router's usage answer is over {MAX_ANSWER_BYTES} bytes; not read")
            return
        try:
            answer = json.loads(body)
        except ValueError:
            self._failed("the router's usage answer is not JSON")
            return
        self.ledger.merge_tokens(answer)

    def _failed(self, why: str) -> None:
        self.pull_errors += 1
        log.warning("usage: %s; retried in %.0f s", why, self.interval)
        if self.on_error is not None:
            self.on_error("usage_pull")
