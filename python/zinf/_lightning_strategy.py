"""The Lightning strategy for zinf, built over whichever Lightning package the script imports:
``lightning.pytorch`` (zinf.lightning) or the older ``pytorch_lightning`` (zinf.pytorch_lightning),
whose Trainers take only their own package's Strategy classes.

Note [Lightning on zinf]
The strategy is Lightning's DDP strategy (processes, torch.distributed for Lightning's own
collectives, the distributed sampler) with the model step taken by zinf in the places
Lightning's DeepSpeed strategy takes it:
- setup: the LightningModule's ``configure_optimizers`` result (one torch optimizer, its
  scheduler) or the config's "optimizer"/"scheduler" go to ``zinf.initialize`` with the
  module; "auto" values come from the Trainer (accumulate_grad_batches, gradient_clip_val, the
  train dataloader's batch size). The engine is the strategy's model, so Lightning's
  training_step, validation_step and predict_step run through it, fetching as they go.
- accumulation is Lightning's (global_step counts optimizer steps, the loss is normalized by
  Lightning); the micro-batch's backward goes to the engine, and the optimizer step Lightning
  makes at the boundary is the engine's step, which also steps the scheduler. Lightning's own
  scheduler stepping and gradient clipping do nothing (the engine clips, to gradient_clip_val,
  by norm only: clipping by value is refused).
- checkpoints: a directory holding the engine's checkpoint, and ``lightning_state.pt`` with
  Lightning's state and the model's weights gathered from the shards, so that
  ``LightningModule.load_from_checkpoint(dir + "/lightning_state.pt")`` loads them; resuming
  (``ckpt_path=dir``) restores the engine bit for bit.
"""

import os

import torch

from . import engine as _engine
from ._stand_ins import ScheduledByTheEngine, SteppedByTheEngine

_OFFLOAD = {"offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"}}
_LIGHTNING_STATE = "lightning_state.pt"


