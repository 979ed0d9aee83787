"""The usage ledger (reconciler/status/usage.py): hour splitting, idempotent merging of the
router's cumulative rows per meter epoch, GPU-seconds of task runs (recomputed, never added
twice) and of model replicas (sampled, capped), documents, bounds and a restart. Pure."""

from __future__ import annotations

import calendar
import json

import pytest

from reconciler.status import usage
from reconciler.status.usage import Day, Job, Ledger, Replicas, document, parse_document, split_hours

T = float(calendar.timegm((2026, 12, 5, 3, 0, 0)))  # 2026-12-05T03:00:00Z
E1, E2 = "a" * 32, "b" * 32


def told(now: float = T) -> Ledger:
    """A ledger told the daemon's clock: every bound in time counts from it."""
    ledger = Ledger()
    ledger.tell(now)
    return ledger


def answer(epoch: str, *rows: tuple[str, str, str, int, int, int]) -> dict[str, object]:
    return {
        "epoch": epoch,
        "now": T,
        "rows": [
            {"hour": h, "user": u, "app": a, "requests": r, "prompt_tokens": p, "completion_tokens": c}
            for h, u, a, r, p, c in rows
        ],
    }


def test_split_hours() -> None:
    assert split_hours(T - 600, T + 1200) == {"2026-12-05T02": 600.0, "2026-12-05T03": 1200.0}
    assert split_hours(T, T) == {} and split_hours(T, T - 5) == {}
    # Across midnight: two dates.
    midnight = T - 3 * 3600
    assert split_hours(midnight - 1800, midnight + 60) == {"2026-12-04T23": 1800.0, "2026-12-05T00": 60.0}


def test_model_object_of_app_names() -> None:
    assert usage.model_object("argus--alice--chat") == "alice/models/chat"
    for bad in ("argus-router", "argus--alice", "argus--a--b--c", "argus--Alice--chat", "foreign", "argus--al/ice--x"):
        assert usage.model_object(bad) is None, bad


def test_tokens_merge_is_idempotent_per_epoch() -> None:
    ledger = told()
    first = answer(E1, ("2026-12-05T03", "alice", "argus--alice--chat", 3, 31, 24))
    assert ledger.merge_tokens(first) == 1
    assert ledger.merge_tokens(first) == 0  # the same answer again: nothing changes
    later = answer(E1, ("2026-12-05T03", "alice", "argus--alice--chat", 5, 50, 40))
    assert ledger.merge_tokens(later) == 1
    t = ledger.totals()
    assert (t.requests, t.prompt_tokens) == ({("alice", "alice/models/chat"): 5}, {("alice", "alice/models/chat"): 50})
    # The meter restarted (a new epoch): its counts add to the old epoch's.
    ledger.merge_tokens(answer(E2, ("2026-12-05T03", "alice", "argus--alice--chat", 1, 7, 2)))
    assert ledger.totals().requests == {("alice", "alice/models/chat"): 6}
    assert ledger.totals().completion_tokens == {("alice", "alice/models/chat"): 42}


def test_malformed_answers_and_rows_are_ignored() -> None:
    ledger = told()
    for bad in (None, [], {"epoch": "zz", "rows": []}, {"epoch": E1, "rows": "x"}):
        assert ledger.merge_tokens(bad) == 0
    rows = [
        ("2026-12-05T03", "Alice", "argus--alice--chat", 1, 1, 1),  # not a user name
        ("2026-12-05T3", "alice", "argus--alice--chat", 1, 1, 1),  # not an hour
        ("2026-12-05T03", "alice", "someone-elses-app", 1, 1, 1),  # not an argus model
        ("2026-12-05T03", "alice", "argus--alice--chat", -1, 1, 1),  # negative
        ("2026-12-05T03", "alice", "argus--alice--chat", True, 1, 1),  # not a count
    ]
    assert ledger.merge_tokens(answer(E1, *rows)) == 0
    assert ledger.merge_tokens(answer(E1, ("2026-12-05T03", "(open)", "argus--alice--chat", 1, 2, 3))) == 1


def test_task_gpu_seconds_are_recomputed_not_added() -> None:
    ledger = told()
    running = Job("argus--alice--train--1", "alice", "train", 2.0, T - 1800, None)
    ledger.record_tasks([running], {"alice": "vision"}, now=T + 600)
    expected = {("alice", "vision", "task"): 2.0 * 2400}
    assert ledger.totals().gpu_seconds == expected
    ledger.record_tasks([running], {"alice": "vision"}, now=T + 600)  # the same records again
    assert ledger.totals().gpu_seconds == expected
    ended = Job("argus--alice--train--1", "alice", "train", 2.0, T - 1800, T + 900)
    ledger.record_tasks([ended], {"alice": "vision"}, now=T + 3000)
    assert ledger.totals().gpu_seconds == {("alice", "vision", "task"): 2.0 * 2700}
    day = ledger.days["2026-12-05"]
    hours = {k[0]: v for k, v in day.gpu.items()}
    assert hours == {"2026-12-05T02": 3600.0, "2026-12-05T03": 1800.0}
    # A job without GPUs or not started counts nothing.
    ledger.record_tasks([Job("x", "bob", "t", 0, T, None), Job("y", "bob", "t", 1, None, None)], {}, now=T + 5)
    assert ("bob", "", "task") not in ledger.totals().gpu_seconds


def test_a_user_moving_team_does_not_double_a_run() -> None:
    ledger = told()
    job = Job("sid", "alice", "train", 1.0, T, T + 100)
    ledger.record_tasks([job], {"alice": "vision"}, now=T + 200)
    ledger.record_tasks([job], {"alice": "nlp"}, now=T + 200)
    assert ledger.totals().gpu_seconds == {("alice", "nlp", "task"): 100.0}


