"""Signed-commit verification (like Flux's): which changes of the branch are trusted. I/O.

When ``cluster.yaml`` sets ``security.require_signed_commits``, every later commit on the
branch's first-parent history is checked with git's SSH signature support against the
repository's ``allowed_signers`` file (principals are user names):

- a change under ``users/<u>/`` needs a signature by ``<u>`` or by an admin;
- a change to ``cluster.yaml`` or to the allowed-signers file needs an admin.

Unverified changes are skipped: the trusted tree keeps the previous good version of those
files, and each rejection is reported. The allowed-signers file and the settings always
come from the trusted tree *before* the commit being checked, so a commit cannot approve
itself by adding its own key.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import dataclass, field

import yaml

from reconciler.source.git import GitRepo, git

Entry = tuple[str, str]  # (mode, blob)


@dataclass(frozen=True)
class Rejection:
    commit: str
    path: str
    reason: str

    def __str__(self) -> str:
        return f"commit {self.commit[:12]}: {self.path}: {self.reason}"


@dataclass
class _Settings:
    enabled: bool = False
    signers_path: str | None = None
    admins: tuple[str, ...] = ()


@dataclass
class TrustedTree:
    """The files (path -> (mode, blob)) that verified commits produced, up to ``head``."""

    head: str
    entries: dict[str, Entry] = field(default_factory=dict)
    rejections: list[Rejection] = field(default_factory=list)
    settings: _Settings = field(default_factory=_Settings)


def _settings(repo: GitRepo, entries: dict[str, Entry], previous: _Settings) -> _Settings:
    entry = entries.get("cluster.yaml")
    if entry is None:
        return _Settings()
    try:
        data = yaml.safe_load(git(repo.path, "cat-file", "blob", entry[1]))
        sec = (data or {}).get("security") or {}
        return _Settings(
            bool(sec.get("require_signed_commits")), sec.get("allowed_signers"), tuple(sec.get("admins") or ())
        )
    except (yaml.YAMLError, AttributeError, TypeError):
        return previous  # a broken cluster.yaml is not applied anyway; keep enforcing


class SignatureVerifier:
    """Computes the trusted tree of a branch head, incrementally across calls."""

    def __init__(self, repo: GitRepo) -> None:
        self.repo = repo
        self._last: TrustedTree | None = None

    def trusted(self, head: str) -> TrustedTree:
        """Return the trusted tree at ``head`` (every change accepted until signing is required)."""
        if self._last is not None and self._last.head == head:
            return self._last
        start: TrustedTree = TrustedTree(head="")
        if self._last is not None and self._is_ancestor(self._last.head, head):
            start = self._last
        rev_range = f"{start.head}..{head}" if start.head else head
        tree = TrustedTree(head, dict(start.entries), list(start.rejections), start.settings)
        # One process for the whole range: first-parent diffs of every commit, oldest first.
        out = git(
            self.repo.path,
            "log",
            "--first-parent",
            "--reverse",
            "--raw",
            "--no-renames",
            "--no-abbrev",
            "-z",
            "--format=%x01%H",
            rev_range,
        )
        commit = ""
        changes: list[tuple[str, Entry | None]] = []
        tokens = out.split(b"\0")
        i = 0
        while i < len(tokens):
            token = tokens[i].decode(errors="replace").lstrip("\n")
            if token.startswith("\x01"):
                if commit:
                    self._apply(tree, commit, changes)
                commit, changes = token[1:], []
            elif token.startswith(":") and i + 1 < len(tokens):
                _old_mode, new_mode, _old_blob, new_blob, status = token[1:].split()
                path = tokens[i + 1].decode(errors="replace")
                changes.append((path, None if status == "D" else (new_mode, new_blob)))
                i += 1
            i += 1
        if commit:
            self._apply(tree, commit, changes)
        tree.head = head
        self._last = tree
        return tree

    def _is_ancestor(self, a: str, b: str) -> bool:
        return (
            subprocess.run(
                ["git", "-C", self.repo.path, "merge-base", "--is-ancestor", a, b], capture_output=True
            ).returncode
            == 0
        )

    def _apply(self, tree: TrustedTree, commit: str, changes: list[tuple[str, Entry | None]]) -> None:
        # Every path is tracked (the allowed-signers file may be any path); only protected
        # ones need a signature.
        guarded = tree.settings.enabled and any(self._relevant(path, tree.settings) for path, _ in changes)
        signer = self._signer(commit, tree) if guarded else None
        for path, entry in changes:
            protected = guarded and self._relevant(path, tree.settings)
            why = self._refuse(path, signer, tree.settings) if protected else None
            if why is not None:
                tree.rejections.append(Rejection(commit, path, why))
                continue
            if entry is None:
                tree.entries.pop(path, None)
            else:
                tree.entries[path] = entry
        if any(path == "cluster.yaml" for path, _ in changes):
            tree.settings = _settings(self.repo, tree.entries, tree.settings)

    @staticmethod
    def _relevant(path: str, settings: _Settings) -> bool:
        return path.startswith("users/") or path == "cluster.yaml" or path == settings.signers_path

    @staticmethod
    def _refuse(path: str, signer: str | None, settings: _Settings) -> str | None:
        if signer is None:
            return "not signed by a key in the allowed signers file: not applied"
        if signer in settings.admins:
            return None
        if path.startswith("users/") and path.split("/")[1] == signer:
            return None
        owner = "an admin" if not path.startswith("users/") else f"{path.split('/')[1]} or an admin"
        return f"signed by {signer}, but only {owner} may change it: not applied"

    def _signer(self, commit: str, tree: TrustedTree) -> str | None:
        """The principal whose key signed ``commit`` (per the trusted allowed-signers file)."""
        entry = tree.entries.get(tree.settings.signers_path or "")
        if entry is None:
            return None
        content = git(self.repo.path, "cat-file", "blob", entry[1])
        with tempfile.NamedTemporaryFile("wb", suffix=".signers", delete=False) as fh:
            fh.write(content)
            signers = fh.name
        try:
            out = git(
                self.repo.path,
                "-c",
                f"gpg.ssh.allowedSignersFile={signers}",
                "log",
                "-1",
                "--format=%G?%x00%GS",
                commit,
            ).decode()
        finally:
            os.unlink(signers)
        status, _, principal = out.strip().partition("\0")
        return principal.strip() or None if status == "G" else None
