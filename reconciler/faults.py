"""Named crash points for fault-injection tests. I/O.

``ARGUS_FAULT=<point>`` makes the process kill itself with SIGKILL (like ``kill -9``) when it
reaches that point, so tests can prove that a restart loses nothing and doubles nothing.
Unset (always, in production) this is a dictionary lookup.
"""

from __future__ import annotations

import os
import signal

POINTS = ("after_submit", "serve_put", "status_commit")


def point(name: str) -> None:
    """Die here if ``ARGUS_FAULT`` names this point."""
    if os.environ.get("ARGUS_FAULT") == name:
        os.kill(os.getpid(), signal.SIGKILL)
