"""File-system answers are reused by push ticks and re-read by timer ticks (reconciler.fscache)."""

from __future__ import annotations

import hashlib
import posixpath
import threading
from pathlib import Path
from unittest.mock import patch

import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from reconciler import fscache
from reconciler.fscache import CachedFS, ScopeGeneration
from reconciler.plan.actions import ActionType
from reconciler.source.localfs import LocalFS
from reconciler.source.remote import open_source
from reconciler.spec.incremental import IncrementalLoader
from reconciler.spec.loader import ParseCache, SourceFile, load
from reconciler.spec.types import ObjectKey
from tests.support import ConfigRepo, cluster_yaml, ticker
from tests.unit.fake_ray import FakeRay


def test_answers_are_kept_until_refresh(tmp_path: Path) -> None:
    fs = CachedFS(LocalFS())
    folder = tmp_path / "m"
    assert not fs.exists(str(folder)) and fs.listdir(str(tmp_path)) == []
    folder.mkdir()
    assert not fs.exists(str(folder))  # remembered
    generation = fs.generation
    fs.refresh()
    assert fs.exists(str(folder)) and fs.listdir(str(tmp_path)) == ["m"] and fs.generation == generation + 1


def test_a_folder_created_between_pushes_is_seen_at_the_next_refresh(tmp_path: Path) -> None:
    users = tmp_path / "users"
    (users / "alice").mkdir(parents=True)
    repo = ConfigRepo(tmp_path)
    repo.write("cluster.yaml", cluster_yaml(tmp_path / "hf", users, 8000))
    repo.write("users/alice/models/chat.yaml", {"kind": "Model", "source": "$HOME/models/chat"})
    repo.commit_push("alice: chat")
    reconciler = ticker(
        open_source(str(repo.bare), str(tmp_path / "cache")),
        "main",
        FakeRay(),
        secrets_env={},
        task_check=lambda t, c: [],
    )
    key = ObjectKey("alice", "model", "chat")
    first = reconciler.tick()
    assert key in first.desired.invalid and "does not exist" in str(first.desired.invalid[key][0])
    (users / "alice" / "models" / "chat").mkdir(parents=True)
    assert key in reconciler.tick().desired.invalid  # a push tick reuses what the file system said
    reconciler.timer()  # a timer tick
    again = reconciler.tick()
    assert key not in again.desired.invalid
    assert [a.type for a in again.plan.for_key(key)] == [ActionType.DEPLOY_MODEL]


def test_capacity_is_observed_on_timer_ticks_and_reused_by_pushes(tmp_path: Path) -> None:
    repo = ConfigRepo(tmp_path)
    repo.write("cluster.yaml", cluster_yaml(tmp_path / "hf", tmp_path / "users", 8000))
    repo.commit_push("cluster")
    asked: list[str] = []

    class Counting(FakeRay):
        def request(self, method: str, path: str, body: object = None, *, timeout: float | None = None) -> object:
            asked.append(f"{method} {path}")
            return super().request(method, path, body, timeout=timeout)

    source = open_source(str(repo.bare), str(tmp_path / "cache"))
    reconciler = ticker(source, "main", Counting(gpus=4), secrets_env={}, task_check=lambda t, c: [])
    reconciler.tick()
    reconciler.tick()  # a push soon after: Serve and Jobs again, capacity reused
    assert sum(p == "GET /api/cluster_status" for p in asked) == 1
    assert sum(p == "GET /api/serve/applications/" for p in asked) == 2
    reconciler.timer()  # a timer tick observes it again
    reconciler.tick()
    assert sum(p == "GET /api/cluster_status" for p in asked) == 2


# -- a refresh finds the answers that changed, and the folders that asked them -----------------


