"""zinf.initialize: DeepSpeed's getting-started loop (tests/python/initialize_train.py, the
same text for X = zinf and X = deepspeed) on 1 and 2 processes gives plain PyTorch's losses on
the same batches and resumes from its checkpoint bitwise with its client_state (DeepSpeed's
own run of the loop: test_initialize_deepspeed.py). Also: what cannot work is refused saying
why; the optimizer and lr_scheduler views; the step result's lr and time."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest

import torch

import initialize_train
import zinf

BUILD_DIR = os.environ.get("ZINF_BUILD_DIR", "")
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "initialize_train.py")
MICRO, GAS, SAMPLES, SAVE_STEP = 4, 2, 64, 3
WEIGHT_DECAY, CLIP = 0.01, 1.0


def loop_config(**extra):
    return {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": GAS,
            "gradient_clipping": CLIP,
            "optimizer": {"type": "AdamW", "params": {"lr": 0.02, "weight_decay": WEIGHT_DECAY,
                                                      "torch_adam": True}},
            "scheduler": {"type": "WarmupLR", "params": {
                "warmup_min_lr": 0.002, "warmup_max_lr": 0.02, "warmup_num_steps": 4,
                "warmup_type": "linear"}},
            "zero_optimization": {"stage": 3}, **extra}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torch_reference(world, lrs):
    """Per-rank micro-batch losses of plain PyTorch on the batches the loop's loader gives
    each rank (DistributedSampler, seed 0), the gradient averaged over ranks and micro-batches,
    AdamW with the learning rate each step applied (lrs) and the config's clipping."""
    torch.manual_seed(0)
    net = initialize_train.Net()
    opt = torch.optim.AdamW(net.parameters(), lr=lrs[0], weight_decay=WEIGHT_DECAY)
    data = initialize_train.dataset(SAMPLES)
    orders = [list(torch.utils.data.DistributedSampler(data, num_replicas=world, rank=r))
              for r in range(world)]
    losses = [[] for _ in range(world)]
    for step, lr in enumerate(lrs):
        opt.zero_grad()
        for r in range(world):
            for k in range(GAS):
                at = (step * GAS + k) * MICRO
                loss = net(data[orders[r][at:at + MICRO]])
                (loss / (world * GAS)).backward()
                losses[r].append(loss.item())
        torch.nn.utils.clip_grad_norm_(net.parameters(), CLIP)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
    return losses


class LoopRunner(unittest.TestCase):
    """Runs tests/python/initialize_train.py and checks what it prints (no tests of its own)."""

    def setUp(self):
        for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            self.assertNotIn(var, os.environ, "run these tests outside a launcher")
        self.dir = tempfile.mkdtemp(prefix="zinf-initialize-test-", dir=BUILD_DIR or None)
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)

    def write_config(self, name, config):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            json.dump(config, f)
        return path

    def run_loop(self, backend, world, config, device="cpu"):
        """Runs the loop on `world` processes, the model put on `device` first; returns each
        rank's result, by rank."""
        save_dir = os.path.join(self.dir, f"{backend}-{world}-ckpt")
        cmd = [sys.executable, SCRIPT, "--backend", backend, "--deepspeed_config",
               self.write_config(f"{backend}-{world}.json", config), "--save_dir", save_dir,
               "--save_step", str(SAVE_STEP), "--samples", str(SAMPLES), "--device", device]
        env = dict(os.environ)
        if world > 1:
            launcher = os.path.join(BUILD_DIR, "bin", "zinf")
            self.assertTrue(os.path.exists(launcher), f"{launcher} is not built")
            cmd = [launcher, "run", "-n", str(world), "--"] + cmd
        elif backend == "deepspeed":  # its init_distributed wants a launcher's environment
            env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(free_port()))
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=400)
        self.assertEqual(done.returncode, 0, f"{backend} on {world}:\n{done.stdout}\n"
                                             f"{done.stderr}")
        results = [json.loads(line[line.index("{"):]) for line in done.stdout.splitlines()
                   if '"losses"' in line]
        self.assertEqual(len(results), world, done.stdout)
        return sorted(results, key=lambda r: r["rank"])

    def check_loop(self, world, results):
        steps = SAMPLES // (MICRO * GAS * world)
        for r in results:
            self.assertEqual((r["micro_batch"], r["gradient_accumulation_steps"],
                              r["train_batch_size"], r["batches"]),
                             (MICRO, GAS, MICRO * GAS * world, steps * GAS), r)
            self.assertEqual(r["client_state"], {"step": SAVE_STEP}, "exactly what was saved")
            # Resumed from the checkpoint: the same losses, bit for bit, and the step count.
            self.assertEqual(r["resumed"], r["losses"][SAVE_STEP + 1:])
            self.assertEqual(r["global_steps"], steps)
        lrs = results[0]["lrs"]
        self.assertEqual(len(lrs), steps)
        ref = torch_reference(world, lrs)
        for r in results:
            for got, want in zip(r["losses"], ref[r["rank"]]):
                self.assertAlmostEqual(got, want, delta=2e-5 * abs(want),
                                       msg=f"rank {r['rank']}: {r['losses']} vs "
                                           f"{ref[r['rank']]}")


