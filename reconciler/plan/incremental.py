"""The planner and the assessment, revisiting only the objects whose inputs changed. Pure.

:class:`IncrementalPlanner` returns exactly what :func:`reconciler.plan.planner.plan` and
:func:`reconciler.plan.assess.assess` return for the same inputs, with the same code
(:func:`~reconciler.plan.planner.model_step`, :func:`~reconciler.plan.planner.task_step`,
:func:`~reconciler.plan.assess.object_status`): per object it keeps the last result and the
inputs it was computed from, and computes again only when one of them differs.

- A spec is unchanged when it is the same object (the incremental loader keeps the objects of
  unchanged folders), or an equal one with the same spec hash (``==`` alone would take
  ``1`` for ``true``, and a task's ``raw`` is not compared).
- Ray's answers (an :class:`~reconciler.plan.actual.ActualModel`, a task's runs) are unchanged
  when they are equal (``==``: they are frozen values, rebuilt by every observation).
- cluster.yaml feeds every object: when it changes (``==``), everything is computed again.
- Foreign job ids feed only the tasks whose submission ids they could hold: each task's step
  records the ids it asked about, and only tasks that asked about an id that came or went
  are computed again.
- The plan's one sort order is kept as a sorted list, updated by insertion and removal.

The mass-deletion guard and admission run in full on every plan, as in the full planner: they
cost nothing when no object waits for admission (and no team is declared) and nothing is
deleted; otherwise they are linear in the actual state.

Memory: one entry per object that exists now (objects gone are dropped on every call).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from operator import itemgetter

from reconciler.plan.actions import Action, ActionType, Plan
from reconciler.plan.actual import ActualJob, ActualModel, ActualState, Capacity
from reconciler.plan.admission import Candidate, admit
from reconciler.plan.assess import ObjectStatus, object_status
from reconciler.plan.moved import moved
from reconciler.plan.planner import (
    Order,
    Step,
    admission_times,
    first_issue,
    guard,
    model_step,
    runs_by_key,
    source_checkpoint,
    task_step,
)
from reconciler.plan.planner import plan as full_plan
from reconciler.spec.hashing import model_spec_hash, task_spec_hash
from reconciler.spec.types import ClusterSpec, DesiredState, ModelSpec, ObjectKey, TaskSpec

# Above this many changed sort entries, the sorted list is rebuilt rather than edited in place.
REBUILD_AT = 64

_MODELS, _TASKS, _ADMITTED, _GUARDED = 0, 1, 2, 3  # where an action comes from, in the full planner's order
_first = itemgetter(0)

SortKey = tuple[int, ObjectKey, str, int, int]


def _sort_key(action: Action, phase: int, index: int) -> SortKey:
    """The plan's sort order (:attr:`Action.sort_key`), ties broken as the full planner's stable
    sort breaks them: by where the action comes from, then by its place there."""
    return (*action.sort_key, phase, index)


@dataclass(eq=False)
class _ModelEntry:
    spec: ModelSpec | None
    live: ActualModel | None
    issue: str | None
    checkpoint: str | None
    step: Step


@dataclass(eq=False)
class _TaskEntry:
    spec: TaskSpec | None
    jobs: list[ActualJob]
    issue: str | None
    asked: tuple[str, ...]  # the foreign ids its step asked about
    step: Step


@dataclass(frozen=True)
class _Seen:
    """What the last assessment read, per source (shallow copies: callers change their dicts)."""

    models: dict[ObjectKey, ModelSpec]
    tasks: dict[ObjectKey, TaskSpec]
    invalid: frozenset[ObjectKey]
    live: dict[ObjectKey, ActualModel]
    runs: dict[ObjectKey, list[ActualJob]]
    stopping: frozenset[str]
    actions: dict[ObjectKey, list[Action]] | None  # None: the planner's own plan (see _actions_of)
    done: frozenset[ObjectKey]
    first_seen: dict[ObjectKey, int]
    preempted: dict[ObjectKey, ObjectKey]


def _mark(marks: set[ObjectKey], key: ObjectKey, on: bool) -> None:
    if on:
        marks.add(key)
    else:
        marks.discard(key)


class _Asking:
    """``foreign_ids``, recording every id asked about (what a task's step depends on)."""

    def __init__(self, ids: frozenset[str]) -> None:
        self.ids = ids
        self.asked: list[str] = []

    def __contains__(self, sid: object) -> bool:
        self.asked.append(str(sid))
        return sid in self.ids


def _same_model_spec(
    new: ModelSpec | None, old: ModelSpec | None, cluster: ClusterSpec, checkpoint: str | None
) -> bool:
    if new is old:
        return True
    if new is None or old is None or new != old:
        return False
    return model_spec_hash(new, cluster, checkpoint) == model_spec_hash(old, cluster, checkpoint)


def _same_task_spec(new: TaskSpec | None, old: TaskSpec | None) -> bool:
    if new is old:
        return True
    if new is None or old is None or new != old:
        return False
    return task_spec_hash(new) == task_spec_hash(old)


class IncrementalPlanner:
    """``plan`` and ``assess`` as the full planner and assessment compute them, from memos.

    ``recomputed`` and ``reassessed``: how many objects the last ``plan`` and the last ``assess``
    computed again (tests and benchmarks).
    """

    def __init__(self) -> None:
        self.recomputed = 0
        self.reassessed = 0
        self.forget()

    def forget(self) -> None:
        """Drop every memo, as a restarted daemon starts."""
        self._cluster: ClusterSpec | None = None
        self._models: dict[ObjectKey, _ModelEntry] = {}
        self._tasks: dict[ObjectKey, _TaskEntry] = {}
        self._foreign: frozenset[str] = frozenset()
        self._askers: dict[str, set[ObjectKey]] = {}  # foreign id asked about -> tasks that asked
        self._keys: list[SortKey] = []  # the sort keys of every step's direct actions, sorted
        self._actions: list[Action] = []  # the actions of _keys, in the same order
        self._waiting: tuple[set[ObjectKey], set[ObjectKey]] = (set(), set())  # candidates (models, tasks)
        self._deleting: tuple[set[ObjectKey], set[ObjectKey]] = (set(), set())
        self._busy: tuple[set[ObjectKey], set[ObjectKey]] = (set(), set())
        self._statuses: dict[ObjectKey, ObjectStatus] = {}
        self._seen: _Seen | None = None
        # The change feed (DesiredState.serial/changed): the serial of the state the memo was
        # planned from (0: none), and the objects whose memo entry depends on more than their own
        # file: models Ray runs or that deploy a task's output, tasks with runs.
        self._serial = 0
        self._live: set[ObjectKey] = set()
        self._sourced: set[ObjectKey] = set()
        self._ran: set[ObjectKey] = set()
        # What the last plan made, for the assessment of that very plan: the plan, its list of
        # actions, the objects whose actions may differ from the plan before it, and the
        # admitted and guarded actions by object (the rest of an object's actions are its step's).
        self._planned: tuple[Plan, list[Action], int] | None = None
        self._acted: set[ObjectKey] = set()
        self._extra: dict[ObjectKey, list[tuple[SortKey, Action]]] = {}
        self._assessed_serial = 0  # the serial of the desired state the statuses were assessed on
        self._plans = 0  # how many plans this planner made
        self._assessed_plan = -1  # which of them the statuses were assessed on (-1: another plan)
        self._status_order: list[ObjectKey] = []
        self._status_keys: set[ObjectKey] = set()

    # -- plan -------------------------------------------------------------------------------

    def plan(
        self,
        desired: DesiredState,
        actual: ActualState,
        capacity: Capacity | None = None,
        *,
        first_seen: Mapping[ObjectKey, int] | None = None,
        now: int | None = None,
        recheck: Collection[ObjectKey] | None = None,
    ) -> Plan:
        """Return what :func:`reconciler.plan.planner.plan` returns for the same arguments.
        Raises what it raises; then every memo is dropped (a half-updated memo is never reused)."""
        try:
            return self._plan(desired, actual, capacity, first_seen, now, recheck)
        except BaseException:
            self.forget()
            raise

    def _plan(
        self,
        desired: DesiredState,
        actual: ActualState,
        capacity: Capacity | None,
        first_seen: Mapping[ObjectKey, int] | None,
        now: int | None,
        recheck: Collection[ObjectKey] | None,
    ) -> Plan:
        if not desired.cluster_valid:  # nothing is planned per object: the full planner's few lines
            self.recomputed = 0
            self._serial = 0
            self._planned = None
            return full_plan(desired, actual, capacity, first_seen=first_seen, now=now, recheck=recheck)
        capacity = capacity if capacity is not None else actual.capacity
        seen = first_seen if first_seen is not None else actual.first_seen
        result = Plan(first_seen=admission_times(desired, seen, now, recheck))
        cluster = desired.cluster
        if cluster is not self._cluster and cluster != self._cluster:
            self.forget()
        self._cluster = cluster
        self.recomputed = 0
        removed: list[SortKey] = []
        added: list[tuple[SortKey, Action]] = []
        runs = runs_by_key(actual)
        # Told which objects' files changed since the state the memo holds, only they and the
        # objects whose entries depend on Ray are looked at (else every object).
        follows = desired.changed is not None and self._serial != 0 and desired.changed[0] == self._serial
        moved = desired.changed[1] if follows and desired.changed is not None else None
        self._serial = 0  # until this plan is made whole
        self._planned = None
        self._acted = set(self._extra)  # the last plan's admitted and guarded actions' objects
        self._plan_models(desired, actual, runs, removed, added, moved)
        self._plan_tasks(desired, actual, runs, removed, added, moved)
        self._resort(removed, added)

        order = Order(seen, now)
        cands: list[Candidate] = []
        deletions: list[Action] = []
        for phase, memo in ((_MODELS, self._models), (_TASKS, self._tasks)):
            for key in sorted(self._waiting[phase]):
                step = memo[key].step
                assert step.action is not None and step.request is not None
                cands.append(Candidate(order.of(key, step.created_at), step.action, step.request))
            for key in sorted(self._deleting[phase]):
                deletions.extend(memo[key].step.deletions)
        # The guard first, as in the full planner: an object whose deletion it holds keeps running
        # and stays preemptible unless its step changes it otherwise.
        guarded = guard(desired, actual, deletions, result)
        busy = set(self._busy[_MODELS] | self._busy[_TASKS])
        held = {a.key for a in guarded if a.held}
        for phase, memo in ((_MODELS, self._models), (_TASKS, self._tasks)):
            for key in held & self._deleting[phase]:
                step = memo[key].step
                if step.action is None and all(a.type is ActionType.KEEP for a in step.out):
                    busy.discard(key)
        extra = [
            (_sort_key(a, _ADMITTED, i), a)
            for i, a in enumerate(admit(desired, actual, capacity, cands, result, now=now, busy=frozenset(busy)))
        ]
        extra.extend((_sort_key(a, _GUARDED, i), a) for i, a in enumerate(guarded))
        result.actions = self._merged(extra)
        self._serial = desired.serial
        self._extra = {}
        for pair in extra:
            self._extra.setdefault(pair[1].key, []).append(pair)
        self._acted.update(self._extra)
        self._planned = (result, result.actions, len(result.actions))
        self._plans += 1
        return result

    def _plan_models(
        self,
        desired: DesiredState,
        actual: ActualState,
        runs: Mapping[ObjectKey, list[ActualJob]],
        removed: list[SortKey],
        added: list[tuple[SortKey, Action]],
        moved: frozenset[ObjectKey] | None,
    ) -> None:
        cluster, memo = desired.cluster, self._models
        invalid = {k for k in desired.invalid if k.kind == "model"}
        if moved is None:
            keys = set(desired.models) | set(actual.models) | invalid
            gone = memo.keys() - keys
        else:
            keys = {k for k in moved if k.kind == "model"} | actual.models.keys() | self._live | self._sourced | invalid
            gone = {k for k in keys if k not in desired.models and k not in actual.models and k not in invalid}
            keys -= gone
            gone &= memo.keys()
        for key in gone:
            self._drop(_MODELS, key, memo.pop(key).step, removed)
            self._live.discard(key)
            self._sourced.discard(key)
        for key in keys:
            spec, live = desired.models.get(key), actual.models.get(key)
            issue = first_issue(desired, key) if key in invalid else None
            checkpoint = source_checkpoint(spec, runs) if spec is not None else None
            entry = memo.get(key)
            if (
                entry is not None
                and (live is entry.live or live == entry.live)
                and issue == entry.issue
                and checkpoint == entry.checkpoint
                and _same_model_spec(spec, entry.spec, cluster, checkpoint)
            ):
                continue
            step = model_step(key, spec, live, issue, cluster, checkpoint)
            self._swap(_MODELS, key, entry.step if entry is not None else None, step, removed, added)
            memo[key] = _ModelEntry(spec, live, issue, checkpoint, step)
            _mark(self._live, key, live is not None)
            _mark(self._sourced, key, spec is not None and bool(spec.source_task))

    def _plan_tasks(
        self,
        desired: DesiredState,
        actual: ActualState,
        runs: Mapping[ObjectKey, list[ActualJob]],
        removed: list[SortKey],
        added: list[tuple[SortKey, Action]],
        moved: frozenset[ObjectKey] | None,
    ) -> None:
        cluster, memo = desired.cluster, self._tasks
        invalid = {k for k in desired.invalid if k.kind == "task"}
        jobs_of = {j.key for j in actual.jobs}
        foreign = actual.foreign_ids
        stale: set[ObjectKey] = set()
        if foreign is not self._foreign and foreign != self._foreign:
            for sid in foreign ^ self._foreign:
                stale |= self._askers.get(sid, set())
        if moved is None:
            keys = set(desired.tasks) | invalid | jobs_of
            leaving = memo.keys() - keys
        else:
            keys = {k for k in moved if k.kind == "task"} | invalid | jobs_of | runs.keys() | self._ran | stale
            leaving = {k for k in keys if k not in desired.tasks and k not in invalid and k not in jobs_of}
            keys -= leaving
            leaving &= memo.keys()
        for key in leaving:
            gone = memo.pop(key)
            self._unask(key, gone.asked)
            self._drop(_TASKS, key, gone.step, removed)
            self._ran.discard(key)
        self._foreign = foreign
        for key in keys:
            spec, jobs = desired.tasks.get(key), runs.get(key, [])
            issue = first_issue(desired, key) if key in invalid else None
            entry = memo.get(key)
            if (
                entry is not None
                and key not in stale
                and issue == entry.issue
                and jobs == entry.jobs
                and _same_task_spec(spec, entry.spec)
            ):
                continue
            asking = _Asking(foreign)
            step = task_step(key, spec, jobs, issue, cluster, asking)
            if entry is not None:
                self._unask(key, entry.asked)
            for sid in asking.asked:
                self._askers.setdefault(sid, set()).add(key)
            self._swap(_TASKS, key, entry.step if entry is not None else None, step, removed, added)
            memo[key] = _TaskEntry(spec, jobs, issue, tuple(asking.asked), step)
            _mark(self._ran, key, bool(jobs))

    def _unask(self, key: ObjectKey, asked: tuple[str, ...]) -> None:
        for sid in asked:
            keys = self._askers.get(sid)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._askers[sid]

    def _swap(
        self,
        phase: int,
        key: ObjectKey,
        old: Step | None,
        new: Step,
        removed: list[SortKey],
        added: list[tuple[SortKey, Action]],
    ) -> None:
        self.recomputed += 1
        self._acted.add(key)
        if old is not None:
            self._drop(phase, key, old, removed)
        added.extend((_sort_key(a, phase, i), a) for i, a in enumerate(new.out))
        for marks, on in ((self._waiting, new.action is not None), (self._deleting, bool(new.deletions))):
            if on:
                marks[phase].add(key)
        if new.busy:
            self._busy[phase].add(key)

    def _drop(self, phase: int, key: ObjectKey, old: Step, removed: list[SortKey]) -> None:
        self._acted.add(key)
        removed.extend(_sort_key(a, phase, i) for i, a in enumerate(old.out))
        for marks in (self._waiting, self._deleting, self._busy):
            marks[phase].discard(key)

    def _resort(self, removed: list[SortKey], added: list[tuple[SortKey, Action]]) -> None:
        """Apply the changed steps' actions to the sorted list (rebuilt when many changed)."""
        if len(removed) + len(added) > max(REBUILD_AT, len(self._keys) // 8):
            pairs = [
                (_sort_key(a, phase, i), a)
                for phase, memo in ((_MODELS, self._models), (_TASKS, self._tasks))
                for entry in memo.values()
                for i, a in enumerate(entry.step.out)
            ]
            pairs.sort(key=_first)
            self._keys = [k for k, _ in pairs]
            self._actions = [a for _, a in pairs]
            return
        for sort_key in removed:
            at = bisect_left(self._keys, sort_key)
            del self._keys[at], self._actions[at]
        for sort_key, action in added:
            at = bisect_left(self._keys, sort_key)
            self._keys.insert(at, sort_key)
            self._actions.insert(at, action)

    def _merged(self, extra: list[tuple[SortKey, Action]]) -> list[Action]:
        """Every action of the plan in its one order: the steps' sorted list with ``extra`` merged in."""
        if not extra:
            return list(self._actions)
        if len(extra) <= REBUILD_AT:
            keys, actions = list(self._keys), list(self._actions)
            for sort_key, action in sorted(extra, key=_first):
                at = bisect_left(keys, sort_key)
                keys.insert(at, sort_key)
                actions.insert(at, action)
            return actions
        pairs = [*zip(self._keys, self._actions, strict=True), *extra]
        pairs.sort(key=_first)  # two sorted runs: a linear merge
        return [a for _, a in pairs]

    # -- assess -----------------------------------------------------------------------------

    def assess(
        self, desired: DesiredState, actual: ActualState, plan: Plan, applied: set[ObjectKey] | None = None
    ) -> dict[ObjectKey, ObjectStatus]:
        """Return what :func:`reconciler.plan.assess.assess` returns for the same arguments (the
        same status values as the last call for the objects whose inputs did not change). Raises
        what it raises; then every memo is dropped."""
        try:
            return self._assess(desired, actual, plan, applied)
        except BaseException:
            self.forget()
            raise

    def _assess(
        self, desired: DesiredState, actual: ActualState, plan: Plan, applied: set[ObjectKey] | None
    ) -> dict[ObjectKey, ObjectStatus]:
        keys = desired.keys() | set(actual.models) | {j.key for j in actual.jobs if j.active}
        self._reorder(keys)
        # The plan this planner just made (and nothing changed it since): each object's actions are
        # its step's and its admitted or guarded ones, and only the objects it acted on may differ.
        made = self._planned
        planned = made is not None and made[0] is plan and made[1] is plan.actions and made[2] == len(plan.actions)
        by_key: dict[ObjectKey, list[Action]] | None = None
        if not planned:
            by_key = {}
            for action in plan.actions:
                by_key.setdefault(action.key, []).append(action)
        runs = runs_by_key(actual)
        seen = _Seen(
            dict(desired.models),
            dict(desired.tasks),
            frozenset(desired.invalid),
            dict(actual.models),
            runs,
            actual.stopping,
            by_key,
            frozenset(keys if applied is None else keys & applied),
            dict(plan.first_seen),
            dict(actual.preempted),
        )
        last, self._seen = self._seen, seen
        follows = desired.changed is not None and self._assessed_serial != 0
        follows = follows and desired.changed is not None and desired.changed[0] == self._assessed_serial
        self._assessed_serial = 0
        memo = self._statuses
        if last is None:
            dirty = set(keys)
        else:
            # Everything a status reads (object_status), source by source: only these keys change.
            if follows and desired.changed is not None:  # the change feed names the specs that moved
                dirty = set(desired.changed[1])
            else:
                dirty = moved(seen.models, last.models, same_object=True)
                dirty |= moved(seen.tasks, last.tasks, same_object=True)
                dirty |= seen.invalid ^ last.invalid
            dirty |= moved(seen.live, last.live)
            dirty |= moved(seen.runs, last.runs)
            if seen.stopping != last.stopping:
                dirty |= seen.runs.keys() | last.runs.keys()
            if seen.actions is not None and last.actions is not None:
                dirty |= moved(seen.actions, last.actions)
            elif planned and self._assessed_plan == self._plans - 1:  # the plan after the one assessed
                dirty |= self._acted
            elif not (planned and self._assessed_plan == self._plans):  # else: the same plan again
                dirty |= keys
            dirty |= seen.done ^ last.done
            dirty |= moved(seen.first_seen, last.first_seen)
            dirty |= moved(seen.preempted, last.preempted)
            dirty |= keys - memo.keys()
        self.reassessed = 0
        for key in dirty & keys:
            self.reassessed += 1
            done = key in seen.done
            actions = by_key.get(key, []) if by_key is not None else self._actions_of(key)
            memo[key] = object_status(key, desired, actual, actions, done, runs.get(key, []), plan)
        self._assessed_serial = desired.serial
        self._assessed_plan = self._plans if planned else -1
        # Statuses are values: the memo's own are handed out (an amended one is a new value).
        order = self._status_order
        return dict(zip(order, map(memo.__getitem__, order), strict=True))

    def _actions_of(self, key: ObjectKey) -> list[Action]:
        """``key``'s actions in the plan this planner made last, in the plan's order."""
        pairs = list(self._extra.get(key, ()))
        for phase, memo in ((_MODELS, self._models), (_TASKS, self._tasks)):
            entry = memo.get(key)
            if entry is not None:
                pairs.extend((_sort_key(a, phase, i), a) for i, a in enumerate(entry.step.out))
        pairs.sort(key=_first)
        return [a for _, a in pairs]

    def _reorder(self, keys: set[ObjectKey]) -> None:
        """Keep the status keys sorted (the full assessment's order) and drop the memos of keys gone."""
        if keys == self._status_keys:
            return
        gone, new = self._status_keys - keys, keys - self._status_keys
        for key in gone:
            self._statuses.pop(key, None)
        if len(gone) + len(new) > REBUILD_AT:
            self._status_order = sorted(keys)
        else:
            for key in gone:
                del self._status_order[bisect_left(self._status_order, key)]
            for key in new:
                self._status_order.insert(bisect_left(self._status_order, key), key)
        self._status_keys = set(keys)
