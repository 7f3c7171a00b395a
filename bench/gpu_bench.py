#!/usr/bin/env python3
"""Plain PyTorch against zinf on one GPU, in the same run (issue 61, item 5): the driver of
scripts/gpu_bench.sh, which runs each part as a process of its own under its own time box and
merges what they wrote.

    gpu_bench.py part a|b|c --out PART.json [--budget-s S] [--dry-run] [--peak-tflops T]
    gpu_bench.py report --dir DIR --status FILE --json OUT.json --txt OUT.txt
    gpu_bench.py check                        (imports what the parts need; for --dry-run)

Parts (each prints its configuration first, then its figures; every figure goes to PART.json,
rewritten after each phase, so a part killed by its time box leaves what it had measured):
  a  examples/torch's GPT at 85.65M (12 x 768, 12 heads, seq 256) with its parameters in GPU
     memory, fp32 and then bf16: torch alone (AdamW fused on the GPU; bf16 under
     torch.autocast) and zinf.zero (parameters on the GPU, offload_optimizer cpu, bf16 from the
     config), a step of each in turn from the same weights and batches; tokens/s medians and
     zinf/torch.
  b  the same GPT at 1.31B (26 x 2048, 16 heads, seq 512), bf16: torch alone on the GPU against
     zinf with its parameters in host memory (offload_param cpu) and its optimizer on the CPU,
     interleaved likewise.
  c  a Llama-shaped model (transformers' LlamaForCausalLM from a config: Llama-2-7B's width,
     as many of its 32 layers as the machine holds, Note [Which Llama]) built under
     zinf.zero.Init, parameters and optimizer state in host memory, activation checkpointing,
     the GPU capped below the model's bf16 size (Note [Capped below the model]); before it,
     torch alone on the same width with the layers that fit the whole GPU (its MFU is the
     reference: torch alone cannot train the capped model).
Every step is timed between two torch.cuda.synchronize(); TFLOPS count 6 x parameters x tokens
a step; MFU is against the GPU's dense bf16 peak (PEAK_BF16_TFLOPS, or --peak-tflops). Each
zinf run ends with a torch.profiler table (the top ops by self CUDA time) and its step
summaries' counters (host waits, copies and bytes each way, memsets, the device tier's peak).

--dry-run: the same code on the CPU with tiny models, one or two steps a part (the engine on
the host device, zinf.device_budget on its budget), so that CI proves every part's path
without a GPU. Exit codes: 0 ran, 77 skipped (PART.json says why), 1 failed (it says where).

Note [Which Llama]
The largest depth of Llama-2-7B's shape (hidden 4096, MLP 11008, 32 heads, vocabulary 32000,
sequence 2048; 32 layers = 6.74B parameters) whose state fits this machine: the host bytes
`zinf plan` gives for "param cpu, optim cpu, bf16" (18 bytes a parameter: fp32 master, AdamW's
two states and the fp32 gradient accumulators, and the bf16 parameter tier) plus 10 GiB for
the process (torch, CUDA, transformers) within 85% of MemAvailable (the host state is pinned:
the kernel cannot reclaim it); Init's spill (4 bytes a parameter, under TMPDIR) within 80% of
that disk's free space; and the part's time box, at --llama-setup-rate parameters a second for
the build and initialize (single-threaded RNG and the spill dominate; Init built 19M
parameters a second on 2 loaded cores of the development VM) and an estimated step. One H200
machine (128 GiB, about 120 GiB available) holds about 25 layers (5.3B): the whole 7B needs
121 GB of host state, and its optimizer on NVMe would move 81 GB a step (80 s at the disk's
2 GB/s), beyond this benchmark's minutes.

Note [Capped below the model]
zinf's device tier is zinf.device_budget: twice the largest module's working set (the
embedding and the LM head, 131M parameters each) and the read-ahead window twice, the least the
engine computes in (raised to what the engine names if it refuses); torch's own allocator is
capped (torch.cuda.set_per_process_memory_fraction) at 95% of the model's bf16 bytes less that
budget, so the process holds less GPU memory than the model's bf16 parameters alone. The
micro-batch is what fits torch's share: one probe step at one sequence measures its peak, and
the micro-batch is 80% of the share over that (at most --llama-micro-max). Gradient
accumulation (--llama-accum) spreads the CPU optimizer's pass over several micro-batches; the
parameters' upload and the gradients' way down come with every micro-batch and hide only under
its compute, which that share bounds: --llama-torch-cap none leaves torch's allocator uncapped
(the device tier alone is then below the model) for a micro-batch large enough to hide them.
"""

import argparse
import gc
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SKIP = 77

# Dense bf16 tensor-core TFLOPS by device name (NVIDIA's datasheets), the first match wins.
PEAK_BF16_TFLOPS = [
    ("H200 NVL", 835, "H200 NVL"),
    ("H200", 989, "H200 SXM"),
    ("GH200", 989, "GH200"),
    ("H100 PCIe", 756, "H100 PCIe"),
    ("H100 NVL", 835, "H100 NVL"),
    ("H100", 989, "H100 SXM (HBM3)"),
    ("H800", 989, "H800 SXM"),
    ("A100", 312, "A100"),
]

# The step summary's counters the report shows (issue 61, item 4), in this order.
COUNTERS = ["host_waits", "worker_waits", "copies_up", "bytes_up", "copies_down", "bytes_down",
            "copies_on_device", "bytes_on_device", "copies_host", "bytes_host",
            "device_bytes_set", "host_bytes_set", "host_bytes_copied", "device_peak_bytes",
            "device_budget_bytes", "seconds_gather", "seconds_reduce", "seconds_optimizer",
            "bytes_gathered", "bytes_reduce_scattered", "peak_live_parameters", "grad_norm"]

GPT_85M = dict(vocab=256, seq=256, d_model=768, heads=12, layers=12)
GPT_13B = dict(vocab=256, seq=512, d_model=2048, heads=16, layers=26)
GPT_DRY = dict(vocab=256, seq=32, d_model=64, heads=4, layers=2)
LLAMA_7B = dict(hidden=4096, intermediate=11008, heads=32, kv_heads=32, vocab=32000, seq=2048,
                layers=32)
LLAMA_DRY = dict(hidden=64, intermediate=172, heads=4, kv_heads=4, vocab=256, seq=32, layers=4)
ADAMW = {"lr": 1e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}
CLIP = 1.0
GiB = 1 << 30


# --- what every part shares -------------------------------------------------------------------

class Record:
    """A part's figures, rewritten to `path` (atomically) at each save()."""

    def __init__(self, path, part):
        self.path = path
        self.data = {"part": part, "status": "running", "phase": "start", "started_unix_s":
                     time.time(), "notes": []}
        self.t0 = time.monotonic()
        self.save()

    def phase(self, name):
        self.data["phase"] = name
        self.data.setdefault("phases_s", {})[name] = round(time.monotonic() - self.t0, 2)
        print(f"[{time.monotonic() - self.t0:7.1f} s] {name}", flush=True)
        self.save()

    def note(self, text):
        print(f"NOTE: {text}", flush=True)
        self.data["notes"].append(text)
        self.save()

    def save(self):
        self.data["elapsed_s"] = round(time.monotonic() - self.t0, 2)
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f, indent=1, default=_json_default)
        os.replace(tmp, self.path)


