"""DeepSpeed's entry points on zinf's ZeRO-3 engine: a DeepSpeed training loop runs unchanged
but for the import.

    model_engine, optimizer, train_loader, lr_scheduler = zinf.initialize(
        args=args, model=net, model_parameters=net.parameters(), training_data=dataset)
    for step, batch in enumerate(train_loader):
        loss = model_engine(batch)
        model_engine.backward(loss)
        model_engine.step()
    model_engine.save_checkpoint(save_dir, client_state={"step": step})
    _, client_state = model_engine.load_checkpoint(save_dir)

``initialize`` puts the model under ``zinf.zero.initialize`` (Note [Module hooks] in
zinf/zero.py) and returns DeepSpeed's four values: the engine (``DeepSpeedEngine``: DeepSpeed's
``forward``, ``backward``, ``step``, checkpoints, ``save_16bit_model`` and
``_zero3_consolidated_16bit_state_dict``, batch-size and learning-rate accessors), the
optimizer (a view of the engine's own: zinf steps the sharded fp32 master with its CPU kernels),
a ``torch.utils.data.DataLoader`` over ``training_data`` as DeepSpeed builds it, and the
learning-rate schedule: the config's ``"scheduler"`` (a view), the trainer's own
``lr_scheduler``, or None.

A trainer's torch optimizer (AdamW, Adam, Adagrad) is taken over as DeepSpeed's ZeRO-Offload
takes it: its hyper-parameters become the engine's optimizer config, stepped by zinf's CPU
kernels, its parameter groups the engine's, each with its own lr, betas, eps and weight_decay
(as are parameter groups given as model_parameters beside a config "optimizer"); the returned
optimizer has one param_group per group; a trainer's LR scheduler (an object, or a callable
making one from the optimizer) is stepped by the engine after each optimizer step, each
group's learning rate applied to the engine (zinf/_client_objects.py). A model with nothing to train (an inference or reference model:
every parameter frozen) runs sharded and offloaded as any other; ``backward`` and ``step`` are
refused.

What cannot work is refused with the reason: an optimizer zinf has no kernel for, parameter
groups that differ in an option other than lr, betas, eps and weight_decay, model parallelism
(``mpu``, ``mesh_param``).

The config's ``csv_monitor`` and ``tensorboard`` blocks are written here (zinf/monitor.py),
``dataloader_drop_last`` shapes the data loader, and
``zero_optimization.stage3_gather_16bit_weights_on_model_save`` decides whether
``save_16bit_model`` saves; the rest of the config is the engine's.
"""

import json
import logging
import os

import torch

from zinf import _client_objects, _engine_inputs, _logging, monitor, zero

__all__ = ["initialize", "init_distributed", "add_config_arguments", "DeepSpeedEngine"]

logger = logging.getLogger("zinf")

# Config keys this module acts on; the engine's config reader sees the rest.
_PYTHON_KEYS = ("csv_monitor", "tensorboard", "dataloader_drop_last")
# zero_optimization's keys for save_16bit_model, new name first (DeepSpeed reads either).
_GATHER_16BIT_KEYS = ("stage3_gather_16bit_weights_on_model_save",
                      "stage3_gather_fp16_weights_on_model_save")


