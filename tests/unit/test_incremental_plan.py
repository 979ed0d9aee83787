"""The incremental planner and assessment equal the full ones, after any sequence of steps.

A small world where every rule of the planner can fire: three users (one with a model taking a
task's checkpoint), cluster.yaml variants (plain, per-user quotas, teams with priorities and
preemption, StrictFIFO with a strict prune guard, broken), files added, changed, broken and
deleted; on Ray's side jobs appearing, ending, failing, being preempted and vanishing (then only
the status branch remembers them), models deploying, failing, scaling and going, foreign jobs
squatting submission ids, capacity going up, down and unknown, the clock moving, the plan applied
(or a part of it), and restarts (a fresh incremental planner). Desired states come from the real
loader: through the incremental loader (unchanged specs are the same objects) or a fresh full
load (equal but new objects); Ray's objects are kept or rebuilt equal. After every step both
paths get the same inputs and must return the same plan (actions in order, notes, first_seen,
teams) and the same statuses (in the same order).
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from reconciler.plan import incremental
from reconciler.plan.actions import ActionType, Plan
from reconciler.plan.actual import PREEMPTED, ActualJob, ActualModel, ActualState, Capacity
from reconciler.plan.assess import assess
from reconciler.plan.incremental import IncrementalPlanner
from reconciler.plan.planner import plan
from reconciler.spec.hashing import submission_id
from reconciler.spec.incremental import IncrementalLoader
from reconciler.spec.loader import ParseCache, SourceFile, load
from reconciler.spec.types import DesiredState, ObjectKey

USERS = ("alice", "bob", "carol")
START = 1767225600
PATHS = {"common": "/hf", "users": "/home"}
CLUSTERS: dict[str, Any] = {
    "plain": {"kind": "Cluster", "paths": PATHS},
    "quotas": {
        "kind": "Cluster",
        "paths": PATHS,
        "users": {"alice": {"gpus": 1, "tasks": 1}, "bob": {"gpus": 2}, "carol": {}},
    },
    "teams": {
        "kind": "Cluster",
        "paths": PATHS,
        "priority_classes": {"high": 10, "low": 0},
        "default_priority": {"models": "high", "tasks": "low"},
        "teams": {
            "red": {"members": ["alice"], "quota": {"gpus": 2, "tasks": 2}, "borrowing_limit": {"gpus": 2}},
            "blue": {"members": ["bob"], "quota": {"gpus": 2, "tasks": 1}},
        },
        "preemption": {"models": True, "min_run_seconds": 120},
    },
    "strict": {
        "kind": "Cluster",
        "paths": PATHS,
        "admission": {"policy": "StrictFIFO"},
        "prune": {"max_fraction": 0.2, "min_deletions": 0},
        "priority_classes": {"high": 10, "low": 0},
    },
    "broken": "kind: Cluster\npaths: [",
}

model_doc = st.fixed_dictionaries(
    {"kind": st.just("Model"), "source": st.sampled_from(["$HOME/models/m", "task:t1", "Qwen/Qwen2.5-0.5B"])},
    optional={
        "replicas": st.integers(0, 3),
        "gpus_per_replica": st.integers(1, 2),
        "min_replicas": st.integers(0, 1),
        "suspend": st.booleans(),
        "priority": st.sampled_from(["high", "low"]),
        "engine_kwargs": st.fixed_dictionaries({"max_model_len": st.sampled_from([1024, 2048])}),
    },
)
task_doc = st.fixed_dictionaries(
    {"kind": st.just("Task"), "workload": st.just("command"), "command": st.sampled_from(["true", "echo hi"])},
    optional={
        "gpus_per_node": st.integers(0, 3),
        "run": st.integers(1, 2),
        "suspend": st.booleans(),
        "priority": st.sampled_from(["high", "low"]),
    },
)
broken = st.sampled_from([b"kind: Model\nsource: [", b"- 1\n"])
text = st.one_of(
    model_doc.map(lambda d: ("models", yaml.safe_dump(d).encode())),
    task_doc.map(lambda d: ("tasks", yaml.safe_dump(d).encode())),
)
MODEL_NAMES, TASK_NAMES = ("m1", "m2"), ("t1", "t2")

push = st.tuples(
    st.just("push"),
    st.sampled_from(USERS),
    st.sampled_from([*MODEL_NAMES, *TASK_NAMES]),
    st.one_of(st.none(), st.booleans(), st.integers(0, 2**30)),  # delete, broken (True), a new document
)
cluster_change = st.tuples(st.just("cluster"), st.sampled_from(sorted(CLUSTERS)))
JOB_STATES = ("PENDING", "RUNNING", "SUCCEEDED", "FAILED", "STOPPED", PREEMPTED, None)  # None: Ray forgets it
job_change = st.tuples(
    st.just("job"),
    st.sampled_from(USERS),
    st.sampled_from(TASK_NAMES),
    st.sampled_from(JOB_STATES),
    st.booleans(),  # of the current spec (else of an older one)
    st.integers(1, 2),  # attempt
    st.booleans(),  # records the run on the status branch too
)
MODEL_STATES = ("RUNNING", "DEPLOYING", "UNHEALTHY", "DEPLOY_FAILED", None)
model_change = st.tuples(
    st.just("model"),
    st.sampled_from(USERS),
    st.sampled_from(MODEL_NAMES),
    st.sampled_from(MODEL_STATES),
    st.booleans(),  # of the current spec
    st.integers(0, 3),  # ready replicas
    st.booleans(),  # awaiting its first answer
)
capacity_change = st.tuples(st.just("capacity"), st.sampled_from([None, 0, 1, 2, 4, 8]), st.integers(0, 3))
foreign_change = st.tuples(st.just("foreign"), st.sampled_from(USERS), st.sampled_from(TASK_NAMES), st.booleans())
other = st.tuples(st.sampled_from(["apply", "apply-some", "restart", "clock", "stopping", "fresh-objects", "crowd"]))
step = st.one_of(push, push, push, cluster_change, job_change, job_change, model_change, capacity_change)
step = st.one_of(step, step, step, foreign_change, other, other, st.just(("apply",)), st.just(("clock",)))


@dataclass
class World:
    """What the repository holds and what Ray and the status branch report."""

    cluster: str = "plain"
    files: dict[str, bytes] = field(default_factory=dict)
    created: dict[str, int] = field(default_factory=dict)
    models: dict[ObjectKey, ActualModel] = field(default_factory=dict)
    jobs: dict[str, ActualJob] = field(default_factory=dict)
    recorded: dict[str, ActualJob] = field(default_factory=dict)
    foreign: frozenset[str] = frozenset()
    total: dict[str, float] = field(default_factory=lambda: {"GPU": 4.0, "CPU": 64.0, "worker_node": 2.0})
    first_seen: dict[ObjectKey, int] = field(default_factory=dict)
    preempted: dict[ObjectKey, ObjectKey] = field(default_factory=dict)
    stopping: frozenset[str] = frozenset()
    clock: int = START
    serial: int = 0

    def source_files(self) -> list[SourceFile]:
        cluster = CLUSTERS[self.cluster]
        data = (cluster if isinstance(cluster, str) else yaml.safe_dump(cluster)).encode()
        files = {p: SourceFile(p, d, hashlib.sha1(d).hexdigest()) for p, d in self.files.items()}
        files["cluster.yaml"] = SourceFile("cluster.yaml", data, hashlib.sha1(data).hexdigest())
        return [files[p] for p in sorted(files)]

    def actual(self, rebuild: bool) -> ActualState:
        """Ray's answer: the same objects as last time, or equal new ones (``rebuild``)."""
        fresh: Any = (lambda o: replace(o)) if rebuild else (lambda o: o)
        used: dict[str, float] = {}
        for job in self.jobs.values():
            for r, v in job.committed().items():
                used[r] = used.get(r, 0.0) + v
        for model in self.models.values():
            for r, v in model.placed().items():
                used[r] = used.get(r, 0.0) + v
        free = {r: max(0.0, v - used.get(r, 0.0)) for r, v in self.total.items()}
        return ActualState(
            models={k: fresh(m) for k, m in self.models.items()},
            jobs=[fresh(j) for j in self.jobs.values()],
            capacity=Capacity(dict(self.total), free) if self.total else Capacity(),
            recorded_runs=[fresh(j) for j in self.recorded.values()],
            foreign_ids=frozenset(self.foreign),
            preempted=dict(self.preempted),
            stopping=self.stopping,
        )

    def apply(self, result: Plan, keys: set[ObjectKey] | None) -> None:
        """What the daemon's apply does to Ray, for the actions of ``keys`` (None: all)."""
        for action in result.actions:
            if keys is not None and action.key not in keys:
                continue
            sid = action.submission_id or ""
            if action.type is ActionType.SUBMIT_TASK:
                resources = {r: v for r, v in action.demand.items() if v}
                job = ActualJob(sid, action.key, action.spec_hash or "", "PENDING", resources=resources)
                self.jobs[sid] = replace(job, start_time=self.clock * 1000)
            elif action.type is ActionType.STOP_TASK and sid in self.jobs:
                self.jobs[sid] = replace(self.jobs[sid], status=PREEMPTED if action.preempted_by else "STOPPED")
                if action.preempted_by is not None:
                    self.preempted[action.key] = action.preempted_by
            elif action.type in (ActionType.DELETE_MODEL, ActionType.STOP_MODEL):
                self.models.pop(action.key, None)
            elif action.type in (ActionType.DEPLOY_MODEL, ActionType.UPDATE_MODEL, ActionType.SCALE_MODEL):
                old = self.models.get(action.key)
                per = {"GPU": 1.0} if old is None else dict(old.resources_per_replica)
                self.models[action.key] = ActualModel(
                    action.key,
                    old.served_name if old else f"{action.key.user}-x-{action.key.name}",
                    action.spec_hash or "",
                    action.replicas or 0,
                    ready_replicas=old.ready_replicas if old else 0,
                    resources_per_replica=per,
                )


