"""The page handler the daemon serves: the status store + Ray logs + redaction, wired once. I/O."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from reconciler.dashboard import Dashboard
from reconciler.logs.ray import RayLogs, redactor
from reconciler.status.store import StatusStore
from reconciler.web.handler import build_handler
from reconciler.web.response import PageHandler


def daemon_pages(
    repo: str,
    status_branch: str,
    dash: Dashboard | None,
    *,
    secret_values: Iterable[str | None] = (),
    ownership_key: bytes | None = None,
    endpoint: str = "",
    refresh_s: float = 5.0,
    serving: Callable[[], Dashboard | None] | None = None,
) -> PageHandler:
    """The status page and API over ``status_branch`` of the git repository at ``repo``.

    ``dash``: where logs are read (None: no log API), models' from ``serving()`` when given (the
    cluster they run on); ``secret_values``: what the daemon hands
    to jobs or holds itself, hidden from every log served; ``ownership_key``: the daemon's key for
    the ownership proofs of its jobs (a run is served only with a valid proof).
    """
    redact = redactor([v for v in secret_values if v])
    logs = RayLogs(dash, redact, ownership_key=ownership_key, serving=serving) if dash is not None else None
    reader = StatusStore(repo, status_branch, redact=redact)  # served redacted, whoever wrote the branch
    return build_handler(reader, logs=logs, endpoint=endpoint, refresh_s=refresh_s)