def _json_default(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)


def meminfo(key):
    """/proc/meminfo's KEY in bytes, 0 where there is none."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def peak_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def peak_for(name):
    """(dense bf16 TFLOPS, which entry) for a device name, (None, None) where none matches."""
    for key, tflops, what in PEAK_BF16_TFLOPS:
        if key in name:
            return tflops, what
    return None, None


def machine(torch, dev, peak_override):
    """What the figures were taken on; the peak MFU is counted against."""
    m = {"torch": torch.__version__, "torch_cuda": torch.version.cuda,
         "python": sys.version.split()[0], "cpus": os.cpu_count(),
         "host_memory_bytes": meminfo("MemTotal"), "host_available_bytes": meminfo("MemAvailable"),
         "device": str(dev), "tf32_matmul": None, "peak_bf16_tflops": None, "peak_source": None}
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        m.update(gpu=props.name, gpu_memory_bytes=props.total_memory,
                 tf32_matmul=torch.backends.cuda.matmul.allow_tf32)
        tflops, what = peak_for(props.name)
        if tflops:
            m.update(peak_bf16_tflops=tflops, peak_source=f"{what}: {tflops} dense bf16 TFLOPS "
                     f"(datasheet), matched from the device name {props.name!r}")
        else:
            m["peak_source"] = f"no datasheet peak known for {props.name!r}: give --peak-tflops"
    if peak_override:
        m.update(peak_bf16_tflops=peak_override, peak_source=f"--peak-tflops {peak_override}")
    if m["peak_bf16_tflops"] is None and dev.type != "cuda":
        m["peak_source"] = "no GPU (dry run): MFU not counted"
    return m


def sync(torch, dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def median(values):
    return statistics.median(values) if values else None


def flops_figures(params, tokens_per_step, step_s, peak_tflops):
    """TFLOPS (6 x parameters x tokens a step) and MFU of one median step time."""
    if not step_s:
        return {"tokens_per_s": None, "tflops": None, "mfu": None}
    tflops = 6.0 * params * tokens_per_step / step_s / 1e12
    return {"tokens_per_s": tokens_per_step / step_s, "tflops": tflops,
            "mfu": tflops / peak_tflops if peak_tflops else None}


def summary_counters(summaries):
    """The last measured step's summary, and each counter's median over the measured steps."""
    if not summaries:
        return {}
    keys = [k for k in COUNTERS if k in summaries[-1]]
    plain = {k: v for k, v in summaries[-1].items() if isinstance(v, (int, float, bool))}
    return {"last": plain,
            "median": {k: median([s[k] for s in summaries if k in s]) for k in keys}}


def profile_table(torch, dev, run_steps, steps, rec, key):
    """torch.profiler over `steps` calls of run_steps(i): the table of the top 30 ops by self
    CUDA time (self CPU time on the host), kept in rec.data[key]."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU]
    if dev.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    try:
        with profile(activities=activities) as prof:
            for i in range(steps):
                run_steps(i)
                sync(torch, dev)
        averages = prof.key_averages()
        table = None
        for sort in (["self_cuda_time_total", "self_device_time_total"] if dev.type == "cuda"
                     else ["self_cpu_time_total"]):
            try:
                table = averages.table(sort_by=sort, row_limit=30, max_name_column_width=60)
                break
            except Exception as e:
                last = e
        if table is None:
            raise RuntimeError(f"no sort key the profiler knows: {last}")
        rec.data[key] = {"steps": steps, "sorted_by": sort, "table": table}
    except Exception as e:  # the profiler (CUPTI) failing must not lose the part's figures
        rec.data[key] = {"steps": steps, "error": f"{type(e).__name__}: {e}"}
        rec.note(f"the profiler failed: {type(e).__name__}: {e}")
    rec.save()


def interleaved(torch, dev, arms, warmup, steps, deadline):
    """Runs a step of each arm in turn (the order flips every step), `warmup` + `steps` times
    or until `deadline` (time.monotonic) once two steps were measured. arms: {name: step(i)},
    each returning (loss, summary or None). Returns ({name: {"seconds": [...], "losses": [...],
    "summaries": [...]}} over the measured steps, and the traceback of the step that raised,
    which ends the loop, else None), so that what was measured before a failure is kept."""
    out = {name: {"seconds": [], "losses": [], "summaries": []} for name in arms}
    names = list(arms)
    for i in range(warmup + steps):
        if i >= warmup + 2 and time.monotonic() > deadline:
            break
        for name in (names if i % 2 == 0 else names[::-1]):
            sync(torch, dev)
            t0 = time.perf_counter()
            try:
                loss, summary = arms[name](i)
                sync(torch, dev)
            except Exception as e:
                return out, (f"{name}'s step {i + 1}: {type(e).__name__}: {e}",
                             traceback.format_exc())
            seconds = time.perf_counter() - t0
            loss = float(loss)
            print(f"  step {i + 1:3d} {name:5s} {seconds * 1e3:9.1f} ms  loss {loss:.4f}"
                  f"{'  (warm-up)' if i < warmup else ''}", flush=True)
            if i >= warmup:
                out[name]["seconds"].append(seconds)
                out[name]["losses"].append(loss)
                if summary is not None:
                    out[name]["summaries"].append(summary)
    return out, None


