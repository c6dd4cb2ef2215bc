#!/usr/bin/env python3
"""A real struct-parameter kernel through ``kwheel.torch`` on a GPU: causal-conv1d's forward.

causal-conv1d's ``causal_conv1d_fwd_kernel`` takes one parameter, ``ConvParamsBase``: 184
bytes of sizes, strides and device pointers. Its launch function here builds that struct as a
``ctypes.Structure`` from each call's tensors. The script checks, against the library's own
definition of the op (a depthwise ``conv1d`` cut to the sequence, then SiLU):

- six calls on six different inputs of one shape give each its own correct result, and
  the first call's output is not written again by the later ones (a plan that kept the first
  call's pointers would do both);
- the op keeps one launch plan for that shape (the struct's address fields are written per
  call, the launch function does not run again);
- the same inside a CUDA graph: captured once, replayed on new data copied into its input;
- the entries picked by length (vector loads when the length is a multiple of 8) and dtype;

and times the host cost of one call against the same op in native torch (``F.conv1d`` + the
cut + ``F.silu``) and against a launch function that runs on every call (what an op costs when
its plan cannot be kept).

The bundle comes from causal-conv1d's sdist (1.5.2, ``csrc/``, which ``ci/setup-thirdparty``
fetches into ``~/.cache/kwheel/thirdparty``), built on any machine with the manifest of
docs/real-libraries.md ("A struct-parameter kernel on the GPU"):

    kwheel dev bundle-kernels --manifest causal-conv1d/kernels.toml --out cc1d-bundle
    python3 gpu_struct.py cc1d-bundle [--json results.json]

Exit status 0 only when every check passes; without a GPU, it says so and exits 0.
"""

import ctypes
import statistics
import sys
import time

from gpu_checks import Checks, gpu_arguments


class ConvParamsBase(ctypes.Structure):
    """causal-conv1d's ``ConvParamsBase`` (csrc/causal_conv1d.h), field by field."""

    _fields_ = [
        ("batch", ctypes.c_int),
        ("dim", ctypes.c_int),
        ("seqlen", ctypes.c_int),
        ("width", ctypes.c_int),
        ("silu_activation", ctypes.c_bool),
        ("x_batch_stride", ctypes.c_uint32),
        ("x_c_stride", ctypes.c_uint32),
        ("x_l_stride", ctypes.c_uint32),
        ("weight_c_stride", ctypes.c_uint32),
        ("weight_width_stride", ctypes.c_uint32),
        ("out_batch_stride", ctypes.c_uint32),
        ("out_c_stride", ctypes.c_uint32),
        ("out_l_stride", ctypes.c_uint32),
        ("conv_state_len", ctypes.c_int),
        ("conv_state_batch_stride", ctypes.c_uint32),
        ("conv_state_c_stride", ctypes.c_uint32),
        ("conv_state_l_stride", ctypes.c_uint32),
        ("x_ptr", ctypes.c_void_p),
        ("weight_ptr", ctypes.c_void_p),
        ("bias_ptr", ctypes.c_void_p),
        ("out_ptr", ctypes.c_void_p),
        ("conv_state_ptr", ctypes.c_void_p),
        ("cache_seqlens", ctypes.c_void_p),
        ("conv_state_indices_ptr", ctypes.c_void_p),
        ("seq_idx_ptr", ctypes.c_void_p),
        ("initial_states_ptr", ctypes.c_void_p),
        ("initial_states_batch_stride", ctypes.c_uint32),
        ("initial_states_l_stride", ctypes.c_uint32),
        ("initial_states_c_stride", ctypes.c_uint32),
        ("final_states_ptr", ctypes.c_void_p),
        ("final_states_batch_stride", ctypes.c_uint32),
        ("final_states_l_stride", ctypes.c_uint32),
        ("final_states_c_stride", ctypes.c_uint32),
    ]


def traits(vector, dtype):
    return f"Causal_conv1d_fwd_kernel_traits<128, 4, {'true' if vector else 'false'}, {dtype}, {dtype}>"


