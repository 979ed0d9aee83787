"""Stable model aliases: who may hold which OpenAI name. Pure.

Every model answers to its dated name ``<user>-<YYYYMMDDHHMM>-<name>`` and to one alias: the
file's ``served_name:`` or else ``<user>-<name>``. The rules keep one user from taking a name
that another user's clients call:

- an alias lies in its owner's namespace: it starts with ``<user>-`` and not with
  ``<other>-`` of a longer user name (``alice-bob-x`` belongs to user ``alice-bob``, not to
  ``alice``), and it does not look like a dated name (``<user>-<12 digits>-...``);
- so two users never contend for one name; within one user, a name already held by an
  earlier model (file added first, then path order) is an error on the later model, which
  stays INVALID (what runs for it is kept) until the clash is resolved.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from reconciler.spec.types import ModelSpec, ObjectKey

_DATED = re.compile(r"^\d{12}-")


def namespace_problem(alias: str, user: str, users: Iterable[str]) -> str | None:
    """Why ``alias`` may not belong to ``user`` (None when it may).

    ``users`` are the cluster's declared users; a longer one that extends ``user`` owns its
    own prefix.
    """
    prefix = f"{user}-"
    if not alias.startswith(prefix):
        return f"must start with {prefix!r} (your user name)"
    if _DATED.match(alias[len(prefix) :]):
        return "must not look like a dated served name (<user>-<YYYYMMDDHHMM>-<name>)"
    for other in users:
        if other != user and other.startswith(prefix) and alias.startswith(f"{other}-"):
            return f"lies in user {other!r}'s namespace ({other}-...)"
    return None


def clashes(models: Iterable[ModelSpec]) -> dict[ObjectKey, tuple[str, ModelSpec]]:
    """Models whose alias or dated name an earlier model already holds.

    Returns ``{later model's key: (the name, the model holding it)}``. Earlier means the file was
    added first (``created_at``), then path order: adding a file never takes a name away
    from a model that already has it.
    """
    held: dict[str, ModelSpec] = {}
    out: dict[ObjectKey, tuple[str, ModelSpec]] = {}
    for model in sorted(models, key=lambda m: (m.created_at, m.key.path)):
        names = dict.fromkeys((model.served_name, model.alias))
        taken = next(((n, held[n]) for n in names if n in held), None)
        if taken is not None:
            out[model.key] = taken
            continue
        held.update(dict.fromkeys(names, model))
    return out
