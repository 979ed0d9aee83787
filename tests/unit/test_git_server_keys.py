"""The git server's self-service API keys (images/git-server/argus-shell, ``key new|list|revoke``): the file
logic, loaded from the script itself. Over a real sshd, with hostile users: tests/e2e/test_git_server_shell.py."""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import threading
from pathlib import Path
from types import ModuleType

import pytest

from reconciler.observe import api_keys
from reconciler.observe.api_keys import parse_keys

SCRIPT = Path(__file__).resolve().parents[2] / "images" / "git-server" / "argus-shell"


def load_shell() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("argus_shell", str(SCRIPT))
    spec = importlib.util.spec_from_loader("argus_shell", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


shell = load_shell()
NOW = 1_800_000_000.0


def test_a_new_key_is_random_printed_once_and_only_its_hash_is_stored(tmp_path: Path) -> None:
    path = str(tmp_path / "keys")
    key, key_id = shell.key_new("alice", path, 5, NOW)
    other, _ = shell.key_new("alice", path, 5, NOW)
    assert key.startswith("argus-alice-") and len(key) > 50 and key != other
    text = Path(path).read_text()
    assert key not in text and other not in text
    digest = hashlib.sha256(key.encode()).hexdigest()
    assert text.splitlines()[0] == f"alice {digest}  # 2027-01-15T08:00:00Z"
    assert key_id == digest[:12]
    # The daemon reads every line the shell writes, without a problem.
    keys, problems = parse_keys(text, path)
    assert problems == [] and keys[digest] == "alice" and len(keys) == 2
    assert (Path(path).stat().st_mode & 0o777) == 0o644


def test_list_shows_only_the_owners_keys(tmp_path: Path) -> None:
    path = str(tmp_path / "keys")
    _, a = shell.key_new("alice", path, 5, NOW)
    _, b = shell.key_new("bob", path, 5, NOW)
    assert shell.key_list("alice", path) == [(a, "2027-01-15T08:00:00Z")]
    assert shell.key_list("bob", path) == [(b, "2027-01-15T08:00:00Z")]
    assert shell.key_list("carol", str(tmp_path / "none")) == []


def test_revoke_deletes_the_owners_key_and_never_anothers(tmp_path: Path) -> None:
    path = str(tmp_path / "keys")
    _, a = shell.key_new("alice", path, 5, NOW)
    _, b = shell.key_new("bob", path, 5, NOW)
    before = Path(path).read_text()
    with pytest.raises(shell.Refused, match="none of your keys has the id"):
        shell.key_revoke("bob", path, a)  # alice's id: for bob, no key of his
    with pytest.raises(shell.Refused, match="none of your keys has the id"):
        shell.key_revoke("bob", path, Path(path).read_text().split()[1])  # her whole hash
    assert Path(path).read_text() == before
    for bad in ("", "abc", "../../etc", "g" * 12, "a" * 65):
        with pytest.raises(shell.Refused, match="is not a key id"):
            shell.key_revoke("bob", path, bad)
    assert shell.key_revoke("alice", path, a[:8].upper()) == a
    assert shell.key_list("alice", path) == [] and shell.key_list("bob", path) == [(b, "2027-01-15T08:00:00Z")]


def test_an_ambiguous_id_revokes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(f"alice {'ab' * 32}  # one\nalice {'ab' * 31}cd  # two\n")
    with pytest.raises(shell.Refused, match="2 of your keys start with abababab"):
        shell.key_revoke("alice", str(path), "abababab")
    assert shell.key_revoke("alice", str(path), "ab" * 31 + "cd") == "ab" * 6
    assert path.read_text() == f"alice {'ab' * 32}  # one\n"


def test_each_user_holds_at_most_the_limit_even_when_asking_at_once(tmp_path: Path) -> None:
    path = str(tmp_path / "keys")
    refused: list[str] = []

    def one() -> None:
        try:
            shell.key_new("alice", path, 3, NOW)
        except shell.Refused as exc:
            refused.append(str(exc))

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(shell.key_list("alice", path)) == 3 and len(refused) == 5
    assert "you have 3 keys, the most one user may have" in refused[0]
    shell.key_new("bob", path, 3, NOW)  # another user's limit is his own


def test_a_user_name_the_daemon_would_skip_gets_no_key(tmp_path: Path) -> None:
    with pytest.raises(shell.Refused, match="not a user name"):
        shell.key_new("bad--name", str(tmp_path / "keys"), 5, NOW)
    assert not (tmp_path / "keys").exists()


def test_without_a_keys_file_setting_key_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ARGUS_SELF_KEYS", raising=False)
    with pytest.raises(shell.Refused, match="ask the admin"):
        shell.keys_path()
    monkeypatch.setenv("ARGUS_SELF_KEYS", "relative/keys")
    with pytest.raises(shell.Refused):
        shell.keys_path()


def test_other_lines_are_kept_as_they_are(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(f"# written by hand\nbob {'c' * 64}\n")
    _, a = shell.key_new("alice", str(path), 5, NOW)
    shell.key_revoke("alice", str(path), a)
    assert path.read_text() == f"# written by hand\nbob {'c' * 64}\n"


def test_the_shell_writes_what_the_daemon_reads() -> None:
    """argus-shell cannot import argus (the git server image has none): its copies of the daemon's user name
    pattern and size bound must stay the same."""
    assert shell.KEY_USER.pattern == api_keys.USER_RE.pattern.removeprefix("^").removesuffix("$")
    assert shell.MAX_KEYS_FILE == api_keys.MAX_BYTES
