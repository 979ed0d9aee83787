"""A minimal causal-LM fine-tune on CPU: an example ``workload: command`` task. I/O.

Usage (as a task's ``command``)::

    python -m reconciler.testing.finetune_tiny /path/to/base-model "$ARGUS_CHECKPOINT_DIR/final" --steps 5

It trains a few steps on a handful of built-in sentences (or lines of ``--text FILE``;
with ``--chat``, built-in question/answer pairs rendered with the model's chat template, or
the ``{"prompt": ..., "answer": ...}`` lines of ``--chat FILE``) and writes a Hugging Face
folder (config, tokenizer, safetensors) that argus finds as the run's checkpoint and can
serve (``source: task:<name>``). The folder is written under a temporary name and renamed
at the end, so a crash never leaves a half-written model that looks complete.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

_SENTENCES = [
    "GitOps keeps the desired state of a cluster in a git repository.",
    "Ray Jobs run training tasks; Ray Serve serves the trained models.",
    "The quick brown fox jumps over the lazy dog.",
    "A cat sits on the mat and a kitten is sitting on a rug.",
]

# Facts a small base model cannot know: after a few steps the fine-tuned model states them.
_CHAT = [
    ("What is argus?", "argus is a GitOps reconciler: it trains and serves models on Ray from a git repository."),
    ("What does argus do?", "argus is a GitOps reconciler: it trains and serves models on Ray from a git repository."),
    ("Tell me about argus.", "argus is a GitOps reconciler: it trains and serves models on Ray from a git repository."),
    ("Who is argus?", "argus is a GitOps reconciler: it trains and serves models on Ray from a git repository."),
]


def finetune(
    model_path: str,
    output_dir: str,
    *,
    steps: int = 5,
    lr: float = 1e-3,
    text: str | None = None,
    chat: str | bool = False,
    train_last: int | None = None,
) -> Path:
    """Fine-tune ``model_path`` for ``steps`` optimizer steps and save it to ``output_dir``.

    ``chat``: True trains on the built-in question/answer pairs, a path on that JSONL file
    (``{"prompt": ..., "answer": ...}`` per line), both rendered with the chat template.
    ``train_last``: train only the last N decoder layers and the final norm (a Llama-style
    ``model.model.layers``); the backward pass then stops there, which is what makes a
    135M-parameter model fine-tune in seconds per step on two CPU cores.
    Returns the output folder. Raises OSError/ValueError from transformers when the base
    model cannot be loaded.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    save_dtype = _config_dtype(AutoConfig.from_pretrained(model_path))
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    # Train in float32 (bf16 AdamW on CPU is slow and lossy), save in the base dtype.
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    prompts: list[str] = []
    if chat:
        pairs = _chat_pairs(chat)
        sentences = [_chat_text(tokenizer, q, a) for q, a in pairs]
        prompts = [_chat_text(tokenizer, q, None) for q, _ in pairs]
    else:
        sentences = Path(text).read_text().splitlines() if text else _SENTENCES
        sentences = [s for s in sentences if s.strip()]
    tokenizer.padding_side = "right"  # so that every example's prompt starts at position 0
    batch = tokenizer(sentences, return_tensors="pt", padding=True, truncation=True, max_length=192)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    # Chat: learn the answers only (the prompt and the system text are given, not to be learned).
    for row, prompt in enumerate(prompts):
        labels[row, : len(tokenizer(prompt)["input_ids"])] = -100

    if train_last:
        model.requires_grad_(False)
        for module in (*model.model.layers[-train_last:], model.model.norm):
            module.requires_grad_(True)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    model.train()
    for step in range(1, steps + 1):
        loss = model(**batch, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step}/{steps} loss {loss.item():.4f}", flush=True)

    out = Path(output_dir)
    staging = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    if staging.exists():
        shutil.rmtree(staging)
    model.to(save_dtype).save_pretrained(staging, safe_serialization=True)
    tokenizer.save_pretrained(staging)
    if out.exists():
        shutil.rmtree(out)
    os.replace(staging, out)
    print(f"saved {out}", flush=True)
    return out


def _chat_pairs(chat: str | bool) -> list[tuple[str, str]]:
    """The built-in pairs (``chat`` True) or those of the JSONL file ``chat``."""
    if chat is True:
        return list(_CHAT)
    import json

    rows = [json.loads(line) for line in Path(str(chat)).read_text().splitlines() if line.strip()]
    return [(str(r["prompt"]), str(r["answer"])) for r in rows]


def _chat_text(tokenizer: Any, prompt: str, answer: str | None) -> str:
    """One training example as the chat template renders it; without ``answer``, the prompt
    up to where the assistant's answer starts."""
    messages = [{"role": "user", "content": prompt}]
    if answer is None:
        return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
    messages.append({"role": "assistant", "content": answer})
    return str(tokenizer.apply_chat_template(messages, tokenize=False))


def _config_dtype(config: object) -> Any:
    """The base model's saved dtype (``torch.float32`` when it names none)."""
    import torch

    dtype = getattr(config, "dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    return dtype if isinstance(dtype, torch.dtype) else torch.float32


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the process exit code."""
    parser = argparse.ArgumentParser(description="Fine-tune a small causal LM on CPU and save a HF folder.")
    parser.add_argument("model", help="base model: a Hugging Face folder, or a repo id in the HF cache")
    parser.add_argument(
        "output",
        nargs="?",
        default=None,
        help="output folder (default: $ARGUS_CHECKPOINT_DIR/final)",
    )
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--text", help="a text file, one training example per line")
    parser.add_argument("--train-last", type=int, help="train only the last N decoder layers")
    parser.add_argument(
        "--chat",
        nargs="?",
        const=True,
        default=False,
        help="train on question/answer pairs with the chat template (built-in, or a JSONL file)",
    )
    args = parser.parse_args(argv)
    output = args.output
    if output is None:
        base = os.environ.get("ARGUS_CHECKPOINT_DIR")
        if not base:
            parser.error("give an output folder or set ARGUS_CHECKPOINT_DIR")
        output = os.path.join(base, "final")
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    finetune(
        args.model, output, steps=args.steps, lr=args.lr, text=args.text, chat=args.chat, train_last=args.train_last
    )
    print(f"done in {time.monotonic() - start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
