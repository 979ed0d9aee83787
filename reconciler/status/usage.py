"""Usage accounting: the ledger behind the status branch's ``usage/<YYYY-MM-DD>.json``. Pure.

Two kinds of rows, per UTC hour (docs/design/usage.md has the format and its limits):

- token rows, from the endpoint's meter (reconciler/endpoint/meter.py): cumulative counts per (meter epoch,
  hour, user, model). The meter restarts with a new random epoch; within one epoch a count only
  grows, so merging is "the latest value per (epoch, hour, user, model) wins", and a total is the
  sum over epochs. Merging the same answer twice, or after a daemon restart that read the
  documents back, changes nothing.
- GPU-second rows, per (hour, user, team, kind, object, run). A task's rows are recomputed from
  its Ray job record (start and end times, the GPUs it asked for), keyed by its submission id,
  so recomputing replaces rather than adds. A model's rows are sampled (running replicas x GPUs
  per replica x time since the last sample, capped) and added; the sum lives in the documents,
  which a restarted daemon reads back.

A document is rebuilt only for the dates that changed: O(changed). Changes differ in urgency
(:class:`Ledger`): a user's tokens and a task's run are written within the minute; a model's
GPU samples, which grow on every sample while it runs, at most every few minutes; the daemon's
own probes (they change on every tick) only along with another change, so an idle cluster
makes no commit. Everything read
from a document or from the router is checked and bounded: a malformed row is dropped, no count is
negative, no hour is accepted outside ``[now - 48 h, now + 1 h]`` (:data:`ANSWER_PAST_HOURS`,
:data:`FUTURE_S`), "now" is the daemon's clock (never a time an answer or a job record names), and
one commit carries at most :data:`MAX_DOCUMENTS_PER_COMMIT` documents.
"""

from __future__ import annotations

import datetime
import functools
import math
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from reconciler.spec.loader import NAME_RE, USER_RE

USAGE_DIR = "usage/"
VERSION = 1
# Rows one document holds at most, per kind: a day of 24 hours x users x models x meter epochs
# stays far below it; past it the smallest rows of the oldest hours are dropped (counted in
# ``dropped``), so a hostile flood of (user, model) pairs cannot grow a document without bound.
MAX_ROWS = 20_000
# Days the ledger keeps row by row, counted back from the daemon's clock's date (today and the two
# before it: what a router answer or a job can still change, the meter reports 48 hours); older
# days are kept as totals only. A date after the clock's (a forged row's) never counts here.
LIVE_DAYS = 3
# The hours a router answer may speak of, counted from the daemon's clock: the meter keeps 48
# hours, and a meter clock ahead of ours by up to FUTURE_S is tolerated (an hour not begun yet by
# more than that is not usage).
ANSWER_PAST_HOURS = 48
FUTURE_S = 3600.0
# Usage documents one status commit carries at most: the live window holds about LIVE_DAYS + 1
# dates, so this is never reached but by a bug or a flood; the rest wait for the next commit.
MAX_DOCUMENTS_PER_COMMIT = 8
MAX_ANSWER_ROWS = 100_000  # the most rows the router's meter answers with (48 hours of them)
OPEN_USER = "(open)"  # requests without a key (an endpoint without a keys file)
DAEMON_USER = "(daemon)"  # the daemon's own probes
SPECIAL_USERS = (OPEN_USER, DAEMON_USER)
_NAME = USER_RE  # the loader's rules: what no name in a usage row may escape
_MODEL_NAME = NAME_RE
_HOUR = re.compile(r"^(\d{4}-\d{2}-\d{2})T(\d{2})$")
_EPOCH = re.compile(r"^[0-9a-f]{1,64}$")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_MAX_COUNT = 10**15  # a count above this is not a real one

TokenKey = tuple[str, str, str, str]  # (epoch, hour, user, model object)
GpuKey = tuple[str, str, str, str, str, str]  # (hour, user, team, kind, object, run)


def is_usage_path(path: str) -> bool:
    """True for ``usage/<YYYY-MM-DD>.json``, the only files of the usage folder."""
    return path.startswith(USAGE_DIR) and path.endswith(".json") and bool(_DATE.match(path[len(USAGE_DIR) : -5]))


def hour_of(ts: float) -> str:
    """The UTC hour of unix time ``ts``: ``YYYY-MM-DDTHH``."""
    return time.strftime("%Y-%m-%dT%H", time.gmtime(ts))


