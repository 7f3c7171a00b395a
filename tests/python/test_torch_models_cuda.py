"""PyTorch models on a GPU under zinf.zero: every test of test_torch_models.py with the models
on cuda (the engine on the same GPU, gathers and reductions there), and what only a GPU has:
bf16 compute, and torch work on a stream other than the default one (Note [On a GPU] in
python/zinf/_device_memory.py).

Skips, saying why, where torch sees no GPU or zinf was built without CUDA."""

import argparse
import os
import shutil
import tempfile
import unittest

import torch

import test_initialize
import test_torch_models as host
import torch_models_train as tm
import zero_train
import zinf.zero


def gpu_missing():
    """Why the models cannot train on a GPU here, or None."""
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no usable GPU"
    try:
        engine = zinf.zero.initialize(torch.nn.Linear(2, 2).cuda(),
                                      {"train_micro_batch_size_per_gpu": 1})
        del engine
    except Exception as e:  # zinf without CUDA says the device is unavailable, and why
        return f"zinf's engine cannot run on cuda here: {e}"
    return None


GPU_MISSING = gpu_missing()


@unittest.skipIf(GPU_MISSING, GPU_MISSING)
class TorchModelsOnGpuTest(host.TorchModelsTest):
    device = "cuda"

    def test_gathered_parameters_are_the_engines_memory_not_copies(self):
        # 64 MiB of weight: a copy per forward would show in torch's allocator.
        torch.manual_seed(0)
        model = torch.nn.Linear(4096, 4096, bias=False).cuda()
        engine = zinf.zero.initialize(model, {"train_micro_batch_size_per_gpu": 2})
        seen = {}

        def look(module, inputs):
            w = module.weight
            seen.update(device=w.device, dtype=w.dtype, nan=bool(torch.isnan(w).any()),
                        torch_bytes=torch.cuda.memory_allocated() - before)

        model.register_forward_pre_hook(look)  # after zinf's, which fetched the weight
        x = torch.randn(2, 4096, device="cuda")
        before = torch.cuda.memory_allocated()
        loss = engine(x).square().mean()
        self.assertEqual(seen["device"], torch.device("cuda", 0))
        self.assertEqual(seen["dtype"], torch.float32)
        self.assertFalse(seen["nan"], "the fetched weight reads as the placeholder")
        self.assertLess(seen["torch_bytes"], 1 << 20,
                        "torch allocated the weight's size: the fetch copied it")
        engine.backward(loss)
        engine.step()
        with self.assertRaises(zinf.ParameterNotGatheredError, msg="the weight stayed fetched"):
            model.weight.sum()

    def test_bf16_computes_in_bf16_and_follows_the_fp32_curve(self):
        args = argparse.Namespace(model="transformer", offload="none", nvme_path=self.dir,
                                  steps=30, device="cuda")
        fp32 = tm.train(args)[0]  # torch's own curve
        model = tm.make("transformer", device="cuda")
        seen = set()
        model.head.register_forward_pre_hook(lambda m, i: seen.add((m.weight.dtype, i[0].dtype)))
        config = tm.config(args, 4)
        config["bf16"] = {"enabled": True}
        engine = zinf.zero.initialize(model, config)
        losses = []
        for tokens in tm.batches(30, 4, device="cuda"):
            loss = engine(tokens)
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        self.assertEqual(seen, {(torch.bfloat16, torch.bfloat16)})
        # bf16 rounds every product to 8 bits of mantissa: the curve follows fp32's loosely.
        for step, (a, b) in enumerate(zip(fp32, losses)):
            self.assertLess(abs(a - b), 0.05 * abs(a), f"step {step}: fp32 {a}, bf16 {b}")
        self.assertLess(sum(losses[-5:]), sum(losses[:5]), f"bf16 did not learn: {losses}")

    def test_torch_on_a_side_stream_trains_as_on_the_default_one(self):
        args = argparse.Namespace(model="encoder", offload="nvme", nvme_path=self.dir,
                                  steps=10, device="cuda")
        default_stream = tm.train(args)[1]  # zinf's losses; the engine goes with the tuple
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            side_stream = tm.train(args)[1]
        self.assertEqual(default_stream, side_stream)


@unittest.skipIf(GPU_MISSING, GPU_MISSING)
class LargerThanTheGpuTest(unittest.TestCase):
    def test_a_cpu_built_model_trains_on_the_gpu_gathered_within_its_budget(self):
        # Note [Where the model computes]: built on the CPU, the model computes on cuda:0
        # (LOCAL_RANK 0) with its parameters homed in host memory or on NVMe and gathered into
        # a device tier a third of their size (zinf.device_budget: the engine's device memory is
        # its own, not torch's allocator's): the CPU torch's losses, the tier's peak within its
        # budget.
        directory = tempfile.mkdtemp(prefix="zinf-gpu-test-",
                                     dir=os.environ.get("ZINF_BUILD_DIR") or None)
        self.addCleanup(shutil.rmtree, directory, ignore_errors=True)
        model_bytes = sum(p.numel() * 4 for p in zero_train.make_model(blocks=24).parameters())
        for offload in ("cpu", "nvme"):
            with self.subTest(offload=offload):
                args = argparse.Namespace(offload=offload, nvme_path=directory, accum=1,
                                          steps=12, blocks=24, device_budget_share=1 / 3)
                summaries = []
                ref, got, diff = zero_train.train(args, summaries)
                self.assertIsNone(zero_train.check(ref, got, diff), f"torch {ref}\nzinf {got}")
                self.assertIsNone(
                    zero_train.check_device_budget(summaries, model_bytes, 1 / 3))
                self.assertGreater(summaries[-1]["bytes_up"], 0, "nothing went to the GPU")


@unittest.skipIf(GPU_MISSING, GPU_MISSING)
class InitializeOnGpuTest(test_initialize.LoopRunner):
    def test_getting_started_loop_with_the_model_on_cuda(self):
        # DeepSpeed's loop with the model on the GPU: torch's losses, and the resume from the
        # checkpoint bitwise.
        results = self.run_loop("zinf", 1, test_initialize.loop_config(), device="cuda")
        self.check_loop(1, results)


if __name__ == "__main__":
    unittest.main()
