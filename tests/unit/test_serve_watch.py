"""The watch on Serve between ticks (reconciler/observe/serve_watch.py): a shadow application, a
take-over or a changed config wakes the loop at once; replicas coming up, or nothing, do not; a
failing read is skipped."""

from __future__ import annotations

import threading
import time
from typing import Any

from reconciler.observe.serve_watch import ServeWatch, fingerprint


class Dash:
    """A dashboard stand-in answering ``GET /api/serve/applications/`` with ``details``."""

    def __init__(self) -> None:
        self.details: dict[str, Any] = {"applications": {"argus-router": self.app("/", "declarative", 1)}}
        self.fail = False

    @staticmethod
    def app(route: str | None, source: str, table: int, status: str = "RUNNING") -> dict[str, Any]:
        return {"route_prefix": route, "source": source, "status": status, "deployed_app_config": {"args": table}}

    def get(self, path: str) -> Any:
        if self.fail:
            raise OSError("the dashboard is away")
        return self.details


def test_a_shadow_a_take_over_or_a_new_config_wakes_and_nothing_else_does() -> None:
    dash, woken = Dash(), []
    watch = ServeWatch(dash, lambda: woken.append(1), threading.Event(), 1.0)  # type: ignore[arg-type]
    assert not watch.check()  # the first read is the baseline
    dash.details["applications"]["argus-router"]["status"] = "DEPLOYING"
    assert not watch.check(), "a status change is the ticks' business"
    dash.details["applications"]["metrics-cache"] = Dash.app("/argus", "imperative", 0)
    assert watch.check() and woken == [1]
    assert not watch.check()
    dash.details["applications"]["argus-router"] = Dash.app("/", "imperative", 1)  # a take-over
    assert watch.check()
    dash.details["applications"]["argus-router"] = Dash.app("/", "declarative", 2)
    assert watch.check()
    dash.fail = True
    assert not watch.check()  # skipped, never raised
    assert len(woken) == 3
    assert fingerprint(None) == fingerprint({"applications": "junk"})


def test_the_watch_thread_wakes_the_loop_and_stops_with_it() -> None:
    dash, wake, stop = Dash(), threading.Event(), threading.Event()
    thread = ServeWatch(dash, wake.set, stop, 0.2).start()  # type: ignore[arg-type]
    time.sleep(0.5)
    dash.details["applications"]["spy"] = Dash.app("/v1", "imperative", 0)
    assert wake.wait(3.0), "a shadow did not wake the loop"
    stop.set()
    thread.join(2.0)
    assert not thread.is_alive()
