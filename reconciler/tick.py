"""One tick = load -> observe -> plan -> apply -> assess, passing values.

The tick is a straight line (Flux's kustomize-controller). Its parts each take values and return
one, and none reads another's attributes:

- :meth:`RevisionReader.read <reconciler.source.revision.RevisionReader.read>` returns the desired
  :class:`~reconciler.source.revision.Revision`;
- :meth:`Observer.observe <reconciler.observe.observer.Observer.observe>` returns the
  :class:`~reconciler.observe.observer.Observation` of Ray and the status branch's records;
- :func:`reconciler.plan.planner.plan` returns the actions (pure);
- :meth:`Applier.apply <reconciler.apply.applier.Applier.apply>` returns one outcome per object;
- :func:`reconciler.plan.assess.assess` and :func:`reconciler.plan.outcome.with_outcomes` compute each
  status once (pure).

:func:`tick` composes them for one revision and one observation, with the
:class:`~reconciler.plan.memory.Memory` the previous tick returned, and returns the
:class:`TickResult` and the next ``Memory``. The loop (:mod:`reconciler.loop`) and the CLI hold the
memory; the parts (:class:`Parts`) own their caches. Nothing is stored outside git and Ray: a
restarted daemon (a fresh ``Memory()``) rebuilds everything from the repository, the status branch's
run records, Ray's proven jobs and app names.

Exactly once: before a tick submits, the runs it is about to submit are recorded on the status
branch (``record_runs``); a run recorded there is never submitted again, even when Ray forgets it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from reconciler.apply.applier import Applied, Applier, RecordRuns
from reconciler.contain import culprits, raises
from reconciler.endpoint.hub import EndpointHub
from reconciler.errors import Issue
from reconciler.observe.observer import Observation, Observer
from reconciler.observe.serve import ServeObservation
from reconciler.plan.actions import Plan
from reconciler.plan.actual import FINAL_JOB_STATES, PREEMPTED, ActualState
from reconciler.plan.assess import ObjectStatus, assess
from reconciler.plan.disk import explain, held_tasks, hold, measured_users, over_quota
from reconciler.plan.incremental import IncrementalPlanner
from reconciler.plan.memory import AdmissionOrder, Memory
from reconciler.plan.outcome import Outcome, with_outcomes
from reconciler.plan.planner import plan as make_plan
from reconciler.plan.serve_kept import with_serve_events
from reconciler.source.revision import Revision, RevisionReader
from reconciler.spec.types import DesiredState, ObjectKey
from reconciler.status.documents import first_seen_of

log = logging.getLogger("argus")

# Secrets reach jobs from the daemon's environment, never from git.
SECRET_ENV_NAMES = ("WANDB_API_KEY", "HF_TOKEN")
STATUS_BRANCH = "argus/status"
StatusDocs = Callable[[], Mapping[str, Mapping[str, Any]]]


@dataclass
class TickResult:
    """Everything one tick learned and did (the status writers and the CLI read it)."""

    revision: str
    desired: DesiredState
    actual: ActualState
    serve: ServeObservation
    plan: Plan
    statuses: dict[ObjectKey, ObjectStatus]
    outcomes: dict[ObjectKey, Outcome] = field(default_factory=dict)
    serve_put: bool = False
    notes: list[str] = field(default_factory=list)
    subject: str = ""
    commit_time: int = 0
    spec_ids: dict[str, str] = field(default_factory=dict)  # path -> blob of every object file

    @property
    def applied(self) -> set[ObjectKey]:
        """The objects a step of which reached Ray this tick."""
        return {k for k, o in self.outcomes.items() if o.applied}

    @property
    def failures(self) -> dict[ObjectKey, str]:
        """The objects a step of which failed this tick, with why."""
        return {k: o.error for k, o in self.outcomes.items() if o.error is not None}

    def to_json(self) -> dict[str, Any]:
        return {
            "revision": self.revision,
            "plan": self.plan.to_json(),
            "errors": [i.to_json() for i in self.desired.issues],
            "failures": {str(k): v for k, v in self.failures.items()},
            "notes": self.notes,
            "objects": [s.to_json() for s in self.statuses.values()],
        }


@dataclass(frozen=True)
class Parts:
    """The parts a tick is made of, for one branch of one repository and one Ray cluster.

    ``status_docs`` returns the status branch's documents (the run records and ``first_seen``);
    ``record_runs`` records runs before they are submitted (the daemon's status writer; None: not
    recorded ahead, as in a one-off ``argus reconcile``). Built by
    :func:`reconciler.daemon.build_parts`."""

    branch: str
    revisions: RevisionReader
    observer: Observer
    applier: Applier
    status_docs: StatusDocs
    record_runs: RecordRuns | None = None
    state_dir: str | None = None  # the daemon keeps its status anchor there (reconciler/loop.py)
    # The OpenAI endpoint's daemon side (reconciler/endpoint/hub.py; None: no endpoint, e.g. one tick).
    endpoint: EndpointHub | None = None
    # Plans and assesses again only the objects whose inputs changed (its memo: one entry per object).
    planner: IncrementalPlanner = field(default_factory=IncrementalPlanner)

    @property
    def source(self) -> Any:
        return self.revisions.source

    @property
    def dash(self) -> Any:
        return self.observer.dash

    @property
    def ownership_key(self) -> bytes:
        return self.observer.ownership_key

    @property
    def secrets_env(self) -> dict[str, str]:
        return self.applier.secrets_env

    def observe(self, revision: Revision) -> Observation:
        """Observe Ray and the status branch for ``revision``'s cluster. Raises RayUnavailable."""
        cluster = revision.desired.cluster
        users = measured_users(revision.desired)
        return self.observer.observe(
            self.status_docs(),
            cluster.paths,
            cluster.serving.internal_http_port,
            users,
            serving_address=cluster.serving.ray_address,
        )

    def run(
        self, memory: Memory | None = None, commit: str | None = None, *, fetch: bool = True
    ) -> tuple[TickResult, Memory]:
        """Read (fetching unless ``fetch`` is False), observe and tick once. Returns the result and
        the memory for the next tick. Raises SourceUnavailable / RayUnavailable."""
        revision = self.revisions.read(commit, fetch=fetch)
        return tick(self, revision, self.observe(revision), memory or Memory())


