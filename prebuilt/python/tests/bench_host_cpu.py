#!/usr/bin/env python3
"""The host side of a kwheel.torch op, measured without a GPU; prints JSON.

1. Import and first definition, in fresh processes after `import torch` (the first one, not
   counted, writes the bytecode under a private `PYTHONPYCACHEPREFIX`): `import kwheel`,
   `import kwheel.torch`, `import af3_kernels`, `from af3_kernels import ops`, the first
   `ops.layer_norm` lookup (its `Call`: nothing defined yet) and its first call on a CPU
   tensor (through the dispatcher to the torch reference: torch defines the operator then),
   each stage timed with `perf_counter_ns`; median and min.
2. Host cost of one call: the CUDA implementation `Op.cuda` run on CPU tensors with the
   loader's function replaced by one whose `launch` does nothing (as the CPU tests stub it),
   so what is timed is everything a call does but the launch: the plan lookup, the output
   allocation and the pointers; once called directly and once through the dispatcher (an op
   of a namespace of its own whose CPU kernel is that implementation); against the native
   op on the same small tensors, and against `torch.empty_like` alone (the allocation every
   call needs). Median of loops of 2,000 calls, kinds interleaved loop by loop.

    PYTHONPATH=<kwheel and af3_kernels>:<torch> python3 bench_host_cpu.py [--processes 9]

On a GPU, `bench_first_op.py` measures the same with real launches.
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
import json, time
import torch
clock = time.perf_counter_ns
x = torch.randn((37, 300)).bfloat16()
stages = {}
mark = began = clock()
def stage(name):
    global mark
    now = clock()
    stages[name] = (now - mark) / 1e6
    mark = now
import kwheel
stage("import_kwheel_ms")
import kwheel.torch
stage("import_kwheel_torch_ms")
import af3_kernels
stage("import_af3_kernels_ms")
from af3_kernels import ops
stage("import_ops_ms")
layer_norm = ops.layer_norm
stage("first_lookup_ms")
y = layer_norm(x, (300,))
stage("first_call_cpu_ms")
stages["total_ms"] = (clock() - began) / 1e6
print(json.dumps(stages))
"""


def first_definitions(processes):
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    samples = []
    with tempfile.TemporaryDirectory(prefix="kwheel-bench-pyc-") as cache:
        env["PYTHONPYCACHEPREFIX"] = cache
        for index in range(processes + 1):
            done = subprocess.run(
                [sys.executable, "-c", CHILD], capture_output=True, text=True, env=env,
                check=False,
            )
            if done.returncode != 0:
                raise SystemExit(f"the import failed:\n{done.stderr[-3000:]}")
            if index:  # the first process wrote the bytecode
                samples.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return {
        name: {
            "median": round(statistics.median(sample[name] for sample in samples), 3),
            "min": round(min(sample[name] for sample in samples), 3),
        }
        for name in samples[0]
    }


class NoLaunch:
    """A loaded function whose launch does nothing: the call's host work, without the GPU."""

    def launch(self, grid, block, args, shared_mem, stream):
        pass


def interleaved(calls, count=2000, loops=9):
    for call in calls.values():
        for _ in range(200):
            call()
    samples = {name: [] for name in calls}
    for _ in range(loops):
        for name, call in calls.items():
            began = time.perf_counter_ns()
            for _ in range(count):
                call()
            samples[name].append((time.perf_counter_ns() - began) / count / 1e3)
    return {name: round(statistics.median(values), 3) for name, values in samples.items()}


def host_costs():
    import torch
    import torch.nn.functional as F

    import af3_kernels
    import kwheel.torch
    from af3_kernels import ops

    bench = kwheel.torch.Library(af3_kernels._registry, namespace="kwheel_bench_host_cpu")
    ops.library.define_all()
    dispatched = {}
    for name, op in ops.library.ops.items():
        op.kernel._loaded[-1] = ({None: NoLaunch(), **_entries(name)}, _constants(name))
        copy = bench.declare(op.schema, kernel=op.kernel.name, shape=op.shape, launch=op.launch)
        copy.kernel._loaded[-1] = op.kernel._loaded[-1]
        overload = copy.callable
        # The CPU kernel is the CUDA implementation: the dispatcher's path to it, on CPU.
        bench._torch_library.impl(copy.name, copy.cuda, "CPU")
        dispatched[name] = overload
    implementations = ops.library.ops
    rows, cols = 8, 64
    x = torch.randn((rows, cols)).bfloat16()
    gate = torch.randn((rows, cols)).bfloat16()
    weight, bias = torch.ones(cols).bfloat16(), torch.zeros(cols).bfloat16()
    x32, factors = torch.randn((rows, cols)), torch.randn((rows,))
    cases = {
        "layer_norm": {
            "implementation": lambda: implementations["layer_norm"].cuda(x, (cols,), weight, bias, 1e-5),
            "dispatched": lambda: dispatched["layer_norm"](x, (cols,), weight, bias, 1e-5),
            "native": lambda: F.layer_norm(x, (cols,), weight, bias, 1e-5),
            "empty_like": lambda: torch.empty_like(x),
        },
        "layer_norm_without_affine": {
            "implementation": lambda: implementations["layer_norm"].cuda(x, (cols,)),
            "dispatched": lambda: dispatched["layer_norm"](x, (cols,)),
            "native": lambda: F.layer_norm(x, (cols,)),
        },
        "sigmoid_gate": {
            "implementation": lambda: implementations["sigmoid_gate"].cuda(x, gate),
            "dispatched": lambda: dispatched["sigmoid_gate"](x, gate),
            "native": lambda: x * torch.sigmoid(gate),
        },
        "scale_rows": {
            "implementation": lambda: implementations["scale_rows"].cuda(x32, factors),
            "dispatched": lambda: dispatched["scale_rows"](x32, factors),
            "native": lambda: x32 * factors[:, None],
        },
    }
    results = {}
    for name, calls in cases.items():
        row = interleaved(calls)
        row["dispatched_over_native"] = round(row["dispatched"] / row["native"], 3)
        results[name] = row
    return results


def _entries(name):
    return {"scale_rows": {"scale_rows<float>": NoLaunch(), "scale_rows<__nv_bfloat16>": NoLaunch()}}.get(name, {})


def _constants(name):
    return {"matmul": {"BLOCK_SIZE": 128, "TILE_M": 64, "TILE_N": 64}}.get(name, {"BLOCK_SIZE": 128})


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=9, help="fresh processes")
    options = parser.parse_args()
    import torch

    report = {
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "first_definition": first_definitions(options.processes),
        "host_cost_us": host_costs(),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
