"""What zinf.zero makes an engine from, besides the model: the DeepSpeed config (a dict, JSON
text or a path, read as zinf reads every input), the trainer's values for its "auto" keys under
the names users give them, and the rendezvous port beside torch.distributed's."""

import json
import math
import os
import socket

import torch

from zinf import _zinf


# Each of zinf's TrainerValues names (zinf/engine.h), and the other names it goes by: Hugging
# Face's TrainingArguments and the DeepSpeed config key that "auto" stands in for.
_TRAINER_NAMES = {
    "micro_batch_size": ("per_device_train_batch_size", "train_micro_batch_size_per_gpu"),
    "gradient_accumulation_steps": (),
    "gradient_clipping": ("max_grad_norm",),
    "lr": ("learning_rate", "optimizer.params.lr", "scheduler.params.warmup_max_lr"),
    "beta1": ("adam_beta1",),
    "beta2": ("adam_beta2",),
    "eps": ("adam_epsilon", "optimizer.params.eps"),
    "weight_decay": ("optimizer.params.weight_decay",),
    "total_num_steps": ("max_steps", "num_training_steps", "scheduler.params.total_num_steps"),
    "warmup_num_steps": ("warmup_steps", "scheduler.params.warmup_num_steps"),
    "fp16": ("fp16.enabled",),
    "bf16": ("bf16.enabled",),
    "hidden_size": (),
}
_TRAINER_ALIASES = {alias: name for name, aliases in _TRAINER_NAMES.items()
                    for alias in aliases}


def trainer_values(values):
    """{TrainerValues name: value} from the names initialize() accepts; ValueError naming an
    unknown name, or two names of one value that disagree."""
    out = {}
    for key, value in values.items():
        if value is None:
            continue
        if key == "optimizer.params.betas":
            pairs = [("beta1", value[0]), ("beta2", value[1])]
        else:
            name = key if key in _TRAINER_NAMES else _TRAINER_ALIASES.get(key)
            if name is None:
                raise ValueError(
                    f"trainer value '{key}' is not one zinf fills \"auto\" from; known: "
                    f"{', '.join(sorted(set(_TRAINER_NAMES) | set(_TRAINER_ALIASES)))}")
            pairs = [(name, value)]
        for name, v in pairs:
            if name in out and out[name] != v:
                raise ValueError(f"trainer value '{name}' given twice, as {out[name]} and {v} "
                                 f"(the second as '{key}')")
            out[name] = v
    return out


def config_json(config):
    """The config's JSON text (a dict, JSON text or a path), checked as zinf checks every input
    before any parser sees it (Note [Bounded input]): a file read through zinf's bounded reader,
    its nesting checked before it is parsed, non-finite numbers refused naming their key, and
    every error naming the file. ValueError (or zinf's error for an unreadable file)."""
    return _config(config)[0]


def config_dict(config):
    """The config as a dict, checked as config_json checks it."""
    return _config(config)[1]


_MAX_DEPTH = 128  # zinf's kMaxJsonDepth (include/zinf/input_file.h)


def _config(config):
    if isinstance(config, dict):
        _check_dict(config, "", 1)
        return json.dumps(config, allow_nan=False), config
    if isinstance(config, (str, os.PathLike)):
        text = os.fspath(config)
        if text.lstrip().startswith("{"):
            source = "the config text"
        else:
            source = f"config file '{text}'"
            # Bounded as every input zinf reads: not /dev/zero, a FIFO or a 10 GB file.
            text = _zinf.read_input_file(text, "config")
        if not text.strip():
            raise ValueError(f"{source} is empty; a config is a JSON object")
        _zinf.check_json_depth(text, source)
        try:
            parsed = json.loads(text, parse_constant=_NonFinite)
        except json.JSONDecodeError as e:
            raise ValueError(f"{source} is not valid JSON: {e.msg} at line {e.lineno} column "
                             f"{e.colno}") from None
        if not isinstance(parsed, dict):
            raise ValueError(f"{source} must hold a JSON object, got {type(parsed).__name__}")
        _check_dict(parsed, "", 1, source)
        return text, parsed
    raise TypeError(f"config must be a dict, a JSON string or a path, got {type(config).__name__}")


class _NonFinite(str):
    """What json.loads makes of NaN and Infinity, so that the key holding one is named."""


def _check_dict(value, key, depth, source="the config"):
    """ValueError naming the key of a non-finite number, or where the config nests deeper than
    zinf reads."""
    if depth > _MAX_DEPTH:
        raise ValueError(f"{source} nests deeper than {_MAX_DEPTH} levels at '{key}'")
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, (list, tuple)):
        items = ((str(i), v) for i, v in enumerate(value))
    else:
        if isinstance(value, _NonFinite) or (isinstance(value, float) and
                                             not math.isfinite(value)):
            raise ValueError(f"config key '{key}' in {source} is {value}; numbers must be finite")
        return
    for k, v in items:
        _check_dict(v, f"{key}.{k}" if key else str(k), depth + 1, source)


_engines_made = 0  # in this process: keys the ports agreed through torch's store


def port_beside_torch():
    """zinf's rendezvous port, agreed through torch.distributed's own store when torch is
    initialized over the same processes: rank 0 picks a free port and publishes it there, so
    it cannot clash with torch's (Note [Beside torch.distributed] in src/comm/environment.h).
    0 (the environment decides: ZINF_MASTER_PORT, else MASTER_PORT + 1) otherwise. The
    environment's port serves one engine: a second in the same process (TRL's reference model
    beside its policy) agrees a port of its own through torch's store."""
    global _engines_made
    _engines_made += 1
    dist = torch.distributed
    if ((os.environ.get("ZINF_MASTER_PORT") and _engines_made == 1)
            or not dist.is_available() or not dist.is_initialized()):
        return 0
    world = dist.get_world_size()
    if world == 1 or world != int(os.environ.get("WORLD_SIZE", "1")):
        return 0
    store = dist.distributed_c10d._get_default_store()
    key = f"zinf/master_port/{_engines_made}"
    if dist.get_rank() == 0:
        with socket.socket() as free:
            free.bind(("", 0))
            store.set(key, str(free.getsockname()[1]))
    return int(store.get(key))
