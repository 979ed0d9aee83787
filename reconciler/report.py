"""What a tick leaves behind: the status report for git, one log line per action, metrics. I/O."""

from __future__ import annotations

import contextlib
import json
import logging

from reconciler.dashboard import Dashboard
from reconciler.errors import ArgusError
from reconciler.observe.jobs import job_log_tail
from reconciler.plan.actions import ActionType
from reconciler.plan.actual import FINAL_JOB_STATES
from reconciler.server import Metrics
from reconciler.status.writer import StatusReport, StatusWriter
from reconciler.tick import TickResult

log = logging.getLogger("argus")


class Reporter:
    """Turns tick results into a status commit, log lines and metrics. Remembers the log tails
    of finished runs (fetched once each) and the last line logged per object, so a steady
    state logs nothing."""

    def __init__(self, dash: Dashboard, writer: StatusWriter, metrics: Metrics) -> None:
        self.dash = dash
        self.writer = writer
        self.metrics = metrics
        self.log_tails: dict[str, list[str]] = {}
        self._logged: dict[str, str] = {}

    def report(self, result: TickResult) -> str | None:
        """Log, write and count one tick. Returns the status commit (None when nothing changed).

        Raises whatever the status writer raises (git failures)."""
        self._fetch_log_tails(result)
        self._log_actions(result)
        commit = self.writer.write(self.status_report(result))
        if commit:
            log.info(json.dumps({"event": "status_commit", "commit": commit[:12], "revision": result.revision[:12]}))
        self._count(result)
        return commit

    def status_report(self, result: TickResult) -> StatusReport:
        """The status writer's input for ``result``."""
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
        )

    def source_error(self, message: str) -> None:
        """Say on the status branch that the source is unreadable, keeping every object's status."""
        try:
            self.writer.write(StatusReport(None, {}, set(), set(), None, [], source_error=message))
        except Exception as exc:  # the status branch may be as unavailable as the source
            log.debug("status write failed: %s", exc)

    def _fetch_log_tails(self, result: TickResult) -> None:
        for job in result.actual.jobs:
            if job.status in FINAL_JOB_STATES and job.submission_id not in self.log_tails:
                with contextlib.suppress(ArgusError):
                    self.log_tails[job.submission_id] = job_log_tail(self.dash, job.submission_id)

    def _log_actions(self, result: TickResult) -> None:
        for action in result.plan.actions:
            if action.type is not ActionType.KEEP:
                line = json.dumps(
                    {
                        "event": action.type.value,
                        "object": str(action.key),
                        "reason": action.reason,
                        "applied": action.key in result.applied,
                        "revision": result.revision[:12],
                    }
                )
                if self._logged.get(str(action.key)) != line:
                    log.info(line)
                    self._logged[str(action.key)] = line

    def _count(self, result: TickResult) -> None:
        counts: dict[tuple[str, str], int] = {}
        for st in result.statuses.values():
            counts[(st.key.kind, st.state)] = counts.get((st.key.kind, st.state), 0) + 1
        self.metrics.set_objects(counts)
        if not result.failures and result.commit_time:
            self.metrics.last_applied_commit_time = float(result.commit_time)
