#!/usr/bin/env python3
"""af3_kernels.ops on a GPU: correctness, one graph, CUDA graphs, gradients, and timings.

With the `kwheel` and `af3-kernels` wheels installed next to torch, this script checks

- every op against its torch equivalent, eager (a direct launch), through the dispatcher and
  under `torch.compile(fullgraph=True)`, at a small ragged and a larger shape, and
  `torch.library.opcheck` on CUDA tensors;
- in a fresh process, which calls skip the dispatcher: a plain eager call defines no operator;
  an `int` where the schema says `float`, a call needing gradients, one under a profiler, one
  under `FakeTensorMode` each go through it, with the same results;
- a small AF3-style block built from the ops: `torch._dynamo.explain` reports 1 graph and 0
  breaks (and, in a process with `AF3_KERNELS_COMPILE_WRAP=disable`, one break per op);
  `mode="reduce-overhead"` and a manual `torch.cuda.graph` capture and replay match eager;
- gradients of `sigmoid_gate` (its backward is the `sigmoid_gate_backward` kernel) against
  torch's autograd, eager and compiled;
- that every kernel came from a prebuilt cubin;
- that a `torch.profiler` trace of the block shows one `kwheel:` range per op, named with the
  kernel, variant (`cu130/sm_90a`), source (`prebuilt`) and key, and that the same ranges go
  to NVTX (captured: `torch.cuda.nvtx.range_push`/`range_pop` replaced), and none while no
  profiler runs;

and times, into the JSON report: the host cost of one op call (direct, and through the dispatcher)
against the raw `launch` and the equivalent native torch op; the block eager, compiled and
reduce-overhead; the first call of an op in a fresh process against torch's first
`layer_norm`.

usage: gpu_torch.py [--json results.json] [--skip-first-call]

Exit status 0 only when every check passes.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

import kwheel
import kwheel.torch
import af3_kernels
from af3_kernels import ops

FAILURES = []
REPORT = {}


def check(condition, message):
    if not condition:
        FAILURES.append(message)
        print(f"FAILED: {message}", file=sys.stderr)
    return condition


def close(got, want, rtol, atol):
    got, want = got.float(), want.float()
    error = (got - want).abs()
    ok = bool(torch.all((error <= atol + rtol * want.abs()) | (got == want)).item())
    ok = ok and not bool(torch.isnan(got).any().item())
    return ok, float(error.max().item()) if error.numel() else 0.0


def bf16(*shape, low=-2.0, high=2.0, generator):
    values = torch.rand(shape, generator=generator, device="cuda") * (high - low) + low
    return values.to(torch.bfloat16)


BF16 = (1 / 128, 1e-5)


def cases(size):
    """{op: (args, torch equivalent, tolerance)} at one size."""
    generator = torch.Generator(device="cuda").manual_seed(5 + (size == "large"))
    rows, cols = (37, 300) if size == "small" else (4096, 768)
    batch, heads, n = (3, 2, 133) if size == "small" else (2, 4, 384)
    m, nn, k = (100, 20, 40) if size == "small" else (1000, 264, 520)
    mask = (torch.rand((batch, n), generator=generator, device="cuda") < 0.75).float()
    mask[:, 0] = 1
    mask[batch - 1] = 0  # a fully masked item: rows of zeros

    def layer_norm_reference(x, shape, weight, bias, eps):
        return F.layer_norm(x.float(), shape, weight.float(), bias.float(), eps).bfloat16()

    def softmax_reference(logits, bias, mask, scale):
        scores = torch.addcmul(bias.unsqueeze(0), logits, torch.tensor(scale, device="cuda"))
        scores = scores.masked_fill(mask[:, None, None, :] == 0, float("-inf"))
        return torch.softmax(scores, dim=-1).nan_to_num(0.0)

    def gate_backward_reference(grad, x, gate):
        s = torch.sigmoid(gate.float())
        return (grad.float() * s).bfloat16(), (grad.float() * x.float() * (s * (1 - s))).bfloat16()

    return {
        "layer_norm": (
            (
                bf16(rows, cols, low=-2, high=4, generator=generator),
                (cols,),
                bf16(cols, low=0.5, high=1.5, generator=generator),
                bf16(cols, low=-0.5, high=0.5, generator=generator),
                1e-5,
            ),
            layer_norm_reference,
            (1 / 128, 1 / 64),
        ),
        "swiglu": (
            (bf16(rows, 2 * cols, low=-4, high=4, generator=generator),),
            lambda x: (F.silu(x[:, :cols].float()) * x[:, cols:].float()).bfloat16(),
            BF16,
        ),
        "sigmoid_gate": (
            (bf16(rows, cols, low=-3, high=3, generator=generator), bf16(rows, cols, low=-6, high=6, generator=generator)),
            lambda x, gate: (x.float() * torch.sigmoid(gate.float())).bfloat16(),
            BF16,
        ),
        "sigmoid_gate_backward": (
            (
                bf16(rows, cols, generator=generator),
                bf16(rows, cols, low=-3, high=3, generator=generator),
                bf16(rows, cols, low=-6, high=6, generator=generator),
            ),
            gate_backward_reference,
            BF16,
        ),
        "masked_softmax_pair_bias": (
            (
                torch.rand((batch, heads, n, n), generator=generator, device="cuda") * 16 - 8,
                torch.rand((heads, n, n), generator=generator, device="cuda") * 4 - 2,
                mask,
                0.25,
            ),
            softmax_reference,
            (1e-4, 1e-6),
        ),
        "scale_rows": (
            (torch.randn((rows, cols), generator=generator, device="cuda"), torch.randn((rows,), generator=generator, device="cuda")),
            lambda x, scale: x * scale[:, None],
            (0, 0),
        ),
        "scale_rows_bf16": (
            (bf16(rows, cols, generator=generator), torch.randn((rows,), generator=generator, device="cuda")),
            lambda x, scale: (x.float() * scale[:, None]).bfloat16(),
            (0, 0),
        ),
        "matmul": (
            (bf16(m, k, low=-1, high=1, generator=generator), bf16(k, nn, low=-1, high=1, generator=generator)),
            lambda a, b: a.float() @ b.float(),
            (1e-3, 1e-3),
        ),
    }


def op_of(name):
    return getattr(ops, "scale_rows" if name == "scale_rows_bf16" else name)


def check_ops():
    rows = []
    for size in ("small", "large"):
        for name, (args, reference, (rtol, atol)) in cases(size).items():
            op = op_of(name)
            torch._dynamo.reset()  # one compiled lambda per op: no recompile limit to hit
            want = reference(*args)
            want = want if isinstance(want, tuple) else (want,)
            compiled = torch.compile(lambda *a, op=op: op(*a), fullgraph=True, dynamic=False)
            modes = (("eager", op), ("dispatcher", op.default), ("compiled", compiled))
            for mode, call in modes:
                got = call(*args)
                got = got if isinstance(got, tuple) else (got,)
                ok, worst = True, 0.0
                for got_one, want_one in zip(got, want):
                    within, error = close(got_one, want_one, rtol, atol)
                    ok, worst = ok and within and got_one.dtype == want_one.dtype, max(worst, error)
                if name == "masked_softmax_pair_bias":
                    ok = ok and bool(torch.all(got[0][-1] == 0).item())
                rows.append({"op": name, "size": size, "mode": mode, "max_abs_error": worst, "ok": ok})
                check(ok, f"{name} {size} {mode}: max error {worst:.3g} (rtol {rtol}, atol {atol})")
            if size == "small":
                try:
                    torch.library.opcheck(op.default, args)
                    rows.append({"op": name, "size": size, "mode": "opcheck", "ok": True})
                except Exception as error:  # report every op, not just the first failure
                    check(False, f"{name}: opcheck: {error}")
    REPORT["ops"] = rows
    torch._dynamo.reset()


def check_requirements():
    """The kernels' declared requirements on the GPU: an op called with CUDA tensors that break
    one is refused at its first call naming the op, the requirement and the values, before
    anything launches; the package answers the same question at setup, for this device, without
    loading anything; shapes on the good side of each boundary run."""
    device = "sm_%d%d" % torch.cuda.get_device_capability()
    odd = torch.empty(4, 5, device="cuda", dtype=torch.bfloat16)
    try:
        ops.swiglu(odd)
        check(False, "swiglu took an odd last dimension")
    except Exception as error:
        text = str(error)
        check(
            "kernel `swiglu`" in text and "requires `width % 2 == 0`" in text and "width = 5" in text,
            f"swiglu's refusal: {text}",
        )
    answer = af3_kernels.unsupported_shape_reason("swiglu", device=device, rows=4, width=5)
    check(answer is not None and "width = 5" in answer, f"setup answer for an odd width: {answer}")
    check(
        af3_kernels.unsupported_shape_reason("swiglu", device=device, rows=4, width=6) is None,
        "setup answer for an even width",
    )
    even = torch.randn(4, 6, device="cuda", dtype=torch.bfloat16)
    got = ops.swiglu(even)
    a, b = even.float().chunk(2, dim=-1)
    within, worst = close(got, (F.silu(a) * b).to(got.dtype), 2e-2, 2e-2)
    check(within, f"swiglu on the good side of its boundary: max error {worst:.3g}")
    REPORT["requirements"] = {"device": device, "odd_width": answer}


# --- the block ---------------------------------------------------------------------------


def block(x, weight, bias, gate, logits, pair_bias, mask, factors):
    """A small AF3-style block: LayerNorm, a gated SwiGLU transition, the triangle-attention
    softmax with pair bias, a row scale, and a bf16 projection on the tensor cores."""
    h = ops.layer_norm(x, (x.shape[-1],), weight, bias, 1e-5)
    t = ops.swiglu(torch.cat([h, x], dim=-1))
    t = ops.sigmoid_gate(t, gate)
    p = ops.masked_softmax_pair_bias(logits, pair_bias, mask, 0.125)
    s = ops.scale_rows(t, factors)
    y = ops.matmul(s, weight_matrix(s))
    return y, p


def weight_matrix(s):
    return s[: s.shape[1]].transpose(0, 1).contiguous()


BLOCK_OPS = 6


def block_inputs(rows=256, cols=128, n=64, seed=11):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    return [
        bf16(rows, cols, generator=generator),
        bf16(cols, low=0.5, high=1.5, generator=generator),
        bf16(cols, generator=generator),
        bf16(rows, cols, generator=generator),
        torch.randn((1, 4, n, n), generator=generator, device="cuda"),
        torch.randn((4, n, n), generator=generator, device="cuda"),
        (torch.rand((1, n), generator=generator, device="cuda") < 0.8).float(),
        torch.randn((rows,), generator=generator, device="cuda"),
    ]


def same(got, want):
    return all(torch.equal(g, w) for g, w in zip(got, want))


def check_block():
    inputs = block_inputs()
    eager = block(*inputs)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(block)(*inputs)
    REPORT["explain"] = {
        "graphs": explained.graph_count,
        "breaks": explained.graph_break_count,
        "ops": explained.op_count,
    }
    check(
        (explained.graph_count, explained.graph_break_count) == (1, 0),
        f"explain: {explained.graph_count} graphs, {explained.graph_break_count} breaks "
        f"({[str(b.reason) for b in explained.break_reasons]})",
    )
    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True)
    check(same(compiled(*inputs), eager), "compiled block differs from eager")
    reduce = torch.compile(block, mode="reduce-overhead", fullgraph=True)
    for step in range(4):  # warm-up, record, replays
        fresh = block_inputs(seed=100 + step)
        check(same(reduce(*fresh), block(*fresh)), f"reduce-overhead block differs, step {step}")
    # Manual capture: static inputs, warm-up on a side stream, capture, then replay on new data.
    static = block_inputs()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            block(*static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = block(*static)
    for step in range(3):
        fresh = block_inputs(seed=200 + step)
        for target, value in zip(static, fresh):
            target.copy_(value)
        graph.replay()
        torch.cuda.synchronize()
        check(same(captured, block(*fresh)), f"CUDA graph replay {step} differs from eager")
    REPORT["cuda_graph"] = "captured and replayed 3 times"
    torch._dynamo.reset()


# The kernel each op of `block` launches, in order.
BLOCK_KERNELS = [
    "layernorm_bf16",
    "swiglu",
    "sigmoid_gate",
    "masked_softmax_pair_bias",
    "scale_rows",
    "wgmma_matmul_bf16",
]


def check_trace():
    inputs = block_inputs()
    block(*inputs)  # loaded and planned: the trace shows steady calls
    torch.cuda.synchronize()
    nvtx = torch.cuda.nvtx
    pushed = []
    push, pop = nvtx.range_push, nvtx.range_pop
    nvtx.range_push = lambda message: pushed.append(message)
    nvtx.range_pop = lambda: pushed.append(None)
    try:
        block(*inputs)
        check(pushed == [], f"ranges marked with no profiler running: {pushed}")
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities) as profile:
            block(*inputs)
            torch.cuda.synchronize()
    finally:
        nvtx.range_push, nvtx.range_pop = push, pop
    events = list(profile.events())
    # With CUDA activity on, a `record_function` range shows twice: on the CPU, and as its
    # user annotation on the GPU timeline. One per op on the CPU is the check.
    labels = [
        event.name
        for event in events
        if event.name.startswith("kwheel:")
        and event.device_type == torch.autograd.DeviceType.CPU
    ]
    REPORT["trace_gpu_annotations"] = sum(
        1
        for event in events
        if event.name.startswith("kwheel:")
        and event.device_type == torch.autograd.DeviceType.CUDA
    )
    REPORT["trace_ranges"] = labels
    check(len(labels) == BLOCK_OPS, f"trace: {len(labels)} kwheel ranges for {BLOCK_OPS} ops: {labels}")
    provenance = {(entry["kernel"], entry["device"]): entry for entry in kwheel.provenance()}
    for kernel, label in zip(BLOCK_KERNELS, labels):
        parts = label.split(" ")
        entry = provenance.get((kernel, 0))
        check(
            entry is not None and label == entry["label"],
            f"trace: range `{label}` is not `{kernel}`'s ({entry and entry['label']})",
        )
        check(
            len(parts) == 5 and parts[0] == f"kwheel:{kernel}" and parts[1].endswith("/sm_90a")
            and parts[2] == "prebuilt" and len(parts[3]) == 12 and parts[4] == "cuda:0",
            f"trace: range `{label}` does not name kernel, variant, source, key and device",
        )
    check(
        [message for message in pushed if message is not None] == labels
        and pushed.count(None) == len(labels),
        f"NVTX ranges differ from the profiler's: {pushed}",
    )
    # Whether the profiler saw the kernels themselves on the GPU (launched with cuLaunchKernel).
    REPORT["trace_gpu_kernels"] = sorted(
        {
            event.name
            for event in events
            if event.device_type == torch.autograd.DeviceType.CUDA
            and any(kernel in event.name for kernel in BLOCK_KERNELS)
        }
    )


# In a process of its own, since the variable is read at import. explain's
# graph_break_count counts only breaks that split a graph (two ops in a row break once);
# dynamo's graph_break counter counts every break, one per op here.
ESCAPE_HATCH = r"""
import json, sys, torch
from torch._dynamo.utils import counters
sys.path.insert(0, sys.argv[1])
import gpu_torch
explained = torch._dynamo.explain(gpu_torch.block)(*gpu_torch.block_inputs())
torch._dynamo.reset()
counters.clear()
graphs = []
def backend(gm, inputs):
    graphs.append(gm)
    return gm.forward