class InitializeTest(LoopRunner):
    def test_getting_started_loop_one_process(self):
        self.check_loop(1, self.run_loop("zinf", 1, loop_config()))

    def test_getting_started_loop_two_processes(self):
        self.check_loop(2, self.run_loop("zinf", 2, loop_config()))

    def test_views_and_step_result(self):
        torch.manual_seed(0)
        net = initialize_train.Net()
        engine, optimizer, loader, scheduler = zinf.initialize(
            model=net, config=loop_config(), training_data=initialize_train.dataset(16))
        self.assertIs(engine.module, net)
        self.assertEqual((engine.zero_optimization_stage(), engine.fp16_enabled(),
                          engine.bfloat16_enabled(), engine.gradient_clipping()),
                         (3, False, False, CLIP))
        self.assertEqual(engine.device, torch.device("cpu"))
        self.assertIs(engine.fc1, net.fc1)  # the model's attributes, as DeepSpeed's engine
        self.assertEqual(len(loader), 16 // MICRO)
        self.assertEqual(scheduler.get_lr(), [0.002])  # before any step: warmup_min_lr
        self.assertEqual(optimizer.param_groups[0]["lr"], 0.002)
        with self.assertRaisesRegex(KeyError, "fixed by the config"):
            optimizer.param_groups[0]["weight_decay"] = 0.5
        with self.assertRaisesRegex(RuntimeError, "engine.step"):
            optimizer.step()
        results = []
        for batch in loader:
            boundary = engine.is_gradient_accumulation_boundary()
            lr = engine.get_lr()[0]
            before = time.time()
            engine.backward(engine(batch))
            result = engine.step()
            self.assertEqual(result is not None, boundary)
            if result is not None:
                self.assertEqual(result["lr"], lr)
                self.assertTrue(before <= result["time"] <= time.time(), result)
                results.append(result)
        self.assertEqual([r["step"] for r in results], [1, 2])
        self.assertEqual(engine.global_steps, 2)
        self.assertEqual(engine.global_samples, 2 * MICRO * GAS)
        self.assertEqual(scheduler.state_dict(), {"last_batch_iteration": 1})
        self.assertNotEqual(scheduler.get_lr(), [0.002])
        with self.assertRaisesRegex(RuntimeError, "steps the config's scheduler"):
            scheduler.step()
        # Without a scheduler: none is returned, and the optimizer's lr sets the engine's.
        config = loop_config()
        del config["scheduler"]
        engine, optimizer, loader, scheduler = zinf.initialize(
            model=initialize_train.Net(), config=config)
        self.assertIsNone(loader)
        self.assertIsNone(scheduler)
        optimizer.param_groups[0]["lr"] = 0.125
        self.assertEqual(engine.get_lr(), [0.125])

    def test_boundary_only_step_as_accelerate_calls_it(self):
        # Accelerate sets the boundary and calls step() only there: the same updates as
        # DeepSpeed's loop, which calls step() every micro-batch.
        def losses(boundary_only):
            torch.manual_seed(0)
            engine, _, loader, _ = zinf.initialize(
                model=initialize_train.Net(), config=loop_config(),
                training_data=initialize_train.dataset(32))
            out = []
            for i, batch in enumerate(loader):
                at_boundary = (i + 1) % GAS == 0
                if boundary_only:
                    engine.set_gradient_accumulation_boundary(at_boundary)
                self.assertEqual(engine.is_gradient_accumulation_boundary(), at_boundary)
                loss = engine(batch)
                out.append(loss.item())
                engine.backward(loss)
                if not boundary_only or at_boundary:
                    engine.step()
            self.assertEqual(engine.global_steps, 32 // MICRO // GAS)
            return out
        self.assertEqual(losses(boundary_only=True), losses(boundary_only=False))

    def test_a_short_last_window_steps_as_deepspeed_steps_it(self):
        # Note [Short last window]: a boundary after 1 of 2 micro-batches (the last window of
        # an epoch, as transformers' Trainer and Accelerate end one) steps with that gradient,
        # scaled by 1 / gradient_accumulation_steps as in a full window: torch's AdamW on the
        # micro-batch's loss / 2. The engine then starts a whole window again. In memory, and
        # with everything on NVMe, the gradient accumulators too (zinf.gradients_on_nvme).
        nvme = {"device": "nvme", "nvme_path": self.dir}
        for placement in ({"stage": 3},
                          {"stage": 3, "offload_param": nvme, "offload_optimizer": nvme}):
            with self.subTest(offload="offload_param" in placement):
                self.check_short_last_window(placement)

    def check_short_last_window(self, placement):
        gas = 2
        config = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": gas,
                  "optimizer": {"type": "AdamW", "params": {"lr": 0.02, "weight_decay": 0.01}},
                  "zero_optimization": placement}
        if "offload_param" in placement:
            config["zinf"] = {"gradients_on_nvme": True}
        data = initialize_train.dataset(5 * MICRO)
        batches = [data[i * MICRO:(i + 1) * MICRO] for i in range(5)]
        windows = [batches[0:1], batches[1:3], batches[3:4], batches[4:5]]

        torch.manual_seed(0)
        ref = initialize_train.Net()
        opt = torch.optim.AdamW(ref.parameters(), lr=0.02, weight_decay=0.01)
        want = []
        for window in windows:
            opt.zero_grad()
            for batch in window:
                loss = ref(batch)
                (loss / gas).backward()
                want.append(loss.item())
            opt.step()

        torch.manual_seed(0)
        engine, *_ = zinf.initialize(model=initialize_train.Net(), config=config)
        got = []
        for window in windows:
            for i, batch in enumerate(window):
                engine.set_gradient_accumulation_boundary(i == len(window) - 1)
                loss = engine(batch)
                engine.backward(loss)
                got.append(loss.item())
                engine.step()
        self.assertEqual(engine.global_steps, len(windows))
        for g, w in zip(got, want):
            self.assertAlmostEqual(g, w, delta=1e-5 * max(1.0, abs(w)), msg=f"{got} vs {want}")

    def test_init_distributed_initializes_torch_distributed_once(self):
        script = ("import torch.distributed as dist, zinf\n"
                  "zinf.init_distributed(); zinf.init_distributed()\n"
                  "print(dist.get_backend(), dist.get_world_size())\n")
        env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              env=env, timeout=120)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(done.stdout.split(), ["gloo", "1"])

    def test_what_cannot_work_is_refused_saying_why(self):
        net = initialize_train.Net()
        # A trainer's optimizer and scheduler: test_engine_behaviours.py.
        with self.assertRaisesRegex(ValueError, "kernels, which exist for torch.optim.AdamW"):
            zinf.initialize(model=net, config=loop_config(),
                            optimizer=torch.optim.SGD(net.parameters(), lr=0.1))
        with self.assertRaisesRegex(TypeError, "it returned NoneType, not a scheduler"):
            zinf.initialize(model=net, config=loop_config(), lr_scheduler=lambda opt: None)
        # Groups with their own lr and weight_decay train (test_engine_behaviours.py); an
        # option a group cannot have for itself is named.
        with self.assertRaisesRegex(ValueError, "group 0 sets \\['amsgrad'\\]"):
            zinf.initialize(model=net, config=loop_config(), model_parameters=[
                {"params": [net.fc1.weight], "amsgrad": True},
                {"params": [net.fc1.bias, net.fc2.weight, net.fc2.bias]}])
        with self.assertRaisesRegex(ValueError, "lists 1 tensor"):
            zinf.initialize(model=net, config=loop_config(), model_parameters=[net.fc1.weight])
        with self.assertRaisesRegex(ValueError, "needs a config"):
            zinf.initialize(model=net)

        class Args:
            deepspeed_config = self.write_config("args.json", loop_config())
        with self.assertRaisesRegex(ValueError, "both in args.deepspeed_config and in config"):
            zinf.initialize(args=Args(), model=net, config=loop_config())
        engine, *_ = zinf.initialize(args=Args(), model=net)
        with self.assertRaisesRegex(TypeError, "client_state must be JSON-able"):
            engine.save_checkpoint(self.dir, client_state={"x": object()})
        with self.assertRaisesRegex(ValueError, "save_latest=False"):
            engine.save_checkpoint(self.dir, save_latest=False)
        self.assertEqual(engine.load_checkpoint(os.path.join(self.dir, "none")), (None, None))
        with self.assertRaisesRegex(ValueError, "whole training state"):
            engine.load_checkpoint(self.dir, load_module_only=True)

    def test_a_failed_initialize_leaves_the_model_whole(self):
        # Checked before the takeover, or undone after it (Note [Undoing the takeover] in
        # zinf/zero.py): the model keeps its values and a corrected retry trains.
        torch.manual_seed(0)
        net = initialize_train.Net()
        before = {k: v.clone() for k, v in net.state_dict().items()}
        data = initialize_train.dataset(SAMPLES)
        with self.assertRaisesRegex(ValueError, "must be a torch.utils.data.Dataset, got list"):
            zinf.initialize(model=net, config=loop_config(), training_data=[1, 2, 3])
        not_a_dir = os.path.join(self.dir, "file")
        open(not_a_dir, "w").close()
        with self.assertRaisesRegex(ValueError, "csv_monitor.output_path.*is not a directory"):
            zinf.initialize(model=net, config=loop_config(csv_monitor={
                "enabled": True, "output_path": os.path.join(not_a_dir, "logs")}))
        real_io = zinf.engine.DeepSpeedEngine.deepspeed_io

        def failing_io(self, dataset):
            raise RuntimeError("injected after the takeover")
        zinf.engine.DeepSpeedEngine.deepspeed_io = failing_io
        try:
            with self.assertRaisesRegex(RuntimeError, "injected after the takeover"):
                zinf.initialize(model=net, config=loop_config(), training_data=data)
        finally:
            zinf.engine.DeepSpeedEngine.deepspeed_io = real_io
        for name, value in net.state_dict().items():
            self.assertTrue(torch.equal(value, before[name]), name)
        engine, _, loader, _ = zinf.initialize(model=net, config=loop_config(), training_data=data)
        batch = next(iter(loader))
        torch.manual_seed(0)
        self.assertEqual(engine(batch).item(), initialize_train.Net()(batch).item())


if __name__ == "__main__":
    unittest.main()
