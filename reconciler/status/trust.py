"""Which status commit argus trusts: its own, never one a user pushed. I/O (git, the state folder).

The status branch is argus's output and its exactly-once journal (run records, ``first_seen``).
:class:`StatusTrust` picks the commit whose documents argus reads and builds on (the *base*):

1. a candidate tip (the remote's, then the local ref) that is the *anchor* — the last status
   commit this daemon wrote or trusted, kept in its state folder, outside the repository — or
   that verifies (:mod:`reconciler.status.auth`) and descends from the anchor (another daemon
   with the same key moved on);
2. else the anchor itself, when its commit still exists (a forged tip, a rewind to an older
   argus commit, a deleted branch: each is ignored and reported, and the next write restores);
3. else the newest commit on the tip's first-parent history that verifies (the anchor is lost);
4. else, for a branch on which no commit carries an ``Argus-Auth`` trailer at all and no
   anchor (the first start after upgrading from an argus that did not authenticate), the
   tip as it is, once (trust on first use), reported;
5. else nothing: the journal starts empty, reported.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from reconciler import git
from reconciler.status.auth import commit_verifies, has_trailer, status_key
from reconciler.status.store import StatusStore

log = logging.getLogger("argus")
# How far back a lost anchor is looked for on the tip's first-parent history.
MAX_WALK = 500
# Commits already judged (sha -> verifies): a tip is read once, not on every refresh.
_MAX_JUDGED = 4096


@dataclass
class Resolution:
    """``base``: the commit to read and build on (None: none is trusted); ``alerts``: what was
    ignored and why (for the log, the status README and /healthz)."""

    base: str | None
    alerts: list[str] = field(default_factory=list)


def commit_parts(repo: str, sha: str) -> tuple[str, list[str], str] | None:
    """``(tree, parents, message)`` of commit ``sha``; None when it is not a commit here."""
    proc = git.probe(repo, "cat-file", "commit", sha)
    if proc.returncode != 0:
        return None
    head, _, message = proc.stdout.partition(b"\n\n")
    tree, parents = "", []
    for line in head.decode(errors="replace").splitlines():
        name, _, value = line.partition(" ")
        if name == "tree":
            tree = value
        elif name == "parent":
            parents.append(value)
    return tree, parents, message.decode(errors="replace")


class StatusTrust:
    """Judges status commits with ``key`` and keeps the anchor in ``anchor_file`` (None: kept
    in memory only, as a one-off ``argus reconcile`` does)."""

    def __init__(self, key: bytes, anchor_file: str | None = None) -> None:
        self.key = key
        self.anchor_file = anchor_file
        self._judged: dict[str, bool] = {}
        self._anchor: str | None = self._read_anchor()

    @property
    def anchor(self) -> str | None:
        return self._anchor

    def verifies(self, repo: str, sha: str) -> bool:
        """True when commit ``sha`` is a status commit argus made with this key."""
        if sha not in self._judged:
            if len(self._judged) >= _MAX_JUDGED:
                self._judged.clear()
            parts = commit_parts(repo, sha)
            self._judged[sha] = parts is not None and commit_verifies(self.key, *parts)
        return self._judged[sha]

    def resolve(self, repo: str, candidates: list[str | None]) -> Resolution:
        """The commit to trust among ``candidates`` (tips, most preferred first; None: absent).
        See the module docstring for the order."""
        anchor = self._anchor
        if anchor is not None and anchor in candidates and candidates[0] in (anchor, None):
            return Resolution(anchor)  # the usual case: the branch is where argus left it (no git call)
        anchor_exists = anchor is not None and commit_parts(repo, anchor) is not None
        alerts: list[str] = []
        for tip in candidates:
            if tip is None:
                continue
            if tip == anchor:
                return Resolution(tip, alerts)
            if not self.verifies(repo, tip):
                alerts.append(f"status tip {tip[:12]} was not written by argus (it does not verify): ignored")
            elif anchor_exists and not _is_ancestor(repo, str(anchor), tip):
                alerts.append(
                    f"status tip {tip[:12]} does not descend from argus's last record {str(anchor)[:12]} "
                    "(a rewind or a replaced history): ignored"
                )
            else:
                self.remember(tip)
                return Resolution(tip, alerts)
        tips = [t for t in candidates if t is not None]
        if anchor is not None and anchor_exists:
            if not tips:
                alerts.append(f"the status branch is gone: argus's last record {anchor[:12]} stays in force")
            return Resolution(anchor, alerts)
        if anchor is not None:
            alerts.append(f"argus's last status record {anchor[:12]} is no longer in the repository")
        walked = 0
        seen_trailer = False
        for tip in tips:
            for sha in _first_parent(repo, tip, MAX_WALK):
                walked += 1
                parts = commit_parts(repo, sha)
                if parts is None:
                    continue
                seen_trailer = seen_trailer or has_trailer(parts[2])
                if self.verifies(repo, sha):
                    alerts.append(f"the newest status commit argus wrote on that history, {sha[:12]}, is used")
                    self.remember(sha)
                    return Resolution(sha, alerts)
        if tips and anchor is None and not seen_trailer and walked < MAX_WALK:
            tip = tips[-1]  # the local ref: the one argus itself last wrote before the upgrade
            alerts.append(
                f"status branch {tip[:12]} was written by an argus that did not authenticate its records: "
                "adopted once as it is; from now on only commits argus authenticates are trusted"
            )
            self.remember(tip)
            return Resolution(tip, alerts)
        if tips:
            alerts.append("no status commit on the branch was written by this argus: the journal starts empty")
        return Resolution(None, alerts)

    def remember(self, sha: str) -> None:
        """Make ``sha`` the anchor (a commit argus wrote or trusted), durably."""
        if sha == self._anchor:
            return
        self._anchor = sha
        self._judged[sha] = True
        if not self.anchor_file:
            return
        os.makedirs(os.path.dirname(self.anchor_file) or ".", mode=0o700, exist_ok=True)
        tmp = f"{self.anchor_file}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump({"commit": sha}, fh)
        os.replace(tmp, self.anchor_file)  # atomic: a crash leaves the old or the new anchor

    def _read_anchor(self) -> str | None:
        if not self.anchor_file:
            return None
        try:
            with open(self.anchor_file, encoding="utf-8") as fh:
                value = json.load(fh).get("commit")
        except (OSError, ValueError, AttributeError):
            return None
        return value if isinstance(value, str) and len(value) in (40, 64) else None


def _is_ancestor(repo: str, a: str, b: str) -> bool:
    return git.probe(repo, "merge-base", "--is-ancestor", a, b).returncode == 0


def _first_parent(repo: str, tip: str, limit: int) -> list[str]:
    proc = git.probe(repo, "rev-list", "--first-parent", f"--max-count={limit}", tip)
    return proc.stdout.decode().split() if proc.returncode == 0 else []


def trusted_documents(repo: str, branch: str, ownership_key: bytes) -> Mapping[str, Mapping[str, Any]]:
    """The status documents of the newest commit argus authenticated on ``branch`` (or, in a
    clone, ``origin/<branch>``), read by a one-off store, for a run without a daemon's anchor;
    what was ignored is reported in the log. Raises GitError when git cannot read them."""
    refs = [f"refs/heads/{branch}", f"refs/remotes/origin/{branch}"]
    tips = [git.rev(repo, ref) for ref in refs]
    resolution = StatusTrust(status_key(ownership_key)).resolve(repo, tips)
    for alert in resolution.alerts:
        log.warning("status integrity: %s", alert)
    return StatusStore(repo, branch).documents(resolution.base) if resolution.base else {}
