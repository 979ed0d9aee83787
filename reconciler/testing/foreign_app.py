"""A trivial Serve application that argus does not own, for tests: ``reconciler.testing.foreign_app:app``.

Run as a Ray job's entrypoint (``python -m reconciler.testing.foreign_app OUT NAME=ROUTE ...``), it is
what hostile code in a job does with nothing but the cluster's token: ``serve.run`` the app under each
``NAME`` at ``ROUTE`` (``-``: no HTTP route), an argus name included (it replaces that application).
Each deployment's outcome is appended to the file ``OUT`` as one JSON line: ``name``, ``route``,
``sent``, then ``returned`` (epoch seconds when it ran: when ``serve.run`` would return), ``gone``
(removed before it ran) or ``error``.
"""

from __future__ import annotations

import json
import sys
import time

from ray import serve
from starlette.requests import Request

# How long the job waits for one of its applications to run, and how often it looks.
RUN_WAIT_S = 120.0
POLL_S = 0.1


@serve.deployment(ray_actor_options={"num_cpus": 0})
class Echo:
    """Answers every request with ``{"foreign": true, "path": ...}``."""

    async def __call__(self, request: Request) -> dict[str, object]:
        return {"foreign": True, "path": request.url.path}


app = Echo.bind()  # type: ignore[attr-defined]  # serve.deployment returns a Deployment


def deploy(out: str, specs: list[str]) -> int:
    """Deploy the Echo app as each ``NAME=ROUTE`` of ``specs`` says, recording each outcome in
    ``out``. Returns 0 (a refused deployment is recorded, not raised).

    ``serve.run`` would wait for the application to run, and never return when it is removed
    before (its wait loop does not notice); so the deployment is sent without waiting and its
    status polled here: ``returned`` is when it first runs (what ``serve.run`` returning means),
    ``gone`` when it was removed before it ran (within RUN_WAIT_S).
    """
    from ray.serve.api import _run

    for spec in specs:
        name, _, route = spec.partition("=")
        prefix = None if route == "-" else route
        record: dict[str, object] = {"name": name, "route": prefix}
        try:
            _run(Echo.bind(), _blocking=False, name=name, route_prefix=prefix)  # type: ignore[attr-defined]
            record["sent"] = time.time()
            record.update(_wait_running(name))
        except Exception as exc:  # Serve refuses some (a route another app holds): recorded
            record["error"] = repr(exc)[:500]
        with open(out, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
    return 0


def _wait_running(name: str) -> dict[str, object]:
    """``{"returned": t}`` when this job's ``name`` runs (epoch s), ``{"gone": t}`` when it is no
    longer this job's app first (deleted, failed, or taken over: it runs other deployments than
    Echo), ``{"timeout": RUN_WAIT_S}`` otherwise."""
    deadline = time.monotonic() + RUN_WAIT_S
    seen = False
    while time.monotonic() < deadline:
        app = serve.status().applications.get(name)
        ours = app is not None and "Echo" in app.deployments
        seen = seen or ours
        if app is None or app.status in ("DELETING", "DEPLOY_FAILED") or (seen and not ours):
            return {"gone": time.time()}
        if app.status == "RUNNING" and ours:
            return {"returned": time.time()}
        time.sleep(POLL_S)
    return {"timeout": RUN_WAIT_S}


if __name__ == "__main__":
    sys.exit(deploy(sys.argv[1], sys.argv[2:]))
