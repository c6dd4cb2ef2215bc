#!/usr/bin/env python3
"""End to end on a GPU: every af3-kernels kernel from the installed wheels, on torch tensors.

With the `kwheel` runtime wheel and the `af3-kernels` wheel installed (`pip install --no-index
--no-deps`), and no compiler within reach, this script

- checks that nothing could compile: `AF3_KERNELS_JIT_FALLBACK=0`, no `nvcc` on `PATH`,
  `CUDA_HOME` unset-and-no-`/usr/local/cuda` or pointing where there is no toolkit, no
  `KWHEEL_NVRTC`; and it gives the JIT a fresh, empty cache that must stay empty;
- times the first call of one op from Python: `import af3_kernels` + `load()` + launch +
  synchronize, after `torch.cuda.init()` and the context creation PyTorch pays anyway;
- calls every entry of every default kernel on torch tensors (the ragged shapes of
  `kernels/reference/src/cases.rs` and a larger one), with the launch geometry from the
  kernel's exported constants, and compares with a torch reference;
- asserts that every kernel was loaded from a prebuilt cubin;
- checks launch-argument errors and stream handling, times launches, and prints a summary.

usage: gpu_e2e.py [--json results.json] [--sizes small,large]

Exit status 0 only when every check passes.
"""

import argparse
import collections
import json
import os
import shutil
import sys
import tempfile
import time


def fail(message):
    print(f"gpu_e2e: FAILED: {message}", file=sys.stderr)
    sys.exit(1)


# ---------------------------------------------------------------------------------------------
# No compiler within reach


def check_no_compiler():
    """Compiling must be both forbidden and impossible; returns what was checked."""
    checked = {}
    if os.environ.get("AF3_KERNELS_JIT_FALLBACK") != "0":
        fail("run with AF3_KERNELS_JIT_FALLBACK=0: the point is that nothing compiles")
    checked["AF3_KERNELS_JIT_FALLBACK"] = "0"
    nvcc = shutil.which("nvcc")
    if nvcc:
        fail(f"nvcc is on PATH ({nvcc}); run with a PATH that has no CUDA toolkit")
    checked["nvcc on PATH"] = "none"
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    # Unset, kwheel's JIT search falls back to /usr/local/cuda.
    toolkit = cuda_home or "/usr/local/cuda"
    for tool in ("bin/nvcc", "lib64/libnvrtc.so", "lib/libnvrtc.so"):
        if os.path.exists(os.path.join(toolkit, tool)):
            fail(
                f"{toolkit}/{tool} exists (CUDA_HOME={cuda_home or 'unset'}); run with "
                "CUDA_HOME=/nonexistent"
            )
    checked["CUDA_HOME"] = f"{cuda_home or 'unset'} (no toolkit at {toolkit})"
    if os.environ.get("KWHEEL_NVRTC"):
        fail("KWHEEL_NVRTC is set; unset it")
    checked["KWHEEL_NVRTC"] = "unset"
    return checked


def nvrtc_in_site_packages():
    """NVRTC wheels next to torch (torch needs them): reachable only by a JIT that is off."""
    import site

    found = []
    for directory in list(site.getsitepackages()) + sys.path:
        for relative in ("nvidia/cu13/lib/libnvrtc.so.13", "nvidia/cuda_nvrtc/lib/libnvrtc.so.12"):
            path = os.path.join(directory, relative)
            if os.path.exists(path) and path not in found:
                found.append(path)
    return found


# ---------------------------------------------------------------------------------------------
# Tensors and references


