"""Lightning on zinf (zinf.lightning): a LightningModule over Hugging Face's GPT-2
(lightning_clm.py) trained by lightning.pytorch.Trainer with the strategy registered by name,
against Lightning's own DDP strategy on the same script: the same losses with gradient
accumulation and clipping on 1 process and on 2, a checkpoint that load_from_checkpoint loads
with the trained module's outputs, a resume through fit(ckpt_path=...) that continues as
Lightning's own does, the same under the older pytorch_lightning package (zinf.pytorch_lightning),
and the Trainer settings zinf cannot honour refused by name. Skips without lightning and
transformers."""

import os
import shutil
import sys
import tempfile
import unittest

import torch

import launch

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "lightning_clm.py")

try:
    import lightning.pytorch  # noqa: F401
    import transformers
    WHY = None
except Exception as e:  # ImportError, or an install that fails to import
    WHY = f"lightning or transformers does not import under {sys.executable}: {e}"
try:
    import pytorch_lightning  # noqa: F401
    PYTORCH_LIGHTNING = None
except Exception as e:
    PYTORCH_LIGHTNING = f"pytorch_lightning does not import under {sys.executable}: {e}"


@unittest.skipIf(WHY is not None, WHY)
class LightningTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="zinf-lightning-")
        sys.path.insert(0, HERE)
        import hf_trainer_clm
        config = transformers.AutoConfig.for_model(**hf_trainer_clm.CONFIGS["gpt2"],
                                                   vocab_size=96)
        torch.manual_seed(42)
        transformers.AutoModelForCausalLM.from_config(config).save_pretrained(
            os.path.join(cls.dir, "init"))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def run_script(self, name, strategy, world, args=(), expect_ok=True):
        cmd = [sys.executable, SCRIPT, "--init", os.path.join(self.dir, "init"), "--out",
               os.path.join(self.dir, name), "--strategy", strategy, "--devices", str(world)]
        cmd += list(args)
        output = launch.run(self, cmd, world, expect_ok=expect_ok, launcher_env=False)
        return launch.result(self, output) if expect_ok else output

    def check(self, got, want, what):
        self.assertEqual(got["global_step"], want["global_step"], what)
        self.assertEqual(len(got["losses"]), len(want["losses"]), what)
        for g, w in zip(got["losses"], want["losses"]):
            self.assertAlmostEqual(g, w, delta=1e-5 * abs(w),
                                   msg=f"{what}: {got['losses']} vs {want['losses']}")
        for g, w in zip(got["loaded_logits"], want["loaded_logits"]):
            self.assertAlmostEqual(g, w, delta=1e-4 * max(1.0, abs(w)), msg=what)
        # The checkpoint holds the trained module.
        self.assertEqual(got["loaded_logits"], got["trained_logits"], what)

    def test_the_registered_strategy_gives_lightnings_ddp_losses(self):
        for world, gas, name in ((1, 2, "zinf_stage_3_offload"), (2, 1, "zinf")):
            with self.subTest(world=world, strategy=name):
                args = ["--gas", str(gas)]
                want = self.run_script(f"ddp-{world}", "ddp", world, args)
                got = self.run_script(f"{name}-{world}", name, world, args)
                self.check(got, want, f"{name} on {world} process(es)")

    def test_a_resume_from_its_checkpoint_continues_as_lightnings_own(self):
        results = {}
        for strategy in ("ddp", "zinf_stage_3_offload"):
            self.run_script(f"stop-{strategy}", strategy, 1, ["--stop_at", "5"])
            results[strategy] = self.run_script(
                f"resume-{strategy}", strategy, 1,
                ["--resume", os.path.join(self.dir, f"stop-{strategy}", "last")])
        self.check(results["zinf_stage_3_offload"], results["ddp"], "resumed")

    @unittest.skipIf(PYTORCH_LIGHTNING is not None, PYTORCH_LIGHTNING)
    def test_the_older_pytorch_lightning_package_gets_the_same_strategy(self):
        # Its Trainer takes only its own package's Strategy classes: zinf.pytorch_lightning
        # registers the names there.
        args = ["--gas", "2", "--package", "pytorch_lightning"]
        want = self.run_script("pl-ddp", "ddp", 1, args)
        got = self.run_script("pl-zinf", "zinf_stage_3_offload", 1, args)
        self.check(got, want, "zinf_stage_3_offload under pytorch_lightning")

    def test_settings_zinf_cannot_honour_are_refused_by_name(self):
        out = self.run_script("bf16", "zinf", 1, ["--precision", "bf16-mixed"], expect_ok=False)
        self.assertIn("leave the Trainer's precision at 32", out)
        out = self.run_script("by-value", "zinf", 1, ["--clip_algorithm", "value"],
                              expect_ok=False)
        self.assertIn("gradient_clip_algorithm='value'", out)


if __name__ == "__main__":
    unittest.main()
