"""Refs that keep the status branch from being stored: names and ``git for-each-ref`` patterns. Pure.

git stores a ref as a file under its folders, so ``refs/heads/argus`` and ``refs/heads/argus/status``
cannot both exist: a branch named like a folder above the status branch (``argus`` for
``argus/status``), or lying under it (``argus/status/x``), keeps it from being created. The bundled
git server refuses such pushes (``images/git-server/pre-receive``); a repository without that hook,
or a ref created in it directly, is found by the status writer (one ``for-each-ref`` with
:func:`patterns`, which it runs anyway) and reported (:class:`~reconciler.errors.StatusBranchBlocked`).
"""

from __future__ import annotations

from collections.abc import Iterable

HEADS = "refs/heads/"
MAX_NAMED = 3  # blocking refs named in one message


def folders_above(branch: str, namespace: str = HEADS) -> list[str]:
    """The refs named like each folder above ``namespace + branch`` within ``namespace``
    (``refs/heads/argus`` for ``argus/status``)."""
    parts = branch.split("/")
    return [namespace + "/".join(parts[:i]) for i in range(1, len(parts))]


def patterns(branch: str, namespace: str = HEADS) -> list[str]:
    """``git for-each-ref`` patterns that list ``namespace + branch``, every ref under it and every ref
    :func:`folders_above` it, and no other. A pattern without wildcards also matches every ref below
    it, so a folder's is made one (its last character escaped) that matches that name alone: a ref
    name holds no backslash, so no ref below it matches."""
    above = [ref[:-1] + "\\" + ref[-1] for ref in folders_above(branch, namespace)]
    return [*above, namespace + branch]


def blocking(names: Iterable[str], branch: str, namespace: str = HEADS) -> list[str]:
    """The refs among ``names`` that keep ``namespace + branch`` from being stored, sorted."""
    above = set(folders_above(branch, namespace))
    below = namespace + branch + "/"
    return sorted(name for name in names if name in above or name.startswith(below))


def describe(branch: str, refs: list[str], namespace: str = HEADS) -> str:
    """What blocks ``branch``, for a message: each ref's branch name and how it blocks, the first
    :data:`MAX_NAMED` of them."""
    named = []
    for ref in refs[:MAX_NAMED]:
        name = ref.removeprefix(namespace)
        how = "named like a folder above it" if name.count("/") < branch.count("/") else "lying under it"
        named.append(f"the branch {name} ({how})")
    more = f" and {len(refs) - MAX_NAMED} more" if len(refs) > MAX_NAMED else ""
    return ", ".join(named) + more


def blocked(names: Iterable[str], branch: str, where: str, remote: str | None = None) -> tuple[str | None, bool]:
    """Whether the refs ``names`` (a repository's, with the remote's branches under ``remote``, None:
    no remote) block ``branch``: (why, for the log and /healthz, or None; whether the block is in the
    repository itself, where no record can be made, rather than on the remote only). ``where`` names
    the repository or remote in the message."""
    names = list(names)
    here = blocking(names, branch)
    if here:
        return (
            f"the status branch {branch} cannot be created in {where}: {describe(branch, here)}, and git "
            "cannot store a branch and a folder of branches of one name. Nothing is submitted and nothing "
            "preempted until that branch is deleted or renamed in the repository (the bundled git server "
            "refuses such names; this one was created past it), or another status branch is set "
            "(ARGUS_STATUS_BRANCH)",
            True,
        )
    there = blocking(names, branch, remote) if remote is not None else []
    if there:
        return (
            f"the status branch {branch} cannot be published to {where}: the remote holds "
            f"{describe(branch, there, remote or HEADS)}, and git cannot store a branch and a folder of branches "
            "of one name. Status is written to the daemon's own copy only (its pages show it, `argus status` "
            "does not) until that branch is deleted or renamed on the remote",
            False,
        )
    return None, False