got = torch.compile(gpu_torch.block, backend=backend)(*gpu_torch.block_inputs())
print(json.dumps({"explain_graphs": explained.graph_count,
                  "explain_breaks": explained.graph_break_count,
                  "graphs": len(graphs),
                  "breaks": sum(counters["graph_break"].values()),
                  "reasons": sorted(counters["graph_break"]),
                  "matches_eager": gpu_torch.same(got, gpu_torch.block(*gpu_torch.block_inputs())),
                  "compile_wrap": gpu_torch.ops.library.compile_wrap}))
"""


def check_escape_hatch():
    env = dict(os.environ, AF3_KERNELS_COMPILE_WRAP="disable")
    here = os.path.dirname(os.path.abspath(__file__))
    result = subprocess.run(
        [sys.executable, "-c", ESCAPE_HATCH, here], capture_output=True, text=True, env=env
    )
    if not check(result.returncode == 0, f"escape hatch run failed: {result.stderr[-2000:]}"):
        return
    explained = json.loads(result.stdout.strip().splitlines()[-1])
    REPORT["escape_hatch"] = explained
    check(not explained["compile_wrap"], "AF3_KERNELS_COMPILE_WRAP=disable was not read")
    check(
        explained["breaks"] == BLOCK_OPS,
        f"escape hatch: {explained['breaks']} breaks, want one per op ({BLOCK_OPS})",
    )
    check(explained["matches_eager"], "escape hatch: the compiled block differs from eager")


def check_gradients():
    generator = torch.Generator(device="cuda").manual_seed(9)
    rows = []
    for shape in ((37, 300), (64, 1024)):
        x = bf16(*shape, low=-3, high=3, generator=generator)
        gate = bf16(*shape, low=-6, high=6, generator=generator)
        grad = bf16(*shape, generator=generator)
        want_x = x.float().requires_grad_()
        want_gate = gate.float().requires_grad_()
        (want_x * torch.sigmoid(want_gate)).backward(grad.float())
        for mode in ("eager", "compiled"):
            got_x = x.clone().requires_grad_()
            got_gate = gate.clone().requires_grad_()
            call = ops.sigmoid_gate if mode == "eager" else torch.compile(ops.sigmoid_gate, fullgraph=True)
            out = call(got_x, got_gate)
            out.backward(grad)
            ok_x, error_x = close(got_x.grad, want_x.grad.bfloat16(), *BF16)
            ok_gate, error_gate = close(got_gate.grad, want_gate.grad.bfloat16(), *BF16)
            rows.append({"shape": list(shape), "mode": mode, "grad_x_error": error_x, "grad_gate_error": error_gate})
            check(ok_x and ok_gate, f"sigmoid_gate gradients {shape} {mode}: errors {error_x:.3g}, {error_gate:.3g}")
    REPORT["gradients"] = rows
    torch._dynamo.reset()


# --- timings -----------------------------------------------------------------------------


def per_call_us(call, count=2000, repeats=5):
    """Host time of one call, µs: the median of `repeats` loops of `count` calls, each loop
    timed from its first call to its last returning (the GPU keeps up with small kernels)."""
    for _ in range(200):
        call()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        began = time.perf_counter()
        for _ in range(count):
            call()
        samples.append((time.perf_counter() - began) / count * 1e6)
        torch.cuda.synchronize()
    return statistics.median(samples)


DIRECT = r"""
import json, torch, torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from af3_kernels import ops
namespace = torch.ops.af3_kernels
x = torch.randn((37, 300), device="cuda").bfloat16()
w = torch.randn((300,), device="cuda").bfloat16()
b = torch.randn((300,), device="cuda").bfloat16()
gate = torch.randn((37, 300), device="cuda").bfloat16()
found = {}
y = ops.layer_norm(x, (300,), w, b, 1e-5)
found["plain_call_defines"] = hasattr(namespace, "layer_norm")
found["plain_matches"] = bool(torch.allclose(y.float(), F.layer_norm(x, (300,), w, b, 1e-5).float(), atol=0.05))
one = ops.layer_norm(x, (300,), w, b, 1)
found["int_eps_defines"] = hasattr(namespace, "layer_norm")
found["int_eps_matches_float"] = bool(torch.equal(one, ops.layer_norm(x, (300,), w, b, 1.0)))
s = ops.sigmoid_gate(x, gate)
found["sigmoid_gate_plain_defines"] = hasattr(namespace, "sigmoid_gate")
xg, gg = x.clone().requires_grad_(), gate.clone().requires_grad_()
ops.sigmoid_gate(xg, gg).float().sum().backward()
found["grad_defines"] = hasattr(namespace, "sigmoid_gate")
xr, gr = x.float().requires_grad_(), gate.float().requires_grad_()
(xr * torch.sigmoid(gr)).sum().backward()
found["grad_matches"] = bool(torch.allclose(xg.grad.float(), xr.grad, atol=0.05) and torch.allclose(gg.grad.float(), gr.grad, atol=0.05))
# Tensors the dispatcher resolves before a kernel sees them: a negative view, a zero tensor.
want = (-x.float() * torch.sigmoid(gate.float())).bfloat16()
found["negative_view_matches"] = bool(torch.allclose(ops.sigmoid_gate(torch._neg_view(x), gate).float(), want.float(), atol=0.05))
zero = torch._efficientzerotensor(x.shape, dtype=x.dtype, device=x.device)
found["zero_tensor_is_zero"] = bool(torch.equal(ops.sigmoid_gate(zero, gate), torch.zeros_like(x)))
x32, f32 = torch.randn((8, 16), device="cuda"), torch.randn((8,), device="cuda")
with torch.no_grad():  # a parameter (a module's weight) is a plain tensor: a direct call
    scaled = ops.scale_rows(x32, torch.nn.Parameter(f32.clone()))