def initialize(args=None, model=None, optimizer=None, model_parameters=None, training_data=None,
               lr_scheduler=None, distributed_port=None, mpu=None, dist_init_required=None,
               collate_fn=None, config=None, mesh_param=None, config_params=None, *,
               trainer=None, optimizer_threads=0, timeout_s=300.0, device=None,
               **trainer_values):
    """DeepSpeed's ``deepspeed.initialize``: returns (engine, optimizer, training_dataloader,
    lr_scheduler).

    args: an object with ``deepspeed_config`` (a path), as ``add_config_arguments`` adds it;
        or pass ``config`` (a dict, JSON text or a path; ``config_params`` is its old name).
    model: the ``nn.Module``: float32 CPU parameters, or floating-point parameters on one GPU
        (moved there first: ``model.to(f"cuda:{local_rank}")``), where the engine then runs.
    optimizer: optional: a torch.optim.AdamW, Adam or Adagrad over the model's trainable
        parameters (or a callable making one from them), taken over: the engine steps its
        hyper-parameters with zinf's CPU kernels (zinf/_client_objects.py); the config then
        names no "optimizer".
    model_parameters: optional; must be the model's trainable parameters (zinf trains every
        parameter with requires_grad): tensors, or parameter groups (dicts with "params" and
        their own lr, betas, eps, weight_decay), as DeepSpeed takes them; a client optimizer's
        groups stand in their place.
    lr_scheduler: optional: a scheduler over `optimizer`, or a callable making one from the
        optimizer (the one passed, else the returned one); the engine steps it after each
        optimizer step and applies its learning rate. It replaces a config "scheduler", as in
        DeepSpeed (a warning says so).
    training_data: a ``torch.utils.data.Dataset``: the returned loader gives each rank its
        share (``DistributedSampler``) in micro-batches of ``train_micro_batch_size_per_gpu``,
        through ``collate_fn``.
    dist_init_required: True initializes torch.distributed (gloo, from the environment) for the
        trainer's own collectives; zinf's engine does not need it.
    distributed_port: unused: the ranks meet where the launcher's environment says.
    trainer, **trainer_values: values for the config's "auto" keys, as Hugging Face's
        integration fills them: a ``transformers.TrainingArguments`` (or any object with its
        attribute names), a dict, or keywords (see ``zinf.zero.initialize``).
    optimizer_threads, timeout_s, device: as ``zinf.zero.initialize`` (the model computes on
        this process's GPU when torch sees one, as in DeepSpeed; device="host" keeps the CPU).
    """
    if model is None:
        raise ValueError("initialize needs a model")
    if mpu is not None or mesh_param is not None:
        raise ValueError("initialize(mpu=/mesh_param=): zinf is data-parallel only; it has no "
                         "tensor, pipeline or sequence parallelism")
    config = _config_dict(args, config, config_params)
    python_keys = {k: config.pop(k) for k in _PYTHON_KEYS if k in config}
    gather_16bit = _gather_16bit_on_save(config)
    monitors = monitor.from_config(python_keys)  # checked before the model is taken over
    param_groups = None  # [(options, parameters)]: one group when None
    if model_parameters is not None:
        model_parameters = list(model_parameters)
        _check_model_parameters(model, model_parameters)
        param_groups = _client_objects.model_parameter_groups(model_parameters)
    if dist_init_required:
        init_distributed()
    values = _trainer_values(trainer, model)
    values.update(trainer_values)
    # Checked, and the client's objects made into config, before the model is taken over.
    client_optimizer = None
    if optimizer is not None:
        trainable = [p for p in model.parameters() if p.requires_grad]
        client_optimizer = _client_objects.make_optimizer(optimizer, trainable)
        section, param_groups = _client_objects.optimizer_config(client_optimizer, trainable)
        if "optimizer" in config:
            raise ValueError(
                f"initialize(optimizer={type(client_optimizer).__name__}) and the config's "
                f"\"optimizer\" {json.dumps(config['optimizer'])[:80]}: give one (DeepSpeed "
                f"would step the object and leave the config's unused)")
        config["optimizer"] = section
        values = _client_objects.trainer_values_beside(
            config["optimizer"], _engine_inputs.trainer_values(values))
    if lr_scheduler is not None:
        _client_objects.check_scheduler(lr_scheduler, client_optimizer)
        if "scheduler" in config:
            # DeepSpeed's engine takes the client's scheduler and leaves the config's unused.
            logger.warning("config key 'scheduler' (%s) has no effect: the lr_scheduler passed "
                           "to initialize replaces it, as in DeepSpeed",
                           json.dumps(config.pop("scheduler"))[:80])
    _logging.follow_logger_level()
    if training_data is not None:
        _check_dataset(training_data)
    zero_engine = zero.initialize(model, config, trainer=values, _undoable=True,
                                  _param_groups=param_groups,
                                  optimizer_threads=optimizer_threads, timeout_s=timeout_s,
                                  device=device)
    try:
        engine = DeepSpeedEngine(zero_engine, has_scheduler="scheduler" in config,
                                 monitors=monitors.open(zero_engine.rank),
                                 drop_last=bool(python_keys.get("dataloader_drop_last", False)),
                                 collate_fn=collate_fn, gather_16bit_on_save=gather_16bit)
        if lr_scheduler is not None:
            engine._take_scheduler(_client_objects.make_scheduler(
                lr_scheduler, client_optimizer or engine.optimizer))
        loader = engine.deepspeed_io(training_data) if training_data is not None else None
    except BaseException:
        # The model holds its values again and a corrected retry works (Note [Undoing the
        # takeover] in zinf/zero.py).
        zero_engine._undo_takeover()
        raise
    zero_engine._keep_takeover()
    return engine, engine.optimizer, loader, engine.lr_scheduler


