"""Usage rows bounded, written as the attacker would (reconciler/status/usage.py,
reconciler/endpoint/limits.py, reconciler/observe/usage.py, reconciler/status/writer.py): the
meter takes writes from any job that reaches its deployment handle, and its answer is read by the
daemon. No negative count anywhere (meter, merge, documents read back); no hour outside ``[now - 48 h, now + 1 h]`` into
the meter or from its answer, "now" being the daemon's clock and never the answer's; no date in
the future ages today out; one status commit carries at most ``MAX_DOCUMENTS_PER_COMMIT`` usage
documents. The honest rows are checked beside each attack. Pure, with fakes (the writer's test: real git)."""

from __future__ import annotations

import calendar
import json
import math
from pathlib import Path
from typing import Any

import pytest

from reconciler.endpoint.limits import KEEP_HOURS, Counters, MeterState
from reconciler.observe.usage import UsageRecorder
from reconciler.plan.actual import ActualState
from reconciler.source.remote import open_source
from reconciler.spec.types import ClusterSpec, DesiredState, ObjectKey, UserPolicy
from reconciler.status import usage
from reconciler.status.auth import status_key
from reconciler.status.usage import Day, Ledger, document
from reconciler.status.writer import StatusReport, StatusWriter
from tests.support import git, status_test_repo

T = float(calendar.timegm((2026, 12, 5, 3, 30, 0)))  # 2026-12-05T03:30:00Z, the daemon's clock
HOUR = math.floor(T / 3600)
E1 = "a" * 32
APP = "argus--alice--chat"
Y2096 = float(calendar.timegm((2096, 1, 1, 0, 0, 0)))


def row(hour: str, user: str = "alice", r: Any = 1, p: Any = 2, c: Any = 3) -> dict[str, Any]:
    return {"hour": hour, "user": user, "app": APP, "requests": r, "prompt_tokens": p, "completion_tokens": c}


def answer(*rows: dict[str, Any], now: float = T) -> dict[str, Any]:
    return {"epoch": E1, "now": now, "rows": list(rows)}


def told(now: float = T) -> Ledger:
    ledger = Ledger()
    ledger.tell(now)
    return ledger


# -- the ledger: rows from the meter's answer ------------------------------------------------------


def test_negative_counts_in_an_answer_are_ignored() -> None:
    ledger = told()
    assert ledger.merge_tokens(answer(row("2026-12-05T03", r=-5), row("2026-12-05T03", user="bob", c=-1))) == 0
    assert ledger.merge_tokens(answer(row("2026-12-05T03"))) == 1
    assert ledger.totals().requests == {("alice", "alice/models/chat"): 1}


def test_hours_outside_the_window_of_the_daemons_clock_are_ignored() -> None:
    ledger = told()
    too_old = [row("2026-12-02T00"), row("2026-12-03T02")]  # begun 75.5 and 49.5 hours before 03:30
    ahead = [row("2026-12-05T05"), row("2096-01-01T00"), row("2026-12-05T24")]  # 1.5 h ahead, 2096, no hour
    assert ledger.merge_tokens(answer(*too_old, *ahead)) == 0
    assert ledger.merge_tokens(answer(row("2026-12-03T03"))) == 1  # 48 hours back: the meter still holds it
    assert ledger.merge_tokens(answer(row("2026-12-05T04", user="bob"))) == 1  # the hour after: clock skew
    assert not any(d > "2026-12-05" for d in ledger.days)


def test_an_answer_naming_its_own_clock_in_2096_does_not_move_the_window() -> None:
    ledger = told()
    assert ledger.merge_tokens(answer(row("2096-01-01T00"), row("2096-01-01T01"), row("2096-01-01T02"), now=Y2096)) == 0


def test_three_rows_dated_2096_do_not_make_today_final() -> None:
    """Before: three rows dated 2096 made today "final", so nobody's usage was recorded any more,
    and usage/2096-*.json documents landed on the status branch for good."""
    ledger = told()
    ledger.merge_tokens(answer(*(row(f"2096-01-0{d}T00") for d in (1, 2, 3))))
    ledger.merge_tokens(answer(row("2026-12-05T03", r=4)))
    docs = ledger.take_documents()
    assert list(docs) == ["usage/2026-12-05.json"] and docs["usage/2026-12-05.json"]["tokens"][0]["requests"] == 4
    ledger.merge_tokens(answer(row("2026-12-05T03", r=5)))
    assert list(ledger.take_documents()) == ["usage/2026-12-05.json"]  # today is still written


