"""Whole ticks on generated hostile repositories: one user's file never affects another's.

Each example builds two commits in a real git repository: the *clean* one holds only
valid objects of the users ``alice`` and ``bob``; the *mixed* one holds the same files plus
hostile files of other users (random names with control characters, random bytes, every
YAML type, huge and deeply nested values, values JSON cannot carry, names whose derived
Serve application name or submission id collides with a valid object's). A full tick runs
on each against :class:`~tests.unit.fake_ray.FakeRay`, a stand-in for the dashboard REST
API. The properties:

- the tick never raises;
- every valid object is planned exactly as in the clean repository, and what its plan
  applies reaches Ray (its application in the PUT, its job submitted);
- an application argus does not own is carried through the PUT unchanged.

Capacity is reported unknown (admission off): which of two valid requests is admitted
first is the planner's question (``test_planner_*``), not containment's.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconciler.builders.serve import app_name
from reconciler.plan.actions import ActionType
from reconciler.source.remote import open_source
from reconciler.spec.types import ObjectKey
from reconciler.tick import TickResult
from tests.support import ticker
from tests.unit.fake_ray import FakeRay

DATE = "2026-11-29T12:00:00+00:00"
FOREIGN = {"name": "team-x", "route_prefix": "/x", "import_path": "team.x:app", "args": {"k": [1, 2]}}
VALID_USERS = ("alice", "bob")


class AllowAll:
    """A file system where every path exists (the path policy's roots are still enforced)."""

    def exists(self, path: str) -> bool:
        return True

    def realpath(self, path: str) -> str:
        return path

    def listdir(self, path: str) -> list[str]:
        return []

    def mtime(self, path: str) -> float:
        return 0.0

    def read_text(self, path: str) -> str | None:
        return None


# -- generators -----------------------------------------------------------------------------

names = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)
valid_model = st.fixed_dictionaries(
    {"kind": st.just("Model"), "source": st.just("$HOME/models/m"), "replicas": st.integers(1, 3)},
    optional={"engine_kwargs": st.fixed_dictionaries({"max_model_len": st.integers(64, 4096)})},
)
valid_task = st.fixed_dictionaries(
    {"kind": st.just("Task"), "workload": st.just("command"), "command": st.sampled_from(["true", "echo hi"])},
    optional={"run": st.integers(1, 3)},
)
valid_objects = st.dictionaries(
    st.tuples(st.sampled_from(VALID_USERS), st.sampled_from(["model", "task"]), names),
    st.none(),
    min_size=1,
    max_size=6,
).flatmap(
    lambda keys: st.fixed_dictionaries(
        {k: (valid_model if k[1] == "model" else valid_task) for k in keys}  # type: ignore[misc]
    )
)

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True)
    | st.text(max_size=30)
    | st.binary(max_size=20)
    | st.dates()
    | st.datetimes()
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
hostile_user = st.sampled_from(["mallory", "alice--x", "bob-x", "a--b", "x"]) | st.text(min_size=1, max_size=12)
hostile_name = names | st.text(min_size=1, max_size=16)
hostile_path = st.one_of(
    st.tuples(hostile_user, st.sampled_from(["models", "tasks"]), hostile_name).map(
        lambda t: f"users/{t[0]}/{t[1]}/{t[2]}.yaml"
    ),
    st.tuples(hostile_user, st.text(min_size=1, max_size=10)).map(lambda t: f"users/{t[0]}/{t[1]}"),
    st.text(min_size=1, max_size=20).map(lambda t: f"users/{t}"),
)
hostile_doc = st.one_of(
    values,
    st.fixed_dictionaries(
        {"kind": st.just("Model"), "source": st.just("$HOME/models/m")},
        optional={"engine_kwargs": values, "env": values, "replicas": values, "gpus_per_replica": values},
    ),
    st.fixed_dictionaries(
        {"kind": st.just("Task"), "workload": st.sampled_from(["command", "ppo", "grpo", "sft", "x"])},
        optional={"command": values, "env": values, "nodes": values, "gpus_per_node": values, "overrides": values},
    ),
)


def _yaml_bytes(doc: object) -> bytes:
    try:
        return yaml.dump(doc, allow_unicode=True).encode("utf-8", "surrogatepass")
    except Exception:
        return repr(doc).encode("utf-8", "replace")


hostile_content = st.one_of(
    hostile_doc.map(_yaml_bytes),
    st.binary(max_size=200),
    st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.sampled_from(
        [
            b"a: &x [*x]\n",
            b"<<: {kind: Model}\n",
            b"kind: Model\nkind: Task\n",
            b"!!python/object:os.system {}\n",
            b"[" * 5000,
            b"kind: Model\nsource: $HOME/models/m\nengine_kwargs: {when: 2026-01-01, blob: !!binary aGVsbG8=}\n",
            b"kind: Task\nworkload: command\ncommand: echo\nenv: {A: 2026-01-01}\n",
        ]
    ),
)
# Objects whose derived names collide with valid objects' (users a/a--b, tasks x-t / bob-x/t).
colliding = st.sampled_from(
    [
        ("users/alice--x/models/y.yaml", b"kind: Model\nsource: $HOME/models/m\n"),
        ("users/bob-x/tasks/t.yaml", b"kind: Task\nworkload: command\ncommand: 'true'\n"),
    ]
)
hostile_files = st.lists(st.tuples(hostile_path, hostile_content) | colliding, min_size=1, max_size=6)


# -- the repository ---------------------------------------------------------------------------


