"""zinf.zero.Init: a model built under it trains bitwise as the same model built normally, on
one process and on two; ranks seeded differently are refused; initialization that writes a
built module's parameters outside GatheredParameters is caught, naming the parameter; the
block leaves nn.Module as it found it; the engine binding's initial values from Python; bad
arguments."""

import json
import os
import subprocess
import sys
import unittest

import torch

import zinf.zero
import zero_init_train
from zinf import _unreadable, _zinf

BUILD_DIR = os.environ.get("ZINF_BUILD_DIR", "")
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "zero_init_train.py")


def is_placeholder(p):
    """Whether p holds no values: a NaN placeholder that refuses reads."""
    with torch._C.DisableTorchFunction():
        nan = all(stride == 0 for stride in p.data.stride()) and torch.isnan(p.data).all()
    return nan and isinstance(p, _unreadable._Unreadable)


class ZeroInitTest(unittest.TestCase):
    def setUp(self):
        for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            self.assertNotIn(var, os.environ, "run these tests outside a launcher")

    def test_one_process_trains_bitwise_as_built_normally(self):
        torch.manual_seed(0)
        plain = zero_init_train.TiedLM()
        built_frozen = plain.frozen.weight.detach().clone()
        normal = zero_init_train.train(plain, 6)
        self.assertTrue(torch.equal(normal[2], built_frozen), "the frozen layer changed")
        torch.manual_seed(0)
        with zinf.zero.Init(config_dict_or_path=zero_init_train.CONFIG):
            model = zero_init_train.TiedLM()
        for name, p in model.named_parameters():
            self.assertTrue(is_placeholder(p), f"'{name}' holds its values after construction")
        built = zero_init_train.train(model, 6)
        self.assertIsNone(zero_init_train.compare(normal, built))
        self.assertLess(built[0][-1], built[0][0])

    def launch(self, *extra):
        launcher = os.path.join(BUILD_DIR, "bin", "zinf")
        self.assertTrue(os.path.exists(launcher), f"{launcher} is not built")
        done = subprocess.run([launcher, "run", "-n", "2", "--", sys.executable, SCRIPT, *extra],
                              capture_output=True, text=True, timeout=300)
        self.assertEqual(done.returncode, 0, f"zinf run -n 2 failed:\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def test_two_processes_train_bitwise_as_built_normally(self):
        out = self.launch()
        self.assertIn("[rank 0] bitwise equal", out)
        self.assertIn("[rank 1] bitwise equal", out)

    def test_ranks_seeded_differently_are_refused(self):
        out = self.launch("--seed-by-rank")
        self.assertIn("[rank 0] refused: the ranks built different parameter values", out)
        self.assertIn("[rank 1] refused", out)

    def test_a_write_into_a_built_parameter_is_caught(self):
        class Parent(torch.nn.Module):
            def __init__(self, gathered):
                super().__init__()
                self.child = torch.nn.Linear(4, 4)
                if gathered:
                    with zinf.zero.GatheredParameters(self.child.bias, modifier_rank=0):
                        torch.nn.init.ones_(self.child.bias)
                else:
                    torch.nn.init.ones_(self.child.bias)  # writes into the placeholder

        config = zero_init_train.CONFIG
        # Inside a parent's __init__ (Hugging Face's post_init), the error says what happened.
        with zinf.zero.Init(config_dict_or_path=config):
            with self.assertRaisesRegex(RuntimeError, r"Parent.__init__ wrote into the "
                                        r"parameters of a submodule built before it"):
                Parent(gathered=False)
        with zinf.zero.Init(config_dict_or_path=config):
            model = Parent(gathered=True)
        engine = zinf.zero.initialize(model, config)
        self.assertTrue(torch.equal(engine.gather_parameters()["child.bias"], torch.ones(4)))
        # After construction, before initialize: a write or a read of the values refuses,
        # naming the parameter and what to call; metadata and printing need no values.
        with zinf.zero.Init():
            layer = torch.nn.Linear(4, 4)
        for use in (lambda: torch.nn.init.normal_(layer.weight), lambda: layer.weight.sum(),
                    lambda: layer.weight.data, lambda: layer.weight.tolist(),
                    lambda: layer(torch.ones(4))):
            with self.assertRaisesRegex(zinf.ParameterNotGatheredError,
                                        r"'Linear.weight' is held in zinf's shards.*"
                                        r"GatheredParameters"):
                use()
        self.assertEqual(layer.weight.shape, (4, 4))
        self.assertIn("Linear.weight", repr(layer.weight))
        with zinf.zero.GatheredParameters([layer.weight, layer.bias], modifier_rank=0):
            self.assertTrue(torch.isfinite(layer.weight).all())
            with torch.no_grad():
                layer.weight.fill_(0.5)
        self.assertTrue(is_placeholder(layer.weight))
        with zinf.zero.GatheredParameters([layer.weight]):
            self.assertTrue(torch.equal(layer.weight, torch.full((4, 4), 0.5)))
        # A write that still reached a placeholder (here, straight into its one element) is
        # caught at initialize, naming the parameter.
        with zinf.zero.Init(config_dict_or_path=config):
            model = Parent(gathered=True)
        model.child.weight._zinf_spilled.nan.fill_(1.0)
        with self.assertRaisesRegex(ValueError, "parameter 'child.weight' was written after"):
            zinf.zero.initialize(model, config)

    def test_the_block_leaves_nn_module_as_it_found_it(self):
        linear_init = torch.nn.Linear.__init__
        with zinf.zero.Init():
            class Defined(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.w = torch.nn.Parameter(torch.ones(3))
            inside = Defined()
            with zinf.zero.Init():  # nested: the outer block does the work
                nested = torch.nn.Linear(2, 2)
        self.assertTrue(is_placeholder(inside.w) and is_placeholder(nested.weight))
        self.assertIs(torch.nn.Linear.__init__, linear_init)
        self.assertFalse(is_placeholder(Defined().w))
        self.assertFalse(is_placeholder(torch.nn.Linear(2, 2).weight))
        self.assertNotIn("__init_subclass__", torch.nn.Module.__dict__)
        with zinf.zero.Init(enabled=False):
            self.assertFalse(is_placeholder(torch.nn.Linear(2, 2).weight))
        model = torch.nn.Linear(3, 3)
        zinf.zero.Init(module=model)  # DeepSpeed's form for a model built already
        self.assertTrue(is_placeholder(model.weight))

    def test_the_engine_takes_initial_values_from_python_and_passes_its_errors_on(self):
        # The binding under zinf.zero.initialize: each piece of the shard from the callable;
        # an exception it raises comes out of initialize as it was.
        config = json.dumps(zero_init_train.CONFIG)
        engine = _zinf.Engine(config)
        engine.register_module("m", [("w", [2, 3]), ("b", [5])])
        asked = []

        def values(name, first, count, out):
            asked.append((name, first, count))
            torch.frombuffer(out, dtype=torch.float32).copy_(
                torch.arange(first, first + count, dtype=torch.float32) + (name == "b") * 10)
        engine.initialize(values=values)
        self.assertEqual(asked, [("w", 0, 6), ("b", 0, 5)])
        gathered = torch.frombuffer(bytearray(engine.gather_parameter("b")), dtype=torch.float32)
        self.assertTrue(torch.equal(gathered, torch.arange(5, dtype=torch.float32) + 10))

        def broken(name, first, count, out):
            raise KeyError(f"no values for {name}")
        engine = _zinf.Engine(config)
        engine.register_module("m", [("w", [2, 3])])
        with self.assertRaisesRegex(KeyError, "no values for w"):
            engine.initialize(values=broken)

    def test_bad_arguments(self):
        with self.assertRaisesRegex(ValueError, "names no zero_optimization.offload_param"):
            with zinf.zero.Init(remote_device="nvme"):
                torch.nn.Linear(2, 2)
        with self.assertRaisesRegex(ValueError, "remote_device"):
            zinf.zero.Init(remote_device="gpu")
        with self.assertRaisesRegex(ValueError, "quantized"):
            zinf.zero.Init(zero_quantized_weights=True)
        with self.assertRaisesRegex(ValueError, "config once"):
            zinf.zero.Init(config_dict_or_path={}, config={})
        self.assertIs(torch.nn.Linear.__init__.__name__, "__init__")
        self.assertFalse(is_placeholder(torch.nn.Linear(2, 2).weight))


if __name__ == "__main__":
    unittest.main()
