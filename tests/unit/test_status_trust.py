"""argus's own records cannot be forged from the repository: status commits, notes, the lease.

Real git throughout: a plain bare repository without hooks (every user can push any ref) read
in place, and the same as a ``file://`` remote mirrored by argus. Each attack is a push an
ordinary user can make: a commit on the status branch recording another user's task as
SUCCEEDED or moving her own ``first_seen`` ahead, a rewind to an older argus commit, a deleted
branch, a forged note, a lease commit with a far-future expiry. Each changes nothing argus
reads, is reported, and is replaced by argus's next write.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from reconciler.source.remote import RepoSource, open_source
from reconciler.spec.types import ObjectKey
from reconciler.status.auth import commit_verifies, note_verifies, status_key
from reconciler.status.branch import read_documents, write_note
from reconciler.status.lease import LEASE_REF, Lease
from reconciler.status.trust import commit_parts, trusted_documents
from reconciler.status.writer import StatusReport, StatusWriter
from tests.support import git, status_test_repo

OWNERSHIP_KEY = b"k" * 32
KEY = status_key(OWNERSHIP_KEY)
BOB = ObjectKey("bob", "task", "train")
ALICE = ObjectKey("alice", "task", "mine")
BOB_SID = "argus--bob--train--0123456789ab"
STATUS = "argus/status"


def _bare(tmp_path: Path) -> Path:
    return status_test_repo(tmp_path)[0]


def _writer(source: RepoSource, anchor: Path, key: bytes | None = KEY) -> StatusWriter:
    writer = StatusWriter(source, auth_key=key, anchor_file=str(anchor))
    return writer


def _keep() -> StatusReport:
    """A report that keeps every document as it is (source unknown): the write restores."""
    return StatusReport(None, {}, set(), set(), None, [])


def _forge(tmp_path: Path, url: str, edit: dict[str, dict[str, object]], name: str = "mallory") -> str:
    """What an ordinary user can do: clone, edit the status branch, commit, push it."""
    work = tmp_path / f"forge-{name}"
    if not work.exists():
        git(tmp_path, "clone", "-q", url, str(work))
    git(work, "fetch", "-q", "origin")
    git(work, "checkout", "-q", "-B", STATUS, f"origin/{STATUS}")
    for path, doc in edit.items():
        (work / path).parent.mkdir(parents=True, exist_ok=True)
        (work / path).write_text(yaml.safe_dump(doc))
    git(work, "add", "-A")
    # Looks like argus's own commit in every field a user can set.
    git(
        work,
        "-c",
        "user.name=argus",
        "-c",
        "user.email=argus@localhost",
        "commit",
        "-q",
        "-m",
        "argus: 1 transition(s) at 0123456789ab",
    )
    git(work, "push", "-q", "--force", "origin", f"HEAD:refs/heads/{STATUS}")
    return git(work, "rev-parse", "HEAD").strip()


def _succeeded_record() -> dict[str, dict[str, object]]:
    return {
        BOB.path: {
            "object": str(BOB),
            "kind": "Task",
            "state": "SUCCEEDED",
            "runs": [{"submission_id": BOB_SID, "spec_hash": "f" * 16, "status": "SUCCEEDED"}],
        }
    }


def _recorded(tmp_path: Path, bare: Path) -> tuple[StatusWriter, str]:
    writer = _writer(open_source(str(bare), str(tmp_path / "cache")), tmp_path / "state" / "anchor.json")
    assert writer.record_runs([(ALICE, "argus--alice--mine--000000000001", "a" * 16)])
    tip = git(bare, "rev-parse", STATUS).strip()
    return writer, tip


def _tip_verifies(repo: Path, ref: str = STATUS) -> bool:
    parts = commit_parts(str(repo), git(repo, "rev-parse", ref).strip())
    return parts is not None and commit_verifies(KEY, *parts)


def test_every_status_commit_argus_writes_verifies_and_a_users_does_not(tmp_path: Path) -> None:
    bare = _bare(tmp_path)
    _recorded(tmp_path, bare)
    assert _tip_verifies(bare)
    message = git(bare, "log", "-1", "--format=%B", STATUS)
    assert "Argus-Auth: v1 " in message
    _forge(tmp_path, str(bare), _succeeded_record())
    assert not _tip_verifies(bare)
    # The same commit content under another key does not verify either.
    parts = commit_parts(str(bare), git(bare, "rev-parse", f"{STATUS}~1").strip())
    assert parts is not None and commit_verifies(KEY, *parts)
    assert not commit_verifies(status_key(b"x" * 32), *parts)


def test_a_forged_succeeded_record_is_ignored_reported_and_replaced(tmp_path: Path) -> None:
    bare = _bare(tmp_path)
    writer, good = _recorded(tmp_path, bare)
    forged = _forge(tmp_path, str(bare), _succeeded_record())
    for reader in (writer, _writer(writer.source, tmp_path / "state" / "anchor.json")):  # also after a restart
        docs = reader.documents()
        assert BOB.path not in docs, "the forged run record must not be read"
        assert ALICE.path in docs
        assert any(forged[:12] in a and "not written by argus" in a for a in reader.alerts)
    # The next write puts argus's record back on the branch (and says what it ignored).
    writer.write(_keep())
    tip = git(bare, "rev-parse", STATUS).strip()
    assert tip != forged and _tip_verifies(bare)
    assert BOB.path not in read_documents(str(bare), STATUS)
    assert "integrity: " in git(bare, "show", f"{STATUS}:README.md")
    assert good in git(bare, "rev-list", STATUS).split()  # argus's own history goes on from its record


def test_a_forged_first_seen_is_ignored(tmp_path: Path) -> None:
    bare = _bare(tmp_path)
    writer = _writer(open_source(str(bare), str(tmp_path / "cache")), tmp_path / "anchor.json")
    assert writer.record_runs([(ALICE, "argus--alice--mine--000000000001", "a" * 16)])
    before = writer.documents()[ALICE.path].get("first_seen")
    doc = dict(read_documents(str(bare), STATUS)[ALICE.path])
    doc["first_seen"] = "2000-01-01T00:00:00Z"  # first in every queue
    _forge(tmp_path, str(bare), {ALICE.path: doc})
    assert writer.documents()[ALICE.path].get("first_seen") == before
    assert writer.alerts


def test_a_rewind_to_an_older_argus_commit_is_ignored(tmp_path: Path) -> None:
    bare = _bare(tmp_path)
    writer, first = _recorded(tmp_path, bare)
    assert writer.record_runs([(BOB, BOB_SID, "b" * 16)])  # bob's run, recorded before it is submitted
    git(bare, "update-ref", f"refs/heads/{STATUS}", first)  # an authentic commit, but older
    fresh = _writer(writer.source, tmp_path / "state" / "anchor.json")  # a restarted daemon
    assert BOB.path in fresh.documents(), "the record of bob's run must survive the rewind"
    assert any("does not descend" in a for a in fresh.alerts)


def test_a_deleted_status_branch_loses_no_record_and_is_restored(tmp_path: Path) -> None:
    bare = _bare(tmp_path)
    writer, _good = _recorded(tmp_path, bare)
    git(bare, "update-ref", "-d", f"refs/heads/{STATUS}")
    fresh = _writer(writer.source, tmp_path / "state" / "anchor.json")
    assert ALICE.path in fresh.documents()
    assert any("gone" in a for a in fresh.alerts)
    fresh.write(_keep())
    assert ALICE.path in read_documents(str(bare), STATUS) and _tip_verifies(bare)


def test_a_branch_from_an_argus_that_did_not_authenticate_is_adopted_once(tmp_path: Path) -> None:
    bare = _bare(tmp_path)
    old = StatusWriter(open_source(str(bare), str(tmp_path / "cache")))  # no key: an older argus
    assert old.record_runs([(ALICE, "argus--alice--mine--000000000001", "a" * 16)])
    upgraded = _writer(old.source, tmp_path / "anchor.json")
    assert ALICE.path in upgraded.documents()
    assert any("did not authenticate" in a for a in upgraded.alerts)
    upgraded.write(_keep())
    assert _tip_verifies(bare)
    # From then on, only authenticated commits count.
    _forge(tmp_path, str(bare), _succeeded_record())
    assert BOB.path not in _writer(old.source, tmp_path / "anchor.json").documents()


def test_a_branch_written_with_another_key_is_not_trusted(tmp_path: Path) -> None:
    bare = _bare(tmp_path)
    other = _writer(open_source(str(bare), str(tmp_path / "cache")), tmp_path / "other.json", status_key(b"o" * 32))
    assert other.record_runs([(BOB, BOB_SID, "b" * 16)])
    mine = _writer(other.source, tmp_path / "mine.json")
    assert mine.documents() == {}
    assert any("journal starts empty" in a for a in mine.alerts)


def test_a_one_off_reconcile_reads_only_authenticated_records(tmp_path: Path) -> None:
    bare = _bare(tmp_path)
    _recorded(tmp_path, bare)
    _forge(tmp_path, str(bare), _succeeded_record())
    docs = trusted_documents(str(bare), STATUS, OWNERSHIP_KEY)
    assert ALICE.path in docs and BOB.path not in docs


def test_a_remote_status_branch_is_never_fetched_over_argus_s_own(tmp_path: Path) -> None:
    origin = _bare(tmp_path)
    url = f"file://{origin}"
    source = open_source(url, str(tmp_path / "cache"))
    writer = _writer(source, tmp_path / "state" / "anchor.json")
    assert writer.record_runs([(ALICE, "argus--alice--mine--000000000001", "a" * 16)])
    assert _tip_verifies(origin)
    forged = _forge(tmp_path, url, _succeeded_record())
    source.fetch()
    mirror = Path(source.repo.path)
    assert git(mirror, "rev-parse", f"refs/heads/{STATUS}").strip() != forged  # the mirror keeps argus's
    assert git(mirror, "rev-parse", f"refs/remotes/origin/{STATUS}").strip() == forged  # judged there
    assert BOB.path not in writer.documents()
    assert any("not written by argus" in a for a in writer.alerts)
    writer.write(_keep())  # replaces the remote's copy (compare-and-swap against the forged tip)
    assert _tip_verifies(origin) and BOB.path not in read_documents(str(origin), STATUS)
    # Deleted on the remote: published again, nothing lost.
    git(origin, "update-ref", "-d", f"refs/heads/{STATUS}")
    source.fetch()
    assert ALICE.path in writer.documents()
    writer.write(_keep())
    assert ALICE.path in read_documents(str(origin), STATUS) and _tip_verifies(origin)
    assert any("missing on the remote" in a for a in writer.alerts)


def test_a_forged_note_is_replaced_and_notes_verify(tmp_path: Path) -> None:
    bare = _bare(tmp_path)
    revision = git(bare, "rev-parse", "main").strip()
    assert write_note(str(bare), revision, "argus: processed it\n", auth_key=KEY)
    text = git(bare, "notes", "--ref=argus", "show", revision)
    assert note_verifies(KEY, revision, text)
    assert not write_note(str(bare), revision, "argus: processed it\n", auth_key=KEY)  # unchanged
    git(bare, "notes", "--ref=argus", "add", "-f", "-m", "argus: processed it, all in sync", revision)
    assert not note_verifies(KEY, revision, git(bare, "notes", "--ref=argus", "show", revision))
    # Even a write that would keep an existing note replaces one argus did not write.
    assert write_note(str(bare), revision, "argus: processed it\n", replace=False, auth_key=KEY)
    assert note_verifies(KEY, revision, git(bare, "notes", "--ref=argus", "show", revision))


def _forge_lease(repo: Path, expires: object = 9e12, holder: str = "mallory") -> str:
    message = json.dumps({"holder": holder, "expires": expires, "auth": "0" * 64})
    tree = git(repo, "hash-object", "-t", "tree", "-w", "/dev/null").strip()
    commit = git(repo, "commit-tree", tree, "-m", message).strip()
    return commit


@pytest.mark.parametrize("remote", [False, True])
def test_a_forged_lease_is_ignored_and_reported(tmp_path: Path, remote: bool) -> None:
    origin = _bare(tmp_path)
    source = open_source(f"file://{origin}" if remote else str(origin), str(tmp_path / "cache"))
    forged = _forge_lease(origin)
    git(origin, "update-ref", LEASE_REF, forged)  # a user's push of refs/argus/lease
    lease = Lease(source, "daemon-1", ttl=30, key=KEY)
    assert lease.acquire(), "a lease argus did not write must not stop it"
    assert lease.ignored is not None and forged[:12] in lease.ignored
    assert git(origin, "rev-parse", LEASE_REF).strip() != forged  # taken over on the remote too
    # A second daemon with the same key sees the first one's lease as held.
    other = Lease(
        open_source(f"file://{origin}" if remote else str(origin), str(tmp_path / "cache2")),
        "daemon-2",
        ttl=30,
        key=KEY,
    )
    assert not other.acquire() and other.other == "daemon-1"


def test_without_a_key_leases_behave_as_before(tmp_path: Path) -> None:
    origin = _bare(tmp_path)
    git(origin, "update-ref", LEASE_REF, _forge_lease(origin))
    lease = Lease(open_source(str(origin), ""), "daemon-1", ttl=30)
    assert not lease.acquire() and lease.other == "mallory"


@pytest.mark.parametrize("key", [KEY, None])
@pytest.mark.parametrize(
    "fields",
    [{"holder": "\udcff"}, {"expires": 10**400}, {"expires": "soon"}, {"expires": True}, {"holder": ["x"]}],
    ids=["surrogate-holder", "huge-expiry", "text-expiry", "bool-expiry", "list-holder"],
)
def test_a_malformed_lease_is_an_expired_one_and_never_stops_a_tick(
    tmp_path: Path, key: bytes | None, fields: dict[str, object]
) -> None:
    """A pushed lease whose holder cannot be encoded or whose expiry is no finite number
    (json.dumps writes the surrogate as an escape, the integer with 400 digits) would make every
    lease check raise: it is read as an expired lease and taken over, with or without a key."""
    origin = _bare(tmp_path)
    git(origin, "update-ref", LEASE_REF, _forge_lease(origin, **fields))  # type: ignore[arg-type]
    lease = Lease(open_source(str(origin), ""), "daemon-1", ttl=30, key=key)
    assert lease.acquire()
    assert lease.acquire()  # renewed: the daemon's own lease from now on
