"""Host cost of a torch.library op's Autograd kernel, on a CPU: torch.library.register_autograd
against kwheel.torch's light Autograd kernel (private dispatcher API, `_light_autograd`), for a
call that needs no gradient. The implementation is a trivial Python function, so what is
measured is the dispatch. docs/benchmarks.md has the numbers.

    PYTHONPATH=~/.cache/kwheel/torch python3 bench_autograd.py
"""
import statistics
import sys
import time

import torch

print("torch", torch.__version__, file=sys.stderr)
x = torch.ones(64, 256)
out = torch.empty_like(x)


def impl(x):
    return out


def make(name, light):
    lib = torch.library.Library(name, "DEF")
    lib.define("f(Tensor x) -> Tensor")
    lib.impl("f", impl, "CPU")
    torch.library.register_fake(f"{name}::f", lambda x: torch.empty_like(x), lib=lib)
    overload = getattr(torch.ops, name).f.default

    def setup_context(ctx, inputs, output):
        pass

    def backward(ctx, grad):
        return grad

    if light:
        below_autograd = torch._C._after_autograd_keyset
        cpu = torch._C.DispatchKey.CPU

        def forward(ctx, keyset, *args):
            with torch._C._AutoDispatchBelowAutograd():
                return overload.redispatch(keyset & below_autograd, *args)

        def bwd(ctx, *grads):
            return (None, *grads)

        function = type("F", (torch.autograd.Function,), {"forward": staticmethod(forward), "backward": staticmethod(bwd)})

        def autograd_kernel(keyset, *args):
            if torch._C.is_grad_enabled() and torch._C._any_requires_grad(*args):
                return function.apply(keyset, *args)
            below = keyset & below_autograd
            if below.highestPriorityTypeId() == cpu:
                return impl(*args)
            with torch._C._AutoDispatchBelowAutograd():
                return overload.redispatch(below, *args)

        lib.impl("f", autograd_kernel, "Autograd", with_keyset=True)
    else:
        torch.library.register_autograd(f"{name}::f", backward, setup_context=setup_context, lib=lib)
    return lib, overload


def timed(call, loops=5, calls=20000):
    results = []
    for _ in range(loops):
        started = time.perf_counter()
        for _ in range(calls):
            call(x)
        results.append((time.perf_counter() - started) / calls * 1e6)
    return statistics.median(results)


keep = []
rows = []
for label, light in [("no Autograd kernel", None), ("register_autograd (public)", False), ("light Autograd kernel (private)", True)]:
    if light is None:
        lib = torch.library.Library("bench_none", "DEF")
        lib.define("f(Tensor x) -> Tensor")
        lib.impl("f", impl, "CPU")
        op = torch.ops.bench_none.f.default
    else:
        lib, op = make("bench_light" if light else "bench_public", light)
    keep.append(lib)
    rows.append((label, timed(op), timed(impl)))
for label, op, direct in rows:
    print(f"| {label} | {op:.2f} µs | {direct:.2f} µs |")
