#!/usr/bin/env python3
"""First call through torch.utils.cpp_extension.load_inline, for docs/benchmarks.md.

For every kernel of a kwheel bundle (or those given with --kernels), this builds the kernel's
shipped source as a torch extension with load_inline and an empty extension cache (a fresh
TORCH_EXTENSIONS_DIR per kernel), for this GPU's architecture, and times the call. That is what
a library that JIT-compiles on first use makes its users wait for. The source is the bundle's
own (`sources/`), with the index's defines, flags and include dirs; templated entries are
instantiated by taking their address, as NVRTC's name expressions do.

The CUDA context is created before timing, as in `first_call` (PyTorch pays it either way).
With --first-call (the --json output of `cargo run --release -p prebuilt --example first_call
-- <bundle> --json first_call.json`) the table adds the first call from the bundle and the ratio.

usage: load_inline_bench.py <bundle> [--kernels a,b] [--first-call first_call.json]
                            [--json load_inline.json]

Needs torch with CUDA, nvcc (CUDA_HOME or /usr/local/cuda), and ninja.
"""

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time


def arch_list(major, minor):
    # sm_90a / sm_100a where the architecture-specific instructions live, as the loader picks.
    suffix = "a" if (major, minor) in ((9, 0), (10, 0)) else ""
    return f"{major}.{minor}{suffix}"


def cuda_source(sources, record):
    source = (sources / record["recipe"]["source"]).read_text()
    entries = record["inputs"]["entries"]
    lines = [source, ""]
    for number, entry in enumerate(entries):
        if "<" in entry:
            lines.append(f"static const auto kwheel_instantiate_{number} = &{entry};")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=pathlib.Path)
    parser.add_argument("--kernels", default="")
    parser.add_argument("--first-call", type=pathlib.Path)
    parser.add_argument("--json", type=pathlib.Path)
    arguments = parser.parse_args()

    import torch
    from torch.utils.cpp_extension import load_inline

    if not torch.cuda.is_available():
        sys.exit("load_inline_bench: no CUDA device")
    started = time.perf_counter()
    torch.zeros(1, device="cuda")
    context_ms = (time.perf_counter() - started) * 1e3
    major, minor = torch.cuda.get_device_capability()
    os.environ["TORCH_CUDA_ARCH_LIST"] = arch_list(major, minor)

    index = json.loads((arguments.bundle / "index.json").read_text())
    sources = arguments.bundle / "sources"
    wanted = [name for name in arguments.kernels.split(",") if name]
    first_call = {}
    if arguments.first_call:
        first_call = json.loads(arguments.first_call.read_text()).get("kernels", {})

    print(
        f"device {torch.cuda.get_device_name()} (compute {major}.{minor}), torch "
        f"{torch.__version__}, TORCH_CUDA_ARCH_LIST={os.environ['TORCH_CUDA_ARCH_LIST']}, "
        f"CUDA context {context_ms:.1f} ms\n"
    )
    print("| kernel | load_inline, empty cache | first call from the bundle | load_inline / first call |")
    print("| --- | ---: | ---: | ---: |")
    results = {}
    for name, record in sorted(index["kernels"].items()):
        if wanted and name not in wanted:
            continue
        recipe = record.get("recipe")
        if recipe is None:
            print(f"| `{name}` | no shipped sources | | |")
            continue
        inputs = record["inputs"]
        # torch passes its own -std; a second one is an nvcc error.
        flags = [f"-D{key}={value}" for key, value in sorted(inputs["defines"].items())]
        flags += inputs["flags"]
        include_dirs = [str(sources if d == "." else sources / d) for d in recipe["include_dirs"]]
        with tempfile.TemporaryDirectory(prefix="kwheel-load-inline-") as cache:
            os.environ["TORCH_EXTENSIONS_DIR"] = cache
            started = time.perf_counter()
            try:
                load_inline(
                    name=f"kwheel_bench_{name}_{os.getpid()}",
                    cpp_sources="void kwheel_noop() {}",
                    cuda_sources=cuda_source(sources, record),
                    functions=["kwheel_noop"],
                    extra_cuda_cflags=flags,
                    extra_include_paths=include_dirs,
                    verbose=False,
                )
            except Exception as error:  # report and go on with the next kernel
                print(f"| `{name}` | failed: {str(error).splitlines()[0]} | | |")
                continue
            seconds = time.perf_counter() - started
        row = {"load_inline_s": seconds}
        bundle_ms = first_call.get(name, {}).get("first_call_ms")
        if bundle_ms:
            row["first_call_ms"] = bundle_ms
            row["ratio"] = seconds * 1e3 / bundle_ms
            print(f"| `{name}` | {seconds:.1f} s | {bundle_ms:.3f} ms | {row['ratio']:,.0f}× |")
        else:
            print(f"| `{name}` | {seconds:.1f} s | | |")
        results[name] = row
        sys.stdout.flush()
    if arguments.json:
        arguments.json.write_text(
            json.dumps({"context_ms": context_ms, "kernels": results}, indent=2) + "\n"
        )


if __name__ == "__main__":
    main()
