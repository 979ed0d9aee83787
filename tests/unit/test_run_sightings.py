"""Run records bounded by what the daemon saw (reconciler/observe/sightings.py), written as the
attacker would: any job's driver can rewrite any job's ``JobInfo`` in the GCS (status, message,
start and end times), and the ownership proof covers none of them. Each attack is one rewrite of
bob's proven job record; the daemon must bill bob only for what it saw itself, keep a final status
it saw, and say what it did not believe (the run's message and one ``run_record_disagrees`` log
line). The honest paths are checked alongside, so none of this is vacuous. Pure, with fakes: a
fake Ray dashboard (tests/unit/fake_ray.py) and a fixed clock."""

from __future__ import annotations

import calendar
import json
import logging
from typing import Any

import pytest

from reconciler.apply.jobs import submit_job
from reconciler.builders.jobs import job_submission
from reconciler.observe.observer import Observer
from reconciler.observe.runs import recorded_times
from reconciler.observe.sightings import CLOCK_SLACK_S, RunRecord, RunSightings
from reconciler.observe.usage import jobs_of
from reconciler.plan.actual import ActualJob, ActualState
from reconciler.plan.assess import ObjectStatus
from reconciler.spec.hashing import submission_id
from reconciler.spec.types import ClusterSpec, ObjectKey
from reconciler.status import usage
from reconciler.status.documents import object_document
from reconciler.status.usage import Ledger
from tests.support import task_spec
from tests.unit.fake_ray import FakeRay

T0 = float(calendar.timegm((2026, 12, 5, 3, 0, 0)))  # argus submits bob's run
KEY = b"sightings-test-ownership-key-0123456789"
BOB = task_spec("bob", "train", command="sleep 3600", gpus_per_node=2)
SID = submission_id(BOB)
TASK = ObjectKey("bob", "task", "train")


def _iso(ts: float) -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def job(status: str, start: float | None, end: float | None = None, message: str = "", **kw: Any) -> ActualJob:
    return ActualJob(
        SID,
        TASK,
        "h",
        status,
        message=message,
        resources={"GPU": 2.0},
        start_time=int(start * 1000) if start is not None else None,
        end_time=int(end * 1000) if end is not None else None,
        **kw,
    )


RECORD = {SID: RunRecord(submitted_at=T0)}


