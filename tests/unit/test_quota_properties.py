"""Properties of teams, quotas, driver slots and preemption over generated clusters and push
sequences (hypothesis). The planner is pure: a tick here is ``plan`` plus a faithful model of
what applying it does to Ray (:class:`tests.unit.quota_sim.Sim`)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.plan.actions import ActionType
from reconciler.plan.actual import PREEMPTED
from reconciler.spec.hashing import task_spec_hash
from reconciler.spec.types import ClusterSpec, ModelSpec, Preemption, TaskSpec, Team, UserPolicy
from tests.unit.quota_sim import (
    ADMITTED,
    ANYONE,
    CLASSES,
    LONER,
    MEMBERS,
    NOW,
    SIZES,
    TEAMS,
    WORK,
    Sim,
    command_task,
    model,
)


@st.composite
def clusters(draw: st.DrawFn) -> tuple[ClusterSpec, dict[str, float]]:
    """Two or three teams whose nominal quotas add up to the cluster (GPUs and driver slots),
    sometimes with GPUs in no team's quota, with borrowing limits sometimes set, model
    preemption on or off, and the Kueue-like preemption defaults."""
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
        "GPU": sum(t.nominal["GPU"] for t in teams.values()) + draw(st.sampled_from([0, 0, 2, 3])),
        "worker_node": sum(t.nominal["tasks"] for t in teams.values()),
        "CPU": 64.0,
    }
    cluster = ClusterSpec(
        teams=teams,
        priority_classes=CLASSES,
        default_priority={"task": "mid", "model": "mid"},
        preemption=Preemption(reclaim=draw(st.sampled_from(["Any", "LowerPriority"])), models=draw(st.booleans())),
    )
    return cluster, total


@settings(max_examples=300, deadline=None, database=None)
@given(clusters(), st.lists(st.tuples(ANYONE, WORK), min_size=1, max_size=14))
def test_no_preemption_cycle_over_any_push_sequence(
    cluster_total: tuple[ClusterSpec, dict[str, float]], pushes
) -> None:  # type: ignore[no-untyped-def]
    """No push sequence (tasks, models, scale-ups, removals, by team members and users in no
    team) makes the planner preempt in a loop: an object is never preempted for the object it
    was itself preempted for, and once pushes stop the cluster settles (a few ticks, then no
    more preemptions at all)."""
    cluster, total = cluster_total
    sim = Sim(cluster, total)
    for i, (user, what) in enumerate(pushes):
        sim.push(user, i, what)
        sim.tick()
    for preemptor, victim in sim.edges:
        later = sim.edges[sim.edges.index((preemptor, victim)) + 1 :]
        assert (victim, preemptor) not in later, f"{victim} preempted {preemptor} back: {sim.edges}"
    quiet = []
    for _ in range(8):
        quiet.append(len(sim.tick().preemptions))
    assert sum(quiet[3:]) == 0, f"still preempting after pushes stopped: {quiet}, {sim.edges}"


@settings(max_examples=500, deadline=None, database=None)
@given(clusters(), st.lists(st.tuples(ANYONE, WORK), min_size=2, max_size=16), st.sampled_from(TEAMS), st.data())
def test_a_team_gets_its_nominal_quota_within_one_tick(cluster_total, pushes, team_name, data) -> None:  # type: ignore[no-untyped-def]
    """Whatever the others run (other teams and users in no team: tasks, models with or without
    min_replicas, models serving a finished training run, scale-ups and updates that wait or never
    fit, files that stop loading, removals, removals the mass-deletion guard holds), a team asking
    for work within its nominal quota (GPUs and driver slots; a task or a model) gets it admitted
    in the very next tick: by idle capacity or by reclaiming what
    others borrowed of it. Everything that borrows is reclaimable, so this holds whatever
    `preemption.models` says.

    Assumptions (the guarantee's, docs/scheduling.md): `reclaim: Any` (LowerPriority lets
    equal-priority borrowers stay), `min_run_seconds: 0` (a younger task is reclaimed once it has
    run that long), quotas that add up to no more than the cluster, no per-node view (argus
    reclaims on the sums; fragmented free GPUs are the documented gap)."""
    cluster, total = cluster_total
    cluster = replace(cluster, preemption=replace(cluster.preemption, reclaim="Any"))
    team = cluster.teams.get(team_name)
    if team is None:
        return
    sim = Sim(cluster, total)
    for i, (user, what) in enumerate(pushes):
        if user not in team.members:
            sim.push(user, i, what)
            sim.tick()
    gpus_held, slots_held = sim.held(team.members)
    room = int(team.nominal["GPU"] - gpus_held)
    if room < 1:
        return
    user = team.members[0]
    priority = data.draw(st.sampled_from([None, "low", "high"]))
    # Often all of the room: what needs the most reclaimed.
    size = st.one_of(st.just(room), st.integers(1, room))
    if data.draw(st.booleans()) and slots_held < team.nominal["tasks"]:
        ask: TaskSpec | ModelSpec = command_task(user, "mine", data.draw(size), priority, NOW + 99)
        sim.desired.tasks[ask.key] = ask
    else:
        gpus = data.draw(st.integers(1, room))
        replicas = data.draw(st.one_of(st.just(room // gpus), st.integers(1, room // gpus)))
        floor = data.draw(st.sampled_from([None, 0, 1]))
        ask = model(user, "mine", replicas, gpus, priority, NOW + 99, floor, from_task=data.draw(st.booleans()))
        if ask.source_task:
            sim.finished_sft(user)
        sim.desired.models[ask.key] = ask
    result = sim.tick()
    admitted = [a for a in result.of(ActionType.SUBMIT_TASK, ActionType.DEPLOY_MODEL) if a.key == ask.key]
    assert admitted, f"{ask.key} not admitted: {[(a.type.value, str(a.key), a.reason) for a in result.actions]}"
    for victim in result.preemptions:
        assert cluster.team_of(victim.key.user) != team_name or victim.preemption == "within team"


@settings(max_examples=200, deadline=None, database=None)
@given(
    clusters(),
    st.lists(st.tuples(ANYONE, ADMITTED), max_size=14),
)
def test_work_that_cannot_be_preempted_never_borrows(cluster_total, pushes) -> None:  # type: ignore[no-untyped-def]
    """After any push sequence that goes through admission, the GPUs that preemption can never
    stop (a model's replicas up to its min_replicas, every replica of a model that may not be
    preempted at all) fit each team's nominal quota, and those of users in no team fit the
    capacity in no team's quota: what makes the guarantee above hold. (A min_replicas edit does
    not go through admission; the guarantee test covers it: protection past the quota is capped.)"""
    cluster, total = cluster_total
    sim = Sim(cluster, total)
    unassigned = total["GPU"] - sum(t.nominal["GPU"] for t in cluster.teams.values())
    for i, (user, what) in enumerate(pushes):
        sim.push(user, i, what)
        sim.tick()
        firm: dict[str, float] = {}
        for key, live in sim.models.items():
            spec = sim.desired.models.get(key)
            floor = live.replicas
            if (
                spec is not None
                and cluster.preemption.models
                and spec.min_replicas is not None
                and not spec.source_task
            ):
                floor = min(live.replicas, spec.min_replicas)
            group = cluster.team_of(key.user)
            firm[group] = firm.get(group, 0.0) + floor * live.resources_per_replica["GPU"]
        for group, held in firm.items():
            limit = cluster.teams[group].nominal["GPU"] if group else unassigned
            assert held <= limit, f"{group or 'no team'} holds {held} firm GPUs, limit {limit}: {sim.models}"


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


@st.composite
def node_clusters(draw: st.DrawFn) -> tuple[ClusterSpec, dict[str, float], int]:
    """Nodes of 2 or 4 GPUs and one driver slot each; two or three teams owning whole nodes
    (nominal GPUs and driver slots), sometimes a node in no team's quota."""
    size = draw(st.sampled_from([2, 4]))
    teams = {}
    for name in TEAMS[: draw(st.integers(2, 3))]:
        nodes = draw(st.integers(1, 3))
        teams[name] = Team(name, MEMBERS[name], nominal={"GPU": float(nodes * size), "tasks": float(nodes)})
    count = sum(int(t.nominal["tasks"]) for t in teams.values()) + draw(st.integers(0, 1))
    cluster = ClusterSpec(
        teams=teams,
        priority_classes=CLASSES,
        default_priority={"task": "mid", "model": "mid"},
        preemption=Preemption(models=draw(st.booleans())),
    )
    return cluster, {"GPU": float(count * size), "worker_node": float(count), "CPU": 16.0 * count}, size


