"""Build-time smoke test of the argus Ray node image: a broken combination fails the build.

Imports every layer a node runs (Ray, Ray Serve LLM, vLLM, verl, argus) and checks that each pinned
distribution in the constraints file is installed at exactly the pinned version.
Run as: python smoke.py constraints.txt (the GPU image) or python smoke.py constraints-cpu.txt cpu (the CPU
variant, where verl is installed without its dependencies: only its config tree is used, so it is not imported).
"""

import importlib
import importlib.metadata
import sys

MODULES = ["ray", "ray.serve", "ray.serve.llm", "vllm", "verl", "reconciler", "reconciler.cli"]
CPU_MODULES = ["ray", "ray.serve", "ray.serve.llm", "vllm", "hydra", "omegaconf", "reconciler", "reconciler.cli"]


def pins(path: str) -> list[tuple[str, str]]:
    """(name, version) of every ``name==version`` line of a constraints file."""
    with open(path, encoding="utf-8") as fh:
        lines = [raw.split("#", 1)[0].strip() for raw in fh]
    return [(n.strip(), v.strip()) for n, _, v in (line.partition("==") for line in lines if line)]


def main(constraints: str, extra: str = "gpu") -> int:
    """0 when every module imports and every pin holds, else 1 (each failure printed on stderr)."""
    failures: list[str] = []
    for module in CPU_MODULES if extra == "cpu" else MODULES:
        try:
            importlib.import_module(module)
        except Exception as exc:  # any import failure is a broken image
            failures.append(f"import {module}: {type(exc).__name__}: {exc}")
    for name, want in pins(constraints):
        try:
            have = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            failures.append(f"{name}: not installed (pinned {want})")
            continue
        if have.split("+", 1)[0] != want:  # a local tag (+cu130) is the same release
            failures.append(f"{name}: {have} installed, {want} pinned")
        else:
            print(f"ok {name}=={have}")
    for failure in failures:
        print(f"smoke: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
