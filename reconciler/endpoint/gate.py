"""Who may call what through argus's OpenAI endpoint: keys, access rules and the model names. Pure.

The daemon builds one *gate config* per tick (reconciler/builders/serve.py ``gate_config``):

- ``models``: the router's table rows (reconciler/serve_apps/table.py), so a name (dated model id
  or alias) is known to belong to an application and so to a user;
- ``keys``: sha256 hex of each API key -> its user (from the admin's keys files and the users'
  self-made keys; never a key). Absent: no keys file, the endpoint is open (every client may call
  every model, as an endpoint without keys always was);
- ``access``: per application, who besides its owner may call it (null: everyone with a key;
  absent: its owner only); ``teams``: each user's team; ``limits``: the per-minute rate limits
  (reconciler/endpoint/limits.py).

The gate lives only in argus's own processes (the daemon's, or ``argus endpoint``'s): nothing a
Ray job can deploy, call or read holds a key hash, an access rule or a count.
:meth:`Gate.caller` resolves a request's key once (one sha256 and a dict lookup);
:meth:`Gate.visible` says whether a caller may call what a name names. A name the caller may not
call is answered exactly as one that does not exist (the endpoint's 404), so private models'
names never reach other users.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from reconciler.endpoint.limits import Limits, parse_limits
from reconciler.serve_apps.table import Entry, owner_of, parse_table

MAX_KEYS = 100_000  # keys past this are ignored (and reported)
MAX_ACCESS_NAMES = 1_000  # names past this in one model's access list are ignored (and reported)
MAX_USER_CHARS = 512  # a key's user name longer than this is not one
EVERYONE = "*"  # in an access list: everyone with a key
BEARER = "bearer "  # the Authorization scheme, compared case-insensitively (RFC 7235)


class Unauthorized(Exception):
    """No key, or one the gate does not hold (the endpoint's 401); the text is the answer's message."""


@dataclass(frozen=True)
class Caller:
    """Whose key a request carries: the key file's user and her team (None: in no team)."""

    user: str
    team: str | None


def may_call(caller: Caller, owner: str, access: frozenset[str] | None) -> bool:
    """True when ``caller`` may call a model of ``owner`` whose access list is ``access``. Pure.

    The owner always may; ``access`` None (or holding EVERYONE) lets every caller; else the
    caller's user name or team must be in it.
    """
    if access is None or caller.user == owner or caller.user in access:
        return True
    return (caller.team is not None and caller.team in access) or EVERYONE in access


def key_digest(authorization: str | None) -> str | None:
    """The sha256 hex of the Bearer key of an ``Authorization`` header value (None: no Bearer key)."""
    header = authorization or ""
    if header[: len(BEARER)].lower() != BEARER:
        return None
    key = header[len(BEARER) :].strip()
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest() if key else None


def _is_sha256(digest: object) -> bool:
    return isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)


