"""A job rewrites another user's proven run record in Ray's GCS, against the session's real Ray head
(reconciler/observe/sightings.py): any job's driver can overwrite any ``JobInfo`` (status, times,
message), and the ownership proof covers none of them. Bob's 1-GPU run is observed as the daemon's
observer does; first honestly (Ray's times stand, nothing is reported), then after another job,
submitted through the Jobs API with nothing but the cluster's access, writes bob's record as
SUCCEEDED, started in 1970 and ended a second after it began. Bob is billed only for what the
observer saw, the forged success is not believed, and the run says why."""

from __future__ import annotations

import sys
import time

import pytest

from reconciler.apply.jobs import submit_job
from reconciler.builders.jobs import job_submission
from reconciler.dashboard import Dashboard
from reconciler.observe.observer import Observer
from reconciler.observe.usage import jobs_of
from reconciler.plan.actual import ActualJob, ActualState
from reconciler.spec.types import ClusterSpec, Paths, Training
from reconciler.status.usage import Ledger
from reconciler.testing.ray_head import RayHead
from tests.support import task_spec

pytestmark = pytest.mark.e2e

KEY = b"forgery-test-ownership-key-0123456789"
NOT_BELIEVED = "argus does not believe Ray's job record"

# The attacker's driver: a plain Ray job (no argus label), rewriting bob's JobInfo in the GCS KV the
# way Ray's own job manager writes it.
FORGE = """
import json, sys, ray
from ray._private import ray_constants
from ray.dashboard.modules.job.common import JobInfoStorageClient
from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_put
ray.init()
key = JobInfoStorageClient.JOB_DATA_KEY.format(job_id=sys.argv[1]).encode()
info = json.loads(_internal_kv_get(key, namespace=ray_constants.KV_NAMESPACE_JOB))
info.update(status="SUCCEEDED", start_time=1000, end_time=info["start_time"] + 1000, message="all good")
_internal_kv_put(key, json.dumps(info).encode(), overwrite=True, namespace=ray_constants.KV_NAMESPACE_JOB)
print("forged", sys.argv[1])
"""


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def _bob(observer: Observer, docs: dict[str, dict[str, object]], sid: str) -> ActualJob | None:
    return next((j for j in observer.observe(docs).jobs if j.submission_id == sid), None)


def test_a_rewritten_run_record_is_bounded_by_what_the_daemon_saw(
    ray_head: RayHead, tmp_path_factory: pytest.TempPathFactory
) -> None:
    dash = Dashboard(ray_head.dashboard_url)
    cluster = ClusterSpec(
        paths=Paths(common=str(tmp_path_factory.mktemp("hf")), users=str(tmp_path_factory.mktemp("users"))),
        training=Training(rollout="vllm", driver_resources={"worker_node": 1.0}),
    )
    task = task_spec("bob", "forged", command="sleep 60", gpus_per_node=1, run=1)
    submitted = time.time()  # argus records the run, then submits it
    sid = submit_job(dash, job_submission(task, cluster, revision="r", secrets_env={}, ownership_key=KEY))
    record = {"submission_id": sid, "status": "SUBMITTED", "submitted_at": _iso(submitted)}
    docs: dict[str, dict[str, object]] = {task.key.path: {"object": str(task.key), "runs": [record]}}
    observer = Observer(dash, KEY)
    # Honest: while it runs, Ray's record agrees with every sighting.
    deadline = time.monotonic() + 120
    bob = _bob(observer, docs, sid)
    while time.monotonic() < deadline and (bob is None or bob.status != "RUNNING"):
        time.sleep(0.5)
        bob = _bob(observer, docs, sid)
    assert bob is not None and bob.status == "RUNNING" and NOT_BELIEVED not in bob.message, bob
    assert bob.start_time is not None and bob.start_time >= int(submitted) * 1000
    for _ in range(16):  # seen running for 8 s more: longer than CLOCK_SLACK_S past the forged end
        time.sleep(0.5)
        bob = _bob(observer, docs, sid)
        assert bob is not None and bob.status == "RUNNING" and NOT_BELIEVED not in bob.message
    last_running = time.time()
    # The attack: another job rewrites bob's record.
    attacker = submit_job(
        dash,
        {"submission_id": f"raysubmit_forge_{int(time.time())}", "entrypoint": f"{sys.executable} -c '{FORGE}' {sid}"},
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and dash.get(f"/api/jobs/{attacker}").get("status") not in (
        "SUCCEEDED",
        "FAILED",
    ):
        time.sleep(0.5)
    done = dash.get(f"/api/jobs/{attacker}")
    assert done["status"] == "SUCCEEDED", (done.get("message"), dash.get(f"/api/jobs/{attacker}/logs"))
    raw = dash.get(f"/api/jobs/{sid}")
    assert raw["status"] == "SUCCEEDED" and raw["start_time"] == 1000  # Ray believes the forger
    forged = _bob(observer, docs, sid)
    seen_at = time.time()
    assert forged is not None
    assert forged.status == "FAILED" and forged.hf_checkpoint is None, forged
    assert NOT_BELIEVED in forged.message and "'all good'" in forged.message
    assert forged.start_time is not None and forged.end_time is not None
    assert forged.start_time >= int(submitted) * 1000 and forged.end_time >= int(last_running - 1) * 1000
    ledger = Ledger()
    ledger.record_tasks(jobs_of(ActualState(jobs=[forged])), {}, now=time.time())
    billed = sum(ledger.totals().gpu_seconds.values())
    assert 3.0 <= billed <= seen_at - submitted + 1.0, billed  # within the run's life as the daemon saw it
    assert len(ledger.take_documents()) <= 2  # today's (and yesterday's, at midnight), not one a day since 1970
    dash.post(f"/api/jobs/{sid}/stop", {})