def test_model_samples_add_and_are_capped() -> None:
    ledger = told()
    chat = [Replicas("alice", "chat", 2, 1.0)]
    assert ledger.sample_models(chat, {}, now=T, cap=120) == 0  # the first sample: no elapsed time yet
    ledger.sample_models(chat, {}, now=T + 10, cap=120)
    assert ledger.totals().gpu_seconds == {("alice", "", "model"): 20.0}
    # A daemon stall of an hour counts at most the cap: no invented usage.
    ledger.sample_models(chat, {}, now=T + 10 + 3600, cap=120)
    assert ledger.totals().gpu_seconds == {("alice", "", "model"): 20.0 + 240.0}


def test_documents_only_for_changed_dates_and_a_restart_continues() -> None:
    ledger = told()
    ledger.merge_tokens(answer(E1, ("2026-12-05T03", "alice", "argus--alice--chat", 3, 31, 24)))
    ledger.record_tasks([Job("sid", "alice", "train", 1.0, T - 60, T)], {}, now=T)
    docs = ledger.take_documents()
    assert sorted(docs) == ["usage/2026-12-05.json"]
    assert ledger.take_documents() == {}  # nothing changed since
    ledger.merge_tokens(answer(E1, ("2026-12-05T03", "alice", "argus--alice--chat", 3, 31, 24)))
    assert ledger.take_documents() == {}  # the same values: no document
    # A restarted daemon reads the documents back: the same answer and records change nothing.
    written = {p: json.loads(json.dumps(d)) for p, d in docs.items()}
    again = told()
    again.load(written)
    before = again.totals()
    again.merge_tokens(answer(E1, ("2026-12-05T03", "alice", "argus--alice--chat", 3, 31, 24)))
    again.record_tasks([Job("sid", "alice", "train", 1.0, T - 60, T)], {}, now=T + 5)
    assert again.take_documents() == {} and again.totals() == before
    assert before.requests == {("alice", "alice/models/chat"): 3} and before.gpu_seconds == {
        ("alice", "", "task"): 60.0
    }


def test_a_document_round_trips_and_forged_rows_are_dropped() -> None:
    day = Day()
    day.tokens[(E1, "2026-12-05T03", "alice", "alice/models/chat")] = (1, 2, 3)
    day.gpu[("2026-12-05T03", "alice", "vision", "task", "alice/tasks/train", "sid")] = 12.5
    doc = document("2026-12-05", day)
    assert parse_document(json.loads(json.dumps(doc))) == ("2026-12-05", day)
    doc["tokens"].append({**doc["tokens"][0], "hour": "2026-12-06T01"})  # another date's hour
    doc["gpu"].append({**doc["gpu"][0], "object": "../../etc"})
    doc["gpu"].append({**doc["gpu"][0], "gpu_seconds": float("inf")})
    assert parse_document(doc) == ("2026-12-05", day)
    assert parse_document({"date": "yesterday"}) is None and parse_document([]) is None
    ledger = told()
    ledger.load({"usage/2026-12-04.json": doc})  # a path that is not its date's: not read
    assert ledger.days == {}


def test_documents_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(usage, "MAX_ROWS", 5)
    ledger = told()
    rows = [("2026-12-05T03", f"u{i}", "argus--alice--chat", i + 1, 1, 1) for i in range(8)]
    ledger.merge_tokens(answer(E1, *rows))
    doc = ledger.take_documents()["usage/2026-12-05.json"]
    assert len(doc["tokens"]) == 5 and doc["dropped"] == 3
    assert {r["user"] for r in doc["tokens"]} == {"u3", "u4", "u5", "u6", "u7"}  # the largest kept


def test_old_days_become_totals_and_are_never_rewritten() -> None:
    ledger = told()
    for d in range(1, 6):  # one answer a day, each read on its day
        at = T + (d - 5) * 86400
        ledger.merge_tokens(answer(E1, (f"2026-12-0{d}T03", "alice", "argus--alice--chat", d, 0, 0)), now=at)
    docs = ledger.take_documents()
    assert len(docs) == 5 and sorted(ledger.days) == ["2026-12-03", "2026-12-04", "2026-12-05"]
    assert ledger.totals().requests == {("alice", "alice/models/chat"): 15}
    # An answer about a folded day changes nothing (its document is not rewritten from scratch).
    assert ledger.merge_tokens(answer(E1, ("2026-12-01T03", "alice", "argus--alice--chat", 9, 0, 0))) == 0
    assert ledger.take_documents() == {}


def test_the_daemons_probes_and_model_samples_are_written_lazily() -> None:
    """An idle cluster makes no commit: the daemon's probe counts (they change every tick) travel
    only with another change, and model samples only when the caller asks for them."""
    ledger = told()
    assert ledger.merge_tokens(answer(E1, ("2026-12-05T03", "(daemon)", "argus--alice--chat", 9, 9, 9))) == 1
    assert ledger.take_documents() == {}
    chat = [Replicas("alice", "chat", 1, 1.0)]
    ledger.sample_models(chat, {}, now=T, cap=120)
    ledger.sample_models(chat, {}, now=T + 10, cap=120)
    assert ledger.take_documents(samples=False) == {}
    doc = ledger.take_documents(samples=True)["usage/2026-12-05.json"]
    assert doc["gpu"][0]["gpu_seconds"] == 10.0 and doc["tokens"][0]["user"] == "(daemon)"  # along with it
    assert ledger.take_documents(samples=True) == {}
    assert ledger.totals().requests == {("(daemon)", "alice/models/chat"): 9}  # counted all along