ENTRIES = {
    ("half", True): f"causal_conv1d_fwd_kernel<{traits(True, 'at::Half')}>",
    ("half", False): f"causal_conv1d_fwd_kernel<{traits(False, 'at::Half')}>",
    ("bfloat16", True): f"causal_conv1d_fwd_kernel<{traits(True, 'at::BFloat16')}>",
}
# Dynamic shared memory per entry: 128 threads x 8 elements x 2 bytes for the exchange, plus,
# without vector loads, the larger of CUB's BlockLoad/BlockStore (WARP_TRANSPOSE) temp
# storage: 2,112 and 2,128 bytes for 128 threads x 8 halves (sizeof, as nvcc 13.0 computes it).
SHARED = {True: 2048, False: 2128 + 2048}


def shape(x, weight, bias, silu):
    return [(x.shape, x.dtype)]


def struct_for(x, weight, bias, silu, out):
    batch, dim, seqlen = x.shape
    return ConvParamsBase(
        batch=batch, dim=dim, seqlen=seqlen, width=weight.shape[1], silu_activation=silu,
        x_batch_stride=x.stride(0), x_c_stride=x.stride(1), x_l_stride=x.stride(2),
        weight_c_stride=weight.stride(0), weight_width_stride=weight.stride(1),
        out_batch_stride=out.stride(0), out_c_stride=out.stride(1), out_l_stride=out.stride(2),
        x_ptr=x.data_ptr(), weight_ptr=weight.data_ptr(),
        bias_ptr=None if bias is None else bias.data_ptr(), out_ptr=out.data_ptr(),
    )


def launch(constants, outputs, x, weight, bias, silu):
    import kwheel.torch as kt

    vector = x.shape[2] % 8 == 0
    dtype = {"torch.float16": "half", "torch.bfloat16": "bfloat16"}[str(x.dtype)]
    params = struct_for(x, weight, bias, silu, outputs[0])
    return kt.Launch((x.shape[0], x.shape[1]), 128, [params], entry=ENTRIES[(dtype, vector)],
                     shared_mem=SHARED[vector])


def reference(x, weight, bias, silu):
    import torch.nn.functional as F

    width = weight.shape[1]
    out = F.conv1d(x.float(), weight.float().unsqueeze(1), None if bias is None else bias.float(),
                   padding=width - 1, groups=x.shape[1])[..., : x.shape[2]]
    return (F.silu(out) if silu else out).to(x.dtype)


