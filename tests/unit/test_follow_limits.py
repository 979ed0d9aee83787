"""Followers of live logs can never starve the pages: at most ``max_followers`` streams at once, at
most ``per_requester`` for one requester (the user an authenticating proxy vouched for, else the client
address; the next one gets 503), a quiet stream still notices a client that left (heartbeats), and the
slot of a gone client is freed. Nobody can lock a user out of her own logs: slots are not counted per
log owner, and a user vouched for following her own task takes a slot from a follower of someone
else's. Real sockets against the real server and page handler (the status branch in real git); Ray is
a stand-in whose stream stays quiet."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from reconciler.dashboard import RayStream
from reconciler.errors import ArgusError
from reconciler.logs.ray import RayLogs
from reconciler.logs.slots import Requester, Slots
from reconciler.server.core import HttpServer
from reconciler.server.metrics import Metrics
from reconciler.testing.status_branch import commit_files, dump, task_doc
from reconciler.web.handler import build_handler
from reconciler.web.reader import StatusReader
from tests.unit.fake_ray import FakeRay

DOC = task_doc("bob", "t", "RUNNING")
SID = DOC["submission_id"]
FOLLOW = "/api/v1/logs/bob/tasks/t?follow=1"


class Quiet:
    """A followed log that never prints: ``read1`` blocks until closed."""

    def __init__(self) -> None:
        self.closed = threading.Event()

    def read1(self, n: int) -> bytes:
        self.closed.wait(30)
        return b""

    def close(self) -> None:
        self.closed.set()

    def __enter__(self) -> Quiet:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class QuietRay(FakeRay):
    def stream(self, path: str, *, timeout: float | None = None) -> RayStream:
        return Quiet()  # type: ignore[return-value]


def _server(
    tmp_path: Path,
    per_requester: int = 100,
    user_header: str | None = None,
    max_followers: int = 4,
    user_header_from: tuple[str, ...] = (),
) -> tuple[HttpServer, RayLogs]:
    ray = QuietRay()
    ray.jobs[SID] = {
        "submission_id": SID,
        "status": "PENDING",  # never ends, never prints: the stream stays quiet
        "driver_node_id": "n1",
        "metadata": {"managed-by": "argus", "argus-user": "bob", "argus-task": "t"},
    }
    repo = str(tmp_path / "config.git")
    subprocess.run(["git", "init", "-q", "--bare", repo], check=True)
    commit_files(repo, {"users/bob/tasks/t.yaml": dump(DOC)})
    logs = RayLogs(ray, lambda s: s, poll_s=0.05, per_requester=per_requester, max_followers=max_followers)
    srv = HttpServer(
        "0.0.0.0:0",
        metrics=Metrics(),
        health=lambda: {"ok": True},
        on_push=None,
        secret=None,
        pages=build_handler(StatusReader(repo), logs=logs),
        user_header=user_header,
        user_header_from=user_header_from,
    )
    return srv, logs


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[int, RayLogs]]:
    srv, logs = _server(tmp_path)
    try:
        yield srv.server_address[1], logs
    finally:
        srv.shutdown()


def _status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=3) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _abandon(port: int, n: int) -> None:
    for _ in range(n):  # send the request, close at once
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(f"GET {FOLLOW} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        s.close()


def test_abandoned_followers_do_not_starve_the_pages(served: tuple[int, RayLogs]) -> None:
    port, logs = served
    _abandon(port, 40)
    time.sleep(0.5)
    started = time.monotonic()
    assert _status(port, "/") == 200 and time.monotonic() - started < 2
    # The gone clients' slots come back: a new follower is served again.
    deadline = time.monotonic() + 5
    while logs.followers.free < logs.max_followers and time.monotonic() < deadline:
        time.sleep(0.05)
    assert logs.followers.free == logs.max_followers
    assert logs.followers.holders() == 0  # nothing is remembered of the clients that left


def test_live_followers_beyond_the_bound_get_503(served: tuple[int, RayLogs]) -> None:
    port, logs = served
    held = []
    for _ in range(logs.max_followers):
        held.append(_follow(port))
    try:
        assert _status(port, FOLLOW) == 503
        assert _status(port, "/") == 200
    finally:
        for s in held:
            s.close()


def _request(user: str | None) -> bytes:
    head = f"GET {FOLLOW} HTTP/1.1\r\nHost: x\r\n" + (f"X-Forwarded-User: {user}\r\n" if user else "") + "\r\n"
    return head.encode()


def _follow(port: int, source: str = "127.0.0.1", user: str | None = None) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), source_address=(source, 0))
    s.sendall(_request(user))
    assert s.recv(64).startswith(b"HTTP/1.1 200")
    return s


def _answer(port: int, source: str, user: str | None = None) -> bytes:
    with socket.create_connection(("127.0.0.1", port), source_address=(source, 0), timeout=3) as s:
        s.sendall(_request(user))
        return s.recv(4096)


def _until(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert check(), "timed out"


def test_one_client_address_cannot_hold_every_follower_slot(tmp_path: Path) -> None:
    srv, _logs = _server(tmp_path, per_requester=2)
    port = srv.server_address[1]
    held = [_follow(port), _follow(port)]
    try:
        refused = _answer(port, "127.0.0.1")
        assert refused.startswith(b"HTTP/1.1 503") and b"by 127.0.0.1" in refused
        # Another address is still served while the first one holds its share.
        held.append(_follow(port, "127.0.0.2"))
        assert _status(port, "/") == 200
    finally:
        for s in held:
            s.close()
        srv.shutdown()


def test_a_stranger_following_bobs_task_does_not_lock_bob_out(tmp_path: Path) -> None:
    """Counted per log owner, two follows of bob's task (anyone's, renewed) held bob's slots."""
    srv, logs = _server(tmp_path, per_requester=2)
    port = srv.server_address[1]
    stranger = [_follow(port, "127.0.0.3"), _follow(port, "127.0.0.3")]  # as many as one requester may
    held = []
    try:
        held.append(_follow(port, "127.0.0.4"))  # bob, from his own address
        held.append(_follow(port, "127.0.0.5"))  # and anyone else
        assert logs.followers.free == 0
        refused = _answer(port, "127.0.0.6")  # the global cap holds
        assert refused.startswith(b"HTTP/1.1 503") and b"at most 4" in refused
        assert _status(port, "/") == 200
    finally:
        for s in stranger + held:
            s.close()
    _until(lambda: logs.followers.free == logs.max_followers)  # released on disconnect
    assert logs.followers.holders() == 0
    srv.shutdown()