@dataclass(frozen=True)
class Planned:
    """What a tick decides before it applies anything: the ``plan``, the ``desired`` state it
    planned (with objects the planner raised for made invalid), the ``actual`` state it planned
    against, and the admission ``order`` and ``memory`` that follow from it; ``held``: the tasks not
    submitted because their user's folder is over its disk quota, with why (reconciler.plan.disk)."""

    plan: Plan
    desired: DesiredState
    actual: ActualState
    order: AdmissionOrder
    memory: Memory
    held: Mapping[ObjectKey, str] = field(default_factory=dict)


def decide(
    revision: Revision,
    observation: Observation,
    memory: Memory,
    *,
    now: int,
    planner: IncrementalPlanner | None = None,
) -> Planned:
    """Pair ``revision`` with ``observation`` and plan (through ``planner``'s memo when given: the
    same plan, computed again only for the objects whose inputs changed). No I/O, and nothing
    changed but ``planner``'s memo.

    Two ticks that decide on the same revision and observation with equal memories decide the
    same; a restarted daemon's memory (``Memory()``) decides what a running one does once the
    status branch holds what the running one carries (the property ``tests/unit/test_tick_equivalence.py``
    checks)."""
    actual, memory = _actual(observation, memory)
    order = memory.order if memory.order.seeded else _seeded(memory.order, observation.docs)
    loaded = revision.desired
    # Following the revision the order was placed after, only the objects that moved are placed
    # again (the admission order's change feed; None: every object).
    feed = order.feed(loaded.serial, revision.commit, loaded.changed, revision.changed)
    order = order.for_files(revision.spec_ids, feed)
    first_seen = order.first_seen

    def recheck(d: DesiredState) -> frozenset[ObjectKey] | None:
        return feed if d is loaded else None  # a contained or held state is another one: every object

    # A user over her disk quota gets no new run: those of her tasks are planned as kept as they run.
    held = held_tasks(loaded, actual, over_quota(loaded.cluster, observation.disk))
    plan, desired = _plan_contained(
        hold(loaded, held) if held else loaded,
        lambda d: make_plan(d, actual, first_seen=first_seen, now=now, recheck=recheck(d)),
        None
        if planner is None
        else (lambda d: planner.plan(d, actual, first_seen=first_seen, now=now, recheck=recheck(d))),
    )
    if desired is loaded:
        order = order.after(plan.first_seen, revision.spec_ids, feed, serial=loaded.serial, commit=revision.commit)
    else:
        order = order.after(plan.first_seen, revision.spec_ids)
    return Planned(plan, desired, actual, order, memory, held)


