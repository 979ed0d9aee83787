"""Benchmark: the serving path's overhead and the cost of the rejected single-app design.

Both parts run on one fresh private Ray head (CPU mode, 8 logical CPUs) that this script
starts with :func:`reconciler.testing.ray_head.start_head` and stops at the end, with the tiny
random-weight Llama generated into a temporary Hugging Face cache.

(a) **commit -> RUNNING**: one tiny model through the reconciler (a commit pushed to a bare
    repository, then :func:`reconciler.tick.tick` runs in-process every ``--poll`` s
    until it reports the model RUNNING) versus a direct ``PUT /api/serve/applications/`` of the
    same Serve config (the builder's model application plus the router), then ``GET`` every
    ``--poll`` s until the application is RUNNING. Runs alternate (reconciler, direct, ...),
    ``--runs`` each, the model is deleted between runs and the router stays. Target: ratio <= 1.1.

(b) **adding a third model**: two models served as ONE application built with Ray Serve LLM's
    own ``build_openai_app`` (both LLMConfigs in its ``args``) versus ours (one application per
    model behind the stable router, through the reconciler). A client loops on model A while
    the third model is added; counted: replicas of the *other* models (A, B) restarted (replica
    ids before/after) and failed requests.

Usage: ``.venv/bin/python bench/serve_latency.py [--part a|b|all] [--runs 3] [--poll 0.5]``.
Prints a markdown table per part.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reconciler.builders.serve import (  # noqa: E402
    app_name,
    llm_config,
    llm_deployment_name,
    model_app_config,
    normalise_app,
    router_app_config,
    serve_config,
)
from reconciler.dashboard import Dashboard  # noqa: E402
from reconciler.observe.capacity import observe_capacity  # noqa: E402
from reconciler.observe.serve import SERVE_APPS_PATH, observe_serve  # noqa: E402
from reconciler.spec.hashing import model_spec_hash  # noqa: E402
from reconciler.spec.types import ModelSpec, ObjectKey  # noqa: E402
from reconciler.testing.load import RequestLooper  # noqa: E402

GIT_ENV = {
    "GIT_AUTHOR_NAME": "bench",
    "GIT_AUTHOR_EMAIL": "bench@example.com",
    "GIT_COMMITTER_NAME": "bench",
    "GIT_COMMITTER_EMAIL": "bench@example.com",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_CONFIG_NOSYSTEM": "1",
}
ENGINE = {"max_model_len": 256, "dtype": "bfloat16", "enforce_eager": True}
TINY = "argus-test/tiny-llama"
USER = "bench"
TIMEOUT_S = 600.0
# After a delete, the old engine's processes are still exiting (CPU-bound on small machines):
# let them go before the next measured deploy, on both paths alike.
SETTLE_S = 10.0


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, env={**os.environ, **GIT_ENV})


class Repo:
    """A bare repository (what the reconciler reads) and a clone the bench pushes from."""

    def __init__(self, root: Path) -> None:
        self.bare, self.work = root / "config.git", root / "work"
        git(root, "init", "-q", "--bare", "-b", "main", str(self.bare))
        git(root, "clone", "-q", str(self.bare), str(self.work))
        git(self.work, "checkout", "-q", "-b", "main")

    def write(self, rel: str, data: dict[str, Any]) -> None:
        path = self.work / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(data, sort_keys=False))

    def remove(self, rel: str) -> None:
        (self.work / rel).unlink()

    def commit_push(self, message: str, *extra: str) -> None:
        git(self.work, "add", "-A")
        git(self.work, "commit", "-q", "--allow-empty", "-m", message, *extra)
        git(self.work, "push", "-q", "origin", "HEAD:main")


def model_doc() -> dict[str, Any]:
    return {"kind": "Model", "source": TINY, "replicas": 1, "engine_kwargs": dict(ENGINE)}


def wait(check: Callable[[], Any], what: str, poll: float, timeout: float = TIMEOUT_S) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(poll)


def details(dash: Dashboard) -> dict[str, Any]:
    return dash.get(SERVE_APPS_PATH) or {}


def replicas_by_deployment(dash: Dashboard, apps: list[str]) -> dict[str, set[str]]:
    """RUNNING replica ids per ``app/deployment`` of ``apps``."""
    out: dict[str, set[str]] = {}
    for name, app in (details(dash).get("applications") or {}).items():
        if name not in apps:
            continue
        for dep_name, dep in (app.get("deployments") or {}).items():
            out[f"{name}/{dep_name}"] = {
                r["replica_id"] for r in dep.get("replicas") or [] if r.get("state") == "RUNNING"
            }
    return out


def cpus_free(dash: Dashboard, total: float) -> bool:
    return observe_capacity(dash).available.get("CPU", 0.0) >= total


class Bench:
    def __init__(self, head: Any, hf_cache: Path, root: Path, poll: float) -> None:
        from reconciler.source.remote import open_source
        from tests.support import ticker

        self.head, self.poll = head, poll
        self.dash = Dashboard(head.dashboard_url)
        self.repo = Repo(root)
        users = root / "users"
        (users / USER).mkdir(parents=True)
        self.repo.write(
            "cluster.yaml",
            {
                "kind": "Cluster",
                "paths": {"common": str(hf_cache), "users": str(users)},
                "serving": {"accelerator": "cpu", "internal_http_port": head.serve_port, "cpus_per_replica": 1},
                "env": {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"},
            },
        )
        self.repo.commit_push("cluster")
        self.reconciler = ticker(open_source(str(self.repo.bare), str(root / "cache")), "main", self.dash)
        self.total_cpus = observe_capacity(self.dash).total.get("CPU", 0.0)

    # -- through the reconciler -------------------------------------------------------------
    def tick_until(self, done: Callable[[Any], bool], what: str) -> Any:
        while True:
            result = self.reconciler.tick()
            if result.failures:
                raise RuntimeError(f"apply failed: {result.failures}")
            for st in result.statuses.values():
                if st.state == "FAILED":
                    raise RuntimeError(f"{st.key} FAILED: {st.reason}")
            if done(result):
                return result
            time.sleep(self.poll)

    @staticmethod
    def running(result: Any, *names: str) -> bool:
        for name in names:
            st = result.statuses.get(ObjectKey(USER, "model", name))
            if st is None or st.state != "RUNNING" or not st.replicas_ready:
                return False
        return True

    def add_models(self, *names: str) -> float:
        """Commit model files, tick until all are RUNNING; return seconds from before the commit.

        ``self.put_after`` is set to the seconds from before the commit to the end of the
        first tick (the one that sent the PUT): the reconciler's own overhead."""
        start = time.monotonic()
        for name in names:
            self.repo.write(f"users/{USER}/models/{name}.yaml", model_doc())
        self.repo.commit_push(f"add {', '.join(names)}")
        first = self.reconciler.tick()
        if not first.serve_put:
            raise RuntimeError(f"the first tick did not PUT: {first.plan.to_json()}")
        self.put_after = time.monotonic() - start
        self.tick_until(lambda r: self.running(r, *names), f"{names} RUNNING")
        return time.monotonic() - start

    put_after = 0.0

    def delete_models(self, *names: str) -> None:
        for name in names:
            self.repo.remove(f"users/{USER}/models/{name}.yaml")
        # Deleting every object at once needs the mass-deletion guard's approval trailer.
        self.repo.commit_push(f"delete {', '.join(names)}", "-m", "Argus-Approve-Prune: yes")
        apps = {app_name(USER, n) for n in names}
        self.tick_until(
            lambda r: not apps & set(observe_serve(self.dash).statuses) and not r.plan.actions, f"{names} deleted"
        )
        wait(lambda: cpus_free(self.dash, self.total_cpus), "all CPUs free", self.poll)
        time.sleep(SETTLE_S)

    # -- direct PUT -------------------------------------------------------------------------
    def put(self, apps: list[dict[str, Any]]) -> None:
        self.dash.put(
            SERVE_APPS_PATH, serve_config(apps, self.reconciler.parts.revisions.read(fetch=False).desired.cluster)
        )

    def direct_deploy(self, body_apps: list[dict[str, Any]], app: str) -> float:
        start = time.monotonic()
        self.put(body_apps)

        def ready() -> bool:
            obs = observe_serve(self.dash)
            return obs.statuses.get(app) == "RUNNING" and bool(obs.replica_ids.get(app))

        wait(ready, f"{app} RUNNING", self.poll)
        return time.monotonic() - start

    def direct_delete(self, keep: list[dict[str, Any]], app: str) -> None:
        self.put(keep)
        wait(lambda: app not in observe_serve(self.dash).statuses, f"{app} deleted", self.poll)
        wait(lambda: cpus_free(self.dash, self.total_cpus), "all CPUs free", self.poll)
        time.sleep(SETTLE_S)

    def spec(self, name: str) -> ModelSpec:
        desired = self.reconciler.parts.revisions.read(fetch=False).desired
        return desired.models[ObjectKey(USER, "model", name)]


