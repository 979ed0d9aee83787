"""Field-level diffs between the spec an object runs with and the one in git. Pure.

``update_model`` and ``stop_task`` reasons name each changed field with its old and new
value (``engine_kwargs.max_model_len: 4096 → 8192``), so a reviewer sees why a model
restarts or a run stops without comparing files by hand.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

MAX_VALUE = 60  # characters of one rendered value; longer ones are cut with "…"
UNSET = "(unset)"


def field_diff(old: Mapping[str, object], new: Mapping[str, object]) -> tuple[str, ...]:
    """Return ``"field: old → new"`` for every leaf that differs, in key order.

    Nested mappings are compared key by key (dotted paths); lists and scalars as a whole.
    A key on one side only shows ``(unset)`` on the other. Both sides are compared as JSON
    data (the recorded side went through JSON: a tuple and a list are the same value).
    """
    out: list[str] = []
    _walk("", _plain(old), _plain(new), out)
    return tuple(out)


def _walk(prefix: str, old: Mapping[str, object], new: Mapping[str, object], out: list[str]) -> None:
    for key in sorted(set(old) | set(new), key=str):
        path = f"{prefix}{key}"
        a, b = old.get(key, _MISSING), new.get(key, _MISSING)
        if a == b:
            continue
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            _walk(path + ".", a, b, out)
        elif isinstance(a, Mapping) and b is _MISSING:
            _walk(path + ".", a, {}, out)
        elif a is _MISSING and isinstance(b, Mapping):
            _walk(path + ".", {}, b, out)
        else:
            out.append(f"{path}: {render(a)} → {render(b)}")


def _plain(value: Mapping[str, object]) -> Mapping[str, object]:
    plain: Mapping[str, object] = json.loads(json.dumps(value, sort_keys=True, default=str))
    return plain


class _Missing:
    def __repr__(self) -> str:
        return UNSET


_MISSING: object = _Missing()


def render(value: object) -> str:
    """One value as a reviewer reads it: strings bare, everything else as compact JSON."""
    if value is _MISSING:
        return UNSET
    text = value if isinstance(value, str) and value else json.dumps(value, sort_keys=True, default=str)
    text = text.replace("\n", "\\n")
    return text if len(text) <= MAX_VALUE else text[: MAX_VALUE - 1] + "…"


def summarise(changes: tuple[str, ...], limit: int = 6) -> str:
    """The changes joined for a one-line reason; more than ``limit`` are counted, not listed."""
    shown = list(changes[:limit])
    if len(changes) > limit:
        shown.append(f"and {len(changes) - limit} more")
    return "; ".join(shown)