class Repo:
    """One git repository; each example commits a new orphan commit to a branch."""

    def __init__(self, root: Path) -> None:
        self.path = str(root / "config.git")
        self.users = str(root / "users")
        self.env = {
            **os.environ,
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@x",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@x",
            "GIT_AUTHOR_DATE": DATE,
            "GIT_COMMITTER_DATE": DATE,
            "GIT_INDEX_FILE": str(root / "index"),
        }
        self.tmp = root / "blobs"
        self.tmp.mkdir()
        self._git("init", "-q", "--bare", "-b", "main", self.path)
        cluster = {
            "kind": "Cluster",
            "paths": {"common": str(root / "hf"), "users": self.users},
            # FOREIGN has a route: carried only because the admin allows it by name.
            "serving": {"accelerator": "cpu", "http_port": 8000, "cpus_per_replica": 1, "allowed_apps": ["team-x"]},
            "training": {"driver_resources": {"worker_node": 1}},
        }
        self.cluster = yaml.safe_dump(cluster).encode()

    def _git(self, *args: str, input: bytes | None = None) -> bytes:
        return subprocess.run(
            ["git", *args], input=input, capture_output=True, check=True, env=self.env, cwd=self.tmp
        ).stdout

    def commit(self, branch: str, files: dict[str, bytes]) -> None:
        paths = sorted(files)
        for i, p in enumerate(paths):
            (self.tmp / str(i)).write_bytes(files[p])
        listing = "\n".join(str(self.tmp / str(i)) for i in range(len(paths))) + "\n"
        blobs = self._git("-C", self.path, "hash-object", "-w", "--stdin-paths", input=listing.encode()).split()
        index = b"".join(
            b"100644 " + b + b"\t" + p.encode("utf-8", "surrogateescape") + b"\0"
            for p, b in zip(paths, blobs, strict=True)
        )
        Path(self.env["GIT_INDEX_FILE"]).unlink(missing_ok=True)
        self._git("-C", self.path, "update-index", "-z", "--add", "--index-info", input=index)
        tree = self._git("-C", self.path, "write-tree").strip().decode()
        commit = self._git("-C", self.path, "commit-tree", tree, "-m", branch).strip().decode()
        self._git("-C", self.path, "update-ref", f"refs/heads/{branch}", commit)


@pytest.fixture(scope="module")
def repo() -> Iterator[Repo]:
    with tempfile.TemporaryDirectory(prefix="argus-fuzz-") as tmp:
        yield Repo(Path(tmp))


def _tick(repo: Repo, branch: str) -> tuple[TickResult, FakeRay]:
    ray = FakeRay(foreign_apps={FOREIGN["name"]: FOREIGN})
    source = open_source(repo.path, repo.path + "-cache")
    reconciler = ticker(source, branch, ray, fs=AllowAll(), secrets_env={}, task_check=lambda t, c: [])
    return reconciler.tick(), ray


def _valid_files(objects: dict[tuple[str, str, str], dict[str, Any]]) -> dict[str, bytes]:
    return {f"users/{u}/{k}s/{n}.yaml": yaml.safe_dump(doc).encode() for (u, k, n), doc in objects.items()}


def _plans(result: TickResult, keys: set[ObjectKey]) -> dict[ObjectKey, list[str]]:
    return {k: sorted(json.dumps(a.to_json(), sort_keys=True) for a in result.plan.actions if a.key == k) for k in keys}


@settings(
    max_examples=int(os.environ.get("ARGUS_FUZZ_EXAMPLES", "200")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    valid=valid_objects,
    hostile=hostile_files,
    collide=st.booleans(),
)
def test_hostile_files_never_affect_valid_objects(
    repo: Repo, valid: dict[tuple[str, str, str], dict[str, Any]], hostile: list[tuple[str, bytes]], collide: bool
) -> None:
    valid = dict(valid)
    if collide:  # valid objects that hostile names collide with (see ``colliding``)
        valid[("alice", "model", "x--y")] = {"kind": "Model", "source": "$HOME/models/m"}
        valid[("bob", "task", "x-t")] = {"kind": "Task", "workload": "command", "command": "true"}
    clean = {"cluster.yaml": repo.cluster, **_valid_files(valid)}
    mixed = dict(clean)
    for path, content in hostile:
        path = path.replace("\0", "")
        if path.startswith(tuple(f"users/{u}/" for u in VALID_USERS)) or path.endswith("/") or "//" in path:
            continue  # hostile files live in other users' folders
        mixed.setdefault(path, content)
    repo.commit("clean", clean)
    repo.commit("mixed", mixed)

    want, _ = _tick(repo, "clean")
    got, ray = _tick(repo, "mixed")  # never raises

    keys = {ObjectKey(u, k, n) for u, k, n in valid}  # type: ignore[arg-type]
    assert _plans(got, keys) == _plans(want, keys)
    assert ray.apps.get(FOREIGN["name"]) == FOREIGN
    for key in keys:
        assert key not in got.failures, got.failures[key]
        for action in got.plan.for_key(key):
            if action.type is ActionType.DEPLOY_MODEL:
                deployed = ray.apps[app_name(key.user, key.name)]["args"]["argus"]
                assert (deployed["user"], deployed["name"]) == (key.user, key.name)
            if action.type is ActionType.SUBMIT_TASK:
                job = ray.jobs[action.submission_id or ""]
                assert (job["metadata"]["argus-user"], job["metadata"]["argus-task"]) == (key.user, key.name)
