"""The compose stack users deploy, built and run for real: Debian's docker.io and docker-compose 1.29, a
private dockerd, Debian bases made with debootstrap, the three images built (the CPU variant of the Ray node),
and the CPU profile up on free ports. Everything after that goes through the interfaces users have: git and
sftp over SSH to the containers, the OpenAI endpoint, the status branch, the status page, ``argus logs``, the
git server's read-only commands over the key users push with (``ssh git@... status|logs|plan``);
and what a hostile job does with the Ray token it holds: run code on the head, where it finds nothing of the
daemon's (:mod:`reconciler.testing.boundary_probe`).

The steps share one stack and run in file order; each is its own test so that a report says which step
fails. It stops exactly the project it started (containers, networks, volumes) and the daemon if it
started it; the daemon's data root (/var/cache/argus-test-docker) stays as a layer cache between runs.
Timings of the build and of each step are written to $ARGUS_COMPOSE_TIMINGS when set.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from reconciler.status.branch import read_documents
from reconciler.testing import docker
from reconciler.testing.compose import ROOT, Stack, http_get, prepare, wait_for
from reconciler.testing.tiny_model import TINY_REPO, generate_tiny_llama

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(3600)]  # its first test builds every image (cold in CI)

STATUS = "argus/status"
MODEL_A = "users/alice/models/chat.yaml"
MODEL_B = "users/bob/models/chat.yaml"
TASK = "users/alice/tasks/read-data.yaml"
PROBE_TASK = "users/alice/tasks/probe-head.yaml"
# What a job tries from the head (reconciler.testing.boundary_probe): each is its own step and its own test.
PROBE_STEPS = (
    "ownership_key",
    "daemon_environment",
    "git_repository",
    "allowed_signers",
    "signal_daemon",
    "daemon_volumes",
)
GIT_ENV = {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}


def require_root() -> None:
    """The test installs packages and runs dockerd: root only. Skips elsewhere, fails in CI."""
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        message = "the compose test needs root on a Debian machine (it installs docker.io and runs dockerd)"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


def model_yaml() -> str:
    return yaml.safe_dump(
        {
            "kind": "Model",
            "source": TINY_REPO,
            "replicas": 1,
            "engine_kwargs": {"max_model_len": 256, "dtype": "float32", "enforce_eager": True},
        }
    )


def task_yaml(data: str) -> str:
    # Reads what alice uploaded through the file service from $HOME (argus sets it to her folder) and writes a
    # checkpoint there.
    command = (
        f"set -e; echo ran-on=$(hostname); echo home=$HOME; cat $HOME/{data}; mkdir -p $ARGUS_CHECKPOINT_DIR; "
        f"wc -c < $HOME/{data} > $ARGUS_CHECKPOINT_DIR/size.txt; echo checkpoint-written"
    )
    return yaml.safe_dump({"kind": "Task", "workload": "command", "command": command, "gpus_per_node": 1})


class Client:
    """A user's clone of the config repository over SSH, committing with her own key (SSH signatures)."""

    def __init__(self, stack: Stack, user: str, root: Path) -> None:
        self.stack, self.user, self.root = stack, user, root / f"work-{user}"

    def git(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            **GIT_ENV,
            "GIT_SSH_COMMAND": self.stack.ssh_command(self.user),
            "GIT_AUTHOR_NAME": self.user,
            "GIT_AUTHOR_EMAIL": f"{self.user}@example.com",
            "GIT_COMMITTER_NAME": self.user,
            "GIT_COMMITTER_EMAIL": f"{self.user}@example.com",
        }
        env.pop("GIT_NO_REPLACE_OBJECTS", None)  # a user's own git, not argus's
        proc = subprocess.run(["git", *args], cwd=self.root, env=env, capture_output=True, text=True, timeout=120)
        if check and proc.returncode != 0:
            raise AssertionError(f"{self.user}: git {' '.join(args)}: {proc.stderr}")
        return proc

    def clone(self) -> None:
        self.root.mkdir(parents=True)
        self.git("init", "-q", "-b", "main")
        self.git("remote", "add", "origin", self.stack.git_url())
        self.git("config", "gpg.format", "ssh")
        self.git("config", "user.signingkey", str(self.stack.key(self.user)))
        if self.git("ls-remote", "origin", "main").stdout.strip():
            self.pull()

    def pull(self) -> None:
        self.git("fetch", "-q", "origin", "main")
        self.git("reset", "-q", "--hard", "origin/main")

    def commit(self, files: dict[str, str | None], message: str, sign: bool = True) -> str:
        for path, text in files.items():
            target = self.root / path
            if text is None:
                target.unlink()
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text)
        self.git("add", "-A")
        self.git("commit", "-q", *(["-S"] if sign else []), "-m", message)
        return self.git("rev-parse", "HEAD").stdout.strip()

    def push(self, refspec: str = "main") -> subprocess.CompletedProcess[str]:
        return self.git("push", "origin", refspec, check=False)

    def status(self) -> dict[str, dict[str, Any]]:
        self.git("fetch", "-q", "origin", f"+refs/heads/{STATUS}:refs/heads/{STATUS}")
        return read_documents(str(self.root), STATUS)


