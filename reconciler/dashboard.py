"""A small JSON client for the Ray dashboard's REST APIs (Jobs, Serve, cluster). I/O.

Connection problems raise :class:`RayUnavailable` (temporary: back off, apply nothing);
an HTTP error answer raises :class:`DashboardError` with the status and the body text.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from reconciler.errors import ArgusError, RayUnavailable


class DashboardError(ArgusError):
    """The dashboard answered with an HTTP error."""

    def __init__(self, method: str, path: str, status: int, text: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {text[:500]}")
        self.status = status
        self.text = text


class Dashboard:
    """``Dashboard("http://127.0.0.1:8265")``; every method returns parsed JSON (or text)."""

    def __init__(self, base_url: str, timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    def request(self, method: str, path: str, body: Any = None, *, timeout: float | None = None) -> Any:
        """Send one request; return the decoded JSON body (None when empty, str when not JSON).

        Raises RayUnavailable when the dashboard cannot be reached, DashboardError on HTTP >= 400.
        """
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raise DashboardError(method, path, exc.code, exc.read().decode(errors="replace")) from exc
        except (urllib.error.URLError, OSError) as exc:
            raise RayUnavailable(f"Ray dashboard {self.base_url} unreachable: {exc}") from exc
        if not raw:
            return None
        text = raw.decode(errors="replace")
        try:
            return json.loads(text)
        except ValueError:
            return text

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> Any:
        return self.request("POST", path, body if body is not None else {}, **kw)

    def put(self, path: str, body: Any, **kw: Any) -> Any:
        return self.request("PUT", path, body, **kw)

    def delete(self, path: str, **kw: Any) -> Any:
        return self.request("DELETE", path, **kw)
