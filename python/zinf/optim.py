"""CPU optimizers on zinf's kernels: drop-in ``torch.optim`` replacements for CPU fp32 params.

``AdamW``, ``Adam``, ``Adagrad`` and ``Lion`` are ``torch.optim.Optimizer`` subclasses: param
groups, changing ``lr``/``betas``/``weight_decay`` in ``param_groups`` between steps, and
``state_dict``/``load_state_dict`` (the state has torch's keys and tensors, so a state dict
moves between ``torch.optim.AdamW`` and ``zinf.optim.AdamW`` both ways) work as in torch.

``step()`` updates each parameter in one streaming pass with zinf's vectorized kernels (AVX-512,
AVX2 or scalar, picked at run time) on torch's own OpenMP threads, with torch 1.13's formulas
evaluated in fp32 (include/zinf/cpu_optimizer.h), instead of torch's several passes over memory.

Options beyond torch's:
- ``threads``: worker threads (0: torch's, ``torch.get_num_threads()``; with
  ``workers="onetbb"``, every CPU this process may use).
- ``workers``: "openmp" (the default) runs the step on the OpenMP team torch's ops run on, which
  is still spinning on the cores when the step follows backward; "onetbb" on a oneTBB pool of
  the optimizer's own, which then waits for those threads to let go of the cores (Note [Whose
  threads] in cpu_optim/parallel.h). An OpenMP team ends in a barrier, so on a machine shared
  with busy processes a small step can wait a scheduler slice for a team thread; "onetbb" does
  not, and "openmp" runs the steps of the next second on oneTBB after a step that waited at the
  barrier longer than it worked (Note [Held up by the team]). Where the process has no OpenMP
  runtime, "openmp" runs on oneTBB; ``optimizer.workers`` says which is in use.
- ``isa``: "auto", "scalar", "avx2" or "avx512".
- ``param_copy_dtype``: ``torch.bfloat16`` or ``torch.float16`` to have each step also write a
  low-precision copy of the new parameters in the same pass; ``optimizer.param_copy(p)``
  returns it (e.g. to upload to a GPU).
- ``step(grad_scale=...)`` multiplies every gradient before use (1/loss_scale times a clip
  coefficient) without a separate pass.

Parameters must be contiguous CPU float32 tensors with dense gradients; anything else raises a
ValueError naming the parameter. Not supported (a ValueError when the optimizer is made, or a
param group added, with it set): amsgrad, maximize.
"""

import torch

from zinf import _zinf
from zinf._errors import check_cpu_tensor, dtype_name

__all__ = ["AdamW", "Adam", "Adagrad", "Lion"]


