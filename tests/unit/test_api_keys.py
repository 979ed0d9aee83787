"""The API keys files (reconciler/observe/api_keys.py): ``<user> <sha256 hex>`` lines, bad
lines reported at ``file:line`` and skipped, read again when it changes, bounded in size, and
failing closed (no key accepted) when it cannot be read; several files (the admin's and the git
server's self-service one) read as one; keys of users cluster.yaml does not declare left out."""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import pytest

from reconciler.observe import api_keys
from reconciler.observe.api_keys import KeysFile, KeysFiles, known_users, parse_keys, split_paths


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


A, B = sha("sk-alice"), sha("sk-bob")


def test_good_lines_comments_and_blank_lines() -> None:
    text = f"# keys of the cluster\n\nalice {A}  # laptop\nbob {B.upper()}\n"
    assert parse_keys(text, "keys") == ({A: "alice", B: "bob"}, [])


def test_bad_lines_are_reported_with_their_line_and_skipped() -> None:
    text = "\n".join(
        [
            f"alice {A}",
            "bob",  # 2: one field
            f"Bob {B}",  # 3: not a user name
            "bob sk-the-key-itself",  # 4: a key, not its hash
            f"bob {'z' * 64}",  # 5: not hex
            f"bob {A}",  # 6: alice's hash again
            f"bob {B} extra",  # 7: three fields
            f"bob {B}",
        ]
    )
    keys, problems = parse_keys(text, "/etc/argus/api-keys")
    assert keys == {A: "alice", B: "bob"}
    assert [(p.line, str(p).split(": ", 1)[0]) for p in problems] == [
        (n, f"/etc/argus/api-keys:{n}") for n in (2, 3, 4, 5, 6, 7)
    ]
    assert "never put keys here" in problems[2].message
    assert "already alice's" in problems[4].message  # a later line cannot take a key over


def test_the_file_is_read_again_when_it_changes_and_only_then(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(f"alice {A}\n")
    keys = KeysFile(str(path))
    first = keys.read()
    assert first == {A: "alice"}
    assert keys.read() is first  # unchanged: one stat, no parse
    path.write_text(f"alice {A}\nbob {B}\n")
    assert keys.read() == {A: "alice", B: "bob"}
    path.write_text(f"bob {B}\n")  # alice's key revoked: the same size as before, a new mtime
    os.utime(path, ns=(1, 1))
    assert keys.read() == {B: "bob"}


def test_an_unreadable_or_oversized_file_admits_no_key_and_says_so_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "keys"
    path.mkdir()  # not a file: cannot be read
    keys = KeysFile(str(path))
    with caplog.at_level(logging.ERROR, logger="argus"):
        assert keys.read() == {} and keys.read() == {}
    assert len(caplog.records) == 1 and "no API key from it is accepted" in caplog.records[0].getMessage()
    assert keys.problems[0].line == 0
    path.rmdir()
    monkeypatch.setattr(api_keys, "MAX_BYTES", 100)
    path.write_text(f"alice {A}\nbob {B}\n")  # 150 bytes
    assert keys.read() == {}
    assert "the limit is 100" in keys.problems[0].message
    path.write_text(f"alice {A}\n")
    assert keys.read() == {A: "alice"}  # fixed: read again


def test_bad_lines_are_logged_once_per_change(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "keys"
    path.write_text("garbage\n" * 50)
    keys = KeysFile(str(path))
    with caplog.at_level(logging.WARNING, logger="argus"):
        keys.read()
        keys.read()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 21 and warnings[0].startswith(f"{path}:1: ") and "30 more" in warnings[-1]


def test_doctor_takes_the_routers_401_for_an_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """With keys on, `argus doctor`'s OpenAI check (which has no key) gets the router's 401: the
    endpoint answers. Any other 401 (a proxy in front) still fails the check."""
    from reconciler import doctor

    settings = doctor.Settings(serve_url="http://serve:8000")
    body = b'{"error": {"message": "No API key provided", "type": "InvalidApiKey", "code": 401}}'
    monkeypatch.setattr(doctor, "_get", lambda url, timeout: (401, body))
    assert "API keys are on" in doctor.check_openai(settings)
    monkeypatch.setattr(doctor, "_get", lambda url, timeout: (401, b"Unauthorized"))
    with pytest.raises(doctor.CheckFailed):
        doctor.check_openai(settings)


def test_a_file_that_does_not_exist_yet_holds_no_key_and_is_no_problem(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "keys"
    keys = KeysFile(str(path))
    with caplog.at_level(logging.WARNING, logger="argus"):
        assert keys.read() == {} and keys.read() == {}
    assert len(caplog.records) == 1 and "no such API keys file" in caplog.records[0].getMessage()
    assert keys.absent and keys.problems == []
    path.write_text(f"alice {A}\n")  # the first `key new`
    assert keys.read() == {A: "alice"} and not keys.absent


def test_several_files_are_one_set_of_keys_each_read_again_when_it_changes(tmp_path: Path) -> None:
    admin, own = tmp_path / "admin", tmp_path / "self"
    admin.write_text(f"alice {A}\n")
    files = KeysFiles([str(admin), str(own)])
    first = files.read()
    assert first == {A: "alice"} and files.read() is first  # the self-service file absent: no key from it
    own.write_text(f"bob {B}  # 2026-12-05T02:50:00Z\n")
    assert files.read() == {A: "alice", B: "bob"}
    own.write_text("")
    assert files.read() == {A: "alice"}  # bob revoked his key


def test_a_hash_belongs_to_the_first_file_that_holds_it(tmp_path: Path) -> None:
    admin, own = tmp_path / "admin", tmp_path / "self"
    admin.write_text(f"alice {A}\n")
    own.write_text(f"bob {A}\nbob {B}\n")
    files = KeysFiles([str(admin), str(own)])
    assert files.read() == {A: "alice", B: "bob"}
    assert [str(p) for p in files.problems] == [f"{own}: a key hash of bob's is already alice's"]


def test_a_broken_file_loses_its_own_keys_only(tmp_path: Path) -> None:
    admin, own = tmp_path / "admin", tmp_path / "self"
    admin.mkdir()  # unreadable as a file
    own.write_text(f"bob {B}\n")
    files = KeysFiles([str(admin), str(own)])
    assert files.read() == {B: "bob"}  # fewer keys, never more
    assert [(p.path, p.line) for p in files.problems] == [(str(admin), 0)]


def test_bad_lines_of_each_file_are_reported_at_their_file_and_line(tmp_path: Path) -> None:
    admin, own = tmp_path / "admin", tmp_path / "self"
    admin.write_text(f"alice {A}\ngarbage\n")
    own.write_text(f"\nbob sk-the-key\nbob {B}\n")
    files = KeysFiles([str(admin), str(own)])
    assert files.read() == {A: "alice", B: "bob"}
    assert [str(p).split(": ")[0] for p in files.problems] == [f"{admin}:2", f"{own}:2"]


def test_keys_of_users_cluster_yaml_does_not_declare_are_left_out() -> None:
    keys = {A: "alice", B: "mallory"}
    assert known_users(keys, None) == keys  # no `users:`: every key counts
    assert known_users(keys, {"alice": object()}) == {A: "alice"}
    assert known_users(keys, {}) == {}  # `users: {}`: nobody


def test_paths_given_once_more_or_as_a_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert split_paths(None) == [] and split_paths("") == [] and split_paths([]) == []
    assert split_paths("/a, /b,,/a") == ["/a", "/b"]
    assert split_paths(["/a", "/b,/c", "rel"]) == ["/a", "/b", "/c", str(tmp_path / "rel")]
