#!/usr/bin/env python3
"""`zinf plan`'s predictions against measured steps of the shipped GPT and MLP configs.

For each case, REPS times: profiles the machine (`zinf bench profile`), asks `zinf plan --json`
for the config's own placement under that profile, and runs the trainer; prints a Markdown
table: the median predicted step (its split; every prediction) against the median measured step
(the ratio of the medians, and the median of each run's ratio to the prediction taken just
before it, which the machine's drift disturbs less), the engine's host and NVMe bytes
after a step (StepSummary) against the predicted steady bytes, and peak RSS against the
predicted peak (engine and activations).

Usage: bench/plan_vs_measured.py [--reps 3] [--nvme DIR] [--profile FILE] [CASE ...]
Cases: see CASES below (default: all but gpt-large*, which take minutes).
Builds nothing: run `cmake --build build --target zinf train_gpt train_mlp` first.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ZINF = os.path.join(ROOT, "build/bin/zinf")
GPT = os.path.join(ROOT, "build/bin/train_gpt")
MLP = os.path.join(ROOT, "build/bin/train_mlp")

# name: (trainer, config, ranks, steps, extra trainer args)
CASES = {
    "mlp-memory": ("mlp", "examples/mlp/configs/memory.json", 1, 8, []),
    "mlp-cpu": ("mlp", "examples/mlp/configs/cpu.json", 1, 8, []),
    "mlp-nvme": ("mlp", "examples/mlp/configs/nvme.json", 1, 8, []),
    "mlp-infinity": ("mlp", "examples/mlp/configs/infinity.json", 1, 8, []),
    "mlp-infinity-2": ("mlp", "examples/mlp/configs/infinity.json", 2, 8, []),
    "gpt-memory": ("gpt", "examples/gpt/configs/memory.json", 1, 30, []),
    "gpt-demo": ("gpt", "examples/gpt/configs/demo.json", 2, 30, []),
    "gpt-demo-1": ("gpt", "examples/gpt/configs/demo.json", 1, 30, []),
    "gpt-nvme": ("gpt", "examples/gpt/configs/nvme.json", 1, 30, []),
    "gpt-large": ("gpt", "examples/gpt/configs/large.json", 1, 3, []),
    # One compute thread (train_gpt --threads 1, zinf plan --threads 1): on a machine whose
    # other core is busy, two threads' speed swings by several times from one run to the next.
    "gpt-memory-t1": ("gpt", "examples/gpt/configs/memory.json", 1, 30, ["--threads", "1"]),
    "gpt-demo-1-t1": ("gpt", "examples/gpt/configs/demo.json", 1, 30, ["--threads", "1"]),
    "gpt-nvme-t1": ("gpt", "examples/gpt/configs/nvme.json", 1, 30, ["--threads", "1"]),
    "gpt-large-t1": ("gpt", "examples/gpt/configs/large.json", 1, 3, ["--threads", "1"]),
}


def placement_of(config_path):
    """The PlacementName of a config, as `zinf plan` spells it."""
    with open(os.path.join(ROOT, config_path)) as f:
        c = json.load(f)
    z = c.get("zero_optimization", {})
    param = z.get("offload_param", {}).get("device", "none")
    optim = z.get("offload_optimizer", {}).get("device", "none")
    ratio = c.get("zinf", {}).get("optimizer_nvme_ratio", 1.0)
    if optim == "nvme" and ratio < 1:
        optim += " %g" % ratio
    prec = "bf16" if c.get("bf16", {}).get("enabled") else "fp16" if c.get("fp16", {}).get(
        "enabled") else "fp32"
    return "param %s, optim %s, %s" % (param, optim, prec)


def run_trainer(kind, config, ranks, steps, nvme, extra):
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "metrics.jsonl")
        if kind == "gpt":
            cmd = [GPT, "--config", config, "--steps", str(steps), "--nvme-path", nvme,
                   "--metrics", metrics] + extra
        else:
            cmd = [MLP, "--config", config, "--steps", str(steps), "--nvme-path", nvme] + extra
        if ranks > 1:
            cmd = [ZINF, "run", "-n", str(ranks), "--"] + cmd
        timed = ["/usr/bin/time", "-v"] + cmd
        p = subprocess.run(timed, cwd=ROOT, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit("failed: %s\n%s\n%s" % (" ".join(cmd), p.stdout[-3000:], p.stderr[-3000:]))
        rss = None
        if ranks == 1:
            m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr)
            rss = int(m.group(1)) * 1024 if m else None
        if kind == "gpt":
            rows = [json.loads(l) for l in open(metrics)]
            steady = rows[1:] if len(rows) > 2 else rows
            step = statistics.median(r["step_s"] for r in steady)
            last = rows[-1]
            m = re.search(r"peak RSS ([0-9.]+) (\w+)", p.stdout)
            if m and ranks > 1:  # rank 0's own figure (time -v would measure the launcher)
                unit = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[m.group(2)]
                rss = float(m.group(1)) * unit
            return step, last["host_bytes"], last["nvme_bytes"], rss
        line = [l for l in p.stdout.splitlines() if '"median_step_s"' in l][-1]
        j = json.loads(line[line.index("{"):])
        return j["median_step_s"], j["host_bytes"], j["nvme_bytes"], rss


def predict(kind, config, ranks, profile, extra, clipped):
    cmd = [ZINF, "plan", "--json", "--model", config, "--profile", profile, "--world-size",
           str(ranks)] + (["--clipped"] if clipped else [])
    if "--threads" in extra:
        cmd += ["--threads", extra[extra.index("--threads") + 1]]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("failed: %s\n%s%s" % (" ".join(cmd), p.stdout, p.stderr))
    j = json.loads(p.stdout[p.stdout.index("{"):])
    want = placement_of(config)
    for r in j["placements"]:
        if r["placement"] == want:
            return r
    sys.exit("no row %s in the plan" % want)


def mib(b):
    return "%.1f" % (b / 2**20) if b is not None else "-"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--nvme", default=os.path.join(ROOT, "build/plan-nvme"))
    ap.add_argument("--profile", default="", help="use this profile (default: profile before "
                    "each run)")
    ap.add_argument("--quick-profile", action="store_true")
    ap.add_argument("--clipped", action="store_true",
                    help="plan for steps that clip (zinf plan --clipped): the shipped configs "
                    "clip at 1.0, and these models' gradient norms are far above it")
    ap.add_argument("cases", nargs="*")
    a = ap.parse_args()
    cases = a.cases or [c for c in CASES if not c.startswith("gpt-large")]
    os.makedirs(a.nvme, exist_ok=True)
    profile = a.profile

    def reprofile():
        path = os.path.join(a.nvme, "profile.json")
        cmd = [ZINF, "bench", "profile", "--path", a.nvme, "--out", path]
        p = subprocess.run(cmd + (["--quick"] if a.quick_profile else []), capture_output=True,
                           text=True)
        if p.returncode != 0:
            sys.exit("failed: %s\n%s" % (" ".join(cmd), p.stderr[-3000:]))
        return path
    print("| case | ranks | placement | predicted step (compute / gather / reduce / optimizer / "
          "NVMe) | measured step (median; runs) | measured / predicted (medians; paired runs' "
          "median) | host bytes predicted / "
          "StepSummary (MiB) | NVMe bytes predicted / StepSummary (MiB) | peak predicted / RSS "
          "(MiB) |")
    print("|" + "---|" * 9)
    for name in cases:
        kind, config, ranks, steps, extra = CASES[name]
        # The machine's speed drifts with its neighbours' load: a fresh profile before each
        # run, and the prediction of that profile beside it.
        runs, preds = [], []
        for _ in range(a.reps):
            p = profile or reprofile()
            preds.append(predict(kind, config, ranks, p, extra, a.clipped))
            runs.append(run_trainer(kind, config, ranks, steps, a.nvme, extra))
        r = sorted(preds, key=lambda x: x["step_s"])[len(preds) // 2]
        step = statistics.median(x[0] for x in runs)
        host = runs[-1][1]
        nvme = runs[-1][2]
        rss = statistics.median(x[3] for x in runs) if runs[0][3] is not None else None
        peak = r["peak_device_bytes"] + r["peak_host_bytes"] + r["activation_bytes"]
        paired = statistics.median(x[0] / p["step_s"] for x, p in zip(runs, preds))
        print("| %s | %d | %s | %.3f s (%.3f / %.3f / %.3f / %.3f / %.3f); %s | %.3f s; %s | %.2f; **%.2f** | "
              "%s / %s | %s / %s | %s / %s |" %
              (name, ranks, r["placement"], r["step_s"], r["compute_s"], r["gather_s"],
               r["reduce_s"], r["optimizer_s"], r["nvme_s"],
               " ".join("%.3f" % x["step_s"] for x in preds), step,
               " ".join("%.3f" % x[0] for x in runs), step / r["step_s"], paired,
               mib(r["steady_host_bytes"]), mib(host), mib(r["nvme_bytes"]), mib(nvme), mib(peak),
               mib(rss)))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
