"""The process heap under zinf's Python side (Note [Heap growth]).

Note [Heap growth]
A zinf engine driven from Python makes and frees large tensors all through a step: the
gradients autograd hands over, a module's worth at a time, and the activations. (Fetched
parameters were such tensors too, copied at every fetch in forward and in backward, until
torch computed on the engine's memory: Note [The engine's memory] in zinf/_device_memory.py.)
glibc serves an allocation of at least its mmap threshold with a mapping of its
own, returned to the system when freed, but it raises that threshold to the size of every
such block freed (up to 32 MiB), so from the second fetch on the same tensors come from the
heap, and a new aligned block of the same size seldom fits the hole the last one left: the
resident memory of a 512 MiB model on NVMe grew from 0.9 to 1.5 GiB over 3 steps and kept
growing, where with the threshold fixed it stays at 0.9 GiB for a 256 MiB model and for a
1 GiB one alike (bench/RESULTS.md). So where memory is what binds, the threshold is fixed at
4 MiB (no heap use for a block that large, and no threshold growth): from zinf.zero.Init on
(a model built not to be whole in memory) and for an engine whose parameters live on NVMe
and whose model is large against the machine (below);
unless the user set MALLOC_MMAP_THRESHOLD_ (glibc's own variable, which wins). The price:
each such tensor's pages are faulted in anew, 17-20 ms per 16 MiB tensor here against 2-3 ms
from the heap, which made a step of the 512 MiB model on NVMe 15-35% slower while fetches were
copies (torch computing on the engine's memory made a bounded step 1.07x faster,
bench/RESULTS.md); so an engine with its parameters in memory (which holds the model anyway)
keeps glibc's behaviour.
Memory binds where the model is large against the machine: the fixed threshold's gain was
the growth it stops (about twice the model over three steps, at 512 MiB), its price every
tensor of 4 MiB or more faulted in anew, a GPT-2's activations at width 256 and 1024 tokens a
micro-batch among them: such a model of 13 MB on NVMe trained 1.4x slower for it
(bench/RESULTS.md). So an engine over a model smaller than 1/16 of the host's memory (or of
its cgroup's limit) keeps glibc's behaviour with its parameters on NVMe too (memory_binds).
The smaller tensors of a step (biases, norms, activations, all under the threshold) still come
from the heap, and free pages between live blocks stay with the process: glibc trims only the
heap's top. A Hugging Face GPT-2 (width 1024) on NVMe held 1471, 1771 and 2008 MiB after its
second step at 11, 33 and 44 blocks. So where the threshold is fixed, every step ends by giving
those pages back (malloc_trim, tens of milliseconds against a step of seconds): 1332, 1335 and
1400 MiB (bench/RESULTS.md)."""

import ctypes
import json
import os

_M_MMAP_THRESHOLD = -3  # glibc's malloc.h
_THRESHOLD_BYTES = 4 << 20


def _glibc():
    try:
        libc = ctypes.CDLL(None)
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


_libc = _glibc()
_bounded = False


def bound_heap_growth():
    """Fixes glibc's mmap threshold (Note [Heap growth]), once per process; a no-op without
    glibc or where the user set MALLOC_MMAP_THRESHOLD_."""
    global _bounded
    if _bounded or _libc is None or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return
    _libc.mallopt(_M_MMAP_THRESHOLD, _THRESHOLD_BYTES)
    _bounded = True


def parameters_on_nvme(config_json):
    """Whether a config (JSON text) puts the parameters on NVMe."""
    try:
        zero = json.loads(config_json).get("zero_optimization") or {}
        return (zero.get("offload_param") or {}).get("device") == "nvme"
    except (ValueError, AttributeError):
        return False  # the engine reports a bad config itself


# Note [Heap growth]: an engine over a model of at least this share of memory bounds the heap.
_MODEL_SHARE_OF_MEMORY = 1 / 16


def host_memory_bytes():
    """This machine's physical memory, or its cgroup's limit where that is lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        if limit != "max":
            total = min(total, int(limit))
    except (OSError, ValueError):
        pass
    return total


def memory_binds(config_json, model_bytes, memory_bytes=None):
    """Whether an engine over a model of `model_bytes` (its trainable parameters, as built)
    bounds the heap: its parameters on NVMe and the model at least 1/16 of `memory_bytes`
    (default: host_memory_bytes()). Note [Heap growth]."""
    if not parameters_on_nvme(config_json):
        return False
    memory = host_memory_bytes() if memory_bytes is None else memory_bytes
    return model_bytes >= memory * _MODEL_SHARE_OF_MEMORY


def return_freed_memory():
    """Gives the heap's free pages back to the system (glibc's malloc_trim)."""
    if _libc is not None:
        _libc.malloc_trim(0)


def after_step():
    """The end of a training step: where the heap is bounded, its free pages go back to the
    system (Note [Heap growth])."""
    if _bounded:
        return_freed_memory()