def test_a_future_document_on_the_branch_is_not_read_back_and_ages_nothing_out() -> None:
    """A usage/2096-*.json an older daemon wrote (or anything dated after today) is not loaded:
    neither its totals nor its place in the live window."""
    day = Day()
    day.tokens[(E1, "2096-01-01T00", "bob", "alice/models/chat")] = (10**12, 0, 0)
    future = {f"usage/2096-01-0{d}.json": json.loads(json.dumps(document(f"2096-01-0{d}", day))) for d in (1, 2, 3)}
    today = Day()
    today.tokens[(E1, "2026-12-05T02", "alice", "alice/models/chat")] = (1, 1, 1)
    ledger = Ledger()
    ledger.load({**future, "usage/2026-12-05.json": document("2026-12-05", today)}, now=T)
    assert sorted(ledger.days) == ["2026-12-05"] and ledger.totals().requests == {("alice", "alice/models/chat"): 1}
    ledger.merge_tokens(answer(row("2026-12-05T03")))
    assert list(ledger.take_documents()) == ["usage/2026-12-05.json"]


def test_negative_counts_in_documents_read_back_are_dropped() -> None:
    doc = {
        "version": 1,
        "date": "2026-12-05",
        "tokens": [
            {
                "epoch": E1,
                "hour": "2026-12-05T01",
                "user": "bob",
                "model": "alice/models/chat",
                "requests": -9,
                "prompt_tokens": 0,
                "completion_tokens": 0,
            },
        ],
        "gpu": [
            {
                "hour": "2026-12-05T01",
                "user": "bob",
                "team": "",
                "kind": "task",
                "object": "bob/tasks/t",
                "run": "r",
                "gpu_seconds": -3600.0,
            },
        ],
        "dropped": -1,
    }
    ledger = Ledger()
    ledger.load({"usage/2026-12-05.json": doc}, now=T)
    day = ledger.days["2026-12-05"]
    assert day.tokens == {} and day.gpu == {} and day.dropped == 0


def test_days_age_by_the_clock_not_by_the_newest_date_held() -> None:
    ledger = told()
    for back in (2, 1, 0):  # 03, 04, 05 December, each merged on its day
        ledger.merge_tokens(answer(row(f"2026-12-0{5 - back}T03")), now=T - back * 86400)
    ledger.tell(T)
    ledger.take_documents()
    assert sorted(ledger.days) == ["2026-12-03", "2026-12-04", "2026-12-05"]
    # The next day, the oldest is folded into totals, and only then.
    ledger.take_documents(now=T + 86400)
    assert sorted(ledger.days) == ["2026-12-04", "2026-12-05"]
    assert ledger.totals().requests == {("alice", "alice/models/chat"): 3}


def test_a_flood_of_dates_is_written_a_bounded_number_per_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    """However many dates changed (a bug, or documents an older daemon left changed), one commit
    carries at most MAX_DOCUMENTS_PER_COMMIT of them, the newest first; the rest wait."""
    monkeypatch.setattr(usage, "LIVE_DAYS", 40)  # a window wide enough for the flood to be held
    ledger = told()
    for back in range(30):
        date = usage.date_of(T - back * 86400)
        ledger.days.setdefault(date, Day()).tokens[(E1, f"{date}T03", "alice", "alice/models/chat")] = (1, 0, 0)
        ledger.dirty.add(date)
    cap = usage.MAX_DOCUMENTS_PER_COMMIT
    batches: list[list[str]] = []
    while docs := ledger.take_documents():
        assert len(docs) <= cap
        batches.append(list(docs))
    written = [path for batch in batches for path in batch]
    assert len(written) == 30 == len(set(written)) and len(batches) == math.ceil(30 / cap)
    assert "usage/2026-12-05.json" in batches[0] and "usage/2026-11-06.json" in batches[-1]


def test_a_run_started_in_1970_makes_a_bounded_number_of_documents() -> None:
    ledger = told()
    ledger.record_tasks([usage.Job("sid", "bob", "t", 8.0, 1.0, None)], {}, now=T)
    docs = ledger.take_documents()
    assert len(docs) <= usage.LIVE_DAYS and len(docs) <= usage.MAX_DOCUMENTS_PER_COMMIT
    assert sum(ledger.totals().gpu_seconds.values()) == pytest.approx(8.0 * (T - usage.live_since(T)))


# -- the recorder: the daemon's clock, whatever the meter says ------------------------------------


def test_the_recorder_bounds_a_hostile_answer_by_its_own_clock() -> None:
    doc = answer(row("2096-01-01T00"), row("2026-12-05T03", r=-1), row("2026-12-05T03"), now=Y2096)
    cluster = ClusterSpec(users={"alice": UserPolicy()})
    desired = DesiredState(cluster, models={ObjectKey("alice", "model", "chat"): None})  # type: ignore[dict-item]
    rec = UsageRecorder(lambda: json.loads(json.dumps(doc)), lambda: {}, clock=lambda: T)
    docs = rec.update(desired, ActualState())
    assert list(docs) == ["usage/2026-12-05.json"] and rec.ledger.clock == T
    assert rec.totals.requests == {("alice", "alice/models/chat"): 1}


