"""Where zinf.zero's modules compute, and how the engine's tensors reach torch there: the
engine's own memory, on the host (HostMemory) and on a GPU (GpuMemory), never a copy.

Note [The engine's memory]
zinf.zero hands torch the engine's own memory: each gathered parameter, and each fp32
gradient buffer, is a torch tensor over it (on the host through the engine's memoryviews,
torch.frombuffer; on a GPU through __cuda_array_interface__). Torch keeps only a reference
to the view or wrapper, never ownership. A fetched parameter stays valid until its module's
Release; backward holds the module fetched from its first saved-tensor unpack to its
ReduceGradients, so a tensor autograd saved stays valid exactly as long as backward reads it.
A module's output that is a view of its parameters (it returns its weight, or a slice of it)
is copied before the release (zinf.zero's post-hook). Any other reference kept past the
release (a slice stored in an attribute) sees the memory reused: read parameters after
training through gather_parameters or consolidated_state_dict.
On the host this spares a copy of every parameter at each fetch, in forward and in backward:
a fresh tensor each time, whose pages the kernel faults in anew wherever the heap is bounded
(Note [Heap growth] in zinf/_heap.py). bench/RESULTS.md has the step times. Where a module's
memory stays where it was between fetches (its parameters in device memory, one rank; its
gradient buffers the accumulators themselves), the engine hands back the same views and the
tensors over them are the ones made before: a fetch makes no tensor.

Note [Where the model computes]
As DeepSpeed, the engine computes on this process's GPU wherever the model was built
(compute_device): on the GPU that holds the model's trainable parameters; else, for a model
built on the CPU or under zinf.zero.Init, on cuda:LOCAL_RANK when torch sees a GPU
(torch.cuda.set_device'd); else on the host. ``device="host"`` (the keyword, or the config's
``zinf.device``) keeps a CPU model on the CPU; ``"cuda"`` / ``"cuda:N"`` ask for a GPU and are
refused where there is none. A CPU-built model's trainable parameters go to the engine's shards
from where they are (host memory or Init's spill), never whole onto the GPU: that is what lets a
model larger than the GPU train, gathered module by module into the device tier
(zinf.device_budget bounds it; on the host device the same path runs within that budget, which
is how CI proves it). Buffers and frozen parameters are moved to the GPU, as DeepSpeed moves
the module.

Note [On a GPU]
The engine runs on the GPU that holds the model's parameters. Ordering goes through torch's
current stream, borrowed by the engine (Device::BorrowStream): the stream waits for the gather
before the module computes; Release and ReduceGradients record it, so the engine reuses a
parameter's memory, or reads a gradient, only after the work torch queued on it so far.
"""

import os

import torch

COMPUTE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def storage_ptr(tensor):
    """The address of the storage a tensor views: its first element's, less its offset (no
    storage object is made, which costs more than the rest of a small module's hooks)."""
    return tensor.data_ptr() - tensor.storage_offset() * tensor.element_size()


def copy_views(output, ptrs):
    """`output` (a module's forward output) with every tensor that views one of the storages
    at `ptrs` replaced by a copy, which autograd differentiates like the view; tensors in
    tuples, lists and dicts are looked at. The output itself where nothing in it is such a
    view."""
    if isinstance(output, torch.Tensor):
        return output.clone() if storage_ptr(output) in ptrs else output
    if isinstance(output, (list, tuple)):
        values = [copy_views(v, ptrs) for v in output]
        if all(new is old for new, old in zip(values, output)):
            return output
        if isinstance(output, list):
            return values
        return (type(output)(*values) if hasattr(output, "_fields")
                else type(output)(values))
    if isinstance(output, dict):  # in place: keeps its type (Hugging Face's ModelOutput)
        for k, v in output.items():
            new = copy_views(v, ptrs)
            if new is not v:
                output[k] = new
    return output


class HostMemory:
    """The engine's tensors on the host device: torch tensors over its memoryviews (Note
    [The engine's memory])."""

    def __init__(self, engine):
        self._engine = engine
        # Per module: (the engine's list of views, the tensors made over them). The engine
        # gives the same list again while the module's memory stays where it was (a module in
        # device memory, one rank), and its tensors are then made once, not at every fetch.
        self._params = {}
        self._grads = {}

    def fetch(self, mid, slots):
        """Fetches module `mid` and returns its parameters, valid until its release."""
        views = self._engine.fetch(mid)
        cached = self._params.get(mid)
        if cached is not None and cached[0] is views:
            return cached[1]
        try:
            tensors = [torch.frombuffer(v, dtype=torch.float32, count=s.numel).view(s.shape)
                       for v, s in zip(views, slots)]
        except BaseException:
            self._engine.release(mid)
            raise
        self._params[mid] = (views, tensors)
        return tensors

    def release(self, mid):
        self._engine.release(mid)

    def gradients(self, mid, slots, overwrite=False):
        """Module `mid`'s gradient buffers in its parameters' shapes, valid until its
        reduce: zeros, or with `overwrite` (the caller writes every element) as they are, not
        zeroed first."""
        views = self._engine.gradients(mid, overwrite)
        cached = self._grads.get(mid)
        if cached is None or cached[0] is not views:
            # None for a frozen parameter, which has no gradient.
            cached = self._grads[mid] = (views, [
                None if v is None else
                torch.frombuffer(v, dtype=torch.float32, count=s.numel).view(s.shape)
                for v, s in zip(views, slots)])
        return cached[1]

    def reduce(self, mid):
        self._engine.reduce_gradients(mid)


