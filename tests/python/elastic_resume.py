"""A DeepSpeed loop on zinf.initialize whose global batch is the same whatever the world size
and gradient accumulation: step s trains samples [s*B, (s+1)*B), rank r's micro-batch k the
slice at (r*gas + k)*micro. Trains --steps steps, saving a checkpoint after --save_after of
them, or with --resume first loads --save_dir's checkpoint and trains the steps after it.
Prints one JSON line per rank: {"rank": r, "losses": {"STEP:OFFSET": loss}}, so that runs of
other shapes compare micro-batch by micro-batch (tests/python/test_initialize.py).

    PYTHONPATH=build/python build/bin/zinf run -n 2 -- python3 tests/python/elastic_resume.py \\
        --gas 1 --steps 6 --save_after 3 --save_dir DIR
"""

import argparse
import json
import sys

import torch

import initialize_train
import zinf

BATCH = 8


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gas", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--save_after", type=int, default=-1)
    parser.add_argument("--save_dir", required=True)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()

    torch.manual_seed(0)
    net = initialize_train.Net()
    config = {"train_batch_size": BATCH, "gradient_accumulation_steps": args.gas,
              "optimizer": {"type": "AdamW", "params": {"lr": 0.02, "weight_decay": 0.01}},
              "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 4}},
              "zero_optimization": {"stage": 3}}
    engine, _, _, _ = zinf.initialize(model=net, config=config)
    if args.resume:
        path, _ = engine.load_checkpoint(args.save_dir)
        assert path is not None, f"no checkpoint in {args.save_dir}"
    micro = engine.train_micro_batch_size_per_gpu()
    x, y = initialize_train.dataset(BATCH * args.steps).tensors
    losses = {}
    for step in range(engine.global_steps, args.steps):
        for k in range(args.gas):
            at = (engine.global_rank * args.gas + k) * micro
            begin = step * BATCH + at
            loss = engine((x[begin:begin + micro], y[begin:begin + micro]))
            engine.backward(loss)
            engine.step()
            losses[f"{step}:{at}"] = loss.item()
        if step + 1 == args.save_after:
            engine.save_checkpoint(args.save_dir)
    print(json.dumps({"rank": engine.global_rank, "losses": losses}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
