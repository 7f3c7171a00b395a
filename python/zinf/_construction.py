"""zinf.zero.Init: a model built straight into the engine's shards, never whole in memory.

    with zinf.zero.Init(config_dict_or_path=ds_config):
        model = MyModel()                        # each module's values leave memory as built
    engine = zinf.zero.initialize(model, ds_config)

Note [Construction into shards]
The engine lays out its shards only once it knows every parameter (Engine::Initialize), and a
model's parameters are known only once it is built; its values exist earlier, one module at
a time, as each __init__ runs its own initialization. So under ``Init``:
- every ``nn.Module`` subclass's ``__init__`` is wrapped (those defined inside the block too,
  through ``__init_subclass__``), as DeepSpeed's ``zero.Init`` does. When a module's outermost
  ``__init__`` returns, each float32 CPU parameter under it not yet taken is appended to a
  spill file and its ``data`` becomes a placeholder of its shape (one NaN element, expanded),
  as the engine's own placeholders are. The values are what the module's own code made
  (``reset_parameters``, ``torch.randn`` in ``__init__``, ...), in the order plain PyTorch
  makes them, so the same seed gives the same model bit for bit. At most the module being
  built is in memory (with its children's placeholders).
- The spill file is unlinked as soon as it is made: its space comes back when the last
  parameter lets go of it. It lives in the config's ``offload_param.nvme_path`` (else
  ``offload_optimizer.nvme_path``) when parameters go to NVMe or ``remote_device="nvme"``,
  else in ``tempfile.gettempdir()``.
- ``zinf.zero.initialize`` then gives the engine each parameter's values from where they are
  (``initial_values``): the spill file, read straight into the shard's home one piece of this
  rank's elements at a time (``Engine::Initialize(InitialValues)``), or the tensor itself
  for a parameter made outside ``Init``, frozen ones included. A frozen parameter the engine
  does not take (of a dtype it does not hold) stays an ordinary tensor and gets its values
  back from the spill (``finish``).
- Code that reads or writes a parameter after its module was built (a parent's
  ``self.apply(init)``, a print of a weight) meets a placeholder that refuses to be read or
  written, naming the parameter and what to call, as a released parameter does after
  ``initialize`` (Note [Released parameters raise]); a write that still reached one (through a
  view taken before) is caught at ``initialize``. Such code runs inside
  ``zinf.zero.GatheredParameters(params, modifier_rank=0)``, as under DeepSpeed, which brings
  the values back for the block and spills what it changed.
- Hugging Face models are such code: ``post_init`` re-initializes every weight at the end of
  the outermost ``__init__``. Under Init a model's ``initialize_weights`` is replaced, for its
  ``__init__``, by the walk transformers runs under DeepSpeed (``initialize_weights_zero3``):
  the same modules in the same order (children first, each sub-model with its own
  ``_initialize_weights``), each with its own and its direct children's parameters gathered.
  Every rank runs it, so the values are plain PyTorch's for the same seed, bit for bit, and
  at most one module's parameters are in memory at once.
- Every rank builds the whole model and keeps the values it owns: ranks must be seeded alike
  (no values are broadcast). ``initialize`` checks it: each spilled parameter's CRC-32 is
  taken as it is spilled, and the ranks' sums must agree.

Construction runs on one thread; ``Init`` blocks do not nest (an inner one does nothing, as
in DeepSpeed).
"""

import contextlib
import ctypes
import functools
import inspect
import math
import os
import sys
import tempfile
import zlib

import torch

from zinf import _engine_inputs, _heap, _unreadable

__all__ = ["Init", "GatheredParameters"]

_active = []        # the Init blocks entered, outermost first
_wrapped = []       # (class, its own __init__) while wrapped
_building = {}      # id(module) -> depth of its __init__ calls under way
_own_init_subclass = torch.nn.Module.__dict__.get("__init_subclass__")