class Env:
    def __init__(self, stack: Stack, tmp: Path) -> None:
        self.stack, self.tmp = stack, tmp
        self.admin = Client(stack, "admin", tmp)
        self.alice = Client(stack, "alice", tmp)
        self.bob = Client(stack, "bob", tmp)
        self.timings: dict[str, float] = {}
        self.api_keys: dict[str, str] = {}  # each user's API key, made over the git server's SSH

    def state(self, path: str) -> dict[str, Any]:
        return self.alice.status().get(path) or {}

    def running(self, path: str) -> dict[str, Any] | None:
        doc = self.state(path)
        return doc if doc.get("state") == "RUNNING" and (doc.get("replicas") or {}).get("ready") == 1 else None


def timings_out(timings: dict[str, float]) -> None:
    target = os.environ.get("ARGUS_COMPOSE_TIMINGS")
    if target:
        Path(target).write_text(json.dumps(timings, indent=2) + "\n")


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    require_root()
    started = time.monotonic()
    daemon = prepare()
    tmp = Path(tempfile.mkdtemp(prefix="argus-compose-", dir="/var/tmp"))
    tmp.chmod(0o755)
    stack = Stack(daemon, tmp)
    e = Env(stack, tmp)
    try:
        stack.setup()
        # The admin puts the model into the shared cache (read-only to users), as docs/compose.md says.
        generate_tiny_llama(tmp / "private" / "hf")
        for path in (tmp / "private" / "hf", *(tmp / "private" / "hf").rglob("*")):
            os.chown(path, 1000, 1000, follow_symlinks=False)
        e.timings["prepare_s"] = time.monotonic() - started
        build = time.monotonic()
        stack.compose("build", timeout=3600)
        e.timings["build_s"] = time.monotonic() - build
        e.timings["up_s"] = stack.up()
        wait_for(stack.answers, "the daemon's /healthz on the webhook port", timeout=300)
        e.timings["healthy_s"] = time.monotonic() - build
        yield e
    except BaseException:
        print(stack.logs(), file=sys.stderr)
        raise
    finally:
        if os.environ.get("ARGUS_COMPOSE_KEEP") != "1":
            stack.down()
        e.timings["total_s"] = time.monotonic() - started
        timings_out(e.timings)
        if os.environ.get("ARGUS_COMPOSE_KEEP") != "1":
            docker.stop_daemon(daemon)
            shutil.rmtree(tmp, ignore_errors=True)


def test_images_and_services(env: Env) -> None:
    names = {line.split()[0] for line in env.stack.compose("ps", "--services").stdout.splitlines() if line}
    assert names == {"head", "argus", "endpoint", "worker-1", "worker-2", "git", "files"}
    sizes = env.stack.daemon.docker("image", "ls", "--format", "{{.Repository}}:{{.Tag}} {{.Size}}").stdout
    for image in ("argus-ray-node:cpu", "argus-git-server:latest", "argus-sftp:latest"):
        assert image in sizes, sizes
    print("images:", sizes, file=sys.stderr)

    def alive() -> int:
        nodes = env.stack.dashboard("/nodes?view=summary")["data"]["summary"]
        return len([n for n in nodes if n.get("raylet", {}).get("state") == "ALIVE"])

    # The workers join once the head answers: the head and two workers, with the Ray auth token.
    wait_for(lambda: alive() == 3, "three Ray nodes", timeout=300, every=5)
    # The dashboard refuses callers without the token.
    assert http_get(env.stack.url("ARGUS_DASHBOARD_PORT", "/api/version"))[0] in (401, 403)


