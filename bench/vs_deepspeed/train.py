#!/usr/bin/env python3
"""One training run of a GPT under DeepSpeed ZeRO-3 or under zinf, for the same-run comparison
of bench/vs_deepspeed.sh (zinf through `zinf.initialize`, DeepSpeed's `deepspeed.initialize`,
called alike): the same model (examples/torch's GPT or Hugging Face's GPT-2 built
from a config, partitioned by each side's `zero.Init(module=...)`), the same initial values
(seed 0), the same batches (examples/torch's sampler:
seed 1234, every rank draws the global batch and takes its rows), the same DeepSpeed config
(AdamW, gradient clipping, fp32) for both. Prints one RESULT line (common.py): the loss of each
step (the mean over ranks) and its gradient norm before clipping, the step time and its split
(forward, backward, optimizer step), the tokens per second, the peak RSS summed over ranks and
the bytes each step made the disk read and write.

  python train.py --side zinf|deepspeed|torch --placement memory|cpu|nvme
      [--model torch_gpt|hf_gpt2] [--layers 2 --d-model 256 --heads 4 --seq 128 --micro 8]
      [--steps 50] [--nvme-path DIR] [--profile DIR] [--ranks N --beside PLACEMENT (torch)]

--side torch is the reference neither side wrote: torch's own AdamW and clip_grad_norm_, one
process, in memory, no ZeRO. Its loss curve explains where the two sides' curves part (Note [Loss
spikes] in report.py); its forward and backward are the limit of any engine that runs torch's
kernels (Note [The compute limit] in report.py). With --ranks N it is one rank of an N-rank run,
rank 0's rows on cores / N threads, counted N times over: data parallelism with nothing shared
and nothing communicated.

--profile runs the timed steps under torch.profiler and prints a "profile" RESULT instead of an
"e2e" one: the steps' wall time and how much of it the model's own torch ops (aten::*, the same
on both sides) took on the training thread, with the table of ops written into DIR. What is
left is each side's own cost: hooks, gathers, the optimizer, Python.

Launch 2 ranks with `zinf run -n 2 -- python train.py --side zinf ...` or
`torchrun --nproc-per-node 2 train.py --side deepspeed ...`. DeepSpeed runs on its CPU
accelerator: DS_ACCELERATOR=cpu, which bench/vs_deepspeed.sh sets.
"""

import argparse
import importlib.util
import os
import sys
import time
import traceback

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import common  # noqa: E402

VOCAB = 256
HYPER = {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}
WARMUP_STEPS = 2  # not counted in the step time: first touches, op caches, swap file growth


def add_model_args(ap):
    ap.add_argument("--model", choices=("torch_gpt", "hf_gpt2"), default="torch_gpt")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--micro", type=int, default=8, help="sequences per rank per step")


