"""The daemon end to end: real git (a bare repository users push to), a real Ray head,
Ray Serve + vLLM CPU, the daemon as a subprocess (``argus run``), the official OpenAI client.

Tests run in file order and share one daemon history: deploy by push, broken push, idle,
webhooks, kill -9 at named points, signed commits, delete by push.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Collection, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from reconciler.dashboard import Dashboard
from reconciler.observe.serve import observe_serve
from reconciler.spec.types import ObjectKey
from reconciler.status.branch import read_documents
from reconciler.testing.ray_head import RayHead, free_port
from tests.support import (
    ArgusRun,
    ConfigRepo,
    cluster_yaml,
    git,
    model_yaml,
    remove_apps,
    site_repo,
    stop_users_runs,
    wait_for,
)

pytestmark = pytest.mark.e2e

SECRET = "s3cret-webhook"
MODEL = "users/carol/models/chat.yaml"
TASK = "users/carol/tasks/sleepy.yaml"
KEY = ObjectKey("carol", "model", "chat")


class DaemonProc:
    """``argus run`` against the session's Ray head, restartable (``start`` again after a kill)."""

    def __init__(self, repo: ConfigRepo, head: RayHead, log_dir: Path) -> None:
        self.repo, self.head, self.log_dir = repo, head, log_dir
        self.listen = f"127.0.0.1:{free_port()}"
        self.openai_listen = f"127.0.0.1:{free_port()}"  # the same across restarts
        self.run: ArgusRun | None = None
        self.starts = 0

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.run.proc if self.run is not None else None

    def start(self, fault: str | None = None, extra_env: dict[str, str] | None = None) -> None:
        self.starts += 1
        env = {**os.environ, "ARGUS_WEBHOOK_SECRET": SECRET, "ARGUS_OPENAI_LISTEN": self.openai_listen}
        env.update(extra_env or {})
        env.pop("ARGUS_FAULT", None)
        if fault:
            env["ARGUS_FAULT"] = fault
        args = ["--repo", str(self.repo.bare), "--ray", self.head.dashboard_url, "--listen", self.listen]
        args += ["--observe-interval", "1", "--endpoint", f"{self.openai_url}/v1"]
        self.run = ArgusRun(args, self.log_dir / f"daemon-{self.starts}.log", env).start()
        wait_for(self.healthy_or_dead, "daemon HTTP server", timeout=60)

    @property
    def openai_url(self) -> str:
        """This daemon's OpenAI endpoint (clients add ``/v1``)."""
        return f"http://{self.openai_listen}"

    def healthy_or_dead(self) -> bool:
        assert self.run is not None
        if not self.run.alive():
            return True
        try:
            urllib.request.urlopen(f"http://{self.listen}/metrics", timeout=2).read()
            return True
        except OSError:
            return False

    def wait_killed(self, timeout: float = 300.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        if self.run is not None:
            self.run.stop(grace=20)

    def log(self) -> str:
        return self.run.log() if self.run is not None else ""


@contextlib.contextmanager
def daemon_for(
    head: RayHead, root: Path, users: Collection[str], apps_of: Collection[str] = ()
) -> Iterator[DaemonProc]:
    """A daemon (not started) for a fresh config repository under ``root``. On exit it is stopped,
    then the runs of ``users`` and the applications of ``apps_of`` are removed from the shared
    head: the next test counts on their GPUs being free again."""
    proc = DaemonProc(ConfigRepo(root), head, root)
    try:
        yield proc
    finally:
        proc.stop()
        dash = Dashboard(head.dashboard_url)
        stop_users_runs(dash, users)
        if apps_of:
            remove_apps(dash, lambda name: any(name.startswith(f"argus--{user}--") for user in apps_of))


@dataclass
class Env:
    repo: ConfigRepo
    daemon: DaemonProc
    dash: Dashboard
    head: RayHead
    hf_cache: Path
    users: Path


@pytest.fixture(scope="module")
def env(ray_head: RayHead, tiny_llama: Path, hf_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("daemon")
    users = root / "users"
    repo = site_repo(root, hf_cache, ray_head.serve_port, "carol")
    daemon = DaemonProc(repo, ray_head, root)
    dash = Dashboard(ray_head.dashboard_url)
    daemon.start()
    try:
        yield Env(repo, daemon, dash, ray_head, hf_cache, users)
    finally:
        daemon.stop()
        remove_apps(dash, lambda name: name.startswith("argus--carol--"))


def status(repo: ConfigRepo, path: str = MODEL) -> dict[str, Any]:
    return read_documents(str(repo.bare), "argus/status").get(path) or {}


def replica_ids(dash: Dashboard, app: str = "argus--carol--chat") -> tuple[str, ...]:
    return observe_serve(dash).replica_ids.get(app, ())


def owned_jobs(dash: Dashboard, sid_prefix: str) -> list[dict[str, Any]]:
    return [j for j in dash.get("/api/jobs/") if str(j.get("submission_id", "")).startswith(sid_prefix)]


def test_push_deploys_model_and_status_shows_running(env: Env) -> None:
    repo, dash = env.repo, env.dash
    repo.write(MODEL, model_yaml("argus-test/tiny-llama"))
    repo.commit_push("carol: deploy chat")
    doc = wait_for(  # first model load: up to minutes on 2 cores
        lambda: status(repo).get("state") == "RUNNING" and status(repo)["replicas"]["ready"] == 1 and status(repo),
        "chat RUNNING on the status branch",
        timeout=300,
    )
    served = doc["served_name"]
    assert served.startswith("carol-") and served.endswith("-chat")
    assert "argus--carol--chat" in observe_serve(dash).apps
    readme = git(repo.bare, "show", "argus/status:README.md")
    assert served in readme and "| carol | model | chat | RUNNING |" in readme

    import openai

    client = openai.OpenAI(base_url=env.head.serve_url + "/v1", api_key="none", max_retries=0, timeout=60)
    wait_for(lambda: served in [m.id for m in client.models.list().data], "router lists the model", timeout=60)
    reply = client.chat.completions.create(model=served, messages=[{"role": "user", "content": "hi"}], max_tokens=8)
    assert reply.choices[0].message.content is not None


def test_broken_push_is_noted_and_running_model_untouched(env: Env) -> None:
    repo, dash = env.repo, env.dash
    before = replica_ids(dash)
    assert before
    repo.write(MODEL, "kind: Model\nsource: argus-test/tiny-llama\nreplicas: two\n")
    sha = repo.commit_push("carol: typo")
    note = wait_for(lambda: repo.note(sha), "a note on the broken commit", timeout=60)
    assert f"{MODEL}:3: replicas: expected an integer" in note
    assert status(repo)["sync"] == "Invalid" and status(repo)["state"] == "RUNNING"
    assert replica_ids(dash) == before
    repo.write(MODEL, model_yaml("argus-test/tiny-llama"))
    repo.commit_push("carol: fix typo")
    wait_for(lambda: status(repo).get("sync") == "Synced", "Synced again", timeout=60)
    assert replica_ids(dash) == before


def test_idle_makes_no_status_commits(env: Env) -> None:
    """Idle, no status document changes. Usage is recorded still (docs/design/usage.md): the tokens
    of the requests just made (read from the router's meter up to a minute later) and the running
    model's sampled GPU-seconds (at most every 10 minutes): at most two commits in a minute, each
    changing only usage documents."""
    repo = env.repo
    time.sleep(3)  # let the last transition settle
    start = git(repo.bare, "rev-parse", "argus/status").strip()
    time.sleep(60)
    commits = git(repo.bare, "rev-list", f"{start}..argus/status").split()
    for commit in commits:
        changed = git(repo.bare, "diff-tree", "--no-commit-id", "--name-only", "-r", commit).split()
        assert changed and all(path.startswith("usage/") for path in changed), (commit, changed)
    assert len(commits) <= 2, commits


def _post_hook(daemon: DaemonProc, body: bytes, headers: dict[str, str]) -> int:
    req = urllib.request.Request(f"http://{daemon.listen}/hooks/git", data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_webhook_signatures(env: Env) -> None:
    daemon = env.daemon
    body = json.dumps({"ref": "refs/heads/main"}).encode()
    good = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    assert _post_hook(daemon, body, {"X-Hub-Signature-256": good, "Content-Type": "application/json"}) == 202
    assert _post_hook(daemon, body, {"X-Hub-Signature-256": "sha256=" + "0" * 64}) == 401
    assert _post_hook(daemon, body, {"X-Gitlab-Token": "wrong"}) == 401
    assert _post_hook(daemon, body, {}) == 401
    assert _post_hook(daemon, body, {"X-Gitlab-Token": SECRET}) == 202
    metrics = urllib.request.urlopen(f"http://{daemon.listen}/metrics", timeout=5).read().decode()
    assert 'argus_errors_total{kind="webhook_signature"} 3' in metrics
    assert "argus_reconcile_duration_seconds_count" in metrics
    assert 'argus_objects{kind="model",state="RUNNING"} 1' in metrics


def _task_yaml(seconds: int, run: int = 1) -> dict[str, Any]:
    return {"kind": "Task", "workload": "command", "command": f"sleep {seconds}", "gpus_per_node": 1, "run": run}


def test_kill9_after_submit_never_duplicates_the_job(env: Env) -> None:
    repo, daemon, dash = env.repo, env.daemon, env.dash
    daemon.stop()
    daemon.start(fault="after_submit")
    repo.write(TASK, _task_yaml(2))
    repo.commit_push("carol: a task")
    assert daemon.wait_killed(timeout=60) == -signal.SIGKILL
    assert len(owned_jobs(dash, "argus--carol--sleepy--")) == 1
    daemon.start()
    wait_for(lambda: status(repo, TASK).get("state") in ("RUNNING", "SUCCEEDED", "PENDING"), "task status", timeout=60)
    wait_for(lambda: status(repo, TASK).get("state") == "SUCCEEDED", "task SUCCEEDED", timeout=120)
    time.sleep(3)
    assert len(owned_jobs(dash, "argus--carol--sleepy--")) == 1


def test_kill9_during_serve_put_loses_and_restarts_nothing(env: Env) -> None:
    repo, daemon, dash = env.repo, env.daemon, env.dash
    first = replica_ids(dash)
    daemon.stop()
    daemon.start(fault="serve_put")
    repo.write(MODEL, model_yaml("argus-test/tiny-llama", replicas=2))
    repo.commit_push("carol: scale to 2")
    assert daemon.wait_killed(timeout=60) == -signal.SIGKILL
    daemon.start()
    wait_for(
        lambda: status(repo).get("replicas", {}).get("ready") == 2 and status(repo)["sync"] == "Synced",
        "2 replicas ready",
        timeout=300,
    )
    assert set(first) <= set(replica_ids(dash)), "the first replica must not be restarted by a scale-up"


def test_kill9_during_status_commit_converges(env: Env) -> None:
    repo, daemon, dash = env.repo, env.daemon, env.dash
    ids = replica_ids(dash)
    jobs = len(owned_jobs(dash, "argus--carol--"))
    daemon.stop()
    daemon.start(fault="status_commit")
    repo.write(TASK, _task_yaml(1, run=2))
    sha = repo.commit_push("carol: run the task again")
    assert daemon.wait_killed(timeout=60) == -signal.SIGKILL
    daemon.start()
    wait_for(
        lambda: status(repo, TASK).get("revision", {}).get("last_attempted") == sha,
        "status of the new commit",
        timeout=30,
    )
    assert len(owned_jobs(dash, "argus--carol--")) == jobs + 1
    assert replica_ids(dash) == ids


def test_source_unavailable_deletes_nothing_and_recovers(env: Env) -> None:
    repo, dash = env.repo, env.dash
    head = git(repo.bare, "rev-parse", "main").strip()
    ids = replica_ids(dash)
    git(repo.bare, "update-ref", "-d", "refs/heads/main")  # the branch is gone (a bad force push, say)
    wait_for(
        lambda: "source unavailable" in git(repo.bare, "show", "argus/status:README.md"),
        "the status README to say the source is unavailable",
        timeout=60,
    )
    assert status(repo)["state"] == "RUNNING", "an unavailable source must not delete anything"
    assert replica_ids(dash) == ids
    git(repo.bare, "update-ref", "refs/heads/main", head)
    wait_for(
        lambda: "source unavailable" not in git(repo.bare, "show", "argus/status:README.md"),
        "reconciling to resume",
        timeout=60,
    )
    assert replica_ids(dash) == ids


def test_ray_unreachable_backs_off_and_applies_nothing(env: Env, tmp_path: Path) -> None:
    env.daemon.stop()  # one daemon per repository (the lease): this one takes its place
    lost = DaemonProc(env.repo, env.head, tmp_path)
    lost.head = replace(env.head, ports={**env.head.ports, "dashboard-port": free_port()})  # nobody listens
    lost.start()
    try:
        time.sleep(8)
        assert lost.proc is not None and lost.proc.poll() is None, "the daemon must keep running"
        health = urllib.request.Request(f"http://{lost.listen}/healthz")
        try:
            urllib.request.urlopen(health, timeout=5)
            code = 200
        except urllib.error.HTTPError as exc:
            code = exc.code
        assert code == 503
        metrics = urllib.request.urlopen(f"http://{lost.listen}/metrics", timeout=5).read().decode()
        assert 'argus_errors_total{kind="ray"}' in metrics
        assert "ray_unavailable" in lost.log()
    finally:
        lost.stop()
        env.daemon.start()
    assert status(env.repo)["state"] == "RUNNING"


def test_push_deleting_the_model_removes_it(env: Env) -> None:
    repo, dash = env.repo, env.dash
    repo.remove(MODEL)
    repo.commit_push("carol: delete chat")
    wait_for(lambda: "argus--carol--chat" not in observe_serve(dash).apps, "app gone from Serve", timeout=120)
    wait_for(lambda: not status(repo), "status file removed", timeout=60)
    readme = git(repo.bare, "show", "argus/status:README.md")
    assert "| carol | model | chat |" not in readme


def _keygen(path: Path, who: str) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", who, "-f", str(path)], check=True)
    return Path(f"{path}.pub").read_text().strip()


def _signed_commit(repo: ConfigRepo, key: Path, message: str) -> str:
    git(repo.work, "add", "-A")
    git(repo.work, "-c", "gpg.format=ssh", "-c", f"user.signingkey={key}", "commit", "-q", "-S", "-m", message)
    repo.push()
    return git(repo.work, "rev-parse", "HEAD").strip()


def test_signed_commits_required(env: Env, tmp_path: Path) -> None:
    """The signing policy is the daemon's (flags/env, keys outside the repository): a push can
    neither switch it off nor, by rewriting history, replace the verified tree."""
    repo, dash = env.repo, env.dash
    carol_pub, admin_pub = _keygen(tmp_path / "carol", "carol"), _keygen(tmp_path / "root", "root")
    _keygen(tmp_path / "mallory", "mallory")
    signers = tmp_path / "allowed_signers"  # the daemon's, not the repository's
    signers.write_text(f"carol {carol_pub}\nroot {admin_pub}\n")
    trusted_from = git(repo.work, "rev-parse", "HEAD").strip()
    env.daemon.stop()
    env.daemon.start(
        extra_env={
            "ARGUS_REQUIRE_SIGNED_COMMITS": "1",
            "ARGUS_ALLOWED_SIGNERS": str(signers),
            "ARGUS_ADMINS": "root",
            "ARGUS_SIGNED_SINCE": trusted_from,
        }
    )
    try:
        # A push cannot switch signing off: cluster.yaml's security section is not the policy.
        doc = cluster_yaml(env.hf_cache, env.users, env.head.serve_port)
        doc["security"] = {"require_signed_commits": False}
        repo.write("cluster.yaml", doc)
        unsigned = "users/carol/tasks/unsigned.yaml"
        repo.write(unsigned, _task_yaml(1))
        sha = repo.commit_push("carol: unsigned change that also turns signing off")
        note = wait_for(lambda: repo.note(sha), "note on the unsigned commit", timeout=60)
        assert f"commit {sha[:12]}: {unsigned}: not signed by a key in the allowed signers file" in note
        assert f"commit {sha[:12]}: cluster.yaml: not signed" in note
        time.sleep(3)
        assert not owned_jobs(dash, "argus--carol--unsigned--")

        other = "users/carol/tasks/other.yaml"
        repo.write(other, _task_yaml(1))
        sha = _signed_commit(repo, tmp_path / "mallory", "mallory signs for carol")
        note = wait_for(lambda: repo.note(sha), "note on mallory's commit", timeout=60)
        assert f"{other}: not signed by a key" in note

        repo.write("users/carol/tasks/unsigned.yaml", _task_yaml(1, run=2))
        repo.write(other, _task_yaml(1, run=2))
        good = _signed_commit(repo, tmp_path / "carol", "carol: signed")
        wait_for(lambda: owned_jobs(dash, "argus--carol--unsigned--"), "carol's signed task submitted", timeout=60)
        wait_for(lambda: owned_jobs(dash, "argus--carol--other--"), "carol's other signed task submitted", timeout=60)

        # A force-push of an unsigned orphan commit that empties everyone's files: refused as a
        # history rewrite, the verified tree stays in force (nothing is stopped or deleted).
        git(repo.work, "checkout", "-q", "--orphan", "evil")
        git(repo.work, "rm", "-q", "-r", "--cached", "users")
        for path in (repo.work / "users").rglob("*.yaml"):
            path.unlink()
        repo.write("users/mallory/tasks/grab.yaml", _task_yaml(1))
        git(repo.work, "add", "-A")
        git(repo.work, "commit", "-q", "-m", "orphan")
        evil = git(repo.work, "rev-parse", "HEAD").strip()
        git(repo.work, "push", "-q", "--force", "origin", "HEAD:main")
        note = wait_for(lambda: repo.note(evil), "note on the force-pushed commit", timeout=60)
        assert "history rewritten: not applied" in note, note
        time.sleep(3)
        assert not owned_jobs(dash, "argus--mallory--")
        assert owned_jobs(dash, "argus--carol--unsigned--") and owned_jobs(dash, "argus--carol--other--")
        # ... also after a daemon restart (the last applied head is kept outside the repository).
        env.daemon.stop()
        env.daemon.start(
            extra_env={
                "ARGUS_REQUIRE_SIGNED_COMMITS": "1",
                "ARGUS_ALLOWED_SIGNERS": str(signers),
                "ARGUS_ADMINS": "root",
                "ARGUS_SIGNED_SINCE": trusted_from,
            }
        )
        time.sleep(4)
        assert not owned_jobs(dash, "argus--mallory--")
    finally:
        git(repo.work, "checkout", "-q", "-f", "main")
        git(repo.work, "reset", "-q", "--hard", good if "good" in locals() else trusted_from)
        git(repo.work, "push", "-q", "--force", "origin", "HEAD:main")
        env.daemon.stop()
        env.daemon.start()
