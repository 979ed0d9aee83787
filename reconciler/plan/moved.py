"""Which keys of a mapping moved between two versions of it. Pure.

A tick hands most values on unchanged from the tick before (statuses, specs, admission times):
what changed is found by comparing the two versions key by key. At 100,000 objects a Python loop
over the items costs 10 to 20 ms and a set difference of their items (hashing a tuple per entry)
80 ms or more; this pass runs in C (``map`` and ``itertools.compress``) and allocates only for
the keys that moved. When both hold the same keys in the same order it looks nothing up: on the
daemon's heap at 100,000 objects the lookups (hashing each key, reading its strings) were most of
its cost.
"""

from __future__ import annotations

import operator
from collections.abc import Hashable, Mapping
from itertools import compress, repeat
from typing import Any, TypeVar

K = TypeVar("K", bound=Hashable)

_ABSENT: Any = object()  # what ``old`` holds at a key it lacks (no value is this object)


def moved(new: Mapping[K, Any], old: Mapping[K, Any], *, same_object: bool = False) -> set[K]:
    """Return the keys whose value differs between ``new`` and ``old``, keys present in one only
    included. ``same_object``: only the very object counts as unchanged (a value equal but
    rebuilt has moved: ``==`` on specs takes as long as rebuilding what depends on them)."""
    if not same_object and new == old:  # in C, each value by identity first: the common case
        return set()
    differs = operator.is_not if same_object else operator.ne
    if len(new) == len(old):
        keys = list(new)
        # The same keys in the same order (a tick's mappings are built in one order): the values
        # are compared pairwise, with no lookup; the keys are compared by identity first.
        if keys == list(old):
            return set(compress(keys, map(differs, old.values(), new.values())))
    out = set(compress(new, map(differs, map(old.get, new, repeat(_ABSENT)), new.values())))
    added = sum(1 for k in out if k not in old)
    if len(new) - added != len(old):  # some key of ``old`` is not in ``new``
        out.update(old.keys() - new.keys())
    return out