def _torch_example():
    spec = importlib.util.spec_from_file_location(
        "torch_train_gpt", os.path.join(REPO, "examples", "torch", "train_gpt.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class HfGpt2(torch.nn.Module):
    """Hugging Face's GPT-2 (no dropout) returning the logits, as examples/torch's GPT does."""

    def __init__(self, args):
        super().__init__()
        import transformers
        cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=args.seq,
                                      n_embd=args.d_model, n_layer=args.layers,
                                      n_head=args.heads, resid_pdrop=0.0, embd_pdrop=0.0,
                                      attn_pdrop=0.0)
        self.lm = transformers.GPT2LMHeadModel(cfg)

    def forward(self, tokens):
        return self.lm(input_ids=tokens).logits


def build_model(args):
    torch.manual_seed(0)  # every rank and both sides start from the same values
    if args.model == "hf_gpt2":
        return HfGpt2(args)
    return _torch_example().GPT(VOCAB, args.seq, args.d_model, args.heads, args.layers)


def ds_config(args):
    """The DeepSpeed config both sides read. nvme: DeepSpeed's documented "aio" defaults and
    its ZeRO-Infinity tutorial's placement (parameters and optimizer state on NVMe)."""
    zero = {"stage": 3}
    if args.placement in ("cpu", "nvme"):
        zero["offload_optimizer"] = {"device": "cpu"}
    if args.placement == "nvme":
        zero["offload_param"] = {"device": "nvme", "nvme_path": args.nvme_path}
        zero["offload_optimizer"] = {"device": "nvme", "nvme_path": args.nvme_path}
    config = {"train_micro_batch_size_per_gpu": args.micro, "gradient_accumulation_steps": 1,
              "gradient_clipping": 1.0, "zero_optimization": zero,
              "optimizer": {"type": "AdamW", "params": dict(HYPER)}}
    if args.placement == "nvme":
        config["aio"] = {"block_size": 1048576, "queue_depth": 8, "intra_op_parallelism": 1,
                         "single_submit": False, "overlap_events": True}
    return config


def engine_grad_norm(engine):
    """The last step's gradient norm before clipping, as both engines report it."""
    norm = engine.get_global_grad_norm()
    return None if norm is None else float(norm)


class Zinf:
    """zinf through its DeepSpeed-compatible entry point, called as the DeepSpeed side is."""

    def __init__(self, model, args, threads):
        import zinf
        config = ds_config(args)
        zinf.zero.Init(module=model, config_dict_or_path=config)  # as DeepSpeed's side is
        self.engine, *_ = zinf.initialize(model=model, model_parameters=model.parameters(),
                                          config=config, optimizer_threads=threads)
        self.rank, self.world = self.engine.global_rank, self.engine.world_size
        self.summary = {}

    def forward(self, x):
        return self.engine(x)

    def backward(self, loss):
        self.engine.backward(loss)

    def step(self):
        self.summary = self.engine.step()

    def mean(self, value):
        return self.engine.zero.mean_over_ranks(value)

    def grad_norm(self):
        return engine_grad_norm(self.engine)

    def split(self):
        """The engine's own split of the step and its own count of NVMe bytes."""
        return {k: self.summary[k] for k in ("seconds_gather", "seconds_reduce",
                                             "seconds_optimizer", "bytes_nvme_read",
                                             "bytes_nvme_written")}


class DeepSpeed:
    def __init__(self, model, args, threads):
        import deepspeed
        import torch.distributed as dist
        for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                           ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29533")):
            os.environ.setdefault(key, value)
        deepspeed.init_distributed()  # the CPU accelerator's backend (gloo without oneCCL)
        self.dist = dist
        config = ds_config(args)
        # Partitioned by zero.Init with the config, as DeepSpeed's docs do for ZeRO-3: left to
        # deepspeed.initialize, 0.19.8 on its CPU accelerator stores swapped parameters in bf16
        # whatever the config says (Init._set_dtype without a config). The model is built
        # whole first: its __init__ re-initializes its submodules' weights, which under a
        # zero.Init block DeepSpeed would silently skip (its parameters are empty by then).
        deepspeed.zero.Init(module=model, config_dict_or_path=config)
        self.engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                               config=config)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()

    def forward(self, x):
        return self.engine(x)

    def backward(self, loss):
        self.engine.backward(loss)

    def step(self):
        self.engine.step()

    def mean(self, value):
        t = torch.tensor([value], dtype=torch.float64)
        self.dist.all_reduce(t)
        return t.item() / self.world

    def grad_norm(self):
        return engine_grad_norm(self.engine)

    def split(self):
        return {}


class Torch:
    """The reference neither side wrote: torch's own AdamW and clip_grad_norm_ on the whole
    model in one process, no ZeRO, the same hyper-parameters: the end-to-end table's compute
    limit (Note [The compute limit] in report.py) and the curve that explains where the two
    sides' curves part (Note [Loss spikes]). With --ranks N, rank 0's share of N ranks."""

    def __init__(self, model, args, threads):
        if args.placement != "memory" or int(os.environ.get("WORLD_SIZE", "1")) != 1:
            raise ValueError("--side torch is one process with --placement memory")
        self.model, self.rank, self.world, self.norm = model, 0, args.ranks, None
        self.optimizer = torch.optim.AdamW(model.parameters(), **HYPER)

    def forward(self, x):
        return self.model(x)

    def backward(self, loss):
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()

    def step(self):
        self.norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()

    def mean(self, value):
        return value

    def grad_norm(self):
        return float(self.norm)

    def split(self):
        return {}


def flops_per_token(args):
    """The model's training FLOPs per token: 6 per weight of its matmuls (forward, and the two
    of backward), 12 d_model x layer x seq for attention's two matmuls (computed whole, the
    causal mask applied after), as in Note [The FLOP ceiling] of report.py."""
    d = args.d_model
    return 6 * (args.layers * 12 * d * d + VOCAB * d) + 12 * args.layers * args.seq * d


def matmul_flops(threads, n=1024, rounds=5):
    """The best rate of torch's fp32 n x n matmul on `threads` threads, in FLOP/s: this
    process's share of the machine's arithmetic peak."""
    a, b, c = torch.randn(n, n), torch.randn(n, n), torch.empty(n, n)
    torch.set_num_threads(threads)
    for _ in range(3):
        torch.mm(a, b, out=c)
    reps, best = max(1, int(2e9 / (2 * n ** 3))), 0.0
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(reps):
            torch.mm(a, b, out=c)
        best = max(best, 2 * n ** 3 * reps / (time.perf_counter() - t0))
    return best


