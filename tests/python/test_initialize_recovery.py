"""zinf.initialize after something went other than planned: a resume under another world size
and gradient accumulation at the same global batch trains on as the run that saved would have
(2 ranks x 1 -> 1 rank x 2 and back; tests/python/elastic_resume.py), and a step refused for
non-finite gradients drops its batch, so that the next one trains."""

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import torch

import initialize_train
import zinf

BUILD_DIR = os.environ.get("ZINF_BUILD_DIR", "")
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "elastic_resume.py")
STEPS, SAVE_AFTER = 6, 3


class InitializeRecoveryTest(unittest.TestCase):
    def setUp(self):
        for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            self.assertNotIn(var, os.environ, "run these tests outside a launcher")
        self.dir = tempfile.mkdtemp(prefix="zinf-recovery-test-", dir=BUILD_DIR or None)
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)

    def run_shape(self, world, gas, save_dir, resume):
        """Every micro-batch's loss, keyed "STEP:OFFSET", over the ranks of one run."""
        cmd = [sys.executable, SCRIPT, "--gas", str(gas), "--steps", str(STEPS),
               "--save_dir", save_dir]
        cmd += ["--resume"] if resume else ["--save_after", str(SAVE_AFTER)]
        if world > 1:
            launcher = os.path.join(BUILD_DIR, "bin", "zinf")
            self.assertTrue(os.path.exists(launcher), f"{launcher} is not built")
            cmd = [launcher, "run", "-n", str(world), "--"] + cmd
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
        self.assertEqual(done.returncode, 0, f"{world} x {gas}:\n{done.stdout}\n{done.stderr}")
        losses = {}
        for line in done.stdout.splitlines():
            if '"losses"' in line:
                losses.update(json.loads(line[line.index("{"):])["losses"])
        return losses

    def check_resume(self, saved_shape, resumed_shape):
        save_dir = os.path.join(self.dir, f"{saved_shape}-{resumed_shape}")
        whole = self.run_shape(*saved_shape, save_dir, resume=False)
        resumed = self.run_shape(*resumed_shape, save_dir, resume=True)
        after = {k: v for k, v in whole.items() if int(k.split(":")[0]) >= SAVE_AFTER}
        self.assertEqual(len(after), (STEPS - SAVE_AFTER) * 2, whole)
        # Bitwise: the ranks' gradients are summed in rank order, as the micro-batches' are
        # accumulated in order, and the step is elementwise.
        self.assertEqual(resumed, after)

    def test_resume_from_two_ranks_on_one_with_twice_the_accumulation(self):
        self.check_resume((2, 1), (1, 2))

    def test_resume_from_one_rank_on_two_with_half_the_accumulation(self):
        self.check_resume((1, 2), (2, 1))

    def test_a_step_refused_for_non_finite_gradients_drops_its_batch(self):
        config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
                  "optimizer": {"type": "AdamW", "params": {"lr": 0.02, "weight_decay": 0.01}},
                  "zero_optimization": {"stage": 3}}
        x, y = initialize_train.dataset(16).tensors
        torch.manual_seed(0)
        engine, *_ = zinf.initialize(model=initialize_train.Net(), config=config)
        bad = x[:4].clone()
        bad[0, 0] = math.nan
        engine.backward(engine((bad, y[:4])))
        with self.assertRaisesRegex(zinf.DataLossError,
                                    "non-finite gradients.*the batch's gradients were dropped"):
            engine.step()
        losses = []
        for at in range(4, 16, 4):
            loss = engine((x[at:at + 4], y[at:at + 4]))
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        # As torch trains from the same start without the refused batch.
        torch.manual_seed(0)
        net = initialize_train.Net()
        opt = torch.optim.AdamW(net.parameters(), lr=0.02, weight_decay=0.01)
        for at, got in zip(range(4, 16, 4), losses):
            opt.zero_grad()
            loss = net((x[at:at + 4], y[at:at + 4]))
            loss.backward()
            opt.step()
            self.assertAlmostEqual(got, loss.item(), delta=1e-6 * abs(loss.item()))
        self.assertEqual(engine.global_steps, 3)


if __name__ == "__main__":
    unittest.main()
