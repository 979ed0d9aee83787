"""StatusRecords equals recorded_runs + preemptions over the same documents, tick after tick.

Documents are replaced (never edited in place, as the status store does), added and removed
between reads; Ray's known ids change; runs that SUCCEEDED have their checkpoint looked up
exactly when ``recorded_runs`` would look it up (a run folder with a checkpoint exists on disk).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconciler.observe.records import StatusRecords
from reconciler.observe.runs import preemptions, recorded_runs
from reconciler.spec.types import Paths
from reconciler.status.persistent import PersistentMap, evolved

SIDS = ["argus--alice--t1--0123abcd", "argus--alice--t1--0123abcd--2", "argus--bob--t2--89abcdef", "hand-made"]
PATHS = ["users/alice/tasks/t1.yaml", "users/bob/tasks/t2.yaml", "users/bob/models/m.yaml", "README.md"]

run = st.fixed_dictionaries(
    {
        "submission_id": st.sampled_from(SIDS),
        "status": st.sampled_from(["SUBMITTED", "RUNNING", "SUCCEEDED", "PREEMPTED", "STOPPED", 3]),
    },
    optional={"spec_hash": st.sampled_from(["h1", "h2"]), "message": st.sampled_from(["", "oom"])},
)
doc = st.fixed_dictionaries(
    {"object": st.just("x")},
    optional={
        "runs": st.one_of(st.lists(run, max_size=3), st.just("not a list")),
        "preempted_by": st.sampled_from(["alice/models/m", "bob/tasks/t2", "bad key"]),
    },
)
step = st.tuples(st.dictionaries(st.sampled_from(PATHS), st.one_of(st.none(), doc)), st.sets(st.sampled_from(SIDS)))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(step, min_size=1, max_size=6), with_paths=st.booleans(), persistent=st.booleans())
def test_reading_per_document_equals_reading_them_all(
    steps: list[tuple[dict[str, Any], set[str]]], with_paths: bool, persistent: bool, tmp_path: Path
) -> None:
    """Plain dicts are read in full; the store's persistent maps only where they changed."""
    paths = Paths(common=str(tmp_path / "hf"), users=str(tmp_path / "users")) if with_paths else None
    records = StatusRecords()
    docs: Mapping[str, Any] = PersistentMap() if persistent else {}
    for changes, known in steps:
        gone = [p for p, new in changes.items() if new is None]
        # New objects: the store replaces what changes, and a persistent map shares the rest.
        docs = evolved(docs, {p: new for p, new in changes.items() if new is not None}, gone)
        mine: dict[str, str | None] = {}
        theirs: dict[str, str | None] = {}
        got = records.read(docs, paths, skip=known, checkpoints=mine)
        in_order = dict(sorted(docs.items()))  # the runs come in their documents' path order
        want = (recorded_runs(in_order, paths, skip=known, memo=theirs), *preemptions(in_order))
        assert got == want
        assert mine == theirs  # the same lookups, with the same answers
        assert len(records._readings) <= len(docs)
