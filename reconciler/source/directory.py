"""Read the desired state from a plain directory (``argus validate DIR``). I/O.

When the directory lies in a git work tree, the commit times that name models come from
its history (files not committed yet get ``now``).
"""

from __future__ import annotations

import hashlib
import os
import stat
import time

from reconciler import git
from reconciler.source.git import GitRepo
from reconciler.spec.loader import SourceFile, classify
from reconciler.spec.yamldoc import MAX_BYTES


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
            if classify(rel)[0] is None and not os.path.islink(os.path.join(root, rel)):
                files.append(SourceFile(rel, None, "unread:" + rel))  # never an object: reported, not read
            else:
                files.append(_file(root, rel))
    return files


def _file(root: str, rel: str) -> SourceFile:
    full = os.path.join(root, rel)
    if os.path.islink(full):
        return SourceFile(rel, None, "symlink:" + rel, symlink=True)
    try:
        # O_NOFOLLOW | O_NONBLOCK: a file swapped for a link or a FIFO after the checks above
        # is neither followed nor waited on.
        fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return SourceFile(rel, None, "special:" + rel)
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode):
            return SourceFile(rel, None, "special:" + rel)
        if info.st_size > MAX_BYTES:  # size before content: never read what is refused anyway
            return SourceFile(rel, None, f"size:{info.st_size}", size=info.st_size)
        content = fh.read(MAX_BYTES + 1)
    if len(content) > MAX_BYTES:  # it grew after fstat
        return SourceFile(rel, None, f"size:{len(content)}+", size=len(content))
    return SourceFile(rel, content, hashlib.sha1(content).hexdigest())


def created_times(root: str) -> tuple[dict[str, int], int]:
    """Return (path -> commit time of the add, now) using the enclosing git history if any."""
    now = int(time.time())
    prefix = git.probe(root, "rev-parse", "--show-prefix")
    if prefix.returncode != 0:
        return {}, now
    head = git.rev(root, "HEAD")
    if head is None:
        return {}, now
    top = git.text(root, "rev-parse", "--show-toplevel", check=False)
    repo = GitRepo(top, prefix=prefix.stdout.decode().strip())
    return repo.created_times(head), now
