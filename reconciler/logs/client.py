"""``argus logs``: read logs through the daemon's HTTP API (users need no dashboard access). I/O."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from typing import BinaryIO

from reconciler.errors import ArgusError

DEFAULT_SERVER = "http://127.0.0.1:8080"
_TARGET = re.compile(r"^([a-z0-9][a-z0-9-]*)/(models?|tasks?)/([a-z0-9][a-z0-9-]*)$")


def log_url(server: str, target: str, *, run: str | None = None, follow: bool = False) -> str:
    """The log API URL of ``USER/tasks/NAME`` or ``USER/models/NAME``. Raises ArgusError on a bad target."""
    found = _TARGET.match(target.strip("/"))
    if not found:
        raise ArgusError(f"{target!r}: expected USER/tasks/NAME or USER/models/NAME")
    user, kind, name = found.groups()
    kinds = kind if kind.endswith("s") else kind + "s"
    if kinds == "models" and (run or follow):
        raise ArgusError("--run and --follow are for tasks; a model's log is its Serve status messages")
    query = {k: v for k, v in (("run", run or ""), ("follow", "1" if follow else "")) if v}
    url = f"{server.rstrip('/')}/api/v1/logs/{user}/{kinds}/{name}"
    return url + ("?" + urllib.parse.urlencode(query) if query else "")


def stream_logs(url: str, out: BinaryIO, *, timeout: float = 60.0) -> None:
    """Copy the log at ``url`` to ``out`` as it arrives (a followed run streams until it ends).

    Raises ArgusError with the daemon's message (404: no such object or run; 503: Ray
    unreachable) or when the daemon cannot be reached.
    """
    request = urllib.request.Request(url, headers={"Accept": "text/plain"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            while True:
                chunk = resp.read1(65536)
                if not chunk:
                    break
                out.write(chunk)
                out.flush()
    except urllib.error.HTTPError as exc:
        text = exc.read().decode(errors="replace")
        try:
            message = json.loads(text).get("error", text)
        except (ValueError, AttributeError):
            message = text
        raise ArgusError(f"{url}: HTTP {exc.code}: {message}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise ArgusError(
            f"cannot reach the argus daemon at {url}: {exc} (set --server or ARGUS_SERVER to its web address)"
        ) from exc