def _gather_16bit_on_save(config):
    """zero_optimization.stage3_gather_16bit_weights_on_model_save (or its old fp16 name),
    taken out of `config` (the engine's reader does not act on it): DeepSpeed's default False,
    and "auto", which DeepSpeed drops in this section, keeps it."""
    zero_section = config.get("zero_optimization")
    if not isinstance(zero_section, dict):
        return False
    zero_section = config["zero_optimization"] = dict(zero_section)  # the caller's stays whole
    value = False
    for key in reversed(_GATHER_16BIT_KEYS):  # the new name wins where both are given
        if key not in zero_section:
            continue
        given = zero_section.pop(key)
        if given == "auto":
            logger.warning("config key 'zero_optimization.%s' is \"auto\": it keeps its "
                           "default false, as in DeepSpeed, which drops \"auto\" in this "
                           "section; save_16bit_model will not save", key)
            given = False
        if not isinstance(given, bool):
            raise ValueError(f"config key 'zero_optimization.{key}' must be true or false, got "
                             f"{json.dumps(given)[:60]}")
        value = given
    return value


def _check_dataset(dataset):
    if not isinstance(dataset, torch.utils.data.Dataset):
        raise ValueError(f"training data must be a torch.utils.data.Dataset, got "
                         f"{type(dataset).__name__}")


def init_distributed(dist_backend=None, auto_mpi_discovery=True, distributed_port=None,
                     verbose=True, timeout=None, init_method=None, dist_init_required=None,
                     config=None, rank=-1, world_size=-1):
    """DeepSpeed's ``init_distributed``: torch.distributed for the trainer's own collectives
    (the engine does not need it), from the launcher's environment unless `init_method`, on
    gloo unless `dist_backend` (zinf's tensors are CPU tensors); nothing when it is initialized
    already or dist_init_required is False. MPI discovery, the port, verbose and config are
    DeepSpeed's launcher's business and unused here."""
    dist = torch.distributed
    if dist.is_initialized() or dist_init_required is False:
        return
    kwargs = {"init_method": init_method, "rank": rank, "world_size": world_size}
    if timeout is not None:
        kwargs["timeout"] = timeout
    dist.init_process_group(dist_backend or "gloo", **kwargs)


def add_config_arguments(parser):
    """DeepSpeed's ``add_config_arguments``: adds ``--deepspeed`` and ``--deepspeed_config``
    to an ``argparse`` parser and returns it."""
    group = parser.add_argument_group("DeepSpeed", "DeepSpeed configurations")
    group.add_argument("--deepspeed", default=False, action="store_true",
                       help="enable DeepSpeed (a flag for the trainer's own code)")
    group.add_argument("--deepspeed_config", default=None, type=str,
                       help="DeepSpeed JSON configuration file")
    return parser