def tick(
    parts: Parts, revision: Revision, observation: Observation, memory: Memory, *, now: int | None = None
) -> tuple[TickResult, Memory]:
    """Decide on ``revision`` against ``observation``, apply the plan with ``parts``' applier,
    assess every object.

    Returns the result and the memory the next tick gets. Raises RayUnavailable when Ray goes away
    while applying. One object's failure (loading, hashing, building, applying, assessing it) is
    that object's status; every other object is planned and applied in the same tick."""
    when = int(time.time()) if now is None else now
    planned = decide(revision, observation, memory, now=when, planner=parts.planner)
    plan, desired = planned.plan, planned.desired
    applied = parts.applier.apply(plan, desired, planned.actual, observation.serve, revision.commit, parts.record_runs)
    actual = applied.actual_after(planned.actual)
    preemptions = planned.memory.preemptions.added(applied.stopped, applied.preempted).kept(
        desired.tasks.keys() | desired.invalid.keys(), desired.models.keys()
    )
    assessed = _assess_contained(desired, actual, plan, applied, parts.planner)
    statuses = explain(with_outcomes(assessed, applied.outcomes, desired.invalid), planned.held)
    statuses, serve_notes = with_serve_events(statuses, applied.serve_events)
    result = TickResult(
        revision=revision.commit,
        desired=desired,
        actual=actual,
        serve=observation.serve,
        plan=plan,
        statuses=statuses,
        outcomes=applied.outcomes,
        serve_put=applied.serve_put,
        notes=[*_notes(revision, observation, desired, plan), *serve_notes],
        subject=revision.subject,
        commit_time=revision.commit_time,
        spec_ids=revision.spec_ids,
    )
    return result, Memory(order=planned.order, preemptions=preemptions)


def _actual(observation: Observation, memory: Memory) -> tuple[ActualState, Memory]:
    """The actual state a plan starts from: what Ray runs, with the preemptions argus made that the
    status branch does not hold yet (a report may be superseded before it is written). Returns it
    and the memory with the preemptions that are still pending."""
    stopped = {j.submission_id for j in observation.jobs if j.status in FINAL_JOB_STATES}
    pending, preempted_runs, preempted_by = memory.preemptions.merged(
        observation.recorded_preempted, observation.recorded_by, stopped
    )
    # Ray reports a preempted attempt as STOPPED; the status branch knows argus stopped it to
    # resume it. Until the stop lands Ray still says RUNNING, and the run counts as running
    # (its resources are held; no second attempt starts beside it).
    owned = [
        replace(j, status=PREEMPTED) if j.status == "STOPPED" and j.submission_id in preempted_runs else j
        for j in observation.jobs
    ]
    actual = ActualState(
        models=observation.models,
        jobs=owned,
        capacity=observation.capacity,
        recorded_runs=observation.recorded_runs,
        foreign_ids=frozenset(j.submission_id for j in observation.foreign),
        preempted=preempted_by,
        stopping=frozenset(j.submission_id for j in owned if j.active and j.submission_id in preempted_runs),
    )
    return actual, replace(memory, preemptions=pending)


def _seeded(order: AdmissionOrder, docs: Mapping[str, Mapping[str, Any]]) -> AdmissionOrder:
    """``order`` with the status branch's record under it: a restart keeps the admission order."""
    blobs: dict[ObjectKey, str] = {}
    for doc in docs.values():
        with contextlib.suppress(ValueError, TypeError):
            if isinstance(doc.get("spec_id"), str):
                blobs[ObjectKey.parse(str(doc.get("object")))] = doc["spec_id"]
    return order.seed(first_seen_of(docs), blobs)


# Foreign jobs named one by one in the status README; the rest are counted (any job can submit
# thousands of jobs that claim to be argus's: they must not grow every status commit).
MAX_FOREIGN_NOTES = 20


