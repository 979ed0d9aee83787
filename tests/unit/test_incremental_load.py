"""The incremental load equals a full load of the same files, after any sequence of trees.

Trees are drawn from a small world where every cross-file rule of the loader can fire: two
users whose names nest (``alice``, ``alice-bob``: one's alias can clash with the other's
name), models taking a task's output (``source: task:<name>``), files that claim an object
(``chat.yml``), broken YAML, symlinks, sub-folders, undeclared users, and cluster.yaml
variants (valid, declaring users, broken). Between trees files are added, changed, deleted
and re-added, creation times move (a history rewrite), and the file system's generation or
the checks change. Both paths see the same inputs; the full one never reuses anything.
"""

from __future__ import annotations

import hashlib

import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from reconciler.plan.actual import ActualState
from reconciler.plan.planner import plan
from reconciler.spec.incremental import IncrementalLoader
from reconciler.spec.loader import ParseCache, SourceFile, load
from reconciler.spec.types import DesiredState, ObjectKey
from tests.unit.test_fuzz_ticks import AllowAll

USERS = ("alice", "alice-bob", "bob", "carol")
CLUSTERS = {
    "plain": {"kind": "Cluster", "paths": {"common": "/hf", "users": "/home"}},
    "declared": {
        "kind": "Cluster",
        "paths": {"common": "/hf", "users": "/home"},
        "users": {"alice": {}, "alice-bob": {}, "bob": {}},
    },
    "broken": "kind: Cluster\npaths: [",
}

model_doc = st.fixed_dictionaries(
    {
        "kind": st.just("Model"),
        "source": st.sampled_from(["$HOME/models/m", "task:t1", "task:t2", "Qwen/Qwen2.5-0.5B"]),
    },
    optional={
        "served_name": st.sampled_from(["alice-bob-x", "alice-bob-m1", "alice-x", "bob-x", "bob-m1", "carol-m1"]),
        "replicas": st.integers(0, 2),
        "suspend": st.booleans(),
    },
)
task_doc = st.fixed_dictionaries(
    {"kind": st.just("Task"), "workload": st.just("command"), "command": st.sampled_from(["true", "echo hi"])},
    optional={"suspend": st.booleans(), "run": st.integers(1, 2)},
)
broken = st.sampled_from([b"kind: Model\nsource: [", b"", b"- 1\n- 2\n", b"\xff\xfe"])
model_text = model_doc.map(lambda d: yaml.safe_dump(d).encode())
when = st.integers(0, 3)
model_entry = st.tuples(
    st.sampled_from(USERS),
    st.sampled_from([f"models/{n}.yaml" for n in ("m1", "m2", "x", "bob-x")]),
    st.one_of(model_text, model_text, model_text, broken),
    when,
)
task_entry = st.tuples(
    st.sampled_from(USERS),
    st.sampled_from(["tasks/t1.yaml", "tasks/t2.yaml"]),
    st.one_of(task_doc.map(lambda d: yaml.safe_dump(d).encode()), broken),
    when,
)
odd_entry = st.tuples(
    st.sampled_from(USERS),
    st.sampled_from(["models/m1.yml", "models/old/m2.yaml", "tasks/.gitkeep", "notes.txt", "tasks/m1.yaml"]),
    st.one_of(model_text, broken),
    when,
)
entry = st.one_of(model_entry, model_entry, task_entry, task_entry, odd_entry)
tree = st.fixed_dictionaries(
    {
        "cluster": st.sampled_from(["plain", "plain", "plain", "declared", "broken"]),
        "files": st.lists(entry, min_size=2, max_size=16),
        "symlink": st.sampled_from([None, "users/bob/models/m2.yaml"]),
        "generation": st.integers(0, 1),
    }
)


class Generations(AllowAll):
    """A file system whose answers are frozen per generation (as CachedFS): every path exists."""

    def __init__(self) -> None:
        self.generation = 0


