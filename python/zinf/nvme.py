"""Asynchronous tensor reads and writes to NVMe swap files (zinf's swap store).

``SwapHandle`` owns preallocated swap files in one or more directories (striped over them),
written and read with io_uring and O_DIRECT where the file system allows, each piece
CRC32C-checked on read by default. Tensors are stored under keys::

    h = zinf.nvme.SwapHandle("/mnt/nvme", capacity_bytes=8 << 30)
    w = h.async_pwrite(tensor, "layer0.weight")     # returns at once
    w.wait()                                        # the bytes are on the device
    r = h.async_pread(out, "layer0.weight")         # `out` must have the same nbytes
    r.wait()

A request holds its tensor until it is done: a written tensor must not change, nor a read one
be used, before ``wait()`` returns. The swap files are unlinked as soon as they are open, so
nothing outlives the process. Tensors must be contiguous CPU tensors of any dtype. Page-aligned
ones (e.g. ``torch.empty(..., pin_memory=True)`` on a CUDA build) go to disk without a copy;
others (torch's allocator aligns even large tensors only to 64 bytes) are copied a block at a
time through the handle's own aligned memory, beside the I/O of the other blocks.

Errors raise zinf exceptions naming the problem: a missing directory (InvalidArgumentError, a
ValueError), a read-only one (FailedPreconditionError), too little space (ResourceExhaustedError,
saying how much is needed), a corrupt file (DataLossError from ``wait()``, naming the tensor, the
file and the offset), a tensor of the wrong size (ValueError).
"""

import json
import os

import torch

from zinf import _zinf
from zinf._errors import check_cpu_tensor

__all__ = ["SwapHandle", "Request"]


class Request:
    """One asynchronous read or write; ``wait()`` blocks until it is done."""

    def __init__(self, completion, tensor, key, kind):
        # Set first, so released first: dropping the completion waits for the I/O, and only
        # then may the tensor's memory go.
        self._completion = completion
        self.tensor = tensor
        self.key = key
        self.kind = kind  # "read" or "write"

    def wait(self):
        """Blocks until done and returns the tensor; raises the operation's error if it failed."""
        self._completion.wait()
        return self.tensor

    def done(self):
        """True when finished (raises the operation's error if it failed); does not block."""
        return self._completion.done()


class SwapHandle:
    """Swap files on NVMe that tensors are written to and read from asynchronously.

    path: a directory, or a list of directories to stripe over (each must exist and be
        writable). capacity_bytes: swap space across them, preallocated at once.
    block_size, queue_depth, thread_count, single_submit: DeepSpeed's "aio" keys; backend
        ("auto", "io_uring", "posix") and direct_io ("auto", "on", "off"): zinf's. None keeps
        zinf's defaults (1 MiB pieces, 8 in flight).
    checksum: CRC32C per piece, verified on read. rank: names the files when several processes
        share a directory.
    """

    def __init__(self, path, capacity_bytes, *, block_size=None, queue_depth=None,
                 thread_count=None, single_submit=None, backend=None, direct_io=None,
                 checksum=True, rank=0):
        if isinstance(path, (str, bytes, os.PathLike)):
            paths = [os.fsdecode(path)]
        else:
            paths = [os.fsdecode(p) for p in path]
        if not paths:
            raise ValueError("SwapHandle needs at least one directory")
        if int(capacity_bytes) <= 0:
            raise ValueError(f"capacity_bytes must be > 0, got {capacity_bytes}")
        aio = {k: v for k, v in dict(block_size=block_size, queue_depth=queue_depth,
                                     thread_count=thread_count, single_submit=single_submit,
                                     backend=backend, direct_io=direct_io).items()
               if v is not None}
        self._store = _zinf.SwapStore(paths, int(capacity_bytes),
                                      aio_json=json.dumps(aio) if aio else None, rank=int(rank),
                                      checksum=bool(checksum))
        self.paths = paths
        self._extents = {}    # key -> (extent id, size in bytes)
        self._pending = []    # requests not yet waited for by wait()

    # -- tensors by key ---------------------------------------------------------------------

    def async_pwrite(self, tensor, key):
        """Starts writing `tensor` under `key`; returns a Request. The first write of a key
        reserves its space; later writes of it must have the same number of bytes."""
        check_cpu_tensor(tensor, "tensor", dtypes=_ANY_DTYPE)
        nbytes = tensor.numel() * tensor.element_size()
        if nbytes == 0:
            raise ValueError(f"tensor for key {key!r} is empty")
        extent = self._extents.get(key)
        if extent is None:
            extent = self._store.allocate(nbytes, str(key))
            self._extents[key] = extent
        elif extent[1] != nbytes:
            raise ValueError(f"key {key!r} holds {extent[1]} bytes; the tensor has {nbytes} "
                             f"(free(key) first to store a different size)")
        return self._track(Request(self._store.write_async(extent[0], extent[1],
                                                           tensor.data_ptr()),
                                   tensor, key, "write"))

    def async_pread(self, tensor, key):
        """Starts reading the bytes stored under `key` into `tensor` (the same nbytes)."""
        check_cpu_tensor(tensor, "tensor", dtypes=_ANY_DTYPE)
        extent = self._extents.get(key)
        if extent is None:
            raise KeyError(f"nothing was written under key {key!r}")
        nbytes = tensor.numel() * tensor.element_size()
        if nbytes != extent[1]:
            raise ValueError(f"key {key!r} holds {extent[1]} bytes; the tensor to read into has "
                             f"{nbytes} ({tuple(tensor.shape)} {tensor.dtype})")
        return self._track(Request(self._store.read_async(extent[0], extent[1],
                                                          tensor.data_ptr()),
                                   tensor, key, "read"))

    def pwrite(self, tensor, key):
        """Writes `tensor` under `key` and waits."""
        return self.async_pwrite(tensor, key).wait()

    def pread(self, tensor, key):
        """Reads `key` into `tensor` and waits; returns `tensor`."""
        return self.async_pread(tensor, key).wait()

    def wait(self):
        """Waits for every request started on this handle; returns how many were still
        unfinished when last checked. Raises the first error after all have finished."""
        pending, self._pending = self._pending, []
        first_error = None
        for request in pending:
            try:
                request.wait()
            except _zinf.ZinfError as e:
                first_error = first_error or e
        if first_error is not None:
            raise first_error
        return len(pending)

    def free(self, key):
        """Returns the space of `key` (no request on it may be in flight)."""
        extent = self._extents.pop(key, None)
        if extent is None:
            raise KeyError(f"nothing was written under key {key!r}")
        self._store.free(extent[0], extent[1])

    def keys(self):
        return list(self._extents)

    def nbytes(self, key):
        return self._extents[key][1]

    def info(self):
        """capacity_bytes, free_bytes, file_bytes, stripe_bytes, file_count, direct_io."""
        return self._store.info()

    def close(self):
        """Waits for outstanding I/O and closes the swap files."""
        self._pending = []
        self._store.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _track(self, request):
        # Requests already waited for are dropped, so the list stays short.
        self._pending = [r for r in self._pending if not _finished(r)]
        self._pending.append(request)
        return request


def _finished(request):
    try:
        return request.done()
    except _zinf.ZinfError:
        return False  # keep it: wait() reports the error


_ANY_DTYPE = tuple(d for d in (torch.float32, torch.float64, torch.float16, torch.bfloat16,
                               torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64,
                               torch.bool))
