#!/usr/bin/env python3
"""zinf.optim.AdamW against torch.optim.AdamW on the same CPU parameters, in one process.

Usage (PYTHONPATH holding the built package, Debian's interpreter):
    PYTHONPATH=build/python /usr/bin/python3 bench/torch_adam.py [--params 16M] [--tensors 8]
        [--threads 2] [--runs 7] [--steps 5] [--param-copy bf16]

Each run times --steps optimizer steps of every variant in turn (zinf; torch's default
for-loop implementation; torch with foreach=True), then measures the limit, so load from other
jobs hits all of them alike; the figure per variant is the median over --runs runs of the mean
step time. torch gets the same number of threads (torch.set_num_threads) as zinf. The limit
is memory bandwidth for the step's own access pattern, from `zinf bench adam` (--zinf, default
build/bin/zinf) in the same run: the best of four in-place read-modify-write passes over the
same number of parameters and threads; AdamW moves 28 bytes per parameter (read p, g, m, v;
write p, m, v), 30 with a bf16 copy.
"""

import argparse
import json
import os
import statistics
import subprocess
import time

import torch

import zinf
import zinf.optim


def parse_count(text):
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1].upper(), 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def make(n_total, tensors, seed):
    g = torch.Generator().manual_seed(seed)
    sizes = [n_total // tensors] * tensors
    sizes[-1] += n_total - sum(sizes)
    params = [torch.nn.Parameter(torch.randn(n, generator=g)) for n in sizes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g) * 1e-2
    return params


def time_steps(opt, steps):
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.step()
    return (time.perf_counter() - t0) / steps


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params", default="16M")
    ap.add_argument("--tensors", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--param-copy", choices=["none", "bf16"], default="none")
    ap.add_argument("--zinf", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                   "..", "build", "bin", "zinf"))
    args = ap.parse_args()
    if not os.path.exists(args.zinf):
        ap.error(f"{args.zinf} is not built (cmake --build build --target zinf), or give --zinf")
    n = parse_count(args.params)
    torch.set_num_threads(args.threads)
    copy_dtype = torch.bfloat16 if args.param_copy == "bf16" else None

    variants = {
        "zinf.optim.AdamW": zinf.optim.AdamW(make(n, args.tensors, 0), lr=1e-3,
                                             weight_decay=0.01, threads=args.threads,
                                             param_copy_dtype=copy_dtype),
        "torch.optim.AdamW": torch.optim.AdamW(make(n, args.tensors, 0), lr=1e-3,
                                               weight_decay=0.01),
        "torch.optim.AdamW(foreach=True)": torch.optim.AdamW(make(n, args.tensors, 0), lr=1e-3,
                                                             weight_decay=0.01, foreach=True),
    }
    zopt = variants["zinf.optim.AdamW"]

    def limit_gbs():
        out = subprocess.run([args.zinf, "bench", "adam", "--params", str(n), "--threads",
                              str(args.threads), "--param-copy", args.param_copy, "--reps", "3",
                              "--json"], capture_output=True, text=True, check=True).stdout
        return json.loads(out.strip().splitlines()[-1])["limit_GBps"]
    print(f"config: params {n} ({n / 2**20:.0f}M) in {args.tensors} tensors, threads "
          f"{args.threads} (torch.get_num_threads() {torch.get_num_threads()}), runs {args.runs} "
          f"x {args.steps} steps, param copy {args.param_copy}, zinf isa {zopt.isa}, "
          f"torch {torch.__version__}")
    for opt in variants.values():  # first step allocates the state
        opt.step()

    times = {name: [] for name in variants}
    limits = []
    for run in range(args.runs):
        for name, opt in variants.items():
            times[name].append(time_steps(opt, args.steps))
        limits.append(limit_gbs())
        print(f"run {run}: " + ", ".join(f"{k} {v[-1] * 1e3:.1f} ms" for k, v in times.items())
              + f", limit {limits[-1]:.1f} GB/s")

    bytes_per_param = 28 + (2 if copy_dtype is not None else 0)
    limit = statistics.median(limits)
    zinf_s = statistics.median(times["zinf.optim.AdamW"])
    print(f"limit: {limit:.1f} GB/s (zinf bench adam's in-place read-modify-write, median)")
    for name, t in times.items():
        med = statistics.median(t)
        gbs = n * bytes_per_param / med / 1e9
        print(f"{name}: median {med * 1e3:.1f} ms/step, {n / med / 1e9:.2f} G params/s, "
              f"{gbs:.1f} GB/s = {gbs / limit:.2f} of the limit, "
              f"{med / zinf_s:.2f}x zinf's time")
    # Per-run ratios too: the machine is shared, and ratios within a run are what compare.
    for name in list(variants)[1:]:
        ratios = [t / z for t, z in zip(times[name], times["zinf.optim.AdamW"])]
        print(f"ratio {name} / zinf.optim.AdamW: median {statistics.median(ratios):.2f} "
              f"(runs: {', '.join(f'{r:.2f}' for r in ratios)})")


if __name__ == "__main__":
    main()
