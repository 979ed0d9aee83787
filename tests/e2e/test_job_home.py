"""An upload alone runs no code in its user's jobs (issue 31 item 6), on a real Ray head.

Every job's ``HOME`` is its user's folder, where the file service writes her uploads. Here that folder
holds an uploaded Python user site (``.local/lib/pythonX.Y/site-packages``) with a ``.pth`` file and a
``usercustomize.py``, each of which would leave a marker file when Python starts. Jobs built by argus
(a verl-shaped driver, ``python3 -m verl.trainer.sft_trainer_ray ...`` as argus submits it, and a
``command`` task running ``python3``) run and leave no marker; with the task's ``user_site: true`` they
do. ``python3`` in the jobs is this interpreter's base Python (the venv's own ignores user sites, as the
Ray node images' Python does not), which the first test shows would run the upload.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from reconciler.apply.jobs import stop_job, submit_job
from reconciler.builders.jobs import job_submission
from reconciler.dashboard import Dashboard
from reconciler.observe.jobs import job_log_tail, observe_jobs
from reconciler.plan.actual import ActualJob
from reconciler.spec.types import ClusterSpec, Paths, TaskSpec, Training
from reconciler.testing.ray_head import RayHead
from tests.support import task_spec

pytestmark = pytest.mark.e2e

KEY = b"test-ownership-key-job-home-0123456789"
BASE_PYTHON = getattr(sys, "_base_executable", sys.executable)  # outside the venv: user sites are on
SITE = f".local/lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
FINAL = {"SUCCEEDED", "FAILED", "STOPPED"}


@dataclass
class Setup:
    dash: Dashboard
    cluster: ClusterSpec
    home: Path
    markers: Path


def _marker(markers: Path, kind: str) -> str:
    """Python that leaves ``<markers>/<job>.<kind>`` (the job is named by ARGUS_TEST_JOB)."""
    where = repr(str(markers))
    return (
        f"import os; os.makedirs({where}, exist_ok=True); "
        f"open(os.path.join({where}, os.environ.get('ARGUS_TEST_JOB', 'none') + '.{kind}'), 'a').close()"
    )


@pytest.fixture(scope="module")
def setup(ray_head: RayHead, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    root = tmp_path_factory.mktemp("jobhome")
    markers = root / "markers"
    home = root / "users" / "alice"
    site = home / SITE
    site.mkdir(parents=True)
    (site / "evil.pth").write_text(_marker(markers, "pth") + "\n")  # an `import` line: run at start-up
    (site / "usercustomize.py").write_text(_marker(markers, "usercustomize") + "\n")
    # A stand-in for verl's SFT entry point, where argus's entrypoint looks for it (python3 -m ...).
    standin = root / "standin" / "verl" / "trainer"
    standin.mkdir(parents=True)
    for folder in (standin, standin.parent):
        (folder / "__init__.py").write_text("")
    driver = "import sys\nprint('verl stand-in ran:', len(sys.argv) - 1, 'overrides')\n"
    (standin / "sft_trainer_ray.py").write_text(driver)
    shims = root / "bin"
    shims.mkdir()
    (shims / "python3").write_text(f'#!/bin/sh\nexec {shlex.quote(BASE_PYTHON)} "$@"\n')
    (shims / "python3").chmod(0o755)
    cluster = ClusterSpec(
        paths=Paths(common=str(root / "hf"), users=str(root / "users")),
        training=Training(rollout="vllm", driver_resources={"worker_node": 1.0}),
        env={"PATH": f"{shims}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONPATH": str(root / "standin")},
    )
    dash = Dashboard(ray_head.dashboard_url)
    try:
        yield Setup(dash, cluster, home, markers)
    finally:
        for job in observe_jobs(dash, KEY):
            if job.status not in FINAL:
                stop_job(dash, job.submission_id)


def _tasks(user_site: bool) -> list[TaskSpec]:
    suffix = "usersite" if user_site else "plain"
    verl = task_spec(
        "alice",
        f"verl-{suffix}",
        "sft",
        model="/models/m",
        model_path="/models/m",
        data_train="/data/train.parquet",
        gpus_per_node=0,
        env={"ARGUS_TEST_JOB": f"verl-{suffix}"},
        user_site=user_site,
    )
    command = task_spec(
        "alice",
        f"cmd-{suffix}",
        command="python3 -c \"print('command ran')\"",
        gpus_per_node=0,
        env={"ARGUS_TEST_JOB": f"cmd-{suffix}"},
        user_site=user_site,
    )
    return [verl, command]


def _run(setup: Setup, tasks: list[TaskSpec]) -> dict[str, ActualJob]:
    """Submit ``tasks`` as argus builds them; wait until each ends; return them by task name."""
    sids = {
        t.key.name: submit_job(
            setup.dash, job_submission(t, setup.cluster, revision=None, secrets_env={}, ownership_key=KEY)
        )
        for t in tasks
    }
    deadline = time.monotonic() + 180
    while True:
        jobs = {j.submission_id: j for j in observe_jobs(setup.dash, KEY)}
        done = {name: jobs[sid] for name, sid in sids.items() if sid in jobs and jobs[sid].status in FINAL}
        if len(done) == len(sids):
            for name, job in done.items():
                assert job.status == "SUCCEEDED", (name, job.message, job_log_tail(setup.dash, job.submission_id))
            return done
        assert time.monotonic() < deadline, f"jobs did not end: {jobs}"
        time.sleep(0.5)


def test_the_upload_would_run_without_argus(setup: Setup) -> None:
    """The premise: this Python, with HOME at alice's folder, runs both files at start-up."""
    env = {**os.environ, "HOME": str(setup.home), "ARGUS_TEST_JOB": "bare"}
    env.pop("PYTHONNOUSERSITE", None)
    subprocess.run([BASE_PYTHON, "-c", "pass"], env=env, check=True, timeout=60)
    assert (setup.markers / "bare.pth").exists() and (setup.markers / "bare.usercustomize").exists()


def test_jobs_do_not_run_code_from_an_upload(setup: Setup) -> None:
    done = _run(setup, _tasks(user_site=False))
    assert any("verl stand-in ran" in line for line in job_log_tail(setup.dash, done["verl-plain"].submission_id))
    assert any("command ran" in line for line in job_log_tail(setup.dash, done["cmd-plain"].submission_id))
    left = sorted(p.name for p in setup.markers.glob("*-plain.*")) if setup.markers.exists() else []
    assert left == [], f"code from alice's uploads ran in her jobs: {left}"


def test_user_site_true_loads_it(setup: Setup) -> None:
    _run(setup, _tasks(user_site=True))
    for job in ("verl-usersite", "cmd-usersite"):
        assert (setup.markers / f"{job}.pth").exists() and (setup.markers / f"{job}.usercustomize").exists(), job
