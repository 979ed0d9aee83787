"""``moved`` names exactly the keys whose value differs, whatever the order of either mapping."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from reconciler.plan.moved import moved

VALUES = [(1,), (1,), (2,), "a", 0, 0.0]  # equal but distinct objects, and values equal across types
entries = st.dictionaries(st.integers(0, 12), st.integers(0, len(VALUES) - 1), max_size=10)


@given(old=entries, new=entries, same_order=st.booleans(), reverse=st.booleans())
def test_moved_names_the_keys_that_differ(
    old: dict[int, int], new: dict[int, int], same_order: bool, reverse: bool
) -> None:
    if same_order:  # the common case in a tick: the same keys, in one order
        new = {k: new.get(k, v) for k, v in old.items()}
    if reverse:
        new = dict(reversed(list(new.items())))
    a = {k: VALUES[i] for k, i in old.items()}
    b = {k: VALUES[i] for k, i in new.items()}
    keys = a.keys() | b.keys()
    absent = object()
    assert moved(b, a, same_object=True) == {k for k in keys if a.get(k, absent) is not b.get(k, absent)}
    assert moved(b, a) == {k for k in keys if k not in a or k not in b or a[k] != b[k]}