def main():
    arguments = gpu_arguments("gpu_struct", "bundle")
    if arguments is None:
        return 0
    import torch

    import kwheel
    import kwheel.torch as kt

    registry = kwheel.open(arguments.bundle)
    library = kt.library(registry, namespace="causal_conv1d_check")
    schema = "causal_conv1d_fwd(Tensor x, Tensor weight, Tensor? bias, bool silu) -> Tensor"
    library.declare(schema, kernel="causal_conv1d_fwd", shape=shape, launch=launch,
                    reference=reference)
    library.declare(schema.replace("fwd(", "fwd_every_call("), kernel="causal_conv1d_fwd",
                    shape=shape, launch=_every_call, reference=reference)
    op = library.lookup("causal_conv1d_fwd")
    planned = library.ops["causal_conv1d_fwd"]
    checks = Checks("gpu_struct", timings={})
    check, results, failures = checks.check, checks.results, checks.failures

    torch.manual_seed(0)
    device = torch.device("cuda:0")

    def inputs(batch, dim, seqlen, dtype):
        x = torch.randn(batch, dim, seqlen, device=device, dtype=dtype)
        weight = torch.randn(dim, 4, device=device, dtype=dtype) * 0.5
        bias = torch.randn(dim, device=device, dtype=dtype)
        return x, weight, bias

    def error(out, expected):
        return (out.float() - expected.float()).abs().max().item()

    # Six calls, six inputs, one shape; between them, allocations that move where the
    # allocator puts the next ones.
    first_out = None
    first_copy = None
    kept_alive = []
    for call in range(6):
        kept_alive.append(torch.empty(call * 4099 + 1, device=device))
        x, weight, bias = inputs(2, 64, 512, torch.half)
        out = op(x, weight, bias, True)
        torch.cuda.synchronize()
        worst = error(out, reference(x, weight, bias, True))
        check(f"call {call + 1} on new tensors matches the reference", worst < 2e-2, f"max error {worst:.4g}")
        if call == 0:
            first_out, first_copy = out, out.clone()
    check("the first call's output was not written again", torch.equal(first_out, first_copy))
    kept = [plan for plan in planned._plans.values() if plan != "uncacheable"]
    check("one launch plan kept for the shape", len(planned._plans) == 1 and len(kept) == 1,
          f"{len(planned._plans)} plans, {len(kept)} kept")

    # The other entries: scalar loads (length not a multiple of 8) and bfloat16.
    for seqlen, dtype in ((509, torch.half), (512, torch.bfloat16)):
        for _ in range(2):
            x, weight, bias = inputs(3, 40, seqlen, dtype)
            worst = error(op(x, weight, bias, False), reference(x, weight, bias, False))
        check(f"length {seqlen}, {dtype}: matches the reference", worst < 5e-2, f"max error {worst:.4g}")

    # A CUDA graph: captured once, replayed on new data.
    static_x, weight, bias = inputs(4, 128, 1024, torch.half)
    op(static_x, weight, bias, True)  # warm: loads, plans
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = op(static_x, weight, bias, True)
    for replay in range(3):
        static_x.copy_(torch.randn_like(static_x))
        graph.replay()
        torch.cuda.synchronize()
        worst = error(static_out, reference(static_x, weight, bias, True))
        check(f"graph replay {replay + 1} on new data matches the reference", worst < 2e-2, f"max error {worst:.4g}")

    # Host cost of one call: small tensors, so the launch path, not the kernel, is timed.
    x, weight, bias = inputs(1, 16, 64, torch.half)
    every = library.lookup("causal_conv1d_fwd_every_call")

    def native():
        return reference_native(x, weight, bias)

    def kwheel_op():
        return op(x, weight, bias, True)

    def kwheel_every_call():
        return every(x, weight, bias, True)

    calls = 2000
    for function in (native, kwheel_op, kwheel_every_call):
        for _ in range(50):
            function()
    torch.cuda.synchronize()
    samples = {name: [] for name in ("native", "kwheel_op", "kwheel_every_call")}
    for _ in range(7):  # interleaved rounds: the machine's noise falls on all alike
        for name, function in (("native", native), ("kwheel_op", kwheel_op), ("kwheel_every_call", kwheel_every_call)):
            torch.cuda.synchronize()
            started = time.perf_counter()
            for _ in range(calls):
                function()
            torch.cuda.synchronize()
            samples[name].append((time.perf_counter() - started) / calls * 1e6)
    medians = {name: statistics.median(values) for name, values in samples.items()}
    results["timings"] = {f"{name}_us_per_call": round(value, 2) for name, value in medians.items()}
    results["timings"]["op_over_native"] = round(medians["kwheel_op"] / medians["native"], 3)
    results["timings"]["every_call_over_native"] = round(medians["kwheel_every_call"] / medians["native"], 3)
    print("host cost per call (us, median of 7 x 2000):", results["timings"])
    worst = error(kwheel_op(), native())
    check("the timed op agrees with native torch", worst < 2e-2, f"max error {worst:.4g}")

    results["ok"] = not failures
    return checks.finish(arguments.json)


def reference_native(x, weight, bias):
    """The op as native torch runs it in the library's own fallback: three ops."""
    import torch.nn.functional as F

    out = F.conv1d(x, weight.unsqueeze(1), bias, padding=weight.shape[1] - 1, groups=x.shape[1])
    return F.silu(out[..., : x.shape[2]])


def _every_call(constants, outputs, x, weight, bias, silu):
    """``launch``, with the struct's unused ``conv_state_len`` field set from ``x``'s address
    shifted: a value that changes with the addresses in a way no plan can write per call, so
    the launch function runs on every call (what an op whose plan cannot be kept costs)."""
    import kwheel.torch as kt

    found = launch(constants, outputs, x, weight, bias, silu)
    params = found.args[0]
    params.conv_state_len = (x.data_ptr() >> 4) & 0x7FFFFFFF
    return kt.Launch(found.grid, found.block, [params], entry=found.entry, shared_mem=found.shared_mem)


if __name__ == "__main__":
    sys.exit(main())