class FakeFS:
    """An in-memory file system: paths that exist (their folders with them), symlinks, texts and
    modification times. ``asked`` counts questions."""

    def __init__(self, *paths: str) -> None:
        self.present: set[str] = {"/"}
        self.links: dict[str, str] = {}
        self.texts: dict[str, str] = {}
        self.mtimes: dict[str, float] = {}
        self.asked = 0
        for path in paths:
            self.add(path)

    def add(self, path: str) -> None:
        while path not in self.present:
            self.present.add(path)
            path = posixpath.dirname(path)

    def remove(self, path: str) -> None:
        self.present = {p for p in self.present if p != path and not p.startswith(path + "/")}

    def realpath(self, path: str) -> str:
        self.asked += 1
        for _ in range(8):
            link = next((p for p in self.links if path == p or path.startswith(p + "/")), None)
            if link is None:
                break
            path = self.links[link] + path[len(link) :]
        return path

    def exists(self, path: str) -> bool:
        return self.realpath(path) in self.present

    def listdir(self, path: str) -> list[str]:
        real = self.realpath(path).rstrip("/")
        return sorted({p[len(real) + 1 :].split("/")[0] for p in self.present if p.startswith(real + "/")})

    def mtime(self, path: str) -> float:
        return self.mtimes.get(self.realpath(path), 0.0)

    def read_text(self, path: str) -> str | None:
        real = self.realpath(path)
        return self.texts.get(real) if real in self.present else None


def test_a_refresh_with_nothing_changed_keeps_every_generation() -> None:
    fs = CachedFS(FakeFS("/home/alice/m"))
    assert fs.scope("alice").exists("/home/alice/m") and not fs.scope("bob").exists("/home/bob/m")
    before = (fs.generation_of("alice"), fs.generation_of("bob"), fs.generation_of(None), fs.changed)
    fs.refresh()
    fs.refresh()
    assert (fs.generation_of("alice"), fs.generation_of("bob"), fs.generation_of(None), fs.changed) == before
    assert fs.generation == 2  # what a caller that does not scope its questions keys by


def test_a_changed_answer_moves_the_generation_of_each_folder_that_asked_it() -> None:
    inner = FakeFS("/home/alice/m")
    fs = CachedFS(inner)
    hf = "/hf/hub/models--org--m/snapshots"
    fs.scope("alice").exists(hf)  # a shared answer: asked by alice and bob
    fs.scope("bob").exists(hf)
    fs.scope("carol").exists("/home/carol/m")
    fs.refresh()
    gens = {u: fs.generation_of(u) for u in ("alice", "bob", "carol")}
    inner.add(hf + "/abc")
    fs.refresh()
    assert fs.generation_of("alice") > gens["alice"] and fs.generation_of("bob") > gens["bob"]
    assert fs.generation_of("carol") == gens["carol"] and fs.changed == fs.generation
    assert fs.scope("bob").exists(hf) and fs.scope("bob").listdir(hf) == ["abc"]
    inner.add("/home/carol/m")
    fs.refresh()
    assert fs.generation_of("carol") > gens["carol"] and fs.generation_of(None) == ScopeGeneration(0)
    # What every folder depends on moves every folder's generation.
    fs.scope(None).exists("/hf/common")
    inner.add("/hf/common")
    fs.refresh()
    now = ScopeGeneration(fs.generation)
    assert all(fs.generation_of(u) == now for u in (None, "alice", "bob", "carol", "dave"))


def test_answers_are_asked_once_per_refresh_and_forgotten_when_nobody_tracks_them() -> None:
    inner = FakeFS("/home/alice/m")
    fs = CachedFS(inner)
    for _ in range(3):
        assert fs.scope("alice").exists("/home/alice/m") and not fs.exists("/untracked")  # cached: asked once
    assert inner.asked == 2
    fs.refresh()  # alice's question is asked again; the untracked one is dropped, not asked
    assert inner.asked == 3 and fs.held() == 2  # the answer and who asked it
    fs.exists("/untracked")
    assert inner.asked == 4


def test_the_table_stays_bounded_when_questions_churn() -> None:
    """Every push asks about new paths, the file system never changes: the questions nobody asks
    any more go when the table outgrows twice a load from scratch, by one new start for all."""
    fs = CachedFS(FakeFS())
    for i in range(10):
        fs.scope("alice").exists(f"/home/alice/{i}")
    fs.refresh()  # the baseline: 10 questions
    peak = 0
    for period in range(400):
        for i in range(10):
            fs.scope("alice").exists(f"/home/alice/p{period}-{i}")
        fs.refresh()
        peak = max(peak, fs.held())
    assert fs.generation_of(None) > ScopeGeneration(0)  # started over at least once
    assert peak <= 3 * (2 * 10 + 1024 + 10) + 10