class DeepSpeedEngine:
    """DeepSpeed's engine over a ``zinf.zero.ZeroEngine`` (``self.zero``): call it like the
    model, then ``backward(loss)`` and ``step()`` every micro-batch; the parameters change at
    each gradient accumulation boundary. Attributes it does not have are the model's, as in
    DeepSpeed."""

    def __init__(self, zero_engine, has_scheduler, monitors, drop_last=False, collate_fn=None,
                 gather_16bit_on_save=False):
        self.zero = zero_engine
        self.optimizer = EngineOptimizer(zero_engine)
        self.lr_scheduler = LRSchedulerView(self) if has_scheduler else None
        self._client_scheduler = False  # lr_scheduler is the trainer's own (_take_scheduler)
        self._gather_16bit_on_save = gather_16bit_on_save
        self.global_steps = 0     # optimizer steps, skipped ones included (as DeepSpeed)
        self.global_samples = 0
        self.skipped_steps = 0
        self.micro_steps = 0
        self.last_step = None     # the summary of the last optimizer step (ZeroEngine.step())
        self.collate_fn = collate_fn
        self._drop_last = drop_last
        self._monitors = monitors
        self._batch_loss = 0.0    # sum over this batch's micro-batches of loss / gas
        self._boundary = None     # set_gradient_accumulation_boundary's value

    # -- what DeepSpeed's engine is ----------------------------------------------------------

    @property
    def module(self):
        return self.zero.module

    @property
    def local_rank(self):
        return self.zero.local_rank

    @property
    def global_rank(self):
        return self.zero.rank

    @property
    def world_size(self):
        return self.zero.world_size

    dp_world_size = world_size

    @property
    def device(self):
        """Where the model computes: this process's GPU, else the CPU (Note [Where the model
        computes] in zinf/_device_memory.py; inputs go there: ``batch.to(engine.device)``)."""
        return self.zero.device

    def train_batch_size(self):
        return self.zero.train_batch_size

    def train_micro_batch_size_per_gpu(self):
        return self.zero.micro_batch_size

    def gradient_accumulation_steps(self):
        return self.zero.gradient_accumulation_steps

    def zero_optimization_stage(self):
        return self.zero.resolved_config["zero_stage"]

    def fp16_enabled(self):
        return self.zero.resolved_config["fp16"]

    def bfloat16_enabled(self):
        return self.zero.resolved_config["bf16"]

    def gradient_clipping(self):
        return self.zero.resolved_config["gradient_clipping"]

    def zero_gather_16bit_weights_on_model_save(self):
        """The config's zero_optimization.stage3_gather_16bit_weights_on_model_save: whether
        save_16bit_model saves (DeepSpeed's default: False)."""
        return self._gather_16bit_on_save

    def get_lr(self):
        """The learning rate of the next step, one per parameter group, as DeepSpeed lists them."""
        return [group["lr"] for group in self.optimizer.param_groups]

    def get_global_grad_norm(self):
        return None if self.last_step is None else self.last_step["grad_norm"]

    def is_gradient_accumulation_boundary(self):
        """Whether the current micro-batch's step() updates the parameters: as
        set_gradient_accumulation_boundary set it, else every gradient_accumulation_steps-th
        micro-batch."""
        if self._boundary is not None:
            return self._boundary
        return (self.micro_steps + 1) % self.gradient_accumulation_steps() == 0

    def set_gradient_accumulation_boundary(self, is_boundary):
        """DeepSpeed's override of the boundary, for a trainer that calls step() only at the
        boundary (Accelerate): from now on step() updates the parameters when is_boundary
        was last set True. A boundary after fewer than gradient_accumulation_steps backward
        calls (the last window of an epoch) steps with what they accumulated, each scaled as
        in a full window, as DeepSpeed does (Note [Short last window] in
        src/zero/engine_step.cc)."""
        self._boundary = bool(is_boundary)

    def train(self, mode=True):
        self.zero.train(mode)

    def eval(self):
        self.zero.eval()

    def zero_grad(self):
        """Nothing to do: gradients go to the engine and leave no ``param.grad``."""

    def __getattr__(self, name):
        # Only reached for names this class lacks: the model's, as DeepSpeed's engine does.
        if name in ("zero", "_monitors"):  # not set yet: __init__ failed or is running
            raise AttributeError(name)
        return getattr(self.zero.module, name)

    # -- training ----------------------------------------------------------------------------

    def forward(self, *args, **kwargs):
        return self.zero(*args, **kwargs)

    __call__ = forward

    def backward(self, loss, retain_graph=False, scale_wrt_gas=True):
        """Backward of the micro-batch's loss; returns it divided by gradient_accumulation_steps
        (as DeepSpeed). The engine averages gradients over the batch's micro-batches, which is
        DeepSpeed's scale_wrt_gas; scale_wrt_gas=False sums them instead."""
        if retain_graph:
            raise ValueError("backward(retain_graph=True): zinf takes each gradient once per "
                             "micro-batch; a second backward over the graph would add it twice")
        gas = self.gradient_accumulation_steps()
        self.zero.backward(loss if scale_wrt_gas else loss * gas)
        scaled = loss / gas if scale_wrt_gas else loss
        self._batch_loss += float(scaled.detach().mean())
        return scaled

    def step(self, lr_kwargs=None):
        """Ends the micro-batch; at a gradient accumulation boundary, the optimizer step
        (ZeroEngine.step()) and the schedule's: the config's, or the trainer's lr_scheduler
        (stepped with lr_kwargs after an applied step, as DeepSpeed's engine steps it, and
        its learning rate set on the engine for the next). Returns that step's summary (step,
        lr, time, grad_norm, ...), None between boundaries."""
        if lr_kwargs and not self._client_scheduler:
            raise ValueError("step(lr_kwargs=...): the engine's schedule comes from the config's "
                             "\"scheduler\" and takes no arguments")
        summary = None
        if self.is_gradient_accumulation_boundary():
            samples_before = self.global_samples
            summary = self.zero.step()
            if self._client_scheduler and not summary["skipped"]:
                _client_objects.step_scheduler(self.lr_scheduler, **(lr_kwargs or {}))
                self._apply_scheduled_lr()
            self.last_step = summary
            self.global_steps += 1
            self.global_samples += self.train_batch_size()
            self.skipped_steps += int(summary["skipped"])
            self._monitors.write_step(self, summary, samples_before, self._batch_loss)
            self._batch_loss = 0.0
            _logging.flush()  # the step's log lines, whichever thread wrote them
        self.micro_steps += 1
        return summary

    def _restore_client_scheduler(self, state):
        """After load_checkpoint: the trainer's lr_scheduler back where save_checkpoint found
        it (its state_dict in `state`, the checkpoint's), and its learning rate the engine's.
        ValueError when the checkpoint has no schedule to restore it from."""
        if not self._client_scheduler:
            return
        saved = state.get("lr_scheduler") if isinstance(state, dict) else None
        if saved is None:
            raise ValueError("the checkpoint holds no lr_scheduler state, and this engine steps "
                             "the trainer's lr_scheduler: its learning rates would start over")
        self.lr_scheduler.load_state_dict(saved)
        # torch's load_state_dict restores the schedule's position, not its optimizer's lr
        # (torch's optimizer checkpoint carries that): set it from the schedule.
        for group, lr in zip(self.lr_scheduler.optimizer.param_groups,
                             self.lr_scheduler.get_last_lr()):
            group["lr"] = lr
        self._apply_scheduled_lr()

    def _take_scheduler(self, scheduler):
        """The trainer's scheduler becomes the engine's lr_scheduler; the learning rate it has
        set (its constructor's step) is the first step's."""
        self.lr_scheduler = scheduler
        self._client_scheduler = True
        self._apply_scheduled_lr()

    def _apply_scheduled_lr(self):
        groups = self.optimizer.param_groups
        for group, lr in zip(groups, _client_objects.scheduled_lrs(self.lr_scheduler, len(groups))):
            if lr != group["lr"]:
                group["lr"] = lr

    # -- data --------------------------------------------------------------------------------

    def deepspeed_io(self, dataset, batch_size=None, route=None, pin_memory=False,
                     data_sampler=None, collate_fn=None, num_local_io_workers=None):
        """A DataLoader over `dataset` as DeepSpeed's: micro-batches of
        train_micro_batch_size_per_gpu, each rank its share through a DistributedSampler
        (shuffled, seed 0, the same order every epoch unless ``loader.sampler.set_epoch`` is
        called), the config's dataloader_drop_last. num_local_io_workers defaults to 0: the
        data is loaded in the training process, since worker processes forked from it would
        inherit the engine's threads mid-operation."""
        _check_dataset(dataset)
        if data_sampler is None and not isinstance(dataset, torch.utils.data.IterableDataset):
            data_sampler = torch.utils.data.DistributedSampler(
                dataset, num_replicas=self.world_size, rank=self.global_rank,
                shuffle=route not in ("eval", "predict"))
        return torch.utils.data.DataLoader(
            dataset, batch_size=batch_size or self.train_micro_batch_size_per_gpu(),
            sampler=data_sampler, collate_fn=collate_fn or self.collate_fn,
            num_workers=num_local_io_workers or 0, pin_memory=pin_memory,
            drop_last=self._drop_last)

    # -- checkpoints -------------------------------------------------------------------------

    def save_checkpoint(self, save_dir, tag=None, client_state=None, save_latest=True,
                        exclude_frozen_parameters=False):
        """Saves `save_dir`/`tag`/ (a collective; tag defaults to global_step<N>) and points
        `save_dir`/latest at it. client_state must be JSON-able (zinf's checkpoints are not
        pickles). zinf keeps only the latest checkpoint in `save_dir` (Engine::SaveCheckpoint);
        frozen parameters are saved with their values (they have no optimizer state), and
        exclude_frozen_parameters=True does not leave them out (a warning says so): a load
        restores the engine whole. A trainer's lr_scheduler is saved with its state_dict
        (which must be JSON-able), as DeepSpeed saves it."""
        if exclude_frozen_parameters:
            logger.warning("save_checkpoint(exclude_frozen_parameters=True): zinf saves the "
                           "frozen parameters too (values only, no optimizer state), so that "
                           "load_checkpoint restores the engine whole")
        if not save_latest:
            raise ValueError("save_checkpoint(save_latest=False): zinf always points 'latest' at "
                             "the newest complete checkpoint, which is how a crash mid-save "
                             "leaves the previous one loadable")
        if tag is None:
            tag = f"global_step{self.global_steps}"
        state = {"client_state": client_state or {}, "engine": self._counters()}
        try:
            json.dumps(state)
        except TypeError as e:
            raise TypeError(f"client_state must be JSON-able (zinf writes it as JSON): {e}") from e
        if self._client_scheduler:
            scheduler_state = self.lr_scheduler.state_dict()
            try:
                json.dumps(scheduler_state)
            except TypeError as e:
                raise TypeError(f"the lr_scheduler's state_dict() must be JSON-able for zinf's "
                                f"checkpoint (zinf writes it as JSON): {e}") from e
            state["lr_scheduler"] = scheduler_state
        self.zero.save_checkpoint(save_dir, str(tag), state)
        return True

    def load_checkpoint(self, load_dir, tag=None, load_module_strict=True,
                        load_optimizer_states=True, load_lr_scheduler_states=True,
                        load_module_only=False, custom_load_fn=None):
        """Restores `load_dir`/`tag` (tag None: the one `load_dir`/latest names) and returns
        (its path, client_state), or (None, None) when `load_dir` holds no checkpoint, as
        DeepSpeed. The whole training state is restored: the optimizer and the schedule's
        position go with the parameters."""
        if load_module_only or not load_optimizer_states or not load_lr_scheduler_states:
            raise ValueError("load_checkpoint restores the whole training state: the fp32 "
                             "master shards, the optimizer state and the schedule's step are "
                             "one checkpoint in zinf; load a module alone with `zinf ckpt "
                             "export` and load_state_dict")
        if custom_load_fn is not None:
            raise ValueError("load_checkpoint(custom_load_fn=...): zinf reads its own format")
        load_dir = os.fspath(load_dir)
        if tag is None:
            latest = os.path.join(load_dir, "latest")
            if not os.path.isfile(latest):
                logger.warning("unable to find a 'latest' file at %s: no checkpoint loaded",
                               latest)
                return None, None
            with open(latest) as f:
                tag = f.read().strip()
        path = os.path.join(load_dir, str(tag))
        state = self.zero.load_checkpoint(path)
        counters = state.get("engine") if isinstance(state, dict) else None
        if counters is None:  # saved by ZeroEngine.save_checkpoint: client_state alone
            return path, state
        self.global_steps = counters["global_steps"]
        self.global_samples = counters["global_samples"]
        self.skipped_steps = counters["skipped_steps"]
        # A checkpoint is taken at a boundary, so the micro-batch count is this run's
        # accumulation times the steps: a resume under another gradient_accumulation_steps (or
        # world size) at the same global batch starts on a boundary, as DeepSpeed's does.
        self.micro_steps = self.global_steps * self.gradient_accumulation_steps()
        self._restore_client_scheduler(state)
        return path, state["client_state"]

    # -- 16-bit model ------------------------------------------------------------------------

    def _zero3_consolidated_16bit_state_dict(self, exclude_frozen_parameters=False):
        """DeepSpeed's: the model's full state_dict on the CPU on rank 0 (None on the others;
        a collective: every rank calls it), parameters in the config's 16-bit dtype (bf16,
        fp16, else fp32) and buffers as they are; tied parameters share one tensor.
        exclude_frozen_parameters leaves out the parameters without requires_grad."""
        dtype = (torch.bfloat16 if self.bfloat16_enabled()
                 else torch.float16 if self.fp16_enabled() else torch.float32)
        state = self.zero.consolidated_state_dict(dtype=dtype, rank=0)
        if state is None:
            return None
        # Parameters outside the engine (frozen ones it does not take) in the same dtype,
        # buffers as they are, all on the CPU; a tensor under several names stays one.
        params = {}  # state_dict name -> the parameter
        for mname, sub in self.module.named_modules(remove_duplicate=False):
            for pname, p in sub._parameters.items():
                if p is not None:
                    params[f"{mname}.{pname}" if mname else pname] = p
        converted = {}
        for name, value in state.items():
            key = (value.data_ptr(), value.dtype, tuple(value.shape))
            if key not in converted:
                cast = dtype if name in params and value.is_floating_point() else value.dtype
                converted[key] = value.detach().to("cpu", cast)
            state[name] = converted[key]
        if exclude_frozen_parameters:
            for name, p in params.items():
                if not p.requires_grad:
                    state.pop(name, None)
        return state

    def save_16bit_model(self, save_dir, save_filename="pytorch_model.bin",
                         exclude_frozen_parameters=False):
        """DeepSpeed's: rank 0 writes ``torch.save`` of _zero3_consolidated_16bit_state_dict()
        to `save_dir`/`save_filename` (a collective: every rank calls it) and every rank returns
        True; with ZeRO-3 and stage3_gather_16bit_weights_on_model_save false it saves nothing
        and returns False, as DeepSpeed does (the shards alone are no model)."""
        path = os.path.join(os.fspath(save_dir), save_filename)
        if (self.zero_optimization_stage() == 3
                and not self.zero_gather_16bit_weights_on_model_save()):
            logger.info("Did not save the model %s because "
                        "stage3_gather_16bit_weights_on_model_save is False", path)
            return False
        state = self._zero3_consolidated_16bit_state_dict(
            exclude_frozen_parameters=exclude_frozen_parameters)
        if state is not None:
            os.makedirs(os.fspath(save_dir), exist_ok=True)
            logger.info("Saving model weights to %s", path)
            torch.save(state, path)
        self.zero.mean_over_ranks(0.0)  # no rank returns before rank 0 has written the file
        return True

    def save_fp16_model(self, save_dir, save_filename="pytorch_model.bin"):
        """save_16bit_model's old name, as DeepSpeed keeps it."""
        return self.save_16bit_model(save_dir, save_filename)

    def _counters(self):
        return {"global_steps": self.global_steps, "global_samples": self.global_samples,
                "skipped_steps": self.skipped_steps, "micro_steps": self.micro_steps}


