"""A small JSON client for the Ray dashboard's REST APIs (Jobs, Serve, cluster). I/O.

Connection problems, and Ray's token authentication refusing argus, raise :class:`RayUnavailable`
(back off, apply nothing); any other HTTP error answer raises :class:`DashboardError` with the status
and the body text.

Ray >= 2.52 can require a token on every dashboard call (``RAY_AUTH_MODE=token``); the client then sends
``Authorization: Bearer <token>``, taken from ``ARGUS_RAY_TOKEN``, else Ray's own ``RAY_AUTH_TOKEN``, else the
file named by ``RAY_AUTH_TOKEN_PATH``. With none of them set nothing is sent, as a cluster without auth expects.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from reconciler.errors import ArgusError, RayUnavailable
from reconciler.errors import DashboardError as DashboardError  # raised here; callers catch it from here


def token_from_env(environ: Mapping[str, str] | None = None) -> str | None:
    """The Ray auth token configured for argus: ``ARGUS_RAY_TOKEN``, ``RAY_AUTH_TOKEN``, or the file
    ``RAY_AUTH_TOKEN_PATH`` names (the variables Ray itself reads); None when none is set.

    Raises ArgusError when ``RAY_AUTH_TOKEN_PATH`` names a file that cannot be read or is empty: a token
    that was meant to be sent must not silently be left out.
    """
    return _token(environ, ("ARGUS_RAY_TOKEN", "RAY_AUTH_TOKEN"), "RAY_AUTH_TOKEN_PATH", "the Ray auth token")


def serving_token_from_env(environ: Mapping[str, str] | None = None) -> str | None:
    """The Ray auth token of the serving cluster (cluster.yaml's ``serving.ray_address``):
    ``ARGUS_SERVING_RAY_TOKEN``, or the file ``ARGUS_SERVING_RAY_TOKEN_PATH`` names; None when
    neither is set (nothing is sent). The jobs cluster's token is never sent there: a cluster of its
    own is one whose jobs' token cannot reach the models.

    Raises ArgusError when the file cannot be read or is empty."""
    return _token(environ, ("ARGUS_SERVING_RAY_TOKEN",), "ARGUS_SERVING_RAY_TOKEN_PATH", "the serving cluster's token")


def _token(environ: Mapping[str, str] | None, names: tuple[str, ...], path_name: str, what: str) -> str | None:
    """The first of ``names`` set in ``environ`` (default: the process's), else the file
    ``path_name`` names; None when none is set. Raises ArgusError for an unreadable or empty file."""
    env = os.environ if environ is None else environ
    for name in names:
        if env.get(name, "").strip():
            return env[name].strip()
    path = env.get(path_name, "").strip()
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            token = fh.read().strip()
    except OSError as exc:
        raise ArgusError(f"{path_name}={path}: cannot read {what}: {exc}") from exc
    if not token:
        raise ArgusError(f"{path_name}={path}: the file of {what} is empty")
    return token


JOBS_TOKEN_NAMES = "ARGUS_RAY_TOKEN, RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH"
SERVING_TOKEN_NAMES = "ARGUS_SERVING_RAY_TOKEN or ARGUS_SERVING_RAY_TOKEN_PATH"


class Clusters:
    """The Ray clusters argus talks to: ``jobs``, where tasks run (and models, unless cluster.yaml's
    ``serving.ray_address`` names a cluster of their own), and that serving cluster's dashboard,
    made on first use and kept while the address stays the same (one at a time). Thread-safe: the
    tick and the Serve watch both ask. ``token``: the serving cluster's (default:
    :func:`serving_token_from_env`, read when its dashboard is made); ``pinned``: the only address
    that token is sent to (default: ``ARGUS_SERVING_RAY``): the repository may name the serving
    cluster, but where a key goes is decided outside it, as the key is; ``make``: how that
    dashboard is made from its address and token (default: a :class:`Dashboard`; tests give a
    stand-in)."""

    def __init__(
        self,
        jobs: Dashboard,
        *,
        token: str | None = "",
        pinned: str | None = "",
        make: Callable[[str, str | None], Dashboard] | None = None,
    ) -> None:
        self.jobs = jobs
        self._token = token
        self._pinned = (os.environ.get("ARGUS_SERVING_RAY", "").strip() or None) if pinned == "" else pinned
        self._make = make or (
            lambda address, token: Dashboard(address, jobs.timeout, token=token, token_names=SERVING_TOKEN_NAMES)
        )
        self._lock = threading.Lock()
        self._serving: Dashboard | None = None

    def serving(self, address: str | None) -> Dashboard:
        """The dashboard models are deployed through for a cluster.yaml whose
        ``serving.ray_address`` is ``address`` (None, or the jobs cluster's own: ``jobs``).

        Raises RayUnavailable when the serving cluster's token file cannot be read, or a token is
        set and ``address`` is not the pinned one (the daemon backs off and applies nothing, as
        when that cluster does not answer)."""
        if address is None or address.rstrip("/") == self.jobs.base_url:
            return self.jobs
        address = address.rstrip("/")
        with self._lock:
            if self._serving is None or self._serving.base_url != address:
                try:
                    token = serving_token_from_env() if self._token == "" else self._token
                except ArgusError as exc:
                    raise RayUnavailable(f"the serving cluster {address}: {exc}") from exc
                pinned = self._pinned.rstrip("/") if self._pinned else None
                if token is not None and pinned != address:
                    raise RayUnavailable(
                        f"cluster.yaml's serving.ray_address is {address}, but the serving cluster's token is sent "
                        f"only to ARGUS_SERVING_RAY ({pinned or 'unset'}): set ARGUS_SERVING_RAY to that dashboard "
                        "in the daemon's environment (a commit cannot send a key elsewhere)"
                    )
                self._serving = self._make(address, token)
            return self._serving


class Dashboard:
    """``Dashboard("http://127.0.0.1:8265")``; every method returns parsed JSON (or text).

    ``token`` is the Ray auth token to send; by default it comes from the environment (:func:`token_from_env`).
    """

    def __init__(
        self, base_url: str, timeout: float = 30.0, *, token: str | None = "", token_names: str = JOBS_TOKEN_NAMES
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.token_names = token_names  # where its token comes from, for a refusal's message
        # "" means "not given": read the environment; None means "send no token".
        self._token = token_from_env() if token == "" else token

    def request(self, method: str, path: str, body: Any = None, *, timeout: float | None = None) -> Any:
        """Send one request; return the decoded JSON body (None when empty, str when not JSON).

        Raises RayUnavailable when the dashboard cannot be reached, DashboardError on HTTP >= 400.
        """
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self._token:
            req.add_unredirected_header("Authorization", f"Bearer {self._token}")  # never to a redirect's host
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            text = exc.read().decode(errors="replace")
            if exc.code in (401, 403) and ("authentication token" in text or self._token):
                # Ray's token auth refused argus itself: a configuration problem of the daemon, never a verdict
                # on an object's spec, so it backs off like an outage instead of failing objects.
                raise RayUnavailable(
                    f"Ray dashboard {self.base_url} refused argus's credentials (HTTP {exc.code}: {text[:200]}): "
                    f"set {self.token_names} to the cluster's Ray auth token"
                ) from exc
            raise DashboardError(method, path, exc.code, text) from exc
        except (urllib.error.URLError, OSError) as exc:
            raise RayUnavailable(f"Ray dashboard {self.base_url} unreachable: {exc}") from exc
        if not raw:
            return None
        text = raw.decode(errors="replace")
        try:
            return json.loads(text)
        except ValueError:
            return text

    def stream(self, path: str, *, timeout: float | None = None) -> RayStream:
        """Open ``GET path`` and return its body unread, for the caller to read piece by piece
        (``read1``) and close: the way to read a log of any size with bounded memory.

        Raises RayUnavailable when the dashboard cannot be reached (or refuses argus's token),
        DashboardError on HTTP >= 400 (with at most 64 KiB of the answer's text).
        """
        url = urllib.parse.urlsplit(self.base_url + path)
        kind = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
        conn = kind(url.hostname or "127.0.0.1", url.port, timeout=timeout or self.timeout)
        headers = {"Authorization": f"Bearer {self._token}"} if self._token else {}
        try:
            conn.request("GET", url.path + (f"?{url.query}" if url.query else ""), headers=headers)
            resp = conn.getresponse()
            if resp.status >= 400:
                text = resp.read(_ERROR_TEXT_BYTES).decode(errors="replace")
                conn.close()
                if resp.status in (401, 403) and ("authentication token" in text or self._token):
                    raise RayUnavailable(
                        f"Ray dashboard {self.base_url} refused argus's credentials (HTTP {resp.status}: {text[:200]})"
                    )
                raise DashboardError("GET", path, resp.status, text)
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise RayUnavailable(f"Ray dashboard {self.base_url} unreachable: {exc}") from exc
        return RayStream(conn, resp)

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> Any:
        return self.request("POST", path, body if body is not None else {}, **kw)

    def put(self, path: str, body: Any, **kw: Any) -> Any:
        return self.request("PUT", path, body, **kw)

    def delete(self, path: str, **kw: Any) -> Any:
        return self.request("DELETE", path, **kw)


_ERROR_TEXT_BYTES = 64 * 1024


class RayStream:
    """The body of one streamed dashboard answer. ``read1(n)`` returns at most ``n`` bytes as they
    arrive (b"" at the end); ``close()`` may be called from another thread and wakes a blocked read."""

    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
        self._conn, self._resp = conn, resp

    def read1(self, n: int) -> bytes:
        """Up to ``n`` bytes. Raises OSError / http.client.HTTPException when the connection fails."""
        return self._resp.read1(n)

    def close(self) -> None:
        sock = self._conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # a read blocked in another thread returns now
        self._conn.close()

    def __enter__(self) -> RayStream:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
