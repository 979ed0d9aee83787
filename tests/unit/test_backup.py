"""``argus backup`` / ``argus restore``: what the archive holds, the modes it keeps, the refusals.

Real git (a bare repository with a deployed branch, a status branch and argus's notes) and real files;
the daemon restarting on a restored copy against a real Ray head is tests/e2e/test_backup_restore.py.
"""

from __future__ import annotations

import io
import json
import os
import stat
import tarfile
from pathlib import Path

import pytest

from reconciler.backup import MANIFEST, anchor_digest, backup, restore
from reconciler.cli import main
from reconciler.errors import ArgusError
from tests.support import ConfigRepo, git

KEY = "0123456789abcdef" * 4 + "\n"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def refs(repo: Path) -> dict[str, str]:
    lines = git(repo, "for-each-ref", "--format=%(refname) %(objectname)").splitlines()
    return dict(line.split(" ", 1) for line in lines)


@pytest.fixture()
def site(tmp_path: Path) -> tuple[ConfigRepo, Path, Path]:
    """A config repository with main, argus/status and refs/notes/argus; a state folder as the daemon
    leaves it (key 0600, the two anchors named after the repository); a secrets folder."""
    repo = ConfigRepo(tmp_path)
    repo.write("cluster.yaml", "kind: Cluster\n")
    head = repo.commit_push("init")
    git(repo.work, "notes", "--ref=argus", "add", "-m", "applied", head)
    git(repo.work, "push", "-q", "origin", "refs/notes/argus")
    git(repo.work, "checkout", "-q", "--orphan", "status")
    repo.write("README.md", "status\n")
    git(repo.work, "add", "-A")
    git(repo.work, "commit", "-q", "-m", "status")
    git(repo.work, "push", "-q", "origin", "HEAD:refs/heads/argus/status")
    git(repo.bare, "update-ref", "refs/argus/lease", head)  # a running daemon's lease
    state = tmp_path / "cache" / "state"
    state.mkdir(parents=True, mode=0o700)
    (state / "ownership.key").write_text(KEY)
    (state / "ownership.key").chmod(0o600)
    url = str(repo.bare)
    (state / f"trust-{anchor_digest(url, 'main')}.json").write_text(json.dumps({"applied": head}))
    (state / f"status-{anchor_digest(url, 'argus/status')}.json").write_text("{}")
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "ray_auth_token").write_text("token\n")
    (secrets / "ray_auth_token").chmod(0o600)
    return repo, state, secrets


def test_archive_holds_state_repository_and_secrets_with_their_modes(
    site: tuple[ConfigRepo, Path, Path], tmp_path: Path
) -> None:
    repo, state, secrets = site
    archive = tmp_path / "b.tar.gz"
    manifest = backup(str(archive), repo=str(repo.bare), state_dir=str(state), secrets_dir=str(secrets))
    assert mode(archive) == 0o600, "the archive holds the ownership key"
    assert manifest["refs"] == {ref: sha for ref, sha in refs(repo.bare).items()}
    assert {"refs/heads/main", "refs/heads/argus/status", "refs/notes/argus"} <= set(refs(repo.bare))
    with tarfile.open(archive) as tar:
        members = {m.name: m for m in tar}
        assert json.loads(tar.extractfile(MANIFEST).read())["repo"] == str(repo.bare)  # type: ignore[union-attr]
        assert tar.extractfile("state/ownership.key").read().decode() == KEY  # type: ignore[union-attr]
    assert stat.S_IMODE(members["state/ownership.key"].mode) == 0o600
    assert stat.S_IMODE(members["secrets/ray_auth_token"].mode) == 0o600
    assert "config.git/HEAD" in members and all(m.uid == 0 and not m.uname for m in members.values())
    assert all(m.isfile() or m.isdir() for m in members.values())

    # Restored into a fresh state folder and a fresh bare repository at another path.
    new_state, new_repo, new_secrets = tmp_path / "n" / "state", tmp_path / "n" / "config.git", tmp_path / "n" / "s"
    done = restore(str(archive), state_dir=str(new_state), repo=str(new_repo), secrets_dir=str(new_secrets))
    assert (new_state / "ownership.key").read_text() == KEY
    assert mode(new_state / "ownership.key") == 0o600 and mode(new_state) == 0o700
    assert mode(new_secrets / "ray_auth_token") == 0o600
    # Every ref but the lease of the daemon that was running at backup time.
    assert "refs/argus/lease" in manifest["refs"]  # type: ignore[operator]
    assert refs(new_repo) == {r: sha for r, sha in refs(repo.bare).items() if r != "refs/argus/lease"}
    assert git(new_repo, "notes", "--ref=argus", "show", "main").strip() == "applied"
    assert git(new_repo, "rev-parse", "--is-bare-repository").strip() == "true"
    # The anchors follow the repository's new URL: the restored daemon finds them.
    for prefix, branch in (("trust", "main"), ("status", "argus/status")):
        assert (new_state / f"{prefix}-{anchor_digest(str(new_repo), branch)}.json").is_file()
        assert not (new_state / f"{prefix}-{anchor_digest(str(repo.bare), branch)}.json").exists()
    assert len(done.renamed) == 2 and done.replaced_state is None


