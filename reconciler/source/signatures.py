"""Signed-commit verification (like Flux's): which changes of the branch are trusted. I/O.

The policy is the daemon's, never the repository's (Flux keeps verification keys in the
cluster, Argo CD in its own ConfigMap): ``--require-signed-commits``, an allowed-signers
file *outside* the repository and the admins come from the daemon's configuration, so no
push can switch signing off or add its own key.

With signing required, every commit on the branch's first-parent history after the trust
start (``--signed-since``, or the root) is checked with git's SSH signature support against
that file (principals are user names):

- a change under ``users/<u>/`` needs a signature by ``<u>`` or by an admin;
- a change to ``cluster.yaml`` (or any other file) needs an admin;
- a commit signed by a forge principal (``--forge-signers``: GitHub, GitLab, Gitea merging a
  pull request) changes nothing by the forge's authority: each path it changes is accepted
  only when the pull request's commits that made that change are signed by the path's owner
  or an admin (:mod:`reconciler.source.forge`).

Unverified changes are skipped: the trusted tree keeps the previous good version of those
files, and each rejection is reported. Creation times (which name served models) and the
mass-deletion approval trailer come from verified commits only (never from a forge's commit:
its signature vouches for no trailer).

A new head that is not a descendant of the last applied one is a **history rewrite**
(a force-push). With signing required it is applied only when every commit since the last
common ancestor verifies *and* its net change (from the tree in force to the new one) is one
that the signer of the new head commit may make alone, with that head newer than the one it
replaces (:meth:`SignatureVerifier._rewrite_refused`); otherwise the last applied tree stays
in force. Without signing it
is applied and noted. The last applied head is kept in the daemon's state file, outside the
repository, so a restart cannot be used to forget it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from reconciler import git
from reconciler.errors import ConfigError, SourceUnavailable
from reconciler.source.forge import DEFAULT_PULL_LIMIT, ForgeJudge, may_change, owner_of, signers_file
from reconciler.source.git import APPROVE_TRAILER, GitRepo, decode_path

Entry = tuple[str, str]  # (mode, blob)


@dataclass(frozen=True)
class SigningPolicy:
    """The daemon's signing configuration (never read from the repository)."""

    required: bool = False
    allowed_signers: str | None = None  # a file outside the repository: `<principal> <ssh public key>` lines
    admins: tuple[str, ...] = ()
    since: str | None = None  # a commit the admin vouches for: its tree is trusted as it is
    # Forge principals (GitHub, GitLab, Gitea): they may change nothing by their own authority; their
    # merges deploy what the owners signed (reconciler.source.forge).
    forge_signers: tuple[str, ...] = ()
    forge_pull_refs: str | None = None  # e.g. refs/pull/*/head: where squashed/rebased PRs' signed commits are
    forge_pull_limit: int = DEFAULT_PULL_LIMIT

    def check(self) -> None:
        """Raises ConfigError when signing is required but cannot be verified, or when the forge
        settings are contradictory (a forge principal that is also an admin) or malformed."""
        both = sorted(set(self.forge_signers) & set(self.admins))
        if both:
            raise ConfigError(
                f"--forge-signers {','.join(both)}: a forge principal cannot also be an admin "
                "(it may change nothing by its own authority)"
            )
        if self.forge_pull_refs is not None:
            check_pull_refs(self.forge_pull_refs)
        if self.forge_pull_limit < 1:
            raise ConfigError(f"--forge-pull-limit must be at least 1, not {self.forge_pull_limit}")
        if not self.required:
            return
        if not self.allowed_signers:
            raise ConfigError("--require-signed-commits needs --allowed-signers FILE (a file outside the repository)")
        if not os.path.isfile(self.allowed_signers):
            raise ConfigError(f"allowed signers file {self.allowed_signers} does not exist")


def check_pull_refs(pattern: str) -> None:
    """Raises ConfigError unless ``pattern`` is a ref pattern with one ``*`` outside argus's and
    the branches' namespaces (``refs/pull/*/head``, ``refs/merge-requests/*/head``): the refs are
    fetched into the mirror under the same names, where they must not replace a branch."""
    reserved = ("refs/heads/", "refs/remotes/", "refs/notes/", "refs/argus/", "refs/tags/")
    if (
        not pattern.startswith("refs/")
        or pattern.count("*") != 1
        or pattern.startswith(reserved)
        or git.probe(None, "check-ref-format", "--refspec-pattern", pattern).returncode != 0
    ):
        raise ConfigError(
            f"--forge-pull-refs {pattern!r}: expected a ref pattern with one '*' outside refs/heads, "
            "refs/remotes, refs/notes, refs/tags and refs/argus (refs/pull/*/head for GitHub and Gitea, "
            "refs/merge-requests/*/head for GitLab)"
        )