@settings(max_examples=300, deadline=None, database=None)
@given(node_clusters(), st.lists(st.tuples(ANYONE, WORK), min_size=2, max_size=14), st.sampled_from(TEAMS), st.data())
def test_whole_node_work_gets_its_nominal_quota_per_node(scenario, pushes, team_name, data) -> None:  # type: ignore[no-untyped-def]
    """The guarantee with per-node placement, when every task and replica takes a whole node
    (argus reclaims on the sums, not per node: with whole-node work, GPUs free in sum are free
    whole nodes, so what it reclaims always places). Everything argus admits is placed on a
    node at once (:class:`Sim` fails otherwise)."""
    cluster, total, size = scenario
    team = cluster.teams.get(team_name)
    if team is None:
        return
    sim = Sim(cluster, total, node_gpus=size)
    for i, (user, (kind, _gpus, replicas, priority, floor)) in enumerate(pushes):
        if user not in team.members:
            sim.push(user, i, (kind, size, replicas, priority, floor))
            sim.tick()
    gpus_held, slots_held = sim.held(team.members)
    room = int(team.nominal["GPU"] - gpus_held) // size
    if room < 1:
        return
    user, priority = team.members[0], data.draw(st.sampled_from([None, "low", "high"]))
    if data.draw(st.booleans()) and slots_held < team.nominal["tasks"]:
        ask: TaskSpec | ModelSpec = command_task(user, "mine", size, priority, NOW + 99)
        sim.desired.tasks[ask.key] = ask
    else:
        replicas = data.draw(st.integers(1, room))
        ask = model(user, "mine", replicas, size, priority, NOW + 99, data.draw(st.sampled_from([None, 0, 1])))
        sim.desired.models[ask.key] = ask
    result = sim.tick()
    admitted = [a for a in result.of(ActionType.SUBMIT_TASK, ActionType.DEPLOY_MODEL) if a.key == ask.key]
    assert admitted, f"{ask.key} not admitted: {[(a.type.value, str(a.key), a.reason) for a in result.actions]}"


