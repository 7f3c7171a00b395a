"""A ZeroEngine's parameter values leaving and entering the shards outside training: the full
values a state_dict, GatheredParameters, gather_parameters and consolidated_state_dict read
(each a collective), a modifier's values written back into every rank's shards, and the
checkpoints with the module's buffers. ShardValues is ZeroEngine's (zinf/zero.py) and uses its
fields: _engine, module, device, _compute_dtype, _slots, _module_slots, _gathered (id(param) ->
[full value, open blocks]), _consolidating, _backwards_since_step, and its _fetched, _show,
_park and _before_engine_writes.
"""

import json
import os

import torch

_SAFETENSORS_DTYPES = {
    torch.float32: "F32", torch.float64: "F64", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL",
}


class ShardValues:
    """ZeroEngine's parameter values outside training (this module's docstring)."""

    def _state_dict_hook(self, module, state_dict, prefix, local_metadata):
        """state_dict() gives managed parameters' values on one rank and refuses on several,
        where they are a collective away; never the placeholders."""
        if self._consolidating:
            return
        for pname, p in module._parameters.items():
            s = self._slots.get(id(p)) if p is not None else None
            key = prefix + pname
            if (s is None or key not in state_dict or self._fetched(s)
                    or id(p) in self._gathered):
                continue
            if self._engine.world_size > 1:
                raise RuntimeError(
                    f"state_dict(): parameter '{s.name}' is sharded over "
                    f"{self._engine.world_size} ranks by zinf; call "
                    f"engine.consolidated_state_dict() on every rank (a collective), or "
                    f"read it inside zinf.zero.GatheredParameters(params) on every rank")
            state_dict[key] = self._full_value(s, device="cpu", dtype=torch.float32)

    def _full_value(self, slot, device=None, dtype=None):
        """A parameter's full value from the engine (a collective)."""
        raw = self._engine.gather_parameter(slot.name)
        value = torch.frombuffer(bytearray(raw), dtype=torch.float32).view(slot.shape)
        return value.to(device or self.device, dtype or self._compute_dtype)

    # -- GatheredParameters -----------------------------------------------------------------

    def _gather_for_block(self, params):
        """Enters a GatheredParameters block (a collective): each parameter's data holds its
        full value until the block ends."""
        for p in params:
            s = self._slots[id(p)]
            entry = self._gathered.get(id(p))
            if entry is not None:
                entry[1] += 1
                continue
            value = self._full_value(s)
            self._gathered[id(p)] = [value, 1]
            if not self._fetched(s):  # else the fetched values stand, and _park restores these
                self._show(s, value)

    def _end_block(self, params, modifier_rank):
        """Leaves a GatheredParameters block (a collective): with modifier_rank, that rank's
        values become every rank's shards, as DeepSpeed's write-back."""
        for p in params:
            s = self._slots[id(p)]
            entry = self._gathered[id(p)]
            entry[1] -= 1
            if entry[1] > 0:
                continue
            if modifier_rank is not None:
                with torch.no_grad():
                    values = p.detach().to("cpu", torch.float32).contiguous().clone()
                self._engine.broadcast(values.data_ptr(), values.numel(), int(modifier_rank))
                self._engine.set_parameter(s.name, values.data_ptr(), values.numel())
            del self._gathered[id(p)]
            if not self._fetched(s):
                self._park(s)

    def gather_parameters(self):
        """{name: full fp32 tensor} of every managed parameter (a collective)."""
        return {s.name: self._full_value(s, device="cpu", dtype=torch.float32)
                for slots in self._module_slots for s in slots}

    def gather_gradients(self):
        """{name: full fp32 gradient} that the next step() would apply, before clipping: the
        mean over ranks and micro-batches, loss scale removed (a collective; call it after the
        batch's last backward)."""
        out = {}
        for slots in self._module_slots:
            for s in slots:
                if not s.trainable:  # frozen: no gradient
                    continue
                raw = self._engine.gather_gradient(s.name)
                out[s.name] = torch.frombuffer(bytearray(raw), dtype=torch.float32).view(s.shape)
        return out

    def consolidated_state_dict(self, dtype=torch.float32, rank=None):
        """The model's state_dict with every managed parameter's full value in `dtype` (a
        collective: every rank calls it), e.g. to save for plain PyTorch or to evaluate
        elsewhere. With `rank`, only that rank keeps the values, one parameter at a time, and
        the others get None."""
        keep = rank is None or rank == self._engine.rank
        gathered = {}
        for slots in self._module_slots:
            for s in slots:
                value = self._full_value(s, device="cpu", dtype=dtype)
                if keep:
                    gathered[s.name] = value
        if not keep:
            return None
        self._consolidating = True
        try:
            state = self.module.state_dict(keep_vars=False)
        finally:
            self._consolidating = False
        for name in list(state):
            if name in gathered:
                state[name] = gathered[name]
        # Tied parameters appear under each name that refers to them.
        for mname, sub in self.module.named_modules():
            for pname, p in sub.named_parameters(recurse=False):
                s = self._slots.get(id(p))
                full = join_name(mname, pname)
                if s is not None and full in state:
                    state[full] = gathered[s.name]
        return state

    def save_checkpoint(self, directory, tag, client_state=None):
        """Saves what resuming needs (a collective): the engine's state, the module buffers
        (rank 0's) and client_state, a JSON-able dict; for a transformers model also its
        config, so that ``zinf ckpt export --hf`` writes what ``from_pretrained`` loads."""
        self._push_buffers()
        self._engine.set_checkpoint_metadata(json.dumps(_checkpoint_metadata(self.module)))
        self._engine.save_checkpoint(os.fspath(directory), str(tag),
                                     json.dumps(client_state or {}))

    def load_checkpoint(self, directory):
        """Restores the latest checkpoint in `directory` (a collective), module buffers
        included; returns client_state."""
        self._push_buffers()  # registers them, so the checkpoint must hold the same set
        self._before_engine_writes()
        client = json.loads(self._engine.load_checkpoint(os.fspath(directory)))
        self._backwards_since_step = 0  # the engine's reductions start again from none
        for name, buf in self._buffers():
            out = torch.empty(buf.shape, dtype=buf.dtype)  # on the host, where the engine reads
            self._engine.get_buffer(name, out.data_ptr(), out.numel() * out.element_size())
            with torch.no_grad():
                buf.copy_(out)
        return client

    def _buffers(self):
        """(name, tensor) of every persistent module buffer, as state_dict names them."""
        for mname, sub in self.module.named_modules():
            skip = getattr(sub, "_non_persistent_buffers_set", set())
            for bname, buf in sub.named_buffers(recurse=False):
                if buf is not None and bname not in skip:
                    yield join_name(mname, bname), buf

    def _push_buffers(self):
        for name, buf in self._buffers():
            dtype = _SAFETENSORS_DTYPES.get(buf.dtype)
            if dtype is None or buf.device not in (torch.device("cpu"), self.device):
                known = ", ".join(sorted(map(str, _SAFETENSORS_DTYPES)))
                raise ValueError(f"buffer '{name}' is {buf.dtype} on {buf.device}; zinf.zero "
                                 f"checkpoints buffers of {known} on the CPU or the model's "
                                 f"device ({self.device})")
            data = buf.detach().to("cpu").contiguous()
            self._engine.set_buffer(name, dtype, list(data.shape), data.data_ptr(),
                                    data.numel() * data.element_size())


def _checkpoint_metadata(model):
    """{"hf_config": config.json's object} for a transformers model (as save_pretrained writes
    it, with the model's class as its architecture), {} for another."""
    config = getattr(model, "config", None)
    if not hasattr(model, "save_pretrained") or not hasattr(config, "to_json_string"):
        return {}
    hf_config = json.loads(config.to_json_string(use_diff=False))
    hf_config["architectures"] = [type(model).__name__]
    return {"hf_config": hf_config}


def join_name(prefix, name):
    """A state_dict name: `name` under module `prefix`."""
    return f"{prefix}.{name}" if prefix else name
