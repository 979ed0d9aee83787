"""The daemon's side of the OpenAI endpoint: the meter, the latest gate config, and where they go. I/O.

One :class:`EndpointHub` per daemon (the composition root makes it). Each tick the applier hands
it the gate config (:meth:`publish`). It then

- serves the endpoint in this process (``listen``: ``auto`` binds ``0.0.0.0`` at cluster.yaml's
  ``serving.http_port`` on the first tick, ``HOST:PORT`` binds that, None: no endpoint here), and
- serves the private link (``link``: a Unix socket path, reconciler/endpoint/link.py) from which
  ``argus endpoint`` processes take the gate config and sync their counts with this daemon's
  meter.

The usage recorder reads the meter's rows (:meth:`usage`) in the daemon's own process: no
credential travels anywhere for it.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from reconciler.endpoint.link import serve_link
from reconciler.endpoint.meter import Meter
from reconciler.endpoint.server import Endpoint
from reconciler.endpoint.service import SiteThread, start_site
from reconciler.spec.types import ClusterSpec

log = logging.getLogger("argus")

BIND_RETRY_S = 30.0  # a port that could not be bound is tried again this long after
AUTO = "auto"


def parse_listen(text: str, http_port: int) -> tuple[str, int]:
    """``(host, port)`` of a listen setting: ``auto`` (0.0.0.0 at ``http_port``) or ``HOST:PORT``.
    Raises ValueError for anything else."""
    if text == AUTO:
        return "0.0.0.0", http_port
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"not HOST:PORT or {AUTO}: {text!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


class EndpointHub:
    """See the module docstring. ``upstream(cluster)``: Serve's internal proxy URL."""

    def __init__(
        self,
        upstream: Callable[[ClusterSpec], str],
        *,
        listen: str | None = AUTO,
        link: str | None = None,
        meter: Meter | None = None,
    ) -> None:
        self.meter = meter or Meter()
        self.upstream = upstream
        self.listen = listen
        self.link = link
        self.endpoint: Endpoint | None = None
        self._thread: SiteThread | None = None
        self._bind_failed_at = float("-inf")
        self._lock = threading.Lock()
        self._epoch = uuid.uuid4().hex[:12]  # a restarted daemon's gates are new to every endpoint
        self._version = 0
        self._config: dict[str, Any] | None = None
        self._link_thread: SiteThread | None = None
        if listen is not None:
            parse_listen(listen, 1)  # a malformed setting fails at start, not at the first tick

    def gate(self) -> tuple[str, dict[str, Any] | None]:
        """``(version, config)`` of the latest gate config (None: none yet); the version is
        ``<epoch>.<count>``, this daemon's random epoch and how many gates it made."""
        with self._lock:
            return f"{self._epoch}.{self._version}", self._config

    def publish(self, config: dict[str, Any], cluster: ClusterSpec) -> None:
        """Take this tick's gate config; start the endpoint on the first call. Never raises: a port
        that cannot be bound is logged and tried again BIND_RETRY_S later."""
        with self._lock:
            changed = config != self._config
            if changed:
                self._version += 1
                self._config = config
        if self.listen is not None and self._thread is None:
            self._start(cluster)
        elif self.endpoint is not None:
            self.endpoint.upstream = self.upstream(cluster).rstrip("/")
            if changed:  # parsing a gate is O(keys + models): only when it changed
                self.endpoint.publish(config)

    def _start(self, cluster: ClusterSpec) -> None:
        if time.monotonic() - self._bind_failed_at < BIND_RETRY_S or self.listen is None:
            return
        host, port = parse_listen(self.listen, cluster.serving.http_port)
        endpoint = Endpoint(self.upstream(cluster), self.meter.link)
        endpoint.publish(self._config)
        thread = SiteThread(lambda: start_site(endpoint, host, port), "argus-endpoint")
        try:
            thread.start()
        except (OSError, TimeoutError) as exc:
            self._bind_failed_at = time.monotonic()
            log.error("argus endpoint: cannot serve on %s:%d: %s (retried in %.0f s)", host, port, exc, BIND_RETRY_S)
            return
        self.endpoint, self._thread = endpoint, thread
        log.info("argus endpoint: serving the OpenAI API on %s:%d, Serve's proxy at %s", host, port, endpoint.upstream)

    def start_link(self) -> None:
        """Serve the private link (when ``link`` is set). Raises OSError when the socket cannot be made."""
        if self.link is None or self._link_thread is not None:
            return
        path = self.link
        thread = SiteThread(lambda: serve_link(self.meter, self.gate, path), "argus-link")
        thread.start()
        self._link_thread = thread

    def usage(self) -> dict[str, Any]:
        """The meter's usage rows (MeterState.usage's document)."""
        return self.meter.usage()

    def close(self) -> None:
        """Stop the endpoint and the link (the daemon's shutdown)."""
        if self._thread is not None:
            self._thread.stop()
            self._thread = None
        if self._link_thread is not None:
            self._link_thread.stop()
            self._link_thread = None
