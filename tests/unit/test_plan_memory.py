"""The admission order between ticks (reconciler/plan/memory.py) against a plain per-object model
of it and, followed through its change feed, against itself placed from every object; the plan's
indexes (reconciler/plan/actions.py) against scans."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.plan.actions import Action, ActionType, Plan
from reconciler.plan.memory import AdmissionOrder, key_of_path
from reconciler.plan.planner import admission_times
from reconciler.spec.types import ClusterSpec, DesiredState, ObjectKey

USERS = ["a", "b", "users", "x.yaml"]
NAMES = ["m", "t", "n.yaml", ""]
KEYS = [ObjectKey(u, k, n) for u in USERS for k in ("model", "task") for n in NAMES]  # type: ignore[arg-type]


def test_key_of_path_inverts_the_key_s_path() -> None:
    for key in KEYS:
        assert key_of_path(key.path) == key
    for path in (
        "cluster.yaml",
        "users/a/models/m.yml",
        "users/a/jobs/m.yaml",
        "users/a/models/x/m.yaml",
        "x/a/models/m.yaml",
    ):
        assert key_of_path(path) is None


class _Reference:
    """The order as it was first written: per object, blobs by object key."""

    def __init__(self) -> None:
        self.first_seen: dict[ObjectKey, int] = {}
        self.seen_blob: dict[ObjectKey, str] = {}

    def seed(self, recorded: dict[ObjectKey, int], blobs: dict[ObjectKey, str]) -> None:
        self.first_seen = {**recorded, **self.first_seen}
        self.seen_blob = {**blobs, **self.seen_blob}

    def for_files(self, spec_ids: dict[str, str]) -> None:
        edited = {
            k
            for k in self.first_seen
            if k.path in spec_ids and self.seen_blob.get(k, spec_ids[k.path]) != spec_ids[k.path]
        }
        self.first_seen = {k: v for k, v in self.first_seen.items() if k not in edited}
        self.seen_blob = {k: v for k, v in self.seen_blob.items() if k not in edited}

    def after(self, planned: dict[ObjectKey, int], spec_ids: dict[str, str]) -> None:
        blobs = {k: b for k, b in self.seen_blob.items() if k in planned}
        for key in planned:
            if key not in self.first_seen and key.path in spec_ids:
                blobs[key] = spec_ids[key.path]
        self.first_seen, self.seen_blob = dict(planned), blobs


keys = st.sampled_from(KEYS)
blobs = st.sampled_from(["b1", "b2", "b3"])
trees = st.dictionaries(keys, blobs, max_size=12)
ticks = st.lists(st.tuples(trees, st.dictionaries(keys, st.integers(0, 5), max_size=12)), max_size=8)


@settings(max_examples=300, deadline=None)
@given(
    recorded=st.dictionaries(keys, st.integers(0, 5), max_size=8),
    recorded_blobs=st.dictionaries(keys, blobs, max_size=8),
    ticks=ticks,
)
def test_the_order_places_objects_as_the_per_object_rules_do(
    recorded: dict[ObjectKey, int],
    recorded_blobs: dict[ObjectKey, str],
    ticks: list[tuple[dict[ObjectKey, str], dict[ObjectKey, int]]],
) -> None:
    """After any seeding and any trees and plans, the order has the same first sightings as the
    per-object rules give, and decides the same edits (whatever it keeps of blobs)."""
    order, ref = AdmissionOrder().seed(recorded, recorded_blobs), _Reference()
    ref.seed(recorded, recorded_blobs)
    for tree, planned_times in ticks:
        spec_ids = {k.path: b for k, b in tree.items()}
        # A plan places every object of the tree, at its recorded time or the planner's "now".
        order, _ = order.for_files(spec_ids), ref.for_files(spec_ids)
        assert dict(order.first_seen) == ref.first_seen
        planned = {k: order.first_seen.get(k, planned_times.get(k, 99)) for k in tree}
        order, _ = order.after(planned, spec_ids), ref.after(planned, spec_ids)
        assert dict(order.first_seen) == ref.first_seen
        expected = {k.path: b for k, b in ref.seen_blob.items() if k in ref.first_seen}
        assert dict(order.seen_blob) == expected


# A revision: each object's file blob and whether it loads (else it is invalid), and the clock.
revisions = st.lists(
    st.tuples(st.dictionaries(keys, st.tuples(blobs, st.booleans()), max_size=12), st.integers(100, 105)),
    min_size=1,
    max_size=8,
)


def _desired(objects: dict[ObjectKey, tuple[str, bool]]) -> DesiredState:
    """The desired state of a revision: one spec value per (object, blob), made at its blob's time."""
    desired = DesiredState(cluster=ClusterSpec())
    for key, (blob, valid) in objects.items():
        if not valid:
            desired.invalid[key] = []
        elif key.kind == "model":
            desired.models[key] = _SPECS.setdefault((key, blob), SimpleNamespace(created_at=int(blob[1:])))
        else:
            desired.tasks[key] = _SPECS.setdefault((key, blob), SimpleNamespace(created_at=int(blob[1:])))
    return desired


