"""CPU time per push tick at 1k/10k/100k objects, without Ray (the dashboard stand-in answers).

For each size, a bare repository of ``users`` x (5 models + 5 tasks), all suspended (as in
``bench/daemon_latency.py``), is read by a real :class:`~reconciler.loop.Daemon` (real git, real
status branch writer, :class:`tests.unit.fake_ray.FakeRay` in place of Ray's REST API). After the
first tick, ``--pushes`` pushes each add one task; each push tick is measured in CPU seconds of
this process (and its git children), split into the load (read the commit, validate) and the tick
(observe, plan, apply, assess), and the status write that follows. A slope near zero from 1k to
100k objects shows that a push tick costs what the push changed.

Usage: PYTHONPATH=. .venv/bin/python bench/tick_cpu.py [--sizes 100,1000,10000] [--pushes 10]
[--profile SIZE]  (prints cProfile's top functions of one more push tick at that size)
[--timer N]  (also N timer ticks after the pushes, as the loop runs them every --observe-interval
with nothing pushed and the file system unchanged: refresh_fs + forget_capacity + a tick with its
status write; the median CPU, refresh_fs's part of it and how many user folders each re-loaded)
[--plan-only]  (only plan + assess of each push, full against :class:`IncrementalPlanner`, in process:
the same objects suspended, then all running in sync with Ray's objects rebuilt for every push)
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import pstats
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


from reconciler.daemon import build_parts  # noqa: E402
from reconciler.loop import Daemon, tune_gc  # noqa: E402
from reconciler.plan.actual import ActualJob, ActualModel, ActualState, Capacity  # noqa: E402
from reconciler.plan.assess import assess  # noqa: E402
from reconciler.plan.incremental import IncrementalPlanner  # noqa: E402
from reconciler.plan.planner import plan  # noqa: E402
from reconciler.server import Metrics  # noqa: E402
from reconciler.source.remote import open_source  # noqa: E402
from reconciler.spec.hashing import model_spec_hash, submission_id, task_spec_hash  # noqa: E402
from reconciler.spec.incremental import IncrementalLoader  # noqa: E402
from reconciler.spec.loader import SourceFile  # noqa: E402
from reconciler.spec.types import DesiredState  # noqa: E402
from reconciler.status.writer import StatusWriter  # noqa: E402
from reconciler.tick import tick  # noqa: E402
from tests.support import ConfigRepo, add_suspended_objects, cluster_yaml  # noqa: E402
from tests.unit.fake_ray import FakeRay  # noqa: E402


def cpu_seconds() -> float:
    child = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + child.ru_utime + child.ru_stime


def make_repo(root: Path, objects: int) -> ConfigRepo:
    """A repository of ``objects`` suspended objects (5 models + 5 tasks per user)."""
    root.mkdir(parents=True)
    repo = ConfigRepo(root)
    home = root / "users-home"
    (home / "bench").mkdir(parents=True)
    repo.write("cluster.yaml", cluster_yaml(root / "hf", home, 8000))
    add_suspended_objects(repo, home, max(0, objects // 10))
    repo.commit_push(f"{objects} objects")
    return repo


def bench_daemon(repo: ConfigRepo, root: Path) -> Daemon:
    """The daemon the benches tick in process: the real parts and status writer on ``repo``, the
    dashboard stand-in for Ray (64 GPUs), caches and state under ``root``."""
    source = open_source(str(repo.bare), str(root / "cache"))
    parts = build_parts(
        source,
        "main",
        FakeRay(gpus=64),
        secrets_env={},
        task_check=lambda t, c: [],
        model_check=lambda m, c: [],
        state_dir=str(root / "state"),
    )
    return Daemon(parts, StatusWriter(source), metrics=Metrics())


def measure(root: Path, objects: int, pushes: int, profile: bool, timers: int = 0) -> dict[str, float]:
    t0 = time.perf_counter()
    repo = make_repo(root, objects)
    made = time.perf_counter() - t0
    daemon = bench_daemon(repo, root)
    tune_gc()  # as Daemon.run does
    parts = daemon.parts  # with the status writer's records
    start = cpu_seconds()
    assert daemon.run_once() == 0.0, daemon.last_error or daemon.tick_exception
    first = cpu_seconds() - start
    loads, ticks, reports = [], [], []
    prof = cProfile.Profile() if profile else None
    # The profiled push is one more, after the measured ones: the profiler's own overhead
    # (about 2x) stays out of the medians.
    for i in range(pushes + (1 if prof else 0)):
        repo.write(f"users/bench/tasks/t{i:03d}.yaml", {"kind": "Task", "workload": "command", "command": "true"})
        repo.commit_push(f"task {i}")
        profiled = prof is not None and i == pushes
        if prof and profiled:
            prof.enable()
        a = cpu_seconds()
        revision = parts.revisions.read(fetch=False)
        b = cpu_seconds()
        result, daemon.memory = tick(parts, revision, parts.observe(revision), daemon.memory)
        daemon.collect(pushed=True)  # as the loop does after a push tick (a full collection waits for a timer tick)
        c = cpu_seconds()
        daemon.reporter.report(result)
        d = cpu_seconds()
        if prof and profiled:
            prof.disable()
        assert any(f"-t{i:03d}-" in sid for sid in parts.dash.jobs), "the pushed task was not submitted"  # type: ignore[attr-defined]
        if profiled:
            continue
        loads.append(b - a)
        ticks.append(c - b)
        reports.append(d - c)
        # Each push on its own: the first ones after a start also read back the first status
        # commit's run records and run the first full collection (not steady state).
        each = f"load {b - a:.3f} s, tick {c - b:.3f} s, report {d - c:.3f} s"
        print(f"{objects:,} objects, push {i}: {each}", file=sys.stderr)
    if prof:
        out = io.StringIO()
        print(f"-- cProfile of one push tick at {objects:,} objects (after {pushes} measured ones)", file=sys.stderr)
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(35)
        print(out.getvalue(), file=sys.stderr)
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
        print(out.getvalue(), file=sys.stderr)
    timed: list[float] = []
    refreshes: list[float] = []
    reloaded: list[int] = []
    loader = parts.revisions._loader
    for _ in range(timers):  # what Daemon.run does when its wait times out (nothing pushed)
        a, folders = cpu_seconds(), loader.folders_loaded
        parts.revisions.refresh_fs()
        refreshes.append(cpu_seconds() - a)
        parts.observer.forget_capacity()
        assert daemon.run_once() == 0.0, daemon.last_error or daemon.tick_exception
        timed.append(cpu_seconds() - a)
        reloaded.append(loader.folders_loaded - folders)
    daemon.close()
    return {
        "timer": statistics.median(timed) if timed else float("nan"),
        "timer_folders": statistics.median(reloaded) if reloaded else float("nan"),
        "timer_refresh": statistics.median(refreshes) if refreshes else float("nan"),
        "generate": made,
        "first": first,
        "load": statistics.median(loads),
        "tick": statistics.median(ticks),
        "report": statistics.median(reports),
        "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def plan_only(objects: int, pushes: int, running: bool) -> dict[str, float]:
    """Median CPU ms of plan + assess per one-file push at ``objects``: full and incremental."""
    import yaml

    cluster = yaml.safe_dump({"kind": "Cluster", "paths": {"common": "/hf", "users": "/home"}}).encode()
    model = yaml.safe_dump({"kind": "Model", "source": "$HOME/models/m", "suspend": not running}).encode()
    task = yaml.safe_dump({"kind": "Task", "workload": "command", "command": "true", "suspend": not running}).encode()
    files = [SourceFile("cluster.yaml", cluster, "c")]
    for u in range(max(1, objects // 10)):
        for i in range(5):
            files.append(SourceFile(f"users/user{u:05d}/models/m{i}.yaml", model, "m"))
            files.append(SourceFile(f"users/user{u:05d}/tasks/t{i}.yaml", task, "t"))
    loader, inc = IncrementalLoader(), IncrementalPlanner()

    def ray(desired: DesiredState) -> ActualState:  # rebuilt on every call, as the observers do
        actual = ActualState(capacity=Capacity({"GPU": 1e9, "CPU": 1e9, "worker_node": 1e9}, {"GPU": 1e9}))
        if running:
            for key, m in desired.models.items():
                digest = model_spec_hash(m, desired.cluster)
                per = {"GPU": 1.0}
                actual.models[key] = ActualModel(key, m.served_name, digest, m.replicas, m.replicas, "RUNNING", "", per)
            for key, t in desired.tasks.items():
                actual.jobs.append(ActualJob(submission_id(t), key, task_spec_hash(t), "SUCCEEDED", end_time=1))
        return actual

    times: dict[str, list[float]] = {"full": [], "incremental": []}
    for i in range(pushes + 1):
        files.append(SourceFile(f"users/user00000/tasks/push{i:03d}.yaml", task, f"p{i}"))
        desired = loader.load(sorted(files, key=lambda f: f.path), default_time=1767225600)
        actual = ray(desired)
        for name, planner, assessor in (("full", plan, assess), ("incremental", inc.plan, inc.assess)):
            gc.collect()
            start = time.process_time()
            assessor(desired, actual, planner(desired, actual, now=1767229200))
            if i:  # the first call fills the memo
                times[name].append(time.process_time() - start)
    return {name: statistics.median(t) * 1000 for name, t in times.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--pushes", type=int, default=10)
    parser.add_argument("--profile", type=int, default=None, help="profile the push ticks at this size")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--timer", type=int, default=0, help="also time this many timer ticks (nothing changed)")
    parser.add_argument("--plan-only", action="store_true", help="time plan + assess alone: full vs incremental")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")] if args.one is None else [args.one]
    if args.plan_only:
        print(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; plan + assess, medians of {args.pushes} pushes\n")
        print("| objects | all suspended: full | incremental | all running: full | incremental |")
        print("|---|---|---|---|---|")
        for n in sizes:
            idle, busy = plan_only(n, args.pushes, False), plan_only(n, args.pushes, True)
            print(
                f"| {n:,} | {idle['full']:.0f} ms | {idle['incremental']:.0f} ms "
                f"| {busy['full']:.0f} ms | {busy['incremental']:.0f} ms |"
            )
        return 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="argus-tickcpu-", ignore_cleanup_errors=True) as tmp:
        for n in sizes:
            gc.collect()
            rows.append((n, measure(Path(tmp) / str(n), n, args.pushes, args.profile == n, args.timer)))
            print(f"{n}: {rows[-1][1]}", file=sys.stderr)
    print(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; medians of {args.pushes} one-file pushes\n")
    timer_head = f" timer tick CPU (median of {args.timer}) | of it refresh_fs | folders re-loaded |"
    timer_head = timer_head if args.timer else ""
    print(
        "| objects | first tick CPU | push tick CPU: load | tick | status write | total |"
        f"{timer_head} peak RSS (all sizes so far) |"
    )
    print("|---|---|---|---|---|---|" + ("---|---|---|" if args.timer else "") + "---|")
    for n, r in rows:
        total = r["load"] + r["tick"] + r["report"]
        timer_cell = (
            f" {r['timer'] * 1000:.0f} ms | {r['timer_refresh'] * 1000:.0f} ms | {r['timer_folders']:.0f} |"
            if args.timer
            else ""
        )
        print(
            f"| {n:,} | {r['first']:.1f} s | {r['load'] * 1000:.0f} ms | {r['tick'] * 1000:.0f} ms "
            f"| {r['report'] * 1000:.0f} ms | {total * 1000:.0f} ms |{timer_cell} {r['rss']:.0f} MB |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
