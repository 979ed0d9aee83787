"""The task and model examples users copy (README, docs/users) fit the GPU layout the docs install
(issue 30): docker-compose.gpus.example.yaml's workers, each a Ray node whose GPUs a task's
`gpus_per_node` and a model's `gpus_per_replica` must fit on. The README's 8-GPU GRPO example was
admitted against the summed GPUs of two 4-GPU workers and would have waited in Ray forever."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from reconciler.plan.actual import NodeCapacity
from reconciler.plan.admission import unschedulable
from reconciler.spec.loader import SourceFile, load
from reconciler.spec.types import DesiredState

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "docs/users/tasks.md", "docs/users/models.md")
CLUSTER = "kind: Cluster\nserving: {accelerator: gpu}\n"
_BLOCK = re.compile(r"```yaml\n(.*?)```", re.S)


def examples() -> list[tuple[str, int, str, str]]:
    """Every ``kind: Task`` / ``kind: Model`` YAML block of the user docs: (doc, index, kind, text)."""
    out = []
    for doc in DOCS:
        for i, block in enumerate(_BLOCK.findall((ROOT / doc).read_text(encoding="utf-8"))):
            kind = re.search(r"^kind: (Task|Model)\b", block, re.M)
            if kind:
                out.append((doc, i, kind.group(1), block))
    return out


def gpu_layout(services: dict[str, Any]) -> tuple[NodeCapacity, ...]:
    """The Ray nodes a host started from the GPU example runs: each worker that is started (no
    ``profiles``) with its device ids as GPUs and ARGUS_WORKER_GPUS driver slots, and a head with neither."""
    nodes = [NodeCapacity("head", {"CPU": 8.0}, {"CPU": 8.0})]
    for name, service in sorted(services.items()):
        if service.get("profiles"):
            continue
        devices = service["deploy"]["resources"]["reservations"]["devices"]
        gpus = float(sum(len(d["device_ids"]) for d in devices))
        slots = float(service["environment"]["ARGUS_WORKER_GPUS"])
        total = {"CPU": 64.0, "GPU": gpus, "worker_node": slots}
        nodes.append(NodeCapacity(name, total, dict(total)))
    return tuple(nodes)


def load_examples() -> DesiredState:
    files = [SourceFile("cluster.yaml", CLUSTER.encode(), "c")]
    for doc, i, kind, text in examples():
        name = f"{Path(doc).stem.lower()}-{i}"
        path = f"users/alice/{kind.lower()}s/{name}.yaml"
        files.append(SourceFile(path, text.encode(), hashlib.sha1(text.encode()).hexdigest()))
    return load(files, default_time=1767225600)


def summed(nodes: tuple[NodeCapacity, ...]) -> dict[str, float]:
    out: dict[str, float] = {}
    for node in nodes:
        for r, v in node.total.items():
            out[r] = out.get(r, 0.0) + v
    return out


def test_every_example_loads() -> None:
    found = examples()
    assert len(found) >= 6 and any(doc == "README.md" and kind == "Task" for doc, _, kind, _ in found)
    state = load_examples()
    assert not state.issues, [f"{i.path}:{i.line}: {i.message}" for i in state.issues]


def test_the_examples_fit_the_documented_gpu_layout() -> None:
    services = yaml.safe_load((ROOT / "docker-compose.gpus.example.yaml").read_text())["services"]
    nodes = gpu_layout(services)
    state = load_examples()
    assert state.tasks and state.models
    assert unschedulable(state, summed(nodes), nodes) == []


def test_the_check_sees_a_layout_the_examples_do_not_fit() -> None:
    """The split the GPU example's comment describes (two 4-GPU workers) cannot run an 8-GPU task."""
    split = (
        NodeCapacity("w1", {"GPU": 4.0, "worker_node": 4.0}, {}),
        NodeCapacity("w2", {"GPU": 4.0, "worker_node": 4.0}, {}),
    )
    never = unschedulable(load_examples(), summed(split), split)
    assert any("largest node has 4 GPUs" in why for _, why in never), never


@pytest.mark.parametrize("doc", DOCS)
def test_each_doc_still_has_examples(doc: str) -> None:
    assert any(d == doc for d, _, _, _ in examples()), f"{doc} has no Task/Model example left to check"