def test_the_daemon_runs_alone_under_its_own_uid(env: Env) -> None:
    (user, _), *others = daemon_processes(env)
    assert user == "argusd" and not others, "one `argus run`, as argusd"
    uid = env.stack.exec("argus", "id", "-u", "argusd").stdout.strip()
    assert uid not in ("0", "1000"), f"the daemon's uid {uid} is root's or Ray's"
    # Nothing of the daemon's on any Ray node: no process, no secret in the environment, no volume.
    for node in ("head", "worker-1", "worker-2"):
        assert "argus run" not in env.stack.exec(node, "ps", "-eo", "args").stdout, node
        environ = env.stack.exec(node, "sh", "-c", "cat /proc/1/environ | tr '\\0' '\\n'").stdout
        assert env.stack.webhook_secret not in environ and "ARGUS_WEBHOOK_SECRET" not in environ, node
        mounts = env.stack.exec(node, "cat", "/proc/self/mountinfo").stdout
        assert not [m for m in ("/srv/git", "/var/cache/argus", "/keys") if f" {m} " in mounts], node


def daemon_processes(env: Env) -> list[tuple[str, str]]:
    """(user, pid) of each `argus run` in the daemon's container."""
    ps = env.stack.exec("argus", "ps", "-eo", "user:20,pid,args").stdout.splitlines()[1:]
    return [(line.split()[0], line.split()[1]) for line in ps if line.rstrip().endswith("/argus run")]


def test_pages_are_on_their_own_address(env: Env) -> None:
    assert http_get(env.stack.url("ARGUS_HTTP_PORT", "/"))[0] == 404
    assert http_get(env.stack.url("ARGUS_HTTP_PORT", "/api/v1/objects"))[0] == 404
    assert http_get(env.stack.url("ARGUS_HTTP_PORT", "/metrics"))[0] == 200
    assert http_get(env.stack.url("ARGUS_WEB_PORT", "/"))[0] == 200


def test_users_push_and_upload(env: Env) -> None:
    stack = env.stack
    env.admin.clone()
    cluster = (ROOT / "desired-state" / "cpu" / "cluster.yaml").read_text()
    env.admin.commit({"cluster.yaml": cluster}, "admin: the cluster")
    pushed = env.admin.push()
    assert pushed.returncode == 0, pushed.stderr
    # alice uploads her data with sftp (the account appears within seconds of her key).
    data = env.tmp / "client" / "data.txt"
    data.write_text("hello from alice's upload\n")
    sftp = [
        "sftp",
        *stack.ssh_command("alice").split()[1:],
        "-P",
        str(stack.ports["ARGUS_SFTP_PORT"]),
        "-b",
        "-",
        "alice@127.0.0.1",
    ]
    wait_for(
        lambda: subprocess.run(sftp, input=f"put {data} data.txt\n", capture_output=True, text=True).returncode == 0,
        "alice's sftp upload",
        timeout=60,
    )
    env.alice.clone()
    env.alice.commit({MODEL_A: model_yaml(), TASK: task_yaml("data.txt")}, "alice: a model and a task")
    started = time.monotonic()
    pushed = env.alice.push()
    assert pushed.returncode == 0, pushed.stderr
    env.timings["push_started"] = started


