"""The disk meter on real folders (issue 31 item 6): what a walk counts, that it is made in bounded steps,
that nothing can be hidden from it (too deep, unreadable), and the background meter's lifecycle."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from reconciler.observe.disk import DiskMeter, Walk
from reconciler.plan.disk import DiskUsage

ROOT = Path(__file__).resolve().parents[2]


def _tree(top: Path) -> Path:
    """A folder as users leave them: data files, nested folders, an empty file, a symlink to a big file
    outside it (rsync munges uploaded links; a job can still make one)."""
    (top / "data" / "a" / "b").mkdir(parents=True)
    (top / "data" / "train.parquet").write_bytes(os.urandom(300_000))
    (top / "data" / "a" / "b" / "x.bin").write_bytes(os.urandom(70_000))
    (top / "data" / "a" / "empty").write_bytes(b"")
    (top / "jobs" / "t" / "sid" / "checkpoints").mkdir(parents=True)
    (top / "jobs" / "t" / "sid" / "checkpoints" / "model.safetensors").write_bytes(os.urandom(1_000_000))
    outside = top.parent / "outside.bin"
    outside.write_bytes(os.urandom(2_000_000))
    (top / "link").symlink_to(outside)
    return top


def _du(top: Path) -> int:
    """``du``'s own count, in bytes: allocated blocks, symlinks not followed, one file system."""
    out = subprocess.run(["du", "-s", "-B1", "-P", "-x", str(top)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0])


def _walk(top: Path, budget: int = 1_000_000, max_depth: int = 64) -> Walk:
    walk = Walk(str(top), max_depth)
    while not walk.step(budget):
        pass
    return walk


def test_a_walk_counts_what_du_counts(tmp_path: Path) -> None:
    top = _tree(tmp_path / "alice")
    walk = _walk(top)
    assert walk.result == DiskUsage(_du(top), None)
    assert walk.used < 2_000_000  # the linked file outside is not counted


def test_a_walk_is_made_in_bounded_steps_with_one_open_folder_per_level(tmp_path: Path) -> None:
    top = _tree(tmp_path / "alice")
    walk = Walk(str(top))
    steps, deepest, before = 0, 0, 0
    while True:
        done = walk.step(3)
        steps += 1
        assert walk.entries - before <= 3  # never more than the budget in one step
        before = walk.entries
        deepest = max(deepest, len(walk._stack))
        if done:
            break
    assert walk.entries == 12 and steps >= 4
    assert deepest <= 5  # alice/jobs/t/sid/checkpoints: one open folder per level, never one per folder seen
    assert walk.result == _walk(top).result


def test_a_folder_too_deep_is_reported_not_hidden(tmp_path: Path) -> None:
    top = tmp_path / "alice"
    deep = top.joinpath(*[f"d{i}" for i in range(10)])
    deep.mkdir(parents=True)
    (deep / "hidden.bin").write_bytes(os.urandom(500_000))
    walk = _walk(top, max_depth=4)
    assert walk.problem is not None and "more than 4 folder levels deep" in walk.problem
    assert "d0/d1/d2/d3" in walk.problem
    assert len(walk._stack) == 0  # everything it opened is closed


def test_a_missing_folder_is_empty_and_a_file_is_counted(tmp_path: Path) -> None:
    assert _walk(tmp_path / "nobody").result == DiskUsage(0, None)
    (tmp_path / "afile").write_bytes(os.urandom(10_000))
    assert _walk(tmp_path / "afile").result.used >= 10_000


