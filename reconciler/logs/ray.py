"""Read a task run's output and a model's Serve messages from Ray, for one object only. I/O.

Users never talk to the dashboard: the daemon reads for them, and only what belongs to the
object they name. A run resolves when the status branch lists it among the object's runs
*and* Ray's job metadata names argus, the user and the task; a model resolves to the Serve
application argus derives from its key, whose argus metadata names the same user and model.
Everything returned passes through the redactor (secret values, URL credentials).
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from reconciler.builders.jobs import LABEL_TASK, LABEL_USER, MANAGED_BY, MANAGER, proof_valid
from reconciler.builders.serve import app_name
from reconciler.dashboard import Dashboard, DashboardError
from reconciler.errors import ArgusError
from reconciler.plan.actual import FINAL_JOB_STATES

Redact = Callable[[str], str]
# The daemon's secrets as jobs receive them (reconciler.tick.SECRET_ENV_NAMES).
SECRET_NAMES = frozenset({"WANDB_API_KEY", "HF_TOKEN"})
REPLICA_LOG_LINES = 30
MAX_REPLICAS_SHOWN = 8
# Job fields that say what argus derived and submitted (the rest is Ray's bookkeeping).
_JOB_SPEC_FIELDS = (
    "entrypoint",
    "entrypoint_num_cpus",
    "entrypoint_num_gpus",
    "entrypoint_memory",
    "entrypoint_resources",
    "runtime_env",
    "metadata",
)


class LogNotFound(LookupError):
    """The object has no such run or application, or Ray does not say it is the object's."""


def redactor(secret_values: list[str]) -> Redact:
    """The shared redactor (``reconciler.redact``) over ``secret_values``."""
    from reconciler.redact import Redactor

    redact: Redact = Redactor(secret_values)
    return redact


_KEY_BEGIN = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----", re.IGNORECASE)
_KEY_END = re.compile(r"-----END [A-Z0-9 ]*PRIVATE KEY-----", re.IGNORECASE)
# An open key block is held back at most this long; past it, the redactor still hides what
# follows its BEGIN line in the chunk and the body lines before its END line in the next.
MAX_HELD_CHARS = 64 * 1024


def _sendable(pending: str) -> tuple[str, str]:
    """Split followed output into (whole lines to redact and send now, text to hold back).

    A private key block that has begun but not ended is held back from its BEGIN line, so that
    it is redacted whole (the redactor hides a block by its BEGIN...END span, not line by line).
    """
    head, newline, rest = pending.rpartition("\n")
    if not newline:
        return "", pending
    head += "\n"
    begins = list(_KEY_BEGIN.finditer(head))
    if begins and not _KEY_END.search(head, begins[-1].end()) and len(pending) <= MAX_HELD_CHARS:
        cut = head.rfind("\n", 0, begins[-1].start()) + 1
        return head[:cut], head[cut:] + rest
    return head, rest


