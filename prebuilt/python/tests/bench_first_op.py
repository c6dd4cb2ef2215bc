#!/usr/bin/env python3
"""A kwheel.torch library's first op call and its host cost per call, against torch's own,
measured side by side in one run; prints JSON.

1. First call, in fresh processes (one per sample, the two kinds alternating so they share
   the host's load): after `import torch`, `torch.cuda.init()` and the inputs' allocation,
   `import kwheel`, `import kwheel.torch`, `import af3_kernels`, `from af3_kernels import ops`
   (the seven op definitions) and the first `ops.layer_norm` on a [37, 300] bf16 tensor,
   then `torch.cuda.synchronize()`, each stage timed with `perf_counter`; against torch's
   first `F.layer_norm` in the same setting. A first process (not counted) writes the
   modules' bytecode under a private `PYTHONPYCACHEPREFIX`, as `pip install` does without
   `--no-compile`, so every counted process imports from bytecode, as a user's does.
   A third kind, in the same rounds, is the same first layer norm through kwheel's runtime
   alone, with no op layer: `import kwheel`, `kwheel.open("af3_kernels")`, `load` and a
   `launch` with the tensors (on a GPU; without one, the import and the open), then an empty
   module's import from `sys.path`: what the op layer (`kwheel.torch`, the library's ops
   module, the op's plan) has left of a budget once the runtime has taken its share.
2. Host cost of one call (GPU only): the median of loops of 2,000 calls, each loop timed from
   its first call to its last returning, kinds interleaved loop by loop: the op as a program
   calls it (`ops.layer_norm`: a direct launch when nothing needs the dispatcher), the same op
   through the dispatcher (`ops.layer_norm.default`), its CUDA implementation called directly, a raw `Function.launch` with int
   pointers (an explicit stream, and stream `None`, which the runtime resolves), and the
   native torch op; `sigmoid_gate` also through `torch.library.register_autograd`'s kernel
   (an op of its own namespace), which measures what the light Autograd kernel saves.

Without a GPU, part 1 runs on CPU tensors (the first call is then the CPU reference) and
part 2 is skipped, saying so.

    PATH=/opt/torch/.venv/bin:$PATH AF3_KERNELS_JIT_FALLBACK=0 PYTHONPATH=DIR \\
        python3 bench_first_op.py [--processes 15] [--json out.json]

with the `kwheel` and `af3-kernels` wheels installed by `pip install --target DIR`.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import json, sys, time
import torch
which = sys.argv[1]
cuda = torch.cuda.is_available()
if cuda:
    torch.cuda.init()
device = "cuda" if cuda else "cpu"
x = torch.randn((37, 300), device=device).bfloat16()
w = torch.ones((300,), device=device, dtype=torch.bfloat16)
b = torch.zeros((300,), device=device, dtype=torch.bfloat16)
if cuda:
    torch.cuda.synchronize()
stages = {}
began = time.perf_counter()
mark = began
def stage(name):
    global mark
    now = time.perf_counter()
    stages[name] = (now - mark) * 1e3
    mark = now
if which == "ops":
    import kwheel
    stage("import_kwheel_ms")
    import kwheel.torch
    stage("import_kwheel_torch_ms")
    import af3_kernels
    stage("import_af3_kernels_ms")
    from af3_kernels import ops
    stage("import_ops_ms")
    y = ops.layer_norm(x, (300,), w, b, 1e-5)
    stage("first_call_ms")
elif which == "runtime":
    import os, tempfile
    empty = tempfile.mkdtemp()
    with open(os.path.join(empty, "kwheel_bench_empty.py"), "w"):
        pass
    __import__("py_compile").compile(os.path.join(empty, "kwheel_bench_empty.py"), doraise=True)
    sys.path.append(empty)
    out = torch.empty_like(x)
    mark = began = time.perf_counter()
    import kwheel
    stage("import_kwheel_ms")
    registry = kwheel.open("af3_kernels")
    stage("open_ms")
    if cuda:
        kernel = registry.load("layernorm_bf16")
        stage("first_load_ms")
        block = kernel.constants["BLOCK_SIZE"]
        kernel.launch(37, block, [out, x, w, b, 37, 300, 1e-5])
        stage("launch_ms")
    stages["runtime_ms"] = (time.perf_counter() - began) * 1e3
else:
    import torch.nn.functional as F
    stage("import_ms")
    y = F.layer_norm(x, (300,), w, b, 1e-5)
    stage("first_call_ms")
if cuda:
    torch.cuda.synchronize()
stage("synchronize_ms")
stages["total_ms"] = (time.perf_counter() - began) * 1e3
if which == "runtime":
    mark = time.perf_counter()
    import kwheel_bench_empty
    stage("empty_module_ms")
if which == "runtime" and cuda:
    reference = torch.nn.functional.layer_norm(x.float(), (300,), w.float(), b.float(), 1e-5)
    stages["max_error"] = float((out.float() - reference).abs().max())
    assert stages["max_error"] < 0.05, stages
stages["bytecode"] = all(
    getattr(sys.modules.get(name), "__cached__", None) is not None
    and __import__("os").path.exists(sys.modules[name].__cached__)
    for name in ("kwheel", "kwheel.torch", "af3_kernels", "af3_kernels.ops")
) if which == "ops" else None
print(json.dumps(stages))
"""