def test_bob_vouched_for_takes_a_slot_from_followers_of_others_behind_one_address(tmp_path: Path) -> None:
    """Behind compose's host port every client has one address: with the proxy's user header the
    slots are counted per user, and bob following his own task when all are taken cuts a stranger's
    follower (the one holding the most), never exceeding the total."""
    srv, logs = _server(tmp_path, per_requester=2, user_header="X-Forwarded-User")
    port = srv.server_address[1]
    mallory = [_follow(port, user="mallory"), _follow(port, user="mallory")]
    eve = [_follow(port, user="eve")]
    held = []
    try:
        third = _answer(port, "127.0.0.1", "mallory")
        assert third.startswith(b"HTTP/1.1 503") and b"by mallory" in third  # per user, not per address
        held.append(_follow(port, user="carol"))
        assert logs.followers.free == 0
        full = _answer(port, "127.0.0.1", "dave")  # following another user's task: no slot to take
        assert full.startswith(b"HTTP/1.1 503") and b"at most 4" in full
        held.append(_follow(port, user="bob"))  # his own task: a stranger's slot goes to him
        assert logs.followers.free == 0  # the total still holds
        cut = b""
        for s in mallory:  # mallory held the most: one of hers ends, saying why
            s.settimeout(3)
            try:
                while b"[argus: stopped following" not in cut:
                    data = s.recv(4096)
                    if not data:
                        break
                    cut += data
            except TimeoutError:
                continue
        assert b"the slot went to a user following her own log" in cut
    finally:
        for s in mallory + eve + held:
            s.close()
        _until(lambda: logs.followers.free == logs.max_followers)
        srv.shutdown()


def test_without_a_configured_header_a_claimed_user_counts_for_nothing(tmp_path: Path) -> None:
    srv, _logs = _server(tmp_path, per_requester=2)
    port = srv.server_address[1]
    held = [_follow(port, user="bob"), _follow(port, user="bob")]
    try:  # the header is ignored: one address, whatever user it claims
        assert b"by 127.0.0.1" in _answer(port, "127.0.0.1", "bob")
    finally:
        for s in held:
            s.close()
        srv.shutdown()


