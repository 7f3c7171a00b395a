#!/usr/bin/env python3
"""Turns the RESULT lines of bench/vs_deepspeed.sh's runs into a markdown report, a gnuplot PNG
(tokens per second of each end-to-end row; the loss curves of the first) and a one-line
summary. Every figure is the median over the repetitions; ratios are zinf / DeepSpeed, both
measured in the same run.

  python report.py LOG --header FILE --markdown OUT.md --png OUT.png --summary OUT.txt
"""

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402

LOSS_TOLERANCE = 1e-3  # relative, per step
# Issue 32's targets: zinf's tokens/s over DeepSpeed's in the same run, by placement.
TOKENS_TARGET = {"memory": 1.5, "cpu": 1.5, "nvme": 2.0}


def read_results(path):
    results = []
    with open(path) as f:
        for line in f:
            at = line.find(common.RESULT_PREFIX)
            if at >= 0:
                results.append(json.loads(line[at + len(common.RESULT_PREFIX):]))
    return results


def mib(n):
    return "-" if n is None else f"{n / 2**20:,.0f} MiB"


def ratio(a, b):
    return f"{a / b:.2f}x" if a and b else "-"


def fraction(a, b):
    return f"{a / b:.2f}" if a and b else "-"


def max_relative_difference(a, b):
    return max(abs(x - y) / abs(y) for x, y in zip(a, b)) if a and b else None


# Note [Loss spikes]
# fp32 runs of the same model differ by summation order only, about 1e-7 relative per op, and
# the two curves agree to that until the training spikes (lr 1e-3 without warmup makes the
# large size spike on some CPUs: torch_gpt 512 x 8 at step 32 on an Intel Xeon, where the
# gradient norm of that step came out 37 under DeepSpeed, 326 under zinf and 501 under torch's
# own AdamW from losses equal to 2e-6 the step before, bench/RESULTS.md). At a spike the
# trajectory is chaotic and the difference grows to whatever it grows to; before it, a wrong
# gradient or update shows from the first step. So a row outside the tolerance says whether
# it was within it up to the first spike: a step whose DeepSpeed loss rose by SPIKE_RISE, or
# whose DeepSpeed gradient norm rose by GRAD_SPIKE_RISE. A spike need not show in the loss:
# torch_gpt 512 x 8 on two ranks had its gradient norm rise 20x at step 31 (0.77 to 15.9) with
# the loss up 1.1x, the curves 1.2e-6 apart before it and 1e-2 twenty steps after.
SPIKE_RISE = 1.2
GRAD_SPIKE_RISE = 10.0


def first_spike(losses, grad_norms=None):
    """The index of the first step whose loss rose by SPIKE_RISE or whose gradient norm rose by
    GRAD_SPIKE_RISE over the step before, or None."""
    def rose(values, i, factor):
        return values is not None and i < len(values) and values[i] > factor * values[i - 1]
    return next((i for i in range(1, len(losses))
                 if rose(losses, i, SPIKE_RISE) or rose(grad_norms, i, GRAD_SPIKE_RISE)), None)


def loss_difference(losses_z, losses_d, grad_norms_d=None):
    """(the largest relative difference, the first spike's index or None, the largest
    difference before it) of two loss curves, the spike found in DeepSpeed's losses and
    gradient norms (Note [Loss spikes]); None for a missing curve."""
    diff = max_relative_difference(losses_z, losses_d)
    if diff is None:
        return None
    spike = first_spike(losses_d, grad_norms_d)
    before = max_relative_difference(losses_z[:spike], losses_d[:spike]) if spike else diff
    return diff, spike, before


def loss_verdict(losses_z, losses_d, grad_norms_d=None):
    """The loss column of an end-to-end row (Note [Loss spikes])."""
    difference = loss_difference(losses_z, losses_d, grad_norms_d)
    if difference is None:
        return "-"
    diff, spike, before = difference
    if diff <= LOSS_TOLERANCE:
        return f"{diff:.1e} (within 1e-3)"
    if spike is None or before > LOSS_TOLERANCE:
        return f"{diff:.1e} (OUTSIDE 1e-3)"
    return (f"{diff:.1e} (OUTSIDE 1e-3 after the spike of step {spike + 1}; "
            f"{before:.1e} before it)")


