"""DeepSpeed's monitors for zinf.initialize's engine: the config's ``csv_monitor`` and
``tensorboard`` blocks write what DeepSpeed's write, on rank 0, at each optimizer step.

    "csv_monitor": {"enabled": true, "output_path": "logs/", "job_name": "run1"}

writes ``logs/run1/Train_Samples_train_loss.csv``, ``Train_Samples_lr.csv`` (and
``Train_Samples_loss_scale.csv`` under fp16): a ``step,<name>`` header, then one ``samples,value``
row per optimizer step, where samples counts the training samples seen (DeepSpeed's
global_samples). train_loss is the batch's loss on rank 0 (the mean of its micro-batches'
losses), at the samples seen before the batch; lr is the learning rate of the next step and
loss_scale the next scale, at the samples after it: DeepSpeed's rows. ``tensorboard`` writes the
same scalars with ``torch.utils.tensorboard.SummaryWriter`` under ``output_path/job_name``; it
needs the ``tensorboard`` package.
"""

import csv
import os

__all__ = ["from_config", "Monitors", "CsvMonitor", "TensorBoardMonitor"]

_DEFAULT_JOB = "DeepSpeedJobName"


def from_config(blocks):
    """The monitors the config's {"csv_monitor": {...}, "tensorboard": {...}} blocks enable,
    not yet opened; ValueError for a key DeepSpeed's blocks do not have."""
    enabled = []
    for key, kind in (("csv_monitor", CsvMonitor), ("tensorboard", TensorBoardMonitor)):
        block = blocks.get(key)
        if block is None:
            continue
        if not isinstance(block, dict):
            raise ValueError(f"config key '{key}' must be an object, got {block!r}")
        unknown = sorted(set(block) - {"enabled", "output_path", "job_name"})
        if unknown:
            raise ValueError(f"config key '{key}' has unknown key(s) {unknown}; it takes "
                             f"enabled, output_path and job_name")
        if block.get("enabled", False):
            if kind is TensorBoardMonitor:
                kind.summary_writer_class()  # missing, it fails before the engine is made
            path = block.get("output_path", "")
            _check_writable(key, path)  # before the engine takes the model over
            enabled.append((kind, path, block.get("job_name", _DEFAULT_JOB)))
    return Monitors(enabled)


def _check_writable(key, path):
    """ValueError naming the key when `path` cannot be made or written."""
    if not isinstance(path, str):
        raise ValueError(f"config key '{key}.output_path' must be a string, got {path!r}")
    existing = os.path.abspath(path or ".")
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing) or not os.access(existing, os.W_OK | os.X_OK):
        what = "is not a directory" if not os.path.isdir(existing) else "cannot be written"
        raise ValueError(f"config key '{key}.output_path' is {path!r}, and {existing!r} {what}: "
                         f"give a directory this process can write")


class Monitors:
    """The enabled monitors, written together; only rank 0's write, as DeepSpeed's."""

    def __init__(self, enabled):
        self._enabled = enabled  # [(class, output_path, job_name)]
        self.monitors = []

    def open(self, rank):
        """Creates the output directories and writers (rank 0); returns self."""
        if rank == 0:
            for kind, path, job in self._enabled:
                try:
                    self.monitors.append(kind(path, job))
                except OSError as e:
                    raise ValueError(f"the {kind.__name__}'s output_path {path!r} (job {job!r}) "
                                     f"cannot be written: {e}") from e
        return self

    def write_step(self, engine, summary, samples_before, batch_loss):
        """The events of one optimizer step, as DeepSpeed's engine writes them."""
        if not self.monitors:
            return
        events = [("Train/Samples/train_loss", batch_loss, samples_before),
                  ("Train/Samples/lr", engine.get_lr()[0], engine.global_samples)]
        if engine.fp16_enabled():  # DeepSpeed writes the next step's scale
            events.append(("Train/Samples/loss_scale", summary["loss_scale"],
                           engine.global_samples))
        for m in self.monitors:
            m.write_events(events)


class CsvMonitor:
    """DeepSpeed's csvMonitor: one CSV file per event name under output_path/job_name."""

    def __init__(self, output_path, job_name):
        self.log_dir = os.path.join(output_path, job_name)
        os.makedirs(self.log_dir, exist_ok=True)
        self._started = set()

    def write_events(self, events):
        for name, value, step in events:
            filename = name.replace("/", "_").replace(" ", "_")
            with open(os.path.join(self.log_dir, filename + ".csv"), "a+", newline="") as f:
                writer = csv.writer(f)
                if filename not in self._started:
                    self._started.add(filename)
                    writer.writerow(["step", name.split("/")[-1]])
                writer.writerow([step, value])


class TensorBoardMonitor:
    """DeepSpeed's TensorBoardMonitor: add_scalar(name, value, samples), flushed each step."""

    def __init__(self, output_path, job_name):
        log_dir = os.path.join(output_path, job_name)
        os.makedirs(log_dir, exist_ok=True)
        self.writer = self.summary_writer_class()(log_dir=log_dir)

    @staticmethod
    def summary_writer_class():
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise ImportError(f"config key 'tensorboard' is enabled but TensorBoard cannot be "
                              f"imported ({e}); pip install tensorboard") from e
        return SummaryWriter

    def write_events(self, events):
        for name, value, step in events:
            self.writer.add_scalar(name, value, step)
        self.writer.flush()