@pytest.mark.parametrize(
    ("trusted", "counted_as"),
    [(("localhost",), b"by bob"), (("127.0.0.1",), b"by bob"), (("192.0.2.77",), b"by 127.0.0.1")],
)
def test_the_user_header_is_believed_only_from_the_hosts_named(
    tmp_path: Path, trusted: tuple[str, ...], counted_as: bytes
) -> None:
    """Compose's git server names each key's owner (`ssh git@HOST logs`); a job on the same network could
    send the header too, so it counts only from the git server's address (here: the loopback or not)."""
    srv, _logs = _server(tmp_path, per_requester=2, user_header="X-Forwarded-User", user_header_from=trusted)
    port = srv.server_address[1]
    held = [_follow(port, user="bob"), _follow(port, user="bob")]
    try:
        assert counted_as in _answer(port, "127.0.0.1", "bob")
    finally:
        for s in held:
            s.close()
        srv.shutdown()


def test_slots_forget_who_held_them() -> None:
    slots = Slots(total=3, per_requester=1, to_owner=True, cut_wait_s=0.2)
    a, b = slots.take(Requester("", "10.0.0.1"), "ann"), slots.take(Requester("", "10.0.0.2"), "ann")
    with pytest.raises(Exception, match=r"by 10\.0\.0\.1"):
        slots.take(Requester("", "10.0.0.1"), "bob")
    c = slots.take(Requester("bob", "10.0.0.1"), "ann")  # a user vouched for is another requester
    with pytest.raises(Exception, match="at most 3"):
        slots.take(Requester("", "10.0.0.3"), "ann")
    # ann herself, vouched for: a slot is cut for her; nobody releases it in time here, so she waits, then is refused
    with pytest.raises(Exception, match="at most 3"):
        slots.take(Requester("ann", "10.0.0.4"), "ann")
    assert sum(s.cut.is_set() for s in (a, b, c)) == 1
    cut = next(s for s in (a, b, c) if s.cut.is_set())
    threading.Timer(0.05, slots.release, (cut,)).start()
    own = slots.take(Requester("ann", "10.0.0.4"), "ann")
    assert slots.free == 0 and own.own
    for slot in (a, b, c, own):
        slots.release(slot)
    slots.release(own)  # again: no effect
    assert slots.free == 3 and slots.holders() == 0


def _release_cut(slots: Slots, stop: threading.Event) -> None:
    """Plays the followers that were cut: each ends at its next poll and gives its slot back."""
    while not stop.is_set():
        with slots._cond:
            cut = [s for s in slots._held if s.cut.is_set()]
        for slot in cut:
            slots.release(slot)
        time.sleep(0.01)


def test_waiting_owners_cannot_take_more_than_their_share() -> None:
    """mallory, following her own log when every slot is taken, sends many requests at once: each would
    wait for a cut slot and take it, past her share; then all slots are her own and nobody can cut one."""
    slots = Slots(total=4, per_requester=2, to_owner=True, cut_wait_s=2.0, max_waiting=8)
    for i in range(4):
        slots.take(Requester("", f"10.0.0.{i}"), "carol")  # strangers following carol's log
    stop = threading.Event()
    threading.Thread(target=_release_cut, args=(slots, stop), daemon=True).start()
    got: list[object] = []

    def ask() -> None:
        with contextlib.suppress(ArgusError):
            got.append(slots.take(Requester("mallory", "10.0.1.1"), "mallory"))

    askers = [threading.Thread(target=ask) for _ in range(6)]
    try:
        for t in askers:
            t.start()
        for t in askers:
            t.join()
        assert len(got) == 2, f"mallory holds {len(got)} slots, her share is 2"
        assert slots.take(Requester("bob", "10.0.2.1"), "bob").own  # bob still gets one for his own log
    finally:
        stop.set()


