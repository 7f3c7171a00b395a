"""transformers' Trainer and Accelerate's Accelerator on zinf (zinf.hf). Trainer: a causal-LM script in the style of transformers'
run_clm.py (hf_trainer_clm.py), changed only in its imports, against the same script on
transformers' own Trainer (plain PyTorch; DistributedDataParallel on 2 processes) and on
DeepSpeed itself, with the ZeRO-3 offload config of Hugging Face's documentation as shipped:
the same losses step for step, a resume from Trainer's checkpoint that continues bit for bit,
and a saved model that from_pretrained loads with the trained model's logits; PEFT's LoRA on a
frozen base too; and from_pretrained under zinf.zero.Init on 1 and 2 processes. Accelerate: a
loop in the style of its examples (accelerate_clm.py) against plain Accelerate and against
DeepSpeed through Accelerate, with save_state/load_state in a new process. TRL: its DPOTrainer
with a reference model (trl_dpo.py) against TRL alone. GPT-2 and Llama
from their configs; nothing is downloaded. Skips without transformers and accelerate (Debian's
torch 1.13 has neither); the DeepSpeed case where deepspeed does not import (it runs in the
virtualenv of bench/vs_deepspeed.sh)."""

import json
import os
import shutil
import sys
import tempfile
import unittest

import torch

import launch

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "hf_trainer_clm.py")
SOURCE_DIR = os.environ.get("ZINF_SOURCE_DIR", os.path.join(HERE, "..", ".."))
HF_ZERO3 = os.path.join(SOURCE_DIR, "tests", "data", "deepspeed_configs", "hf_zero3_auto.json")

try:
    import accelerate  # noqa: F401  (Trainer needs it)
    import transformers  # noqa: F401
    WHY = None
except Exception as e:  # ImportError, or an install that fails to import
    WHY = f"transformers' Trainer does not import under {sys.executable}: {e}"

# The config a Trainer user writes when Trainer's own optimizer and schedule are to be used
# (transformers hands them to DeepSpeed, and zinf.hf to zinf): no "optimizer", no "scheduler".
OWN_OPTIMIZER = {
    "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"},
                          "offload_optimizer": {"device": "cpu"}},
    "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
    "train_batch_size": "auto", "gradient_clipping": "auto",
}
# The same without offload: what DeepSpeed runs with a client optimizer on the CPU (its
# offload wants its own CPU Adam), for the comparisons of LoRA and DPO on both.
NO_OFFLOAD = {
    "zero_optimization": {"stage": 3},
    "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
    "train_batch_size": "auto", "gradient_clipping": "auto",
}
ARGS = ["--learning_rate", "1e-2", "--warmup_steps", "3", "--logging_steps", "1",
        "--report_to", "none", "--use_cpu", "--max_grad_norm", "0.5"]


def deepspeed_missing():
    try:
        import deepspeed  # noqa: F401
    except Exception as e:
        return f"deepspeed does not import under {sys.executable}: {e}"
    return None


class DeepSpeedOnTheCpu:
    """DS_ACCELERATOR=cpu for the block, as DeepSpeed on a machine without a GPU needs."""

    def __enter__(self):
        self.old = os.environ.get("DS_ACCELERATOR")
        os.environ["DS_ACCELERATOR"] = "cpu"

    def __exit__(self, *exc):
        if self.old is None:
            os.environ.pop("DS_ACCELERATOR", None)
        else:
            os.environ["DS_ACCELERATOR"] = self.old