def batches_for(torch, dev, vocab, seq, micro, count, seed=1234):
    """`count` batches of `micro` random sequences of seq + 1 tokens, on the device."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (micro, seq + 1), generator=g).to(dev) for _ in range(count)]


def torch_adamw(torch, dev, params):
    kwargs = dict(lr=ADAMW["lr"], betas=tuple(ADAMW["betas"]), eps=ADAMW["eps"],
                  weight_decay=ADAMW["weight_decay"])
    if dev.type == "cuda":
        kwargs["fused"] = True
    return torch.optim.AdamW(params, **kwargs)


def zinf_config(micro, accum, bf16, offload_param, extra_zero=None, zinf_keys=None):
    zero = {"stage": 3, "offload_optimizer": {"device": "cpu"}}
    if offload_param != "none":
        zero["offload_param"] = {"device": offload_param}
    zero.update(extra_zero or {})
    config = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": accum,
              "zero_optimization": zero, "gradient_clipping": CLIP,
              "optimizer": {"type": "AdamW", "params": dict(ADAMW)}}
    if bf16:
        config["bf16"] = {"enabled": True}
    if zinf_keys:
        config["zinf"] = dict(zinf_keys)
    return config


def free_cuda(torch, dev):
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


# --- parts a and b: examples/torch's GPT --------------------------------------------------------

def gpt_arms(torch, F, dev, shape, micro, precision, offload_param, rec, key):
    """The torch and zinf arms of one GPT comparison, from the same initial weights."""
    import zinf.zero
    sys.path.insert(0, os.path.join(REPO, "examples", "torch"))
    from train_gpt import GPT

    torch.manual_seed(0)
    with torch.device(dev):  # the initialization runs where the model lives (fast on a GPU)
        model = GPT(shape["vocab"], shape["seq"], shape["d_model"], shape["heads"],
                    shape["layers"])
    params = sum(p.numel() for p in model.parameters())
    # zinf's copy: the same values, on the GPU (part a) or in host memory (part b).
    with torch.device("meta"):
        zmodel = GPT(shape["vocab"], shape["seq"], shape["d_model"], shape["heads"],
                     shape["layers"])
    zmodel = zmodel.to_empty(device=dev if offload_param == "none" else "cpu")
    zmodel.load_state_dict(model.state_dict())
    bf16 = precision == "bf16"
    optimizer = torch_adamw(torch, dev, model.parameters())
    config = zinf_config(micro, 1, bf16, offload_param)
    rec.data[key]["zinf_config"] = config
    t0 = time.monotonic()
    try:
        engine = zinf.zero.initialize(model=zmodel, config=config)
        rec.data[key]["zinf_initialize_s"] = round(time.monotonic() - t0, 2)
        rec.data[key]["engine_device"] = str(engine.device)
    except Exception as e:  # torch alone is still measured; run_gpt reports the failure
        engine = None
        rec.data[key]["error"] = f"zinf's initialize: {type(e).__name__}: {e}\n" + \
            traceback.format_exc()
        rec.note(f"{key}: zinf's initialize failed: {type(e).__name__}: {str(e)[:300]}; torch "
                 f"alone is measured")
    vocab = shape["vocab"]

    def loss_of(logits, batch):
        return F.cross_entropy(logits.float().reshape(-1, vocab), batch[:, 1:].reshape(-1))

    def torch_step(batch):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(batch[:, :-1])
        loss = loss_of(logits, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        optimizer.step()
        return loss.detach(), None

    def zinf_step(batch):
        loss = loss_of(engine(batch[:, :-1]), batch)
        engine.backward(loss)
        return loss.detach(), engine.step()

    return params, model, optimizer, engine, torch_step, zinf_step


def run_gpt(torch, dev, args, rec, key, shape, micro, precision, offload_param, warmup, steps,
            profile_steps, deadline):
    import torch.nn.functional as F
    entry = rec.data.setdefault(key, {})
    entry.update(model=dict(shape), micro_batch=micro, precision=precision,
                 zinf_offload_param=offload_param, zinf_offload_optimizer="cpu",
                 torch_optimizer="torch.optim.AdamW" + (" (fused, on the GPU)"
                                                         if dev.type == "cuda" else ""),
                 torch_precision="torch.autocast bf16, fp32 parameters" if precision == "bf16"
                 else "fp32", zinf_precision="bf16 (config bf16.enabled)" if precision == "bf16"
                 else "fp32")
    rec.phase(f"{key}: build")
    params, model, optimizer, engine, torch_step, zinf_step = gpt_arms(
        torch, F, dev, shape, micro, precision, offload_param, rec, key)
    tokens = micro * shape["seq"]
    entry.update(parameters=params, tokens_per_step=tokens)
    print(f"{key}: GPT {params / 1e6:.2f}M ({shape['layers']} x {shape['d_model']}, "
          f"{shape['heads']} heads, seq {shape['seq']}), {precision}, micro-batch {micro} "
          f"({tokens} tokens a step); zinf: offload_param {offload_param}, optimizer on the CPU, "
          f"engine on {engine.device if engine else '- (failed)'}", flush=True)
    data = batches_for(torch, dev, shape["vocab"], shape["seq"], micro, warmup + steps)
    rec.phase(f"{key}: steps")
    arms = {"torch": lambda i: torch_step(data[i])}
    if engine is not None:
        arms["zinf"] = lambda i: zinf_step(data[i])
    results, failure = interleaved(torch, dev, arms, warmup, steps, deadline)
    results.setdefault("zinf", {"seconds": [], "losses": [], "summaries": []})
    peak = rec.data["machine"]["peak_bf16_tflops"]
    for name in ("torch", "zinf"):
        r = results[name]
        entry[name] = {"step_s": r["seconds"], "losses": r["losses"],
                       "median_step_s": median(r["seconds"]),
                       **flops_figures(params, tokens, median(r["seconds"]), peak)}
    t, z = entry["torch"], entry["zinf"]
    if t["tokens_per_s"] and z["tokens_per_s"]:
        entry["zinf_over_torch"] = z["tokens_per_s"] / t["tokens_per_s"]
        entry["zinf_over_torch_paired_median"] = median(
            [a / b for a, b in zip(results["torch"]["seconds"], results["zinf"]["seconds"])])
    entry["counters"] = summary_counters(results["zinf"]["summaries"])
    entry["measured_steps"] = len(results["torch"]["seconds"])
    entry["warmup_steps"] = warmup
    if dev.type == "cuda":
        entry["torch_cuda_max_allocated_bytes"] = torch.cuda.max_memory_allocated(dev)
    print(f"{key}: torch {t['tokens_per_s'] or 0:,.0f} tokens/s, zinf "
          f"{z['tokens_per_s'] or 0:,.0f} tokens/s, zinf/torch "
          f"{entry.get('zinf_over_torch', float('nan')):.3f}", flush=True)
    rec.save()
    if failure:
        entry["error"] = f"{failure[0]}\n{failure[1]}"
        raise RuntimeError(failure[0])
    if engine is None:
        raise RuntimeError(entry["error"].splitlines()[0])
    # Free torch's arm (its step holds the model and optimizer) before profiling zinf's.
    del model, optimizer, torch_step
    free_cuda(torch, dev)
    rec.phase(f"{key}: profile")
    profile_table(torch, dev, lambda i: zinf_step(data[i % len(data)]), profile_steps, rec,
                  key + "_profile")
    del engine
    free_cuda(torch, dev)


def part_a(torch, dev, args, rec):
    shape = GPT_DRY if args.dry_run else GPT_85M
    micro = 2 if args.dry_run else args.gpt_micro
    warmup, steps, prof = (1, 2, 1) if args.dry_run else (3, args.steps_a, 2)
    failures = []
    for i, precision in enumerate(("fp32", "bf16")):
        # The first precision may use what is left of the box less what the second needs.
        left = rec.deadline - time.monotonic()
        deadline = time.monotonic() + (left * 0.45 if i == 0 else left - 10)
        try:
            run_gpt(torch, dev, args, rec, precision, shape, micro, precision, "none", warmup,
                    steps, prof, deadline)
            free_cuda(torch, dev)  # the engine's hooks make cycles: its GPU memory goes here
        except Exception as e:
            failures.append(f"{precision}: {type(e).__name__}: {e}")
            rec.data.setdefault(precision, {}).setdefault("error", traceback.format_exc())
            rec.note(f"{precision} failed: {type(e).__name__}: {str(e)[:300]}")
            free_cuda(torch, dev)
    return failures


def part_b(torch, dev, args, rec):
    shape = GPT_DRY if args.dry_run else GPT_13B
    micro = 2 if args.dry_run else args.gpt13_micro
    warmup, steps, prof = (1, 2, 1) if args.dry_run else (2, args.steps_b, 1)
    try:
        run_gpt(torch, dev, args, rec, "bf16", shape, micro, "bf16", "cpu", warmup, steps, prof,
                rec.deadline - 20)
    except Exception as e:
        rec.data.setdefault("bf16", {}).setdefault("error", traceback.format_exc())
        rec.note(f"failed: {type(e).__name__}: {str(e)[:300]}")
        return [f"{type(e).__name__}: {e}"]
    return []


# --- part c: a Llama larger than the GPU ------------------------------------------------------

def llama_params(shape, layers):
    """LlamaForCausalLM's parameters (untied embedding and head, no biases)."""
    h, i, v = shape["hidden"], shape["intermediate"], shape["vocab"]
    kv = h // shape["heads"] * shape["kv_heads"]
    return 2 * v * h + layers * (2 * h * h + 2 * h * kv + 3 * h * i + 2 * h) + h


