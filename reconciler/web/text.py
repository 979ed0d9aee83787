"""``argus status`` as text: fetch the status branch (saying when it could not) and what needs attention. I/O."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from typing import Any

from reconciler import git
from reconciler.errors import ArgusError, GitError, SourceUnavailable
from reconciler.redact import redact
from reconciler.source.git import GitRepo
from reconciler.source.remote import RepoSource, open_source
from reconciler.web import view

LOG_LINES = 10
QUIET_STATES = ("RUNNING", "SUCCEEDED")


def status_remote(path: str, requested: str | None) -> str | None:
    """The remote ``argus status`` reads the status branch from, in a user's clone at ``path``:
    ``requested`` (``--remote``), else the current branch's upstream remote, else ``origin``, else
    the only remote; None when the clone has no remote (the daemon's own repository).
    Raises ArgusError for an unknown ``requested`` remote or several remotes and no upstream."""
    remotes = git.text(path, "remote", check=False).split()
    if requested:
        if requested not in remotes:
            raise ArgusError(f"no remote {requested!r} in {path} (remotes: {', '.join(remotes) or 'none'})")
        return requested
    head = git.text(path, "symbolic-ref", "-q", "--short", "HEAD", check=False)
    if head:
        upstream = git.text(path, "config", "--get", f"branch.{head}.remote", check=False)
        if upstream in remotes:
            return upstream
    if "origin" in remotes:
        return "origin"
    if len(remotes) == 1:
        return remotes[0]
    if remotes:
        raise ArgusError(
            f"{path} has several remotes ({', '.join(remotes)}) and the current branch follows none: "
            "pass --remote NAME (the one the daemon writes its status branch to)"
        )
    return None


def fetch_status_source(
    repo: str, cache_dir: str, branch: str, remote: str | None = None
) -> tuple[RepoSource, str | None, str | None]:
    """Open ``repo`` and bring its status branch up to date.

    Returns the source, why the data may be stale when the fetch failed but an earlier copy exists
    (None when fresh, or when ``repo`` is the daemon's own repository), and the remote the branch
    was fetched from (see :func:`status_remote`; None when nothing was fetched by name).
    Raises SourceUnavailable when there is nothing to show at all, ArgusError for a bad ``remote``.
    """
    try:
        source = open_source(repo, cache_dir)
    except SourceUnavailable as exc:
        # open_source mirrors a URL here; an earlier mirror still holds the last status.
        mirror = os.path.join(cache_dir, hashlib.sha1(repo.encode()).hexdigest()[:16] + ".git")
        if not os.path.isdir(mirror):
            raise
        return RepoSource(repo, GitRepo(mirror), local=False), f"could not fetch {repo}: {exc}", None
    if not source.local:
        return source, None, None
    name = status_remote(source.repo.path, remote)
    if name is None:
        return source, None, None  # the daemon writes here itself: nothing to fetch
    try:
        git.run(source.repo.path, "fetch", "-q", name, f"+refs/heads/{branch}:refs/remotes/{name}/{branch}")
    except GitError as exc:
        why = redact(exc.stderr) if exc.stderr else str(exc)
        return source, f"could not fetch {branch} from {name}: {why}", name
    return source, None, name


def attention_lines(docs: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Indented lines under the table: each reason that is not "all fine", and for a task whose
    current run failed, Ray's message and the last lines of its log."""
    out: list[str] = []
    for path in sorted(docs):
        doc = docs[path]
        state = view.text(doc.get("state"))
        reason = view.text(doc.get("reason"))
        if reason and state not in QUIET_STATES:
            out.append(f"  {doc.get('object') or path}: {reason}")
        if "/tasks/" not in path:
            continue
        run = view.current_run(doc)
        if run is None or run.get("status") not in ("FAILED", "STOPPED", "LOST"):
            continue
        message = view.text(run.get("message"))
        ended = view.text(run.get("end_time"))
        head = f"    run {run.get('submission_id')}: {run.get('status')}" + (f" at {ended}" if ended else "")
        out.append(head + (f": {message}" if message and message != reason else ""))
        tail = [view.text(line) for line in view.listing(run.get("log_tail"))][-LOG_LINES:]
        if tail:
            out.append(f"    last {len(tail)} log line(s) (argus logs {doc.get('object') or path} --run ID for all):")
            out += [f"      | {line}" for line in tail]
    return out
