"""What a trainer that drives DeepSpeed through its own loop (transformers' Trainer,
Accelerate, Lightning) holds as its optimizer and scheduler once zinf's engine steps both: the
engine's parameter groups and learning rate, read live, with steps that do nothing, as
DeepSpeed's wrappers in those trainers do (zinf/hf.py, zinf/lightning.py)."""

import torch


class SteppedByTheEngine(torch.optim.Optimizer):
    """The trainer's optimizer: the engine's parameter groups (their live "lr"), with a step
    that only runs its closure, since the engine steps at the boundary. Its state is in the
    engine's checkpoint; its state_dict is a marker Accelerate may move and load back."""

    def __init__(self, optimizer):
        self._optimizer = optimizer  # not Optimizer.__init__: it owns no parameters
        self.defaults = {}
        self.state = {}
        self.param_groups = optimizer.param_groups

    def step(self, closure=None):
        return closure() if closure is not None else None

    def zero_grad(self, set_to_none=True):
        """Nothing to do: gradients go to the engine and leave no ``param.grad``."""

    def state_dict(self):
        return {"zinf": "the optimizer state is in the engine's checkpoint"}

    def load_state_dict(self, state_dict):
        if state_dict != self.state_dict():
            raise ValueError("the optimizer state is the engine's: it is resumed from the "
                             "engine's checkpoint (load_checkpoint)")


class ScheduledByTheEngine:
    """The trainer's lr_scheduler: the schedule the engine steps after each optimizer step (the
    config's, or the trainer's own handed to it), read here; step does nothing."""

    def __init__(self, engine, scheduler):
        self._engine = engine
        self._scheduler = scheduler

    def step(self, *unused, **unused_kwargs):
        return None

    def get_last_lr(self):
        # What torch's scheduler reports when a trainer logs, between the optimizer's step and
        # its own: the rate the last step applied (before any: the first step's).
        last = self._engine.last_step
        return [last["lr"]] if last is not None else self._engine.get_lr()

    get_lr = get_last_lr

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        return None
