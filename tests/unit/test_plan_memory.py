"""The admission order between ticks (reconciler/plan/memory.py) against a plain per-object model
of it, and the plan's indexes (reconciler/plan/actions.py) against scans."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.plan.actions import Action, ActionType, Plan
from reconciler.plan.memory import AdmissionOrder, key_of_path
from reconciler.spec.types import ObjectKey

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
