"""Pull requests merged by a forge, with signing on: real git, real SSH keys, a simulated forge.

The "forge" is a local repository where pull-request branches are made with commits signed by
alice, by bob or by nobody, their heads published under ``refs/pull/<n>/head`` (as GitHub and
Gitea do), and merged into ``main`` the three ways a forge's button does (merge commit, squash,
rebase), each merge signed with the forge's own SSH key. The forge's key changes nothing by its
own authority: what deploys is what the owners signed.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from reconciler.errors import ConfigError
from reconciler.source.forge import MAX_PR_COMMITS
from reconciler.source.git import GitRepo
from reconciler.source.remote import open_source
from reconciler.source.signatures import SignatureVerifier, SigningPolicy, TrustedTree
from tests.support import git, ssh_key

T0 = 1767225600
PULLS = "refs/pull/*/head"


class Forge:
    """A repository with a forge's merge buttons."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.path = tmp / "repo"
        git(tmp, "init", "-q", "-b", "main", str(self.path))
        self.keys = {who: ssh_key(tmp, who) for who in ("root", "alice", "bob", "github")}
        self.signers = tmp / "allowed_signers"
        self.signers.write_text("".join(f"{who} {key}\n" for who, (_p, key) in self.keys.items()))
        self.n = 0
        self.pulls = 0
        self.pull_refs: str | None = PULLS
        self.pull_limit = 200
        self.write("users/alice/models/a.yaml", "a1")
        self.write("users/bob/models/b.yaml", "b1")
        self.write("cluster.yaml", "kind: Cluster\n")
        self.since = self.commit("history from before signing")

    def env(self) -> dict[str, str]:
        self.n += 1
        stamp = f"{T0 + self.n * 3600} +0000"
        return {
            "PATH": "/usr/bin:/bin",
            "HOME": str(self.tmp),
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@e",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@e",
            "GIT_AUTHOR_DATE": stamp,
            "GIT_COMMITTER_DATE": stamp,
        }

    def git(self, *args: str, signer: str | None = None) -> str:
        sign = ["-c", "gpg.format=ssh", "-c", f"user.signingkey={self.keys[signer][0]}"] if signer else []
        proc = subprocess.run(
            ["git", *sign, *args], cwd=self.path, capture_output=True, text=True, env=self.env(), check=False
        )
        assert proc.returncode == 0, f"git {' '.join(args)}: {proc.stdout}{proc.stderr}"
        return proc.stdout.strip()

    def write(self, rel: str, text: str) -> None:
        (self.path / rel).parent.mkdir(parents=True, exist_ok=True)
        (self.path / rel).write_text(text)

    def commit(self, message: str, signer: str | None = None) -> str:
        self.git("add", "-A")
        self.git("commit", "-q", "--allow-empty", *(["-S"] if signer else []), "-m", message, signer=signer)
        return self.git("rev-parse", "HEAD")

    def pull_request(self, *commits: tuple[str | None, dict[str, str]]) -> str:
        """A PR branch from main with ``commits`` ((signer, {path: content})); returns its head,
        published under refs/pull/<n>/head."""
        self.pulls += 1
        branch = f"pr{self.pulls}"
        self.git("checkout", "-q", "-b", branch, "main")
        for signer, changes in commits:
            for rel, text in changes.items():
                self.write(rel, text)
            self.commit(f"{branch}: {', '.join(changes)}", signer)
        head = self.git("rev-parse", "HEAD")
        self.git("update-ref", f"refs/pull/{self.pulls}/head", head)
        self.git("checkout", "-q", "main")
        return head

    def merge(self, head: str, signer: str = "github") -> str:
        self.git("merge", "-q", "--no-ff", "-S", "-m", "Merge pull request", head, signer=signer)
        return self.git("rev-parse", "HEAD")

    def squash(self, head: str, signer: str = "github") -> str:
        self.git("merge", "-q", "--squash", head)
        return self.commit("Squashed pull request", signer)

    def rebase(self, head: str, signer: str = "github") -> str:
        commits = self.git("rev-list", "--reverse", head, "--not", "main").split()
        for commit in commits:
            self.git("cherry-pick", "-S", commit, signer=signer)
        return self.git("rev-parse", "HEAD")

    def verifier(self) -> SignatureVerifier:
        policy = SigningPolicy(
            True,
            str(self.signers),
            ("root",),
            self.since,
            forge_signers=("github",),
            forge_pull_refs=self.pull_refs,
            forge_pull_limit=self.pull_limit,
        )
        return SignatureVerifier(GitRepo(str(self.path)), policy, str(self.tmp / "state" / "trust.json"))

    def tree(self) -> TrustedTree:
        v = self.verifier()
        return v.trusted(v.repo.resolve("HEAD"))

    def trusted(self) -> tuple[dict[str, str], list[str]]:
        tree = self.tree()
        assert tree.entries is not None
        blobs = {p: git(self.path, "cat-file", "blob", b).strip() for p, (_m, b) in tree.entries.items()}
        return blobs, [str(r) for r in tree.rejections]


