"""``argus status`` as text: fetch the status branch (saying when it could not) and what needs attention. I/O."""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Mapping
from typing import Any

from reconciler.errors import SourceUnavailable
from reconciler.redact import redact
from reconciler.source.git import GitRepo
from reconciler.source.remote import RepoSource, open_source
from reconciler.web import view

LOG_LINES = 10
QUIET_STATES = ("RUNNING", "SUCCEEDED")


def fetch_status_source(repo: str, cache_dir: str, branch: str) -> tuple[RepoSource, str | None]:
    """Open ``repo`` and bring its status branch up to date.

    Returns the source and, when the fetch failed but an earlier copy exists, why the data
    may be stale (None when fresh, or when ``repo`` is the daemon's own repository).
    Raises SourceUnavailable when there is nothing to show at all.
    """
    try:
        source = open_source(repo, cache_dir)
    except SourceUnavailable as exc:
        # open_source mirrors a URL here; an earlier mirror still holds the last status.
        mirror = os.path.join(cache_dir, hashlib.sha1(repo.encode()).hexdigest()[:16] + ".git")
        if not os.path.isdir(mirror):
            raise
        return RepoSource(repo, GitRepo(mirror), local=False), f"could not fetch {repo}: {exc}"
    if not source.local:
        return source, None
    has_origin = subprocess.run(["git", "-C", source.repo.path, "remote", "get-url", "origin"], capture_output=True)
    if has_origin.returncode != 0:
        return source, None  # the daemon writes here itself: nothing to fetch
    proc = subprocess.run(
        [
            "git",
            "-C",
            source.repo.path,
            "fetch",
            "-q",
            "origin",
            f"+refs/heads/{branch}:refs/remotes/origin/{branch}",
        ],
        capture_output=True,
    )
    if proc.returncode != 0:
        return source, f"could not fetch {branch} from origin: {redact(proc.stderr.decode(errors='replace').strip())}"
    return source, None


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
