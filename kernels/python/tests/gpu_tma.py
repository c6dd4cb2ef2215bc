#!/usr/bin/env python3
"""A real TMA kernel from a kwheel bundle on a Hopper GPU: DeepGEMM's bf16 GEMM.

DeepGEMM's ``sm90_bf16_gemm_impl`` (``deep_gemm/include/deep_gemm/impls/sm90_bf16_gemm.cuh``)
is a persistent, warp-specialized CuTe kernel: it takes its operands as three
``__grid_constant__ cute::TmaDescriptor`` parameters (A, B and the output D), copies tiles
with TMA into 5 pipeline stages of shared memory (196,688 bytes of dynamic shared memory, far
above the 48 KB a launch gets without raising the entry's limit), and, built with
``kNumTMAMulticast = 2``, runs in clusters of two blocks where block 0 of each cluster loads
the shared B tile once and multicasts it into both blocks' shared memory. DeepGEMM's own C++
host code (``csrc/jit_kernels/impls/sm90_bf16_gemm.hpp``, ``runtime_utils.hpp``) makes the
descriptors and launches; here ``kwheel.tensor_map`` makes them the same way (2-D, box
``64 x 128``, 128-byte swizzle, 256-byte L2 promotion) and ``Kernel.launch`` launches with
``shared_mem=`` and ``cluster=``. The script checks, against ``torch.matmul`` in float32:

- the cluster-of-one entry and the cluster-of-two (multicast) entry each give the GEMM for
  three ``m`` on new tensors (DeepGEMM's own test metric, ``1 - 2<x,y>/(|x|^2+|y|^2)``, below
  1e-5, and the largest error within bf16 rounding);
- the multicast entry inside a CUDA graph: captured once, replayed on new data copied in;
- a map that breaks the copy engine's rules is refused before the driver sees it;

and times both entries against ``torch.matmul`` (bf16, cuBLAS) at 4096 x 4096 x 4096.

The bundle comes from a DeepGEMM checkout and CUTLASS 4.2's headers (``ci/setup-thirdparty``
fetches them into ``~/.cache/kwheel/thirdparty``), with the manifest of docs/real-libraries.md
("DeepGEMM's bf16 GEMM on the GPU: TMA maps, 196 KB of shared memory, a cluster of two"):

    kwheel dev bundle-kernels --manifest deep-gemm/kernels.toml --out dg-bundle
    python3 gpu_tma.py dg-bundle [--json results.json]

Exit status 0 only when every check passes; without a GPU, it says so and exits 0.
"""

import statistics
import sys

from gpu_checks import Checks, gpu_arguments

N = K = 4096
BLOCK_M = BLOCK_N = 128
BLOCK_K = 64
STAGES = 5
# DeepGEMM's shared-memory layout for this instance: the D tile, then A and B per stage, then
# a full and an empty barrier (8 bytes each) per stage.
SHARED = BLOCK_M * BLOCK_N * 2 + STAGES * (BLOCK_M * BLOCK_K + BLOCK_N * BLOCK_K) * 2 + STAGES * 2 * 8
SMS = 132


def entry(multicast):
    return (
        "sm90_bf16_gemm_impl<cute::UMMA::Major::K, cute::UMMA::Major::K, 0, 4096, 4096, 1, "
        f"128, 128, 64, 128, 128, 128, {STAGES}, 128, 256, {multicast}, false, {SMS}, "
        "GemmType::Normal, false, cutlass::bfloat16_t>"
    )


