"""The pure part of the endpoint's rate limits and usage accounting (reconciler/endpoint/limits.py):
the sliding window and its Retry-After, the ``limits`` part of the gate config, an
endpoint process's local decisions and the meter's global state and bounds."""

from __future__ import annotations

import math
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reconciler.endpoint import limits
from reconciler.endpoint.limits import (
    MAX_RETRY_S,
    Counters,
    Limits,
    MeterState,
    estimate,
    minute_of,
    parse_limits,
    retry_after,
)

T0 = 1_796_000_000.0 - 1_796_000_000.0 % 3600  # an hour's (and a minute's) start


def later(prev: float, cur: float, elapsed: float, wait: float) -> float:
    """The estimate ``wait`` seconds later with nothing more counted (windows shift at minute ends)."""
    t = elapsed + wait
    if t < 60:
        return estimate(prev, cur, t)
    if t < 120:
        return estimate(cur, 0, t - 60)
    return 0.0


def test_the_estimate_weighs_the_previous_minute_by_what_is_left_of_it() -> None:
    assert minute_of(T0 + 90.5) == (int(T0 // 60) + 1, 30.5)
    assert estimate(60, 10, 0) == 70 and estimate(60, 10, 30) == 40
    assert estimate(60, 10, 59.999) == pytest.approx(10.001)


def test_retry_after_at_the_boundaries() -> None:
    assert retry_after(10, 0, 0, 5) == 31  # 10 * (1 - t/60) < 5 from t > 30: 31 whole seconds
    assert later(10, 0, 0, 30) == 5 and later(10, 0, 0, 31) < 5
    assert retry_after(10, 0, 29.5, 5) == 1  # 0.5 s to the boundary: a second, never 0
    assert retry_after(10, 0, 30, 5) == 1  # exactly at the limit: not under it yet
    assert retry_after(0, 5, 0, 5) == 61  # all in this minute: falls through the next one
    assert retry_after(0, 5, 59, 5) == 2
    assert retry_after(0, 500, 0, 1) == 120  # far over: two windows at most
    assert retry_after(3, 1, 0, 5) == 1  # under the limit already


@given(
    prev=st.integers(0, 10_000),
    cur=st.integers(0, 10_000),
    limit=st.integers(1, 10_000),
    elapsed=st.floats(0, 59.99, allow_nan=False),
)
def test_retry_after_is_the_first_whole_second_under_the_limit(prev: int, cur: int, limit: int, elapsed: float) -> None:
    if estimate(prev, cur, elapsed) < limit:
        return
    wait = retry_after(prev, cur, elapsed, limit)
    assert 1 <= wait <= MAX_RETRY_S
    tolerance = 1e-6 * max(prev, cur, 1)
    assert later(prev, cur, elapsed, wait) < limit + tolerance
    if wait > 1:
        assert later(prev, cur, elapsed, wait - 1) >= limit - tolerance


def test_parse_limits_reads_the_contract_and_skips_malformed_entries() -> None:
    assert parse_limits({"models": []}) == (None, [])
    assert parse_limits(None) == (None, [])
    parsed, problems = parse_limits(
        {"limits": {"default": [600, None], "users": {"alice": [1200, 400000]}, "teams": {"vision": [None, 500]}}}
    )
    assert problems == [] and parsed == Limits((600, None), {"alice": (1200, 400000)}, {"vision": (None, 500)})
    parsed, problems = parse_limits(
        {
            "limits": {
                "default": [0, 5],
                "users": {"bob": [True, 1], "carl": [1.5, None], "dan": [1], "eve": [-1, 2], "fay": [3, None]},
                "teams": ["x"],
            }
        }
    )
    assert parsed == Limits((None, None), {"fay": (3, None)}, {})
    assert len(problems) == 6  # the default, four users, the teams
    assert parse_limits({"limits": "lots"}) == (None, ["limits is not a mapping: no limits"])


def test_a_users_own_limit_overrides_the_default_and_a_team_adds_its_own() -> None:
    lim = Limits((10, None), {"alice": (None, 100)}, {"research": (50, None)})
    assert lim.of("bob", None) == [("u:bob", 10, None)]
    assert lim.of("alice", "research") == [("u:alice", None, 100), ("t:research", 50, None)]
    assert Limits().of("bob", "other") == []  # nothing set: nothing counted


def test_a_user_at_her_limit_does_not_refuse_another_and_a_refused_request_is_not_counted() -> None:
    counters = Counters()
    lim = Limits((2, None))
    assert counters.admit(lim.of("alice", None), T0) is None
    assert counters.admit(lim.of("alice", None), T0 + 1) is None
    refused = counters.admit(lim.of("alice", None), T0 + 2)
    assert refused == (59, "u:alice requests")  # at T0 + 61, a second into the next minute: 2 * (1 - 1/60) < 2
    assert counters.pending == {"u:alice": [2, 0]}
    assert counters.admit(lim.of("bob", None), T0 + 2) is None


def test_a_team_limit_sums_its_members() -> None:
    counters = Counters()
    lim = Limits((None, None), {}, {"research": (3, None)})
    for user in ("alice", "carl", "alice"):
        assert counters.admit(lim.of(user, "research"), T0) is None
    assert counters.admit(lim.of("carl", "research"), T0) == (61, "t:research requests")
    assert counters.admit(lim.of("bob", None), T0) is None  # in no team: unlimited


def test_tokens_count_when_known_and_refuse_the_next_request() -> None:
    counters = Counters()
    subjects = Limits((None, 100)).of("alice", None)
    assert counters.admit(subjects, T0) is None
    counters.add_tokens(["u:alice"], 150)
    assert counters.admit(subjects, T0 + 10) == (
        71,
        "u:alice tokens",
    )  # 150 * (1 - t/60) < 100 from t > 20 of the next minute


def sync(counters: Counters, meter: MeterState, now: float) -> None:
    counters.settle(meter.sync(counters.take(), now))


def test_two_replicas_with_one_meter_enforce_one_global_limit() -> None:
    meter = MeterState("e" * 32, T0)
    a, b = Counters(), Counters()
    lim = Limits((10, None)).of("alice", None)
    for _ in range(5):
        assert a.admit(lim, T0) is None
    sync(a, meter, T0)
    for _ in range(5):
        assert b.admit(lim, T0 + 1) is None
    sync(b, meter, T0 + 1)
    assert b.admit(lim, T0 + 1) is not None  # b knows a's five
    assert a.admit(lim, T0 + 1) is None  # a does not know b's yet: the overshoot, one sync period
    sync(a, meter, T0 + 1.5)
    assert a.admit(lim, T0 + 1.5) is not None
    assert meter.windows["u:alice"][2] == 11


def test_the_overshoot_is_bounded_by_the_replicas_rate_and_sync_period() -> None:
    """R replicas each admitting r requests a second and syncing every P seconds (staggered): one
    minute admits at least the limit (one global limit, not one per replica) and at most
    limit + 2 (R - 1) r P (the module docstring's bound)."""
    replicas, rate, period, limit = 4, 20, 0.5, 200
    meter = MeterState("e" * 32, T0)
    counters = [Counters() for _ in range(replicas)]
    lim = Limits((limit, None)).of("alice", None)
    admitted = 0
    step = 1 / rate
    for tick in range(int(55 / step)):
        now = T0 + tick * step
        for i, replica in enumerate(counters):
            admitted += replica.admit(lim, now) is None
            if (tick + i * 3) % int(period / step) == 0:
                sync(replica, meter, now)
    assert limit <= admitted <= limit + 2 * (replicas - 1) * rate * period


def test_a_failed_sync_keeps_its_counts_pending() -> None:
    counters = Counters()
    lim = Limits((5, None)).of("alice", None)
    counters.admit(lim, T0)
    counters.record(T0, "alice", "argus--bob--chat", 1, 3, 4)
    deltas = counters.take()
    assert deltas == {"s": {"u:alice": [1, 0]}, "u": [[int(T0 // 3600), "alice", "argus--bob--chat", 1, 3, 4]]}
    with pytest.raises(RuntimeError):
        counters.take()  # one sync at a time
    counters.admit(lim, T0)  # counted while the sync is under way
    counters.settle(None)
    assert counters.pending == {"u:alice": [2, 0]}
    assert counters.usage == {(int(T0 // 3600), "alice", "argus--bob--chat"): [1, 3, 4]}


def test_the_meter_answers_active_subjects_and_drops_idle_ones() -> None:
    meter = MeterState("e" * 32, T0)
    meter.sync({"s": {"u:alice": [3, 10], "u:bob": [1, 0]}, "u": []}, T0)
    answer = meter.sync({"s": {"u:alice": [1, 0]}, "u": []}, T0 + 61)
    minute = int(T0 // 60)
    assert answer["w"]["u:alice"] == [minute + 1, 3, 1, 10, 0]  # shifted into the new minute
    assert answer["w"]["u:bob"] == [minute, 0, 1, 0, 0]  # last minute's: still counts
    answer = meter.sync({"s": {}, "u": []}, T0 + 125)
    assert answer["w"] == {"u:alice": [minute + 1, 3, 1, 10, 0]}
    assert "u:bob" not in meter.windows  # idle two minutes: dropped


def test_the_meter_caps_its_subjects(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "MAX_SUBJECTS", 2)
    meter = MeterState("e" * 32, T0)
    answer = meter.sync({"s": {"u:a": [1, 0], "u:b": [1, 0], "u:c": [1, 0]}, "u": []}, T0)
    assert set(answer["w"]) == {"u:a", "u:b"} and meter.refused_subjects == 1


def test_usage_rows_are_cumulative_in_the_contracts_format() -> None:
    meter = MeterState("e" * 32, T0)
    hour = int(T0 // 3600)
    meter.sync({"s": {}, "u": [[hour, "bob", "argus--bob--chat", 1, 10, 5]]}, T0)
    meter.sync(
        {"s": {}, "u": [[hour, "bob", "argus--bob--chat", 2, 20, 7], [hour, "(open)", "argus--a--b", 1, 0, 0]]}, T0
    )
    usage = meter.usage(T0 + 5)
    assert usage["epoch"] == "e" * 32 and usage["now"] == T0 + 5
    stamp = time.strftime("%Y-%m-%dT%H", time.gmtime(T0))
    tokens = ("requests", "prompt_tokens", "completion_tokens")
    assert usage["rows"] == [
        {"hour": stamp, "user": "(open)", "app": "argus--a--b", **dict(zip(tokens, (1, 0, 0), strict=True))},
        {"hour": stamp, "user": "bob", "app": "argus--bob--chat", **dict(zip(tokens, (3, 30, 12), strict=True))},
    ]


def test_usage_keeps_48_hours_and_the_newest_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    meter = MeterState("e" * 32, T0)
    hour = int(T0 // 3600)
    meter.sync({"s": {}, "u": [[hour - h, "bob", "argus--bob--chat", 1, 0, 0] for h in range(50)]}, T0)
    assert len(meter.usage(T0)["rows"]) == 48  # 47 hours back and this one
    assert len(meter.usage(T0 + 3600)["rows"]) == 47
    monkeypatch.setattr(limits, "MAX_ROWS", 20)
    meter = MeterState("e" * 32, T0)
    rows = [[hour - h, f"u{i}", "argus--u--m", 1, 0, 0] for h in range(3) for i in range(10)]
    meter.sync({"s": {}, "u": rows}, T0)
    kept = meter.usage(T0)["rows"]
    assert len(kept) <= 20
    newest = {r["user"] for r in kept if r["hour"] == kept[-1]["hour"]}
    assert len(newest) == 10  # the newest hour whole; the oldest went first
    assert not any(math.isnan(r["requests"]) for r in kept)