def part_a(b: Bench, runs: int) -> dict[str, list[float]]:
    log("(a) warm-up: router + one model through the reconciler (not measured)")
    b.add_models("tiny")
    cluster = b.reconciler.parts.revisions.read(fetch=False).desired.cluster
    spec = b.spec("tiny")
    assert spec.source_path
    model_app = model_app_config(spec, cluster, spec.source_path, model_spec_hash(spec, cluster))
    router = router_app_config(cluster, [model_app])  # what the reconciler PUTs: the table lists the model
    deployed = observe_serve(b.dash).apps[model_app["name"]]
    if normalise_app(deployed) != normalise_app(model_app):
        raise RuntimeError(f"the reconciler deployed {deployed}, the builder gives {model_app}")
    b.delete_models("tiny")
    times: dict[str, list[float]] = {"reconciler": [], "direct PUT": [], "reconciler: commit -> PUT sent": []}
    for i in range(runs):
        t = b.add_models("tiny")
        times["reconciler"].append(t)
        times["reconciler: commit -> PUT sent"].append(b.put_after)
        log(f"(a) run {i + 1}: reconciler {t:.1f} s (PUT sent after {b.put_after:.2f} s)")
        b.delete_models("tiny")
        t = b.direct_deploy([model_app, router], model_app["name"])
        times["direct PUT"].append(t)
        log(f"(a) run {i + 1}: direct PUT {t:.1f} s")
        b.direct_delete([router_app_config(cluster)], model_app["name"])
    return times


