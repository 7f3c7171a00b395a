#!/usr/bin/env python3
"""What the GPT demo pays for its parameters on NVMe, against the same run in memory.

Runs `train_gpt --config examples/gpt/configs/demo.json` on RANKS ranks, REPS times, each time
with the parameters on NVMe (as shipped) and then in memory (offload_param none), interleaved
so that the machine's drift hits both alike. With --other BUILD it also runs that build's
trainer on NVMe in the same rotation (an earlier commit, built elsewhere), for a before/after.
Prints, per build and placement, the median over runs of each run's median of steps 6 on:
the step and its split (compute, parameter waits, Step), and the ratio of the NVMe step to
the memory step, whose floor is 1.

Usage: bench/demo_nvme_cost.py [--reps 5] [--ranks 2] [--nvme DIR] [--other BUILD_DIR]
Builds nothing: run `scripts/build.sh zinf train_gpt` first.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIELDS = ["step_s", "compute_s", "param_wait_s", "optimizer_s"]


def run(build, ranks, nvme, in_memory):
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "metrics.jsonl")
        cmd = [os.path.join(build, "bin/zinf"), "run", "-n", str(ranks), "--",
               os.path.join(build, "bin/train_gpt"), "--config", "examples/gpt/configs/demo.json",
               "--nvme-path", nvme, "--steps", "30", "--metrics", metrics]
        if in_memory:
            cmd += ["--set", 'zero_optimization.offload_param.device="none"']
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit("failed: %s\n%s" % (" ".join(cmd), p.stderr[-3000:]))
        rows = [json.loads(l) for l in open(metrics)]
        steady = [r for r in rows if r["step"] >= 6]
        return {f: statistics.median(r[f] for r in steady) for f in FIELDS}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--nvme", default=ROOT)
    ap.add_argument("--other", help="another build directory, run on NVMe in the rotation")
    a = ap.parse_args()
    here = os.path.join(ROOT, "build")
    lanes = [("this build, NVMe", here, False), ("this build, memory", here, True)]
    if a.other:
        lanes.insert(0, ("%s, NVMe" % a.other, os.path.abspath(a.other), False))
    results = {name: [] for name, _, _ in lanes}
    for rep in range(a.reps):
        for name, build, in_memory in lanes:
            r = run(build, a.ranks, a.nvme, in_memory)
            results[name].append(r)
            print("rep %d %-28s step %.1f ms" % (rep + 1, name, r["step_s"] * 1e3),
                  file=sys.stderr)
    memory = statistics.median(r["step_s"] for r in results["this build, memory"])
    print("| build, placement | step (ms) | compute | parameter waits | Step | step / memory |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, _, _ in lanes:
        m = {f: statistics.median(r[f] for r in results[name]) * 1e3 for f in FIELDS}
        print("| %s | %.1f (%s) | %.1f | %.1f | %.1f | %.2f |" % (
            name, m["step_s"], " ".join("%.1f" % (r["step_s"] * 1e3) for r in results[name]),
            m["compute_s"], m["param_wait_s"], m["optimizer_s"], m["step_s"] / 1e3 / memory))


if __name__ == "__main__":
    main()
