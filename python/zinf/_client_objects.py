"""A trainer's own torch optimizer and LR scheduler under ``zinf.initialize``, taken as
DeepSpeed's engine takes them.

- ``optimizer=`` a ``torch.optim.AdamW``, ``Adam`` or ``Adagrad`` (or a callable that makes one
  from the parameters, as DeepSpeed accepts): what DeepSpeed's ZeRO-Offload does with a client
  optimizer is step its parameter groups' shards on the CPU; zinf reads the optimizer's type
  and hyper-parameters into the engine's ``"optimizer"`` config and steps the shards with its
  own CPU kernels, which compute torch's formulas (include/zinf/cpu_optimizer.h). Its
  parameter groups become the engine's, each with its own lr, betas, eps and weight_decay
  (Note [Parameter groups] in src/zero/optimizer_step.cc): Hugging Face's Trainer puts biases
  and norms in a group without weight decay. The torch object itself is never stepped.
  Refused, naming why: another type (zinf has no kernel for it), an option the kernels do not
  compute (amsgrad, maximize, Adagrad's lr_decay), groups that differ in another option, one
  that has stepped already (its state would be lost), and a config "optimizer" beside it.
- ``model_parameters=`` parameter groups (dicts with "params" and options), as DeepSpeed takes
  them beside a config "optimizer": each group steps with the config's options but those it
  sets (``model_parameter_groups``).
- ``lr_scheduler=`` a scheduler object (over that optimizer) or a callable that makes one from
  the optimizer, as transformers passes it: the engine steps it after each optimizer step that
  was applied, as DeepSpeed's does, and the learning rate it leaves in its optimizer's groups
  becomes the engine's for the next step, each group's its own (torch's LambdaLR scales each
  group's initial lr). A config "scheduler" beside it is not used, as in DeepSpeed, with a
  warning naming it.
"""

import logging
import warnings

import torch

logger = logging.getLogger("zinf")

# The torch optimizers zinf's CPU kernels compute, by exact type: a subclass may step otherwise.
_KERNELS = {torch.optim.AdamW: "AdamW", torch.optim.Adam: "Adam", torch.optim.Adagrad: "Adagrad"}
# Options that choose torch's implementation, not the numbers: any value is zinf's kernel.
_IMPLEMENTATION = ("foreach", "fused", "capturable", "differentiable")
# Options that must keep the value zinf's kernels compute, by type.
_FIXED = {"AdamW": {"amsgrad": False, "maximize": False},
          "Adam": {"amsgrad": False, "maximize": False},
          "Adagrad": {"lr_decay": 0, "initial_accumulator_value": 0, "maximize": False}}
# What the engine's config takes from the group, by type.
_READ = {"AdamW": ("lr", "betas", "eps", "weight_decay"),
         "Adam": ("lr", "betas", "eps", "weight_decay", "decoupled_weight_decay"),
         "Adagrad": ("lr", "eps", "weight_decay")}
# Options each parameter group may set for itself, by type: the engine gives each group its own.
_PER_GROUP = {"AdamW": ("lr", "betas", "eps", "weight_decay"),
              "Adam": ("lr", "betas", "eps", "weight_decay"),
              "Adagrad": ("lr", "eps", "weight_decay")}
# Keys of a group that are no option of the update: torch's LR schedulers record initial_lr.
_NOT_OPTIONS = ("params", "initial_lr") + _IMPLEMENTATION
# The trainer's values that fill only the config optimizer's params: a client optimizer's
# own numbers stand in their place.
_OPTIMIZER_TRAINER_VALUES = ("beta1", "beta2", "eps", "weight_decay")


def make_optimizer(optimizer, trainable):
    """The torch optimizer object: `optimizer` itself, or what a callable makes of the trainable
    parameters (DeepSpeed calls it with model_parameters)."""
    if isinstance(optimizer, torch.optim.Optimizer):
        return optimizer
    if callable(optimizer):
        made = optimizer(trainable)
        if not isinstance(made, torch.optim.Optimizer):
            raise TypeError(f"initialize(optimizer=callable): it returned "
                            f"{type(made).__name__}, not a torch.optim.Optimizer")
        return made
    raise TypeError(f"initialize(optimizer=...) must be a torch.optim.Optimizer or a callable "
                    f"that makes one from the parameters, got {type(optimizer).__name__}")