def events(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    out = []
    for r in caplog.records:
        try:
            value = json.loads(r.getMessage())
        except ValueError:
            continue
        if isinstance(value, dict) and value.get("event") == "run_record_disagrees":
            out.append(value)
    return out


def billed(jobs: list[ActualJob], now: float) -> float:
    ledger = Ledger()
    ledger.record_tasks(jobs_of(ActualState(jobs=jobs)), {}, now=now)
    return sum(ledger.totals().gpu_seconds.values())


# -- the honest run: Ray's times stand -------------------------------------------------------------


def test_an_honest_run_keeps_rays_times_and_message(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="argus")
    s = RunSightings()
    (seen,) = s.see([job("PENDING", T0 + 1)], RECORD, T0 + 2)
    assert seen.status == "PENDING" and seen.start_time == int((T0 + 1) * 1000) and seen.submitted_at == int(T0)
    (seen,) = s.see([job("RUNNING", T0 + 1)], RECORD, T0 + 5)
    assert seen.seen_running == int(T0 + 5) and seen.seen_ended is None and seen.message == ""
    s.see([job("RUNNING", T0 + 1)], RECORD, T0 + 600)
    (done,) = s.see([job("SUCCEEDED", T0 + 1, T0 + 601, message="done")], RECORD, T0 + 605)
    assert (done.status, done.message) == ("SUCCEEDED", "done")
    assert (done.start_time, done.end_time) == (int((T0 + 1) * 1000), int((T0 + 601) * 1000))
    assert done.seen_ended == int(T0 + 605) and events(caplog) == []
    assert billed([done], T0 + 3600) == pytest.approx(600 * 2.0)
    # Observed again unchanged: the same value (no document churn), nothing more billed.
    (again,) = s.see([job("SUCCEEDED", T0 + 1, T0 + 601, message="done")], RECORD, T0 + 700)
    assert again == done


# -- the attacks -----------------------------------------------------------------------------------


def test_a_start_time_of_1970_is_billed_from_argus_own_submission(caplog: pytest.LogCaptureFixture) -> None:
    """Bob's record's start_time rewritten to 1970: before, bob was billed ~1.8e9 GPU-seconds and one
    commit carried a usage document per day since 1970."""
    caplog.set_level(logging.INFO, logger="argus")
    s = RunSightings()
    s.see([job("RUNNING", T0 + 1)], RECORD, T0 + 5)
    (forged,) = s.see([job("RUNNING", 1.0)], RECORD, T0 + 3600)
    assert forged.start_time == int(T0 * 1000)  # clamped to when argus submitted it
    assert "before argus submitted it" in forged.message and "1970-01-01T00:00:01Z" in forged.message
    assert forged.status == "RUNNING"  # a time's disagreement alone does not change the status
    assert [e["field"] for e in events(caplog)] == ["start_time"]
    s.see([job("RUNNING", 1.0)], RECORD, T0 + 3605)
    assert len(events(caplog)) == 1  # logged once per run and kind, not every tick
    ledger = Ledger()
    ledger.record_tasks(jobs_of(ActualState(jobs=[forged])), {}, now=T0 + 3600)
    assert sum(ledger.totals().gpu_seconds.values()) == pytest.approx(3600 * 2.0)
    docs = ledger.take_documents()
    assert list(docs) == ["usage/2026-12-05.json"]


def test_the_submission_bound_holds_after_the_task_and_its_record_are_gone() -> None:
    """Bob deletes his task to stop it: its status document (the run's record) goes, Ray still lists
    the stopping run with its forged 1970 start. The bound this daemon read stays."""
    s = RunSightings()
    s.see([job("RUNNING", T0 + 1)], RECORD, T0 + 5)
    (gone,) = s.see([job("STOPPED", 1.0, T0 + 600)], {}, T0 + 601)  # no record any more
    assert gone.start_time == int(T0 * 1000)
    assert billed([gone], T0 + 700) <= 601 * 2.0


def test_a_start_after_argus_saw_it_running_is_not_believed(caplog: pytest.LogCaptureFixture) -> None:
    """The other way round: bob rewrites his own record's start to now, to be billed nothing."""
    caplog.set_level(logging.INFO, logger="argus")
    s = RunSightings()
    s.see([job("RUNNING", T0 + 1)], RECORD, T0 + 5)
    (forged,) = s.see([job("RUNNING", T0 + 3000)], RECORD, T0 + 3600)
    assert forged.start_time == int((T0 + 5) * 1000) and "after argus saw it" in forged.message
    assert billed([forged], T0 + 3600) == pytest.approx((3600 - 5) * 2.0)


def test_an_end_time_in_2096_is_billed_to_when_argus_saw_it_end(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="argus")
    s = RunSightings()
    s.see([job("RUNNING", T0 + 1)], RECORD, T0 + 5)
    s.see([job("RUNNING", T0 + 1)], RECORD, T0 + 600)
    y2096 = float(calendar.timegm((2096, 1, 1, 0, 0, 0)))
    (forged,) = s.see([job("SUCCEEDED", T0 + 1, y2096)], RECORD, T0 + 605)
    assert forged.end_time == int((T0 + 605) * 1000) and "2096-01-01T00:00:00Z" in forged.message
    assert forged.status == "SUCCEEDED"  # it did end, by argus's own sighting
    assert [e["field"] for e in events(caplog)] == ["end_time"]
    assert billed([forged], T0 + 3600) == pytest.approx(604 * 2.0)


def test_a_succeeded_written_while_argus_saw_it_running_is_not_believed(caplog: pytest.LogCaptureFixture) -> None:
    """A job rewrites bob's running run to SUCCEEDED, ended an hour ago (before argus last saw it
    running): not a success argus saw, so it is FAILED with why, no checkpoint is served from it,
    and it is billed up to argus's last sighting, not Ray's end."""
    caplog.set_level(logging.INFO, logger="argus")
    s = RunSightings()
    s.see([job("RUNNING", T0 + 1)], RECORD, T0 + 5)
    s.see([job("RUNNING", T0 + 1)], RECORD, T0 + 7200)
    (forged,) = s.see(
        [job("SUCCEEDED", T0 + 1, T0 + 3600, message="all good", hf_checkpoint="/u/bob/x")], RECORD, T0 + 7205
    )
    assert forged.status == "FAILED" and forged.hf_checkpoint is None
    assert "argus saw it running at 2026-12-05T05:00:00Z" in forged.message and "'all good'" in forged.message
    assert forged.end_time == int((T0 + 7200) * 1000)
    assert billed([forged], T0 + 8000) == pytest.approx((7200 - 1) * 2.0)
    assert [e["field"] for e in events(caplog)] == ["end_time"]


def test_a_run_argus_saw_end_keeps_its_status_whatever_ray_says_later(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="argus")
    s = RunSightings()
    s.see([job("RUNNING", T0 + 1)], RECORD, T0 + 5)
    (done,) = s.see([job("SUCCEEDED", T0 + 1, T0 + 100)], RECORD, T0 + 105)
    # Rewritten to FAILED afterwards, then back to RUNNING with no end: argus saw it succeed.
    for status in ("FAILED", "RUNNING"):
        (later,) = s.see([job(status, T0 + 1, T0 + 100 if status == "FAILED" else None)], RECORD, T0 + 500)
        assert later.status == "SUCCEEDED" and f"now says {status}" in later.message
        assert later.end_time == done.end_time and billed([later], T0 + 5000) == billed([done], T0 + 5000)
    assert [e["field"] for e in events(caplog)] == ["status"]  # one line for the run's status


def test_memory_is_bounded_by_rays_list() -> None:
    s = RunSightings()
    s.see([job("RUNNING", T0 + 1)], RECORD, T0 + 5)
    assert s.size() == 1
    s.see([], RECORD, T0 + 10)  # Ray forgot it: its run record on the status branch stands
    assert s.size() == 0


def test_a_run_recorded_before_submitted_at_existed_is_not_reported() -> None:
    """Runs recorded by an older daemon carry no submission time: nothing to disagree with (the
    ledger's own window still bounds what is billed)."""
    (seen,) = RunSightings().see([job("RUNNING", T0 - 7200)], {}, T0)
    assert seen.start_time == int((T0 - 7200) * 1000) and seen.message == ""


def test_a_restarted_daemon_bounds_by_the_record() -> None:
    """The first sightings are kept in the run record (transition times, written with the status
    change they come with); a restarted daemon bounds Ray's record by them."""
    s = RunSightings()
    s.see([job("RUNNING", T0 + 1)], RECORD, T0 + 5)
    (done,) = s.see([job("SUCCEEDED", T0 + 1, T0 + 100)], RECORD, T0 + 105)
    st = ObjectStatus(TASK, "SUCCEEDED", "Synced", submission_id=SID, runs=(done,))
    recorded = {"object": str(TASK), "runs": [{"submission_id": SID, "status": "SUBMITTED", "submitted_at": _iso(T0)}]}
    kw: dict[str, Any] = {"revision": "r", "applied": True, "now": "x", "endpoint": "", "log_tails": {}}
    doc = object_document(st, recorded, checkpoints={}, **kw)
    (run,) = doc["runs"]
    assert (run["submitted_at"], run["seen_running"], run["seen_ended"]) == (
        _iso(T0),
        _iso(T0 + 5),
        _iso(T0 + 105),
    )
    times = recorded_times({TASK.path: doc})
    assert times == {SID: RunRecord(T0, T0 + 5, T0 + 105, "SUCCEEDED", end_time=T0 + 100)}
    # The restarted daemon, then a rewrite of the record to end in 2096 and FAILED.
    fresh = RunSightings()
    (after,) = fresh.see([job("FAILED", 1.0, 4e9)], times, T0 + 9000)
    assert after.status == "SUCCEEDED" and after.start_time == int(T0 * 1000)
    assert after.end_time == int((T0 + 100) * 1000)  # the end argus believed when it saw it end
    # And the document rebuilt from it keeps the same first sightings (no churn of them).
    again = object_document(
        ObjectStatus(TASK, "SUCCEEDED", "Synced", submission_id=SID, runs=(after,)), doc, checkpoints={}, **kw
    )
    assert again["runs"][0]["seen_ended"] == _iso(T0 + 105)


def test_a_short_run_is_billed_its_exact_time_before_and_after_a_restart() -> None:
    """Ray's times are milliseconds, and so are the sightings that bound them: a run that ends
    between two whole seconds is billed Ray's end minus Ray's start, by the daemon that saw it and
    by one restarted from its record. (Sightings kept to the second cut up to a second off: CI saw
    a 1.578 s run billed 1.467 s.)"""
    start, end, seen_end = T0 + 1.234, T0 + 2.812, T0 + 2.901
    s = RunSightings()
    s.see([job("RUNNING", start)], RECORD, T0 + 1.5)
    (done,) = s.see([job("SUCCEEDED", start, end)], RECORD, seen_end)
    assert done.seen_ended == pytest.approx(seen_end)
    assert billed([done], T0 + 3600) == pytest.approx((end - start) * 2.0, abs=0.002)
    st = ObjectStatus(TASK, "SUCCEEDED", "Synced", submission_id=SID, runs=(done,))
    recorded = {"object": str(TASK), "runs": [{"submission_id": SID, "status": "SUBMITTED", "submitted_at": _iso(T0)}]}
    kw: dict[str, Any] = {"revision": "r", "applied": True, "now": "x", "endpoint": "", "log_tails": {}}
    doc = object_document(st, recorded, checkpoints={}, **kw)
    (run,) = doc["runs"]
    assert run["submitted_at"] == _iso(T0)  # a whole second stays written as one
    assert run["seen_ended"] == _iso(T0 + 2)[:-1] + ".901Z"
    (after,) = RunSightings().see([job("SUCCEEDED", start, end)], recorded_times({TASK.path: doc}), T0 + 60)
    assert billed([after], T0 + 3600) == pytest.approx((end - start) * 2.0, abs=0.002)


# -- through the observer, with a fake Ray -----------------------------------------------------------


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_the_observer_bounds_a_rewritten_record_and_the_bill_follows(caplog: pytest.LogCaptureFixture) -> None:
    """The whole way: argus submits bob's run (recorded with its submission time), sees it run,
    then a job rewrites bob's record (start 1970, SUCCEEDED an hour before argus last saw it
    running). The observer's jobs are what the tick plans with and the usage recorder bills."""
    caplog.set_level(logging.INFO, logger="argus")
    ray = FakeRay(gpus=8)
    sid = submit_job(ray, job_submission(BOB, ClusterSpec(), revision="r", secrets_env={}, ownership_key=KEY))
    docs = {
        TASK.path: {
            "object": str(TASK),
            "runs": [{"submission_id": sid, "status": "SUBMITTED", "submitted_at": _iso(T0)}],
        }
    }
    observer = Observer(ray, KEY)
    observer.clock = clock = Clock(T0 + 2)
    ray.jobs[sid].update(status="RUNNING", start_time=int((T0 + 1) * 1000))
    (seen,) = observer.observe(docs).jobs
    assert seen.status == "RUNNING" and seen.message == "" and seen.seen_running == int(T0 + 2)
    clock.now = T0 + 7200
    observer.observe(docs)
    ray.jobs[sid].update(status="SUCCEEDED", start_time=1000, end_time=int((T0 + 3600) * 1000), message="ok")
    clock.now = T0 + 7205
    (forged,) = observer.observe(docs).jobs
    assert forged.status == "FAILED" and forged.start_time == int(T0 * 1000)
    assert "before argus submitted it" in forged.message and "argus saw it running" in forged.message
    assert observer.memo_sizes()["sightings"] == 1
    assert billed([forged], T0 + 8000) == pytest.approx(7200 * 2.0)  # bob ran two hours on 2 GPUs
    assert {e["field"] for e in events(caplog)} == {"start_time", "end_time"}


def test_the_observer_believes_an_honest_record() -> None:
    ray = FakeRay(gpus=8)
    sid = submit_job(ray, job_submission(BOB, ClusterSpec(), revision="r", secrets_env={}, ownership_key=KEY))
    docs = {
        TASK.path: {
            "object": str(TASK),
            "runs": [{"submission_id": sid, "status": "SUBMITTED", "submitted_at": _iso(T0)}],
        }
    }
    observer = Observer(ray, KEY)
    observer.clock = clock = Clock(T0 + 2)
    ray.jobs[sid].update(status="RUNNING", start_time=int((T0 + 1) * 1000))
    observer.observe(docs)
    ray.jobs[sid].update(status="SUCCEEDED", end_time=int((T0 + 100.5) * 1000), message="done")
    clock.now = T0 + 100.5 + CLOCK_SLACK_S / 2  # a sighting a little after the end
    (done,) = observer.observe(docs).jobs
    assert (done.status, done.message, done.end_time) == ("SUCCEEDED", "done", int((T0 + 100.5) * 1000))
    assert billed([done], T0 + 3600) == pytest.approx(99.5 * 2.0)


def test_the_ledger_alone_never_bills_before_its_live_window() -> None:
    """A record nobody bounded (a one-off reconcile's, or a run recorded before submission times
    were): a start in 1970 is counted from the oldest live day at most, never a day per date."""
    ledger = Ledger()
    j = ActualJob(SID, TASK, "h", "RUNNING", resources={"GPU": 1.0}, start_time=1000)
    ledger.record_tasks(jobs_of(ActualState(jobs=[j])), {}, now=T0)
    docs = ledger.take_documents()
    assert len(docs) <= usage.LIVE_DAYS
    assert sum(ledger.totals().gpu_seconds.values()) == pytest.approx(T0 - usage.live_since(T0))
