"""Properties of teams, quotas, driver slots and preemption over generated clusters and push
sequences (hypothesis). The planner is pure: a tick here is ``plan`` plus a faithful model of
what applying it does to Ray (stops free resources at once, submissions run at once)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.plan.actions import ActionType, Plan
from reconciler.plan.actual import PREEMPTED, ActualJob, ActualState, Capacity
from reconciler.plan.planner import plan
from reconciler.spec.hashing import task_spec_hash
from reconciler.spec.types import ClusterSpec, DesiredState, ObjectKey, Preemption, TaskSpec, Team, UserPolicy
from tests import support

CLASSES = {"high": 1000, "mid": 100, "low": 0}
TEAMS = ("red", "blue", "green")
MEMBERS = {"red": ("alice", "ann"), "blue": ("bob", "bea"), "green": ("carl",)}
NOW = 1_767_225_600


def command_task(user: str, name: str, gpus: int, priority: str | None, created: int) -> TaskSpec:
    return support.task_spec(
        user, name, "command", command="sleep infinity", gpus_per_node=gpus, created_at=created, priority=priority
    )


@dataclass
class Sim:
    """A cluster whose Ray does at once what the plan says: the desired tree and what runs."""

    cluster: ClusterSpec
    total: dict[str, float]
    desired: DesiredState = field(init=False)
    jobs: dict[str, ActualJob] = field(default_factory=dict)
    preempted: dict[ObjectKey, ObjectKey] = field(default_factory=dict)
    first_seen: dict[ObjectKey, int] = field(default_factory=dict)
    edges: list[tuple[ObjectKey, ObjectKey]] = field(default_factory=list)  # (preemptor, victim)
    clock: int = NOW

    def __post_init__(self) -> None:
        self.desired = DesiredState(cluster=self.cluster)

    def actual(self) -> ActualState:
        active = [j for j in self.jobs.values() if j.active]
        used: dict[str, float] = {}
        for job in active:
            for r, v in job.resources.items():
                used[r] = used.get(r, 0.0) + v
        free = {r: v - used.get(r, 0.0) for r, v in self.total.items()}
        return ActualState(
            jobs=list(self.jobs.values()),
            capacity=Capacity(dict(self.total), free),
            first_seen=dict(self.first_seen),
            preempted=dict(self.preempted),
        )

    def tick(self) -> Plan:
        self.clock += 60
        result = plan(self.desired, self.actual(), now=self.clock)
        self.first_seen = dict(result.first_seen)
        for action in result.of(ActionType.STOP_TASK):
            job = self.jobs[action.submission_id or ""]
            preempted = action.preempted_by is not None
            self.jobs[job.submission_id] = replace(job, status=PREEMPTED if preempted else "STOPPED")
            if action.preempted_by is not None:
                self.preempted[action.key] = action.preempted_by
                self.edges.append((action.preempted_by, action.key))
        for action in result.of(ActionType.SUBMIT_TASK):
            sid = action.submission_id or ""
            resources = {k: v for k, v in action.demand.items() if v}
            self.jobs[sid] = ActualJob(
                sid, action.key, action.spec_hash or "", "RUNNING", resources=resources, start_time=self.clock * 1000
            )
        return result


@st.composite
def clusters(draw: st.DrawFn) -> tuple[ClusterSpec, dict[str, float]]:
    """Two or three teams whose nominal quotas add up to the cluster (GPUs and driver slots),
    with lending and borrowing limits sometimes set, and the Kueue-like preemption defaults."""
    teams = {}
    for name in TEAMS[: draw(st.integers(2, 3))]:
        gpus = draw(st.integers(1, 6))
        slots = draw(st.integers(1, 4))
        borrow = {"GPU": float(draw(st.integers(0, 4)))} if draw(st.booleans()) else {}
        teams[name] = Team(
            name,
            MEMBERS[name],
            nominal={"GPU": float(gpus), "tasks": float(slots)},
            borrowing_limit=borrow,
            weight=float(draw(st.sampled_from([1, 1, 2, 3]))),
        )
    total = {
        "GPU": sum(t.nominal["GPU"] for t in teams.values()),
        "worker_node": sum(t.nominal["tasks"] for t in teams.values()),
        "CPU": 64.0,
    }
    cluster = ClusterSpec(
        teams=teams,
        priority_classes=CLASSES,
        default_priority={"task": "mid"},
        preemption=Preemption(reclaim=draw(st.sampled_from(["Any", "LowerPriority"]))),
    )
    return cluster, total


PUSH = st.tuples(
    st.sampled_from([m for ms in MEMBERS.values() for m in ms]),
    st.integers(1, 4),
    st.sampled_from([None, "high", "mid", "low"]),
    st.booleans(),  # False: delete one of the user's tasks instead
)


@settings(max_examples=150, deadline=None, database=None)
@given(clusters(), st.lists(PUSH, min_size=1, max_size=14))
def test_no_preemption_cycle_over_any_push_sequence(
    cluster_total: tuple[ClusterSpec, dict[str, float]], pushes
) -> None:  # type: ignore[no-untyped-def]
    """No push sequence makes the planner preempt in a loop: an object is never preempted for
    the object it was itself preempted for, and once pushes stop the cluster settles (a few ticks,
    then no more preemptions at all)."""
    cluster, total = cluster_total
    sim = Sim(cluster, total)
    for i, (user, gpus, priority, add) in enumerate(pushes):
        if cluster.team_of(user) not in cluster.teams:
            continue
        if add:
            task = command_task(user, f"t{i}", gpus, priority, NOW + i)
            sim.desired.tasks[task.key] = task
        else:
            mine = sorted(k for k in sim.desired.tasks if k.user == user)
            if mine:
                del sim.desired.tasks[mine[0]]
        sim.tick()
    for preemptor, victim in sim.edges:
        later = sim.edges[sim.edges.index((preemptor, victim)) + 1 :]
        assert (victim, preemptor) not in later, f"{victim} preempted {preemptor} back: {sim.edges}"
    quiet = []
    for _ in range(8):
        quiet.append(len(sim.tick().preemptions))
    assert sum(quiet[3:]) == 0, f"still preempting after pushes stopped: {quiet}, {sim.edges}"


@settings(max_examples=200, deadline=None, database=None)
@given(clusters(), st.lists(PUSH, min_size=0, max_size=10), st.sampled_from(TEAMS), st.data())
def test_a_team_gets_its_nominal_quota_within_one_tick(cluster_total, pushes, team_name, data) -> None:  # type: ignore[no-untyped-def]
    """Whatever the others run, a team asking for work within its nominal quota (GPUs and driver
    slots) gets it admitted in the very next tick: by idle capacity or by reclaiming what others
    borrowed of it."""
    cluster, total = cluster_total
    # The guarantee holds under the default `reclaim: Any`; LowerPriority lets equal-priority borrowers stay.
    cluster = replace(cluster, preemption=Preemption(reclaim="Any"))
    team = cluster.teams.get(team_name)
    if team is None:
        return
    sim = Sim(cluster, total)
    for i, (user, gpus, priority, _add) in enumerate(pushes):
        if cluster.team_of(user) in cluster.teams and cluster.team_of(user) != team_name:
            task = command_task(user, f"o{i}", gpus, priority, NOW + i)
            sim.desired.tasks[task.key] = task
            sim.tick()
    used = sum(j.resources.get("GPU", 0.0) for j in sim.jobs.values() if j.active and j.key.user in team.members)
    room = int(team.nominal["GPU"] - used)
    if room < 1:
        return
    gpus = data.draw(st.integers(1, room))
    ask = command_task(team.members[0], "mine", gpus, data.draw(st.sampled_from([None, "low", "high"])), NOW + 99)
    sim.desired.tasks[ask.key] = ask
    result = sim.tick()
    admitted = [a for a in result.of(ActionType.SUBMIT_TASK) if a.key == ask.key]
    assert admitted, f"{ask.key} not admitted: {[(a.type.value, str(a.key), a.reason) for a in result.actions]}"
    for victim in result.preemptions:
        assert cluster.team_of(victim.key.user) != team_name or victim.preemption == "within team"


@st.composite
def slot_clusters(draw: st.DrawFn) -> tuple[ClusterSpec, dict[str, float], int]:
    """No teams: per-user GPU and task caps whose sum fits the cluster (GPUs and driver slots)."""
    users = ("alice", "bob", "carol")
    gpus = {u: draw(st.integers(1, 4)) for u in users}
    tasks = {u: draw(st.integers(1, 3)) for u in users}
    cluster = ClusterSpec(users={u: UserPolicy(gpus=gpus[u], tasks=tasks[u]) for u in users})
    total = {"GPU": float(sum(gpus.values())), "worker_node": float(sum(tasks.values())), "CPU": 64.0}
    return cluster, total, draw(st.integers(1, 12))


@settings(max_examples=200, deadline=None, database=None)
@given(slot_clusters(), st.lists(st.integers(1, 4), min_size=1, max_size=12), st.data())
def test_one_users_tasks_never_starve_another_user_of_driver_slots(scenario, hers, data) -> None:  # type: ignore[no-untyped-def]
    """Whatever alice submits within her quota (any number of tasks, any sizes), bob's task that
    fits his quota is admitted: she cannot hold every driver slot with idle GPUs left."""
    cluster, total, _ = scenario
    sim = Sim(cluster, total)
    for i, gpus in enumerate(hers):
        task = command_task("alice", f"a{i}", gpus, None, NOW + i)
        sim.desired.tasks[task.key] = task
        sim.tick()
    quota = cluster.quota("bob") or 1
    theirs = command_task("bob", "train", data.draw(st.integers(1, quota)), None, NOW + 99)
    sim.desired.tasks[theirs.key] = theirs
    result = sim.tick()
    assert result.of(ActionType.SUBMIT_TASK) and any(a.key == theirs.key for a in result.of(ActionType.SUBMIT_TASK)), [
        (a.type.value, str(a.key), a.reason) for a in result.actions
    ]


def test_without_the_task_limit_one_user_can_hold_every_slot() -> None:
    """The attack the task limit stops (issue 18): with no `tasks:` cap, two 1-GPU tasks of one
    user take both driver slots and bob's training waits with 6 of 8 GPUs idle, told why."""
    cluster = ClusterSpec(users={"alice": UserPolicy(gpus=4), "bob": UserPolicy(gpus=4)})
    sim = Sim(cluster, {"GPU": 8.0, "worker_node": 2.0, "CPU": 64.0})
    for name in ("s1", "s2"):
        task = command_task("alice", name, 1, None, NOW)
        sim.desired.tasks[task.key] = task
    sim.tick()
    bob = command_task("bob", "train", 2, None, NOW + 1)
    sim.desired.tasks[bob.key] = bob
    waiting = [a for a in sim.tick().actions if a.key == bob.key]
    assert [a.type for a in waiting] == [ActionType.QUEUE]
    assert "worker_node is the driver slot" in waiting[0].reason
    capped = replace(cluster, users={"alice": UserPolicy(gpus=4, tasks=1), "bob": UserPolicy(gpus=4)})
    sim = Sim(capped, {"GPU": 8.0, "worker_node": 2.0, "CPU": 64.0})
    for name in ("s1", "s2"):
        task = command_task("alice", name, 1, None, NOW)
        sim.desired.tasks[task.key] = task
    sim.desired.tasks[bob.key] = bob
    result = sim.tick()
    assert {str(a.key) for a in result.of(ActionType.SUBMIT_TASK)} == {"alice/tasks/s1", "bob/tasks/train"}
    assert "alice runs 1 of 1 task" in next(a.reason for a in result.of(ActionType.QUEUE))


