"""Observation of what code on the cluster can write: Serve apps under argus's names, job
metadata, node resources, run folders. None of it may make a tick fail for everyone, and a
run folder must never lead the checkpoint scan outside its owner's home.

Whole ticks run against :class:`~tests.unit.fake_ray.FakeRay` (a stand-in for the dashboard
REST API) on a real git repository; run folders are real temporary directories.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

import reconciler.observe.jobs as observe_jobs
from reconciler.builders.serve import app_name
from reconciler.observe.capacity import parse_capacity
from reconciler.observe.jobs import (
    checkpoint_of,
    checkpoint_step,
    find_hf_checkpoint,
    job_resources,
    resume_point,
    run_checkpoint_step,
)
from reconciler.observe.serve import parse_serve_details, resources_per_replica
from reconciler.plan.actions import ActionType
from reconciler.source.remote import open_source
from reconciler.spec.types import ObjectKey, Paths
from tests.support import ConfigRepo, Ticker, cluster_yaml, task_spec, ticker
from tests.unit.fake_ray import FakeRay
from tests.unit.test_fuzz_ticks import AllowAll

BAD_NAME = "argus--mallory--m"
MALLORY = ObjectKey("mallory", "model", "m")
BOB = ObjectKey("bob", "model", "chat")
MALFORMED_ARGS: dict[str, dict[str, Any]] = {
    "args.argus is a string": {"import_path": "x:y", "args": {"argus": "pwn"}},
    "args.argus.spec_hash is a list": {"import_path": "x:y", "args": {"argus": {"spec_hash": [1], "served_name": 3}}},
    "bundle value not a number": {
        "import_path": "x:y",
        "args": {"llm_config": {"placement_group_config": {"bundles": [{"GPU": "lots"}, "x"]}}},
    },
    "actor options of odd types": {
        "import_path": "x:y",
        "args": {"llm_config": {"deployment_config": {"ray_actor_options": {"num_cpus": [], "resources": [1]}}}},
    },
    "deployments is a list of str": {"import_path": "x:y", "args": {}, "deployments": ["a", {"num_replicas": "9"}]},
    "args is a list": {"import_path": "x:y", "args": [1]},
    "llm_config is a string": {"import_path": "x:y", "args": {"llm_config": "nope"}},
}


def _repo(tmp_path: Path, *, mallory_model: bool) -> ConfigRepo:
    repo = ConfigRepo(tmp_path)
    repo.write("cluster.yaml", cluster_yaml(tmp_path / "hf", tmp_path / "users", 8000))
    repo.write("users/alice/tasks/a.yaml", {"kind": "Task", "workload": "command", "command": "true"})
    repo.write("users/bob/models/chat.yaml", {"kind": "Model", "source": "$HOME/models/chat", "replicas": 1})
    if mallory_model:
        repo.write("users/mallory/models/m.yaml", {"kind": "Model", "source": "$HOME/models/m", "replicas": 1})
    repo.commit_push("objects")
    return repo


def _reconciler(repo: ConfigRepo, ray: FakeRay) -> Ticker:
    source = open_source(str(repo.bare), str(repo.bare) + "-cache")
    return ticker(source, "main", ray, fs=AllowAll(), secrets_env={}, task_check=lambda t, c: [])


@pytest.mark.parametrize("case", sorted(MALFORMED_ARGS))
@pytest.mark.parametrize("mallory_model", [False, True], ids=["no-file", "file"])
def test_an_argus_named_app_with_malformed_args_never_stops_a_tick(
    tmp_path: Path, case: str, mallory_model: bool
) -> None:
    repo = _repo(tmp_path, mallory_model=mallory_model)
    ray = FakeRay(foreign_apps={BAD_NAME: dict(name=BAD_NAME, **MALFORMED_ARGS[case])}, gpus=8)
    rec = _reconciler(repo, ray)
    result = rec.tick()

    # Everyone else's work is applied in the same tick.
    assert ray.submits == 1 and any(sid.startswith("argus--alice--a--") for sid in ray.jobs)
    assert app_name("bob", "chat") in ray.apps
    assert BOB not in result.failures
    # The bad app is argus's (its namespace) with an unknown spec: reported in the plan and
    # replaced by the desired config, or deleted when no file declares it.
    assert MALLORY in result.actual.models and result.actual.models[MALLORY].spec_hash == ""
    kinds = {a.type for a in result.plan.for_key(MALLORY)}
    if mallory_model:
        assert ActionType.UPDATE_MODEL in kinds
        # Someone else's code under argus's name: removed first, argus's config deployed once it is gone.
        assert BAD_NAME not in ray.apps
        rec.tick()
        deployed = ray.apps[BAD_NAME]["args"]
        assert deployed["argus"]["spec_hash"] and deployed["llm_config"]["placement_group_config"]["bundles"]
    else:
        assert ActionType.DELETE_MODEL in kinds
        assert BAD_NAME not in ray.apps


def test_a_foreign_app_with_odd_deployments_is_carried_unchanged(tmp_path: Path) -> None:
    odd = {"name": "team-x", "import_path": "x:y", "route_prefix": None, "args": [1], "deployments": ["a"]}
    repo = _repo(tmp_path, mallory_model=False)
    ray = FakeRay(foreign_apps={"team-x": odd}, gpus=8)
    _reconciler(repo, ray).tick()
    assert ray.apps["team-x"] == odd
    assert app_name("bob", "chat") in ray.apps and ray.submits == 1


def test_serve_details_of_odd_shapes_parse_without_raising() -> None:
    body: dict[str, Any] = {
        "applications": {
            "argus--a--b": {"status": "RUNNING", "deployed_app_config": {"args": {}}, "deployments": ["x"]},
            "argus--c--d": {"status": 1, "deployed_app_config": [1], "deployments": {"d": {"replicas": "r"}}},
            "argus--e--f": "not an app",
            "argus--bad": {"status": "RUNNING", "deployed_app_config": {"args": {"argus": 1}}},
            "g": {"status": "DEPLOYING", "deployed_app_config": {}, "last_deployed_time_s": "soon"},
        },
        "http_options": "port 80",
        "proxy_location": 7,
    }
    obs = parse_serve_details(body)
    assert set(obs.models) == {ObjectKey("a", "model", "b")}
    assert "argus--c--d" in obs.imperative  # a config of the wrong type is never put back
    assert "argus--bad" in obs.apps and "argus--bad" not in obs.foreign_apps()  # argus's: the PUT drops it
    assert obs.building_since["g"] == 0.0
    assert obs.http_options is None and obs.proxy_location is None


def test_resources_that_are_not_numbers_count_zero() -> None:
    llm = {
        "placement_group_config": {"bundles": [{"GPU": "lots", "CPU": 2}, {"GPU": float("inf")}, [1], {3: 1}]},
        "deployment_config": {"ray_actor_options": {"num_cpus": "1", "num_gpus": True, "resources": {"x": None}}},
    }
    assert resources_per_replica(llm) == {"CPU": 2.0}
    assert resources_per_replica({"placement_group_config": "x", "deployment_config": [1]}) == {"CPU": 1.0}


def test_capacity_of_odd_shapes_counts_unknown_values_zero() -> None:
    nodes: list[Any] = [
        {"state": "ALIVE", "resources_total": {"GPU": "8", "CPU": 4, "x": [1], 5: 1}},
        {"state": "ALIVE", "resources_total": ["GPU"]},
        "node",
        {"state": "ALIVE", "resources_total": {"GPU": 2}},
    ]
    cap = parse_capacity(nodes, {"CPU": "busy", "GPU": [1.0, 2.0], "x": []})
    assert cap.total == {"GPU": 2.0, "CPU": 4.0, "x": 0.0}
    assert cap.available == {"GPU": 1.0, "CPU": 4.0, "x": 0.0}
    assert parse_capacity("nodes", "usage").total == {}  # type: ignore[arg-type]


def test_job_resources_of_odd_types_count_zero() -> None:
    assert job_resources({"metadata": {"argus-resources": '{"GPU": "2", "CPU": 1}'}}) == {"CPU": 1.0}
    assert job_resources({"metadata": "x", "entrypoint_resources": ["GPU"], "entrypoint_num_gpus": "4"}) == {}
    assert job_resources({"entrypoint_resources": {"GPU": "x", "CPU": 2}}) == {"GPU": 0.0, "CPU": 2.0}


# -- checkpoint lookup ------------------------------------------------------------------------


def _hf_folder(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"w")
    return folder


SID = "argus--alice--t--0123abcd"


def _paths(tmp_path: Path) -> Paths:
    return Paths(common=str(tmp_path / "hf"), users=str(tmp_path / "users"))


def test_a_run_folder_checkpoint_is_found(tmp_path: Path) -> None:
    hf = _hf_folder(tmp_path / "users/alice/jobs/t" / SID / "checkpoints/global_step_3/huggingface")
    assert checkpoint_of(_paths(tmp_path), "alice", "t", SID) == str(hf)


def test_a_run_folder_that_is_a_symlink_is_not_scanned(tmp_path: Path) -> None:
    inside = _hf_folder(tmp_path / "users/alice/elsewhere/ckpt")
    bob = _hf_folder(tmp_path / "users/bob/models/m")
    (tmp_path / "users/alice/jobs/t").mkdir(parents=True)
    run = tmp_path / "users/alice/jobs/t" / SID
    paths = _paths(tmp_path)
    for target in (inside.parent, bob.parent, tmp_path / "users", Path("/")):
        if run.is_symlink():
            run.unlink()
        run.symlink_to(target)
        assert checkpoint_of(paths, "alice", "t", SID) is None, target


def test_a_run_folder_reached_through_a_symlink_out_of_the_home_is_not_scanned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _hf_folder(tmp_path / "users/bob/jobs/t" / SID / "hf")
    (tmp_path / "users/alice").mkdir(parents=True)
    (tmp_path / "users/alice/jobs").symlink_to(tmp_path / "users/bob/jobs")
    scans: list[str] = []
    monkeypatch.setattr(observe_jobs, "find_hf_checkpoint", scans.append)
    assert checkpoint_of(_paths(tmp_path), "alice", "t", SID) is None
    assert scans == []  # not even walked: the path policy would only have dropped the result


def test_the_scan_stops_after_the_entry_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"
    for i in range(30):
        (run / f"d{i:02}").mkdir(parents=True)
    _hf_folder(run / "zz")
    monkeypatch.setattr(observe_jobs, "_MAX_ENTRIES", 10)
    visited = list(observe_jobs._walk(str(run)))
    assert len(visited) == 1  # the root's 31 entries already pass the bound: nothing below is read
    assert find_hf_checkpoint(str(run)) is None
    monkeypatch.setattr(observe_jobs, "_MAX_ENTRIES", 1000)
    assert find_hf_checkpoint(str(run)) == str(run / "zz")


def test_a_succeeded_jobs_folder_is_scanned_once_across_ticks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scans: list[str] = []
    real_find = observe_jobs.find_hf_checkpoint

    def counting(run_dir: str) -> str | None:
        scans.append(run_dir)
        return real_find(run_dir)

    monkeypatch.setattr(observe_jobs, "find_hf_checkpoint", counting)
    repo = _repo(tmp_path, mallory_model=False)
    ray = FakeRay(gpus=8)
    rec = _reconciler(repo, ray)
    rec.tick()
    (sid,) = ray.jobs
    hf = _hf_folder(tmp_path / "users/alice/jobs/a" / sid / "out")
    ray.jobs[sid]["status"] = "SUCCEEDED"
    results = [rec.tick() for _ in range(4)]
    assert scans == [str(tmp_path / "users/alice/jobs/a" / sid)]
    assert all(j.hf_checkpoint == str(hf) for r in results for j in r.actual.jobs if j.submission_id == sid)


# -- checkpoint steps (issue 30): one small file per running run, never trusted blindly ---------------------


def _tracker(tmp_path: Path, sid: str, text: str | bytes, user: str = "alice") -> Path:
    folder = tmp_path / "users" / user / "jobs/t" / sid / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    tracker = folder / "latest_checkpointed_iteration.txt"
    tracker.write_bytes(text if isinstance(text, bytes) else text.encode())
    return tracker


def test_a_runs_newest_checkpoint_step_is_read_from_its_tracker(tmp_path: Path) -> None:
    paths = _paths(tmp_path)
    assert checkpoint_step(paths, "alice", "t", SID) is None
    _tracker(tmp_path, SID, "12\n")
    assert checkpoint_step(paths, "alice", "t", SID) == 12
    # A resumed verl attempt saves into the first attempt's folder; a later attempt's own comes first.
    assert run_checkpoint_step(paths, "alice", "t", f"{SID}--3") == 12
    _tracker(tmp_path, f"{SID}--3", "20")
    assert run_checkpoint_step(paths, "alice", "t", f"{SID}--3") == 20


@pytest.mark.parametrize("text", ["", "x", "-3", "1e3", "12 13", "9" * 13, b"\xff\xfe", "7" * 40])
def test_a_tracker_that_holds_no_step_counts_as_none(tmp_path: Path, text: str | bytes) -> None:
    _tracker(tmp_path, SID, text)
    assert checkpoint_step(_paths(tmp_path), "alice", "t", SID) is None


def test_a_tracker_that_is_a_fifo_a_link_or_out_of_the_home_is_not_read(tmp_path: Path) -> None:
    paths = _paths(tmp_path)
    bobs = _tracker(tmp_path, SID, "99", user="bob")
    tracker = _tracker(tmp_path, SID, "1")
    tracker.unlink()
    tracker.symlink_to(bobs)  # a link to bob's tracker: not followed
    assert checkpoint_step(paths, "alice", "t", SID) is None
    tracker.unlink()
    os.mkfifo(tracker)  # reading a FIFO would block the daemon: never opened for a read that waits
    assert checkpoint_step(paths, "alice", "t", SID) is None
    tracker.unlink()
    folder = tracker.parent
    shutil.rmtree(folder)
    folder.symlink_to(bobs.parent)  # the checkpoints folder itself leads into bob's home
    assert checkpoint_step(paths, "alice", "t", SID) is None


def test_a_resumed_attempt_reads_the_folder_it_resumes_from(tmp_path: Path) -> None:
    paths = _paths(tmp_path)
    _tracker(tmp_path, SID, "8")
    _tracker(tmp_path, f"{SID}--2", "3")
    verl = task_spec("alice", "t", "sft", model="m", model_path="/m", data_train="/d")
    command = task_spec("alice", "t", "command", command="true")
    # verl resumes in its first attempt's folder; a command task in the newest attempt that saved.
    assert resume_point(paths, verl, f"{SID}--2", SID) == (SID, 8)
    assert resume_point(paths, command, f"{SID}--2", SID) == (f"{SID}--2", 3)
    assert resume_point(paths, command, f"{SID}--3", SID) == (f"{SID}--2", 3)  # --3 saved nothing
    assert resume_point(paths, command, None, None) == (None, None)
    assert resume_point(paths, command, "argus--alice--t--ffffffff", None) == ("argus--alice--t--ffffffff", None)