class RayLogs:
    """``RayLogs(dash, redact)``: the :class:`reconciler.web.handler.Logs` the daemon serves.

    ``ownership_key``: the daemon's key; a run is served only when its ``argus-proof`` label
    verifies under it (labels alone prove nothing: code on the cluster can submit jobs that claim
    to be anyone's). ``poll_s``: how often a followed run is re-read; ``max_follow_s``: a follower
    is cut off after this long (the client reconnects if it still cares). ``max_followers``: how
    many runs may be followed at once; each holds a page thread of the web server, so this stays
    below its page threads (8) and followers can never starve the pages.
    """

    def __init__(
        self,
        dash: Dashboard,
        redact: Redact,
        *,
        ownership_key: bytes | None = None,
        poll_s: float = 1.0,
        max_follow_s: float = 15 * 60.0,
        max_followers: int = 4,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.dash = dash
        self.redact = redact
        self.ownership_key = ownership_key
        self.poll_s = poll_s
        self.max_follow_s = max_follow_s
        self.max_followers = max_followers
        self._followers = threading.BoundedSemaphore(max_followers)
        self.sleep = sleep

    # -- tasks ------------------------------------------------------------------------------
    def resolve_run(self, user: str, name: str, doc: Mapping[str, Any], run: str | None) -> str:
        """The submission id to read: ``run`` or the document's current run.

        Raises LogNotFound when the status branch does not list it for this task, or when Ray
        does not know it as argus's job of this user and task.
        """
        runs = [str(r.get("submission_id")) for r in doc.get("runs") or [] if isinstance(r, Mapping)]
        current = doc.get("submission_id")
        known = set(runs) | ({str(current)} if current else set())
        sid = run or (str(current) if current else (runs[-1] if runs else None))
        if sid is None:
            raise LogNotFound(f"{user}/tasks/{name} has no run yet")
        if sid not in known:
            raise LogNotFound(f"{sid!r} is not a run of {user}/tasks/{name}")
        info = self._job(sid)
        meta = info.get("metadata") or {}
        labelled = (meta.get(MANAGED_BY), meta.get(LABEL_USER), meta.get(LABEL_TASK)) == (MANAGER, user, name)
        proven = self.ownership_key is None or proof_valid(self.ownership_key, sid, info)
        if not (labelled and proven):
            raise LogNotFound(f"Ray does not hold {sid!r} as a run of {user}/tasks/{name}")
        return sid

    def _job(self, sid: str) -> Mapping[str, Any]:
        try:
            info = self.dash.get(f"/api/jobs/{urllib.parse.quote(sid, safe='')}")
        except DashboardError as exc:
            if exc.status == 404:
                raise LogNotFound(f"Ray no longer holds {sid!r} (its head may have restarted)") from exc
            raise
        if not isinstance(info, Mapping):
            raise LogNotFound(f"Ray answered nothing for {sid!r}")
        return info

    def _text(self, sid: str) -> str:
        data = self.dash.get(f"/api/jobs/{urllib.parse.quote(sid, safe='')}/logs")
        return str(data.get("logs", "")) if isinstance(data, Mapping) else str(data or "")

    def task_log(self, user: str, name: str, doc: Mapping[str, Any], run: str | None) -> str:
        """The whole output of one run so far, redacted. Raises LogNotFound, RayUnavailable."""
        sid = self.resolve_run(user, name, doc, run)
        return self.redact(self._text(sid))

    def follow_task_log(self, user: str, name: str, doc: Mapping[str, Any], run: str | None) -> Iterator[str]:
        """Check the run now (raises LogNotFound), then return an iterator of redacted output
        that follows the run until Ray reports it final. It yields ``""`` at every poll, a
        heartbeat on which the server checks that the client is still there.

        Raises ArgusError when ``max_followers`` runs are followed already (the server answers 503).
        """
        sid = self.resolve_run(user, name, doc, run)
        if not self._followers.acquire(blocking=False):
            raise ArgusError(f"too many live logs are followed now (at most {self.max_followers}); retry shortly")
        stream = self._held(sid)
        next(stream)  # started: from here on, closing or dropping the stream frees the slot
        return stream

    def _held(self, sid: str) -> Iterator[str]:
        try:
            yield ""
            yield from self._follow(sid)
        finally:
            self._followers.release()

    def _follow(self, sid: str) -> Iterator[str]:
        # Only whole lines are redacted and sent while the run goes on, so that a secret split
        # across two reads is still recognised; the rest is sent when the run ends.
        sent = 0
        pending = ""
        deadline = time.monotonic() + self.max_follow_s
        while True:
            try:
                status = str(self._job(sid).get("status", ""))
                text = self._text(sid)  # read after the status: a final status means complete output
            except (ArgusError, LookupError) as exc:
                yield self.redact(pending) + f"\n[argus: stopped following {sid}: {exc}]\n"
                return
            if len(text) < sent:  # the log was rotated or rewritten: start over
                sent = 0
            pending += text[sent:]
            sent = len(text)
            done = status in FINAL_JOB_STATES
            if done:
                if pending:
                    yield self.redact(pending)
                yield f"[argus: run {sid} {status}]\n"
                return
            head, pending = _sendable(pending)
            if head:
                yield self.redact(head)
            if time.monotonic() > deadline:
                yield self.redact(pending) + f"\n[argus: follow time limit reached; {sid} still {status}]\n"
                return
            yield ""  # a heartbeat: the server notices a client that left even while the run is quiet
            self.sleep(self.poll_s)

    def deployed_task_spec(self, user: str, name: str, doc: Mapping[str, Any], run: str | None) -> Any:
        """What argus submitted for a run: entrypoint (verl argv or the command), resources,
        runtime environment, labels. Values redacted. Raises LogNotFound, RayUnavailable."""
        sid = self.resolve_run(user, name, doc, run)
        info = self._job(sid)
        spec = {k: info[k] for k in _JOB_SPEC_FIELDS if info.get(k) not in (None, {}, "")}
        spec = {"submission_id": sid, **spec}
        return self._redacted(spec)

    def deployed_model_spec(self, user: str, name: str, doc: Mapping[str, Any]) -> Any:
        """The Serve application argus deployed for a model (source path, engine arguments, tensor
        parallel size, replicas, resources), values redacted. Raises LogNotFound, RayUnavailable."""
        app, info = self._app(user, name, doc)
        config = info.get("deployed_app_config") or {}
        return self._redacted({"application": app, **{k: v for k, v in config.items() if k != "name"}})

    def _redacted(self, data: Any) -> Any:
        """``data`` with every string redacted (and secret variables' values hidden by name)."""
        if isinstance(data, Mapping):
            return {
                str(k): "***" if str(k) in SECRET_NAMES and isinstance(v, str) else self._redacted(v)
                for k, v in data.items()
            }
        if isinstance(data, list):
            return [self._redacted(v) for v in data]
        return self.redact(data) if isinstance(data, str) else data

    def _app(self, user: str, name: str, doc: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]]:
        app = app_name(user, name)
        details = self.dash.get("/api/serve/applications/") or {}
        apps = details.get("applications") if isinstance(details, Mapping) else None
        info = (apps or {}).get(app)
        if not isinstance(info, Mapping):
            raise LogNotFound(f"Serve runs no application for {user}/models/{name} (state {doc.get('state')})")
        meta = ((info.get("deployed_app_config") or {}).get("args") or {}).get("argus") or {}
        if meta and (meta.get("user"), meta.get("name")) != (user, name):
            raise LogNotFound(f"Serve application {app!r} is not {user}/models/{name}")
        return app, info

    # -- models -----------------------------------------------------------------------------
    def model_log(self, user: str, name: str, doc: Mapping[str, Any]) -> str:
        """The model's Serve application, deployment and replica status messages and the last
        lines of each replica's log, redacted. Raises LogNotFound, RayUnavailable."""
        app, info = self._app(user, name, doc)
        lines = [f"application {app}: {info.get('status')}"]
        lines += _indented(info.get("message"))
        replicas: list[Mapping[str, Any]] = []
        for dep_name, dep in sorted((info.get("deployments") or {}).items()):
            lines.append(f"deployment {dep_name}: {dep.get('status')}")
            lines += _indented(dep.get("message"))
            for rep in dep.get("replicas") or []:
                lines.append(
                    f"  replica {rep.get('replica_id')}: {rep.get('state')}"
                    f" (node {rep.get('node_ip') or rep.get('node_id') or '?'}, pid {rep.get('pid') or '?'})"
                )
                replicas.append(rep)
        for rep in replicas[:MAX_REPLICAS_SHOWN]:
            tail = self._replica_tail(rep)
            if tail:
                lines += ["", f"--- last lines of replica {rep.get('replica_id')} ---", *tail]
        return self.redact("\n".join(lines) + "\n")

    def _replica_tail(self, rep: Mapping[str, Any]) -> list[str]:
        """The last lines of a replica's Serve log (where its errors go); [] when Ray has none."""
        node, path = rep.get("node_id"), str(rep.get("log_file_path") or "")
        if not node or not path:
            return []
        query = urllib.parse.urlencode(
            {"node_id": node, "filename": path.lstrip("/"), "lines": REPLICA_LOG_LINES, "timeout": 5}
        )
        with contextlib.suppress(ArgusError):
            data = self.dash.get(f"/api/v0/logs/file?{query}", timeout=10)
            if isinstance(data, str):
                return data.splitlines()[-REPLICA_LOG_LINES:]
        return []


def _indented(message: Any) -> list[str]:
    return [f"  {line}" for line in str(message or "").splitlines() if line.strip()]
