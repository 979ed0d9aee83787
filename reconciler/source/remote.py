"""Where the config repository lives: a local repository (read in place) or a remote URL
(mirrored into a local bare clone and fetched). I/O.

A remote's branches are mirrored into ``refs/heads/*``, except argus's own refs: the status
branch, the notes and the lease are argus's output, which anyone who can push could forge.
They are fetched into tracking refs only (:data:`TRACKING`), judged there
(:mod:`reconciler.status.trust`, :mod:`reconciler.status.lease`), and never overwrite what
argus wrote locally; argus's pushes replace the remote's copy with compare-and-swap against
the tracking value (``--force-with-lease``)."""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass

from reconciler import git
from reconciler.errors import GitError, SourceUnavailable
from reconciler.redact import redact, redact_url
from reconciler.source.git import GitRepo

log = logging.getLogger(__name__)

MAX_SINGLE_REF_UPDATES = 32  # refs tried one by one after a failed transaction, per fetch


def is_local(repo: str) -> bool:
    """True when ``repo`` is a path on this machine (``file://`` URLs count as remote)."""
    return "://" not in repo and not repo.startswith("git@") and os.path.exists(repo)


NOTES_TRACKING = "refs/remotes/origin-notes/"


def tracking_ref(ref: str) -> str:
    """Where the remote's copy of argus's own ``ref`` is fetched to (it is judged there)."""
    if ref.startswith("refs/heads/"):
        return "refs/remotes/origin/" + ref.removeprefix("refs/heads/")
    if ref.startswith("refs/notes/"):
        return NOTES_TRACKING + ref.removeprefix("refs/notes/")
    return "refs/remotes/origin-argus/" + ref.removeprefix("refs/argus/")