found["parameter_matches"] = bool(torch.allclose(scaled, x32 * f32[:, None]))
found["scale_rows_defined_before_profiler"] = hasattr(namespace, "scale_rows")
with torch.profiler.profile() as profile:
    ops.scale_rows(x32, f32)
found["profiler_sees_op"] = any(event.name == "af3_kernels::scale_rows" for event in profile.events())
with FakeTensorMode() as mode:
    fake = ops.swiglu(mode.from_tensor(torch.randn((4, 8), device="cuda").bfloat16()))
found["fake_shape"] = list(fake.shape)
print(json.dumps(found))
"""


def check_direct():
    """Which calls skip the dispatcher, in a fresh process (no op defined yet)."""
    result = subprocess.run([sys.executable, "-c", DIRECT], capture_output=True, text=True)
    if not check(result.returncode == 0, f"direct calls failed: {result.stderr[-3000:]}"):
        return
    found = json.loads(result.stdout.strip().splitlines()[-1])
    REPORT["direct"] = found
    want = {
        "plain_call_defines": False, "plain_matches": True, "int_eps_defines": True,
        "int_eps_matches_float": True, "sigmoid_gate_plain_defines": False,
        "grad_defines": True, "grad_matches": True,
        "negative_view_matches": True, "zero_tensor_is_zero": True, "parameter_matches": True,
        "scale_rows_defined_before_profiler": False, "profiler_sees_op": True,
        "fake_shape": [4, 4],
    }
    for name, value in want.items():
        check(found.get(name) == value, f"direct calls: {name} is {found.get(name)!r}, expected {value!r}")


def time_overhead():
    generator = torch.Generator(device="cuda").manual_seed(1)
    rows, cols = 64, 256
    x = bf16(rows, cols, generator=generator)
    gate = bf16(rows, cols, generator=generator)
    out = torch.empty_like(x)
    weight = bf16(cols, generator=generator)
    bias = bf16(cols, generator=generator)
    x32 = torch.randn((rows, cols), device="cuda")
    factors = torch.randn((rows,), device="cuda")
    out32 = torch.empty_like(x32)
    import af3_kernels

    gate_function = af3_kernels.load("sigmoid_gate").function("sigmoid_gate")
    scale_function = af3_kernels.load("scale_rows").function("scale_rows<float>")
    norm_function = af3_kernels.load("layernorm_bf16").function("layernorm_bf16")
    count = rows * cols
    stream = torch.cuda.current_stream().cuda_stream
    p = {name: t.data_ptr() for name, t in dict(out=out, x=x, gate=gate, weight=weight, bias=bias, out32=out32, x32=x32, factors=factors).items()}
    library_ops = ops.library.ops
    results = {}
    for name, op_call, dispatcher_call, implementation_call, raw_call, raw_int_call, native_call in (
        (
            "sigmoid_gate",
            lambda: ops.sigmoid_gate(x, gate),
            lambda: ops.sigmoid_gate.default(x, gate),
            lambda: library_ops["sigmoid_gate"].cuda(x, gate),
            lambda: gate_function.launch(count // 256, 256, [out, x, gate, count]),
            lambda: gate_function.launch(count // 256, 256, [p["out"], p["x"], p["gate"], count], 0, stream),
            lambda: x * torch.sigmoid(gate),
        ),
        (
            "scale_rows",
            lambda: ops.scale_rows(x32, factors),
            lambda: ops.scale_rows.default(x32, factors),
            lambda: library_ops["scale_rows"].cuda(x32, factors),
            lambda: scale_function.launch(count // 256, 256, [out32, x32, factors, rows, cols]),
            lambda: scale_function.launch(count // 256, 256, [p["out32"], p["x32"], p["factors"], rows, cols], 0, stream),
            lambda: x32 * factors[:, None],
        ),
        (
            "layer_norm",
            lambda: ops.layer_norm(x, (cols,), weight, bias, 1e-5),
            lambda: ops.layer_norm.default(x, (cols,), weight, bias, 1e-5),
            lambda: library_ops["layer_norm"].cuda(x, (cols,), weight, bias, 1e-5),
            lambda: norm_function.launch(rows, 256, [out, x, weight, bias, rows, cols, 1e-5]),
            lambda: norm_function.launch(rows, 256, [p["out"], p["x"], p["weight"], p["bias"], rows, cols, 1e-5], 0, stream),
            lambda: F.layer_norm(x, (cols,), weight, bias, 1e-5),
        ),
    ):
        row = {
            "op_us": per_call_us(op_call),
            "dispatcher_us": per_call_us(dispatcher_call),
            "implementation_without_dispatcher_us": per_call_us(implementation_call),
            "raw_launch_us": per_call_us(raw_call),
            "raw_launch_ints_us": per_call_us(raw_int_call),
            "native_us": per_call_us(native_call),
        }
        # The same call marked in traces (as under AF3_KERNELS_TRACE=1, no profiler running).
        tracing, ops.library.trace = ops.library.trace, True
        try:
            row["op_traced_us"] = per_call_us(op_call)
        finally:
            ops.library.trace = tracing
        with torch.inference_mode():
            row["op_inference_mode_us"] = per_call_us(op_call)
            row["native_inference_mode_us"] = per_call_us(native_call)
        row["op_vs_native"] = row["op_us"] / row["native_us"]
        results[name] = row
    REPORT["overhead_us"] = results
    for name, row in results.items():
        check(
            row["op_vs_native"] <= 2.0,
            f"{name}: op call {row['op_us']:.1f} µs is more than 2x native {row['native_us']:.1f} µs",
        )


def time_block():
    results = {}
    for label, shape in (("small", dict(rows=256, cols=128, n=64)), ("large", dict(rows=4096, cols=384, n=256))):
        inputs = block_inputs(**shape)
        torch._dynamo.reset()
        modes = {
            "eager": block,
            "compiled": torch.compile(block, fullgraph=True),
            "reduce-overhead": torch.compile(block, mode="reduce-overhead", fullgraph=True),
        }
        row = {}
        for mode, call in modes.items():
            for _ in range(5):
                call(*inputs)
            torch.cuda.synchronize()
            samples = []
            for _ in range(5):
                began = time.perf_counter()
                for _ in range(200):
                    call(*inputs)
                torch.cuda.synchronize()
                samples.append((time.perf_counter() - began) / 200 * 1e6)
            row[mode] = statistics.median(samples)
        results[label] = {"shape": shape, "us_per_step": row}
    REPORT["block_us"] = results
    torch._dynamo.reset()


def gated_residual_reference(x, gate, residual):
    return (residual.float() + x.float() * torch.sigmoid(gate.float())).to(x.dtype)


def check_module_op():
    """The embedded library's extension module op, `torch.ops.af3_native.gated_residual`
    (a C++ launcher on the stable ABI, loaded at `import af3_kernels`): fp32 and bf16 against
    torch at a ragged and a large size, its errors, one graph with the cubin ops under
    `torch.compile(fullgraph=True)`, and a CUDA graph replayed on new data."""
    op = torch.ops.af3_native.gated_residual
    generator = torch.Generator(device="cuda").manual_seed(3)
    results = {}
    for dtype, tolerance in ((torch.float32, (1e-6, 1e-6)), (torch.bfloat16, BF16)):
        for shape in ((37, 301), (4096, 3072)):
            x, gate, residual = (
                (torch.rand(shape, generator=generator, device="cuda") * 4 - 2).to(dtype)
                for _ in range(3)
            )
            ok, error = close(op(x, gate, residual), gated_residual_reference(x, gate, residual), *tolerance)
            check(ok, f"gated_residual {dtype} {shape}: max error {error}")
            results[f"{dtype}-{shape}"] = error
    x = torch.randn(64, 128, device="cuda")
    try:
        op(x, x.double(), x)
        check(False, "gated_residual took mixed dtypes")
    except RuntimeError as error:
        check("one dtype" in str(error), f"gated_residual's dtype error: {error}")

    def block(x, gate, residual):
        return ops.sigmoid_gate(op(x, gate, residual), gate)

    x, gate, residual = (bf16(256, 512, generator=generator) for _ in range(3))
    torch._dynamo.reset()
    explained = torch._dynamo.explain(block)(x, gate, residual)
    check(explained.graph_count == 1 and explained.graph_break_count == 0,
          f"module op + cubin op: {explained.graph_count} graphs, {explained.graph_break_count} breaks")
    compiled = torch.compile(block, fullgraph=True)
    check(same(compiled(x, gate, residual), block(x, gate, residual)), "compiled module block differs from eager")
    torch._dynamo.reset()

    static = [t.clone() for t in (x, gate, residual)]
    op(*static)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = op(*static)
    fresh = [bf16(256, 512, generator=generator) for _ in range(3)]
    for target, source in zip(static, fresh):
        target.copy_(source)
    graph.replay()
    torch.cuda.synchronize()
    check(same(out, op(*fresh)), "gated_residual replayed in a CUDA graph differs from eager on new data")
    REPORT["module_op"] = {
        "max_error": results,
        "graphs": explained.graph_count,
        "breaks": explained.graph_break_count,
        "loaded": [entry for entry in kwheel.provenance() if entry.get("kernel") == "_C"],
    }


FIRST_CALL = r"""
import json, sys, time, torch
which = sys.argv[1]
torch.cuda.init()
x = torch.randn((37, 300), device="cuda").bfloat16()
w = torch.ones((300,), device="cuda", dtype=torch.bfloat16)
b = torch.zeros((300,), device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
began = time.perf_counter()
if which == "af3_kernels.ops":
    from af3_kernels import ops
    imported = time.perf_counter()
    y = ops.layer_norm(x, (300,), w, b, 1e-5)
elif which == "af3_native (module)":
    import af3_kernels
    imported = time.perf_counter()
    y = torch.ops.af3_native.gated_residual(x, x, x)
else:
    import torch.nn.functional as F
    imported = time.perf_counter()
    y = F.layer_norm(x, (300,), w, b, 1e-5)
torch.cuda.synchronize()
done = time.perf_counter()
print(json.dumps({"import_ms": (imported - began) * 1e3, "total_ms": (done - began) * 1e3}))
"""


def time_first_call(processes=5):
    """Fresh processes importing from bytecode, as after a `pip install` that compiles: a
    first, uncounted process writes it under a private PYTHONPYCACHEPREFIX.
    `prebuilt/python/tests/bench_first_op.py` times each stage of the import."""
    import tempfile

    results = {}
    with tempfile.TemporaryDirectory(prefix="gpu-torch-pyc-") as cache:
        env = dict(os.environ, PYTHONPYCACHEPREFIX=cache)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        for which in ("af3_kernels.ops", "af3_native (module)", "torch.nn.functional"):
            samples = []
            for index in range(processes + 1):
                result = subprocess.run(
                    [sys.executable, "-c", FIRST_CALL, which], capture_output=True, text=True,
                    env=env,
                )
                if not check(result.returncode == 0, f"first call ({which}) failed: {result.stderr[-2000:]}"):
                    break
                if index:
                    samples.append(json.loads(result.stdout.strip().splitlines()[-1]))
            results[which] = samples
    REPORT["first_call_ms"] = results


def run_steps(steps, check):
    """Runs each step, timed; a step that raises is one failure, and the rest still run."""
    for step in steps:
        began = time.perf_counter()
        try:
            step()
        except Exception as error:  # keep going: one report with every failure
            import traceback

            traceback.print_exc()
            check(False, f"{step.__name__} raised {type(error).__name__}: {error}")
        print(f"{step.__name__}: {time.perf_counter() - began:.1f} s", flush=True)


def finish(name, report, failures, json_path):
    """Prints the report (and writes it to `json_path`), then exits 1 if anything failed."""
    report["failures"] = failures
    text = json.dumps(report, indent=2, default=str)
    print(text)
    if json_path:
        with open(json_path, "w") as handle:
            handle.write(text)
    if failures:
        print(f"{name}: {len(failures)} failed", file=sys.stderr)
        sys.exit(1)
    print(f"{name}: all checks passed")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results as JSON here")
    parser.add_argument("--skip-first-call", action="store_true")
    options = parser.parse_args()
    check(torch.cuda.is_available(), "torch sees no CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = False
    REPORT["device"] = torch.cuda.get_device_name()
    REPORT["torch"] = torch.__version__
    REPORT["kwheel"] = kwheel.__version__

    steps = [
        check_ops, check_requirements, check_direct, check_block, check_trace, check_escape_hatch,
        check_gradients, check_module_op,
        time_overhead,
        time_block,
    ]
    if not options.skip_first_call:
        steps.append(time_first_call)
    run_steps(steps, check)

    provenance = {name: str(op.kernel.registry.load(op.kernel.name, device=0).provenance) for name, op in ops.library.ops.items()}
    REPORT["provenance"] = provenance
    REPORT["loaded"] = kwheel.provenance()
    for name, text in provenance.items():
        check(text.startswith("prebuilt "), f"{name}: kernel not prebuilt ({text})")
    finish("gpu_torch", REPORT, FAILURES, options.json)


if __name__ == "__main__":
    main()
