#!/usr/bin/env python3
"""zinf.optim.AdamW against torch.optim.AdamW on the same CPU parameters, in one process.

Usage (PYTHONPATH holding the built package, Debian's interpreter):
    PYTHONPATH=build/python /usr/bin/python3 bench/torch_adam.py [--params 16M] [--tensors 8]
        [--threads 2] [--runs 7] [--steps 5] [--param-copy bf16]

Each run times --steps optimizer steps of every variant in turn (zinf; torch's default
for-loop implementation; torch with foreach=True; a memory copy), so load from other jobs hits
all of them alike; the figure per variant is the median over --runs runs of the mean step time.
torch gets the same number of threads (torch.set_num_threads) as zinf. The limit is the copy
bandwidth measured in the same run (torch's copy_ of a buffer of the same size as the state:
read + write); AdamW moves 28 bytes per parameter (read p, g, m, v; write p, m, v), 30 with a
bf16 copy.
"""

import argparse
import statistics
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
    args = ap.parse_args()
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
    src = torch.ones(n * 4)  # as many bytes as the p, g, m, v arrays together
    dst = torch.empty_like(src)
    print(f"config: params {n} ({n / 2**20:.0f}M) in {args.tensors} tensors, threads "
          f"{args.threads} (torch.get_num_threads() {torch.get_num_threads()}), runs {args.runs} "
          f"x {args.steps} steps, param copy {args.param_copy}, zinf isa {zopt.isa}, "
          f"torch {torch.__version__}")
    for opt in variants.values():  # first step allocates the state
        opt.step()
    dst.copy_(src)

    times = {name: [] for name in variants}
    copy_times = []
    for run in range(args.runs):
        for name, opt in variants.items():
            times[name].append(time_steps(opt, args.steps))
        t0 = time.perf_counter()
        for _ in range(args.steps):
            dst.copy_(src)
        copy_times.append((time.perf_counter() - t0) / args.steps)
        print(f"run {run}: " + ", ".join(f"{k} {v[-1] * 1e3:.1f} ms" for k, v in times.items())
              + f", copy {copy_times[-1] * 1e3:.1f} ms")

    bytes_per_param = 28 + (2 if copy_dtype is not None else 0)
    copy_gbs = 2 * src.numel() * 4 / statistics.median(copy_times) / 1e9
    zinf_s = statistics.median(times["zinf.optim.AdamW"])
    print(f"limit: copy {copy_gbs:.1f} GB/s (read + write, median)")
    for name, t in times.items():
        med = statistics.median(t)
        gbs = n * bytes_per_param / med / 1e9
        print(f"{name}: median {med * 1e3:.1f} ms/step, {n / med / 1e9:.2f} G params/s, "
              f"{gbs:.1f} GB/s = {gbs / copy_gbs:.2f} of the copy limit, "
              f"{med / zinf_s:.2f}x zinf's time")
    # Per-run ratios too: the machine is shared, and ratios within a run are what compare.
    for name in list(variants)[1:]:
        ratios = [t / z for t, z in zip(times[name], times["zinf.optim.AdamW"])]
        print(f"ratio {name} / zinf.optim.AdamW: median {statistics.median(ratios):.2f} "
              f"(runs: {', '.join(f'{r:.2f}' for r in ratios)})")


if __name__ == "__main__":
    main()
