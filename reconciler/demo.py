"""``make demo``: the real loop on this machine, end to end.

A local Ray head (CPU mode), a bare git repository seeded from ``desired-state/``, the argus
daemon watching it, a ``git push`` that deploys the tiny model, an OpenAI call through the
official client, and the status table. Interactive runs stay up until Ctrl-C (then stop
everything they started); non-interactive runs stop after the status table.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from reconciler.errors import ArgusError
from reconciler.status.branch import read_documents
from reconciler.testing.ray_head import RayHead, free_port, start_head
from reconciler.testing.tiny_model import generate_tiny_llama

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "desired-state"


def say(msg: str) -> None:
    print(f"\033[1m==>\033[0m {msg}", flush=True)


def git(cwd: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "alice",
        "GIT_AUTHOR_EMAIL": "alice@example.com",
        "GIT_COMMITTER_NAME": "alice",
        "GIT_COMMITTER_EMAIL": "alice@example.com",
    }
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True, env=env).stdout


def main() -> int:
    cluster = yaml.safe_load((SEED / "cluster.yaml").read_text())
    base = Path(cluster["paths"]["common"]).parent
    port = int(cluster["serving"]["http_port"])
    say(f"workspace {base}")
    for folder in ("config.git", "work", "ray"):
        shutil.rmtree(base / folder, ignore_errors=True)
    Path(cluster["paths"]["users"], "alice").mkdir(parents=True, exist_ok=True)
    say("generating the tiny random-weight Llama into the shared HF cache")
    print(f"    {generate_tiny_llama(cluster['paths']['common'])}")

    say("starting a local Ray head (CPU mode, 2 logical GPUs for training admission)")
    head: RayHead = start_head(
        num_cpus=8, num_gpus=2, resources={"worker_node": 4}, env={"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    )
    daemon: subprocess.Popen[bytes] | None = None
    try:
        print(f"    dashboard {head.dashboard_url}")
        bare, work = base / "config.git", base / "work"
        git(base, "init", "-q", "--bare", "-b", "main", str(bare))
        git(base, "clone", "-q", str(bare), str(work))
        listen = f"127.0.0.1:{free_port()}"
        say(f"starting the daemon: argus run --repo {bare} (metrics on http://{listen}/metrics)")
        daemon = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "reconciler.cli",
                "run",
                "--repo",
                str(bare),
                "--ray",
                head.dashboard_url,
                "--listen",
                listen,
                "--endpoint",
                f"http://127.0.0.1:{port}/v1",
            ],
            stdout=sys.stderr,
            stderr=sys.stderr,
            start_new_session=True,
        )
        time.sleep(2)
        say("git push of desired-state/ (one model: users/alice/models/tiny-chat.yaml)")
        shutil.copytree(SEED, work, dirs_exist_ok=True)
        git(work, "add", "-A")
        git(work, "commit", "-q", "-m", "Deploy alice's tiny chat model")
        pushed = time.monotonic()
        git(work, "push", "-q", "origin", "HEAD:main")
        served = wait_running(bare, head, pushed)
        call_model(port, served)
        say("status (argus status --repo config.git)")
        subprocess.run([sys.executable, "-m", "reconciler.cli", "status", "--repo", str(bare)], check=False)
        print(git(bare, "log", "--notes=argus", "-1", "main"))
        print_howto(port, served, work)
        if sys.stdin.isatty():
            say("running; push more changes from the clone above. Ctrl-C stops everything.")
            signal.pause()
    except KeyboardInterrupt:
        print()
    finally:
        say("stopping the daemon and the Ray head")
        if daemon is not None and daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(timeout=15)
            except subprocess.TimeoutExpired:
                daemon.kill()
        head.stop()
    return 0


def wait_running(bare: Path, head: RayHead, since: float, timeout: float = 600.0) -> str:
    """Show progress from the status branch until the model is RUNNING; return its served name."""
    last = ""
    while time.monotonic() - since < timeout:
        doc = read_documents(str(bare), "argus/status").get("users/alice/models/tiny-chat.yaml")
        state = doc.get("state") if doc else "waiting for the first status commit"
        line = f"    {time.monotonic() - since:5.0f}s  tiny-chat: {state}"
        if doc:
            line += f" ({doc['replicas']['ready']}/{doc['replicas']['desired']} ready)"
        if line.split(":", 1)[1] != last:
            print(line, flush=True)
            last = line.split(":", 1)[1]
        if doc and doc.get("state") == "RUNNING" and doc["replicas"]["ready"]:
            say(f"RUNNING {time.monotonic() - since:.0f} s after the push")
            return str(doc["served_name"])
        if doc and doc.get("state") == "FAILED":
            raise ArgusError(f"model failed: {doc.get('reason')}")
        time.sleep(2)
    raise ArgusError(f"model not RUNNING after {timeout:.0f} s; see {head.dashboard_url}")


def call_model(port: int, served: str) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
    for _ in range(30):  # the router learns about a new app within a few seconds
        if served in [m.id for m in client.models.list().data]:
            break
        time.sleep(2)
    say(f"OpenAI call: client.chat.completions.create(model={served!r}, ...)")
    reply = client.chat.completions.create(
        model=served, messages=[{"role": "user", "content": "Say hello"}], max_tokens=16, temperature=0
    )
    print(
        f"    reply ({reply.usage.completion_tokens if reply.usage else '?'} tokens, random weights): "
        f"{reply.choices[0].message.content!r}"
    )


def print_howto(port: int, served: str, work: Path) -> None:
    print(f"""
How to call it (any OpenAI client):
    from openai import OpenAI
    client = OpenAI(base_url="http://127.0.0.1:{port}/v1", api_key="none")
    client.chat.completions.create(model="{served}", messages=[{{"role": "user", "content": "hi"}}])

    curl http://127.0.0.1:{port}/v1/chat/completions -H 'Content-Type: application/json' \\
      -d '{{"model": "{served}", "messages": [{{"role": "user", "content": "hi"}}], "max_tokens": 16}}'

Change something and push from the clone: {work}
    (e.g. set `replicas: 2` in users/alice/models/tiny-chat.yaml, commit, git push)
""")


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ArgusError as exc:
        print(f"demo failed: {exc}", file=sys.stderr)
        sys.exit(1)
