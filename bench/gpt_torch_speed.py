#!/usr/bin/python3
"""Training tokens/s of the GPT of tests/data/gpt_torch_ref.py in PyTorch (Debian's torch),
all in memory, AdamW, for bench/gpt_vs_torch.sh and bench/gpt_bf16.sh.

Usage: gpt_torch_speed.py CONFIG.json STEPS THREADS [fp32|bf16|both]
bf16 runs forward and loss under torch.autocast("cpu", dtype=torch.bfloat16): matmuls take
bf16 inputs (oneDNN's kernels in Debian's build), parameters, gradients and AdamW stay fp32,
the logits are widened to fp32 for the cross-entropy, as zinf's bf16 matmul path does.
A step is what zinf's is: gradient_accumulation_steps micro-batches of
train_micro_batch_size_per_gpu sequences, each forward and backward (the loss divided by the
accumulation, as DeepSpeed scales it), then one clip and one optimizer step.
Prints one JSON line: {"tokens_per_s": median over the steps after the first five}; with
"both", the two models train side by side, a step of each in turn, and the line is
{"fp32": ..., "bf16": ..., "bf16_over_fp32": the median of the steps' ratios}.
"""
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data"))
from gpt_torch_ref import Gpt  # noqa: E402  (the model the gradient check uses)


def main():
    config_path, steps, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    precision = sys.argv[4] if len(sys.argv) > 4 else "fp32"
    if precision not in ("fp32", "bf16", "both"):
        sys.exit(f"precision must be fp32, bf16 or both, got {precision}")
    config = json.load(open(config_path))
    model_config = {"vocab_size": 256, **config["model"]}
    model_config.pop("activation_checkpointing", None)
    batch = config.get("train_micro_batch_size_per_gpu", 1)
    accumulation = config.get("gradient_accumulation_steps", 1)
    if not isinstance(batch, int) or not isinstance(accumulation, int):
        sys.exit(f"{config_path}: give train_micro_batch_size_per_gpu and "
                 "gradient_accumulation_steps as integers")
    params = config["optimizer"]["params"]
    torch.set_num_threads(threads)
    arms = {}
    for arm in (("fp32", "bf16") if precision == "both" else (precision,)):
        torch.manual_seed(0)  # the same initial weights in both arms
        model = Gpt(model_config)
        optimizer = torch.optim.AdamW(model.parameters(), lr=params["lr"],
                                      betas=tuple(params.get("betas", (0.9, 0.999))),
                                      weight_decay=params.get("weight_decay", 0.0))
        arms[arm] = (model, optimizer, [])
    t, v = model_config["seq_len"], model_config["vocab_size"]
    names = list(arms)
    for step in range(steps):
        micro_batches = [torch.randint(0, v, (batch, t + 1)) for _ in range(accumulation)]
        # With both arms, a step of each, starting with the other one every step.
        for arm in names[step % len(names):] + names[:step % len(names)]:
            model, optimizer, rates = arms[arm]
            start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            for rows in micro_batches:
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=arm == "bf16"):
                    logits = model(rows[:, :-1])
                loss = F.cross_entropy(logits.float().reshape(-1, v), rows[:, 1:].reshape(-1))
                (loss / accumulation).backward()
            if config.get("gradient_clipping"):
                torch.nn.utils.clip_grad_norm_(model.parameters(), config["gradient_clipping"])
            optimizer.step()
            rates.append(accumulation * batch * t / (time.perf_counter() - start))
    if precision != "both":
        print(json.dumps({"tokens_per_s": statistics.median(arms[precision][2][5:])}))
        return
    fp32, bf16 = arms["fp32"][2][5:], arms["bf16"][2][5:]
    print(json.dumps({"fp32": statistics.median(fp32), "bf16": statistics.median(bf16),
                      "bf16_over_fp32": statistics.median(b / f for b, f in zip(bf16, fp32))}))


if __name__ == "__main__":
    main()