@dataclass(frozen=True)
class Gate:
    """One gate config, parsed. ``keys`` None: the endpoint is open."""

    entries: dict[str, Entry] = field(default_factory=dict)
    keys: dict[str, str] | None = None
    access: dict[str, frozenset[str] | None] = field(default_factory=dict)
    teams: dict[str, str] = field(default_factory=dict)
    limits: Limits | None = None
    names: dict[str, tuple[str, ...]] = field(default_factory=dict)  # model id or alias -> apps claiming it

    @property
    def open(self) -> bool:
        return self.keys is None

    def caller(self, authorization: str | None) -> Caller | None:
        """The caller an ``Authorization`` header names; None when the endpoint is open.

        Raises Unauthorized for no key or one the gate does not hold. Cost: one sha256 and two
        dict lookups (the key is random, so looking its hash up leaks nothing a constant-time
        comparison would hide)."""
        if self.keys is None:
            return None
        digest = key_digest(authorization)
        if digest is None:
            raise Unauthorized("No API key provided: send `Authorization: Bearer <key>`.")
        user = self.keys.get(digest)
        if user is None:
            raise Unauthorized("Incorrect API key provided.")
        return Caller(user, self.teams.get(user))

    def may_call_app(self, caller: Caller | None, app: str) -> bool:
        """True when ``caller`` (None: the open endpoint) may call application ``app``."""
        if caller is None:
            return True
        owner = owner_of(app)
        return owner is not None and may_call(caller, owner, self.access.get(app, frozenset()))

    def visible(self, caller: Caller | None, model: str) -> bool:
        """True when ``caller`` may call what ``model`` names. A name no tabled application claims
        is not visible (with keys); a name two applications claim (an INVALID file keeps its old
        one) is visible only when the caller may call both: the router picks one, the gate cannot
        know which."""
        if caller is None:
            return True
        apps = self.names.get(model, ())
        return bool(apps) and all(self.may_call_app(caller, a) for a in apps)

    def app_of(self, model: str | None) -> str:
        """The application a request for ``model`` is booked to ("" when none or several claim it
        differently: the first in name order)."""
        apps = self.names.get(model, ()) if model is not None else ()
        return apps[0] if apps else ""


def parse_gate(config: Any) -> tuple[Gate, list[str]]:
    """Return ``(gate, problems)`` of a gate config. Pure; never raises.

    Fails closed: a malformed ``keys`` (present but not a mapping) admits no key at all, a
    malformed access list lets the owner only, a malformed key or team row is skipped; each is
    described in ``problems`` (bounded by the sizes above)."""
    if not isinstance(config, Mapping):
        return Gate(), ["the gate config is not a mapping: the endpoint is open with no models"]
    config = dict(config)
    entries, _, problems = parse_table(config)
    keys: dict[str, str] | None = None
    raw_keys = config.get("keys")
    if raw_keys is not None:
        keys = {}
        if not isinstance(raw_keys, Mapping):
            problems.append("keys is not a mapping: every request is refused")
        else:
            for digest, user in list(raw_keys.items())[:MAX_KEYS]:
                if _is_sha256(digest) and isinstance(user, str) and 0 < len(user) <= MAX_USER_CHARS:
                    keys[digest] = user
                else:
                    problems.append(f"keys: an entry of {str(user)[:40]!r} is not a sha256 hex and a user: skipped")
            if len(raw_keys) > MAX_KEYS:
                problems.append(f"{len(raw_keys)} keys: only the first {MAX_KEYS} are accepted")
    access: dict[str, frozenset[str] | None] = {}
    raw_access = config.get("access", {})
    if not isinstance(raw_access, Mapping):
        problems.append("access is not a mapping: every model is its owner's only")
        raw_access = {}
    for app, who in raw_access.items():
        if who is None:
            access[str(app)] = None
        elif isinstance(who, list) and all(isinstance(n, str) for n in who):
            if len(who) > MAX_ACCESS_NAMES:
                problems.append(f"access of {app}: only the first {MAX_ACCESS_NAMES} names are read")
            access[str(app)] = frozenset(who[:MAX_ACCESS_NAMES])
        else:
            problems.append(f"access of {app} is not a list of names: its owner's only")
    teams: dict[str, str] = {}
    raw_teams = config.get("teams", {})
    if isinstance(raw_teams, Mapping):
        teams = {u: t for u, t in raw_teams.items() if isinstance(u, str) and isinstance(t, str)}
        if len(teams) != len(raw_teams):
            problems.append("teams: entries that are not user -> team names skipped")
    else:
        problems.append("teams is not a mapping: nobody is in a team")
    limits, limit_problems = parse_limits(config)
    names: dict[str, list[str]] = {}
    for entry in sorted(entries.values(), key=lambda e: e.app):
        for name in (entry.model_id, entry.alias):
            if name:
                names.setdefault(name, []).append(entry.app)
    gate = Gate(entries, keys, access, teams, limits, {n: tuple(a) for n, a in names.items()})
    return gate, problems + limit_problems
