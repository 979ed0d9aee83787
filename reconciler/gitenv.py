"""The environment every git command argus runs inherits.

``GIT_NO_REPLACE_OBJECTS=1``: git ignores ``refs/replace/*``. Without it, anyone who can create a replace
ref in the repository (a push to a server that allows it, or an admin pointing argus at a repository that
has some) changes what every ``git show``, ``cat-file`` and ``log`` returns: another user's signed file read
with different content, a lease commit read with a different expiry. argus spawns git in many places, each
with ``os.environ`` or a copy of it, so the variable is set once in this process's environment, when the
``reconciler`` package is imported, and every git child process inherits it.
"""

from __future__ import annotations

import os

GIT_ENV = {"GIT_NO_REPLACE_OBJECTS": "1"}


def apply() -> None:
    """Put GIT_ENV into ``os.environ`` (overriding any other value). Returns nothing."""
    os.environ.update(GIT_ENV)