def _files(spec: dict[str, object]) -> tuple[list[SourceFile], dict[str, int]]:
    cluster = CLUSTERS[str(spec["cluster"])]
    text = cluster if isinstance(cluster, str) else yaml.safe_dump(cluster)
    by_path: dict[str, SourceFile] = {}
    created: dict[str, int] = {}
    for user, rel, data, when in spec["files"]:  # type: ignore[attr-defined]
        path = f"users/{user}/{rel}"
        by_path[path] = SourceFile(path, data, hashlib.sha1(data).hexdigest())
        created[path] = 1767225600 + 60 * when
    link = spec["symlink"]
    if isinstance(link, str):
        by_path[link] = SourceFile(link, None, "0" * 40, symlink=True)
    by_path["cluster.yaml"] = SourceFile("cluster.yaml", text.encode(), hashlib.sha1(text.encode()).hexdigest())
    return [by_path[p] for p in sorted(by_path)], created


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(tree, min_size=1, max_size=6), st.booleans())
def test_incremental_load_equals_a_full_load_after_any_sequence_of_trees(
    trees: list[dict[str, object]], online: bool
) -> None:
    inc, fed = IncrementalLoader(), IncrementalLoader()  # fed: told which paths changed, as the reader tells it
    fs = Generations()
    last: dict[str, tuple[SourceFile, int | None]] = {}
    got_before: DesiredState | None = None
    fed_before: DesiredState | None = None
    for n, spec in enumerate(trees):
        files, created = _files(spec)
        if n:  # some files without a creation time: the commit's time, which moves
            created = {p: t for p, t in created.items() if not p.endswith("2.yaml")}
        fs.generation = int(spec["generation"])  # type: ignore[call-overload]
        kw = dict(created=created, default_time=1767225000 + n, fs=fs if online else None, revision=f"r{n}")
        got = inc.load(files, **kw)  # type: ignore[arg-type]
        now = {f.path: (f, created.get(f.path)) for f in files}
        paths = {p for p in now.keys() | last.keys() if now.get(p) != last.get(p)}
        fed_got = fed.load(files, changed=(f"r{n - 1}", paths), **kw)  # type: ignore[arg-type]
        last = now
        want = load(files, cache=ParseCache(), **kw)  # type: ignore[arg-type]
        assert got == want
        assert fed_got == want
        for state, before in ((got, got_before), (fed_got, fed_before)):
            _check_changed(state, before)
        got_before, fed_before = got, fed_got
        event(f"models {min(len(want.models), 3)}, tasks {min(len(want.tasks), 3)}")
        event(f"clash: {any('already used' in i.message for i in want.issues)}")
        event(f"task source: {any(m.source.startswith('task:') for m in want.models.values())}")
        assert plan(got, ActualState(), now=0) == plan(want, ActualState(), now=0)


def _check_changed(state: DesiredState, before: DesiredState | None) -> None:
    """The change feed: every object it does not name is as it was, its very spec object."""
    assert state.serial and (before is None or state.serial != before.serial)
    if state.changed is None:
        return
    assert before is not None and state.changed[0] == before.serial
    for key in state.keys() | before.keys():
        if key not in state.changed[1]:
            assert state.models.get(key) is before.models.get(key), key
            assert state.tasks.get(key) is before.tasks.get(key), key
            assert state.invalid.get(key) == before.invalid.get(key), key


class _Untouchable(SourceFile):
    """A file of a folder the push did not change: only its path may be read (to find folders)."""

    def __init__(self, file: SourceFile) -> None:
        object.__setattr__(self, "_file", file)

    def __getattribute__(self, name: str) -> object:
        if name in ("path", "__class__"):
            return object.__getattribute__(self, "_file").path if name == "path" else _Untouchable
        raise AssertionError(f"the loader read .{name} of a file whose folder did not change")