# Note [The compute limit]
# Both engines run the model's forward and backward as torch's own kernels, on the same cores;
# what an engine adds (gathers, swapping, the optimizer, hooks) can at best hide behind them.
# So no engine's tokens/s exceeds torch alone's forward and backward without ZeRO: train.py
# --side torch, timed without its optimizer step, and for N ranks one rank's share on cores / N
# threads counted N times (data parallelism that shares and communicates nothing). A target
# above that limit cannot be met by making zinf cheaper; the row says so, and how far zinf is
# from the limit instead. Each placement's rows take the torch runs interleaved with their own
# (train.py --beside): this machine's speed drifts within a run, and a limit taken in a slow
# quarter of an hour once read below zinf's tokens/s in rows run after it (bench/RESULTS.md).


# Note [The FLOP ceiling]
# Whatever kernels an engine brings, a step cannot take less time than its arithmetic at the
# machine's peak rate. The torch side measures that rate in the same run: the best of torch's
# fp32 1024 x 1024 matmuls on its threads, N ranks' worth (train.py's matmul_flops, within a
# few percent of the FMA units' peak on the CPUs measured). The model's FLOPs per token are 6 per
# matmul weight and 12 d_model x layers x seq for attention (train.py's flops_per_token; the
# norms, GELU, softmax and the optimizer are left out, so the ceiling is generous). A target
# above the ceiling cannot be met on this machine in fp32 by any engine, not only by one that
# runs torch's kernels.


def targets(placement, tokens_z, tokens_d, rss_z, rss_d, limit, ceiling=None):
    """Whether a row meets issue 32's targets, said in the row itself; a tokens/s target above
    the compute limit or the FLOP ceiling says so (Notes [The compute limit], [The FLOP
    ceiling])."""
    if not (tokens_z and tokens_d and rss_z and rss_d):
        return "-"
    goal = TOKENS_TARGET[placement]
    verdict = "met" if tokens_z >= goal * tokens_d else "NOT met"
    if verdict != "met" and limit and goal * tokens_d > limit:
        verdict += f" (the limit is {limit / tokens_d:.2f}x"
        if ceiling:
            above = " < the target" if goal * tokens_d > ceiling else ""
            verdict += f"; the FLOP ceiling {ceiling / tokens_d:.2f}x{above}"
        verdict += ")"
    return f"{goal}x {verdict}, {'met' if rss_z <= rss_d else 'NOT met'}"


def compute_limits(results):
    """(model, world, d_model, layers, placement) -> (the median compute limit, the median FLOP
    ceiling or None), both in tokens/s (Notes [The compute limit], [The FLOP ceiling]), from the
    torch runs interleaved with that placement's; placement None pools every torch run of the
    model and size (a log from before the runs said which placement they were beside)."""
    limits, ceilings = collections.defaultdict(list), collections.defaultdict(list)
    for r in results:
        if (r["kind"] == "e2e" and r["side"] == "torch" and "error" not in r
                and "compute_tokens_per_s" in r):
            model_size = (r["model"], r["world"], r["d_model"], r["layers"])
            for key in {model_size + (r.get("beside"),), model_size + (None,)}:
                limits[key].append(r["compute_tokens_per_s"])
                if r.get("matmul_flops"):
                    ceilings[key].append(r["matmul_flops"] / r["flops_per_token"])
    return {key: (common.median(values), common.median(ceilings[key]) if ceilings[key] else None)
            for key, values in limits.items()}


