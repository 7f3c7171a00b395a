"""zinf.zero and torch.distributed share a process on 1 and 2 processes, initialized in
either order (Note [Beside torch.distributed] in src/comm/environment.h: zinf's rendezvous
store does not take MASTER_PORT, which torch's TCPStore binds), with torch's all_reduce of a
metric beside the engine's collectives. The training is tests/python/torch_distributed_train.py.

SyncBatchNorm is not run: torch implements it for CUDA tensors only ("SyncBatchNorm expected
input tensor to be on GPU") and zinf.zero's parameters are CPU tensors."""

import os
import socket
import subprocess
import sys
import unittest

import torch.distributed as dist

BUILD_DIR = os.environ.get("ZINF_BUILD_DIR", "")
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_distributed_train.py")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@unittest.skipUnless(dist.is_available(), "this torch is built without torch.distributed")
class TorchDistributedTest(unittest.TestCase):
    def setUp(self):
        for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            self.assertNotIn(var, os.environ, "run these tests outside a launcher")

    def test_one_process_either_order(self):
        for order in ("torch-first", "zinf-first"):
            with self.subTest(order=order):
                env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                           MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
                done = subprocess.run([sys.executable, SCRIPT, "--order", order],
                                      capture_output=True, text=True, env=env, timeout=300)
                self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
                self.assertIn(f"rank 0: {order} ok", done.stdout)

    def test_two_processes_either_order(self):
        launcher = os.path.join(BUILD_DIR, "bin", "zinf")
        self.assertTrue(os.path.exists(launcher), f"{launcher} is not built")
        for order in ("torch-first", "zinf-first"):
            with self.subTest(order=order):
                done = subprocess.run([launcher, "run", "-n", "2", "--", sys.executable, SCRIPT,
                                       "--order", order], capture_output=True, text=True,
                                      timeout=300)
                self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
                for rank in (0, 1):
                    self.assertIn(f"rank {rank}: {order} ok", done.stdout)


if __name__ == "__main__":
    unittest.main()
