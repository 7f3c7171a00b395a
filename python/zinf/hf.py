"""Hugging Face's trainers on zinf. transformers' ``Trainer`` runs with its imports changed,

    from zinf.hf import Trainer, TrainingArguments   # was: from transformers import ...

and its own ``--deepspeed ds_config.json`` (Hugging Face's "auto" values filled from the
TrainingArguments, as transformers fills them for DeepSpeed). Everything else is transformers'
own Trainer, unchanged: data loading and sharding over the ranks, the loss and its
normalization over gradient accumulation, logging, callbacks, evaluation, checkpoint rotation.

Note [Trainer on zinf]
Trainer drives DeepSpeed through Accelerate (``accelerator.prepare`` calls
``deepspeed.initialize``; ``accelerator.backward`` calls the engine's backward and, at the
accumulation boundary, its step). zinf takes the same places, in the methods Trainer documents
for overriding:
- ``create_optimizer``: ``zinf.initialize`` takes the model over, with the config's optimizer
  and scheduler, or with Trainer's own optimizer and schedule where the config names none (as
  transformers' ``deepspeed_init`` passes them). Trainer gets stand-ins whose ``step`` does
  nothing, since the engine steps both, as DeepSpeed's do under Accelerate.
- ``_wrap_model``: the engine, which Trainer then keeps as ``model_wrapped`` (Accelerate leaves
  an object it does not know as it is: no DistributedDataParallel around the engine).
- ``training_step``: the micro-batch's backward goes to the engine, as Accelerate's DeepSpeed
  wrapper sends it: the boundary set, ``backward(loss, scale_wrt_gas=False)`` (Trainer has
  already normalized the loss over the accumulation) and ``step()`` at the boundary. The
  gradient norm Trainer logs is the engine's, taken before clipping.
- checkpoints: the engine's checkpoint in Trainer's ``checkpoint-N`` directory (resumed by
  ``load_checkpoint``, which also restores a client schedule), and the model's weights beside
  it, gathered from the shards (a collective) and written by ``save_pretrained`` on the main
  process, so ``from_pretrained`` loads the checkpoint and ``save_model``'s output.

Accelerate's ``Accelerator`` likewise (``from zinf.hf import Accelerator``): a script written for
Accelerate's DeepSpeed mode (a ``DeepSpeedPlugin``, or ``accelerate launch --use_deepspeed
--deepspeed_config_file``) trains on zinf with that config, Note [Accelerate on zinf].

Note [Accelerate on zinf]
Accelerate's DeepSpeed mode hands ``prepare``'s model, optimizer and scheduler to
``deepspeed.initialize`` and returns its engine; ``backward`` runs the engine's backward and,
where gradients sync (the accumulation boundary), its step; the optimizer's and scheduler's
``step`` do nothing. zinf's Accelerator does the same with ``zinf.initialize``, taking the
plugin's config (its "auto" values filled as Accelerate fills them: the micro-batch from the
first prepared DataLoader, the accumulation from the Accelerator, the optimizer's and
schedule's numbers from DummyOptim and DummyScheduler) and leaving Accelerate's own DeepSpeed
path, which needs the deepspeed package, switched off. The rest (data sharding, accumulate(),
gather, wait_for_everyone, RNG state) is Accelerate's. One model per Accelerator, as in
Accelerate's DeepSpeed mode with one plugin.
"""

import argparse
import contextlib
import copy
import dataclasses
import math
import os

import accelerate
import torch
import transformers
from accelerate.utils import DeepSpeedPlugin
from accelerate.utils.deepspeed import DummyOptim, DummyScheduler

from . import engine as _engine
from ._stand_ins import ScheduledByTheEngine as _ScheduledByTheEngine
from ._stand_ins import SteppedByTheEngine as _SteppedByTheEngine

__all__ = ["Accelerator", "Trainer", "TrainerOnZinf", "TrainingArguments", "on_zinf"]


