"""Hostile pull requests against the forge-merge trust model (issue #32 item 1 review).

mallory has her own folder (users/mallory/), her own signing key, and can open pull requests,
push branches and pull-request refs and craft any commit; the forge (github) signs the merges,
squashes and rebases she gets through. Each test is one attempt to change users/bob/ or
cluster.yaml without bob's or an admin's signature (or to stop others' changes from
deploying); the oracle is the verifier's TrustedTree. The attempts under "brought back" and
"indentation" succeeded before the fix in reconciler/source/forge.py that came with this
file; one that still succeeds is ``xfail(strict=True)`` with the reason (it passes, and must
lose the mark, once fixed).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support import git, ssh_key
from tests.unit.test_forge_merges import Forge

B = "users/bob/models/b.yaml"
A = "users/alice/models/a.yaml"
M = "users/mallory/models/m.yaml"


class Mallory(Forge):
    """The simulated forge of test_forge_merges, with mallory's key in the allowed signers."""

    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp)
        self.keys["mallory"] = ssh_key(tmp, "mallory")
        self.signers.write_text("".join(f"{who} {key}\n" for who, (_p, key) in self.keys.items()))

    def publish(self, head: str) -> str:
        """Publishes ``head`` as a new pull request's ref (refs/pull/<n>/head); returns it."""
        self.pulls += 1
        self.git("update-ref", f"refs/pull/{self.pulls}/head", head)
        return head

    def blob(self, rev: str, path: str) -> str | None:
        proc = self.git("ls-tree", rev, "--", path)
        return git(self.path, "cat-file", "blob", proc.split()[2]).strip() if proc else None


@pytest.fixture
def forge(tmp_path: Path) -> Mallory:
    return Mallory(tmp_path)


def _land(forge: Forge, how: str, head: str) -> str:
    return {"merge": forge.merge, "squash": forge.squash, "rebase": forge.rebase}[how](head)


# -- attacks that are refused ---------------------------------------------------------------


@pytest.mark.parametrize("how", ["merge", "squash", "rebase"])
def test_mallory_deleting_bobs_file_in_her_pull_request_is_refused(forge: Mallory, how: str) -> None:
    forge.git("checkout", "-q", "-b", "evil", "main")
    forge.write(M, "m")
    forge.git("rm", "-q", B)
    head = forge.publish(forge.commit("my model, and bob's is gone", "mallory"))
    forge.git("checkout", "-q", "main")
    _land(forge, how, head)
    files, rejected = forge.trusted()
    assert files[B] == "b1" and files[M] == "m"
    assert len(rejected) == 1 and B in rejected[0] and "(signed by mallory)" in rejected[0]


@pytest.mark.parametrize("how", ["merge", "squash"])
def test_reverting_bobs_change_through_a_forge_merge_is_refused(forge: Mallory, how: str) -> None:
    forge.write(B, "b2")
    bobs = forge.commit("bob on main", "bob")
    forge.git("checkout", "-q", "-b", "evil", "main")
    forge.git("revert", "--no-edit", "-S", bobs, signer="mallory")
    head = forge.publish(forge.git("rev-parse", "HEAD"))
    forge.git("checkout", "-q", "main")
    _land(forge, how, head)
    files, rejected = forge.trusted()
    assert files[B] == "b2" and len(rejected) == 1 and "(signed by mallory)" in rejected[0]


@pytest.mark.parametrize("how", ["merge", "squash"])
def test_bobs_signed_commit_followed_by_mallorys_change_is_refused(forge: Mallory, how: str) -> None:
    """bob's signed commit taken from his own pull request, then mallory's edit of the same file:
    every pull-request commit changing the path must be bob's."""
    bobs = forge.pull_request(("bob", {B: "b2"}))
    forge.git("checkout", "-q", "-b", "evil", bobs)
    forge.write(B, "b2 + mallory's line")
    head = forge.publish(forge.commit("on top of bob's", "mallory"))
    forge.git("checkout", "-q", "main")
    _land(forge, how, head)
    files, _rejected = forge.trusted()
    assert files[B] == "b1"