def llama_config(transformers, shape, layers):
    return transformers.LlamaConfig(
        vocab_size=shape["vocab"], hidden_size=shape["hidden"],
        intermediate_size=shape["intermediate"], num_hidden_layers=layers,
        num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"],
        max_position_embeddings=shape["seq"], use_cache=False)


def checkpointing(model):
    """Activation checkpointing on, in training mode (transformers 5 renamed the call)."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    (enable or model.gradient_checkpointing_enable)()
    model.train()


def zinf_binary():
    for d in (os.environ.get("ZINF_BUILD_DIR", ""), os.path.join(REPO, "build-gpu"),
              os.path.join(REPO, "build")):
        path = os.path.join(d, "bin", "zinf") if d else ""
        if path and os.access(path, os.X_OK):
            return path
    return None


def hardware_file(work, m, args):
    """A `zinf plan --hardware` description of this machine: its memory and GPU from here, the
    link and the CPU optimizer's rate from gpu_check's figures where they are beside the build."""
    build = os.environ.get("ZINF_BUILD_DIR", "")
    h2d = d2h = 50.0
    adam = 5e9
    source = ["link 50 GB/s and CPU AdamW 5e9 params/s assumed"]
    try:
        with open(os.path.join(build, "gpu_check", "profile.json")) as f:
            p = json.load(f)
        if p.get("link", {}).get("kind") == "pcie":
            h2d, d2h = p["link"]["h2d_GBps"], p["link"]["d2h_GBps"]
        adam = max(o["params_per_s"] for o in p.get("cpu_optimizer", [])) or adam
        source = [f"link and CPU AdamW from {build}/gpu_check/profile.json"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    hw = {"zinf_hardware": 1, "name": f"this machine ({m.get('gpu', 'no GPU: dry run')})",
          "notes": "; ".join(source),
          "gpus": {"count": 1, "bf16_tflops": m["peak_bf16_tflops"] or 989,
                   "training_efficiency": 0.5,
                   "memory_GiB": max(m.get("gpu_memory_bytes", 80 * GiB) / GiB, 1),
                   "h2d_GBps": h2d, "d2h_GBps": d2h},
          "host": {"memory_GiB": max(m["host_memory_bytes"] / GiB, 1), "memory_GBps": 100,
                   "cpu_adam_params_per_s": adam}}
    path = os.path.join(work, "hardware.json")
    with open(path, "w") as f:
        json.dump(hw, f, indent=1)
    return path, hw["notes"]


def plan_row(zinf, hardware, params, layers, tokens):
    """`zinf plan`'s row "param cpu, optim cpu, bf16" for a model of `params` in `layers`, or
    None with the reason."""
    try:
        out = subprocess.run([zinf, "plan", "--params", str(params), "--layers", str(layers),
                              "--tokens", str(tokens), "--hardware", hardware, "--json"],
                             capture_output=True, text=True, timeout=60)
        plan = json.loads(out.stdout)
        for row in plan["placements"]:
            if row["placement"] == "param cpu, optim cpu, bf16":
                return row, None
        return None, "no row 'param cpu, optim cpu, bf16'"
    except Exception as e:
        return None, f"zinf plan failed: {type(e).__name__}: {e}"


def choose_llama(shape, m, args, rec, work, time_left_s):
    """The depth of Note [Which Llama]: (layers, parameters, the reasons)."""
    dry = args.dry_run
    overhead = (GiB // 2) if dry else 10 * GiB
    available = meminfo("MemAvailable")
    disk_free = shutil.disk_usage(tempfile.gettempdir()).free
    zinf = zinf_binary()
    hardware, hw_source = hardware_file(work, m, args) if zinf else (None, None)
    peak = (m["peak_bf16_tflops"] or 989) * 1e12
    tokens = args.llama_micro_guess * shape["seq"] * args.llama_accum
    tried = []
    for layers in range(min(shape["layers"], args.llama_max_layers), 0, -1):
        n = llama_params(shape, layers)
        row, why = plan_row(zinf, hardware, n, layers, shape["seq"]) if zinf else (
            None, "no zinf binary (ZINF_BUILD_DIR/bin/zinf)")
        host = max(row["peak_host_bytes"], row["steady_host_bytes"]) if row else 18 * n
        step_s = 6 * n * tokens / (0.35 * peak) + n / 3e9
        setup_s = n / args.llama_setup_rate
        estimate_s = setup_s + (3 + args.steps_c) * step_s
        verdict = {"layers": layers, "parameters": n, "host_state_bytes": host,
                   "host_state_from": "zinf plan" if row else f"18 B/parameter ({why})",
                   "host_needed_bytes": host + overhead, "host_available_bytes": available,
                   "spill_bytes": 4 * n, "disk_free_bytes": disk_free,
                   "estimated_s": round(estimate_s, 1), "time_left_s": round(time_left_s, 1)}
        if row:
            verdict["plan"] = {k: row[k] for k in ("peak_host_bytes", "steady_host_bytes",
                                                   "peak_device_bytes", "step_s", "hide_tokens",
                                                   "fits") if k in row}
        reasons = []
        if host + overhead > 0.85 * available:
            reasons.append(f"host state {host / GiB:.1f} GiB + {overhead / GiB:.1f} GiB for the "
                           f"process above 85% of MemAvailable {available / GiB:.1f} GiB")
        if 4 * n > 0.8 * disk_free:
            reasons.append(f"Init's spill {4 * n / GiB:.1f} GiB above 80% of the free "
                           f"{disk_free / GiB:.1f} GiB under {tempfile.gettempdir()}")
        if not dry and estimate_s > time_left_s:
            reasons.append(f"about {estimate_s:.0f} s to build and run, {time_left_s:.0f} s left")
        verdict["rejected_because"] = reasons
        tried.append(verdict)
        if not reasons:
            rec.data["llama_choice"] = {"chosen": verdict, "larger_rejected": tried[:-1][-2:],
                                        "hardware_for_plan": hw_source}
            return layers, n
    rec.data["llama_choice"] = {"chosen": None, "larger_rejected": tried[-3:],
                                "hardware_for_plan": hw_source}
    return 0, 0


def device_need_estimate(model, prefetch_elements):
    """Bytes of Note [Tier budgets]'s device tier for one rank, from above: twice the largest
    module's parameters at 10 bytes (bf16 copy, fp32 gradient, the host device's fp32 view),
    the read-ahead window twice in bf16, the small (persistent) parameters, 64 MiB of slack."""
    largest, small = 0, 0
    for module in model.modules():
        own = sum(p.numel() for p in module.parameters(recurse=False))
        largest = max(largest, own)
        if 0 < own < 100_000:
            small += own
    return 2 * largest * 10 + 2 * prefetch_elements * 2 + small * 10 + (64 << 20)


def parse_bytes(text):
    m = re.match(r"([0-9.]+) (B|KiB|MiB|GiB|TiB)", text)
    if not m:
        return None
    scale = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}[m.group(2)]
    return int(float(m.group(1)) * scale)


def llama_steps(torch, dev, engine_or_model, optimizer, batches_of, accum, uses_engine):
    """One optimizer step over `accum` micro-batches (batches_of(a) gives micro-batch a):
    returns (mean loss, the summary or None)."""
    total = 0.0
    if not uses_engine:
        optimizer.zero_grad(set_to_none=True)
    for a in range(accum):
        x = batches_of(a)
        if uses_engine:
            loss = engine_or_model(input_ids=x, labels=x).loss
            engine_or_model.backward(loss)
        else:
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                loss = engine_or_model(input_ids=x, labels=x).loss
            (loss / accum).backward()
        total += loss.detach().float()
    if uses_engine:
        return total / accum, engine_or_model.step()
    torch.nn.utils.clip_grad_norm_(engine_or_model.parameters(), CLIP)
    optimizer.step()
    return total / accum, None


def llama_torch_reference(torch, transformers, dev, shape, layers, args, rec, deadline):
    """torch alone on the same width, with the layers that fit the whole GPU (fp32 parameters,
    AdamW on the GPU: 16 bytes a parameter, and the activations)."""
    entry = rec.data.setdefault("torch_reference", {})
    if dev.type == "cuda":
        total = torch.cuda.get_device_properties(dev).total_memory
        reserve = 14 * GiB
        layers_t = layers
        while layers_t > 0 and 16 * llama_params(shape, layers_t) + reserve > 0.8 * total:
            layers_t -= 1
    else:
        layers_t = min(layers, 2)
    if layers_t < 1:
        entry["skipped"] = "not even one layer of this width fits the GPU with its optimizer"
        return None
    micro = 1 if args.dry_run else args.llama_micro_ref
    accum = 1
    n = llama_params(shape, layers_t)
    entry.update(layers=layers_t, parameters=n, micro_batch=micro, accumulation=accum,
                 tokens_per_step=micro * shape["seq"] * accum,
                 what="torch alone: fp32 parameters on the GPU, torch.autocast bf16, fused "
                      "AdamW, activation checkpointing (the same width and sequence)")
    rec.phase("c: torch reference: build")
    torch.manual_seed(0)
    with torch.device(dev):
        model = transformers.LlamaForCausalLM(llama_config(transformers, shape, layers_t))
    checkpointing(model)
    optimizer = torch_adamw(torch, dev, model.parameters())
    data = batches_for(torch, dev, shape["vocab"], shape["seq"] - 1, micro, 8)
    rec.phase("c: torch reference: steps")
    seconds, losses = [], []
    warmup = 1
    for i in range(warmup + (2 if args.dry_run else 3)):
        if i > warmup and time.monotonic() > deadline:
            break
        sync(torch, dev)
        t0 = time.perf_counter()
        loss, _ = llama_steps(torch, dev, model, optimizer, lambda a: data[(i + a) % len(data)],
                              accum, False)
        sync(torch, dev)
        dt = time.perf_counter() - t0
        print(f"  torch reference step {i + 1}: {dt:.3f} s  loss {float(loss):.4f}", flush=True)
        if i >= warmup:
            seconds.append(dt)
            losses.append(float(loss))
    entry.update(step_s=seconds, losses=losses, median_step_s=median(seconds),
                 **flops_figures(n, entry["tokens_per_step"], median(seconds),
                                 rec.data["machine"]["peak_bf16_tflops"]))
    if dev.type == "cuda":
        entry["torch_cuda_max_allocated_bytes"] = torch.cuda.max_memory_allocated(dev)
    rec.save()
    del model, optimizer, data
    free_cuda(torch, dev)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    return entry


def part_c(torch, dev, args, rec):
    try:
        import transformers
    except ImportError as e:
        rec.data["skipped"] = f"transformers is not installed for {sys.executable} ({e})"
        return SKIP
    import zinf
    import zinf.zero
    rec.data["transformers"] = transformers.__version__
    shape = LLAMA_DRY if args.dry_run else LLAMA_7B
    m = rec.data["machine"]
    work = os.path.dirname(os.path.abspath(rec.path))
    accum = 2 if args.dry_run else args.llama_accum
    rec.data.update(shape=dict(shape), accumulation=accum, tmpdir=tempfile.gettempdir())

    rec.phase("c: choose the model")
    reference_s = 0 if args.dry_run else args.llama_reference_s
    layers, n = choose_llama(shape, m, args, rec, work,
                             rec.deadline - time.monotonic() - reference_s - 15)
    if layers == 0:
        rec.data["skipped"] = ("no depth of this width fits: " + "; ".join(
            rec.data["llama_choice"]["larger_rejected"][-1]["rejected_because"]))
        return SKIP
    bf16_bytes = 2 * n
    rec.data.update(layers=layers, parameters=n, bf16_bytes=bf16_bytes)
    print(f"c: Llama of {n / 1e9:.2f}B parameters ({layers} layers of hidden {shape['hidden']}, "
          f"MLP {shape['intermediate']}, vocabulary {shape['vocab']}), sequence {shape['seq']}, "
          f"bf16 {bf16_bytes / GiB:.1f} GiB; gradient accumulation {accum}", flush=True)

    # torch alone first, on the whole GPU, before the cap.
    try:
        llama_torch_reference(torch, transformers, dev, shape, layers, args, rec,
                              time.monotonic() + reference_s)
    except Exception as e:
        rec.data.setdefault("torch_reference", {})["error"] = traceback.format_exc()
        rec.note(f"the torch reference failed: {type(e).__name__}: {str(e)[:300]}")
        free_cuda(torch, dev)

    # zinf: built under Init, straight into host memory.
    # The read-ahead: one decoder layer, so that the next layer's upload runs under this one's
    # compute.
    prefetch = llama_params(shape, 1) - llama_params(shape, 0)
    config = zinf_config(1, accum, True, "cpu",
                         extra_zero={"stage3_prefetch_bucket_size": prefetch})
    rec.phase("c: build under zinf.zero.Init")
    t0 = time.monotonic()
    torch.manual_seed(0)
    with zinf.zero.Init(config_dict_or_path=config):
        model = transformers.LlamaForCausalLM(llama_config(transformers, shape, layers))
    rec.data["build_s"] = round(time.monotonic() - t0, 2)
    rec.data["build_params_per_s"] = n / max(time.monotonic() - t0, 1e-9)
    counted = sum(p.numel() for p in model.parameters())
    if counted != n:
        rec.note(f"the model has {counted} parameters, the formula said {n}")
        n = counted
        rec.data["parameters"] = n
    checkpointing(model)

    need = device_need_estimate(model, prefetch)
    # The dry run starts below what the engine takes, so that CI proves the retry on the
    # engine's own figure (its message's form) that the GPU run falls back on.
    budget = 1 << 20 if args.dry_run else int(need * 1.1)
    rec.phase("c: initialize")
    t0 = time.monotonic()
    for attempt in range(2):
        config["zinf"] = {"device_budget": budget}
        try:
            engine = zinf.zero.initialize(model=model, config=config)
            break
        except zinf.ResourceExhaustedError as e:
            named = re.search(r"is below the ([0-9.]+ \w+) the engine computes in", str(e))
            if attempt == 1 or not named or parse_bytes(named.group(1)) is None:
                raise
            rec.note(f"zinf.device_budget {budget} refused; the engine names "
                     f"{named.group(1)}: again with that and 96 MiB")
            budget = parse_bytes(named.group(1)) + (96 << 20)
    rec.data.update(initialize_s=round(time.monotonic() - t0, 2), device_budget_bytes=budget,
                    device_need_estimate_bytes=need, zinf_config=config,
                    engine_device=str(engine.device),
                    host_available_after_initialize_bytes=meminfo("MemAvailable"),
                    peak_rss_after_initialize_bytes=peak_rss_bytes())
    rec.save()

    # Torch's own allocator capped so that the process holds less than the bf16 model.
    torch_share = int(0.95 * bf16_bytes) - budget
    cap = {"device_budget_bytes": budget, "torch_share_bytes": None, "set": False}
    if dev.type == "cuda" and args.llama_torch_cap == "none":
        cap["why_not"] = "--llama-torch-cap none: the device tier alone is capped"
    elif dev.type == "cuda":
        total = torch.cuda.get_device_properties(dev).total_memory
        if torch_share >= 2 * GiB:
            torch.cuda.set_per_process_memory_fraction(torch_share / total, dev)
            cap.update(torch_share_bytes=torch_share, set=True,
                       fraction=torch_share / total)
        else:
            cap["why_not"] = (f"95% of the model's bf16 {bf16_bytes / GiB:.2f} GiB less the "
                              f"device budget leaves {torch_share / GiB:.2f} GiB: too little "
                              "for the activations; torch's allocator left uncapped")
    else:
        cap["why_not"] = "no GPU: the host device's budget (zinf.device_budget) alone"
    rec.data["cap"] = cap
    rec.save()

    # Sequences of shape["seq"] tokens (batches_for adds one): the labels are the inputs,
    # shifted inside the model.
    seq = shape["seq"]
    stream = batches_for(torch, dev, shape["vocab"], seq - 1, 1, 4 * accum)

    # The probe step at one sequence a micro-batch: what a sequence costs torch's allocator.
    rec.phase("c: probe step (one sequence a micro-batch)")
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
        base = torch.cuda.memory_allocated(dev)
    sync(torch, dev)
    t0 = time.perf_counter()
    loss, summary = llama_steps(torch, dev, engine, None, lambda a: stream[a], accum, True)
    sync(torch, dev)
    rec.data["probe"] = {"step_s": time.perf_counter() - t0, "loss": float(loss),
                         "counters": summary_counters([summary])["last"]}
    micro = 1 if args.dry_run else args.llama_micro_guess
    if dev.type == "cuda":
        per_sequence = torch.cuda.max_memory_allocated(dev) - base
        room = (cap["torch_share_bytes"] - base if cap["set"] else
                torch.cuda.mem_get_info(dev)[0] - 4 * GiB)
        micro = max(1, min(args.llama_micro_max, int(0.8 * room / max(per_sequence, 1))))
        rec.data["probe"].update(torch_peak_per_sequence_bytes=per_sequence,
                                 torch_room_bytes=room, torch_base_bytes=base)
    tokens = micro * seq * accum
    rec.data.update(micro_batch=micro, tokens_per_step=tokens)
    print(f"c: micro-batch {micro} x {seq} tokens, {accum} micro-batches a step: {tokens} "
          f"tokens a step", flush=True)
    rec.save()

    data = batches_for(torch, dev, shape["vocab"], seq - 1, micro, 4 * accum, seed=99)
    rec.phase("c: steps")
    seconds, losses, summaries = [], [], []
    warmup = 1
    last = rec.data["probe"]["step_s"]
    for i in range(warmup + (1 if args.dry_run else args.steps_c)):
        # Room for this step and the profiled one.
        if i > warmup and time.monotonic() + 2.2 * last > rec.deadline:
            rec.note(f"stopped after {len(seconds)} measured steps: the box ends")
            break
        sync(torch, dev)
        t0 = time.perf_counter()
        loss, summary = llama_steps(torch, dev, engine, None,
                                    lambda a: data[(i * accum + a) % len(data)], accum, True)
        sync(torch, dev)
        last = time.perf_counter() - t0
        print(f"  zinf step {i + 1}: {last:.3f} s  loss {float(loss):.4f}"
              f"{'  (warm-up)' if i < warmup else ''}", flush=True)
        if i >= warmup:
            seconds.append(last)
            losses.append(float(loss))
            summaries.append(summary)
            rec.data.update(step_s=seconds, losses=losses, median_step_s=median(seconds),
                            **flops_figures(n, tokens, median(seconds), m["peak_bf16_tflops"]),
                            counters=summary_counters(summaries))
            rec.save()
    if dev.type == "cuda":
        rec.data["torch_cuda_max_reserved_bytes"] = torch.cuda.max_memory_reserved(dev)
        device_peak = max((s.get("device_peak_bytes", 0) for s in summaries), default=0)
        rec.data["gpu_held_bytes"] = rec.data["torch_cuda_max_reserved_bytes"] + device_peak
        rec.data["gpu_held_below_bf16_model"] = rec.data["gpu_held_bytes"] < bf16_bytes
    rec.data["peak_rss_bytes"] = peak_rss_bytes()
    ref = rec.data.get("torch_reference", {})
    if ref.get("mfu") and rec.data.get("mfu"):
        rec.data["zinf_mfu_over_torch_reference"] = rec.data["mfu"] / ref["mfu"]
    if ref.get("tflops") and rec.data.get("tflops"):
        rec.data["zinf_tflops_over_torch_reference"] = rec.data["tflops"] / ref["tflops"]
    rec.save()
    if time.monotonic() + last * 1.3 < rec.deadline:
        rec.phase("c: profile")
        profile_table(torch, dev, lambda i: llama_steps(
            torch, dev, engine, None, lambda a: data[a % len(data)], accum, True), 1, rec,
            "profile")
    else:
        rec.data["profile"] = {"error": "not run: the box ends"}
        rec.note("the profiler did not run: the box ends")
    return 0 if seconds else 1


# --- the command line ------------------------------------------------------------------------

def run_part(args):
    rec = Record(args.out, args.part)
    rec.deadline = time.monotonic() + args.budget_s - 5
    rec.data.update(dry_run=args.dry_run, budget_s=args.budget_s, argv=sys.argv[1:])
    try:
        import torch
    except ImportError as e:
        rec.data.update(status="skip", skipped=f"no torch for {sys.executable}: {e}")
        rec.save()
        return SKIP
    if not args.dry_run and not torch.cuda.is_available():
        rec.data.update(status="skip", skipped=f"torch {torch.__version__} sees no GPU "
                        f"(CUDA {torch.version.cuda})")
        rec.save()
        return SKIP
    if args.dry_run:
        dev = torch.device("cpu")
        torch.set_num_threads(1)  # the dry run proves the path; CI shares its cores
    else:
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(dev)
    rec.data["machine"] = machine(torch, dev, args.peak_tflops)
    print(f"gpu_bench part {args.part}: {json.dumps(rec.data['machine'])}", flush=True)
    rec.save()
    try:
        if args.part == "a":
            failures = part_a(torch, dev, args, rec)
            rc = 1 if failures else 0
        elif args.part == "b":
            rc = 1 if part_b(torch, dev, args, rec) else 0
        else:
            rc = part_c(torch, dev, args, rec)
    except Exception as e:
        rec.data["error"] = traceback.format_exc()
        rec.note(f"failed in {rec.data['phase']}: {type(e).__name__}: {str(e)[:300]}")
        rc = 1
    rec.data["status"] = {0: "pass", SKIP: "skip"}.get(rc, "fail")
    rec.phase("done")
    return rc


def check(args):
    """What --dry-run checks before running the parts: the modules each part imports."""
    problems = []
    try:
        import torch
        if int(torch.__version__.split(".")[0]) < 2:
            problems.append(f"torch {torch.__version__}: gpu_bench needs torch 2.x")
        import torch.profiler  # noqa: F401
    except ImportError as e:
        problems.append(f"no torch: {e}")
    for module in ("transformers", "zinf", "zinf.zero"):
        try:
            __import__(module)
        except ImportError as e:
            problems.append(f"cannot import {module}: {e}")
    sys.path.insert(0, os.path.join(REPO, "examples", "torch"))
    try:
        from train_gpt import GPT  # noqa: F401
    except ImportError as e:
        problems.append(f"cannot import examples/torch/train_gpt.py's GPT: {e}")
    # The names NVIDIA's driver gives the GPUs this benchmark is for.
    for name, want in (("NVIDIA H100 80GB HBM3", 989), ("NVIDIA H100 PCIe", 756),
                       ("NVIDIA H200", 989), ("NVIDIA H100 NVL", 835), ("Tesla T4", None)):
        if peak_for(name)[0] != want:
            problems.append(f"the peak table gives {peak_for(name)[0]} for {name!r}, not {want}")
    for p in problems:
        print(f"gpu_bench check: {p}")
    if not problems:
        import torch
        import transformers
        print(f"gpu_bench check: torch {torch.__version__}, transformers "
              f"{transformers.__version__}, zinf from {os.path.dirname(__import__('zinf').__file__)}")
    return 1 if problems else 0


def fmt_bytes(b):
    if b is None:
        return "-"
    for unit, scale in (("GiB", GiB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(b) >= scale:
            return f"{b / scale:.2f} {unit}"
    return f"{b:.0f} B"


def fmt(v, spec=",.0f"):
    return "-" if v is None else format(v, spec)


def report(args):
    """Merges the parts' files and the shell's statuses into one JSON file and its text."""
    statuses = []
    if os.path.exists(args.status):
        with open(args.status) as f:
            for line in f:
                name, result, seconds, box, note = (line.rstrip("\n").split("\t") + [""] * 5)[:5]
                statuses.append({"part": name, "result": result, "seconds": int(seconds or 0),
                                 "box_s": int(box or 0), "note": note})
    parts = {}
    for s in statuses:
        path = os.path.join(args.dir, f"part_{s['part']}.json")
        try:
            with open(path) as f:
                parts[s["part"]] = json.load(f)
        except (OSError, ValueError) as e:
            parts[s["part"]] = {"status": "missing", "error": f"{path}: {e}"}
    m = next((p["machine"] for p in parts.values() if "machine" in p), {})
    merged = {"gpu_bench": 1, "written_unix_s": time.time(), "commit": args.commit,
              "machine": m, "results": statuses, "parts": parts}
    with open(args.json, "w") as f:
        json.dump(merged, f, indent=1, default=_json_default)
    lines = []
    gpu = m.get("gpu", "no GPU (dry run)" if parts and all(
        p.get("dry_run") for p in parts.values() if isinstance(p, dict)) else "?")
    lines.append(f"gpu_bench: {gpu} ({fmt_bytes(m.get('gpu_memory_bytes'))}); "
                 f"torch {m.get('torch')} (CUDA {m.get('torch_cuda')}), python {m.get('python')},"
                 f" {m.get('cpus')} cores, {fmt_bytes(m.get('host_memory_bytes'))} host memory; "
                 f"commit {args.commit}")
    lines.append(f"peak for MFU: {m.get('peak_source')}; TF32 matmuls: {m.get('tf32_matmul')}; "
                 f"TFLOPS = 6 x parameters x tokens / step time; medians of the measured steps")
    for s in statuses:
        p = parts.get(s["part"], {})
        lines.append("")
        lines.append(f"== {s['part']}: {s['result']} in {s['seconds']} s (box {s['box_s']} s)"
                     f"{': ' + s['note'] if s['note'] else ''}")
        if p.get("skipped"):
            lines.append(f"skipped: {p['skipped']}")
        if p.get("status") == "running":
            lines.append(f"stopped in phase '{p.get('phase')}' (the box ended or it crashed); "
                         f"what it had measured follows")
        lines.extend(_part_lines(s["part"], p))
    with open(args.txt, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def _comparison_lines(key, e):
    out = []
    if not e:
        return out
    model = e.get("model", {})
    out.append(f"{key}: GPT {fmt(e.get('parameters', 0) / 1e6, '.2f')}M ({model.get('layers')} x "
               f"{model.get('d_model')}, {model.get('heads')} heads, seq {model.get('seq')}), "
               f"micro-batch {e.get('micro_batch')} ({e.get('tokens_per_step')} tokens a step); "
               f"torch: {e.get('torch_precision')}, {e.get('torch_optimizer')}; zinf: "
               f"{e.get('zinf_precision')}, offload_param {e.get('zinf_offload_param')}, "
               f"optimizer on the CPU, on {e.get('engine_device')}; "
               f"{e.get('measured_steps')} steps each after {e.get('warmup_steps')} warm-up, "
               f"interleaved")
    if "error" in e:
        out.append(f"  FAILED: {e['error'].strip().splitlines()[-1]}")
    t, z = e.get("torch", {}), e.get("zinf", {})
    if t or z:
        out.append(f"  {'':6s} {'tokens/s':>12s} {'step ms':>9s} {'TFLOPS':>8s} {'MFU':>7s}")
        for name, r in (("torch", t), ("zinf", z)):
            out.append(f"  {name:6s} {fmt(r.get('tokens_per_s')):>12s} "
                       f"{fmt((r.get('median_step_s') or 0) * 1e3, '.1f'):>9s} "
                       f"{fmt(r.get('tflops'), '.1f'):>8s} {fmt(r.get('mfu'), '.1%'):>7s}")
        out.append(f"  zinf/torch tokens/s: {fmt(e.get('zinf_over_torch'), '.3f')} (paired "
                   f"steps' median {fmt(e.get('zinf_over_torch_paired_median'), '.3f')}); "
                   f"losses at the last step: torch {fmt((t.get('losses') or [None])[-1], '.4f')}"
                   f", zinf {fmt((z.get('losses') or [None])[-1], '.4f')}")
    out.extend(_counter_lines(e.get("counters")))
    return out


def _counter_lines(counters):
    if not counters:
        return []
    med = counters.get("median", {})
    parts = []
    for k in COUNTERS:
        if k in med and med[k] is not None:
            v = med[k]
            parts.append(f"{k} {fmt_bytes(v) if 'bytes' in k else fmt(v, '.4g')}")
    return ["  zinf step summary (median of the measured steps): " + ", ".join(parts)]


def _profile_lines(title, prof):
    if not prof:
        return []
    if "error" in prof:
        return [f"  profiler ({title}): {prof['error']}"]
    return [f"  torch.profiler, {title}, {prof['steps']} step(s), sorted by {prof['sorted_by']}:"
            ] + ["    " + line for line in prof["table"].rstrip().splitlines()]


def _part_lines(name, p):
    out = []
    for note in p.get("notes", []):
        out.append(f"note: {note}")
    if name in ("a", "b"):
        for key in ("fp32", "bf16"):
            if key in p:
                out.extend(_comparison_lines(key, p[key]))
                out.extend(_profile_lines(f"zinf {key}", p.get(key + "_profile")))
    elif name == "c":
        choice = p.get("llama_choice", {}).get("chosen")
        if choice:
            out.append(f"model: LlamaForCausalLM, {p.get('layers')} layers of hidden "
                       f"{p.get('shape', {}).get('hidden')} (Llama-2-7B's: 4096), "
                       f"{fmt(p.get('parameters', 0) / 1e9, '.2f')}B parameters, bf16 "
                       f"{fmt_bytes(p.get('bf16_bytes'))}; host state "
                       f"{fmt_bytes(choice['host_state_bytes'])} ({choice['host_state_from']}) "
                       f"of {fmt_bytes(choice['host_available_bytes'])} available")
            for r in p.get("llama_choice", {}).get("larger_rejected", []):
                out.append(f"  {r['layers']} layers not taken: {'; '.join(r['rejected_because'])}")
        ref = p.get("torch_reference", {})
        if ref:
            if ref.get("skipped") or ref.get("error"):
                out.append(f"torch reference: {ref.get('skipped') or ref['error'].strip().splitlines()[-1]}")
            else:
                out.append(f"torch reference ({ref.get('what')}): {ref.get('layers')} layers, "
                           f"{fmt(ref.get('parameters', 0) / 1e9, '.2f')}B, micro-batch "
                           f"{ref.get('micro_batch')}: {fmt(ref.get('tokens_per_s'))} tokens/s, "
                           f"{fmt(ref.get('tflops'), '.1f')} TFLOPS, MFU {fmt(ref.get('mfu'), '.1%')}")
        if "build_s" in p:
            out.append(f"zinf: built under zinf.zero.Init in {p['build_s']} s, initialized in "
                       f"{p.get('initialize_s', '-')} s; device budget "
                       f"{fmt_bytes(p.get('device_budget_bytes'))}; torch's allocator "
                       + (f"capped at {fmt_bytes(p['cap']['torch_share_bytes'])}"
                          if p.get("cap", {}).get("set") else
                          f"not capped ({p.get('cap', {}).get('why_not', '-')})"))
        if "micro_batch" in p:
            out.append(f"  micro-batch {p['micro_batch']} x {p['shape']['seq']} tokens, "
                       f"{p.get('accumulation')} a step: {p.get('tokens_per_step')} tokens a step")
        if p.get("step_s"):
            out.append(f"  zinf: {fmt(p.get('tokens_per_s'))} tokens/s, step "
                       f"{fmt(p.get('median_step_s'), '.2f')} s, {fmt(p.get('tflops'), '.1f')} "
                       f"TFLOPS, MFU {fmt(p.get('mfu'), '.1%')}; against the torch reference: "
                       f"TFLOPS x{fmt(p.get('zinf_tflops_over_torch_reference'), '.3f')}; "
                       f"losses {', '.join(fmt(x, '.4f') for x in p.get('losses', []))}")
        if "gpu_held_bytes" in p:
            out.append(f"  GPU held at most {fmt_bytes(p['gpu_held_bytes'])} (torch's reserved "
                       f"peak + the device tier's peak), below the bf16 model: "
                       f"{p.get('gpu_held_below_bf16_model')}")
        out.extend(_counter_lines(p.get("counters")))
        out.extend(_profile_lines("zinf", p.get("profile")))
    if p.get("error"):
        out.append("error: " + p["error"].strip().splitlines()[-1])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    pp = sub.add_parser("part")
    pp.add_argument("part", choices=["a", "b", "c"])
    pp.add_argument("--out", required=True)
    pp.add_argument("--budget-s", type=float, default=300)
    pp.add_argument("--dry-run", action="store_true")
    pp.add_argument("--peak-tflops", type=float, default=0,
                    help="dense bf16 TFLOPS of the GPU (default: from its name)")
    pp.add_argument("--gpt-micro", type=int, default=32, help="part a's micro-batch (seq 256)")
    pp.add_argument("--gpt13-micro", type=int, default=8, help="part b's micro-batch (seq 512)")
    pp.add_argument("--steps-a", type=int, default=10)
    pp.add_argument("--steps-b", type=int, default=5)
    pp.add_argument("--steps-c", type=int, default=3)
    pp.add_argument("--llama-max-layers", type=int, default=32)
    pp.add_argument("--llama-accum", type=int, default=4)
    pp.add_argument("--llama-micro-guess", type=int, default=4,
                    help="micro-batch the size choice assumes, before the probe step")
    pp.add_argument("--llama-micro-max", type=int, default=16)
    pp.add_argument("--llama-torch-cap", choices=["model", "none"], default="model",
                    help="cap torch's allocator so that the process holds less than the bf16 "
                         "model (model), or cap the device tier alone (none)")
    pp.add_argument("--llama-micro-ref", type=int, default=4,
                    help="the torch reference's micro-batch")
    pp.add_argument("--llama-setup-rate", type=float, default=30e6,
                    help="parameters a second that Init's build and initialize are assumed to take")
    pp.add_argument("--llama-reference-s", type=float, default=45,
                    help="seconds kept for the torch reference of part c")
    rp = sub.add_parser("report")
    rp.add_argument("--dir", required=True)
    rp.add_argument("--status", required=True)
    rp.add_argument("--json", required=True)
    rp.add_argument("--txt", required=True)
    rp.add_argument("--commit", default="")
    sub.add_parser("check")
    args = ap.parse_args()
    if args.command == "part":
        return run_part(args)
    if args.command == "report":
        return report(args)
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
