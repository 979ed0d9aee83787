"""Benchmark: load + validate + plan a 10,000-object config repository read from git.

Generates, in a temporary git repository, ``--users`` users x (``--models`` models + ``--tasks``
tasks) object files (offline references only: Hugging Face ids and ``$HOME`` paths), then measures,
each in its own Python process so that every peak RSS is honest:

- ``raw``: ``yaml.safe_load`` of the same files' bytes (already in memory): the baseline, what a
  naive loader does (PyYAML's default ``safe_load`` is pure Python; no checks, no line numbers).
- ``raw_c``: ``yaml.load(..., Loader=yaml.CSafeLoader)`` of the same bytes: libyaml's C parser
  alone, with no checks, shown for honesty (the floor of any YAML loader in Python).
- ``cold``: a fresh process: ``GitRepo.snapshot`` + ``load`` + ``plan`` (git reads included),
  parsing with libyaml's C parser (``reconciler.spec.yamldoc``).
- ``cold_py``: the same with the pure-Python parser (what argus does where PyYAML lacks libyaml).
- ``incremental``: after a warm snapshot+load+plan, a chain of commits that each change one file
  is re-planned commit by commit with the same :class:`GitRepo` and :class:`ParseCache`, as the
  daemon does after each push (only the changed blob is re-parsed: the count is printed). The
  median, the first and the slowest round are reported (the slowest is usually a full GC pass).

Usage: ``.venv/bin/python bench/load_plan.py [--users 1000] [--models 5] [--tasks 5] [--keep DIR]``.
Targets (issue 13): cold load + validate (+ plan) at most 1.0x the raw ``safe_load``; (issue 2):
incremental under 100 ms, peak RSS under 300 MB.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GIT_ENV = {
    "GIT_AUTHOR_NAME": "bench",
    "GIT_AUTHOR_EMAIL": "bench@example.com",
    "GIT_COMMITTER_NAME": "bench",
    "GIT_COMMITTER_EMAIL": "bench@example.com",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_CONFIG_NOSYSTEM": "1",
}

MODEL = """\
# yaml-language-server: $schema=../../../schemas/model.schema.json
kind: Model
source: Qwen/Qwen2.5-{i}B-Instruct
replicas: {replicas}
gpus_per_replica: 1
engine_kwargs:
  max_model_len: 4096
  gpu_memory_utilization: 0.85
  dtype: bfloat16
env:
  VLLM_LOGGING_LEVEL: INFO
"""

TASK = """\
# yaml-language-server: $schema=../../../schemas/task.schema.json
kind: Task
workload: grpo
model: Qwen/Qwen2.5-0.5B-Instruct
data:
  train: $HOME/data/gsm8k-{i}/train.parquet
  val: $HOME/data/gsm8k-{i}/test.parquet
nodes: 1
gpus_per_node: 2
epochs: 1
steps: 100
overrides:
  - actor_rollout_ref.actor.optim.lr=1e-6
  - data.train_batch_size=64
env:
  WANDB_MODE: offline