def e2e_table(results, out):
    rows = collections.defaultdict(lambda: collections.defaultdict(list))
    errors = {}
    limits = compute_limits(results)
    for r in results:
        if r["kind"] != "e2e" or r["side"] == "torch":
            continue
        key = (r["model"] if r["side"] != "zinf native" else "torch_gpt", r["placement"],
               r["world"], r["d_model"], r["layers"])
        if "error" in r:
            errors[(key, r["side"])] = r["error"]
        else:
            rows[key][r["side"]].append(r)
    out.append("| model | d_model x layers | placement | ranks | zinf tokens/s | DeepSpeed "
               "tokens/s | zinf / DeepSpeed | compute limit tokens/s (torch alone, forward and "
               "backward) | zinf / limit | DeepSpeed / limit | train_gpt tokens/s | peak RSS "
               "zinf / DeepSpeed / "
               "train_gpt | disk read + written per step, zinf / DeepSpeed | step split (fwd / "
               "bwd / step s) zinf; DeepSpeed | loss: max relative difference over the steps | "
               "targets: tokens/s, peak RSS |")
    out.append("|" + "---|" * 16)
    plot_rows, curves = [], None
    for key in sorted(set(rows) | {k for k, _ in errors}):
        model, placement, world, d_model, layers = key
        sides = rows[key]

        def med(side, field):
            runs = sides.get(side, [])
            return common.median([r[field] for r in runs]) if runs else None

        def split(side):
            runs = sides.get(side, [])
            if not runs:
                return errors.get((key, side), "-")[:60] if (key, side) in errors else "-"
            s = runs[0]["split"]
            return f"{s['forward_s']:.3f} / {s['backward_s']:.3f} / {s['step_s']:.3f}"

        def disk(side):
            runs = sides.get(side, [])
            if not runs or "disk_read_per_step" not in runs[0]:
                return "-"
            return (f"{mib(med(side, 'disk_read_per_step'))} + "
                    f"{mib(med(side, 'disk_written_per_step'))}")

        def tokens(side):
            value = med(side, "tokens_per_s")
            if value is None:
                return "refused (below)" if (key, side) in errors else "-"
            return f"{value:,.0f}"

        z, d = med("zinf", "tokens_per_s"), med("deepspeed", "tokens_per_s")
        losses_z = sides["zinf"][0]["losses"] if sides.get("zinf") else None
        losses_d = sides["deepspeed"][0]["losses"] if sides.get("deepspeed") else None
        grad_norms_d = sides["deepspeed"][0].get("grad_norms") if sides.get("deepspeed") else None
        verdict = loss_verdict(losses_z, losses_d, grad_norms_d)
        rss_z, rss_d = med("zinf", "peak_rss_bytes"), med("deepspeed", "peak_rss_bytes")
        limit, ceiling = limits.get((model, world, d_model, layers, placement),
                                    limits.get((model, world, d_model, layers, None), (None, None)))
        out.append(
            f"| {model} | {d_model} x {layers} | {placement} | {world} | {tokens('zinf')} | "
            f"{tokens('deepspeed')} | {ratio(z, d)} | "
            f"{'-' if limit is None else f'{limit:,.0f}'} | {fraction(z, limit)} | "
            f"{fraction(d, limit)} | {tokens('zinf native')} | "
            f"{mib(rss_z)} / {mib(rss_d)} / "
            f"{mib(med('zinf native', 'peak_rss_bytes'))} | {disk('zinf')} / {disk('deepspeed')} "
            f"| {split('zinf')}; {split('deepspeed')} | {verdict} | "
            f"{targets(placement, z, d, rss_z, rss_d, limit, ceiling)} |")
        plot_rows.append((f"{model.replace('_', '-')} {d_model}x{layers} {placement} n{world}",
                          z or 0, d or 0,
                          med("zinf native", "tokens_per_s") or 0, limit or 0, ceiling or 0))
        if curves is None and losses_z and losses_d:
            native = sides["zinf native"][0]["losses"] if sides.get("zinf native") else None
            curves = (f"{model} {placement} {world} rank(s)", losses_z, losses_d, native)
    for (key, side), error in sorted(errors.items()):
        out.append("")
        out.append(f"{side} refused {key[0]} / {key[1]} / {key[2]} rank(s): `{error[:400]}`")
    return plot_rows, curves


def adam_table(results, out, limits):
    rows = collections.defaultdict(dict)
    for r in results:
        if r["kind"] == "adam":
            key = (r["params"], r.get("tensors", 1), r["threads"], r.get("load", 0),
                   r.get("after_torch_op", False))
            rows[key].setdefault(r["side"], []).append(r["GBps"])
    if not rows:
        return
    out.append("")
    out.append("| parameters | threads | other busy processes | zinf.optim.AdamW GB/s | "
               "DeepSpeedCPUAdam GB/s | zinf / DeepSpeed | bandwidth limit GB/s (`zinf bench "
               "adam`, same load) | zinf / limit | DeepSpeed / limit |")
    out.append("|" + "---|" * 9)
    for (params, tensors, threads, load, after_op), sides in sorted(rows.items()):
        z, d = common.median(sides.get("zinf", [])), common.median(sides.get("deepspeed", []))
        limit = common.median(limits.get((params, threads, load), []))
        where = (f"{params / 2**20:g}M" + (f" in {tensors} tensors" if tensors > 1 else "") +
                 (", right after a torch op" if after_op else ""))
        out.append(f"| {where} | {threads} | {load} | {z:.2f} | {d:.2f} | "
                   f"{z / d:.2f}x | {limit:.2f} | {z / limit:.2f} | {d / limit:.2f} |")