def test_a_folder_the_daemon_cannot_read_is_reported(tmp_path: Path) -> None:
    """A user can chmod 000 a folder of hers over SFTP: its size is unknown, and that is what the check says.
    As root (which reads everything) the walk runs without the capabilities that bypass permissions."""
    top = _tree(tmp_path / "alice")
    secret = top / "secret"
    secret.mkdir()
    (secret / "big.bin").write_bytes(os.urandom(400_000))
    code = "import json, sys; from tests.unit.test_observe_disk import _walk; w = _walk(sys.argv[1]); "
    code += "print(json.dumps([w.used, w.problem]))"
    command = [sys.executable, "-c", code, str(top)]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            if os.environ.get("CI"):
                pytest.fail("running as root without setpriv: permissions cannot be enforced here", pytrace=False)
            pytest.skip("running as root without setpriv: permissions cannot be enforced here")
        os.chown(secret, 65534, 65534)
        command = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--", *command]
    secret.chmod(0)
    try:
        out = subprocess.run(
            command, capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)}
        )
    finally:
        secret.chmod(0o755)
    used, problem = json.loads(out.stdout)
    assert problem == "cannot read 'secret': Permission denied; make it readable (chmod 755) or remove it"
    assert used < _du(top)  # a lower bound: what it could count


def _wait(check: object, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_the_meter_measures_in_the_background_and_keeps_only_what_it_is_asked(tmp_path: Path) -> None:
    users = tmp_path / "users"
    _tree(users / "alice")
    (users / "bob").mkdir()
    meter = DiskMeter(batch=4, pause_s=0.0, rest_s=0.2)
    try:
        assert meter.usage() == {}
        meter.want(str(users), {"alice", "bob"})
        _wait(lambda: set(meter.usage()) == {"alice", "bob"})
        assert meter.usage()["alice"] == DiskUsage(_du(users / "alice"))
        (users / "alice" / "more.bin").write_bytes(os.urandom(800_000))
        _wait(lambda: meter.usage()["alice"].used == _du(users / "alice"))  # measured again after its rest
        meter.want(str(users), {"alice"})
        assert set(meter.usage()) == {"alice"}  # bob's total is dropped with him
        meter.want(str(tmp_path / "elsewhere"), {"alice"})
        assert meter.usage() == {}  # another root: other folders
    finally:
        meter.close()
    assert not any(t.name == "argus-disk-meter" and t.is_alive() for t in threading.enumerate())


def test_the_meter_starts_no_thread_until_asked(tmp_path: Path) -> None:
    meter = DiskMeter()
    meter.want(str(tmp_path), ())
    meter.want(None, {"alice"})
    assert meter._thread is None and meter.usage() == {}
    meter.close()


def test_a_folder_of_more_entries_than_a_walk_counts_is_reported(tmp_path: Path) -> None:
    """Millions of small files made one walk take hours, and every other user's measurement waited behind
    it (one folder at a time): a walk stops at ``max_entries`` and says so, which holds that user's runs."""
    users = tmp_path / "users"
    for i in range(30):
        (users / "alice" / "many").mkdir(parents=True, exist_ok=True)
        (users / "alice" / "many" / f"f{i}").write_bytes(b"x")
    walk = Walk(str(users / "alice"), max_entries=20)
    while not walk.step(7):
        pass
    assert walk.entries == 20
    assert walk.result.problem == "it holds more than 20 files and folders; remove some (old run folders under jobs/)"
    assert not walk._stack  # stopped: nothing is left open
    (users / "bob").mkdir()
    meter = DiskMeter(batch=4, pause_s=0.0, rest_s=60, max_entries=20)
    try:
        meter.want(str(users), {"alice", "bob"})
        _wait(lambda: set(meter.usage()) == {"alice", "bob"})
        assert meter.usage()["alice"].problem is not None and meter.usage()["bob"] == DiskUsage(_du(users / "bob"))
    finally:
        meter.close()


def test_a_folder_replaced_by_a_symbolic_link_is_reported(tmp_path: Path) -> None:
    """Job code (any user's: jobs share one uid) can swap a user folder for a link to where her data
    really is: counted as a link, the data would escape the quota."""
    real = _tree(tmp_path / "real")
    (tmp_path / "users").mkdir()
    (tmp_path / "users" / "alice").symlink_to(real)
    result = _walk(tmp_path / "users" / "alice").result
    assert result.problem == "it is a symbolic link, not a folder; make it the user's folder again"