run: 1
"""

CLUSTER = """\
kind: Cluster
paths: {common: /private/hf, users: /private/users}
serving: {accelerator: gpu, http_port: 8000}
training: {rollout: vllm, driver_resources: {worker_node: 1}}
env: {HF_HUB_OFFLINE: "1"}
"""


def git(repo: Path, *args: str, env: dict[str, str] | None = None) -> str:
    full_env = {**os.environ, **GIT_ENV, **(env or {})}
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=full_env
    ).stdout.strip()


def generate(repo: Path, users: int, models: int, tasks: int, changes: int) -> dict[str, Any]:
    """Write the repository: one commit with every file, then ``changes`` commits that each change
    one file (a different user's model each time). Returns {"first": id, "chain": [ids]}."""
    repo.mkdir(parents=True, exist_ok=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / "cluster.yaml").write_text(CLUSTER)
    for u in range(users):
        home = repo / "users" / f"user{u:04d}"
        (home / "models").mkdir(parents=True)
        (home / "tasks").mkdir(parents=True)
        for m in range(models):
            (home / "models" / f"model-{m}.yaml").write_text(MODEL.format(i=m, replicas=1 + m % 2))
        for t in range(tasks):
            (home / "tasks" / f"task-{t}.yaml").write_text(TASK.format(i=t))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "10,000 objects", env={"GIT_COMMITTER_DATE": "1767225600 +0000"})
    first = git(repo, "rev-parse", "HEAD")
    chain = []
    for i in range(changes):
        changed = repo / "users" / f"user{(7 + 37 * i) % users:04d}" / "models" / f"model-{i % models}.yaml"
        changed.write_text(changed.read_text().replace("max_model_len: 4096", "max_model_len: 8192"))
        when = f"{1767229200 + 60 * i} +0000"
        git(repo, "commit", "-q", "-am", f"change {i}", env={"GIT_COMMITTER_DATE": when, "GIT_AUTHOR_DATE": when})
        chain.append(git(repo, "rev-parse", "HEAD"))
    return {"first": first, "chain": chain}


def write_actual(repo: Path, commit: str, out: Path) -> None:
    """An actual state where every model of the first commit runs and every task ran (SUCCEEDED),
    so that the plan is what a daemon meets in steady state (few changes, 10,000 comparisons)."""
    from reconciler.plan.actual import ActualJob, ActualModel, ActualState, Capacity
    from reconciler.source.git import GitRepo
    from reconciler.spec.hashing import model_spec_hash, submission_id, task_spec_hash
    from reconciler.spec.loader import load

    snap = GitRepo(str(repo)).snapshot(commit)
    desired = load(snap.files, created=snap.created, default_time=snap.commit_time, revision=commit)
    actual = ActualState(capacity=Capacity(total={"GPU": 4096.0}, available={"GPU": 64.0, "worker_node": 16.0}))
    for key, m in desired.models.items():
        actual.models[key] = ActualModel(
            key,
            m.served_name,
            model_spec_hash(m, desired.cluster),
            m.replicas,
            m.replicas,
            "RUNNING",
            resources_per_replica={"GPU": float(m.gpus_per_replica)},
        )
    for t in desired.tasks.values():
        actual.jobs.append(ActualJob(submission_id(t), t.key, task_spec_hash(t), "SUCCEEDED", resources={"GPU": 2.0}))
    out.write_text(json.dumps(actual.to_json()))


