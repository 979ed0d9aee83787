"""Where a daemon's memory goes at 10,000 or 100,000 objects: tracemalloc's top lines per phase.

The same set-up as ``bench/tick_cpu.py`` (a real :class:`~reconciler.loop.Daemon` on a real bare
repository of ``--objects`` suspended objects and its status branch, the dashboard stand-in in
place of Ray), run phase by phase as the daemon's loop runs them: the first load, the first tick,
the first status write (``Daemon.collect()`` after every tick, as ``Daemon.run_once``), ``--pushes`` push ticks,
then ``--timer-ticks`` timer ticks (``refresh_fs()``: a full re-load each, as every
``--observe-interval`` seconds). After each phase it prints the traced
memory now and the phase's traced peak, VmRSS and VmHWM, and tracemalloc's top ``--top`` lines
(what is alive at the end of the phase); after the first status write and at the end, also what
the phase added (the diff to the previous snapshot). ``--no-trace`` gives the RSS figures without
tracemalloc's own overhead (about 2x).

Usage: PYTHONPATH=. .venv/bin/python bench/memory.py [--objects 10000] [--pushes 3] [--timer-ticks 3] [--top 25]
[--frames 1] [--no-trace]
"""

from __future__ import annotations

import argparse
import gc
import linecache
import os
import sys
import tempfile
import time
import tracemalloc
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from tick_cpu import bench_daemon, make_repo  # noqa: E402

from reconciler.loop import tune_gc  # noqa: E402
from reconciler.tick import tick  # noqa: E402

MB = 1024 * 1024


def proc_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _where(frame: tracemalloc.Frame) -> str:
    name = os.path.relpath(frame.filename, ROOT) if frame.filename.startswith(str(ROOT)) else frame.filename
    for marker in ("site-packages/", "lib/python3"):
        if marker in name:
            name = "…/" + name.split(marker, 1)[1]
    source = linecache.getline(frame.filename, frame.lineno).strip()
    return f"{name}:{frame.lineno}  {source[:90]}"


class Phases:
    def __init__(self, trace: bool, top: int, key: str) -> None:
        self.trace, self.top, self.key = trace, top, key
        self.previous: tracemalloc.Snapshot | None = None
        self.rows: list[tuple[str, float, float, float, float, float]] = []
        self.started = time.perf_counter()

    def mark(self, phase: str, *, diff: bool = False) -> None:
        now = peak = float("nan")
        seconds = time.perf_counter() - self.started
        if self.trace:
            current, top = tracemalloc.get_traced_memory()
            now, peak = current / MB, top / MB
        self.rows.append((phase, seconds, now, peak, proc_mb("VmRSS"), proc_mb("VmHWM")))
        print(
            f"\n== {phase} ({seconds:.1f} s): traced {now:.0f} MB (phase peak {peak:.0f} MB), "
            f"VmRSS {self.rows[-1][4]:.0f} MB, VmHWM {self.rows[-1][5]:.0f} MB",
            file=sys.stderr,
        )
        if self.trace:
            snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
            stats = snap.statistics(self.key)
            print(f"-- alive, top {self.top} by {self.key}:", file=sys.stderr)
            for stat in stats[: self.top]:
                print(f"{stat.size / MB:8.1f} MB {stat.count:9d}  {_where(stat.traceback[0])}", file=sys.stderr)
                for frame in list(stat.traceback)[1:]:
                    print(f"{'':29}<- {_where(frame)}", file=sys.stderr)
            if diff and self.previous is not None:
                print(f"-- added by the phase, top {self.top}:", file=sys.stderr)
                for change in snap.compare_to(self.previous, self.key)[: self.top]:
                    print(
                        f"{change.size_diff / MB:+8.1f} MB {change.count_diff:+9d}  {_where(change.traceback[0])}",
                        file=sys.stderr,
                    )
            self.previous = snap
            tracemalloc.reset_peak()
        self.started = time.perf_counter()


_SKIP = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.CodeType)


def deep_mb(root: object, seen: set[int]) -> float:
    """Bytes reachable from ``root`` (objects in ``seen`` not counted again), in MB."""
    total, stack = 0, [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _SKIP):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        stack.extend(gc.get_referents(obj))
    return total / MB


