"""zinf for PyTorch trainers.

- ``zinf.optim``: AdamW, Adam, Adagrad and Lion as ``torch.optim.Optimizer``s stepping CPU
  fp32 parameters with zinf's vectorized, threaded kernels.
- ``zinf.nvme``: ``SwapHandle``, asynchronous tensor reads and writes to NVMe swap files.
- ``zinf.zero``: ``initialize(model, config)`` runs an ``nn.Module`` under zinf's ZeRO-3
  engine (parameters sharded across ranks, on the CPU or on NVMe).
- ``zinf.cuda``: PyTorch's pluggable CUDA allocator backed by zinf's device pool.
- ``zinf.initialize(model=, config=, ...)``: DeepSpeed's ``deepspeed.initialize`` on that
  engine (``zinf.engine``), returning (engine, optimizer, dataloader, lr_scheduler);
  ``zinf.add_config_arguments(parser)`` and ``zinf.init_distributed()`` as DeepSpeed's.

zinf's log lines go to Python's ``logging``, logger ``"zinf"`` (``zinf._logging``).

Errors from zinf raise ``zinf.ZinfError`` subclasses named after the status code
(``InvalidArgumentError`` is also a ``ValueError``, ``IoError`` an ``OSError``), with zinf's
message.
"""

from zinf._version import __version__  # noqa: F401  (written by python/CMakeLists.txt)
from zinf._zinf import (  # noqa: F401
    CancelledError,
    DataLossError,
    DeadlineExceededError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    IoError,
    ResourceExhaustedError,
    UnavailableError,
    ZinfError,
    supported_isas,
)
from zinf import _logging  # noqa: F401  (zinf's log lines go to the "zinf" logger from here on)

__all__ = [
    "ZinfError", "InvalidArgumentError", "FailedPreconditionError", "ResourceExhaustedError",
    "UnavailableError", "IoError", "DataLossError", "CancelledError", "DeadlineExceededError",
    "InternalError", "supported_isas", "optim", "nvme", "zero", "cuda", "engine", "monitor",
    "initialize", "init_distributed", "add_config_arguments", "ParameterNotGatheredError",
]


def __getattr__(name):
    # The submodules import torch; load them on first use so that `import zinf` does not.
    import importlib
    if name in ("optim", "nvme", "zero", "cuda", "engine", "monitor"):
        return importlib.import_module("zinf." + name)
    if name in ("initialize", "init_distributed", "add_config_arguments"):
        return getattr(importlib.import_module("zinf.engine"), name)
    if name == "ParameterNotGatheredError":
        return importlib.import_module("zinf._unreadable").ParameterNotGatheredError
    raise AttributeError(f"module 'zinf' has no attribute {name!r}")
