"""Observe Ray and the status branch's records once per tick, into one value. I/O.

:class:`Observer` owns what observing remembers between ticks, each bounded by what exists now:
the model prober (its verdicts, one per model Serve runs), checkpoint answers (one per run Ray or
the status branch lists), the foreign jobs already logged (those Ray still holds), the status
documents' readings (one per document), the last capacity answer (one), the daemon's sightings of
each run Ray lists (one per run: what bounds Ray's job records, :mod:`reconciler.observe.sightings`)
and the disk meter's last measurement of each user folder it is asked to measure
(:mod:`reconciler.observe.disk`).
"""

from __future__ import annotations

import json
import logging
import time
import urllib.parse
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from reconciler.dashboard import Clusters, Dashboard
from reconciler.observe.capacity import merge_capacity, observe_capacity
from reconciler.observe.disk import DiskMeter
from reconciler.observe.jobs import ForeignJob, observe_job_records
from reconciler.observe.probe import ModelProber, post_json
from reconciler.observe.records import StatusRecords
from reconciler.observe.serve import ServeObservation, observe_serve
from reconciler.observe.sightings import RunSightings
from reconciler.plan.actual import ActualJob, ActualModel, Capacity
from reconciler.plan.disk import DiskUsage
from reconciler.spec.types import ObjectKey, Paths

log = logging.getLogger("argus")


@dataclass(frozen=True)
class Observation:
    """What one tick found: Serve (``serve``; ``models`` with the probe's verdicts), argus's proven
    jobs (``jobs``) and the foreign ones, capacity, and what the status branch records: its runs,
    the attempts it calls preempted and by whom, and its documents (``docs``: path -> document); the
    last complete measurement of each user folder a disk quota applies to (``disk``: user -> usage)."""

    serve: ServeObservation
    models: dict[ObjectKey, ActualModel]
    jobs: list[ActualJob]
    capacity: Capacity
    recorded_runs: list[ActualJob]
    recorded_preempted: frozenset[str]
    recorded_by: dict[ObjectKey, ObjectKey]
    foreign: list[ForeignJob] = field(default_factory=list)
    docs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    disk: Mapping[str, DiskUsage] = field(default_factory=dict)