@functools.lru_cache(maxsize=4096)
def hour_start(hour: str) -> float | None:
    """The unix time at which the UTC hour ``YYYY-MM-DDTHH`` begins, or None when it is not one
    (a month 13 or an hour 24 included). Cached: an answer names few distinct hours."""
    m = _HOUR.match(hour)
    if m is None:
        return None
    try:
        y, mo, d = (int(part) for part in m.group(1).split("-"))
        return datetime.datetime(y, mo, d, int(m.group(2)), tzinfo=datetime.UTC).timestamp()
    except ValueError:
        return None


def date_of(ts: float) -> str:
    """The UTC date of unix time ``ts``: ``YYYY-MM-DD``."""
    return time.strftime("%Y-%m-%d", time.gmtime(ts))


def live_since(now: float) -> float:
    """The unix time at which the oldest date the ledger holds row by row at ``now`` begins: the
    start of the UTC day ``LIVE_DAYS - 1`` days before ``now``'s."""
    return (math.floor(now / 86400) - (LIVE_DAYS - 1)) * 86400.0


def split_hours(start: float, end: float) -> dict[str, float]:
    """Seconds of ``[start, end)`` in each UTC hour it touches (empty when ``end <= start``)."""
    out: dict[str, float] = {}
    t = start
    while t < end:
        boundary = (math.floor(t / 3600) + 1) * 3600
        stop = min(end, boundary)
        out[hour_of(t)] = out.get(hour_of(t), 0.0) + (stop - t)
        t = stop
    return out


def model_object(app: str) -> str | None:
    """``<user>/models/<name>`` of an argus model application name ``argus--<user>--<name>``, else None."""
    if not app.startswith("argus--"):
        return None
    parts = app[len("argus--") :].split("--")
    if len(parts) != 2 or not _NAME.match(parts[0]) or not _MODEL_NAME.match(parts[1]):
        return None
    return f"{parts[0]}/models/{parts[1]}"


def valid_user(name: object) -> bool:
    """A user name the loader accepts, or one of :data:`SPECIAL_USERS`."""
    return isinstance(name, str) and (name in SPECIAL_USERS or bool(_NAME.match(name)))


