"""What zinf.zero makes an engine from, besides the model: the DeepSpeed config (a dict, JSON
text or a path, read as zinf reads every input), the trainer's values for its "auto" keys under
the names users give them, and the rendezvous port beside torch.distributed's."""

import json
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
    if isinstance(config, dict):
        return json.dumps(config)
    if isinstance(config, (str, os.PathLike)):
        text = os.fspath(config)
        if text.lstrip().startswith("{"):
            return text
        # Bounded as every input zinf reads: not /dev/zero, a FIFO or a 10 GB file.
        return _zinf.read_input_file(text, "config")
    raise TypeError(f"config must be a dict, a JSON string or a path, got {type(config).__name__}")


_engines_made = 0  # in this process: keys the ports agreed through torch's store


def port_beside_torch():
    """zinf's rendezvous port, agreed through torch.distributed's own store when torch is
    initialized over the same processes: rank 0 picks a free port and publishes it there, so
    it cannot clash with torch's (Note [Beside torch.distributed] in src/comm/environment.h).
    0 (the environment decides: ZINF_MASTER_PORT, else MASTER_PORT + 1) otherwise."""
    global _engines_made
    _engines_made += 1
    dist = torch.distributed
    if (os.environ.get("ZINF_MASTER_PORT") or not dist.is_available()
            or not dist.is_initialized()):
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
