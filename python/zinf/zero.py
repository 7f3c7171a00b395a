"""Run an ordinary ``nn.Module`` under zinf's ZeRO-3 engine.

    engine = zinf.zero.initialize(model, "ds_config.json")     # or a dict
    for batch in data:
        loss = loss_fn(engine(batch.x), batch.y)
        engine.backward(loss)    # loss.backward() with the fp16 loss scale
        engine.step()            # after gradient_accumulation_steps micro-batches

The config is DeepSpeed's (``zero_optimization.stage``, ``offload_param``,
``offload_optimizer``, ``optimizer``, ``scheduler``, ``gradient_clipping``, ``bf16``/``fp16``,
``aio``, ...); the optimizer is the engine's (fp32 master copy, zinf's CPU kernels), so no
``torch.optim`` optimizer is used. Under ``zinf run -n N`` (or torchrun) each process is a
data-parallel rank: parameters, gradients and optimizer state are sharded across them, and
the optimizer sees the mean gradient over ranks, as one process training on the whole global
batch.

How the module runs (Note [Module hooks]):
- At ``initialize`` every submodule with parameters of its own becomes an engine module; the
  model's current values are handed to the engine (on several ranks, rank 0's values of every
  parameter built outside ``zinf.zero.Init`` are broadcast first, as DeepSpeed broadcasts
  them; those built under ``Init`` are checked alike instead), and each parameter's ``data``
  becomes a placeholder of its shape that refuses to be read: outside a fetch or a
  GatheredParameters block, anything that needs its values raises
  ``zinf.ParameterNotGatheredError`` naming it and what to call (shape, dtype, device and
  requires_grad still answer; Note [Released parameters raise] in zinf/_unreadable.py).
- Reading values outside a forward: ``zinf.zero.GatheredParameters(params)`` (a collective,
  as DeepSpeed's) gives the parameters their full values for the block; with
  ``modifier_rank`` that rank's values are written into every rank's shards as it ends.
  ``state_dict()`` (so ``save_pretrained``) gives the values on one rank and, on several,
  refuses naming ``consolidated_state_dict()``, the collective that gathers them.
- The trained set is the parameters that require grad at ``initialize``; ``step()`` refuses,
  naming the parameter, when one was frozen or unfrozen since, until it is set back.
- Note [Undoing the takeover]: what ``initialize`` can check it checks before it touches the
  model; the model's own tensors (and ``Init``'s spill) are kept until it returns, so that a
  failure after the takeover (``zinf.initialize``'s data loader or monitors among them) puts
  back every parameter's data, buffer, hook and ``_parameters`` dict and drops the native
  engine: the model is as it was and a corrected retry works.
- Forward pre-hook: ``Fetch`` the module's parameters (gathered from all ranks, from NVMe when
  they live there), handed to torch as tensors over the engine's memory; forward hook:
  ``Release`` them and put the placeholders back.
- Note [Resident parameters]: where the engine's fetched tensors are the parameters' own
  memory, in place for the engine's life (``Engine::parameters_resident``: one rank,
  parameters in device memory, handed out in their stored precision: fp32 on the host, any on
  a GPU), each parameter's ``data`` is that memory from ``initialize`` on, as in plain
  PyTorch: no placeholder, no module hooks and no saved-tensor hooks, and no engine call in
  forward; the step updates the values in place, as torch's optimizers do. Only the gradients
  go to the engine, as everywhere. On a GPU the engine's writes (the step, a checkpoint's load)
  come after torch's stream has finished what it queued (one wait a step), and are complete
  when the call returns, before the next forward is queued.
- A forward that reads a parameter of a module it does not call (``nn.MultiheadAttention``
  passes ``self.out_proj.weight`` to ``F.multi_head_attention_forward`` without calling
  ``out_proj``; ``TransformerEncoderLayer``'s fast path reads every child's weights) fetches it
  itself: each managed module's ``_parameters`` dict is replaced by one whose item lookup,
  which ``nn.Module.__getattr__`` goes through for ``module.weight``, fetches the parameter's
  module when it is not fetched and a forward is running, for the innermost running forward,
  which releases it with its own. So any module like it is found by the read itself, with no
  list of module types and no registration (``register_external_parameter`` still declares
  such a use ahead, so the fetch happens in the pre-hook). Reading ``_parameters`` directly
  (``state_dict``, ``named_parameters``) iterates and is not intercepted.
- Tensors autograd saves for backward that are parameters (or views of them) are replaced by
  a reference (``torch.autograd.graph.saved_tensors_hooks``); backward fetches the module
  again when it needs them, so no gathered parameter stays alive between forward and
  backward.
- Note [Recompute in backward]: activation checkpointing (``torch.utils.checkpoint``,
  reentrant or not, and so transformers' ``gradient_checkpointing_enable``) runs a module's
  forward again inside backward. What that recompute saves is the parameter itself (a
  reentrant checkpoint, with no saved-tensor hooks of ours around it) or a detached view of
  its memory (a non-reentrant one, whose own hooks are innermost), so a forward that runs once
  backward has begun (the hook on the model's output has fired) releases nothing: its modules
  are fetched for backward, their ``data`` set to the fetched values, and released when their
  gradients are reduced, or at the end of backward. torch 2's non-reentrant checkpoint stops
  a recompute midway by raising, so such a forward leaves no state for its post-hook to undo.
- Each parameter's gradient, once accumulated, goes into the engine's gradient buffer and the
  module's buffers are reduce-scattered (``ReduceGradients``) when all its gradients are in;
  ``param.grad`` is cleared. At the end of backward, modules that got no gradient are
  reduced with zeros, as every module must be each micro-batch.
- Note [Frozen modules in backward]: a module of frozen parameters alone (a LoRA layer's
  base) gets no gradient whose arrival could end its backward use, yet its backward fetches it
  when autograd needs its weights for the gradient of its inputs. Its forward's inputs pass
  through an identity autograd function (DeepSpeed's way); autograd runs that function's
  backward once the module's own backward is done with them, and it releases what that
  backward fetched. A module whose inputs need no gradient is never fetched for backward.
- ``step()`` runs the engine's optimizer step.
- Beside torch.distributed: when ``init_process_group`` came first, the engine's rendezvous
  port is agreed through torch's store; otherwise it is ZINF_MASTER_PORT, else MASTER_PORT + 1
  (MASTER_PORT is torch's), so the two can start in either order. ZINF_MASTER_PORT serves the
  process's first engine; a second one at the same time (a reference model beside the policy)
  needs torch.distributed initialized, through whose store it agrees a port of its own.
- Module buffers (BatchNorm's running statistics) stay ordinary tensors of each rank,
  replicated as DeepSpeed keeps them: ``save_checkpoint`` hands the engine their current
  values, which checkpoints carry (rank 0's, as DeepSpeed saves the model states of rank 0),
  ``load_checkpoint`` copies them back on every rank, and ``zinf ckpt export`` writes them
  beside the parameters. Non-persistent buffers (``persistent=False``) are left out, as
  ``state_dict`` leaves them out.

A model too large for memory is built under ``zinf.zero.Init`` (DeepSpeed's ``zero.Init``):
each module's values leave memory as its ``__init__`` finishes and reach the engine's shards
at ``initialize`` (Note [Construction into shards] in zinf/_construction.py).

Where the model computes is this process's GPU, as in DeepSpeed, else the host (Notes [Where
the model computes], [The engine's memory] and [On a GPU] in zinf/_device_memory.py):
- the host (no GPU, or ``device="host"``; float32 CPU parameters): fetched parameters are CPU
  tensors over the engine's memory, gradients copied into the engine's buffers.
- a GPU: the one holding the model's parameters, or cuda:LOCAL_RANK for a model built on the
  CPU or under ``zinf.zero.Init``, whose parameters go to the engine's shards without ever
  being whole on the GPU (so the model may be larger than it). The engine gathers and
  reduce-scatters there over NCCL. Fetched parameters are torch CUDA tensors over the engine's
  own memory, in the config's precision (bf16, fp16, else fp32), with no copy; gradients are
  copied into its fp32 buffers on the device. Every engine call is ordered with torch's current
  stream by events, never by synchronizing the host. Buffers and frozen parameters are moved to
  the GPU, and with bf16 or fp16 cast to that precision, as DeepSpeed moves and casts the
  module, so that the model computes in one dtype on one device.
Frozen parameters (requires_grad False at ``initialize``: a LoRA base, a reference model) are
taken by the engine as trained ones are: sharded, offloaded where the config says, fetched for
each forward, so their bytes per rank fall with the ranks. The engine keeps no master, gradient
or optimizer state for them (Note [Frozen parameters] in src/zero/partition.h) and they get no
gradient hook; a frozen parameter of a dtype the engine does not take (not floating point, or
not float32 on the host) stays an ordinary tensor.
Note [Nothing to train]: a model whose parameters are all frozen at ``initialize`` (an inference
model, TRL's reference model) is such a model with nothing else: ``backward()`` and ``step()``
are refused, and a backward through the model to its inputs only releases what it fetched.
"""

