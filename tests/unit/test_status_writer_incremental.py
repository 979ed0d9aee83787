"""The status writer works in deltas (the tree and the store are updated only where a write changed
something): after any sequence of writes, recorded runs, a second writer's commits and a stray file
on the branch, what it holds and what it wrote equal a full recomputation. Real git.

- The store's snapshot (updated in place by the writer's own commits) equals a fresh store's read
  of the same commit: documents, root files and blob ids.
- A writer started from nothing, handed the same report at the same clock, finds nothing to
  commit: the tree built in deltas is the tree a full build makes.
- The branch holds exactly one document per reported object (objects gone are removed, a stray
  file is dropped).
- After every write, a writer started from nothing finds nothing to commit: the documents the
  writer did not look at (their status the very value handed on, their file, log tail and
  checkpoint unchanged) are the ones a full build leaves as they are. Statuses are handed on as
  the tick hands them (the same value while unchanged), and a run's log tail can arrive later
  than its status.
- A report older than a run's record (the background writer's, written after the next tick
  recorded a new task's run) keeps that run on record; the next report removes what is gone.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from reconciler.plan.actions import Plan
from reconciler.plan.actual import ActualJob
from reconciler.plan.assess import ObjectStatus
from reconciler.source.remote import open_source
from reconciler.spec.types import ObjectKey
from reconciler.status.store import StatusStore
from reconciler.status.writer import StatusReport, StatusWriter
from tests.support import git, status_test_repo

KEYS = [ObjectKey(u, k, n) for u in ("alice", "bob") for k in ("model", "task") for n in ("a", "b", "c")]
STATES = ("RUNNING", "QUEUED", "SUSPENDED", "FAILED")
CLOCK = "2026-12-01T12:00:00Z"
# A name that is not UTF-8 (decoded with surrogateescape), one with a newline, one with a tab:
# git stores any of them; someone who can push the status branch could leave one there.
ODD_NAMES = ["junk-\udcff.yaml", "users/alice/two\nlines.yaml", "users/bob/a\tb.yaml"]

step = st.one_of(
    st.tuples(
        st.just("write"),
        st.dictionaries(st.sampled_from(KEYS), st.sampled_from(STATES), max_size=len(KEYS)),
        st.integers(0, 31),  # which revision of the inputs (a bit each: see _report)
    ),
    st.tuples(st.just("record"), st.sampled_from([k for k in KEYS if k.kind == "task"]), st.integers(1, 3)),
    st.tuples(st.just("other"), st.sampled_from(KEYS), st.sampled_from(STATES)),
    st.tuples(st.just("stray"), st.sampled_from(["users/alice/notes.txt", "junk.yaml", *ODD_NAMES]), st.just(0)),
    st.tuples(st.just("tail"), st.sampled_from([k for k in KEYS if k.kind == "task"]), st.integers(0, 1)),
    st.tuples(st.just("unknown"), st.just(None), st.just(0)),  # a source error between two reports
    # A run recorded, then the report of the tick before (which may not list the task) written.
    st.tuples(st.just("stale"), st.sampled_from([k for k in KEYS if k.kind == "task"]), st.integers(4, 5)),
)
RESOLVED = [{"model": "a"}, {"model": "b"}]
# One value per (object, state): a status unchanged is the very value the last tick handed on.
_STATUSES: dict[tuple[ObjectKey, str], ObjectStatus] = {}


def _repo(root: Path) -> tuple[Path, Path, str]:
    bare, sha = status_test_repo(root)
    return bare, root / "work", sha


def _status(key: ObjectKey, state: str) -> ObjectStatus:
    known = _STATUSES.get((key, state))
    if known is None:
        runs = (ActualJob(_sid(key), key, "h", state),) if key.kind == "task" else ()
        sync = "OutOfSync" if state == "QUEUED" else "Synced"  # then whether it was applied shows
        known = _STATUSES[(key, state)] = ObjectStatus(key, state, sync, reason=f"{state.lower()} now", runs=runs)
    return known


def _sid(key: ObjectKey) -> str:
    return f"argus--{key.user}--{key.name}--0001"


def _report(
    sha: str, states: dict[ObjectKey, str], revision: int, tails: dict[str, list[str]] | None = None
) -> StatusReport:
    statuses = {k: _status(k, s) for k, s in sorted(states.items())}
    actual: dict[str, Any] = {"jobs": []}
    # Each bit of ``revision`` moves one input of the documents alone: the file blobs, which objects
    # were applied, which failed, their resolved specs (one value per variant, handed on by
    # identity), the checkpoints of task runs.
    bit = [(revision >> b) & 1 for b in range(5)]
    return StatusReport(
        sha,
        statuses,
        {k for i, k in enumerate(statuses) if (i + bit[1]) % 2 == 0},
        {k for i, k in enumerate(statuses) if (i + bit[2]) % 3 == 0},
        Plan(),
        [],
        spec_ids={k.path: f"blob-{bit[0]}" for k in statuses},
        resolved={k.path: RESOLVED[bit[3]] for k in statuses},
        checkpoints={_sid(k): f"/ckpt/{bit[4]}" for k in statuses if k.kind == "task"},
        actual=actual,
        first_seen={k: 1767225600 + revision for k in statuses},
        log_tails=tails if tails is not None else {},
    )


def _writer(bare: Path, cache: Path) -> StatusWriter:
    return StatusWriter(open_source(str(bare), str(cache)), now=lambda: CLOCK)


def _same_as_a_fresh_read(writer: StatusWriter) -> None:
    tip = writer._tip
    assert tip is not None
    held = writer._store.read(tip)
    fresh = StatusStore(writer.source.repo.path, "argus/status").read(tip)
    assert dict(held.blobs) == dict(fresh.blobs)
    assert dict(held.docs) == dict(fresh.docs)
    assert dict(held.root) == dict(fresh.root)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(step, min_size=1, max_size=7))
@example(steps=[("write", {KEYS[3]: "FAILED", KEYS[0]: "RUNNING"}, 0), ("tail", KEYS[3], 0)])  # a tail after its status
# The same statuses, one other input moved: applied, failed, resolved, checkpointed otherwise.
@example(steps=[("write", dict.fromkeys(KEYS[:5], "QUEUED"), 0), ("write", dict.fromkeys(KEYS[:5], "QUEUED"), 1)])
@example(steps=[("write", dict.fromkeys(KEYS[:5], "QUEUED"), 0), ("write", dict.fromkeys(KEYS[:5], "QUEUED"), 2)])
@example(steps=[("write", dict.fromkeys(KEYS[:5], "QUEUED"), 0), ("write", dict.fromkeys(KEYS[:5], "QUEUED"), 4)])
@example(steps=[("write", dict.fromkeys(KEYS[:5], "QUEUED"), 0), ("write", dict.fromkeys(KEYS[:5], "QUEUED"), 8)])
@example(steps=[("write", dict.fromkeys(KEYS[:5], "QUEUED"), 0), ("write", dict.fromkeys(KEYS[:5], "QUEUED"), 16)])
# A new task's run recorded while the last report (without it) waits, then that report written.
@example(steps=[("write", {KEYS[0]: "RUNNING"}, 0), ("stale", KEYS[3], 4), ("write", {KEYS[0]: "QUEUED"}, 1)])
def test_writes_in_deltas_equal_a_full_build(tmp_path_factory: Any, steps: list[tuple[Any, ...]]) -> None:
    root = tmp_path_factory.mktemp("delta")
    bare, work, sha = _repo(root)
    writer = _writer(bare, root / "cache")
    other = _writer(bare, root / "other")
    last: StatusReport | None = None
    tails: dict[str, list[str]] = {}  # the reporter's: log tails arrive in place, between writes
    for n, (kind, what, value) in enumerate(steps):
        if kind == "write":
            last = _report(sha, what, value, tails)
            writer.write(last)
            assert _writer(bare, root / f"full{n}").write(last) is None, "a full build differs"
        elif kind == "tail" and last is not None:
            tails.setdefault(_sid(what), [f"line {value}"])  # the reporter fetches a run's tail once
            writer.write(last)
            assert _writer(bare, root / f"full{n}").write(last) is None, "a full build differs"
        elif kind == "unknown":
            writer.write(StatusReport(None, {}, set(), set(), None, [], source_error="unreachable"))
        elif kind == "stale" and last is not None:
            seen, sid = writer.records, f"argus--{what.user}--{what.name}--{value:04d}"
            assert writer.record_runs([(what, sid, "h")])
            writer.write(replace(last, records_seen=seen))
            runs = writer.documents()[what.path]["runs"]
            assert sid in [r["submission_id"] for r in runs], "a report older than a record dropped it"
        elif kind == "record" and last is not None:
            assert writer.record_runs([(what, f"argus--{what.user}--{what.name}--{value:04d}", "h")])
        elif kind == "other" and last is not None:  # a second writer with this branch moves it
            other.write(StatusReport(sha, {what: _status(what, value)}, {what}, set(), Plan(), []))
        elif kind == "stray":
            branch = git(bare, "rev-parse", "-q", "--verify", "argus/status", check=False).strip()
            if branch:
                git(work, "fetch", "-q", "origin", "argus/status")
                git(work, "checkout", "-q", "FETCH_HEAD")
                Path(work / what).parent.mkdir(parents=True, exist_ok=True)
                Path(work / what).write_text("not argus's\n")
                git(work, "add", "-A")
                git(work, "commit", "-q", "--allow-empty", "-m", "stray")
                git(work, "push", "-q", "origin", "HEAD:refs/heads/argus/status")
                git(work, "checkout", "-q", "main")
        if writer._tip is not None and kind in ("write", "record", "stale"):
            _same_as_a_fresh_read(writer)
    if last is None:
        return
    writer.write(last)  # on whatever the others left: the documents are exactly the reported objects
    _same_as_a_fresh_read(writer)
    files = set(git(bare, "ls-tree", "-r", "--name-only", "argus/status").split())
    assert files == {k.path for k in last.statuses} | {"README.md", "revision.yaml", "actual.json"}
    fresh = _writer(bare, root / "fresh")
    assert fresh.write(last) is None  # a full build finds the tree the deltas built


def test_a_stray_file_with_any_name_is_dropped_and_the_writer_goes_on(tmp_path: Path) -> None:
    bare, work, sha = _repo(tmp_path)
    writer = _writer(bare, tmp_path / "cache")
    writer.write(_report(sha, {KEYS[0]: "RUNNING"}, 0))
    git(work, "fetch", "-q", "origin", "argus/status")
    git(work, "checkout", "-q", "FETCH_HEAD")
    for name in ODD_NAMES:
        path = work / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("not argus's\n")
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "odd names")
    git(work, "push", "-q", "origin", "HEAD:refs/heads/argus/status")
    git(work, "checkout", "-q", "main")
    last = _report(sha, {KEYS[0]: "QUEUED", KEYS[1]: "RUNNING"}, 1)
    assert writer.write(last) is not None
    _same_as_a_fresh_read(writer)
    listing = subprocess.run(
        ["git", "ls-tree", "-r", "-z", "--name-only", "argus/status"], cwd=bare, capture_output=True, check=True
    ).stdout
    files = {os.fsdecode(name) for name in listing.split(b"\0") if name}
    assert files == {k.path for k in last.statuses} | {"README.md", "revision.yaml", "actual.json"}
    assert _writer(bare, tmp_path / "fresh").write(last) is None


def test_text_that_is_not_utf_8_is_written_escaped_not_refused(tmp_path: Path) -> None:
    """A lone surrogate (a path that is not UTF-8, decoded with surrogateescape, named in an
    error, a note, a source error or an object's reason) cannot be encoded into git's UTF-8: the
    writer shows its escape instead of failing every status write."""
    bare, _work, sha = _repo(tmp_path)
    writer = _writer(bare, tmp_path / "cache")
    odd = "users/bob/caf\udce9.yaml"
    status = ObjectStatus(KEYS[0], "FAILED", "Synced", reason=f"{odd} is odd")
    report = StatusReport(
        sha,
        {KEYS[0]: status},
        {KEYS[0]},
        set(),
        Plan(),
        [f"{odd}:0: unsigned"],
        notes=[f"rejected {odd}"],
        source_error=f"cannot read {odd}",
    )
    assert writer.write(report) is not None
    readme = git(bare, "show", "argus/status:README.md")
    assert "caf\\udce9.yaml" in readme and "\udce9" not in readme
    assert "caf\\udce9.yaml is odd" in git(bare, "show", f"argus/status:{KEYS[0].path}")
