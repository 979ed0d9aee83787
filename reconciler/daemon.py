"""One tick = load -> observe -> plan -> apply -> assess; and the loop that runs ticks.

The tick is a straight line (Flux's kustomize-controller): fetch the source, build the
desired state, observe Ray, plan (pure), apply (stops, one Serve PUT, submissions), assess
health and sync. Nothing is stored outside git and Ray: a restarted daemon rebuilds
everything from the repository, Ray's labels and app names.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from reconciler import faults
from reconciler.apply.jobs import stop_job, submit_job
from reconciler.apply.serve import apply_serve
from reconciler.builders.jobs import job_submission
from reconciler.builders.serve import app_name, model_app_config
from reconciler.dashboard import Dashboard
from reconciler.errors import ApplyFailed, ArgusError, PermanentError, RayUnavailable, SourceUnavailable
from reconciler.observe.capacity import observe_capacity
from reconciler.observe.jobs import observe_jobs
from reconciler.observe.serve import ServeObservation, observe_serve
from reconciler.plan.actions import ActionType, Plan
from reconciler.plan.actual import ActualState
from reconciler.plan.assess import ObjectStatus, assess
from reconciler.plan.planner import plan as make_plan
from reconciler.server import Metrics
from reconciler.source.localfs import LocalFS
from reconciler.source.remote import RepoSource
from reconciler.source.signatures import SignatureVerifier
from reconciler.spec.hashing import task_spec_hash
from reconciler.spec.loader import ParseCache, TaskCheck, load
from reconciler.spec.paths import FileSystem
from reconciler.spec.types import DesiredState, ObjectKey, TaskSpec
from reconciler.status.writer import StatusReport, StatusWriter

log = logging.getLogger("argus")

# Secrets reach jobs from the daemon's environment, never from git.
SECRET_ENV_NAMES = ("WANDB_API_KEY", "HF_TOKEN")


def default_task_check() -> TaskCheck | None:
    try:
        from reconciler.checks.verl_overrides import check_overrides, verl_available
    except ImportError:
        return None
    return check_overrides if verl_available() else None


@dataclass
class TickResult:
    """Everything one tick learned and did (the status writers and the CLI read it)."""

    revision: str
    desired: DesiredState
    actual: ActualState
    serve: ServeObservation
    plan: Plan
    statuses: dict[ObjectKey, ObjectStatus]
    applied: set[ObjectKey] = field(default_factory=set)
    failures: dict[ObjectKey, str] = field(default_factory=dict)
    serve_put: bool = False
    notes: list[str] = field(default_factory=list)
    subject: str = ""
    commit_time: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "revision": self.revision,
            "plan": self.plan.to_json(),
            "errors": [i.to_json() for i in self.desired.issues],
            "failures": {str(k): v for k, v in self.failures.items()},
            "notes": self.notes,
            "objects": [s.to_json() for s in self.statuses.values()],
        }


class Reconciler:
    """Reconciles one branch of one config repository with one Ray cluster."""

    def __init__(
        self,
        source: RepoSource,
        branch: str,
        dash: Dashboard,
        *,
        fs: FileSystem | None = None,
        secrets_env: Mapping[str, str] | None = None,
        task_check: TaskCheck | None = None,
    ) -> None:
        self.source = source
        self.branch = branch
        self.dash = dash
        self.fs = fs if fs is not None else LocalFS()
        self.secrets_env = (
            dict(secrets_env)
            if secrets_env is not None
            else {k: os.environ[k] for k in SECRET_ENV_NAMES if k in os.environ}
        )
        self.task_check = task_check if task_check is not None else default_task_check()
        self.cache = ParseCache()
        self.verifier = SignatureVerifier(source.repo)
        self.rejections: list[str] = []
        self._put_memo: dict[str, Any] = {}
        self._subject = ""
        self._refused: dict[tuple[ObjectKey, str | None], str] = {}

    # -- load ---------------------------------------------------------------------------
    def load(self, commit: str | None = None, *, fetch: bool = True) -> tuple[DesiredState, str, int]:
        """Fetch (unless ``fetch`` is False) and read the branch head (or ``commit``).

        Raises SourceUnavailable."""
        if fetch:
            self.source.fetch()
        commit = commit or self.source.repo.resolve(f"refs/heads/{self.branch}")
        trusted = self.verifier.trusted(commit)
        signed = trusted.settings.enabled or bool(trusted.rejections)
        snap = self.source.repo.snapshot(commit, self.cache, trusted.entries if signed else None)
        self.rejections = [str(r) for r in trusted.rejections]
        desired = load(
            snap.files,
            created=snap.created,
            default_time=snap.commit_time,
            fs=self.fs,
            cache=self.cache,
            task_check=self.task_check,
            revision=commit,
            approve_prune=snap.approve_prune,
        )
        self._subject = snap.subject
        return desired, commit, snap.commit_time

    # -- observe ------------------------------------------------------------------------
    def observe(self) -> tuple[ActualState, ServeObservation]:
        """Observe Serve, Jobs and capacity. Raises RayUnavailable (apply nothing then)."""
        serve = observe_serve(self.dash)
        jobs = observe_jobs(self.dash)
        capacity = observe_capacity(self.dash)
        return ActualState(models=dict(serve.models), jobs=jobs, capacity=capacity), serve

    # -- tick ---------------------------------------------------------------------------
    def tick(self, desired: DesiredState | None = None, revision: str | None = None) -> TickResult:
        """Run one reconcile. Raises SourceUnavailable / RayUnavailable before applying anything."""
        commit_time = 0
        if desired is None:
            desired, revision, commit_time = self.load()
        actual, serve = self.observe()
        plan = make_plan(desired, actual)
        result = TickResult(
            revision=revision or "",
            desired=desired,
            actual=actual,
            serve=serve,
            plan=plan,
            statuses={},
            subject=self._subject,
            commit_time=commit_time,
        )
        result.notes.extend(f"unverified change kept out: {r}" for r in self.rejections)
        result.notes.extend(serve.settings_mismatch(desired.cluster))
        result.notes.extend(plan.notes)
        self._apply(result)
        result.statuses = assess(desired, actual, plan, result.applied)
        for key, why in result.failures.items():
            status = result.statuses.get(key)
            if status is not None:
                status.reason = f"{status.reason}; apply failed: {why}" if status.reason else f"apply failed: {why}"
        return result

    def _apply(self, result: TickResult) -> None:
        plan, desired = result.plan, result.desired
        for action in plan.of(ActionType.STOP_TASK):
            sid = action.submission_id or ""
            self._record(result, [action.key], self._try(partial(stop_job, self.dash, sid)))
        self._apply_serve(result)
        for action in plan.of(ActionType.SUBMIT_TASK):
            task = desired.tasks[action.key]
            refused = self._refused.get((action.key, action.spec_hash))
            if refused is not None:  # permanent: not retried until the spec changes (kopf's rule)
                result.failures[action.key] = refused
                continue
            self._record(result, [action.key], self._try(partial(self._submit, task, desired, result.revision)))
            faults.point("after_submit")

    def _submit(self, task: TaskSpec, desired: DesiredState, revision: str) -> None:
        """Build and submit one run. Raises PermanentError (cannot be built) or ApplyFailed."""
        try:
            body = job_submission(task, desired.cluster, revision=revision, secrets_env=self.secrets_env)
            submit_job(self.dash, body)
        except (PermanentError, ApplyFailed) as exc:
            if isinstance(exc, PermanentError) or exc.permanent:
                self._refused[(task.key, task_spec_hash(task))] = f"{exc} (not retried until the file changes)"
            raise

    def _apply_serve(self, result: TickResult) -> None:
        """Send the whole owned app set in one PUT, only when it differs from what runs."""
        plan, desired, serve = result.plan, result.desired, result.serve
        changing = (ActionType.UPDATE_MODEL, ActionType.SCALE_MODEL, ActionType.DEPLOY_MODEL)
        apps: list[dict[str, Any]] = []
        touched: list[ObjectKey] = []
        for key in sorted(set(result.actual.models) | {a.key for a in plan.of(*changing)}):
            by_type = {a.type: a for a in plan.for_key(key)}
            if ActionType.DELETE_MODEL in by_type:
                touched.append(key)
                continue
            change = next((by_type[t] for t in changing if t in by_type), None)
            deployed = serve.apps.get(app_name(key.user, key.name))
            if change is not None and change.source_path:
                spec = desired.models[key]
                apps.append(model_app_config(spec, desired.cluster, change.source_path, change.spec_hash or ""))
                touched.append(key)
            elif deployed is not None:
                apps.append(deployed)  # carried through exactly as it runs
        error = self._try(
            lambda: setattr(
                result, "serve_put", apply_serve(self.dash, apps, serve, desired.cluster, memo=self._put_memo)
            )
        )
        if result.serve_put:
            faults.point("serve_put")
        self._record(result, touched, error)

    @staticmethod
    def _record(result: TickResult, keys: list[ObjectKey], error: str | None) -> None:
        for key in keys:
            if error is None:
                result.applied.add(key)
            else:
                result.failures[key] = error

    @staticmethod
    def _try(fn: Callable[[], object]) -> str | None:
        """Run one apply step; return None on success or the error text. Ray being
        unreachable is not an apply failure: it propagates and the tick stops."""
        try:
            fn()
        except RayUnavailable:
            raise
        except ArgusError as exc:
            log.warning("apply failed: %s", exc)
            return str(exc)
        return None


# -- the loop ------------------------------------------------------------------------------


class Daemon:
    """Runs ticks when triggered (a push seen by watchfiles or a webhook, the fetch interval
    for remotes) and every ``observe_interval`` seconds to keep status fresh and fix drift.
    Writes status once per tick, and only when something changed."""

    def __init__(
        self,
        reconciler: Reconciler,
        writer: StatusWriter,
        *,
        observe_interval: float = 5.0,
        fetch_interval: float = 15.0,
        metrics: Metrics | None = None,
    ) -> None:
        self.reconciler = reconciler
        self.writer = writer
        self.observe_interval = observe_interval
        self.fetch_interval = fetch_interval
        self.metrics = metrics or Metrics()
        self.wake = threading.Event()
        self.stop = threading.Event()
        self.last_tick_ok = 0.0
        self.last_error: str | None = None
        self._log_tails: dict[str, list[str]] = {}
        self._last_fetch = 0.0
        self._logged: dict[str, str] = {}

    def on_push(self, ref: str | None) -> bool:
        """Webhook/watch trigger. Returns whether ``ref`` is the tracked branch (None = unknown)."""
        if ref is not None and ref != f"refs/heads/{self.reconciler.branch}":
            return False
        self._last_fetch = 0.0
        self.wake.set()
        return True

    def health(self) -> dict[str, Any]:
        age = time.monotonic() - self.last_tick_ok if self.last_tick_ok else None
        ok = age is not None and age < max(60.0, 6 * self.observe_interval)
        return {"ok": ok, "last_tick_age_s": age, "last_error": self.last_error}

    def watch_local(self) -> threading.Thread | None:
        """Watch a local repository's branch refs with watchfiles, so a push ticks at once."""
        if not self.reconciler.source.local:
            return None
        import subprocess

        import watchfiles

        git_dir = subprocess.run(
            ["git", "-C", self.reconciler.source.repo.path, "rev-parse", "--absolute-git-dir"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        status_ref = f"refs/heads/{self.writer.branch}"

        def relevant(change: watchfiles.Change, path: str) -> bool:
            rel = os.path.relpath(path, git_dir)
            return (rel.startswith("refs/heads") and not rel.startswith(status_ref)) or rel.startswith("packed-refs")

        def loop() -> None:
            for _changes in watchfiles.watch(
                git_dir, watch_filter=relevant, debounce=50, step=20, stop_event=self.stop, raise_interrupt=False
            ):
                self.on_push(None)

        thread = threading.Thread(target=loop, name="argus-watch", daemon=True)
        thread.start()
        return thread

    def run(self) -> None:
        """Tick until ``stop`` is set. Never raises for source or Ray outages: backs off."""
        backoff = 0.0
        self.wake.set()
        while not self.stop.is_set():
            self.wake.wait(timeout=backoff or self.observe_interval)
            self.wake.clear()
            if self.stop.is_set():
                break
            backoff = self.run_once()

    def run_once(self) -> float:
        """One tick plus its status write. Returns the back-off delay (0 when healthy)."""
        started = time.monotonic()
        fetch = not self.reconciler.source.local and started - self._last_fetch >= self.fetch_interval
        try:
            if fetch or self.reconciler.source.local:
                self._last_fetch = started
                self.reconciler.source.fetch()
            desired, revision, commit_time = self.reconciler.load(fetch=False)
            result = self.reconciler.tick(desired, revision)
            result.commit_time = commit_time
        except SourceUnavailable as exc:
            self._fail("source", str(exc))
            self._write_source_error(str(exc))
            return min(60.0, max(self.observe_interval, 5.0))
        except RayUnavailable as exc:
            self._fail("ray", str(exc))
            return min(60.0, max(1.0, 2 * (self._backoff or 0.5)))
        self._backoff = 0.0
        self.last_error = None
        if not self.last_tick_ok:
            # The desired tree and caches live as long as the daemon: keep the cyclic GC from
            # re-scanning them on every tick (10,000 objects made full collections dominate).
            gc.collect()
            gc.freeze()
        self._report(result)
        self.metrics.tick(time.monotonic() - started)
        self.last_tick_ok = time.monotonic()
        return 0.0

    _backoff = 0.0

    def _fail(self, kind: str, message: str) -> None:
        self.metrics.error(kind)
        self._backoff = min(60.0, max(1.0, 2 * (self._backoff or 0.5)))
        if self.last_error != message:
            log.warning(json.dumps({"event": f"{kind}_unavailable", "error": message}))
        self.last_error = message

    def _write_source_error(self, message: str) -> None:
        try:
            self.writer.write(StatusReport(None, {}, set(), set(), None, [], source_error=message))
        except Exception as exc:  # the status branch may be as unavailable as the source
            log.debug("status write failed: %s", exc)

    def _report(self, result: TickResult) -> None:
        from reconciler.observe.jobs import job_log_tail
        from reconciler.plan.actual import FINAL_JOB_STATES

        for job in result.actual.jobs:
            if job.status in FINAL_JOB_STATES and job.submission_id not in self._log_tails:
                with contextlib.suppress(ArgusError):
                    self._log_tails[job.submission_id] = job_log_tail(self.reconciler.dash, job.submission_id)
        for action in result.plan.actions:
            if action.type is not ActionType.KEEP:
                line = json.dumps(
                    {
                        "event": action.type.value,
                        "object": str(action.key),
                        "reason": action.reason,
                        "applied": action.key in result.applied,
                        "revision": result.revision[:12],
                    }
                )
                if self._logged.get(str(action.key)) != line:
                    log.info(line)
                    self._logged[str(action.key)] = line
        report = StatusReport(
            revision=result.revision,
            statuses=result.statuses,
            applied_keys=result.applied,
            failed_keys=set(result.failures),
            plan=result.plan,
            errors=[str(i) for i in result.desired.issues],
            notes=list(result.notes),
            log_tails=self._log_tails,
            checkpoints={j.submission_id: j.hf_checkpoint for j in result.actual.jobs},
            actual=result.actual.to_json(),
        )
        commit = self.writer.write(report)
        if commit:
            log.info(json.dumps({"event": "status_commit", "commit": commit[:12], "revision": result.revision[:12]}))
        counts: dict[tuple[str, str], int] = {}
        for st in result.statuses.values():
            counts[(st.key.kind, st.state)] = counts.get((st.key.kind, st.state), 0) + 1
        self.metrics.set_objects(counts)
        if not result.failures and result.commit_time:
            self.metrics.last_applied_commit_time = float(result.commit_time)
