"""Usage documents on the status branch (reconciler/status/writer.py, ``StatusReport.usage``):
written through the one status writer only when handed (a changed date), kept across writes
and restarts, read back by a restarted daemon, and never believed from a user's push.

Real git: a bare repository every user can push to (tests.support.status_test_repo)."""

from __future__ import annotations

import json
from pathlib import Path

from reconciler.source.remote import open_source
from reconciler.spec.types import ObjectKey
from reconciler.status.auth import status_key
from reconciler.status.branch import read_documents
from reconciler.status.usage import Day, Ledger, document
from reconciler.status.writer import StatusReport, StatusWriter
from tests.support import git, status_test_repo

KEY = status_key(b"k" * 32)
STATUS = "argus/status"
ALICE = ObjectKey("alice", "task", "mine")
PATH = "usage/2026-12-05.json"


def _writer(tmp_path: Path, bare: Path) -> StatusWriter:
    source = open_source(str(bare), str(tmp_path / "cache"))
    return StatusWriter(source, auth_key=KEY, anchor_file=str(tmp_path / "state" / "anchor.json"))


def _doc(requests: int) -> dict[str, object]:
    day = Day()
    day.tokens[("a" * 32, "2026-12-05T03", "alice", "alice/models/chat")] = (requests, 10, 5)
    return document("2026-12-05", day)


def _report(usage: dict[str, dict[str, object]] | None = None) -> StatusReport:
    return StatusReport(None, {}, set(), set(), None, [], usage=usage or {})


def _show(bare: Path, path: str) -> str:
    return git(bare, "show", f"{STATUS}:{path}")


def test_usage_documents_are_written_once_per_change_and_read_back(tmp_path: Path) -> None:
    bare = status_test_repo(tmp_path)[0]
    writer = _writer(tmp_path, bare)
    assert writer.record_runs([(ALICE, "argus--alice--mine--000000000001", "a" * 16)])
    first = writer.write(_report({PATH: _doc(3)}))
    assert first is not None and json.loads(_show(bare, PATH))["tokens"][0]["requests"] == 3
    # A report without usage changes keeps the document as it is (no commit at all).
    assert writer.write(_report()) is None
    assert json.loads(_show(bare, PATH))["tokens"][0]["requests"] == 3
    second = writer.write(_report({PATH: _doc(4)}))
    assert second is not None and git(bare, "diff", "--name-only", first, second).split() == [PATH]
    # A restarted daemon reads the documents back, and its first write does not drop them.
    fresh = _writer(tmp_path, bare)
    back = fresh.usage_documents()
    assert list(back) == [PATH] and back[PATH]["tokens"][0]["requests"] == 4
    fresh.write(_report())
    assert json.loads(_show(bare, PATH))["tokens"][0]["requests"] == 4
    ledger = Ledger()
    ledger.load(back)
    assert ledger.totals().requests == {("alice", "alice/models/chat"): 4}
    assert ALICE.path in read_documents(str(bare), STATUS)


def test_a_forged_usage_file_is_not_believed(tmp_path: Path) -> None:
    """A user pushes a status commit with inflated (or deflated) usage: argus reads only the
    commits it authenticated, so neither the running daemon nor a restarted one believes it,
    and its next write replaces the forged tip."""
    bare = status_test_repo(tmp_path)[0]
    writer = _writer(tmp_path, bare)
    writer.write(_report({PATH: _doc(3)}))
    work = tmp_path / "forge"
    git(tmp_path, "clone", "-q", str(bare), str(work))
    git(work, "checkout", "-q", "-B", STATUS, f"origin/{STATUS}")
    (work / PATH).write_text(json.dumps(_doc(1_000_000)))
    (work / "usage" / "2026-12-04.json").write_text(json.dumps({**_doc(7), "date": "2026-12-04"}))
    git(work, "add", "-A")
    git(work, "-c", "user.name=argus", "-c", "user.email=argus@localhost", "commit", "-q", "-m", "argus: usage")
    git(work, "push", "-q", "--force", "origin", f"HEAD:refs/heads/{STATUS}")
    for reader in (writer, _writer(tmp_path, bare)):  # also after a restart
        back = reader.usage_documents()
        assert list(back) == [PATH] and back[PATH]["tokens"][0]["requests"] == 3
        assert reader.alerts
    writer.write(_report())
    assert json.loads(_show(bare, PATH))["tokens"][0]["requests"] == 3
    assert "usage/2026-12-04.json" not in git(bare, "ls-tree", "-r", "--name-only", STATUS).split()