@pytest.fixture
def forge(tmp_path: Path) -> Forge:
    return Forge(tmp_path)


MERGES = ("merge", "squash", "rebase")


def _land(forge: Forge, how: str, head: str) -> str:
    return {"merge": forge.merge, "squash": forge.squash, "rebase": forge.rebase}[how](head)


@pytest.mark.parametrize("how", MERGES)
def test_alices_signed_pull_request_deploys_however_it_is_merged(forge: Forge, how: str) -> None:
    head = forge.pull_request(("alice", {"users/alice/models/a.yaml": "a2"}), ("alice", {"users/alice/t.yaml": "t"}))
    _land(forge, how, head)
    files, rejected = forge.trusted()
    assert files["users/alice/models/a.yaml"] == "a2" and files["users/alice/t.yaml"] == "t"
    assert rejected == []


@pytest.mark.parametrize("how", MERGES)
def test_alices_pull_request_touching_bobs_files_deploys_only_alices_part(forge: Forge, how: str) -> None:
    """Acceptance is per path, as for any commit: alice's own change deploys, bob's file keeps
    its previous good version and the rejection names the pull-request commit."""
    head = forge.pull_request(("alice", {"users/alice/models/a.yaml": "a2", "users/bob/models/b.yaml": "by alice"}))
    landed = _land(forge, how, head)
    files, rejected = forge.trusted()
    assert files["users/alice/models/a.yaml"] == "a2"
    assert files["users/bob/models/b.yaml"] == "b1"
    assert len(rejected) == 1 and rejected[0].startswith(f"commit {landed[:12]}: users/bob/models/b.yaml: ")
    assert (
        f"PR commit {head[:12]} changes users/bob/models/b.yaml but is not signed by bob or an admin" in rejected[0]
        or f"rebased by github from PR commit {head[:12]}, which is not signed by bob or an admin" in rejected[0]
    )
    assert "(signed by alice)" in rejected[0]


@pytest.mark.parametrize("how", ["merge", "squash"])
def test_a_pull_request_with_an_unsigned_commit_does_not_deploy(forge: Forge, how: str) -> None:
    head = forge.pull_request(
        ("alice", {"users/alice/models/a.yaml": "a2"}), (None, {"users/alice/models/a.yaml": "a3 unsigned"})
    )
    _land(forge, how, head)
    files, rejected = forge.trusted()
    assert files["users/alice/models/a.yaml"] == "a1"
    assert rejected and all("not signed by a key in the allowed signers file" in r for r in rejected)
    assert f"PR commit {head[:12]} changes users/alice/models/a.yaml but is not signed" in rejected[0]


def test_a_rebase_deploys_the_signed_commits_of_a_partly_signed_pull_request(forge: Forge) -> None:
    """A rebase lands each pull-request commit as its own forge commit: each is judged alone,
    so the signed one deploys and the unsigned one after it is refused."""
    head = forge.pull_request(
        ("alice", {"users/alice/models/a.yaml": "a2"}), (None, {"users/alice/models/a.yaml": "a3 unsigned"})
    )
    forge.rebase(head)
    tree = forge.tree()
    assert tree.entries is not None
    assert git(forge.path, "cat-file", "blob", tree.entries["users/alice/models/a.yaml"][1]) == "a2"
    assert len(tree.rejections) == 1


def test_a_merge_with_content_of_the_forges_own_is_refused(forge: Forge) -> None:
    head = forge.pull_request(("alice", {"users/alice/models/a.yaml": "a2"}))
    # main moves on (alice, signed); the forge resolves the conflict itself and signs the merge.
    forge.write("users/alice/models/a.yaml", "a-main")
    forge.commit("alice on main", "alice")
    proc = subprocess.run(["git", "merge", "-q", "--no-ff", "--no-commit", head], cwd=forge.path, capture_output=True)
    assert proc.returncode != 0  # a conflict
    forge.write("users/alice/models/a.yaml", "resolved by the forge")
    merge = forge.commit("Merge pull request (conflict resolved in the web editor)", "github")
    files, rejected = forge.trusted()
    assert files["users/alice/models/a.yaml"] == "a-main"
    assert rejected == [
        f"commit {merge[:12]}: users/alice/models/a.yaml: merged by github, a forge, with content of its own: "
        f"users/alice/models/a.yaml differs from the pull request head {head[:12]} (a conflict resolved on the "
        "forge?): not applied"
    ]


