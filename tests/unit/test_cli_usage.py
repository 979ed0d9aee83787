"""``argus usage`` (reconciler/cli/usage.py) against a real repository whose status branch the
real status writer built from a real ledger, read from a user's clone as ``argus status`` reads
it; and the pure summing and table."""

from __future__ import annotations

import calendar
import json
from pathlib import Path

import pytest

from reconciler.cli import main
from reconciler.cli.usage import render, summarise
from reconciler.source.remote import open_source
from reconciler.status.auth import status_key
from reconciler.status.usage import Job, Ledger
from reconciler.status.writer import StatusReport, StatusWriter
from tests.support import git, status_test_repo

T = float(calendar.timegm((2026, 12, 5, 3, 0, 0)))


def _answer(epoch: str, hour: str, user: str, app: str, req: int, p: int, c: int) -> dict[str, object]:
    row = {"hour": hour, "user": user, "app": app, "requests": req, "prompt_tokens": p, "completion_tokens": c}
    return {"epoch": epoch, "now": T, "rows": [row]}


def _ledger() -> Ledger:
    ledger = Ledger()
    ledger.tell(T)  # the daemon's clock, which the ledger's bounds count from
    ledger.merge_tokens(_answer("a" * 32, "2026-12-05T03", "alice", "argus--alice--chat", 3, 31, 24))
    ledger.merge_tokens(_answer("b" * 32, "2026-12-05T04", "alice", "argus--alice--chat", 2, 9, 6))  # meter restarted
    ledger.merge_tokens(_answer("a" * 32, "2026-12-04T22", "bob", "argus--alice--chat", 1, 5, 5))
    ledger.record_tasks([Job("sid", "bob", "train", 2.0, T - 3600, T - 1800)], {"bob": "vision"}, now=T)
    return ledger


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    bare = status_test_repo(tmp_path)[0]
    writer = StatusWriter(open_source(str(bare), str(tmp_path / "cache")), auth_key=status_key(b"k" * 32))
    assert writer.write(StatusReport(None, {}, set(), set(), None, [], usage=_ledger().take_documents()))
    out = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(bare), str(out))
    return out


def test_usage_table(clone: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["usage", "--repo", str(clone), "--cache-dir", str(clone.parent / "c")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["USER", "OBJECT", "REQUESTS", "PROMPT_TOKENS", "COMPLETION_TOKENS", "GPU_SECONDS"]
    rows = [line.split() for line in lines[1:]]
    assert ["alice", "alice/models/chat", "5", "40", "30", "0.0"] in rows
    assert ["bob", "alice/models/chat", "1", "5", "5", "0.0"] in rows
    assert ["bob", "bob/tasks/train", "0", "0", "0", "3600.0"] in rows
    assert ["bob", "(total)", "1", "5", "5", "3600.0"] in rows


def test_usage_filters_and_json(clone: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cache = ["--cache-dir", str(clone.parent / "c")]
    assert main(["usage", "--repo", str(clone), *cache, "--user", "bob", "--since", "2026-12-05", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rows"] == [
        {
            "user": "bob",
            "object": "bob/tasks/train",
            "requests": 0,
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "gpu_seconds": 3600.0,
        }
    ]
    assert out["totals"]["bob"]["gpu_seconds"] == 3600.0
    assert main(["usage", "--repo", str(clone), *cache, "--until", "2026-12-04", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [(r["user"], r["requests"]) for r in out["rows"]] == [("bob", 1)]


def test_a_bad_date_is_refused(clone: Path) -> None:
    with pytest.raises(SystemExit):
        main(["usage", "--repo", str(clone), "--since", "yesterday"])


def test_summarise_and_render_are_pure() -> None:
    ledger = _ledger()
    table = summarise(sorted(ledger.days.items()), user="alice")
    assert list(table) == [("alice", "alice/models/chat")]
    assert render(table)[-1].split() == ["alice", "(total)", "5", "40", "30", "0.0"]
