"""Daemon latencies and memory at 10,000 objects, side by side with an almost empty repository.

One real Ray head, two ``argus run`` daemons (each watching its own bare repository with
watchfiles): ``empty`` (a cluster.yaml only) and ``big`` (1,000 users x (5 models + 5 tasks),
all suspended so nothing is deployed). Pushes of a new task alternate between the two.

1. push -> job submitted: ``git push`` until the Ray Jobs API lists the job, p50/p95/max, per repo.
2. the status commit after a one-file push at 10,000 objects, once the branch is quiet: the
   files it changed and the time from the push until it landed.
3. the big daemon's peak RSS (VmHWM) at the end.

Usage: PYTHONPATH=. .venv/bin/python bench/daemon_latency.py [--pushes 20] [--users 1000] [--profile DIR]

``--profile DIR``: py-spy samples the big daemon (all threads, idle ones too) while the pushes
run; DIR gets ``big.pyspy`` (collapsed stacks), ``big-top.txt`` (the heaviest frames per thread)
and ``big.log`` (the daemon's log).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


from reconciler.dashboard import Dashboard  # noqa: E402
from reconciler.testing.ray_head import free_port, start_head  # noqa: E402
from tests.support import ConfigRepo, add_suspended_objects, cluster_yaml, git  # noqa: E402


def daemon(repo: ConfigRepo, dash_url: str, log: Path) -> subprocess.Popen[bytes]:
    # Each daemon its own cache folder, so its own ownership key: it never counts the other's jobs.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ARGUS_CACHE_DIR": str(log.with_suffix(".cache"))}
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "reconciler.cli", "run", "--repo", str(repo.bare), "--ray", dash_url),
            *("--listen", f"127.0.0.1:{free_port()}", "--observe-interval", "5"),
            *("--cache-dir", str(log.with_suffix(".cache"))),
        ],
        stdout=open(log, "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=env,
    )


def rss_peak_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def make_repo(root: Path, name: str, users: int) -> ConfigRepo:
    (root / name).mkdir()
    repo = ConfigRepo(root / name)
    home = root / f"{name}-users"
    (home / "bench").mkdir(parents=True)
    repo.write("cluster.yaml", cluster_yaml(root / "hf", home, free_port()))
    add_suspended_objects(repo, home, users)
    repo.commit_push(f"{users * 10} objects")
    return repo


def status_tip(repo: ConfigRepo) -> str:
    return git(repo.bare, "rev-parse", "--verify", "--quiet", "argus/status", check=False).strip()


def wait_quiet(repo: ConfigRepo, timeout: float) -> float:
    """Wait for the first status commit, then until the branch stops moving for 6 s."""
    start = time.time()
    while not status_tip(repo) and time.time() - start < timeout:
        time.sleep(0.2)
    first = time.time() - start
    last, since = status_tip(repo), time.time()
    while time.time() - since < 6 and time.time() - start < timeout:
        time.sleep(0.5)
        if status_tip(repo) != last:
            last, since = status_tip(repo), time.time()
    return first


def push_task(repo: ConfigRepo, dash: Dashboard, name: str) -> tuple[float, str]:
    """Push a new task; return the seconds until Ray lists its job, and the pushed commit."""
    repo.write(f"users/bench/tasks/{name}.yaml", {"kind": "Task", "workload": "command", "command": "true"})
    sha = repo.commit(f"task {name}")
    start = time.time()
    git(repo.work, "push", "-q", "origin", "HEAD:main")
    while time.time() - start < 60:
        if any(f"-{name}-" in str(j.get("submission_id")) for j in dash.get("/api/jobs/")):
            return time.time() - start, sha
        time.sleep(0.01)
    return float("inf"), sha


def status_commit_for(repo: ConfigRepo, sha: str, pushed: float, timeout: float = 120) -> tuple[float, list[str]]:
    """Seconds from the push to the first status commit whose revision.yaml names ``sha``,
    and the files that commit changed."""
    seen: set[str] = set()
    while time.time() - pushed < timeout:
        commits = git(repo.bare, "rev-list", "argus/status", "-n", "20").split()
        for commit in reversed(commits):
            if commit in seen:
                continue
            seen.add(commit)
            root = git(repo.bare, "show", f"{commit}:revision.yaml", check=False)
            if sha in root:
                when = int(git(repo.bare, "log", "-1", "--format=%ct", commit).strip())
                files = git(repo.bare, "diff-tree", "--no-commit-id", "--name-only", "-r", f"{commit}^", commit)
                return when - pushed, files.split()
        time.sleep(0.05)
    return float("inf"), []


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """Stop the daemons: at 100,000 objects one writes its pending status first (over a minute
    on 2 shared cores; a 60 s limit lost a 23-minute run's figures), so wait, then kill."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=600)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def profile(pid: int, out: Path) -> subprocess.Popen[bytes]:
    """py-spy on ``pid`` until stopped (SIGINT), collapsed stacks per thread into ``out``."""
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or "py-spy"
    cmd = [spy, "record", "--pid", str(pid), "--rate", "50", "--threads", "--idle", "--format", "raw"]
    return subprocess.Popen([*cmd, "--output", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def top_frames(collapsed: Path, limit: int = 25) -> str:
    """The frames most samples were in, per thread (self time, and inclusive of what they call)."""
    inclusive: dict[tuple[str, str], int] = {}
    own: dict[tuple[str, str], int] = {}
    totals: dict[str, int] = {}
    for line in collapsed.read_text(errors="replace").splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not stack or not count_s.isdigit():
            continue
        count = int(count_s)
        frames = stack.split(";")
        thread = frames[0]
        totals[thread] = totals.get(thread, 0) + count
        for frame in set(frames[1:]):
            inclusive[(thread, frame)] = inclusive.get((thread, frame), 0) + count
        if len(frames) > 1:
            own[(thread, frames[-1])] = own.get((thread, frames[-1]), 0) + count
    lines = []
    for thread, total in sorted(totals.items(), key=lambda kv: -kv[1]):
        lines.append(f"== {thread}: {total} samples")
        ranked = sorted(((n, f) for (t, f), n in inclusive.items() if t == thread), reverse=True)[:limit]
        lines += [f"  incl {n:6d}  {f}" for n, f in ranked]
        ranked = sorted(((n, f) for (t, f), n in own.items() if t == thread), reverse=True)[:limit]
        lines += [f"  self {n:6d}  {f}" for n, f in ranked]
    return "\n".join(lines) + "\n"


def print_results(
    args: argparse.Namespace,
    lat: dict[str, list[float]],
    commits: list[tuple[float, list[str]]],
    rss: float,
    first: float,
) -> None:
    """Print the figures (while the daemons still run)."""
    load = os.getloadavg()
    print(f"\nmachine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load {load[0]:.1f}")
    print(f"| push -> job submitted (n={args.pushes} each, interleaved) | p50 | p95 | max |")
    print("|---|---|---|---|")
    for label, values in lat.items():
        what = "almost empty repository" if label == "empty" else f"{args.users * 10:,} objects"
        print(f"| {what} | {statistics.median(values):.2f} s | {pct(values, 0.95):.2f} s | {max(values):.2f} s |")
    ratio = statistics.median(lat["big"]) / statistics.median(lat["empty"])
    print(f"\np50 ratio big/empty: {ratio:.2f}x")
    for seconds, files in commits:
        print(f"status commit after a one-file push: {seconds:.1f} s after the push, {len(files)} files: {files}")
    print(f"big daemon: peak RSS {rss:.0f} MB; first status commit {first:.1f} s after start")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pushes", type=int, default=20)
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--profile", type=Path, help="py-spy the big daemon during the pushes into this folder")
    args = parser.parse_args()
    head = start_head(num_cpus=8, num_gpus=64, resources={"worker_node": 64}, env={"PYTHONPATH": str(ROOT)})
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="argus-bench-", ignore_cleanup_errors=True) as tmp:
            root = Path(tmp)
            (root / "hf").mkdir()
            dash = Dashboard(head.dashboard_url)
            t0 = time.time()
            big = make_repo(root, "big", args.users)
            empty = make_repo(root, "empty", 0)
            print(f"repositories written in {time.time() - t0:.1f} s", file=sys.stderr)
            big_proc = daemon(big, head.dashboard_url, root / "big.log")
            empty_proc = daemon(empty, head.dashboard_url, root / "empty.log")
            procs += [big_proc, empty_proc]
            first = wait_quiet(big, 900)
            wait_quiet(empty, 60)
            print(f"big daemon: first status commit {first:.1f} s after start", file=sys.stderr)
            lat: dict[str, list[float]] = {"empty": [], "big": []}
            commits: list[tuple[float, list[str]]] = []
            spy = None
            if args.profile is not None:
                args.profile.mkdir(parents=True, exist_ok=True)
                spy = profile(big_proc.pid, args.profile / "big.pyspy")
                time.sleep(2)  # py-spy attached
            for i in range(args.pushes):
                for label, repo in (("empty", empty), ("big", big)):
                    seconds, _sha = push_task(repo, dash, f"{label[0]}{i:03d}")
                    lat[label].append(seconds)
                    print(f"{label} push {i}: {seconds:.2f} s", file=sys.stderr, flush=True)
                time.sleep(0.5)
            if spy is not None and args.profile is not None:
                spy.send_signal(2)
                spy.wait(timeout=120)
                (args.profile / "big-top.txt").write_text(top_frames(args.profile / "big.pyspy"))
                shutil.copy(root / "big.log", args.profile / "big.log")
            for i in range(3):  # a one-file push once the branch is quiet (the last run's end recorded)
                wait_quiet(big, 60)
                seconds, sha = push_task(big, dash, f"s{i:03d}")
                commits.append(status_commit_for(big, sha, time.time() - seconds))
            rss = rss_peak_mb(big_proc.pid)
            print_results(args, lat, commits, rss, first)  # before stopping: nothing measured is lost
            stop(procs)  # before the folder they write to goes
    finally:
        stop(procs)
        head.stop()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    sys.exit(main())
