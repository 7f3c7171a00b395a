"""Checks of the tensors handed to zinf: a bad one raises a ValueError naming it."""

import torch

_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def dtype_name(dtype):
    return _DTYPE_NAMES.get(dtype)


def check_cpu_tensor(tensor, what, dtypes=(torch.float32,)):
    """Raises ValueError unless `tensor` is a contiguous CPU tensor of one of `dtypes`."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.device.type != "cpu":
        raise ValueError(f"{what} must be on the CPU, got a tensor on {tensor.device}")
    if tensor.dtype not in dtypes:
        allowed = ", ".join(str(d) for d in dtypes)
        raise ValueError(f"{what} must be {allowed}, got {tensor.dtype}")
    if tensor.layout is not torch.strided:
        raise ValueError(f"{what} must be dense, got layout {tensor.layout}")
    if not tensor.is_contiguous():
        raise ValueError(f"{what} must be contiguous (call .contiguous() first)")
