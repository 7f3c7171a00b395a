#!/usr/bin/python3
"""Reference values for tests/gpt/gpt_test.cc, made with PyTorch.

Run with Debian's interpreter (python3-torch): /usr/bin/python3 gpt_torch_ref.py
It writes gpt_torch_ref.safetensors beside itself: the tokens and targets of one micro-batch,
the mean cross-entropy loss, the logits, and the gradient of the loss for every parameter
("grad.<name>"), from a GPT-2 block stack written out in plain torch to match
examples/gpt/gpt_model.cc: pre-LN blocks, causal attention, GELU (tanh), tied output head.

Parameters are not stored: each is a fixed function of its name and element index
(HashUnit below, repeated in the C++ test), so the file stays small.
"""
import json
import math
import os
import struct

import torch
import torch.nn.functional as F

CONFIG = {"vocab_size": 256, "seq_len": 16, "d_model": 32, "n_layer": 2, "n_head": 4}
BATCH = 2


def fnv1a(name):
    h = 0x811C9DC5
    for b in name.encode():
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


def hash_unit(key, i):
    """Uniform in [-1, 1): a 32-bit integer hash of (key, i)."""
    h = (i * 0x9E3779B1 + key * 0x85EBCA77 + 1) & 0xFFFFFFFF
    h ^= h >> 15
    h = (h * 0x2C1B3C6D) & 0xFFFFFFFF
    h ^= h >> 12
    h = (h * 0x297A2D39) & 0xFFFFFFFF
    h ^= h >> 15
    return h / 2.0**31 - 1.0


def param_value(name, numel):
    """LayerNorm weights 1 + 0.2u, biases 0.1u, embeddings 0.5u, matrices 0.2u."""
    key = fnv1a(name)
    if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
        center, amplitude = 1.0, 0.2
    elif name.endswith(".bias"):
        center, amplitude = 0.0, 0.1
    elif name in ("wte.weight", "wpe.weight"):
        center, amplitude = 0.0, 0.5
    else:
        center, amplitude = 0.0, 0.2
    return torch.tensor([center + amplitude * hash_unit(key, i) for i in range(numel)],
                        dtype=torch.float32)


class Attention(torch.nn.Module):
    def __init__(self, d, n_head):
        super().__init__()
        self.n_head = n_head
        self.c_attn = torch.nn.Linear(d, 3 * d)
        self.c_proj = torch.nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        hd = d // self.n_head
        q, k, v = self.c_attn(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_head, hd).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        return self.c_proj((att @ v).transpose(1, 2).reshape(b, t, d))


class Mlp(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.c_fc = torch.nn.Linear(d, 4 * d)
        self.c_proj = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(torch.nn.Module):
    def __init__(self, d, n_head):
        super().__init__()
        self.ln_1 = torch.nn.LayerNorm(d, eps=1e-5)
        self.attn = Attention(d, n_head)
        self.ln_2 = torch.nn.LayerNorm(d, eps=1e-5)
        self.mlp = Mlp(d)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Gpt(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte = torch.nn.Embedding(c["vocab_size"], c["d_model"])
        self.wpe = torch.nn.Embedding(c["seq_len"], c["d_model"])
        self.h = torch.nn.ModuleList(Block(c["d_model"], c["n_head"]) for _ in range(c["n_layer"]))
        self.ln_f = torch.nn.LayerNorm(c["d_model"], eps=1e-5)

    def forward(self, tokens):
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1]))
        for block in self.h:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.t()


def write_safetensors(path, tensors, metadata):
    """safetensors: 8-byte little-endian header length, JSON header, raw little-endian data."""
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name, t in tensors.items():
        data = t.detach().contiguous().numpy().tobytes()
        dtype = {torch.float32: "F32", torch.int32: "I32"}[t.dtype]
        header[name] = {"dtype": dtype, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the format aligns the data to 8 bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def main():
    torch.manual_seed(0)
    model = Gpt(CONFIG)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(param_value(name, p.numel()).view_as(p))
    # Each row is a window of T + 1 bytes: tokens are its first T, targets its last T.
    t, v = CONFIG["seq_len"], CONFIG["vocab_size"]
    key = fnv1a("tokens")
    rows = torch.tensor([[int((hash_unit(key, r * (t + 1) + i) + 1) / 2 * v) for i in range(t + 1)]
                         for r in range(BATCH)], dtype=torch.int32)
    tokens, targets = rows[:, :-1].contiguous(), rows[:, 1:].contiguous()
    logits = model(tokens.long())
    loss = F.cross_entropy(logits.reshape(-1, v), targets.reshape(-1).long())
    loss.backward()
    tensors = {"tokens": tokens, "targets": targets, "loss": loss.detach().reshape(1),
               "logits": logits.detach()}
    for name, p in model.named_parameters():
        tensors["grad." + name] = p.grad
    metadata = {k: str(val) for k, val in CONFIG.items()}
    metadata["batch"] = str(BATCH)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpt_torch_ref.safetensors")
    write_safetensors(path, tensors, metadata)
    print(f"wrote {path}: loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
