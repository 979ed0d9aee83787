"""Per-minute rate limits and usage accounting of the endpoint: the pure part (no Ray, no I/O).

Limits (the gate config's ``limits``, built by the daemon from cluster.yaml) cap each user's and
each team's requests and tokens (prompt + completion) per minute. Counting uses Cloudflare's
sliding-window counter: per subject (``u:<user>``, ``t:<team>``) the counts of the current and
the previous wall-clock minute, and the estimate ``prev * (1 - elapsed / 60) + cur``. The
estimate is continuous (at a minute's end ``cur`` becomes ``prev`` at full weight) and never
rises without new counts, so the time a refused caller must wait has a closed form
(:func:`retry_after`).

Across endpoint processes. :class:`MeterState` (held by the daemon's ``Meter``,
reconciler/endpoint/meter.py) owns the global windows and the usage rows; its clock assigns the
deltas it receives to minutes. Each endpoint process decides alone with its :class:`Counters`: the
global windows of its last sync plus what it admitted and counted since (unsynced), so a busy
process's requests cost no remote call. A process syncs every SYNC_BUSY_S while it had traffic in
the last BUSY_FOR_S (its last counts are flushed then), and not at all when idle: an idle endpoint
costs no meter call. Overshoot bound: a process does not see what another admitted since that
one's last sync, nor what reached the meter after its own last sync, so with R processes, a sync
period P (SYNC_BUSY_S plus the sync's latency) and a caller admitted at rate r by each process,
one window admits at most ``limit + 2 * (R - 1) * r * P`` requests (e.g. 4 processes, 0.5 s, 20
requests/s each: 60 over; tests/unit/test_limits.py simulates it). Tokens likewise, plus the tokens
of the requests in flight when the limit is reached: tokens are known only when a response's usage
arrives. A process whose windows are older than STALE_S (it stops syncing when idle) first waits
for one sync, at most FRESHEN_TIMEOUT_S (meter.py), before it decides a limited request: the only
remote call a request may wait for, once per wake-up. In ``argus run`` the one process is the
daemon's and its sync a function call.

Tokens come from the responses' own ``usage`` (reconciler/endpoint/usage.py). A stream the
client leaves before its end (vLLM reports usage last) is charged one completion token per chunk
it received and no prompt tokens (an estimate: vLLM streams about a token a chunk).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

WINDOW_S = 60.0
MAX_RETRY_S = 120  # a Retry-After never exceeds two windows (the estimate is zero by then)
MAX_SUBJECTS = 100_000  # users and teams the meter counts at once; new ones past it are not limited
MAX_ROWS = 100_000  # usage rows (hour, user, app) kept; the newest hours win
KEEP_HOURS = 48  # usage rows of older hours are dropped
MAX_LIMIT_ENTRIES = 100_000  # per-user or per-team limit entries read from user_config
FUTURE_HOURS = 1  # usage rows of hours after the meter's current one are refused past this (clock skew)
# A count no row or window holds more of: a delta, or a sum, above it is not a real one.
MAX_COUNT = 10**15
MAX_NAME = 256  # the longest subject, user or application name a delta may carry
OPEN_USER = "(open)"  # usage rows of requests without a key (no keys file)
DAEMON_USER = "(daemon)"  # usage rows of the daemon's own probes

Pair = tuple[int | None, int | None]  # (requests per minute, tokens per minute); None: unlimited


@dataclass(frozen=True)
class Limits:
    """The ``limits`` part of the gate config: each user's default, users' own
    limits (overriding the default) and teams' (on their members' summed counts)."""

    default: Pair = (None, None)
    users: dict[str, Pair] = field(default_factory=dict)
    teams: dict[str, Pair] = field(default_factory=dict)

    def of(self, user: str, team: str | None) -> list[tuple[str, int | None, int | None]]:
        """Return the ``(subject, rpm, tpm)`` a caller is limited by: her own (``u:<user>``), then her
        team's (``t:<team>``); subjects without any limit are left out. Pure."""
        out: list[tuple[str, int | None, int | None]] = []
        rpm, tpm = self.users.get(user, self.default)
        if rpm is not None or tpm is not None:
            out.append((f"u:{user}", rpm, tpm))
        if team is not None:
            rpm, tpm = self.teams.get(team, (None, None))
            if rpm is not None or tpm is not None:
                out.append((f"t:{team}", rpm, tpm))
        return out


