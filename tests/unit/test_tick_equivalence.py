"""A running daemon decides what a restarted one would (reconciler/tick.py ``decide``).

The tick carries values from one tick to the next (the admission order, the preemptions in flight)
and its parts keep caches (the parsed tree, the status documents' readings, checkpoint answers).
The property: after any sequence of pushes, Ray changes and restarts, the running daemon's next
decision equals the one a daemon started from nothing — its own clone of the repository, empty
caches, a fresh ``Memory()`` seeded from the status branch — makes on the same commit, Ray and
clock. Real git and the real status writer; Ray is the dashboard stand-in (a property test that
runs hundreds of ticks may use one). Both paths are asked on the same inputs before every tick.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from reconciler.daemon import build_parts
from reconciler.fscache import CachedFS
from reconciler.loop import Daemon
from reconciler.plan.memory import Memory
from reconciler.server import Metrics
from reconciler.source.remote import open_source
from reconciler.source.revision import Revision
from reconciler.status.writer import StatusWriter
from reconciler.tick import Parts, Planned, decide, tick
from tests.support import ConfigRepo, model_yaml, two_teams
from tests.unit.fake_ray import FakeRay
from tests.unit.test_fuzz_ticks import AllowAll

KEY = b"equivalence-ownership-key-012345"
NOW = 1_800_000_000
USERS = ("alice", "bob")
NAMES = ("a", "b", "c")


@dataclass
class World:
    """The repository, Ray, the running daemon and the clock of one example."""

    root: Path
    repo: ConfigRepo
    ray: FakeRay
    daemon: Daemon
    now: int = NOW
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    cold_clones: int = 0

    def parts(self, cache: str) -> Parts:
        source = open_source(str(self.repo.bare), str(self.root / cache))
        return build_parts(
            source,
            "main",
            self.ray,
            fs=CachedFS(AllowAll()),  # as the daemon's: answers kept per generation, so loads are incremental
            secrets_env={},
            task_check=lambda t, c: [],
            model_check=lambda m, c: [],
            ownership_key=KEY,
        )

    def start(self) -> None:
        """A (re)started daemon: new parts and memory on the same cache folder, as ``argus run``."""
        parts = self.parts("cache")
        self.daemon = Daemon(parts, StatusWriter(parts.source), metrics=Metrics())


def _world(root: Path) -> World:
    repo = ConfigRepo(root)
    repo.write("cluster.yaml", two_teams(root / "hf", root / "users", 8000))
    repo.commit_push("the cluster")
    world = World(root, repo, FakeRay(gpus=2), None)  # type: ignore[arg-type]
    world.start()
    return world


def _decide(parts: Parts, memory: Memory, now: int) -> tuple[Planned, Revision]:
    """The decision, and the revision (its file blobs patched from the last read's in a running daemon)."""
    parts.source.fetch()
    revision = parts.revisions.read(fetch=False)
    return decide(revision, parts.observe(revision), memory, now=now, planner=parts.planner), revision


def _summary(planned: Planned) -> tuple[Any, ...]:
    """What a decision is: the actions in order, the notes, the admission order, what counts as
    preempted and by whom."""
    return (
        [a.to_json() for a in planned.plan.actions],
        planned.plan.notes,
        dict(sorted(planned.plan.first_seen.items())),
        dict(sorted((str(k), str(v)) for k, v in planned.actual.preempted.items())),
        sorted(planned.actual.stopping),
    )


def _task(gpus: int, command: str, suspend: bool, priority: str | None) -> dict[str, Any]:
    doc: dict[str, Any] = {"kind": "Task", "workload": "command", "command": command, "gpus_per_node": gpus}
    if suspend:
        doc["suspend"] = True
    if priority:
        doc["priority"] = priority
    return doc


objects = st.tuples(st.sampled_from(USERS), st.sampled_from(NAMES))
steps = st.one_of(
    st.tuples(
        st.just("task"),
        objects,
        st.integers(0, 2),
        st.sampled_from(["true", "echo one", "echo two"]),
        st.booleans(),
        st.sampled_from([None, "production", "best-effort"]),
    ),
    st.tuples(st.just("model"), objects, st.integers(0, 2), st.booleans()),
    st.tuples(st.just("delete"), objects, st.sampled_from(["tasks", "models"])),
    st.tuples(st.just("ray"), st.integers(0, 7), st.sampled_from(["RUNNING", "SUCCEEDED", "FAILED", "gone"])),
    st.tuples(st.just("gpus"), st.integers(0, 3)),
    st.tuples(st.just("restart")),
    st.tuples(st.just("wait"), st.integers(1, 120)),
)


def _apply_step(world: World, step: tuple[Any, ...]) -> None:
    kind = step[0]
    if kind in ("task", "model", "delete"):
        user, name = step[1]
        if kind == "task":
            path = f"users/{user}/tasks/{name}.yaml"
            world.repo.write(path, _task(*step[2:]))
        elif kind == "model":
            path = f"users/{user}/models/{name}.yaml"
            world.repo.write(path, model_yaml(str(world.root / "hf" / "tiny"), replicas=step[2], suspend=step[3]))
        else:
            path = f"users/{user}/{step[2]}/{name}.yaml"
            if not (world.repo.work / path).exists():
                return
            world.repo.remove(path)
        world.repo.commit_push(f"{kind} {path}")
    elif kind == "ray":
        jobs = sorted(world.ray.jobs)
        if not jobs:
            return
        sid = jobs[step[1] % len(jobs)]
        if step[2] == "gone":  # a head restart forgets the job
            del world.ray.jobs[sid]
        else:
            world.ray.jobs[sid]["status"] = step[2]
    elif kind == "gpus":
        world.ray.gpus = step[1]
        world.daemon.parts.observer.forget_capacity()  # as the next timer tick does
    elif kind == "restart":
        world.start()
    elif kind == "wait":
        world.now += step[1]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(steps, min_size=1, max_size=10))
# Found once: bob's run preempted (recorded PREEMPTED), then its Ray record says RUNNING again; a restarted
# daemon must disbelieve it from the record as the running one does from what it saw.
@example(
    [
        ("task", ("bob", "a"), 2, "true", False, None),
        ("task", ("alice", "a"), 1, "true", False, None),
        ("model", ("alice", "a"), 0, False),
        ("ray", 1, "RUNNING"),
    ]
)
@example(
    [
        ("ray", 0, "RUNNING"),
        ("task", ("alice", "b"), 1, "true", False, None),
        ("gpus", 0),
        ("ray", 0, "RUNNING"),
        ("ray", 0, "FAILED"),
        ("delete", ("alice", "b"), "tasks"),
        ("ray", 0, "RUNNING"),
    ]
)
def test_a_running_daemon_decides_what_a_restarted_one_would(sequence: list[tuple[Any, ...]]) -> None:
    with tempfile.TemporaryDirectory(prefix="argus-equiv-") as tmp:
        world = _world(Path(tmp))
        for step in [("wait", 1), *sequence]:
            _apply_step(world, step)
            daemon = world.daemon
            warm, revision = _decide(daemon.parts, daemon.memory, world.now)
            world.cold_clones += 1
            cold, cold_revision = _decide(world.parts(f"cold-{world.cold_clones}"), Memory(), world.now)
            assert _summary(warm) == _summary(cold), step
            assert revision.spec_ids == cold_revision.spec_ids, step
            # Then the running daemon ticks for real on that revision (its admission order follows
            # the last tick's through the change feed): it applies and writes its status.
            parts = daemon.parts
            result, daemon.memory = tick(parts, revision, parts.observe(revision), daemon.memory, now=world.now)
            daemon.reporter.report(result)