def run(args):
    ranks = args.ranks if args.side == "torch" else int(os.environ.get("WORLD_SIZE", "1"))
    threads = max(1, common.cores() // ranks)
    torch.set_num_threads(threads)
    # The script's snapshot of the corpus, so that an edit of the README during a run does not
    # give the two sides different batches.
    corpus = _torch_example().load_corpus(os.environ.get("ZINF_VS_DS_CORPUS", ""))
    model = build_model(args)
    params = sum(p.numel() for p in model.parameters())
    side = {"zinf": Zinf, "deepspeed": DeepSpeed, "torch": Torch}[args.side](model, args, threads)
    rank, world, micro, seq = side.rank, side.world, args.micro, args.seq

    g = torch.Generator().manual_seed(1234)
    losses, grad_norms, steps = [], [], []
    profiler = None
    for step in range(args.steps):
        if args.profile and step == WARMUP_STEPS:
            profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            profiler.start()
        starts = torch.randint(0, len(corpus) - seq - 1, (micro * world,),
                               generator=g)[rank * micro:(rank + 1) * micro]
        batch = torch.stack([corpus[s:s + seq + 1] for s in starts.tolist()])
        io0 = common.disk_io_bytes()
        t0 = time.perf_counter()
        logits = side.forward(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
        t1 = time.perf_counter()
        side.backward(loss)
        t2 = time.perf_counter()
        side.step()
        t3 = time.perf_counter()
        io1 = common.disk_io_bytes()
        losses.append(side.mean(loss.item()))
        grad_norms.append(side.grad_norm())
        steps.append({"forward_s": t1 - t0, "backward_s": t2 - t1, "step_s": t3 - t2,
                      "total_s": t3 - t0, "disk_read": io1[0] - io0[0],
                      "disk_written": io1[1] - io0[1], **side.split()})
    timed = steps[WARMUP_STEPS:] or steps
    if profiler is not None:
        profiler.stop()
        report_profile(args, profiler, timed, side, params)
        return
    per_step = {k: common.median([s[k] for s in timed]) for k in timed[0]}
    # Summed over ranks: the node's memory and disk traffic.
    rss = side.mean(float(common.peak_rss_bytes())) * world
    disk_read = side.mean(per_step["disk_read"]) * world
    disk_written = side.mean(per_step["disk_written"]) * world
    # The torch side also measures the machine's fp32 matmul peak, N ranks' worth (Note [The
    # FLOP ceiling] in report.py).
    ceiling = ({"matmul_flops": matmul_flops(threads) * world,
                "flops_per_token": flops_per_token(args), "beside": args.beside}
               if args.side == "torch" else {})
    if rank == 0:
        common.emit("e2e", side=args.side, model=args.model, placement=args.placement,
                    world=world, threads_per_rank=threads, params=params, layers=args.layers,
                    d_model=args.d_model, seq=seq, micro=micro, steps=args.steps,
                    construction="zero.Init(module)" if args.side != "torch" else "no ZeRO",
                    losses=losses, grad_norms=grad_norms, step_s=per_step["total_s"],
                    tokens_per_s=micro * world * seq / per_step["total_s"],
                    compute_tokens_per_s=micro * world * seq / (per_step["forward_s"] +
                                                                per_step["backward_s"]),
                    peak_rss_bytes=rss, disk_read_per_step=disk_read,
                    disk_written_per_step=disk_written, split=per_step, **ceiling)


def report_profile(args, profiler, timed, side, params):
    """The "profile" RESULT of --profile (see the top of this file)."""
    ops = profiler.key_averages()
    aten_s = sum(e.self_cpu_time_total for e in ops if e.key.startswith("aten::")) / 1e6
    wall_s = sum(s["total_s"] for s in timed)
    if side.rank != 0:
        return
    os.makedirs(args.profile, exist_ok=True)
    name = f"{args.side}_{args.model}_{args.placement}_w{side.world}.txt"
    with open(os.path.join(args.profile, name), "w") as f:
        f.write(ops.table(sort_by="self_cpu_time_total", row_limit=30))
    common.emit("profile", side=args.side, model=args.model, placement=args.placement,
                world=side.world, params=params, layers=args.layers, d_model=args.d_model,
                steps=len(timed), wall_s=wall_s, aten_s=aten_s, table=name)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--side", choices=("zinf", "deepspeed", "torch"), required=True)
    ap.add_argument("--placement", choices=("memory", "cpu", "nvme"), required=True)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--nvme-path", default="")
    ap.add_argument("--ranks", type=int, default=1,
                    help="--side torch: one rank of this many (see the top of the file)")
    ap.add_argument("--beside", choices=("memory", "cpu", "nvme"),
                    help="--side torch: the placement whose runs this one is interleaved with, "
                         "whose rows take it as their compute limit (Note [The compute limit])")
    ap.add_argument("--profile", default="",
                    help="profile the timed steps into this directory (see the top of the file)")
    add_model_args(ap)
    args = ap.parse_args()
    if args.placement == "nvme" and not args.nvme_path:
        ap.error("--placement nvme needs --nvme-path")
    if args.ranks != 1 and args.side != "torch":
        ap.error("--ranks is for --side torch; launch zinf and DeepSpeed with several processes")
    try:
        run(args)
    except Exception as e:  # the refusal is a result: report.py prints its exact text
        if os.environ.get("RANK", "0") == "0":
            common.emit("e2e", side=args.side, model=args.model, placement=args.placement,
                        world=int(os.environ.get("WORLD_SIZE", "1")), layers=args.layers,
                        d_model=args.d_model, error=f"{type(e).__name__}: {e}",
                        traceback=traceback.format_exc()[-3000:])
        raise


if __name__ == "__main__":
    main()