@dataclass(frozen=True)
class Rejection:
    commit: str
    path: str
    reason: str

    def __str__(self) -> str:
        return f"commit {self.commit[:12]}: {self.path}: {self.reason}"


@dataclass
class TrustedTree:
    """What verified commits produced up to ``head``.

    ``entries`` (path -> (mode, blob)) is the tree to load, or None when signing is off (the
    commit's own tree is used). ``applied`` is the head whose tree is in force: ``head``, or
    the last applied head when a history rewrite was refused.
    """

    head: str
    applied: str
    entries: dict[str, Entry] | None = None
    rejections: list[Rejection] = field(default_factory=list)
    created: dict[str, int] = field(default_factory=dict)
    approve_prune: bool = False
    notes: list[str] = field(default_factory=list)
    verified: set[str] = field(default_factory=set)  # first-parent commits whose signature verified
    signers: dict[str, str] = field(default_factory=dict)  # verified commit -> its signer


class SignatureVerifier:
    """Computes the trusted tree of a branch head, incrementally across calls.

    ``state_file`` (in the daemon's state folder) remembers the last applied head across
    restarts, for history-rewrite detection.
    """

    def __init__(self, repo: GitRepo, policy: SigningPolicy | None = None, state_file: str | None = None) -> None:
        self.repo = repo
        self.policy = policy or SigningPolicy()
        self.state_file = state_file
        self._last: TrustedTree | None = None
        self._applied: str | None = self._read_state()
        p = self.policy
        self.forge = ForgeJudge(repo.path, p.admins, p.forge_signers, p.forge_pull_refs, p.forge_pull_limit)

    # -- public ---------------------------------------------------------------------------
    def trusted(self, head: str) -> TrustedTree:
        """Return the trusted tree at ``head``. Raises SourceUnavailable when git fails."""
        if self._last is not None and self._last.head == head:
            return self._last
        previous = self._applied
        rewrite = previous is not None and previous != head and not self._is_ancestor(previous, head)
        if not self.policy.required:
            tree = TrustedTree(head, head)
            if rewrite and previous is not None:
                tree.notes.append(
                    f"history rewritten: {head[:12]} is not a descendant of the last applied {previous[:12]}"
                    " (force-push); applied, as signing is not required"
                )
            self._remember(tree)
            return tree
        base_tree = self._last if self._last is not None and self._last.applied == self._last.head else None
        if base_tree is not None and (rewrite or not self._is_ancestor(base_tree.head, head)):
            base_tree = None
        tree = self._verify(head, base_tree)
        if rewrite:
            assert previous is not None
            base = self._merge_base(previous, head)
            since = f"{base[:12] if base else 'the root'}"
            since_base = self._first_parent(f"{base}..{head}" if base else head)
            bad = [str(r) for r in tree.rejections if r.commit in since_base]
            kept = self._verify(previous) if self._exists(previous) else None
            if not bad and kept is not None:
                why = self._rewrite_refused(previous, head, kept, tree)
                if why is not None:
                    bad.append(why)
            if bad and kept is None:
                # The tree in force cannot be rebuilt (its commit is gone): apply nothing, delete nothing.
                raise SourceUnavailable(
                    f"history rewritten: {head[:12]} replaces {previous[:12]}, which is no longer in the "
                    f"repository, and not every change since {since} is verified (first: {bad[0]}): not applied"
                )
            if bad and kept is not None:
                kept.head = head
                kept.approve_prune = False
                kept.notes.append(
                    f"history rewritten: not applied: {head[:12]} is not a descendant of the last applied "
                    f"{previous[:12]}, and not every change since {since} is verified (first: {bad[0]}); "
                    f"the tree of {previous[:12]} stays in force"
                )
                self._last = kept  # _applied stays `previous`
                return kept
            tree.notes.append(
                f"history rewritten: {head[:12]} replaces {previous[:12]}; every change since {since} "
                "is verified: applied"
            )
        self._remember(tree)
        return tree

    def _rewrite_refused(self, previous: str, head: str, kept: TrustedTree, tree: TrustedTree) -> str | None:
        """Why the rewrite from ``previous`` (whose trusted tree is ``kept``) to ``head`` (trusted
        tree ``tree``) is refused, or None when it is applied.

        Every new commit verifying is not enough: a rewrite also drops commits, and its new
        commits may come from anywhere (an admin's commit from an unmerged branch). The net
        change, from the tree in force to the new one, must be one that a single identity may
        make: the signer of the new head commit, the one commit whose signature covers the
        whole resulting history. An admin-signed head applies any net change; a user-signed
        head only changes under ``users/<user>/``. The head must also be newer (committer
        date, which the signature covers) than the head it replaces, so an old signed commit
        (an admin's stale branch, a rewind) cannot be replayed over newer work."""
        old, new = kept.entries or {}, tree.entries or {}
        changed = sorted(p for p in set(old) | set(new) if old.get(p) != new.get(p))
        if not changed:
            return None
        signer = self._signer(head, self._read_signers())
        if signer is None:
            return f"{changed[0]} changes, and the new head {head[:12]} is not signed by an allowed key"
        if self._committed_at(head) < self._committed_at(previous):
            return (
                f"{changed[0]} changes, and the new head {head[:12]} (signed by {signer}) is older than "
                f"the {previous[:12]} it replaces"
            )
        for path in changed:
            if self._refuse(path, signer) is not None:
                return f"{path} changes, and the new head is signed by {signer}, who may not change it alone"
        return None

    # -- verification ---------------------------------------------------------------------
    def _verify(self, head: str, base: TrustedTree | None = None) -> TrustedTree:
        """Walk first-parent history from the trust start (or from ``base``, an ancestor's
        trusted tree) to ``head``, keeping verified changes."""
        start = self.policy.since if self.policy.since and self._is_ancestor(self.policy.since, head) else None
        tree = TrustedTree(head, head, entries={})
        assert tree.entries is not None
        if base is not None and base.entries is not None:
            tree.entries = dict(base.entries)
            tree.created = dict(base.created)
            tree.rejections = list(base.rejections)
            tree.verified = set(base.verified)
            tree.signers = dict(base.signers)
            start = base.head
        elif start is not None:
            listing = git.run(self.repo.path, "ls-tree", "-r", "-z", "--full-tree", start)
            for record in listing.split(b"\0"):
                meta, _, path_b = record.partition(b"\t")
                if meta:
                    mode, _type, blob = meta.decode().split()
                    tree.entries[decode_path(path_b)] = (mode, blob)
            tree.created = {p: t for p, t in self.repo.created_times(start).items() if p in tree.entries}
        signers = self._read_signers()
        out = git.run(
            self.repo.path,
            "log",
            "--first-parent",
            "--reverse",
            "--raw",
            "--no-renames",
            "--no-abbrev",
            "-z",
            "--format=%x01%H %at %P",
            f"{start}..{head}" if start else head,
        )
        header: list[str] = []
        changes: list[tuple[str, Entry | None]] = []
        tokens = out.split(b"\0")
        i = 0
        while i < len(tokens):
            raw = tokens[i].lstrip(b"\n")
            if raw.startswith(b"\x01"):
                if header:
                    self._apply(tree, header, changes, signers)
                header, changes = raw[1:].decode().split(), []
            elif raw.startswith(b":") and i + 1 < len(tokens):
                _old_mode, new_mode, _old_blob, new_blob, status = raw[1:].decode().split()
                path = decode_path(tokens[i + 1])
                changes.append((path, None if status == "D" else (new_mode, new_blob)))
                i += 1
            i += 1
        if header:
            self._apply(tree, header, changes, signers)
        # An approval counts only from a verified head commit (a rejected one cannot approve), and
        # never from a forge's: its own signature vouches for nothing (the PR's trailer is not its).
        head_signer = self._signer(head, signers)
        tree.approve_prune = (
            head_signer is not None and head_signer not in self.policy.forge_signers and self._approves(head)
        )
        return tree

    def _apply(
        self, tree: TrustedTree, header: list[str], changes: list[tuple[str, Entry | None]], signers: bytes
    ) -> None:
        commit, author_time, parents = header[0], int(header[1]), header[2:]
        assert tree.entries is not None
        signer = self._signer(commit, signers) if changes else None
        if signer is not None:
            tree.verified.add(commit)
            tree.signers[commit] = signer
        forged: dict[str, str | None] = {}
        if signer is not None and signer in self.policy.forge_signers:
            paths = [p for p, _e in changes]
            in_force = {p: e[1] if (e := tree.entries.get(p)) else None for p in paths}
            forged = self.forge.judge(commit, parents, paths, signer, signers, in_force)
        added: list[str] = []
        for path, entry in changes:
            why = forged[path] if path in forged else self._refuse(path, signer)
            if why is not None:
                tree.rejections.append(Rejection(commit, path, why))
                continue
            if entry is None:
                tree.entries.pop(path, None)
                tree.created.pop(path, None)
            else:
                if path not in tree.entries:
                    added.append(path)
                tree.entries[path] = entry
        if added:
            times = self.repo.introduction_times(parents, added) if len(parents) > 1 else {}
            for path in added:
                tree.created[path] = times.get(path, author_time)

    def _refuse(self, path: str, signer: str | None) -> str | None:
        """Why ``signer`` may not change ``path`` by its own authority (None: it may)."""
        if signer is None:
            return "not signed by a key in the allowed signers file: not applied"
        if may_change(path, signer, self.policy.admins, self.policy.forge_signers):
            return None
        if signer in self.policy.forge_signers:
            return f"signed by {signer}, a forge, which may change nothing by its own authority: not applied"
        return f"signed by {signer}, but only {owner_of(path)} may change it: not applied"

    def _signer(self, commit: str, signers: bytes) -> str | None:
        """The principal whose key signed ``commit`` (per the daemon's allowed-signers file)."""
        with signers_file(signers) as path:
            out = git.run(
                self.repo.path, "-c", f"gpg.ssh.allowedSignersFile={path}", "log", "-1", "--format=%G?%x00%GS", commit
            ).decode(errors="replace")
        status, _, principal = out.strip().partition("\0")
        return (principal.strip() or None) if status == "G" else None

    def _read_signers(self) -> bytes:
        # Read on every verification: an admin adds a key without restarting the daemon.
        if not self.policy.allowed_signers:
            return b""
        try:
            with open(self.policy.allowed_signers, "rb") as fh:
                return fh.read()
        except OSError:
            return b""  # nothing verifies: every protected change is kept out, and reported

    def _approves(self, commit: str) -> bool:
        out = git.run(self.repo.path, "log", "-1", f"--format=%(trailers:key={APPROVE_TRAILER},valueonly)", commit)
        return out.decode(errors="replace").strip().lower() in {"yes", "true", "1"}

    # -- git helpers ----------------------------------------------------------------------
    def _is_ancestor(self, a: str, b: str) -> bool:
        return git.probe(self.repo.path, "merge-base", "--is-ancestor", a, b).returncode == 0

    def _merge_base(self, a: str, b: str) -> str | None:
        return git.text(self.repo.path, "merge-base", a, b, check=False) or None

    def _exists(self, commit: str) -> bool:
        return git.probe(self.repo.path, "cat-file", "-e", f"{commit}^{{commit}}").returncode == 0

    def _committed_at(self, commit: str) -> int:
        return int(git.run(self.repo.path, "log", "-1", "--format=%ct", commit).decode().strip() or 0)

    def _first_parent(self, rev_range: str) -> set[str]:
        return set(git.run(self.repo.path, "rev-list", "--first-parent", rev_range).decode().split())

    # -- state ----------------------------------------------------------------------------
    def _remember(self, tree: TrustedTree) -> None:
        self._last = tree
        if tree.applied != self._applied:
            self._applied = tree.applied
            self._write_state()

    def _read_state(self) -> str | None:
        if not self.state_file:
            return None
        try:
            with open(self.state_file, encoding="utf-8") as fh:
                value = json.load(fh).get("applied")
        except (OSError, ValueError, AttributeError):
            return None
        return value if isinstance(value, str) and len(value) in (40, 64) else None

    def _write_state(self) -> None:
        if not self.state_file or not self._applied:
            return
        os.makedirs(os.path.dirname(self.state_file) or ".", exist_ok=True)
        tmp = f"{self.state_file}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump({"applied": self._applied}, fh)
        os.replace(tmp, self.state_file)  # atomic: a crash leaves the old or the new head
