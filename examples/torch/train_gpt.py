#!/usr/bin/env python3
"""A small GPT written in plain PyTorch, trained under zinf's ZeRO-3 engine with its parameters
on NVMe: the model is an ordinary nn.Module; zinf.zero.initialize does the rest.

Build:  cmake --build build --target zinf_python_package zinf
Run:    PYTHONPATH=build/python /usr/bin/python3 examples/torch/train_gpt.py [--steps 100]
        PYTHONPATH=build/python build/bin/zinf run -n 2 -- /usr/bin/python3 \\
            examples/torch/train_gpt.py --nvme-path /mnt/nvme
        [--config examples/torch/nvme.json] [--data FILE] [--layers 2] [--d-model 128]
        [--heads 4] [--seq 64] [--save DIR] [--device cuda]

Debian's /usr/bin/python3 is the interpreter python3-torch is installed for. The config is a
DeepSpeed config; "@NVME_PATH@" in it becomes --nvme-path (default: a temporary directory,
removed at the end). The model is byte-level; without --data it trains on zinf's own README
and architecture notes. Rank 0 prints each step's loss (the mean over ranks), tokens per second
and the bytes the engine read from NVMe. With --device cuda the model is put on the rank's GPU
(cuda:LOCAL_RANK) before initialize, and the engine runs there.
"""

import argparse
import math
import os
import shutil
import tempfile
import time

import torch
import torch.nn.functional as F

import zinf.zero

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


class CausalSelfAttention(torch.nn.Module):
    def __init__(self, d_model, heads):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(d_model, 3 * d_model)
        self.proj = torch.nn.Linear(d_model, d_model)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (y.view(b, t, self.heads, d // self.heads).transpose(1, 2) for y in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        return self.proj(y)


class Block(torch.nn.Module):
    def __init__(self, d_model, heads):
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, heads)
        self.ln2 = torch.nn.LayerNorm(d_model)
        self.fc = torch.nn.Linear(d_model, 4 * d_model)
        self.out = torch.nn.Linear(4 * d_model, d_model)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(torch.nn.Module):
    def __init__(self, vocab, seq, d_model, heads, layers):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, d_model)
        self.pos = torch.nn.Embedding(seq, d_model)
        self.blocks = torch.nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(d_model)
        self.head = torch.nn.Linear(d_model, vocab, bias=False)
        for name, p in self.named_parameters():
            if name.endswith("weight") and p.dim() == 2:
                torch.nn.init.normal_(p, std=0.02)

    def forward(self, tokens):
        t = tokens.shape[1]
        x = self.tok(tokens) + self.pos(torch.arange(t, device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def load_corpus(path):
    if path:
        with open(path, "rb") as f:
            data = f.read()
    else:
        data = b""
        for name in ("README.md", "docs/ARCHITECTURE.md", "DESIGN.md"):
            p = os.path.join(REPO, name)
            if os.path.exists(p):
                with open(p, "rb") as f:
                    data += f.read()
    if len(data) < 1024:
        raise SystemExit(f"train_gpt: the corpus has {len(data)} bytes; give --data FILE")
    return torch.tensor(list(data), dtype=torch.long)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=os.path.join(HERE, "nvme.json"))
    ap.add_argument("--nvme-path", default="")
    ap.add_argument("--data", default="")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--save", default="")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="where the model computes (cuda: cuda:LOCAL_RANK)")
    args = ap.parse_args()
    device = (f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}" if args.device == "cuda"
              else "cpu")

    nvme_path, temporary = args.nvme_path, None
    if not nvme_path:
        # One directory for all ranks of this node: each rank's swap files carry its rank.
        temporary = nvme_path = os.path.join(tempfile.gettempdir(),
                                             f"zinf-torch-gpt-{os.getppid()}")
        os.makedirs(nvme_path, exist_ok=True)
    with open(args.config) as f:
        config = f.read().replace("@NVME_PATH@", nvme_path)

    corpus = load_corpus(args.data)
    torch.manual_seed(0)  # every rank starts from the same model
    model = GPT(256, args.seq, args.d_model, args.heads, args.layers).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    engine = zinf.zero.initialize(model, config)
    rank, world, micro = engine.rank, engine.world_size, engine.micro_batch_size
    if rank == 0:
        print(f"GPT: {n_params / 1e6:.2f}M parameters, {args.layers} layers, d_model "
              f"{args.d_model}, seq {args.seq}; {world} rank(s) x {micro} sequences on "
              f"{engine.device}; NVMe path {nvme_path}")

    g = torch.Generator().manual_seed(1234)
    try:
        for step in range(args.steps):
            t0 = time.perf_counter()
            total = 0.0
            for _ in range(engine.gradient_accumulation_steps):
                # Every rank draws the global batch and takes its own rows.
                starts = torch.randint(0, len(corpus) - args.seq - 1, (micro * world,),
                                       generator=g)[rank * micro:(rank + 1) * micro]
                batch = torch.stack([corpus[s:s + args.seq + 1]
                                     for s in starts.tolist()]).to(engine.device)
                logits = engine(batch[:, :-1])
                loss = F.cross_entropy(logits.reshape(-1, 256), batch[:, 1:].reshape(-1))
                engine.backward(loss)
                total += loss.item()
            summary = engine.step()
            loss = engine.mean_over_ranks(total / engine.gradient_accumulation_steps)
            seconds = time.perf_counter() - t0
            if rank == 0:
                tokens = micro * world * args.seq * engine.gradient_accumulation_steps
                print(f"step {step + 1:4d}  loss {loss:.4f}  lr {engine.learning_rate:.2e}  "
                      f"{tokens / seconds:7.0f} tokens/s  NVMe read "
                      f"{summary['bytes_nvme_read'] / 2**20:.1f} MiB", flush=True)
        if args.save:
            engine.save_checkpoint(args.save, f"step{args.steps}", {"step": args.steps})
    finally:
        if temporary and rank == 0:
            shutil.rmtree(temporary, ignore_errors=True)


if __name__ == "__main__":
    main()