def ceil_div(a, b):
    return -(-a // b)


# One launch of one entry, with its inputs, outputs and torch reference; `tolerance` is
# (rtol, atol), and (0, 0) means bit-exact.
Case = collections.namedtuple(
    "Case", "kernel entry shape grid block args outputs reference tolerance"
)


def make_cases(torch, constants, size):
    """Every entry of every default kernel at one size (`small`: cases.rs's shapes)."""
    F = torch.nn.functional
    generator = torch.Generator(device="cuda").manual_seed(0x1A7E + (size == "large"))
    cuda = "cuda"

    def uniform(shape, low, high, dtype=torch.float32):
        values = torch.rand(shape, generator=generator, device=cuda, dtype=torch.float32)
        return (values * (high - low) + low).to(dtype)

    bf16 = torch.bfloat16
    bf16_tolerance = (1.0 / 128, 1e-5)  # one bf16 ulp
    rows, cols = (37, 300) if size == "small" else (4096, 768)
    cases = []

    # layernorm_bf16: (out, in, gamma, beta, rows, cols, eps); one block per row.
    x = uniform((rows, cols), -2.0, 4.0, bf16)
    gamma = uniform((cols,), 0.5, 1.5, bf16)
    beta = uniform((cols,), -0.5, 0.5, bf16)
    out = torch.empty_like(x)
    eps = 1e-5
    block = constants["layernorm_bf16"]["BLOCK_SIZE"]
    cases.append(
        Case(
            "layernorm_bf16",
            "layernorm_bf16",
            f"[{rows}, {cols}]",
            rows,
            block,
            [out, x, gamma, beta, rows, cols, eps],
            [out],
            lambda x=x, gamma=gamma, beta=beta, cols=cols: [
                F.layer_norm(x.float(), (cols,), gamma.float(), beta.float(), eps).to(bf16)
            ],
            # torch's fp32 statistics differ in the last bits from the kernel's two-pass
            # ones, which can move a result to the neighbouring bf16.
            (1.0 / 128, 1.0 / 64),
        )
    )

    # swiglu: (out, in, rows, hidden); one thread per output element.
    hidden = cols
    x = uniform((rows, 2 * hidden), -4.0, 4.0, bf16)
    out = torch.empty((rows, hidden), device=cuda, dtype=bf16)
    block = constants["swiglu"]["BLOCK_SIZE"]
    cases.append(
        Case(
            "swiglu",
            "swiglu",
            f"[{rows}, 2 x {hidden}]",
            ceil_div(rows * hidden, block),
            block,
            [out, x, rows, hidden],
            [out],
            lambda x=x, hidden=hidden: [
                (F.silu(x[:, :hidden].float()) * x[:, hidden:].float()).to(bf16)
            ],
            bf16_tolerance,
        )
    )

    # masked_softmax_pair_bias: (out, logits, bias, mask, batch, heads, n, scale), fp32; one
    # block per (b, h, i) row. Item 0: random mask; item 1: every key kept; item 2: none.
    batch, heads, n = (3, 2, 133) if size == "small" else (3, 4, 384)
    scale = 0.25
    logits = uniform((batch, heads, n, n), -8.0, 8.0)
    bias = uniform((heads, n, n), -2.0, 2.0)
    mask = torch.zeros((batch, n), device=cuda, dtype=torch.float32)
    mask[0] = (torch.rand((n,), generator=generator, device=cuda) < 0.75).float()
    mask[0, 0] = 1.0
    mask[1] = 1.0
    out = torch.empty_like(logits)
    block = constants["masked_softmax_pair_bias"]["BLOCK_SIZE"]

    def softmax_reference(logits=logits, bias=bias, mask=mask):
        x = torch.addcmul(bias.unsqueeze(0), logits, torch.tensor(scale, device=cuda))
        x = x.masked_fill(mask[:, None, None, :] == 0, float("-inf"))
        return [torch.nan_to_num(torch.softmax(x, dim=-1), nan=0.0)]

    cases.append(
        Case(
            "masked_softmax_pair_bias",
            "masked_softmax_pair_bias",
            f"[{batch}, {heads}, {n}, {n}]",
            batch * heads * n,
            block,
            [out, logits, bias, mask, batch, heads, n, scale],
            [out],
            softmax_reference,
            (1e-4, 1e-6),
        )
    )

    # sigmoid_gate: (out, x, gate, count), bf16; built with AF3_FAST_EXP (__expf).
    count = rows * cols
    x = uniform((count,), -3.0, 3.0, bf16)
    gate = uniform((count,), -6.0, 6.0, bf16)
    out = torch.empty_like(x)
    block = constants["sigmoid_gate"]["BLOCK_SIZE"]
    cases.append(
        Case(
            "sigmoid_gate",
            "sigmoid_gate",
            f"[{count}]",
            ceil_div(count, block),
            block,
            [out, x, gate, count],
            [out],
            lambda x=x, gate=gate: [(x.float() * torch.sigmoid(gate.float())).to(bf16)],
            bf16_tolerance,
        )
    )

    # scale_rows<float> and scale_rows<__nv_bfloat16>: (out, in, scale, rows, cols); one fp32
    # multiply (and one rounding) per element on both sides, so bit-exact.
    block = constants["scale_rows"]["BLOCK_SIZE"]
    for entry, dtype in (("scale_rows<float>", torch.float32), ("scale_rows<__nv_bfloat16>", bf16)):
        x = uniform((rows, cols), -2.0, 2.0, dtype)
        factors = uniform((rows,), -1.5, 1.5)
        out = torch.empty_like(x)
        cases.append(
            Case(
                "scale_rows",
                entry,
                f"[{rows}, {cols}]",
                ceil_div(rows * cols, block),
                block,
                [out, x, factors, rows, cols],
                [out],
                lambda x=x, factors=factors, dtype=dtype: [
                    (x.float() * factors[:, None]).to(dtype)
                ],
                (0.0, 0.0),
            )
        )

    # wgmma_matmul_bf16: (c, a, b, m, n, k), bf16 in, fp32 out; one warpgroup per
    # TILE_M x TILE_N tile, grid (ceil(n / TILE_N), ceil(m / TILE_M)).
    tiles = constants["wgmma_matmul_bf16"]
    m, n, k = (100, 20, 40) if size == "small" else (1000, 264, 520)
    a = uniform((m, k), -1.0, 1.0, bf16)
    b = uniform((k, n), -1.0, 1.0, bf16)
    c = torch.empty((m, n), device=cuda, dtype=torch.float32)
    cases.append(
        Case(
            "wgmma_matmul_bf16",
            "wgmma_matmul_bf16",
            f"{m} x {n} x {k}",
            (ceil_div(n, tiles["TILE_N"]), ceil_div(m, tiles["TILE_M"]), 1),
            tiles["BLOCK_SIZE"],
            [c, a, b, m, n, k],
            [c],
            lambda a=a, b=b: [torch.matmul(a.float(), b.float())],
            (1e-3, 1e-3),
        )
    )
    return cases


def compare(torch, got, want, tolerance):
    """(max abs error, whether every element is within rtol * |want| + atol)."""
    got = got.float()
    want = want.float()
    rtol, atol = tolerance
    error = (got - want).abs()
    bound = atol + rtol * want.abs()
    ok = bool(torch.all((error <= bound) | (got == want)).item()) and not bool(
        torch.isnan(got).any().item()
    )
    return float(error.max().item()) if error.numel() else 0.0, ok


# ---------------------------------------------------------------------------------------------
# The run


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results as JSON here")
    parser.add_argument("--sizes", default="small,large", help="small (cases.rs), large, or both")
    options = parser.parse_args()

    environment = check_no_compiler()
    jit_cache = tempfile.mkdtemp(prefix="kwheel-e2e-jit-")
    os.environ["KWHEEL_JIT_CACHE"] = jit_cache
    if "af3_kernels" in sys.modules or "kwheel" in sys.modules:
        fail("af3_kernels was imported before the first-call measurement")

    import torch

    if not torch.cuda.is_available():
        fail("torch sees no CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.cuda.init()
    # The context and the first allocation are PyTorch's cost, paid before any kernel library.
    warm = torch.zeros(1, device="cuda")
    torch.cuda.synchronize()

    # --- First call of one op, from Python -----------------------------------------------
    rows, cols, eps = 37, 300, 1e-5
    x = torch.randn((rows, cols), device="cuda").to(torch.bfloat16)
    gamma = torch.ones((cols,), device="cuda", dtype=torch.bfloat16)
    beta = torch.zeros((cols,), device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(x)
    torch.cuda.synchronize()
    start = time.perf_counter()
    import af3_kernels

    imported = time.perf_counter()
    layernorm = af3_kernels.load("layernorm_bf16")
    loaded = time.perf_counter()
    layernorm.launch(rows, layernorm.constants["BLOCK_SIZE"], [out, x, gamma, beta, rows, cols, eps])
    torch.cuda.synchronize()
    finished = time.perf_counter()
    first_call = {
        "op": "layernorm_bf16",
        "import_ms": (imported - start) * 1e3,
        "load_ms": (loaded - imported) * 1e3,
        "launch_and_sync_ms": (finished - loaded) * 1e3,
        "total_ms": (finished - start) * 1e3,
    }
    reference = torch.nn.functional.layer_norm(x.float(), (cols,), gamma.float(), beta.float(), eps)
    first_error, first_ok = compare(torch, out, reference, (1.0 / 128, 1.0 / 64))
    del warm

    import kwheel

    registry = af3_kernels._registry
    runtime = registry.query()
    status = af3_kernels.status()

    # --- Every kernel ---------------------------------------------------------------------
    kernels = {}
    load_ms = {}
    for name in registry.kernels:
        began = time.perf_counter()
        kernels[name] = af3_kernels.load(name)
        load_ms[name] = (time.perf_counter() - began) * 1e3
    constants = {name: kernel.constants for name, kernel in kernels.items()}
    # The registry's device is torch's current one, 0 here: the per-device path is the same
    # module, whichever way device 0 is named.
    for name, kernel in kernels.items():
        for device in (0, "cuda:0", torch.device("cuda", 0)):
            again = af3_kernels.load(name, device=device)
            if (again.device, again.trace_label) != (0, kernel.trace_label):
                fail(f"{name}: load(device={device!r}) is {again.trace_label}, not {kernel.trace_label}")

    results = []
    failures = []
    for size in options.sizes.split(","):
        for case in make_cases(torch, constants, size):
            kernel = kernels[case.kernel]
            kernel.launch(case.grid, case.block, case.args, entry=case.entry)
            torch.cuda.synchronize()
            wants = case.reference()
            worst, ok = 0.0, True
            for got, want in zip(case.outputs, wants):
                error, within = compare(torch, got, want, case.tolerance)
                worst, ok = max(worst, error), ok and within
            if case.kernel == "masked_softmax_pair_bias":
                masked = case.args[3] == 0
                probabilities = case.outputs[0]
                exact_zeros = bool(
                    torch.all(probabilities.masked_select(masked[:, None, None, :]) == 0).item()
                )
                ok = ok and exact_zeros and bool(torch.all(probabilities[2] == 0).item())
            provenance = kernel.provenance
            prebuilt = provenance.kind == "prebuilt"
            row = {
                "kernel": case.kernel,
                "entry": case.entry,
                "size": size,
                "shape": case.shape,
                "variant": provenance.variant,
                "provenance": provenance.kind,
                "max_abs_error": worst,
                "tolerance": case.tolerance,
                "ok": ok and prebuilt,
            }
            results.append(row)
            if not row["ok"]:
                failures.append(
                    f"{case.entry} {size} {case.shape}: max error {worst:.3g} "
                    f"(rtol, atol {case.tolerance}), provenance {provenance}"
                )

    # --- Streams: torch's current stream by default, or the one given ---------------------
    scale_rows = kernels["scale_rows"]
    block = scale_rows.constants["BLOCK_SIZE"]
    source = torch.randn((rows, cols), device="cuda")
    factors = torch.randn((rows,), device="cuda")
    want = source * factors[:, None]
    side = torch.cuda.Stream()
    for how in ("current stream", "explicit stream"):
        result = torch.empty_like(source)
        args = [result, source, factors, rows, cols]
        side.wait_stream(torch.cuda.current_stream())
        if how == "current stream":
            with torch.cuda.stream(side):
                scale_rows.launch(ceil_div(rows * cols, block), block, args, entry="scale_rows<float>")
        else:
            scale_rows.launch(
                ceil_div(rows * cols, block), block, args, stream=side, entry="scale_rows<float>"
            )
        side.synchronize()
        if not torch.equal(result, want):
            failures.append(f"scale_rows<float> on a side stream ({how}) differs")

    # --- Argument errors name the parameter -----------------------------------------------
    argument_checks = []
    function = scale_rows.function("scale_rows<float>")
    bad = {
        "host tensor": [result.cpu(), source, factors, rows, cols],
        "tensor for an int": [result, source, factors, source, cols],
        "too few": [result, source, factors, rows],
        "int too large": [result, source, factors, 2**40, cols],
        "non-contiguous": [result.t(), source, factors, rows, cols],
    }
    for label, args in bad.items():
        try:
            function.launch(1, block, args)
        except kwheel.ArgumentError as error:
            argument_checks.append((label, str(error)))
        else:
            failures.append(f"launch with {label} was not refused")
    try:
        scale_rows.launch(1, block, [result, source, factors, rows, cols])
    except kwheel.ArgumentError as error:
        argument_checks.append(("no entry= for two entries", str(error)))
    else:
        failures.append("a kernel with two entries launched without entry=")
    torch.cuda.synchronize()

    # --- Launch overhead from Python ------------------------------------------------------
    small = [result, source, factors, rows, cols]
    for _ in range(100):
        function.launch(ceil_div(rows * cols, block), block, small)
    torch.cuda.synchronize()
    launches = 2000
    began = time.perf_counter()
    for _ in range(launches):
        function.launch(ceil_div(rows * cols, block), block, small)
    queued = time.perf_counter()
    torch.cuda.synchronize()
    launch_us = (queued - began) / launches * 1e6

    # --- Nothing compiled -----------------------------------------------------------------
    not_prebuilt = [name for name, k in kernels.items() if k.provenance.kind != "prebuilt"]
    if not_prebuilt:
        failures.append(f"not prebuilt: {', '.join(not_prebuilt)}")
    cached = [os.path.join(d, f) for d, _, files in os.walk(jit_cache) for f in files]
    if cached:
        failures.append(f"the JIT cache is not empty: {cached}")
    if not first_ok:
        failures.append(f"first call (layernorm_bf16) differs: max error {first_error:.3g}")

    # --- Report ---------------------------------------------------------------------------
    device = torch.cuda.get_device_name()
    print(f"device        {device} (compute {runtime['device']}), driver CUDA {runtime['driver']}")
    print(f"runtime       torch {torch.__version__}, CUDA build {runtime['cuda']}")
    print(f"bundle        {registry.path} (torch pin {registry.bundle.torch})")
    print(f"kwheel        {kwheel.__version__} ({kwheel._kwheel.__file__})")
    for key, value in environment.items():
        print(f"no compiler   {key}: {value}")
    nvrtc = nvrtc_in_site_packages()
    print(
        "              NVRTC in site-packages: "
        + (", ".join(nvrtc) + " (not used: the JIT is off)" if nvrtc else "none")
    )
    print()
    print("status():")
    for name, text in status.items():
        print(f"  {name:26} {text}")
    print()
    print(
        f"first call from Python (layernorm_bf16 [{rows}, {cols}], context already created): "
        f"{first_call['total_ms']:.2f} ms = import {first_call['import_ms']:.2f} + load "
        f"{first_call['load_ms']:.2f} + launch and sync {first_call['launch_and_sync_ms']:.2f}"
    )
    print(f"launch overhead from Python (scale_rows<float>): {launch_us:.2f} µs per launch")
    print()
    header = f"{'entry':28} {'size':5} {'shape':22} {'variant':14} {'provenance':10} {'max err':>9}  ok"
    print(header)
    print("-" * len(header))
    for row in results:
        print(
            f"{row['entry']:28} {row['size']:5} {row['shape']:22} {row['variant'] or '-':14} "
            f"{row['provenance']:10} {row['max_abs_error']:9.2e}  {'yes' if row['ok'] else 'NO'}"
        )
    print()
    print("load() of each kernel (after the first):")
    for name, ms in load_ms.items():
        print(f"  {name:26} {ms:7.3f} ms  {kernels[name].provenance}")
    print()
    print("argument errors:")
    for label, message in argument_checks:
        print(f"  {label}: {message}")
    print()

    if options.json:
        with open(options.json, "w") as handle:
            json.dump(
                {
                    "device": device,
                    "runtime": runtime,
                    "torch": torch.__version__,
                    "first_call": first_call,
                    "launch_overhead_us": launch_us,
                    "load_ms": load_ms,
                    "results": results,
                    "argument_errors": argument_checks,
                    "failures": failures,
                },
                handle,
                indent=2,
            )
    if failures:
        for failure in failures:
            print(f"FAILED: {failure}", file=sys.stderr)
        sys.exit(1)
    passed = sum(row["ok"] for row in results)
    print(f"gpu_e2e: {passed} passed, 0 failed")


if __name__ == "__main__":
    main()
