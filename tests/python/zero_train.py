"""Trains one small model twice from the same initial values: with plain PyTorch
(torch.optim.AdamW, the whole global batch in one process) and under zinf.zero (each rank its
slice of the batch), and compares the loss curves and the final parameters.

Run alone (one rank) or under the launcher, from the repository root:
    PYTHONPATH=build/python build/bin/zinf run -n 2 -- /usr/bin/python3 \
        tests/python/zero_train.py [--offload none|cpu|nvme] [--nvme-path DIR] [--accum 2]
        [--checkpoint reentrant|non-reentrant] [--frozen]
Exits non-zero, saying where, when the curves differ by more than the tolerance.
"""

import argparse
import os
import sys

import torch
import torch.nn.functional as F
import torch.utils.checkpoint

import zinf.zero

# The engine's AdamW runs zinf's fp32 kernels and reduces gradients in rank order; torch's
# runs several fp32 passes: the curves agree to rounding, which grows slowly with steps.
LOSS_RTOL = 2e-4
PARAM_ATOL = 2e-4


class Block(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class TinyLM(torch.nn.Module):
    """Embedding, residual MLP blocks, a LayerNorm and an output layer: parameters in nested
    modules, at the root (a bias of its own) and a module used twice per forward."""

    def __init__(self, vocab=64, width=32, blocks=2, checkpoint=""):
        super().__init__()
        self.checkpoint = checkpoint  # "", "reentrant" or "non-reentrant": each block's
        self.embed = torch.nn.Embedding(vocab, width)
        self.blocks = torch.nn.ModuleList(Block(width) for _ in range(blocks))
        self.shared = torch.nn.Linear(width, width)  # applied twice
        self.norm = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, vocab, bias=False)
        self.out_bias = torch.nn.Parameter(torch.zeros(vocab))

    def forward(self, tokens):
        x = self.embed(tokens)
        for b in self.blocks:
            if self.checkpoint:
                # Backward runs the block's forward again (Note [Recompute in backward]).
                x = torch.utils.checkpoint.checkpoint(
                    b, x, use_reentrant=self.checkpoint == "reentrant")
            else:
                x = b(x)
        x = x + self.shared(torch.tanh(self.shared(x)))
        return self.head(self.norm(x)) + self.out_bias


def make_model(seed=0, checkpoint="", blocks=2, frozen=False):
    """`frozen`: the embedding and the first block frozen (requires_grad False), as a LoRA
    base is beside its adapters."""
    torch.manual_seed(seed)
    model = TinyLM(checkpoint=checkpoint, blocks=blocks)
    if frozen:
        for p in [*model.embed.parameters(), *model.blocks[0].parameters()]:
            p.requires_grad_(False)
    return model


