"""Read the desired state from a plain directory (``argus validate DIR``). I/O.

When the directory lies in a git work tree, the commit times that name models come from
its history (files not committed yet get ``now``).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import time

from reconciler.source.git import GitRepo
from reconciler.spec.loader import SourceFile


def read_directory(root: str) -> list[SourceFile]:
    """Return ``cluster.yaml`` and every file under ``users/`` (symlinks flagged, not followed)."""
    files: list[SourceFile] = []
    cluster = os.path.join(root, "cluster.yaml")
    if os.path.lexists(cluster):
        files.append(_file(root, "cluster.yaml"))
    users = os.path.join(root, "users")
    if os.path.islink(users):
        files.append(SourceFile("users", None, "symlink", symlink=True))
        return files
    for dirpath, dirnames, filenames in os.walk(users):
        for d in list(dirnames):
            if os.path.islink(os.path.join(dirpath, d)):
                dirnames.remove(d)
                filenames.append(d)
        for name in filenames:
            rel = os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/")
            files.append(_file(root, rel))
    return files


def _file(root: str, rel: str) -> SourceFile:
    full = os.path.join(root, rel)
    if os.path.islink(full):
        return SourceFile(rel, None, "symlink:" + rel, symlink=True)
    if not os.path.isfile(full):
        return SourceFile(rel, None, "special:" + rel)
    with open(full, "rb") as fh:
        content = fh.read()
    return SourceFile(rel, content, hashlib.sha1(content).hexdigest())


def created_times(root: str) -> tuple[dict[str, int], int]:
    """Return (path -> commit time of the add, now) using the enclosing git history if any."""
    now = int(time.time())
    proc = subprocess.run(["git", "-C", root, "rev-parse", "--show-prefix"], capture_output=True, text=True)
    if proc.returncode != 0:
        return {}, now
    head = subprocess.run(
        ["git", "-C", root, "rev-parse", "--verify", "--quiet", "HEAD"], capture_output=True, text=True
    )
    if head.returncode != 0:
        return {}, now
    top = subprocess.run(
        ["git", "-C", root, "rev-parse", "--show-toplevel"], capture_output=True, text=True
    ).stdout.strip()
    repo = GitRepo(top, prefix=proc.stdout.strip())
    return repo.created_times(head.stdout.strip()), now
