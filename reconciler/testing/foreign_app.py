"""A trivial Serve application that argus does not own, for tests: ``reconciler.testing.foreign_app:app``."""

from __future__ import annotations

from ray import serve
from starlette.requests import Request


@serve.deployment(ray_actor_options={"num_cpus": 0})
class Echo:
    """Answers every request with ``{"foreign": true, "path": ...}``."""

    async def __call__(self, request: Request) -> dict[str, object]:
        return {"foreign": True, "path": request.url.path}


app = Echo.bind()  # type: ignore[attr-defined]  # serve.deployment returns a Deployment
