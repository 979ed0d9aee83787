"""Actual state as plain data: what the observers report and what ``argus plan --actual`` reads.

JSON form (documented in docs/users/pr-workflow.md)::

    {"models": [{"user": "alice", "name": "chat", "served_name": "alice-202611291200-chat",
                 "spec_hash": "...", "replicas": 1, "ready_replicas": 1, "status": "RUNNING",
                 "message": "", "resources_per_replica": {"GPU": 1}}],
     "jobs": [{"submission_id": "argus--alice--grpo--1a2b3c4d", "user": "alice", "task": "grpo",
               "spec_hash": "...", "status": "RUNNING", "message": "", "resources": {"GPU": 2},
               "hf_checkpoint": null, "start_time": 0, "end_time": null}],
     "capacity": {"total": {"GPU": 8, "CPU": 64}, "available": {"GPU": 4, "CPU": 40},
                  "nodes": [{"node_id": "5f1e", "total": {"GPU": 4, "CPU": 32}, "available": {"GPU": 0, "CPU": 20}},
                            {"node_id": "9ab2", "total": {"GPU": 4, "CPU": 32}, "available": {"GPU": 4, "CPU": 20}}]},
     "first_seen": {"alice/tasks/grpo": 1767225600}}

``spec`` (optional, on models and jobs) is the spec the object was deployed or submitted with,
for field-level diffs; ``first_seen`` (optional) is when the daemon first saw each object;
``capacity.nodes`` (optional) is each alive node's resources: without it only the sums are
checked, with it a task's ``nodes`` x ``gpus_per_node`` and a model replica's GPUs must fit on
single nodes (:mod:`reconciler.plan.placement`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from reconciler.errors import PermanentError
from reconciler.spec.types import ObjectKey

Resources = Mapping[str, float]

# PREEMPTED: an attempt argus stopped to make room for other work; the run resumes in a new attempt.
PREEMPTED = "PREEMPTED"
FINAL_JOB_STATES = frozenset({"SUCCEEDED", "FAILED", "STOPPED", PREEMPTED})
ACTIVE_JOB_STATES = frozenset({"PENDING", "RUNNING"})
# A run the status branch recorded as submitted or running that Ray no longer knows: the
# head restarted under it. Final like the others: resubmitted only after `run:` is bumped.
LOST = "LOST"
LOST_REASON = "the Ray head restarted while it ran"


@dataclass(frozen=True)
class ActualModel:
    """One owned Serve application (one model)."""

    key: ObjectKey
    served_name: str
    spec_hash: str
    replicas: int  # target replicas in the deployed config
    ready_replicas: int = 0  # replicas in state RUNNING
    status: str = "DEPLOYING"  # Serve application status
    message: str = ""
    resources_per_replica: Resources = field(default_factory=dict)
    spec: Mapping[str, Any] | None = None  # the spec fields it was deployed with (field-level diffs)
    # What a real request through the endpoint found (reconciler.observe.probe); the defaults say
    # nothing was asked, and then Serve's status stands alone.
    awaiting_answer: bool = False  # Serve says RUNNING, but no answer came yet for these replicas
    answer_error: str = ""  # the endpoint's error answer (the engine's exception), when it failed

    def placed(self) -> dict[str, float]:
        """Resources Ray already counts as used by this model (its running replicas)."""
        return scale(self.resources_per_replica, self.ready_replicas)

    def committed(self) -> dict[str, float]:
        """Resources this model will hold once every target replica runs."""
        return scale(self.resources_per_replica, self.replicas)


@dataclass(frozen=True)
class ActualJob:
    """One owned Ray Job (one run of a task)."""

    submission_id: str
    key: ObjectKey
    spec_hash: str
    status: str  # PENDING RUNNING SUCCEEDED FAILED STOPPED
    message: str = ""
    resources: Resources = field(default_factory=dict)
    hf_checkpoint: str | None = None  # newest Hugging Face checkpoint folder, if any
    start_time: int | None = None  # epoch ms, as Ray reports
    end_time: int | None = None
    revision: str | None = None
    spec: Mapping[str, Any] | None = None  # the task spec it was submitted with (field-level diffs)
    checkpoint_step: int | None = None  # a running run's newest checkpoint step (its run folder's tracker)
    resumed_from_step: int | None = None  # a resumed attempt: the checkpoint step it resumed from (0: none)
    # The run's life as the daemon itself saw it (UTC epoch seconds to the millisecond, its own clock; None: not
    # seen): when argus recorded it before submitting it, when it first saw it RUNNING and when it
    # first saw it ended. Transition times, kept in the run record (reconciler/observe/sightings.py);
    # start_time and end_time are Ray's, bounded by these.
    submitted_at: float | None = None
    seen_running: float | None = None
    seen_ended: float | None = None

    @property
    def active(self) -> bool:
        return self.status in ACTIVE_JOB_STATES

    def placed(self) -> dict[str, float]:
        return dict(self.resources) if self.status == "RUNNING" else {}

    def committed(self) -> dict[str, float]:
        return dict(self.resources) if self.active else {}


@dataclass(frozen=True)
class NodeCapacity:
    """One alive Ray node's resources (``total`` and currently ``available``), by Ray's node id."""

    node_id: str
    total: Resources = field(default_factory=dict)
    available: Resources = field(default_factory=dict)


@dataclass(frozen=True)
class Capacity:
    """Cluster resources as Ray reports them (``total`` and currently ``available``), summed over
    nodes, and per node (``nodes``; empty: not known, and only the sums are checked)."""

    total: Resources = field(default_factory=dict)
    available: Resources = field(default_factory=dict)
    nodes: tuple[NodeCapacity, ...] = ()


@dataclass
class ActualState:
    """What runs, plus what the status branch remembers.

    ``recorded_runs``: runs the status branch recorded (the durable record: Ray forgets every
    job when its head restarts without GCS fault tolerance). ``foreign_ids``: submission ids
    held by jobs argus cannot prove it submitted (never adopted, never reused).
    """

    models: dict[ObjectKey, ActualModel] = field(default_factory=dict)
    jobs: list[ActualJob] = field(default_factory=list)
    capacity: Capacity = field(default_factory=Capacity)
    recorded_runs: list[ActualJob] = field(default_factory=list)
    foreign_ids: frozenset[str] = frozenset()
    # When the daemon first saw each object (UTC epoch seconds), from the status branch: the
    # first-come-first-served order, which an author cannot change by back-dating commits.
    first_seen: dict[ObjectKey, int] = field(default_factory=dict)
    # Objects argus preempted and which object it preempted them for (from the status branch):
    # a preempted object is never readmitted ahead of its preemptor, nor preempts it back.
    preempted: dict[ObjectKey, ObjectKey] = field(default_factory=dict)
    # Attempts argus stopped for preemption that Ray still reports active: they hold their
    # resources until the stop lands, but their status (and their run record) is PREEMPTED.
    stopping: frozenset[str] = frozenset()

    def jobs_of(self, key: ObjectKey) -> list[ActualJob]:
        return [j for j in self.jobs if j.key == key]

    def runs(self) -> list[ActualJob]:
        """Every run of every task: Ray's jobs, then recorded runs Ray no longer knows.

        A forgotten run recorded in a final state keeps it; one recorded as submitted or
        running is ``LOST`` (it may have run: it is never resubmitted by itself).
        """
        if not self.recorded_runs:
            return list(self.jobs)
        known = {j.submission_id for j in self.jobs}
        out = list(self.jobs)
        for run in self.recorded_runs:
            # A foreign job holding a recorded id voids only a record that may never have run
            # (recorded, then refused by Ray); a final record stands: argus saw its own job end
            # (job code can delete that job and squat its id, or Ray keeps a bare entry of it).
            squatted = run.submission_id in self.foreign_ids and run.status not in FINAL_JOB_STATES
            if run.submission_id in known or squatted:
                continue
            known.add(run.submission_id)
            if run.status not in FINAL_JOB_STATES and run.status != LOST:
                run = replace(run, status=LOST, message=LOST_REASON, resources={})
            out.append(run)
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "models": [
                {
                    "user": m.key.user,
                    "name": m.key.name,
                    "served_name": m.served_name,
                    "spec_hash": m.spec_hash,
                    "replicas": m.replicas,
                    "ready_replicas": m.ready_replicas,
                    "status": m.status,
                    "message": m.message,
                    "resources_per_replica": dict(m.resources_per_replica),
                    **({"spec": dict(m.spec)} if m.spec is not None else {}),
                }
                for m in sorted(self.models.values(), key=lambda m: m.key)
            ],
            "jobs": [
                {
                    "submission_id": j.submission_id,
                    "user": j.key.user,
                    "task": j.key.name,
                    "spec_hash": j.spec_hash,
                    "status": j.status,
                    "message": j.message,
                    "resources": dict(j.resources),
                    "hf_checkpoint": j.hf_checkpoint,
                    "start_time": j.start_time,
                    "end_time": j.end_time,
                    "revision": j.revision,
                    **({"spec": dict(j.spec)} if j.spec is not None else {}),
                }
                for j in sorted(self.jobs, key=lambda j: j.submission_id)
            ],
            "capacity": {
                "total": dict(self.capacity.total),
                "available": dict(self.capacity.available),
                **({"nodes": [_node_json(n) for n in self.capacity.nodes]} if self.capacity.nodes else {}),
            },
            "recorded_runs": [
                {
                    "submission_id": j.submission_id,
                    "user": j.key.user,
                    "task": j.key.name,
                    "spec_hash": j.spec_hash,
                    "status": j.status,
                    "hf_checkpoint": j.hf_checkpoint,
                }
                for j in sorted(self.recorded_runs, key=lambda j: j.submission_id)
            ],
            "foreign_ids": sorted(self.foreign_ids),
            **({"first_seen": {str(k): v for k, v in sorted(self.first_seen.items())}} if self.first_seen else {}),
            **({"preempted": {str(k): str(v) for k, v in sorted(self.preempted.items())}} if self.preempted else {}),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ActualState:
        """Parse the documented JSON form. Raises PermanentError naming the bad entry."""
        try:
            models = {}
            for m in data.get("models", []):
                key = ObjectKey(m["user"], "model", m["name"])
                models[key] = ActualModel(
                    key=key,
                    served_name=m.get("served_name", ""),
                    spec_hash=m.get("spec_hash", ""),
                    replicas=int(m.get("replicas", 1)),
                    ready_replicas=int(m.get("ready_replicas", 0)),
                    status=m.get("status", "RUNNING"),
                    message=m.get("message", ""),
                    resources_per_replica={k: float(v) for k, v in m.get("resources_per_replica", {}).items()},
                    spec=_mapping(m.get("spec")),
                )
            jobs = [
                ActualJob(
                    submission_id=j["submission_id"],
                    key=ObjectKey(j["user"], "task", j["task"]),
                    spec_hash=j.get("spec_hash", ""),
                    status=j["status"],
                    message=j.get("message", ""),
                    resources={k: float(v) for k, v in j.get("resources", {}).items()},
                    hf_checkpoint=j.get("hf_checkpoint"),
                    start_time=j.get("start_time"),
                    end_time=j.get("end_time"),
                    revision=j.get("revision"),
                    spec=_mapping(j.get("spec")),
                )
                for j in data.get("jobs", [])
            ]
            recorded = [
                ActualJob(
                    submission_id=j["submission_id"],
                    key=ObjectKey(j["user"], "task", j["task"]),
                    spec_hash=j.get("spec_hash", ""),
                    status=j["status"],
                    hf_checkpoint=j.get("hf_checkpoint"),
                )
                for j in data.get("recorded_runs", [])
            ]
            foreign = frozenset(str(s) for s in data.get("foreign_ids", []))
            first_seen = {ObjectKey.parse(k): int(v) for k, v in (data.get("first_seen") or {}).items()}
            preempted = {ObjectKey.parse(k): ObjectKey.parse(v) for k, v in (data.get("preempted") or {}).items()}
            cap = data.get("capacity", {})
            capacity = Capacity(
                total={k: float(v) for k, v in cap.get("total", {}).items()},
                available={k: float(v) for k, v in cap.get("available", {}).items()},
                nodes=tuple(
                    NodeCapacity(
                        node_id=str(n["node_id"]),
                        total={k: float(v) for k, v in n.get("total", {}).items()},
                        available={k: float(v) for k, v in n.get("available", {}).items()},
                    )
                    for n in cap.get("nodes") or []
                ),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            what = f"missing field {exc.args[0]!r}" if isinstance(exc, KeyError) else str(exc)
            raise PermanentError(f"actual-state JSON is malformed: {what}") from exc
        return cls(
            models=models,
            jobs=jobs,
            capacity=capacity,
            recorded_runs=recorded,
            foreign_ids=foreign,
            first_seen=first_seen,
            preempted=preempted,
        )


def _node_json(node: NodeCapacity) -> dict[str, Any]:
    return {"node_id": node.node_id, "total": dict(node.total), "available": dict(node.available)}


def _mapping(value: object) -> Mapping[str, Any] | None:
    """A recorded spec, when it is a mapping (anything else is ignored: diffs are a courtesy)."""
    return dict(value) if isinstance(value, Mapping) else None


def scale(resources: Resources, n: float) -> dict[str, float]:
    return {k: v * n for k, v in resources.items() if v * n}


def add(a: Resources, b: Resources) -> dict[str, float]:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0.0) + v
    return out


def sub(a: Resources, b: Resources) -> dict[str, float]:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0.0) - v
    return out