def test_a_question_asked_while_a_refresh_asks_the_file_system_is_not_lost() -> None:
    """A folder that asks during a refresh gets the answer the refresh is replacing: when that
    answer changed, the folder gets a new generation too."""
    inner = FakeFS()
    fs = CachedFS(inner)
    fs.scope("alice").exists("/hf/x")
    fs.refresh()

    class Meanwhile(FakeFS):
        def exists(self, path: str) -> bool:
            if path == "/hf/x":
                inner.add("/hf/x")
                assert not fs.scope("bob").exists("/hf/x")  # another thread: the old answer
                fs.scope("bob").exists("/home/bob/new")
            return inner.exists(path)

    fs.inner = Meanwhile()
    bob = fs.generation_of("bob")
    fs.refresh()
    assert fs.generation_of("bob") > bob and fs.generation_of("alice") == ScopeGeneration(fs.generation)
    fs.inner = inner
    assert fs.scope("bob").exists("/hf/x")


def test_questions_from_other_threads_during_refreshes() -> None:
    """Page threads ask while the loop refreshes: every question is answered, what a folder asked
    stays tracked with an answer, and after a last refresh every answer is the file system's."""
    inner = FakeFS()
    fs = CachedFS(inner)
    paths = [f"/home/u{i}/m" for i in range(40)]
    errors: list[BaseException] = []

    def ask() -> None:
        try:
            for n in range(3000):
                path = paths[n % len(paths)]
                fs.scope(f"u{n % 7}").exists(path)
                fs.realpath(path)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    thread = threading.Thread(target=ask)
    thread.start()
    for n in range(200):
        if n % 3:
            inner.add(paths[n % len(paths)])
        else:
            inner.remove(paths[n % len(paths)])
        fs.refresh()
    thread.join()
    assert not errors
    assert set(fs._askers) <= set(fs._answers)
    fs.refresh()
    assert all(fs.scope("u0").exists(p) == inner.exists(p) for p in paths)


# -- the loader re-loads only the folders whose answers changed --------------------------------

CLUSTER = {"kind": "Cluster", "paths": {"common": "/hf", "users": "/home"}}
QWEN = "/hf/hub/models--Qwen--Qwen2.5-0.5B/snapshots/a"


def _file(path: str, data: object) -> SourceFile:
    text = (data if isinstance(data, str) else yaml.safe_dump(data)).encode()
    return SourceFile(path, text, hashlib.sha1(text).hexdigest())


def _tree(docs: dict[str, object]) -> list[SourceFile]:
    files = [_file(path, doc) for path, doc in docs.items()]
    return sorted([_file("cluster.yaml", CLUSTER), *files], key=lambda f: f.path)


def _sft(data: str, model: str = "Qwen/Qwen2.5-0.5B") -> dict[str, object]:
    return {"kind": "Task", "workload": "sft", "model": model, "data": {"train": data}}


USERS3 = ("alice", "bob", "carol")


def test_a_timer_tick_with_nothing_changed_reloads_no_folder() -> None:
    inner = FakeFS(QWEN, *(f"/home/{u}/models/m" for u in USERS3), "/home/alice/data/train.parquet")
    docs: dict[str, object] = {}
    for u in USERS3:
        docs[f"users/{u}/models/m.yaml"] = {"kind": "Model", "source": "$HOME/models/m"}
        docs[f"users/{u}/models/q.yaml"] = {"kind": "Model", "source": "Qwen/Qwen2.5-0.5B"}
        docs[f"users/{u}/tasks/t.yaml"] = _sft("$HOME/data/train.parquet")
    files, fs, loader = _tree(docs), CachedFS(inner), IncrementalLoader()
    first = loader.load(files, fs=fs)
    assert loader.folders_loaded == 3 and len(first.models) == 6 and len(first.invalid) == 2
    for _ in range(3):
        fs.refresh()  # a timer tick
        again = loader.load(files, fs=fs)
        assert loader.folders_loaded == 3
        assert again == first == load(files, fs=inner, cache=ParseCache())
        assert all(again.models[k] is first.models[k] for k in first.models)  # not rebuilt


def test_a_users_data_folder_appearing_reloads_exactly_that_users_folder() -> None:
    inner = FakeFS(QWEN)
    docs: dict[str, object] = {f"users/{u}/tasks/t.yaml": _sft("$HOME/data/train.parquet") for u in USERS3}
    files, fs, loader = _tree(docs), CachedFS(inner), IncrementalLoader()
    first = loader.load(files, fs=fs)
    assert len(first.invalid) == 3 and loader.folders_loaded == 3
    inner.add("/home/bob/data/train.parquet")
    assert loader.load(files, fs=fs) == first  # a push tick: the answers of the last timer tick
    fs.refresh()
    got = loader.load(files, fs=fs)
    assert loader.folders_loaded == 4
    assert ObjectKey("bob", "task", "t") in got.tasks and len(got.invalid) == 2
    assert got == load(files, fs=inner, cache=ParseCache())