def test_an_octopus_merge_by_the_forge_is_refused(forge: Mallory) -> None:
    one = forge.pull_request(("bob", {B: "b2"}))
    two = forge.pull_request(("mallory", {M: "m"}))
    forge.git("merge", "-q", "--no-ff", "-S", "-m", "octopus", one, two, signer="github")
    files, rejected = forge.trusted()
    assert files[B] == "b1" and M not in files and all("an octopus merge" in r for r in rejected)


def test_a_forge_commit_published_as_its_own_pull_request_does_not_vouch_for_itself(forge: Mallory) -> None:
    """The forge's squash commit (or a descendant of it) pushed as a pull-request head: its only
    commit changing the path is the forge's own, which changes nothing by its own authority."""
    forge.write(B, "forge's own")
    commit = forge.commit("forge commit", "github")
    forge.publish(commit)
    forge.git("checkout", "-q", "-b", "evil", commit)
    forge.write(M, "m")
    forge.publish(forge.commit("descendant", "mallory"))
    forge.git("checkout", "-q", "main")
    files, _rejected = forge.trusted()
    assert files[B] == "b1"


@pytest.mark.parametrize("how", ["squash", "rebase"])
def test_bobs_signed_change_moved_to_another_file_is_refused(forge: Mallory, how: str) -> None:
    """Same lines, another file (mallory's copy of bob's signed change into cluster.yaml's
    place): patch ids name the file, and the content check is per path."""
    forge.pull_request(("bob", {B: "kind: Cluster\n# bob's\n"}))
    forge.git("checkout", "-q", "-b", "evil", "main")
    forge.write("cluster.yaml", "kind: Cluster\n# bob's\n")
    head = forge.publish(forge.commit("cluster", "mallory"))
    forge.git("checkout", "-q", "main")
    _land(forge, how, head)
    files, _rejected = forge.trusted()
    assert files["cluster.yaml"] == "kind: Cluster"


# -- old versions brought back, whitespace (succeeded before the fix), pull-ref eviction -----


def _rollback_branch(forge: Mallory, path: str, witness_signer: str, main_version: str | None) -> str:
    """mallory's pull request that puts ``path`` back to its version at the trust start (or
    deletes it), with no commit of hers changing it on any first-parent diff:

    1. her branch starts at the trust start (``since``), where ``path`` has its old version;
    2. she merges a witness, any commit signed by the owner that changes ``path`` and is not on
       main (here the owner's open pull request), keeping her side for ``path``: the merge's
       first-parent diff does not show ``path``;
    3. she merges main (the owner's newer version), again keeping her side ("Update branch").
    The forge's merge (or squash) then changes ``path`` back to the old version, and the only
    pull-request commit whose first-parent diff changes ``path`` is the owner's witness."""
    if main_version is None:
        forge.write(path, "created on main by its owner")
    else:
        forge.write(path, main_version)
    forge.commit("the owner's newer version, on main", witness_signer)
    witness = forge.pull_request((witness_signer, {path: "the owner's draft, under review"}))
    forge.git("checkout", "-q", "-b", "evil", forge.since)
    forge.write(M, "m")
    mine = forge.commit("my model", "mallory")
    for other in (witness, "main"):
        forge.git("merge", "-q", "--no-ff", "--no-commit", "-s", "ours", other)
        forge.git("read-tree", "-u", "--reset", mine)  # her side of everything, the old `path`
        forge.commit(f"Merge {other}", "mallory")
    head = forge.publish(forge.git("rev-parse", "HEAD"))
    forge.git("checkout", "-q", "main")
    return head


@pytest.mark.parametrize("how", ["merge", "squash"])
@pytest.mark.parametrize(
    ("path", "owner", "main_version"),
    [
        (B, "bob", "b2"),
        ("cluster.yaml", "root", "kind: Cluster\n# admin's newer\n"),
        ("users/bob/new.yaml", "bob", None),
    ],
)
def test_rollback_of_bobs_file_or_cluster_yaml_via_a_witness_commit_is_refused(
    forge: Mallory, how: str, path: str, owner: str, main_version: str | None
) -> None:
    head = _rollback_branch(forge, path, owner, main_version)
    before = forge.blob("main", path)
    _land(forge, how, head)
    assert forge.blob("main", path) != before  # the forge's commit does change it
    files, rejected = forge.trusted()
    assert files.get(path) == before and files[M] == "m"
    assert len(rejected) == 1 and f": {path}: " in rejected[0]
    assert "do not lead from its version in force to the head's" in rejected[0]