class EngineOptimizer(torch.optim.Optimizer):
    """What DeepSpeed's initialize returns as the optimizer, over the engine's own: a parameter
    group for each of the engine's, whose "lr" reads (and, without a config scheduler, sets)
    that group's learning rate. The engine steps it in ``engine.step()``. A
    ``torch.optim.Optimizer``, so that torch's LR schedulers take it; its state is the engine's
    (engine.save_checkpoint)."""

    def __init__(self, zero_engine):
        # Not Optimizer.__init__, which would take the parameters as its own to step.
        self._zero = zero_engine
        self.defaults = {}
        self.state = {}
        groups = zero_engine.param_groups or [
            (0, [p for p in zero_engine.module.parameters() if p.requires_grad])]
        self.param_groups = [_ParamGroup(zero_engine, group, params) for group, params in groups]

    def state_dict(self):
        raise RuntimeError("the optimizer's state is the engine's, sharded over the ranks: "
                           "engine.save_checkpoint saves it")

    def load_state_dict(self, state_dict):
        raise RuntimeError("the optimizer's state is the engine's: engine.load_checkpoint "
                           "restores it")

    def add_param_group(self, param_group):
        raise RuntimeError("the engine's parameter group is fixed at initialize: it trains the "
                           "model's parameters with requires_grad=True")

    def zero_grad(self, set_to_none=True):
        """Nothing to do: gradients go to the engine and leave no ``param.grad``."""

    def step(self, closure=None):
        raise RuntimeError("the optimizer is the engine's: call engine.step() (every "
                           "micro-batch), which steps it at each gradient accumulation boundary")

    @property
    def loss_scale(self):
        return self._zero.loss_scale

    cur_scale = loss_scale