def sequences(steps, global_batch, seq, vocab, seed=1):
    """Sequences of seq + 1 tokens that follow t -> (5t + 3) mod vocab from a random start:
    learnable. torch_models_train.py uses them too."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        tokens = torch.empty(global_batch, seq + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(0, vocab, (global_batch,), generator=g)
        for t in range(seq):
            tokens[:, t + 1] = (5 * tokens[:, t] + 3) % vocab
        yield tokens


def batches(steps, global_batch, seq=8, vocab=64, seed=1):
    """Inputs and next-token targets."""
    for tokens in sequences(steps, global_batch, seq, vocab, seed):
        yield tokens[:, :-1], tokens[:, 1:]


def lm_loss(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def config(args, micro_batch, model_bytes=0):
    zero = {"stage": 3, "stage3_param_persistence_threshold": 0}
    share = getattr(args, "device_budget_share", 0)
    extra = {}
    if share:
        # A device tier that holds `share` of the model's parameters: the read-ahead and the
        # gradient buckets a few modules' worth, so that a module at a time is what must fit.
        zero.update(stage3_prefetch_bucket_size=4096, reduce_bucket_size=4096)
        extra["zinf"] = {"device_budget": int(model_bytes * share)}
    if args.offload != "none":
        zero["offload_param"] = {"device": args.offload}
        zero["offload_optimizer"] = {"device": args.offload}
        if args.offload == "nvme":
            zero["offload_param"]["nvme_path"] = args.nvme_path
            zero["offload_optimizer"]["nvme_path"] = args.nvme_path
    return {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": args.accum,
        "zero_optimization": zero,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95],
                                                   "weight_decay": 0.1}},
        **extra,
    }


def train(args, summaries=None):
    """Returns (reference losses, zinf losses, max parameter difference); rank 0's view. Each
    step's summary is appended to `summaries` when given."""
    micro = 4
    checkpoint = getattr(args, "checkpoint", "")
    blocks = getattr(args, "blocks", 2)
    frozen = getattr(args, "frozen", False)
    model = make_model(checkpoint=checkpoint, blocks=blocks, frozen=frozen)
    model_bytes = sum(p.numel() * 4 for p in model.parameters())
    engine = zinf.zero.initialize(model, config(args, micro, model_bytes), timeout_s=60)
    rank, world = engine.rank, engine.world_size
    global_batch = micro * world * args.accum

    ref = make_model(checkpoint=checkpoint, blocks=blocks, frozen=frozen)
    trained = [p for p in ref.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trained, lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    ref_losses, zinf_losses = [], []
    for tokens, targets in batches(args.steps, global_batch):
        # Reference: the whole global batch at once, as DeepSpeed's numerics promise.
        opt.zero_grad()
        loss = lm_loss(ref(tokens), targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        opt.step()
        ref_losses.append(loss.item())

        # zinf: micro-batches of this rank's rows; the global loss is the mean over both.
        total = 0.0
        for a in range(args.accum):
            rows = slice((a * world + rank) * micro, (a * world + rank + 1) * micro)
            # engine.device: a CPU-built model computes on this process's GPU where there is one.
            loss = lm_loss(engine(tokens[rows].to(engine.device)),
                           targets[rows].to(engine.device))
            engine.backward(loss)
            total += loss.item()
        summary = engine.step()
        if summaries is not None:
            summaries.append(summary)
        zinf_losses.append(engine.mean_over_ranks(total / args.accum))

    gathered = engine.gather_parameters()
    diff = 0.0
    for name, p in ref.named_parameters():
        diff = max(diff, (gathered[name] - p.detach()).abs().max().item())
    return ref_losses, zinf_losses, diff


def check_device_budget(summaries, model_bytes, share):
    """A message when the device tier held more than its budget, or the budget is not
    `share` of the model's parameters; else None."""
    budget = summaries[-1]["device_budget_bytes"]
    peak = max(s["device_peak_bytes"] for s in summaries)
    if budget != int(model_bytes * share):
        return f"the device budget is {budget} bytes, not {share} of the model's {model_bytes}"
    if not 0 < peak <= budget:
        return f"the device tier peaked at {peak} bytes, over its budget of {budget}"
    return None


def check(ref_losses, zinf_losses, diff):
    """A message naming the first step that differs, or None."""
    for step, (a, b) in enumerate(zip(ref_losses, zinf_losses)):
        if abs(a - b) > LOSS_RTOL * abs(a):
            return f"step {step}: torch loss {a:.7f}, zinf loss {b:.7f}"
    if diff > PARAM_ATOL:
        return f"final parameters differ by up to {diff:.3g} (tolerance {PARAM_ATOL})"
    if not ref_losses[-1] < ref_losses[0]:
        return f"the model did not learn: loss {ref_losses[0]:.4f} -> {ref_losses[-1]:.4f}"
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--offload", choices=["none", "cpu", "nvme"], default="none")
    ap.add_argument("--nvme-path", default="")
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--checkpoint", choices=["", "reentrant", "non-reentrant"], default="",
                    help="activation checkpointing of each block")
    ap.add_argument("--blocks", type=int, default=2)
    ap.add_argument("--frozen", action="store_true",
                    help="freeze the embedding and the first block")
    ap.add_argument("--device-budget-share", type=float, default=0,
                    help="zinf.device_budget as this share of the parameters' bytes")
    args = ap.parse_args()
    summaries = []
    ref_losses, zinf_losses, diff = train(args, summaries)
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        for step, (a, b) in enumerate(zip(ref_losses, zinf_losses)):
            print(f"step {step:2d}  torch {a:.6f}  zinf {b:.6f}")
        print(f"max |param difference| {diff:.3g}")
        print(f"host bytes {summaries[-1]['host_bytes']}")
    problem = check(ref_losses, zinf_losses, diff)
    if problem is None and args.device_budget_share:
        model_bytes = sum(p.numel() * 4 for p in make_model(blocks=args.blocks).parameters())
        problem = check_device_budget(summaries, model_bytes, args.device_budget_share)
        print(f"device tier: peak {max(s['device_peak_bytes'] for s in summaries)} bytes, "
              f"budget {summaries[-1]['device_budget_bytes']}, parameters {model_bytes}")
    if problem:
        print(f"MISMATCH: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
