"""Every consumer of a DeepSpeed config resolves it the same way: the Python package
(zinf.zero), the C ABI (zinf_engine_create through ctypes), train_gpt, train_mlp and `zinf plan`
are each
fed every way of giving the batch (train_batch_size alone, with the micro-batch, with the
accumulation, all three, inconsistent) and must train at, or report, the same batch shape, or
refuse the same config naming train_batch_size. Also the trainer's values for "auto" keys
(Python keyword arguments and dicts, the C struct, train_gpt's --steps and --lr) and
train_gpt's --nvme-path overriding the config's paths."""

import ctypes
import json
import os
import shutil
import subprocess
import tempfile
import unittest

import torch

import zinf
import zinf.zero

BUILD_DIR = os.environ.get("ZINF_BUILD_DIR", "")

# (what the config gives, the batch shape expected on one rank: micro, accumulation, batch);
# None: refused naming train_batch_size. DeepSpeed's rules: the batch alone means accumulation
# 1; the batch and one factor derive the other.
CASES = [
    ("train_batch_size alone", {"train_batch_size": 8}, (8, 1, 8)),
    ("with the micro-batch", {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2},
     (2, 4, 8)),
    ("with the accumulation", {"train_batch_size": 8, "gradient_accumulation_steps": 2},
     (4, 2, 8)),
    ("all three", {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2,
                   "gradient_accumulation_steps": 4}, (2, 4, 8)),
    ("inconsistent", {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 3,
                      "gradient_accumulation_steps": 2}, None),
    ("micro-batch alone", {"train_micro_batch_size_per_gpu": 3}, (3, 1, 3)),
]

ENGINE = {"zero_optimization": {"stage": 3},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
GPT_MODEL = {"vocab_size": 256, "seq_len": 8, "d_model": 16, "n_layer": 1, "n_head": 2}

# The C ABI's structs (include/zinf/c_api.h), as ctypes lays them out: natural alignment, as C.


class EngineInfo(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("rank", ctypes.c_int32),
                ("world_size", ctypes.c_int32), ("local_rank", ctypes.c_int32),
                ("zero_stage", ctypes.c_int32), ("micro_batch_size", ctypes.c_int32),
                ("gradient_accumulation_steps", ctypes.c_int32), ("loss_scale", ctypes.c_double),
                ("learning_rate", ctypes.c_double), ("train_batch_size", ctypes.c_int64)]


class TrainerValues(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("micro_batch_size", ctypes.c_int32),
                ("gradient_accumulation_steps", ctypes.c_int32),
                ("total_num_steps", ctypes.c_int64), ("warmup_num_steps", ctypes.c_int64),
                ("hidden_size", ctypes.c_int64), ("gradient_clipping", ctypes.c_double),
                ("lr", ctypes.c_double), ("beta1", ctypes.c_double), ("beta2", ctypes.c_double),
                ("eps", ctypes.c_double), ("weight_decay", ctypes.c_double),
                ("fp16", ctypes.c_int32), ("bf16", ctypes.c_int32)]


class EngineOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("rank", ctypes.c_int32),
                ("world_size", ctypes.c_int32), ("master_addr", ctypes.c_char_p),
                ("master_port", ctypes.c_int32), ("optimizer_threads", ctypes.c_int32),
                ("timeout_ms", ctypes.c_int64),
                ("data_parallel_ranks", ctypes.POINTER(ctypes.c_int32)),
                ("data_parallel_rank_count", ctypes.c_size_t),
                ("trainer", ctypes.POINTER(TrainerValues))]


def load_capi():
    lib = ctypes.CDLL(os.path.join(BUILD_DIR, "lib", "libzinf.so"))
    lib.zinf_engine_create.argtypes = [ctypes.c_char_p, ctypes.POINTER(EngineOptions),
                                       ctypes.POINTER(ctypes.c_void_p),
                                       ctypes.POINTER(ctypes.c_char_p)]
    lib.zinf_engine_info.argtypes = [ctypes.c_void_p, ctypes.POINTER(EngineInfo),
                                     ctypes.POINTER(ctypes.c_char_p)]
    lib.zinf_engine_destroy.argtypes = [ctypes.c_void_p]
    lib.zinf_engine_options_init.argtypes = [ctypes.POINTER(EngineOptions)]
    lib.zinf_trainer_values_init.argtypes = [ctypes.POINTER(TrainerValues)]
    return lib


def capi_engine(lib, config, trainer=None):
    """(micro, accumulation, batch, learning rate) of a C ABI engine, or the error text."""
    options = EngineOptions()
    lib.zinf_engine_options_init(ctypes.byref(options))
    values = TrainerValues()
    if trainer is not None:
        lib.zinf_trainer_values_init(ctypes.byref(values))
        for k, v in trainer.items():
            setattr(values, k, v)
        options.trainer = ctypes.pointer(values)
    engine, err = ctypes.c_void_p(), ctypes.c_char_p()
    code = lib.zinf_engine_create(json.dumps(config).encode(), ctypes.byref(options),
                                  ctypes.byref(engine), ctypes.byref(err))
    if code != 0:
        return err.value.decode()  # freed with the process: a test
    try:
        info = EngineInfo()
        info.struct_size = ctypes.sizeof(EngineInfo)
        assert lib.zinf_engine_info(engine, ctypes.byref(info), ctypes.byref(err)) == 0
        return (info.micro_batch_size, info.gradient_accumulation_steps, info.train_batch_size,
                info.learning_rate)
    finally:
        lib.zinf_engine_destroy(engine)