def first_calls(processes):
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    results = {"ops": [], "runtime": [], "torch": []}
    with tempfile.TemporaryDirectory(prefix="kwheel-bench-pyc-") as cache:
        env["PYTHONPYCACHEPREFIX"] = cache
        for index in range(processes + 1):
            for which in ("ops", "runtime", "torch"):
                done = subprocess.run(
                    [sys.executable, "-c", CHILD, which],
                    capture_output=True, text=True, env=env, check=False,
                )
                if done.returncode != 0:
                    raise SystemExit(f"first call ({which}) failed:\n{done.stderr[-3000:]}")
                if index:  # the first round wrote the bytecode
                    results[which].append(json.loads(done.stdout.strip().splitlines()[-1]))
    summary = {}
    for which, samples in results.items():
        summary[which] = {
            name: {
                "median": statistics.median(sample[name] for sample in samples),
                "min": min(sample[name] for sample in samples),
                "max": max(sample[name] for sample in samples),
            }
            for name in samples[0]
            if name.endswith("_ms")
        }
    summary["ops_total_over_torch_first_call"] = (
        summary["ops"]["total_ms"]["median"] / summary["torch"]["total_ms"]["median"]
    )
    summary["ops_from_bytecode"] = all(sample["bytecode"] for sample in results["ops"])
    summary["samples"] = results
    return summary


def interleaved(calls, count=2000, loops=9):
    """{name: median µs per call}: loops of `count` calls, the kinds taking turns loop by
    loop, so that they share whatever else the host is doing."""
    import torch

    for call in calls.values():
        for _ in range(200):
            call()
    torch.cuda.synchronize()
    samples = {name: [] for name in calls}
    for _ in range(loops):
        for name, call in calls.items():
            began = time.perf_counter()
            for _ in range(count):
                call()
            samples[name].append((time.perf_counter() - began) / count * 1e6)
            torch.cuda.synchronize()
    return {name: statistics.median(values) for name, values in samples.items()}


