"""``argus doctor``'s checks that need no cluster: bounded probes, the state folder's mount, signing,
the ownership key, the users' homes, the output lines and the exit status."""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from pathlib import Path

import pytest

from reconciler import cli, doctor
from reconciler.doctor import CheckFailed, Result, Settings, run_checks
from reconciler.spec.types import ClusterSpec, Paths, UserPolicy
from tests.support import git, status_test_repo


def test_a_wedged_dashboard_fails_within_the_timeout() -> None:
    # Accepts connections (the kernel's backlog) and never answers: the probe must give up on its own.
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        settings = Settings(ray=f"http://127.0.0.1:{server.getsockname()[1]}", timeout=1)
        started = time.monotonic()
        results = run_checks(settings, [("ray dashboard", doctor.check_dashboard), ("jobs api", doctor.check_jobs)])
        assert time.monotonic() - started < 3
    assert [r.ok for r in results] == [False, False]
    assert all("timed out" in r.detail or "no answer" in r.detail for r in results), results


def test_a_check_that_never_returns_is_a_fail_not_a_hang() -> None:
    def stuck(settings: Settings) -> str:
        time.sleep(30)
        return "never"

    started = time.monotonic()
    [result] = run_checks(Settings(timeout=0.5), [("stuck", stuck)])
    assert time.monotonic() - started < 2.5
    assert not result.ok and "no answer within" in result.detail


def test_a_crashing_check_does_not_hide_the_others() -> None:
    def crash(settings: Settings) -> str:
        raise KeyError("boom")

    results = run_checks(Settings(timeout=2), [("crash", crash), ("fine", lambda s: "all good")])
    assert [(r.name, r.ok) for r in results] == [("crash", False), ("fine", True)]
    assert "KeyError" in results[0].detail


def test_lines_say_ok_or_fail_and_what_to_do() -> None:
    assert Result("a", True, "fine", "unused").line() == "ok    a: fine"
    assert Result("b", False, "broken", "fix it").line() == "FAIL  b: broken -> fix it"


MOUNTINFO = """\
22 1 0:21 / / rw,relatime - overlay overlay rw,lowerdir=/x
23 22 0:22 / /tmp rw - tmpfs tmpfs rw
24 22 8:1 /volumes/argus-state/_data /var/cache/argus rw - ext4 /dev/sda1 rw
"""


def test_mount_of_finds_the_longest_mount_point(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_text(MOUNTINFO)
    assert doctor.mount_of("/var/cache/argus/state", str(info)) == ("/var/cache/argus", "ext4")
    assert doctor.mount_of("/var/cache/argusx", str(info)) == ("/", "overlay")
    assert doctor.mount_of("/tmp/x", str(info)) == ("/tmp", "tmpfs")


def test_state_folder_on_the_containers_own_layer_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "state").mkdir()
    monkeypatch.setattr(doctor, "mount_of", lambda path: ("/", "overlay"))
    monkeypatch.setattr(doctor, "in_container", lambda: True)
    with pytest.raises(CheckFailed, match="lost when the container is recreated") as exc:
        doctor.check_state_folder(Settings(cache_dir=str(tmp_path)))
    assert "volume" in exc.value.fix
    monkeypatch.setattr(doctor, "mount_of", lambda path: ("/var/cache/argus", "ext4"))
    assert "writable" in doctor.check_state_folder(Settings(cache_dir=str(tmp_path)))
    assert not [p for p in (tmp_path / "state").iterdir()], "the probe file is removed"


def test_signing_needs_a_readable_signers_file_and_admins_with_keys(tmp_path: Path) -> None:
    signers = tmp_path / "allowed_signers"
    signers.write_text("alice ssh-ed25519 AAAA\nadmin ssh-ed25519 BBBB\n")
    on = Settings(require_signed=True, allowed_signers=str(signers), admins=("admin",))
    assert "2 signer(s)" in doctor.check_signing(on)
    bad = [
        (Settings(), "signing is off"),
        (Settings(require_signed=True, allowed_signers=str(tmp_path / "none"), admins=("admin",)), "No such file"),
        (Settings(require_signed=True, allowed_signers=str(signers)), "no admins"),
        (Settings(require_signed=True, allowed_signers=str(signers), admins=("root",)), "without a key: root"),
    ]
    for settings, message in bad:
        with pytest.raises(CheckFailed, match=message):
            doctor.check_signing(settings)