def medians(sides, *names):
    """The median of each named side's runs (nan for a side with none)."""
    return tuple(common.median(sides[n]) if sides.get(n) else float("nan") for n in names)


def aio_table(results, out):
    rows = collections.defaultdict(dict)
    for r in results:
        if r["kind"] == "aio":
            rows[(r["size"], r["rw"])].setdefault(r["side"], []).append(r["GBps"])
    if not rows:
        return
    out.append("")
    out.append("| bytes | direction | zinf SwapHandle GB/s (CRC32C, its default) | without "
               "checksums | DeepSpeed aio_handle GB/s | fio GB/s | zinf / DeepSpeed | without "
               "checksums / DeepSpeed | zinf / fio | DeepSpeed / fio |")
    out.append("|" + "---|" * 10)
    for (size, rw), sides in sorted(rows.items()):
        z, p, d, f = medians(sides, "zinf", "zinf without checksums", "deepspeed", "fio")
        out.append(f"| {mib(size)} | {rw} | {z:.2f} | {p:.2f} | {d:.2f} | {f:.2f} | "
                   f"{z / d:.2f}x | {p / d:.2f}x | {z / f:.2f} | {d / f:.2f} |")
    fio_buffers = sorted({r["buffer"] for r in results
                          if r["kind"] == "aio" and r["side"] == "fio"})
    if fio_buffers:
        out.append("")
        out.append(f"fio's buffers: {'; '.join(fio_buffers)}.")
    files = collections.defaultdict(list)  # file -> the sides on it
    for r in results:
        if r["kind"] == "aio" and "file" in r and r["side"] not in files[r["file"]]:
            files[r["file"]].append(r["side"])
    if files:
        out.append("")
        out.append("Files (Note [One file for every side] in parts.py): " + "; ".join(
            f"{file}: " + ", ".join(f'"{side}"' for side in sides)
            for file, sides in files.items()) + ".")
    store_table(rows, out)
    ordinary = {key: sides for key, sides in rows.items() if "zinf, ordinary tensor" in sides}
    if not ordinary:
        return
    buffer = next(r["buffer"] for r in results
                  if r["kind"] == "aio" and r["side"] == "zinf, ordinary tensor")
    lines = []
    for (size, rw), sides in sorted(ordinary.items()):
        z, d, locked = medians(sides, "zinf, ordinary tensor", "deepspeed, ordinary tensor",
                               "zinf")
        lines.append([mib(size), rw, f"{z:.2f}", f"{d:.2f}", f"{z / d:.2f}x", f"{z / locked:.2f}"])
    sub_table(out, f"The same from and into an {buffer} and pageable, as a user passes one: each "
              "side stages it through page-aligned memory of its own.",
              ["bytes", "direction", "zinf GB/s (CRC32C)", "DeepSpeed GB/s", "zinf / DeepSpeed",
               "zinf: ordinary / locked buffer"], lines)


