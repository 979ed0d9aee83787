"""Properties of the planner over generated desired and actual states (hypothesis)."""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.errors import Issue
from reconciler.plan.actions import ActionType, Plan
from reconciler.plan.actual import ActualJob, ActualModel, ActualState, Capacity
from reconciler.plan.planner import free_capacity, plan
from reconciler.spec.hashing import model_spec_hash, submission_id, task_spec_hash
from reconciler.spec.types import Admission, ClusterSpec, DesiredState, ModelSpec, ObjectKey, TaskSpec, UserPolicy
from tests import support

USERS = ("alice", "bob", "carol")
NAMES = ("a", "b", "c")
ADMITTED = (ActionType.DEPLOY_MODEL, ActionType.UPDATE_MODEL, ActionType.SCALE_MODEL, ActionType.SUBMIT_TASK)
JOB_STATES = ("PENDING", "RUNNING", "SUCCEEDED", "FAILED", "STOPPED")


def model_spec(key: ObjectKey, replicas: int, gpus: int, created: int, suspend: bool) -> ModelSpec:
    return ModelSpec(
        key=key,
        source="Qwen/Qwen2.5-0.5B-Instruct",
        source_path=None,
        source_task=None,
        replicas=replicas,
        gpus_per_replica=gpus,
        engine_kwargs={"max_model_len": 4096},
        env={},
        suspend=suspend,
        created_at=created,
    )


def grpo_task(key: ObjectKey, gpus: int, run: int, created: int, suspend: bool) -> TaskSpec:
    return support.task_spec(
        key.user,
        key.name,
        "grpo",
        model="Qwen/Qwen2.5-0.5B-Instruct",
        data_train="/d/t.parquet",
        gpus_per_node=gpus,
        run=run,
        created_at=created,
        suspend=suspend,
    )


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[DesiredState, ActualState]:
    """A desired state (some objects invalid or suspended) and an owned actual state that partly matches it."""
    quotas = draw(st.dictionaries(st.sampled_from(USERS), st.one_of(st.none(), st.integers(0, 6)), max_size=3))
    cluster = ClusterSpec(users={u: UserPolicy(quotas.get(u)) for u in USERS} if quotas else None)
    desired = DesiredState(cluster=cluster, approve_prune=draw(st.booleans()))
    keys = [ObjectKey(u, k, n) for u in USERS for k in ("model", "task") for n in NAMES]  # type: ignore[arg-type]
    for key in draw(st.lists(st.sampled_from(keys), unique=True, max_size=12)):
        created, suspend = draw(st.integers(0, 5)), draw(st.booleans()) and draw(st.booleans())
        if draw(st.integers(0, 9)) == 0:
            desired.invalid[key] = [Issue(key.path, 2, "broken")]
        elif key.kind == "model":
            spec = model_spec(key, draw(st.integers(1, 4)), draw(st.integers(1, 2)), created, suspend)
            desired.models[key] = spec
        else:
            desired.tasks[key] = grpo_task(key, draw(st.integers(1, 4)), draw(st.integers(1, 2)), created, suspend)
    actual = ActualState()
    for key in draw(st.lists(st.sampled_from([k for k in keys if k.kind == "model"]), unique=True, max_size=9)):
        spec = desired.models.get(key)
        same = spec is not None and draw(st.booleans())
        digest = model_spec_hash(spec, cluster) if same and spec else "0000000000000000"
        replicas = draw(st.integers(1, 4))
        ready, status = draw(st.integers(0, replicas)), draw(st.sampled_from(("RUNNING", "DEPLOYING")))
        per_replica = {"GPU": float(draw(st.integers(1, 2)))}
        served = f"{key.user}-202601010000-{key.name}"
        actual.models[key] = ActualModel(
            key, served, digest, replicas, ready, status, resources_per_replica=per_replica
        )
    for key in draw(st.lists(st.sampled_from([k for k in keys if k.kind == "task"]), max_size=6)):
        task = desired.tasks.get(key)
        if task is not None and draw(st.booleans()):
            sid, digest = submission_id(task), task_spec_hash(task)
        else:
            n = draw(st.integers(0, 99))
            sid, digest = f"argus-{key.user}-{key.name}-{n:08d}", f"{n:016d}"
        if any(j.submission_id == sid for j in actual.jobs):
            continue
        gpus = float(draw(st.integers(1, 4)))
        actual.jobs.append(ActualJob(sid, key, digest, draw(st.sampled_from(JOB_STATES)), resources={"GPU": gpus}))
    if draw(st.booleans()):
        total = float(draw(st.integers(0, 16)))
        free = float(draw(st.integers(0, int(total))))
        workers = float(draw(st.integers(0, 3)))
        actual.capacity = Capacity({"GPU": total, "worker_node": workers}, {"GPU": free, "worker_node": workers})
    return desired, actual


def shuffled(desired: DesiredState, actual: ActualState, seed: int) -> tuple[DesiredState, ActualState]:
    """The same states with every dict and list in another order."""
    rng = random.Random(seed)

    def mix(d: dict) -> dict:  # type: ignore[type-arg]
        items = list(d.items())
        rng.shuffle(items)
        return dict(items)

    jobs = list(actual.jobs)
    rng.shuffle(jobs)
    new_desired = replace(desired, models=mix(desired.models), tasks=mix(desired.tasks), invalid=mix(desired.invalid))
    return new_desired, ActualState(models=mix(actual.models), jobs=jobs, capacity=actual.capacity)