def change_with_client(
    b: Bench, model_a: str, others: list[str], change: Callable[[], None], settle: float = 3.0
) -> dict[str, Any]:
    """Run ``change`` while a client loops on ``model_a``; count other models' restarts."""
    apps = sorted({o.split("/")[0] for o in others})
    before = replicas_by_deployment(b.dash, apps)
    before = {k: v for k, v in before.items() if k in others}
    assert all(before.values()), before
    start = time.monotonic()
    import openai

    client = openai.OpenAI(base_url=b.head.serve_url + "/v1", api_key="none", max_retries=0, timeout=60)
    with RequestLooper(client, model_a) as looper:
        time.sleep(2)
        ok_before = looper.ok
        change()
        converge = time.monotonic() - start
        time.sleep(settle)
    after = replicas_by_deployment(b.dash, apps)
    restarted = sum(len(ids - after.get(k, set())) for k, ids in before.items())
    return {
        "restarted": restarted,
        "replicas": sum(len(v) for v in before.values()),
        "failed": len(looper.failures),
        "ok": looper.ok,
        "ok_before": ok_before,
        "seconds": converge,
        "errors": sorted(set(looper.failures)),
    }


def part_b(b: Bench) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    log("(b) ours: A and B, one application each, through the reconciler")
    b.add_models("a", "b")
    sa, sb = b.spec("a"), b.spec("b")
    others = [f"{app_name(USER, n)}/{llm_deployment_name(s.served_name)}" for n, s in (("a", sa), ("b", sb))]

    def add_c_ours() -> None:
        log("(b) ours: adding C")
        b.add_models("c")

    out["ours (one app per model)"] = change_with_client(b, sa.served_name, others, add_c_ours)
    sc = b.spec("c")
    cluster = b.reconciler.parts.revisions.read(fetch=False).desired.cluster
    b.delete_models("a", "b", "c")
    b.put([])  # the single app needs the "/" route the router holds
    wait(lambda: not observe_serve(b.dash).statuses, "no applications left", b.poll)

    def single(*specs: ModelSpec) -> dict[str, Any]:
        configs = [llm_config(s, cluster, s.source_path or "") for s in specs]
        return {
            "name": "single",
            "route_prefix": "/",
            "import_path": "ray.serve.llm:build_openai_app",
            "args": {"llm_configs": configs},
        }

    def single_running(*specs: ModelSpec) -> bool:
        obs = observe_serve(b.dash)
        reps = replicas_by_deployment(b.dash, ["single"])
        deps = [f"single/{llm_deployment_name(s.served_name)}" for s in specs]
        return obs.statuses.get("single") == "RUNNING" and all(reps.get(d) for d in deps)

    log("(b) single app: A and B in one build_openai_app application")
    b.put([single(sa, sb)])
    wait(lambda: single_running(sa, sb), "single app with A and B RUNNING", b.poll)
    wait(lambda: sa.served_name in _listed(b), "the single app to list A", b.poll, timeout=60)
    others = [f"single/{llm_deployment_name(s.served_name)}" for s in (sa, sb)]

    def add_c_single() -> None:
        log("(b) single app: adding C")
        b.put([single(sa, sb, sc)])
        wait(lambda: single_running(sa, sb, sc), "single app with A, B and C RUNNING", b.poll)

    out["single build_openai_app"] = change_with_client(b, sa.served_name, others, add_c_single)
    b.put([])
    return out