def _desired(world: World, loader: IncrementalLoader, fresh: bool) -> DesiredState:
    kw: dict[str, Any] = dict(created=world.created, default_time=START, revision="r")
    if fresh:
        return load(world.source_files(), cache=ParseCache(), **kw)
    return loader.load(world.source_files(), **kw)


def _step(world: World, desired: DesiredState, last: Plan | None, move: tuple[Any, ...]) -> None:
    kind = move[0]
    world.serial += 1
    if kind == "push":
        _, user, name, what = move
        folder = "models" if name in MODEL_NAMES else "tasks"
        path = f"users/{user}/{folder}/{name}.yaml"
        if what is None:
            world.files.pop(path, None)
        elif what is True:
            world.files[path] = b"kind: Model\nsource: ["
        else:
            world.files[path] = _document(folder, user, name, int(what))
            world.created.setdefault(path, world.clock)
    elif kind == "cluster":
        world.cluster = move[1]
    elif kind == "crowd":  # carol (in no team) runs two 2-GPU tasks: everything she runs is borrowed
        world.cluster, world.total = "teams", {"GPU": 4.0, "CPU": 64.0, "worker_node": 3.0}
        for name in TASK_NAMES:
            path = f"users/carol/tasks/{name}.yaml"
            world.files[path] = _document("tasks", "carol", name, 20)
            world.created.setdefault(path, world.clock)
        crowded = load(world.source_files(), cache=ParseCache(), created=world.created, default_time=START)
        for name in TASK_NAMES:
            spec = crowded.tasks.get(ObjectKey("carol", "task", name))
            if spec is not None:
                sid = submission_id(spec)
                world.jobs[sid] = ActualJob(
                    sid,
                    spec.key,
                    _task_hash(spec),
                    "RUNNING",
                    resources={"GPU": 2.0, "worker_node": 1.0},
                    start_time=(world.clock - 3600) * 1000,
                )
    elif kind == "job":
        _, user, name, status, current, attempt, record = move
        key = ObjectKey(user, "task", name)
        spec = desired.tasks.get(key)
        if spec is not None and current:
            sid, digest = submission_id(spec, attempt), _task_hash(spec)
        else:
            sid, digest = f"argus--{user}--{name}--0ld0ld0{attempt}", "0ld"
        if status is None:
            world.jobs.pop(sid, None)
            return
        gpus = float(spec.gpus) if spec is not None else 1.0
        job = ActualJob(
            sid,
            key,
            digest,
            status,
            resources={"GPU": gpus, "worker_node": 1.0} if gpus else {"worker_node": 1.0},
            hf_checkpoint=f"/home/{user}/ckpt/{world.serial}" if status == "SUCCEEDED" else None,
            start_time=(world.clock - 600) * 1000,
            end_time=world.clock * 1000 if status not in ("PENDING", "RUNNING") else None,
            message="Job failed, last available logs (truncated to 20,000 chars):\nValueError: x"
            * (status == "FAILED"),
        )
        world.jobs[sid] = job
        if record:
            world.recorded[sid] = replace(job, message="", resources={})
    elif kind == "model":
        _, user, name, status, current, ready, awaiting = move
        key = ObjectKey(user, "model", name)
        if status is None:
            world.models.pop(key, None)
            return
        spec = desired.models.get(key)
        match = [a for a in (last.actions if last else []) if a.key == key and a.spec_hash]
        digest = (
            match[0].spec_hash if match and current else (world.models[key].spec_hash if key in world.models else "old")
        )
        replicas = spec.replicas if spec is not None else 1
        world.models[key] = ActualModel(
            key,
            spec.served_name if spec is not None else f"{user}-old-{name}",
            digest or "old",
            replicas,
            ready_replicas=min(ready, replicas),
            status=status,
            resources_per_replica={"GPU": float(spec.gpus_per_replica) if spec else 1.0},
            spec={"replicas": replicas - 1} if current else None,
            awaiting_answer=awaiting,
        )
    elif kind == "capacity":
        _, gpus, slots = move
        world.total = {} if gpus is None else {"GPU": float(gpus), "CPU": 64.0, "worker_node": float(slots)}
    elif kind == "foreign":
        _, user, name, add = move
        sid = f"argus--{user}--{name}--"
        squat = {s for s in [*world.jobs, *world.recorded] if s.startswith(sid)}
        world.foreign = world.foreign | squat if add else world.foreign - squat
        world.foreign = world.foreign | {f"argus--{user}--{name}--deadbeef"} if add else world.foreign
    elif kind == "stopping":
        world.stopping = frozenset(s for s, j in world.jobs.items() if j.active) if not world.stopping else frozenset()
    elif kind == "clock":
        world.clock += 150