@unittest.skipIf(WHY is not None, WHY)
class HfTrainerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="zinf-hf-trainer-")
        # Every run starts from the same saved weights (as a fine-tune does), so that no side's
        # way of building the model (DeepSpeed's zero.Init) changes the starting point.
        sys.path.insert(0, HERE)
        import hf_trainer_clm
        for model_type, config in hf_trainer_clm.CONFIGS.items():
            c = transformers.AutoConfig.for_model(**config, vocab_size=96)
            torch.manual_seed(42)
            model = transformers.AutoModelForCausalLM.from_config(c)
            model.save_pretrained(os.path.join(cls.dir, f"init-{model_type}"))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def run_script(self, name, trainer, world, model_type, config, args):
        """Runs the script with `trainer` ("zinf" or "transformers") on `world` processes;
        returns losses.json."""
        out = os.path.join(self.dir, name)
        cmd = [sys.executable, SCRIPT, "--model_type", model_type, "--model_name_or_path",
               os.path.join(self.dir, f"init-{model_type}"), "--output_dir", out] + ARGS + args
        if config is not None:
            path = config if isinstance(config, str) else os.path.join(self.dir, name + ".json")
            if not isinstance(config, str):
                with open(path, "w") as f:
                    json.dump(config, f)
            cmd += ["--deepspeed", path]
        launch.run(self, cmd, world, {"ZINF_TRAINER": trainer})
        with open(os.path.join(out, "losses.json")) as f:
            return json.load(f)

    def assert_same_training(self, got, want, rel, what):
        self.assertEqual(got["global_step"], want["global_step"], what)
        self.assertEqual([s["step"] for s in got["steps"]], [s["step"] for s in want["steps"]])
        for g, w in zip(got["steps"], want["steps"]):
            self.assertAlmostEqual(g["loss"], w["loss"], delta=rel * abs(w["loss"]),
                                   msg=f"{what}: step {w['step']}: {got['steps']} vs "
                                       f"{want['steps']}")
            self.assertAlmostEqual(g["grad_norm"], w["grad_norm"], delta=1e-4 * w["grad_norm"],
                                   msg=f"{what}: step {w['step']}'s gradient norm")
        for g, w in zip(got["logits"], want["logits"]):
            self.assertAlmostEqual(g, w, delta=1e-4 * max(1.0, abs(w)), msg=what)

    def test_trainers_own_optimizer_and_schedule_give_plain_trainers_losses(self):
        # Trainer's AdamW (a decay group, and a no-decay group of biases and norms) and linear
        # schedule, handed to zinf as transformers hands them to DeepSpeed: plain Trainer's
        # losses, learning rates and gradient norms, on 1 process with accumulation and on 2
        # (plain Trainer: DistributedDataParallel).
        for model_type, world, gas in (("gpt2", 1, 2), ("llama", 1, 2), ("gpt2", 2, 1)):
            with self.subTest(model=model_type, world=world):
                args = ["--max_steps", "20", "--per_device_train_batch_size", "2",
                        "--gradient_accumulation_steps", str(gas), "--weight_decay", "0.1"]
                want = self.run_script(f"torch-{model_type}-{world}", "transformers", world,
                                       model_type, None, args)
                got = self.run_script(f"zinf-own-{model_type}-{world}", "zinf", world,
                                      model_type, OWN_OPTIMIZER, args)
                self.assert_same_training(got, want, 1e-5,
                                          f"{model_type} on {world} process(es)")
                self.assertEqual([s["learning_rate"] for s in got["steps"]],
                                 [s["learning_rate"] for s in want["steps"]])

    def test_peft_lora_on_a_frozen_base_gives_plain_trainers_losses(self):
        # PEFT's LoRA (its own package) on a frozen GPT-2: the adapters train to plain
        # Trainer's losses, and save_model writes the adapter, which from_pretrained loads
        # onto the base with the trained model's logits. The base is sharded (Note [Frozen
        # parameters]): the host bytes per rank fall with the ranks.
        try:
            import peft  # noqa: F401
        except Exception as e:
            self.skipTest(f"peft does not import: {e}")
        host_bytes = {}
        for world, gas in ((1, 2), (2, 1)):
            with self.subTest(world=world):
                args = ["--max_steps", "20", "--per_device_train_batch_size", "2",
                        "--gradient_accumulation_steps", str(gas), "--weight_decay", "0.0",
                        "--lora_r", "4"]
                want = self.run_script(f"torch-lora-{world}", "transformers", world, "gpt2",
                                       None, args)
                got = self.run_script(f"zinf-lora-{world}", "zinf", world, "gpt2",
                                      OWN_OPTIMIZER, args)
                self.assert_same_training(got, want, 1e-5, f"LoRA on {world} process(es)")
                self.assertTrue(os.path.exists(os.path.join(
                    self.dir, f"zinf-lora-{world}", "adapter_model.safetensors")))
                for g, w in zip(got["logits"], got["trained_logits"]):
                    self.assertAlmostEqual(g, w, delta=1e-5 * max(1.0, abs(w)))
                host_bytes[world] = got["host_bytes"]
        # Half the base leaves each rank's host tier (its fp32 values, offload_param cpu);
        # unsharded, two ranks would hold more than one, their buckets besides.
        base = transformers.AutoModelForCausalLM.from_pretrained(
            os.path.join(self.dir, "init-gpt2"))
        base_bytes = 4 * sum(p.numel() for p in base.parameters())
        self.assertGreater(host_bytes[1] - host_bytes[2], 0.4 * base_bytes,
                           f"host bytes per rank {host_bytes}, the base {base_bytes}")

    def test_hugging_face_zero3_offload_config_trains_resumes_and_saves(self):
        # The config as Hugging Face's docs ship it ("auto" everywhere, AdamW and
        # WarmupDecayLR, parameters and optimizer on the CPU), with gradient checkpointing.
        args = ["--max_steps", "20", "--per_device_train_batch_size", "2",
                "--gradient_accumulation_steps", "2", "--weight_decay", "0.01",
                "--save_steps", "10", "--gradient_checkpointing"]
        for model_type in ("gpt2", "llama"):
            with self.subTest(model=model_type):
                whole = self.run_script(f"hf-{model_type}", "zinf", 1, model_type, HF_ZERO3,
                                        args)
                losses = [s["loss"] for s in whole["steps"]]
                self.assertLess(sum(losses[-5:]), sum(losses[:5]), f"it learns: {losses}")
                # The saved model, loaded by from_pretrained, is the trained one.
                for g, w in zip(whole["logits"], whole["trained_logits"]):
                    self.assertAlmostEqual(g, w, delta=1e-5 * max(1.0, abs(w)))
                # A new process resumes from Trainer's checkpoint-10 and continues bit for bit.
                resumed_dir = os.path.join(self.dir, f"hf-{model_type}-resumed")
                shutil.copytree(os.path.join(self.dir, f"hf-{model_type}", "checkpoint-10"),
                                os.path.join(resumed_dir, "checkpoint-10"))
                resumed = self.run_script(
                    f"hf-{model_type}-resumed", "zinf", 1, model_type, HF_ZERO3,
                    args + ["--resume_from_checkpoint",
                            os.path.join(resumed_dir, "checkpoint-10")])
                self.assertEqual(resumed["global_step"], 20)
                self.assertEqual(resumed["steps"], whole["steps"][10:])
                self.assertEqual(resumed["logits"], whole["logits"])

    def test_from_pretrained_under_zero_init_on_one_and_two_processes(self):
        # transformers builds the model under zinf.zero.Init and loads the saved weights into
        # it on every rank; the engine's model then computes the saved model's logits.
        script = """
import sys, torch, transformers, zinf.zero
cfg = {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"},
                             "offload_optimizer": {"device": "cpu"}},
       "train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW"}}
with zinf.zero.Init(config_dict_or_path=cfg):
    model = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1])
engine = zinf.zero.initialize(model, cfg)
x = torch.arange(32).reshape(2, 16) % 96
with torch.no_grad():
    got = model(x).logits
    want = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1])(x).logits
print("DIFFERENCE", engine.rank, float((got - want).abs().max()))
"""
        for model_type in ("gpt2", "llama"):
            for world in (1, 2):
                with self.subTest(model=model_type, world=world):
                    output = launch.run(self, [sys.executable, "-c", script, os.path.join(
                        self.dir, f"init-{model_type}")], world, timeout=300,
                        launcher_env=False)
                    found = [line.split()[-1] for line in output.splitlines()
                             if "DIFFERENCE" in line]
                    self.assertEqual(found, ["0.0"] * world, output[-4000:])

    def test_deepspeed_runs_the_same_script_to_the_same_losses(self):
        why = deepspeed_missing()
        if why:
            self.skipTest(why)
        args = ["--max_steps", "20", "--per_device_train_batch_size", "2",
                "--gradient_accumulation_steps", "2", "--weight_decay", "0.01",
                "--gradient_checkpointing"]
        with DeepSpeedOnTheCpu():
            theirs = self.run_script("deepspeed", "transformers", 1, "gpt2", HF_ZERO3, args)
        ours = self.run_script("zinf-vs-deepspeed", "zinf", 1, "gpt2", HF_ZERO3, args)
        self.assert_same_training(ours, theirs, 1e-5, "against DeepSpeed")

    def test_deepspeed_runs_peft_lora_to_the_same_losses(self):
        # LoRA on a frozen base, the base sharded by each (Note [Frozen parameters]).
        why = deepspeed_missing()
        if why:
            self.skipTest(why)
        try:
            import peft  # noqa: F401
        except Exception as e:
            self.skipTest(f"peft does not import: {e}")
        args = ["--max_steps", "12", "--per_device_train_batch_size", "2",
                "--gradient_accumulation_steps", "2", "--weight_decay", "0.0", "--lora_r", "4"]
        with DeepSpeedOnTheCpu():
            theirs = self.run_script("deepspeed-lora", "transformers", 1, "gpt2", NO_OFFLOAD,
                                     args)
        ours = self.run_script("zinf-lora-vs-deepspeed", "zinf", 1, "gpt2", NO_OFFLOAD, args)
        self.assert_same_training(ours, theirs, 1e-5, "LoRA against DeepSpeed")


