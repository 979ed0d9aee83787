"""The contract between the daemon's HTTP server and the pages it serves.

A page handler is ``(method, path, query) -> Response | None``; None means "not mine" (404).
The server owns sockets, limits and timeouts; handlers own content. ``body`` may be an
iterable of chunks, which the server streams (live logs) and stops when the client leaves.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field


@dataclass
class Response:
    status: int
    content_type: str
    body: bytes | Iterable[bytes]
    headers: Mapping[str, str] = field(default_factory=dict)


PageHandler = Callable[[str, str, Mapping[str, list[str]]], "Response | None"]

# The address of the client whose request a page handler is answering ("" when unknown). Set by the
# server around each call, so that the handler's signature stays ``(method, path, query)``; the log
# reader uses it to bound what one client address can hold.
CLIENT_ADDRESS: contextvars.ContextVar[str] = contextvars.ContextVar("argus_client_address", default="")
# The user an authenticating proxy in front of the pages vouched for (``argus run --web-user-header``),
# "" when none is configured or the request carries none: log slots are then counted per user.
CLIENT_USER: contextvars.ContextVar[str] = contextvars.ContextVar("argus_client_user", default="")