def optimizer_config(optimizer, trainable):
    """The engine's "optimizer" config section for a client torch optimizer over exactly the
    `trainable` parameters (its first group's options), and its parameter groups as
    [(the options in which a group differs from the first, its parameters)]; ValueError naming
    what zinf cannot step as it would."""
    name = _KERNELS.get(type(optimizer))
    if name is None:
        raise ValueError(
            f"initialize(optimizer={type(optimizer).__module__}.{type(optimizer).__name__}): "
            f"zinf steps a client optimizer with its own CPU kernels, which exist for "
            f"torch.optim.AdamW, torch.optim.Adam and torch.optim.Adagrad (and Lion, in the "
            f"config); pass one of those, or name the optimizer in the config's \"optimizer\"")
    # Adagrad makes its state (step 0, zero sums) in its constructor; a step makes it count.
    stepped = [s for s in optimizer.state.values() if float(s.get("step", 1)) > 0]
    if stepped:
        raise ValueError(
            f"initialize(optimizer={name}): it has stepped already and holds state for "
            f"{len(stepped)} parameter(s), which zinf's optimizer would not start from; "
            f"pass it before its first step (resume from an engine checkpoint instead)")
    # Groups without parameters are dropped, as DeepSpeed drops them.
    groups = [g for g in optimizer.param_groups if len(g["params"]) != 0]
    if not groups:
        raise ValueError(f"initialize(optimizer={name}): it has no parameters")
    first = groups[0]
    per_group = _PER_GROUP[name]
    for i, group in enumerate(groups[1:], start=1):
        for key in sorted(set(first) | set(group)):
            if key in _NOT_OPTIONS or key in per_group:
                continue
            if _value(first.get(key)) != _value(group.get(key)):
                raise ValueError(
                    f"initialize(optimizer={name}): parameter groups 0 and {i} differ in "
                    f"'{key}' ({_value(first.get(key))} and {_value(group.get(key))}); zinf's "
                    f"engine gives each group its own {', '.join(per_group)}, and one '{key}' "
                    f"to all. Give every group the same '{key}' (or freeze the parameters "
                    f"meant to stay unchanged with requires_grad=False)")
    listed = {id(p) for g in groups for p in g["params"]}
    want = {id(p) for p in trainable}
    if listed != want:
        raise ValueError(
            f"initialize(optimizer={name}): it steps {len(listed)} tensor(s), the model has "
            f"{len(want)} trainable parameter(s), {len(listed & want)} in common: zinf trains "
            f"exactly the model's parameters with requires_grad=True")
    for key, value in _FIXED[name].items():
        if key in first and _value(first[key]) != value:
            raise ValueError(
                f"initialize(optimizer={name}): its '{key}' is {_value(first[key])}; zinf's CPU "
                f"kernel computes {name} with {key}={value} only")
    params = {key: _value(first[key]) for key in _READ[name] if key in first}
    if name == "Adam":
        # torch's Adam adds weight decay to the gradient (L2), DeepSpeed's "Adam" with
        # adam_w_mode false; with decoupled_weight_decay (torch 2.6) it is AdamW.
        if params.pop("decoupled_weight_decay", False):
            name = "AdamW"
        else:
            params["adam_w_mode"] = False
    if "betas" in params:
        params["betas"] = [float(b) for b in params["betas"]]
    param_groups = [({k: _option(k, group[k]) for k in per_group
                      if k in group and _value(group[k]) != _value(first.get(k))},
                     list(group["params"])) for group in groups]
    return {"type": name, "params": params}, param_groups


def model_parameter_groups(model_parameters):
    """DeepSpeed's model_parameters as parameter groups [(options, parameters)]: each dict a
    group with its options, the loose tensors one group (first); None when there is no dict
    (one group). ValueError naming an option a group cannot set for itself."""
    items = list(model_parameters)
    if not any(isinstance(item, dict) for item in items):
        return None
    loose = [item for item in items if not isinstance(item, dict)]
    groups = [({}, loose)] if loose else []
    allowed = sorted(set(_PER_GROUP["AdamW"]) | set(_PER_GROUP["Adagrad"]))
    for i, item in enumerate(x for x in items if isinstance(x, dict)):
        other = sorted(k for k in item if k not in allowed and k not in _NOT_OPTIONS)
        if other:
            raise ValueError(
                f"model_parameters' group {i} sets {other}; a group sets its own {allowed} in "
                f"zinf, and the config's \"optimizer\" gives the rest to all")
        params = item["params"]
        params = [params] if isinstance(params, torch.Tensor) else list(params)
        groups.append(({k: _option(k, v) for k, v in item.items() if k in allowed}, params))
    return [g for g in groups if g[1]]  # groups without parameters are dropped


