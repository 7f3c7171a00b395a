"""DeepSpeed engine behaviours that transformers' Trainer, Accelerate, PEFT and TRL call, on
zinf.initialize, each against plain PyTorch on the same seed and data:
- a trainer's torch optimizer (AdamW, Adam, Adagrad) taken over and stepped by zinf's kernels;
- a trainer's LR scheduler (an object over that optimizer, or a callable as transformers passes);
- parameter groups with their own weight_decay and lr (transformers' Trainer's decay and no-decay
  groups), in a torch optimizer or as model_parameters, the optimizer state in host memory and
  on NVMe, under a LambdaLR;
- _zero3_consolidated_16bit_state_dict, save_16bit_model and
  stage3_gather_16bit_weights_on_model_save, on 1 and 2 processes;
- a model with nothing to train (TRL's reference model) sharded and offloaded;
- shipped ZeRO-3 offload configs (LLaMA-Factory's, Hugging Face's) with "auto" from the trainer.
What zinf cannot do as DeepSpeed would is refused, the message naming the option and the way."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import types
import unittest

import torch

import initialize_train
import zinf

BUILD_DIR = os.environ.get("ZINF_BUILD_DIR", "")
SOURCE_DIR = os.environ.get("ZINF_SOURCE_DIR",
                            os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
CONFIGS = os.path.join(SOURCE_DIR, "tests", "data", "deepspeed_configs")
MICRO, STEPS = 4, 6


def config(**extra):
    return {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 1,
            "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"},
                                  "offload_optimizer": {"device": "cpu"}}, **extra}


def batches(n=STEPS):
    data = initialize_train.dataset(n * MICRO)
    return [data[i * MICRO:(i + 1) * MICRO] for i in range(n)]


def torch_losses(make_optimizer, make_scheduler=None, n=STEPS):
    """Plain PyTorch: the losses and the learning rate of each step."""
    torch.manual_seed(0)
    net = initialize_train.Net()
    opt = make_optimizer(net)
    sched = make_scheduler(opt) if make_scheduler else None
    losses, lrs = [], []
    for batch in batches(n):
        opt.zero_grad()
        loss = net(batch)
        loss.backward()
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        if sched is not None:
            sched.step()
        losses.append(loss.item())
    return losses, lrs


def zinf_losses(engine, n=STEPS):
    losses, lrs = [], []
    for batch in batches(n):
        loss = engine(batch)
        engine.backward(loss)
        lrs.append(engine.get_lr()[0])
        engine.step()
        losses.append(loss.item())
    return losses, lrs


class _NormNet(torch.nn.Module):
    """initialize_train.Net with a LayerNorm: what transformers' Trainer keeps out of decay."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.norm = torch.nn.LayerNorm(16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, batch):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.fc2(self.norm(torch.tanh(self.fc1(x)))), y)


def _torch_run(make_optimizer, make_scheduler, n):
    """Plain PyTorch on _NormNet: the losses and every group's learning rate of each step."""
    torch.manual_seed(0)
    net = _NormNet()
    opt = make_optimizer(net)
    sched = make_scheduler(opt) if make_scheduler else None
    losses, lrs = [], []
    for batch in batches(n):
        opt.zero_grad()
        loss = net(batch)
        loss.backward()
        lrs.extend(g["lr"] for g in opt.param_groups)
        opt.step()
        if sched is not None:
            sched.step()
        losses.append(loss.item())
    return losses, lrs


def _zinf_run(engine, n):
    losses, lrs = [], []
    for batch in batches(n):
        loss = engine(batch)
        engine.backward(loss)
        lrs.extend(engine.get_lr())
        engine.step()
        losses.append(loss.item())
    return losses, lrs


class EngineBehavioursTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="zinf-engine-behaviours-", dir=BUILD_DIR or None)
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)

    def assertClose(self, got, want, tolerance=1e-5):
        self.assertEqual(len(got), len(want))
        for g, w in zip(got, want):
            self.assertAlmostEqual(g, w, delta=tolerance * max(1.0, abs(w)), msg=f"{got} vs {want}")

    # -- a trainer's torch optimizer ----------------------------------------------------------

    def test_torch_optimizers_are_taken_over_with_their_numbers(self):
        cases = {
            "AdamW": lambda ps: torch.optim.AdamW(ps, lr=0.02, betas=(0.8, 0.99), eps=1e-6,
                                                  weight_decay=0.05),
            # L2 weight decay, as torch's Adam adds it to the gradient.
            "Adam": lambda ps: torch.optim.Adam(ps, lr=0.01, weight_decay=0.1),
            "Adagrad": lambda ps: torch.optim.Adagrad(ps, lr=0.05, weight_decay=0.01, eps=1e-8),
        }
        for name, make in cases.items():
            with self.subTest(name):
                want, _ = torch_losses(lambda net: make(net.parameters()))
                torch.manual_seed(0)
                net = initialize_train.Net()
                engine, optimizer, _, scheduler = zinf.initialize(
                    model=net, optimizer=make(net.parameters()), config=config())
                self.assertIsNone(scheduler)
                self.assertIs(optimizer, engine.optimizer)
                got, _ = zinf_losses(engine)
                self.assertClose(got, want)
        # A callable making the optimizer from the parameters, as DeepSpeed takes it; groups
        # with equal options are one group.
        want, _ = torch_losses(lambda net: cases["AdamW"](net.parameters()))
        torch.manual_seed(0)
        net = initialize_train.Net()
        engine, *_ = zinf.initialize(model=net, config=config(), optimizer=lambda ps: cases[
            "AdamW"]([{"params": ps[:2]}, {"params": ps[2:]}]))
        self.assertClose(zinf_losses(engine)[0], want)

    def test_what_a_torch_optimizer_cannot_be_is_refused_naming_it(self):
        net = initialize_train.Net()
        refused = {
            "torch.optim.AdamW, torch.optim.Adam and torch.optim.Adagrad":
                torch.optim.SGD(net.parameters(), lr=0.1),
            "differ in 'amsgrad' \\(False and True\\)": torch.optim.AdamW(
                [{"params": [net.fc1.weight, net.fc2.weight]},
                 {"params": [net.fc1.bias, net.fc2.bias], "amsgrad": True}], lr=0.1),
            "'amsgrad' is True": torch.optim.AdamW(net.parameters(), amsgrad=True),
            "'lr_decay' is 0.5": torch.optim.Adagrad(net.parameters(), lr_decay=0.5),
            "it steps 2 tensor": torch.optim.AdamW([net.fc1.weight, net.fc1.bias]),
        }
        for message, opt in refused.items():
            with self.subTest(message), self.assertRaisesRegex(ValueError, message):
                zinf.initialize(model=net, optimizer=opt, config=config())
        stepped = torch.optim.AdamW(net.parameters())
        net(batches(1)[0]).backward()
        stepped.step()
        with self.assertRaisesRegex(ValueError, "has stepped already"):
            zinf.initialize(model=net, optimizer=stepped, config=config())
        with self.assertRaisesRegex(ValueError, "and the config's \"optimizer\".*give one"):
            zinf.initialize(model=net, optimizer=torch.optim.AdamW(net.parameters()),
                            config=config(optimizer={"type": "AdamW", "params": {"lr": 0.1}}))
        # Every refusal came before the takeover: the model trains under a corrected call.
        engine, *_ = zinf.initialize(model=net, optimizer=torch.optim.AdamW(net.parameters()),
                                     config=config())
        self.assertEqual(len(zinf_losses(engine, 2)[0]), 2)

    # -- parameter groups ----------------------------------------------------------------------

    def test_parameter_groups_with_their_own_weight_decay_and_lr_give_torch_losses(self):
        def no_decay(name):  # transformers' Trainer: biases and LayerNorm weights
            return name.endswith("bias") or name.startswith("norm.")

        def split(net, decay_options, no_decay_options):
            named = list(net.named_parameters())
            return [{"params": [p for n, p in named if not no_decay(n)], **decay_options},
                    {"params": [p for n, p in named if no_decay(n)], **no_decay_options}]

        def adamw(net):  # the no-decay group with an lr and betas of its own too
            return torch.optim.AdamW(split(net, {"weight_decay": 0.1}, {
                "weight_decay": 0.0, "lr": 0.03, "betas": (0.8, 0.99)}), lr=0.02)

        def warmup_decay(opt):  # as transformers' get_linear_schedule_with_warmup
            return torch.optim.lr_scheduler.LambdaLR(
                opt, lambda step: min((step + 1) / 4, max(0.0, (40 - step) / 36)))

        steps = 20
        for device in ("cpu", "nvme"):
            offload = {"device": device}
            if device == "nvme":
                offload["nvme_path"] = os.path.join(self.dir, "swap")
                os.makedirs(offload["nvme_path"], exist_ok=True)
            zero = {"stage": 3, "offload_param": {"device": "cpu"}, "offload_optimizer": offload}
            for scheduled in (False, True):
                with self.subTest(device=device, scheduled=scheduled):
                    want, want_lrs = _torch_run(adamw, warmup_decay if scheduled else None,
                                                steps)
                    # As Accelerate passes them: the optimizer and a scheduler built over it.
                    torch.manual_seed(0)
                    net = _NormNet()
                    opt = adamw(net)
                    engine, optimizer, _, _ = zinf.initialize(
                        model=net, optimizer=opt, config=config(zero_optimization=zero),
                        lr_scheduler=warmup_decay(opt) if scheduled else None)
                    self.assertEqual([g["weight_decay"] for g in optimizer.param_groups],
                                     [0.1, 0.0])
                    self.assertEqual(optimizer.param_groups[1]["betas"], (0.8, 0.99))
                    got, lrs = _zinf_run(engine, steps)
                    self.assertClose(lrs, want_lrs, 1e-12)
                    self.assertClose(got, want)
        # As DeepSpeed takes them: groups as model_parameters beside the config's optimizer,
        # each with the config's options but those it sets; a scheduler made, as transformers
        # makes it, over the returned optimizer.
        want, want_lrs = _torch_run(lambda net: torch.optim.AdamW(
            split(net, {}, {"weight_decay": 0.0}), lr=0.02, weight_decay=0.1), warmup_decay,
            steps)
        torch.manual_seed(0)
        net = _NormNet()
        engine, optimizer, _, scheduler = zinf.initialize(
            model=net, model_parameters=split(net, {}, {"weight_decay": 0.0}),
            lr_scheduler=warmup_decay, config=config(
                optimizer={"type": "AdamW", "params": {"lr": 0.02, "weight_decay": 0.1}}))
        self.assertEqual([g["weight_decay"] for g in optimizer.param_groups], [0.1, 0.0])
        got, lrs = _zinf_run(engine, steps)
        self.assertClose(lrs, want_lrs, 1e-12)
        self.assertClose(got, want)
        self.assertEqual(scheduler.get_last_lr(), engine.get_lr())
        other = _NormNet()
        with self.assertRaisesRegex(ValueError, "group 0 sets \\['amsgrad'\\]"):
            zinf.initialize(model=other, config=config(), model_parameters=[
                {"params": list(other.parameters()), "amsgrad": True}])

    def test_transformers_trainers_groups_and_schedule_give_torch_losses(self):
        try:
            import transformers
            from transformers.trainer_pt_utils import get_parameter_names
        except ImportError as e:
            self.skipTest(f"transformers does not import: {e}")

        def trainer_optimizer(net):  # Trainer.create_optimizer, weight_decay 0.1
            decay = set(get_parameter_names(net, [torch.nn.LayerNorm], [
                r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)"]))
            named = list(net.named_parameters())
            return torch.optim.AdamW(
                [{"params": [p for n, p in named if n in decay], "weight_decay": 0.1},
                 {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0}],
                lr=0.02)

        def schedule(opt):
            return transformers.get_linear_schedule_with_warmup(opt, 3, 20)
        want, want_lrs = _torch_run(trainer_optimizer, schedule, 20)
        # As Trainer passes them without a config optimizer: its optimizer and a callable.
        torch.manual_seed(0)
        net = _NormNet()
        engine, *_ = zinf.initialize(model=net, optimizer=trainer_optimizer(net),
                                     lr_scheduler=schedule, config=config())
        got, lrs = _zinf_run(engine, 20)
        self.assertClose(lrs, want_lrs, 1e-12)
        self.assertClose(got, want)

    # -- a trainer's LR scheduler -------------------------------------------------------------

    def test_client_schedulers_give_torch_learning_rates(self):
        def warmup(opt):
            return torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / 4))

        def adamw(net):
            return torch.optim.AdamW(net.parameters(), lr=0.02, weight_decay=0.01)
        want, want_lrs = torch_losses(adamw, warmup)
        # As transformers passes it: a callable making the scheduler from the optimizer
        # initialize returns (the config names the optimizer).
        torch.manual_seed(0)
        engine, _, _, scheduler = zinf.initialize(
            model=initialize_train.Net(), lr_scheduler=warmup,
            config=config(optimizer={"type": "AdamW", "params": {"lr": 0.02,
                                                                 "weight_decay": 0.01}}))
        self.assertIsInstance(scheduler, torch.optim.lr_scheduler.LambdaLR)
        got, lrs = zinf_losses(engine)
        self.assertClose(lrs, want_lrs, 1e-12)
        self.assertClose(got, want)
        self.assertEqual(scheduler.get_last_lr(), engine.get_lr())
        # As Accelerate passes them: the optimizer and a scheduler built over it.
        torch.manual_seed(0)
        net = initialize_train.Net()
        opt = adamw(net)
        engine, _, _, scheduler = zinf.initialize(model=net, optimizer=opt,
                                                  lr_scheduler=warmup(opt), config=config())
        got, lrs = zinf_losses(engine)
        self.assertClose(lrs, want_lrs, 1e-12)
        self.assertClose(got, want)
        # Beside a config scheduler the trainer's is the one stepped, as in DeepSpeed, and
        # the config's is named in a warning.
        torch.manual_seed(0)
        with self.assertLogs("zinf", "WARNING") as logs:
            engine, _, _, scheduler = zinf.initialize(
                model=initialize_train.Net(), lr_scheduler=warmup, config=config(
                    optimizer={"type": "AdamW", "params": {"lr": 0.02, "weight_decay": 0.01}},
                    scheduler={"type": "WarmupLR", "params": {"warmup_num_steps": 100}}))
        self.assertIn("config key 'scheduler'", "\n".join(logs.output))
        self.assertClose(zinf_losses(engine)[1], want_lrs, 1e-12)

    def test_a_client_scheduler_is_checkpointed_with_the_engine(self):
        def warmup(opt):
            return torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / 8))

        def make():
            torch.manual_seed(0)
            net = initialize_train.Net()
            return zinf.initialize(model=net, lr_scheduler=warmup, config=config(
                optimizer={"type": "AdamW", "params": {"lr": 0.02}}))[0]
        engine = make()
        data = batches(6)
        for batch in data[:3]:
            engine.backward(engine(batch))
            engine.step()
        engine.save_checkpoint(self.dir, tag="three")
        want = []
        for batch in data[3:]:
            want.append(engine.get_lr()[0])
            engine.backward(engine(batch))
            engine.step()
        # A new run resumed from the checkpoint: the schedule carries on where it was.
        engine = make()
        path, _ = engine.load_checkpoint(self.dir, tag="three")
        self.assertEqual(path, os.path.join(self.dir, "three"))
        got = []
        for batch in data[3:]:
            got.append(engine.get_lr()[0])
            engine.backward(engine(batch))
            engine.step()
        self.assertEqual(got, want)
        with self.assertRaisesRegex(ValueError, "no lr_scheduler state"):
            engine._restore_client_scheduler({"client_state": {}})

    def test_a_scheduler_the_engine_cannot_follow_is_refused(self):
        net = initialize_train.Net()
        other = torch.optim.AdamW(net.parameters())
        with self.assertRaisesRegex(ValueError, "not the one passed as optimizer="):
            zinf.initialize(model=net, config=config(optimizer={"type": "AdamW"}),
                            lr_scheduler=torch.optim.lr_scheduler.StepLR(other, 1))
        with self.assertRaisesRegex(TypeError, "a callable that makes one"):
            zinf.initialize(model=net, config=config(), lr_scheduler=3)

    # -- the 16-bit model -----------------------------------------------------------------------

    def test_save_16bit_model_saves_the_trained_values(self):
        def adamw(net):
            return torch.optim.AdamW(net.parameters(), lr=0.02)
        torch.manual_seed(0)
        net = initialize_train.Net()
        ref_opt = adamw(net)
        for batch in batches():
            ref_opt.zero_grad()
            net(batch).backward()
            ref_opt.step()
        want = net.state_dict()
        zero = {"stage": 3, "stage3_gather_16bit_weights_on_model_save": True}
        torch.manual_seed(0)
        model = initialize_train.Net()
        engine, *_ = zinf.initialize(model=model, optimizer=adamw(model),
                                     config=config(zero_optimization=zero))
        self.assertTrue(engine.zero_gather_16bit_weights_on_model_save())
        zinf_losses(engine)
        state = engine._zero3_consolidated_16bit_state_dict()
        self.assertEqual(sorted(state), sorted(want))
        for name, value in want.items():
            self.assertEqual(state[name].dtype, torch.float32)  # no 16-bit section: fp32
            self.assertTrue(torch.allclose(state[name], value, atol=1e-5), name)
        self.assertTrue(engine.save_16bit_model(self.dir, "model.bin"))
        saved = torch.load(os.path.join(self.dir, "model.bin"))
        for name, value in state.items():
            self.assertTrue(torch.equal(saved[name], value), name)
        # Off (DeepSpeed's default, and "auto"): nothing is saved and False returned, as
        # DeepSpeed does.
        for value in (False, "auto", None):
            zero = {"stage": 3}
            if value is not None:
                zero["stage3_gather_16bit_weights_on_model_save"] = value
            engine, *_ = zinf.initialize(model=initialize_train.Net(),
                                         config=config(zero_optimization=zero,
                                                       optimizer={"type": "AdamW"}))
            self.assertFalse(engine.zero_gather_16bit_weights_on_model_save())
            self.assertFalse(engine.save_16bit_model(self.dir, "off.bin"))
            self.assertFalse(os.path.exists(os.path.join(self.dir, "off.bin")))
        with self.assertRaisesRegex(ValueError, "must be true or false"):
            zinf.initialize(model=initialize_train.Net(), config=config(zero_optimization={
                "stage": 3, "stage3_gather_16bit_weights_on_model_save": "yes"}))

    def test_16bit_state_dict_is_in_the_config_dtype_and_leaves_out_frozen_on_request(self):
        torch.manual_seed(0)
        net = initialize_train.Net()
        want = {k: v.clone() for k, v in net.state_dict().items()}
        net.fc1.requires_grad_(False)  # a frozen part, outside the engine
        engine, *_ = zinf.initialize(model=net, config=config(
            bf16={"enabled": True}, optimizer={"type": "AdamW"},
            zero_optimization={"stage": 3, "stage3_gather_fp16_weights_on_model_save": True}))
        state = engine._zero3_consolidated_16bit_state_dict()
        for name, value in want.items():
            self.assertEqual(state[name].dtype, torch.bfloat16, name)
            self.assertTrue(torch.equal(state[name], value.to(torch.bfloat16)), name)
        state = engine._zero3_consolidated_16bit_state_dict(exclude_frozen_parameters=True)
        self.assertEqual(sorted(state), ["fc2.bias", "fc2.weight"])

    def test_on_two_processes(self):
        # The 16-bit state dict is rank 0's, the others get None; a model with nothing to
        # train, sharded over both, computes torch's loss.
        script = (
            "import json, os, sys, torch, zinf, initialize_train\n"
            # As TRL runs a policy and a reference engine at once: torch.distributed first,
            # through whose store each engine's rendezvous port is agreed.
            "zinf.init_distributed()\n"
            "torch.manual_seed(0)\n"
            "engine, *_ = zinf.initialize(model=initialize_train.Net(), config={\n"
            "    'train_micro_batch_size_per_gpu': 1, 'optimizer': {'type': 'AdamW'},\n"
            "    'zero_optimization': {'stage': 3,\n"
            "        'stage3_gather_16bit_weights_on_model_save': True}})\n"
            "state = engine._zero3_consolidated_16bit_state_dict()\n"
            "saved = engine.save_16bit_model(sys.argv[1])\n"
            "torch.manual_seed(1)\n"  # a reference model with nothing to train, on both ranks
            "ref, *_ = zinf.initialize(model=initialize_train.Net().requires_grad_(False),\n"
            "    config={'train_micro_batch_size_per_gpu': 1, 'zero_optimization': {\n"
            "        'stage': 3, 'offload_param': {'device': 'cpu'}}})\n"
            "with torch.no_grad():\n"
            "    ref_loss = ref(initialize_train.dataset(4)[:4]).item()\n"
            "print(json.dumps({'rank': engine.global_rank, 'saved': saved, 'state': None if\n"
            "    state is None else {k: v.tolist() for k, v in state.items()},\n"
            "    'ref_loss': ref_loss}))\n")
        launcher = os.path.join(BUILD_DIR, "bin", "zinf")
        self.assertTrue(os.path.exists(launcher), f"{launcher} is not built")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [os.path.dirname(os.path.abspath(__file__)), os.environ.get("PYTHONPATH", "")]))
        done = subprocess.run([launcher, "run", "-n", "2", "--", sys.executable, "-c", script,
                               self.dir], capture_output=True, text=True, env=env, timeout=300)
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        results = sorted((json.loads(line[line.index("{"):]) for line in done.stdout.splitlines()
                          if '"rank"' in line), key=lambda r: r["rank"])
        self.assertEqual([r["rank"] for r in results], [0, 1])
        self.assertEqual([r["saved"] for r in results], [True, True])
        self.assertIsNone(results[1]["state"])
        torch.manual_seed(1)
        with torch.no_grad():
            ref_loss = initialize_train.Net()(initialize_train.dataset(4)[:4]).item()
        self.assertEqual([r["ref_loss"] for r in results], [ref_loss, ref_loss])
        torch.manual_seed(0)
        want = initialize_train.Net().state_dict()
        saved = torch.load(os.path.join(self.dir, "pytorch_model.bin"))
        for name, value in want.items():
            self.assertEqual(results[0]["state"][name], value.tolist(), name)
            self.assertTrue(torch.equal(saved[name], value), name)

    # -- nothing to train -----------------------------------------------------------------------

    def test_a_model_with_nothing_to_train_runs_sharded_and_offloaded(self):
        x = torch.randn(5, 8, generator=torch.Generator().manual_seed(3))
        for device in ("cpu", "nvme"):
            with self.subTest(device):
                torch.manual_seed(0)
                ref = initialize_train.Net().requires_grad_(False)
                torch.manual_seed(0)
                net = initialize_train.Net().requires_grad_(False)
                offload = {"device": device}
                if device == "nvme":
                    offload["nvme_path"] = os.path.join(self.dir, "swap")
                    os.makedirs(offload["nvme_path"], exist_ok=True)
                # As TRL prepares its reference model: the policy's config, optimizer and all.
                engine, *_ = zinf.initialize(model=net, config=config(
                    optimizer={"type": "AdamW"}, zero_optimization={
                        "stage": 3, "offload_param": offload}))
                for p in net.parameters():
                    # A placeholder outside a forward, which refuses to be read: the values
                    # are the engine's shards.
                    self.assertFalse(p.requires_grad)
                    with torch._C.DisableTorchFunction():
                        self.assertEqual(p.data.storage().size(), 1)
                    self.assertRaises(zinf.ParameterNotGatheredError, p.sum)
                with torch.no_grad():
                    self.assertEqual(engine(batches(1)[0]).item(), ref(batches(1)[0]).item())
                # Backward through it reaches its inputs, as through torch's.
                y = torch.arange(5) % 4
                xs = [x.clone().requires_grad_(True) for _ in range(2)]
                for model, xg in ((engine, xs[0]), (ref, xs[1])):
                    model((xg, y)).backward()
                self.assertTrue(torch.allclose(xs[0].grad, xs[1].grad, atol=1e-6))
                loss = engine(batches(1)[0])
                with self.assertRaisesRegex(RuntimeError, "backward\\(\\): this engine has "
                                                          "nothing to train"):
                    engine.backward(loss)
                with self.assertRaisesRegex(RuntimeError, "step\\(\\): this engine has nothing"):
                    engine.step()
                state = engine.zero.consolidated_state_dict()
                for name, value in ref.state_dict().items():
                    self.assertTrue(torch.equal(state[name], value), name)

    # -- shipped configs ----------------------------------------------------------------------

    def test_shipped_zero3_offload_configs_are_accepted_with_the_trainers_values(self):
        args = types.SimpleNamespace(
            per_device_train_batch_size=MICRO, gradient_accumulation_steps=1, max_grad_norm=1.0,
            learning_rate=0.02, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8,
            weight_decay=0.0, fp16=False, bf16=False, max_steps=STEPS,
            get_warmup_steps=lambda steps: 2)
        for name in ("llamafactory_ds_z3_offload_config.json", "hf_zero3_auto.json"):
            with self.subTest(name):
                torch.manual_seed(0)
                net = initialize_train.Net()
                optimizer = None
                if name.startswith("llamafactory"):  # names no optimizer: the trainer's
                    optimizer = torch.optim.AdamW(net.parameters(), lr=0.02, weight_decay=0.0)
                engine, *_ = zinf.initialize(model=net, optimizer=optimizer, trainer=args,
                                             config=os.path.join(CONFIGS, name))
                self.assertEqual((engine.train_micro_batch_size_per_gpu(),
                                  engine.gradient_clipping()), (MICRO, 1.0))
                self.assertTrue(engine.zero_gather_16bit_weights_on_model_save())
                losses, _ = zinf_losses(engine, 2)
                self.assertEqual(len(losses), 2)


if __name__ == "__main__":
    unittest.main()