import collections
import json
import math
import weakref

import torch

from zinf import _construction, _device_memory, _engine_inputs, _fetch_units, _heap, _zinf
from zinf import _client_objects, _unreadable
from zinf._backward import Backward
from zinf._shard_values import ShardValues, join_name
from zinf._construction import GatheredParameters, Init  # noqa: F401

__all__ = ["initialize", "ZeroEngine", "register_external_parameter", "Init",
           "GatheredParameters"]


def initialize(model, config, *, trainer=None, optimizer_threads=0, timeout_s=300.0,
               device=None, _undoable=False, _param_groups=None, **trainer_values):
    """Puts `model` under the ZeRO engine and returns the ZeroEngine that trains it.

    config: a DeepSpeed config as a dict, a JSON string, or a path to a JSON file.
    trainer, **trainer_values: the trainer's values for the config's "auto" keys, as Hugging
        Face's integration fills them: a dict and/or keyword arguments named as zinf's
        TrainerValues (lr, total_num_steps, warmup_num_steps, micro_batch_size, ...), as Hugging
        Face's TrainingArguments (learning_rate, max_steps, warmup_steps,
        per_device_train_batch_size, adam_beta1, max_grad_norm, ...) or as the config key they
        fill ("scheduler.params.total_num_steps"). A value that differs from a number the config
        spells out is an error naming both; an "auto" with no value keeps its key's default,
        with a warning.
    optimizer_threads: threads of the CPU optimizer (0: all this process may use).
    timeout_s: how long a collective may make no progress before it fails (a dead rank).
    device: where the model computes: None or "auto" (the model's GPU; else this process's GPU
        when torch sees one, else the host), "host", "cuda" or "cuda:N"; the config's
        ``zinf.device`` says the same (Note [Where the model computes] in
        zinf/_device_memory.py).
    Every rank must call it with the same model and config.
    """
    values = dict(trainer or {})
    values.update(trainer_values)
    return ZeroEngine(model, config, optimizer_threads=optimizer_threads, timeout_s=timeout_s,
                      trainer=values, undoable=_undoable, param_groups=_param_groups,
                      device=device)


