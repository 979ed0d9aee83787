"""The loader's reuse of unchanged objects between loads (offline) and the memoised spec hashes."""

from __future__ import annotations

import hashlib
from dataclasses import replace

from reconciler.source.localfs import LocalFS
from reconciler.spec.hashing import model_spec_hash, task_spec_hash
from reconciler.spec.loader import ParseCache, SourceFile, load
from reconciler.spec.types import ClusterSpec, DesiredState, ObjectKey

CHAT = ObjectKey("alice", "model", "chat")
TUNED = ObjectKey("alice", "model", "tuned")
TRAIN = ObjectKey("alice", "task", "train")
TASK = "kind: Task\nworkload: grpo\nmodel: org/base\ndata:\n  train: $HOME/data/train.parquet\n"


def f(path: str, text: str) -> SourceFile:
    return SourceFile(path, text.encode(), hashlib.sha1(text.encode()).hexdigest())


def files(cluster: str = "kind: Cluster\n", with_task: bool = True) -> list[SourceFile]:
    out = [
        f("cluster.yaml", cluster),
        f("users/alice/models/chat.yaml", "kind: Model\nsource: org/chat\nreplicas: 2\n"),
        f("users/alice/models/tuned.yaml", "kind: Model\nsource: task:train\n"),
        f("users/alice/models/bad.yaml", "kind: Model\nsource: /etc/passwd\n"),
    ]
    return [*out, f("users/alice/tasks/train.yaml", TASK)] if with_task else out


def same_state(a: DesiredState, b: DesiredState) -> None:
    assert a.models == b.models
    assert a.tasks == b.tasks
    assert a.invalid == b.invalid
    assert a.issues == b.issues
    assert a.cluster == b.cluster


def test_an_unchanged_tree_reuses_the_same_objects() -> None:
    cache = ParseCache()
    first = load(files(), cache=cache, default_time=100)
    second = load(files(), cache=cache, default_time=100)
    same_state(first, second)
    same_state(second, load(files(), default_time=100))
    assert second.models[CHAT] is first.models[CHAT]
    assert second.tasks[TRAIN] is first.tasks[TRAIN]
    assert second.cluster is first.cluster
    assert cache.parsed == 5


def test_a_cluster_change_rebuilds_every_object() -> None:
    cache = ParseCache()
    before = load(files(), cache=cache)
    after = load(files('kind: Cluster\nenv: {HF_HUB_OFFLINE: "1", EXTRA: "x"}\n'), cache=cache)
    same_state(after, load(files('kind: Cluster\nenv: {HF_HUB_OFFLINE: "1", EXTRA: "x"}\n')))
    assert model_spec_hash(after.models[CHAT], after.cluster) != model_spec_hash(before.models[CHAT], before.cluster)


def test_a_task_source_becomes_valid_when_its_task_appears() -> None:
    cache = ParseCache()
    without = load(files(with_task=False), cache=cache)
    assert TUNED in without.invalid
    with_task = load(files(), cache=cache)
    assert TUNED in with_task.models and TUNED not in with_task.invalid
    assert TUNED in load(files(with_task=False), cache=cache).invalid


def test_a_new_created_time_gives_a_new_served_name() -> None:
    cache = ParseCache()
    first = load(files(), cache=cache, default_time=0)
    later = load(files(), cache=cache, created={"users/alice/models/chat.yaml": 1767225600}, default_time=0)
    assert first.models[CHAT].served_name == "alice-197001010000-chat"
    assert later.models[CHAT].served_name == "alice-202601010000-chat"


def test_online_loads_are_not_memoised() -> None:
    """With a file system the result depends on it (a model downloaded meanwhile): never reused."""
    cache = ParseCache()
    load(files(), cache=cache, fs=LocalFS())
    assert cache.built == {}


def test_memoised_hashes_follow_the_object_and_the_cluster() -> None:
    state = load(files())
    model, task = state.models[CHAT], state.tasks[TRAIN]
    digest = model_spec_hash(model, state.cluster)
    assert model_spec_hash(model, state.cluster) == digest
    other = ClusterSpec(env={"HF_HUB_OFFLINE": "0"})
    assert model_spec_hash(model, other) != digest
    assert model_spec_hash(model, state.cluster) == digest
    assert model_spec_hash(model, state.cluster, "/ckpt") != digest
    assert model_spec_hash(replace(model, gpus_per_replica=2), state.cluster) != digest
    run2 = replace(task, raw={**task.raw, "run": 2})
    assert task_spec_hash(run2) != task_spec_hash(task)
    assert task_spec_hash(task) == task_spec_hash(replace(task))
