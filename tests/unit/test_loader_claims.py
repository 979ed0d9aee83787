"""An invalid file holds the object its path still names (issue 12: renaming chat.yaml to chat.yml
must not delete the running model)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from reconciler.plan.actual import ActualModel, ActualState
from reconciler.plan.planner import plan
from reconciler.source.git import GitRepo
from reconciler.spec.hashing import model_spec_hash
from reconciler.spec.loader import SourceFile, claimed_key, load
from reconciler.spec.types import ObjectKey
from tests.unit.gitrepo import WorkRepo

MODEL = "kind: Model\nsource: Qwen/Qwen2.5-0.5B-Instruct\n"
CHAT = ObjectKey("alice", "model", "chat")


def file(path: str, text: str = MODEL) -> SourceFile:
    return SourceFile(path, text.encode(), hashlib.sha1(text.encode()).hexdigest())


@pytest.mark.parametrize(
    ("path", "key"),
    [
        ("users/alice/models/chat.yml", CHAT),
        ("users/alice/models/chat.yaml.bak", CHAT),
        ("users/alice/models/chat", CHAT),
        ("users/alice/models/chat.YAML", CHAT),
        ("users/alice/models/old/chat.yaml", CHAT),
        ("users/alice/models/a/b/chat.json", CHAT),
        ("users/alice/tasks/train.yml", ObjectKey("alice", "task", "train")),
        ("users/alice/chat.yaml", None),  # directly under the user: names no kind
        ("users/alice/model/chat.yaml", None),  # unknown folder
        ("users/alice/models/Chat.yml", None),  # not a valid name: no object ever had it
        ("users/alice/models/.gitkeep", None),
        ("users/Alice/models/chat.yml", None),
        ("users/alice/models/chat\n.yml", None),
        ("users/alice/models/caf\udce9.yml", None),
        ("cluster.yml", None),
    ],
)
def test_claimed_key(path: str, key: ObjectKey | None) -> None:
    assert claimed_key(path) == key


def test_an_invalid_file_holds_its_object_unless_the_real_file_exists() -> None:
    state = load([file("users/alice/models/chat.yml"), file("users/bob/models/old/coder.yaml")])
    assert set(state.invalid) == {CHAT, ObjectKey("bob", "model", "coder")}
    assert [i.message for i in state.invalid[CHAT]] == ["use the .yaml extension (.yml files are not loaded)"]
    assert not state.models
    # Beside the real file, a stray copy is reported but holds nothing: the real file decides.
    state = load([file("users/alice/models/chat.yml"), file("users/alice/models/chat.yaml")])
    assert CHAT in state.models and CHAT not in state.invalid
    assert [i.path for i in state.issues] == ["users/alice/models/chat.yml"]
    # Two invalid files naming one object: both reported, on the one object.
    state = load([file("users/alice/models/chat.yml"), file("users/alice/models/chat.yaml.orig")])
    assert len(state.invalid[CHAT]) == 2


def test_renaming_a_running_models_file_to_yml_keeps_it(tmp_path: Path) -> None:
    """Through a real repository: commit chat.yaml, deploy it, `git mv` it to chat.yml."""
    repo = WorkRepo(tmp_path / "config")
    repo.write("users/alice/models/chat.yaml", MODEL)
    first = repo.commit("add chat", 1767225600)
    source = GitRepo(str(repo.root))
    snap = source.snapshot(first)
    desired = load(snap.files, created=snap.created)
    spec = desired.models[CHAT]
    actual = ActualState()
    actual.models[CHAT] = ActualModel(CHAT, spec.served_name, model_spec_hash(spec, desired.cluster), 1, 1, "RUNNING")
    assert [a.type.value for a in plan(desired, actual).actions] == []

    repo.git("mv", "users/alice/models/chat.yaml", "users/alice/models/chat.yml")
    second = repo.commit("rename to .yml", 1767312000)
    snap = source.snapshot(second)
    desired = load(snap.files, created=snap.created)
    actions = plan(desired, actual).actions
    assert [(a.type.value, a.key) for a in actions] == [("keep", CHAT)]
    assert "kept as it runs: the file is invalid (users/alice/models/chat.yml: use the .yaml extension" in (
        actions[0].reason
    )