def cpu_seconds() -> float:
    """CPU time of this process and its finished children (git): unlike wall time, it does not
    grow when other processes compete for the cores, so it is also reported."""
    child = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + child.ru_utime + child.ru_stime


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def measure(kind: str, repo: Path, commits: dict[str, Any], actual_path: Path) -> dict[str, Any]:
    """Run one measurement in this process (called in a fresh subprocess by :func:`main`)."""
    import yaml

    from reconciler.plan.actual import ActualState
    from reconciler.plan.planner import plan
    from reconciler.source.git import GitRepo
    from reconciler.spec.loader import ParseCache, load

    actual = ActualState.from_json(json.loads(actual_path.read_text()))
    out: dict[str, Any] = {}
    if kind in ("raw", "raw_c"):
        snap = GitRepo(str(repo)).snapshot(commits["chain"][0])
        contents = [f.content for f in snap.files if f.content is not None]
        loader = yaml.SafeLoader if kind == "raw" else yaml.CSafeLoader
        start, cpu = time.perf_counter(), cpu_seconds()
        for content in contents:
            yaml.load(content, Loader=loader)
        out["seconds"] = time.perf_counter() - start
        out["cpu"] = cpu_seconds() - cpu
        out["files"] = len(contents)
    elif kind in ("cold", "cold_py"):
        from reconciler.spec import yamldoc

        yamldoc.USE_LIBYAML = kind == "cold" and yamldoc.HAS_LIBYAML
        start, cpu = time.perf_counter(), cpu_seconds()
        cache = ParseCache()
        snap = GitRepo(str(repo)).snapshot(commits["chain"][0], cache)
        t_snap = time.perf_counter()
        desired = load(snap.files, created=snap.created, default_time=snap.commit_time, cache=cache)
        t_load = time.perf_counter()
        result = plan(desired, actual)
        end = time.perf_counter()
        out.update(
            seconds=end - start,
            cpu=cpu_seconds() - cpu,
            snapshot=t_snap - start,
            load=t_load - t_snap,
            plan=end - t_load,
            libyaml=yamldoc.USE_LIBYAML,
            parsed=cache.parsed,
            objects=desired.object_count,
            issues=len(desired.issues),
            actions=len(result.actions),
        )
    elif kind == "incremental":
        cache = ParseCache()
        source = GitRepo(str(repo))
        snap = source.snapshot(commits["first"], cache)
        plan(load(snap.files, created=snap.created, default_time=snap.commit_time, cache=cache), actual)
        gc.collect()
        gc.freeze()  # as the daemon does after its first tick: the long-lived tree is not re-scanned
        cpus: list[float] = []
        rounds = []  # each commit of the chain changes one more file: a push, a re-plan
        for commit in commits["chain"]:
            before = cache.parsed
            start, cpu = time.perf_counter(), cpu_seconds()
            snap = source.snapshot(commit, cache)
            t_snap = time.perf_counter()
            desired = load(snap.files, created=snap.created, default_time=snap.commit_time, cache=cache)
            t_load = time.perf_counter()
            result = plan(desired, actual)
            end = time.perf_counter()
            used = cpu_seconds() - cpu
            changes = [f"{a.type.value} {a.key}" for a in result.actions if a.type.value != "keep"]
            rounds.append((end - start, t_snap - start, t_load - t_snap, end - t_load, cache.parsed - before, changes))
            cpus.append(used)
        times = sorted(r[0] for r in rounds)
        first = rounds[0]
        out.update(
            seconds=first[0],
            snapshot=first[1],
            load=first[2],
            plan=first[3],
            parsed=first[4],
            changes=first[5],
            median=statistics.median(times),
            cpu_median=statistics.median(cpus),
            max=times[-1],
            rounds=len(rounds),
            parsed_each=sorted({r[4] for r in rounds}),
        )
    else:
        raise SystemExit(f"unknown measurement {kind!r}")
    out["peak_rss_mb"] = peak_rss_mb()
    return out


