"""Parameters whose values are in the engine's shards refuse to be read.

Note [Released parameters raise]
Outside a fetch (a forward or backward that uses it) and outside a GatheredParameters block, a
managed parameter's ``data`` is a placeholder of its shape whose storage is one NaN element
(zinf/zero.py's ``_placeholder``). Read as values, it would give NaN, or stale numbers once
copied somewhere: an EMA copy, a merge of LoRA weights, a custom save. So while released, the
parameter's class is swapped for an unreadable subclass of its own class, whose
``__torch_function__`` lets through what needs no values (shape, dtype, device, requires_grad,
grad, hooks, setting ``data``) and raises ``ParameterNotGatheredError`` for everything else,
naming the parameter and what to call. Swapping ``__class__`` costs a pointer store, so a
release makes no tensor and a fetch none either; ``isinstance(p, nn.Parameter)`` stays true.

A conversion that changes nothing (``.cpu()`` on the CPU, ``.float()`` of fp32) gives the
parameter itself, as torch does; one to another device moves the placeholder (its values stay
in the shards: ``module.cpu()`` at a trainer's teardown); a new dtype raises. ``detach()`` is let through but gives an unreadable tensor too: ``nn.Module.state_dict``
detaches every parameter before zinf's state-dict hook replaces the entry with the gathered
value (or refuses), and a detached placeholder that escapes must not read as values either.
"""

import torch


class ParameterNotGatheredError(RuntimeError):
    """A parameter held in zinf's shards was read where zinf does not hold its values."""


# What a released parameter answers without values: the names of tensor methods and properties
# (torch hands property access to __torch_function__ as the property's __get__/__set__).
_METADATA = frozenset({
    "shape", "dtype", "device", "layout", "names", "requires_grad", "is_leaf", "grad",
    "grad_fn", "size", "dim", "ndim", "ndimension", "numel", "nelement", "element_size",
    "stride", "storage_offset", "is_contiguous", "is_floating_point", "is_complex",
    "is_cuda", "is_cpu", "is_meta", "is_sparse", "is_quantized", "is_mkldnn", "is_nested",
    "get_device", "__hash__", "__len__", "register_hook", "register_post_accumulate_grad_hook",
    "_backward_hooks", "retain_grad", "requires_grad_", "_post_accumulate_grad_hooks",
    "_has_compatible_shallow_copy_type",
})
# Conversions: without a change they give the tensor itself back; a move to another device
# moves the placeholder (``module.cpu()``, as Lightning's teardown calls it); a new dtype needs
# the values.
_CONVERSIONS = frozenset({"to", "cpu", "cuda", "float", "double", "half", "bfloat16", "type"})
# Settable without values: a new data (a fetch), a gradient, requires_grad.
_SETTABLE = frozenset({"data", "grad", "requires_grad", "_backward_hooks",
                       "_post_accumulate_grad_hooks"})


def _name_of(func):
    """(name, accessor) of a function __torch_function__ receives: ("shape", "__get__") for a
    property, ("add", None) for a method or function."""
    name = getattr(func, "__name__", "")
    if name in ("__get__", "__set__", "__delete__"):
        return getattr(getattr(func, "__self__", None), "__name__", ""), name
    return name, None


# What zinf's own hot paths read of released parameters (grad, requires_grad) needs no
# values: inside this block no __torch_function__ dispatch runs (a few microseconds each).
metadata_only = torch._C.DisableTorchFunction


def _first_unreadable(args, kwargs):
    for a in list(args) + list((kwargs or {}).values()):
        if isinstance(a, _Unreadable):
            return a
        if isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, _Unreadable):
                    return b
    return None


class _Unreadable:
    """The refusal, mixed into the released parameter's class and the detached tensor's."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name, accessor = _name_of(func)
        writes = accessor in ("__set__", "__delete__")
        if (name in _SETTABLE) if writes else (name in _METADATA):
            return torch._C._disabled_torch_function_impl(func, types, args, kwargs or {})
        if name in _CONVERSIONS and accessor is None and args and isinstance(args[0], _Unreadable):
            return _convert(func, args, kwargs or {}, name)
        if name == "detach":
            source = args[0]
            out = torch._C._disabled_torch_function_impl(func, types, args, kwargs or {})
            out = out.as_subclass(UnreadableTensor)
            out._zinf_name = source._zinf_name
            return out
        raise not_gathered(_first_unreadable(args, kwargs), name)

    def __repr__(self):
        return (f"<zinf: parameter '{self._zinf_name}' of shape {list(self.shape)}, held in "
                f"zinf's shards (read it inside zinf.zero.GatheredParameters)>")


class UnreadableTensor(_Unreadable, torch.Tensor):
    """A detached released parameter."""


def _convert(func, args, kwargs, name):
    """A conversion of released parameter args[0], tried on one element of its placeholder:
    the parameter itself when nothing changes, the placeholder moved when only the device
    does; a new dtype raises."""
    source = args[0]
    with torch._C.DisableTorchFunction():
        one = source.as_strided((1,), (1,))
        out = func(one, *args[1:], **kwargs)
        if out is one or not isinstance(out, torch.Tensor):  # type() without arguments: a name
            return source if out is one else out
        if out.dtype != one.dtype:
            raise not_gathered(source, f"{name} to {out.dtype}")
        moved = out.view([1] * source.dim()).expand(source.shape)
    moved = moved.as_subclass(UnreadableTensor)
    moved._zinf_name = source._zinf_name
    return moved


def not_gathered(tensor, what):
    name = getattr(tensor, "_zinf_name", "?")
    return ParameterNotGatheredError(
        f"parameter '{name}' is held in zinf's shards and not gathered here ({what} needs its "
        f"values): read or change it inside `with zinf.zero.GatheredParameters(params, "
        f"modifier_rank=None or a rank):` on every rank (a collective), or take the model's "
        f"values from engine.module.state_dict() on one rank, engine.consolidated_state_dict() "
        f"on several")


# A fetch and a release each swap a class per parameter: two dict lookups, no allocation.
_released_classes = {}  # a parameter's class -> its unreadable subclass
_original_classes = {}  # the unreadable subclass -> the parameter's class


def release(param, name=None):
    """Makes `param` (whose data is a placeholder now) refuse reads; `name` names it in the
    error (given once: it stays)."""
    if name is not None:
        param._zinf_name = name
    cls = type(param)
    released = _released_classes.get(cls)
    if released is None:
        if cls in _original_classes:
            return  # released already
        released = type(f"Released{cls.__name__}", (_Unreadable, cls), {"__module__": __name__})
        _released_classes[cls] = released
        _original_classes[released] = cls
    param.__class__ = released


def restore(param):
    """Undoes release: `param`'s data holds its values again."""
    original = _original_classes.get(type(param))
    if original is not None:
        param.__class__ = original
