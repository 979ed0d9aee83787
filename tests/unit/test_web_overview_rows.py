"""The overview's rows kept across status commits equal the rows computed afresh, after any
sequence of commits (documents added, changed, replaced by an equal copy, deleted), whether the
page is fed the changed paths or compares every document."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping
from typing import Any

from hypothesis import event, given, settings
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
# Each commit: new documents for some paths, deletions, equal copies (a new object, same content),
# paths named as changed that did not change (the writer rewrote them), and how the page meets it.
HOW = ["follow", "follow", "follow", "skip", "full", "back"]
commits = st.lists(
    st.tuples(
        st.dictionaries(paths, docs, max_size=12),
        st.lists(paths, max_size=4),
        st.lists(paths, max_size=4),
        st.lists(paths, max_size=2),
        st.sampled_from(HOW),
    ),
    min_size=1,
    max_size=10,
)


class Spy(view.Overview):
    """An overview that records how each update found the changed rows."""

    def __init__(self) -> None:
        super().__init__()
        self.fed: list[bool] = []

    def update(self, docs: Mapping[str, Mapping[str, Any]], changed: Collection[str] | None = None) -> None:
        self.fed.append(changed is not None)
        super().update(docs, changed)


def _check(kept: view.Overview, current: Mapping[str, Any]) -> None:
    fresh = view.sorted_rows(current)
    assert kept.rows == fresh
    assert kept.keys == [view.sort_key(r) for r in fresh]
    assert kept.states == Counter(r.state for r in fresh)
    assert kept.users == sorted({r.user for r in fresh})
    assert view.queued_capacity(view.Capacity(), kept.queued) == view.capacity({}, current)


@settings(max_examples=300, deadline=None)
@given(commits)
def test_kept_rows_equal_fresh_rows_after_any_commits(history: list[Any]) -> None:
    """As the page follows the status store: a snapshot names its predecessor and the paths that
    differ from it; when the page last saw that predecessor only those paths are looked at, else
    (a commit it never saw, a full read, the store moved back) every document is compared."""
    kept = Spy()
    tips: list[tuple[str, Mapping[str, Any]]] = [("", {})]  # the store's snapshots, oldest first
    for i, (changed, deleted, copied, named, how) in enumerate(history):
        before_tip, before = tips[-1]
        current = dict(tips[-3][1]) if how == "back" and len(tips) > 2 else dict(before)
        current.update(changed)
        for path in deleted:
            current.pop(path, None)
        for path in copied:
            if path in current:
                current[path] = dict(current[path])
        moved = {p for p in current.keys() | before.keys() if current.get(p) is not before.get(p)}
        since, paths = (None, None) if how == "full" or not before_tip else (before_tip, frozenset(moved | set(named)))
        tip = f"c{i}"
        tips.append((tip, current))
        if how == "skip":
            continue
        fed = since is not None and since == kept.tip
        kept.follow(tip, current, since, paths)
        assert kept.fed[-1] == fed and kept.tip == tip
        event("fed the changed paths" if fed else "compared every document")
        _check(kept, current)


def test_a_followed_commit_looks_at_its_changed_paths_only() -> None:
    """O(changed): the documents of a commit the page follows are never iterated."""

    class Untouchable(dict[str, Any]):
        def __iter__(self) -> Any:
            raise AssertionError("iterated every document")

        def items(self) -> Any:
            raise AssertionError("iterated every document")

    docs = {f"users/u{i:03d}/models/m.yaml": {"state": "RUNNING"} for i in range(500)}
    kept = view.Overview()
    kept.follow("c1", docs, None, None)
    after = Untouchable({**docs, "users/u250/models/m.yaml": {"state": "FAILED"}})
    del after["users/u007/models/m.yaml"]
    kept.follow("c2", after, "c1", {"users/u250/models/m.yaml", "users/u007/models/m.yaml"})
    assert kept.rows[0].user == "u250" and len(kept.rows) == 499 and kept.tip == "c2"
    assert "u007" not in kept.users
    _check(kept, dict(after.copy()))


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