def run_child(kind: str, repo: Path, commits: dict[str, Any], actual: Path) -> dict[str, Any]:
    cmd = [
        sys.executable,
        __file__,
        "--measure",
        kind,
        "--repo",
        str(repo),
        "--actual",
        str(actual),
        "--commits",
        json.dumps(commits),
    ]
    proc = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--models", type=int, default=5)
    parser.add_argument("--tasks", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement; the best time is reported")
    parser.add_argument("--changes", type=int, default=20, help="one-file commits re-planned in the incremental run")
    parser.add_argument("--keep", metavar="DIR", help="generate into DIR and keep it (default: a temporary folder)")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--repo", help=argparse.SUPPRESS)
    parser.add_argument("--actual", help=argparse.SUPPRESS)
    parser.add_argument("--commits", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, Path(args.repo), json.loads(args.commits), Path(args.actual))))
        return 0

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="argus-bench-"))
    try:
        repo = work / "repo"
        if repo.exists():
            shutil.rmtree(repo)
        t0 = time.perf_counter()
        commits = generate(repo, args.users, args.models, args.tasks, max(1, args.changes))
        actual = work / "actual.json"
        write_actual(repo, commits["first"], actual)
        n = args.users * (args.models + args.tasks)
        print(f"generated {n} object files in {repo} ({time.perf_counter() - t0:.1f} s)\n", file=sys.stderr)

        best: dict[str, dict[str, Any]] = {}
        for kind in ("raw", "raw_c", "cold", "cold_py", "incremental"):
            runs = [run_child(kind, repo, commits, actual) for _ in range(args.repeat)]
            best[kind] = min(runs, key=lambda r: r.get("median", r["seconds"]))
            best[kind]["peak_rss_mb"] = max(r["peak_rss_mb"] for r in runs)
        raw, raw_c, cold, cold_py, inc = (best[k] for k in ("raw", "raw_c", "cold", "cold_py", "incremental"))
        ratio = cold["seconds"] / raw["seconds"]
        print(
            f"{n} objects ({args.users} users x ({args.models} models + {args.tasks} tasks)), "
            f"best of {args.repeat}, each measurement in a fresh process; {os.cpu_count()} CPUs\n"
        )
        print("| measurement | wall time | CPU time | vs raw `safe_load` (wall / CPU) | peak RSS | target |")
        print("|---|---|---|---|---|---|")
        print(
            f"| raw `yaml.safe_load` of the {raw['files']} files (pure Python, no checks) | {raw['seconds']:.2f} s "
            f"| {raw['cpu']:.2f} s | 1.00x | {raw['peak_rss_mb']:.0f} MB | (baseline) |"
        )
        print(
            f"| raw `yaml.load(CSafeLoader)` of the same files (libyaml, no checks) | {raw_c['seconds']:.2f} s "
            f"| {raw_c['cpu']:.2f} s | {raw_c['seconds'] / raw['seconds']:.2f}x / {raw_c['cpu'] / raw['cpu']:.2f}x "
            f"| {raw_c['peak_rss_mb']:.0f} MB | (floor) |"
        )
        met = ratio <= 1.0 and cold["peak_rss_mb"] < 300
        load_only = cold["snapshot"] + cold["load"]
        print(
            f"| cold: read the commit + load + validate + plan (libyaml: {cold['libyaml']}) | {cold['seconds']:.2f} s "
            f"| {cold['cpu']:.2f} s | {ratio:.2f}x / {cold['cpu'] / raw['cpu']:.2f}x (load + validate alone "
            f"{load_only / raw['seconds']:.2f}x) | {cold['peak_rss_mb']:.0f} MB | <= 1.0x raw, < 300 MB: {_ok(met)} |"
        )
        print(
            f"| the same with the pure-Python parser (no libyaml) | {cold_py['seconds']:.2f} s "
            f"| {cold_py['cpu']:.2f} s "
            f"| {cold_py['seconds'] / raw['seconds']:.2f}x / {cold_py['cpu'] / raw['cpu']:.2f}x "
            f"| {cold_py['peak_rss_mb']:.0f} MB | |"
        )
        what = f"incremental re-plan, median of {inc['rounds']} one-file commits ({inc['parsed']} blob re-parsed each)"
        print(
            f"| {what} | {inc['median'] * 1000:.0f} ms "
            f"(first {inc['seconds'] * 1000:.0f}, max {inc['max'] * 1000:.0f}) | {inc['cpu_median'] * 1000:.0f} ms "
            f"| {inc['median'] / raw['seconds']:.3f}x | {inc['peak_rss_mb']:.0f} MB "
            f"| < 100 ms: {_ok(inc['median'] < 0.1)} |"
        )
        print()
        print(
            f"cold: snapshot {cold['snapshot']:.2f} s, load {cold['load']:.2f} s, plan {cold['plan']:.2f} s; "
            f"{cold['parsed']} files parsed, {cold['objects']} valid objects, {cold['issues']} issues, "
            f"{cold['actions']} actions"
        )
        print(
            f"incremental: snapshot {inc['snapshot'] * 1000:.0f} ms, load {inc['load'] * 1000:.0f} ms, "
            f"plan {inc['plan'] * 1000:.0f} ms; changes: {', '.join(inc['changes']) or 'none'}"
        )
        print(
            f"incremental, {inc['rounds']} successive one-file commits in one process: median "
            f"{inc['median'] * 1000:.0f} ms, max {inc['max'] * 1000:.0f} ms (blobs parsed per round: "
            f"{', '.join(map(str, inc['parsed_each']))}); best process of {args.repeat}"
        )
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


def _ok(passed: bool) -> str:
    return "met" if passed else "**missed**"


if __name__ == "__main__":
    sys.exit(main())
