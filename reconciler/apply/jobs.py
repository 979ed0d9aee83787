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
from collections.abc import Callable, Mapping
from typing import Any

from reconciler.dashboard import Dashboard, DashboardError
from reconciler.errors import ApplyFailed, RayUnavailable

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


def is_permanent(status: int, text: str) -> bool:
    """True when Ray's answer (``status``, body ``text``) refuses the request itself.

    A 500 that relays the job agent's 4xx (``Request failed with status code 400: ...``) is
    classified by the relayed status.
    """
    relayed = _RELAYED.search(text)
    effective = int(relayed.group(1)) if relayed and status >= 500 else status
    return effective in _REQUEST_REFUSED


def submit_job(dash: Dashboard, body: Mapping[str, Any]) -> str:
    """``POST /api/jobs/`` with ``body`` (from :func:`~reconciler.builders.jobs.job_submission`).

    Returns the submission id. A job that already exists under that id counts as
    submitted (logged, no second job; the observer decides whether it is argus's).
    Raises ApplyFailed: ``permanent=True`` only when Ray refuses the request itself
    (:func:`is_permanent`), ``permanent=False`` when Ray is unreachable or may heal.
    """
    sid = str(body.get("submission_id") or "")
    if not sid:
        # Without an id Ray would invent one, and a retry would start a second run.
        raise ApplyFailed("job submission without submission_id", permanent=True)
    try:
        dash.post("/api/jobs/", dict(body))
    except DashboardError as exc:
        if _DUPLICATE in exc.text:
            log.info("job %s already submitted; not submitting again", sid)
            return sid
        permanent = is_permanent(exc.status, exc.text)
        raise ApplyFailed(f"submit {sid}: HTTP {exc.status}: {_last_line(exc.text)}", permanent=permanent) from exc
    except RayUnavailable as exc:
        raise ApplyFailed(f"submit {sid}: {exc}", permanent=False) from exc
    log.info("submitted job %s", sid)
    return sid


class Backoff:
    """Per-key retry schedule for temporary failures: 2, 4, 8 ... up to ``cap`` seconds.

    ``due(key, now)`` says whether to try again; ``failed`` schedules the next try and returns
    the delay; ``succeeded`` forgets the key. ``now`` is passed in (monotonic seconds) so that
    tests drive it without sleeping.
    """

    def __init__(self, first: float = 2.0, cap: float = 60.0) -> None:
        self.first, self.cap = first, cap
        self._next: dict[object, tuple[float, float]] = {}  # key -> (not before, last delay)

    def due(self, key: object, now: float) -> bool:
        entry = self._next.get(key)
        return entry is None or now >= entry[0]

    def failed(self, key: object, now: float) -> float:
        last = self._next.get(key, (0.0, 0.0))[1]
        delay = min(self.cap, 2 * last if last else self.first)
        self._next[key] = (now + delay, delay)
        return delay

    def succeeded(self, key: object) -> None:
        self._next.pop(key, None)

    def prune(self, keep: Callable[[object], bool]) -> None:
        """Forget every key for which ``keep(key)`` is false (the caller's objects that are gone)."""
        for key in [k for k in self._next if not keep(k)]:
            del self._next[key]

    def __len__(self) -> int:
        return len(self._next)

    def retry_in(self, key: object, now: float) -> float | None:
        """Seconds until the next try of ``key`` (None when it is not backing off)."""
        entry = self._next.get(key)
        return None if entry is None else max(0.0, entry[0] - now)


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
            f"stop {submission_id}: HTTP {exc.status}: {_last_line(exc.text)}",
            permanent=is_permanent(exc.status, exc.text),
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
