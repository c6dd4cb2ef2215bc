"""Everything ``kwheel.torch`` takes from torch beyond its public API, in one place.

| what | why no public API serves | used |
| --- | --- | --- |
| ``PROFILER``: torch.autograd.profiler's ``_is_profiler_enabled`` flag | torch has no public question "is a profiler recording?"; the flag is one attribute read (~10 ns) on each launch | always (``torch.autograd._profiler_enabled()`` where the flag is missing) |
| ``intercepted``: ``_len_torch_dispatch_stack``, ``_is_torch_function_mode_enabled``, ``_is_tracing``, ``_functorch.peek_interpreter_stack`` | whether a dispatch or torch function mode, a jit trace or a functorch transform would see a call; torch asks these itself where it decides to run Python code under them, and has no public question for "would the dispatcher do anything but run the kernel?" | on every call of an op's ``Call`` (~0.3 µs), which goes straight to the kernel only when nothing would |
| ``light_autograd``: the keyset after Autograd, ``redispatch``, ``_AutoDispatchBelowAutograd``, ``_any_requires_grad`` | ``torch.library.register_autograd``'s kernel sends a call that needs no gradient through the dispatcher a second time; this one goes straight to the CUDA implementation | only on the torch releases of ``kwheel.torch.LIGHT_AUTOGRAD_TORCH`` (checked on 2.11) |

What the light kernel saves is measured by ``prebuilt/python/tests/bench_autograd.py`` (CPU)
and ``bench_first_op.py`` (a GPU: ``sigmoid_gate`` through both kernels, side by side). The
current stream's raw handle is the runtime's business: ``kwheel.torch`` launches on stream
``None``.
"""

import torch


class _ProfilerFunction:
    """For a torch without the flag: ``torch.autograd._profiler_enabled()`` asked each time."""

    _is_profiler_enabled = property(lambda self: torch.autograd._profiler_enabled())


#: What a launch asks whether a profiler runs: torch's module flag, set by torch.profiler and
#: torch.autograd.profiler while they record, where it exists.
PROFILER = (
    torch.autograd.profiler
    if isinstance(getattr(torch.autograd.profiler, "_is_profiler_enabled", None), bool)
    else _ProfilerFunction()
)


_C = torch._C
_dispatch_modes = _C._len_torch_dispatch_stack
_function_modes = _C._is_torch_function_mode_enabled
_tracing = _C._is_tracing
_transforms = _C._functorch.peek_interpreter_stack


def intercepted():
    """Whether something would see an op's call that a direct launch skips: a torch dispatch
    mode (fake tensors, ``make_fx``, functionalization), a torch function mode, a
    ``torch.jit.trace``, or a functorch transform (``vmap``, ``grad``)."""
    return (
        _dispatch_modes() != 0
        or _function_modes()
        or _tracing()
        or _transforms() is not None
    )


def light_autograd(op, overload, torch_library, backward, setup_context):
    """Registers ``op``'s Autograd kernel made lighter for the common call that needs no
    gradient: it goes straight to the CUDA implementation when nothing but fallthrough keys
    lies between (no fake tensors, no functionalization, no mode), instead of the second trip
    through the dispatcher that ``register_autograd``'s kernel makes. ``kwheel.torch`` calls
    it only on the torch releases it was checked on. ``overload``: the op's."""
    below_autograd = torch._C._after_autograd_keyset
    cuda = torch._C.DispatchKey.CUDA

    def forward(ctx, keyset, *args):
        with torch._C._AutoDispatchBelowAutograd():
            output = overload.redispatch(keyset & below_autograd, *args)
        setup_context(ctx, args, output)
        return output

    def backward_with_keyset(ctx, *grads):
        needs_input_grad = ctx.needs_input_grad
        ctx.needs_input_grad = needs_input_grad[1:]
        try:
            grads = backward(ctx, *grads)
        finally:
            ctx.needs_input_grad = needs_input_grad
        return (None, *grads) if isinstance(grads, tuple) else (None, grads)

    function = type(
        f"{op.library.namespace}_{op.name}_backward",
        (torch.autograd.Function,),
        {"forward": staticmethod(forward), "backward": staticmethod(backward_with_keyset)},
    )

    def autograd_kernel(keyset, *args):
        if torch._C.is_grad_enabled() and torch._C._any_requires_grad(*args):
            return function.apply(keyset, *args)
        below = keyset & below_autograd
        if below.highestPriorityTypeId() == cuda:
            return op.cuda(*args)
        with torch._C._AutoDispatchBelowAutograd():
            return overload.redispatch(below, *args)

    torch_library.impl(op.name, autograd_kernel, "Autograd", with_keyset=True)