def test_a_preempted_run_resumes_as_the_same_run_never_from_zero() -> None:
    """Preempted, then room again: the run's next attempt is submitted (same spec hash), and a
    run that ended by itself is never submitted again."""
    cluster = ClusterSpec(
        teams={"red": Team("red", ("alice",), {"GPU": 2.0}), "blue": Team("blue", ("bob",), {"GPU": 2.0})}
    )
    sim = Sim(cluster, {"GPU": 4.0, "worker_node": 4.0, "CPU": 64.0})
    train = command_task("alice", "train", 4, None, NOW)
    sim.desired.tasks[train.key] = train
    sim.tick()
    eval_ = command_task("bob", "eval", 2, None, NOW + 1)
    sim.desired.tasks[eval_.key] = eval_
    stop = sim.tick()
    assert [(str(a.key), a.preemption) for a in stop.preemptions] == [("alice/tasks/train", "reclaim")]
    first = next(j for j in sim.jobs.values() if j.key == train.key)
    assert first.status == PREEMPTED
    del sim.desired.tasks[eval_.key]
    sim.jobs = {sid: (replace(j, status="SUCCEEDED") if j.key == eval_.key else j) for sid, j in sim.jobs.items()}
    resumed = sim.tick().of(ActionType.SUBMIT_TASK)
    assert [(a.key, a.resume_from, a.spec_hash) for a in resumed] == [
        (train.key, first.submission_id, task_spec_hash(train))
    ]
    assert resumed[0].submission_id == f"{first.submission_id}--2"
    sim.jobs = {sid: replace(j, status="SUCCEEDED") for sid, j in sim.jobs.items()}
    assert not sim.tick().of(ActionType.SUBMIT_TASK)


def test_queue_positions_are_exact_near_the_head_and_stable_further_back() -> None:
    """Waiting objects carry their place; past the first 50 the reason stops changing, so a moving
    queue does not rewrite thousands of status documents on every admission."""
    sim = Sim(ClusterSpec(), {"GPU": 1.0, "worker_node": 1.0, "CPU": 64.0})
    for i in range(60):
        task = command_task("alice", f"t{i:02d}", 1, None, NOW + i)
        sim.desired.tasks[task.key] = task
    queued = sim.tick().of(ActionType.QUEUE)
    assert [a.position for a in queued] == list(range(1, 60))
    assert queued[0].reason.endswith("[queue position 1]") and queued[49].reason.endswith("[queue position 50]")
    assert all(a.reason.endswith("[behind 50+ in the queue]") for a in queued[50:])
