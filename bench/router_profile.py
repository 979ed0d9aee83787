"""The argus router under cProfile, for ``bench/router_vs_ray.py --profile DIR`` only.

``import_path: bench.router_profile:build_router`` (the bench's Ray head has the checkout on its
PYTHONPATH). Each replica profiles its user-code event loop thread, where the ingress, FastAPI
and the response stream run (Ray's handle routing runs on its own loop thread, not profiled), and
writes ``router-<pid>.prof`` into ``args["dir"]`` every 5 s.
"""

from __future__ import annotations

import asyncio
import cProfile
import os
from pathlib import Path
from typing import Any

from ray.serve.deployment import Application
from ray.serve.handle import DeploymentHandle

from reconciler.serve_apps.router import ArgusIngress, router_application

DUMP_EVERY_S = 5.0


class ProfiledIngress(ArgusIngress):
    def __init__(self, meter: DeploymentHandle | None, dir: str) -> None:
        super().__init__(meter)
        self._dir = Path(dir)
        self._profiler: cProfile.Profile | None = None

    async def reconfigure(self, user_config: Any) -> None:
        await super().reconfigure(user_config)
        if self._profiler is None:  # on the replica's user event loop thread
            self._profiler = cProfile.Profile()
            self._profiler.enable()
            asyncio.get_running_loop().create_task(self._dump_loop())

    async def _dump_loop(self) -> None:
        assert self._profiler is not None
        while True:
            await asyncio.sleep(DUMP_EVERY_S)
            self._profiler.dump_stats(str(self._dir / f"router-{os.getpid()}.prof"))  # disables it
            self._profiler.enable()


def build_router(args: dict[str, Any]) -> Application:
    """The router application with profiled replicas writing into ``args["dir"]``."""
    return router_application(ProfiledIngress, args["dir"])
