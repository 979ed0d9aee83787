"""Submit and stop Ray Jobs through the Jobs REST API. I/O.

Submission is exactly-once by construction: the submission id is derived from the spec
(:func:`~reconciler.spec.hashing.submission_id`) and Ray refuses a second job with the
same id, so a retried or repeated submit can never start a second run.
"""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Mapping
from typing import Any

from reconciler.dashboard import Dashboard, DashboardError
from reconciler.errors import ApplyFailed, RayUnavailable

log = logging.getLogger(__name__)

# Ray answers a duplicate submission id with HTTP 500 (not 409) and this text.
_DUPLICATE = "already exists"
# A 500 whose traceback shows one of these is Ray rejecting the request itself
# (runtime_env validation happens in the job agent, which the head reports as 500).
_PERMANENT_500 = ("ValueError", "TypeError", "RuntimeEnvSetupError", "Failed to validate")


def submit_job(dash: Dashboard, body: Mapping[str, Any]) -> str:
    """``POST /api/jobs/`` with ``body`` (from :func:`~reconciler.builders.jobs.job_submission`).

    Returns the submission id. A job that already exists under that id counts as
    submitted (logged, no second job). Raises ApplyFailed: ``permanent=True`` when Ray
    rejects the request (4xx, invalid runtime_env), ``permanent=False`` when Ray is
    unreachable or fails transiently (5xx).
    """
    sid = str(body.get("submission_id") or "")
    if not sid:
        # Without an id Ray would invent one, and a retry would start a second run.
        raise ApplyFailed("job submission without submission_id", permanent=True)
    try:
        dash.post("/api/jobs/", dict(body))
    except DashboardError as exc:
        if exc.status >= 500 and _DUPLICATE in exc.text:
            log.info("job %s already submitted; not submitting again", sid)
            return sid
        permanent = exc.status < 500 or any(marker in exc.text for marker in _PERMANENT_500)
        raise ApplyFailed(f"submit {sid}: HTTP {exc.status}: {_last_line(exc.text)}", permanent=permanent) from exc
    except RayUnavailable as exc:
        raise ApplyFailed(f"submit {sid}: {exc}", permanent=False) from exc
    log.info("submitted job %s", sid)
    return sid


def stop_job(dash: Dashboard, submission_id: str) -> bool:
    """Ask Ray to stop a job. Idempotent.

    Returns True when Ray stopped a running/pending job, False when it was already in a
    final state or does not exist. Raises ApplyFailed(permanent=False) when Ray is
    unreachable or fails, ApplyFailed(permanent=True) on any other refusal.
    """
    path = f"/api/jobs/{urllib.parse.quote(submission_id, safe='')}/stop"
    try:
        answer = dash.post(path)
    except DashboardError as exc:
        if exc.status == 404:
            log.info("job %s does not exist; nothing to stop", submission_id)
            return False
        raise ApplyFailed(
            f"stop {submission_id}: HTTP {exc.status}: {_last_line(exc.text)}", permanent=exc.status < 500
        ) from exc
    except RayUnavailable as exc:
        raise ApplyFailed(f"stop {submission_id}: {exc}", permanent=False) from exc
    stopped = bool(answer.get("stopped")) if isinstance(answer, dict) else False
    log.info("stop %s: %s", submission_id, "stopping" if stopped else "already final")
    return stopped


def _last_line(text: str) -> str:
    """The most telling line of Ray's answer (its tracebacks end with the exception)."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:500] if lines else ""
