"""zinf.nvme.SwapHandle: asynchronous tensor writes and reads through swap files, many in flight,
and bad input: a missing or read-only directory, too little space, a tensor of the wrong size,
a corrupt swap file."""

import os
import shutil
import subprocess
import tempfile
import unittest

import torch

import zinf
from zinf.nvme import SwapHandle

MiB = 1 << 20


def swap_file_descriptors(directory):
    """This process's open (unlinked) swap files in `directory`, by /proc/self/fd."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(os.path.join(directory, "zinf-swap-")):
            found.append(int(fd))
    return found


class SwapHandleTest(unittest.TestCase):
    def setUp(self):
        # Under the build tree (a real disk, where O_DIRECT works), not a tmpfs /tmp.
        base = os.environ.get("ZINF_BUILD_DIR") or None
        self.dir = tempfile.mkdtemp(prefix="zinf-swap-test-", dir=base)
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)

    def test_async_round_trip_of_many_tensors(self):
        g = torch.Generator().manual_seed(0)
        tensors = {
            "fp32": torch.randn(3 * MiB // 4 + 5, generator=g),          # not a page multiple
            "bf16": torch.randn(257, 1031, generator=g).to(torch.bfloat16),
            "int64": torch.randint(-2**40, 2**40, (12345,), generator=g),
            "tiny": torch.tensor([1.5]),
            "big": torch.randn(9 * MiB // 4, generator=g),               # several pieces
        }
        with SwapHandle(self.dir, capacity_bytes=64 * MiB) as h:
            writes = [h.async_pwrite(t, k) for k, t in tensors.items()]  # all in flight
            self.assertIn(h.wait(), range(1, len(writes) + 1))  # finished ones are not counted
            for w in writes:
                self.assertTrue(w.done())
            outs = {k: torch.empty_like(t) for k, t in tensors.items()}
            reads = [h.async_pread(outs[k], k) for k in tensors]
            for r in reads:
                self.assertIs(r.wait(), outs[r.key])
            for k, t in tensors.items():
                self.assertTrue(torch.equal(outs[k], t), k)
            # Overwrite a key and read the new bytes back.
            new = tensors["fp32"] * 2
            h.pwrite(new, "fp32")
            self.assertTrue(torch.equal(h.pread(torch.empty_like(new), "fp32"), new))
            self.assertEqual(sorted(h.keys()), sorted(tensors))
            info = h.info()
            self.assertGreaterEqual(info["capacity_bytes"], 64 * MiB)
            self.assertLess(info["free_bytes"], info["capacity_bytes"])
            h.free("big")
            self.assertNotIn("big", h.keys())

    def test_striped_over_two_directories(self):
        dirs = [os.path.join(self.dir, "a"), os.path.join(self.dir, "b")]
        for d in dirs:
            os.mkdir(d)
        t = torch.randn(4 * MiB)
        with SwapHandle(dirs, capacity_bytes=32 * MiB, block_size=MiB) as h:
            self.assertEqual(h.info()["file_count"], 2)
            h.pwrite(t, "t")
            self.assertTrue(torch.equal(h.pread(torch.empty_like(t), "t"), t))

    def test_missing_directory(self):
        missing = os.path.join(self.dir, "no-such-dir")
        with self.assertRaises(zinf.InvalidArgumentError) as ctx:
            SwapHandle(missing, capacity_bytes=MiB)
        self.assertIsInstance(ctx.exception, ValueError)
        self.assertIn(missing, str(ctx.exception))
        self.assertIn("does not exist", str(ctx.exception))

    def test_read_only_directory(self):
        ro = os.path.join(self.dir, "ro")
        os.mkdir(ro)
        if os.geteuid() == 0:
            # Root ignores permission bits: only a read-only mount is an honest test.
            mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", ro],
                                     capture_output=True, text=True)
            if mounted.returncode != 0:
                self.skipTest(f"no read-only file system to test with: {mounted.stderr.strip()}")
            self.addCleanup(subprocess.run, ["umount", ro], capture_output=True)
            expected = "read-only"
        else:
            os.chmod(ro, 0o500)
            self.addCleanup(os.chmod, ro, 0o700)
            expected = "not writable"
        with self.assertRaises(zinf.FailedPreconditionError) as ctx:
            SwapHandle(ro, capacity_bytes=MiB)
        self.assertIn(ro, str(ctx.exception))
        self.assertIn(expected, str(ctx.exception))

    def test_too_little_space_says_how_much_is_needed(self):
        with self.assertRaises(zinf.ResourceExhaustedError) as ctx:
            SwapHandle(self.dir, capacity_bytes=1 << 60)
        self.assertIn("needs", str(ctx.exception))
        with SwapHandle(self.dir, capacity_bytes=MiB) as h:
            with self.assertRaises(zinf.ResourceExhaustedError):
                h.async_pwrite(torch.empty(MiB), "larger than the swap space")

    def test_wrong_size_and_unknown_keys(self):
        with SwapHandle(self.dir, capacity_bytes=8 * MiB) as h:
            h.pwrite(torch.randn(1000), "w")
            with self.assertRaisesRegex(ValueError, r"holds 4000 bytes; the tensor to read into "
                                                    r"has 3996"):
                h.async_pread(torch.empty(999), "w")
            with self.assertRaisesRegex(ValueError, "holds 4000 bytes; the tensor has 8000"):
                h.async_pwrite(torch.randn(1000, dtype=torch.float64), "w")
            with self.assertRaisesRegex(KeyError, "nothing was written under key 'nope'"):
                h.async_pread(torch.empty(1000), "nope")
            with self.assertRaisesRegex(ValueError, "contiguous"):
                h.async_pwrite(torch.randn(10, 10).t(), "t")
            with self.assertRaisesRegex(ValueError, "empty"):
                h.async_pwrite(torch.empty(0), "e")
        with self.assertRaisesRegex(ValueError, "capacity_bytes"):
            SwapHandle(self.dir, capacity_bytes=0)
        with self.assertRaises(zinf.InvalidArgumentError) as ctx:
            SwapHandle(self.dir, capacity_bytes=MiB, queue_depth=0)
        self.assertIn("queue_depth", str(ctx.exception))

    def test_corrupt_swap_file_is_a_data_loss_error(self):
        t = torch.randn(MiB // 4)  # 1 MiB
        with SwapHandle(self.dir, capacity_bytes=4 * MiB) as h:
            h.pwrite(t, "victim")
            fds = swap_file_descriptors(self.dir)
            self.assertEqual(len(fds), 1, "expected one swap file")
            # Flip bytes in the middle of what was written, behind zinf's back.
            with open(f"/proc/self/fd/{fds[0]}", "r+b", buffering=0) as f:
                f.seek(8192)
                old = f.read(16)
                f.seek(8192)
                f.write(bytes(b ^ 0xFF for b in old))
                os.fsync(f.fileno())
            out = torch.empty_like(t)
            request = h.async_pread(out, "victim")
            with self.assertRaises(zinf.DataLossError) as ctx:
                request.wait()
            self.assertIn("victim", str(ctx.exception))
            self.assertIn("checksum", str(ctx.exception))
            with self.assertRaises(zinf.DataLossError):
                h.wait()  # the handle reports it too


if __name__ == "__main__":
    unittest.main()