@settings(max_examples=300, deadline=None, database=None)
@given(
    st.integers(1, 6),
    st.integers(1, 6),
    st.lists(
        st.tuples(st.sampled_from(["bob", "bea", LONER]), st.tuples(st.sampled_from(["model", "floor"]), *SIZES)),
        min_size=2,
        max_size=8,
    ),
)
def test_protection_a_file_adds_later_does_not_keep_borrowed_gpus(red: int, blue: int, pushes) -> None:  # type: ignore[no-untyped-def]
    """blue's models (and a user's in no team) borrow red's idle GPUs with the replicas above
    min_replicas, then their files protect every replica (min_replicas dropped or raised: not in
    the spec hash, so nothing restarts and admission never sees it). red asking for all of its
    nominal quota still gets it in the next tick: protection counts only within the owner's
    nominal quota (users in no team: the capacity outside every team's)."""
    teams = {
        "red": Team("red", MEMBERS["red"], {"GPU": float(red), "tasks": 2.0}),
        "blue": Team("blue", MEMBERS["blue"], {"GPU": float(blue), "tasks": 2.0}),
    }
    cluster = ClusterSpec(teams=teams, priority_classes=CLASSES, preemption=Preemption(models=True))
    sim = Sim(cluster, {"GPU": float(red + blue), "worker_node": 4.0, "CPU": 64.0})
    for i, (user, what) in enumerate(pushes):
        sim.push(user, i, what)
        sim.tick()
    ask = model("alice", "mine", red, 1, None, NOW + 99)
    sim.desired.models[ask.key] = ask
    result = sim.tick()
    admitted = [a for a in result.of(ActionType.DEPLOY_MODEL) if a.key == ask.key]
    assert admitted, f"{ask.key} not admitted: {[(a.type.value, str(a.key), a.reason) for a in result.actions]}"
