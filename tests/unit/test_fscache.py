"""File-system answers are reused by push ticks and re-read by timer ticks (reconciler.fscache)."""

from __future__ import annotations

import posixpath
from pathlib import Path

from reconciler.fscache import CachedFS, ScopeGeneration
from reconciler.plan.actions import ActionType
from reconciler.source.localfs import LocalFS
from reconciler.source.remote import open_source
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