class Observer:
    """Observes one Ray cluster for one repository (``ownership_key`` proves argus's jobs).

    ``serve_url``: the Serve HTTP proxy where models Serve calls RUNNING are asked for a real
    answer before they count as RUNNING ("": the dashboard's host at ``serving.internal_http_port``;
    None: Serve's status alone)."""

    # A push tick reuses the capacity the last timer tick observed (two dashboard calls off the
    # push path) for at most this long. Admission stays safe: Serve and Jobs are observed fresh
    # every tick, and the planner caps free capacity by total minus everything argus holds, so
    # argus's own work since then is always counted; only others' use can be this old.
    CAPACITY_MAX_AGE_S = 10.0

    def __init__(
        self, dash: Dashboard, ownership_key: bytes, serve_url: str | None = None, *, clusters: Clusters | None = None
    ) -> None:
        self.dash = dash
        self.clusters = clusters if clusters is not None else Clusters(dash)
        # The dashboard the last observation read Serve from (None: none yet, and model logs and the
        # Serve watch read nothing: before cluster.yaml is read, the jobs cluster may not be it).
        self.serving_dash: Dashboard | None = None
        self.ownership_key = ownership_key
        self.serve_url = serve_url
        self._prober: ModelProber | None = None
        self._checkpoints: dict[str, str | None] = {}
        self._foreign_logged: set[str] = set()
        self._records = StatusRecords()
        self._sightings = RunSightings()
        self.clock = time.time  # the daemon's clock its sightings of runs are taken by
        self._capacity: tuple[float, Capacity] | None = None
        self._disk: DiskMeter | None = None  # started when a disk quota first applies

    def forget_capacity(self) -> None:
        """Observe capacity afresh on the next call (the loop's timer ticks do)."""
        self._capacity = None

    def observe(
        self,
        docs: Mapping[str, Mapping[str, Any]],
        paths: Paths | None = None,
        http_port: int | None = None,
        disk_users: Collection[str] = (),
        serving_address: str | None = None,
    ) -> Observation:
        """Observe Serve, Jobs (argus's proven ones) and capacity, and read the runs ``docs`` (the
        status branch's documents) record. ``paths``: the cluster's paths, to find checkpoints
        (None: not looked up); ``http_port``: Serve's own (internal) port, where models Serve calls RUNNING are
        asked for an answer (None: not asked); ``disk_users``: the users whose folders under
        ``paths.users`` the disk meter measures from now on (their last measurements are returned;
        measuring happens off the tick); ``serving_address``: cluster.yaml's ``serving.ray_address``,
        the cluster Serve is read from (None: the jobs cluster; capacity is then both clusters'
        together). Raises RayUnavailable (apply nothing then)."""
        serving = self.clusters.serving(serving_address)
        if serving is not self.serving_dash:
            self.forget_capacity()  # the capacity kept was another pair of clusters'
        self.serving_dash = serving
        serve = observe_serve(self.serving_dash)
        prober = self._model_prober(http_port, serving) if http_port is not None else None
        models = prober.check(serve.models, serve.apps, serve.replica_ids) if prober else dict(serve.models)
        asked = self.clock()
        jobs = observe_job_records(self.dash, self.ownership_key, paths, self._checkpoints)
        answered = self.clock()
        capacity = self._observe_capacity()
        for job in jobs.foreign:
            if job.submission_id not in self._foreign_logged:  # reported once; the status note stays
                log.warning(
                    json.dumps({"event": "foreign_job", "submission_id": job.submission_id, "claims": job.claims})
                )
        self._foreign_logged = {j.submission_id for j in jobs.foreign}
        known = {j.submission_id for j in jobs.owned}
        records, preempted, by = self._records.read(docs, paths, skip=known, checkpoints=self._checkpoints)
        # Ray's records of argus's runs, believed only within what the daemon saw of them.
        owned = self._sightings.see(jobs.owned, self._records.times(known), answered, asked)
        runs = known | {j.submission_id for j in records}
        self._checkpoints = {s: c for s, c in self._checkpoints.items() if s in runs}
        disk = self._disk_usage(paths, disk_users)
        return Observation(serve, models, owned, capacity, records, preempted, by, jobs.foreign, docs, disk)

    def _disk_usage(self, paths: Paths | None, users: Collection[str]) -> dict[str, DiskUsage]:
        """Ask the meter for ``users``' folders (none: it stops measuring); their last measurements."""
        if self._disk is None:
            if not users or paths is None:
                return {}
            self._disk = DiskMeter()
        self._disk.want(paths.users if paths is not None else None, users)
        return self._disk.usage()

    def close(self) -> None:
        """Stop measuring folders (the daemon's shutdown)."""
        if self._disk is not None:
            self._disk.close()

    def _observe_capacity(self) -> Capacity:
        now = time.monotonic()
        seen = self._capacity
        if seen is not None and now - seen[0] < self.CAPACITY_MAX_AGE_S:
            return seen[1]
        capacity = observe_capacity(self.dash)
        if self.serving_dash is not None and self.serving_dash is not self.dash:
            capacity = merge_capacity(capacity, observe_capacity(self.serving_dash))
        self._capacity = (now, capacity)
        return capacity

    def _model_prober(self, http_port: int, serving: Dashboard) -> ModelProber | None:
        """The prober of the Serve proxy beside ``serving`` (one, kept between ticks: it owns the verdicts)."""
        if self.serve_url is None:
            return None
        url = self.serve_url or serve_url_beside(serving.base_url, http_port)
        if self._prober is None or self._prober.serve_url != url.rstrip("/"):
            if self._prober is not None:
                self._prober.close()
            # No credential: Serve's proxy is reached on the cluster's internal port, where the
            # router authenticates nobody; a probe carries nothing a job's app could reuse.
            self._prober = ModelProber(url, post=post_json)
        return self._prober

    def memo_sizes(self) -> dict[str, int]:
        """How many entries each memo holds (the soak checks they stay bounded)."""
        return {
            "checkpoints": len(self._checkpoints),
            "foreign_logged": len(self._foreign_logged),
            "records": self._records.size(),
            "sightings": self._sightings.size(),
            "verdicts": self._prober.size() if self._prober is not None else 0,
        }


def serve_url_beside(dashboard_url: str, http_port: int) -> str:
    """The Serve proxy on the dashboard's host: ``http://<host>:<http_port>``."""
    parts = urllib.parse.urlsplit(dashboard_url)
    host = parts.hostname or "127.0.0.1"
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme or 'http'}://{host}:{http_port}"
