"""The reporter follows what moved: after any sequence of ticks its resolved specs equal resolving
every spec again and its object counts equal counting every status again, whether a mapping is a
new one, the same one changed in place, or ``cluster.yaml`` changed. Pure (no Ray: the reporter's
passes only)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.builders.resolved import resolved_spec
from reconciler.plan.assess import ObjectStatus
from reconciler.report import Reporter
from reconciler.server import Metrics
from reconciler.spec.types import ClusterSpec, DesiredState, ObjectKey, TaskSpec
from tests.support import task_spec

KEYS = [ObjectKey(u, "task", n) for u in ("alice", "bob") for n in ("a", "b", "c")]
STATES = ("RUNNING", "QUEUED", "SUSPENDED")
# One value per (object, variant): an unchanged spec or status is the very value handed on.
SPECS: dict[tuple[ObjectKey, int], TaskSpec] = {
    (k, v): task_spec(k.user, k.name, command=f"echo {v}") for k in KEYS for v in range(3)
}
STATUSES = {(k, s): ObjectStatus(k, s, "Synced") for k in KEYS for s in STATES}
CLUSTERS = [ClusterSpec(), ClusterSpec()]

tick = st.tuples(
    st.dictionaries(st.sampled_from(KEYS), st.tuples(st.integers(0, 2), st.sampled_from(STATES))),
    st.integers(0, 1),  # which cluster.yaml
    st.booleans(),  # hand the same mappings again, changed in place
)


class _Metrics(Metrics):
    counts: dict[tuple[str, str], int]

    def set_objects(self, by_kind_state: Any) -> None:
        self.counts = dict(by_kind_state)


@settings(max_examples=60, deadline=None)
@given(ticks=st.lists(tick, min_size=1, max_size=8))
def test_resolved_specs_and_counts_follow_what_moved(ticks: list[tuple[Any, int, bool]]) -> None:
    metrics = _Metrics()
    reporter = Reporter(None, None, metrics)  # type: ignore[arg-type]
    tasks: dict[ObjectKey, TaskSpec] = {}
    statuses: dict[ObjectKey, ObjectStatus] = {}
    for objects, cluster_at, in_place in ticks:
        new_tasks = {k: SPECS[(k, v)] for k, (v, _s) in objects.items()}
        new_statuses = {k: STATUSES[(k, s)] for k, (_v, s) in objects.items()}
        if in_place:
            tasks.clear()
            tasks.update(new_tasks)
            statuses.clear()
            statuses.update(new_statuses)
        else:
            tasks, statuses = new_tasks, new_statuses
        cluster = CLUSTERS[cluster_at]
        result: Any = SimpleNamespace(
            desired=DesiredState(cluster=cluster, tasks=tasks), statuses=statuses, failures={}, commit_time=0
        )
        resolved = reporter._resolve(result)
        assert resolved == {k.path: resolved_spec(s, cluster) for k, s in tasks.items()}
        reporter._count(result)
        full: dict[tuple[str, str], int] = {}
        for status in statuses.values():
            full[(status.key.kind, status.state)] = full.get((status.key.kind, status.state), 0) + 1
        assert metrics.counts == full


def test_a_report_knows_the_runs_recorded_when_its_tick_ended() -> None:
    """The background writer may write a report after the next tick recorded runs: the report
    carries the record count of its own tick's end, so that writer keeps those records
    (StatusReport.records_seen; the writer's side: tests/unit/test_runs_record.py)."""
    from reconciler.plan.actions import Plan
    from reconciler.plan.actual import ActualState

    written: list[Any] = []
    writer: Any = SimpleNamespace(records=3, write=lambda report: written.append(report))
    reporter = Reporter(None, writer, _Metrics())  # type: ignore[arg-type]
    held: list[Any] = []
    reporter._submit = held.append  # type: ignore[method-assign,assignment]  # the background writer, busy
    empty: dict[str, Any] = {"statuses": {}, "applied": set(), "failures": {}, "notes": [], "spec_ids": {}}
    result: Any = SimpleNamespace(
        revision="a" * 40, desired=DesiredState(cluster=ClusterSpec()), plan=Plan(), actual=ActualState(), subject="",
        commit_time=0, **empty,
    )  # fmt: skip
    reporter.report(result)
    writer.records = 4  # the next tick records a run before the writer gets to this report
    held[0]()
    assert [r.records_seen for r in written] == [3]


def test_a_report_carries_the_usage_documents_that_changed() -> None:
    """The reporter asks the usage recorder (reconciler/observe/usage.py) off the tick's path; a
    recorder that fails costs the usage documents of that report, never the status commit."""
    from reconciler.plan.actions import Plan
    from reconciler.plan.actual import ActualState

    doc = {"version": 1, "date": "2026-12-05", "tokens": [], "gpu": [], "dropped": 0}
    recorder: Any = SimpleNamespace(update=lambda desired, actual: {"usage/2026-12-05.json": doc})
    written: list[Any] = []
    writer: Any = SimpleNamespace(records=0, write=lambda report: written.append(report))
    reporter = Reporter(None, writer, _Metrics(), usage=recorder)  # type: ignore[arg-type]
    empty: dict[str, Any] = {"statuses": {}, "applied": set(), "failures": {}, "notes": [], "spec_ids": {}}
    result: Any = SimpleNamespace(
        revision="a" * 40, desired=DesiredState(cluster=ClusterSpec()), plan=Plan(), actual=ActualState(), subject="",
        commit_time=0, **empty,
    )  # fmt: skip
    reporter.report(result)
    assert written[-1].usage == {"usage/2026-12-05.json": doc}

    def broken(desired: Any, actual: Any) -> Any:
        raise RuntimeError("boom")

    recorder.update = broken
    reporter.report(result)
    assert written[-1].usage == {} and len(written) == 2
