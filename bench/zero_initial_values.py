#!/usr/bin/env python3
"""How long a model's values take to reach an engine whose parameters and optimizer state
are on NVMe: Initialize and then SetParameter per parameter (each a pass over the NVMe
optimizer state) against Initialize(values), which writes each shard piece to its home in
the one pass of initialization (what zinf.zero.initialize and zinf.zero.Init use).

Usage (PYTHONPATH holding the built package, --nvme-path on a real disk):
    PYTHONPATH=build/python /usr/bin/python3 bench/zero_initial_values.py \
        --nvme-path build/bench-nvme [--layers 32] [--width 512] [--runs 3]

Prints the configuration, then the median over --runs runs of each way (run alternately, so
load from other jobs hits both alike) and their ratio. Each run checks that a parameter
gathered back holds the values given.
"""

import argparse
import json
import os
import statistics
import time

import torch

from zinf import _zinf


def engine(nvme_path, layers, width):
    nvme = {"device": "nvme", "nvme_path": nvme_path}
    e = _zinf.Engine(json.dumps({
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {"stage": 3, "offload_param": nvme, "offload_optimizer": nvme},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}))
    for i in range(layers):
        e.register_module(f"l{i}", [(f"l{i}.w", [width, width]), (f"l{i}.b", [width])])
    return e


def hand_over(values, e, per_parameter):
    """Seconds from Initialize until every value is in the engine."""
    start = time.perf_counter()
    if per_parameter:
        e.initialize()
        for name, v in values.items():
            e.set_parameter(name, v.data_ptr(), v.numel())
    else:
        def read(name, first, count, out):
            torch.frombuffer(out, dtype=torch.float32).copy_(values[name][first:first + count])
        e.initialize(values=read)
    seconds = time.perf_counter() - start
    got = torch.frombuffer(bytearray(e.gather_parameter("l0.w")), dtype=torch.float32)
    assert torch.equal(got, values["l0.w"]), "the engine does not hold the values given"
    return seconds


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nvme-path", required=True)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    os.makedirs(args.nvme_path, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    values = {}
    for i in range(args.layers):
        values[f"l{i}.w"] = torch.randn(args.width * args.width, generator=g)
        values[f"l{i}.b"] = torch.randn(args.width, generator=g)
    elements = sum(v.numel() for v in values.values())
    print(f"{args.layers} modules of Linear({args.width}, {args.width}): {len(values)} parameters, "
          f"{elements * 4 / 2**20:.1f} MiB fp32; parameters and AdamW state on NVMe in "
          f"{args.nvme_path}; {args.runs} runs")
    times = {"set_parameter per parameter": [], "initialize(values)": []}
    for _ in range(args.runs):
        for way, per_parameter in zip(times, (True, False)):
            times[way].append(hand_over(values, engine(args.nvme_path, args.layers, args.width),
                                        per_parameter))
    median = {way: statistics.median(t) for way, t in times.items()}
    for way, t in times.items():
        print(f"{way:28s} median {median[way]:.3f} s  (runs {', '.join(f'{x:.3f}' for x in t)})")
    print(f"ratio {median['set_parameter per parameter'] / median['initialize(values)']:.1f}x")


if __name__ == "__main__":
    main()
