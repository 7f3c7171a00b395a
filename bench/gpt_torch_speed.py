#!/usr/bin/python3
"""Training tokens/s of the GPT of tests/data/gpt_torch_ref.py in PyTorch (Debian's torch),
all in memory, AdamW, for bench/gpt_vs_torch.sh and bench/gpt_bf16.sh.

Usage: gpt_torch_speed.py CONFIG.json STEPS THREADS [fp32|bf16]
bf16 runs forward and loss under torch.autocast("cpu", dtype=torch.bfloat16): matmuls take
bf16 inputs (oneDNN's kernels in Debian's build), parameters, gradients and AdamW stay fp32,
the logits are widened to fp32 for the cross-entropy, as zinf's bf16 matmul path does.
Prints one JSON line: {"tokens_per_s": median over the steps after the first five}.
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
    if precision not in ("fp32", "bf16"):
        sys.exit(f"precision must be fp32 or bf16, got {precision}")
    config = json.load(open(config_path))
    model_config = {"vocab_size": 256, **config["model"]}
    model_config.pop("activation_checkpointing", None)
    batch = config.get("train_micro_batch_size_per_gpu", 1)
    params = config["optimizer"]["params"]
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = Gpt(model_config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=params["lr"],
                                  betas=tuple(params.get("betas", (0.9, 0.999))),
                                  weight_decay=params.get("weight_decay", 0.0))
    t, v = model_config["seq_len"], model_config["vocab_size"]
    rates = []
    for _ in range(steps):
        rows = torch.randint(0, v, (batch, t + 1))
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits = model(rows[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, v), rows[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if config.get("gradient_clipping"):
            torch.nn.utils.clip_grad_norm_(model.parameters(), config["gradient_clipping"])
        optimizer.step()
        rates.append(batch * t / (time.perf_counter() - start))
    print(json.dumps({"tokens_per_s": statistics.median(rates[5:])}))


if __name__ == "__main__":
    main()