def test_the_forge_key_alone_changes_nothing(forge: Forge) -> None:
    forge.write("users/alice/models/a.yaml", "the forge's own")
    forge.write("users/github/models/g.yaml", "its own folder")
    forge.write("cluster.yaml", "kind: Cluster\n# the forge's\n")
    commit = forge.commit("a forge-signed commit with no pull request behind it", "github")
    # Nor does a merge of a branch that brings nothing signed (the forge's own, published as a PR).
    forge.git("checkout", "-q", "-b", "forge-branch", "main~1")
    forge.write("users/bob/models/b.yaml", "the forge's branch")
    side = forge.commit("forge's branch", "github")
    forge.git("update-ref", "refs/pull/99/head", side)
    forge.git("checkout", "-q", "main")
    forge.merge(side)
    files, rejected = forge.trusted()
    assert files["users/alice/models/a.yaml"] == "a1" and files["users/bob/models/b.yaml"] == "b1"
    assert files["cluster.yaml"] == "kind: Cluster" and "users/github/models/g.yaml" not in files
    assert len(rejected) == 4
    assert (
        f"commit {commit[:12]}: cluster.yaml: signed by github, a forge, but none of the open pull-request heads"
        in rejected[0]
    )
    assert f"PR commit {side[:12]} changes users/bob/models/b.yaml but is not signed by bob or an admin" in rejected[3]
    assert "(signed by github)" in rejected[3]


@pytest.mark.parametrize("how", ["squash", "rebase"])
def test_the_matching_pull_request_is_found_among_others_within_the_limit(forge: Forge, how: str) -> None:
    """--forge-pull-limit bounds the heads holding the squashed content that are checked, in
    pull-request order (oldest first); heads holding other content do not count, nor do newer ones."""
    forge.pull_request((None, {"users/alice/models/a.yaml": "a2"}))  # the same change, unsigned, first
    alice = forge.pull_request(*(("alice", {"users/alice/models/a.yaml": v}) for v in ("a1.5", "a2")))
    forge.pull_request(("bob", {"users/bob/models/b.yaml": "b2"}))  # the newest, still open
    _land(forge, how, alice)  # a squash of two commits: no one patch, matched by content
    files, rejected = forge.trusted()
    assert files["users/alice/models/a.yaml"] == "a2" and rejected == []
    forge.pull_limit = 1  # only the first head holding a2 is checked: the unsigned one
    files, rejected = forge.trusted()
    if how == "rebase":  # a rebase is matched by patch among all heads' commits changing the file
        assert files["users/alice/models/a.yaml"] == "a2" and rejected == []
        return
    assert files["users/alice/models/a.yaml"] == "a1"
    assert len(rejected) == 1
    assert "is not signed by alice or an admin (not signed by a key in the allowed signers file)" in rejected[0]


def test_a_forge_commit_without_pull_refs_is_refused_with_the_way_out(forge: Forge) -> None:
    forge.pull_refs = None
    head = forge.pull_request(("alice", {"users/alice/models/a.yaml": "a2"}))
    forge.squash(head)
    files, rejected = forge.trusted()
    assert files["users/alice/models/a.yaml"] == "a1"
    assert "merge pull requests with a merge commit, or set --forge-pull-refs" in rejected[0]


@pytest.mark.parametrize("how", MERGES)
def test_cluster_yaml_through_a_pull_request_needs_admin_signed_commits(forge: Forge, how: str) -> None:
    alice = forge.pull_request(("alice", {"cluster.yaml": "kind: Cluster\n# alice's\n"}))
    _land(forge, how, alice)
    files, rejected = forge.trusted()
    assert files["cluster.yaml"] == "kind: Cluster" and "not signed by an admin (signed by alice)" in rejected[0]
    root = forge.pull_request(("root", {"cluster.yaml": "kind: Cluster\n# the admin's\n"}))
    _land(forge, how, root)
    files, _ = forge.trusted()
    assert files["cluster.yaml"] == "kind: Cluster\n# the admin's"


def test_a_merge_cannot_bring_back_an_old_version_the_pull_request_never_touched(forge: Forge) -> None:
    head = forge.pull_request(("alice", {"users/alice/models/a.yaml": "a2"}))
    forge.write("users/bob/models/b.yaml", "b2")
    forge.commit("bob on main", "bob")
    # The forge "merges" taking the PR head's whole tree: bob's newer file goes back to b1.
    forge.git("merge", "-q", "--no-ff", "--no-commit", "-s", "ours", head)
    forge.git("read-tree", "-u", "--reset", head)
    merge = forge.commit("Merge pull request", "github")
    files, rejected = forge.trusted()
    assert files["users/alice/models/a.yaml"] == "a2" and files["users/bob/models/b.yaml"] == "b2"
    assert rejected == [
        f"commit {merge[:12]}: users/bob/models/b.yaml: merged by github: no commit of the pull request "
        "changes users/bob/models/b.yaml: not applied"
    ]


