"""Read a task run's output and a model's Serve messages from Ray, for one object only. I/O.

Users never talk to the dashboard: the daemon reads for them, and only what belongs to the
object they name. A run resolves when the status branch lists it among the object's runs
*and* Ray's job metadata names argus, the user and the task; a model resolves to the Serve
application argus derives from its key, whose argus metadata names the same user and model.
Everything returned passes through the redactor (secret values, URL credentials).
"""

from __future__ import annotations

import codecs
import contextlib
import http.client
import queue
import re
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from reconciler.builders.jobs import LABEL_TASK, LABEL_USER, MANAGED_BY, MANAGER, proof_valid
from reconciler.builders.serve import app_name
from reconciler.dashboard import Dashboard, DashboardError, RayStream
from reconciler.errors import ArgusError
from reconciler.errors import LogNotFound as LogNotFound  # raised here; callers catch it from here
from reconciler.logs.slots import Requester, Slot, Slots
from reconciler.logs.tail import (
    CHUNK,
    DEFAULT_LIMIT_BYTES,
    DEFAULT_TAIL_LINES,
    MAX_LIMIT_BYTES,
    MAX_TAIL_LINES,
    clamp,
    driver_node,
    job_tail,
    read_last,
    stream_path,
)
from reconciler.plan.actual import FINAL_JOB_STATES

Redact = Callable[[str], str]
# The daemon's secrets as jobs receive them (reconciler.tick.SECRET_ENV_NAMES).
SECRET_NAMES = frozenset({"WANDB_API_KEY", "HF_TOKEN"})
REPLICA_LOG_LINES = 30
REPLICA_LOG_BYTES = 16 * 1024
# Below the redactor's whole-text cap (reconciler.redact.MAX_TEXT_CHARS, 1 Mi characters).
REDACT_PIECE = 512 * 1024
# A follower starts this many lines before the end, as `kubectl logs -f --tail` does.
FOLLOW_FROM_LINES = 200
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
        # One endless line is sent in pieces past the bound, never held whole.
        return (pending, "") if len(pending) > MAX_HELD_CHARS else ("", pending)
    head += "\n"
    begins = list(_KEY_BEGIN.finditer(head))
    if begins and not _KEY_END.search(head, begins[-1].end()) and len(pending) <= MAX_HELD_CHARS:
        cut = head.rfind("\n", 0, begins[-1].start()) + 1
        return head[:cut], head[cut:] + rest
    if len(rest) > MAX_HELD_CHARS:
        return pending, ""
    return head, rest


