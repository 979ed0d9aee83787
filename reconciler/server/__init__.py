"""The daemon's HTTP side: ``POST /hooks/git`` (push webhooks), ``/metrics``, ``/healthz`` and the
status pages (a :data:`~reconciler.web.response.PageHandler`). I/O; limits in :mod:`reconciler.server.core`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from reconciler.server.core import DEFAULT_MAX_BODY, HttpServer
from reconciler.server.metrics import Metrics
from reconciler.server.webhook import header_problem, pushed_ref, signature_ok
from reconciler.web.response import PageHandler

__all__ = ["DEFAULT_MAX_BODY", "HttpServer", "Metrics", "header_problem", "pushed_ref", "signature_ok", "start_server"]


def start_server(
    listen: str,
    *,
    metrics: Metrics,
    on_push: Callable[[str | None], bool] | None,
    secret: str | None,
    health: Callable[[], dict[str, Any]],
    pages: PageHandler | None = None,
    max_body: int = DEFAULT_MAX_BODY,
    **limits: Any,
) -> HttpServer:
    """Serve on ``host:port`` in background threads; return the server (``.shutdown()`` to stop).

    ``on_push(ref)`` returns whether the push concerns the tracked branch; None serves no webhook
    (the page address). ``pages`` answers every other GET/HEAD (404 without it). ``limits`` are
    :class:`HttpServer`'s keyword arguments (timeouts, connection and thread counts).
    Raises OSError when the address cannot be bound, ValueError when it is not ``HOST:PORT``.
    """
    return HttpServer(
        listen, metrics=metrics, health=health, on_push=on_push, secret=secret, pages=pages, max_body=max_body, **limits
    )