def test_ownership_key_present_private_and_long_enough(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ARGUS_OWNERSHIP_KEY", raising=False)
    settings = Settings(cache_dir=str(tmp_path))
    with pytest.raises(CheckFailed, match="No such file"):
        doctor.check_ownership_key(settings)
    (tmp_path / "state").mkdir()
    key = tmp_path / "state" / "ownership.key"
    key.write_text("x" * 64 + "\n")
    key.chmod(0o644)
    with pytest.raises(CheckFailed, match="readable by others"):
        doctor.check_ownership_key(settings)
    key.chmod(0o600)
    assert "present" in doctor.check_ownership_key(settings)


def test_homes_must_be_writable_by_the_job_uid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    users = tmp_path / "users"
    (users / "alice").mkdir(parents=True)
    keys = tmp_path / "keys"
    keys.mkdir()
    for user in ("alice", "bob"):
        (keys / f"{user}.pub").write_text("ssh-ed25519 AAAA\n")
    monkeypatch.setattr(doctor, "_cluster", lambda s: ClusterSpec(paths=Paths(users=str(users))))
    real_lstat = os.lstat

    def lstat_as_1000(path: str) -> os.stat_result:
        # The homes as the file service makes them: owned by uid 1000, mode 2770.
        info = real_lstat(path)
        return os.stat_result((info.st_mode & ~0o7777 | 0o2770, *info[1:4], doctor.JOB_UID, *info[5:]))

    monkeypatch.setattr(doctor.os, "lstat", lstat_as_1000)
    with pytest.raises(CheckFailed, match="no home yet: bob"):
        doctor.check_users_root(Settings(keys_dir=str(keys)))
    (users / "bob").mkdir()
    assert "2 home(s) writable by uid 1000" in doctor.check_users_root(Settings(keys_dir=str(keys)))


def test_may_reads_owner_group_and_other_bits() -> None:
    def info(uid: int, gid: int, mode: int) -> os.stat_result:
        return os.stat_result((0o040000 | mode, 0, 0, 0, uid, gid, 0, 0, 0, 0))

    assert doctor._may(info(1000, 20001, 0o2770), 1000, 0o3)
    assert not doctor._may(info(0, 0, 0o711), 1000, 0o3)
    assert doctor._may(info(0, 0, 0o711), 1000, 0o1)
    assert not doctor._may(info(1000, 1000, 0o500), 1000, 0o2)


def test_the_cli_exits_1_when_a_check_fails(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(doctor, "CHECKS", (("fine", lambda s: "yes"), ("bad", _fails)))
    assert cli.main(["doctor", "--timeout", "2"]) == 1
    out = capsys.readouterr().out
    assert "ok    fine: yes" in out and "FAIL  bad: broken -> do this" in out and "1 ok, 1 FAIL" in out


def _fails(settings: Settings) -> str:
    raise CheckFailed("broken", "do this")


def test_the_status_branch_check_names_a_branch_that_blocks_it(tmp_path: Path) -> None:
    """`argus` created in the repository past the hook: the daemon can never create argus/status."""
    bare, commit = status_test_repo(tmp_path)
    git(bare, "update-ref", "refs/heads/argus", commit)
    settings = Settings(repo=str(bare), timeout=10)
    with pytest.raises(CheckFailed) as failed:
        doctor.check_status_branch(settings)
    assert "holds the branch argus (named like a folder above it): git cannot create argus/status" in str(failed.value)
    assert "update-ref -d refs/heads/argus" in (failed.value.fix or "")
    git(bare, "update-ref", "-d", "refs/heads/argus")
    git(bare, "update-ref", "refs/heads/argus/status", commit)
    assert "writable" in doctor.check_status_branch(settings)


def test_signing_names_the_forges_and_needs_their_keys(tmp_path: Path) -> None:
    signers = tmp_path / "allowed_signers"
    signers.write_text("admin ssh-ed25519 AAAA\ngitlab ssh-ed25519 BBBB\n")
    on = Settings(require_signed=True, allowed_signers=str(signers), admins=("admin",), forge_signers=("gitlab",))
    assert doctor.check_signing(on).endswith("; forges gitlab (merge commits only)")
    pulls = dataclasses.replace(on, forge_pull_refs="refs/merge-requests/*/head")
    assert "(squash/rebase against refs/merge-requests/*/head)" in doctor.check_signing(pulls)
    with pytest.raises(CheckFailed, match="forge principal\\(s\\) without a key: gitea"):
        doctor.check_signing(dataclasses.replace(on, forge_signers=("gitea",)))
    with pytest.raises(CheckFailed, match="also admin"):
        doctor.check_signing(dataclasses.replace(on, forge_signers=("admin",)))


def test_api_keys_none_configured_is_a_warning_not_a_fail(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("ARGUS_API_KEYS", raising=False)
    monkeypatch.setattr(doctor, "CHECKS", (("fine", lambda s: "yes"), ("api keys", doctor.check_api_keys)))
    assert cli.main(["doctor", "--timeout", "2"]) == 0
    out = capsys.readouterr().out
    assert "warn  api keys: none configured: the OpenAI endpoint is open" in out and "-> set ARGUS_API_KEYS" in out
    assert "1 ok, 1 warn, 0 FAIL" in out


def test_api_keys_reports_each_file_its_users_and_bad_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    admin, own = tmp_path / "admin", tmp_path / "self"
    a, b, m = ("a" * 64, "b" * 64, "c" * 64)
    own.write_text(f"alice {a}  # 2026-12-05T02:50:00Z\nbob {b}\nmallory {m}\n")
    settings = Settings(api_keys=(str(admin), str(own)))
    line = doctor.check_api_keys(settings)
    assert line == f"closed, 3 key(s) of 3 user(s): {admin} absent; {own}: 3 key(s) of 3 user(s)"
    users = {"alice": UserPolicy(), "bob": UserPolicy()}
    monkeypatch.setattr(doctor, "_cluster", lambda settings: ClusterSpec(users=users))
    assert doctor.check_api_keys(settings).startswith("closed, 2 key(s) of 2 user(s): ")
    assert doctor.check_api_keys(settings).endswith("; ignored, not users of cluster.yaml: mallory")
    admin.write_text(f"alice {a[:40]}\n")
    with pytest.raises(CheckFailed, match=f"{admin}:1: the second field looks like a key") as failed:
        doctor.check_api_keys(settings)
    assert "docs/admins/api-keys.md" in failed.value.fix
    # As the CLI gives them: ARGUS_API_KEYS, a comma-separated list; --api-keys once or more instead.
    monkeypatch.setenv("ARGUS_API_KEYS", f"{admin},{own}")
    assert cli._api_keys(cli.build_parser().parse_args(["doctor"])) == [str(admin), str(own)]
    args = cli.build_parser().parse_args(["doctor", "--api-keys", str(own), "--api-keys", f"{admin},{own}"])
    assert cli._api_keys(args) == [str(own), str(admin)]
