#!/usr/bin/env python3
"""Where the GPT example's compute goes, per oneDNN primitive, from oneDNN's own timings.

Runs `train_gpt` on one rank with ONEDNN_VERBOSE=1 (oneDNN prints each primitive's execution
time) and sums the last STEPS' calls by primitive, shape and layout: milliseconds a step,
calls a step and, for matmuls, GFLOP/s. The trainer's own loops (softmax, loss, column sums)
are not oneDNN's and do not show here: `perf record` shows them.

Usage: bench/gpt_kernel_split.py [--config examples/gpt/configs/memory.json] [--steps 12]
                                 [--last 6] [--threads 1] [-- extra train_gpt args]
Builds nothing: run `scripts/build.sh train_gpt` first.
"""
import argparse
import collections
import math
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="examples/gpt/configs/memory.json")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--last", type=int, default=6, help="steps summed (the first ones warm up)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("extra", nargs="*")
    a = ap.parse_args()
    cmd = [os.path.join(ROOT, "build/bin/train_gpt"), "--config", a.config, "--steps",
           str(a.steps), "--threads", str(a.threads)] + a.extra
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, ONEDNN_VERBOSE="1"))
    if p.returncode != 0:
        sys.exit("failed: %s\n%s" % (" ".join(cmd), p.stderr[-3000:]))
    calls = [l.split(",") for l in p.stdout.splitlines()
             if l.startswith(("onednn_verbose,exec,", "dnnl_verbose,exec,"))]
    per_step = len(calls) // a.steps
    calls = calls[-a.last * per_step:]
    # (kind, implementation, direction, shape, layouts) -> [calls, ms, FLOPs]
    rows = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for f in calls:
        kind, impl, direction, layouts, shape, ms = f[3], f[4], f[5], f[6], f[-2], float(f[-1])
        flops = 0.0
        if kind == "matmul":
            src, wei = shape.split(":")[:2]
            flops = 2.0 * math.prod(int(x) for x in src.split("x")) * int(wei.split("x")[-1])
        tags = " ".join(t.split("::")[1] for t in layouts.split() if "::" in t)
        row = rows[(kind, impl.split(":")[0], direction, shape, tags)]
        row[0] += 1
        row[1] += ms
        row[2] += flops
    total = sum(r[1] for r in rows.values()) / a.last
    print("%d oneDNN calls a step, %.2f ms a step (the mean of steps %d-%d)"
          % (per_step, total, a.steps - a.last + 1, a.steps))
    print("| ms / step | calls / step | GFLOP/s | primitive | shape | layouts |")
    print("| --- | --- | --- | --- | --- | --- |")
    by_kind = collections.defaultdict(float)
    for key, (n, ms, flops) in sorted(rows.items(), key=lambda kv: -kv[1][1]):
        by_kind[key[0]] += ms / a.last
        rate = "%.1f" % (flops / ms / 1e6) if flops else ""
        print("| %.2f | %d | %s | %s %s %s | %s | %s |" % (
            ms / a.last, n // a.last, rate, key[0], key[1], key[2], key[3], key[4]))
    print("by primitive (ms / step): " +
          ", ".join("%s %.2f" % kv for kv in sorted(by_kind.items(), key=lambda kv: -kv[1])))


if __name__ == "__main__":
    main()