class _ZinfOptimizer(torch.optim.Optimizer):
    _type = None          # "adamw", "adam", "adagrad", "lion"
    _state_names = ()     # torch's names of the state tensors, in zinf's state0/state1 order

    def __init__(self, params, defaults, threads=0, isa="auto", param_copy_dtype=None,
                 workers="openmp"):
        if param_copy_dtype not in (None, torch.bfloat16, torch.float16):
            raise ValueError(
                f"param_copy_dtype must be None, torch.bfloat16 or torch.float16, "
                f"got {param_copy_dtype}")
        if workers not in ("openmp", "onetbb"):
            raise ValueError(f"workers must be 'openmp' or 'onetbb', got {workers!r}")
        super().__init__(params, defaults)
        if threads == 0 and workers == "openmp":
            threads = torch.get_num_threads()
        self._kernels = _zinf.CpuOptimizer(threads=threads, isa=isa, workers=workers)
        self.param_copy_dtype = param_copy_dtype
        self._param_copies = {}

    @property
    def isa(self):
        """The kernel in use: "avx512", "avx2" or "scalar"."""
        return self._kernels.isa

    @property
    def threads(self):
        return self._kernels.threads

    @property
    def workers(self):
        """Whose threads run the step: "openmp" (torch's) or "onetbb" (the optimizer's own)."""
        return self._kernels.workers

    def param_copy(self, param):
        """The low-precision copy of `param` that each step writes (param_copy_dtype)."""
        if self.param_copy_dtype is None:
            raise ValueError("this optimizer was made without param_copy_dtype")
        copy = self._param_copies.get(param)
        if copy is None:
            copy = param.detach().to(self.param_copy_dtype)
            self._param_copies[param] = copy
        return copy

    def add_param_group(self, param_group):
        # torch's constructor adds each group through here: an option zinf does not implement
        # is refused when the optimizer is made, not at its first step.
        self._check_group({**self.defaults, **param_group})
        super().add_param_group(param_group)

    def _check_group(self, group):
        if group.get("amsgrad", False):
            raise ValueError(f"zinf.optim.{type(self).__name__} does not implement amsgrad")
        if group.get("maximize", False):
            raise ValueError(f"zinf.optim.{type(self).__name__} does not implement maximize")

    def _init_state(self, p, group):
        raise NotImplementedError

    def _refuse(self, what, p, grad, arrays):
        """Raises the ValueError that names what is wrong with a parameter `step` cannot use."""
        check_cpu_tensor(p, what)
        if grad.is_sparse:
            raise ValueError(f"{what} has a sparse gradient; zinf.optim needs dense ones")
        check_cpu_tensor(grad, what + ".grad")
        if grad.numel() != p.numel():
            raise ValueError(f"{what}.grad has {grad.numel()} elements, the parameter {p.numel()}")
        for name, a in zip(self._state_names, arrays):
            check_cpu_tensor(a, f"state of {what} ('{name}')")
            if a.numel() != p.numel():
                raise ValueError(f"state of {what} ('{name}') has {a.numel()} elements, "
                                 f"the parameter {p.numel()}")
        raise AssertionError(f"{what} was refused, but every check passes")

    def _hyper_params(self, group):
        raise NotImplementedError

    @torch.no_grad()
    def step(self, closure=None, grad_scale=1.0):
        """Performs one optimization step; returns the closure's loss when one is given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        first = self._state_names[0]
        second = self._state_names[1] if len(self._state_names) > 1 else None
        for gi, group in enumerate(self.param_groups):
            self._check_group(group)
            items = []
            for pi, p in enumerate(group["params"]):
                grad = p.grad
                if grad is None:
                    continue
                state = self.state[p]
                if len(state) == 0:
                    self._init_state(p, group)
                state0 = state[first]
                # With one state array the parameter stands in for the second: it passes the
                # same checks, and the kernels get 0.
                state1 = state[second] if second is not None else p
                step = state["step"]
                numel = p.numel()
                if not _plain_step(step, numel, p, grad, state0, state1):
                    if not _plain_step(_SCALAR, numel, p, grad, state0, state1):
                        self._refuse(f"param_groups[{gi}]['params'][{pi}]", p, grad,
                                     [state[n] for n in self._state_names])
                    step = _step_count(state)  # only the count was not as the kernels take it
                copy_ptr, copy_dtype = 0, "bfloat16"
                if self.param_copy_dtype is not None:
                    copy = self.param_copy(p)
                    if copy.shape != p.shape:
                        copy = torch.empty_like(p, dtype=self.param_copy_dtype)
                        self._param_copies[p] = copy
                    copy_ptr, copy_dtype = copy.data_ptr(), dtype_name(copy.dtype)
                items.append((step.data_ptr(), p.data_ptr(), grad.data_ptr(), "float32",
                              state0.data_ptr(), state1.data_ptr() if second is not None else 0,
                              copy_ptr, copy_dtype, numel))
            if items:
                # Advances each parameter's step count as its update is applied; a refused step
                # (bad hyper-parameters) changes nothing, the step counts included.
                self._kernels.apply(type=self._type, grad_scale=float(grad_scale), items=items,
                                    **self._hyper_params(group))
        return loss


def _plain_step(step, numel, *tensors):
    """Whether the kernels can step these as they are: `step` a float32 CPU scalar tensor, and
    each tensor a contiguous CPU float32 tensor of `numel` elements. Inlined attribute checks:
    this runs for every parameter at every step, and a model has hundreds (bench/RESULTS.md)."""
    try:
        if not (step.dtype is _FP32 and step.is_cpu and step.dim() == 0):
            return False
        for t in tensors:
            if not (t.dtype is _FP32 and t.is_cpu and t.layout is _STRIDED and t.is_contiguous()
                    and t.numel() == numel):
                return False
    except AttributeError:  # not a tensor: a state dict with plain numbers, or worse
        return False
    return True


_FP32, _STRIDED = torch.float32, torch.strided
_SCALAR = torch.zeros((), dtype=_FP32)  # a step count _plain_step takes, to check the rest


def _step_count(state):
    """The state's step count as the float32 CPU scalar tensor the kernels advance in place."""
    step = state["step"]
    if not (torch.is_tensor(step) and step.dtype is _FP32 and step.is_cpu and step.dim() == 0):
        # A state dict with plain numbers (DeepSpeed's), or a count kept elsewhere.
        step = state["step"] = torch.tensor(float(step), dtype=_FP32)
    return step


def _step_tensor():
    # torch 1.13 keeps `step` as a float32 scalar tensor; so does zinf, for state_dict
    # compatibility both ways.
    return torch.zeros((), dtype=torch.float32)


