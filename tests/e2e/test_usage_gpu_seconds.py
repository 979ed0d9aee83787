"""GPU-seconds of a task from Ray's own job record (reconciler/observe/usage.py, status/usage.py),
against the session's real Ray head (2 logical GPUs): a 1-GPU task that sleeps ~3 s is counted
as its record's run time x 1 GPU, and recounting the same record adds nothing."""

from __future__ import annotations

import time

import pytest

from reconciler.apply.jobs import submit_job
from reconciler.builders.jobs import job_submission
from reconciler.dashboard import Dashboard
from reconciler.observe.jobs import observe_jobs
from reconciler.observe.usage import jobs_of
from reconciler.plan.actual import ActualJob, ActualState
from reconciler.spec.types import ClusterSpec, Paths, Training
from reconciler.status.usage import Ledger
from reconciler.testing.ray_head import RayHead
from tests.support import task_spec

pytestmark = pytest.mark.e2e

KEY = b"usage-test-ownership-key-0123456789"


def test_a_task_counts_its_run_time_times_its_gpus(ray_head: RayHead, tmp_path_factory: pytest.TempPathFactory) -> None:
    dash = Dashboard(ray_head.dashboard_url)
    cluster = ClusterSpec(
        paths=Paths(common=str(tmp_path_factory.mktemp("hf")), users=str(tmp_path_factory.mktemp("users"))),
        training=Training(rollout="vllm", driver_resources={"worker_node": 1.0}),
    )
    task = task_spec("carol", "usage-gpu", command="sleep 3", gpus_per_node=1, run=1)
    sid = submit_job(dash, job_submission(task, cluster, revision="r", secrets_env={}, ownership_key=KEY))
    deadline = time.monotonic() + 180
    done: ActualJob | None = None
    while time.monotonic() < deadline:
        done = next((j for j in observe_jobs(dash, KEY) if j.submission_id == sid), None)
        if done is not None and done.status in ("SUCCEEDED", "FAILED", "STOPPED"):
            break
        time.sleep(0.5)
    assert done is not None and done.status == "SUCCEEDED", done
    assert done.start_time and done.end_time
    run_time = (done.end_time - done.start_time) / 1000.0
    assert run_time >= 3.0
    ledger = Ledger()
    jobs = jobs_of(ActualState(jobs=[done]))
    ledger.record_tasks(jobs, {"carol": "vision"}, now=time.time())
    expected = {("carol", "vision", "task"): pytest.approx(run_time * 1.0, abs=0.01)}
    assert ledger.totals().gpu_seconds == expected
    ledger.take_documents()
    ledger.record_tasks(jobs, {"carol": "vision"}, now=time.time() + 3600)  # a finished run: its record is final
    assert ledger.totals().gpu_seconds == expected and ledger.take_documents() == {}