# -- the meter and a router replica's counters ----------------------------------------------------


def test_the_meter_refuses_negative_and_malformed_deltas() -> None:
    meter = MeterState("e" * 32, T)
    answer_ = meter.sync(
        {
            "s": {"u:bob": [-1000, -(10**9)], "u:eve": ["1", 0], "u:carol": [1], 5: [1, 1], "u:alice": [2, 30]},
            "u": [
                [HOUR, "bob", APP, -5, -5, -5],
                [HOUR, "bob", APP, 1, 2],
                [HOUR, "bob", APP, True, 0, 0],
                "junk",
                [HOUR, "alice", APP, 1, 10, 5],
            ],
        },
        T,
    )
    assert set(answer_["w"]) == {"u:alice"} and answer_["w"]["u:alice"][2] == 2
    assert meter.refused_deltas == 8
    rows = meter.usage(T)["rows"]
    assert [(r["user"], r["requests"]) for r in rows] == [("alice", 1)]
    assert all(v >= 0 for w in answer_["w"].values() for v in w[1:])
    assert meter.sync("not a delta", T)["w"] == answer_["w"]  # never raises


def test_the_meter_refuses_hours_outside_its_window() -> None:
    """Rows dated 2096 (or any hour more than FUTURE_HOURS ahead, or older than KEEP_HOURS) do
    not enter the meter, so its answer never carries them."""
    meter = MeterState("e" * 32, T)
    h2096 = math.floor(Y2096 / 3600)
    meter.sync({"s": {}, "u": [[h, "bob", APP, 1, 1, 1] for h in (h2096, h2096 + 1, h2096 + 2, HOUR + 2)]}, T)
    meter.sync({"s": {}, "u": [[HOUR - KEEP_HOURS, "bob", APP, 1, 1, 1]]}, T)
    assert meter.usage(T)["rows"] == [] and meter.refused_deltas == 5
    meter.sync({"s": {}, "u": [[HOUR + 1, "bob", APP, 1, 1, 1], [HOUR - KEEP_HOURS + 1, "bob", APP, 1, 1, 1]]}, T)
    assert len(meter.usage(T)["rows"]) == 2  # the next hour (clock skew) and the oldest one kept


def test_the_meter_refuses_a_count_past_its_bound() -> None:
    meter = MeterState("e" * 32, T)
    meter.sync({"s": {"u:bob": [10**15, 0]}, "u": []}, T)
    meter.sync({"s": {"u:bob": [1, 0]}, "u": []}, T)
    assert meter.sync({"s": {}, "u": []}, T)["w"]["u:bob"][2] == 10**15 and meter.refused_deltas == 1


def test_a_replicas_counters_take_no_negative_count() -> None:
    counters = Counters()
    counters.record(T, "bob", APP, -1, -100, -7)
    counters.record(T, "bob", APP, 1, 10, 5)
    assert (counters.take() or {})["u"] == [[HOUR, "bob", APP, 1, 10, 5]]
    # A meter answer with a negative window (it would give bob room past his limit) is not adopted.
    counters.settle({"w": {"u:bob": [0, -50, -50, 0, 0], "u:alice": [1, 2, 3, 4, 5], "u:x": "junk"}})
    assert counters.windows == {"u:alice": [1, 2, 3, 4, 5]}


# -- the status writer: one commit, a bounded number of usage documents ----------------------------


def test_one_status_commit_never_carries_more_than_the_bound(tmp_path: Path) -> None:
    """Whatever a caller hands the writer (the ledger hands at most the bound), one commit carries at
    most MAX_DOCUMENTS_PER_COMMIT usage documents, the newest dates first."""
    bare = status_test_repo(tmp_path)[0]
    writer = StatusWriter(open_source(str(bare), str(tmp_path / "cache")), auth_key=status_key(b"k" * 32))
    dates = [usage.date_of(T - back * 86400) for back in range(12)]
    handed = {f"usage/{d}.json": document(d, Day()) for d in dates}
    commit = writer.write(StatusReport(None, {}, set(), set(), None, [], usage=handed))
    assert commit is not None
    files = git(bare, "ls-tree", "-r", "--name-only", commit, "usage/").split()
    assert len(files) == usage.MAX_DOCUMENTS_PER_COMMIT and f"usage/{dates[0]}.json" in files
