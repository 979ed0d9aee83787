"""The base install (validate/plan/status/init) and the commands that need the runtime extras.

`argus run` on the base install once ended in a ModuleNotFoundError traceback, and `argus reconcile` without
`--once` failed although the help showed the flag as optional. Here a subprocess runs the real CLI with the
runtime modules made unimportable, as on a base install.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from reconciler.cli import RUNTIME_MODULES, build_parser

ROOT = Path(__file__).resolve().parents[2]

# A meta-path finder that refuses the runtime extras' modules, placed before every other finder.
BLOCK = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, Block())
from reconciler.cli import main
sys.exit(main(sys.argv[1:]))
"""


def argus(*args: str, blocked: tuple[str, ...] = RUNTIME_MODULES) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    for name in list(env):
        if name.startswith("ARGUS_"):
            del env[name]
    return subprocess.run(
        [sys.executable, "-c", BLOCK.format(blocked=set(blocked)), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=ROOT,
    )


def test_run_on_the_base_install_names_the_extra(tmp_path: Path) -> None:
    proc = argus("run", "--repo", str(tmp_path), "--ray", "http://127.0.0.1:9")
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "argus-reconciler[gpu]" in line and "[cpu]" in line and "argus run" in line, line
    assert proc.stdout == ""


@pytest.mark.parametrize("module", ["watchfiles", "prometheus_client", "jinja2"])
def test_each_missing_daemon_module_is_named(module: str, tmp_path: Path) -> None:
    proc = argus("run", "--repo", str(tmp_path), "--ray", "http://127.0.0.1:9", blocked=(module,))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"'{module}'" in proc.stderr and "argus-reconciler[gpu]" in proc.stderr


def test_base_install_commands_still_work(tmp_path: Path) -> None:
    """validate, plan and init need none of the runtime modules."""
    repo = tmp_path / "config"
    assert argus("init", str(repo)).returncode == 0
    valid = argus("validate", "--offline", str(repo))
    assert valid.returncode == 0, valid.stderr
    planned = argus("plan", "--offline", str(repo))
    assert planned.returncode == 2, planned.stderr


def test_reconcile_is_one_tick_by_default(tmp_path: Path) -> None:
    """Without --once it runs its one tick (here against an unreachable Ray: a one-line error, no traceback)."""
    help_text = build_parser().parse_args(["reconcile", "--repo", "x", "--ray", "y"])
    assert help_text.once is False  # the flag is optional...
    reconcile_help = subprocess.run(
        [sys.executable, "-m", "reconciler.cli", "reconcile", "--help"], capture_output=True, text=True, cwd=ROOT
    ).stdout
    assert "default and only mode" in " ".join(reconcile_help.split())
    for args in ((), ("--once",)):
        proc = argus("reconcile", *args, "--repo", str(tmp_path / "missing"), "--ray", "http://127.0.0.1:9")
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert "needs --once" not in proc.stderr  # ...and its absence is not an error
        assert proc.stderr.startswith("argus: error:"), proc.stderr
