"""Where the config repository lives: a local repository (read in place) or a remote URL
(mirrored into a local bare clone and fetched). I/O."""

from __future__ import annotations

import hashlib
import os
import subprocess
from dataclasses import dataclass

from reconciler.errors import SourceUnavailable
from reconciler.redact import redact, redact_url
from reconciler.source.git import GitRepo, git


def is_local(repo: str) -> bool:
    """True when ``repo`` is a path on this machine (``file://`` URLs count as remote)."""
    return "://" not in repo and not repo.startswith("git@") and os.path.exists(repo)


@dataclass
class RepoSource:
    """The config repository as argus reads and writes it.

    ``repo.path`` is the repository git commands run in: the local repository itself, or
    a bare mirror of the remote under ``cache_dir``.
    """

    url: str
    repo: GitRepo
    local: bool

    def fetch(self) -> None:
        """Bring the mirror up to date (no-op for a local repository). Raises SourceUnavailable."""
        if self.local:
            return
        git(
            self.repo.path,
            "fetch",
            "--prune",
            "--force",
            "origin",
            "+refs/heads/*:refs/heads/*",
            "+refs/notes/*:refs/notes/*",
        )

    def push(self, refs: list[str]) -> bool:
        """Push ``refs`` to the remote; False when rejected (someone else wrote first)."""
        if self.local:
            return True
        proc = subprocess.run(
            ["git", "-C", self.repo.path, "push", "--porcelain", "origin", *refs], capture_output=True
        )
        return proc.returncode == 0


def open_source(url: str, cache_dir: str) -> RepoSource:
    """Open ``url`` (a path or a git URL). A remote is mirrored into ``cache_dir`` on first use.

    Raises SourceUnavailable when a local path is not a git repository or a clone fails.
    """
    if is_local(url):
        path = os.path.abspath(url)
        probe = subprocess.run(["git", "-C", path, "rev-parse", "--git-dir"], capture_output=True)
        if probe.returncode != 0:
            raise SourceUnavailable(f"{redact_url(url)} is not a git repository")
        return RepoSource(url, GitRepo(path), local=True)
    mirror = os.path.join(cache_dir, hashlib.sha1(url.encode()).hexdigest()[:16] + ".git")
    if not os.path.isdir(mirror):
        os.makedirs(cache_dir, exist_ok=True)
        proc = subprocess.run(["git", "clone", "--bare", "--quiet", url, mirror], capture_output=True)
        if proc.returncode != 0:
            stderr = redact(proc.stderr.decode(errors="replace").strip())
            raise SourceUnavailable(f"cannot clone {redact_url(url)}: {stderr}")
    source = RepoSource(url, GitRepo(mirror), local=False)
    source.fetch()
    return source