def python_engine(config, **trainer):
    """(micro, accumulation, batch, learning rate) of a zinf.zero engine, or the error text."""
    try:
        e = zinf.zero.initialize(torch.nn.Linear(4, 4), config, **trainer)
    except zinf.ZinfError as err:
        return str(err)
    return e.micro_batch_size, e.gradient_accumulation_steps, e.train_batch_size, e.learning_rate


class ConsumersTest(unittest.TestCase):
    def setUp(self):
        for var in ("RANK", "WORLD_SIZE", "MASTER_PORT"):
            self.assertNotIn(var, os.environ, "run these tests outside a launcher")
        self.dir = tempfile.mkdtemp(prefix="zinf-consumers-", dir=BUILD_DIR or None)
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        self.lib = load_capi()

    def write(self, name, config):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            json.dump(config, f)
        return path

    def train_gpt(self, config, *args):
        path = self.write("gpt.json", {"model": GPT_MODEL, **config})
        return subprocess.run([os.path.join(BUILD_DIR, "bin", "train_gpt"), "--config", path,
                               "--threads", "1", *args], capture_output=True, text=True,
                              timeout=300)

    def test_every_consumer_resolves_the_batch_the_same_way(self):
        for what, batch, want in CASES:
            with self.subTest(what):
                config = {**ENGINE, **batch}
                py = python_engine(config)
                c = capi_engine(self.lib, config)
                gpt = self.train_gpt(batch, "--steps", "1")
                mlp = subprocess.run(
                    [os.path.join(BUILD_DIR, "bin", "train_mlp"), "--config",
                     self.write("mlp.json", config), "--layers", "1", "--width", "8",
                     "--steps", "1"], capture_output=True, text=True, timeout=120)
                plan = subprocess.run(
                    [os.path.join(BUILD_DIR, "bin", "zinf"), "plan", "--model",
                     self.write("plan.json", {"model": GPT_MODEL, **config})],
                    capture_output=True, text=True, timeout=120)
                if want is None:
                    for name, got in (("python", py), ("C ABI", c)):
                        self.assertIsInstance(got, str, f"{name} accepted {batch}: {got}")
                        self.assertIn("train_batch_size 8", got, name)
                    for name, done in (("train_gpt", gpt), ("train_mlp", mlp),
                                       ("zinf plan", plan)):
                        self.assertEqual(done.returncode, 1, f"{name}: {done.stdout}")
                        self.assertIn("train_batch_size 8", done.stderr, name)
                    continue
                micro, gas, tbs = want
                self.assertEqual(py[:3], want, "python")
                self.assertEqual(c[:3], want, "C ABI")
                self.assertEqual(gpt.returncode, 0, gpt.stderr)
                self.assertIn(f"micro-batch {micro} x gradient accumulation {gas} =",
                              gpt.stdout, "train_gpt trains at another shape")
                shape = (f"train_batch_size {tbs} = micro-batch {micro} x gradient "
                         f"accumulation {gas} x 1 data-parallel rank(s)")
                self.assertIn("batch: " + shape, gpt.stderr, "the engine's log line")
                self.assertEqual(mlp.returncode, 0, mlp.stderr)
                summary = json.loads(mlp.stdout.strip().splitlines()[-1])
                self.assertEqual((summary["micro_batch"], summary["gradient_accumulation_steps"]),
                                 (micro, gas), "train_mlp trains at another shape")
                self.assertEqual(plan.returncode, 0, plan.stderr)
                self.assertIn(shape, plan.stdout, "zinf plan")

    def test_plan_resolves_for_its_world_size(self):
        path = self.write("plan.json", {"model": GPT_MODEL, **ENGINE, "train_batch_size": 8,
                                        "train_micro_batch_size_per_gpu": 2})
        done = subprocess.run([os.path.join(BUILD_DIR, "bin", "zinf"), "plan", "--model", path,
                               "--world-size", "2"], capture_output=True, text=True,
                              timeout=120)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("train_batch_size 8 = micro-batch 2 x gradient accumulation 2 x 2",
                      done.stdout)

    AUTO = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3},
            "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
            "scheduler": {"type": "WarmupDecayLR",
                          "params": {"warmup_min_lr": 0, "warmup_max_lr": "auto",
                                     "warmup_num_steps": "auto", "total_num_steps": "auto",
                                     "warmup_type": "linear"}}}

    def test_python_trainer_values(self):
        # WarmupDecayLR needs total_num_steps: without the trainer's it is refused by name.
        err = python_engine(self.AUTO)
        self.assertIsInstance(err, str)
        self.assertIn("scheduler.params.total_num_steps", err)
        def lr_curve(config, **trainer):
            e = zinf.zero.initialize(torch.nn.Linear(4, 4), config, **trainer)
            lrs = []
            for _ in range(6):
                lrs.append(e.learning_rate)
                e.backward(e(torch.ones(2, 4)).sum())
                e.step()
            return lrs

        # The same config with the numbers written out: "auto" filled by the trainer must give
        # exactly its schedule.
        explicit = json.loads(json.dumps(self.AUTO))
        explicit["optimizer"]["params"]["lr"] = 0.5
        explicit["scheduler"]["params"].update(warmup_max_lr=0.5, warmup_num_steps=4,
                                               total_num_steps=10)
        want = lr_curve(explicit)
        self.assertGreater(max(want), 0.1)
        # Keyword arguments in zinf's names, Hugging Face's, or the config key's; or a dict.
        for trainer in ({"lr": 0.5, "total_num_steps": 10, "warmup_num_steps": 4},
                        {"learning_rate": 0.5, "max_steps": 10, "warmup_steps": 4},
                        {"trainer": {"optimizer.params.lr": 0.5,
                                     "scheduler.params.total_num_steps": 10,
                                     "scheduler.params.warmup_num_steps": 4}}):
            with self.subTest(trainer=trainer):
                self.assertEqual(lr_curve(self.AUTO, **trainer), want)
        with self.assertRaisesRegex(ValueError, "trainer value 'learning_rat' is not one"):
            zinf.zero.initialize(torch.nn.Linear(4, 4), self.AUTO, learning_rat=0.5)
        with self.assertRaisesRegex(ValueError, "given twice"):
            zinf.zero.initialize(torch.nn.Linear(4, 4), self.AUTO, lr=0.5, learning_rate=0.1)
        # A number in the config and a different one from the trainer: refused, naming both.
        err = python_engine({**ENGINE}, learning_rate=0.5)
        self.assertIn("'optimizer.params.lr' is 0.001 but the trainer's value is 0.5", err)

    def test_c_trainer_values(self):
        err = capi_engine(self.lib, self.AUTO)
        self.assertIsInstance(err, str)
        self.assertIn("scheduler.params.total_num_steps", err)
        no_scheduler = {k: v for k, v in self.AUTO.items() if k != "scheduler"}
        self.assertEqual(capi_engine(self.lib, no_scheduler, trainer={"lr": 0.25})[3], 0.25)
        self.assertEqual(capi_engine(self.lib, no_scheduler)[3], 1e-3)  # the default, warned
        got = capi_engine(self.lib, self.AUTO, trainer={"lr": 0.5, "total_num_steps": 10,
                                                         "warmup_num_steps": 4})
        self.assertEqual(got[:3], (2, 1, 2))
        bad = capi_engine(self.lib, self.AUTO, trainer={"fp16": 2})
        self.assertIn("options->trainer->fp16 must be -1 (not given), 0 or 1, got 2", bad)

    def test_train_gpt_passes_its_steps_and_learning_rate(self):
        auto = {k: v for k, v in self.AUTO.items() if k != "zero_optimization"}
        done = self.train_gpt(auto, "--steps", "2", "--lr", "0.01")
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("scheduler.params.total_num_steps' is \"auto\": 2 (from the trainer)",
                      done.stderr)
        self.assertIn("optimizer.params.lr' is \"auto\": 0.01 (from the trainer)", done.stderr)
        # Without --lr, "auto" keeps the default, with a warning that says so.
        done = self.train_gpt(auto, "--steps", "2")
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertRegex(done.stderr, r"warn.*'optimizer.params.lr' is \"auto\" and the trainer "
                                      r"gave no value")
        # --lr against a number in the config: refused naming the key.
        done = self.train_gpt({"optimizer": {"type": "AdamW", "params": {"lr": 0.5}}},
                              "--steps", "1", "--lr", "0.01")
        self.assertEqual(done.returncode, 1)
        self.assertIn("'optimizer.params.lr' is 0.5 but the trainer's value is 0.01", done.stderr)

    def test_train_gpt_nvme_path_overrides_the_config(self):
        elsewhere = "/nonexistent-zinf-disk/swap"
        config = {"zero_optimization": {
            "stage": 3, "offload_param": {"device": "nvme", "nvme_path": elsewhere},
            "offload_optimizer": {"device": "nvme", "nvme_path": [elsewhere, elsewhere + "2"]}}}
        done = self.train_gpt(config, "--steps", "1")
        self.assertEqual(done.returncode, 1, "the config's own path does not exist")
        self.assertIn(elsewhere, done.stderr)
        done = self.train_gpt(config, "--steps", "1", "--nvme-path", self.dir)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("parameters on nvme", done.stdout)
        self.assertNotIn(elsewhere, done.stdout + done.stderr)


if __name__ == "__main__":
    unittest.main()
