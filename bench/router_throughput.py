"""Benchmark: argus's Ray-side router alone versus Ray Serve LLM's own ``build_openai_app`` ingress.

The router is called on Serve's proxy directly, without argus's endpoint in front (which now checks
keys, rules and limits outside Ray): ``bench/router_vs_ray.py`` measures the endpoint, Ray's ingress
and bare vLLM side by side.

One fresh private Ray head (CPU mode) runs, on one Serve instance:

- **ours**: the tiny model as an argus model application plus the ``argus-router``
  application at ``/`` with its default settings (autoscaling, two replicas minimum);
- **Ray's**: ``ray.serve.llm:build_openai_app`` with the same ``LLMConfig`` at ``/ray``, its
  ingress left at Ray's defaults (``DEFAULT_INGRESS_OPTIONS``: autoscaling).

Each path has its own vLLM engine of the same config. For 1, 8 and 32 concurrent clients
(threads with the official ``openai`` client, ``max_retries=0``, chat completions of
``--max-tokens`` tokens at temperature 0), rounds alternate between the two paths (the first
path alternates too), ``--seconds`` per path per round, ``--rounds`` rounds; only one path is
loaded at a time. Reported per level: throughput (requests/s, all rounds pooled) and p50/p95
latency, and the ratios ours / Ray's. Targets (issue 13): throughput >= 0.95x and
p50 <= 1.05x at every level. Any failed request is reported.

Usage: ``.venv/bin/python bench/router_throughput.py [--rounds 3] [--seconds 15]``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reconciler.builders.serve import llm_config, model_app_config, router_app_config, serve_config  # noqa: E402
from reconciler.dashboard import Dashboard  # noqa: E402
from reconciler.observe.serve import SERVE_APPS_PATH, observe_serve  # noqa: E402
from reconciler.spec.hashing import model_spec_hash  # noqa: E402
from reconciler.spec.types import ClusterSpec, ModelSpec, ObjectKey, Serving  # noqa: E402

ENGINE = {"max_model_len": 256, "dtype": "bfloat16", "enforce_eager": True}
LEVELS = (1, 8, 32)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run_clients(base_url: str, model: str, clients: int, seconds: float, max_tokens: int) -> dict[str, Any]:
    """``clients`` threads loop for ``seconds``; returns latencies and failures."""
    import openai

    latencies: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def loop() -> None:
        client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=120)
        while time.monotonic() < deadline:
            start = time.monotonic()
            try:
                client.chat.completions.create(
                    model=model,
                    messages=[{"role": "user", "content": "Say something."}],
                    max_tokens=max_tokens,
                    temperature=0,
                )
            except Exception as exc:  # counted, never hidden
                with lock:
                    failures.append(repr(exc)[:200])
                continue
            with lock:
                latencies.append(time.monotonic() - start)

    started = time.monotonic()
    threads = [threading.Thread(target=loop) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"latencies": latencies, "failures": failures, "elapsed": time.monotonic() - started}


def side_by_side(source: Path, serve_port: int) -> tuple[ClusterSpec, ModelSpec, dict[str, Any], dict[str, Any]]:
    """The CPU cluster, the model, argus's application of the tiny model at ``source`` and Ray Serve LLM's own
    ``build_openai_app`` of the same model under ``/ray``: what the router benches compare. Serve's proxy
    (``serving.internal_http_port``) is on ``serve_port``."""
    cluster = ClusterSpec(
        serving=Serving(accelerator="cpu", internal_http_port=serve_port, cpus_per_replica=1.0),
        env={"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"},
    )
    spec = ModelSpec(
        key=ObjectKey("bench", "model", "tiny"),
        source="bench/tiny",
        source_path=str(source),
        source_task=None,
        replicas=1,
        gpus_per_replica=1,
        engine_kwargs=ENGINE,
        env={},
        suspend=False,
        created_at=1764417600,
    )
    ours = model_app_config(spec, cluster, str(source), model_spec_hash(spec, cluster))
    theirs = {
        "name": "ray-openai",
        "route_prefix": "/ray",
        "import_path": "ray.serve.llm:build_openai_app",
        "args": {"llm_configs": [llm_config(spec, cluster, str(source))]},
    }
    return cluster, spec, ours, theirs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--max-tokens", type=int, default=8)
    args = parser.parse_args(argv)

    from reconciler.testing.ray_head import start_head
    from reconciler.testing.tiny_model import generate_tiny_llama

    root = Path(tempfile.mkdtemp(prefix="argus-router-bench-"))
    source = generate_tiny_llama(root / "hf")
    head = start_head(num_cpus=8, env={"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"})
    try:
        dash = Dashboard(head.dashboard_url)
        cluster, spec, ours, theirs = side_by_side(source, head.serve_port)
        dash.put(SERVE_APPS_PATH, serve_config([ours, router_app_config(cluster, [ours]), theirs], cluster))
        deadline = time.monotonic() + 900
        while True:
            statuses = observe_serve(dash).statuses
            if all(statuses.get(n) == "RUNNING" for n in (ours["name"], "argus-router", "ray-openai")):
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"apps did not reach RUNNING: {statuses}")
            time.sleep(2)
        log("all applications RUNNING")
        paths = {"ours": head.serve_url + "/v1", "ray": head.serve_url + "/ray/v1"}
        model = spec.served_name
        for name, url in paths.items():  # warm-up: routers have found the model, engines are hot
            for _ in range(60):
                res = run_clients(url, model, 1, 1.0, args.max_tokens)
                if res["latencies"] and not res["failures"]:
                    break
                time.sleep(1)
            run_clients(url, model, 4, 5.0, args.max_tokens)
            log(f"warmed up {name}")
        results: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for level in LEVELS:
            for r in range(args.rounds):
                order = ["ours", "ray"] if r % 2 == 0 else ["ray", "ours"]
                for name in order:
                    res = run_clients(paths[name], model, level, args.seconds, args.max_tokens)
                    results.setdefault((name, level), []).append(res)
                    log(
                        f"{name} x{level} round {r + 1}: {len(res['latencies']) / res['elapsed']:.1f} req/s, "
                        f"{len(res['failures'])} failed"
                    )
        rows = [
            "| clients | ours req/s | Ray's req/s | throughput ratio | ours p50 / p95 (ms) | Ray's p50 / p95 (ms) "
            "| p50 ratio | failed (ours/Ray's) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for level in LEVELS:
            stat: dict[str, tuple[float, float, float, int]] = {}
            for name in ("ours", "ray"):
                runs = results[(name, level)]
                lat = sorted(x for run in runs for x in run["latencies"])
                rate = sum(len(run["latencies"]) for run in runs) / sum(run["elapsed"] for run in runs)
                p50 = statistics.median(lat) * 1000
                p95 = lat[int(0.95 * (len(lat) - 1))] * 1000
                stat[name] = (rate, p50, p95, sum(len(run["failures"]) for run in runs))
            o, t = stat["ours"], stat["ray"]
            rows.append(
                f"| {level} | {o[0]:.1f} | {t[0]:.1f} | **{o[0] / t[0]:.2f}x** | {o[1]:.0f} / {o[2]:.0f} "
                f"| {t[1]:.0f} / {t[2]:.0f} | **{o[1] / t[1]:.2f}x** | {o[3]} / {t[3]} |"
            )
        print("\n### argus router vs Ray Serve LLM's build_openai_app ingress (same model, same Serve)\n")
        print("\n".join(rows), flush=True)
        details = dash.get(SERVE_APPS_PATH)["applications"]
        counts = {
            app: {d: len(v.get("replicas", [])) for d, v in details[app]["deployments"].items()}
            for app in ("argus-router", "ray-openai")
        }
        print(f"\nreplicas at the end: {counts}")
    finally:
        head.stop()
        shutil.rmtree(head.temp_dir, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
