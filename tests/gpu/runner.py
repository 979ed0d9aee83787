"""Submit argus's rendered job bodies to a private Ray head and follow them, as the daemon does. I/O, no Ray import.

Jobs go in through argus's own Jobs-API client (:func:`reconciler.apply.jobs.submit_job`), are stopped the way
argus preempts them (:func:`reconciler.apply.jobs.stop_job`: Ray's stop) and are watched through argus's observer
(:func:`reconciler.observe.jobs.observe_jobs`), so what the status would report is checked along the way. Every wait
has a deadline: a job still running at its deadline is stopped and the test fails with the log's end.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reconciler.apply.jobs import stop_job, submit_job
from reconciler.dashboard import Dashboard
from reconciler.observe.jobs import observe_jobs
from reconciler.spec.types import DesiredState
from tests.gpu import scenario

FINAL = {"SUCCEEDED", "FAILED", "STOPPED"}
# Deadlines of one job (Ray worker start-up, model load, the steps, the saves): a job still running then is stopped
# and its test fails. Not measured in this form yet; the H200 run of /work/shared/gpu (driver started by hand) took
# well under the SFT one.
SFT_JOB_S = 300
RL_JOB_S = 420
POLL_S = 0.5


def artifacts_dir() -> Path:
    """Where the suite keeps job logs and the head's logs: ``$ARGUS_TEST_ARTIFACTS/gpu`` (default .artifacts/gpu)."""
    root = os.environ.get("ARGUS_TEST_ARTIFACTS") or str(Path(__file__).resolve().parents[2] / ".artifacts")
    out = Path(root) / "gpu"
    out.mkdir(parents=True, exist_ok=True)
    return out


def say(message: str) -> None:
    """A progress line on stderr (`make gpu-check` runs pytest with -s: a GPU run takes minutes; elsewhere pytest
    shows them with a failing test's output)."""
    print(f"[gpu-suite {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def shims_folder(folder: Path) -> Path:
    """``python3`` (and ``ray`` where no console script sits beside this interpreter or on PATH) as this
    interpreter: a job's entrypoint (``python3 -m verl...``) and the head then run the installed stack, also
    from a site-packages tree on PYTHONPATH (the air-gapped install of docs/admins/gpu-and-cpu-modes.md)."""
    folder.mkdir(parents=True, exist_ok=True)
    scripts = {"python3": f'exec "{sys.executable}" "$@"\n'}
    if not Path(sys.executable).with_name("ray").exists() and shutil.which("ray") is None:
        scripts["ray"] = f'exec "{sys.executable}" -m ray.scripts.scripts "$@"\n'
    for name, body in scripts.items():
        path = folder / name
        path.write_text("#!/bin/sh\n" + body)
        path.chmod(0o755)
    return folder


@dataclass
class JobRun:
    """One job as it ended: Ray's status and message, the whole driver log, what argus observed meanwhile."""

    submission_id: str
    status: str
    message: str
    log: str
    seconds: float
    stopped_by_test: bool = False
    observed_steps: list[int] = field(default_factory=list)  # argus's checkpoint_step readings while it ran
    resumed_from_step: int | None = None  # argus's reading of the run's argus-resumed-from label

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.splitlines()[-lines:])

    def explain(self) -> str:
        ended = f"{self.submission_id}: {self.status} ({self.message}) after {self.seconds:.0f}s"
        return f"{ended}; log's end:\n{self.tail()}"


def _status(dash: Dashboard, sid: str) -> tuple[str, str]:
    info = dash.get(f"/api/jobs/{urllib.parse.quote(sid, safe='')}")
    info = info if isinstance(info, Mapping) else {}
    return str(info.get("status", "PENDING")), str(info.get("message") or "")


def _log(dash: Dashboard, sid: str) -> str:
    try:
        answer = dash.get(f"/api/jobs/{urllib.parse.quote(sid, safe='')}/logs", timeout=120)
    except Exception as exc:  # the log is evidence, not the verdict
        return f"(could not read the job's log: {exc!r})"
    return str(answer.get("logs", "")) if isinstance(answer, Mapping) else str(answer)


