"""The bundled git server, with real git and real sshd: the shipped pre-receive hook is an allow-list,
the entrypoint's repository settings hold, and both sshd configs pass ``sshd -t`` with the pre-authentication
limits set. The hook runs exactly as the image installs it (a copy in a bare repository's hooks/).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GIT_SERVER = ROOT / "images" / "git-server"
SFTP = ROOT / "images" / "sftp"
SSHD = "/usr/sbin/sshd"
ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@x",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@x",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}


def git(*args: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **ENV}
    env.pop("ARGUS_STATUS_BRANCH", None)
    return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=check)


@pytest.fixture
def server(tmp_path: Path) -> tuple[Path, Path]:
    """A bare repository with the shipped hook and the entrypoint's settings, and a clone with one commit."""
    bare, work = tmp_path / "config.git", tmp_path / "work"
    git("init", "-q", "--bare", "-b", "main", str(bare), cwd=tmp_path)
    shutil.copy(GIT_SERVER / "pre-receive", bare / "hooks" / "pre-receive")
    (bare / "hooks" / "pre-receive").chmod(0o755)
    for key, value in (("receive.denyDeletes", "true"), ("argus.statusBranch", "argus/status")):
        git("config", key, value, cwd=bare)
    git("init", "-q", "-b", "main", str(work), cwd=tmp_path)
    (work / "cluster.yaml").write_text("kind: Cluster\n")
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", "c", cwd=work)
    return bare, work


def push(work: Path, bare: Path, refspec: str) -> subprocess.CompletedProcess[str]:
    return git("push", str(bare), refspec, cwd=work, check=False)


def refs(bare: Path) -> set[str]:
    return set(git("for-each-ref", "--format=%(refname)", cwd=bare).stdout.split())


def test_branches_and_tags_are_accepted(server: tuple[Path, Path]) -> None:
    bare, work = server
    assert push(work, bare, "main").returncode == 0
    assert push(work, bare, "main:refs/heads/alice/feature").returncode == 0
    git("tag", "v1", cwd=work)
    assert push(work, bare, "refs/tags/v1").returncode == 0
    assert {"refs/heads/main", "refs/heads/alice/feature", "refs/tags/v1"} <= refs(bare)


@pytest.mark.parametrize(
    "refspec",
    [
        "main:refs/heads/argus/status",  # the daemon's status branch
        "main:refs/replace/0123456789012345678901234567890123456789",  # would change what every read returns
        "main:refs/notes/argus",
        "main:refs/notes/argus/x",  # pushed first, it would make every later note write fail
        "main:refs/notes/commits",
        "main:refs/argus/lease",  # a forged lease would stop all applying
        "main:refs/pull/1/head",  # any other name
        "main:refs/remotes/origin/main",
        "main:refs/stash",
    ],
)
def test_every_other_ref_is_refused_with_a_message(server: tuple[Path, Path], refspec: str) -> None:
    bare, work = server
    before = refs(bare)
    proc = push(work, bare, refspec)
    target = refspec.split(":", 1)[1]
    assert proc.returncode != 0, proc.stderr
    assert f"argus: refused {target}" in proc.stderr, proc.stderr
    assert refs(bare) == before


def test_a_replace_ref_is_refused_even_for_a_real_object(server: tuple[Path, Path]) -> None:
    bare, work = server
    assert push(work, bare, "main").returncode == 0
    blob = git("rev-parse", "HEAD:cluster.yaml", cwd=work).stdout.strip()
    forged = git("hash-object", "-w", "--stdin", cwd=work).stdout.strip()
    git("replace", blob, forged, cwd=work)
    proc = push(work, bare, f"refs/replace/{blob}")
    assert proc.returncode != 0 and "only branches (refs/heads/*) and tags (refs/tags/*)" in proc.stderr
    assert not any(r.startswith("refs/replace/") for r in refs(bare))


def test_a_mixed_push_is_refused_as_a_whole(server: tuple[Path, Path]) -> None:
    bare, work = server
    proc = git("push", "--atomic", str(bare), "main", "main:refs/notes/argus", cwd=work, check=False)
    assert proc.returncode != 0
    assert refs(bare) == set(), "pre-receive refuses the whole push: nothing of it lands"


def test_the_status_branch_name_comes_from_the_repository(server: tuple[Path, Path]) -> None:
    """An SSH session has none of the container's variables: the entrypoint records the name in the repo."""
    bare, work = server
    git("config", "argus.statusBranch", "ops/status", cwd=bare)
    assert "argus: refused refs/heads/ops/status" in push(work, bare, "main:refs/heads/ops/status").stderr
    assert push(work, bare, "main:refs/heads/argus/status").returncode == 0  # no longer special


@pytest.mark.parametrize(
    ("status_branch", "name", "blocks"),
    [
        ("argus/status", "argus", "names a folder above"),  # then refs/heads/argus/status cannot be made
        ("argus/status", "argus/status/x", "lies under"),
        ("argus/status", "argus/status/x/y", "lies under"),
        ("ops/argus/status", "ops", "names a folder above"),
        ("ops/argus/status", "ops/argus", "names a folder above"),
    ],
)
def test_a_branch_that_would_block_the_status_branch_is_refused(
    server: tuple[Path, Path], status_branch: str, name: str, blocks: str
) -> None:
    bare, work = server
    git("config", "argus.statusBranch", status_branch, cwd=bare)
    proc = push(work, bare, f"main:refs/heads/{name}")
    assert proc.returncode != 0
    assert f"argus: refused refs/heads/{name}: this name {blocks} the status branch {status_branch}" in proc.stderr
    assert refs(bare) == set()
    # The daemon can still create its branch (as it does: update-ref in the bare repository).
    head = git("rev-parse", "HEAD", cwd=work).stdout.strip()
    assert push(work, bare, "main").returncode == 0
    git("update-ref", f"refs/heads/{status_branch}", head, cwd=bare)