class GpuMemory:
    """The engine's tensors on a GPU, as torch CUDA tensors over its memory (Note [The
    engine's memory]), every call ordered with torch's current stream (Note [On a GPU])."""

    def __init__(self, engine, device):
        self._engine = engine
        self._device = device

    def _stream(self):
        return torch.cuda.current_stream(self._device).cuda_stream

    def _tensor(self, address, dtype, numel):
        typestr, view_as = _CUDA_ARRAY_TYPES[dtype]
        t = torch.as_tensor(_CudaArray(address, typestr, numel), device=self._device)
        return t.view(view_as) if view_as is not None else t

    def fetch(self, mid, slots):
        fetched = self._engine.fetch_on_stream(mid, self._stream())
        try:
            return [self._tensor(a, d, n).view(s.shape) for (a, d, n), s in zip(fetched, slots)]
        except BaseException:
            self._engine.release_on_stream(mid, self._stream())
            raise

    def release(self, mid):
        self._engine.release_on_stream(mid, self._stream())

    def gradients(self, mid, slots, overwrite=False):
        return [None if g is None else self._tensor(*g).view(s.shape)
                for g, s in zip(self._engine.gradients_on_device(mid, overwrite), slots)]

    def reduce(self, mid):
        self._engine.reduce_gradients_on_stream(mid, self._stream())


# The engine's dtype names: (__cuda_array_interface__'s typestr, the torch dtype to view it as).
# The interface has no bfloat16: its values travel as int16 and are reinterpreted, no copy.
_CUDA_ARRAY_TYPES = {"float32": ("<f4", None), "float16": ("<f2", None),
                     "bfloat16": ("<i2", torch.bfloat16)}


class _CudaArray:
    """Device memory as torch.as_tensor takes it without a copy."""
    __slots__ = ("__cuda_array_interface__",)

    def __init__(self, address, typestr, numel):
        self.__cuda_array_interface__ = {"data": (address, False), "shape": (numel,),
                                         "typestr": typestr, "version": 2}


def compute_device(model, requested=None):
    """Where the engine computes for `model` (Note [Where the model computes]): `requested`
    is None or "auto", "host" (or "cpu"), "cuda" or "cuda:N". ValueError naming both when the
    request and the model's device disagree, or a GPU is asked for where torch sees none."""
    on = model_device(model)
    requested = "auto" if requested is None else str(requested)
    if requested == "auto":
        if on.type == "cuda" or not torch.cuda.is_available():
            return on
        return _local_gpu(requested)
    if requested in ("host", "cpu"):
        if on.type != "cpu":
            raise ValueError(f"device {requested!r}, but the model's parameters are on {on}: "
                             f"move the model to the CPU first, or leave the device to zinf")
        return torch.device("cpu")
    try:
        device = torch.device(requested)
    except RuntimeError:
        device = None
    if device is None or device.type != "cuda":
        raise ValueError(f"device must be \"auto\", \"host\", \"cuda\" or \"cuda:N\", got "
                         f"{requested!r}")
    if not torch.cuda.is_available():
        raise ValueError(f"device {requested!r}, but PyTorch sees no GPU "
                         f"(torch.cuda.is_available() is False)")
    if device.index is None:
        device = _local_gpu(requested)
    if on.type == "cuda" and on != device:
        raise ValueError(f"device {requested!r}, but the model's parameters are on {on}")
    return device


def _local_gpu(requested):
    """cuda:LOCAL_RANK; ValueError when this node has fewer GPUs than that."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if local_rank >= torch.cuda.device_count():
        raise ValueError(
            f"device {requested!r}: this process is LOCAL_RANK {local_rank}, but torch sees "
            f"{torch.cuda.device_count()} GPU(s): launch one process per GPU, or pass "
            f"device=\"host\" (or the config's zinf.device) to train on the CPU")
    return torch.device("cuda", local_rank)


def model_device(model):
    """The one device of the model's trainable parameters (of all its parameters when it has
    nothing to train; the host's when it has no parameters: the engine then says so)."""
    devices = ({p.device for p in model.parameters() if p.requires_grad}
               or {p.device for p in model.parameters()})
    if len(devices) > 1:
        raise ValueError(f"the model's trainable parameters are on {len(devices)} devices "
                         f"({', '.join(sorted(map(str, devices)))}); zinf.zero trains a model on "
                         f"one: the CPU or one GPU")
    device = next(iter(devices), torch.device("cpu"))
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"the model's parameters are on {device}; zinf.zero trains on the CPU "
                         f"or a CUDA GPU")
    return device


def move_the_rest(model, device, dtype, slots):
    """Buffers and frozen parameters (those not in `slots`) to the compute device, and the
    floating ones to the compute dtype, as DeepSpeed moves and casts the whole module. New
    tensors, never in place, so that an undone takeover puts the old ones back."""
    def moved(t):
        want = dtype if t.is_floating_point() else t.dtype
        return t.to(device, want) if (t.device != device or t.dtype != want) else t
    with torch.no_grad():
        for sub in model.modules():
            for p in sub.parameters(recurse=False):
                if id(p) not in slots:
                    new = moved(p.data)
                    if new is not p.data:
                        p.data = new
            for name, buf in sub.named_buffers(recurse=False):
                if buf is not None:
                    sub._buffers[name] = moved(buf)
