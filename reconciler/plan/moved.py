"""Which keys of a mapping moved between two versions of it. Pure.

A tick hands most values on unchanged from the tick before (statuses, specs, admission times):
what changed is found by comparing the two versions key by key. At 100,000 objects a Python loop
over the items costs 10 to 20 ms and a set difference of their items (hashing a tuple per entry)
80 ms or more; this pass runs in C (``map`` and ``itertools.compress``) and allocates only for
the keys that moved, and looks up by key only the entries where the two orders differ.
"""

from __future__ import annotations

import operator
from collections.abc import Hashable, Mapping
from itertools import compress, filterfalse, repeat
from typing import Any, TypeVar

K = TypeVar("K", bound=Hashable)

_ABSENT: Any = object()  # what ``old`` holds at a key it lacks (no value is this object)


def moved(new: Mapping[K, Any], old: Mapping[K, Any], *, same_object: bool = False) -> set[K]:
    """Return the keys whose value differs between ``new`` and ``old``, keys present in one only
    included. ``same_object``: only the very object counts as unchanged (a value equal but
    rebuilt has moved: ``==`` on specs takes as long as rebuilding what depends on them).

    The two are walked in their own orders: where both hold the very same key objects in the same
    order (the prefix and the suffix they share: all of it but the few entries a push added or
    removed, a tick's mappings being built in one order) values are compared pairwise, and only the
    entries between are looked up by key. On the daemon's heap at 100,000 objects a lookup per key
    (hashing it, reading its strings) cost 100 ms a pass."""
    if not same_object and new == old:  # in C, each value by identity first: the common case
        return set()
    differs = operator.is_not if same_object else operator.ne
    new_keys, old_keys = list(new), list(old)
    if new_keys == old_keys:  # the same keys in the same order (compared by identity first)
        return set(compress(new_keys, map(differs, old.values(), new.values())))
    shared = min(len(new_keys), len(old_keys))
    head = _first_true(list(map(operator.is_not, new_keys, old_keys)), shared)
    tail = _first_true(list(map(operator.is_not, reversed(new_keys), reversed(old_keys))), shared)
    tail = min(tail, shared - head)
    new_values, old_values = list(new.values()), list(old.values())
    new_end, old_end = len(new_keys) - tail, len(old_keys) - tail
    out = set(compress(new_keys[:head], map(differs, old_values[:head], new_values[:head])))
    if tail:
        out.update(compress(new_keys[new_end:], map(differs, old_values[old_end:], new_values[new_end:])))
    # Between: a key of one side is not among the other's shared prefix or suffix (those are the
    # very keys of this side's, and a mapping's keys are distinct), so it is looked up in the whole.
    middle = new_keys[head:new_end]
    if middle:
        got = map(old.get, middle, repeat(_ABSENT))
        out.update(compress(middle, map(differs, got, new_values[head:new_end])))
    out.update(filterfalse(new.__contains__, old_keys[head:old_end]))
    return out


def _first_true(flags: list[bool], default: int) -> int:
    """The index of the first True in ``flags`` (a C scan), or ``default``."""
    try:
        return flags.index(True)
    except ValueError:
        return default
