"""Field-level diffs, and the states the new actions lead to (STOPPED, UNSCHEDULABLE, Held)."""

from __future__ import annotations

from dataclasses import replace

from reconciler.plan.actions import Action, ActionType, Plan
from reconciler.plan.actual import ActualModel, ActualState, Capacity
from reconciler.plan.admission import unschedulable
from reconciler.plan.assess import assess
from reconciler.plan.diff import MAX_VALUE, field_diff, summarise
from reconciler.plan.planner import plan
from reconciler.spec.types import ClusterSpec, DesiredState, ModelSpec, ObjectKey, Preemption, Team, UserPolicy
from tests import support

CHAT = ObjectKey("alice", "model", "chat")


def model(replicas: int = 1, gpus: int = 1) -> ModelSpec:
    return ModelSpec(CHAT, "Qwen/Qwen2.5-0.5B-Instruct", None, None, replicas, gpus, {}, {}, False, 1767225600)


def test_field_diff_names_each_leaf_with_old_and_new() -> None:
    old = {"source": "a", "engine_kwargs": {"max_model_len": 4096, "dtype": "auto"}, "gpus_per_replica": 1}
    new = {"source": "b", "engine_kwargs": {"max_model_len": 8192}, "gpus_per_replica": 2, "env": {"X": "1"}}
    assert field_diff(old, new) == (
        "engine_kwargs.dtype: auto → (unset)",
        "engine_kwargs.max_model_len: 4096 → 8192",
        "env.X: (unset) → 1",
        "gpus_per_replica: 1 → 2",
        "source: a → b",
    )
    assert field_diff(new, new) == ()
    assert field_diff({"overrides": ()}, {"overrides": []}) == ()  # JSON-equal values are equal


def test_field_diff_keeps_values_short_and_on_one_line() -> None:
    (line,) = field_diff({"command": "x"}, {"command": "python train.py\n" + "y" * 200})
    assert "\n" not in line and line.endswith("…")
    assert len(line.split(" → ")[1]) == MAX_VALUE
    assert summarise(tuple(str(i) for i in range(8)), limit=3) == "0; 1; 2; and 5 more"


def test_stopped_model_keeps_its_name_and_status() -> None:
    desired = DesiredState(ClusterSpec(), models={CHAT: model(replicas=0)})
    live = ActualModel(CHAT, "alice-202601010000-chat", "h", 2, 2, "RUNNING", resources_per_replica={"GPU": 1})
    before = ActualState(models={CHAT: live})
    result = plan(desired, before)
    assert [a.type for a in result.actions] == [ActionType.STOP_MODEL]
    assert assess(desired, before, result)[CHAT].state == "DELETING"
    after = ActualState()
    status = assess(desired, after, plan(desired, after))[CHAT]
    assert (status.state, status.sync, status.served_name) == ("STOPPED", "Synced", "alice-202601010000-chat")
    assert status.replicas_desired == 0


def test_unschedulable_state_and_validate_warning() -> None:
    cluster = ClusterSpec(users={"alice": UserPolicy(gpus=2), "bob": UserPolicy()})
    big = support.task_spec("alice", "big", "grpo", model="m", data_train="/d", gpus_per_node=4)
    desired = DesiredState(cluster, tasks={big.key: big})
    actual = ActualState(capacity=Capacity({"GPU": 8, "worker_node": 1}, {"GPU": 8, "worker_node": 1}))
    result = plan(desired, actual)
    assert [a.type for a in result.actions] == [ActionType.UNSCHEDULABLE]
    status = assess(desired, actual, result)[big.key]
    assert (status.state, status.sync) == ("UNSCHEDULABLE", "OutOfSync")
    assert "quota is 2 GPUs" in status.reason
    assert unschedulable(desired) == [(big.key, "needs 4 GPU but alice's quota is 2 GPUs")]
    # Larger than the whole cluster: known only with the cluster's capacity.
    assert unschedulable(DesiredState(ClusterSpec(), tasks={big.key: big}), {"GPU": 2, "worker_node": 1}) == [
        (big.key, "needs 4 GPU, 1 worker_node but the whole cluster has 2 GPU")
    ]


