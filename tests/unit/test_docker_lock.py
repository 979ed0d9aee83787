"""One run at a time uses the compose test's Docker cache folder (reconciler/testing/docker.py):
a second run on the same machine waits for the lock instead of sharing (and then losing) the
first run's dockerd and image tags."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from reconciler.testing import docker


def test_a_second_run_waits_for_the_first_and_then_gets_the_folder(tmp_path: Path) -> None:
    first = docker._take_lock(tmp_path, timeout=1)
    with pytest.raises(RuntimeError, match="in use by another run"):
        docker._take_lock(tmp_path, timeout=0.5)
    got: list[float] = []

    def second() -> None:
        fd = docker._take_lock(tmp_path, timeout=30)
        got.append(time.monotonic())
        os.close(fd)

    thread = threading.Thread(target=second)
    thread.start()
    time.sleep(1.0)
    assert not got  # still waiting
    released = time.monotonic()
    docker._release(docker.Daemon(tmp_path, pid=0, started=False, lock=first))
    thread.join(30)
    assert got and got[0] >= released


def test_stop_releases_the_lock_even_for_a_daemon_it_did_not_start(tmp_path: Path) -> None:
    daemon = docker.Daemon(tmp_path, pid=0, started=False, lock=docker._take_lock(tmp_path, timeout=1))
    docker.stop_daemon(daemon)
    assert daemon.lock is None
    os.close(docker._take_lock(tmp_path, timeout=1))