def _take_device(config):
    """Removes zinf.device from `config` (a dict) and returns it, None when absent."""
    section = config.get("zinf")
    if not isinstance(section, dict) or "device" not in section:
        return None
    value = section.pop("device")
    if not section:
        del config["zinf"]
    if not isinstance(value, str):
        raise ValueError(f"zinf.device must be \"auto\", \"host\", \"cuda\" or \"cuda:N\", "
                         f"got {value!r}")
    return value


def _takeable(p, device):
    """Whether the engine takes `p`'s values: float32 on the CPU, any floating dtype on the CPU
    for a GPU engine (the engine keeps fp32 masters), or on that GPU."""
    if p.device.type == "cpu":
        return p.dtype == torch.float32 or (device.type == "cuda" and p.is_floating_point())
    return p.device == device and p.is_floating_point()


def register_external_parameter(module, parameter):
    """Declares that `module`'s forward uses `parameter`, which belongs to another module
    (tied weights read directly, e.g. ``F.linear(x, self.wte.weight)``): the parameter is
    fetched in `module`'s forward pre-hook, with its own. Optional: without it the read itself
    fetches the parameter (Note [Module hooks]); declared, the fetch comes first and in a
    fixed place."""
    external = module.__dict__.setdefault("_zinf_external_parameters", [])
    external.append(parameter)


class _Slot:
    """One managed parameter: its engine module, its index there, its name and shape, and the
    placeholder its data is while no fetch holds it."""
    __slots__ = ("param", "module_id", "index", "name", "shape", "numel", "placeholder",
                 "trainable")

    def __init__(self, param, module_id, index, name):
        self.param = param
        self.module_id = module_id
        self.index = index
        self.name = name
        self.shape = tuple(param.shape)
        self.numel = param.numel()
        self.placeholder = None
        self.trainable = param.requires_grad  # at initialize: the engine's ParamSpec::trainable