def run_job(
    dash: Dashboard,
    state: DesiredState,
    job: Mapping[str, Any],
    *,
    timeout_s: float,
    stop_when: Callable[[int | None], bool] | None = None,
) -> JobRun:
    """Submit ``job`` (a body from :func:`scenario.body`) and wait until it ends.

    ``stop_when(step)`` is asked every poll while the job runs, with the newest checkpoint step argus's observer
    reports for it (None while there is none; where the observer has no such field, verl's tracker file is read
    instead); when it answers True the job is stopped as argus preempts one. A job not ended by ``timeout_s`` is
    stopped and AssertionError raised with its log's end. The driver log is kept under :func:`artifacts_dir`.
    """
    sid = submit_job(dash, dict(job))
    say(f"submitted {sid}")
    started = time.monotonic()
    checkpoints = scenario.run_folder(job) / "checkpoints"
    run = JobRun(sid, "PENDING", "", "", 0.0)
    while True:
        status, message = _status(dash, sid)
        owned = observe_jobs(dash, scenario.OWNERSHIP_KEY, state.cluster.paths)
        seen = next((j for j in owned if j.submission_id == sid), None)
        if seen is not None:
            run.resumed_from_step = getattr(seen, "resumed_from_step", None)
        if status in FINAL:
            break
        step = _checkpoint_step(seen, checkpoints)
        if seen is not None and getattr(seen, "checkpoint_step", None) is not None:
            run.observed_steps.append(seen.checkpoint_step)  # type: ignore[attr-defined]
        if stop_when is not None and not run.stopped_by_test and status == "RUNNING" and stop_when(step):
            say(f"stopping {sid} at checkpoint step {step}, as argus preempts a run")
            stop_job(dash, sid)
            run.stopped_by_test = True
        if time.monotonic() - started > timeout_s:
            stop_job(dash, sid)
            _wait_final(dash, sid, 60)
            log = _log(dash, sid)
            _keep(sid, log)
            raise AssertionError(f"{sid} did not end within {timeout_s:.0f}s (stopped); log's end:\n{log[-6000:]}")
        time.sleep(POLL_S)
    run.status, run.message = status, message
    run.seconds = time.monotonic() - started
    run.log = _log(dash, sid)
    _keep(sid, run.log)
    say(f"{sid} ended {status} after {run.seconds:.0f}s")
    return run


def _checkpoint_step(seen: object, checkpoints: Path) -> int | None:
    if seen is not None and hasattr(seen, "checkpoint_step"):
        value = seen.checkpoint_step
        return value if isinstance(value, int) else None
    return scenario.tracker_step(checkpoints)


def _wait_final(dash: Dashboard, sid: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    status = "PENDING"
    while time.monotonic() < deadline:
        status, _ = _status(dash, sid)
        if status in FINAL:
            break
        time.sleep(POLL_S)
    return status


def _keep(sid: str, log: str) -> None:
    (artifacts_dir() / f"{sid}.log").write_text(log)


@dataclass
class Resumed:
    """A run stopped after a checkpoint and its resumed attempt: both runs, the step it was stopped at and the
    checkpoints folder both attempts saved into (the first attempt's)."""

    first: JobRun
    second: JobRun
    checkpoint: int  # the newest checkpoint when attempt 1 had stopped
    checkpoints: Path
    first_body: dict[str, Any]
    second_body: dict[str, Any]


def preempt_and_resume(dash: Dashboard, state: DesiredState, name: str, *, timeout_s: float) -> Resumed:
    """Run attempt 1 of task ``name``, stop it once a checkpoint exists, then run attempt 2 as the planner resumes
    a preempted run. Each attempt may take ``timeout_s``."""
    first_body = scenario.body(state, name)
    checkpoints = scenario.run_folder(first_body) / "checkpoints"
    first = run_job(dash, state, first_body, timeout_s=timeout_s, stop_when=lambda step: step is not None and step > 0)
    at = scenario.tracker_step(checkpoints)
    assert first.stopped_by_test and first.status == "STOPPED", (
        f"attempt 1 of {name} was to be stopped after its first checkpoint, but it ended {first.status} "
        f"(checkpoint tracker: {at}; argus observed checkpoint steps {first.observed_steps}): {first.explain()}"
    )
    assert at is not None, f"no checkpoint after attempt 1 of {name}:\n{scenario.describe(checkpoints)}"
    second_body = scenario.body(state, name, attempt=2, resume_step=at)
    second = run_job(dash, state, second_body, timeout_s=timeout_s)
    return Resumed(first, second, at, checkpoints, first_body, second_body)
