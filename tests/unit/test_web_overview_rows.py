"""The overview's rows kept across status commits equal the rows computed afresh, after any
sequence of commits (documents added, changed, replaced by an equal copy, deleted)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.web import view

STATES = ["RUNNING", "FAILED", "QUEUED", "INVALID", "DEPLOYING", "SUCCEEDED", 7, None]
paths = st.builds(
    lambda u, k, n: f"users/{u}/{k}/{n}.yaml",
    st.sampled_from(["alice", "bob", "carol", "a"]),
    st.sampled_from(["models", "tasks"]),
    st.sampled_from(["m1", "m2", "x", "a-b"]),
)
docs = st.fixed_dictionaries(
    {"state": st.sampled_from(STATES)},
    optional={
        "sync": st.sampled_from(["Synced", "Held", "Invalid"]),
        "reason": st.sampled_from(["", "insufficient capacity: needs 2 GPU, free 0 GPU"]),
        "requested": st.just({"GPU": 1}),
    },
)
# Each commit: new documents for some paths, deletions, and equal copies (a new object, same content).
commits = st.lists(
    st.tuples(st.dictionaries(paths, docs, max_size=12), st.lists(paths, max_size=4), st.lists(paths, max_size=4)),
    min_size=1,
    max_size=8,
)


@settings(max_examples=300, deadline=None)
@given(commits)
def test_kept_rows_equal_fresh_rows_after_any_commits(history: list[Any]) -> None:
    kept = view.Overview()
    current: dict[str, Any] = {}
    for changed, deleted, copied in history:
        current = dict(current)
        current.update(changed)
        for path in deleted:
            current.pop(path, None)
        for path in copied:
            if path in current:
                current[path] = dict(current[path])
        kept.update(current)
        fresh = view.sorted_rows(current)
        assert kept.rows == fresh
        assert kept.keys == [view.sort_key(r) for r in fresh]
        assert kept.states == Counter(r.state for r in fresh)
        assert kept.users == sorted({r.user for r in fresh})
        assert view.queued_capacity(view.Capacity(), kept.queued) == view.capacity({}, current)


def test_a_commit_of_one_document_moves_one_row() -> None:
    docs = {f"users/u{i:03d}/models/m.yaml": {"state": "RUNNING"} for i in range(500)}
    kept = view.Overview()
    kept.update(docs)
    before = list(kept.rows)
    docs = {**docs, "users/u250/models/m.yaml": {"state": "FAILED"}}
    kept.update(docs)
    assert kept.rows[0].user == "u250" and kept.rows[0].state == "FAILED"
    assert [r for r in kept.rows[1:]] == [r for r in before if r.user != "u250"]
    assert all(a is b for a, b in zip(kept.rows[1:], [r for r in before if r.user != "u250"], strict=True))


def test_filters_and_pages() -> None:
    docs = {f"users/u{i % 7}/tasks/t{i}.yaml": {"state": "QUEUED" if i % 3 else "RUNNING"} for i in range(100)}
    kept = view.Overview()
    kept.update(docs)
    rows = kept.rows
    for f in (
        view.Filters(),
        view.Filters(user="u3"),
        view.Filters(state="QUEUED, attention"),
        view.Filters(kind="task", page=2, per_page=7),
        view.Filters(page=99),
    ):
        page = view.paginate(rows, f)
        every = [r for r in rows if f.keep(r)]
        start = (f.page - 1) * f.per_page
        assert list(page.rows) == every[start : start + f.per_page] and page.total == len(every)