def host_costs():
    import torch
    import torch.nn.functional as F

    import af3_kernels
    import kwheel.torch
    from af3_kernels import ops

    public = public_autograd_gate()
    generator = torch.Generator(device="cuda").manual_seed(1)
    rows, cols = 64, 256

    def bf16(*shape):
        return (torch.rand(shape, generator=generator, device="cuda") * 4 - 2).bfloat16()

    x, gate, weight, bias = bf16(rows, cols), bf16(rows, cols), bf16(cols), bf16(cols)
    x32 = torch.randn((rows, cols), device="cuda")
    factors = torch.randn((rows,), device="cuda")
    out, out32 = torch.empty_like(x), torch.empty_like(x32)
    stream = torch.cuda.current_stream().cuda_stream
    count = rows * cols
    gate_kernel, scale_kernel, norm_kernel = (
        af3_kernels.load(name) for name in ("sigmoid_gate", "scale_rows", "layernorm_bf16")
    )
    gate_function = gate_kernel.function("sigmoid_gate")
    scale_function = scale_kernel.function("scale_rows<float>")
    norm_function = norm_kernel.function("layernorm_bf16")
    gate_block, scale_block, norm_block = (
        dict(kernel.constants)["BLOCK_SIZE"] for kernel in (gate_kernel, scale_kernel, norm_kernel)
    )
    implementations = ops.library.ops
    ptr = {name: t.data_ptr() for name, t in dict(out=out, x=x, gate=gate, weight=weight, bias=bias, out32=out32, x32=x32, factors=factors).items()}
    gate_ints = [ptr["out"], ptr["x"], ptr["gate"], count]
    scale_ints = [ptr["out32"], ptr["x32"], ptr["factors"], rows, cols]
    norm_ints = [ptr["out"], ptr["x"], ptr["weight"], ptr["bias"], rows, cols, 1e-5]
    cases = {
        "layer_norm": {
            "op": lambda: ops.layer_norm(x, (cols,), weight, bias, 1e-5),
            "dispatcher": lambda: ops.layer_norm.default(x, (cols,), weight, bias, 1e-5),
            "implementation": lambda: implementations["layer_norm"].cuda(x, (cols,), weight, bias, 1e-5),
            "raw_launch_ints": lambda: norm_function.launch(rows, norm_block, norm_ints, 0, stream),
            "raw_launch_ints_stream_none": lambda: norm_function.launch(rows, norm_block, norm_ints, 0, None),
            "native": lambda: F.layer_norm(x, (cols,), weight, bias, 1e-5),
        },
        "layer_norm_without_affine": {
            "op": lambda: ops.layer_norm(x, (cols,)),
            "dispatcher": lambda: ops.layer_norm.default(x, (cols,)),
            "native": lambda: F.layer_norm(x, (cols,)),
        },
        "sigmoid_gate": {
            "op": lambda: ops.sigmoid_gate(x, gate),
            "dispatcher": lambda: ops.sigmoid_gate.default(x, gate),
            "op_register_autograd": lambda: public(x, gate),
            "implementation": lambda: implementations["sigmoid_gate"].cuda(x, gate),
            "raw_launch_ints": lambda: gate_function.launch(-(-count // gate_block), gate_block, gate_ints, 0, stream),
            "raw_launch_ints_stream_none": lambda: gate_function.launch(-(-count // gate_block), gate_block, gate_ints, 0, None),
            "native": lambda: x * torch.sigmoid(gate),
        },
        "scale_rows": {
            "op": lambda: ops.scale_rows(x32, factors),
            "dispatcher": lambda: ops.scale_rows.default(x32, factors),
            "implementation": lambda: implementations["scale_rows"].cuda(x32, factors),
            "raw_launch_ints": lambda: scale_function.launch(-(-count // scale_block), scale_block, scale_ints, 0, stream),
            "raw_launch_ints_stream_none": lambda: scale_function.launch(-(-count // scale_block), scale_block, scale_ints, 0, None),
            "native": lambda: x32 * factors[:, None],
        },
    }
    results = {}
    for name, calls in cases.items():
        row = interleaved(calls)
        row["op_over_native"] = row["op"] / row["native"]
        row["dispatcher_over_native"] = row["dispatcher"] / row["native"]
        if "op_register_autograd" in row:
            row["register_autograd_over_native"] = row["op_register_autograd"] / row["native"]
            row["light_autograd_saves_us"] = row["op_register_autograd"] - row["dispatcher"]
        results[name] = row
    with torch.inference_mode():
        for name in ("layer_norm", "sigmoid_gate"):
            row = interleaved({kind: cases[name][kind] for kind in ("op", "dispatcher", "native")})
            results[f"{name}_inference_mode"] = dict(
                row,
                op_over_native=row["op"] / row["native"],
                dispatcher_over_native=row["dispatcher"] / row["native"],
            )
    results["light_autograd"] = kwheel.torch._torch_release() in kwheel.torch.LIGHT_AUTOGRAD_TORCH
    return results


def public_autograd_gate():
    """`af3_kernels.ops.sigmoid_gate` once more, in a namespace of its own, its Autograd
    kernel `torch.library.register_autograd`'s whatever the torch release."""
    import af3_kernels
    import kwheel.torch
    from af3_kernels import ops

    checked = kwheel.torch.LIGHT_AUTOGRAD_TORCH
    kwheel.torch.LIGHT_AUTOGRAD_TORCH = ()
    try:
        library = kwheel.torch.Library(af3_kernels._registry, namespace="kwheel_bench_public_autograd")
        gate = library.define(
            "sigmoid_gate(Tensor x, Tensor gate) -> Tensor",
            kernel="sigmoid_gate",
            shape=ops._sigmoid_gate_shape,
            launch=ops._sigmoid_gate_launch,
            reference=ops._sigmoid_gate_reference,
        )
        library.autograd(gate, ops._sigmoid_gate_grad, ops._sigmoid_gate_setup_context)
    finally:
        kwheel.torch.LIGHT_AUTOGRAD_TORCH = checked
    return gate


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=15, help="fresh processes per kind")
    parser.add_argument("--json", help="also write the report here")
    options = parser.parse_args()
    import torch

    import kwheel

    report = {
        "torch": torch.__version__,
        "kwheel": kwheel.__version__,
        "python": sys.version.split()[0],
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "jit_fallback": os.environ.get("AF3_KERNELS_JIT_FALLBACK"),
    }
    report["first_call"] = first_calls(options.processes)
    if torch.cuda.is_available():
        report["host_cost_us"] = host_costs()
    else:
        report["host_cost_us"] = "skipped: no CUDA device (the per-call costs need a GPU)"
    text = json.dumps(report, indent=2)
    print(text)
    if options.json:
        with open(options.json, "w") as handle:
            handle.write(text)


if __name__ == "__main__":
    main()
