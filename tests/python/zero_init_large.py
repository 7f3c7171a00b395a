"""Builds a model whose fp32 weights are larger than this process may hold under
zinf.zero.Init (a stack of Linear layers, or with --model gpt2 a Hugging Face GPT-2 from a
config, whose post_init re-initializes every weight), parameters and optimizer state on NVMe,
trains it a few steps, and prints one
JSON line: the model's fp32 bytes, the process's resident memory before building (VmRSS, torch
and zinf loaded), its peak (VmHWM) after building, after initialize and at the end, its
resident memory after each step, and the losses. test_zero_init_large.py checks the peaks.

    PYTHONPATH=build/python /usr/bin/python3 tests/python/zero_init_large.py \
        --nvme-path build/zi --layers 64 --width 2048
"""

import argparse
import json

import torch

import zinf.zero


class Stack(torch.nn.Module):
    """Square Linear layers with a tanh between: each layer's weights one engine module."""

    def __init__(self, layers, width):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


def hf_gpt2(layers, width):
    """Hugging Face's GPT-2 from a config: a vocabulary of 256, sequences of 16, no dropout."""
    import transformers
    config = transformers.GPT2Config(vocab_size=256, n_positions=16, n_embd=width, n_layer=layers,
                                     n_head=16, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(config)


def config(nvme_path):
    nvme = {"device": "nvme", "nvme_path": nvme_path}
    return {
        "train_micro_batch_size_per_gpu": 4,
        "zero_optimization": {"stage": 3, "offload_param": nvme, "offload_optimizer": nvme,
                              "stage3_param_persistence_threshold": 0,
                              "stage3_max_live_parameters": 20_000_000,
                              "stage3_prefetch_bucket_size": 10_000_000,
                              "reduce_bucket_size": 5_000_000},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        # The gradient accumulators on NVMe too, and small staging: host memory stays flat.
        "zinf": {"gradients_on_nvme": True, "host_budget": 64 << 20},
    }


def memory_bytes(field):
    """VmHWM (peak resident memory) or VmRSS (resident now) of this process."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nvme-path", required=True)
    ap.add_argument("--layers", type=int, default=64)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--model", choices=("stack", "gpt2"), default="stack")
    args = ap.parse_args()
    cfg = config(args.nvme_path)
    if args.model == "gpt2":
        hf_gpt2(1, 64)  # what transformers imports on first use, before the baseline is read
    torch.manual_seed(0)
    before_rss = memory_bytes("VmRSS")  # torch and zinf loaded, nothing built
    with zinf.zero.Init(config_dict_or_path=cfg):
        model = Stack(args.layers, args.width) if args.model == "stack" else hf_gpt2(
            args.layers, args.width)
    built_rss = memory_bytes("VmHWM")
    engine = zinf.zero.initialize(model, cfg)
    initialized_rss = memory_bytes("VmHWM")
    g = torch.Generator().manual_seed(1)
    if args.model == "stack":
        x = torch.randn(4, args.width, generator=g)
        target = torch.tanh(torch.randn(4, args.width, generator=g))

        def compute_loss():
            return torch.nn.functional.mse_loss(engine(x), target)
    else:
        tokens = torch.randint(0, 256, (4, 16), generator=g)

        def compute_loss():
            return engine(input_ids=tokens, labels=tokens).loss
    losses, rss_after_steps = [], []
    for _ in range(args.steps):
        loss = compute_loss()
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
        rss_after_steps.append(memory_bytes("VmRSS"))
    model_bytes = sum(p.numel() for p in model.parameters()) * 4
    print(json.dumps({"model_bytes": model_bytes, "rss_before_build_bytes": before_rss,
                      "peak_rss_bytes": memory_bytes("VmHWM"),
                      "peak_rss_after_build_bytes": built_rss,
                      "peak_rss_after_initialize_bytes": initialized_rss,
                      "rss_after_step_bytes": rss_after_steps,
                      "losses": losses}))


if __name__ == "__main__":
    main()