def test_a_model_appearing_in_the_hf_cache_reloads_each_user_of_it() -> None:
    inner = FakeFS(QWEN)
    docs: dict[str, object] = {
        "users/alice/models/o.yaml": {"kind": "Model", "source": "org/other"},
        "users/bob/tasks/t.yaml": {**_sft("$HOME/d", model="org/other")},
        "users/carol/models/q.yaml": {"kind": "Model", "source": "Qwen/Qwen2.5-0.5B"},
    }
    inner.add("/home/bob/d")
    files, fs, loader = _tree(docs), CachedFS(inner), IncrementalLoader()
    assert len(loader.load(files, fs=fs).invalid) == 2
    inner.add("/hf/hub/models--org--other/snapshots/b")
    fs.refresh()
    got = loader.load(files, fs=fs)
    assert loader.folders_loaded == 3 + 2 and not got.invalid
    assert got == load(files, fs=inner, cache=ParseCache())


def test_what_a_full_load_built_is_not_reused_by_a_folders_load() -> None:
    """A full load asks the CachedFS itself (nobody tracks its questions): an object it built
    is never a hit for a folder's load, whatever the generations' numbers."""
    inner = FakeFS()
    files = _tree({"users/alice/models/m.yaml": {"kind": "Model", "source": "$HOME/m"}})
    fs, cache = CachedFS(inner), ParseCache()
    assert load(files, fs=fs, cache=cache).invalid  # built in generation 0
    inner.add("/home/alice/m")
    fs.refresh()
    got = IncrementalLoader(cache).load(files, fs=fs)  # alice's folder: also generation 0
    assert not got.invalid and got == load(files, fs=inner)


def test_a_file_system_without_generations_is_asked_on_every_load() -> None:
    inner = FakeFS(*(f"/home/{u}/m" for u in USERS3))
    files = _tree({f"users/{u}/models/m.yaml": {"kind": "Model", "source": "$HOME/m"} for u in USERS3})
    loader = IncrementalLoader()
    assert loader.load(files, fs=inner) == load(files, fs=inner)
    inner.remove("/home/bob/m")
    got = loader.load(files, fs=inner)
    assert ObjectKey("bob", "model", "m") in got.invalid and got == load(files, fs=inner)


# -- the property: after any changes, refreshes and pushes, the load equals a full load ---------

PATHS = [
    *(f"/home/{u}/{p}" for u in USERS3 for p in ("models/m", "models/n", "data/train.parquet", "work", "")),
    QWEN,
    "/hf/hub/models--Qwen--Qwen2.5-0.5B/snapshots/b",
    "/hf/hub/models--org--other/snapshots/a",
    "/hf",
]
add_or_remove = st.tuples(st.sampled_from(["add", "remove"]), st.sampled_from(PATHS).map(lambda p: p.rstrip("/")))
fs_change = st.one_of(
    add_or_remove,
    add_or_remove,
    add_or_remove,
    st.tuples(st.just("link"), st.sampled_from([f"/home/{u}/models/m" for u in USERS3])),
    st.tuples(st.just("unlink"), st.sampled_from([f"/home/{u}/models/m" for u in USERS3])),
    st.tuples(st.just("refs"), st.sampled_from(["a", "b", "gone"])),
    st.tuples(st.just("touch"), st.sampled_from([QWEN, "/hf/hub/models--Qwen--Qwen2.5-0.5B/snapshots/b"])),
)
model_doc = st.builds(
    lambda s: {"kind": "Model", "source": s},
    st.sampled_from(["$HOME/models/m", "$HOME/models/n", "Qwen/Qwen2.5-0.5B", "org/other", "task:t"]),
)
task_doc = st.one_of(
    st.builds(
        _sft,
        st.sampled_from(["$HOME/data/train.parquet", "$HOME/work"]),
        st.sampled_from(["Qwen/Qwen2.5-0.5B", "org/other"]),
    ),
    st.just({"kind": "Task", "workload": "command", "command": "true", "working_dir": "$HOME/work"}),
)
tree_docs = st.fixed_dictionaries(
    {},
    optional={
        **{f"users/{u}/models/{n}.yaml": model_doc for u in USERS3 for n in ("a", "b")},
        **{f"users/{u}/tasks/t.yaml": task_doc for u in USERS3},
    },
)
fs_step = st.tuples(st.just("fs"), fs_change)
timer_step = st.tuples(st.just("timer"), st.none())
step = st.one_of(fs_step, fs_step, timer_step, timer_step, st.tuples(st.just("push"), tree_docs))


