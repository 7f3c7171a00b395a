"""A ZeroEngine's backward: the saved tensors that are parameters kept as references and
fetched again when backward needs them, each parameter's gradient into the engine's buffers and
a module's reduce once all of them are in, the end of a backward, and the release of a frozen
module once its backward is done (Notes [Module hooks], [Recompute in backward] and [Frozen
modules in backward] in zinf/zero.py). Backward is ZeroEngine's and uses its fields: _engine,
device, _compute_dtype, _memory, _module_slots, _trained_mids, _trains, _forward_ptrs,
_forward_refs, _backward_params, _grad_views, _grads_pending, _reduced, _in_backward,
_backwards_since_step, and its _hold, _unhold, _show, _park and _refuse_without_training.
"""

import torch

from zinf import _device_memory, _unreadable


class _ReleaseAfterBackward(torch.autograd.Function):
    """The identity on a frozen module's inputs; its backward releases what the module's
    backward fetched (Note [Frozen modules in backward])."""

    @staticmethod
    def forward(ctx, release, *inputs):
        ctx.release = release
        return tuple(x.view_as(x) for x in inputs)

    @staticmethod
    def backward(ctx, *grads):
        ctx.release()
        return (None, *grads)


class _SavedParam:
    """What saved_tensors_hooks keeps instead of a parameter (or a view of one)."""
    __slots__ = ("slot", "offset", "size", "stride")

    def __init__(self, slot, tensor):
        self.slot = slot
        self.offset = tensor.storage_offset()
        self.size = tuple(tensor.shape)
        self.stride = tuple(tensor.stride())


class Backward:
    """ZeroEngine's backward (this module's docstring)."""

    def _backward_begins(self, *unused):
        if not self._in_backward and not self._trains:
            # Backward through a model with nothing to train reaches its inputs only: what it
            # fetched is released at its end, and nothing goes to the engine.
            self._in_backward = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_frozen_backward)
            return
        if not self._in_backward:
            gas = self._engine.gradient_accumulation_steps
            if self._backwards_since_step >= gas:
                # Refused before any gradient reaches the engine, so the batch is intact.
                raise RuntimeError(
                    f"backward() was called {self._backwards_since_step + 1} times since the "
                    f"last step(), and gradient_accumulation_steps is {gas}: call step() after "
                    f"the batch's last backward; this backward was refused and nothing of it "
                    f"reached the engine (after a step() that failed, its gradients are still "
                    f"held: call step() again, or load_checkpoint)")
            self._in_backward = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)

    def _release_after_backward(self, mids, inputs):
        """`inputs` with those that need a gradient through _ReleaseAfterBackward (Note
        [Frozen modules in backward]); None when none does."""
        which = [i for i, x in enumerate(inputs)
                 if isinstance(x, torch.Tensor) and x.requires_grad]
        if not which:
            return None

        def release():
            for mid in mids:
                self._release_for_backward(mid)
        passed = _ReleaseAfterBackward.apply(release, *(inputs[i] for i in which))
        out = list(inputs)
        for i, x in zip(which, passed):
            out[i] = x
        return tuple(out)

    # -- saved tensors ----------------------------------------------------------------------

    def _pack(self, tensor):
        if self._forward_ptrs and tensor.device == self.device:
            s = self._forward_ptrs.get(_device_memory.storage_ptr(tensor))
            if s is not None and tensor.dtype == self._compute_dtype:
                return _SavedParam(s, tensor)
        return tensor

    def _unpack(self, saved):
        if not isinstance(saved, _SavedParam):
            return saved
        s = saved.slot
        tensors = self._acquire_for_backward(s.module_id)
        return tensors[s.index].as_strided(saved.size, saved.stride, saved.offset)

    def _acquire_for_backward(self, mid):
        """Module `mid`'s parameters for backward, held, and its parameters' ``data`` set to
        them, until its gradients are reduced (Note [Recompute in backward])."""
        tensors = self._backward_params.get(mid)
        if tensors is None:
            tensors = self._backward_params[mid] = self._hold(mid)
            for s, t in zip(self._module_slots[mid], tensors):
                self._show(s, t)
        return tensors

    def _release_for_backward(self, mid):
        if self._backward_params.pop(mid, None) is None:
            return
        if mid not in self._forward_refs:
            for s in self._module_slots[mid]:
                self._park(s)
        self._unhold(mid)  # backward's use of the parameters is over

    # -- backward ---------------------------------------------------------------------------

    def backward(self, loss):
        """loss.backward() with the loss multiplied by the engine's fp16 loss scale (1 without
        fp16); the gradients go to the engine."""
        self._refuse_without_training("backward()")
        scale = self._engine.loss_scale
        (loss * scale if scale != 1.0 else loss).backward()

    def _make_grad_hook(self, slot):
        def grad_hook(*unused):
            self._take_gradient(slot)
        return grad_hook

    def _take_gradient(self, s):
        p = s.param
        with _unreadable.metadata_only():  # no dispatch per access of a released parameter
            grad = p.grad
            p.grad = None
        if grad is None:
            return
        self._backward_begins()  # where the output's hook was not reached
        mid = s.module_id
        if mid in self._reduced:
            raise RuntimeError(f"a second gradient for '{s.name}' in one backward: call "
                               f"backward once per micro-batch")
        views = self._grad_views.get(mid)
        if views is None:
            # Not zeroed first: each view is overwritten by its gradient here, or zeroed at the
            # end of backward if none comes.
            views = self._memory.gradients(mid, self._module_slots[mid], overwrite=True)
            self._grad_views[mid] = views
            self._grads_pending[mid] = {t.index for t in self._module_slots[mid] if t.trainable}
        views[s.index].copy_(grad)  # the buffers come in the parameters' shapes
        pending = self._grads_pending[mid]
        pending.discard(s.index)
        if not pending:
            self._reduce(mid)

    def _reduce(self, mid):
        self._grad_views.pop(mid, None)  # no view outlives the buffers
        self._grads_pending.pop(mid, None)
        self._release_for_backward(mid)
        self._memory.reduce(mid)
        self._reduced.add(mid)

    def _end_frozen_backward(self):
        self._in_backward = False
        for mid in list(self._backward_params):
            self._release_for_backward(mid)

    def _end_backward(self):
        # Every module is reduced once per micro-batch; one that got no gradient (not used,
        # or its output did not reach the loss) gives zeros, as torch's optimizers see None.
        self._in_backward = False
        self._backwards_since_step += 1
        for mid in self._trained_mids:  # a module of frozen parameters has nothing to reduce
            if mid not in self._reduced:
                if mid not in self._grad_views:
                    self._memory.gradients(mid, self._module_slots[mid])  # zeros
                else:  # the parameters of the module whose gradient did not come
                    views = self._grad_views[mid]
                    for index in self._grads_pending[mid]:
                        views[index].zero_()
                self._reduce(mid)
        self._reduced.clear()
        for mid in list(self._backward_params):  # fetched by a recompute after its reduce
            self._release_for_backward(mid)
