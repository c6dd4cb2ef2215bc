#!/usr/bin/env python3
"""Extension modules from kwheel wheels on a GPU: vLLM's stable-ABI ops and kwtest's axpby.

Run where the wheels are installed (``pip install --target DIR``, ``PYTHONPATH=DIR``) next to
a CUDA torch, with no compiler in reach. Two packages:

- ``vllm_kernels``: a subset of vLLM 0.34's ``_C_stable_libtorch`` built by kwheel from the
  sdist's own launcher files (``csrc/activation_kernels.cu``, ``csrc/layernorm_kernels.cu``)
  and a registration file in the form of vLLM's ``csrc/torch_bindings.cpp`` declaring just
  those ops (docs/real-libraries.md, "vLLM's stable-ABI ops as an extension module");
- ``kwtest_ops``: the test fixture's stable-ABI module (``testkit/fixtures/stable_module``).

Checks, each against a torch reference: ``torch.ops._C.silu_and_mul``, ``gelu_and_mul``,
``gelu_tanh_and_mul``, ``rms_norm`` and ``fused_add_rms_norm`` in bf16, fp16 and fp32 right
after ``import vllm_kernels`` (CUDA not initialised by the import); ``status()`` of each
module right after the import says it is available and its fatbin covers the device, whose
capability NVML reads as 9.0, and neither the import nor ``status()`` initialises CUDA; a block of these ops under
``torch.compile(fullgraph=True)`` is one graph with no break; the same block captured in a
CUDA graph and replayed on new data; ``torch.ops.kwtest.axpby`` on CUDA tensors. Then, in
fresh processes, the first call through a module (import + load + first call) against
torch's own first op, and the host cost per call of a module op against torch's.

    python3 gpu_modules.py [--json results.json]

Exit status 0 only when every check passes; without a GPU, it says so and exits 0.
"""

import json
import os
import statistics
import subprocess
import sys
import time

from gpu_checks import Checks, check_import_registers_without_cuda, gpu_arguments

# In a fresh process: what `status()` says of each module right after the import, the GPU as
# NVML reads it, and whether either initialised CUDA. A ModuleArchWarning is an error here.
STATUS = r"""
import json, warnings
import kwheel
warnings.simplefilter("error", kwheel.ModuleArchWarning)
import torch, kwtest_ops, vllm_kernels
after_import = torch.cuda.is_initialized()
devices, why = kwheel._kwheel.visible_devices()
status = {package: kwheel.open(package).status() for package in ("kwtest_ops", "vllm_kernels")}
print(json.dumps({
    "after_import": after_import,
    "after_status": torch.cuda.is_initialized(),
    "nvml": [(d["ordinal"], d["name"], list(d["capability"])) for d in devices or []],
    "why": why,
    "status": status,
}))
"""

FIRST_CALL = r"""
import time, sys
start = time.perf_counter()
import torch
after_torch = time.perf_counter()
which = sys.argv[1]
if which == "module":
    import vllm_kernels  # loads the module: its ops are registered
    x = torch.randn(16, 512, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(16, 256, device="cuda", dtype=torch.bfloat16)
    begin = time.perf_counter()
    torch.ops._C.silu_and_mul(out, x)
else:
    x = torch.randn(16, 512, device="cuda", dtype=torch.bfloat16)
    begin = time.perf_counter()
    out = torch.nn.functional.silu(x[:, :256]) * x[:, 256:]
torch.cuda.synchronize()
end = time.perf_counter()
print(f"{(end - begin) * 1e3:.3f} {(begin - after_torch) * 1e3:.3f}")
"""


def references():
    import torch
    import torch.nn.functional as F

    def gated(activation):
        def run(x):
            d = x.shape[-1] // 2
            return activation(x[..., :d].float()) * x[..., d:].float()

        return run

    def rms(x, weight, eps):
        x = x.float()
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()

    return {
        "silu_and_mul": gated(F.silu),
        "gelu_and_mul": gated(lambda t: F.gelu(t, approximate="none")),
        "gelu_tanh_and_mul": gated(lambda t: F.gelu(t, approximate="tanh")),
        "rms_norm": rms,
    }


