"""A stand-in for the Ray dashboard's REST API, for fuzz tests of whole ticks (no Ray).

It answers the few endpoints argus calls the way Ray 2.60 does, including the failure
modes that matter: a body that is not JSON cannot be sent (the real client serialises it
first), a second job with the same submission id is refused with HTTP 500 "already exists",
a PUT with two applications of one name is refused with HTTP 400. Everything runs at once:
applications are RUNNING and jobs PENDING as soon as they are accepted.
"""

from __future__ import annotations

import collections
import copy
import io
import json
import re
import urllib.parse
from typing import Any

from reconciler.dashboard import Dashboard, DashboardError, RayStream

_JOB = re.compile(r"^/api/jobs/([^/]+)(/logs|/stop)?$")


PUT_BODIES_KEPT = 8  # the last PUT bodies kept for tests (a soak sends thousands)


class FakeRay(Dashboard):
    """``FakeRay(foreign_apps={...})``; ``puts`` and ``submits`` count what argus sent."""

    def __init__(
        self,
        *,
        foreign_apps: dict[str, dict[str, Any]] | None = None,
        gpus: float | None = None,
        base_url: str = "http://fake-ray",
        per_node: bool = False,
    ) -> None:
        super().__init__(base_url)
        self.per_node = per_node  # report its one node's usage as Ray does (a per-node view)
        self.apps: dict[str, dict[str, Any]] = copy.deepcopy(foreign_apps or {})
        self.jobs: dict[str, dict[str, Any]] = {}
        self.logs: dict[str, str] = {}  # submission id -> driver log text
        self.gpus = gpus  # None: no nodes reported (capacity unknown)
        self.puts = 0
        self.submits = 0
        self.http_options: dict[str, Any] | None = None
        # Apps deployed with ``serve.run`` (name -> route prefix or None), as Ray 2.60 treats them: a
        # PUT that leaves one out does not touch it; a PUT that names one makes it declarative.
        self.imperative: dict[str, str | None] = {}
        self.put_bodies: collections.deque[dict[str, Any]] = collections.deque(maxlen=PUT_BODIES_KEPT)

    def serve_run(self, name: str, route_prefix: str | None) -> None:
        """What a job's ``serve.run(app, name=name, route_prefix=route_prefix)`` leaves in Serve
        (it replaces a declarative app of the same name)."""
        self.apps.pop(name, None)
        self.imperative[name] = route_prefix

    def request(self, method: str, path: str, body: Any = None, *, timeout: float | None = None) -> Any:
        if body is not None:
            body = json.loads(json.dumps(body))  # what the real client would send, or TypeError
        if path == "/api/serve/applications/":
            return self._put(body) if method == "PUT" else self._serve()
        if path.startswith("/api/v0/nodes"):
            node = {"state": "ALIVE", "resources_total": self._totals(), "node_id": f"node-of-{self.base_url}"}
            return {"data": {"result": {"result": [] if self.gpus is None else [node]}}}
        if path == "/api/cluster_status":
            report: dict[str, Any] = {"usage": {}}
            if self.per_node:
                report["usageByNode"] = {f"node-of-{self.base_url}": {}}
            return {"data": {"clusterStatus": {"loadMetricsReport": report}}}
        if path == "/api/jobs/":
            return self._submit(body) if method == "POST" else [copy.deepcopy(j) for j in self.jobs.values()]
        match = _JOB.match(path)
        if match:
            sid, what = match.group(1), match.group(2)
            if sid not in self.jobs:
                raise DashboardError(method, path, 404, f"Job {sid} does not exist")
            if what == "/logs":
                return {"logs": self.logs.get(sid, "")}
            if what == "/stop":
                self.jobs[sid]["status"] = "STOPPED"
                return {"stopped": True}
            return copy.deepcopy(self.jobs[sid])
        raise DashboardError(method, path, 404, "not found")

    def stream(self, path: str, *, timeout: float | None = None) -> RayStream:
        """The state API's log endpoints: the last ``lines`` lines of a job's driver log."""
        route, _, raw = path.partition("?")
        query = dict(urllib.parse.parse_qsl(raw))
        sid = query.get("filename", "").removeprefix("job-driver-").removesuffix(".log")
        known = route in ("/api/v0/logs/file", "/api/v0/logs/stream") and sid in self.jobs
        if not known or query.get("node_id") != self.jobs[sid].get("driver_node_id"):
            raise DashboardError("GET", path, 500, f"no log file for {query}")
        lines = self.logs.get(sid, "").splitlines(keepends=True)[-int(query.get("lines", 1000)) :]
        return io.BytesIO("".join(lines).encode())  # type: ignore[return-value]

    def _totals(self) -> dict[str, float]:
        return {"CPU": 1e6, "GPU": float(self.gpus or 0), "worker_node": 1e6, "memory": 1e12}

    def _serve(self) -> dict[str, Any]:
        apps = {}
        for name, config in self.apps.items():
            deployments = {
                d["name"]: {"status": "HEALTHY", "replicas": [{"state": "RUNNING", "replica_id": f"{name}#1"}]}
                for d in config.get("deployments") or []
                if isinstance(d, dict) and isinstance(d.get("name"), str)  # Ray would refuse the rest
            }
            apps[name] = {
                "name": name,
                "status": "RUNNING",
                "message": "",
                "source": "declarative",
                "deployed_app_config": copy.deepcopy(config),
                "deployments": deployments,
                "last_deployed_time_s": 0.0,
                "route_prefix": config.get("route_prefix", "/"),
            }
        for name, route in self.imperative.items():
            apps[name] = {
                "name": name,
                "status": "RUNNING",
                "message": "",
                "source": "imperative",
                "deployed_app_config": None,
                "deployments": {"Shadow": {"status": "HEALTHY", "replicas": [{"state": "RUNNING", "replica_id": "s"}]}},
                "last_deployed_time_s": 0.0,
                "route_prefix": route,
            }
        return {"applications": apps, "http_options": self.http_options, "proxy_location": "EveryNode"}

    def _put(self, body: dict[str, Any]) -> None:
        names = [a["name"] for a in body["applications"]]
        if len(names) != len(set(names)):
            raise DashboardError("PUT", "/api/serve/applications/", 400, "Application names must be unique")
        self.puts += 1
        self.put_bodies.append(body)
        self.http_options = body.get("http_options")
        self.apps = {a["name"]: a for a in body["applications"]}
        for name in names:  # named: declarative from now on (Ray's apply_app_config)
            self.imperative.pop(name, None)

    def _submit(self, body: dict[str, Any]) -> dict[str, Any]:
        sid = body["submission_id"]
        if sid in self.jobs:
            raise DashboardError("POST", "/api/jobs/", 500, f"Job with submission_id {sid} already exists.")
        self.submits += 1
        self.jobs[sid] = {
            **body,
            "status": "PENDING",
            "message": "",
            "start_time": None,
            "end_time": None,
            "driver_node_id": "fake-node",
        }
        return {"submission_id": sid}
