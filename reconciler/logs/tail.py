"""Bounded reads of a job's driver log through Ray's state API. I/O.

Ray's Jobs API (``/api/jobs/<id>/logs``) answers the whole log in one JSON document: a 40 MB log
costs the reader 40 MB several times over. The state API serves the same file from the node that
holds it, from the last ``lines`` lines on (``/api/v0/logs/file?submission_id=...&lines=N``), or
follows it from there (``/api/v0/logs/stream``, Ray keeps the offset). Neither has a byte limit, so
the reader keeps only the last ``limit_bytes`` of what arrives, as ``kubectl logs --tail
--limit-bytes`` does, and stops reading after ``max_read_bytes`` in all.
"""

from __future__ import annotations

import http.client
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, Protocol

from reconciler.dashboard import DashboardError, RayStream
from reconciler.errors import RayUnavailable

DEFAULT_TAIL_LINES = 1000
MAX_TAIL_LINES = 10_000
DEFAULT_LIMIT_BYTES = 1024 * 1024
MAX_LIMIT_BYTES = 8 * 1024 * 1024
# The last N lines may be one line of any length: past this much read, the reader stops.
MAX_READ_BYTES = 32 * 1024 * 1024
CHUNK = 64 * 1024


class Streams(Protocol):
    """What a bounded read needs of the dashboard client (:class:`reconciler.dashboard.Dashboard`)."""

    def stream(self, path: str, *, timeout: float | None = None) -> RayStream: ...

    def get(self, path: str, **kw: Any) -> Any: ...


@dataclass(frozen=True)
class Tail:
    """The end of a log: ``text`` (at most the limit's bytes, decoded), and whether bytes before it
    were dropped for the byte limit (``cut``) or the reader gave up (``gave_up``)."""

    text: str
    cut: bool = False
    gave_up: bool = False

    def note(self, limit_bytes: int) -> str:
        """A line saying what was left out ("" when nothing was)."""
        if self.gave_up:
            return f"[argus: stopped reading after {MAX_READ_BYTES // (1024 * 1024)} MiB; the last lines are longer]\n"
        if self.cut:
            return f"[argus: output before the last {limit_bytes} bytes left out]\n"
        return ""


def clamp(value: int | None, default: int, top: int) -> int:
    """``value`` within 1..``top`` (``default`` when None)."""
    return default if value is None else max(1, min(top, value))


def stream_path(submission_id: str, node_id: str, *, lines: int, follow: bool = False, interval: float = 1.0) -> str:
    """The state API path that reads (or, ``follow``, follows) the driver log of ``submission_id``
    on its driver's node ``node_id`` from its last ``lines`` lines on.

    Ray 2.60 refuses ``submission_id`` without a node (HTTP 500), so the node and the driver log's
    file name (``job-driver-<id>.log``, as Ray's job manager names it) are given instead.
    """
    query: dict[str, str | int | float] = {
        "node_id": node_id,
        "filename": f"job-driver-{submission_id}.log",
        "lines": lines,
        "timeout": 10,
    }
    if follow:
        query["interval"] = max(0.1, interval)
    return f"/api/v0/logs/{'stream' if follow else 'file'}?{urllib.parse.urlencode(query)}"


def driver_node(dash: Streams, submission_id: str) -> str:
    """The node that runs (or ran) the driver of ``submission_id``, from ``GET /api/jobs/<id>``.

    Raises DashboardError (404: no such job, or no driver yet) / RayUnavailable."""
    path = f"/api/jobs/{urllib.parse.quote(submission_id, safe='')}"
    info = dash.get(path)
    node = info.get("driver_node_id") if isinstance(info, dict) else None
    if not isinstance(node, str) or not node:
        raise DashboardError("GET", path, 404, f"{submission_id} has no driver node (yet)")
    return node


def read_last(
    stream: RayStream,
    limit_bytes: int,
    *,
    max_read: int = MAX_READ_BYTES,
    deadline: float | None = None,
    stop: threading.Event | None = None,
) -> Tail:
    """Read ``stream`` to its end keeping only its last ``limit_bytes`` (cut at a line start when
    cut at all). Stops after ``max_read`` bytes, at ``deadline`` (monotonic) or once ``stop`` is set,
    ``gave_up`` then. Raises what ``stream.read1`` raises."""
    kept = bytearray()
    total = 0
    cut = gave_up = False
    while True:
        if total >= max_read or (deadline is not None and time.monotonic() > deadline) or (stop and stop.is_set()):
            gave_up = True
            break
        data = stream.read1(CHUNK)
        if not data:
            break
        total += len(data)
        kept += data
        if len(kept) > limit_bytes:
            del kept[: len(kept) - limit_bytes]
            cut = True
    if cut:
        start = kept.find(b"\n")
        if 0 <= start < len(kept) - 1:
            del kept[: start + 1]
    return Tail(kept.decode(errors="replace"), cut=cut, gave_up=gave_up)


def job_tail(
    dash: Streams,
    submission_id: str,
    *,
    lines: int = DEFAULT_TAIL_LINES,
    limit_bytes: int = DEFAULT_LIMIT_BYTES,
    timeout: float = 30.0,
    node_id: str | None = None,
    stop: threading.Event | None = None,
) -> Tail:
    """The last ``lines`` lines of a job's driver log, at most ``limit_bytes`` of them. ``node_id``:
    its driver's node (default: asked of Ray); ``stop``: ends the read early (``gave_up``) once set.

    Raises DashboardError (no such job, or Ray no longer holds its log file) / RayUnavailable.
    """
    path = stream_path(submission_id, node_id or driver_node(dash, submission_id), lines=max(1, lines))
    deadline = time.monotonic() + timeout
    with dash.stream(path, timeout=min(timeout, 30.0)) as stream:
        try:
            return read_last(stream, limit_bytes, deadline=deadline, stop=stop)
        except (OSError, http.client.HTTPException) as exc:
            raise RayUnavailable(f"reading the log of {submission_id} failed: {exc}") from exc