def sub_table(out, intro, columns, lines):
    """A paragraph, then a table under it."""
    out += ["", intro, "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    out += ["| " + " | ".join(cells) + " |" for cells in lines]


def store_table(rows, out):
    """zinf's store through fio's buffer size and through the whole size: how much of the
    handles' distance to fio is the memory the transfers land in."""
    small, whole = "zinf store, fio's buffer size", "zinf store, the whole size"
    rows = {key: sides for key, sides in rows.items() if small in sides and whole in sides}
    if not rows:
        return
    lines = []
    for (size, rw), sides in sorted(rows.items()):
        a, b, f = medians(sides, small, whole, "fio")
        lines.append([mib(size), rw, f"{a:.2f}", f"{b:.2f}", f"{b / a:.2f}", f"{f:.2f}",
                      f"{a / f:.2f}"])
    sub_table(out, "fio moves every block through a buffer of block size x queue depth; both "
              "handles move the whole tensor in place. zinf's swap store (`zinf bench nvme`, same "
              "settings, 2 MiB pages, no checksums) through a buffer of each size, in the same "
              "run:",
              ["bytes", "direction", "store, fio's buffer size GB/s", "store, the whole size GB/s",
               "whole / fio's size", "fio GB/s", "store, fio's size / fio"], lines)


def estimate_table(results, out):
    measured = collections.defaultdict(dict)
    for r in results:
        if r["kind"] == "e2e" and "error" not in r and r["model"] in ("torch_gpt", "train_gpt"):
            measured[(r["placement"], r["world"], r["d_model"])].setdefault(
                r["side"], []).append(r["peak_rss_bytes"])
    rows = [r for r in results if r["kind"] == "estimate"]
    if not rows:
        return
    out.append("")
    out.append("| placement | ranks | parameters | DeepSpeed estimate (model states, host) | "
               "zinf plan, all ranks (device tier + host tier + activations) | zinf plan NVMe | "
               "measured peak RSS zinf / DeepSpeed / train_gpt |")
    out.append("|" + "---|" * 7)
    for r in rows:
        m = measured.get((r["placement"], r["world"], r["d_model"]), {})
        out.append(
            f"| {r['placement']} | {r['world']} | {r['params'] / 1e6:.2f}M | "
            f"{mib(r['deepspeed_host_bytes'])} | {mib(r.get('zinf_plan_node_bytes'))} | "
            f"{mib(r['zinf_plan_nvme_bytes'])} | "
            f"{mib(common.median(m.get('zinf', [])) if m.get('zinf') else None)} / "
            f"{mib(common.median(m.get('deepspeed', [])) if m.get('deepspeed') else None)} / "
            f"{mib(common.median(m.get('zinf native', [])) if m.get('zinf native') else None)} |")


def plot(png, plot_rows, curves):
    with tempfile.TemporaryDirectory() as tmp:
        bars = os.path.join(tmp, "tokens.dat")
        with open(bars, "w") as f:
            for label, z, d, n, limit, _ in plot_rows:
                f.write(f'"{label}" {z} {d} {n} {limit}\n')
        script = [f'set terminal pngcairo noenhanced size 1400,{900 if curves else 500}',
                  f'set output "{png}"', "set multiplot layout %d,1" % (2 if curves else 1),
                  'set title "tokens/s (median), zinf vs DeepSpeed ZeRO-3 (CPU accelerator)"',
                  "set style data histograms", "set style fill solid 0.8", "set grid ytics",
                  "set xtics rotate by -30", "set ylabel 'tokens/s'",
                  f'plot "{bars}" using 2:xtic(1) title "zinf", "" using 3 title "DeepSpeed", '
                  f'"" using 4 title "train_gpt (native)", '
                  f'"" using 5 title "compute limit (torch alone, forward and backward)"']
        if curves:
            title, z, d, n = curves
            loss = os.path.join(tmp, "loss.dat")
            with open(loss, "w") as f:
                for i, (a, b) in enumerate(zip(z, d)):
                    f.write(f"{i + 1} {a} {b} {n[i] if n and i < len(n) else 'NaN'}\n")
            script += ["set style data linespoints", "set xtics norotate", "set xlabel 'step'",
                       "set ylabel 'loss'", f'set title "loss per step, {title}"',
                       f'plot "{loss}" using 1:2 title "zinf", "" using 1:3 title "DeepSpeed", '
                       f'"" using 1:4 title "train_gpt (own sampler, tied head)"']
        script.append("unset multiplot")
        subprocess.run(["gnuplot"], input="\n".join(script), text=True, check=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("log")
    ap.add_argument("--header", required=True, help="markdown that opens the report")
    ap.add_argument("--adam-limits", default="", help="JSON lines of `zinf bench adam --json`")
    ap.add_argument("--markdown", required=True)
    ap.add_argument("--png", required=True)
    ap.add_argument("--summary", required=True)
    ap.add_argument("--strict", action="store_true",
                    help="exit 1 when a zinf run failed or a loss curve is outside tolerance")
    args = ap.parse_args()
    results = read_results(args.log)
    limits = collections.defaultdict(list)
    if args.adam_limits and os.path.exists(args.adam_limits):
        with open(args.adam_limits) as f:
            for line in f:
                if line.startswith("{"):
                    j = json.loads(line)
                    limits[(j["params"], j["threads"], j.get("load_threads", 0))].append(
                        j["limit_GBps"])
    with open(args.header) as f:
        out = [f.read().rstrip()]
    stamped = [r for r in results if "utc" in r]
    if stamped:
        cpus = sorted({r["cpu"] for r in stamped})
        out += ["", f"The results below were measured from {min(r['utc'] for r in stamped)} to "
                f"{max(r['utc'] for r in stamped)} UTC, on {' and '.join(cpus)}."]
        if len(stamped) < len(results):
            out[-1] += (f" {len(results) - len(stamped)} of the {len(results)} come from an "
                        "earlier run that did not stamp its results (the section before this "
                        "report in bench/RESULTS.md says when).")
    unpartitioned = [r for r in results if r["kind"] == "e2e" and r["side"] != "zinf native"
                     and "construction" not in r]
    if unpartitioned:
        cases = sorted({f"{r['model']} {r['d_model']}x{r['layers']} {r['placement']} n{r['world']}"
                        for r in unpartitioned})
        out += ["", f"{len(unpartitioned)} end-to-end results ({', '.join(cases)}) come from runs "
                "that left partitioning to `initialize`, before both sides were partitioned by "
                "their `zero.Init(module=...)`: there DeepSpeed 0.19.8 on its CPU accelerator "
                "swaps parameters in bf16 whatever the config says (bench/RESULTS.md, "
                "2026-11-28)."]
    steps = sorted({r["steps"] for r in results if r["kind"] == "e2e" and "steps" in r})
    out += ["", f"End to end ({'/'.join(map(str, steps)) or 'no'} steps, the first "
            "2 not timed; tokens/s, RSS and disk bytes are medians over the repetitions, "
            "the split and the losses are the first repetition's):", ""]
    plot_rows, curves = e2e_table(results, out)
    adam_table(results, out, limits)
    aio_table(results, out)
    estimate_table(results, out)
    if plot_rows:  # a parts-only run has no tokens/s to plot
        out.append("")
        out.append(f"![zinf vs DeepSpeed]({os.path.basename(args.png)})")
    with open(args.markdown, "w") as f:
        f.write("\n".join(out) + "\n")
    if plot_rows:
        plot(os.path.abspath(args.png), plot_rows, curves)
    ratios = [z / d for _, z, d, _, _, _ in plot_rows if z and d]
    headroom = [limit / d for _, z, d, _, limit, _ in plot_rows if z and d and limit]
    flops = [ceiling / d for _, z, d, _, _, ceiling in plot_rows if z and d and ceiling]
    with open(args.summary, "w") as f:
        f.write(f"Against DeepSpeed ZeRO-3 on its CPU accelerator, same machine, same run "
                f"(`bench/vs_deepspeed.sh`, bench/RESULTS.md): zinf's tokens/s is "
                f"{min(ratios):.2f}x to {max(ratios):.2f}x DeepSpeed's over {len(ratios)} "
                f"model / placement / rank rows" +
                (f", where torch's own forward and backward alone, the limit of any engine that "
                 f"runs them, is {min(headroom):.2f}x to {max(headroom):.2f}x" if headroom
                 else "") +
                (f", and the model's arithmetic at this CPU's fp32 matmul peak, the limit of any "
                 f"engine at all, {min(flops):.2f}x to {max(flops):.2f}x" if flops else "") +
                ".\n"
                if ratios else "Against DeepSpeed (`bench/vs_deepspeed.sh`): no end-to-end row "
                "both sides ran.\n")
    if args.strict:
        problems = check(results)
        for p in problems:
            print(f"vs_deepspeed: {p}", file=sys.stderr)
        sys.exit(1 if problems else 0)


def check(results):
    """What makes a run fail: a zinf row that failed, no zinf row, or a loss curve that leaves
    DeepSpeed's by more than LOSS_TOLERANCE before the first spike (Note [Loss spikes])."""
    problems = [f"zinf ({r['side']}) failed on {r['model']} {r['placement']} {r['world']} "
                f"rank(s): {r['error'][:300]}"
                for r in results if r["kind"] == "e2e" and "error" in r
                and r["side"] not in ("deepspeed", "torch")]
    ran = {}
    for r in results:
        if r["kind"] == "e2e" and "error" not in r:
            ran.setdefault((r["model"], r["placement"], r["world"], r["d_model"]), {}).setdefault(
                r["side"], r)
    if not any("zinf" in sides for sides in ran.values()):
        problems.append("no end-to-end zinf run finished")
    for key, sides in ran.items():
        if "zinf" in sides and "deepspeed" in sides:
            diff, spike, before = loss_difference(sides["zinf"]["losses"],
                                                  sides["deepspeed"]["losses"],
                                                  sides["deepspeed"].get("grad_norms"))
            if before > LOSS_TOLERANCE:  # after a spike the curves part anyway: Note [Loss spikes]
                where = f" before the spike of step {spike + 1}" if spike else ""
                problems.append(
                    f"{key}: zinf's loss leaves DeepSpeed's by {before:.2e} relative{where}")
    return problems


if __name__ == "__main__":
    main()