_SPECS: dict[tuple[ObjectKey, str], Any] = {}


@settings(max_examples=300, deadline=None)
@given(
    recorded=st.dictionaries(keys, st.integers(0, 5), max_size=8),
    recorded_blobs=st.dictionaries(keys, blobs, max_size=8),
    revisions=revisions,
    broken=st.integers(1, 9),
)
def test_the_order_placed_from_its_change_feed_equals_one_placed_from_everything(
    recorded: dict[ObjectKey, int],
    recorded_blobs: dict[ObjectKey, str],
    revisions: list[tuple[dict[ObjectKey, tuple[str, bool]], int]],
    broken: int,
) -> None:
    """After any revisions (files added, edited, removed, made invalid and valid again), an order
    that follows each revision's change feed (only the objects that moved are placed again) holds
    what an order placed from every object holds, and the plan's admission times are the same.
    Revision ``broken`` is read but never placed (its tick failed): the next one, whose feed is
    relative to it, places everything."""
    full = fed = AdmissionOrder().seed(recorded, recorded_blobs)
    last: dict[ObjectKey, tuple[str, bool]] = {}
    for n, (objects, now) in enumerate(revisions, start=1):
        spec_ids = {k.path: b for k, (b, _valid) in objects.items()}
        desired = _desired(objects)
        moved = {k for k in objects.keys() | last.keys() if objects.get(k) != last.get(k)}
        paths = {k.path for k in objects.keys() | last.keys() if objects.get(k, ("",))[0] != last.get(k, ("",))[0]}
        last = objects
        if n == broken:  # read, then the tick failed: the orders were not placed after it
            continue
        feed = fed.feed(n, f"c{n}", (n - 1, moved), (f"c{n - 1}", paths))
        full = full.for_files(spec_ids)
        fed = fed.for_files(spec_ids, feed)
        assert dict(fed.first_seen) == dict(full.first_seen)
        times = admission_times(desired, full.first_seen, now)
        assert admission_times(desired, fed.first_seen, now, feed) == times
        full = full.after(times, spec_ids)
        fed = fed.after(times, spec_ids, feed, serial=n, commit=f"c{n}")
        assert (dict(fed.first_seen), dict(fed.seen_blob)) == (dict(full.first_seen), dict(full.seen_blob))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(list(ActionType)), keys), max_size=30))
def test_the_plan_s_lookups_equal_scans(pairs: list[tuple[ActionType, ObjectKey]]) -> None:
    plan = Plan([Action(t, k, "r") for t, k in pairs])
    for types in [(t,) for t in ActionType] + [(ActionType.KEEP, ActionType.SUBMIT_TASK), tuple(ActionType)]:
        assert plan.of(*types) == [a for a in plan.actions if a.type in types]
    for key in KEYS:
        assert plan.for_key(key) == [a for a in plan.actions if a.key == key]
    assert plan.has_changes == any(a.type is not ActionType.KEEP for a in plan.actions)
    plan.actions = plan.actions[: len(plan.actions) // 2]  # a new list of actions: looked up anew
    assert plan.of(ActionType.KEEP) == [a for a in plan.actions if a.type is ActionType.KEEP]
    assert plan.has_changes == any(a.type is not ActionType.KEEP for a in plan.actions)
    for key in KEYS:
        assert plan.for_key(key) == [a for a in plan.actions if a.key == key]
