"""Builds one model twice from the same seed, normally and under zinf.zero.Init, trains each
under zinf.zero for a few steps and checks that losses, parameters and frozen weights are
bitwise equal. The model has what construction meets in practice: nested modules, a
parameter made by __init__ itself, a parent that initializes a child's parameters after the
child was built (under GatheredParameters), tied weights and a frozen layer.

Run alone (one rank) or under the launcher, from the repository root:
    PYTHONPATH=build/python build/bin/zinf run -n 2 -- /usr/bin/python3 \
        tests/python/zero_init_train.py [--seed-by-rank]
--seed-by-rank seeds each rank differently: initialize must refuse the model.
Exits non-zero, saying where, when anything differs.
"""

import argparse
import gc
import os
import sys

import torch

import zinf.zero
import zero_train


class TiedLM(torch.nn.Module):
    def __init__(self, vocab=64, width=32):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.blocks = torch.nn.ModuleList(zero_train.Block(width) for _ in range(2))
        self.scale = torch.nn.Parameter(torch.randn(width) * 0.1 + 1)  # made by __init__ itself
        self.frozen = torch.nn.Linear(width, width)
        self.frozen.requires_grad_(False)
        self.head = torch.nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied
        # A parent's initialization of its children, as GPT-2's _init_weights.
        with zinf.zero.GatheredParameters(list(self.blocks.parameters()), modifier_rank=0):
            for block in self.blocks:
                torch.nn.init.normal_(block.down.weight, std=0.02)
                torch.nn.init.zeros_(block.down.bias)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.frozen(x) * self.scale)


CONFIG = {"train_micro_batch_size_per_gpu": 4,
          "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
          "gradient_clipping": 1.0,
          "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}}}


def train(model, steps):
    """(losses, gathered parameters, frozen weight) of `steps` steps under zinf.zero."""
    engine = zinf.zero.initialize(model, CONFIG, timeout_s=60)
    rank, world = engine.rank, engine.world_size
    losses = []
    for tokens, targets in zero_train.batches(steps, 4 * world):
        rows = slice(rank * 4, (rank + 1) * 4)
        loss = zero_train.lm_loss(engine(tokens[rows]), targets[rows])
        engine.backward(loss)
        engine.step()
        losses.append(engine.mean_over_ranks(loss.item()))
    gathered = engine.gather_parameters()  # the frozen layer's too: the engine holds it
    out = losses, gathered, gathered["frozen.weight"]
    # The model's hooks, the last loss's graph and the engine refer to each other: collect
    # them now, so that the next engine of this process may take the rendezvous port.
    del engine, model, loss
    gc.collect()
    return out


def compare(normal, built):
    """A message naming the first difference, or None."""
    if normal[0] != built[0]:
        return f"losses differ: normal {normal[0]}, under Init {built[0]}"
    for name, value in normal[1].items():
        if not torch.equal(value, built[1][name]):
            return f"parameter '{name}' differs by {(value - built[1][name]).abs().max()}"
    if not torch.equal(normal[2], built[2]):
        return "the frozen layer's weights differ"
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--seed-by-rank", action="store_true")
    args = ap.parse_args()
    if args.seed_by_rank:
        torch.manual_seed(int(os.environ.get("RANK", "0")))
        with zinf.zero.Init(config_dict_or_path=CONFIG):
            model = TiedLM()
        try:
            zinf.zero.initialize(model, CONFIG, timeout_s=60)
        except ValueError as e:
            print(f"refused: {e}")
            return 0
        print("MISMATCH: ranks seeded differently were not refused", file=sys.stderr)
        return 1
    torch.manual_seed(0)
    normal = train(TiedLM(), args.steps)
    if "MASTER_PORT" in os.environ:
        # The second engine rendezvouses on a port of its own: the first one's may not be
        # free again yet on every rank.
        os.environ["ZINF_MASTER_PORT"] = str(int(os.environ["MASTER_PORT"]) + 2)
    torch.manual_seed(0)
    with zinf.zero.Init(config_dict_or_path=CONFIG):
        model = TiedLM()
    for name, p in model.named_parameters():
        with torch._C.DisableTorchFunction():  # placeholders refuse reads of their values
            holds_values = p.data.numel() > 1 and any(stride != 0 for stride in p.data.stride())
        if holds_values:
            print(f"MISMATCH: '{name}' holds its values after construction", file=sys.stderr)
            return 1
    problem = compare(normal, train(model, args.steps))
    if problem:
        print(f"MISMATCH: {problem}", file=sys.stderr)
        return 1
    print(f"bitwise equal over {args.steps} steps; losses {normal[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