def main():
    arguments = gpu_arguments("gpu_modules")
    if arguments is None:
        return 0
    import torch

    checks = Checks("gpu_modules", device=torch.cuda.get_device_name(0), torch=torch.__version__)
    check, results = checks.check, checks.results

    check_import_registers_without_cuda(
        checks, ["vllm_kernels", "kwtest_ops"], ["_C.silu_and_mul", "kwtest.axpby"])

    probe = subprocess.run([sys.executable, "-c", STATUS], capture_output=True, text=True)
    try:
        seen = json.loads(probe.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        seen = None
    detail = (probe.stdout + probe.stderr).strip()[-600:]
    check("status_without_cuda", seen is not None and seen["after_import"] is False
          and seen["after_status"] is False, detail)
    nvml = (seen or {}).get("nvml") or []
    check("nvml_reads_capability_9_0", bool(nvml) and nvml[0][2] == [9, 0],
          f"NVML: {nvml or (seen or {}).get('why')}")
    kwtest = ((seen or {}).get("status") or {}).get("kwtest_ops", {}).get("_C (module)", "")
    check("status_kwtest_module_covers_sm_90",
          kwtest.startswith("available: module cu130/") and "its fatbin covers sm_90 (sm_90a) on cuda:0" in kwtest,
          kwtest or detail)
    vllm = ((seen or {}).get("status") or {}).get("vllm_kernels", {})
    modules = {name: text for name, text in vllm.items() if name.endswith(" (module)")}
    check("status_vllm_modules_available",
          bool(modules) and all(text.startswith("available: ") and "its fatbin covers sm_90" in text
                                for text in modules.values()),
          json.dumps(modules or vllm)[:600])

    import vllm_kernels  # noqa: F401
    import kwtest_ops  # noqa: F401

    ref = references()
    tolerance = {torch.bfloat16: 2e-2, torch.float16: 2e-3, torch.float32: 1e-5}
    torch.manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        tol = tolerance[dtype]
        for op in ("silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"):
            x = torch.randn(83, 2 * 1024, device="cuda", dtype=dtype)
            out = torch.empty(83, 1024, device="cuda", dtype=dtype)
            getattr(torch.ops._C, op)(out, x)
            expected = ref[op](x)
            error = float(((out.float() - expected).abs() / (expected.abs() + 1)).max())
            check(f"{op}_{str(dtype)[6:]}", error <= tol, f"largest relative error {error:.2e}")
        x = torch.randn(67, 4096, device="cuda", dtype=dtype)
        weight = torch.randn(4096, device="cuda", dtype=dtype)
        out = torch.empty_like(x)
        torch.ops._C.rms_norm(out, x, weight, 1e-6)
        expected = ref["rms_norm"](x, weight, 1e-6)
        error = float(((out.float() - expected).abs() / (expected.abs() + 1)).max())
        check(f"rms_norm_{str(dtype)[6:]}", error <= 2 * tol, f"largest relative error {error:.2e}")
        residual = torch.randn_like(x)
        summed = x.float() + residual.float()
        inplace, residual_inplace = x.clone(), residual.clone()
        torch.ops._C.fused_add_rms_norm(inplace, residual_inplace, weight, 1e-6)
        expected = ref["rms_norm"](summed.to(dtype), weight, 1e-6)
        error = float(((inplace.float() - expected).abs() / (expected.abs() + 1)).max())
        residual_error = float((residual_inplace.float() - summed.to(dtype).float()).abs().max())
        check(f"fused_add_rms_norm_{str(dtype)[6:]}", error <= 2 * tol and residual_error == 0,
              f"largest relative error {error:.2e}, residual {residual_error:.1e}")

    x = torch.randn(1000, device="cuda")
    y = torch.randn(1000, device="cuda")
    # nvcc contracts `a * x + y` to one FMA (one rounding); torch's `2.5 * x + y` rounds twice.
    got = torch.ops.kwtest.axpby(x, y, 2.5).double()
    expected = 2.5 * x.double() + y.double()
    error = float(((got - expected).abs() / (expected.abs() + 1)).max())
    check("kwtest_axpby_cuda", error <= 2 ** -23, f"2.5 * x + y in float64, largest relative error {error:.1e}")

    def block(x, weight):
        hidden = torch.empty(x.shape[0], x.shape[1] // 2, device=x.device, dtype=x.dtype)
        torch.ops._C.silu_and_mul(hidden, x)
        out = torch.empty_like(hidden)
        torch.ops._C.rms_norm(out, hidden, weight, 1e-6)
        return out * 2

    x = torch.randn(64, 2048, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    expected = block(x, weight)
    import torch._dynamo

    torch._dynamo.reset()
    explanation = torch._dynamo.explain(block)(x, weight)
    compiled = torch.compile(block, fullgraph=True)
    same = torch.allclose(compiled(x, weight).float(), expected.float(), atol=1e-2, rtol=1e-2)
    check("torch_compile_one_graph", explanation.graph_count == 1 and explanation.graph_break_count == 0 and same,
          f"{explanation.graph_count} graph(s), {explanation.graph_break_count} break(s), result equal: {same}")

    static_x = x.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        block(static_x, weight)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = block(static_x, weight)
    errors = []
    for _ in range(3):
        static_x.copy_(torch.randn_like(static_x))
        graph.replay()
        torch.cuda.synchronize()
        errors.append(float((static_out.float() - block(static_x, weight).float()).abs().max()))
    check("cuda_graph_replay", max(errors) == 0, f"three replays on new data, largest difference {max(errors)}")

    # First call in fresh processes, interleaved: through the module, and torch's own op.
    env = dict(os.environ)
    firsts = {"module": [], "torch": []}
    for _ in range(5):
        for which in firsts:
            out = subprocess.run([sys.executable, "-c", FIRST_CALL, which], capture_output=True,
                                 text=True, env=env, check=True).stdout.split()
            firsts[which].append((float(out[0]), float(out[1])))
    results["first_call_ms"] = {
        which: {"call": statistics.median(c for c, _ in runs), "setup": statistics.median(s for _, s in runs)}
        for which, runs in firsts.items()
    }
    print(f"gpu_modules: first call (median of 5 fresh processes): {results['first_call_ms']}")

    # Host cost per call: the module op against torch's, small tensors, interleaved rounds.
    x = torch.randn(16, 512, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(16, 256, device="cuda", dtype=torch.bfloat16)
    a = torch.randn(4096, device="cuda")

    def per_call(run, calls=2000):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            run()
        torch.cuda.synchronize()
        return (time.perf_counter() - start) / calls * 1e6

    runs = {
        "module_silu_and_mul": lambda: torch.ops._C.silu_and_mul(out, x),
        "torch_mul": lambda: torch.mul(a, a),
        "module_axpby": lambda: torch.ops.kwtest.axpby(a, a, 2.0),
        "torch_add_alpha": lambda: torch.add(a, a, alpha=2.0),
    }
    samples = {name: [] for name in runs}
    for _ in range(7):
        for name, run in runs.items():
            samples[name].append(per_call(run))
    results["host_us"] = {name: statistics.median(values) for name, values in samples.items()}
    print(f"gpu_modules: host cost per call, us (median of 7 x 2000): {results['host_us']}")
    return checks.finish(arguments.json)


if __name__ == "__main__":
    sys.exit(main())