def _task_hash(spec: Any) -> str:
    from reconciler.spec.hashing import task_spec_hash

    return task_spec_hash(spec)


def _document(folder: str, user: str, name: str, seed: int) -> bytes:
    """A valid document for ``folder``, chosen by ``seed`` (hypothesis shrinks integers well)."""
    if folder == "models":
        doc: dict[str, Any] = {"kind": "Model", "source": ["$HOME/models/m", "task:t1", "Qwen/Qwen2.5-0.5B"][seed % 3]}
        doc["replicas"] = seed // 3 % 4
        if seed // 12 % 2:
            doc["gpus_per_replica"] = 2
        if seed // 24 % 2:
            doc["min_replicas"] = 1
        if seed // 48 % 5 == 0:
            doc["suspend"] = True
        if seed // 240 % 3:
            doc["priority"] = ["high", "low"][seed // 240 % 3 - 1]
        if seed // 720 % 2:
            doc["engine_kwargs"] = {"max_model_len": 1024}
    else:
        doc = {"kind": "Task", "workload": "command", "command": ["true", "echo hi"][seed % 2]}
        doc["gpus_per_node"] = seed // 2 % 4
        doc["run"] = 1 + seed // 8 % 2
        if seed // 16 % 5 == 0:
            doc["suspend"] = True
        if seed // 80 % 3:
            doc["priority"] = ["high", "low"][seed // 80 % 3 - 1]
    return yaml.safe_dump(doc).encode()


initial = st.dictionaries(
    st.tuples(st.sampled_from(USERS), st.sampled_from([*MODEL_NAMES, *TASK_NAMES])), st.integers(0, 2**12), max_size=12
)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    initial,
    st.sampled_from([*sorted(CLUSTERS), "teams", "teams"]),
    st.booleans(),
    st.lists(step, min_size=1, max_size=14),
    st.integers(0, 2**16),
    st.sampled_from([0, incremental.REBUILD_AT]),
)
def test_the_incremental_plan_and_assessment_equal_the_full_ones_after_any_steps(
    files: dict[tuple[str, str], int],
    cluster: str,
    crowd: bool,
    moves: list[tuple[Any, ...]],
    seed: int,
    rebuild_at: int,
) -> None:
    default, incremental.REBUILD_AT = incremental.REBUILD_AT, rebuild_at  # 0: sorted lists rebuilt, not edited
    try:
        _run(files, cluster, crowd, moves, seed)
    finally:
        incremental.REBUILD_AT = default


def _run(files: dict[tuple[str, str], int], cluster: str, crowd: bool, moves: list[tuple[Any, ...]], seed: int) -> None:
    world, loader, inc = World(cluster=cluster), IncrementalLoader(), IncrementalPlanner()
    for (user, name), doc in files.items():
        folder = "models" if name in MODEL_NAMES else "tasks"
        world.files[f"users/{user}/{folder}/{name}.yaml"] = _document(folder, user, name, doc)
    moves = [("apply",), *([("crowd",)] if crowd else []), *moves]
    fresh_specs = rebuild_actual = False
    last: Plan | None = None
    for i, move in enumerate(moves):
        kind = move[0]
        desired = _desired(world, loader, fresh_specs)
        if kind == "restart":
            inc = IncrementalPlanner() if i % 2 else inc
            if not i % 2:
                inc.forget()
        elif kind == "fresh-objects":
            fresh_specs, rebuild_actual = not fresh_specs, not rebuild_actual
        elif kind not in ("apply", "apply-some"):
            _step(world, desired, last, move)
            desired = _desired(world, loader, fresh_specs)
        actual = world.actual(rebuild_actual)
        want = plan(desired, actual, first_seen=world.first_seen, now=world.clock)
        got = inc.plan(desired, actual, first_seen=world.first_seen, now=world.clock)
        assert got == want, move
        applied: set[ObjectKey] | None = None
        if kind == "apply-some":
            applied = {k for n, k in enumerate(sorted(desired.keys())) if (seed >> (n % 16)) & 1}
        statuses = inc.assess(desired, actual, got, applied)
        expected = assess(desired, actual, want, applied)
        assert statuses == expected, move
        assert list(statuses) == list(expected)
        for status in statuses.values():  # values: an apply failure makes a new status
            with pytest.raises(dataclasses.FrozenInstanceError):
                status.state = "FAILED"  # type: ignore[misc]
            assert isinstance(status.runs, tuple)
        if kind in ("apply", "apply-some"):
            world.apply(want, applied)
        world.first_seen = dict(want.first_seen)
        last = want
        event(f"actions: {min(len(want.actions), 4)}")
        event(f"queued: {bool(want.of(ActionType.QUEUE))}, preempted: {bool(want.preemptions)}")
        event(f"held: {want.deletions_held}")


def _tree(users: int) -> World:
    world = World()
    for u in range(users):
        for name in MODEL_NAMES:
            world.files[f"users/user{u:03d}/models/{name}.yaml"] = _document("models", "x", name, 51)
        for name in TASK_NAMES:
            world.files[f"users/user{u:03d}/tasks/{name}.yaml"] = _document("tasks", "x", name, 18)
    world.total = {"GPU": 1000.0, "CPU": 1000.0, "worker_node": 1000.0}
    return world


def test_a_push_recomputes_only_the_object_it_changed() -> None:
    world, loader, inc = _tree(50), IncrementalLoader(), IncrementalPlanner()
    desired = _desired(world, loader, False)
    first = inc.plan(desired, world.actual(False), now=START)
    world.apply(first, None)
    actual = world.actual(True)  # Ray's answers are new objects on every observation
    inc.plan(desired, actual, now=START)
    assert inc.recomputed == 200  # every object now runs: each one's plan is computed again
    actual = world.actual(True)
    steady = inc.plan(desired, actual, now=START)
    assert inc.recomputed == 0
    inc.assess(desired, actual, steady)
    world.files["users/user007/tasks/t9.yaml"] = _document("tasks", "x", "t9", 19)
    desired = _desired(world, loader, False)
    actual = world.actual(True)
    got = inc.plan(desired, actual, now=START)
    assert inc.recomputed == 1
    assert got == plan(desired, actual, now=START)
    statuses = inc.assess(desired, actual, got)
    assert inc.reassessed == 1
    assert statuses == assess(desired, actual, got)


def test_a_foreign_job_recomputes_only_the_task_whose_id_it_holds() -> None:
    world, loader, inc = _tree(20), IncrementalLoader(), IncrementalPlanner()
    world.total = {}
    desired = _desired(world, loader, False)
    inc.plan(desired, world.actual(False), now=START)
    spec = desired.tasks[ObjectKey("user003", "task", "t1")]
    world.foreign = frozenset({submission_id(spec), "argus--nobody--x--12345678", "raysubmit_1"})
    actual = world.actual(False)
    got = inc.plan(desired, actual, now=START)
    assert inc.recomputed == 1
    assert got == plan(desired, actual, now=START)
    assert submission_id(spec, 2) in {a.submission_id for a in got.actions}


def test_a_cluster_change_recomputes_everything() -> None:
    world, loader, inc = _tree(5), IncrementalLoader(), IncrementalPlanner()
    desired = _desired(world, loader, False)
    inc.plan(desired, world.actual(False), now=START)
    world.cluster = "quotas"
    desired = _desired(world, loader, False)
    got = inc.plan(desired, world.actual(False), now=START)
    assert inc.recomputed == 20
    assert got == plan(desired, world.actual(False), now=START)


def test_a_plan_that_raises_midway_leaves_no_half_updated_memo(monkeypatch: Any) -> None:
    world, loader, inc = _tree(10), IncrementalLoader(), IncrementalPlanner()
    desired = _desired(world, loader, False)
    inc.plan(desired, world.actual(False), now=START)
    world.files["users/user004/models/m1.yaml"] = _document("models", "x", "m1", 3)  # suspended now
    world.files["users/user009/models/m1.yaml"] = _document("models", "x", "m1", 54)
    desired = _desired(world, loader, False)
    real = incremental.model_step

    def flaky(key: ObjectKey, *args: Any) -> Any:
        if key.user == "user009":
            raise RuntimeError("boom")
        return real(key, *args)

    monkeypatch.setattr(incremental, "model_step", flaky)
    try:
        inc.plan(desired, world.actual(False), now=START)
    except RuntimeError:
        pass
    else:
        raise AssertionError("the step did not raise")
    monkeypatch.setattr(incremental, "model_step", real)
    assert inc.plan(desired, world.actual(False), now=START) == plan(desired, world.actual(False), now=START)


def test_a_model_taking_a_task_s_output_is_planned_again_when_the_task_succeeds() -> None:
    """No file changed (the change feed names no object), but the model's checkpoint appeared."""
    world, loader, inc = World(), IncrementalLoader(), IncrementalPlanner()
    world.files["users/alice/models/m1.yaml"] = _document("models", "alice", "m1", 52)  # source: task:t1
    world.files["users/alice/tasks/t1.yaml"] = _document("tasks", "alice", "t1", 50)
    desired = _desired(world, loader, False)
    before = inc.plan(desired, world.actual(False), now=START)
    assert not any(a.type is ActionType.DEPLOY_MODEL for a in before.actions)
    spec = desired.tasks[ObjectKey("alice", "task", "t1")]
    sid = submission_id(spec)
    done = ActualJob(sid, spec.key, _task_hash(spec), "SUCCEEDED", end_time=START, hf_checkpoint="/home/alice/ckpt/1")
    world.jobs[sid] = done
    desired = _desired(world, loader, False)
    assert desired.changed is not None and not desired.changed[1]
    actual = world.actual(False)
    got = inc.plan(desired, actual, now=START)
    assert got == plan(desired, actual, now=START)
    assert any(a.type is ActionType.DEPLOY_MODEL for a in got.actions)