def on_zinf(cls):
    """`cls` on zinf: a transformers.Trainer subclass (TRL's DPOTrainer, SFTTrainer, ...) as a
    subclass that trains on zinf (Note [Trainer on zinf]), or a TrainingArguments subclass
    (TRL's DPOConfig, ...) as one whose ``deepspeed`` config is zinf's. How TRL's trainers run
    on zinf by their imports: ``DPOTrainer, DPOConfig = map(zinf.hf.on_zinf, (DPOTrainer,
    DPOConfig))``. The class made is this module's ``<name>OnZinf`` (so that Trainer can pickle
    the arguments into its checkpoints), made once per class."""
    name = cls.__name__ if cls in (transformers.Trainer, transformers.TrainingArguments) \
        else cls.__name__ + "OnZinf"
    made = _ON_ZINF.get(cls)
    if made is not None:
        return made
    attributes = {"__module__": __name__, "__qualname__": name}
    if issubclass(cls, transformers.TrainingArguments):
        def __post_init__(self):
            # transformers' own DeepSpeed integration, which needs the deepspeed package,
            # never sees the config.
            self.zinf_config = self.deepspeed
            self.deepspeed = None
            cls.__post_init__(self)
        made = dataclasses.dataclass(type(name, (cls,), dict(
            attributes, __post_init__=__post_init__,
            __doc__=f"{cls.__name__}, whose deepspeed config is zinf's.")))
    elif issubclass(cls, transformers.Trainer):
        made = type(name, (TrainerOnZinf, cls), dict(
            attributes, __doc__=f"{cls.__name__} on zinf (Note [Trainer on zinf])."))
    else:
        raise TypeError(f"on_zinf({cls.__name__}): a transformers.Trainer or TrainingArguments "
                        f"subclass, please")
    _ON_ZINF[cls] = made
    globals()[name] = made
    return made


_ON_ZINF = {}


