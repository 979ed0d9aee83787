"""argus installed by name (not a checkout): the wheel pip builds from a git clone records its commit,
``argus init`` pins it, ``argus --version`` shows it; without a recorded commit the release tag is pinned.

Real git, a real ``pip wheel`` build (offline, no build isolation), the wheel unpacked and run from
outside any checkout.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from reconciler import __version__
from reconciler.scaffold import files
from tests.support import git

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _a_checkout() -> None:
    """Both tests build from, or read, this checkout's git history."""
    if not (ROOT / ".git").exists():
        if os.environ.get("CI"):
            pytest.fail("not a git checkout", pytrace=False)
        pytest.skip("not a git checkout")


def _setup_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("argus_setup", ROOT / "setup.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # setup() runs only as __main__
    return module


def _run(cwd: Path, site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_a_wheel_built_from_a_clone_pins_its_commit(tmp_path: Path) -> None:
    head = git(ROOT, "rev-parse", "HEAD").strip()
    src = tmp_path / "src"
    git(tmp_path, "clone", "-q", "--no-checkout", str(ROOT), str(src))
    git(src, "checkout", "-q", head)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
         "-w", str(tmp_path / "dist"), str(src)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (wheel,) = (tmp_path / "dist").glob("argus_reconciler-*.whl")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        assert zf.read("reconciler/_build_commit.txt").decode().strip() == head
        zf.extractall(site)
    work = tmp_path / "elsewhere"  # no checkout around: the recorded commit is all there is
    work.mkdir()
    out = _run(work, site, "-c", "import reconciler.scaffold as s; print(s.__file__); print(s.default_source().rev)")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(site / "reconciler" / "scaffold.py"), head]
    assert out.stderr == ""
    version = _run(work, site, "-m", "reconciler.cli", "--version")
    assert version.stdout.strip() == f"argus {__version__} (commit {head})", version.stderr
    init = _run(work, site, "-m", "reconciler.cli", "init", str(work / "config"))
    assert init.returncode == 0, init.stderr
    workflow = (work / "config" / ".github" / "workflows" / "argus.yaml").read_text()
    assert f"argus.git@{head}" in workflow

    # The same wheel without the record (as built from an sdist): the release tag, with a note.
    (site / "reconciler" / "_build_commit.txt").unlink()
    init = _run(work, site, "-m", "reconciler.cli", "init", str(work / "config2"))
    assert init.returncode == 0, init.stderr
    assert f"pinning the release tag v{__version__}" in init.stderr
    assert f"argus.git@v{__version__}" in (work / "config2" / ".github" / "workflows" / "argus.yaml").read_text()
    version = _run(work, site, "-m", "reconciler.cli", "--version")
    assert version.stdout.strip() == f"argus {__version__} (commit unknown)"


def test_the_build_hook_records_only_a_checkout_of_this_tree(tmp_path: Path) -> None:
    setup = _setup_module()
    assert setup.checkout_commit(str(ROOT)) == git(ROOT, "rev-parse", "HEAD").strip()
    assert setup.checkout_commit(str(tmp_path)) is None  # not a checkout (an sdist, git archive)
    outer = tmp_path / "outer"
    git(tmp_path, "init", "-q", str(outer))
    (outer / "vendored").mkdir()
    git(outer, "commit", "-q", "--allow-empty", "-m", "x")
    assert setup.checkout_commit(str(outer)) is not None and re.fullmatch(
        r"[0-9a-f]{40}", setup.checkout_commit(str(outer))
    )
    assert setup.checkout_commit(str(outer / "vendored")) is None, "another repository's commit is not argus's"
    env_path = os.environ.get("PATH", "")
    try:
        os.environ["PATH"] = str(tmp_path / "no-git-here")  # git absent: no record, no failure
        assert setup.checkout_commit(str(ROOT)) is None
    finally:
        os.environ["PATH"] = env_path


def _yaml_blocks(path: Path) -> list[str]:
    return re.findall(r"^```yaml\n(.*?)^```", path.read_text(encoding="utf-8"), re.M | re.S)


def test_the_docs_show_the_templates_argus_init_writes() -> None:
    """The admin chapter's GPU cluster.yaml is argus init's, and the users' first model is its example model."""
    scaffold = files(user="alice")
    assert scaffold["cluster.yaml"] in _yaml_blocks(ROOT / "docs" / "admins" / "install.md")
    access = (ROOT / "docs" / "users" / "getting-access.md").read_text(encoding="utf-8")
    (model,) = re.findall(r"cat > users/alice/models/hello.yaml <<'EOF'\n(.*?)^EOF", access, re.M | re.S)
    assert yaml.safe_load(model) == yaml.safe_load(scaffold["users/alice/models/chat.yaml"])