class _ParamGroup(dict):
    """One of the engine's parameter groups: "params", its options as the engine steps them,
    and a live "lr"."""

    def __init__(self, zero_engine, group, params):
        options = zero_engine.param_group(group)
        fixed = {"weight_decay": options["weight_decay"], "eps": options["eps"]}
        if options["type"] in ("adam", "adamw"):
            fixed["betas"] = options["betas"]
        super().__init__(params=params, **fixed)
        self._zero = zero_engine
        self._group = group

    def __getitem__(self, key):
        if key == "lr":
            return self._zero.param_group(self._group)["lr"]
        return super().__getitem__(key)

    def get(self, key, default=None):
        return self[key] if key == "lr" or key in self else default

    def __setitem__(self, key, value):
        if key != "lr":
            raise KeyError(f"param_groups[0]['{key}'] is fixed by the config; only 'lr' can be "
                           f"set (without a config scheduler)")
        self._zero.set_group_learning_rate(self._group, value)


class LRSchedulerView:
    """DeepSpeed's lr_scheduler (get_lr, get_last_lr, state_dict) for the config's "scheduler",
    which the engine steps itself after each optimizer step, as DeepSpeed's engine steps a
    scheduler from the config."""

    def __init__(self, engine):
        self._engine = engine

    def get_lr(self):
        return self._engine.get_lr()

    get_last_lr = get_lr

    @property
    def last_batch_iteration(self):
        return self._engine.global_steps - 1

    def step(self, last_batch_iteration=None):
        raise RuntimeError("the engine steps the config's scheduler in engine.step(), as "
                           "DeepSpeed's engine does; a second step here would skip ahead")

    def state_dict(self):
        return {"last_batch_iteration": self.last_batch_iteration}

    def load_state_dict(self, state):
        if state.get("last_batch_iteration") != self.last_batch_iteration:
            raise ValueError(f"the schedule's position is the engine's step count, restored "
                             f"with load_checkpoint; got {state}, the engine is at "
                             f"{self.state_dict()}")


