"""What zinf.zero costs per module, against torch alone and DeepSpeed ZeRO-3 in the same run.

A model of many small modules (--blocks blocks of Linear(d, d) and Tanh: tiny compute, so the
step is mostly what each side does around each module), one rank, parameters in memory, the
optimizer on the CPU (offload_optimizer cpu; torch alone: torch.optim.AdamW), the same AdamW
hyper-parameters, batch and data. Each side runs as a process of its own that times --steps
steps after a warm-up and prints its median; the sides take turns (zinf, torch, DeepSpeed,
torch under DeepSpeed's interpreter, zinf, ...) for --reps rounds, and the report gives the
median of each side over the rounds, each engine's step against torch alone's in the same
interpreter (the limit: nothing done per module), and the cost per module with parameters:
(step - torch's step) / blocks.

    PYTHONPATH=build/python /usr/bin/python3 bench/per_module.py \\
        [--ds-python build/venv-deepspeed/bin/python] [--blocks 200] [--reps 5]

zinf runs under this interpreter (its torch), DeepSpeed under --ds-python (its torch, with
DS_ACCELERATOR=cpu); without --ds-python, or where that interpreter has no deepspeed, its row
says so. --granularity sets zinf.zero's stage3_module_granularity_threshold where zinf takes
it (0: a fetch per module with parameters). --offload-param cpu homes the parameters in host
memory on both engines (offload_param), so that each module's parameters move to the compute
device and back at every fetch instead of staying where they are.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

D, BATCH, WARMUP = 16, 4, 3
HYPER = {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01}


def build(blocks):
    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(D, D), torch.nn.Tanh())
                                 for _ in range(blocks)])


def config(args):
    zero = {"stage": 3, "offload_optimizer": {"device": "cpu"}}
    if args.offload_param != "none":
        zero["offload_param"] = {"device": args.offload_param}
    if args.granularity is not None:
        zero["stage3_module_granularity_threshold"] = args.granularity
    return {"train_micro_batch_size_per_gpu": BATCH, "gradient_accumulation_steps": 1,
            "zero_optimization": zero, "optimizer": {"type": "AdamW", "params": dict(HYPER)}}


def side(args):
    """One side's median step time in seconds, over --steps steps after a warm-up."""
    import torch
    torch.set_num_threads(1)  # the same compute threads on every side
    model = build(args.blocks)
    x = torch.randn(BATCH, D, generator=torch.Generator().manual_seed(1))
    if args.side == "torch":
        # foreach: torch's fastest AdamW on the CPU (one kernel per op over all parameters).
        opt = torch.optim.AdamW(model.parameters(), lr=HYPER["lr"], betas=tuple(HYPER["betas"]),
                                eps=HYPER["eps"], weight_decay=HYPER["weight_decay"],
                                foreach=True)

        def step():
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
    elif args.side == "zinf":
        import zinf
        engine = zinf.zero.initialize(model, config(args), optimizer_threads=1)

        def step():
            engine.backward(engine(x).square().mean())
            engine.step()
    else:
        import deepspeed
        for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                           ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(args.port))):
            os.environ.setdefault(key, value)
        deepspeed.init_distributed()
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=config(args))

        def step():
            engine.backward(engine(x).square().mean())
            engine.step()
    for _ in range(WARMUP):
        step()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run_side(python, name, args, env=None):
    cmd = [python, os.path.abspath(__file__), "--side", name, "--blocks", str(args.blocks),
           "--steps", str(args.steps), "--port", str(args.port)]
    if args.granularity is not None:
        cmd += ["--granularity", str(args.granularity)]
    cmd += ["--offload-param", args.offload_param]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if done.returncode != 0:
        return None, (done.stderr.strip().splitlines() or ["failed"])[-1]
    return json.loads(done.stdout.strip().splitlines()[-1])["seconds"], None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--side", choices=["torch", "zinf", "deepspeed"])
    parser.add_argument("--blocks", type=int, default=200)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--granularity", type=int, default=None)
    parser.add_argument("--ds-python", default=None)
    parser.add_argument("--offload-param", choices=["none", "cpu"], default="none")
    parser.add_argument("--port", type=int, default=29541)
    args = parser.parse_args()
    if args.side:
        print(json.dumps({"seconds": side(args)}), flush=True)
        return 0

    import platform
    print(f"per_module: {args.blocks} blocks of Linear({D}, {D}) + Tanh, batch {BATCH}, one "
          f"rank, parameters {'offloaded to the CPU' if args.offload_param == 'cpu' else 'in memory'}, AdamW on the CPU, {args.steps} steps x {args.reps} "
          f"rounds, interleaved; {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs; zinf granularity {args.granularity}")
    ds_env = dict(os.environ, DS_ACCELERATOR="cpu")
    ds_env.pop("PYTHONPATH", None)
    # DeepSpeed JIT-builds its CPU Adam once; kept where vs_deepspeed.sh keeps it.
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ds_env.setdefault("TORCH_EXTENSIONS_DIR",
                      os.path.join(root, "build", "vs-deepspeed", "torch_extensions"))
    sides = [("zinf", sys.executable, None), ("torch", sys.executable, None)]
    if args.ds_python:
        sides += [("deepspeed", args.ds_python, ds_env), ("torch (DeepSpeed's)", args.ds_python,
                                                          ds_env)]
    results = {name: [] for name, _, _ in sides}
    errors = {}
    for _ in range(args.reps):
        for name, python, env in sides:
            seconds, error = run_side(python, name.split(" ")[0], args, env)
            if seconds is None:
                errors[name] = error
            else:
                results[name].append(seconds)
    med = {k: statistics.median(v) for k, v in results.items() if v}
    for name, torch_name in (("zinf", "torch"), ("deepspeed", "torch (DeepSpeed's)")):
        if name not in med or torch_name not in med:
            why = errors.get(name) or errors.get(torch_name) or "no --ds-python given"
            print(f"{name:>9}: not measured ({why})")
            continue
        ratio = med[name] / med[torch_name]
        per_module = (med[name] - med[torch_name]) / args.blocks * 1e6
        print(f"{name:>9}: step {med[name] * 1e3:8.2f} ms, torch alone {med[torch_name] * 1e3:8.2f} "
              f"ms, ratio {ratio:5.2f}, {per_module:6.1f} us per module")
    return 0


if __name__ == "__main__":
    sys.exit(main())
