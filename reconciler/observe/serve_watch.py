"""A light watch on Serve between ticks: a changed application set wakes the loop. I/O.

Any job can deploy a Serve application at a route (a shadow that catches requests meant for argus's
router) or take over one of argus's; the daemon removes or restores it on its next tick
(reconciler/plan/serve_kept.py). Ticks come every ``--observe-interval`` seconds (5 by default), so
between them a shadow could live one interval and a tick. :class:`ServeWatch` reads
``GET /api/serve/applications/`` every ``interval`` seconds (1 by default) and calls ``wake`` when the
applications' names, kinds (imperative or not), routes or deployed configs differ from its last read:
the window is then about a second and a tick. Its own memory is one fingerprint; argus's own changes
wake one extra (push) tick. A failed read is skipped (the ticks report Ray's outages).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from reconciler.dashboard import Dashboard
from reconciler.observe.serve import SERVE_APPS_PATH

log = logging.getLogger("argus")

WATCH_S = 1.0  # the default interval between two reads
MIN_WATCH_S = 0.2  # an interval below this is this


def fingerprint(details: Any) -> str:
    """A digest of what a ``GET /api/serve/applications/`` answer says of each application: its name,
    whether it is imperative, its route and its deployed config (not its status: replicas coming up
    wake nothing). Pure; never raises."""
    apps = details.get("applications") if isinstance(details, Mapping) else None
    rows = []
    for name, app in sorted((apps or {}).items()) if isinstance(apps, Mapping) else ():
        if not isinstance(app, Mapping):
            continue
        rows.append([str(name), str(app.get("source")), str(app.get("route_prefix")), app.get("deployed_app_config")])
    return hashlib.sha256(json.dumps(rows, sort_keys=True, default=str).encode()).hexdigest()


class ServeWatch:
    """Reads Serve every ``interval`` seconds in a thread of its own and calls ``wake`` on a change,
    until ``stop`` is set."""

    def __init__(
        self,
        dash: Dashboard | Callable[[], Dashboard | None],
        wake: Callable[[], None],
        stop: threading.Event,
        interval: float,
    ) -> None:
        # A callable: the dashboard to read now (the serving cluster can change with cluster.yaml;
        # None: not known yet, nothing is read).
        self._dash: Callable[[], Dashboard | None] = dash if callable(dash) else (lambda: dash)
        self.wake = wake
        self.stop = stop
        self.interval = max(interval, MIN_WATCH_S)
        self._last: str | None = None

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._loop, name="argus-serve-watch", daemon=True)
        thread.start()
        return thread

    def check(self) -> bool:
        """Read Serve once; True (after calling ``wake``) when it changed since the last read."""
        dash = self._dash()
        if dash is None:
            return False
        try:
            seen = fingerprint(dash.get(SERVE_APPS_PATH) or {})
        except Exception as exc:  # Ray away or slow: the ticks say so; the watch reads again later
            log.debug("serve watch: %r", exc)
            return False
        changed = self._last is not None and seen != self._last
        self._last = seen
        if changed:
            self.wake()
        return changed

    def _loop(self) -> None:
        while not self.stop.wait(self.interval):
            self.check()
