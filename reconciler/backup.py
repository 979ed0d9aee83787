"""``argus backup`` and ``argus restore``: the daemon's state folder and its config repository in one archive. I/O.

What argus cannot rebuild lives in two places (docs/admins/backup-and-upgrade.md): the state folder
(``<cache dir>/state``: the ownership key, the last applied head, the status anchor) and the config
repository with the ``argus/status`` branch and ``refs/notes/argus`` (the record of every run). The
archive (gzipped tar, mode 0600: it holds the ownership key) has:

- ``argus-backup.json``: the manifest (format, argus version, time, repository URL, branches, refs);
- ``state/``: the state folder as it was, file modes kept;
- ``config.git/``: a bare mirror of the repository (``git clone --mirror``: every ref, notes included);
- ``secrets/``: the files of ``--secrets DIR``, when given (modes kept).

The state folder is read before the repository is mirrored: the anchor and the last applied head it
names are then always in the mirror (a commit made in between only descends from them).

Restore writes a state folder and a local bare repository (the daemon's ``--repo``), and refuses to
write over a non-empty one without ``force`` (a replaced state folder is kept beside, renamed). It leaves
out the lease (``refs/argus/lease``: which daemon was running at backup time), so the restored daemon
takes it at start instead of waiting for it to expire. The
anchors in the state folder are named after the repository URL and branch the daemon was given
(``trust-<digest>.json``, ``status-<digest>.json``); when the restored daemon is given another URL,
restore renames them for it, so the restored daemon keeps its rollback protection.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import stat
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

from reconciler import __version__, git
from reconciler.errors import ArgusError, GitError
from reconciler.redact import redact_url
from reconciler.status.lease import LEASE_REF

FORMAT = 1
MANIFEST = "argus-backup.json"
STATE, REPO, SECRETS = "state", "config.git", "secrets"
MAX_MEMBERS = 1_000_000  # a backup is a state folder and one repository: more is not an argus backup


@dataclass(frozen=True)
class Restored:
    """What :func:`restore` wrote: the state folder, the repository, the secrets folder (or None), the
    folder a replaced state folder was moved to (or None), and the anchors renamed for a new URL."""

    state_dir: str
    repo: str
    secrets_dir: str | None
    replaced_state: str | None
    renamed: tuple[tuple[str, str], ...]


def is_url(repo: str) -> bool:
    """True when ``repo`` names a remote (``scheme://`` or scp-like ``host:path``), not a local path."""
    return "://" in repo or bool(re.match(r"^[^/]*:", repo))


def anchor_digest(url: str, branch: str) -> str:
    """The digest naming a state file for ``url`` and ``branch``, as the daemon computes it
    (reconciler/source/revision.py: ``trust-``, reconciler/loop.py: ``status-``)."""
    return hashlib.sha256(f"{url}\0{branch}".encode()).hexdigest()[:16]


def _files(root: str) -> Iterator[str]:
    """Regular files and folders under ``root``, relative, sorted (links and devices are not state)."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not os.path.islink(os.path.join(dirpath, d)))
        rel = os.path.relpath(dirpath, root)
        if rel != ".":
            yield rel
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            if stat.S_ISREG(os.lstat(path).st_mode):
                yield os.path.normpath(os.path.join(rel, name))


def _add_tree(tar: tarfile.TarFile, root: str, prefix: str) -> list[str]:
    """Add ``root``'s files under ``prefix/`` (modes kept, owner dropped). Returns the names added."""
    names = []
    for rel in _files(root):
        info = tar.gettarinfo(os.path.join(root, rel), arcname=f"{prefix}/{rel}")
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        if info.isfile():
            with open(os.path.join(root, rel), "rb") as fh:
                tar.addfile(info, fh)
        else:
            tar.addfile(info)
        names.append(info.name)
    return names


def backup(
    to: str,
    *,
    repo: str,
    state_dir: str,
    branch: str = "main",
    status_branch: str = "argus/status",
    secrets_dir: str | None = None,
) -> dict[str, object]:
    """Write the archive ``to`` (mode 0600; replaced whole, never half-written). Returns the manifest.

    Raises ArgusError when the state folder is missing or empty, ``secrets_dir`` is not a folder, or
    the repository cannot be mirrored (GitError, with git's message).
    """
    if not os.path.isdir(state_dir) or not os.listdir(state_dir):
        raise ArgusError(f"{state_dir}: no daemon state here (is --cache-dir the daemon's?)")
    if secrets_dir is not None and not os.path.isdir(secrets_dir):
        raise ArgusError(f"--secrets {secrets_dir}: not a folder")
    target = os.path.abspath(to)
    with tempfile.TemporaryDirectory(prefix="argus-backup-") as tmp:
        # The state first (see the module docstring), copied so that the archive holds one moment of it.
        state_copy = os.path.join(tmp, STATE)
        shutil.copytree(state_dir, state_copy, symlinks=True)
        mirror = os.path.join(tmp, REPO)
        git.run(None, "clone", "--mirror", "--quiet", repo, mirror)
        refs = git.text(mirror, "for-each-ref", "--format=%(objectname) %(refname)").splitlines()
        manifest: dict[str, object] = {
            "format": FORMAT,
            "argus_version": __version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "repo": repo,
            "branch": branch,
            "status_branch": status_branch,
            "refs": {ref: sha for sha, _, ref in (line.partition(" ") for line in refs)},
        }
        fd, partial = tempfile.mkstemp(prefix=".argus-backup-", dir=os.path.dirname(target))
        try:
            os.fchmod(fd, 0o600)  # the archive holds the ownership key
            with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
                body = json.dumps(manifest, indent=2, sort_keys=True).encode() + b"\n"
                info = tarfile.TarInfo(MANIFEST)
                info.size, info.mode, info.mtime = len(body), 0o600, int(time.time())
                tar.addfile(info, io.BytesIO(body))
                files = _add_tree(tar, state_copy, STATE)
                files += _add_tree(tar, mirror, REPO)
                if secrets_dir is not None:
                    files += _add_tree(tar, secrets_dir, SECRETS)
                manifest["files"] = len(files)
            os.replace(partial, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(partial)
            raise
    return manifest


def _members(tar: tarfile.TarFile, archive: str) -> dict[str, tarfile.TarInfo]:
    """The archive's members by name. Raises ArgusError on anything an argus backup never holds: links,
    devices, absolute names, ``..``, names outside state/, config.git/, secrets/."""
    members: dict[str, tarfile.TarInfo] = {}
    for info in tar:
        name = info.name
        top = name.split("/", 1)[0]
        if (
            os.path.isabs(name)
            or ".." in name.split("/")
            or not (info.isfile() or info.isdir())
            or (name != MANIFEST and top not in (STATE, REPO, SECRETS))
        ):
            raise ArgusError(f"{archive}: {name!r} is not part of an argus backup (refusing to restore it)")
        members[name] = info
        if len(members) > MAX_MEMBERS:
            raise ArgusError(f"{archive}: more than {MAX_MEMBERS} files: not an argus backup")
    if MANIFEST not in members:
        raise ArgusError(f"{archive}: no {MANIFEST}: not an argus backup")
    return members


def _extract(tar: tarfile.TarFile, members: dict[str, tarfile.TarInfo], prefix: str, dest: str) -> None:
    """Write the members under ``prefix/`` into ``dest`` (created 0700) with their modes (no setuid,
    setgid or sticky bits)."""
    os.makedirs(dest, mode=0o700, exist_ok=True)
    folders = []
    for name, info in members.items():
        if not name.startswith(prefix + "/"):
            continue
        path = os.path.join(dest, name[len(prefix) + 1 :])
        if info.isdir():
            os.makedirs(path, mode=0o700, exist_ok=True)
            folders.append((path, info.mode))
            continue
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        src = tar.extractfile(info)
        assert src is not None  # a regular file (checked in _members)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as out:
            shutil.copyfileobj(src, out)
        os.chmod(path, info.mode & 0o777)
    for path, mode in reversed(folders):  # after their files: a read-only folder was still written into
        os.chmod(path, (mode & 0o777) | 0o700)


def _open_archive(archive: str) -> tarfile.TarFile:
    """The archive, open for reading. Raises ArgusError when it is not a readable gzipped tar."""
    try:
        return tarfile.open(archive, mode="r:gz")
    except (OSError, tarfile.TarError) as exc:
        raise ArgusError(f"{archive}: cannot read it: {exc}") from exc


def _repo_has_refs(path: str) -> bool:
    try:
        return bool(git.text(path, "for-each-ref", "--count=1"))
    except GitError:
        return True  # not a repository git can read: something is there, do not write over it


def restore(
    archive: str,
    *,
    state_dir: str,
    repo: str,
    secrets_dir: str | None = None,
    force: bool = False,
) -> Restored:
    """Restore ``archive`` into ``state_dir`` and the bare repository ``repo`` (a local path: created when
    absent; an existing one gets every ref of the backup), and the secret files into ``secrets_dir``
    when given. Returns what was written (:class:`Restored`).

    Raises ArgusError, before writing anything, when the archive is not an argus backup, ``repo`` is a
    URL, or (without ``force``) the state folder is not empty, the repository has refs, or a secret file
    exists; GitError when git fails.
    """
    if is_url(repo):
        raise ArgusError(
            f"--repo {redact_url(repo)}: restore writes a local bare repository; restore into a path, then "
            "`git push --mirror <URL>` from it"
        )
    with _open_archive(archive) as tar, tempfile.TemporaryDirectory(prefix="argus-restore-") as tmp:
        members = _members(tar, archive)
        source = tar.extractfile(members[MANIFEST])
        assert source is not None
        try:
            manifest = json.loads(source.read(1 << 24))
        except ValueError as exc:
            raise ArgusError(f"{archive}: {MANIFEST} is not JSON: {exc}") from exc
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise ArgusError(f"{archive}: backup format {manifest.get('format')!r}, this argus reads {FORMAT}")
        secret_names = [n[len(SECRETS) + 1 :] for n, i in members.items() if n.startswith(SECRETS + "/") and i.isfile()]
        # Every refusal before the first write.
        if not force:
            if os.path.isdir(state_dir) and os.listdir(state_dir):
                raise ArgusError(f"{state_dir}: the state folder is not empty (--force moves it aside and restores)")
            if os.path.exists(repo) and _repo_has_refs(repo):
                raise ArgusError(f"{repo}: the repository is not empty (--force replaces every ref in it)")
            if secrets_dir is not None:
                taken = [n for n in secret_names if os.path.lexists(os.path.join(secrets_dir, n))]
                if taken:
                    raise ArgusError(f"{secrets_dir}: {', '.join(taken)} exist (--force writes over them)")
        mirror = os.path.join(tmp, REPO)
        _extract(tar, members, REPO, mirror)
        git.run(mirror, "rev-parse", "--git-dir")  # a repository, or GitError before anything is written
        # The lease names the daemon that was running when the backup was taken: not part of the record, and
        # restored it would keep the restored daemon waiting for it to expire (reconciler/status/lease.py).
        git.run(mirror, "update-ref", "-d", LEASE_REF)

        replaced = None
        if os.path.isdir(state_dir) and os.listdir(state_dir):
            replaced = f"{state_dir.rstrip(os.sep)}.replaced-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
            os.rename(state_dir, replaced)
        _extract(tar, members, STATE, state_dir)
        os.chmod(state_dir, 0o700)
        renamed = _rename_anchors(state_dir, manifest, repo)

        if not os.path.exists(repo):
            git.run(None, "init", "--quiet", "--bare", "-b", str(manifest.get("branch") or "main"), repo)
        # Every ref of the backup, notes and the status branch included; --prune drops refs made since.
        git.run(repo, "fetch", "--quiet", "--prune", "--no-write-fetch-head", mirror, "+refs/*:refs/*")
        _match_owner(repo)
        if secrets_dir is not None and secret_names:
            _extract(tar, members, SECRETS, secrets_dir)
    return Restored(state_dir, repo, secrets_dir if secret_names else None, replaced, renamed)


def _match_owner(repo: str) -> None:
    """Run as root (``docker compose exec argus argus restore``), hand what restore wrote in ``repo`` to
    the repository's owner (the git server's user), who must keep writing refs and objects there."""
    if os.geteuid() != 0:
        return
    top = os.stat(repo)
    for dirpath, dirnames, filenames in os.walk(repo):
        for name in (*dirnames, *filenames):
            os.lchown(os.path.join(dirpath, name), top.st_uid, top.st_gid)


def _rename_anchors(state_dir: str, manifest: dict[str, object], repo: str) -> tuple[tuple[str, str], ...]:
    """Rename the state files named after the backed-up repository URL for ``repo`` (the URL the restored
    daemon is given). Returns the (old, new) names."""
    old_url = str(manifest.get("repo") or "")
    if not old_url or old_url == repo:
        return ()
    renamed = []
    for prefix, branch in (("trust", manifest.get("branch")), ("status", manifest.get("status_branch"))):
        if not isinstance(branch, str):
            continue
        old = f"{prefix}-{anchor_digest(old_url, branch)}.json"
        new = f"{prefix}-{anchor_digest(repo, branch)}.json"
        if os.path.exists(os.path.join(state_dir, old)):
            os.replace(os.path.join(state_dir, old), os.path.join(state_dir, new))
            renamed.append((old, new))
    return tuple(renamed)