def _config_dict(args, config, config_params):
    if config is None:
        config = config_params
    from_args = getattr(args, "deepspeed_config", None)
    if from_args is not None:
        if config is not None:
            raise ValueError("a config both in args.deepspeed_config and in config=: give one")
        config = from_args
    if config is None:
        raise ValueError("initialize needs a config: config= (a dict, JSON text or a path) or "
                         "args.deepspeed_config (see add_config_arguments)")
    return dict(_engine_inputs.config_dict(config))


def _check_model_parameters(model, model_parameters):
    given = list(model_parameters)
    params = []
    for item in given:
        if isinstance(item, dict):  # a parameter group (its options: model_parameter_groups)
            group = item["params"]
            params.extend([group] if isinstance(group, torch.Tensor) else group)
        else:
            params.append(item)
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    listed = {id(p) for p in params}
    if not trainable:
        return  # nothing to train (Note [Nothing to train] in zinf/zero.py): nothing to step
    if listed != trainable:
        raise ValueError(
            f"model_parameters lists {len(listed)} tensor(s), the model has {len(trainable)} "
            f"trainable parameter(s), {len(listed & trainable)} in common: zinf trains exactly "
            f"the model's parameters with requires_grad=True")


# TrainingArguments' attributes that Hugging Face's DeepSpeed integration fills "auto" keys
# from (transformers.integrations.deepspeed.HfTrainerDeepSpeedConfig).
_TRAINING_ARGUMENTS = ("per_device_train_batch_size", "gradient_accumulation_steps",
                       "max_grad_norm", "learning_rate", "adam_beta1", "adam_beta2",
                       "adam_epsilon", "weight_decay")


def _trainer_values(trainer, model):
    """The trainer's values from a dict, or read from a TrainingArguments as Hugging Face's
    integration reads them: fp16/bf16 from the training or eval flag, total and warmup steps
    when max_steps is set, the hidden size from the model's config."""
    if trainer is None:
        return {}
    if isinstance(trainer, dict):
        return dict(trainer)
    values = {name: getattr(trainer, name) for name in _TRAINING_ARGUMENTS
              if hasattr(trainer, name)}
    for flag in ("fp16", "bf16"):
        values[flag] = bool(getattr(trainer, flag, False)
                            or getattr(trainer, flag + "_full_eval", False))
    max_steps = getattr(trainer, "max_steps", -1)
    if max_steps and max_steps > 0:
        values["max_steps"] = max_steps
        if hasattr(trainer, "get_warmup_steps"):
            values["warmup_steps"] = max(1, trainer.get_warmup_steps(max_steps))
    hidden_size = getattr(getattr(model, "config", None), "hidden_size", None)
    if isinstance(hidden_size, int):
        values["hidden_size"] = hidden_size
    return values
