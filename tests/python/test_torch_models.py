"""Models no one in this project wrote, under zinf.zero.initialize without hand registration,
train to plain PyTorch's loss curve within 1e-5 (relative) over 30 steps, on one process and
on two (`zinf run -n 2`), with parameters in memory and on NVMe: nn.Transformer and
nn.TransformerEncoder (nn.MultiheadAttention reads out_proj's weight without calling it), a
CNN with BatchNorm, and, where `transformers` is importable, Hugging Face's GPT-2 and Llama
built from a config. The training itself is tests/python/torch_models_train.py.

The same tests run on a GPU (the model on cuda, the engine there) in
test_torch_models_cuda.py, which subclasses this one with `device = "cuda"`."""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import torch

import torch_models_train as tm
import zinf.zero

BUILD_DIR = os.environ.get("ZINF_BUILD_DIR", "")
HERE = os.path.dirname(os.path.abspath(__file__))

try:
    import transformers  # noqa: F401
    NO_TRANSFORMERS = None
except ImportError as e:
    NO_TRANSFORMERS = (f"transformers is not importable for {sys.executable} ({e}): "
                       f"pip install transformers (into a virtualenv with this torch)")


def read_safetensors(path):
    """{name: tensor} of a safetensors file (the format is a length, a JSON header, the data)."""
    dtypes = {"F32": torch.float32, "I64": torch.int64, "BF16": torch.bfloat16}
    with open(path, "rb") as f:
        raw = f.read()
    size = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + size])
    data = raw[8 + size:]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        begin, end = t["data_offsets"]
        out[name] = torch.frombuffer(bytearray(data[begin:end]),
                                     dtype=dtypes[t["dtype"]]).reshape(t["shape"])
    return out


