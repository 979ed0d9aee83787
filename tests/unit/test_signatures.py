"""Signed-commit verification with real keys (ssh-keygen) and real git signatures.

The policy is the daemon's (an allowed-signers file outside the repository, admins from its
configuration): these tests attack it from the repository side — unsigned and wrongly signed
changes, a push that edits cluster.yaml's security section, force-pushed history, forged
creation times and approvals.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from reconciler.errors import ConfigError
from reconciler.source.git import GitRepo
from reconciler.source.signatures import SignatureVerifier, SigningPolicy, TrustedTree
from tests.support import git, ssh_key

T0 = 1767225600


class Repo:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.path = tmp / "repo"
        git(tmp, "init", "-q", "-b", "main", str(self.path))
        self.keys = {who: ssh_key(tmp, who) for who in ("root", "carol", "mallory")}
        self.signers = tmp / "allowed_signers"  # outside the repository
        self.signers.write_text("".join(f"{who} {self.keys[who][1]}\n" for who in ("root", "carol")))
        self.state = tmp / "state" / "trust.json"
        self.since: str | None = None
        self.n = 0

    def write(self, rel: str, text: str) -> None:
        (self.path / rel).parent.mkdir(parents=True, exist_ok=True)
        (self.path / rel).write_text(text)

    def commit(self, message: str, signer: str | None = None, *, when: int | None = None) -> str:
        self.n += 1
        stamp = f"{when if when is not None else T0 + self.n * 3600} +0000"
        git(self.path, "add", "-A")
        args = ["-c", "gpg.format=ssh", "-c", f"user.signingkey={self.keys[signer][0]}"] if signer else []
        subprocess.run(
            ["git", *args, "commit", "-q", "--allow-empty", *(["-S"] if signer else []), "-m", message],
            cwd=self.path,
            check=True,
            capture_output=True,
            env={
                "PATH": "/usr/bin:/bin",
                "HOME": str(self.tmp),
                "GIT_AUTHOR_NAME": "t",
                "GIT_AUTHOR_EMAIL": "t@e",
                "GIT_COMMITTER_NAME": "t",
                "GIT_COMMITTER_EMAIL": "t@e",
                "GIT_AUTHOR_DATE": stamp,
                "GIT_COMMITTER_DATE": stamp,
            },
        )
        return git(self.path, "rev-parse", "HEAD").strip()

    def policy(self, required: bool = True) -> SigningPolicy:
        return SigningPolicy(required, str(self.signers), ("root",), self.since)

    def verifier(self, required: bool = True) -> SignatureVerifier:
        return SignatureVerifier(GitRepo(str(self.path)), self.policy(required), str(self.state))

    def tree(self, verifier: SignatureVerifier | None = None) -> TrustedTree:
        v = verifier or self.verifier()
        return v.trusted(v.repo.resolve("HEAD"))

    def trusted(self, verifier: SignatureVerifier | None = None) -> tuple[dict[str, str], list[str]]:
        tree = self.tree(verifier)
        assert tree.entries is not None
        blobs = {p: git(self.path, "cat-file", "blob", b).strip() for p, (_m, b) in tree.entries.items()}
        return blobs, [str(r) for r in tree.rejections]


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    r = Repo(tmp_path)
    r.write("users/carol/models/a.yaml", "v1")
    r.write("cluster.yaml", "kind: Cluster\n")
    r.since = r.commit("history from before signing: the admin vouches for this tree")
    return r


def test_owner_signed_change_is_applied(repo: Repo) -> None:
    repo.write("users/carol/models/a.yaml", "v2")
    repo.commit("carol", "carol")
    files, rejected = repo.trusted()
    assert files["users/carol/models/a.yaml"] == "v2" and rejected == []


def test_unsigned_change_keeps_the_previous_good_version(repo: Repo) -> None:
    repo.write("users/carol/models/a.yaml", "evil")
    sha = repo.commit("unsigned")
    files, rejected = repo.trusted()
    assert files["users/carol/models/a.yaml"] == "v1"
    assert rejected == [
        f"commit {sha[:12]}: users/carol/models/a.yaml: not signed by a key in the allowed signers file: not applied"
    ]


def test_unknown_key_and_other_users_files(repo: Repo) -> None:
    repo.write("users/carol/models/a.yaml", "mallory")
    repo.commit("mallory's key is not allowed", "mallory")
    repo.write("users/bob/models/b.yaml", "carol writes bob's")
    repo.commit("carol touches bob", "carol")
    files, rejected = repo.trusted()
    assert files["users/carol/models/a.yaml"] == "v1"
    assert "users/bob/models/b.yaml" not in files
    assert "not signed by a key" in rejected[0]
    assert "signed by carol, but only bob or an admin may change it" in rejected[1]


def test_the_repository_cannot_switch_signing_off(repo: Repo) -> None:
    # The old policy lived in cluster.yaml and the allowed-signers file in the repository: a
    # commit that rewrote them was the way out. Neither is read any more.
    repo.write(
        "cluster.yaml", "kind: Cluster\nsecurity: {require_signed_commits: false, allowed_signers: .argus/mine}\n"
    )
    repo.write(".argus/mine", f"carol {repo.keys['mallory'][1]}\n")
    repo.commit("carol tries to switch signing off", "carol")
    repo.write("users/carol/models/a.yaml", "signed by mallory's key, claimed as carol")
    repo.commit("mallory", "mallory")
    files, rejected = repo.trusted()
    assert files["cluster.yaml"] == "kind: Cluster"
    assert ".argus/mine" not in files
    assert files["users/carol/models/a.yaml"] == "v1"
    assert len(rejected) == 3
    repo.write("users/bob/models/b.yaml", "root may")
    repo.commit("admin", "root")
    files, _ = repo.trusted()
    assert files["users/bob/models/b.yaml"] == "root may"


def test_a_key_added_to_the_daemons_file_counts_without_a_restart(repo: Repo) -> None:
    verifier = repo.verifier()
    repo.write("users/mallory/models/m.yaml", "m")
    repo.commit("mallory, not yet allowed", "mallory")
    assert "users/mallory/models/m.yaml" not in repo.trusted(verifier)[0]
    with repo.signers.open("a") as fh:
        fh.write(f"mallory {repo.keys['mallory'][1]}\n")
    repo.write("users/mallory/models/m.yaml", "m2")
    repo.commit("mallory, allowed now", "mallory")
    assert repo.trusted(verifier)[0]["users/mallory/models/m.yaml"] == "m2"


def test_unsigned_force_push_keeps_the_verified_tree_also_after_a_restart(repo: Repo) -> None:
    repo.write("users/carol/models/a.yaml", "v2")
    good = repo.commit("carol", "carol")
    assert repo.trusted()[0]["users/carol/models/a.yaml"] == "v2"
    # An orphan commit replacing every user's files, force-pushed.
    git(repo.path, "checkout", "-q", "--orphan", "evil")
    git(repo.path, "rm", "-q", "-r", "-f", ".")
    repo.write("users/mallory/models/m.yaml", "m")
    repo.write("cluster.yaml", "kind: Cluster\n")
    evil = repo.commit("orphan")
    git(repo.path, "branch", "-q", "-f", "main", evil)
    for verifier in (repo.verifier(), repo.verifier()):  # the second one is a restarted daemon
        tree = repo.tree(verifier)
        assert tree.applied == good and tree.head == evil
        assert tree.entries is not None and "users/mallory/models/m.yaml" not in tree.entries
        assert any(n.startswith("history rewritten: not applied") for n in tree.notes)


def test_rewrite_whose_commits_all_verify_is_applied(repo: Repo) -> None:
    repo.write("users/carol/models/a.yaml", "v2")
    repo.commit("carol", "carol")
    repo.tree()
    git(repo.path, "reset", "-q", "--hard", "HEAD~1")
    repo.write("users/carol/models/a.yaml", "v3")
    new = repo.commit("carol amends", "carol")
    tree = repo.tree()
    assert tree.applied == new
    assert tree.entries is not None
    assert any("history rewritten" in n and "applied" in n and "not applied" not in n for n in tree.notes)


def test_without_signing_a_rewrite_is_applied_and_noted(repo: Repo) -> None:
    first = repo.tree(repo.verifier(required=False))
    assert first.entries is None  # the commit's own tree is used
    git(repo.path, "checkout", "-q", "--orphan", "other")
    repo.write("users/carol/models/b.yaml", "b")
    new = repo.commit("orphan")
    git(repo.path, "branch", "-q", "-f", "main", new)
    tree = repo.tree(repo.verifier(required=False))
    assert tree.applied == new
    assert any("history rewritten" in n and "signing is not required" in n for n in tree.notes)


def test_creation_times_and_approvals_come_from_verified_commits_only(repo: Repo) -> None:
    repo.write("users/carol/models/new.yaml", "n")
    repo.commit("carol adds a model", "carol", when=T0 + 100 * 3600)
    created = repo.tree().created["users/carol/models/new.yaml"]
    assert created == T0 + 100 * 3600
    # An unsigned delete + re-add would rename the model (new time): both commits are refused.
    git(repo.path, "rm", "-q", "users/carol/models/new.yaml")
    repo.commit("unsigned delete")
    repo.write("users/carol/models/new.yaml", "n")
    repo.commit("unsigned re-add", when=T0 + 200 * 3600)
    tree = repo.tree()
    assert tree.created["users/carol/models/new.yaml"] == created
    # The mass-deletion approval trailer of an unsigned head commit does not count ...
    repo.commit("approve\n\nArgus-Approve-Prune: yes")
    assert repo.tree().approve_prune is False
    # ... a verified one does.
    repo.commit("approve\n\nArgus-Approve-Prune: yes", "root")
    assert repo.tree().approve_prune is True


def test_misconfiguration_is_a_start_up_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="needs --allowed-signers"):
        SigningPolicy(required=True).check()
    with pytest.raises(ConfigError, match="does not exist"):
        SigningPolicy(required=True, allowed_signers=str(tmp_path / "missing")).check()
    SigningPolicy(required=False).check()


def test_cli_refuses_to_start_without_the_signers_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from reconciler.cli import main

    code = main(["reconcile", "--once", "--repo", str(tmp_path), "--require-signed-commits"])
    assert code == 1
    assert "--require-signed-commits needs --allowed-signers" in capsys.readouterr().err


def test_a_keyless_rewind_does_not_undo_other_users_changes(repo: Repo) -> None:
    repo.write("users/carol/models/a.yaml", "v2")
    old = repo.commit("carol", "carol")
    repo.write("users/carol/models/b.yaml", "b")
    good = repo.commit("carol adds b", "carol")
    assert repo.tree().applied == good
    git(repo.path, "reset", "-q", "--hard", old)  # a rewind: no new commit at all
    for verifier in (repo.verifier(), repo.verifier()):
        tree = repo.tree(verifier)
        assert tree.applied == good
        assert tree.entries is not None and "users/carol/models/b.yaml" in tree.entries
        assert any(n.startswith("history rewritten: not applied") for n in tree.notes)


def test_a_rewrite_signed_by_another_user_cannot_drop_carols_commits(repo: Repo) -> None:
    with repo.signers.open("a") as fh:
        fh.write(f"mallory {repo.keys['mallory'][1]}\n")
    repo.write("users/carol/models/b.yaml", "b")
    good = repo.commit("carol adds b", "carol")
    repo.tree()
    git(repo.path, "reset", "-q", "--hard", "HEAD~1")
    repo.write("users/mallory/models/m.yaml", "m")
    repo.commit("mallory's own, signed, with an approval\n\nArgus-Approve-Prune: yes", "mallory")
    tree = repo.tree()
    assert tree.applied == good and tree.approve_prune is False
    assert tree.entries is not None and "users/carol/models/b.yaml" in tree.entries
    assert "users/mallory/models/m.yaml" not in tree.entries
    # An admin can sign a rewrite that changes anyone's files.
    git(repo.path, "reset", "-q", "--hard", "HEAD~1")
    repo.write("cluster.yaml", "kind: Cluster\n# rewritten by the admin\n")
    admin = repo.commit("admin rewrites", "root")
    assert repo.tree().applied == admin


def test_an_unrelated_admin_commit_cannot_lend_its_rights_to_a_users_rewrite(repo: Repo) -> None:
    """The reported attack: an admin-signed commit from an unmerged branch plus mallory's own
    commit, force-pushed, deleted carol's models. Every new commit verifies and each one is
    within its signer's rights, but the net change is not one any single identity made."""
    with repo.signers.open("a") as fh:
        fh.write(f"mallory {repo.keys['mallory'][1]}\n")
    base = git(repo.path, "rev-parse", "HEAD").strip()
    git(repo.path, "checkout", "-q", "-b", "admin-wip")
    repo.write("cluster.yaml", "kind: Cluster\n# the admin's unmerged experiment\n")
    repo.commit("admin: try a setting", "root")
    git(repo.path, "checkout", "-q", "main")
    repo.write("users/carol/models/b.yaml", "b")
    good = repo.commit("carol adds b", "carol")
    assert repo.tree().applied == good
    # mallory: main := the admin's branch plus her own signed commit, force-pushed.
    git(repo.path, "reset", "-q", "--hard", "admin-wip")
    repo.write("users/mallory/models/m.yaml", "m")
    evil = repo.commit("mallory's own model", "mallory")
    assert git(repo.path, "merge-base", good, evil).strip() == base
    for verifier in (repo.verifier(), repo.verifier()):  # also after a restart
        tree = repo.tree(verifier)
        assert tree.applied == good and tree.head == evil
        assert tree.entries is not None
        assert "users/carol/models/b.yaml" in tree.entries
        assert "users/mallory/models/m.yaml" not in tree.entries
        note = next(n for n in tree.notes if n.startswith("history rewritten: not applied"))
        assert "signed by mallory, who may not change it alone" in note