class TrainerOnZinf:
    """What zinf changes in a transformers Trainer (Note [Trainer on zinf]): a mixin before
    the Trainer class; ``on_zinf`` makes the class. Without a config (TrainingArguments from
    ``on_zinf``), the Trainer as it is."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.zinf_engine = None
        self._zinf_max_steps = None
        config = getattr(self.args, "zinf_config", None)
        if config is None and self.args.deepspeed is not None:
            raise ValueError(f"{type(self).__name__} on zinf: pass zinf.hf.TrainingArguments (or "
                             f"zinf.hf.on_zinf of your arguments class), whose deepspeed= config "
                             f"trains on zinf (transformers' own sends it to DeepSpeed)")
        self._zinf_config = config

    # -- the engine ---------------------------------------------------------------------------

    def _prepare_for_training(self, max_steps, *args, **kwargs):
        self._zinf_max_steps = max_steps  # the "auto" total and warmup steps come from it
        return super()._prepare_for_training(max_steps, *args, **kwargs)

    def create_optimizer(self, model=None):
        if self._zinf_config is None:
            return super().create_optimizer(model)
        if self.zinf_engine is not None:
            return self.optimizer
        config = _engine._config_dict(None, self._zinf_config, None)
        _check_mixed_precision(self.args, config)
        client_optimizer = None
        if "optimizer" not in config:
            client_optimizer = super().create_optimizer(model)  # decay and no-decay groups
        lr_scheduler = None
        if "scheduler" not in config:
            def lr_scheduler(optimizer):
                self.lr_scheduler = None
                return self.create_scheduler(self._zinf_max_steps, optimizer=optimizer)
        values = {}
        if self._zinf_max_steps is not None and self._zinf_max_steps > 0:
            values = {"max_steps": self._zinf_max_steps,
                      "warmup_steps": max(1, self.args.get_warmup_steps(self._zinf_max_steps))}
        engine, optimizer, _, scheduler = _engine.initialize(
            model=self.model, config=config, optimizer=client_optimizer,
            lr_scheduler=lr_scheduler, trainer=self.args, **values)
        self.zinf_engine = engine
        self.optimizer = _SteppedByTheEngine(optimizer)
        self.lr_scheduler = _ScheduledByTheEngine(engine, scheduler)
        self._take_reference_model(config)
        return self.optimizer

    def _take_reference_model(self, config):
        """TRL's reference model (``ref_model``, beside the policy) sharded and offloaded as the
        policy is, by an engine with nothing to train, where DeepSpeed's integration makes it an
        inference engine (trl's prepare_deepspeed)."""
        ref = getattr(self, "ref_model", None)
        if not isinstance(ref, torch.nn.Module):
            return
        # Accelerate's autocast wrapper, which TRL's __init__ put on its forward outside
        # DeepSpeed's mode: the engine's config sets the precision, the policy's and this one's.
        ref = accelerate.utils.extract_model_from_parallel(ref, keep_fp32_wrapper=False)
        for p in ref.parameters():
            p.requires_grad_(False)  # a reference: never trained (Note [Nothing to train])
        ref_config = {k: v for k, v in config.items() if k not in ("optimizer", "scheduler")}
        self.ref_model = _engine.initialize(model=ref, config=ref_config, trainer=self.args)[0]
        self.ref_model.eval()

    def create_scheduler(self, num_training_steps, optimizer=None):
        if self.zinf_engine is not None:
            return self.lr_scheduler  # the engine's (create_optimizer), stepped by the engine
        return super().create_scheduler(num_training_steps, optimizer)

    def _wrap_model(self, model, training=True, dataloader=None):
        if self.zinf_engine is not None:
            return self.zinf_engine
        return super()._wrap_model(model, training, dataloader)

    # -- backward and step --------------------------------------------------------------------

    def training_step(self, model, inputs, num_items_in_batch=None):
        if self.zinf_engine is None:
            return super().training_step(model, inputs, num_items_in_batch)
        with self._backward_to_the_engine():
            return super().training_step(model, inputs, num_items_in_batch)

    @contextlib.contextmanager
    def _backward_to_the_engine(self):
        accelerator = self.accelerator
        engine = self.zinf_engine

        def backward(loss, **unused):
            boundary = accelerator.sync_gradients
            engine.set_gradient_accumulation_boundary(boundary)
            engine.backward(loss, scale_wrt_gas=False)  # Trainer normalized it already
            engine.step()  # the optimizer step at the boundary, else only the count

        accelerator.backward = backward
        try:
            yield
        finally:
            del accelerator.backward  # the class's again

    def _clip_grad_norm(self, model):
        return self._get_grad_norm(model)  # the engine clipped, with gradient_clipping

    def _get_grad_norm(self, model, grad_norm=None):
        if self.zinf_engine is None:
            return super()._get_grad_norm(model, grad_norm)
        return self.zinf_engine.get_global_grad_norm()

    # -- checkpoints --------------------------------------------------------------------------

    def _save_optimizer_and_scheduler(self, output_dir):
        if self.zinf_engine is None:
            return super()._save_optimizer_and_scheduler(output_dir)
        tag = f"global_step{self.state.global_step}"
        if _latest_tag(output_dir) == tag:
            # An earlier run's checkpoint of the same step: Trainer replaces its files, and
            # zinf, which never overwrites its latest checkpoint (a crash mid-save would leave
            # none), saves beside it and then removes it.
            tag += "-again"
        self.zinf_engine.save_checkpoint(output_dir, tag=tag)

    def _load_optimizer_and_scheduler(self, checkpoint):
        if self.zinf_engine is None or checkpoint is None:
            return super()._load_optimizer_and_scheduler(checkpoint)
        self.zinf_engine.load_checkpoint(checkpoint)

    def save_model(self, output_dir=None, _internal_call=False):
        if self.zinf_engine is None:
            return super().save_model(output_dir, _internal_call)
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        # A collective: every rank gathers, the main process writes.
        state = self.zinf_engine._zero3_consolidated_16bit_state_dict()
        self._save(output_dir, state_dict=state)
        self.zinf_engine.zero.mean_over_ranks(0.0)  # no rank goes on before the files are in
        if self.args.push_to_hub and not _internal_call:
            self.push_to_hub(commit_message="Model save", revision=self.args.hub_revision)


def _check_mixed_precision(args, config):
    """ValueError where the trainer asks for bf16 or fp16 (TrainingArguments' flags,
    Accelerate's mixed_precision) and the config has no section for it: zinf computes in its
    config's precision, as DeepSpeed does (Accelerate's autocast is not put around the
    engine), so the setting would be ignored."""
    for flag, sections in (("bf16", ("bf16", "bfloat16")), ("fp16", ("fp16",))):
        if getattr(args, flag, False) and not any(k in config for k in sections):
            raise ValueError(
                f"TrainingArguments({flag}=True): zinf computes in its config's precision, as "
                f"DeepSpeed does, and the config has no \"{flag}\" section, so the flag would "
                f"be ignored; add \"{flag}\": {{\"enabled\": \"auto\"}} to the config, or set "
                f"{flag}=False")


def _latest_tag(directory):
    try:
        with open(os.path.join(directory, "latest")) as f:
            return f.read().strip()
    except FileNotFoundError:
        return None


TrainingArguments = on_zinf(transformers.TrainingArguments)
Trainer = on_zinf(transformers.Trainer)


class Accelerator(accelerate.Accelerator):
    """Accelerate's Accelerator, training on zinf where it would train on DeepSpeed (Note
    [Accelerate on zinf]); without a DeepSpeed config, Accelerate's as it is."""

    def __init__(self, *args, deepspeed_plugin=None, deepspeed_plugins=None, **kwargs):
        plugin = deepspeed_plugin if deepspeed_plugin is not None else deepspeed_plugins
        if plugin is None and os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true":
            plugin = DeepSpeedPlugin()  # accelerate launch's --deepspeed_config_file and flags
        if isinstance(plugin, dict):
            raise ValueError("zinf.hf.Accelerator: several DeepSpeed plugins (one per model) "
                             "are not supported; pass one DeepSpeedPlugin")
        self.zinf_config = None if plugin is None else copy.deepcopy(plugin.deepspeed_config)
        if self.zinf_config is not None and self.zinf_config.get("steps_per_print") == math.inf:
            # The plugin's default, DeepSpeed's "never": zinf prints no step lines either way
            # (it ignores the key), and JSON has no infinity.
            del self.zinf_config["steps_per_print"]
        self.zinf_engine = None
        if plugin is not None:
            # Accelerate's own DeepSpeed path (it sets this itself for a plugin) needs the
            # deepspeed package; zinf takes the plugin's config instead.
            os.environ["ACCELERATE_USE_DEEPSPEED"] = "false"
            # Without a GPU, DeepSpeed's mode runs its processes on its CPU accelerator, where
            # Accelerate alone needs cpu=True for them to be one job.
            if not torch.cuda.is_available():
                kwargs["cpu"] = True
        super().__init__(*args, **kwargs)

    def prepare(self, *args, device_placement=None):
        if self.zinf_config is None:
            return super().prepare(*args, device_placement=device_placement)
        models = [a for a in args if isinstance(a, torch.nn.Module)]
        if len(models) != 1 or self.zinf_engine is not None:
            raise ValueError("zinf.hf.Accelerator.prepare: pass the one model to train in one "
                             "prepare call, with its optimizer (and scheduler, dataloaders), as "
                             "Accelerate's DeepSpeed mode takes them")
        out = [super(Accelerator, self).prepare(a) if isinstance(a, torch.utils.data.DataLoader)
               else a for a in args]
        loaders = [a for a in args if isinstance(a, torch.utils.data.DataLoader)]
        optimizers = [a for a in args if isinstance(a, (torch.optim.Optimizer, DummyOptim))]
        schedulers = [a for a in args if _is_scheduler(a)]
        if len(optimizers) > 1 or len(schedulers) > 1:
            raise ValueError("zinf.hf.Accelerator.prepare: one optimizer and one scheduler for "
                             "the model, as DeepSpeed takes them")
        optimizer = optimizers[0] if optimizers else None
        scheduler = schedulers[0] if schedulers else None
        precision = str(getattr(self.mixed_precision, "value", self.mixed_precision))
        _check_mixed_precision(
            argparse.Namespace(bf16=precision == "bf16", fp16=precision == "fp16"),
            self.zinf_config)
        values = {"gradient_accumulation_steps": self.gradient_accumulation_steps,
                  "bf16": precision == "bf16", "fp16": precision == "fp16"}
        if loaders and loaders[0].batch_size is not None:
            values["per_device_train_batch_size"] = loaders[0].batch_size
        if isinstance(optimizer, DummyOptim):
            values.update(learning_rate=optimizer.lr, weight_decay=optimizer.weight_decay)
            optimizer = None
        if isinstance(scheduler, DummyScheduler):
            if scheduler.total_num_steps is not None:
                values["max_steps"] = scheduler.total_num_steps
            values["warmup_steps"] = max(1, scheduler.warmup_num_steps)
            scheduler = None
        engine, engine_optimizer, _, engine_scheduler = _engine.initialize(
            model=models[0], config=self.zinf_config, optimizer=optimizer,
            lr_scheduler=scheduler, trainer=values)
        self.zinf_engine = engine
        stand_ins = {id(models[0]): engine}
        for a in optimizers:
            stand_ins[id(a)] = _SteppedByTheEngine(engine_optimizer)
        for a in schedulers:
            stand_ins[id(a)] = _ScheduledByTheEngine(engine, engine_scheduler)
        out = [stand_ins.get(id(a), o) for a, o in zip(args, out)]
        return out[0] if len(out) == 1 else tuple(out)

    def backward(self, loss, **kwargs):
        engine = self.zinf_engine
        if engine is None:
            return super().backward(loss, **kwargs)
        engine.set_gradient_accumulation_boundary(self.sync_gradients)
        engine.backward(loss, **kwargs)  # averaged over the accumulation, as DeepSpeed's
        engine.step()  # the optimizer step where gradients sync, else only the count

    def clip_grad_norm_(self, parameters, max_norm, norm_type=2):
        """The engine clips in its step with the config's gradient_clipping (DeepSpeed's mode
        returns None here); this returns the norm before clipping, and refuses a max_norm the
        engine does not clip with rather than pretend."""
        engine = self.zinf_engine
        if engine is None:
            return super().clip_grad_norm_(parameters, max_norm, norm_type)
        if norm_type != 2 or float(max_norm) != engine.gradient_clipping():
            raise ValueError(
                f"clip_grad_norm_(max_norm={max_norm}, norm_type={norm_type}): zinf clips in "
                f"its step, to the config's gradient_clipping ({engine.gradient_clipping()}) "
                f"in the L2 norm; set the config's value instead")
        norm = engine.get_global_grad_norm()
        return None if norm is None else torch.tensor(norm)

    def unwrap_model(self, model, *args, **kwargs):
        if self.zinf_engine is not None and model is self.zinf_engine:
            return model.module
        return super().unwrap_model(model, *args, **kwargs)

    def get_state_dict(self, model, unwrap=True):
        """With zinf: the model's values gathered from the shards onto the main process (a
        collective), as DeepSpeed's ZeRO-3 gives them; an empty dict on the other processes,
        which write nothing (save_pretrained(state_dict=None) would read the shards there)."""
        if self.zinf_engine is not None and model in (self.zinf_engine, self.zinf_engine.module):
            state = self.zinf_engine._zero3_consolidated_16bit_state_dict()
            return {} if state is None else state
        return super().get_state_dict(model, unwrap)

    def save_state(self, output_dir=None, **kwargs):
        path = super().save_state(output_dir, **kwargs)  # RNG, dataloaders, custom objects
        if self.zinf_engine is not None:
            self.zinf_engine.save_checkpoint(os.path.join(path, "zinf"))
        return path

    def load_state(self, input_dir=None, **kwargs):
        if self.zinf_engine is not None and input_dir is None:
            raise ValueError("load_state(): name the directory save_state wrote (zinf resumes "
                             "the engine from its checkpoint there)")
        out = super().load_state(input_dir, **kwargs)
        if self.zinf_engine is not None:
            self.zinf_engine.load_checkpoint(os.path.join(input_dir, "zinf"))
        return out


def _is_scheduler(obj):
    return isinstance(obj, (torch.optim.lr_scheduler.LRScheduler, DummyScheduler))
