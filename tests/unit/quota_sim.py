"""A simulated Ray for the planner's property tests: the desired tree, what runs, and a tick that
does at once what a plan says (stops free resources, submissions run, a model's replicas come
up; with ``node_gpus``, each on one node as Ray places it), and generated pushes (hypothesis)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from hypothesis import strategies as st

from reconciler.errors import Issue
from reconciler.plan.actions import ActionType, Plan
from reconciler.plan.actual import PREEMPTED, ActualJob, ActualModel, ActualState, Capacity, NodeCapacity
from reconciler.plan.planner import plan
from reconciler.spec.types import ClusterSpec, DesiredState, ModelSpec, ObjectKey, TaskSpec
from tests import support

CLASSES = {"high": 1000, "mid": 100, "low": 0}
TEAMS = ("red", "blue", "green")
MEMBERS = {"red": ("alice", "ann"), "blue": ("bob", "bea"), "green": ("carl",)}
LONER = "zed"  # in no team: borrows lent capacity, holds firm work only outside every team's quota
NOW = 1_767_225_600
CHECKPOINT = "/private/users/{user}/argus-runs/sft/checkpoints/global_step_10/huggingface"


def command_task(user: str, name: str, gpus: int, priority: str | None, created: int) -> TaskSpec:
    return support.task_spec(
        user, name, "command", command="sleep infinity", gpus_per_node=gpus, created_at=created, priority=priority
    )


def model(
    user: str,
    name: str,
    replicas: int,
    gpus: int,
    priority: str | None,
    created: int,
    min_replicas: int | None = None,
    from_task: bool = False,
) -> ModelSpec:
    """A model of ``replicas`` x ``gpus``; ``from_task``: ``source: task:sft`` (the user's finished
    training run, which :meth:`Sim.finished_sft` provides)."""
    source = "task:sft" if from_task else "Qwen/Qwen2.5-0.5B-Instruct"
    return ModelSpec(
        ObjectKey(user, "model", name),
        source,
        None,
        "sft" if from_task else None,
        replicas,
        gpus,
        {},
        {},
        False,
        created,
        priority=priority,
        min_replicas=min_replicas,
    )


@dataclass
class Sim:
    """A cluster whose Ray does at once what the plan says: the desired tree and what runs.

    ``node_gpus``: when set, the cluster is nodes of that many GPUs and one driver slot each,
    reported per node, and every task and replica is placed on one node as Ray would (first
    node with room, by id); placing what argus admitted must succeed."""

    cluster: ClusterSpec
    total: dict[str, float]
    node_gpus: int = 0
    desired: DesiredState = field(init=False)
    jobs: dict[str, ActualJob] = field(default_factory=dict)
    models: dict[ObjectKey, ActualModel] = field(default_factory=dict)
    preempted: dict[ObjectKey, ObjectKey] = field(default_factory=dict)
    first_seen: dict[ObjectKey, int] = field(default_factory=dict)
    edges: list[tuple[ObjectKey, ObjectKey]] = field(default_factory=list)  # (preemptor, victim)
    clock: int = NOW

    # node id -> free resources, and where each job (submission id) and replica (model key) runs
    free: dict[str, dict[str, float]] = field(default_factory=dict)
    placed: dict[str | ObjectKey, list[tuple[str, dict[str, float]]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.desired = DesiredState(cluster=self.cluster)
        if self.node_gpus:
            count = int(self.total["GPU"]) // self.node_gpus
            self.free = {f"n{i:02d}": self._node_total() for i in range(count)}

    def _node_total(self) -> dict[str, float]:
        return {"GPU": float(self.node_gpus), "worker_node": 1.0, "CPU": 16.0}

    def _place(self, holder: str | ObjectKey, part: dict[str, float]) -> None:
        if not self.node_gpus:
            return
        node = next((n for n, f in sorted(self.free.items()) if all(f.get(r, 0) >= v for r, v in part.items())), None)
        assert node is not None, f"argus admitted {holder} ({part}) but no node has room: {self.free}"
        for r, v in part.items():
            self.free[node][r] -= v
        self.placed.setdefault(holder, []).append((node, part))

    def _release(self, holder: str | ObjectKey, count: int | None = None) -> None:
        parts = self.placed.get(holder, [])
        for node, part in parts[len(parts) - (len(parts) if count is None else count) :]:
            for r, v in part.items():
                self.free[node][r] += v
        del parts[len(parts) - (len(parts) if count is None else count) :]

    def actual(self) -> ActualState:
        active = [j for j in self.jobs.values() if j.active]
        used: dict[str, float] = {}
        for job in active:
            for r, v in job.resources.items():
                used[r] = used.get(r, 0.0) + v
        for live in self.models.values():
            for r, v in live.resources_per_replica.items():
                used[r] = used.get(r, 0.0) + v * live.replicas
        free = {r: v - used.get(r, 0.0) for r, v in self.total.items()}
        nodes = tuple(NodeCapacity(n, self._node_total(), dict(f)) for n, f in sorted(self.free.items()))
        return ActualState(
            models=dict(self.models),
            jobs=list(self.jobs.values()),
            capacity=Capacity(dict(self.total), free, nodes),
            first_seen=dict(self.first_seen),
            preempted=dict(self.preempted),
        )

    def finished_sft(self, user: str) -> None:
        """A training run of ``user``'s that ended with a checkpoint (what a ``task:sft`` model serves)."""
        key = ObjectKey(user, "task", "sft")
        sid = f"argus--{user}--sft--done"
        self.jobs[sid] = ActualJob(sid, key, "done", "SUCCEEDED", hf_checkpoint=CHECKPOINT.format(user=user))

    def held(self, users: tuple[str, ...]) -> tuple[float, int]:
        """GPUs and driver slots ``users`` hold now."""
        gpus = sum(j.resources.get("GPU", 0.0) for j in self.jobs.values() if j.active and j.key.user in users)
        gpus += sum(
            m.resources_per_replica.get("GPU", 0.0) * m.replicas for m in self.models.values() if m.key.user in users
        )
        return gpus, sum(1 for j in self.jobs.values() if j.active and j.key.user in users)

    def tick(self) -> Plan:
        self.clock += 60
        result = plan(self.desired, self.actual(), now=self.clock)
        self.first_seen = dict(result.first_seen)
        # What the plan frees first, then what it starts (Ray places new work once room is free).
        for action in result.of(ActionType.STOP_TASK):
            job = self.jobs[action.submission_id or ""]
            preempted = action.preempted_by is not None
            self.jobs[job.submission_id] = replace(job, status=PREEMPTED if preempted else "STOPPED")
            self._release(job.submission_id)
            if action.preempted_by is not None:
                self.preempted[action.key] = action.preempted_by
                self.edges.append((action.preempted_by, action.key))
        for action in result.of(ActionType.STOP_MODEL, ActionType.DELETE_MODEL, ActionType.UPDATE_MODEL):
            self.models.pop(action.key, None)
            self._release(action.key)
        for action in result.of(ActionType.SCALE_MODEL):
            live = self.models[action.key]
            self._release(action.key, max(0, live.replicas - (action.replicas or 0)))
        for action in result.of(ActionType.SUBMIT_TASK):
            sid = action.submission_id or ""
            resources = {k: v for k, v in action.demand.items() if v}
            self.jobs[sid] = ActualJob(
                sid, action.key, action.spec_hash or "", "RUNNING", resources=resources, start_time=self.clock * 1000
            )
            self._place(sid, resources)
        for action in result.of(ActionType.DEPLOY_MODEL, ActionType.UPDATE_MODEL, ActionType.SCALE_MODEL):
            replicas = action.replicas or 0
            if not replicas:  # preempted down to none: its application leaves Serve
                self.models.pop(action.key, None)
                if action.preempted_by is not None:
                    self.preempted[action.key] = action.preempted_by
                    self.edges.append((action.preempted_by, action.key))
                continue
            spec = self.desired.models[action.key]
            before = self.models[action.key].replicas if action.key in self.models else 0
            per = {"GPU": float(spec.gpus_per_replica)}
            self.models[action.key] = ActualModel(
                action.key,
                spec.served_name,
                action.spec_hash or "",
                replicas,
                ready_replicas=replicas,
                status="RUNNING",
                resources_per_replica=per,
            )
            for _ in range(before, replicas):
                self._place(action.key, per)
            if action.preempted_by is not None:
                self.preempted[action.key] = action.preempted_by
                self.edges.append((action.preempted_by, action.key))
        return result

    def push(self, user: str, i: int, what: tuple[str, int, int, str | None, int | None]) -> None:
        """Apply one generated push of ``user``'s (:data:`PUSH`) to the desired tree."""
        kind, gpus, replicas, priority, floor = what
        mine = sorted(k for k in {*self.desired.tasks, *self.desired.models} if k.user == user)
        if kind == "task":
            task = command_task(user, f"t{i}", gpus, priority, NOW + i)
            self.desired.tasks[task.key] = task
        elif kind in ("model", "sft"):
            if kind == "sft":
                self.finished_sft(user)
            spec = model(user, f"m{i}", replicas, gpus, priority, NOW + i, floor, from_task=kind == "sft")
            self.desired.models[spec.key] = spec
        elif kind in ("scale", "floor"):
            ours = [k for k in mine if k.kind == "model"]
            if ours:
                key = ours[i % len(ours)]
                # "floor" protects every replica: it drops min_replicas, or raises it to them all.
                spec = self.desired.models[key]
                edit = {"replicas": replicas} if kind == "scale" else {"min_replicas": floor and spec.replicas}
                self.desired.models[key] = replace(self.desired.models[key], **edit)
        elif kind == "bump":
            ours = [k for k in mine if k.kind == "model"]
            if ours:
                # A new spec (a restart, admitted as an update) of any size: one that waits or can
                # never fit keeps the old version running as it runs.
                key = ours[i % len(ours)]
                self.desired.models[key] = replace(self.desired.models[key], gpus_per_replica=gpus)
        elif kind == "break":
            if mine:
                # The file stops loading: the object is kept as it runs, its spec unknown.
                key = mine[i % len(mine)]
                self.desired.tasks.pop(key, None)
                self.desired.models.pop(key, None)
                self.desired.invalid[key] = [Issue(f"users/{user}/{key.kind}s/{key.name}.yaml", 1, "broken")]
        elif kind == "drop":
            # Every file of the user's at once: with few objects in the cluster, the mass-deletion
            # guard holds the deletions back and what runs keeps running.
            for key in mine:
                self.desired.tasks.pop(key, None)
                self.desired.models.pop(key, None)
        elif mine:
            key = mine[0]
            self.desired.tasks.pop(key, None)
            self.desired.models.pop(key, None)


# Any object a user may push: a task, a model with or without min_replicas, a model serving the
# user's finished training run (`source: task:`), a new replica count for one of the user's
# models, the removal of one of the user's objects, or ("floor") protecting every replica of one of
# the user's models by dropping min_replicas or raising it to its replicas (not in the spec hash:
# nothing restarts, admission never sees it); "bump": a new spec for one of the user's models (an
# update, which may wait or never fit); "break": one of the user's files stops loading; "drop": every
# file of the user's removed at once (which may trip the mass-deletion guard).
KINDS = ["task", "task", "model", "model", "sft", "scale", "delete"]
SIZES = (
    st.integers(1, 4),  # GPUs (a task's, or one replica's)
    st.integers(1, 3),  # replicas
    st.sampled_from([None, "high", "mid", "low"]),
    st.sampled_from([None, None, 0, 1, 2, 3]),  # min_replicas
)
WORK = st.tuples(st.sampled_from([*KINDS, "floor", "floor", "bump", "break", "drop"]), *SIZES)
ADMITTED = st.tuples(st.sampled_from(KINDS), *SIZES)  # every change goes through admission
ANYONE = st.sampled_from([*(m for ms in MEMBERS.values() for m in ms), LONER])
