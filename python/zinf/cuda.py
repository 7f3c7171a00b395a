"""PyTorch's CUDA memory allocator backed by zinf's device pool.

    import zinf.cuda
    zinf.cuda.use_as_allocator()       # before anything allocates CUDA memory
    x = torch.randn(1 << 20, device="cuda")

The pool (offload/memory_pool.h over zinf's CudaDevice) carves large arenas (1 GiB by default,
made as needed) best-fit with coalescing, rounded only to 256 bytes, under a byte budget (by
default 90% of the GPU's free memory when first used); a freed block returns to the pool only
once the work queued on its stream has run (Note [Stream-ordered frees] in
python/csrc/cuda_allocator.cc). An allocation beyond the budget raises a RuntimeError naming
the pool, what is in use and the request.

It needs zinf built with CUDA (nvcc found), a PyTorch with CUDA and
torch.cuda.memory.CUDAPluggableAllocator (2.0 or later), and a GPU; ``unavailable_reason()``
says which is missing.
"""

import ctypes
import os

import torch

from zinf import _zinf

__all__ = ["library_path", "probe", "unavailable_reason", "pluggable_allocator", "use_as_allocator",
           "stats"]

_LIBRARY = "libzinf_torch_allocator.so"
_lib = None


def library_path():
    """The allocator's shared library (next to this module), or None when zinf was built
    without CUDA."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), _LIBRARY)
    return path if os.path.exists(path) else None


def _load():
    global _lib
    if _lib is None:
        path = library_path()
        if path is None:
            raise _zinf.UnavailableError(f"zinf was built without CUDA: no {_LIBRARY}")
        lib = ctypes.CDLL(path)
        lib.zinf_torch_allocator_last_error.restype = ctypes.c_char_p
        lib.zinf_torch_allocator_configure.argtypes = [ctypes.c_uint64, ctypes.c_uint64]
        lib.zinf_torch_allocator_probe.argtypes = [ctypes.c_int]
        u64p = ctypes.POINTER(ctypes.c_uint64)
        lib.zinf_torch_allocator_stats.argtypes = [ctypes.c_int, u64p, u64p, u64p, u64p]
        _lib = lib
    return _lib


def _last_error(lib):
    return lib.zinf_torch_allocator_last_error().decode(errors="replace")


def probe(device=0):
    """None when zinf can open its pool on `device`, else the reason (no GPU, ...)."""
    lib = _load()
    if lib.zinf_torch_allocator_probe(int(device)) != 0:
        return _last_error(lib)
    return None


def unavailable_reason():
    """None when the allocator can be used here, else why not."""
    if library_path() is None:
        return f"zinf was built without CUDA (no {_LIBRARY})"
    if not hasattr(torch.cuda, "memory") or \
            not hasattr(torch.cuda.memory, "CUDAPluggableAllocator"):
        return (f"PyTorch {torch.__version__} has no torch.cuda.memory.CUDAPluggableAllocator "
                f"(PyTorch 2.0 or later)")
    if not torch.backends.cuda.is_built():
        return f"PyTorch {torch.__version__} was built without CUDA"
    if not torch.cuda.is_available():
        return "PyTorch sees no GPU (torch.cuda.is_available() is False)"
    # Not torch.cuda.current_device(): that initializes PyTorch's own allocator, after which
    # PyTorch refuses to swap it ("Can't swap an already initialized allocator").
    return probe(0)


def pluggable_allocator(budget_bytes=0, arena_bytes=0):
    """A torch.cuda.memory.CUDAPluggableAllocator on zinf's pool. budget_bytes: what the pool
    may hand out per device (0: 90% of free memory); arena_bytes: arena size (0: 1 GiB).
    Raises zinf.UnavailableError saying why when it cannot be used here."""
    reason = unavailable_reason()
    if reason is not None:
        raise _zinf.UnavailableError(reason)
    lib = _load()
    if lib.zinf_torch_allocator_configure(int(budget_bytes), int(arena_bytes)) != 0:
        raise _zinf.FailedPreconditionError(_last_error(lib))
    return torch.cuda.memory.CUDAPluggableAllocator(library_path(), "zinf_torch_malloc",
                                                    "zinf_torch_free")


def use_as_allocator(budget_bytes=0, arena_bytes=0):
    """Makes zinf's pool PyTorch's CUDA allocator; call before the first CUDA allocation
    (PyTorch refuses a change afterwards)."""
    allocator = pluggable_allocator(budget_bytes, arena_bytes)
    torch.cuda.memory.change_current_allocator(allocator)
    return allocator


def stats(device=0):
    """{in_use_bytes, peak_bytes, parked_bytes, arena_bytes} of the pool on `device`."""
    lib = _load()
    values = [ctypes.c_uint64() for _ in range(4)]
    if lib.zinf_torch_allocator_stats(int(device), *[ctypes.byref(v) for v in values]) != 0:
        raise _zinf.FailedPreconditionError(_last_error(lib))
    return dict(zip(("in_use_bytes", "peak_bytes", "parked_bytes", "arena_bytes"),
                    (v.value for v in values)))
