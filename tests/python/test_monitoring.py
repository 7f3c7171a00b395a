"""zinf's log lines go through Python's logging ("zinf" logger), from the Python thread and
from native worker threads (queued, never taking the GIL there: a worker that logs while the
Python thread waits for it holding the GIL does not deadlock), at the level the logger lets
through; at exit nothing is lost or crashes. The config's csv_monitor writes DeepSpeed's
files and rows; tensorboard where the package is installed."""

import csv
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

import torch

import initialize_train
import zinf
from zinf import _zinf

BUILD_DIR = os.environ.get("ZINF_BUILD_DIR", "")


def config(**extra):
    return {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
            "optimizer": {"type": "AdamW", "params": {"lr": 0.02}},
            "scheduler": {"type": "WarmupLR", "params": {
                "warmup_min_lr": 0.002, "warmup_max_lr": 0.02, "warmup_num_steps": 4,
                "warmup_type": "linear"}},
            "zero_optimization": {"stage": 3}, **extra}


def train(engine, loader):
    """The micro-batch losses; each step's (lr applied, samples before, samples after)."""
    losses, steps = [], []
    for batch in loader:
        lr, samples = engine.get_lr()[0], engine.global_samples
        loss = engine(batch)
        engine.backward(loss)
        if engine.step() is not None:
            steps.append((lr, samples, engine.global_samples))
        losses.append(loss.item())
    return losses, steps


class Captured(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)


class LoggingTest(unittest.TestCase):
    def setUp(self):
        self.logger = logging.getLogger("zinf")
        self.handler = Captured()
        self.logger.addHandler(self.handler)
        self.addCleanup(self.logger.removeHandler, self.handler)
        level = self.logger.level
        self.addCleanup(self.logger.setLevel, level)
        self.assertNotIn("ZINF_LOG_LEVEL", os.environ, "it would override the logger's level")

    def messages(self, level=logging.DEBUG):
        return [r.getMessage() for r in self.handler.records if r.levelno >= level]

    def test_engine_lines_are_records_of_the_zinf_logger(self):
        self.logger.setLevel(logging.INFO)
        zinf.initialize(model=initialize_train.Net(), config=config(steps_per_print=10))
        zinf._logging.flush()
        infos = [r for r in self.handler.records if r.levelno == logging.INFO]
        self.assertTrue(any(r.getMessage().startswith("batch: train_batch_size 8 = micro-batch 4")
                            for r in infos), self.messages())
        warned = [r.getMessage() for r in self.handler.records if r.levelno == logging.WARNING]
        self.assertTrue(any("steps_per_print" in m for m in warned), self.messages())
        self.assertTrue(all(r.name == "zinf" for r in self.handler.records))

    def test_the_loggers_level_is_the_cores_threshold(self):
        self.logger.setLevel(logging.ERROR)
        zinf.initialize(model=initialize_train.Net(), config=config(steps_per_print=10))
        zinf._logging.flush()
        self.assertEqual(_zinf.get_log_level(), "error")
        self.assertEqual(self.messages(), [])
        self.logger.setLevel(logging.DEBUG)
        zinf._logging.follow_logger_level()
        self.assertEqual(_zinf.get_log_level(), "debug")

    def test_a_worker_threads_line_arrives_without_deadlock(self):
        # The native thread is joined while this thread holds the GIL: a sink that took the
        # GIL would hang here (and the test time out).
        for i in range(3):
            _zinf.sink_from_worker_thread("warning", f"from a worker {i}")
        _zinf.sink_from_worker_thread("error", "and an error")
        # Delivered in order by the interpreter's pending call, which Python 3.11 notices when
        # this thread next takes the GIL back (every zinf call that waits releases it).
        time.sleep(0)
        self.assertEqual(self.messages(),
                         [f"from a worker {i}" for i in range(3)] + ["and an error"])
        self.assertEqual(self.handler.records[-1].levelno, logging.ERROR)

    def test_lines_reach_logging_configured_as_usual_and_exit_is_clean(self):
        script = textwrap.dedent("""
            import logging, sys
            logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                                format="%(name)s|%(levelname)s|%(message)s")
            sys.path.insert(0, sys.argv[1])
            import initialize_train, zinf
            from zinf import _zinf
            zinf.initialize(model=initialize_train.Net(), config={
                "train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3}})
            _zinf.sink_from_worker_thread("warning", "queued at exit")
        """)
        done = subprocess.run([sys.executable, "-c", script,
                               os.path.dirname(os.path.abspath(__file__))],
                              capture_output=True, text=True, timeout=120)
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        self.assertIn("zinf|INFO|batch: train_batch_size 2", done.stdout)
        self.assertIn("zinf|WARNING|queued at exit", done.stdout)
        self.assertNotIn("[zinf]", done.stderr)  # nothing bypassed logging


class MonitorTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="zinf-monitor-test-", dir=BUILD_DIR or None)
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)

    def read_csv(self, name):
        with open(os.path.join(self.dir, "job", name), newline="") as f:
            return list(csv.reader(f))

    def train_with(self, monitor):
        """Trains 4 steps with the config's `monitor` block enabled, writing to DIR/job."""
        torch.manual_seed(0)
        engine, _, loader, _ = zinf.initialize(
            model=initialize_train.Net(), training_data=initialize_train.dataset(32),
            config=config(**{monitor: {"enabled": True, "output_path": self.dir,
                                       "job_name": "job"}}))
        return (engine, *train(engine, loader))

    def test_csv_monitor_writes_deepspeeds_files_and_rows(self):
        engine, losses, steps = self.train_with("csv_monitor")
        self.assertEqual(len(steps), 4)
        self.assertEqual(sorted(os.listdir(os.path.join(self.dir, "job"))),
                         ["Train_Samples_lr.csv", "Train_Samples_train_loss.csv"])
        lr_rows = self.read_csv("Train_Samples_lr.csv")
        self.assertEqual(lr_rows[0], ["step", "lr"])
        # lr: the next step's, at the samples seen after each step (DeepSpeed's get_lr()).
        next_lrs = [s[0] for s in steps[1:]] + [engine.get_lr()[0]]
        self.assertEqual(lr_rows[1:], [[str(s[2]), str(lr)] for s, lr in zip(steps, next_lrs)])
        loss_rows = self.read_csv("Train_Samples_train_loss.csv")
        self.assertEqual(loss_rows[0], ["step", "train_loss"])
        self.assertEqual([int(r[0]) for r in loss_rows[1:]], [s[1] for s in steps])
        for row, i in zip(loss_rows[1:], range(0, len(losses), 2)):
            self.assertAlmostEqual(float(row[1]), (losses[i] + losses[i + 1]) / 2, places=6)

    def test_a_disabled_monitor_writes_nothing_and_bad_keys_are_refused(self):
        zinf.initialize(model=initialize_train.Net(), config=config(
            csv_monitor={"enabled": False, "output_path": self.dir, "job_name": "job"}))
        self.assertEqual(os.listdir(self.dir), [])
        model = initialize_train.Net()
        with self.assertRaisesRegex(ValueError, "unknown key\\(s\\) \\['path'\\]"):
            zinf.initialize(model=model, config=config(
                csv_monitor={"enabled": True, "path": self.dir}))
        zinf.initialize(model=model, config=config())  # refused before it took the model

    def test_tensorboard_writes_the_same_scalars(self):
        try:
            from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
            from torch.utils.tensorboard import SummaryWriter  # noqa: F401
        except ImportError as e:
            self.skipTest(f"tensorboard is not installed for {sys.executable}: {e}")
        _, _, steps = self.train_with("tensorboard")
        events = EventAccumulator(os.path.join(self.dir, "job"))
        events.Reload()
        lr = events.Scalars("Train/Samples/lr")
        self.assertEqual([e.step for e in lr], [s[2] for s in steps])
        self.assertEqual(len(events.Scalars("Train/Samples/train_loss")), len(steps))


if __name__ == "__main__":
    unittest.main()