def _notes(revision: Revision, observation: Observation, desired: DesiredState, plan: Plan) -> list[str]:
    """What the status branch's README says about this tick, besides each object's status."""
    foreign = observation.foreign
    more = len(foreign) - MAX_FOREIGN_NOTES
    return [
        *revision.notes,
        *observation.serve.settings_mismatch(desired.cluster),
        *plan.notes,
        *(
            # repr: the id and claims are the job's metadata, anyone with the cluster's token writes them.
            f"foreign job {j.submission_id!r} ({'claims ' + repr(j.claims) if j.claims else 'argus-like id'}) "
            "has no valid ownership proof: ignored, never counted as a run"
            for j in foreign[:MAX_FOREIGN_NOTES]
        ),
        *([f"and {more} more foreign jobs without a valid ownership proof (ignored)"] if more > 0 else []),
    ]


def _plan_contained(
    desired: DesiredState,
    planner: Callable[[DesiredState], Plan],
    incremental: Callable[[DesiredState], Plan] | None = None,
) -> tuple[Plan, DesiredState]:
    """``planner(desired)`` (or ``incremental(desired)``, the same plan from a memo) and the desired
    state it planned. When it raises for some objects, they become invalid (kept as they run, with
    the error) and everything else is planned as usual by ``planner`` (bisection would only churn the
    memo); the desired state returned then is a new one (``desired`` is not changed)."""
    try:
        return (incremental or planner)(desired), desired
    except Exception as exc:
        first = exc
    keys = sorted(set(desired.models) | set(desired.tasks))

    def subset(chosen: Iterable[ObjectKey]) -> DesiredState:
        wanted = set(chosen)
        return replace(
            desired,
            models={k: v for k, v in desired.models.items() if k in wanted},
            tasks={k: v for k, v in desired.tasks.items() if k in wanted},
        )

    bad = culprits(keys, lambda sub: raises(partial(planner, subset(sub))) is not None)
    if not bad:
        raise first
    issues: dict[ObjectKey, Issue] = {}
    for key in bad:
        error = raises(partial(planner, subset([key])))
        log.error("planning %s failed", key, exc_info=error)
        spec = desired.models.get(key) or desired.tasks.get(key)
        line = getattr(spec, "line", 0) if key.kind == "model" else 0
        issues[key] = Issue(key.path, line, f"internal error while planning: {error!r}")
    contained = replace(
        desired,
        models={k: v for k, v in desired.models.items() if k not in issues},
        tasks={k: v for k, v in desired.tasks.items() if k not in issues},
        invalid={**desired.invalid, **{k: [i] for k, i in issues.items()}},
        issues=sorted([*desired.issues, *issues.values()]),
    )
    return planner(contained), contained


def _assess_contained(
    desired: DesiredState, actual: ActualState, plan: Plan, applied: Applied, planner: IncrementalPlanner
) -> dict[ObjectKey, ObjectStatus]:
    """Assess every object (through ``planner``'s memo); one whose assessment raises is FAILED with
    the error (assessed one by one without the memo)."""
    done = {k for k, o in applied.outcomes.items() if o.applied}
    try:
        return planner.assess(desired, actual, plan, done)
    except Exception as exc:
        log.error("assessing the objects failed; assessing them one by one", exc_info=exc)
    out: dict[ObjectKey, ObjectStatus] = {}
    keys = desired.keys() | set(actual.models) | {j.key for j in actual.jobs if j.active}
    for key in sorted(keys):
        one_desired = replace(
            desired,
            models={key: desired.models[key]} if key in desired.models else {},
            tasks={key: desired.tasks[key]} if key in desired.tasks else {},
            invalid={key: desired.invalid[key]} if key in desired.invalid else {},
        )
        one_actual = replace(
            actual,
            models={key: actual.models[key]} if key in actual.models else {},
            jobs=[j for j in actual.jobs if j.key == key],
        )
        one_plan = Plan([a for a in plan.actions if a.key == key])
        try:
            out.update(assess(one_desired, one_actual, one_plan, done))
        except Exception as exc:
            out[key] = ObjectStatus(key, "FAILED", "Unknown", reason=f"internal error while assessing: {exc!r}")
    return out