def _attrs(obj: object) -> dict[str, object]:
    if isinstance(obj, dict) and len(obj) <= 64 and all(isinstance(k, str) for k in obj):
        return dict(obj)
    names = getattr(type(obj), "__slots__", ())
    out = {n: getattr(obj, n) for n in names if hasattr(obj, n)}
    out.update(getattr(obj, "__dict__", {}))
    return out


def owners(depth: int = 3, **roots: object) -> None:
    """Print what the long-lived objects retain, as a tree of attributes: each line's MB is what
    that attribute reaches that no line printed before it reached (biggest first, so a shared
    object is counted under its biggest holder), then its count (len) when it has one."""
    seen: set[int] = set()
    print("-- retained, by attribute (MB not reached by an earlier line):", file=sys.stderr)

    def visit(name: str, obj: object, level: int) -> None:
        if id(obj) in seen:
            return
        # Biggest first by what each reaches (shared objects included): one walk per child.
        children = sorted(_attrs(obj).items(), key=lambda kv: -deep_mb(kv[1], set())) if level < depth else []
        for child, value in children:
            visit(f"{name}.{child}", value, level + 1)
        added = deep_mb(obj, seen)
        if added >= 0.5:
            count = f" (len {len(obj)})" if isinstance(obj, dict | list | set | tuple) else ""
            print(f"{added:8.1f} MB  {name}{count}{' (the rest)' if children else ''}", file=sys.stderr)

    for owner, obj in roots.items():
        visit(owner, obj, 0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=10000)
    parser.add_argument("--pushes", type=int, default=3)
    parser.add_argument("--timer-ticks", type=int, default=3)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--frames", type=int, default=1, help="traceback depth (>1 groups by traceback)")
    parser.add_argument("--no-trace", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="argus-memory-", ignore_cleanup_errors=True) as tmp:
        root = Path(tmp)
        repo = make_repo(root / "repo", args.objects)
        print(f"{args.objects} objects written; VmRSS {proc_mb('VmRSS'):.0f} MB", file=sys.stderr)
        gc.collect()
        if not args.no_trace:
            tracemalloc.start(args.frames)
        phases = Phases(not args.no_trace, args.top, "lineno" if args.frames <= 1 else "traceback")
        phases.mark("start")
        daemon = bench_daemon(repo, root)
        tune_gc()  # as Daemon.run does
        parts = daemon.parts  # with the status writer's records

        def one_tick(label: str) -> None:
            revision = parts.revisions.read(fetch=False)
            phases.mark(f"{label}: load")
            result, daemon.memory = tick(parts, revision, parts.observe(revision), daemon.memory)
            del revision
            phases.mark(f"{label}: tick")
            daemon.collect()  # as Daemon.run_once after every tick
            daemon.reporter.report(result)
            del result
            phases.mark(f"{label}: status write", diff=label == "first")

        one_tick("first")
        held = dict(parts=parts, memory=daemon.memory, reporter=daemon.reporter, writer=daemon.writer)
        owners(**held)
        for i in range(args.pushes):
            repo.write(f"users/bench/tasks/t{i:03d}.yaml", {"kind": "Task", "workload": "command", "command": "true"})
            repo.commit_push(f"task {i}")
            # The bench's own commit (git add of every file) raised this process's peak by ~50 MB at
            # 10,000 objects: start the peak (VmHWM) again, so that it is the daemon's work alone.
            Path("/proc/self/clear_refs").write_text("5")
            phases.mark(f"push {i + 1} (git commit, push; VmHWM reset)")
            one_tick(f"push tick {i + 1}")
        for i in range(args.timer_ticks):
            parts.revisions.refresh_fs()
            parts.observer.forget_capacity()
            one_tick(f"timer tick {i + 1}")
        owners(**held)
        daemon.close()
    print(f"\n{args.objects:,} objects, tracemalloc {'off' if args.no_trace else 'on'}, load {os.getloadavg()[0]:.1f}")
    print("| phase | seconds | traced now | traced peak in phase | VmRSS | VmHWM |")
    print("|---|---|---|---|---|---|")
    for phase, seconds, now, peak, rss, hwm in phases.rows:
        print(f"| {phase} | {seconds:.1f} | {now:.0f} MB | {peak:.0f} MB | {rss:.0f} MB | {hwm:.0f} MB |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