class Init:
    """Builds the modules constructed inside the block into zinf's shards (Note [Construction
    into shards]): DeepSpeed's ``deepspeed.zero.Init`` signature.

    config_dict_or_path (or config): the DeepSpeed config ``zinf.zero.initialize`` will get;
        it says where the values wait until then (offload_param.nvme_path).
    remote_device: "nvme" spills to the config's nvme_path, "cpu" or "none" to the temporary
        directory; None: as the config's offload_param.device.
    module: a model built already, whose parameters are spilled at once.
    enabled: False makes the block do nothing.
    dtype: None, torch.float32, or the config's 16-bit type: zinf keeps fp32 parameters and
        computes in the precision the config's bf16/fp16 says.
    data_parallel_group, mem_efficient_linear, pin_memory, mpu, zero_param_parallel_group,
    sequence_data_parallel_group, param_swapper: accepted; the engine's ranks and placement
        come from the environment and the config.
    """

    def __init__(self, module=None, data_parallel_group=None, mem_efficient_linear=True,
                 remote_device=None, pin_memory=False, config_dict_or_path=None, config=None,
                 enabled=True, dtype=None, mpu=None, zero_param_parallel_group=None,
                 zero_quantized_weights=False, zero_quantized_nontrainable_weights=False,
                 sequence_data_parallel_group=None, param_swapper=None):
        if config_dict_or_path is not None and config is not None:
            raise ValueError("give the config once: config_dict_or_path or config")
        if zero_quantized_weights or zero_quantized_nontrainable_weights:
            raise ValueError("zinf.zero.Init: quantized weights (zero_quantized_weights) are not "
                             "supported; zinf keeps fp32 parameters")
        if dtype not in (None, torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(f"zinf.zero.Init: dtype {dtype} is not float32, float16 or bfloat16")
        if remote_device not in (None, "none", "cpu", "nvme"):
            raise ValueError(f"remote_device must be None, 'none', 'cpu' or 'nvme', got "
                             f"{remote_device!r}")
        self.enabled = enabled
        self._config = config_dict_or_path if config_dict_or_path is not None else config
        self._remote_device = remote_device
        self._spill = None
        if enabled and module is not None:
            _capture(module, self._spill_file())

    def __enter__(self):
        if self.enabled:
            _heap.bound_heap_growth()
            _active.append(self)
            if len(_active) == 1:
                _wrap_module_inits()
        return self

    def __exit__(self, *exc):
        if self.enabled:
            _active.remove(self)
            if not _active:
                _unwrap_module_inits()
            self._spill = None  # the parameters hold it while they need it
        return False

    def _spill_file(self):
        if self._spill is None:
            self._spill = _SpillFile(self._spill_directory())
        return self._spill

    def _spill_directory(self):
        zero = {}
        if self._config is not None:
            zero = _engine_inputs.config_dict(self._config).get(
                "zero_optimization", {})
        device = self._remote_device or zero.get("offload_param", {}).get("device", "none")
        if device != "nvme":
            return tempfile.gettempdir()
        for section in ("offload_param", "offload_optimizer"):
            path = zero.get(section, {}).get("nvme_path")
            if isinstance(path, list):
                path = path[0] if path else None
            if path:
                return os.fspath(path)
        raise ValueError("zinf.zero.Init: parameters go to NVMe, but the config names no "
                         "zero_optimization.offload_param.nvme_path to build them into")


class GatheredParameters:
    """DeepSpeed's ``zero.GatheredParameters``: inside the block the given parameters (one or
    an iterable) hold their full values; on leaving it, with modifier_rank not None, that
    rank's values are kept, on every rank. Every rank must enter the block with the same
    parameters (a collective, as in DeepSpeed).
    - While a model is built under ``Init``: the values come back from the spill file, and
      what the block wrote is spilled again. Every rank runs the same code on the same values,
      so no rank's values are broadcast.
    - After ``zinf.zero.initialize``: the values are gathered from the engine's shards, and
      with modifier_rank that rank's values are broadcast and written into every rank's
      shards (the optimizer's fp32 master included).
    Other tensors (frozen parameters the engine does not hold, plain tensors) are left as
    they are."""

    def __init__(self, params, modifier_rank=None, fwd_module=None, enabled=True):
        if isinstance(params, torch.Tensor):
            params = [params]
        params = list(params) if params is not None else []
        self._params = [p for p in params if getattr(p, "_zinf_spilled", None) is not None]
        self._engines = {}  # id(engine) -> (engine, [its parameters])
        for p in params:
            ref = p.__dict__.get("_zinf_engine") if isinstance(p, torch.Tensor) else None
            engine = ref() if ref is not None else None
            if engine is not None:
                self._engines.setdefault(id(engine), (engine, []))[1].append(p)
        self._modifier_rank = modifier_rank
        self._modify = modifier_rank is not None
        self._enabled = enabled

    def __enter__(self):
        if self._enabled:
            for p in self._params:
                p.data = p._zinf_spilled.load()
                _unreadable.restore(p)
            for engine, params in self._engines.values():
                engine._gather_for_block(params)
        return self

    def __exit__(self, *exc):
        if not self._enabled:
            return False
        for p in self._params:
            spilled = p._zinf_spilled
            if self._modify and exc[0] is None:
                spilled.store(p.data)
            p.data = spilled.placeholder
            _unreadable.release(p)
        for engine, params in self._engines.values():
            engine._end_block(params, self._modifier_rank if exc[0] is None else None)
        return False


def initial_values(params):
    """The engine's source of initial values (Engine::Initialize's InitialValues) for
    {engine name: parameter}: from the spill file for parameters built under Init, from the
    tensor for the others. ValueError, before anything is read, naming a parameter whose
    placeholder something wrote into."""
    sources = {}
    for name, p in params.items():
        spilled = _intact_spill(name, p)
        if spilled is not None:
            sources[name] = spilled.read
        else:
            sources[name] = functools.partial(_read_tensor, p)

    def read(name, first, count, out):
        sources[name](first, count, out)
    return read


def check_ranks_built_alike(model, mean_over_ranks):
    """ValueError on every rank when the ranks built different values under Init (a
    collective): the sums of the spilled parameters' CRC-32s must agree."""
    mine = float(sum(_spill_of(p).crc for p in model.parameters() if _spill_of(p) is not None))
    if mean_over_ranks(mine) != mine:
        raise ValueError("the ranks built different parameter values under zinf.zero.Init: "
                         "seed torch alike on every rank (torch.manual_seed) before building "
                         "the model")


def finish(model):
    """After the engine took the values: frozen parameters built under Init that the engine
    does not hold get theirs back, and every parameter lets go of the spill file."""
    for p in model.parameters():
        spilled = _spill_of(p)
        if spilled is None:
            continue
        with _unreadable.metadata_only():
            frozen_placeholder = (not p.requires_grad
                                  and p.data.data_ptr() == spilled.nan.data_ptr())
        if frozen_placeholder:
            p.data = spilled.load()
            _unreadable.restore(p)
        del p._zinf_spilled


# -- how values are taken and given back -------------------------------------------------------

class _SpillFile:
    """Parameters' values, back to back, in a file that is already unlinked."""

    def __init__(self, directory):
        fd, path = tempfile.mkstemp(prefix="zinf-init-", suffix=".values", dir=directory)
        os.unlink(path)
        self.fd = fd
        self.path = path  # for messages
        self.size = 0

    def __del__(self, _close=os.close):
        # os.close bound early: at interpreter exit the module may be gone; no fd where
        # __init__ failed.
        fd = self.__dict__.get("fd")
        if fd is not None:
            _close(fd)

    def write(self, tensor, offset):
        view = _bytes_of(tensor)
        done = 0
        while done < len(view):
            done += os.pwrite(self.fd, view[done:], offset + done)

    def read(self, offset, out):
        view = memoryview(out).cast("B")
        done = 0
        while done < len(view):
            n = os.preadv(self.fd, [view[done:]], offset + done)
            if n == 0:
                raise OSError(f"{self.path}: {len(view) - done} bytes missing at offset "
                              f"{offset + done}")
            done += n


class _Spilled:
    """Where one parameter's values wait until the engine takes them."""
    __slots__ = ("file", "offset", "shape", "numel", "crc", "nan", "placeholder")

    def __init__(self, file, tensor):
        self.file = file
        self.offset = file.size
        self.shape = tuple(tensor.shape)
        self.numel = tensor.numel()
        values = tensor.detach().contiguous()
        file.write(values, self.offset)
        file.size += self.numel * 4
        self.crc = zlib.crc32(_bytes_of(values))
        # One NaN element in the parameter's shape, as the engine's placeholders.
        self.nan = torch.full((), math.nan)
        self.placeholder = self.nan.expand(self.shape)

    def read(self, first, count, out):
        self.file.read(self.offset + 4 * first, out)

    def load(self):
        values = torch.empty(self.shape, dtype=torch.float32)
        if self.numel:
            self.file.read(self.offset, _bytes_of(values))
        return values

    def store(self, values):
        if tuple(values.shape) != self.shape or values.dtype != torch.float32:
            raise ValueError(f"a parameter of shape {list(self.shape)} (float32) became "
                             f"{list(values.shape)} ({values.dtype}) under GatheredParameters")
        values = values.detach().contiguous().cpu()
        self.file.write(values, self.offset)
        self.crc = zlib.crc32(_bytes_of(values))


def _capture(module, spill):
    freed = 0
    for name, p in module.named_parameters():
        name = f"{type(module).__name__}.{name}"  # the outermost module built names it last
        if _spill_of(p) is not None:
            p._zinf_name = name
            continue  # taken already
        if p.dtype != torch.float32 or p.device.type != "cpu" or p.numel() == 0:
            continue  # not what the engine holds
        p._zinf_spilled = _Spilled(spill, p)
        p.data = p._zinf_spilled.placeholder
        _unreadable.release(p, name)  # Note [Released parameters raise]
        freed += p._zinf_spilled.numel * 4
    if freed >= 1 << 20:
        # glibc keeps the freed weights' pages otherwise (Note [Heap growth] in zinf/_heap.py):
        # without it torch 2.x built a 1 GiB model into 1 GiB of RSS.
        _heap.return_freed_memory()


def _wrap_module_inits():
    classes, todo = [], [torch.nn.Module]
    while todo:
        cls = todo.pop()
        classes.append(cls)
        todo.extend(cls.__subclasses__())
    for cls in dict.fromkeys(classes):
        _wrap_init(cls)
    torch.nn.Module.__init_subclass__ = classmethod(_wrap_new_class)


def _wrap_new_class(cls, **kwargs):
    if _own_init_subclass is not None:
        _own_init_subclass.__get__(None, cls)(**kwargs)
    else:
        super(torch.nn.Module, cls).__init_subclass__(**kwargs)
    _wrap_init(cls)


def _unwrap_module_inits():
    if _own_init_subclass is None:
        del torch.nn.Module.__init_subclass__
    else:
        torch.nn.Module.__init_subclass__ = _own_init_subclass
    for cls, original in reversed(_wrapped):
        cls.__init__ = original
    _wrapped.clear()


def _wrap_init(cls):
    original = cls.__dict__.get("__init__")
    if original is None or getattr(original, "_zinf_wraps", None) is not None:
        return

    @functools.wraps(original)
    def __init__(module, *args, **kwargs):
        key = id(module)
        depth = _building.get(key, 0)
        _building[key] = depth + 1
        gathers_for_hf = depth == 0 and bool(_active) and _is_hf_model(module)
        if gathers_for_hf:
            object.__setattr__(module, "initialize_weights",
                               functools.partial(_hf_initialize_weights, module))
        try:
            original(module, *args, **kwargs)
        except RuntimeError as e:
            into_placeholder = (isinstance(e, _unreadable.ParameterNotGatheredError)
                                or "single memory location" in str(e))
            if not into_placeholder or not _active:
                raise
            # A read of, or an in-place write into, a placeholder (Note [Construction into
            # shards]).
            raise RuntimeError(
                f"{type(module).__name__}.__init__ wrote into the parameters of a submodule "
                f"built before it under zinf.zero.Init, whose values had already gone to the "
                f"engine's side: run that initialization inside "
                f"zinf.zero.GatheredParameters(params, modifier_rank=0), or in each "
                f"module's own __init__") from e
        finally:
            if gathers_for_hf:
                module.__dict__.pop("initialize_weights", None)
            if depth == 0:
                del _building[key]
            else:
                _building[key] = depth
        if depth == 0 and _active:
            _capture(module, _active[0]._spill_file())

    __init__._zinf_wraps = original
    _wrapped.append((cls, original))
    cls.__init__ = __init__


def _is_hf_model(module):
    """Whether module is a Hugging Face PreTrainedModel (duck-typed: transformers need not be
    imported): one whose post_init initializes every weight through initialize_weights."""
    return all(callable(getattr(module, name, None))
               for name in ("post_init", "initialize_weights", "_initialize_weights"))


def _hf_initialize_weights(model):
    """PreTrainedModel.initialize_weights for a model built under Init (Note [Construction
    into shards]): transformers' own walk (smart_apply), each module's initialization inside
    GatheredParameters of its own and its direct children's parameters, as transformers'
    initialize_weights_zero3 does under DeepSpeed."""
    hf_init = sys.modules.get("transformers.initialization")
    guard = getattr(hf_init, "guard_torch_init_functions", contextlib.nullcontext)
    custom = model.is_custom_code() if hasattr(model, "is_custom_code") else False
    # transformers 5 passes whether the model is remote code; 4.x passed the module alone.
    takes_custom = len(inspect.signature(model._initialize_weights).parameters) >= 2

    def apply(module, initialize):
        for child in module.children():
            apply(child, child._initialize_weights if _is_hf_model(child) else initialize)
        args = (module, custom) if takes_custom else (module,)
        if getattr(module, "_is_hf_initialized", False):
            initialize(*args)  # returns at once: nothing to bring back
            return
        params = list(module.parameters(recurse=False))
        for child in module.children():
            if not _is_hf_model(child):
                params.extend(child.parameters(recurse=False))
        with GatheredParameters(list({id(p): p for p in params}.values()), modifier_rank=0):
            initialize(*args)

    with torch.no_grad(), guard():
        apply(model, model._initialize_weights)


def _intact_spill(name, p):
    """p's spill record when its values are still the spilled ones; None when p was not built
    under Init or was given new values since (``p.data = ...``); ValueError when something
    wrote into its placeholder."""
    spilled = _spill_of(p)
    if spilled is None:
        return None
    with _unreadable.metadata_only():
        if p.data.data_ptr() != spilled.nan.data_ptr():
            return None
    if not math.isnan(spilled.nan.item()):
        raise ValueError(
            f"parameter '{name}' was written after its module was built under zinf.zero.Init "
            f"(its values had gone to the engine's side): run such initialization inside "
            f"zinf.zero.GatheredParameters(params, modifier_rank=0)")
    return spilled


def _read_tensor(p, first, count, out):
    torch.frombuffer(out, dtype=torch.float32).copy_(p.detach().reshape(-1)[first:first + count])


def _spill_of(p):
    return getattr(p, "_zinf_spilled", None)


def _bytes_of(tensor):
    """A writable byte view of a contiguous CPU tensor's memory (no numpy needed)."""
    nbytes = tensor.numel() * tensor.element_size()
    return memoryview((ctypes.c_char * nbytes).from_address(tensor.data_ptr())).cast("B")

