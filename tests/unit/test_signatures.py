"""Signed-commit verification with real keys (ssh-keygen) and real git signatures."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from reconciler.source.git import GitRepo
from reconciler.source.signatures import SignatureVerifier
from tests.support import git

CLUSTER = """kind: Cluster
security:
  require_signed_commits: true
  allowed_signers: .argus/allowed_signers
  admins: [root]
"""


def _key(tmp: Path, who: str) -> tuple[Path, str]:
    path = tmp / who
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", who, "-f", str(path)], check=True)
    return path, Path(f"{path}.pub").read_text().strip()


class Repo:
    def __init__(self, tmp: Path) -> None:
        self.path = tmp / "repo"
        git(tmp, "init", "-q", "-b", "main", str(self.path))
        self.keys = {who: _key(tmp, who) for who in ("root", "carol", "mallory")}

    def write(self, rel: str, text: str) -> None:
        (self.path / rel).parent.mkdir(parents=True, exist_ok=True)
        (self.path / rel).write_text(text)

    def commit(self, message: str, signer: str | None = None) -> str:
        git(self.path, "add", "-A")
        args = ["-c", "gpg.format=ssh", "-c", f"user.signingkey={self.keys[signer][0]}"] if signer else []
        git(self.path, *args, "commit", "-q", "--allow-empty", *(["-S"] if signer else []), "-m", message)
        return git(self.path, "rev-parse", "HEAD").strip()

    def trusted(self) -> tuple[dict[str, str], list[str]]:
        repo = GitRepo(str(self.path))
        tree = SignatureVerifier(repo).trusted(repo.resolve("HEAD"))
        blobs = {p: git(self.path, "cat-file", "blob", b).strip() for p, (_m, b) in tree.entries.items()}
        return blobs, [str(r) for r in tree.rejections]


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    r = Repo(tmp_path)
    r.write("users/carol/models/a.yaml", "v1")
    r.commit("before signing is required: anything goes")
    signers = "".join(f"{who} {r.keys[who][1]}\n" for who in ("root", "carol"))
    r.write(".argus/allowed_signers", signers)
    r.write("cluster.yaml", CLUSTER)
    r.commit("admin turns signing on", "root")
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


def test_only_admins_change_cluster_yaml_and_signers(repo: Repo) -> None:
    repo.write("cluster.yaml", "kind: Cluster\n")  # carol tries to switch signing off
    repo.write(".argus/allowed_signers", f"mallory {repo.keys['mallory'][1]}\n")
    repo.commit("carol disables signing", "carol")
    repo.write("users/carol/models/a.yaml", "still needs a signature")
    repo.commit("unsigned")
    files, rejected = repo.trusted()
    assert files["cluster.yaml"] == CLUSTER.strip()
    assert files["users/carol/models/a.yaml"] == "v1"
    assert len(rejected) == 3
    repo.write("users/bob/models/b.yaml", "root may")
    repo.commit("admin", "root")
    files, _ = repo.trusted()
    assert files["users/bob/models/b.yaml"] == "root may"
