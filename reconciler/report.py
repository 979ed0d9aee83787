"""What a tick leaves behind: the status report for git, one log line per action, metrics. I/O.

The status write runs in a background thread (``start()``) so that a push never waits for
the report of the tick before it: the tick hands its result over and returns; the writer
thread writes only the newest result it has (reports coalesce while a write is running).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from reconciler.builders.resolved import resolved_spec
from reconciler.dashboard import Dashboard, DashboardError
from reconciler.errors import ArgusError
from reconciler.observe.jobs import job_log_tail
from reconciler.observe.usage import UsageRecorder
from reconciler.plan.actual import FINAL_JOB_STATES
from reconciler.plan.assess import ObjectStatus
from reconciler.plan.moved import moved
from reconciler.server import Metrics
from reconciler.spec.types import ModelSpec, ObjectKey, TaskSpec
from reconciler.status.writer import StatusReport, StatusWriter
from reconciler.tick import TickResult

log = logging.getLogger("argus")


def _identity(text: str) -> str:
    return text


class Reporter:
    """Turns tick results into a status commit, log lines and metrics. Remembers the log tails
    of finished runs (fetched once each) and the last line logged per object, so a steady
    state logs nothing. Every text it writes or logs passes through ``redact``."""

    def __init__(
        self,
        dash: Dashboard,
        writer: StatusWriter,
        metrics: Metrics,
        *,
        redact: Callable[[str], str] = _identity,
        secret_names: tuple[str, ...] = (),
        usage: UsageRecorder | None = None,
    ) -> None:
        self.dash = dash
        self.usage = usage  # the usage ledger: its changed documents travel with the status report
        self.secret_names = secret_names
        # path -> resolved spec, and the (cluster, models, tasks) it was resolved from: rebuilt only
        # for the specs that changed (everything when cluster.yaml did).
        self._resolved: dict[str, dict[str, Any]] = {}
        self._specs: tuple[object, Mapping[ObjectKey, ModelSpec], Mapping[ObjectKey, TaskSpec]] | None = None
        # The statuses counted last and their counts by (kind, state) (the metrics' gauge).
        self._counted: Mapping[ObjectKey, ObjectStatus] = {}
        self._counts: dict[tuple[str, str], int] = {}
        self.writer = writer
        self.metrics = metrics
        self.redact = redact
        self.log_tails: dict[str, list[str]] = {}
        self.daemon_error: str | None = None  # the last tick's unexpected exception, until one succeeds
        self.last_commit: str | None = None
        self.write_seconds = 0.0  # duration of the last status write
        self._logged: dict[ObjectKey, str] = {}
        self._cond = threading.Condition()
        self._pending: Callable[[], None] | None = None
        self._busy = False
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._write_error: str | None = None

    # -- what the loop calls ----------------------------------------------------------------
    def report(self, result: TickResult) -> None:
        """Log and count one tick at once; write its status now, or in the background
        writer once ``start()`` was called. Raises (foreground only) what the writer raises."""
        self.daemon_error = None
        self._log_actions(result)
        self._count(result)
        # The runs recorded so far are this tick's and earlier ones': a run the next tick records
        # before this report is written is not this report's to remove (StatusReport.records_seen).
        seen = self.writer.records
        self._submit(lambda: self._write(result, seen))

    def source_error(self, message: str) -> None:
        """Say on the status branch that the source is unreadable, keeping every object's status."""
        self._submit(lambda: self._write_report(self._unknown(source_error=message)))

    def tick_error(self, message: str) -> None:
        """Say on the status branch that the last tick failed unexpectedly (objects kept)."""
        self.daemon_error = message
        self._submit(lambda: self._write_report(self._unknown()))

    def start(self) -> None:
        """Write status in a background thread from now on."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="argus-status-writer", daemon=True)
            self._thread.start()

    def flush(self, timeout: float = 60.0) -> bool:
        """Wait until every report handed over is written. Returns False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._thread is not None and (self._pending is not None or self._busy):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def stop(self, timeout: float = 60.0) -> None:
        """Write what is pending, then end the background writer."""
        self.flush(timeout)
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    # -- the writer -------------------------------------------------------------------------
    def _submit(self, job: Callable[[], None]) -> None:
        if self._thread is None:
            job()
            return
        with self._cond:
            self._pending = job  # only the newest report matters: an older one is dropped
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._stopping:
                    self._cond.wait()
                if self._pending is None:
                    return
                job, self._pending, self._busy = self._pending, None, True
            try:
                job()
                self._write_error = None
            except Exception as exc:  # the branch may be unwritable for a while: next report retries
                message = f"{type(exc).__name__}: {exc}"
                self.metrics.error("status_write")
                if message != self._write_error:
                    log.error(json.dumps({"event": "status_write_failed", "error": self.redact(message)}))
                self._write_error = message
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _unknown(self, source_error: str | None = None) -> StatusReport:
        """A report that knows nothing about the objects (their documents are kept)."""
        return StatusReport(None, {}, set(), set(), None, [], source_error=source_error, daemon_error=self.daemon_error)

    def _write(self, result: TickResult, records_seen: int | None = None) -> None:
        self._fetch_log_tails(result)
        self._write_report(self.status_report(result, records_seen))

    def _write_report(self, report: StatusReport) -> None:
        started = time.monotonic()
        commit = self.writer.write(report)
        self.write_seconds = time.monotonic() - started
        if commit:
            self.last_commit = commit
            revision = (report.revision or "")[:12]
            log.info(json.dumps({"event": "status_commit", "commit": commit[:12], "revision": revision}))

    def status_report(self, result: TickResult, records_seen: int | None = None) -> StatusReport:
        """The status writer's input for ``result`` (``records_seen``: see StatusReport)."""
        return StatusReport(
            revision=result.revision,
            statuses=result.statuses,
            applied_keys=result.applied,
            failed_keys=set(result.failures),
            plan=result.plan,
            errors=[str(i) for i in result.desired.issues],
            notes=list(result.notes),
            log_tails=self.log_tails,
            checkpoints={j.submission_id: j.hf_checkpoint for j in result.actual.runs()},
            actual=result.actual.to_json(),
            first_seen=result.plan.first_seen,  # published in actual.json for PR plans
            spec_ids=result.spec_ids,
            subject=result.subject,
            daemon_error=self.daemon_error,
            resolved=self._resolve(result),
            records_seen=records_seen,
            usage=self._usage(result),
        )

    def _usage(self, result: TickResult) -> dict[str, dict[str, Any]]:
        """The usage documents that changed (:class:`~reconciler.observe.usage.UsageRecorder`;
        at most once a minute), or {}. A failure is logged: the usage is a record, not a reason
        to lose the status commit."""
        if self.usage is None:
            return {}
        try:
            return self.usage.update(result.desired, result.actual)
        except Exception as exc:
            log.error("usage accounting failed", exc_info=exc)
            self.metrics.error("usage")
            return {}

    def _resolve(self, result: TickResult) -> dict[str, dict[str, Any]]:
        """path -> resolved spec of every loaded object. Returns a new mapping (the last one is
        handed to a writer and never changed). O(objects whose spec changed) after the first tick:
        a resolved spec is a function of the spec and ``cluster.yaml`` alone, and a spec that did
        not change is the very value the last load handed on."""
        desired = result.desired
        cluster = desired.cluster
        last = self._specs
        if last is None or last[0] is not cluster:
            changed: set[ObjectKey] = {*desired.models, *desired.tasks}
            out: dict[str, dict[str, Any]] = {}
        else:
            changed = moved(desired.models, last[1], same_object=True) | moved(desired.tasks, last[2], same_object=True)
            out = dict(self._resolved)  # C-speed copy: the last one may be in a writer's hands
        for key in changed:
            spec: ModelSpec | TaskSpec | None = desired.models.get(key) or desired.tasks.get(key)
            out.pop(key.path, None)
            if spec is None:
                continue
            try:
                out[key.path] = resolved_spec(spec, cluster, secret_names=self.secret_names)
            except Exception as exc:  # one object's derivation must not stop the report
                log.error("resolving %s failed", key, exc_info=exc)
        self._specs = (cluster, dict(desired.models), dict(desired.tasks))  # copies: C-speed
        self._resolved = out
        return out

    def _fetch_log_tails(self, result: TickResult) -> None:
        """Fetch the (bounded) log tail of each finished run of an object that exists, once.

        Tails are kept only for runs Ray still holds of objects still reported: a document keeps
        a tail once written (``documents._keep``), so nothing else needs it again.
        """
        held = set()  # Ray's jobs that are runs of a reported object (few: not every object's)
        runs_of: dict[ObjectKey, set[str]] = {}
        for job in result.actual.jobs:
            runs = runs_of.get(job.key)
            if runs is None:
                status = result.statuses.get(job.key)
                runs = runs_of[job.key] = {r.submission_id for r in status.runs} if status is not None else set()
            if job.submission_id in runs:
                held.add(job.submission_id)
        for sid in [s for s in self.log_tails if s not in held]:
            del self.log_tails[sid]
        for job in result.actual.jobs:
            if job.status in FINAL_JOB_STATES and job.submission_id in held and job.submission_id not in self.log_tails:
                try:
                    tail = job_log_tail(self.dash, job.submission_id)
                except DashboardError:  # Ray has no log file for it (it never started): asked once
                    tail = []
                except ArgusError:  # Ray unreachable: asked again next time
                    continue
                # The tail is redacted as one text: a key block spans lines.
                self.log_tails[job.submission_id] = self.redact("\n".join(tail)).split("\n") if tail else []

    def _log_actions(self, result: TickResult) -> None:
        # The last line logged per object is kept for objects that still exist, no longer.
        changes = result.plan.changes
        acting = {a.key for a in changes}
        for key in [k for k in self._logged if k not in result.statuses and k not in acting]:
            del self._logged[key]
        applied = result.applied  # a set built from the outcomes: once, not once per action
        failures = result.failures  # why a step did not take (not submitted, preemption held, ...)
        for action in changes:
            entry: dict[str, Any] = {
                "event": action.type.value,
                "object": str(action.key),
                "reason": action.reason,
                "applied": action.key in applied,
                "revision": result.revision[:12],
            }
            if action.key in failures:
                entry["error"] = failures[action.key]
            line = json.dumps(entry)
            if self._logged.get(action.key) != line:
                log.info(self.redact(line))
                self._logged[action.key] = line

    def _count(self, result: TickResult) -> None:
        """Objects by (kind, state) for the metrics: only the statuses that moved since the last
        count are counted again (statuses are values handed on while unchanged)."""
        statuses, last = result.statuses, self._counted
        counts = self._counts
        for key in moved(statuses, last, same_object=True):
            was, now = last.get(key), statuses.get(key)
            if was is not None:
                bucket = (was.key.kind, was.state)
                counts[bucket] -= 1
                if not counts[bucket]:
                    del counts[bucket]
            if now is not None:
                bucket = (now.key.kind, now.state)
                counts[bucket] = counts.get(bucket, 0) + 1
        self._counted = dict(statuses)  # a copy (C-speed): a caller may change its mapping in place
        self.metrics.set_objects(dict(counts))
        if not result.failures and result.commit_time:
            self.metrics.last_applied_commit_time = float(result.commit_time)
