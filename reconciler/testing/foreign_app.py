"""A trivial Serve application that argus does not own, for tests: ``reconciler.testing.foreign_app:app``.

Run as a Ray job's entrypoint (``python -m reconciler.testing.foreign_app OUT NAME=ROUTE ...``), it is
what hostile code in a job does with nothing but the cluster's token: ``serve.run`` the app under each
``NAME`` at ``ROUTE`` (``-``: no HTTP route), an argus name included (it replaces that application).
Each deployment's outcome is appended to the file ``OUT`` as one JSON line: ``name``, ``route``,
``returned`` (epoch seconds when ``serve.run`` returned) or ``error``.
"""

from __future__ import annotations

import json
import sys
import time

from ray import serve
from starlette.requests import Request


@serve.deployment(ray_actor_options={"num_cpus": 0})
class Echo:
    """Answers every request with ``{"foreign": true, "path": ...}``."""

    async def __call__(self, request: Request) -> dict[str, object]:
        return {"foreign": True, "path": request.url.path}


app = Echo.bind()  # type: ignore[attr-defined]  # serve.deployment returns a Deployment


def deploy(out: str, specs: list[str]) -> int:
    """``serve.run`` the Echo app as each ``NAME=ROUTE`` of ``specs`` says, recording each outcome
    in ``out``. Returns 0 (a refused deployment is recorded, not raised)."""
    for spec in specs:
        name, _, route = spec.partition("=")
        prefix = None if route == "-" else route
        record: dict[str, object] = {"name": name, "route": prefix}
        try:
            serve.run(Echo.bind(), name=name, route_prefix=prefix)  # type: ignore[attr-defined]
            record["returned"] = time.time()
        except Exception as exc:  # Serve refuses some (a route another app holds): recorded
            record["error"] = repr(exc)[:500]
        with open(out, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(deploy(sys.argv[1], sys.argv[2:]))