def test_restore_refuses_to_overwrite_without_force(site: tuple[ConfigRepo, Path, Path], tmp_path: Path) -> None:
    repo, state, _ = site
    archive = tmp_path / "b.tar.gz"
    backup(str(archive), repo=str(repo.bare), state_dir=str(state))
    fresh = tmp_path / "fresh.git"
    before = refs(repo.bare)
    with pytest.raises(ArgusError, match="state folder is not empty"):
        restore(str(archive), state_dir=str(state), repo=str(fresh))
    assert not fresh.exists(), "nothing is written before every refusal is checked"
    empty_state = tmp_path / "empty"
    empty_state.mkdir()
    with pytest.raises(ArgusError, match="repository is not empty"):
        restore(str(archive), state_dir=str(empty_state), repo=str(repo.bare))
    assert list(empty_state.iterdir()) == []
    # An existing empty bare repository (the git server made it) is not "non-empty".
    git(tmp_path, "init", "-q", "--bare", str(fresh))
    restore(str(archive), state_dir=str(empty_state), repo=str(fresh))
    assert refs(fresh) == {r: sha for r, sha in before.items() if r != "refs/argus/lease"}

    # --force: the state folder that was there is kept beside, renamed; the repository gets the backup's refs.
    (state / "ownership.key").write_text("f" * 64 + "\n")
    git(repo.work, "checkout", "-q", "main")
    repo.commit_push("after the backup")
    done = restore(str(archive), state_dir=str(state), repo=str(repo.bare), force=True)
    assert done.replaced_state and Path(done.replaced_state, "ownership.key").read_text() == "f" * 64 + "\n"
    assert (state / "ownership.key").read_text() == KEY
    assert refs(repo.bare) == {r: s for r, s in before.items() if r != "refs/argus/lease"}, "--prune: refs since go"


def test_restore_refuses_what_is_not_an_argus_backup(site: tuple[ConfigRepo, Path, Path], tmp_path: Path) -> None:
    repo = site[0]
    target = {"state_dir": str(tmp_path / "s"), "repo": str(tmp_path / "r.git")}

    def archive(name: str, *members: tarfile.TarInfo) -> str:
        path = tmp_path / name
        with tarfile.open(path, "w:gz") as tar:
            manifest = tarfile.TarInfo(MANIFEST)
            body = b'{"format": 1}'
            manifest.size = len(body)
            tar.addfile(manifest, io.BytesIO(body))
            for info in members:
                tar.addfile(info, io.BytesIO(b"x" * info.size) if info.isfile() else None)
        return str(path)

    escape = tarfile.TarInfo("state/../../evil")
    escape.size = 1
    link = tarfile.TarInfo("state/ownership.key")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    other = tarfile.TarInfo("home/x")
    other.size = 1
    for name, member in (("escape", escape), ("link", link), ("other", other)):
        with pytest.raises(ArgusError, match="not part of an argus backup"):
            restore(archive(f"{name}.tar.gz", member), **target)
    assert not (tmp_path / "evil").exists() and not (tmp_path / "s").exists()
    (tmp_path / "plain.txt").write_text("hello")
    with pytest.raises(ArgusError, match="cannot read it"):
        restore(str(tmp_path / "plain.txt"), **target)
    with pytest.raises(ArgusError, match="local bare repository"):
        restore(archive("ok.tar.gz"), state_dir=str(tmp_path / "s"), repo="ssh://git@host:2222/srv/git/config.git")
    with pytest.raises(ArgusError, match="no daemon state"):
        backup(str(tmp_path / "x.tar.gz"), repo=str(repo.bare), state_dir=str(tmp_path / "nothing"))


def test_cli_backup_and_restore(
    site: tuple[ConfigRepo, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo, state, _ = site
    archive = str(tmp_path / "argus-backup.tar.gz")
    cache = str(state.parent)
    assert main(["backup", "--to", archive, "--repo", str(repo.bare), "--cache-dir", cache]) == 0
    assert "refs" in capsys.readouterr().out
    assert main(["restore", archive, "--repo", str(repo.bare), "--cache-dir", cache]) == 1
    assert "state folder is not empty" in capsys.readouterr().err
    new = tmp_path / "new"
    assert main(["restore", archive, "--repo", str(new / "config.git"), "--cache-dir", str(new / "cache")]) == 0
    out = capsys.readouterr().out
    assert f"--repo {new / 'config.git'}" in out and os.path.isfile(new / "cache" / "state" / "ownership.key")