@settings(max_examples=300, deadline=None, database=None)
@given(scenarios(), st.integers(0, 2**32 - 1))
def test_plan_is_deterministic_and_ordered(scenario: tuple[DesiredState, ActualState], seed: int) -> None:
    desired, actual = scenario
    first = plan(desired, actual)
    assert first.to_json() == plan(desired, actual).to_json()
    assert first.to_json() == plan(*shuffled(desired, actual, seed)).to_json()
    assert [a.sort_key for a in first.actions] == sorted(a.sort_key for a in first.actions)


@settings(max_examples=300, deadline=None, database=None)
@given(scenarios())
def test_never_admits_more_than_free_capacity(scenario: tuple[DesiredState, ActualState]) -> None:
    desired, actual = scenario
    result = plan(desired, actual)
    if not (actual.capacity.total or actual.capacity.available):
        return
    free = free_capacity(actual, actual.capacity)
    admitted: dict[str, float] = {}
    for action in result.actions:
        if action.type in ADMITTED:
            for resource, amount in action.demand.items():
                admitted[resource] = admitted.get(resource, 0.0) + amount
    for resource, amount in admitted.items():
        assert amount <= free.get(resource, 0.0) + 1e-9, (resource, amount, free)


@settings(max_examples=300, deadline=None, database=None)
@given(scenarios())
def test_never_exceeds_a_user_quota(scenario: tuple[DesiredState, ActualState]) -> None:
    desired, actual = scenario
    result = plan(desired, actual)
    for user in USERS:
        quota = desired.cluster.quota(user)
        if quota is None:
            continue
        held = sum(t.committed().get("GPU", 0.0) for t in [*actual.models.values(), *actual.jobs] if t.key.user == user)
        new = sum(a.demand.get("GPU", 0.0) for a in result.actions if a.type in ADMITTED and a.key.user == user)
        assert new == 0 or held + new <= quota, (user, held, new, quota)


@settings(max_examples=300, deadline=None, database=None)
@given(scenarios())
def test_only_known_objects_are_touched(scenario: tuple[DesiredState, ActualState]) -> None:
    """Nothing absent from both desired and actual appears; only owned objects are deleted or stopped;
    an invalid or suspended object, or one of an invalid cluster.yaml, gets no change."""
    desired, actual = scenario
    result = plan(desired, actual)
    owned = set(actual.models) | {j.key for j in actual.jobs}
    for action in result.actions:
        assert action.key in desired.keys() | owned
        if action.type in (ActionType.DELETE_MODEL, ActionType.STOP_TASK):
            assert action.key in owned
            assert any(j.submission_id == action.submission_id and j.active for j in actual.jobs) or (
                action.type is ActionType.DELETE_MODEL
            )
        if action.key in desired.invalid:
            assert action.type is ActionType.KEEP
        spec = desired.models.get(action.key) or desired.tasks.get(action.key)
        if spec is not None and spec.suspend:
            assert action.type is ActionType.KEEP
    broken = plan(replace(desired, cluster_valid=False), actual)
    assert all(a.type is ActionType.KEEP for a in broken.actions)


@settings(max_examples=300, deadline=None, database=None)
@given(scenarios())
def test_held_deletions_delete_nothing(scenario: tuple[DesiredState, ActualState]) -> None:
    desired, actual = scenario
    result = plan(desired, actual)
    deletes = result.of(ActionType.DELETE_MODEL) + [
        a for a in result.of(ActionType.STOP_TASK) if "file removed" in a.reason
    ]
    if result.deletions_held:
        assert not deletes
        assert not desired.approve_prune
    if desired.approve_prune:
        assert not result.deletions_held


@settings(max_examples=200, deadline=None, database=None)
@given(scenarios())
def test_a_finished_run_is_never_resubmitted(scenario: tuple[DesiredState, ActualState]) -> None:
    desired, actual = scenario
    result = plan(desired, actual)
    ran = {j.submission_id for j in actual.jobs}
    for action in result.of(ActionType.SUBMIT_TASK):
        assert action.submission_id not in ran


@settings(max_examples=300, deadline=None, database=None)
@given(scenarios(), st.sampled_from(["BestEffortFIFO", "StrictFIFO"]))
def test_an_unschedulable_request_blocks_nobody(scenario: tuple[DesiredState, ActualState], policy: str) -> None:
    """Whatever the policy, every other object is planned exactly as if the unschedulable
    requests (that have nothing running) were not in the repository at all."""
    desired, actual = scenario
    desired = replace(desired, cluster=replace(desired.cluster, admission=Admission(policy)))  # type: ignore[arg-type]
    result = plan(desired, actual)
    running = set(actual.models) | {j.key for j in actual.jobs}
    never = {a.key for a in result.of(ActionType.UNSCHEDULABLE)} - running
    if not never:
        return
    without = replace(
        desired,
        models={k: v for k, v in desired.models.items() if k not in never},
        tasks={k: v for k, v in desired.tasks.items() if k not in never},
    )
    waiting = (*ADMITTED, ActionType.QUEUE, ActionType.UNSCHEDULABLE)

    def others(p: Plan) -> list[tuple[str, ObjectKey, str]]:
        return [(a.type.value, a.key, a.reason) for a in p.of(*waiting) if a.key not in never]

    assert others(result) == others(plan(without, actual))