def test_a_push_reloads_only_the_folder_it_changed() -> None:
    spec: dict[str, object] = {
        "cluster": "plain",
        "files": [
            (u, f"models/m{i}.yaml", yaml.safe_dump({"kind": "Model", "source": "$HOME/m"}).encode(), 0)
            for u in USERS
            for i in (1, 2)
        ],
        "symlink": None,
        "generation": 0,
    }
    inc = IncrementalLoader()
    files, created = _files(spec)
    inc.load(files, created=created)
    assert inc.folders_loaded == len(USERS)
    changed = [
        f if f.path != "users/bob/models/m1.yaml" else SourceFile(f.path, b"kind: Model\nsource: x\n", "b2")
        for f in files
    ]
    got = inc.load(changed, created=created)
    assert inc.folders_loaded == len(USERS) + 1
    assert got == load(changed, created=created)
    # Told what changed, the loader looks only at those folders' files (not at the others at all).
    fed = IncrementalLoader()
    fed.load(files, created=created, revision="r1")
    untouchable = [
        f if not f.path.startswith("users/") or f.path.startswith("users/bob/") else _Untouchable(f) for f in changed
    ]
    got = fed.load(untouchable, created=created, revision="r2", changed=("r1", ["users/bob/models/m1.yaml"]))
    assert fed.folders_loaded == len(USERS) + 1
    assert got == load(changed, created=created, revision="r2")
    # cluster.yaml changes every object's validation: everything is loaded again.
    recluster = [
        f if f.path != "cluster.yaml" else SourceFile("cluster.yaml", b"kind: Cluster\n", "c2") for f in changed
    ]
    assert inc.load(recluster, created=created) == load(recluster, created=created)
    assert inc.folders_loaded == 2 * len(USERS) + 1


def test_the_cache_keeps_one_generation_of_built_objects() -> None:
    """A file system without scopes that starts a new generation has every object rebuilt: the
    objects built for the last generation are replaced and those of the last cluster.yaml go,
    instead of piling up to the cache's bound (at 10,000 objects, ~10 MB a generation)."""
    spec: dict[str, object] = {
        "cluster": "plain",
        "files": [
            (u, f"models/m{i}.yaml", yaml.safe_dump({"kind": "Model", "source": "$HOME/m"}).encode(), 0)
            for u in USERS
            for i in (1, 2)
        ],
        "symlink": None,
        "generation": 0,
    }
    files, created = _files(spec)
    inc, fs = IncrementalLoader(), Generations()
    for generation in range(5):
        fs.generation = generation
        got = inc.load(files, created=created, fs=fs)  # type: ignore[arg-type]
        assert got == load(files, created=created, fs=fs)  # type: ignore[arg-type]
        assert len(inc.cache.built) == len(files) - 1  # one per object file, of this generation
    recluster = [f if f.path != "cluster.yaml" else SourceFile("cluster.yaml", b"kind: Cluster\n", "c2") for f in files]
    assert inc.load(recluster, created=created, fs=fs) == load(recluster, created=created, fs=fs)  # type: ignore[arg-type]
    assert len(inc.cache.built) == len(files) - 1


def test_the_change_feed_names_a_model_that_wins_its_served_name_back() -> None:
    """A clash's loser keeps its file; when the other side goes, it is valid again though its own
    folder did not change: the feed must name it."""
    model = yaml.safe_dump({"kind": "Model", "source": "$HOME/m"}).encode()

    def tree(*entries: tuple[str, str]) -> dict[str, object]:
        return {"cluster": "plain", "files": [(u, r, model, i) for i, (u, r) in enumerate(entries)], "symlink": None}

    trees = [
        tree(("alice", "models/bob-x.yaml"), ("carol", "models/m1.yaml")),
        tree(("alice", "models/bob-x.yaml"), ("alice-bob", "models/x.yaml"), ("carol", "models/m1.yaml")),
        tree(("alice", "models/bob-x.yaml"), ("carol", "models/m1.yaml")),
    ]
    loader, before = IncrementalLoader(), None
    for n, spec in enumerate(trees):
        files, created = _files(spec)
        state = loader.load(files, created=created, revision=f"r{n}")
        assert state == load(files, created=created, revision=f"r{n}")
        _check_changed(state, before)
        before = state
    assert (
        before is not None and before.changed is not None and ObjectKey("alice", "model", "bob-x") in before.changed[1]
    )


def test_a_state_made_from_a_loaded_one_carries_no_change_feed() -> None:
    """``dataclasses.replace`` (the tick's containment) makes a state the loader did not: a
    planner must not take its objects as the feed says."""
    import dataclasses

    model = yaml.safe_dump({"kind": "Model", "source": "$HOME/m"}).encode()
    loader = IncrementalLoader()
    for n in range(2):
        files, created = _files({"cluster": "plain", "files": [("alice", "models/m1.yaml", model, n)], "symlink": None})
        state = loader.load(files, created=created, revision=f"r{n}")
    assert state.serial and state.changed is not None
    copy = dataclasses.replace(state, models={})
    assert copy.serial == 0 and copy.changed is None