class RayLogs:
    """``RayLogs(dash, redact)``: the :class:`reconciler.web.handler.Logs` the daemon serves.

    ``serving`` returns the dashboard of the cluster models run on (default: ``dash``).
    ``ownership_key``: the daemon's key; a run is served only when its ``argus-proof`` label
    verifies under it (labels alone prove nothing: code on the cluster can submit jobs that claim
    to be anyone's). Every read is bounded: a run's output is its last lines (``tail``, at most
    :data:`~reconciler.logs.tail.MAX_TAIL_LINES`) and last bytes (``limit_bytes``), read through
    Ray's state API; a follower reads one stream from Ray (Ray keeps its offset), is cut off after
    ``max_follow_s`` or ``max_follow_bytes`` (the client reconnects if it still cares), and
    ``poll_s`` is how often it checks the run's state. Each read holds a page thread of the web
    server, so there are few at once: ``max_followers`` followers and ``max_readers`` reads, each
    at most ``per_requester`` for one requester (the user an authenticating proxy vouched for, else
    the client address: :class:`~reconciler.logs.slots.Requester`); both together stay below the
    page threads (8), so no log can starve the pages. A user vouched for who follows her own task's
    log when every follower slot is taken gets the slot of someone following another user's: a
    stranger cannot lock her out of her own logs.
    """

    def __init__(
        self,
        dash: Dashboard,
        redact: Redact,
        *,
        ownership_key: bytes | None = None,
        poll_s: float = 1.0,
        max_follow_s: float = 15 * 60.0,
        max_follow_bytes: int = 64 * 1024 * 1024,
        max_followers: int = 4,
        max_readers: int = 3,
        per_requester: int = 2,
        sleep: Callable[[float], None] = time.sleep,
        serving: Callable[[], Dashboard | None] | None = None,
    ) -> None:
        self.dash = dash
        # Where models' logs are read: the cluster they run on (cluster.yaml's serving.ray_address).
        self.serving: Callable[[], Dashboard | None] = serving if serving is not None else (lambda: dash)
        self.redact = redact
        self.ownership_key = ownership_key
        self.poll_s = poll_s
        self.max_follow_s = max_follow_s
        self.max_follow_bytes = max_follow_bytes
        self.max_followers = max_followers
        self.followers = Slots(max_followers, per_requester, "live logs followed", to_owner=True)
        self.readers = Slots(max_readers, per_requester, "log reads", to_owner=True)
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

    def _driver_node(self, sid: str) -> str:
        """The driver's node of ``sid``. Raises DashboardError (no driver yet), RayUnavailable."""
        return driver_node(self.dash, sid)

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

    def task_log(
        self,
        user: str,
        name: str,
        doc: Mapping[str, Any],
        run: str | None,
        *,
        tail: int | None = None,
        limit_bytes: int | None = None,
        client: str = "",
        identity: str = "",
    ) -> str:
        """The last ``tail`` lines (default 1000) of one run's output, at most ``limit_bytes``
        (default 1 MiB) of them, redacted; a first line says when bytes were left out. ``client``:
        the requester's address; ``identity``: the user a proxy vouched for ("" when none).

        Raises LogNotFound; ArgusError when too many reads run now (503), or when this read's slot went
        to ``user`` herself, vouched for, reading her own log when all were taken; RayUnavailable.
        """
        sid = self.resolve_run(user, name, doc, run)
        lines = clamp(tail, DEFAULT_TAIL_LINES, MAX_TAIL_LINES)
        limit = clamp(limit_bytes, DEFAULT_LIMIT_BYTES, MAX_LIMIT_BYTES)
        slot = self.readers.take(Requester(identity, client), user)
        try:
            found = job_tail(self.dash, sid, lines=lines, limit_bytes=limit, stop=slot.cut)
        except DashboardError as exc:  # no log file (yet): the run has not started, or its node is gone
            return f"[argus: Ray has no log for {sid} now (HTTP {exc.status})]\n"
        finally:
            self.readers.release(slot)
        if slot.cut.is_set():
            raise ArgusError(
                f"reading the log of {sid} stopped: the read slot went to a user reading her own log; retry shortly"
            )
        return found.note(limit) + self._redact_pieces(found.text)

    def _redact_pieces(self, text: str) -> str:
        """``text`` redacted in pieces of at most :data:`REDACT_PIECE` characters cut at line ends:
        the redactor cuts a longer text to its first and last half-MiB, and a tail may be 8 MiB. A
        key block cut in two stays hidden (the redactor hides a BEGIN without END and the body
        lines before an END)."""
        out = []
        start = 0
        while start < len(text):
            end = min(len(text), start + REDACT_PIECE)
            if end < len(text):
                newline = text.rfind("\n", start, end)
                end = newline + 1 if newline > start else end
            out.append(self.redact(text[start:end]))
            start = end
        return "".join(out)

    def follow_task_log(
        self,
        user: str,
        name: str,
        doc: Mapping[str, Any],
        run: str | None,
        *,
        client: str = "",
        identity: str = "",
    ) -> Iterator[str]:
        """Check the run now (raises LogNotFound), then return an iterator of redacted output
        that follows the run from its last lines until Ray reports it final. It yields ``""`` at
        every poll, a heartbeat on which the server checks that the client is still there.
        ``client``: the requester's address; ``identity``: the user a proxy vouched for.

        Raises ArgusError when the follower slots (in all, or this requester's) are taken (the
        server answers 503); ``user`` herself, vouched for, gets one cut from another user's follower.
        """
        sid = self.resolve_run(user, name, doc, run)
        slot = self.followers.take(Requester(identity, client), user)
        stream = self._held(sid, slot)
        next(stream)  # started: from here on, closing or dropping the stream frees the slot
        return stream

    def _held(self, sid: str, slot: Slot) -> Iterator[str]:
        try:
            yield ""
            for chunk in self._follow(sid):
                if slot.cut.is_set():  # its owner follows her own log and every slot was taken
                    yield f"\n[argus: stopped following {sid}: the slot went to a user following her own log]\n"
                    return
                yield chunk
        finally:
            self.followers.release(slot)

    def _follow(self, sid: str) -> Iterator[str]:
        # Only whole lines are redacted and sent while the run goes on, so that a secret split
        # across two reads is still recognised; the rest is sent when the run ends.
        def opened() -> RayStream:
            node = self._driver_node(sid)  # none until the driver starts: "missing", opened again later
            path = stream_path(sid, node, lines=FOLLOW_FROM_LINES, follow=True, interval=self.poll_s)
            return self.dash.stream(path, timeout=self.max_follow_s + 60)

        reader = _StreamReader(opened)
        pending = ""
        sent = 0
        deadline = time.monotonic() + self.max_follow_s
        final_since: float | None = None
        checked = float("-inf")
        status = ""
        try:
            while True:
                kind, data = reader.get(self.poll_s)
                if kind == "data":
                    pending += data
                    sent += len(data)
                elif kind == "missing" and final_since is None:
                    reader.retry_later(self.poll_s)  # no log file yet: the run has not started
                elif kind == "missing":  # final without a log file: it never started (Ray's message says why)
                    yield f"[argus: run {sid} {status}]\n"
                    return
                elif kind == "error":
                    yield self.redact(pending) + f"\n[argus: stopped following {sid}: {data}]\n"
                    return
                now = time.monotonic()
                if final_since is None and now - checked >= self.poll_s:  # one small GET per poll at most
                    checked = now
                    try:
                        status = str(self._job(sid).get("status", ""))
                    except (ArgusError, LookupError) as exc:
                        yield self.redact(pending) + f"\n[argus: stopped following {sid}: {exc}]\n"
                        return
                if status in FINAL_JOB_STATES and final_since is None:
                    final_since = now
                # Ray sends what the file gained every poll: once the run is final and the stream
                # stayed quiet for two polls, the whole output has arrived.
                settled = final_since is not None and kind != "data" and now - final_since >= 2 * self.poll_s
                if settled or kind == "end":
                    if pending:
                        yield self.redact(pending)
                    yield f"[argus: run {sid} {status}]\n" if status in FINAL_JOB_STATES else ""
                    return
                head, pending = _sendable(pending)
                if head:
                    yield self.redact(head)
                if now > deadline or sent > self.max_follow_bytes:
                    limit = "time" if now > deadline else f"{self.max_follow_bytes}-byte"
                    yield self.redact(pending) + f"\n[argus: follow {limit} limit reached; {sid} still {status}]\n"
                    return
                yield ""  # a heartbeat: the server notices a client that left even while the run is quiet
        finally:
            reader.close()

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
        app, info = self._app(self._serving(user, name), user, name, doc)
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

    def _serving(self, user: str, name: str) -> Dashboard:
        """The dashboard of the cluster models run on. Raises LogNotFound before the daemon has
        observed it (the jobs cluster may not be it, and a job could deploy a look-alike there)."""
        dash = self.serving()
        if dash is None:
            raise LogNotFound(f"{user}/models/{name}: the daemon has not observed Serve yet")
        return dash

    def _app(self, dash: Dashboard, user: str, name: str, doc: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]]:
        app = app_name(user, name)
        details = dash.get("/api/serve/applications/") or {}
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
        dash = self._serving(user, name)
        app, info = self._app(dash, user, name, doc)
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
            tail = self._replica_tail(dash, rep)
            if tail:
                lines += ["", f"--- last lines of replica {rep.get('replica_id')} ---", *tail]
        return self.redact("\n".join(lines) + "\n")

    def _replica_tail(self, dash: Dashboard, rep: Mapping[str, Any]) -> list[str]:
        """The last lines of a replica's Serve log (where its errors go); [] when Ray has none."""
        node, path = rep.get("node_id"), str(rep.get("log_file_path") or "")
        if not node or not path:
            return []
        query = urllib.parse.urlencode(
            {"node_id": node, "filename": path.lstrip("/"), "lines": REPLICA_LOG_LINES, "timeout": 5}
        )
        with contextlib.suppress(ArgusError, OSError, http.client.HTTPException):
            with dash.stream(f"/api/v0/logs/file?{query}", timeout=10) as stream:
                found = read_last(stream, REPLICA_LOG_BYTES, deadline=time.monotonic() + 10)
            return found.text.splitlines()[-REPLICA_LOG_LINES:]
        return []


