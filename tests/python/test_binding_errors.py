"""Every binding of zinf._zinf that fails raises the exception class of zinf's status code with
zinf's own text, and loses nothing doing so: no message is leaked.

Note [Bindings under the leak checker]
The binding once read a C ABI call's `err` before the call wrote it (argument evaluation order
is unspecified): users saw "ResourceExhausted: no message" and the real message leaked. The
messages are checked in every build. In the sanitizer build (the asan preset) this module is
the one Python test that runs: CTest preloads ASan's and UBSan's runtimes into the interpreter
(PYTHONMALLOC=malloc, so every Python object is a malloc block LeakSanitizer can see) with the
leak check at exit off, since the interpreter's own teardown leaves blocks behind. Instead
test_failed_calls_leak_nothing asks LeakSanitizer for a report before and after thousands of
failing calls, in this process: a binding that drops a message adds one leaked block per call,
and no leaked block may come from zinf's code. The module needs no PyTorch (buffers are
ctypes arrays), because PyTorch is not instrumented. GCC 12's LeakSanitizer misreads the
dynamic TLS of a dlopened library's threads and dies in its thread scan ("Tracer caught signal
11"), so libzinf keeps no thread_local (a pthread key instead: src/core/thread_name.cc).
"""

import ctypes
import os
import re
import shutil
import tempfile
import unittest

import zinf
from zinf import _zinf

MiB = 1 << 20
CONFIG = ('{"train_micro_batch_size_per_gpu": 1,'
          ' "optimizer": {"type": "AdamW", "params": {"lr": 0.001}}}')


def leak_checker():
    """LeakSanitizer's recoverable check when its runtime is loaded, else None."""
    try:
        return ctypes.CDLL(None).__lsan_do_recoverable_leak_check
    except AttributeError:
        return None


def leaked_allocations(check, scratch):
    """How many allocations LeakSanitizer finds unreachable now, and its report. The report
    goes to stderr, so descriptor 2 points at a file while it runs."""
    path = os.path.join(scratch, "lsan-report.txt")
    saved = os.dup(2)
    try:
        with open(path, "w") as f:
            os.dup2(f.fileno(), 2)
            check()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    with open(path) as f:
        report = f.read()
    found = re.search(r"leaked in (\d+) allocation", report)
    return (int(found.group(1)) if found else 0), report


class BindingErrorsTest(unittest.TestCase):
    def setUp(self):
        # Under the build tree (a real disk, where O_DIRECT works), not a tmpfs /tmp.
        base = os.environ.get("ZINF_BUILD_DIR") or None
        self.dir = tempfile.mkdtemp(prefix="zinf-binding-test-", dir=base)
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        self.buffer = (ctypes.c_float * 1024)()
        self.store = _zinf.SwapStore([self.dir], MiB)
        self.addCleanup(self.store.close)
        self.engine = _zinf.Engine(CONFIG)
        self.engine.register_module("m", [("w", [2, 3])])
        self.engine.initialize()
        self.optimizer = _zinf.CpuOptimizer(1)

    def failing_calls(self):
        """(call, exception class, zinf's text) for a failure of each binding: the swap store
        and its completions (through the C ABI), the engine and the CPU optimizer."""
        address = ctypes.addressof(self.buffer)
        store, engine, optimizer = self.store, self.engine, self.optimizer
        return [
            (lambda: _zinf.SwapStore([self.dir], MiB, aio_json="{"), zinf.InvalidArgumentError,
             "aio_json is not valid JSON"),
            (lambda: store.allocate(4 * MiB, "big"), zinf.ResourceExhaustedError,
             "tensor 'big' (4194304 bytes) in a swap store of capacity 1.00 MiB"),
            (lambda: store.free(12345, 4096), ValueError, "extent id 12345: no such extent"),
            (lambda: store.write_async(12345, 4096, address).wait(), ValueError,
             "writing swap extent id 12345 (4096 bytes)"),
            (lambda: store.read_async(12345, 4096, address).done(), ValueError,
             "reading swap extent id 12345 (4096 bytes)"),
            (lambda: store.write_async(1, 4096, 0), ValueError, "source is a null pointer"),
            (lambda: _zinf.Engine("{"), zinf.InvalidArgumentError, "config is not valid JSON"),
            (lambda: _zinf.Engine('{"zero_optimization": {"stage": 7}}'),
             zinf.InvalidArgumentError, "'zero_optimization.stage' must be in [0, 3], got 7"),
            (lambda: _zinf.Engine(CONFIG, trainer={"bogus": 1}), zinf.InvalidArgumentError,
             "trainer value 'bogus' is not one zinf knows"),
            (lambda: engine.fetch(7), zinf.InvalidArgumentError,
             "module id 7 is not registered (have 1)"),
            (lambda: engine.gather_parameter("nope"), zinf.InvalidArgumentError,
             "no parameter 'nope'"),
            (lambda: engine.load_checkpoint(os.path.join(self.dir, "none")),
             zinf.InvalidArgumentError, "is not a zinf checkpoint"),
            (lambda: engine.get_buffer("nope", 0, 0), zinf.InvalidArgumentError,
             "no buffer 'nope' was set"),
            (lambda: engine.set_learning_rate(-1), zinf.InvalidArgumentError,
             "lr must be a finite number >= 0, got -1"),
            (lambda: _zinf.CpuOptimizer(1, "sse9"), zinf.InvalidArgumentError,
             "isa must be auto, scalar, avx2 or avx512, got sse9"),
            (lambda: optimizer.grad_stats(0, "float32", 4), zinf.InvalidArgumentError,
             "grads is a null pointer"),
            (lambda: _zinf.set_log_level("loud"), zinf.InvalidArgumentError,
             "log level must be trace, debug, info, warning, error or off, got 'loud'"),
        ]

    def test_every_failure_carries_zinfs_text(self):
        for call, kind, text in self.failing_calls():
            with self.subTest(text=text):
                with self.assertRaises(kind) as ctx:
                    call()
                message = str(ctx.exception)
                self.assertNotIn("no message", message)
                self.assertIn(text, message)

    def test_a_closed_store_says_so(self):
        self.store.close()
        for call in (self.store.check_status, self.store.info,
                     lambda: self.store.allocate(4096, "x")):
            with self.assertRaisesRegex(zinf.ZinfError, "closed"):
                call()

    def test_failed_calls_leak_nothing(self):
        check = leak_checker()
        if check is None:
            self.skipTest("LeakSanitizer is not loaded: the sanitizer build (asan preset) runs "
                          "this with its runtime preloaded")
        calls = self.failing_calls()

        def fail_every_call(times):
            for _ in range(times):
                for call, kind, _ in calls:
                    try:
                        call()
                    except kind:
                        pass

        fail_every_call(3)  # the interpreter's and pybind11's one-time allocations first
        before, _ = leaked_allocations(check, self.dir)
        rounds = 300
        fail_every_call(rounds)
        after, report = leaked_allocations(check, self.dir)
        # A binding that drops a message leaks a block per failing call: thousands here. The
        # interpreter itself holds a block or two in ways the checker cannot follow, so the
        # count may move by a few, but no leaked block may have been allocated in zinf's code.
        self.assertLess(after - before, rounds // 10, "failing calls leak:\n" + report[-4000:])
        for leak in report.split("leak of ")[1:]:
            self.assertNotRegex(leak, r"libzinf|_zinf\.", "zinf's code leaked:\n" + leak)


if __name__ == "__main__":
    unittest.main()
