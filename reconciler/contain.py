"""Find the items that make a whole-set step raise, so one bad object fails alone. Pure.

The tick's steps (load, plan, assess) work on every object at once, and a bug or an input
nobody foresaw in one object must not stop the others. When such a step raises, bisection
finds the items it raises for (a few extra runs of the step, only on that rare path);
the step then runs without them and they are reported on their own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def raises(step: Callable[[], object]) -> BaseException | None:
    """Run ``step``; return the exception it raised (None when it did not). Interrupts propagate."""
    try:
        step()
    except Exception as exc:
        return exc
    return None


def culprits(items: Sequence[T], fails: Callable[[Sequence[T]], bool]) -> list[T] | None:
    """The items ``fails`` fails for, found by bisection.

    ``fails(subset)`` runs the step on a subset. Returns [] when the whole set passes, and
    None when the failure cannot be pinned on single items (the halves pass, the whole fails:
    an interaction, or a failure that does not depend on the items at all).
    """
    if not fails(items):
        return []
    return _bisect(list(items), fails)


def _bisect(items: list[T], fails: Callable[[Sequence[T]], bool]) -> list[T] | None:
    # Precondition: fails(items) is True.
    if not items:
        return None  # it fails without any item: not theirs
    if len(items) == 1:
        return items
    mid = len(items) // 2
    left, right = items[:mid], items[mid:]
    found: list[T] = []
    for half in (left, right):
        if fails(half):
            sub = _bisect(half, fails)
            if sub is None:
                return None
            found.extend(sub)
    return found or None