def maps(a, b, d):
    import kwheel

    # As DeepGEMM's make_tma_2d_desc: with a 128-byte swizzle the box is 64 bf16 wide.
    box = lambda rows: (rows, 128 // a.element_size())  # noqa: E731
    return [
        kwheel.tensor_map(a, box(BLOCK_M), swizzle=128, l2_promotion=256),
        kwheel.tensor_map(b, box(BLOCK_N), swizzle=128, l2_promotion=256),
        kwheel.tensor_map(d, box(BLOCK_M), swizzle=128, l2_promotion=256),
    ]


def gemm(kernel, a, b, d, multicast):
    """D = A @ B^T (A: m x K, B: N x K, both K-major), launched as DeepGEMM's host code does."""
    m = a.shape[0]
    kernel.launch(SMS, 384, [None, m, N, K, *maps(a, b, d)], entry=entry(multicast),
                  shared_mem=SHARED, cluster=(multicast, 1, 1) if multicast > 1 else None)


def difference(x, y):
    """DeepGEMM's test metric."""
    x, y = x.double(), y.double()
    denominator = (x * x + y * y).sum()
    return float(1 - 2 * (x * y).sum() / denominator)


def main():
    arguments = gpu_arguments("gpu_tma", "bundle")
    if arguments is None:
        return 0
    import torch

    import kwheel

    device = torch.device("cuda", 0)
    properties = torch.cuda.get_device_properties(device)
    if (properties.major, properties.multi_processor_count) != (9, SMS):
        print(f"gpu_tma: SKIPPED: the bundle's instance is for a 9.0 GPU of {SMS} multiprocessors,"
              f" this is {properties.name} ({properties.major}.{properties.minor}, "
              f"{properties.multi_processor_count})")
        return 0
    registry = kwheel.open(arguments.bundle)
    kernel = registry.load("sm90_bf16_gemm", device=0)
    checks = Checks("gpu_tma", device=properties.name, shared_mem=SHARED,
                    provenance=str(kernel.provenance))
    check, results = checks.check, checks.results

    torch.manual_seed(0)
    for multicast in (1, 2):
        for m in (4096, 2048, 768):
            a = torch.randn(m, K, device=device, dtype=torch.bfloat16)
            b = torch.randn(N, K, device=device, dtype=torch.bfloat16)
            d = torch.full((m, N), float("nan"), device=device, dtype=torch.bfloat16)
            gemm(kernel, a, b, d, multicast)
            torch.cuda.synchronize()
            reference = a.float() @ b.float().T
            diff = difference(d, reference)
            worst = float((d.float() - reference).abs().max())
            scale = float(reference.abs().max())
            check(f"gemm_cluster{multicast}_m{m}", diff < 1e-5 and worst <= scale / 128,
                  f"diff {diff:.2e}, largest error {worst:.3f} of values up to {scale:.1f}")

    # A CUDA graph: maps made once for the static tensors, the launch captured and replayed.
    m = 2048
    a = torch.randn(m, K, device=device, dtype=torch.bfloat16)
    b = torch.randn(N, K, device=device, dtype=torch.bfloat16)
    d = torch.empty((m, N), device=device, dtype=torch.bfloat16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        gemm(kernel, a, b, d, 2)  # warm-up outside the capture
        with torch.cuda.graph(graph, stream=stream):
            gemm(kernel, a, b, d, 2)
    torch.cuda.current_stream().wait_stream(stream)
    diffs = []
    for _ in range(3):
        a.copy_(torch.randn_like(a))
        b.copy_(torch.randn_like(b))
        d.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        diffs.append(difference(d, a.float() @ b.float().T))
    check("cuda_graph_cluster2", max(diffs) < 1e-5, f"three replays on new data, diff {max(diffs):.2e}")

    # The copy engine's rules, before the driver: a row stride that is not 16-byte aligned.
    odd = torch.empty(256, 100, device=device, dtype=torch.bfloat16)
    try:
        kwheel.tensor_map(odd, (128, 64), swizzle=128)
        check("bad_map_refused", False, "a 200-byte row stride was accepted")
    except ValueError as error:
        check("bad_map_refused", "dimension 0's stride is 200 bytes" in str(error), str(error))

    # Throughput at 4096^3, kwheel's launches against cuBLAS through torch.matmul.
    m = 4096
    a = torch.randn(m, K, device=device, dtype=torch.bfloat16)
    b = torch.randn(N, K, device=device, dtype=torch.bfloat16)
    d = torch.empty((m, N), device=device, dtype=torch.bfloat16)
    flops = 2 * m * N * K

    def timed(run):
        for _ in range(5):
            run()
        samples = []
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(20):
                run()
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end) / 20)
        return statistics.median(samples)

    times = {
        "deepgemm_cluster1": timed(lambda: gemm(kernel, a, b, d, 1)),
        "deepgemm_cluster2": timed(lambda: gemm(kernel, a, b, d, 2)),
        "torch_matmul": timed(lambda: torch.matmul(a, b.T)),
    }
    results["tflops"] = {name: flops / (ms * 1e-3) / 1e12 for name, ms in times.items()}
    results["ms"] = times
    for name, ms in times.items():
        print(f"gpu_tma: {name}: {ms:.3f} ms, {results['tflops'][name]:.0f} TFLOP/s")
    return checks.finish(arguments.json)


if __name__ == "__main__":
    sys.exit(main())