def test_a_stale_admin_signed_head_cannot_be_replayed_over_newer_work(repo: Repo) -> None:
    git(repo.path, "checkout", "-q", "-b", "admin-wip")
    repo.write("cluster.yaml", "kind: Cluster\n# old experiment\n")
    stale = repo.commit("admin: old experiment", "root")
    git(repo.path, "checkout", "-q", "main")
    repo.write("users/carol/models/b.yaml", "b")
    good = repo.commit("carol adds b", "carol")
    assert repo.tree().applied == good
    git(repo.path, "reset", "-q", "--hard", stale)  # the admin's signed head, as it is
    tree = repo.tree()
    assert tree.applied == good
    assert tree.entries is not None and "users/carol/models/b.yaml" in tree.entries
    assert any("is older than" in n for n in tree.notes if n.startswith("history rewritten: not applied"))


def test_an_admin_signed_head_may_rewrite_the_whole_history(repo: Repo) -> None:
    repo.write("users/carol/models/b.yaml", "b")
    repo.commit("carol adds b", "carol")
    repo.tree()
    git(repo.path, "reset", "-q", "--hard", "HEAD~1")
    repo.write("users/carol/models/c.yaml", "c")
    repo.commit("carol's other change", "carol")
    repo.write("cluster.yaml", "kind: Cluster\n# the admin squashes and vouches for the result\n")
    head = repo.commit("admin: the rewritten history as a whole", "root")
    tree = repo.tree()
    assert tree.applied == head
    assert tree.entries is not None and "users/carol/models/b.yaml" not in tree.entries


def test_a_users_rewrite_of_her_own_history_that_drops_another_users_commit_is_refused(repo: Repo) -> None:
    repo.write("users/carol/models/b.yaml", "b")
    repo.commit("carol adds b", "carol")
    repo.write("cluster.yaml", "kind: Cluster\n# admin's change\n")
    good = repo.commit("admin edits cluster.yaml", "root")
    repo.tree()
    git(repo.path, "reset", "-q", "--hard", "HEAD~2")
    repo.write("users/carol/models/b.yaml", "b2")
    repo.commit("carol amends b, dropping the admin's commit", "carol")
    tree = repo.tree()
    assert tree.applied == good
    assert any("cluster.yaml changes" in n for n in tree.notes)
