#!/usr/bin/env python3
"""A classic ``TORCH_LIBRARY`` extension module from a kwheel wheel on a GPU: GPTQModel's
fast Hadamard transform.

GPTQModel (7.7.0, its sdist's ``gptqmodel_ext/hadamard``) vendors Tri Dao's
fast-hadamard-transform as a torch extension: ``hadamard.cpp`` includes
``<torch/extension.h>``, dispatches on dtype and size in C++ and registers
``torch.ops.gptqmodel_hadamard.*`` with ``TORCH_LIBRARY``; the library builds it with
``cpp_extension`` on first use. kwheel builds the two files, unmodified, as an ``abi = "torch"``
module (docs/real-libraries.md, "GPTQModel's Hadamard transform as a classic module"), and
the wheel ``gptq_hadamard`` carries it. Run where the wheel is installed (``pip install
--target DIR``, ``PYTHONPATH=DIR``), with no compiler in reach. Checks:

- ``import gptq_hadamard`` registers the ops and leaves CUDA uninitialised;
- ``fast_hadamard_transform`` equals ``x @ H * scale`` (``H`` Sylvester's Hadamard matrix) in
  float32, float16 and bfloat16 for sizes 256 to 8192, three calls on new tensors each;
- under ``torch.compile(fullgraph=True)`` (with the fake kernel a library registers for an op
  that returns a new tensor) one graph, no break; captured in a CUDA graph and replayed on new
  data;

and, with ``--own FILE`` naming the library's own build (``cpp_extension.load`` of the same
sources with the namespace renamed ``gptqmodel_hadamard_own``, made beforehand where nvcc is),
the host cost per call of the op from each build in this process, interleaved, and the first
call in a fresh process (import or load, then the first call) from each.

    python3 gpu_classic.py [--own FILE] [--json results.json]

Exit status 0 only when every check passes; without a GPU, it says so and exits 0.
"""

import statistics
import subprocess
import sys
import time

from gpu_checks import Checks, check_import_registers_without_cuda, gpu_arguments

# One fresh process: import or load one build and time its first call.
FIRST_CALL = r"""
import sys, time
import torch
after_torch = time.perf_counter()
which, own = sys.argv[1], sys.argv[2]
if which == "kwheel":
    import gptq_hadamard
    op = torch.ops.gptqmodel_hadamard.fast_hadamard_transform
else:
    torch.ops.load_library(own)
    op = torch.ops.gptqmodel_hadamard_own.fast_hadamard_transform
x = torch.randn(8, 256, device="cuda")
begin = time.perf_counter()
y = op(x, 0.0625)
torch.cuda.synchronize()
print((time.perf_counter() - begin) * 1e3, (begin - after_torch) * 1e3)
"""


def sylvester(n, device):
    import torch

    h = torch.ones(1, 1, device=device, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def main():
    arguments = gpu_arguments("gpu_classic", "--own")
    if arguments is None:
        return 0
    import torch

    checks = Checks("gpu_classic", device=torch.cuda.get_device_name(0), torch=torch.__version__)
    check, results = checks.check, checks.results

    check_import_registers_without_cuda(
        checks, ["gptq_hadamard"], ["gptqmodel_hadamard.fast_hadamard_transform"])

    import gptq_hadamard  # noqa: F401

    op = torch.ops.gptqmodel_hadamard.fast_hadamard_transform
    tolerance = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
    torch.manual_seed(0)
    for dtype, tol in tolerance.items():
        for dim in (256, 1024, 4096, 8192):
            h = sylvester(dim, "cuda")
            scale = dim ** -0.5
            errors = []
            for _ in range(3):
                x = torch.randn(37, dim, device="cuda", dtype=dtype)
                out = op(x, scale)
                expected = (x.double() @ h) * scale
                errors.append(float(((out.double() - expected).abs() / (expected.abs() + 1)).max()))
            check(f"hadamard_{str(dtype)[6:]}_{dim}", out.dtype == dtype and max(errors) <= tol,
                  f"three calls, largest relative error {max(errors):.2e}")

    @torch.library.register_fake("gptqmodel_hadamard::fast_hadamard_transform")
    def _(x, scale):
        return torch.empty_like(x)

    def block(x):
        return op(x * 2, 0.03125) + 1

    x = torch.randn(64, 1024, device="cuda", dtype=torch.float16)
    expected = block(x)
    import torch._dynamo

    torch._dynamo.reset()
    explanation = torch._dynamo.explain(block)(x)
    compiled = torch.compile(block, fullgraph=True)
    same = torch.allclose(compiled(x).float(), expected.float(), atol=1e-2, rtol=1e-2)
    check("torch_compile_one_graph",
          explanation.graph_count == 1 and explanation.graph_break_count == 0 and same,
          f"{explanation.graph_count} graph(s), {explanation.graph_break_count} break(s), "
          f"result equal: {same}")

    static_x = x.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        block(static_x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = block(static_x)
    errors = []
    for _ in range(3):
        static_x.copy_(torch.randn_like(static_x))
        graph.replay()
        torch.cuda.synchronize()
        errors.append(float((static_out.float() - block(static_x).float()).abs().max()))
    check("cuda_graph_replay", max(errors) == 0,
          f"three replays on new data, largest difference {max(errors)}")

    if arguments.own:
        # The library's own build registers the same op under `gptqmodel_hadamard_own` (its
        # sources with the namespace renamed), so both live in this process.
        torch.ops.load_library(arguments.own)
        own = torch.ops.gptqmodel_hadamard_own.fast_hadamard_transform.default
        mine = op.default
        x = torch.randn(8, 256, device="cuda")
        check("own_build_agrees", torch.equal(own(x, 0.0625), mine(x, 0.0625)), "same output")

        def per_call(run, calls=2000):
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                run(x, 0.0625)
            torch.cuda.synchronize()
            return (time.perf_counter() - start) / calls * 1e6

        samples = {"kwheel": [], "own": []}
        for _ in range(9):
            samples["kwheel"].append(per_call(mine))
            samples["own"].append(per_call(own))
        results["host_us"] = {w: statistics.median(v) for w, v in samples.items()}
        results["host_ratio"] = results["host_us"]["kwheel"] / results["host_us"]["own"]

        firsts = {"kwheel": [], "own": []}
        for _ in range(5):
            for which in firsts:
                out = subprocess.run([sys.executable, "-W", "ignore", "-c", FIRST_CALL, which,
                                      arguments.own], capture_output=True, text=True)
                if out.returncode != 0:
                    check(f"first_call_{which}", False, out.stderr.strip()[-400:])
                    return checks.finish(arguments.json)
                firsts[which].append([float(v) for v in out.stdout.split()])
        results["first_call_ms"] = {w: statistics.median(s[0] for s in v) for w, v in firsts.items()}
        results["setup_ms"] = {w: statistics.median(s[1] for s in v) for w, v in firsts.items()}
        print(f"gpu_classic: host us per call {results['host_us']} (kwheel / own build "
              f"{results['host_ratio']:.3f}, one process, 9 interleaved rounds of 2000), first "
              f"call ms {results['first_call_ms']}, import+load ms {results['setup_ms']}")
    return checks.finish(arguments.json)


if __name__ == "__main__":
    sys.exit(main())
