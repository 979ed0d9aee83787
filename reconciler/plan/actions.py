"""Actions a plan is made of, and their one sort order. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from reconciler.spec.types import ObjectKey


class ActionType(StrEnum):
    DEPLOY_MODEL = "deploy_model"
    UPDATE_MODEL = "update_model"  # needs a restart: source, engine, GPUs or env changed
    SCALE_MODEL = "scale_model"  # replicas only: in place
    DELETE_MODEL = "delete_model"
    STOP_MODEL = "stop_model"  # replicas: 0: the Serve app goes, the name, file and status stay
    SUBMIT_TASK = "submit_task"
    STOP_TASK = "stop_task"
    QUEUE = "queue"  # not admitted; the reason names the shortfall
    UNSCHEDULABLE = "unschedulable"  # larger than the whole cluster or the user's quota: never admitted as written
    KEEP = "keep"  # left exactly as it runs (invalid file, suspended, held deletion)


# Stops and deletions first (they free capacity), then changes to running things, then new work.
ORDER = {
    ActionType.STOP_TASK: 0,
    ActionType.DELETE_MODEL: 1,
    ActionType.STOP_MODEL: 1,
    ActionType.UPDATE_MODEL: 2,
    ActionType.SCALE_MODEL: 3,
    ActionType.DEPLOY_MODEL: 4,
    ActionType.SUBMIT_TASK: 5,
    ActionType.QUEUE: 6,
    ActionType.UNSCHEDULABLE: 7,
    ActionType.KEEP: 8,
}

CHANGES = frozenset(ORDER) - {ActionType.KEEP, ActionType.QUEUE, ActionType.UNSCHEDULABLE}


@dataclass(frozen=True)
class Action:
    """One step with a human reason. Fields beyond ``type``/``key``/``reason`` are set when they apply."""

    type: ActionType
    key: ObjectKey
    reason: str
    spec_hash: str | None = None
    replicas: int | None = None  # target replicas (models)
    source_path: str | None = None  # resolved model folder (deploy/update/scale)
    submission_id: str | None = None  # job to submit or stop
    demand: Mapping[str, float] = field(default_factory=dict)  # resources this action adds
    held: bool = False  # a deletion or stop the mass-deletion guard holds back
    changed: tuple[str, ...] = ()  # field-level diff, "field: old → new" (update_model, stop_task)
    preempted_by: ObjectKey | None = None  # a stop or scale-down that makes room for this object
    preemption: str | None = None  # why it may: "reclaim" or "within team"
    resume_from: str | None = None  # submit_task: the preempted attempt this one resumes
    first_attempt: str | None = None  # submit_task resuming: the run's first attempt (verl's checkpoints)
    position: int | None = None  # queue: place among the waiting objects (1 = next)

    @property
    def sort_key(self) -> tuple[int, ObjectKey, str]:
        return (ORDER[self.type], self.key, self.submission_id or "")

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"action": self.type.value, "object": str(self.key), "reason": self.reason}
        for name in ("spec_hash", "replicas", "source_path", "submission_id"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.demand:
            out["demand"] = dict(self.demand)
        if self.held:
            out["held"] = True
        if self.changed:
            out["changed"] = list(self.changed)
        if self.preempted_by is not None:
            out["preempted_by"] = str(self.preempted_by)
            out["preemption"] = self.preemption
        for name in ("resume_from", "first_attempt", "position"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out


@dataclass
class Plan:
    """Ordered actions plus plan-wide notes (guard held deletions, cluster.yaml invalid, ...).

    ``first_seen``: the admission order time of every desired object (the recorded first
    sighting, or the planner's ``now`` for objects seen for the first time), for the status
    branch to record. ``frozen``: cluster.yaml is invalid, so nothing at all is applied.
    """

    actions: list[Action] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    deletions_held: bool = False
    frozen: bool = False
    first_seen: dict[ObjectKey, int] = field(default_factory=dict)
    # Per queue (team; "" for users in no team) once the plan is applied: nominal, used,
    # borrowed, lent quota and fair share (empty when cluster.yaml declares no teams).
    teams: dict[str, dict[str, object]] = field(default_factory=dict)

    @property
    def preemptions(self) -> list[Action]:
        """The stops and scale-downs that make room for waiting work."""
        return [a for a in self.actions if a.preempted_by is not None]

    @property
    def has_changes(self) -> bool:
        """True when anything is to be applied or is waiting (terraform's exit code 2)."""
        return bool(self._changing())

    @property
    def held(self) -> list[Action]:
        """Deletions (and stops) the mass-deletion guard holds back."""
        return [a for a in self.actions if a.type is ActionType.KEEP and a.held]

    @property
    def changes(self) -> list[Action]:
        """The actions other than KEEP, in the plan's order (at scale, a few among many KEEPs)."""
        actions = self.actions
        return [actions[i] for i in self._changing()]

    def of(self, *types: ActionType) -> list[Action]:
        """The actions of ``types``, in the plan's order."""
        if ActionType.KEEP in types:
            return [a for a in self.actions if a.type in types]
        actions = self.actions
        return [actions[i] for i in self._changing() if actions[i].type in types]

    def for_key(self, key: ObjectKey) -> list[Action]:
        """The actions of object ``key``, in the plan's order."""
        by_key: dict[ObjectKey, list[int]] | None = self._memo("_by_key_at")
        if by_key is None:
            by_key = {}
            for i, action in enumerate(self.actions):
                by_key.setdefault(action.key, []).append(i)
            self._remember("_by_key_at", by_key)
        return [self.actions[i] for i in by_key.get(key, ())]

    # Most of a plan at scale is KEEP (one per object in sync): the other actions' places and the
    # actions by object are found once per list of actions, not on every lookup (at 100,000
    # objects a scan per lookup cost 40 ms, and a scan per running model was quadratic).
    def _changing(self) -> list[int]:
        """Where the actions other than KEEP are, in order."""
        at: list[int] | None = self._memo("_changing_at")
        if at is None:
            keep = ActionType.KEEP
            at = [i for i, a in enumerate(self.actions) if a.type is not keep]
            self._remember("_changing_at", at)
        return at

    def _memo(self, name: str) -> Any:
        """What :meth:`_remember` kept under ``name`` for the list of actions the plan holds now."""
        kept = self.__dict__.get(name)
        actions = self.actions
        return kept[2] if kept is not None and kept[0] is actions and kept[1] == len(actions) else None

    def _remember(self, name: str, value: Any) -> None:
        self.__dict__[name] = (self.actions, len(self.actions), value)

    def to_json(self) -> dict[str, object]:
        return {
            "changes": self.has_changes,
            "deletions_held": self.deletions_held,
            "frozen": self.frozen,
            "notes": list(self.notes),
            "actions": [a.to_json() for a in self.actions],
            **({"teams": self.teams} if self.teams else {}),
        }