def test_few_owners_wait_at_once() -> None:
    """Each request waiting for a cut slot holds one of the 8 page threads: past ``max_waiting`` the
    others are told to retry at once, so waiting owners cannot take the threads the pages need."""
    slots = Slots(total=2, per_requester=2, to_owner=True, cut_wait_s=0.5)
    strangers = [slots.take(Requester("", "10.0.0.1"), "carol"), slots.take(Requester("", "10.0.0.1"), "carol")]
    refused: list[ArgusError] = []

    def ann_waits() -> None:
        try:
            slots.take(Requester("ann", ""), "ann")  # nobody releases the cut slot here: she waits, then is refused
        except ArgusError as exc:
            refused.append(exc)

    waiting = threading.Thread(target=ann_waits)
    waiting.start()
    _until(lambda: sum(s.cut.is_set() for s in strangers) == 1)
    started = time.monotonic()
    with pytest.raises(ArgusError, match="at most 2"):
        slots.take(Requester("bob", ""), "bob")
    assert time.monotonic() - started < 0.2, "refused at once, not after a wait"
    waiting.join()
    assert refused


def test_owners_holding_their_share_do_not_lock_out_another_owner() -> None:
    """Two users following their own tasks twice each hold every slot: bob following his own gets one
    of the requester holding the most, who keeps one; an owner is never cut for one holding as many."""
    slots = Slots(total=4, per_requester=2, to_owner=True, cut_wait_s=1.0)
    mine = [slots.take(Requester(u, "10.0.0.1"), u) for u in ("ann", "ann", "eve", "eve")]
    stop = threading.Event()
    threading.Thread(target=_release_cut, args=(slots, stop), daemon=True).start()
    try:
        assert slots.take(Requester("bob", "10.0.0.1"), "bob").own
        assert sum(s.cut.is_set() for s in mine) == 1
        assert slots.take(Requester("carl", "10.0.0.1"), "carl").own  # the other one holding two
        # now ann, eve, bob and carl hold one each: dave following his own cuts nobody
        with pytest.raises(ArgusError, match="at most 4"):
            slots.take(Requester("dave", "10.0.0.1"), "dave")
        assert slots.free == 0 and slots.holders() == 4
    finally:
        stop.set()


class Endless:
    """A log read that ends after ``lines`` lines (None: never; an endless log, slowly served)."""

    def __init__(self, lines: int | None, ended: threading.Event) -> None:
        self.left, self.ended = lines, ended

    def read1(self, n: int) -> bytes:
        if self.left is not None:
            self.left -= 1
            return b"line\n" if self.left >= 0 else b""
        time.sleep(0.01)
        return b"" if self.ended.is_set() else b"line\n"

    def close(self) -> None:
        pass

    def __enter__(self) -> Endless:
        return self

    def __exit__(self, *_: object) -> None:
        pass


class EndlessRay(FakeRay):
    """The first three reads never end by themselves; the next ones are three lines."""

    streams = 0
    ended = threading.Event()  # ends the endless ones

    def stream(self, path: str, *, timeout: float | None = None) -> RayStream:
        self.streams += 1
        return Endless(None if self.streams <= 3 else 3, self.ended)  # type: ignore[return-value]


def test_strangers_reading_in_a_loop_do_not_lock_bob_out_of_his_own_log_tail() -> None:
    """Reads of a big log last up to 30 s each: two strangers reading bob's (or anyone's) log in a loop
    held every read slot, and bob, vouched for, got 503 for his own task's tail. Now his read cuts one."""
    ray = EndlessRay()
    ray.jobs[SID] = {
        "submission_id": SID,
        "status": "RUNNING",
        "driver_node_id": "n1",
        "metadata": {"managed-by": "argus", "argus-user": "bob", "argus-task": "t"},
    }
    logs = RayLogs(ray, lambda s: s, poll_s=0.05, per_requester=2, max_readers=3)
    outcomes: list[str] = []

    def read(identity: str) -> None:
        try:
            logs.task_log("bob", "t", DOC, None, client="10.0.0.1", identity=identity)
            outcomes.append("read")
        except ArgusError as exc:
            outcomes.append(str(exc))

    strangers = [threading.Thread(target=read, args=(who,)) for who in ("mallory", "mallory", "eve")]
    for t in strangers:
        t.start()
    _until(lambda: logs.readers.free == 0)
    started = time.monotonic()
    assert logs.task_log("bob", "t", DOC, None, client="10.0.0.1", identity="bob").endswith("line\n")
    assert time.monotonic() - started < 6
    ray.ended.set()
    for t in strangers:
        t.join(40)
    assert sum("went to a user reading her own log" in o for o in outcomes) == 1, outcomes
