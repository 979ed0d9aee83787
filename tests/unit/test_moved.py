"""``moved`` names exactly the keys whose value differs, whatever the order of either mapping."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from reconciler.plan.moved import moved

VALUES = [(1,), (1,), (2,), "a", 0, 0.0]  # equal but distinct objects, and values equal across types
entries = st.lists(st.tuples(st.integers(0, 12), st.integers(0, len(VALUES) - 1)), max_size=14)


@given(
    old=entries,
    edits=st.lists(st.tuples(st.sampled_from(["set", "drop", "add"]), st.integers(0, 13), st.integers(0, 5))),
    shuffle=st.randoms(use_true_random=False),
    reorder=st.booleans(),
    same_keys=st.booleans(),
)
def test_moved_names_the_keys_that_differ(
    old: list[tuple[int, int]],
    edits: list[tuple[str, int, int]],
    shuffle: object,
    reorder: bool,
    same_keys: bool,
) -> None:
    keys = {k: (f"k{k}",) for k, _ in old}  # tuples: equal keys need not be the same object
    before = {keys[k]: VALUES[v] for k, v in old}
    after = dict(before)  # the tick's way: the last mapping's key objects, in its order
    for op, k, v in edits:
        key = keys.get(k) if same_keys and k in keys else (f"k{k}",)
        if op == "set" and key in after:
            after[key] = VALUES[v]
        elif op == "drop":
            after.pop(key, None)
        else:  # an insertion in the middle of the order
            items = list(after.items())
            at = min(v, len(items))
            after = dict([*items[:at], (key, VALUES[v]), *items[at:]])
    if reorder:
        items = list(after.items())
        shuffle.shuffle(items)  # type: ignore[attr-defined]
        after = dict(items)
    every = before.keys() | after.keys()
    absent = object()
    assert moved(after, before, same_object=True) == {
        k for k in every if before.get(k, absent) is not after.get(k, absent)
    }
    assert moved(after, before) == {k for k in every if k not in before or k not in after or before[k] != after[k]}