ACCELERATE_SCRIPT = os.path.join(HERE, "accelerate_clm.py")


@unittest.skipIf(WHY is not None, WHY)
class HfAccelerateTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        HfTrainerTest.setUpClass.__func__(cls)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def run_script(self, name, accelerator, world, config, args=(), resume=False, env=None):
        out = os.path.join(self.dir, name)
        cmd = [sys.executable, ACCELERATE_SCRIPT, "--init", os.path.join(self.dir, "init-gpt2"),
               "--out", out] + list(args) + (["--resume"] if resume else [])
        if config is not None:
            path = os.path.join(self.dir, name + ".json")
            with open(path, "w") as f:
                json.dump(config, f)
            cmd += ["--deepspeed", path]
        return launch.result(self, launch.run(self, cmd, world,
                                              {"ZINF_ACCELERATOR": accelerator, **(env or {})}))

    def check(self, got, want, what):
        for g, w in zip(got["losses"], want["losses"]):
            self.assertAlmostEqual(g, w, delta=1e-5 * abs(w),
                                   msg=f"{what}: {got['losses']} vs {want['losses']}")
        for g, w in zip(got["logits"], want["logits"]):
            self.assertAlmostEqual(g, w, delta=1e-4 * max(1.0, abs(w)), msg=what)
        # The saved model is the trained one.
        self.assertEqual(got["logits"], got["trained_logits"], what)

    def test_accelerate_on_zinf_gives_plain_accelerates_losses_and_resumes(self):
        for world, gas in ((1, 2), (2, 1)):
            with self.subTest(world=world):
                args = ["--gas", str(gas), "--steps", "10", "--resume_at", "5"]
                if world > 1:
                    # Accelerate alone steps the schedule once per process at each step, its
                    # DeepSpeed mode (and zinf) once: compare at a constant rate.
                    args.append("--constant_lr")
                want = self.run_script(f"acc-torch-{world}", "accelerate", world, None, args)
                got = self.run_script(f"acc-zinf-{world}", "zinf", world, OWN_OPTIMIZER, args)
                self.check(got, want, f"{world} process(es)")
                resumed = self.run_script(f"acc-zinf-{world}", "zinf", world, OWN_OPTIMIZER,
                                          args, resume=True)
                self.assertEqual(resumed["resumed"], got["losses"][5 * gas:])

    def test_deepspeed_through_accelerate_gives_the_same_losses(self):
        why = deepspeed_missing()
        if why:
            self.skipTest(why)
        # Hugging Face's config, with the betas and eps Accelerate's DeepSpeed mode wants
        # given (it fills only lr and weight_decay from DummyOptim, and refuses "auto" there).
        with open(HF_ZERO3) as f:
            config = json.load(f)
        config["optimizer"]["params"].update(betas=[0.9, 0.999], eps=1e-8)
        args = ["--gas", "2", "--steps", "10"]
        theirs = self.run_script("acc-deepspeed", "accelerate", 1, config, args,
                                 env={"DS_ACCELERATOR": "cpu"})
        ours = self.run_script("acc-zinf-hf", "zinf", 1, config, args)
        self.check(ours, theirs, "against DeepSpeed")


