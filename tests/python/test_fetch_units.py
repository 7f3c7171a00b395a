"""zinf.zero's fetch units (Note [Fetch units] in zinf/_fetch_units.py): which modules are
fetched whole with their parent under each setting of stage3_module_granularity_threshold,
and that every setting trains to torch's losses, with tied weights read across units,
activation checkpointing inside a unit, and parameters on NVMe."""

import os
import shutil
import tempfile
import unittest

import torch
import torch.utils.checkpoint

import zinf
import zinf.zero

STEPS = 4


class Block(torch.nn.Module):
    def __init__(self, d, checkpoint=False):
        super().__init__()
        self.fc = torch.nn.Linear(d, d)
        self.norm = torch.nn.LayerNorm(d)
        self.checkpoint = checkpoint

    def forward(self, x):
        if self.checkpoint:
            return x + torch.utils.checkpoint.checkpoint(self._inner, x, use_reentrant=False)
        return x + self._inner(x)

    def _inner(self, x):
        return torch.tanh(self.norm(self.fc(x)))


class Net(torch.nn.Module):
    """An embedding, small blocks, a big layer and a head tied to the embedding."""

    def __init__(self, checkpoint=False):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 8)
        self.blocks = torch.nn.Sequential(*[Block(8, checkpoint) for _ in range(4)])
        self.big = torch.nn.Linear(8, 8 * 64)
        self.down = torch.nn.Linear(8 * 64, 8)
        self.head = torch.nn.Linear(8, 50, bias=False)
        self.head.weight = self.embed.weight  # tied: read by the head from another unit

    def forward(self, tokens):
        h = self.blocks(self.embed(tokens))
        h = h + self.down(torch.relu(self.big(h)))
        return torch.nn.functional.cross_entropy(self.head(h).flatten(0, 1), tokens.flatten())


def config(**zero):
    return {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
            "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.0}},
            "zero_optimization": {"stage": 3, **zero}}


def batches():
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, 50, (2, 6), generator=g) for _ in range(STEPS)]


def torch_losses(checkpoint=False):
    torch.manual_seed(0)
    net = Net(checkpoint)
    opt = torch.optim.AdamW(net.parameters(), lr=0.01, weight_decay=0.0)
    out = []
    for tokens in batches():
        loss = net(tokens)
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


class FetchUnitsTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="zinf-fetch-units-",
                                    dir=os.environ.get("ZINF_BUILD_DIR") or None)
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)

    def train(self, cfg, checkpoint=False):
        torch.manual_seed(0)
        engine = zinf.zero.initialize(Net(checkpoint), cfg)
        losses = []
        for tokens in batches():
            loss = engine(tokens)
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        return engine, losses

    def check(self, cfg, units, checkpoint=False):
        engine, losses = self.train(cfg, checkpoint)
        self.assertEqual(engine._module_names, units)
        for got, want in zip(losses, torch_losses(checkpoint)):
            self.assertAlmostEqual(got, want, delta=1e-5 * abs(want))

    def test_by_default_subtrees_below_the_persistence_threshold_are_one_unit(self):
        # The blocks (4 x 88 elements) are one unit, and the embedding one of its own; big and
        # down (4608 and 4104 elements) are over a persistence threshold of 4000, and so is the
        # root. The head's one parameter is the embedding's.
        self.check(config(stage3_param_persistence_threshold=4000),
                   ["embed", "blocks", "big", "down"])
        # Everything under the default threshold (1e5): the whole model, one fetch.
        self.check(config(), ["<root>"])

    def test_zero_fetches_every_module_with_parameters(self):
        self.check(config(stage3_module_granularity_threshold=0),
                   ["embed"] + [f"blocks.{i}.{m}" for i in range(4) for m in ("fc", "norm")]
                   + ["big", "down"])
        # Without persistence there is nothing to fuse by default either.
        self.check(config(stage3_param_persistence_threshold=0),
                   ["embed"] + [f"blocks.{i}.{m}" for i in range(4) for m in ("fc", "norm")]
                   + ["big", "down"])

    def test_deepspeeds_rule_uses_elements_per_descendant(self):
        # Elements / (1 + descendants): a block 88 / 3 = 29.3, its fc 72, its norm 16; the
        # blocks' Sequential 352 / 13 = 27.1; embed 400; the root 9464 / 18 = 525.8.
        per_module = (["embed"] + [f"blocks.{i}.{m}" for i in range(4) for m in ("fc", "norm")]
                      + ["big", "down"])
        no_persistence = {"stage3_param_persistence_threshold": 0}
        self.check(config(stage3_module_granularity_threshold=28, **no_persistence),
                   ["embed", "blocks", "big", "down"])
        self.check(config(stage3_module_granularity_threshold=27, **no_persistence), per_module)
        self.check(config(stage3_module_granularity_threshold=600, **no_persistence), ["<root>"])

    def test_checkpointing_inside_a_unit_and_parameters_on_nvme(self):
        self.check(config(stage3_param_persistence_threshold=4000), ["embed", "blocks", "big", "down"],
                   checkpoint=True)
        self.check(config(stage3_param_persistence_threshold=4000,
                          offload_param={"device": "nvme", "nvme_path": self.dir},
                          offload_optimizer={"device": "nvme", "nvme_path": self.dir}),
                   ["embed", "blocks", "big", "down"])

    def test_a_bad_threshold_is_refused_naming_the_key(self):
        for bad in (-1, "auto", True, [1]):
            with self.assertRaisesRegex(ValueError, "stage3_module_granularity_threshold must be"):
                zinf.zero.initialize(Net(), config(stage3_module_granularity_threshold=bad))


if __name__ == "__main__":
    unittest.main()