def test_update_branch_on_the_forge_without_a_conflict_still_deploys(forge: Forge) -> None:
    head = forge.pull_request(("alice", {"users/alice/models/a.yaml": "a2"}))
    forge.write("users/bob/models/b.yaml", "b2")
    forge.commit("bob on main", "bob")
    # "Update branch": the forge merges main into the pull request's branch, signed by itself.
    forge.git("checkout", "-q", "pr1")
    forge.git("merge", "-q", "--no-ff", "-S", "-m", "Merge branch 'main' into pr1", "main", signer="github")
    head = forge.git("rev-parse", "HEAD")
    forge.git("update-ref", "refs/pull/1/head", head)
    forge.git("checkout", "-q", "main")
    forge.merge(head)
    files, rejected = forge.trusted()
    assert files["users/alice/models/a.yaml"] == "a2" and files["users/bob/models/b.yaml"] == "b2"
    assert rejected == []


def test_a_forge_merge_does_not_approve_a_prune(forge: Forge) -> None:
    head = forge.pull_request(("alice", {"users/alice/models/a.yaml": "a2"}))
    forge.git("merge", "-q", "--no-ff", "-S", "-m", "Merge\n\nArgus-Approve-Prune: yes", head, signer="github")
    assert forge.tree().approve_prune is False


def test_a_pull_request_past_the_commit_bound_is_refused(forge: Forge, monkeypatch: pytest.MonkeyPatch) -> None:
    import reconciler.source.forge as forge_module

    monkeypatch.setattr(forge_module, "MAX_PR_COMMITS", 2)
    head = forge.pull_request(*(("alice", {"users/alice/models/a.yaml": f"a{i}"}) for i in range(3)))
    forge.merge(head)
    files, rejected = forge.trusted()
    assert files["users/alice/models/a.yaml"] == "a1"
    assert "the pull request has more than 2 commits, which are not checked" in rejected[0]
    assert MAX_PR_COMMITS == 1000


def test_the_mirror_fetches_the_forges_pull_refs(forge: Forge, tmp_path: Path) -> None:
    """Through the daemon's source: a remote (file:// URL) mirrored with the pull refs, and its
    squash merge verified against them."""
    head = forge.pull_request(("alice", {"users/alice/models/a.yaml": "a2"}))
    forge.squash(head)
    source = open_source(f"file://{forge.path}", str(tmp_path / "cache"))
    policy = SigningPolicy(
        True, str(forge.signers), ("root",), forge.since, forge_signers=("github",), forge_pull_refs=PULLS
    )
    verifier = SignatureVerifier(source.repo, policy)
    commit = source.repo.resolve("refs/heads/main")
    assert verifier.trusted(commit).rejections  # the mirror has no pull refs yet
    source.pull_refs = PULLS
    source.fetch()
    assert git(source.repo.path, "rev-parse", "refs/pull/1/head").strip() == head
    verifier = SignatureVerifier(source.repo, policy)
    tree = verifier.trusted(commit)
    assert tree.rejections == [] and tree.entries is not None
    assert git(source.repo.path, "cat-file", "blob", tree.entries["users/alice/models/a.yaml"][1]) == "a2"


def test_forge_settings_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot also be an admin"):
        SigningPolicy(admins=("root",), forge_signers=("root",)).check()
    for bad in ("refs/heads/*", "pull/*/head", "refs/pull/*/*", "refs/notes/*", "refs/pull/head"):
        with pytest.raises(ConfigError, match="--forge-pull-refs"):
            SigningPolicy(forge_pull_refs=bad).check()
    SigningPolicy(forge_pull_refs="refs/merge-requests/*/head").check()
    SigningPolicy(forge_pull_refs=PULLS).check()


def test_cli_takes_the_forge_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from reconciler.cli import _signing, build_parser

    monkeypatch.setenv("ARGUS_FORGE_SIGNERS", "github, gitea")
    monkeypatch.setenv("ARGUS_FORGE_PULL_REFS", PULLS)
    signers = tmp_path / "s"
    signers.write_text("")
    args = build_parser().parse_args(
        [
            "reconcile",
            "--repo",
            str(tmp_path),
            "--require-signed-commits",
            "--allowed-signers",
            str(signers),
            "--forge-pull-limit",
            "50",
        ]
    )
    policy = _signing(args)
    assert policy.forge_signers == ("github", "gitea")
    assert policy.forge_pull_refs == PULLS and policy.forge_pull_limit == 50
    assert os.path.isabs(policy.allowed_signers or "")
