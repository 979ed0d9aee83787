"""Submit and stop Ray Jobs through the Jobs REST API. I/O.

A retried submit never starts a second run while Ray remembers the first: the submission id
is derived from the spec (:func:`~reconciler.spec.hashing.submission_id`) and Ray refuses a
second job with the same id. When Ray forgets (a head restart), the status branch is the
record (see ``ActualState.recorded_runs``).
"""

from __future__ import annotations

import logging
import re
import urllib.parse
from collections.abc import Mapping
from typing import Any

from reconciler.dashboard import Dashboard, DashboardError
from reconciler.errors import ApplyDeferred, ApplyFailed, ApplyRefused, RayUnavailable

log = logging.getLogger(__name__)

# Ray answers a duplicate submission id with an error (HTTP 500 relaying the job agent's
# refusal in Ray 2.60) whose text says so.
_DUPLICATE = "already exists"
# The head relays the job agent's own answer inside its HTTP 500 as this text.
_RELAYED = re.compile(r"Request failed with status code (\d{3})")
# 4xx answers about the request itself: the same body is refused again until the spec changes.
# Everything else (5xx such as "No available agent to submit job, please try again later" right
# after a head starts, 401/403 token problems, 404/408/429) may heal without a new spec.
_REQUEST_REFUSED = frozenset({400, 405, 411, 413, 414, 415, 422})


def http_failure(what: str, exc: DashboardError) -> ApplyFailed:
    """The error for Ray's HTTP answer ``exc`` to ``what``: :class:`ApplyRefused` when it refuses
    the request itself, else :class:`ApplyDeferred`.

    A 500 that relays the job agent's 4xx (``Request failed with status code 400: ...``) is
    classified by the relayed status.
    """
    relayed = _RELAYED.search(exc.text)
    effective = int(relayed.group(1)) if relayed and exc.status >= 500 else exc.status
    kind = ApplyRefused if effective in _REQUEST_REFUSED else ApplyDeferred
    return kind(f"{what}: HTTP {exc.status}: {_last_line(exc.text)}")


def submit_job(dash: Dashboard, body: Mapping[str, Any]) -> str:
    """``POST /api/jobs/`` with ``body`` (from :func:`~reconciler.builders.jobs.job_submission`).

    Returns the submission id. A job that already exists under that id counts as
    submitted (logged, no second job; the observer decides whether it is argus's).
    Raises ApplyRefused only when Ray refuses the request itself (:func:`http_failure`),
    ApplyDeferred when Ray is unreachable or may heal.
    """
    sid = str(body.get("submission_id") or "")
    if not sid:
        # Without an id Ray would invent one, and a retry would start a second run.
        raise ApplyRefused("job submission without submission_id")
    try:
        dash.post("/api/jobs/", dict(body))
    except DashboardError as exc:
        if _DUPLICATE in exc.text:
            log.info("job %s already submitted; not submitting again", sid)
            return sid
        raise http_failure(f"submit {sid}", exc) from exc
    except RayUnavailable as exc:
        raise ApplyDeferred(f"submit {sid}: {exc}", delay=exc.delay) from exc
    log.info("submitted job %s", sid)
    return sid


def stop_job(dash: Dashboard, submission_id: str) -> bool:
    """Ask Ray to stop a job. Idempotent.

    Returns True when Ray stopped a running/pending job, False when it was already in a
    final state or does not exist. Raises ApplyDeferred when Ray is unreachable or fails,
    ApplyRefused when it refuses the request itself.
    """
    path = f"/api/jobs/{urllib.parse.quote(submission_id, safe='')}/stop"
    try:
        answer = dash.post(path)
    except DashboardError as exc:
        if exc.status == 404:
            log.info("job %s does not exist; nothing to stop", submission_id)
            return False
        raise http_failure(f"stop {submission_id}", exc) from exc
    except RayUnavailable as exc:
        raise ApplyDeferred(f"stop {submission_id}: {exc}", delay=exc.delay) from exc
    stopped = bool(answer.get("stopped")) if isinstance(answer, dict) else False
    log.info("stop %s: %s", submission_id, "stopping" if stopped else "already final")
    return stopped


def _last_line(text: str) -> str:
    """The most telling line of Ray's answer (its tracebacks end with the exception)."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:500] if lines else ""
