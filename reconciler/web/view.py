"""What the page shows, computed from a status snapshot: rows, order, filters, capacity. Pure.

Everything here tolerates documents with missing or oddly typed fields: the status format
moves with the daemon, and an old branch must still render.
"""

from __future__ import annotations

import bisect
import re
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

# What needs someone's attention comes first (in this order); then work in progress; then what is fine.
ATTENTION = ("FAILED", "INVALID", "UNSCHEDULABLE", "LOST", "QUEUED")
PROGRESS = ("DEPLOYING", "SUBMITTED", "PENDING", "DELETING")
ATTENTION_SYNC = ("Held", "Invalid")
FINAL_RUN_STATES = ("SUCCEEDED", "FAILED", "STOPPED", "LOST")
PER_PAGE = 200
_NEEDS = re.compile(r"needs (\d+(?:\.\d+)?) GPU")
_ERROR_LINE = re.compile(r"^- `(.*)`$")
_REVISION_LINE = re.compile(r"(?i)^(desired revision|last applied|last attempted)[^`]*`([^`]*)`")


def text(value: Any, default: str = "") -> str:
    """A document field as display text (None -> ``default``)."""
    if value is None:
        return default
    return value if isinstance(value, str) else str(value)


def number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an integer of 400 digits
        return 0.0


def mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def listing(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else []


def priority(state: str, sync: str) -> int:
    """Sort rank: 0 needs attention, 1 in progress, 2 fine."""
    if state in ATTENTION or sync in ATTENTION_SYNC:
        return 0
    if state in PROGRESS:
        return 1
    return 2


@dataclass(frozen=True)
class Row:
    """One object on the overview."""

    path: str
    user: str
    kind: str  # "model" | "task"
    name: str
    state: str
    sync: str
    where: str  # served model name, or the current run's submission id
    replicas: str  # "ready/desired" for models, "" for tasks
    gpus: float
    last_transition: str
    reason: str
    rank: int

    @property
    def url(self) -> str:
        return f"/users/{self.user}/{self.kind}s/{self.name}"

    @property
    def attention(self) -> bool:
        return self.rank == 0


def row(path: str, doc: Mapping[str, Any]) -> Row:
    """The overview row of the document at ``path`` (``users/<user>/<kind>s/<name>.yaml``)."""
    _, user, kinds, file = path.split("/")
    kind = kinds[:-1]
    state, sync = text(doc.get("state"), "UNKNOWN"), text(doc.get("sync"), "")
    if kind == "model":
        where = text(doc.get("served_name"))
        reps = mapping(doc.get("replicas"))
        replicas = f"{text(reps.get('ready'), '0')}/{text(reps.get('desired'), '?')}"
    else:
        where = text(doc.get("submission_id"))
        replicas = ""
    return Row(
        path=path,
        user=user,
        kind=kind,
        name=file.removesuffix(".yaml"),
        state=state,
        sync=sync,
        where=where,
        replicas=replicas,
        gpus=number(doc.get("gpus")),
        last_transition=text(doc.get("last_transition")),
        reason=text(doc.get("reason")),
        rank=priority(state, sync),
    )


def sorted_rows(docs: Mapping[str, Mapping[str, Any]]) -> list[Row]:
    """Every object, what needs attention first, then by user, kind and name."""
    return sorted((row(path, doc) for path, doc in docs.items()), key=sort_key)


SortKey = tuple[int, int, str, str, str]


def sort_key(r: Row) -> SortKey:
    severity = ATTENTION.index(r.state) if r.state in ATTENTION else len(ATTENTION)
    return (r.rank, severity, r.user, r.kind, r.name)


class Overview:
    """The overview's rows in page order, the users and the state counts, kept from one status
    commit to the next: a commit that changes ``k`` of ``n`` documents costs ``O(k log n)`` to
    find the changed rows' places (and a list move in C each) when the caller names the changed
    paths, else first one pass over all ``n`` comparing document identities (the reader hands out
    the same parsed object while a blob is unchanged). At 100,000 objects, sorting every row
    again took most of a second per commit. Not thread-safe: the caller holds a lock.
    """

    def __init__(self) -> None:
        self._docs: Mapping[str, Mapping[str, Any]] = {}  # the last update's, kept (never changed)
        self.tip: str | None = None  # the status commit of the rows (:meth:`follow`); None: unknown
        self._rows: dict[str, Row] = {}
        self.keys: list[SortKey] = []  # sorted; self.rows[i] is the row of self.keys[i]
        self.rows: list[Row] = []
        self.states: Counter[str] = Counter()
        self._users: Counter[str] = Counter()
        self.users: list[str] = []  # sorted
        self.queued: dict[str, Mapping[str, Any]] = {}  # the QUEUED documents (capacity counts them)

    def follow(
        self, tip: str | None, docs: Mapping[str, Mapping[str, Any]], since: str | None, changed: Collection[str] | None
    ) -> None:
        """Make the rows those of the status snapshot at ``tip`` (its documents ``docs``; see
        :meth:`update`), which differs from the one at ``since`` only at ``changed``: only they
        are looked at when the rows are the snapshot's at ``since`` (the last one followed),
        else (a snapshot skipped, read in full, a branch rewritten) every document is."""
        follows = since is not None and since == self.tip and changed is not None
        self.update(docs, changed if follows else None)
        self.tip = tip

    def update(self, docs: Mapping[str, Mapping[str, Any]], changed: Collection[str] | None = None) -> None:
        """Make the rows those of ``docs`` (path -> document), which is kept, not copied: the
        caller never changes it (a status snapshot's documents never change). ``changed``: the
        only paths where ``docs`` may differ from the last update's (removed ones included; any
        other path is never looked at); None: every document is compared."""
        self.tip = None
        if changed is not None:
            if len(changed) > len(docs) // 4 + 16:
                self._rebuild(docs)
                return
            for path in changed:
                if path in self._rows:
                    self._remove(path)
                doc = docs.get(path)
                if doc is not None:
                    self._insert(path, doc)
            self._docs = docs
            return
        prev = self._docs
        moved = [p for p, doc in docs.items() if prev.get(p) is not doc]
        added = sum(1 for p in moved if p not in prev)
        gone = [p for p in prev if p not in docs] if len(prev) + added > len(docs) else []
        if len(moved) + len(gone) > len(docs) // 4 + 16:
            self._rebuild(docs)
            return
        for path in gone:
            self._remove(path)
        for path in moved:
            if path in prev:
                self._remove(path)
            self._insert(path, docs[path])
        self._docs = docs

    def _rebuild(self, docs: Mapping[str, Mapping[str, Any]]) -> None:
        old = self._rows
        # Rows of documents that are the same objects are reused (their text is what costs). New
        # ones are made in path order, about page order: a filtered request walks every row, and
        # rows laid out in memory in the order it walks them take half the time at 100,000.
        prev = self._docs
        self._rows = {p: old[p] if prev.get(p) is (doc := docs[p]) else row(p, doc) for p in sorted(docs)}
        pairs = sorted(((sort_key(r), r) for r in self._rows.values()), key=lambda pair: pair[0])
        self.keys = [k for k, _r in pairs]
        self.rows = [r for _k, r in pairs]
        self.states = Counter(r.state for r in self.rows)
        self._users = Counter(r.user for r in self.rows)
        self.users = sorted(self._users)
        self.queued = {p: doc for p, doc in docs.items() if doc.get("state") == "QUEUED"}
        self._docs = docs

    def _insert(self, path: str, doc: Mapping[str, Any]) -> None:
        r = self._rows[path] = row(path, doc)
        key = sort_key(r)
        at = bisect.bisect_left(self.keys, key)
        self.keys.insert(at, key)
        self.rows.insert(at, r)
        self.states[r.state] += 1
        self._users[r.user] += 1
        if self._users[r.user] == 1:
            bisect.insort(self.users, r.user)
        if doc.get("state") == "QUEUED":
            self.queued[path] = doc

    def _remove(self, path: str) -> None:
        r = self._rows.pop(path)
        at = bisect.bisect_left(self.keys, sort_key(r))
        del self.keys[at], self.rows[at]
        self.states[r.state] -= 1
        if not self.states[r.state]:
            del self.states[r.state]
        self._users[r.user] -= 1
        if not self._users[r.user]:
            del self._users[r.user]
            del self.users[bisect.bisect_left(self.users, r.user)]
        self.queued.pop(path, None)


@dataclass(frozen=True)
class Filters:
    user: str = ""
    state: str = ""
    kind: str = ""
    page: int = 1
    per_page: int = PER_PAGE

    @property
    def any(self) -> bool:
        """Whether any filter is set (else every row is kept)."""
        return bool(self.user or self.kind or self.state)

    @cached_property
    def wanted(self) -> frozenset[str]:
        """The states (and sync values) of ``state=``; parsed once per request, not per row."""
        return frozenset(s.strip() for s in self.state.split(",") if s.strip())

    def keep(self, r: Row) -> bool:
        if self.user and r.user != self.user:
            return False
        if self.kind and r.kind != self.kind:
            return False
        if self.state:
            wanted = self.wanted
            if r.state not in wanted and r.sync not in wanted and not ("attention" in wanted and r.attention):
                return False
        return True

    def query(self, **changes: Any) -> str:
        """The query string of these filters with ``changes`` (for links: next page, a user)."""
        values = {"user": self.user, "state": self.state, "kind": self.kind, "page": self.page, **changes}
        parts = [f"{k}={_quote(str(v))}" for k, v in values.items() if v and not (k == "page" and v == 1)]
        return "?" + "&".join(parts) if parts else "?"


def _quote(value: str) -> str:
    from urllib.parse import quote

    return quote(value, safe=",")


@dataclass(frozen=True)
class Page:
    rows: Sequence[Row]
    total: int
    page: int
    pages: int


def paginate(rows: Iterable[Row], filters: Filters) -> Page:
    """The filtered rows of one page (pages count from 1; a page past the end is empty)."""
    # The plain overview: one page of the rows as they are, nothing visited.
    kept = [r for r in rows if filters.keep(r)] if filters.any else list(rows)
    per = max(1, filters.per_page)
    pages = max(1, -(-len(kept) // per))
    start = (max(1, filters.page) - 1) * per
    return Page(rows=kept[start : start + per], total=len(kept), page=max(1, filters.page), pages=pages)


@dataclass(frozen=True)
class Capacity:
    """Cluster resources in GPUs and CPUs (from ``actual.json`` and the documents)."""

    total: Mapping[str, float] = field(default_factory=dict)
    available: Mapping[str, float] = field(default_factory=dict)
    models: Mapping[str, float] = field(default_factory=dict)
    jobs: Mapping[str, float] = field(default_factory=dict)
    queued: Mapping[str, float] = field(default_factory=dict)
    queued_objects: int = 0
    known: bool = False  # actual.json held a capacity


def _add(into: dict[str, float], resources: Any, times: float = 1.0) -> None:
    for key, value in mapping(resources).items():
        if key in ("GPU", "CPU"):
            into[key] = into.get(key, 0.0) + number(value) * times


def capacity(actual: Mapping[str, Any], docs: Mapping[str, Mapping[str, Any]]) -> Capacity:
    """Totals, what models and running jobs hold, and what queued work asks for.

    Models count their target replicas (what they hold once deployed), jobs count while
    PENDING or RUNNING. Queued work counts the document's ``requested`` resources when the
    daemon writes them, else the GPUs its reason names ("needs 2 GPU").
    """
    return queued_capacity(held_capacity(actual), docs)


def held_capacity(actual: Mapping[str, Any]) -> Capacity:
    """:func:`capacity` without the queued work: what ``actual.json`` alone gives."""
    cap = mapping(actual.get("capacity"))
    total: dict[str, float] = {}
    available: dict[str, float] = {}
    _add(total, cap.get("total"))
    _add(available, cap.get("available"))
    models: dict[str, float] = {}
    for m in listing(actual.get("models")):
        m = mapping(m)
        _add(models, m.get("resources_per_replica"), number(m.get("replicas", 1)))
    jobs: dict[str, float] = {}
    for j in listing(actual.get("jobs")):
        j = mapping(j)
        if j.get("status") in ("PENDING", "RUNNING"):
            _add(jobs, j.get("resources"))
    return Capacity(total, available, models, jobs, known=bool(total))


def queued_capacity(held: Capacity, docs: Mapping[str, Mapping[str, Any]]) -> Capacity:
    """``held`` with what the QUEUED documents of ``docs`` ask for (the others are skipped)."""
    queued: dict[str, float] = {}
    n = 0
    for doc in docs.values():
        if doc.get("state") != "QUEUED":
            continue
        n += 1
        requested = mapping(doc.get("requested"))
        if requested:
            _add(queued, requested)
        else:
            found = _NEEDS.search(text(doc.get("reason")))
            if found:
                queued["GPU"] = queued.get("GPU", 0.0) + float(found.group(1))
    return Capacity(held.total, held.available, held.models, held.jobs, queued, n, known=held.known)


@dataclass(frozen=True)
class Revisions:
    attempted: str = ""
    applied: str = ""
    errors: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    subject: str = ""  # the attempted commit's subject line
    problems: tuple[str, ...] = ()  # the daemon's own trouble: source unreadable, a failed tick


def revisions(root: Mapping[str, Any], docs: Mapping[str, Mapping[str, Any]]) -> Revisions:
    """The desired revision last attempted and applied, and the validation errors.

    Read from a root file with ``last_attempted``/``last_applied`` (the branch-level record),
    else from the README's lines, else from the documents' own ``revision`` fields (the
    revision most objects were last applied at).
    """
    attempted = applied = subject = ""
    errors: list[str] = []
    notes: list[str] = []
    problems: list[str] = []
    for name, value in sorted(root.items()):
        if name == "actual.json" or not isinstance(value, Mapping):
            continue
        rev = mapping(value.get("revision")) or value
        attempted = attempted or text(rev.get("last_attempted") or rev.get("attempted"))
        applied = applied or text(rev.get("last_applied") or rev.get("applied"))
        subject = subject or text(value.get("subject"))
        errors += [text(e) for e in listing(value.get("errors"))]
        notes += [text(e) for e in listing(value.get("notes"))]
        if value.get("source_error"):
            problems.append(f"the config repository could not be read: {text(value['source_error'])}")
        if value.get("daemon_error"):
            problems.append(f"the daemon's last tick failed (it retries): {text(value['daemon_error'])}")
    readme = root.get("README.md")
    if isinstance(readme, str):
        section = ""
        for line in readme.splitlines():
            if line.startswith("#"):
                section = line.lower()
                continue
            found = _REVISION_LINE.match(line.strip())
            if found:
                label, value = found.group(1).lower(), found.group(2)
                if label == "last applied":
                    applied = applied or value
                else:
                    attempted = attempted or value
            error = _ERROR_LINE.match(line.strip())
            if error and "error" in section and error.group(1) not in errors:
                errors.append(error.group(1))
    if not attempted or not applied:
        seen_attempted: Counter[str] = Counter()
        seen_applied: Counter[str] = Counter()
        for doc in docs.values():
            rev = mapping(doc.get("revision"))
            if rev.get("last_attempted"):
                seen_attempted[text(rev["last_attempted"])] += 1
            if rev.get("last_applied"):
                seen_applied[text(rev["last_applied"])] += 1
        if not attempted and seen_attempted:
            attempted = seen_attempted.most_common(1)[0][0]
        if not applied and seen_applied:
            applied = seen_applied.most_common(1)[0][0]
    if attempted == "unknown":
        attempted = ""
    return Revisions(attempted, applied, tuple(errors), tuple(notes), subject, tuple(problems))


def object_runs(doc: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """A task's runs, newest first."""
    runs = [mapping(r) for r in listing(doc.get("runs")) if isinstance(r, Mapping)]
    return list(reversed(runs))


def current_run(doc: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The run the document names as current (else the newest)."""
    runs = object_runs(doc)
    sid = doc.get("submission_id")
    return next((r for r in runs if r.get("submission_id") == sid), runs[0] if runs else None)


def openai_example(served_name: str, endpoint: str) -> tuple[str, str]:
    """A copy-paste Python client example and a curl example for ``served_name`` at ``endpoint``."""
    base = endpoint.rstrip("/") or "http://127.0.0.1:8000/v1"
    python = (
        "from openai import OpenAI\n\n"
        f'client = OpenAI(base_url="{base}", api_key="unused")\n'
        "reply = client.chat.completions.create(\n"
        f'    model="{served_name}",\n'
        '    messages=[{"role": "user", "content": "Hello!"}],\n'
        ")\n"
        "print(reply.choices[0].message.content)\n"
    )
    body = '{"model": "' + served_name + '", "messages": [{"role": "user", "content": "Hello!"}]}'
    curl = f"curl {base}/chat/completions \\\n  -H \"Content-Type: application/json\" \\\n  -d '{body}'\n"
    return python, curl


@dataclass(frozen=True)
class TeamRow:
    """One team's quota use as the last tick left it (``teams`` in the status branch's revision.yaml)."""

    name: str
    used: float
    nominal: float
    borrowed: float
    lent: float
    used_slots: float
    nominal_slots: float
    share: float
    weight: float


def teams(root: Mapping[str, Any]) -> list[TeamRow]:
    """The per-team view; empty when cluster.yaml declares no teams (or the record is malformed)."""
    out: list[TeamRow] = []
    for name, value in sorted(root.items()):
        if name == "actual.json" or not isinstance(value, Mapping):
            continue
        for team, usage in sorted(mapping(value.get("teams")).items()):
            u = mapping(usage)

            def amount(field: str, resource: str = "gpus", u: Mapping[str, Any] = u) -> float:
                return number(mapping(u.get(field)).get(resource))

            out.append(
                TeamRow(
                    name=text(team) or "(users in no team)",
                    used=amount("used"),
                    nominal=amount("nominal"),
                    borrowed=amount("borrowed"),
                    lent=amount("lent"),
                    used_slots=amount("used", "tasks"),
                    nominal_slots=amount("nominal", "tasks"),
                    share=number(u.get("share")),
                    weight=number(u.get("weight")) or 1.0,
                )
            )
    return out[:MAX_TEAMS]


MAX_TEAMS = 256  # as many as cluster.yaml may declare