def test_validate_reports_a_model_that_could_only_run_by_borrowing_what_is_never_reclaimed() -> None:
    """argus validate/plan: a model that can never be preempted and is larger than its team's nominal
    quota (or, for a user in no team, than the capacity in no team's quota) can never run; with
    min_replicas (and model preemption on) only the floor counts."""
    teams = {"research": Team("research", ("alice",), {"GPU": 4.0}), "product": Team("product", ("bob",), {"GPU": 2.0})}
    cluster = ClusterSpec(teams=teams, preemption=Preemption(models=True))
    big = model(replicas=4, gpus=2)
    desired = DesiredState(cluster, models={CHAT: big})
    assert unschedulable(desired) == [
        (
            CHAT,
            "needs 8 GPU that cannot be preempted (a model without `min_replicas` is never preempted) but team "
            "research's nominal quota is 4 GPU: only work that can be preempted borrows",
        )
    ]
    assert unschedulable(DesiredState(cluster, models={CHAT: replace(big, min_replicas=2)})) == []
    assert unschedulable(DesiredState(cluster, models={CHAT: replace(big, min_replicas=3)}))  # 6 GPUs firm
    off = replace(cluster, preemption=Preemption(models=False))
    assert (
        "without `preemption.models: true`"
        in unschedulable(DesiredState(off, models={CHAT: replace(big, min_replicas=1)}))[0][1]
    )
    assert unschedulable(DesiredState(replace(off, preemption=Preemption(reclaim="Never")), models={CHAT: big})) == []
    # A user in no team: offline the capacity outside the teams' quotas is unknown; with it, 2 GPUs.
    carl = replace(big, key=ObjectKey("carl", "model", "chat"))
    assert unschedulable(DesiredState(cluster, models={carl.key: carl})) == []
    (why,) = unschedulable(DesiredState(cluster, models={carl.key: carl}), {"GPU": 8.0})
    assert why[1].endswith("on the capacity in no team's quota (2 GPU): only work that can be preempted borrows")


def test_held_is_a_flag_not_a_word_in_the_reason() -> None:
    desired = DesiredState(ClusterSpec(), models={CHAT: model()})
    held = Plan(actions=[Action(ActionType.KEEP, CHAT, "kept", held=True)])
    assert assess(desired, ActualState(), held)[CHAT].sync == "Held"
    guard_word = Plan(actions=[Action(ActionType.KEEP, CHAT, "my guard model is invalid")])
    assert assess(desired, ActualState(), guard_word)[CHAT].sync != "Held"


def test_first_seen_is_recorded_for_every_desired_object() -> None:
    desired = DesiredState(ClusterSpec(), models={CHAT: model()})
    assert plan(desired, ActualState(), now=1800000000).first_seen == {CHAT: 1800000000}
    seen = ActualState(first_seen={CHAT: 1700000000})
    assert plan(desired, seen, now=1800000000).first_seen == {CHAT: 1700000000}
    assert plan(desired, ActualState()).first_seen == {}  # no clock, nothing recorded


def test_first_seen_is_written_once_and_read_back() -> None:
    from reconciler.plan.assess import ObjectStatus
    from reconciler.status.documents import first_seen_of, object_document

    def doc(first_seen: int, previous: dict[str, object] | None) -> dict[str, object]:
        st = ObjectStatus(CHAT, "RUNNING", "Synced", first_seen=first_seen)
        return object_document(
            st, previous, revision="r", applied=True, now="t", endpoint="e", log_tails={}, checkpoints={}
        )

    first = doc(1767225600, None)
    assert first["first_seen"] == "2026-01-01T00:00:00Z"
    # The document follows the order time the tick gives it (kept until the object's file changes) ...
    assert doc(1800000000, first)["first_seen"] == "2027-01-15T08:00:00Z"
    # ... and keeps the recorded one when the tick gives none.
    st = ObjectStatus(CHAT, "RUNNING", "Synced")
    kept = object_document(st, first, revision="r", applied=True, now="t", endpoint="e", log_tails={}, checkpoints={})
    assert kept["first_seen"] == "2026-01-01T00:00:00Z"
    assert first_seen_of({CHAT.path: first, "users/x/models/y.yaml": {"object": "x/models/y"}}) == {CHAT: 1767225600}
