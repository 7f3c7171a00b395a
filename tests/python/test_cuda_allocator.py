"""zinf.cuda: PyTorch's pluggable CUDA allocator on zinf's device pool. Where a GPU and a CUDA
PyTorch 2.x are present, tensors are allocated from the pool, freed back after their stream's
work, and the budget is enforced; elsewhere the library is still checked (built where CUDA is,
exports the entry points, refuses with the reason) and the GPU test skips saying why."""

import ctypes
import os
import subprocess
import sys
import textwrap
import unittest

import zinf
import zinf.cuda

HAVE_CUDA_BUILD = os.environ.get("ZINF_HAVE_CUDA") == "ON"


class CudaAllocatorTest(unittest.TestCase):
    def test_library_is_built_with_the_entry_points(self):
        if not HAVE_CUDA_BUILD:
            self.assertIsNone(zinf.cuda.library_path())
            self.skipTest("zinf was built without CUDA: there is no allocator library")
        path = zinf.cuda.library_path()
        self.assertIsNotNone(path, "zinf was built with CUDA but the allocator is missing")
        lib = ctypes.CDLL(path)
        for symbol in ("zinf_torch_malloc", "zinf_torch_free", "zinf_torch_allocator_configure",
                       "zinf_torch_allocator_stats", "zinf_torch_allocator_probe",
                       "zinf_torch_allocator_last_error"):
            self.assertTrue(hasattr(lib, symbol), symbol)
        # Nothing else leaks out of it (zinf's own code and cudart stay hidden).
        nm = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True, text=True)
        if nm.returncode == 0:
            exported = [line.split()[-1] for line in nm.stdout.splitlines()
                        if line.split()[1] == "T"]
            self.assertTrue(all(s.startswith("zinf_torch_") for s in exported), exported)

    def test_without_a_usable_gpu_it_says_why(self):
        if not HAVE_CUDA_BUILD:
            self.skipTest("zinf was built without CUDA")
        reason = zinf.cuda.probe(0)
        if reason is None:
            self.skipTest("a GPU is usable here: test_torch_tensors_live_in_the_pool covers it")
        self.assertRegex(reason, r"^Unavailable: .*GPU")
        with self.assertRaises(zinf.FailedPreconditionError) as ctx:
            zinf.cuda.stats(0)
        self.assertIn("no allocation was made on cuda:0", str(ctx.exception))
        why = zinf.cuda.unavailable_reason()
        self.assertIsNotNone(why)
        with self.assertRaises(zinf.UnavailableError) as ctx:
            zinf.cuda.pluggable_allocator()
        self.assertIn(why, str(ctx.exception))

    def test_torch_tensors_live_in_the_pool(self):
        reason = zinf.cuda.unavailable_reason()
        if reason is not None:
            self.skipTest(reason)
        # A fresh process: PyTorch takes an allocator only before its first CUDA allocation.
        script = textwrap.dedent("""
            import torch, zinf, zinf.cuda
            MiB = 1 << 20
            zinf.cuda.use_as_allocator(budget_bytes=256 * MiB, arena_bytes=64 * MiB)
            x = torch.randn(4 * MiB, device="cuda")            # 16 MiB
            y = (x * 2).sum()
            s = zinf.cuda.stats(torch.cuda.current_device())
            assert s["in_use_bytes"] >= 2 * 16 * MiB, s
            assert abs(y.item() - 2 * x.sum().item()) < 1e-2 * abs(y.item()) + 1e-3
            del x
            torch.cuda.synchronize()
            z = torch.empty(4 * MiB, device="cuda")             # reuses the freed block
            s = zinf.cuda.stats(torch.cuda.current_device())
            assert s["arena_bytes"] == 64 * MiB, s
            try:
                torch.empty(300 * MiB // 4, device="cuda")
            except RuntimeError as e:
                assert "ResourceExhausted" in str(e), e
            else:
                raise AssertionError("a 300 MiB tensor fit a 256 MiB budget")
            print("OK", zinf.cuda.stats(torch.cuda.current_device()))
        """)
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              timeout=300)
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        self.assertIn("OK", done.stdout)


if __name__ == "__main__":
    unittest.main()
