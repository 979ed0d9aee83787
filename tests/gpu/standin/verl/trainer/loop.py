"""verl 0.9.1's training loops as the GPU suite sees them, without a model (tests/gpu/standin/README.md).

What it keeps of verl (verl/trainer/sft_trainer_ray.py ``SFTTrainer.fit``, verl/trainer/ppo/ray_trainer.py
``RayPPOTrainer.fit``, verl/utils/checkpoint): the hydra overrides it reads (the last of a key wins), the loop
``for epoch in range(total_epochs)`` that ends at ``total_training_steps`` and saves there or every ``save_freq``
steps, the checkpoint layout (``global_step_N/[actor/]huggingface``, ``latest_checkpointed_iteration.txt`` written
after the folder), ``resume_mode=auto`` from that tracker, a keep-limit over the checkpoints this process saved, and
the log lines the suite reads. ``ARGUS_STANDIN_SFT_STEP_S`` / ``ARGUS_STANDIN_PPO_STEP_S``: the time one step
takes (an RL step is seconds in verl too).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time

STEPS_PER_EPOCH = {"sft": 16, "ppo": 3}  # the suite's data: 512 rows / 32, 24 prompts / 8


def _overrides(argv: list[str]) -> dict[str, str]:
    out = {}
    for word in argv:
        key, _, value = word.partition("=")
        out[key.lstrip("+~")] = value
    return out


def _save(kind: str, folder: str, tracker: str, step: int, prefix: str) -> None:
    line = f"Saving checkpoint to: {folder}" if kind == "sft" else f"local_global_step_folder: {folder}"
    print(prefix + line, flush=True)
    hf = os.path.join(folder, "huggingface" if kind == "sft" else os.path.join("actor", "huggingface"))
    os.makedirs(hf, exist_ok=True)
    with open(os.path.join(hf, "config.json"), "w") as fh:
        json.dump({"model_type": "llama"}, fh)
    with open(os.path.join(hf, "model.safetensors"), "wb") as fh:
        fh.write(b"\0" * 8)
    with open(tracker + ".tmp", "w") as fh:
        fh.write(str(step))
    os.rename(tracker + ".tmp", tracker)


def main(kind: str) -> None:
    args = _overrides(sys.argv[1:])
    per_epoch = STEPS_PER_EPOCH[kind]
    epochs = int(args["trainer.total_epochs"])
    bound = args.get("trainer.total_training_steps", "null")
    total = int(bound) if bound not in ("null", "None", "") else per_epoch * epochs
    save_freq = int(args.get("trainer.save_freq", "-1"))
    keep = int(args.get("trainer.max_ckpt_to_keep" if kind == "sft" else "trainer.max_actor_ckpt_to_keep", "0") or 0)
    ckpt = args["trainer.default_local_dir"]
    tracker = os.path.join(ckpt, "latest_checkpointed_iteration.txt")
    prefix = "" if kind == "sft" else "(TaskRunner pid=1) "
    delay = float(os.environ.get(f"ARGUS_STANDIN_{kind.upper()}_STEP_S", "0.5" if kind == "sft" else "3"))
    step = 0
    if args.get("trainer.resume_mode", "auto") == "auto" and os.path.exists(tracker):
        with open(tracker) as fh:
            step = int(fh.read().strip())
        found = os.path.join(ckpt, f"global_step_{step}")
        print(f"Found latest checkpoint: {found} (step {step})" if kind == "sft" else f"{prefix}Resuming from {found}")
    else:
        print(f"{prefix}Checkpoint tracker file does not exist: {tracker}", flush=True)
    mine: list[str] = []
    first_epoch = step // per_epoch
    for epoch in range(first_epoch, epochs):
        done = step % per_epoch if epoch == first_epoch else 0
        for _ in range(per_epoch - done):
            step += 1
            time.sleep(delay)
            print(f"{prefix}step:{step} - train/loss:{10.0 / step:.3f} - train/lr:0.001", flush=True)
            last = step >= total
            if last or (save_freq > 0 and step % save_freq == 0):
                folder = os.path.join(ckpt, f"global_step_{step}")
                _save(kind, folder, tracker, step, prefix)
                mine.append(folder)
                for old in mine[:-keep] if keep > 0 else []:
                    shutil.rmtree(old, ignore_errors=True)
                mine = mine[-keep:] if keep > 0 else mine
            if last:
                print("Total time for train steps: 0.00s", flush=True)
                return
    print(f"{prefix}the epochs ended at step {step}, before step {total}", flush=True)