def _indented(message: Any) -> list[str]:
    return [f"  {line}" for line in str(message or "").splitlines() if line.strip()]


class _StreamReader:
    """Reads one followed stream in its own thread into a small queue (at most ``QUEUE`` chunks:
    a slow client slows the read from Ray, it never grows memory). ``get(timeout)`` returns
    ``(kind, text)``: ``data``, ``idle`` (nothing within ``timeout``), ``end``, ``missing`` (Ray has
    no log file yet: ``retry_later`` opens it again) or ``error``. ``close()`` ends the thread."""

    QUEUE = 8

    def __init__(self, open_stream: Callable[[], RayStream]) -> None:
        self._open = open_stream
        self._queue: queue.Queue[tuple[str, str]] = queue.Queue(self.QUEUE)
        self._stop = threading.Event()
        self._stream: RayStream | None = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, args=(0.0,), name="argus-log-follow", daemon=True)
        self._thread.start()

    def retry_later(self, delay: float) -> None:
        self._thread = threading.Thread(target=self._run, args=(delay,), name="argus-log-follow", daemon=True)
        self._thread.start()

    def _run(self, delay: float) -> None:
        if self._stop.wait(delay):
            return
        try:
            stream = self._open()
        except DashboardError as exc:
            self._put(("missing", f"HTTP {exc.status}"))
            return
        except Exception as exc:  # Ray unreachable, or anything else: the follower says so and ends
            self._put(("error", str(exc)))
            return
        with self._lock:
            if self._stop.is_set():
                stream.close()
                return
            self._stream = stream
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        try:
            while not self._stop.is_set():
                data = stream.read1(CHUNK)
                if not data:
                    self._put(("data", decoder.decode(b"", final=True)))
                    self._put(("end", ""))
                    return
                self._put(("data", decoder.decode(data)))
        except (OSError, http.client.HTTPException, ValueError) as exc:
            self._put(("error", f"reading from Ray failed: {exc}"))

    def _put(self, item: tuple[str, str]) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(queue.Full):
                self._queue.put(item, timeout=0.5)
                return

    def get(self, timeout: float) -> tuple[str, str]:
        try:
            return self._queue.get(timeout=max(timeout, 0.01))
        except queue.Empty:
            return "idle", ""

    def close(self) -> None:
        with self._lock:
            self._stop.set()
            stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()