def add_param_groups(engine, groups):
    """`groups` [(options, parameters)] as the engine's optimizer groups, before its parameters
    are registered: a first group without options of its own is the config's optimizer (group
    0), every other group one of its own (the config's options but those it sets), so that a
    scheduler may give each its own learning rate. Returns [(engine group, parameters)] and
    {id(parameter): engine group}."""
    out, group_of = [], {}
    for i, (options, params) in enumerate(groups or []):
        group = 0 if i == 0 and not options else engine.add_param_group(options)
        out.append((group, params))
        group_of.update((id(p), group) for p in params)
    return out, group_of


def _option(key, value):
    value = _value(value)
    return [float(b) for b in value] if key == "betas" else value


def trainer_values_beside(optimizer_section, values):
    """The trainer's values without those the client optimizer's own numbers replace; ValueError
    when the trainer's learning rate (which also fills the scheduler's "auto") is another."""
    out = {k: v for k, v in values.items() if k not in _OPTIMIZER_TRAINER_VALUES}
    lr = optimizer_section["params"].get("lr")
    if "lr" in out and lr is not None and out["lr"] != lr:
        raise ValueError(f"the optimizer passed to initialize has lr {lr}, the trainer's "
                         f"learning rate is {out['lr']}: make them agree")
    return out


def _value(v):
    if isinstance(v, torch.Tensor):
        return v.tolist()
    if isinstance(v, tuple):
        return [_value(x) for x in v]
    return v


# -- schedulers ---------------------------------------------------------------------------------


def is_scheduler_object(lr_scheduler):
    """A scheduler object (it steps and has an optimizer), as opposed to a callable making one."""
    return hasattr(lr_scheduler, "step") and hasattr(lr_scheduler, "optimizer")


def check_scheduler(lr_scheduler, client_optimizer):
    """Before the takeover: TypeError or ValueError for a scheduler the engine cannot follow."""
    if is_scheduler_object(lr_scheduler):
        if lr_scheduler.optimizer is not client_optimizer:
            raise ValueError(
                f"initialize(lr_scheduler={type(lr_scheduler).__name__}): it schedules an "
                f"optimizer that is not the one passed as optimizer=, so the engine would never "
                f"see its learning rates; pass that optimizer too, or pass a callable that "
                f"makes the scheduler from the optimizer initialize returns")
    elif not callable(lr_scheduler):
        raise TypeError(f"initialize(lr_scheduler=...) must be a scheduler (with step() and "
                        f"optimizer) or a callable that makes one from the optimizer, got "
                        f"{type(lr_scheduler).__name__}")


def make_scheduler(lr_scheduler, optimizer):
    """The scheduler object: `lr_scheduler` itself, or what the callable makes of `optimizer`
    (as DeepSpeed calls it with its basic optimizer)."""
    if is_scheduler_object(lr_scheduler):
        return lr_scheduler
    made = lr_scheduler(optimizer)
    if not is_scheduler_object(made):
        raise TypeError(f"initialize(lr_scheduler=callable): it returned "
                        f"{type(made).__name__}, not a scheduler with step() and optimizer")
    return made


def step_scheduler(scheduler, **kwargs):
    """One scheduler step after the engine's optimizer step. torch warns when its scheduler
    steps before its optimizer has; here the engine's optimizer is what stepped."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` "
                                                  r"before `optimizer.step\(\)`")
        scheduler.step(**kwargs)


def scheduled_lrs(scheduler, count):
    """The learning rates the scheduler left in its optimizer's groups (those with
    parameters), one for each of the engine's `count` groups; ValueError when it has another
    number of groups."""
    lrs = [float(_value(g["lr"])) for g in scheduler.optimizer.param_groups
           if len(g["params"]) != 0]
    if len(lrs) != count:
        raise ValueError(f"the lr_scheduler's optimizer has {len(lrs)} parameter group(s), the "
                         f"engine {count}: schedule the optimizer passed to initialize, or the "
                         f"one it returns")
    return lrs
