"""Figures of the compose stack (CPU profile) on this machine: build and up times, image sizes, the time from
``up`` to the first model RUNNING, push -> RUNNING through the git container (SSH) vs through the local
bare repository (a push from inside the daemon's container to /srv/git/config.git), same model, same run, both once
Serve and the router run (cluster.yaml is pushed first); then, with the
bench's stack down, how long tests/e2e/test_compose_stack.py takes (``pytest --durations=0``, CI=true): what
the compose test adds to ``make test``.

Needs root (a private dockerd, as tests/e2e/test_compose_stack.py, reusing its layer cache). Signing is
turned off for the bench's stack so that the local push needs no user key; everything else is the
test's stack. From a fresh clone: ``make bench-compose`` (the venv, the Debian packages, then this, niced).

Usage: .venv/bin/python bench/compose_stack.py [--keep] [--no-compose-test] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from reconciler.builders.serve import ROUTER_APP  # noqa: E402
from reconciler.status.branch import read_documents  # noqa: E402
from reconciler.testing import docker  # noqa: E402
from reconciler.testing.compose import Stack, prepare, wait_for  # noqa: E402
from reconciler.testing.tiny_model import TINY_REPO, generate_tiny_llama  # noqa: E402

MODEL = {
    "kind": "Model",
    "source": TINY_REPO,
    "replicas": 1,
    "engine_kwargs": {"max_model_len": 256, "dtype": "float32", "enforce_eager": True},
}


def git(work: Path, stack: Stack, *args: str) -> str:
    env = {**os.environ, "GIT_SSH_COMMAND": stack.ssh_command("alice"), "GIT_CONFIG_GLOBAL": os.devnull}
    env.update(GIT_AUTHOR_NAME="alice", GIT_AUTHOR_EMAIL="a@x", GIT_COMMITTER_NAME="alice", GIT_COMMITTER_EMAIL="a@x")
    return subprocess.run(["git", *args], cwd=work, env=env, check=True, capture_output=True, text=True).stdout


def running(work: Path, stack: Stack, path: str) -> bool:
    git(work, stack, "fetch", "-q", "origin", "+refs/heads/argus/status:refs/heads/argus/status")
    doc = read_documents(str(work), "argus/status").get(path) or {}
    return doc.get("state") == "RUNNING"


def router_running(stack: Stack) -> bool:
    apps = stack.dashboard("/api/serve/applications/").get("applications") or {}
    return bool((apps.get(ROUTER_APP) or {}).get("status") == "RUNNING")


def machine() -> dict[str, object]:
    """The machine and its load now: figures from a shared machine say under what load they were taken."""
    with open("/proc/meminfo") as fh:
        mem_kb = int(fh.readline().split()[1])
    with open("/proc/cpuinfo") as fh:
        cpu = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), "?")
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "memory_gb": round(mem_kb / 1024 / 1024, 1),
        "kernel": platform.release(),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
    }


DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)s (setup|call|teardown)\s+(\S+)")


def compose_test() -> dict[str, object]:
    """Run tests/e2e/test_compose_stack.py as ``make test`` does (CI=true); returns its wall time, its
    outcome and the durations pytest reports (the module's stack start is the first test's setup)."""
    timings = Path(tempfile.mkstemp(prefix="argus-compose-timings-", suffix=".json")[1])
    env = {**os.environ, "CI": "true", "PYTHONPATH": str(ROOT), "ARGUS_COMPOSE_TIMINGS": str(timings)}
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--durations=0",
        f"--basetemp={tempfile.mkdtemp(prefix='argus-bench-pytest-')}",
        "tests/e2e/test_compose_stack.py",
    ]
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=5400, check=False)
    wall = time.monotonic() - started
    durations = [(float(m[1]), m[2], m[3]) for m in map(DURATION.match, proc.stdout.splitlines()) if m]
    out: dict[str, object] = {
        "wall_s": round(wall, 1),
        "passed": proc.returncode == 0,
        "summary": proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-500:],
        "durations_sum_s": round(sum(d for d, _, _ in durations), 1),
        "slowest": [f"{d:.1f}s {when} {name.split('::')[-1]}" for d, when, name in durations[:8]],
    }
    with contextlib.suppress(ValueError):
        out["test_timings"] = json.loads(timings.read_text() or "{}")
    timings.unlink(missing_ok=True)
    if proc.returncode:
        out["output_tail"] = proc.stdout[-3000:]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="leave the stack and the daemon running")
    parser.add_argument("--no-compose-test", action="store_true", help="skip timing the compose test")
    parser.add_argument("--out", help="also write the figures to this JSON file")
    args = parser.parse_args()
    figures: dict[str, object] = {"machine": machine()}
    started = time.monotonic()
    daemon = prepare()
    tmp = Path(tempfile.mkdtemp(prefix="argus-bench-compose-", dir="/var/tmp"))
    tmp.chmod(0o755)
    stack = Stack(daemon, tmp)
    try:
        stack.setup(admins="alice")
        with stack.env_file.open("a") as fh:
            fh.write("ARGUS_REQUIRE_SIGNED_COMMITS=0\n")
        generate_tiny_llama(tmp / "private" / "hf")
        for path in (tmp / "private" / "hf", *(tmp / "private" / "hf").rglob("*")):
            os.chown(path, 1000, 1000, follow_symlinks=False)
        build = time.monotonic()
        stack.compose("build", timeout=3600)
        figures["build_s"] = round(time.monotonic() - build, 1)
        up = time.monotonic()
        stack.up()
        # Before the first push /healthz is 503 (no branch yet): the daemon answering at all is "up".
        wait_for(stack.answers, "the daemon's /healthz", timeout=300)
        figures["up_to_daemon_answers_s"] = round(time.monotonic() - up, 1)
        work = tmp / "work"
        work.mkdir()
        git(work, stack, "init", "-q", "-b", "main")
        git(work, stack, "remote", "add", "origin", stack.git_url())
        # cluster.yaml alone first: Serve and the router start, so that both model pushes below find Serve up
        # (otherwise the first one would also pay for Serve's start and the comparison would say nothing).
        (work / "cluster.yaml").write_text((ROOT / "desired-state" / "cpu" / "cluster.yaml").read_text())
        git(work, stack, "add", "-A")
        git(work, stack, "commit", "-q", "-m", "the cluster")
        git(work, stack, "push", "-q", "origin", "main")
        wait_for(lambda: router_running(stack), "Serve and the router", timeout=900, every=2)
        figures["up_to_serve_and_router_running_s"] = round(time.monotonic() - up, 1)
        (work / "users/alice/models").mkdir(parents=True)
        (work / "users/alice/models/ssh.yaml").write_text(yaml.safe_dump(MODEL))
        git(work, stack, "add", "-A")
        git(work, stack, "commit", "-q", "-m", "through the git container")
        pushed = time.monotonic()
        git(work, stack, "push", "-q", "origin", "main")
        wait_for(lambda: running(work, stack, "users/alice/models/ssh.yaml"), "ssh model", timeout=900, every=2)
        figures["push_to_running_ssh_s"] = round(time.monotonic() - pushed, 1)
        figures["up_to_first_model_running_s"] = round(time.monotonic() - up, 1)
        # The same model under another name, pushed from inside the daemon's container (as the daemon's user, the
        # only one there that writes the repository) straight into the bare repository.
        script = (
            "set -e; cd /tmp && rm -rf w && git clone -q /srv/git/config.git w && cd w && "
            "cp users/alice/models/ssh.yaml users/alice/models/local.yaml && git add -A && "
            "git -c user.name=alice -c user.email=a@x commit -q -m local && git push -q origin main"
        )
        local = time.monotonic()
        stack.exec("argus", "argus-node", "bash", "-c", script)
        wait_for(lambda: running(work, stack, "users/alice/models/local.yaml"), "local model", timeout=900, every=2)
        figures["push_to_running_local_bare_s"] = round(time.monotonic() - local, 1)
        sizes = daemon.docker("image", "ls", "--format", "{{.Repository}}:{{.Tag}}={{.Size}}").stdout.split()
        figures["image_sizes"] = dict(s.split("=", 1) for s in sizes if s.startswith(("argus", "debian")))
        figures["total_s"] = round(time.monotonic() - started, 1)
    finally:
        print("figures so far:", json.dumps(figures), file=sys.stderr)
        if not args.keep:
            stack.down()
            docker.stop_daemon(daemon)
            shutil.rmtree(tmp, ignore_errors=True)
    if not args.keep and not args.no_compose_test:
        figures["compose_test"] = compose_test()
    figures["machine_after"] = machine()
    text = json.dumps(figures, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    test = figures.get("compose_test")
    return 1 if isinstance(test, dict) and not test.get("passed") else 0


if __name__ == "__main__":
    sys.exit(main())
