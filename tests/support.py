"""Helpers for end-to-end tests: real git repositories and config files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from reconciler.spec.types import ObjectKey, TaskSpec

if TYPE_CHECKING:
    from reconciler.dashboard import Dashboard
    from reconciler.tick import Parts, TickResult

# float32: vLLM CPU picks its kernels by processor for bfloat16 (AMX tiles on Intel Xeons that have
# them, AVX512-BF16 elsewhere, emulation without either); float32 runs the same AVX kernels on every
# x86 machine, so the suite does not depend on the processor it runs on (docs/notes/vllm-cpu.md).
ENGINE = {"max_model_len": 256, "dtype": "float32", "enforce_eager": True}
GIT_ENV = {
    "GIT_AUTHOR_NAME": "test",
    "GIT_AUTHOR_EMAIL": "test@example.com",
    "GIT_COMMITTER_NAME": "test",
    "GIT_COMMITTER_EMAIL": "test@example.com",
}


def git(cwd: Path | str, *args: str, check: bool = True) -> str:
    proc = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, env={**os.environ, **GIT_ENV}, check=False
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {proc.stderr}")
    return proc.stdout


def status_test_repo(root: Path) -> tuple[Path, str]:
    """A bare repository ``root/config.git`` with one commit on ``main`` pushed from its clone
    ``root/work`` (the status-branch tests write beside it). Returns (bare, commit)."""
    bare = root / "config.git"
    git(root, "init", "-q", "--bare", "-b", "main", str(bare))
    work = root / "work"
    git(root, "clone", "-q", str(bare), str(work))
    (work / "README.md").write_text("config\n")
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "init")
    git(work, "push", "-q", "origin", "HEAD:main")
    return bare, git(work, "rev-parse", "HEAD").strip()


class ConfigRepo:
    """A bare repository (what the daemon watches) and a clone users push from."""

    def __init__(self, root: Path) -> None:
        self.bare = root / "config.git"
        self.work = root / "work"
        git(root, "init", "-q", "--bare", "-b", "main", str(self.bare))
        git(root, "clone", "-q", str(self.bare), str(self.work))
        git(self.work, "checkout", "-q", "-b", "main")

    def write(self, rel: str, data: dict[str, Any] | str) -> None:
        path = self.work / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))

    def remove(self, rel: str) -> None:
        (self.work / rel).unlink()

    def commit(self, message: str, *extra: str) -> str:
        git(self.work, "add", "-A")
        git(self.work, "commit", "-q", "--allow-empty", "-m", message, *extra)
        return git(self.work, "rev-parse", "HEAD").strip()

    def push(self) -> None:
        git(self.work, "push", "-q", "origin", "HEAD:main")

    def commit_push(self, message: str, *extra: str) -> str:
        sha = self.commit(message, *extra)
        self.push()
        return sha

    def status_commits(self, branch: str = "argus/status") -> int:
        out = git(self.bare, "rev-list", "--count", branch, check=False).strip()
        return int(out) if out else 0

    def note(self, commit: str) -> str:
        return git(self.bare, "notes", "--ref=argus", "show", commit, check=False)


def cluster_yaml(hf_cache: Path, users_root: Path, serve_port: int, **extra: Any) -> dict[str, Any]:
    """A CPU cluster.yaml whose Serve proxy is the session head's ``serve_port`` (Serve's own,
    internal port); argus's endpoint is wherever each ``argus run`` binds it (:class:`ArgusRun`)."""
    from reconciler.testing.ray_head import free_port

    doc: dict[str, Any] = {
        "kind": "Cluster",
        "paths": {"common": str(hf_cache), "users": str(users_root)},
        "serving": {
            "accelerator": "cpu",
            "http_port": free_port(),
            "internal_http_port": serve_port,
            "cpus_per_replica": 1,
        },
        "training": {"driver_resources": {"worker_node": 1}},
        "env": {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"},
    }
    doc.update(extra)
    return doc


def two_teams(hf_cache: Path, users_root: Path, serve_port: int) -> dict[str, Any]:
    """cluster.yaml of two teams of one GPU each: research (alice, tasks best-effort by default)
    and product (bob, models production by default)."""
    return cluster_yaml(
        hf_cache,
        users_root,
        serve_port,
        users={"alice": {}, "bob": {}},
        priority_classes={"production": 1000, "best-effort": 0},
        default_priority={"models": "production", "tasks": "best-effort"},
        teams={
            "research": {"members": ["alice"], "quota": {"gpus": 1}},
            "product": {"members": ["bob"], "quota": {"gpus": 1}},
        },
    )


def add_suspended_objects(repo: ConfigRepo, home: Path, users: int) -> None:
    """Write ``users`` users x (5 models + 5 tasks), all suspended (nothing is deployed), into
    ``repo``'s work tree, each model's folder under ``home``: the benches' big repositories."""
    model = yaml.safe_dump({"kind": "Model", "source": "$HOME/models/m", "suspend": True})
    task = yaml.safe_dump({"kind": "Task", "workload": "command", "command": "true", "suspend": True})
    for u in range(users):
        user = f"user{u:05d}"
        (home / user / "models" / "m").mkdir(parents=True)
        for kind, text in (("models", model), ("tasks", task)):
            folder = repo.work / "users" / user / kind
            folder.mkdir(parents=True)
            for i in range(5):
                (folder / f"{kind[0]}{i}.yaml").write_text(text)


def site_repo(root: Path, hf_cache: Path, serve_port: int, *users: str, **cluster: Any) -> ConfigRepo:
    """A config repository under ``root`` whose cluster.yaml (not yet committed) puts the users'
    folders in ``root/users``, with a folder for each of ``users``."""
    for user in users:
        (root / "users" / user).mkdir(parents=True, exist_ok=True)
    repo = ConfigRepo(root)
    repo.write("cluster.yaml", cluster_yaml(hf_cache, root / "users", serve_port, **cluster))
    return repo


def model_yaml(source: str, replicas: int = 1, **fields: Any) -> dict[str, Any]:
    return {"kind": "Model", "source": source, "replicas": replicas, "engine_kwargs": dict(ENGINE), **fields}


def wait_for(check: Callable[[], Any], what: str, timeout: float = 60.0, every: float = 1.0) -> Any:
    """Poll ``check`` until it returns something truthy (returned); fail naming ``what``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


def remove_apps(dash: Dashboard, doomed: Callable[[str], bool], timeout: float = 300.0) -> None:
    """PUT every declarative Serve app except the ``doomed`` ones, and wait until Serve lists
    none of them, so the Serve instance the test session shares is as other modules expect it: an
    ``argus--`` app still being deleted is every argus's (its replicas hold what they held), and
    the next module's admission counted one for minutes once (vLLM on CPU stops slowly)."""
    from reconciler.observe.serve import observe_serve

    obs = observe_serve(dash)
    keep = [a for n, a in obs.apps.items() if not doomed(n)]
    gone = {n for n in obs.apps if doomed(n)}  # declarative apps: what the PUT removes
    if gone:
        body: dict[str, Any] = {"applications": keep}
        if obs.http_options:
            body["http_options"] = obs.http_options
        if obs.proxy_location:
            body["proxy_location"] = obs.proxy_location
        dash.put("/api/serve/applications/", body)
    wait_for(
        lambda: not gone & observe_serve(dash).statuses.keys(),
        "the removed Serve applications to be gone",
        timeout=timeout,
    )


TASK_RAW_FIELDS = (
    "workload",
    "model",
    "nodes",
    "gpus_per_node",
    "epochs",
    "steps",
    "overrides",
    "command",
    "env",
    "run",
)


def task_spec(user: str, name: str, workload: str = "command", **fields: Any) -> TaskSpec:
    """A resolved TaskSpec as the loader would produce it; ``raw`` (what the spec hash covers)
    is built from the fields a task file holds, plus the name."""
    base: dict[str, Any] = {
        "key": ObjectKey(user, "task", name),
        "workload": workload,
        "model": None,
        "model_path": None,
        "data_train": None,
        "data_val": None,
        "nodes": 1,
        "gpus_per_node": 1,
        "epochs": None,
        "steps": None,
        "overrides": (),
        "override_lines": (),
        "command": None,
        "working_dir": None,
        "env": {},
        "run": 1,
        "suspend": False,
        "created_at": 0,
    }
    base.update(fields)
    raw = {k: base[k] for k in TASK_RAW_FIELDS}
    if raw["epochs"] is None:  # the loader hashes a file without `epochs` as `epochs: 1`
        raw["epochs"] = 1
    return TaskSpec(**base, raw={**raw, "name": name})


class ArgusRun:
    """``argus run ARGS`` as a subprocess in its own process session, its output in ``log``.

    Stopped by its own pid (SIGTERM, then SIGKILL after ``grace`` seconds): never by name."""

    def __init__(self, args: Sequence[str], log: Path, env: Mapping[str, str] | None = None) -> None:
        from reconciler.testing.ray_head import free_port

        self.args, self.log_path = list(args), log
        self.env = dict(os.environ if env is None else env)
        # The OpenAI endpoint on loopback at a free port (never 0.0.0.0 at cluster.yaml's port:
        # tests share the machine), unless the test names one.
        self.env.setdefault("ARGUS_OPENAI_LISTEN", f"127.0.0.1:{free_port()}")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def openai_url(self) -> str:
        """The base URL of this daemon's OpenAI endpoint (``.../v1`` for clients)."""
        return f"http://{self.env['ARGUS_OPENAI_LISTEN']}"

    def start(self) -> ArgusRun:
        with open(self.log_path, "wb") as out:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "reconciler.cli", "run", *self.args],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_serving(self, url: str, timeout: float = 60.0) -> None:
        """Wait until ``url`` answers any HTTP status; raises AssertionError (with the log) if the
        daemon exits first or ``timeout`` passes."""
        import urllib.error
        import urllib.request

        def answers() -> bool:
            assert self.alive(), self.log()
            try:
                urllib.request.urlopen(url, timeout=2).read()
            except urllib.error.HTTPError:
                pass
            except OSError:
                return False
            return True

        wait_for(answers, f"the daemon to answer {url}", timeout=timeout, every=0.5)

    def stop(self, grace: float = 30.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class Ticker:
    """Ticks as the daemon's loop does, in a test: the parts (``reconciler.daemon.build_parts``)
    and the memory each tick hands the next."""

    def __init__(self, parts: Parts) -> None:
        from reconciler.plan.memory import Memory

        self.parts = parts
        self.memory = Memory()

    def tick(self, commit: str | None = None, *, fetch: bool = True) -> TickResult:
        """One tick of the branch head (or ``commit``). Returns its result."""
        result, self.memory = self.parts.run(self.memory, commit, fetch=fetch)
        return result

    def timer(self) -> None:
        """What the loop does before a timer tick: file-system answers and capacity observed afresh."""
        self.parts.revisions.refresh_fs()
        self.parts.observer.forget_capacity()

    @property
    def first_seen(self) -> Mapping[ObjectKey, int]:
        return self.memory.order.first_seen


def ticker(source: Any, branch: str, dash: Any, **options: Any) -> Ticker:
    """A :class:`Ticker` of ``build_parts(source, branch, dash, **options)``."""
    from reconciler.daemon import build_parts

    return Ticker(build_parts(source, branch, dash, **options))


def stop_users_runs(dash: Dashboard, users: Collection[str], timeout: float = 120.0) -> None:
    """Stop every PENDING or RUNNING job of ``users`` on the shared Ray head and wait until they
    stopped: the next test on that head counts on their GPUs being free again."""
    from reconciler.apply.jobs import stop_job

    stopping = []
    for job in dash.get("/api/jobs/"):
        meta = job.get("metadata") or {}
        if meta.get("argus-user") in users and job.get("status") in ("PENDING", "RUNNING"):
            stop_job(dash, str(job["submission_id"]))
            stopping.append(str(job["submission_id"]))
    wait_for(
        lambda: (
            not any(
                j.get("status") in ("PENDING", "RUNNING")
                for j in dash.get("/api/jobs/")
                if j["submission_id"] in stopping
            )
        ),
        "the runs of " + ", ".join(sorted(users)) + " to stop",
        timeout=timeout,
    )


def ssh_key(folder: Path, who: str) -> tuple[Path, str]:
    """A fresh ed25519 key pair ``folder/who`` (commented ``who``): ``(private key path, public key line)``."""
    path = folder / who
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", who, "-f", str(path)], check=True)
    return path, Path(f"{path}.pub").read_text().strip()