def _listed(b: Bench) -> set[str]:
    import openai

    client = openai.OpenAI(base_url=b.head.serve_url + "/v1", api_key="none", max_retries=0, timeout=30)
    try:
        return {m.id for m in client.models.list().data}
    except openai.OpenAIError:
        return set()


def table_a(times: dict[str, list[float]]) -> str:
    rows = ["| path | runs (s) | median (s) |", "|---|---|---|"]
    for name, ts in times.items():
        rows.append(f"| {name} | {', '.join(f'{t:.2f}' for t in ts)} | {statistics.median(ts):.2f} |")
    ratio = statistics.median(times["reconciler"]) / statistics.median(times["direct PUT"])
    rows.append(f"\nratio reconciler / direct (medians): **{ratio:.2f}** (target <= 1.1)")
    return "\n".join(rows)


def table_b(res: dict[str, dict[str, Any]]) -> str:
    rows = [
        "| design | other replicas restarted | failed requests to A | ok requests to A | add -> all RUNNING (s) |",
        "|---|---|---|---|---|",
    ]
    for name, r in res.items():
        errors = f" ({', '.join(r['errors'])})" if r["errors"] else ""
        rows.append(
            f"| {name} | {r['restarted']} of {r['replicas']} | {r['failed']}{errors} | {r['ok']} | {r['seconds']:.1f} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=["a", "b", "all"], default="all")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--poll", type=float, default=0.5, help="seconds between status polls (both paths)")
    args = parser.parse_args(argv)

    from reconciler.testing.ray_head import start_head
    from reconciler.testing.tiny_model import generate_tiny_llama

    root = Path(tempfile.mkdtemp(prefix="argus-bench-"))
    generate_tiny_llama(root / "hf")
    head = start_head(
        num_cpus=8,
        env={"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"},
    )
    log(f"head at {head.dashboard_url}, serve port {head.serve_port}")
    try:
        b = Bench(head, root / "hf", root, args.poll)
        if args.part in ("a", "all"):
            times = part_a(b, args.runs)
            print("\n### commit -> RUNNING, one tiny model (CPU)\n")
            print(table_a(times), flush=True)
        if args.part in ("b", "all"):
            res = part_b(b)
            print("\n### adding a third model while a client loops on model A\n")
            print(table_b(res), flush=True)
    finally:
        head.stop()
        shutil.rmtree(head.temp_dir, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