def strategy_classes(pl, module_name):
    """(ZinfStrategy, its precision plugin) over Lightning package `pl`, named as members of
    `module_name` (where they are exposed, so that they pickle by reference), with the
    strategy names registered in `pl`'s StrategyRegistry."""
    DDPStrategy = pl.strategies.DDPStrategy
    Precision = pl.plugins.precision.Precision

    class ZinfStrategy(DDPStrategy):
        """Lightning's strategy for zinf (Note [Lightning on zinf]). `config`: a DeepSpeed
        config (dict, JSON text or path); `offload`: without a config, parameters and optimizer
        state on the CPU."""

        strategy_name = "zinf"

        def __init__(self, config=None, offload=False, **kwargs):
            super().__init__(**kwargs)
            if config is None:
                config = {"zero_optimization": {"stage": 3, **(_OFFLOAD if offload else {})}}
            self._zinf_config = _engine._config_dict(None, config, None)
            # What Lightning's Trainer decides, unless the config says it (a number the Trainer
            # contradicts is refused, naming both).
            for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                        "gradient_clipping"):
                self._zinf_config.setdefault(key, "auto")
            self.zinf_engine = None

        @property
        def handles_gradient_accumulation(self):
            return False  # Lightning's: it steps at the boundary, as without zinf

        def setup(self, trainer):
            if type(self.precision_plugin) not in (Precision, _ZinfPrecision):
                raise ValueError(
                    f"Trainer(precision=...) gave {type(self.precision_plugin).__name__}: zinf "
                    f"computes in its config's precision (its bf16 or fp16 section); leave the "
                    f"Trainer's precision at 32")
            self.precision_plugin = _ZinfPrecision()  # the backward and the step are the engine's
            self.accelerator.setup(trainer)
            module = self.lightning_module
            optimizer = scheduler = None
            scheduler_config = None
            if trainer.state.fn == pl.trainer.states.TrainerFn.FITTING:
                if "optimizer" not in self._zinf_config:
                    self.setup_optimizers(trainer)  # configure_optimizers
                    if len(self.optimizers) != 1 or len(self.lr_scheduler_configs) > 1:
                        raise ValueError(
                            f"zinf's strategy trains with one optimizer (and at most one "
                            f"scheduler); configure_optimizers gave {len(self.optimizers)} and "
                            f"{len(self.lr_scheduler_configs)}")
                    optimizer = self.optimizers[0]
                    if self.lr_scheduler_configs:
                        scheduler_config = self.lr_scheduler_configs[0]
                        if scheduler_config.interval != "step" or scheduler_config.frequency != 1:
                            raise ValueError(
                                "zinf's engine steps the scheduler after each optimizer step: "
                                "return it with interval 'step' and frequency 1")
                        scheduler = scheduler_config.scheduler
            algorithm = trainer.gradient_clip_algorithm
            name = str(getattr(algorithm, "value", algorithm))
            if algorithm is not None and name != "norm":
                raise ValueError(f"gradient_clip_algorithm='{name}': zinf clips by the global L2 "
                                 f"norm only ('norm')")
            values = {"gradient_accumulation_steps": trainer.accumulate_grad_batches,
                      "max_grad_norm": float(trainer.gradient_clip_val or 0.0)}
            batch_size = _train_batch_size(trainer)
            if batch_size is not None:
                values["per_device_train_batch_size"] = batch_size
            # Lightning's process group is made; zinf's rendezvous reads the launcher's variables,
            # of which Lightning's own launch sets WORLD_SIZE but not RANK.
            os.environ.setdefault("RANK", str(self.global_rank))
            os.environ.setdefault("LOCAL_RANK", str(self.local_rank))
            engine, engine_optimizer, _, engine_scheduler = _engine.initialize(
                model=module, config=self._zinf_config, optimizer=optimizer,
                lr_scheduler=scheduler, trainer=values)
            engine.set_gradient_accumulation_boundary(False)  # the optimizer step sets it
            self.zinf_engine = engine
            self.model = engine
            if trainer.state.fn == pl.trainer.states.TrainerFn.FITTING:
                self.optimizers = [SteppedByTheEngine(engine_optimizer)]
                if scheduler_config is not None:
                    scheduler_config.scheduler = ScheduledByTheEngine(engine, engine_scheduler)
            self.barrier()

        def _setup_model(self, model):
            return model  # no DistributedDataParallel: the engine reduces the gradients

        # -- checkpoints -----------------------------------------------------------------------

        def lightning_module_state_dict(self):
            """The module's values gathered from the shards (a collective; on the main process, an
            empty dict elsewhere), kept in lightning_state.pt beside the engine's checkpoint."""
            state = self.zinf_engine._zero3_consolidated_16bit_state_dict()
            return {} if state is None else state

        def optimizer_state(self, optimizer):
            return {}  # the engine's checkpoint holds it

        def save_checkpoint(self, checkpoint, filepath, storage_options=None):
            if storage_options is not None:
                raise TypeError("zinf's strategy writes its checkpoint directory itself: "
                                "storage_options is not used")
            filepath = self.broadcast(os.fspath(filepath))
            self.zinf_engine.save_checkpoint(filepath)
            if self.is_global_zero:
                state = {k: v for k, v in checkpoint.items() if k != "optimizer_states"}
                torch.save(state, os.path.join(filepath, _LIGHTNING_STATE))
            self.barrier()

        @property
        def restore_checkpoint_after_setup(self):
            return True  # the engine exists from setup on

        @property
        def lightning_restore_optimizer(self):
            return False  # the engine restores its optimizer

        def load_checkpoint(self, checkpoint_path, weights_only=None):
            checkpoint_path = self.broadcast(os.fspath(checkpoint_path))
            self.zinf_engine.load_checkpoint(checkpoint_path)
            return torch.load(os.path.join(checkpoint_path, _LIGHTNING_STATE), weights_only=False)

        def load_model_state_dict(self, checkpoint, strict=True):
            """Nothing: load_checkpoint restored the engine, the weights with it."""

        def load_optimizer_state_dict(self, checkpoint):
            """Nothing: load_checkpoint restored the engine's optimizer."""

        @classmethod
        def register_strategies(cls, registry):
            registry.register("zinf", cls, description="zinf: ZeRO stage 3, state in memory")
            registry.register("zinf_stage_3_offload", cls, offload=True,
                              description="zinf: ZeRO stage 3, parameters and optimizer on the CPU")

    class _ZinfPrecision(Precision):
        """fp32 as Lightning computes it, with the backward and the step the engine's (the
        config's bf16/fp16 sections set the engine's precision)."""

        def backward(self, tensor, model, optimizer, *args, **kwargs):
            # Lightning normalized the loss over the accumulation already.
            model.trainer.strategy.zinf_engine.backward(tensor, scale_wrt_gas=False)

        def optimizer_step(self, optimizer, model, closure, **kwargs):
            engine = model.trainer.strategy.zinf_engine
            engine.set_gradient_accumulation_boundary(True)
            try:
                result = closure()  # the boundary micro-batch's training_step and backward
                engine.step()
            finally:
                engine.set_gradient_accumulation_boundary(False)
            return result

        def clip_gradients(self, optimizer, clip_val=0.0, gradient_clip_algorithm=None):
            """Nothing: the engine clips in its step."""

    for cls in (ZinfStrategy, _ZinfPrecision):
        cls.__module__ = module_name
        cls.__qualname__ = cls.__name__
    ZinfStrategy.register_strategies(pl.strategies.StrategyRegistry)
    return ZinfStrategy, _ZinfPrecision


def _train_batch_size(trainer):
    """The train dataloader's batch size, as Lightning's DeepSpeed strategy reads it; None when
    it has none to give."""
    try:
        loader = trainer.fit_loop._data_source.dataloader()
    except Exception:  # no fit loop data yet (validate, predict) or a source that cannot say
        return None
    return getattr(loader, "batch_size", None)