def _apply(inner: FakeFS, change: tuple[str, str]) -> None:
    what, arg = change
    if what == "add":
        inner.add(arg)
    elif what == "remove":
        inner.remove(arg)
    elif what == "link":
        inner.add("/outside/m")
        inner.links[arg] = "/outside/m"
    elif what == "unlink":
        inner.links.pop(arg, None)
    elif what == "refs":
        ref = "/hf/hub/models--Qwen--Qwen2.5-0.5B/refs/main"
        inner.add(ref)
        if arg == "gone":
            inner.remove(ref)
        else:
            inner.texts[ref] = arg
    else:
        inner.mtimes[arg] = inner.mtimes.get(arg, 0.0) + 1


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    tree_docs,
    st.lists(step, min_size=3, max_size=14),
    st.sets(st.sampled_from(PATHS), max_size=6),
    st.booleans(),
)
def test_after_any_file_system_changes_refreshes_and_pushes_the_load_equals_a_full_load(
    first: dict[str, object], steps: list[tuple[str, object]], present: set[str], tight: bool
) -> None:
    """Paths under users' homes and models in the Hugging Face cache appear, vanish, become
    symlinks out of the roots, ``refs/main`` and snapshot times move; pushes change which users
    ask what. After every timer tick (and every push with no file-system change since the last
    one) the incremental load equals a full load on the file system as it is. ``tight``: the
    table's bound is what a load from scratch asked, so every folder starts over often."""
    inner = FakeFS(*(p.rstrip("/") for p in present))
    fs, loader = CachedFS(inner), IncrementalLoader()
    files = _tree(first)
    fresh = True  # no file-system change since the last refresh
    changes = 0
    with patch.multiple(fscache, GROWTH=1 if tight else fscache.GROWTH, SLACK=0 if tight else fscache.SLACK):
        assert loader.load(files, fs=fs) == load(files, fs=inner, cache=ParseCache())
        for what, arg in steps:
            if what == "fs":
                _apply(inner, arg)  # type: ignore[arg-type]
                fresh, changes = False, changes + 1
                continue
            before, everyone = loader.folders_loaded, fs.generation_of(None)
            if what == "timer":
                fs.refresh()
                fresh = True
            else:
                files = _tree(arg)  # type: ignore[arg-type]
            got = loader.load(files, fs=fs)
            if what == "timer" and fs.generation_of(None) != everyone:
                event("timer: every folder started over")
            elif what == "timer" and changes:
                reloaded = loader.folders_loaded - before
                event(f"timer after changes: re-loaded {reloaded} of {len(loader._folders)} folders")
            changes = 0 if what == "timer" else changes
            if fresh:  # else the answers of the last timer tick stand, by design (reconciler.fscache)
                assert got == load(files, fs=inner, cache=ParseCache())
        fs.refresh()
        assert loader.load(files, fs=fs) == load(files, fs=inner, cache=ParseCache())


def test_an_interrupted_refresh_changes_nothing(tmp_path: Path) -> None:
    """A push waiting stops the timer tick's re-check; what was asked so far is thrown away."""
    fs = CachedFS(LocalFS())
    folders = [tmp_path / f"d{i}" for i in range(3 * fscache.CHECK_EVERY)]
    for folder in folders:
        assert not fs.scope("alice").exists(str(folder))
    generation, stamp = fs.generation, fs.generation_of("alice")
    folders[-1].mkdir()
    looks: list[int] = []

    def push_waiting() -> bool:
        looks.append(1)
        return len(looks) == 2  # a push arrived while the second batch of questions was asked

    assert fs.refresh(push_waiting) is False
    assert len(looks) == 2
    assert (fs.generation, fs.generation_of("alice")) == (generation, stamp)
    assert not fs.scope("alice").exists(str(folders[-1]))  # the old answer, until a refresh ends
    assert fs.refresh(lambda: False) is True
    assert fs.generation == generation + 1 and fs.generation_of("alice") != stamp
    assert fs.scope("alice").exists(str(folders[-1]))