@dataclass
class RepoSource:
    """The config repository as argus reads and writes it.

    ``repo.path`` is the repository git commands run in: the local repository itself, or
    a bare mirror of the remote under ``cache_dir``.
    """

    url: str
    repo: GitRepo
    local: bool
    status_branch: str = "argus/status"  # argus's own branch: never mirrored over (see above)
    # A forge's pull-request heads (``refs/pull/*/head``), fetched under the same names: a squash or
    # rebase merge is verified against their signed commits (reconciler.source.forge). Checked
    # (SigningPolicy.check) never to name branches or argus's own refs.
    pull_refs: str | None = None

    def fetch(self) -> None:
        """Bring the mirror up to date (no-op for a local repository). Raises SourceUnavailable."""
        if self.local:
            return
        git.run(
            self.repo.path,
            "fetch",
            "--prune",
            "--force",
            "origin",
            "+refs/heads/*:refs/remotes/origin/*",
            f"+refs/notes/*:{NOTES_TRACKING}*",
            *([f"+{self.pull_refs}:{self.pull_refs}"] if self.pull_refs else []),
        )
        self._mirror_branches()

    def _mirror_branches(self) -> None:
        """``refs/heads/*`` := the remote's branches, except the status branch (one git call when
        the refs can be stored in one transaction, as almost always)."""
        own = f"refs/heads/{self.status_branch}"
        listing = git.run(
            self.repo.path, "for-each-ref", "--format=%(objectname) %(refname)", "refs/heads/", "refs/remotes/"
        )
        local: dict[str, str] = {}
        remote: dict[str, str] = {}
        # Ref names hold no newline but may hold any byte that is not UTF-8: surrogateescape
        # round-trips them, so two names never collapse into one and each is written back as is.
        for line in listing.decode("utf-8", "surrogateescape").splitlines():
            sha, _, ref = line.partition(" ")
            if ref.startswith("refs/heads/"):
                local[ref] = sha
            elif ref.startswith("refs/remotes/origin/") and ref != "refs/remotes/origin/HEAD":
                remote["refs/heads/" + ref.removeprefix("refs/remotes/origin/")] = sha
        # The status branch is argus's own: never mirrored over, and a branch named like a folder
        # above or below it (``argus``, ``argus/status/x``) is left out, as it could not be stored.
        mine = [r for r in remote if r == own or r.startswith(own + "/") or own.startswith(r + "/")]
        for ref in mine:
            del remote[ref]
        deletes = [f"delete {ref}\n" for ref in local if ref != own and ref not in remote]
        updates = [f"update {ref} {sha}\n" for ref, sha in remote.items() if local.get(ref) != sha]
        notes = "refs/notes/argus"
        if not self.repo_has(notes) and self.repo_has(tracking_ref(notes)):
            # A fresh mirror starts from the published notes (each note is verified when read).
            updates.append(f"create {notes} {tracking_ref(notes)}\n")
        if not deletes and not updates:
            return
        if self._update_refs(deletes + updates):
            return
        # One transaction for all refs failed: a branch renamed from `a` to `a/b` cannot be
        # created before `a` is deleted. Deletes first, then the rest; what still fails is tried
        # alone (a bounded number per fetch) and logged, and holds back no other branch.
        failed = [group for group in (deletes, updates) if group and not self._update_refs(group)]
        singles = [command for group in failed for command in group]
        for command in singles[:MAX_SINGLE_REF_UPDATES]:
            self._update_refs([command], report=True)
        if len(singles) > MAX_SINGLE_REF_UPDATES:
            log.error("mirroring branches: %d ref updates not tried this fetch", len(singles) - MAX_SINGLE_REF_UPDATES)

    def _update_refs(self, commands: list[str], report: bool = False) -> bool:
        """One ``update-ref --stdin`` transaction; False when git refused it (logged if ``report``)."""
        done = git.probe(
            self.repo.path, "update-ref", "--stdin", input="".join(commands).encode("utf-8", "surrogateescape")
        )
        if done.returncode != 0 and report:
            log.error("mirroring %r failed: %s", commands[0].strip(), done.stderr.decode(errors="replace")[-300:])
        return done.returncode == 0

    def repo_has(self, ref: str) -> bool:
        return git.rev(self.repo.path, ref) is not None

    def push(self, refs: list[str]) -> bool:
        """Push argus's own ``refs`` to the remote, each replacing the remote's copy only if it
        is still what was last fetched (``--force-with-lease``); False when rejected (it moved)
        or when the remote does not answer in time. The tracking refs follow a successful push."""
        if self.local:
            return True
        leases = [f"--force-with-lease={ref}:{git.rev(self.repo.path, tracking_ref(ref)) or ''}" for ref in refs]
        try:
            pushed = git.probe(self.repo.path, "push", "--porcelain", *leases, "origin", *(f"{r}:{r}" for r in refs))
        except GitError:
            return False
        if pushed.returncode != 0:
            return False
        commands = "".join(f"update {tracking_ref(r)} {r}\n" for r in refs)
        git.probe(self.repo.path, "update-ref", "--stdin", input=commands.encode())
        return True


def open_source(url: str, cache_dir: str) -> RepoSource:
    """Open ``url`` (a path or a git URL). A remote is mirrored into ``cache_dir`` on first use.

    Raises SourceUnavailable when a local path is not a git repository or a clone fails.
    """
    if is_local(url):
        path = os.path.abspath(url)
        if git.probe(path, "rev-parse", "--git-dir").returncode != 0:
            raise SourceUnavailable(f"{redact_url(url)} is not a git repository")
        return RepoSource(url, GitRepo(path), local=True)
    mirror = os.path.join(cache_dir, hashlib.sha1(url.encode()).hexdigest()[:16] + ".git")
    if not os.path.isdir(mirror):
        os.makedirs(cache_dir, exist_ok=True)
        try:
            git.run(None, "clone", "--bare", "--quiet", url, mirror)
        except GitError as exc:
            why = redact(exc.stderr) if exc.stderr else str(exc)
            raise SourceUnavailable(f"cannot clone {redact_url(url)}: {why}") from exc
    source = RepoSource(url, GitRepo(mirror), local=False)
    source.fetch()
    return source