def test_squash_replaying_an_old_version_bob_signed_in_a_squashed_pull_request_is_refused(forge: Mallory) -> None:
    """bob's two pull requests are squashed (b2, then b3); their signed commits stay in their
    refs, not merged into main. mallory's squash setting b2 again finds bob's first pull request
    with that content and bob's signature, but bob changed b1 to b2, not the b3 in force."""
    forge.squash(forge.pull_request(("bob", {B: "b2"})))
    forge.squash(forge.pull_request(("bob", {B: "b3"})))
    assert forge.trusted()[0][B] == "b3"
    forge.squash(forge.pull_request(("mallory", {M: "m", B: "b2"})))
    files, rejected = forge.trusted()
    assert files[M] == "m" and files[B] == "b3"
    assert len(rejected) == 1 and f": {B}: " in rejected[0]


def test_rebase_matching_bobs_patch_with_other_indentation_is_refused(forge: Mallory) -> None:
    """bob's open pull request adds two keys under ``resources``; mallory's rebased commit adds
    the same lines with ``replicas`` dedented (another meaning in YAML). patch-id --stable
    strips whitespace (bob's commit was taken as the signed twin); --verbatim does not."""
    forge.pull_request(("bob", {B: "b1\nresources:\n  gpus: 1\n  replicas: 2\n"}))
    evil = forge.pull_request(("mallory", {B: "b1\nresources:\n  gpus: 1\nreplicas: 2\n"}))
    forge.rebase(evil)
    files, rejected = forge.trusted()
    assert files[B] == "b1" and len(rejected) == 1


def test_newer_pull_requests_do_not_undo_a_deployed_squash_after_a_restart(forge: Mallory) -> None:
    """alice's squashed change deploys. mallory then opens ``pull_limit`` pull requests (their
    committer dates are hers to choose: newest forever). Every verification from the trust start
    (a restart, a new key in the allowed-signers file) judges alice's old squash against the
    newest refs only: her change is refused and her file goes back to the old version."""
    forge.pull_limit = 3
    forge.squash(forge.pull_request(("alice", {A: "a2"})))
    assert forge.trusted() == ({**forge.trusted()[0], A: "a2"}, [])
    for i in range(forge.pull_limit):
        forge.pull_request(("mallory", {M: f"spam {i}"}))
    files, rejected = forge.trusted()  # forge.trusted() starts a new verifier: a restart
    assert files[A] == "a2" and rejected == []


@pytest.mark.parametrize("how", ["merge", "squash"])
def test_bobs_superseded_signed_commit_brought_back_through_a_crafted_merge_is_refused(
    forge: Mallory, how: str
) -> None:
    """bob's first pull request (b2) was squashed, then his second (b3). mallory's branch holds
    bob's original b2 commit (from the first pull request's ref) and merges main keeping b2: the
    only commit whose first-parent diff changes b.yaml is bob's, but it changes b1, not b3."""
    first = forge.pull_request(("bob", {B: "b2"}))
    forge.squash(first)
    forge.squash(forge.pull_request(("bob", {B: "b3"})))
    forge.git("checkout", "-q", "-b", "evil", first)
    forge.write(M, "m")
    mine = forge.commit("my model", "mallory")
    forge.git("merge", "-q", "--no-ff", "--no-commit", "-s", "ours", "main")
    forge.git("read-tree", "-u", "--reset", mine)
    head = forge.publish(forge.commit("Merge main", "mallory"))
    forge.git("checkout", "-q", "main")
    _land(forge, how, head)
    assert forge.blob("main", B) == "b2"
    files, rejected = forge.trusted()
    assert files[B] == "b3" and files[M] == "m"
    assert len(rejected) == 1 and "do not lead from its version in force to the head's" in rejected[0]


