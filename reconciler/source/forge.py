"""Pull-request merges made by a forge (GitHub, GitLab, Gitea): which of their changes the
owners signed. I/O (git), used by :mod:`reconciler.source.signatures`.

A forge principal (``--forge-signers``) is a key in the daemon's allowed-signers file that
may change **nothing** by its own authority: it is neither an admin nor a user. A commit it
signs carries changes that someone else signed, and each path it changes is accepted only
when the commits that made that change verify for the path under the normal rules (a
change under ``users/<u>/`` signed by ``<u>`` or an admin, anything else by an admin):

- **merge commit** (two parents): a path the merge changes (first parent -> merge) is
  accepted when the merge's content for it equals the pull-request head's (the second
  parent: the forge added nothing of its own, so a conflict resolved on the forge is
  refused) and every commit of the pull-request side (``merge^2 --not merge^1``) that
  changes the path verifies for it, at least one of them changing it, and their changes lead
  from the version in force (the first parent's) to the head's (a merge cannot bring back an
  old version of a file, which the first-parent diffs of merges inside the pull request and
  another pull request's signed commits would otherwise allow);
- **squash or rebase** (one parent): the owners' signatures are not on the branch, so the
  forge's pull-request refs (``--forge-pull-refs``) are searched: a path is accepted when a
  pull-request head ``H`` (not merged into the parent) has either a commit ``K``
  (``H --not parent``) with the same patch (:func:`patch_ids`: ``git patch-id --stable``'s,
  but whitespace counts) that verifies for the path, applied to the version in force (rebase),
  or the same content for the path, with every commit of ``H --not merge-base(parent, H)`` that
  changes the path verifying for it, at least one changing it, and their changes leading from
  the parent's version to the head's (squash);
- anything else a forge signs (an octopus merge, a root commit) is refused.

Acceptance is per path, as for every other commit: a pull request that changes the
author's own files and another user's without that user's signature deploys the author's
part only, and each refused path is reported with the commit and the reason.
Candidates are selected by what the forge commit changes, not by recency, so that a verdict does
not change as pull requests are opened (a verification from the trust start, after a restart or an
edited allowed-signers file, judges an old squash against today's refs): the refs are read in
pull-request order (``refs/pull/9/head`` before ``refs/pull/10/head``: the forge numbers them as they
are opened, whatever dates their commits carry), at most :data:`MAX_PULL_REFS`; the rebase twins are
searched among the pull-request commits changing a judged path only (:data:`MAX_PULL_COMMITS`,
newest first: commits elsewhere do not use up the bound); the squash candidates are the heads holding
the commit's content for a judged path (one object lookup for all heads), of which the first
``pull_limit`` (``--forge-pull-limit``) are checked. Every walk is bounded (also
:data:`MAX_PR_COMMITS` commits per pull request); a squash or rebase commit costs a constant number
of git runs for all heads (plus the candidate heads checked), and the verdicts are cached per commit
(and allowed-signers content) in a bounded cache (:data:`CACHE_SIZE`). What a flood still does:
more than :data:`MAX_PULL_COMMITS` commits changing the very file, dated newer, hide a rebase twin of
it; more than :data:`MAX_PULL_REFS` older pull-request refs, or ``pull_limit`` older pull requests
holding the very content, hide a pull request (both refused with the reason).
Signatures of pull-request commits (an ssh-keygen run each) are checked only for commits that
change a path being judged, each once per allowed-signers content (:data:`SIGNER_CACHE`).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from reconciler import git
from reconciler.source.git import decode_path

MAX_PR_COMMITS = 1000  # commits of one pull request looked at; past it, its changes are refused
MAX_PULL_COMMITS = 5000  # pull-request commits changing a judged path compared by patch with a rebased commit
MAX_PULL_REFS = 20000  # pull-request refs read (in pull-request order); past it, the newer ones are not searched
DEFAULT_PULL_LIMIT = 200  # pull-request heads holding a squashed path's content that are checked, oldest first
CACHE_SIZE = 256  # forge commits whose verdicts are kept
SIGNER_CACHE = 20000  # pull-request commits whose signers are kept

Verdict = dict[str, str | None]  # path -> why it is refused (None: accepted)


def owner_of(path: str) -> str:
    """Who may change ``path``, in words: ``"bob or an admin"`` or ``"an admin"``."""
    parts = path.split("/")
    return f"{parts[1]} or an admin" if path.startswith("users/") and len(parts) > 2 else "an admin"


def may_change(path: str, signer: str | None, admins: Iterable[str], forges: Iterable[str]) -> bool:
    """True when ``signer`` may change ``path`` by its own authority. A forge principal may
    change nothing (even a ``users/<forge>/`` folder); an admin anything; a user her folder."""
    if signer is None or signer in forges:
        return False
    if signer in admins:
        return True
    parts = path.split("/")
    return path.startswith("users/") and len(parts) > 2 and parts[1] == signer


def patch_ids(log: bytes) -> dict[str, str]:
    """commit -> the patch id of each commit of ``log`` (``git log -p --format="commit %H"``
    output) that changes something. Like ``git patch-id --stable`` (line numbers, ``index``
    lines and the order of the files do not count), but whitespace counts, as YAML indentation
    does (``--stable`` strips it; ``--verbatim`` keeps it but needs git 2.39)."""
    files: dict[str, list[bytes]] = {}  # commit -> the digest of each file's diff
    commit: list[bytes] | None = None
    diff: list[bytes] | None = None  # the lines of the file diff being read
    for line in [*log.split(b"\n"), b"commit "]:  # a last header closes the last diff
        if line.startswith((b"commit ", b"diff --git ")) and diff is not None and commit is not None:
            commit.append(hashlib.sha256(b"\n".join(diff)).digest())
            diff = None
        if line.startswith(b"commit "):
            commit = files.setdefault(line[7:].strip().decode(), [])
        elif line.startswith(b"diff --git ") and commit is not None:
            diff = [line]
        elif diff is not None and line and not line.startswith(b"index "):
            diff.append(b"@@" if line.startswith(b"@@") else line)  # content lines start with " ", "+" or "-"
    return {c: hashlib.sha256(b"".join(sorted(d))).hexdigest() for c, d in files.items() if d}


@contextmanager
def signers_file(signers: bytes) -> Iterator[str]:
    """A temporary copy of the allowed-signers file (what git reads); yields its path."""
    with tempfile.NamedTemporaryFile("wb", suffix=".signers", delete=False) as fh:
        fh.write(signers)
        path = fh.name
    try:
        yield path
    finally:
        os.unlink(path)


@dataclass(frozen=True)
class PrCommit:
    """A commit of a pull request: its id, the principal whose key signed it (None: no good
    signature by an allowed key) and the paths it changes (merges: against the first parent),
    each with the object ids before and after the change (None: absent), and its parents."""

    sha: str
    signer: str | None
    made: dict[str, tuple[str | None, str | None]]
    parents: tuple[str, ...] = ()

    @property
    def paths(self) -> frozenset[str]:
        """The paths the commit changes."""
        return frozenset(self.made)


class ForgeJudge:
    """Judges the changes of commits signed by a forge principal (see the module docstring)."""

    def __init__(
        self,
        repo: str,
        admins: tuple[str, ...],
        forges: tuple[str, ...],
        pull_refs: str | None = None,
        pull_limit: int = DEFAULT_PULL_LIMIT,
    ) -> None:
        self.repo = repo
        self.admins = admins
        self.forges = forges
        self.pull_refs = pull_refs
        self.pull_limit = pull_limit
        self._cache: OrderedDict[tuple[str, str], Verdict] = OrderedDict()
        self._signed: OrderedDict[tuple[str, str], str | None] = OrderedDict()  # (commit, signers) -> signer

    def judge(
        self,
        commit: str,
        parents: list[str],
        paths: list[str],
        forge: str,
        signers: bytes,
        in_force: dict[str, str | None] | None = None,
    ) -> Verdict:
        """path -> None (accepted) or why the change of ``path`` by ``commit`` (signed by the
        forge principal ``forge``) is refused. ``in_force``: path -> the object id of the trusted
        version before ``commit`` (None: absent; the verdict of a commit is cached, and its
        trusted history is the same each time); without it, the parent's. Raises GitError when
        git fails."""
        key = (commit, hashlib.sha256(signers).hexdigest())  # a key added to the file may change the verdict
        cached = self._cache.get(key)
        if cached is not None and set(cached) >= set(paths):
            self._cache.move_to_end(key)
            return {p: cached[p] for p in paths}
        if len(parents) == 2:
            verdict = self._merge(commit, parents[0], parents[1], paths, forge, signers)
        elif len(parents) == 1:
            verdict = self._rewritten(commit, parents[0], paths, forge, signers, in_force)
        else:
            what = "an octopus merge" if parents else "a root commit"
            why = f"signed by {forge}, a forge, but {what}: nothing of it was signed by its owners: not applied"
            verdict = dict.fromkeys(paths, why)
        self._cache[key] = verdict
        while len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        return verdict

    # -- merge commits ----------------------------------------------------------------------
    def _merge(self, merge: str, base: str, head: str, paths: list[str], forge: str, signers: bytes) -> Verdict:
        own = self._differs(head, merge)
        commits = self._pr_commits(signers, paths, head, "--not", base)
        kept = [p for p in paths if p not in own]
        content = self._objects([(c, p) for p in kept for c in (base, head)]) if commits is not None else {}
        verdict: Verdict = {}
        for path in paths:
            if path in own:
                verdict[path] = (
                    f"merged by {forge}, a forge, with content of its own: {path} differs from the pull "
                    f"request head {head[:12]} (a conflict resolved on the forge?): not applied"
                )
            elif commits is None:
                verdict[path] = (
                    f"merged by {forge}: the pull request has more than {MAX_PR_COMMITS} commits, "
                    "which are not checked: not applied"
                )
            else:
                why = self._owners(path, commits, content[(base, path)], content[(head, path)])
                verdict[path] = None if why is None else f"merged by {forge}: {why}: not applied"
        return verdict

    # -- squash and rebase ------------------------------------------------------------------
    def _rewritten(
        self,
        commit: str,
        parent: str,
        paths: list[str],
        forge: str,
        signers: bytes,
        in_force: dict[str, str | None] | None,
    ) -> Verdict:
        """A forge commit with one parent: each path is accepted when a pull-request head holds the
        owners' signed version of the change (same patch: rebase; same content: squash).

        A constant number of git runs for all pull-request heads (one patch-id pass over their
        commits, one object lookup of the paths in every head); only heads that match cost more."""
        if not self.pull_refs:
            refused = (
                f"signed by {forge}, a forge, and not a merge commit (a squash or rebase merge: the owners' "
                "signatures are not on the branch); merge pull requests with a merge commit, or set "
                "--forge-pull-refs so that the signed pull-request commits can be found: not applied"
            )
            return dict.fromkeys(paths, refused)
        heads, more = self._pull_heads(parent)
        heads = [h for h in heads if h != commit]
        searched = f"the first {MAX_PULL_REFS} (more are not searched)" if more else "the"
        verdict: Verdict = dict.fromkeys(
            paths,
            f"signed by {forge}, a forge, but none of {searched} open pull-request heads ({self.pull_refs}) "
            "has this patch, or this content with signed commits: not applied",
        )
        specific: set[str] = set()  # paths whose reason names a pull request that brought the change
        todo = set(paths)
        if not heads:
            return verdict
        # Rebase: a pull-request commit (not on the branch yet) with the same patch, signed for the path.
        # Only commits changing one of the paths can have the patch: a pull request's commits elsewhere
        # (however many, however new) do not use up the bound.
        patch = self._patch_ids([commit], parent, paths).get(commit)
        twins = [k for k, pid in self._patch_ids(heads, parent, paths).items() if pid == patch and k != commit]
        signer_of = self._signers(signers, twins) if patch is not None and twins else {}
        # The same patch vouches for the change, not for the rest of the file it lands in: the commit's
        # whole new version deploys, so the version it was applied to must be the one in force (not
        # a refused change's, whose lines the owner's patch would carry along).
        before = self._objects([(parent, p) for p in todo]) if twins and in_force is not None else {}
        for path in sorted(todo):
            signed = [k for k in twins if may_change(path, signer_of.get(k), self.admins, self.forges)]
            if signed and in_force is not None and before[(parent, path)] != in_force.get(path):
                verdict[path] = (
                    f"rebased by {forge} from PR commit {signed[0][:12]}, but onto a version of {path} that "
                    "is not the one in force (a refused change before it): not applied"
                )
                specific.add(path)
            elif signed:
                verdict[path] = None
                todo.discard(path)
            elif twins:
                unsigned = self._unsigned(path, signer_of.get(twins[0]))
                verdict[path] = f"rebased by {forge} from PR commit {twins[0][:12]}, which {unsigned}: not applied"
                specific.add(path)
        # Squash: a head with the commit's content for the path, every pull-request commit changing it signed.
        if todo:
            mine = self._objects([(c, p) for p in todo for c in (commit, parent)])
            # One lookup of the paths in every head (cheap for thousands): only heads holding the
            # commit's content for a path are candidates, and the per-head bound applies to them, in
            # pull-request order (a pull request opened later, however new its dates, comes after).
            theirs = self._objects([(h, p) for h in heads for p in todo])
            candidates = [h for h in heads if any(theirs[(h, p)] == mine[(commit, p)] for p in todo)]
            for n, head in enumerate(candidates):
                if n == self.pull_limit:
                    rest = {p for h in candidates[n:] for p in todo if theirs[(h, p)] == mine[(commit, p)]}
                    for path in rest - specific:
                        verdict[path] = (
                            f"signed by {forge}, a forge, but none of the first {self.pull_limit} pull-request "
                            f"heads ({self.pull_refs}) holding its content for {path} has signed commits "
                            "bringing it (later ones, which hold it too, are not checked: --forge-pull-limit): "
                            "not applied"
                        )
                    break
                same = [p for p in sorted(todo) if theirs[(head, p)] == mine[(commit, p)]]
                if same:
                    differs = self._differs(commit, head)  # also compares modes
                    same = [p for p in same if p not in differs]
                if not same:
                    continue
                fork = git.text(self.repo, "merge-base", parent, head, check=False)
                commits = self._pr_commits(signers, same, head, *(["--not", fork] if fork else []))
                for path in same:
                    why: str | None
                    if commits is None:
                        why = f"the pull request {head[:12]} has more than {MAX_PR_COMMITS} commits"
                    elif not any(path in k.paths for k in commits):
                        continue  # this pull request did not bring the change: not its content to vouch for
                    else:
                        why = self._owners(path, commits, mine[(parent, path)], theirs[(head, path)])
                    if why is None:
                        verdict[path] = None
                        todo.discard(path)
                    elif path not in specific:
                        verdict[path] = f"squashed by {forge} from pull request head {head[:12]}: {why}: not applied"
                        specific.add(path)
                if not todo:
                    break
        return verdict

    def _pull_heads(self, parent: str) -> tuple[list[str], bool]:
        """The pull-request heads not merged into ``parent``, in pull-request order (refs sorted
        by version: ``refs/pull/9/head`` before ``refs/pull/10/head``; the forge numbers them as
        they are opened, so a newer pull request never comes before an older one, whatever
        dates its commits carry), at most :data:`MAX_PULL_REFS`; and whether there were more."""
        assert self.pull_refs is not None
        out = git.text(
            self.repo,
            "for-each-ref",
            "--sort=version:refname",
            f"--count={MAX_PULL_REFS + 1}",
            f"--no-merged={parent}",
            "--format=%(objectname)",
            self.pull_refs,
        ).split()
        return list(dict.fromkeys(out[:MAX_PULL_REFS])), len(out) > MAX_PULL_REFS

    def _patch_ids(self, heads: list[str], parent: str, paths: Iterable[str]) -> dict[str, str]:
        """commit -> patch id (:func:`patch_ids`, of the whole commit) of each non-merge commit of
        ``heads --not parent`` that changes one of ``paths`` (at most :data:`MAX_PULL_COMMITS`, newest
        first), in one git run (heads and paths on its input: thousands fit). {} when no path can
        be named (a path with a newline)."""
        named = [p for p in paths if "\n" not in p]
        if not named:
            return {}
        revs = "".join(f"{h}\n" for h in [*heads, f"^{parent}"])
        log = git.run(
            self.repo,
            "--literal-pathspecs",  # a path is a name, not a pattern
            "log",
            "--stdin",
            "--no-merges",
            "--full-history",  # a commit behind a merge that kept the other side is still found
            "--full-diff",  # the patch of the whole commit, not of the paths
            f"--max-count={MAX_PULL_COMMITS}",
            "-p",
            "--text",  # a `-diff` or `binary` attribute must not turn two changes into the same line
            "--no-textconv",
            "--no-renames",
            "--no-color",
            "--no-ext-diff",
            "--format=commit %H",
            input=(revs + "--\n" + "".join(f"{p}\n" for p in named)).encode("utf-8", "surrogateescape"),
        )
        return patch_ids(log)

    def _objects(self, wanted: list[tuple[str, str]]) -> dict[tuple[str, str], str | None]:
        """(commit, path) -> the object id at that path (None: absent), in one ``cat-file --batch-check``.
        A path with a newline (which the lookup cannot name) gets a value of its own per commit, so it
        is never found equal in two commits."""
        names = [(c, p) for c, p in wanted if "\n" not in p]
        found: dict[tuple[str, str], str | None] = {(c, p): f"\n{c}" for c, p in wanted if "\n" in p}
        if names:
            request = "".join(f"{c}:{p}\n" for c, p in names).encode("utf-8", "surrogateescape")
            out = git.run(self.repo, "cat-file", "--batch-check=%(objectname)", input=request).decode()
            for key, line in zip(names, out.splitlines(), strict=True):
                found[key] = None if line.endswith(" missing") else line.strip()
        return found

    # -- shared -----------------------------------------------------------------------------
    def _owners(self, path: str, commits: list[PrCommit], start: str | None, content: str | None) -> str | None:
        """Why taking ``path`` from the version in force (object id ``start``, None: absent) to
        the pull-request head's (``content``) is not a change its owners made (None: it is)."""
        touching = [k for k in commits if path in k.paths]
        if not touching:
            return f"no commit of the pull request changes {path}"
        for k in reversed(touching):  # oldest first: the first bad commit is reported
            if not may_change(path, k.signer, self.admins, self.forges):
                return f"PR commit {k.sha[:12]} changes {path} but {self._unsigned(path, k.signer)}"
        # Signed commits changing the path are not enough: a merge in the pull request is judged on
        # its first-parent diff, so one keeping its first parent's (older) version over main's newer
        # one shows no change, and a signed commit of another (squashed, open) pull request changes
        # an old version. The owners' changes must lead from the version in force to the head's.
        steps = [k.made[path] for k in touching]
        # A signed merge in the pull request (the owner bringing main in) also changes the version
        # of its other parents into its own: the owner signed that result too.
        others = self._objects([(p, path) for k in touching for p in k.parents[1:]])
        steps += [(others[(p, path)], k.made[path][1]) for k in touching for p in k.parents[1:]]
        reached, todo = {start}, [start]
        while todo:
            here = todo.pop()
            for before, after in steps:
                if before == here and after not in reached:
                    reached.add(after)
                    todo.append(after)
        if content not in reached:
            return (
                f"the signed commits of the pull request changing {path} do not lead from its version "
                "in force to the head's (an older version brought back?)"
            )
        return None

    def _unsigned(self, path: str, signer: str | None) -> str:
        by = "is not signed by a key in the allowed signers file" if signer is None else f"is signed by {signer}"
        return f"is not signed by {owner_of(path)} ({by.removeprefix('is ')})"

    def _differs(self, a: str, b: str) -> set[str]:
        """Paths whose entry differs between commits ``a`` and ``b``."""
        out = git.run(self.repo, "diff-tree", "-r", "-z", "--no-renames", "--name-only", a, b)
        return {decode_path(p) for p in out.split(b"\0") if p}

    def _pr_commits(self, signers: bytes, paths: Iterable[str], *revs: str) -> list[PrCommit] | None:
        """The commits of ``revs`` (newest first) with their changed paths and, for those that
        change one of ``paths``, their signers (the others': None); None when there are more than
        :data:`MAX_PR_COMMITS`.

        Signatures (one ssh-keygen run each) are checked only where they matter, and each commit's
        once per allowed-signers content (:data:`SIGNER_CACHE`): pull requests sharing one long
        chain of signed commits would otherwise cost a check of every commit for every head."""
        out = git.run(
            self.repo,
            "log",
            f"--max-count={MAX_PR_COMMITS + 1}",
            "--raw",
            "--no-renames",
            "--no-abbrev",
            "-z",
            "--diff-merges=first-parent",
            "--format=%x01%H%x02%P",
            *revs,
        )
        commits: list[tuple[str, dict[str, tuple[str | None, str | None]], tuple[str, ...]]] = []
        tokens = out.split(b"\0")
        i = 0
        while i < len(tokens):
            raw = tokens[i].lstrip(b"\n")
            if raw.startswith(b"\x01"):
                sha, _, parents = raw[1:].decode(errors="replace").partition("\x02")
                commits.append((sha, {}, tuple(parents.split())))
            elif raw.startswith(b":") and i + 1 < len(tokens) and commits:
                _old_mode, _new_mode, old, new, change = raw[1:].decode().split()
                before = None if change == "A" else old
                commits[-1][1][decode_path(tokens[i + 1])] = (before, None if change == "D" else new)
                i += 1
            i += 1
        if len(commits) > MAX_PR_COMMITS:
            return None
        wanted = set(paths)
        key = hashlib.sha256(signers).hexdigest()
        checked = [sha for sha, made, _p in commits if wanted & set(made)]
        unknown = [sha for sha in checked if (sha, key) not in self._signed]
        if unknown:
            for sha, signer in self._signers(signers, unknown).items():
                self._signed[(sha, key)] = signer
        signer_of: dict[str, str | None] = {}
        for sha in checked:
            signer_of[sha] = self._signed.get((sha, key))
            if (sha, key) in self._signed:
                self._signed.move_to_end((sha, key))
        while len(self._signed) > SIGNER_CACHE:
            self._signed.popitem(last=False)
        return [PrCommit(sha, signer_of.get(sha), made, parents) for sha, made, parents in commits]

    def _signers(self, signers: bytes, commits: list[str]) -> dict[str, str | None]:
        """commit -> the principal whose key signed it (None: no good signature by an allowed key)."""
        with signers_file(signers) as path:
            out = git.run(
                self.repo,
                "-c",
                f"gpg.ssh.allowedSignersFile={path}",
                "log",
                "--no-walk=unsorted",
                "--format=%H%x02%G?%x02%GS",
                *commits,
            ).decode(errors="replace")
        found: dict[str, str | None] = {}
        for line in out.splitlines():
            sha, status, principal = [*line.split("\x02"), "", ""][:3]
            found[sha] = (principal.strip() or None) if status == "G" else None
        return found