@pytest.mark.parametrize(
    "name", ["argus-status", "argusx", "status", "argus/statusx", "argus/other", "x/argus/status", "argus/stat"]
)
def test_names_beside_the_status_branch_are_accepted(server: tuple[Path, Path], name: str) -> None:
    bare, work = server
    assert push(work, bare, f"main:refs/heads/{name}").returncode == 0
    assert f"refs/heads/{name}" in refs(bare)


@pytest.mark.parametrize("tag", ["argus", "argus/status", "argus/status/x"])
def test_tags_named_like_the_status_branch_are_accepted(server: tuple[Path, Path], tag: str) -> None:
    """Tags live under refs/tags/: they cannot keep refs/heads/argus/status from being created."""
    bare, work = server
    git("tag", tag, cwd=work)
    assert push(work, bare, f"refs/tags/{tag}").returncode == 0
    head = git("rev-parse", "HEAD", cwd=work).stdout.strip()
    git("update-ref", "refs/heads/argus/status", head, cwd=bare)  # the daemon's first write still works


def test_deleting_a_blocking_branch_is_left_to_the_server_settings(server: tuple[Path, Path]) -> None:
    """One created past the hook (directly in the repository) may be deleted where deletes are allowed:
    that only unblocks the status branch."""
    bare, work = server
    git("config", "receive.denyDeletes", "false", cwd=bare)
    assert push(work, bare, "main").returncode == 0
    head = git("rev-parse", "HEAD", cwd=work).stdout.strip()
    git("update-ref", "refs/heads/argus", head, cwd=bare)
    proc = push(work, bare, ":refs/heads/argus")
    assert proc.returncode == 0, proc.stderr
    assert refs(bare) == {"refs/heads/main"}


def test_entrypoint_sets_the_repository_limits() -> None:
    text = (GIT_SERVER / "entrypoint").read_text()
    for setting in ("receive.denyNonFastForwards true", "receive.denyDeletes true", "receive.fsckObjects true"):
        assert f"config {setting}" in text
    assert "config receive.maxInputSize '$max_input'" in text and "ARGUS_GIT_MAX_INPUT_SIZE:-100m" in text
    assert "config argus.statusBranch '$status_branch'" in text
    subprocess.run(["sh", "-n", str(GIT_SERVER / "entrypoint")], check=True)


def require_sshd() -> None:
    """Skip without sshd (``make sysdeps`` installs it); in CI fail instead."""
    if not os.access(SSHD, os.X_OK):
        if os.environ.get("CI"):
            pytest.fail(f"{SSHD} is missing (apt-get install openssh-server)", pytrace=False)
        pytest.skip(f"{SSHD} is missing (apt-get install openssh-server)")


def sshd_test(config: Path) -> dict[str, str]:
    """``sshd -t`` then ``sshd -T`` on ``config``; returns the effective settings (lower-case keys)."""
    if not Path("/run/sshd").is_dir() and os.geteuid() == 0:
        Path("/run/sshd").mkdir()  # sshd's privilege separation folder (the images have it)
    checked = subprocess.run([SSHD, "-t", "-f", str(config)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    out = subprocess.run([SSHD, "-T", "-f", str(config)], capture_output=True, text=True, check=True).stdout
    return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)


def host_key(tmp_path: Path) -> Path:
    key = tmp_path / "host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return key


def assert_pre_auth_limits(conf: dict[str, str]) -> None:
    # One client's idle sockets must not starve the others: a per-source cap well below the global one.
    assert int(conf["logingracetime"]) <= 30
    assert int(conf["persourcemaxstartups"]) <= 10
    assert conf["persourcenetblocksize"] == "32:64"
    start, _rate, full = (int(x) for x in conf["maxstartups"].split(":"))
    assert start >= 100 and full >= start


def test_git_server_sshd_config_is_valid_and_limits_pre_auth(tmp_path: Path) -> None:
    require_sshd()
    text = (GIT_SERVER / "sshd_config").read_text()
    config = tmp_path / "sshd_config"
    config.write_text(text.replace("HostKey /etc/ssh/keys/ssh_host_ed25519_key", f"HostKey {host_key(tmp_path)}"))
    conf = sshd_test(config)
    assert_pre_auth_limits(conf)
    assert conf["allowusers"] == "git" and conf["passwordauthentication"] == "no"


def test_file_service_sshd_config_is_valid_and_limits_pre_auth(tmp_path: Path) -> None:
    require_sshd()
    env = {"PATH": os.environ["PATH"], "SFTP_HOST_KEY": str(host_key(tmp_path))}
    out = subprocess.run(["sh", str(SFTP / "sshd-config")], env=env, capture_output=True, text=True, check=True)
    config = tmp_path / "sshd_config"
    config.write_text(out.stdout)
    conf = sshd_test(config)
    assert_pre_auth_limits(conf)
    assert conf["chrootdirectory"] == "/srv/sftp"
