"""The router's model table: what the daemon pushes in ``user_config`` and how a row is read. Pure.

One row ``[app name, deployment, model id, alias]`` per argus model application (alias ``""``: the
default one, ``<user>-<name>``). The Ray-side router (reconciler/serve_apps/router.py) routes by it;
argus's endpoint (reconciler/endpoint) reads the same rows to know whose model a name is. No Ray
import: the endpoint runs in argus's own processes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

OWNED_PREFIX = "argus--"
SAFETY_REFRESH_S = 30.0  # the router re-reads Serve's status this often even when no table arrives
REFRESH_BOUNDS_S = (1.0, 86400.0)  # the range a user_config ``refresh_s`` is clamped to
MAX_TABLE_ENTRIES = 100_000  # entries past this are ignored (and logged)
MAX_FIELD_CHARS = 512  # an entry with a longer field is ignored


@dataclass(frozen=True)
class Entry:
    """One argus model application the daemon deployed (a table row)."""

    app: str
    deployment: str
    model_id: str
    alias: str | None  # None: no alias is routed (the file's lies outside its user's namespace)


def parse_table(config: Any) -> tuple[dict[str, Entry], float, list[str]]:
    """Return ``(entries by app name, refresh period, problems)`` of a table document
    (``{"models": [...], "refresh_s": ...}``).

    Pure. Malformed rows are skipped and described in ``problems``; so is everything past
    MAX_TABLE_ENTRIES. A config that is not a mapping yields an empty table. Never raises.
    """
    problems: list[str] = []
    if not isinstance(config, dict):
        return {}, SAFETY_REFRESH_S, ["user_config is not a mapping: no models routed"] if config is not None else []
    refresh = config.get("refresh_s", SAFETY_REFRESH_S)
    if isinstance(refresh, bool) or not isinstance(refresh, (int, float)) or refresh != refresh:
        problems.append(f"refresh_s {refresh!r} is not a number: {SAFETY_REFRESH_S} s")
        refresh = SAFETY_REFRESH_S
    refresh = min(max(float(refresh), REFRESH_BOUNDS_S[0]), REFRESH_BOUNDS_S[1])
    rows = config.get("models", [])
    if not isinstance(rows, list):
        return {}, refresh, [*problems, "models is not a list: no models routed"]
    if len(rows) > MAX_TABLE_ENTRIES:
        problems.append(f"{len(rows)} models: only the first {MAX_TABLE_ENTRIES} are routed")
        rows = rows[:MAX_TABLE_ENTRIES]
    entries: dict[str, Entry] = {}
    for i, row in enumerate(rows):
        if (
            not isinstance(row, list)
            or len(row) != 4
            or not all(isinstance(f, str) and len(f) <= MAX_FIELD_CHARS for f in row)
            or not all(row[:3])
        ):
            problems.append(f"models[{i}] is not four short strings: skipped")
            continue
        app, deployment, model_id, alias = row
        if not app.startswith(OWNED_PREFIX) or app in entries:
            problems.append(f"models[{i}]: {app!r} is not an argus application or listed twice: skipped")
            continue
        entries[app] = Entry(app, deployment, model_id, alias_of(app, alias))
    return entries, refresh, problems


def owner_of(app_name: str) -> str | None:
    """The user of an argus application name (``argus--<user>--<name>``), else None."""
    parts = app_name[len(OWNED_PREFIX) :].split("--") if app_name.startswith(OWNED_PREFIX) else []
    return parts[0] if len(parts) == 2 and all(parts) else None


def alias_of(app_name: str, alias: str | None) -> str | None:
    """The alias a table entry may route: ``alias`` (the file's ``served_name:``) when it lies in
    the application's own user's namespace, else None; ``<user>-<name>`` when ``alias`` is empty."""
    parts = app_name[len(OWNED_PREFIX) :].split("--")
    if len(parts) != 2 or not all(parts):
        return None
    if alias:
        # Only in the app's own user's namespace: an application PUT by code on the cluster under
        # alice's app name can never take bob's alias (the loader's rule, enforced here again).
        return alias if alias.startswith(f"{parts[0]}-") else None
    return f"{parts[0]}-{parts[1]}"
