"""Hugging Face round trips: a GPT-2 and a Llama built from a config train under zinf.zero, and
`zinf ckpt export --hf` writes what transformers' from_pretrained loads into a model whose
logits are the trained model's; the native GPT example (train_gpt) exports as a GPT-2 whose
loss is train_gpt's own on the same tokens; a directory written by save_pretrained (one file, and sharded
with an index) imports with `zinf ckpt import` into a checkpoint that zinf.zero loads with the
model's values. Skips where transformers is not installed (pip install transformers)."""

import json
import os
import shutil
import subprocess
import tempfile
import unittest

import torch

import zinf.zero

try:
    import transformers
except ImportError:
    transformers = None

BUILD_DIR = os.environ.get("ZINF_BUILD_DIR", "")
CONFIG = {"train_micro_batch_size_per_gpu": 2,
          "zero_optimization": {"stage": 3},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}}
VOCAB, SEQ = 64, 12


def gpt2():
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=16, n_embd=32, n_layer=2, n_head=4,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0))


def llama():
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
        tie_word_embeddings=False))


def batch(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (2, SEQ), generator=g)


@unittest.skipIf(transformers is None, "transformers is not installed for this interpreter "
                                       "(pip install transformers safetensors)")
class HfCheckpointTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="zinf-hf-test-", dir=BUILD_DIR or None)
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        self.zinf_cli = os.path.join(BUILD_DIR, "bin", "zinf")
        self.assertTrue(os.path.exists(self.zinf_cli), f"{self.zinf_cli} is not built")

    def cli(self, *args):
        done = subprocess.run([self.zinf_cli, *args], capture_output=True, text=True, timeout=300)
        self.assertEqual(done.returncode, 0, f"zinf {' '.join(args)}:\n{done.stdout}{done.stderr}")
        return done.stdout

    def train_and_export(self, make, name):
        torch.manual_seed(0)
        engine = zinf.zero.initialize(make(), CONFIG)
        for step in range(3):
            ids = batch(step)
            engine.backward(engine(input_ids=ids, labels=ids).loss)
            engine.step()
        engine.eval()
        ids = batch(100)
        with torch.no_grad():
            trained = engine(input_ids=ids).logits
        ckpt = os.path.join(self.dir, name)
        engine.save_checkpoint(ckpt, "step-3")
        out = os.path.join(self.dir, name + "-hf")
        self.cli("ckpt", "export", ckpt, "--hf", out)
        loaded = type(engine.module).from_pretrained(out).eval()
        with torch.no_grad():
            got = loaded(input_ids=ids).logits
        # The exported values are the engine's fp32 master copy, which its forward computes
        # with, and the module hooks change no arithmetic: the same logits, bit for bit.
        torch.testing.assert_close(got, trained, rtol=0, atol=0)
        return out

    def test_gpt2_trained_under_zinf_loads_with_from_pretrained(self):
        out = self.train_and_export(gpt2, "gpt2")
        with open(os.path.join(out, "config.json")) as f:
            config = json.load(f)
        self.assertEqual(config["model_type"], "gpt2")
        self.assertEqual(config["architectures"], ["GPT2LMHeadModel"])

    def test_llama_trained_under_zinf_loads_with_from_pretrained(self):
        self.train_and_export(llama, "llama")

    def test_train_gpt_exports_as_a_gpt2_that_computes_its_loss(self):
        train_gpt = os.path.join(BUILD_DIR, "bin", "train_gpt")
        if not os.path.exists(train_gpt):
            self.skipTest(f"{train_gpt} is not built (it needs oneDNN)")
        seq = 16
        config = os.path.join(self.dir, "gpt.json")
        with open(config, "w") as f:
            json.dump({"model": {"vocab_size": 256, "seq_len": seq, "d_model": 32, "n_layer": 2,
                                 "n_head": 4},
                       **CONFIG, "train_micro_batch_size_per_gpu": 1}, f)
        # seq + 2 bytes: two windows, so each step's loss is one of two known ones.
        data = bytes((7 * i + 3) % 256 for i in range(seq + 2))
        with open(os.path.join(self.dir, "data.bin"), "wb") as f:
            f.write(data)
        ckpt, metrics = os.path.join(self.dir, "gpt"), os.path.join(self.dir, "m.jsonl")
        common = ["--config", config, "--data", os.path.join(self.dir, "data.bin"),
                  "--matmul", "fp32", "--threads", "1"]
        for args in (["--steps", "2", "--save", ckpt],
                     ["--steps", "3", "--resume", ckpt, "--metrics", metrics]):
            done = subprocess.run([train_gpt, *common, *args], capture_output=True, text=True,
                                  timeout=300)
            self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        with open(metrics) as f:
            loss = json.loads(f.readlines()[-1])["loss"]  # step 3: the checkpoint's weights
        out = os.path.join(self.dir, "gpt-hf")
        self.cli("ckpt", "export", ckpt, "--hf", out)
        model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
        self.assertIsInstance(model, transformers.GPT2LMHeadModel)
        tokens = torch.tensor(list(data))
        losses = []
        for start in (0, 1):
            window = tokens[start:start + seq + 1]
            with torch.no_grad():
                logits = model(input_ids=window[None, :seq]).logits[0]
            losses.append(torch.nn.functional.cross_entropy(logits, window[1:]).item())
        self.assertGreater(abs(losses[0] - losses[1]), 1e-3)  # the windows are told apart
        # fp32 on both sides; oneDNN and torch sum in different orders.
        self.assertLess(min(abs(loss - x) for x in losses), 1e-5 * loss,
                        f"train_gpt's loss {loss}, GPT-2's on the two windows {losses}")

    def import_and_load(self, make, saved, **save_kwargs):
        """save_pretrained(saved model) -> zinf ckpt import -> zinf.zero load_checkpoint of a
        differently initialized model: every value is the saved model's."""
        hf_dir = os.path.join(self.dir, "saved")
        saved.save_pretrained(hf_dir, **save_kwargs)
        config_file = os.path.join(self.dir, "ds.json")
        with open(config_file, "w") as f:
            json.dump(CONFIG, f)
        ckpt = os.path.join(self.dir, "imported")
        self.cli("ckpt", "import", hf_dir, "--out", ckpt, "--config", config_file)
        torch.manual_seed(1)
        engine = zinf.zero.initialize(make(), CONFIG)
        engine.load_checkpoint(ckpt)
        got = engine.consolidated_state_dict()
        for name, value in saved.state_dict().items():
            self.assertIn(name, got)
            self.assertTrue(torch.equal(got[name], value), name)
        engine.eval()
        ids = batch(7)
        with torch.no_grad():
            torch.testing.assert_close(engine(input_ids=ids).logits,
                                       saved.eval()(input_ids=ids).logits, rtol=0, atol=0)
        return hf_dir

    def test_save_pretrained_directory_imports(self):
        torch.manual_seed(2)
        self.import_and_load(gpt2, gpt2())

    def test_sharded_save_pretrained_directory_imports(self):
        torch.manual_seed(3)
        hf_dir = self.import_and_load(llama, llama(), max_shard_size="40KB")
        self.assertTrue(os.path.exists(os.path.join(hf_dir, "model.safetensors.index.json")),
                        os.listdir(hf_dir))

    def test_pytorch_pickles_are_refused_naming_safetensors(self):
        hf_dir = os.path.join(self.dir, "pickles")
        gpt2().save_pretrained(hf_dir)
        os.rename(os.path.join(hf_dir, "model.safetensors"),
                  os.path.join(hf_dir, "pytorch_model.bin"))
        done = subprocess.run([self.zinf_cli, "ckpt", "import", hf_dir, "--out",
                               os.path.join(self.dir, "x")], capture_output=True, text=True)
        self.assertEqual(done.returncode, 1, done.stdout + done.stderr)
        self.assertIn("reads safetensors", done.stdout + done.stderr)


if __name__ == "__main__":
    unittest.main()