def test_task_runs_on_a_worker_and_reads_the_upload(env: Env) -> None:
    doc = wait_for(lambda: env.state(TASK).get("state") in ("SUCCEEDED", "FAILED") and env.state(TASK), "task", 400)
    assert doc["state"] == "SUCCEEDED", doc
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "reconciler.cli",
            "logs",
            "alice/tasks/read-data",
            "--server",
            env.stack.url("ARGUS_WEB_PORT"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr
    assert "hello from alice's upload" in out.stdout and "checkpoint-written" in out.stdout
    assert "home=/private/users/alice" in out.stdout, out.stdout
    ran_on = next(line.split("=", 1)[1] for line in out.stdout.splitlines() if line.startswith("ran-on="))
    assert ran_on in ("worker-1", "worker-2"), f"the driver ran on {ran_on}, not on a worker"
    checkpoints = list((env.tmp / "private" / "users" / "alice" / "jobs" / "read-data").rglob("size.txt"))
    assert checkpoints and checkpoints[0].read_text().strip() == "26"


def git_ssh(env: Env, user: str, *command: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``ssh -p PORT git@127.0.0.1 COMMAND...`` with ``user``'s key: the git server's argus commands."""
    login = [*env.stack.ssh_command(user).split(), "-p", str(env.stack.ports["ARGUS_GIT_SSH_PORT"])]
    return subprocess.run(
        [*login, "git@127.0.0.1", *command], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


def api_key(env: Env, user: str) -> str:
    """``user``'s API key for the OpenAI endpoint, made once with ``ssh git@... key new`` (the endpoint is closed
    by default: the daemon reads the git server's self-service keys file)."""
    if user not in env.api_keys:
        made = git_ssh(env, user, "key", "new")
        assert made.returncode == 0 and made.stdout.startswith(f"argus-{user}-"), made.stderr
        env.api_keys[user] = made.stdout.strip()
    return env.api_keys[user]


def test_users_read_status_and_logs_over_the_git_servers_ssh(env: Env) -> None:
    """The key alice pushes with reads status and her own logs from the git server (no host account, no
    tunnel); bob's key cannot read hers; nothing but the argus commands and git runs."""
    status = git_ssh(env, "alice", "status")
    assert status.returncode == 0, status.stderr
    rows = {line.split()[0]: line.split()[1] for line in status.stdout.splitlines()[1:] if not line.startswith(" ")}
    assert rows.get("alice/tasks/read-data") == "SUCCEEDED", status.stdout
    assert "alice/tasks/read-data" in git_ssh(env, "bob", "status", "alice/tasks/read-data").stdout
    for follow in ([], ["--follow"]):  # a finished run: its output, then the command ends
        own = git_ssh(env, "alice", "logs", "alice/tasks/read-data", *follow)
        assert own.returncode == 0, (follow, own.stderr)
        assert "hello from alice's upload" in own.stdout and "checkpoint-written" in own.stdout, own.stdout
    # `argus logs` in her clone, with no --server: over SSH to the git server it pushes to, by itself.
    cli_env = {**os.environ, **GIT_ENV, "PYTHONPATH": str(ROOT), "GIT_SSH_COMMAND": env.stack.ssh_command("alice")}
    cli_env.pop("ARGUS_SERVER", None)
    out = subprocess.run(
        [sys.executable, "-m", "reconciler.cli", "logs", "alice/tasks/read-data"],
        cwd=env.alice.root,
        capture_output=True,
        text=True,
        timeout=120,
        env=cli_env,
    )
    assert out.returncode == 0 and "checkpoint-written" in out.stdout, out.stderr
    refused = git_ssh(env, "bob", "logs", "alice/tasks/read-data")
    assert refused.returncode == 1 and "you may read only your own logs" in refused.stderr, refused
    assert "hello from alice" not in refused.stdout
    for command in (["ls"], ["logs alice/tasks/read-data; id"], ["sh", "-c", "id"]):
        other = git_ssh(env, "alice", *command)
        assert other.returncode == 1 and "not an argus command" in other.stderr, (command, other)
        assert "uid=" not in other.stdout + other.stderr and "hello" not in other.stdout
    plan = git_ssh(env, "alice", "plan")
    assert plan.returncode == 0 and "last applied:" in plan.stdout, plan.stderr
    # Pushing still works with the same key (a branch the daemon does not read; later steps push to main).
    pushed = env.alice.push("HEAD:refs/heads/alice-ssh-check")
    assert pushed.returncode == 0, pushed.stderr


def probe_lines(output: str) -> dict[str, Any]:
    """The probe's JSON lines by step (and ``ran_on``), from a job's log or a command's output."""
    out: dict[str, Any] = {}
    for line in output.splitlines():
        if line.startswith("{"):
            try:
                item = json.loads(line)
            except ValueError:
                continue
            if "step" in item:
                out[item["step"]] = item
            elif "ran_on" in item:
                out["ran_on"] = item["ran_on"]
    return out


@pytest.fixture(scope="module")
def head_probe(env: Env) -> dict[str, dict[str, Any]]:
    """Alice's task submits, with the Ray token it holds, a job without entrypoint resources (Ray runs its
    driver on the head) that tries each step; the same probe also runs in the daemon's container, as the
    daemon, where each step must reach what it looks for (so no step passes because it looks nowhere)."""
    stack = env.stack
    secret_sha256 = hashlib.sha256(stack.webhook_secret.encode()).hexdigest()
    probe = ["python3", "-m", "reconciler.testing.boundary_probe", "probe", "--secret-sha256", secret_sha256]
    control = probe_lines(stack.exec("argus", "argus-node", *probe).stdout)
    before = daemon_processes(env), signers(env)
    sid = f"head-probe-{secrets.token_hex(3)}"
    command = (
        "echo ran-on=$(hostname); python3 -m reconciler.testing.boundary_probe submit "
        f"--submission-id {sid} --secret-sha256 {secret_sha256}"
    )
    task = yaml.safe_dump({"kind": "Task", "workload": "command", "command": command, "gpus_per_node": 1})
    env.alice.pull()
    env.alice.commit({PROBE_TASK: task}, "alice: a task whose code submits a job of its own")
    pushed = env.alice.push()
    assert pushed.returncode == 0, pushed.stderr
    doc = wait_for(
        lambda: env.state(PROBE_TASK).get("state") in ("SUCCEEDED", "FAILED") and env.state(PROBE_TASK),
        "the probing task",
        timeout=600,
        every=5,
    )
    logs = stack.dashboard(f"/api/jobs/{sid}/logs").get("logs", "")
    print(f"the probe on the head:\n{logs}", file=sys.stderr)
    assert doc["state"] == "SUCCEEDED", (doc, logs)
    return {
        "head": probe_lines(logs),
        "control": control,
        "before": {"daemon": before[0], "signers": before[1]},
    }


def signers(env: Env) -> str:
    return env.stack.exec("argus", "cat", "/run/argus/allowed_signers").stdout


def test_a_job_runs_code_on_the_head(head_probe: dict[str, Any]) -> None:
    assert head_probe["head"].get("ran_on") == "head", "the probe's driver did not run on the head"
    assert head_probe["control"].get("ran_on") == "argus"


@pytest.mark.parametrize("step", PROBE_STEPS)
def test_from_the_head_a_job_cannot_reach(head_probe: dict[str, Any], step: str) -> None:
    control, head = head_probe["control"].get(step), head_probe["head"].get(step)
    assert control and control["reached"], f"{step}: the probe finds nothing even as the daemon: {control}"
    assert head is not None, f"{step}: the probe on the head did not report this step"
    assert not head["reached"], f"{step} LEAKED to a job on the head: {head['detail']}"


def test_the_daemon_is_untouched_by_the_probe(env: Env, head_probe: dict[str, Any]) -> None:
    assert env.stack.healthy()
    assert daemon_processes(env) == head_probe["before"]["daemon"], "the daemon was restarted or killed"
    assert signers(env) == head_probe["before"]["signers"]


def test_model_runs_on_a_worker_and_answers_openai(env: Env) -> None:
    doc = wait_for(lambda: env.running(MODEL_A), "alice's model RUNNING", timeout=600, every=5)
    env.timings["push_to_running_s"] = time.monotonic() - env.timings.pop("push_started")
    from openai import AuthenticationError, OpenAI

    base = env.stack.url("ARGUS_OPENAI_PORT", "/v1")
    chat = {"model": doc["served_name"], "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    with pytest.raises(AuthenticationError):  # closed by default: a key is needed
        OpenAI(base_url=base, api_key="unused", max_retries=0).chat.completions.create(**chat, temperature=0)
    # Her key, made over the git server's SSH, reaches the endpoint at the daemon's next tick.
    client = OpenAI(base_url=base, api_key=api_key(env, "alice"), max_retries=0)

    def answered() -> Any:
        try:
            return client.chat.completions.create(**chat, temperature=0)
        except AuthenticationError:
            return None

    answer = wait_for(answered, "alice's new API key accepted", timeout=60, every=2)
    assert answer.choices[0].message.content is not None
    # The endpoint is a service of its own: argus endpoint as argusd, no Ray token, the daemon's link only.
    ps = env.stack.exec("endpoint", "ps", "-eo", "user:20,args").stdout
    assert any(line.split()[0] == "argusd" and "argus endpoint" in line for line in ps.splitlines()), ps
    assert env.stack.exec("endpoint", "test", "-e", "/run/secrets/ray_auth_token", check=False).returncode != 0
    # No key reached Ray: the router's config holds the model table only.
    apps = env.stack.dashboard("/api/serve/applications/")["applications"]
    assert set(apps["argus-router"]["deployed_app_config"]["deployments"][0]["user_config"]) == {"models"}
    for service, expect in (("head", False), ("worker-1", None), ("worker-2", None)):
        ps = env.stack.exec(service, "ps", "-eo", "args").stdout
        if expect is False:
            assert "ServeReplica:argus--alice--chat" not in ps, "a replica on the head"
    replicas = sum(
        "ServeReplica:argus--alice--chat" in env.stack.exec(w, "ps", "-eo", "args").stdout
        for w in ("worker-1", "worker-2")
    )
    assert replicas == 1


def test_second_users_model_deploys_without_restarting_the_first(env: Env) -> None:
    pid_before = replica_pids(env, "alice")
    env.bob.clone()
    env.bob.commit({MODEL_B: model_yaml()}, "bob: a model")
    assert env.bob.push().returncode == 0
    wait_for(lambda: env.running(MODEL_B), "bob's model RUNNING", timeout=600, every=5)
    assert replica_pids(env, "alice") == pid_before, "alice's replica was restarted"


def replica_pids(env: Env, user: str) -> set[str]:
    pids = set()
    for worker in ("worker-1", "worker-2"):
        for line in env.stack.exec(worker, "ps", "-eo", "pid,args").stdout.splitlines():
            if f"ServeReplica:argus--{user}--chat" in line:
                pids.add(f"{worker}:{line.split()[0]}")
    return pids


def test_doctor_in_the_daemons_container_says_everything_works(env: Env) -> None:
    # What docs/compose.md tells the admin to run after `up` (and the first push): every line ok, exit 0.
    proc = env.stack.compose("exec", "-T", "argus", "argus-node", "argus", "doctor", check=False, timeout=120)
    print(proc.stdout, file=sys.stderr)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith(("ok", "FAIL"))]
    assert len(lines) == 13 and all(line.startswith("ok") for line in lines), proc.stdout
    assert any(line.startswith("ok    api keys: closed, ") for line in lines), proc.stdout
    assert "0 FAIL" in proc.stdout


def test_status_branch_and_page_show_both(env: Env) -> None:
    docs = env.alice.status()
    assert docs[MODEL_A]["state"] == "RUNNING" and docs[MODEL_B]["state"] == "RUNNING"
    assert docs[TASK]["state"] == "SUCCEEDED"
    status, body = http_get(env.stack.url("ARGUS_WEB_PORT", "/"))
    page = body.decode()
    assert status == 200 and "alice" in page and "bob" in page and "RUNNING" in page


@pytest.mark.parametrize(
    "refspec",
    [
        "main:refs/replace/0123456789012345678901234567890123456789",
        "main:refs/notes/argus",
        f"main:refs/heads/{STATUS}",
    ],
)
def test_reserved_refs_are_refused_by_the_git_server(env: Env, refspec: str) -> None:
    env.alice.pull()
    # Forced, as a hostile user would: the daemon's refs exist, and git's client refuses a non-fast-forward
    # push by itself (the server's hook must refuse it, not her client).
    proc = env.alice.push(f"+{refspec}")
    assert proc.returncode != 0 and "argus: refused" in proc.stderr, proc.stderr


def test_bob_cannot_change_alices_folder(env: Env) -> None:
    env.bob.pull()
    unsigned = env.bob.commit({MODEL_A: None}, "bob: delete alice's model (unsigned)", sign=False)
    wrongly = env.bob.commit({TASK: None}, "bob: delete alice's task (his own key)")
    assert env.bob.push().returncode == 0, "the git server authenticates; argus authorizes"

    def reported() -> bool:
        env.bob.git("fetch", "-q", "origin", "+refs/notes/argus:refs/notes/argus", check=False)
        notes = "".join(env.bob.git("notes", "--ref=argus", "show", c, check=False).stdout for c in (unsigned, wrongly))
        kept_out = [line for line in notes.splitlines() if "unverified change kept out" in line]
        return any(MODEL_A in line for line in kept_out) and any(TASK in line for line in kept_out)

    wait_for(reported, "the daemon's notes on bob's commits", timeout=120)
    docs = env.alice.status()
    assert docs[MODEL_A]["state"] == "RUNNING" and docs[TASK]["state"] == "SUCCEEDED"


def test_recreate_the_daemon(env: Env) -> None:
    # Its state (the ownership key) is on the argus-state volume: a new container running a new image keeps
    # adopting what runs, restarts nothing and runs no finished task again.
    pids = replica_pids(env, "alice") | replica_pids(env, "bob")
    runs_before = task_runs(env)
    old = env.stack.container_id("argus")
    started = time.monotonic()
    # --no-deps: compose 1.29 recreates a service's dependencies (the head) with it otherwise.
    env.stack.compose("up", "-d", "--no-deps", "--force-recreate", "argus")
    assert env.stack.container_id("argus") != old, "a new container"
    wait_for(env.stack.healthy, "the daemon after its recreation", timeout=300)
    wait_for(lambda: env.running(MODEL_A) and env.running(MODEL_B), "both models RUNNING", timeout=300, every=5)
    env.timings["recreate_argus_s"] = time.monotonic() - started
    assert replica_pids(env, "alice") | replica_pids(env, "bob") == pids, "a replica was restarted"
    assert task_runs(env) == runs_before, "a task ran again"


def test_backup_and_restore_with_the_documented_commands_runs_nothing_again(env: Env, tmp_path: Path) -> None:
    # docs/admins/backup-and-upgrade.md, "With compose", command by command: a backup while the daemon runs,
    # copied to the host; a restore over the installation (refused without --force, then with it, the
    # daemon stopped); the daemon back on the restored state adopts what runs and runs nothing again.
    pids = replica_pids(env, "alice") | replica_pids(env, "bob")
    runs_before = task_runs(env)
    task_before = env.alice.status()[TASK]
    made = env.stack.exec("argus", "argus-node", "argus", "backup", "--to", "/tmp/argus-backup.tar.gz")
    assert "wrote /tmp/argus-backup.tar.gz" in made.stdout, made.stdout + made.stderr
    archive = tmp_path / "argus-backup.tar.gz"
    container = env.stack.container_id("argus")
    copied = subprocess.run(
        ["docker", "cp", f"{container}:/tmp/argus-backup.tar.gz", str(archive)],
        env=env.stack.daemon.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert copied.returncode == 0 and archive.stat().st_size > 0, copied.stderr
    env.stack.exec("argus", "rm", "/tmp/argus-backup.tar.gz")
    env.stack.compose("stop", "argus")
    restore = ("run", "--rm", "--no-deps", "--entrypoint", "argus", "-v", f"{archive}:/backup.tar.gz:ro", "argus")
    refused = env.stack.compose(*restore, "restore", "/backup.tar.gz", check=False, timeout=300)
    assert refused.returncode != 0 and "--force" in refused.stdout + refused.stderr, refused.stdout + refused.stderr
    done = env.stack.compose(*restore, "restore", "--force", "/backup.tar.gz", timeout=300)
    assert "restored the state folder" in done.stdout, done.stdout + done.stderr
    env.stack.compose("up", "-d", "--no-deps", "argus")
    wait_for(env.stack.healthy, "the daemon on the restored state", timeout=300)
    wait_for(lambda: env.running(MODEL_A) and env.running(MODEL_B), "both models RUNNING", timeout=300, every=5)
    assert replica_pids(env, "alice") | replica_pids(env, "bob") == pids, "a replica was restarted"
    assert task_runs(env) == runs_before, "a task ran again"
    task_after = env.alice.status()[TASK]
    assert task_after["state"] == task_before["state"] == "SUCCEEDED"
    assert task_after.get("submission_id") == task_before.get("submission_id")


def test_restart_and_recreate_the_head(env: Env) -> None:
    runs_before = task_runs(env)
    for how in (("restart", "head"), ("up", "-d", "--force-recreate", "head")):
        old = env.stack.container_id("head")
        started = time.monotonic()
        env.stack.compose(*how)
        if how[0] == "up":
            assert env.stack.container_id("head") != old, "a new container"
        wait_for(env.stack.healthy, "the daemon after " + how[0], timeout=300)
        # The daemon keeps running through the head's restart, so its status branch says RUNNING until it
        # notices: only answers through the (new) head's OpenAI endpoint say the models are back.
        try:
            wait_for(
                lambda: answers(env, MODEL_A) and answers(env, MODEL_B), "both models answer", timeout=900, every=5
            )
        except AssertionError as exc:
            logs = env.stack.compose("logs", "--no-color", "--tail", "40", "endpoint", "argus", check=False).stdout
            raise AssertionError(f"{exc}\n{logs}") from None
        wait_for(lambda: env.running(MODEL_A) and env.running(MODEL_B), "both models back", timeout=300, every=5)
        env.timings[f"{how[0]}_head_s"] = time.monotonic() - started
        # A new Ray head has no job history: any run listed now would be a re-run.
        assert set(task_runs(env)) <= set(runs_before), "a finished task ran again"


def answers(env: Env, path: str) -> bool:
    """The model at ``path`` answers a chat request through the OpenAI endpoint (on the head)."""
    from openai import OpenAI

    name = env.state(path).get("served_name")
    key = api_key(env, path.split("/")[1])  # the model's owner's
    client = OpenAI(base_url=env.stack.url("ARGUS_OPENAI_PORT", "/v1"), api_key=key, timeout=30, max_retries=0)
    answer = client.chat.completions.create(
        model=str(name), messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0
    )
    return answer.choices[0].message.content is not None


def task_runs(env: Env) -> list[str]:
    # The dashboard of a head that has just restarted may reset a connection or two.
    (jobs,) = wait_for(lambda: (env.stack.dashboard("/api/jobs/"),), "the job list", timeout=120, every=5)
    return sorted(j["submission_id"] for j in jobs if "read-data" in str(j.get("submission_id")))


def test_killing_a_worker_and_starting_it_again(env: Env) -> None:
    env.stack.compose("kill", "worker-1")
    time.sleep(20)
    docs = env.alice.status()
    # A model whose replica was on the dead worker is FAILED once a real request finds it does not
    # answer, before Serve notices the node is gone (then DEPLOYING or UNHEALTHY): never RUNNING
    # unless it answers, and every model that is not served says why.
    for path in (MODEL_A, MODEL_B):
        assert docs[path]["state"] in ("RUNNING", "DEPLOYING", "QUEUED", "UNHEALTHY", "FAILED"), docs[path]
        assert docs[path]["state"] == "RUNNING" or docs[path].get("reason"), docs[path]
    env.stack.compose("start", "worker-1")
    wait_for(lambda: env.running(MODEL_A) and env.running(MODEL_B), "everything RUNNING again", timeout=600, every=5)
    history = env.alice.git("log", "--format=%H", STATUS).stdout.split()
    assert len(history) > 1 and env.alice.status()[TASK]["state"] == "SUCCEEDED"