def _limit(value: Any) -> int | None:
    """A positive int or None; raises ValueError for anything else."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(value)
    return value


def _pair(value: Any) -> Pair:
    if not isinstance(value, list) or len(value) != 2:
        raise ValueError(value)
    return _limit(value[0]), _limit(value[1])


def parse_limits(config: Any) -> tuple[Limits | None, list[str]]:
    """Return ``(limits, problems)`` of a gate config's ``limits`` (None: absent, no limit).

    Pure; never raises. Malformed parts are skipped and described in ``problems``, like the
    table's other parts: a malformed ``default`` leaves users without a default limit, a malformed
    user's entry leaves her the default, a malformed team's entry leaves the team unlimited (the
    daemon builds this part; a malformed one is a bug to log, not a reason to refuse everyone).
    """
    raw = config.get("limits") if isinstance(config, dict) else None
    if raw is None:
        return None, []
    if not isinstance(raw, dict):
        return None, ["limits is not a mapping: no limits"]
    problems: list[str] = []
    default: Pair = (None, None)
    if "default" in raw:
        try:
            default = _pair(raw["default"])
        except ValueError:
            problems.append("limits.default is not [rpm|null, tpm|null] of positive integers: no default")
    parts: dict[str, dict[str, Pair]] = {"users": {}, "teams": {}}
    for part, out in parts.items():
        rows = raw.get(part, {})
        if not isinstance(rows, dict):
            problems.append(f"limits.{part} is not a mapping: skipped")
            continue
        for name, value in list(rows.items())[:MAX_LIMIT_ENTRIES]:
            try:
                if not isinstance(name, str):
                    raise ValueError(name)
                out[name] = _pair(value)
            except ValueError:
                problems.append(f"limits.{part}: the entry of {str(name)[:40]!r} is malformed: skipped")
        if len(rows) > MAX_LIMIT_ENTRIES:
            problems.append(f"limits.{part}: only the first {MAX_LIMIT_ENTRIES} entries are read")
    return Limits(default, parts["users"], parts["teams"]), problems


def count(value: Any) -> int | None:
    """``value`` when it is a count (an int, not a bool, in ``[0, MAX_COUNT]``), else None. Pure."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        return None
    return value


