"""Build hook: record the git commit argus is built from in the package (``reconciler/_build_commit.txt``).

pip builds ``argus-reconciler @ git+<URL>@<REV>`` from a clone, so the commit is known at build time and
lost after it; ``argus init`` pins it (``reconciler.scaffold.argus_commit``). Everything else about the
build is in pyproject.toml. No network: one local ``git rev-parse``; without git, or outside a checkout
of this very tree (an sdist, a folder vendored inside another repository), no file is written and
``argus init`` falls back to the release tag.
"""

from __future__ import annotations

import os
import re
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))
COMMIT_FILE = "_build_commit.txt"


def checkout_commit(root: str = ROOT) -> str | None:
    """The commit of the git checkout whose top level is ``root``, or None (no git, not a checkout, or
    ``root`` lies inside another repository's tree: that commit would not be argus's)."""

    def git(*args: str) -> str | None:
        try:
            proc = subprocess.run(
                ["git", "-C", root, *args],
                capture_output=True,
                text=True,
                timeout=30,
                env={**os.environ, "GIT_NO_REPLACE_OBJECTS": "1", "LC_ALL": "C"},
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return proc.stdout.strip() if proc.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    if top is None or os.path.realpath(top) != os.path.realpath(root):
        return None
    sha = git("rev-parse", "--verify", "-q", "HEAD^{commit}")
    return sha if sha and re.fullmatch(r"[0-9a-f]{40}", sha) else None


class BuildPyWithCommit(build_py):
    """build_py, then ``reconciler/_build_commit.txt`` in the build tree when the commit is known."""

    def run(self) -> None:
        super().run()
        commit = checkout_commit()
        if commit is None or getattr(self, "editable_mode", False):
            return  # an editable install runs from the checkout, which argus asks directly
        target = os.path.join(self.build_lib, "reconciler", COMMIT_FILE)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "w", encoding="utf-8") as fh:
            fh.write(commit + "\n")


# setuptools runs this file as __main__; tests import it for checkout_commit.
if __name__ == "__main__":
    setup(cmdclass={"build_py": BuildPyWithCommit})