class _AdamBase(_ZinfOptimizer):
    _state_names = ("exp_avg", "exp_avg_sq")

    def __init__(self, params, lr, betas, eps, weight_decay, amsgrad, maximize,
                 bias_correction, threads, isa, param_copy_dtype, workers):
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if eps < 0.0:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= betas[0] < 1.0 or not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameters: {betas}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                        maximize=maximize, bias_correction=bias_correction)
        super().__init__(params, defaults, threads, isa, param_copy_dtype, workers)

    def _init_state(self, p, group):
        state = self.state[p]
        state["step"] = _step_tensor()
        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.contiguous_format)

    def _hyper_params(self, group):
        beta1, beta2 = group["betas"]
        return dict(lr=float(group["lr"]), beta1=float(beta1), beta2=float(beta2),
                    eps=float(group["eps"]), weight_decay=float(group["weight_decay"]),
                    bias_correction=bool(group.get("bias_correction", True)), lr_decay=0.0,
                    initial_accumulator_value=0.0)


class AdamW(_AdamBase):
    """torch.optim.AdamW on zinf's kernels (decoupled weight decay). See the module docs."""
    _type = "adamw"

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, *, maximize=False, bias_correction=True, threads=0, isa="auto",
                 param_copy_dtype=None, workers="openmp"):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize,
                         bias_correction, threads, isa, param_copy_dtype, workers)


class Adam(_AdamBase):
    """torch.optim.Adam on zinf's kernels (L2 weight decay). See the module docs."""
    _type = "adam"

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 amsgrad=False, *, maximize=False, bias_correction=True, threads=0, isa="auto",
                 param_copy_dtype=None, workers="openmp"):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize,
                         bias_correction, threads, isa, param_copy_dtype, workers)


class Adagrad(_ZinfOptimizer):
    """torch.optim.Adagrad on zinf's kernels. See the module docs."""
    _type = "adagrad"
    _state_names = ("sum",)

    def __init__(self, params, lr=1e-2, lr_decay=0.0, weight_decay=0.0,
                 initial_accumulator_value=0.0, eps=1e-10, *, maximize=False, threads=0,
                 isa="auto", param_copy_dtype=None, workers="openmp"):
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if lr_decay < 0.0:
            raise ValueError(f"Invalid lr_decay value: {lr_decay}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if initial_accumulator_value < 0.0:
            raise ValueError(f"Invalid initial_accumulator_value value: "
                             f"{initial_accumulator_value}")
        if eps < 0.0:
            raise ValueError(f"Invalid epsilon value: {eps}")
        defaults = dict(lr=lr, lr_decay=lr_decay, eps=eps, weight_decay=weight_decay,
                        initial_accumulator_value=initial_accumulator_value, maximize=maximize)
        super().__init__(params, defaults, threads, isa, param_copy_dtype, workers)

    def _init_state(self, p, group):
        state = self.state[p]
        state["step"] = _step_tensor()
        state["sum"] = torch.full_like(p, group["initial_accumulator_value"],
                                       memory_format=torch.contiguous_format)

    def _hyper_params(self, group):
        return dict(lr=float(group["lr"]), beta1=0.9, beta2=0.999, eps=float(group["eps"]),
                    weight_decay=float(group["weight_decay"]), bias_correction=True,
                    lr_decay=float(group["lr_decay"]),
                    initial_accumulator_value=float(group["initial_accumulator_value"]))


class Lion(_ZinfOptimizer):
    """Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"):
        p *= 1 - lr*wd;  p -= lr * sign(b1*m + (1-b1)*g);  m = b2*m + (1-b2)*g
    with the paper's defaults. torch has no Lion; the state is "exp_avg"."""
    _type = "lion"
    _state_names = ("exp_avg",)

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0, *, threads=0,
                 isa="auto", param_copy_dtype=None, workers="openmp"):
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= betas[0] < 1.0 or not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameters: {betas}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        defaults = dict(lr=lr, betas=betas, weight_decay=weight_decay)
        super().__init__(params, defaults, threads, isa, param_copy_dtype, workers)

    def _init_state(self, p, group):
        state = self.state[p]
        state["step"] = _step_tensor()
        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.contiguous_format)

    def _hyper_params(self, group):
        beta1, beta2 = group["betas"]
        return dict(lr=float(group["lr"]), beta1=float(beta1), beta2=float(beta2), eps=0.0,
                    weight_decay=float(group["weight_decay"]), bias_correction=True,
                    lr_decay=0.0, initial_accumulator_value=0.0)