def _name(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_NAME


def _window(value: Any) -> list[int] | None:
    """A meter window ``[minute, requests prev, requests cur, tokens prev, tokens cur]`` with no
    negative count, else None (the process then counts the subject from its own counts alone)."""
    if not isinstance(value, list) or len(value) != 5:
        return None
    minute = value[0]
    counts = [count(v) for v in value[1:]]
    if isinstance(minute, bool) or not isinstance(minute, int) or any(c is None for c in counts):
        return None
    return [minute, *(int(c or 0) for c in counts)]


# -- the sliding window ----------------------------------------------------------------------------


def minute_of(now: float) -> tuple[int, float]:
    """Return ``(minute index, seconds elapsed in it)`` of a unix time. Pure."""
    minute = math.floor(now / WINDOW_S)
    return minute, now - minute * WINDOW_S


def estimate(prev: float, cur: float, elapsed: float) -> float:
    """The sliding-window estimate ``elapsed`` seconds into the current minute. Pure."""
    return prev * (1.0 - elapsed / WINDOW_S) + cur


def retry_after(prev: float, cur: float, elapsed: float, limit: int) -> int:
    """Return the whole seconds ``s >= 1`` after which the estimate is below ``limit`` again,
    assuming nothing more is counted. Pure; closed form.

    The estimate falls linearly through the rest of this minute (to ``cur``) and then through the
    next (to 0); ``s`` is one more than the whole seconds to the instant it reaches ``limit``
    (strictly below is what admits), at least 1 and at most MAX_RETRY_S.
    """
    if estimate(prev, cur, elapsed) < limit:
        return 1
    if cur < limit:  # within this minute: prev * (1 - t / 60) + cur = limit
        reach = WINDOW_S * (1.0 - (limit - cur) / prev) - elapsed
    else:  # in the next minute, where cur weighs as prev: cur * (1 - t / 60) = limit
        reach = (WINDOW_S - elapsed) + WINDOW_S * (1.0 - limit / cur)
    return min(max(1, math.floor(reach) + 1), MAX_RETRY_S)


# Window = [minute, requests prev, requests cur, tokens prev, tokens cur]


def shifted(window: list[int] | None, minute: int) -> tuple[int, int, int, int]:
    """Return ``(requests prev, requests cur, tokens prev, tokens cur)`` of ``window`` seen in
    ``minute`` (a later minute shifts cur into prev; a window two minutes old is zero). Pure."""
    if window is None or window[0] < minute - 1:
        return 0, 0, 0, 0
    if window[0] == minute - 1:
        return window[2], 0, window[4], 0
    return window[1], window[2], window[3], window[4]  # this minute (or a meter clock ahead: as is)


class Counters:
    """An endpoint process's view of the windows and its unsynced counts. Not thread-safe: used on
    the endpoint's event loop only.

    ``windows``: the meter's answer at the last sync (subject -> window); ``pending``: what this
    process counted since (subject -> [requests, tokens]) and ``usage`` (hour index, user, app ->
    [requests, prompt tokens, completion tokens]); ``sent`` and ``sent_usage``: what a sync under
    way carries (still counted here until its answer arrives).
    """

    def __init__(self) -> None:
        self.windows: dict[str, list[int]] = {}
        self.pending: dict[str, list[int]] = {}
        self.sent: dict[str, list[int]] = {}
        self.usage: dict[tuple[int, str, str], list[int]] = {}
        self.sent_usage: dict[tuple[int, str, str], list[int]] = {}
        self.dropped_usage = 0  # rows not kept while the meter was unreachable (bounded memory)

    def admit(self, limits: list[tuple[str, int | None, int | None]], now: float) -> tuple[int, str] | None:
        """Count one request against every subject of ``limits`` and return None when each is under
        its limits; else count nothing and return ``(Retry-After, which)``: the whole seconds
        (>= 1) of the longest wait among the limits exceeded, and that limit (``"u:<user>
        requests"``, ``"t:<team> tokens"``)."""
        minute, elapsed = minute_of(now)
        wait, which = 0, ""
        for subject, rpm, tpm in limits:
            rp, rc, tp, tc = shifted(self.windows.get(subject), minute)
            mine = self.pending.get(subject, (0, 0))
            theirs = self.sent.get(subject, (0, 0))
            rc += mine[0] + theirs[0]
            tc += mine[1] + theirs[1]
            if rpm is not None and estimate(rp, rc, elapsed) >= rpm:
                seconds = retry_after(rp, rc, elapsed, rpm)
                if seconds > wait:
                    wait, which = seconds, f"{subject} requests"
            if tpm is not None and estimate(tp, tc, elapsed) >= tpm:
                seconds = retry_after(tp, tc, elapsed, tpm)
                if seconds > wait:
                    wait, which = seconds, f"{subject} tokens"
        if wait:
            return wait, which
        for subject, _, _ in limits:
            self.pending.setdefault(subject, [0, 0])[0] += 1
        return None

    def add_tokens(self, subjects: list[str], tokens: int) -> None:
        """Count ``tokens`` against each of ``subjects`` (the ones a request was admitted under)."""
        if tokens > 0:
            for subject in subjects:
                self.pending.setdefault(subject, [0, 0])[1] += tokens

    def record(self, now: float, user: str, app: str, requests: int, prompt: int, completion: int) -> None:
        """Add a usage row's counts (hour of ``now``, ``user``, ``app``). A count that is not one
        (negative, not an int: a model's ``usage`` field says what it likes) adds nothing."""
        requests, prompt, completion = (count(v) or 0 for v in (requests, prompt, completion))
        key = (math.floor(now / 3600), user, app)
        row = self.usage.get(key)
        if row is None:
            if len(self.usage) >= MAX_ROWS:
                self.dropped_usage += 1
                return
            row = self.usage[key] = [0, 0, 0]
        row[0] += requests
        row[1] += prompt
        row[2] += completion

    def take(self) -> dict[str, Any] | None:
        """Return the deltas to send to the meter (None: nothing to send, and no sync under way);
        they stay counted here (as ``sent``) until :meth:`settle`."""
        if self.sent or self.sent_usage:
            raise RuntimeError("a sync is under way")
        self.sent, self.pending = self.pending, {}
        self.sent_usage, self.usage = self.usage, {}
        return {
            "s": {s: list(v) for s, v in self.sent.items()},
            "u": [[h, u, a, *v] for (h, u, a), v in self.sent_usage.items()],
        }

    def settle(self, answer: dict[str, Any] | None) -> None:
        """End the sync :meth:`take` began: with the meter's ``answer`` its windows replace ours
        (they include what was sent); without one (the sync failed) what was sent is pending again."""
        if answer is not None:
            windows = answer.get("w") if isinstance(answer, dict) else None
            checked = ((k, _window(w)) for k, w in (windows.items() if isinstance(windows, dict) else ()))
            self.windows = {k: w for k, w in checked if isinstance(k, str) and w is not None}
        else:
            for subject, (r, t) in self.sent.items():
                counts = self.pending.setdefault(subject, [0, 0])
                counts[0] += r
                counts[1] += t
            for (h, u, a), (r, p, c) in self.sent_usage.items():
                self.record(h * 3600.0, u, a, r, p, c)
        self.sent, self.sent_usage = {}, {}


def _row_delta(entry: Any, oldest: int, newest: int) -> tuple[int, str, str, int, int, int] | None:
    """A usage row delta ``[hour index, user, app, requests, prompt, completion]`` of an hour in
    ``[oldest, newest]`` with names and counts that are ones, else None. Pure."""
    if not isinstance(entry, (list, tuple)) or len(entry) != 6:
        return None
    hour, user, app = entry[0], entry[1], entry[2]
    counts = [count(v) for v in entry[3:]]
    if isinstance(hour, bool) or not isinstance(hour, int) or not oldest <= hour <= newest:
        return None
    if not _name(user) or not _name(app) or any(c is None for c in counts):
        return None
    return hour, user, app, int(counts[0] or 0), int(counts[1] or 0), int(counts[2] or 0)


class MeterState:
    """The global windows and usage rows, as the daemon's ``Meter`` holds them. Pure: the
    clock is passed in.

    Bounded: at most MAX_SUBJECTS subjects (idle ones, last counted two minutes ago or more, are
    dropped once a minute; a new subject past the cap is not counted, hence not limited, and
    logged by the caller via ``refused_subjects``), at most MAX_ROWS usage rows of the last
    KEEP_HOURS hours (the oldest hours go first).
    """

    def __init__(self, epoch: str, now: float) -> None:
        self.epoch = epoch
        self.windows: dict[str, list[int]] = {}
        self.rows: dict[tuple[int, str, str], list[int]] = {}
        self.refused_subjects = 0
        self.refused_deltas = 0  # deltas not counted: malformed, negative, out of the hours kept
        self._pruned_minute = minute_of(now)[0]

    def sync(self, deltas: Any, now: float) -> dict[str, Any]:
        """Add an endpoint process's deltas (:meth:`Counters.take`) and return the windows of every subject
        counted in this minute or the last: ``{"epoch", "w": {subject: window}}``.

        Every delta is checked (its caller may be any code that reaches the meter): a malformed
        one, a negative or oversized count, a row of an hour before the last KEEP_HOURS or more
        than FUTURE_HOURS after ``now``'s, or one that would take a count past MAX_COUNT is
        skipped and counted in ``refused_deltas``. Never raises for what ``deltas`` holds."""
        minute = minute_of(now)[0]
        if minute != self._pruned_minute:
            self._pruned_minute = minute
            self.windows = {s: w for s, w in self.windows.items() if w[0] >= minute - 1}
            self._prune_rows(now)
        subjects = deltas.get("s", {}) if isinstance(deltas, dict) else {}
        for subject, delta in subjects.items() if isinstance(subjects, dict) else ():
            pair = delta if isinstance(delta, (list, tuple)) and len(delta) == 2 else (None, None)
            requests, tokens = count(pair[0]), count(pair[1])
            if not _name(subject) or requests is None or tokens is None:
                self.refused_deltas += 1
                continue
            window = self.windows.get(subject)
            if window is None:
                if len(self.windows) >= MAX_SUBJECTS:
                    self.refused_subjects += 1
                    continue
                window = self.windows[subject] = [minute, 0, 0, 0, 0]
            if window[0] != minute:
                window[:] = [minute, *shifted(window, minute)]
            if window[2] + requests > MAX_COUNT or window[4] + tokens > MAX_COUNT:
                self.refused_deltas += 1
                continue
            window[2] += requests
            window[4] += tokens
        rows = deltas.get("u", []) if isinstance(deltas, dict) else []
        current = math.floor(now / 3600)
        oldest = current - KEEP_HOURS + 1
        for entry in rows if isinstance(rows, list) else ():
            delta = _row_delta(entry, oldest, current + FUTURE_HOURS)
            if delta is None:
                self.refused_deltas += 1
                continue
            hour, user, app, requests, prompt, completion = delta
            key = (hour, user, app)
            row = self.rows.get(key)
            if row is None:
                if len(self.rows) >= MAX_ROWS:
                    self._prune_rows(now, room=1)
                    if len(self.rows) >= MAX_ROWS:
                        continue
                row = self.rows[key] = [0, 0, 0]
            if max(row[0] + requests, row[1] + prompt, row[2] + completion) > MAX_COUNT:
                self.refused_deltas += 1
                continue
            row[0] += requests
            row[1] += prompt
            row[2] += completion
        active = {s: list(w) for s, w in self.windows.items() if w[0] >= minute - 1}
        return {"epoch": self.epoch, "w": active}

    def _prune_rows(self, now: float, room: int = 0) -> None:
        """Drop rows older than KEEP_HOURS; then, to make ``room``, whole oldest hours (never the
        newest hour: a row of it that does not fit is not kept). Amortized: frees a tenth more."""
        oldest = math.floor(now / 3600) - KEEP_HOURS + 1
        self.rows = {k: v for k, v in self.rows.items() if k[0] >= oldest}
        if room and len(self.rows) + room > MAX_ROWS:
            hours = sorted({k[0] for k in self.rows})
            target = MAX_ROWS - room - MAX_ROWS // 10
            for hour in hours[:-1]:
                if len(self.rows) <= target:
                    break
                self.rows = {k: v for k, v in self.rows.items() if k[0] != hour}

    def usage(self, now: float) -> dict[str, Any]:
        """The meter's usage document: ``{"epoch", "now", "rows"}``, rows cumulative
        since the epoch, sorted by hour, user, app, of the last KEEP_HOURS hours."""
        self._prune_rows(now)
        return {
            "epoch": self.epoch,
            "now": now,
            "rows": [
                {
                    "hour": time.strftime("%Y-%m-%dT%H", time.gmtime(hour * 3600)),
                    "user": user,
                    "app": app,
                    "requests": r,
                    "prompt_tokens": p,
                    "completion_tokens": c,
                }
                for (hour, user, app), (r, p, c) in sorted(self.rows.items())
            ],
        }