class ZeroEngine(ShardValues, Backward):
    """A model under zinf's ZeRO engine. Call it like the model; then backward() and step()."""

    def __init__(self, model, config, optimizer_threads=0, timeout_s=300.0, trainer=None,
                 undoable=False, param_groups=None, device=None):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if any(getattr(m, "_zinf_managed", False) for m in model.modules()):
            # Its parameters are the first engine's placeholders now, not values.
            raise ValueError("this model is already under a zinf engine (its parameters hold "
                             "placeholders): build the model anew for a second engine, or keep "
                             "training with the first")
        self.module = model
        config_json = _engine_inputs.config_json(config)
        # zinf.zero's own keys (Note [Fetch units]; zinf.device), taken out before the engine
        # reads the rest.
        parsed = json.loads(config_json)
        self._granularity = _fetch_units.take_threshold(parsed)
        configured_device = _take_device(parsed)
        if self._granularity is not None or configured_device is not None:
            config_json = json.dumps(parsed)
        if device is not None and configured_device is not None and device != configured_device:
            raise ValueError(f"device={device!r}, but the config's zinf.device is "
                             f"{configured_device!r}")
        # Where the model computes (Note [Where the model computes]).
        self.device = _device_memory.compute_device(model, device or configured_device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        # Whether the model has anything to train; without, its frozen parameters are the
        # engine's (Note [Nothing to train]).
        self._trains = any(p.requires_grad for p in model.parameters())
        model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        if _heap.memory_binds(config_json, model_bytes):
            _heap.bound_heap_growth()
        on_gpu = self.device.type == "cuda"
        try:
            self._engine = _zinf.Engine(config_json,
                                        optimizer_threads=optimizer_threads, timeout_s=timeout_s,
                                        trainer=_engine_inputs.trainer_values(trainer or {}),
                                        master_port=_engine_inputs.port_beside_torch(),
                                        device=f"cuda:{self.device.index}" if on_gpu else "host")
        except _zinf.UnavailableError as e:
            chosen = (device or configured_device) in (None, "auto")
            if on_gpu and chosen and _device_memory.model_device(model).type == "cpu":
                raise _zinf.UnavailableError(
                    f"{e} (the model computes on {self.device} because torch sees a GPU: pass "
                    f"device=\"host\", or the config's zinf.device, to train on the CPU)") from e
            raise
        if self._engine.resolved_config["layer_major"]:
            raise ValueError(
                "zinf.layer_major needs a trainer that runs every micro-batch through a module "
                "before it fetches the next; zinf.zero follows autograd, whose backward runs one "
                "micro-batch through the whole model at a time, so it cannot: leave the key off "
                "(Note [Layer-major micro-batches] in src/zero/engine.cc)")
        self._memory = (_device_memory.GpuMemory(self._engine, self.device) if on_gpu
                        else _device_memory.HostMemory(self._engine))
        # What the model computes in: the engine's precision on a GPU; fp32 on the host, where
        # the engine hands out fp32 values whatever its precision.
        self._compute_dtype = _device_memory.COMPUTE_DTYPES[
            next((k for k in ("bf16", "fp16") if self._engine.resolved_config[k]), "fp32")
            if on_gpu else "fp32"]
        self._held = {}           # module id -> [its fetched tensors, holders, their storages]
        self._storages = {}       # module id -> (fetched tensors, their storage pointers)
        self._slots = {}          # id(param) -> _Slot
        self._module_slots = []   # module id -> [_Slot]
        self._frozen = []         # (name, param) of the model's parameters not in _slots
        self._trained_mids = []   # module ids with a trainable parameter
        self._resident = False    # Note [Resident parameters]
        self._module_names = []
        self._hook_handles = []
        self._grad_accumulators = []
        self._forward_refs = {}   # module id -> references of modules in forward
        self._forward_ptrs = {}   # storage address -> _Slot, of the parameters fetched in forward
        self._nan = None          # the placeholders' one element
        self._unit_roots = {}     # id(module) -> its unit's root (Note [Fetch units])
        self._forward_stack = []  # [module ids fetched on read] per running forward, innermost last
        self._backward_params = {}  # module id -> fetched tensors backward reads
        self._grad_views = {}     # module id -> gradient buffers (torch views)
        self._grads_pending = {}  # module id -> slots whose gradient has not come yet
        self._reduced = set()     # module ids reduced this micro-batch
        self._in_backward = False
        self._backwards_since_step = 0  # as the engine counts its modules' reductions
        self._saved_hooks = None  # saved_tensors_hooks of the forward in progress
        self._gathered = {}       # id(param) -> [its full value, GatheredParameters depth]
        self._consolidating = False
        self._before = None       # what the takeover changed, until it is kept (_keep_takeover)
        # Optimizer parameter groups [(options, parameters)] (zinf/_client_objects.py): the
        # engine's group of each parameter, and [(engine group, parameters)].
        self.param_groups, self._group_of = _client_objects.add_param_groups(
            self._engine, param_groups)
        try:
            self._register(model)
        except BaseException:
            self._undo_takeover()
            raise
        if not undoable:
            self._keep_takeover()

    # -- setup ------------------------------------------------------------------------------

    def _takes(self, p):
        # A frozen parameter the engine cannot hold stays the model's (Note [Nothing to
        # train] refuses it instead: a model of those alone has nothing the engine could take).
        return p.requires_grad or not self._trains or _takeable(p, self.device)

    def _register(self, model):
        self._remember_model(model)
        # Note [Fetch units]: a unit's root registers its whole subtree's parameters.
        self._unit_roots = _fetch_units.unit_roots(
            model, self._takes, self._granularity,
            self._engine.resolved_config["stage3_param_persistence_threshold"])
        for mname, sub in model.named_modules():
            root = self._unit_roots.get(id(sub))
            if root is not None and root is not sub:
                continue  # its parameters are its unit's
            own = []
            for pname, p in sub.named_parameters(recurse=root is sub):
                if not self._takes(p) or id(p) in self._slots:
                    continue
                if not _takeable(p, self.device):
                    raise ValueError(f"parameter '{join_name(mname, pname)}' is {p.dtype} on "
                                     f"{p.device}; zinf.zero needs float32 CPU parameters, or "
                                     f"floating-point parameters on the CPU or on the GPU it "
                                     f"computes on ({self.device})")
                own.append((join_name(mname, pname), p))
            if not own:
                continue
            mid = self._engine.register_module(
                mname or "<root>", [(name, list(p.shape) or [1]) for name, p in own],
                [self._group_of.get(id(p), 0) for _, p in own],
                [p.requires_grad for _, p in own])
            assert mid == len(self._module_slots)
            slots = [_Slot(p, mid, i, name) for i, (name, p) in enumerate(own)]
            for s in slots:
                self._slots[id(s.param)] = s
            self._module_slots.append(slots)
            self._module_names.append(mname or "<root>")
        if not self._module_slots:
            raise ValueError("the model has no parameters")
        self._broadcast_from_rank_0(model)
        # Each parameter's values go to its shard from where they are: its tensor, or the
        # spill file of zinf.zero.Init (Note [Construction into shards]).
        self._engine.initialize(values=_construction.initial_values(
            {s.name: s.param for slots in self._module_slots for s in slots}))
        _construction.check_ranks_built_alike(model, self._engine.mean_over_ranks)
        for slots in self._module_slots:
            for s in slots:
                # The placeholder first: a new dtype or device would make torch drop the
                # parameter's gradient accumulator. The accumulator of a leaf lives as long as
                # something holds it; the placeholder has the parameter's shape. One built under
                # Init refuses reads until then (Note [Construction into shards]).
                _unreadable.restore(s.param)
                s.param.data = self._placeholder(s)
                if s.trainable:
                    acc = s.param.expand_as(s.param).grad_fn.next_functions[0][0]
                    self._hook_handles.append(acc.register_hook(self._make_grad_hook(s)))
                    self._grad_accumulators.append(acc)
                s.param._zinf_engine = weakref.ref(self)  # for GatheredParameters
                _unreadable.release(s.param, s.name)  # Note [Released parameters raise]
        self._resident = self._engine.parameters_resident
        if self._resident:  # Note [Resident parameters]: fetched once, for good
            for mid, slots in enumerate(self._module_slots):
                for s, t in zip(slots, self._memory.fetch(mid, slots)):
                    self._show(s, t)
                self._memory.release(mid)
        _construction.finish(model)  # frozen parameters built under Init get their values
        # What step() checks stayed frozen: listed once, not found by a walk every step.
        self._frozen = [(name, p) for name, p in model.named_parameters()
                        if id(p) not in self._slots]
        self._trained_mids = [mid for mid, slots in enumerate(self._module_slots)
                              if any(s.trainable for s in slots)]
        if self._compute_dtype != torch.float32 or self.device.type == "cuda":
            _device_memory.move_the_rest(model, self.device, self._compute_dtype, self._slots)
        for sub in model.modules():
            sub._zinf_managed = True  # a second initialize would take placeholders as values
        # The root's pre-hook first: it clears what a forward that raised left behind (the
        # stack of running forwards among it) before the root's own fetch.
        self._hook_handles.append(model.register_forward_pre_hook(self._root_pre_hook))
        if not self._resident:  # Note [Resident parameters]: nothing to fetch
            self._hook_modules(model)
        # Registered last, so that it runs after the root's release.
        self._hook_handles.append(model.register_forward_hook(self._root_post_hook))

    def _hook_modules(self, model):
        """The fetch and release around each module's forward (Note [Module hooks])."""
        for sub in model.modules():
            mids = self._module_ids_of(sub)
            # Every module's forward is a frame that parameters read inside it are fetched for
            # (those without parameters of their own too), so they are released with it. A
            # leaf without parameters (an activation, dropout) is left to its parent's frame:
            # it has no child to read from, and two hooks on every such module cost more than
            # a small module's compute. Inside a unit only its root is hooked.
            root = self._unit_roots.get(id(sub))
            hooked = (root is sub or (root is None and (
                mids or sub is model or next(sub.children(), None) is not None)))
            if hooked:
                self._hook_handles.append(
                    sub.register_forward_pre_hook(self._make_pre_hook(mids)))
                self._hook_handles.append(sub.register_forward_hook(self._make_post_hook(mids)))
            if any(id(p) in self._slots for p in sub.parameters(recurse=False)):
                sub.__dict__["_parameters"] = _FetchingParameters(self, sub.__dict__["_parameters"])
                self._hook_handles.append(sub._register_state_dict_hook(self._state_dict_hook))

    def _remember_model(self, model):
        """What the takeover changes (Note [Undoing the takeover])."""
        params = {id(p): p for p in model.parameters()}.values()
        with _unreadable.metadata_only():  # Init's placeholders refuse reads of their values
            remembered = [(p, p.data, getattr(p, "_zinf_spilled", None),
                           isinstance(p, _unreadable._Unreadable)) for p in params]
        self._before = {
            "params": remembered,
            "buffers": [(sub, name, buf) for sub in model.modules()
                        for name, buf in sub._buffers.items()],
            "parameter_dicts": [(sub, sub.__dict__["_parameters"]) for sub in model.modules()],
        }

    def _keep_takeover(self):
        self._before = None  # the model's own tensors may go now

    def _undo_takeover(self):
        """Puts the model back as it was before the takeover and closes the native engine, so
        that a corrected retry works (Note [Undoing the takeover])."""
        before, self._before = self._before, None
        for handle in self._hook_handles:
            handle.remove()
        self._hook_handles.clear()
        self._grad_accumulators.clear()
        if self._saved_hooks is not None:
            self._root_post_hook()
        if before is not None:
            for p, data, spilled, unreadable in before["params"]:
                p.data = data
                if unreadable:  # an Init placeholder's, as it was
                    _unreadable.release(p)
                else:
                    _unreadable.restore(p)
                p.__dict__.pop("_zinf_engine", None)
                if spilled is not None:
                    p._zinf_spilled = spilled
            for sub, name, buf in before["buffers"]:
                sub._buffers[name] = buf
            for sub, parameters in before["parameter_dicts"]:
                sub.__dict__["_parameters"] = parameters
        for sub in self.module.modules():
            sub.__dict__.pop("_zinf_managed", None)
        self._slots.clear()
        self._frozen = []
        self._trained_mids = []
        self._resident = False
        self._module_slots.clear()
        # The native engine goes with its last reference: its rendezvous port is free again.
        self._memory = None
        self._engine = None

    def _broadcast_from_rank_0(self, model):
        """Every rank starts from rank 0's values of the parameters built outside
        zinf.zero.Init, as DeepSpeed broadcasts them (those built under Init are checked
        alike instead: check_ranks_built_alike)."""
        if self._engine.world_size == 1:
            return
        with torch.no_grad():
            for p in {id(p): p for p in model.parameters()}.values():
                if not p.is_floating_point() or getattr(p, "_zinf_spilled", None) is not None:
                    continue
                host = p.detach().to("cpu", torch.float32).contiguous()
                self._engine.broadcast(host.data_ptr(), host.numel(), 0)
                if host.data_ptr() != p.data_ptr():
                    p.data.copy_(host)

    def _module_ids_of(self, sub):
        params = list(sub.parameters(recurse=self._unit_roots.get(id(sub)) is sub))
        params += sub.__dict__.get("_zinf_external_parameters", [])
        mids = []
        for p in params:
            s = self._slots.get(id(p))
            if s is not None and s.module_id not in mids:
                mids.append(s.module_id)
        return mids

    def _show(self, slot, values):
        """The parameter's data becomes `values` (fetched or gathered), readable."""
        _unreadable.restore(slot.param)  # first: a released parameter's setter costs a dispatch
        slot.param.data = values

    def _park(self, slot):
        """A parameter's data when no fetch holds it: its value inside a GatheredParameters
        block, else the placeholder, which refuses reads (Note [Released parameters raise])."""
        gathered = self._gathered.get(id(slot.param))
        if gathered is not None:
            self._show(slot, gathered[0])
        else:
            slot.param.data = self._placeholder(slot)
            _unreadable.release(slot.param)

    def _fetched(self, slot):
        """Whether a forward or backward holds the parameter's module fetched (a resident
        one always is)."""
        return (self._resident or slot.module_id in self._forward_refs
                or slot.module_id in self._backward_params)

    def _placeholder(self, slot):
        # Full shape (p.shape stays true, autograd's metadata matches), one element of storage,
        # of the fetched tensors' dtype and device; made once, so that a release makes no
        # tensor and launches no kernel.
        if slot.placeholder is None:
            if self._nan is None:
                self._nan = torch.full((1,), math.nan, dtype=self._compute_dtype,
                                       device=self.device)
            slot.placeholder = self._nan.expand(slot.shape)
        return slot.placeholder

    # -- forward ----------------------------------------------------------------------------

    def __call__(self, *args, **kwargs):
        try:
            return self.module(*args, **kwargs)
        except BaseException:
            self._recover()
            raise

    forward = __call__

    def _root_pre_hook(self, *unused):
        if self._saved_hooks is not None or self._backward_params:
            # A forward that raised when the model was called directly, or a backward that
            # raised, left its state behind.
            self._recover()
        self._in_backward = False
        if self._resident:  # no parameter is fetched for backward: nothing to save by reference
            return
        self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._saved_hooks.__enter__()

    def _root_post_hook(self, module=None, inputs=None, output=None):
        hooks, self._saved_hooks = self._saved_hooks, None
        if hooks is not None:
            hooks.__exit__(None, None, None)
        # The gradient of the model's output is backward's first step, in the outermost
        # backward (a reentrant checkpoint runs one of its own inside it): from there on a
        # forward is a recompute (Note [Recompute in backward]).
        for t in _tensors_in(output):
            if t.requires_grad:
                t.register_hook(self._backward_begins)

    def _recover(self):
        """Undoes what a forward that raised left: the saved-tensor hooks, fetched modules."""
        self._root_post_hook()
        self._forward_stack.clear()
        for mid in list(self._forward_refs) + list(self._backward_params):
            for s in self._module_slots[mid]:
                self._park(s)
        self._forward_refs.clear()
        self._forward_ptrs.clear()
        self._backward_params.clear()
        for mid in list(self._held):
            try:
                self._memory.release(mid)
            except _zinf.ZinfError:
                pass  # the engine's own error is what the caller sees
        self._held.clear()

    def _make_pre_hook(self, mids):
        # Note [Frozen modules in backward]: those of frozen parameters alone.
        frozen = [mid for mid in mids
                  if not any(s.trainable for s in self._module_slots[mid])]

        def pre_hook(module, inputs):
            if self._in_backward:  # a recompute (Note [Recompute in backward])
                for mid in mids:
                    self._acquire_for_backward(mid)
                return
            for mid in mids:
                self._acquire(mid)
            self._forward_stack.append([])
            if frozen and self._trains and torch.is_grad_enabled():
                return self._release_after_backward(frozen, inputs)
            return None
        return pre_hook

    def _make_post_hook(self, mids):
        def post_hook(module, inputs, output):
            if self._in_backward:
                return output  # what it fetched stays until the module's gradients are in
            read = self._forward_stack.pop() if self._forward_stack else []
            output = self._own_escaping(output, read + mids)
            for mid in reversed(read):
                self._drop(mid)
            for mid in mids:
                self._drop(mid)
            return output
        return post_hook

    def _own_escaping(self, output, mids):
        """The forward's output, its views of parameters about to be released copied (Note
        [The engine's memory] in zinf/_device_memory.py)."""
        ptrs = {ptr for mid in mids if mid in self._held for ptr in self._held[mid][2]}
        return _device_memory.copy_views(output, ptrs) if ptrs else output

    def _on_read(self, param):
        """A managed parameter read through its module's attribute: inside a forward that has
        not fetched its module, fetch it for the innermost running forward."""
        s = self._slots.get(id(param))
        if s is None:
            return
        if self._in_backward:
            self._acquire_for_backward(s.module_id)
            return
        if not self._forward_stack or s.module_id in self._forward_refs:
            return
        self._acquire(s.module_id)
        self._forward_stack[-1].append(s.module_id)

    def _hold(self, mid):
        """Module `mid`'s fetched parameters, fetched by the first holder: a forward using it,
        or (on a GPU) backward until the module's gradients are reduced."""
        held = self._held.get(mid)
        if held is None:
            tensors = self._memory.fetch(mid, self._module_slots[mid])
            # The same tensors come back while the module's memory stays (HostMemory), and
            # their storage pointers with them.
            known = self._storages.get(mid)
            if known is None or known[0] is not tensors:
                known = self._storages[mid] = (
                    tensors, [_device_memory.storage_ptr(t) for t in tensors])
            held = self._held[mid] = [tensors, 0, known[1]]
        held[1] += 1
        return held[0]

    def _unhold(self, mid):
        """Released by the last holder."""
        held = self._held[mid]
        held[1] -= 1
        if held[1] == 0:
            del self._held[mid]
            self._memory.release(mid)

    def _acquire(self, mid):
        refs = self._forward_refs.get(mid, 0)
        if refs == 0:
            tensors = self._hold(mid)
            for s, t, ptr in zip(self._module_slots[mid], tensors, self._held[mid][2]):
                self._show(s, t)
                self._forward_ptrs[ptr] = s
        self._forward_refs[mid] = refs + 1

    def _drop(self, mid):
        refs = self._forward_refs[mid] - 1
        self._forward_refs[mid] = refs
        if refs == 0:
            del self._forward_refs[mid]
            for s, ptr in zip(self._module_slots[mid], self._held[mid][2]):
                self._forward_ptrs.pop(ptr, None)
                self._park(s)
            self._unhold(mid)

    # -- step and the rest ------------------------------------------------------------------

    def step(self):
        """The engine's Step(): after gradient_accumulation_steps micro-batches it updates the
        parameters. Returns the step summary (step, grad_norm, loss_scale, bytes moved, ...)."""
        self._refuse_without_training("step()")
        self._check_requires_grad()
        self._before_engine_writes()
        try:
            summary = self._engine.step()
        except _zinf.DataLossError as e:
            # Non-finite gradients without fp16: the engine refused the step and dropped the
            # batch, so the next one starts from no backward, as the engine's count does.
            if "non-finite gradients" in str(e):
                self._backwards_since_step = 0
            raise
        self._backwards_since_step = 0
        _heap.after_step()
        return summary

    def _before_engine_writes(self):
        """Resident parameters on a GPU (Note [Resident parameters]): the engine writes them in
        place, so torch's queued kernels must be done reading them first; the engine's writes
        are complete when its call returns."""
        if self._resident and self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def _refuse_without_training(self, call):
        if not self._trains:
            raise RuntimeError(
                f"{call}: this engine has nothing to train (every parameter of the model had "
                f"requires_grad=False at initialize: an inference or reference model), so it "
                f"has no optimizer step; run its forward only (under torch.no_grad()), or "
                f"unfreeze the parameters to train before initialize (a new engine)")

    def _check_requires_grad(self):
        """ValueError naming the parameter whose requires_grad changed since initialize: the
        engine trains the set it took then, and would ignore the change."""
        with _unreadable.metadata_only():
            self._check_requires_grad_unchanged()

    def _check_requires_grad_unchanged(self):
        for slots in self._module_slots:
            for s in slots:
                if s.param.requires_grad == s.trainable:
                    continue
                if not s.trainable:
                    raise ValueError(
                        f"parameter '{s.name}' requires grad now but was frozen at initialize, "
                        f"so zinf keeps no optimizer state for it and it would never train: set "
                        f"requires_grad back to False before step(), or unfreeze it before "
                        f"initialize (a new engine)")
                raise ValueError(
                    f"parameter '{s.name}' was frozen (requires_grad=False) after "
                    f"initialize; zinf's optimizer holds it and would go on stepping it: "
                    f"set requires_grad back to True before step(), or freeze it before "
                    f"initialize (a new engine)")
        for name, p in self._frozen:
            if p.requires_grad:
                raise ValueError(
                    f"parameter '{name}' requires grad now but was frozen at initialize, so "
                    f"zinf's optimizer does not hold it and it would never train: set "
                    f"requires_grad back to False before step(), or unfreeze it before "
                    f"initialize (a new engine)")

    @property
    def rank(self):
        return self._engine.rank

    @property
    def parameters_resident(self):
        """Whether the parameters hold their values for good (Note [Resident parameters]):
        readable anywhere, with no fetch in forward."""
        return self._resident

    @property
    def world_size(self):
        return self._engine.world_size

    @property
    def local_rank(self):
        return self._engine.local_rank

    @property
    def loss_scale(self):
        return self._engine.loss_scale

    @property
    def learning_rate(self):
        return self._engine.learning_rate

    @property
    def resolved_config(self):
        """What the config resolved to ("auto" filled): zero_stage, fp16, bf16,
        gradient_clipping."""
        return self._engine.resolved_config

    def set_learning_rate(self, lr):
        self._engine.set_learning_rate(float(lr))

    def param_group(self, group):
        """The engine's optimizer group `group` (param_groups' first items): its type, lr,
        weight_decay, betas, eps... as the next step applies them."""
        return self._engine.param_group(group)

    def set_group_learning_rate(self, group, lr):
        self._engine.set_group_learning_rate(group, float(lr))

    @property
    def micro_batch_size(self):
        return self._engine.micro_batch_size

    @property
    def gradient_accumulation_steps(self):
        return self._engine.gradient_accumulation_steps

    @property
    def train_batch_size(self):
        """micro_batch_size x gradient_accumulation_steps x world_size, as the engine resolved
        the config's batch keys."""
        return self._engine.train_batch_size

    def mean_over_ranks(self, value):
        """The mean of a number over all ranks (a collective), e.g. the global batch's loss."""
        return self._engine.mean_over_ranks(float(value))

    def train(self, mode=True):
        self.module.train(mode)
        return self

    def eval(self):
        return self.train(False)


class _FetchingParameters(collections.OrderedDict):
    """A module's ``_parameters`` whose item lookup (``module.weight``) fetches the parameter
    when a forward reads it without having fetched it (Note [Module hooks])."""

    def __init__(self, engine=None, parameters=()):
        super().__init__(parameters)
        # A weak reference: the model may outlive the engine.
        self._zinf_engine = weakref.ref(engine) if engine is not None else None

    def __getitem__(self, name):
        param = super().__getitem__(name)
        engine = self._zinf_engine() if self._zinf_engine is not None else None
        if engine is not None and param is not None:
            engine._on_read(param)
        return param


def _tensors_in(output):
    """The tensors of a forward's output: in tuples, lists and dicts (ModelOutput)."""
    if isinstance(output, torch.Tensor):
        yield output
    elif isinstance(output, (list, tuple)):
        for v in output:
            yield from _tensors_in(v)
    elif isinstance(output, dict):
        for v in output.values():
            yield from _tensors_in(v)
