"""Path macros and the path policy (security-relevant). Pure: file-system facts come
through the :class:`FileSystem` interface (``None`` = offline: skip those checks).

Rules: ``$HOME`` is ``<paths.users>/<user>``; ``$HOME/common/hf`` is ``<paths.common>``.
A path must resolve inside ``<paths.common>/`` or ``<paths.users>/<user>/``, also after
symlinks when it exists. ``org/name`` is a Hugging Face repo id, resolved offline to the
newest snapshot in the shared cache.
"""

from __future__ import annotations

import posixpath
import re
from typing import Protocol, cast

from reconciler.errors import PathError as PathError  # raised here; callers catch it from here
from reconciler.spec.types import Paths

HF_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
COMMON_MACRO = "$HOME/common/hf"


class FileSystem(Protocol):
    """The few file-system questions the policy asks (implemented in reconciler.source.localfs)."""

    def exists(self, path: str) -> bool: ...

    def realpath(self, path: str) -> str: ...

    def listdir(self, path: str) -> list[str]: ...

    def mtime(self, path: str) -> float: ...

    def read_text(self, path: str) -> str | None: ...


class ScopedFileSystem(FileSystem, Protocol):
    """A file system that remembers its answers and knows which user folder asked each
    (implemented in reconciler.fscache). ``scope(folder)`` answers on behalf of one user folder's
    load (None: of what every folder depends on); the view's ``generation`` changes exactly when
    an answer it may have given changed (generations compare by equality only).
    ``generation_of(folder)`` is that generation now; ``changed`` moves whenever some folder's
    generation does."""

    changed: int

    def scope(self, folder: str | None) -> FileSystem: ...

    def generation_of(self, folder: str | None) -> object: ...


def scoped(fs: FileSystem | None) -> ScopedFileSystem | None:
    """Return ``fs`` when it is a :class:`ScopedFileSystem`, else None."""
    return cast(ScopedFileSystem, fs) if callable(getattr(fs, "scope", None)) else None


def _inside(path: str, root: str) -> bool:
    root = root.rstrip("/") or "/"
    return path == root or path.startswith(root + "/")


def expand(raw: str, user: str, paths: Paths) -> str:
    """Expand macros and normalise; return an absolute path. Raises PathError.

    Does not check the allowed roots (see :func:`resolve_path`).
    """
    if raw.startswith("~"):
        raise PathError(f"{raw!r}: `~` is not expanded; use $HOME/...")
    if raw == COMMON_MACRO or raw.startswith(COMMON_MACRO + "/"):
        expanded = paths.common.rstrip("/") + raw[len(COMMON_MACRO) :]
    elif raw == "$HOME" or raw.startswith("$HOME/"):
        expanded = posixpath.join(paths.users, user) + raw[len("$HOME") :]
    elif "$" in raw:
        var = re.search(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?", raw)
        raise PathError(f"{raw!r}: unknown variable {var.group(0) if var else '$'}; only $HOME is expanded")
    elif not raw.startswith("/"):
        raise PathError(f"{raw!r}: relative paths are not allowed; start with $HOME/ or an absolute path")
    else:
        expanded = raw
    if "$" in expanded[1:] and expanded != raw:
        raise PathError(f"{raw!r}: only one leading $HOME macro is expanded")
    return posixpath.normpath(expanded)


def allowed_roots(user: str, paths: Paths) -> tuple[str, str]:
    return (posixpath.normpath(paths.common), posixpath.normpath(posixpath.join(paths.users, user)))


def resolve_path(raw: str, user: str, paths: Paths, fs: FileSystem | None, *, must_exist: bool = True) -> str:
    """Return the absolute, policy-checked path for ``raw``. Raises PathError.

    With ``fs``: symlinks are resolved and must stay inside the roots, and (when
    ``must_exist``) the path must exist.
    """
    path = expand(raw, user, paths)
    roots = allowed_roots(user, paths)
    if not any(_inside(path, r) for r in roots):
        raise PathError(
            f"{raw!r} resolves to {path}, outside the allowed roots "
            f"{roots[1]}/ (your home) and {roots[0]}/ (shared cache)"
        )
    if fs is None:
        return path
    if not fs.exists(path) and must_exist:
        raise PathError(f"{raw!r} ({path}) does not exist on the cluster's file system")
    # A path that does not exist yet (an output folder) is created below its nearest existing
    # ancestor: that ancestor must not be a symlink out of the roots either.
    existing = path
    while not fs.exists(existing) and existing != "/":
        existing = posixpath.dirname(existing)
    real = fs.realpath(existing)
    real_roots = [fs.realpath(r) if fs.exists(r) else r for r in roots]
    if (
        fs.exists(existing)
        and not any(_inside(real, r) for r in real_roots)
        and any(_inside(existing, r) for r in roots)
    ):
        where = repr(raw) if existing == path else f"{raw!r}: {existing}"
        raise PathError(f"{where} is a symlink to {real}, outside the allowed roots")
    return path


def is_hf_id(raw: str) -> bool:
    return not raw.startswith(("/", "$", "~", ".")) and bool(HF_ID.match(raw))


def hf_cache_dir(repo_id: str, paths: Paths) -> str:
    org, name = repo_id.split("/")
    return posixpath.join(paths.common, "hub", f"models--{org}--{name}")


def resolve_hf_id(repo_id: str, paths: Paths, fs: FileSystem | None) -> str | None:
    """Return the newest local snapshot folder of ``repo_id`` (None offline). Raises PathError
    when it is not cached: online resolution from many replicas at once caused HTTP 429 storms.

    "Newest" is the snapshot named by ``refs/main`` when present, else the latest modified.
    """
    if fs is None:
        return None
    base = hf_cache_dir(repo_id, paths)
    snapshots = posixpath.join(base, "snapshots")
    names = fs.listdir(snapshots) if fs.exists(snapshots) else []
    if not names:
        raise PathError(
            f"{repo_id!r} is not in the shared cache ({snapshots} is empty or missing); "
            f"download it first, e.g. `HF_HOME={paths.common} huggingface-cli download {repo_id}`"
        )
    ref = fs.read_text(posixpath.join(base, "refs", "main"))
    if ref and ref.strip() in names:
        chosen = ref.strip()
    else:
        chosen = max(names, key=lambda n: (fs.mtime(posixpath.join(snapshots, n)), n))
    path = posixpath.join(snapshots, chosen)
    real = fs.realpath(path)
    common_real = fs.realpath(paths.common)
    if not _inside(real, common_real):
        raise PathError(f"{repo_id!r}: snapshot {path} is a symlink to {real}, outside the shared cache")
    return path


def resolve_source(raw: str, user: str, paths: Paths, fs: FileSystem | None) -> str | None:
    """Resolve a model/data reference: an HF repo id or a path. Returns None when offline for
    HF ids. Raises PathError."""
    if is_hf_id(raw):
        return resolve_hf_id(raw, paths, fs)
    return resolve_path(raw, user, paths, fs)