def _count(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_COUNT:
        return None
    return value


def _seconds(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    v = float(value)
    return v if math.isfinite(v) and 0 <= v <= 1e12 else None


@dataclass(frozen=True)
class Job:
    """What a task's GPU-seconds are computed from: one Ray job record (times in unix seconds)."""

    submission_id: str
    user: str
    task: str
    gpus: float
    start: float | None
    end: float | None  # None: still running (counted up to now)


@dataclass(frozen=True)
class Replicas:
    """One model's running replicas at a sample."""

    user: str
    model: str
    replicas: int
    gpus_per_replica: float


@dataclass
class Totals:
    """Sums over every day the ledger knows: requests and tokens by (user, model object), and
    GPU-seconds by (user, team, kind)."""

    requests: dict[tuple[str, str], int] = field(default_factory=dict)
    prompt_tokens: dict[tuple[str, str], int] = field(default_factory=dict)
    completion_tokens: dict[tuple[str, str], int] = field(default_factory=dict)
    gpu_seconds: dict[tuple[str, str, str], float] = field(default_factory=dict)

    def add(self, other: Totals, sign: int = 1) -> None:
        for mine, theirs in (
            (self.requests, other.requests),
            (self.prompt_tokens, other.prompt_tokens),
            (self.completion_tokens, other.completion_tokens),
        ):
            for k, v in theirs.items():
                mine[k] = mine.get(k, 0) + sign * v
        for g, s in other.gpu_seconds.items():
            self.gpu_seconds[g] = self.gpu_seconds.get(g, 0.0) + sign * s


@dataclass
class Day:
    """One UTC date's rows (one usage document)."""

    tokens: dict[TokenKey, tuple[int, int, int]] = field(default_factory=dict)
    gpu: dict[GpuKey, float] = field(default_factory=dict)
    dropped: int = 0

    def totals(self) -> Totals:
        t = Totals()
        for (_epoch, _hour, user, model), (req, prompt, completion) in self.tokens.items():
            k = (user, model)
            t.requests[k] = t.requests.get(k, 0) + req
            t.prompt_tokens[k] = t.prompt_tokens.get(k, 0) + prompt
            t.completion_tokens[k] = t.completion_tokens.get(k, 0) + completion
        for (_hour, user, team, kind, _obj, _run), s in self.gpu.items():
            g = (user, team, kind)
            t.gpu_seconds[g] = t.gpu_seconds.get(g, 0.0) + s
        return t


def document(date: str, day: Day) -> dict[str, Any]:
    """The JSON document of ``day``: rows sorted (the same rows, the same bytes), at most
    :data:`MAX_ROWS` of each kind (see :func:`_bounded`)."""
    tokens, dropped_t = _bounded(day.tokens, lambda v: v[0] + v[1] + v[2], hour_at=1)
    gpu, dropped_g = _bounded(day.gpu, lambda v: v, hour_at=0)
    return {
        "version": VERSION,
        "date": date,
        "tokens": [
            {
                "epoch": e,
                "hour": h,
                "user": u,
                "model": m,
                "requests": r,
                "prompt_tokens": p,
                "completion_tokens": c,
            }
            for (e, h, u, m), (r, p, c) in sorted(tokens.items())
        ],
        "gpu": [
            {"hour": h, "user": u, "team": t, "kind": k, "object": o, "run": run, "gpu_seconds": round(s, 3)}
            for (h, u, t, k, o, run), s in sorted(gpu.items())
        ],
        "dropped": day.dropped + dropped_t + dropped_g,
    }


def _bounded(rows: Mapping[Any, Any], size: Any, hour_at: int) -> tuple[dict[Any, Any], int]:
    """``rows`` cut to :data:`MAX_ROWS`: the newest hours first, the largest rows first within
    one; returns the rows kept and how many were dropped."""
    if len(rows) <= MAX_ROWS:
        return dict(rows), 0
    order = sorted(rows, key=lambda k: (k[hour_at], size(rows[k]), k), reverse=True)
    return {k: rows[k] for k in order[:MAX_ROWS]}, len(rows) - MAX_ROWS


def parse_document(value: object) -> tuple[str, Day] | None:
    """The date and rows of a usage document read back (malformed rows dropped), else None."""
    if not isinstance(value, Mapping) or not isinstance(value.get("date"), str) or not _DATE.match(value["date"]):
        return None
    date: str = value["date"]
    day = Day(dropped=_count(value.get("dropped")) or 0)
    token_rows, gpu_rows = value.get("tokens"), value.get("gpu")
    for row in token_rows if isinstance(token_rows, list) else []:
        if not isinstance(row, Mapping) or len(day.tokens) >= MAX_ROWS:
            continue
        e, h, u, m = row.get("epoch"), row.get("hour"), row.get("user"), row.get("model")
        counts = tuple(_count(row.get(f)) for f in ("requests", "prompt_tokens", "completion_tokens"))
        if not (isinstance(e, str) and _EPOCH.match(e) and isinstance(h, str) and h.startswith(date)):
            continue
        if not (_HOUR.match(h) and valid_user(u) and isinstance(m, str) and _is_model_object(m)):
            continue
        if any(c is None for c in counts):
            continue
        day.tokens[(e, h, str(u), m)] = (int(counts[0] or 0), int(counts[1] or 0), int(counts[2] or 0))
    for row in gpu_rows if isinstance(gpu_rows, list) else []:
        if not isinstance(row, Mapping) or len(day.gpu) >= MAX_ROWS:
            continue
        h, u, t, k, o, run = (row.get(f) for f in ("hour", "user", "team", "kind", "object", "run"))
        s = _seconds(row.get("gpu_seconds"))
        if not (isinstance(h, str) and h.startswith(date) and _HOUR.match(h) and valid_user(u)):
            continue
        if not (isinstance(t, str) and (t == "" or _NAME.match(t)) and k in ("task", "model")):
            continue
        if not (isinstance(o, str) and _is_object(o) and isinstance(run, str) and len(run) <= 200) or s is None:
            continue
        day.gpu[(h, str(u), t, str(k), o, run)] = s
    return date, day


def _is_object(text: str) -> bool:
    parts = text.split("/")
    return (
        len(parts) == 3
        and bool(_NAME.match(parts[0]))
        and parts[1] in ("models", "tasks")
        and bool(_MODEL_NAME.match(parts[2]))
    )


def _is_model_object(text: str) -> bool:
    parts = text.split("/")
    return (
        len(parts) == 3 and bool(_NAME.match(parts[0])) and parts[1] == "models" and bool(_MODEL_NAME.match(parts[2]))
    )


@dataclass
class Ledger:
    """The daemon's usage rows: the dates of the last :data:`LIVE_DAYS` days by the daemon's clock
    row by row, older ones as totals. The dates whose document differs from the one last written:
    ``dirty`` (a user's tokens, a task's run: write it soon), ``sampled`` (model GPU samples only:
    write it now and then) and ``passive`` (the daemon's probes only: write it with the next other
    change).

    ``clock``: the daemon's time as last told (by :meth:`tell` or any method given ``now``; 0: never,
    then the system clock is read). Every bound in time is counted from it, never from a time an
    answer, a document or a job record names."""

    days: dict[str, Day] = field(default_factory=dict)
    old: Totals = field(default_factory=Totals)  # the totals of the days no longer held row by row
    dirty: set[str] = field(default_factory=set)
    sampled: set[str] = field(default_factory=set)
    passive: set[str] = field(default_factory=set)
    last_sample: float | None = None  # when the models were last sampled (None: not since start)
    folded: str = ""  # the newest date kept as totals only: its document is never written again
    clock: float = field(default=0.0, init=False)

    def tell(self, now: float) -> None:
        """Set the daemon's clock the ledger's bounds are counted from (:attr:`clock`)."""
        self.clock = now

    def _now(self, now: float | None) -> float:
        """``now`` (remembered as :attr:`clock`), else the clock last told, else the system's."""
        if now is not None:
            self.clock = now
            return now
        return self.clock or time.time()

    def load(self, documents: Mapping[str, Any], now: float | None = None) -> None:
        """Adopt the usage documents of the status branch (path -> parsed JSON), replacing
        what the ledger holds: a daemon restart continues from them. A document dated after the
        clock's date (+ :data:`FUTURE_S`) is not read: no forged or mistaken future date can hold
        a day's place or age today out."""
        clock = self._now(now)
        latest = date_of(clock + FUTURE_S)
        self.days, self.old, self.folded = {}, Totals(), ""
        self.dirty, self.sampled, self.passive = set(), set(), set()
        for path, value in sorted(documents.items()):
            parsed = parse_document(value)
            if parsed is None or path != f"{USAGE_DIR}{parsed[0]}.json" or parsed[0] > latest:
                continue
            self.days[parsed[0]] = parsed[1]
        self._age(clock)

    def merge_tokens(self, answer: object, now: float | None = None) -> int:
        """Merge one usage document of the endpoint's meter: per (epoch, hour, user, model)
        the latest cumulative value wins. Returns how many rows changed; malformed rows, negative
        counts, hours outside ``[now - ANSWER_PAST_HOURS, now + FUTURE_S]`` (``now``: the
        ledger's clock when not given, never the answer's own) and rows of applications that
        are not an argus model are ignored."""
        if not isinstance(answer, Mapping):
            return 0
        clock = self._now(now)
        epoch, rows = answer.get("epoch"), answer.get("rows")
        if not isinstance(epoch, str) or not _EPOCH.match(epoch) or not isinstance(rows, list):
            return 0
        oldest = (math.floor(clock / 3600) - ANSWER_PAST_HOURS) * 3600.0
        newest = clock + FUTURE_S
        changed = 0
        for row in rows[:MAX_ANSWER_ROWS]:
            if not isinstance(row, Mapping):
                continue
            hour, user, app = row.get("hour"), row.get("user"), row.get("app")
            model = model_object(app) if isinstance(app, str) else None
            counts = tuple(_count(row.get(f)) for f in ("requests", "prompt_tokens", "completion_tokens"))
            if not (isinstance(hour, str) and _HOUR.match(hour) and valid_user(user) and model):
                continue
            begins = hour_start(hour)
            if begins is None or not oldest <= begins <= newest:
                continue  # an hour the meter cannot hold yet, or no longer
            if any(c is None for c in counts):
                continue
            date = hour[:10]
            day = self._day(date, clock)
            if day is None:
                continue
            key = (epoch, hour, str(user), model)
            value = (int(counts[0] or 0), int(counts[1] or 0), int(counts[2] or 0))
            if key not in day.tokens and len(day.tokens) >= 2 * MAX_ROWS:
                continue  # held in memory at most twice what a document keeps
            if day.tokens.get(key) != value:
                day.tokens[key] = value
                (self.passive if user == DAEMON_USER else self.dirty).add(date)
                changed += 1
        return changed

    def record_tasks(self, jobs: Iterable[Job], team_of: Mapping[str, str], now: float) -> int:
        """Set each task run's GPU-seconds per hour from its job record (a running one up to
        ``now``): a recomputation replaces the run's rows, never adds to them. Only the live
        window counts: a run is counted from :func:`live_since` at the earliest (older days are
        final) and never past ``now``, whatever times its record names. Returns how many rows
        changed."""
        clock = self._now(now)
        since = live_since(clock)
        changed = 0
        for job in jobs:
            if not (job.gpus > 0 and math.isfinite(job.gpus)) or job.start is None:
                continue
            end = clock if job.end is None else min(job.end, clock)
            start = max(job.start, since)
            obj = f"{job.user}/tasks/{job.task}"
            team = team_of.get(job.user, "")
            for hour, seconds in split_hours(start, end).items():
                day = self._day(hour[:10], clock)
                if day is None:
                    continue
                key = (hour, job.user, team, "task", obj, job.submission_id)
                value = round(seconds * job.gpus, 3)
                if key not in day.gpu and len(day.gpu) >= 2 * MAX_ROWS:
                    continue  # held in memory at most twice what a document keeps
                if day.gpu.get(key) != value:
                    # The run's row under another team (the user moved): replaced, not doubled.
                    for other in [k for k in day.gpu if k[0] == hour and k[5] == job.submission_id and k != key]:
                        del day.gpu[other]
                    day.gpu[key] = value
                    self.dirty.add(hour[:10])
                    changed += 1
        return changed

    def sample_models(self, running: Iterable[Replicas], team_of: Mapping[str, str], now: float, cap: float) -> int:
        """Add each model's running replicas x GPUs per replica x the time since the last sample
        (at most ``cap`` seconds: a daemon that stopped sampling does not invent usage for the
        gap; the first sample after a start adds nothing). Returns how many rows changed."""
        self._now(now)
        last, self.last_sample = self.last_sample, now
        if last is None or now <= last:
            return 0
        start = max(last, now - cap)
        changed = 0
        for r in running:
            gpus = r.replicas * r.gpus_per_replica
            if not (gpus > 0 and math.isfinite(gpus)):
                continue
            team = team_of.get(r.user, "")
            for hour, seconds in split_hours(start, now).items():
                day = self._day(hour[:10], now)
                if day is None:
                    continue
                key = (hour, r.user, team, "model", f"{r.user}/models/{r.model}", "")
                if key not in day.gpu and len(day.gpu) >= 2 * MAX_ROWS:
                    continue
                day.gpu[key] = round(day.gpu.get(key, 0.0) + seconds * gpus, 3)
                self.sampled.add(hour[:10])
                changed += 1
        return changed

    def take_documents(self, samples: bool = True, now: float | None = None) -> dict[str, dict[str, Any]]:
        """The documents of the dates changed since they were last taken (path -> document):
        ``dirty`` dates, and ``sampled`` ones too when ``samples``; a ``passive`` change travels
        with them. At most :data:`MAX_DOCUMENTS_PER_COMMIT`, the newest dates first: the others
        stay changed and are taken by the next call. Forgets that the ones taken changed; days
        older than the live window are then kept as totals only."""
        clock = self._now(now)
        dates = sorted((self.dirty | (self.sampled if samples else set())) & self.days.keys(), reverse=True)
        taken = set(dates[:MAX_DOCUMENTS_PER_COMMIT])
        out = {f"{USAGE_DIR}{d}.json": document(d, self.days[d]) for d in sorted(taken)}
        self.dirty = {d for d in self.dirty if d in self.days} - taken
        self.sampled = {d for d in self.sampled if d in self.days} - taken
        self.passive -= taken
        self._age(clock)
        return out

    def totals(self) -> Totals:
        """The sums over every date the ledger knows (a new object)."""
        out = Totals()
        out.add(self.old)
        for day in self.days.values():
            out.add(day.totals())
        return out

    def _day(self, date: str, now: float) -> Day | None:
        """The rows of ``date`` (created when new); None for a date already kept as totals only
        (an answer about a day that old changes nothing) and, when new, for a date outside the
        live window at ``now`` (older than :func:`live_since`, or after ``now + FUTURE_S``)."""
        day = self.days.get(date)
        if day is None:
            if date <= self.folded or date < date_of(live_since(now)) or date > date_of(now + FUTURE_S):
                return None
            day = self.days[date] = Day()
        return day

    def _age(self, now: float) -> None:
        """Fold the days older than the live window at ``now`` (and not waiting to be written)
        into ``old``. Counted from the clock, not from the newest date held: no date can push
        today out."""
        oldest = date_of(live_since(now))
        for date in sorted(self.days):
            if date >= oldest:
                break
            if date not in self.dirty and date not in self.sampled:
                # A passive change of a day this old (the daemon's probe counts) is not written.
                self.passive.discard(date)
                self.old.add(self.days.pop(date).totals())
                self.folded = max(self.folded, date)