@pytest.mark.parametrize("how", ["merge", "squash"])
def test_alice_merging_main_into_her_own_pull_request_deploys(forge: Mallory, how: str) -> None:
    """The honest case next to the attacks: alice brings main (with a newer signed version of her
    file) into her pull request with her own signed merge."""
    forge.write(A, "top\n\n\n\nbottom\n")
    forge.commit("alice's file, several lines", "alice")
    forge.pull_request(("alice", {A: "top, the branch's\n\n\n\nbottom\n"}))
    forge.write(A, "top\n\n\n\nbottom, main's\n")
    forge.commit("alice on main", "alice")
    forge.git("checkout", "-q", "pr1")
    forge.git("merge", "-q", "--no-ff", "-S", "-m", "Merge main", "main", signer="alice")
    head = forge.publish(forge.git("rev-parse", "HEAD"))
    forge.git("checkout", "-q", "main")
    _land(forge, how, head)
    files, rejected = forge.trusted()
    assert files[A] == forge.blob(head, A) and rejected == []


def test_one_long_pull_request_does_not_stop_rebased_pull_requests_from_deploying(
    forge: Mallory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mallory's one open pull request with MAX_PULL_COMMITS commits, newer than alice's (the
    dates are hers to choose): the patch-id pass over the pull requests' commits sees only hers,
    so alice's rebased, signed commits find no twin. The last one is still accepted by content
    (the head's version), but the one before it is refused: only the end state survives."""
    import reconciler.source.forge as forge_module

    monkeypatch.setattr(forge_module, "MAX_PULL_COMMITS", 3)
    alice = forge.pull_request(("alice", {A: "a2"}), ("alice", {A: "a3"}))
    forge.pull_request(*(("mallory", {M: f"m{i}"}) for i in range(3)))
    forge.rebase(alice)
    files, rejected = forge.trusted()
    assert files[A] == "a3" and rejected == []


def test_replace_refs_do_not_change_what_the_verifier_reads(forge: Mallory) -> None:
    """A replace ref (``git replace``: pushed to a server that allows it) swapping main's head for
    a commit of mallory's with bob's file changed: argus's git ignores refs/replace."""
    head = forge.git("rev-parse", "main")
    forge.git("checkout", "-q", "-b", "evil", "main")
    forge.write(B, "mallory's")
    evil = forge.commit("evil", "mallory")
    forge.git("checkout", "-q", "main")
    forge.git("replace", head, evil)
    files, _rejected = forge.trusted()
    assert files[B] == "b1"


@pytest.mark.parametrize("attributes", ["*.yaml -diff\n", "*.yaml binary\n"])
def test_gitattributes_in_the_checkout_do_not_make_patches_alike(forge: Mallory, attributes: str) -> None:
    """mallory's ``.gitattributes`` lands in main's tree through a forge merge (refused for the
    trusted tree, but checked out in a repository with a work tree, which is what git reads
    attributes from). With ``*.yaml -diff`` every change to a YAML file is "Binary files ...
    differ" in ``git log -p``, so all changes to one path would share a patch id: bob's open pull
    request's signed draft would vouch for mallory's rebased content."""
    forge.squash(forge.pull_request(("mallory", {".gitattributes": attributes, M: "m"})))
    assert (forge.path / ".gitattributes").read_text() == attributes
    forge.pull_request(("bob", {B: "bob's draft"}))
    forge.rebase(forge.pull_request(("mallory", {B: "mallory's"})))
    files, _rejected = forge.trusted()
    assert files[B] == "b1" and ".gitattributes" not in files


def test_a_rebase_onto_a_file_changed_above_the_patch_still_deploys(forge: Mallory) -> None:
    """The honest case next to the indentation attack: patch ids ignore line numbers, so alice's
    signed change rebased below lines added on main since is still her change."""
    forge.write(A, "one\ntwo\nthree\nfour\nfive\n")
    forge.commit("alice's file, several lines", "alice")
    alice = forge.pull_request(("alice", {A: "one\ntwo\nthree\nfour\nfive, alice's\n"}))
    forge.write(A, "zero\nzero again\none\ntwo\nthree\nfour\nfive\n")
    forge.commit("alice on main", "alice")
    forge.rebase(alice)
    assert forge.blob("main", A) == "zero\nzero again\none\ntwo\nthree\nfour\nfive, alice's"
    files, rejected = forge.trusted()
    assert files[A] == forge.blob("main", A) and rejected == []


@pytest.mark.parametrize("how", ["rebase", "squash"])
def test_a_signed_patch_replayed_on_a_version_never_in_force_does_not_carry_it(forge: Mallory, how: str) -> None:
    """mallory pushes her own line into bob's file on main (refused: the trusted file stays bob's,
    but git's has her line). bob's open pull request, made before, appends a line; mallory's
    pull request appends the same line to git's version: the same patch (line numbers do not
    count), so the forge's commit is bob's change, but its whole content, her line included,
    must not become the version in force."""
    forge.write(B, "l1\nl2\nl3\n")
    forge.commit("bob's file", "bob")
    forge.pull_request(("bob", {B: "l1\nl2\nl3\nl4\n"}))
    forge.write(B, "evil: mallory's\nl1\nl2\nl3\n")
    forge.commit("pushed to main, refused", "mallory")
    assert forge.trusted()[0][B] == "l1\nl2\nl3"
    _land(forge, how, forge.pull_request(("mallory", {B: "evil: mallory's\nl1\nl2\nl3\nl4\n"})))
    files, _rejected = forge.trusted()
    assert "evil" not in files[B]


def test_many_heads_sharing_one_long_signed_chain_do_not_multiply_signature_checks(
    forge: Mallory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mallory's pull requests share one chain of signed commits, each with its own tip setting
    alice's file to alice's squashed content unsigned (so each head matches by content and is
    refused, and the next one is tried). Every matching head ran ``git log`` over its whole
    pull request with signature checks (one ssh-keygen per signed commit): pull_limit x
    MAX_PR_COMMITS verifications per squash commit (200 x 1000 by default, minutes), again on
    every verification from the trust start (152 here). Now only commits changing the path are
    checked, each once. Counted with a real ssh-keygen behind a shim."""
    chain, heads = 12, 6
    alice = forge.pull_request(("alice", {A: "a1.5"}), ("alice", {A: "a2"}))  # no one patch: a squash
    forge.git("checkout", "-q", "-b", "spam", "main")
    for i in range(chain):
        forge.write(M, f"m{i}")
        forge.commit(f"spam {i}", "mallory")
    for i in range(heads):
        forge.git("checkout", "-q", "-b", f"tip{i}", "spam")
        forge.write(A, "a2")
        forge.write("users/mallory/tip", str(i))
        forge.publish(forge.commit(f"tip {i}"))
    forge.git("checkout", "-q", "main")
    forge.squash(alice)
    shim = tmp_path / "bin"
    shim.mkdir()
    calls = tmp_path / "calls"
    real = subprocess.run(["which", "ssh-keygen"], capture_output=True, text=True, check=True).stdout.strip()
    (shim / "ssh-keygen").write_text(f'#!/bin/sh\necho >> "{calls}"\nexec {real} "$@"\n')
    (shim / "ssh-keygen").chmod(0o755)
    monkeypatch.setenv("PATH", f"{shim}:{os.environ['PATH']}")
    files, rejected = forge.trusted()
    assert files[A] == "a2" and rejected == []
    verifications = len(calls.read_text().splitlines()) if calls.exists() else 0
    assert verifications <= chain + heads + 10, verifications


@pytest.mark.parametrize("how", ["merge", "squash"])
def test_bobs_open_draft_carried_in_mallorys_pull_request_deploys_as_documented(forge: Mallory, how: str) -> None:
    """The documented limit (security model, "What it does not cover"): a commit bob signed is
    bob's change wherever it comes from. mallory's pull request that carries bob's open draft
    (signed, changing the version in force) deploys it; reviews on the forge are what stop it."""
    draft = forge.pull_request(("bob", {B: "bob's draft, under review"}))
    forge.git("checkout", "-q", "-b", "evil", draft)
    forge.write(M, "m")
    head = forge.publish(forge.commit("my model, on top of bob's draft", "mallory"))
    forge.git("checkout", "-q", "main")
    _land(forge, how, head)
    files, rejected = forge.trusted()
    assert files[B] == "bob's draft, under review" and files[M] == "m" and rejected == []


def _spam(forge: Mallory, count: int) -> None:
    """``count`` pull requests of mallory's (one commit each, changing alice's file to content of
    her own), written in one ``git fast-import``."""
    base = forge.git("rev-parse", "main")
    stream = "".join(
        f"commit refs/pull/{1000 + i}/head\ncommitter m <m@e> {2_000_000_000 + i} +0000\ndata 4\nspam\n"
        f"from {base}\nM 100644 inline {A}\ndata {len(f'spam {i}')}\nspam {i}\n\n"
        for i in range(count)
    )
    subprocess.run(["git", "fast-import", "--quiet"], cwd=forge.path, input=stream.encode(), check=True)


def _git_runs(forge: Mallory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """The git runs of a verification from the trust start (a restart), counted by a shim."""
    shim = tmp_path / "gitbin"
    shim.mkdir(exist_ok=True)
    calls = tmp_path / "git-calls"
    calls.unlink(missing_ok=True)
    real = subprocess.run(["which", "git"], capture_output=True, text=True, check=True).stdout.strip()
    (shim / "git").write_text(f'#!/bin/sh\necho >> "{calls}"\nexec {real} "$@"\n')
    (shim / "git").chmod(0o755)
    with monkeypatch.context() as patch:
        patch.setenv("PATH", f"{shim}:{os.environ['PATH']}")
        files, rejected = forge.trusted()
    assert files[A] == "a3" and rejected == []
    return len(calls.read_text().splitlines())


@pytest.mark.parametrize("how", ["squash", "rebase"])
def test_many_pull_request_refs_cost_no_git_run_each(
    forge: Mallory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """The candidates are selected in one pass for all refs (an object lookup of the judged paths
    in every head; a patch-id log restricted to the judged paths): 300 more pull requests, newer
    and all changing alice's file, cost no git run more than none, and change no verdict."""
    _land(forge, how, forge.pull_request(("alice", {A: "a2"}), ("alice", {A: "a3"})))
    before = _git_runs(forge, tmp_path, monkeypatch)
    _spam(forge, 300)
    assert _git_runs(forge, tmp_path, monkeypatch) == before


def test_past_the_pull_ref_cap_newer_pull_requests_are_refused_with_the_reason(
    forge: Mallory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MAX_PULL_REFS bounds the refs read, in pull-request order: the older pull requests are
    still found (a verdict does not change as pull requests are opened), a newer one is refused
    and the reason says why."""
    import reconciler.source.forge as forge_module

    monkeypatch.setattr(forge_module, "MAX_PULL_REFS", 2)
    forge.squash(forge.pull_request(("alice", {A: "a1.5"}), ("alice", {A: "a2"})))
    forge.pull_request(("mallory", {M: "m"}))
    forge.squash(forge.pull_request(("bob", {B: "b1.5"}), ("bob", {B: "b2"})))
    files, rejected = forge.trusted()
    assert files[A] == "a2" and files[B] == "b1" and len(rejected) == 1
    assert "none of the first 2 (more are not searched) open pull-request heads" in rejected[0]


def test_the_pull_limit_counts_heads_holding_the_content_in_pull_request_order(forge: Mallory) -> None:
    """mallory's older pull request holds alice's squashed content (it forked where alice's file
    had it) without changing it: a candidate that vouches for nothing. With --forge-pull-limit 1
    it is the only head checked and the reason says so; with 2, alice's is found."""
    forge.write(A, "a2")
    old = forge.commit("alice's a2, on main", "alice")
    forge.write(A, "a1")
    forge.commit("alice's a1 again", "alice")
    forge.git("checkout", "-q", "-b", "old", old)
    forge.write(M, "m")
    forge.publish(forge.commit("my model, from an old main", "mallory"))
    forge.git("checkout", "-q", "main")
    forge.squash(forge.pull_request(("alice", {A: "a1.5"}), ("alice", {A: "a2"})))
    forge.pull_limit = 1
    files, rejected = forge.trusted()
    assert files[A] == "a1" and len(rejected) == 1
    assert "none of the first 1 pull-request heads" in rejected[0] and "--forge-pull-limit" in rejected[0]
    forge.pull_limit = 2
    files, rejected = forge.trusted()
    assert files[A] == "a2" and rejected == []