TRL_SCRIPT = os.path.join(HERE, "trl_dpo.py")


@unittest.skipIf(WHY is not None, WHY)
class TrlTest(unittest.TestCase):
    """TRL's DPOTrainer (its own package) with a policy and a reference model, on zinf through
    zinf.hf.on_zinf, against TRL alone on the same script."""

    def setUp(self):
        try:
            import trl  # noqa: F401
        except Exception as e:
            self.skipTest(f"trl does not import: {e}")
        self.dir = tempfile.mkdtemp(prefix="zinf-trl-")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def run_script(self, name, on_zinf, world, args=(), expect_ok=True, deepspeed=None):
        """TRL's script on zinf (`on_zinf`, with OWN_OPTIMIZER unless `deepspeed` says
        another config), or as it is: on DeepSpeed where `deepspeed` gives it a config."""
        cmd = [sys.executable, TRL_SCRIPT, "--out", os.path.join(self.dir, name)] + list(args)
        config = deepspeed or (OWN_OPTIMIZER if on_zinf else None)
        if config is not None:
            path = os.path.join(self.dir, name + ".json")
            with open(path, "w") as f:
                json.dump(config, f)
            cmd += ["--deepspeed", path]
        # DeepSpeed's own initialize looks for a launcher's environment (else MPI's).
        output = launch.run(self, cmd, world, {"ZINF_TRL": "1" if on_zinf else "0"},
                            expect_ok=expect_ok,
                            launcher_env=deepspeed is not None and not on_zinf)
        return launch.result(self, output) if expect_ok else output

    def test_dpo_with_a_reference_model_gives_trls_losses(self):
        for world in (1, 2):
            with self.subTest(world=world):
                want = self.run_script(f"trl-{world}", False, world)
                got = self.run_script(f"zinf-{world}", True, world)
                # The reference model is sharded and offloaded by an engine of its own.
                self.assertEqual(got["reference_engine"], "DeepSpeedEngine")
                self.assertEqual(len(got["steps"]), len(want["steps"]))
                for g, w in zip(got["steps"], want["steps"]):
                    self.assertAlmostEqual(g["loss"], w["loss"], delta=1e-5 * w["loss"],
                                           msg=f"{got['steps']} vs {want['steps']}")
                    self.assertAlmostEqual(g["margin"], w["margin"], delta=1e-5)

    def test_dpo_on_deepspeed_gives_the_same_losses(self):
        # The same script on TRL over DeepSpeed (ZeRO-3, its reference model an engine too).
        why = deepspeed_missing()
        if why:
            self.skipTest(why)
        with DeepSpeedOnTheCpu():
            theirs = self.run_script("deepspeed", False, 1, deepspeed=NO_OFFLOAD)
        got = self.run_script("zinf-vs-deepspeed", True, 1, deepspeed=NO_OFFLOAD)
        self.assertEqual(len(got["steps"]), len(theirs["steps"]))
        for g, w in zip(got["steps"], theirs["steps"]):
            self.assertAlmostEqual(g["loss"], w["loss"], delta=1e-5 * w["loss"],
                                   msg=f"{got['steps']} vs {theirs['steps']}")
            self.assertAlmostEqual(g["margin"], w["margin"], delta=1e-5)

    def test_mixed_precision_the_config_does_not_set_is_refused(self):
        # TRL's configs default to bf16, which outside DeepSpeed's mode is Accelerate's
        # autocast; zinf, as DeepSpeed, computes in the config's precision.
        out = self.run_script("bf16", True, 1, ["--bf16"], expect_ok=False)
        self.assertIn('add "bf16": {"enabled": "auto"} to the config', out)


if __name__ == "__main__":
    unittest.main()