class TorchModelsTest(unittest.TestCase):
    device = "cpu"  # where the models and the engine compute

    def setUp(self):
        for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            self.assertNotIn(var, os.environ, "run these tests outside a launcher")
        self.dir = tempfile.mkdtemp(prefix="zinf-torch-models-", dir=BUILD_DIR or None)
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)

    def one_process(self, model, offload):
        args = argparse.Namespace(model=model, offload=offload, nvme_path=self.dir, steps=30,
                                  device=self.device)
        ref, got, _, _ = tm.train(args)
        problem = tm.check(ref, got)
        self.assertIsNone(problem, f"{model} {offload}: {problem}\ntorch {ref}\nzinf  {got}")

    def two_processes(self, model, offload):
        if self.device == "cuda" and torch.cuda.device_count() < 2:
            self.skipTest(f"two ranks on cuda need two GPUs; {torch.cuda.device_count()} here")
        launcher = os.path.join(BUILD_DIR, "bin", "zinf")
        self.assertTrue(os.path.exists(launcher), f"{launcher} is not built")
        done = subprocess.run(
            [launcher, "run", "-n", "2", "--", sys.executable,
             os.path.join(HERE, "torch_models_train.py"), "--model", model, "--offload", offload,
             "--nvme-path", self.dir, "--device", self.device],
            capture_output=True, text=True, timeout=600)
        self.assertEqual(done.returncode, 0,
                         f"{model} {offload} on 2 processes:\n{done.stdout}\n{done.stderr}")
        self.assertIn("[rank 0] step 29", done.stdout)

    def check_model(self, model):
        for offload in ("none", "nvme"):
            with self.subTest(processes=1, offload=offload):
                self.one_process(model, offload)
            with self.subTest(processes=2, offload=offload):
                self.two_processes(model, offload)

    def test_transformer(self):
        self.check_model("transformer")

    def test_transformer_encoder(self):
        self.check_model("encoder")

    def test_cnn_with_batchnorm(self):
        self.check_model("cnn_bn")

    def test_batchnorm_statistics_survive_a_resume_and_are_exported(self):
        args = argparse.Namespace(model="cnn_bn", offload="none", nvme_path=self.dir, steps=10,
                                  device=self.device)
        self.assertIsNone(tm.resume_check(args))
        # `zinf ckpt export` writes the buffers beside the parameters, in their own dtype.
        out = os.path.join(self.dir, "cnn.safetensors")
        done = subprocess.run([os.path.join(BUILD_DIR, "bin", "zinf"), "ckpt", "export",
                               os.path.join(self.dir, "resume-ckpt"), "--out", out],
                              capture_output=True, text=True, timeout=120)
        self.assertEqual(done.returncode, 0, done.stderr)
        tensors = read_safetensors(out)
        model = tm.make("cnn_bn", device=self.device)
        engine = zinf.zero.initialize(model, tm.config(args, 4))
        engine.load_checkpoint(os.path.join(self.dir, "resume-ckpt"))
        for name, want in model.state_dict().items():
            if name.endswith(("running_mean", "running_var", "num_batches_tracked")):
                self.assertIn(name, tensors)
                self.assertTrue(torch.equal(tensors[name], want.cpu()), name)
        self.assertEqual(tensors["net.1.num_batches_tracked"].dtype, torch.int64)
        self.assertEqual(int(tensors["net.1.num_batches_tracked"]), 10)
        # Two processes: every rank resumes with rank 0's statistics.
        with self.subTest(processes=2):
            if self.device == "cuda" and torch.cuda.device_count() < 2:
                self.skipTest(f"two ranks on cuda need two GPUs; {torch.cuda.device_count()} "
                              f"here")
            done = subprocess.run(
                [os.path.join(BUILD_DIR, "bin", "zinf"), "run", "-n", "2", "--", sys.executable,
                 os.path.join(HERE, "torch_models_train.py"), "--model", "cnn_bn",
                 "--resume-check", "--nvme-path", os.path.join(self.dir, "two"),
                 "--device", self.device],
                capture_output=True, text=True, timeout=600)
            self.assertEqual(done.returncode, 0, f"{done.stdout}\n{done.stderr}")
            self.assertIn("[rank 1] [resume check] rank 1 ok", done.stdout)

    @unittest.skipIf(NO_TRANSFORMERS, NO_TRANSFORMERS)
    def test_hugging_face_gpt2(self):
        self.check_model("gpt2")

    @unittest.skipIf(NO_TRANSFORMERS, NO_TRANSFORMERS)
    def test_hugging_face_llama(self):
        self.check_model("llama")

    @unittest.skipIf(NO_TRANSFORMERS, NO_TRANSFORMERS)
    def test_hugging_face_gradient_checkpointing_with_offloaded_parameters(self):
        # Trainer's --gradient_checkpointing: backward recomputes each block, which must fetch
        # what it reads (Note [Recompute in backward] in zinf/zero.py). Offloaded parameters
        # are where a recompute that read released memory went wrong.
        for model in ("gpt2_ckpt", "gpt2_ckpt_reentrant", "llama_ckpt"):
            for offload in ("cpu", "nvme"):
                with self.subTest(processes=1, model=model, offload=offload):
                    self.one_process(model, offload)
        with self.subTest(processes=2, model="gpt2_ckpt", offload="cpu"):
            self.two_processes("gpt2_ckpt", "cpu")

    def test_a_parameter_read_outside_its_module_is_fetched_by_the_reader(self):
        # nn.MultiheadAttention alone: its forward passes out_proj.weight and .bias to
        # F.multi_head_attention_forward without calling out_proj.
        tm.deterministic(self.device)
        torch.manual_seed(0)
        ref = torch.nn.MultiheadAttention(8, 2, batch_first=True).to(self.device)
        torch.manual_seed(0)
        model = torch.nn.MultiheadAttention(8, 2, batch_first=True).to(self.device)
        # Offloaded, so that out_proj is fetched and released (resident parameters never are:
        # Note [Resident parameters]).
        engine = zinf.zero.initialize(model, {
            "train_micro_batch_size_per_gpu": 2,
            "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}})
        x = torch.randn(2, 3, 8).to(self.device)
        want = ref(x, x, x, need_weights=False)[0]
        got = engine(x, x, x, need_weights=False)[0]
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        # Released with the reader: between forwards out_proj holds its placeholder again.
        with torch._C.DisableTorchFunction():
            weight = model.out_proj.weight.data
            elements = (weight.untyped_storage().nbytes() // weight.element_size()
                        if hasattr(weight, "untyped_storage") else weight.storage().size())
        self.assertEqual(elements, 1)
        engine.backward(got.square().sum())
        want.square().sum().backward()
        grads = engine.gather_gradients()
        torch.testing.assert_close(grads["out_proj.weight"], ref.out_proj.weight.grad.cpu())
        # Outside any forward nothing is fetched, and the placeholder refuses to be read.
        with self.assertRaisesRegex(zinf.ParameterNotGatheredError, "'out_proj.weight'"):
            model.out_proj.weight.sum()

    def test_a_module_that_returns_a_view_of_its_parameter_returns_its_values(self):
        # A learned table returned by slicing, as position embeddings and learned queries are.
        # The view must outlive the module's release, and the next step's update: torch
        # computes on the engine's memory (Note [The engine's memory]). Offloaded, so that the
        # module is released (a resident parameter's view follows its updates, as in torch).
        class Table(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.weight = torch.nn.Parameter(torch.randn(6, 8))

            def forward(self, n):
                return self.weight[:n]

        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.table = Table()
                self.head = torch.nn.Linear(8, 1)
                self.scale = torch.nn.Parameter(torch.randn(8))

            def forward(self, x):  # returns a view of its own parameter too, in a tuple
                rows = self.table(x.shape[0])
                return self.head(x * self.scale + rows).square().sum(), rows, self.scale[:2]

        tm.deterministic(self.device)
        torch.manual_seed(0)
        ref = Model().to(self.device)
        torch.manual_seed(0)
        model = Model().to(self.device)
        engine = zinf.zero.initialize(model, {
            "train_micro_batch_size_per_gpu": 4,
            "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}},
            "optimizer": {"type": "AdamW", "params": {"lr": 0.1}}})
        x = torch.randn(4, 8).to(self.device)
        want = ref(x)
        got = engine(x)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
        engine.backward(got[0] + got[1].sum() + got[2].sum())
        (want[0] + want[1].sum() + want[2].sum()).backward()
        grads = engine.gather_gradients()
        torch.testing.assert_close(grads["table.weight"], ref.table.weight.grad.cpu())
        torch.testing.assert_close(grads["scale"], ref.scale.grad.cpu())
        engine.step()
        self.assertFalse(torch.equal(engine.gather_parameters()["table.weight"],
                                     ref.table.weight.detach().cpu()))  # the step moved it
        for g, w in zip(got, want):  # the values returned stay
            torch.testing.assert_close(g, w, rtol=0, atol=0)


if __name__ == "__main__":
    unittest.main()
