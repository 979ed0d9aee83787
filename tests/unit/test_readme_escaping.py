"""Text that jobs or users control cannot add rows, headings or links to the status README."""

from __future__ import annotations

from pathlib import Path

from reconciler.status.documents import readme, readme_row
from tests.unit.fake_ray import FakeRay
from tests.unit.test_daemon_loop import _daemon, _readme, _repo

PAYLOAD = (
    "z`\n\n| alice | model | chat | FAILED | OutOfSync | `use http://evil.example/v1 instead` | now |\n\n"
    "## alice: your model was moved, see [here](http://evil.example)\n<!--"
)


def _injected(text: str) -> list[str]:
    """Lines of the README that the payload started (a line of its own: a row, heading or comment)."""
    return [line for line in text.splitlines() if line.startswith(("| alice | model", "## alice", "<!--"))]


def test_a_foreign_jobs_metadata_stays_inside_its_note(tmp_path: Path) -> None:
    repo, ray = _repo(tmp_path), FakeRay()
    ray.jobs["argus--x"] = {
        "submission_id": "argus--x",
        "status": "PENDING",
        "metadata": {"managed-by": "argus", "argus-task": "t", "argus-user": PAYLOAD},
    }
    daemon = _daemon(repo, ray)
    daemon.run_once()
    daemon.run_once()
    text = _readme(repo)
    assert "foreign job 'argus--x'" in text and not _injected(text)
    note = next(line for line in text.splitlines() if "foreign job" in line)
    assert note.startswith("- `") and note.endswith("`") and note.count("`") == 2


def test_errors_and_the_daemon_error_are_one_line_code_spans() -> None:
    text = readme({}, revision="r", errors=[f"users/a.yaml:1: {PAYLOAD}"], daemon_error=PAYLOAD).decode()
    assert not _injected(text)
    for line in text.splitlines():
        if "evil" in line:
            assert line.count("`") == 2 and "\n" not in line


def test_a_row_keeps_its_seven_cells() -> None:
    row = readme_row("users/a/tasks/t.yaml", {"submission_id": "x | y`\n| z", "state": "A|B", "sync": "s"})
    assert row.count(" | ") == 6 and "\n" not in row


def test_a_flood_of_foreign_jobs_is_counted_not_listed(tmp_path: Path) -> None:
    """Any job can submit thousands of jobs that claim to be argus's: the README names the first
    MAX_FOREIGN_NOTES and counts the rest, so no status commit grows with them."""
    from reconciler.tick import MAX_FOREIGN_NOTES

    repo, ray = _repo(tmp_path), FakeRay()
    flood = MAX_FOREIGN_NOTES + 500
    for i in range(flood):
        sid = f"argus--x{i:04d}"
        ray.jobs[sid] = {"submission_id": sid, "status": "PENDING", "metadata": {"managed-by": "argus"}}
    daemon = _daemon(repo, ray)
    daemon.run_once()
    daemon.run_once()
    text = _readme(repo)
    assert sum("foreign job 'argus--x" in line for line in text.splitlines()) == MAX_FOREIGN_NOTES
    assert "and 500 more foreign jobs" in text
    assert len(text.encode()) < 64 * 1024, len(text.encode())
