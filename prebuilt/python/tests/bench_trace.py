"""Host cost of provenance tracing in a kwheel.torch op call, on a CPU.

An op's CUDA implementation reached directly (`Op.cuda`, a launch-plan hit) with a launcher
that does nothing, on CPU tensors: what is measured is kwheel.torch's own Python path. Four
numbers, each the median of 5 loops of 20,000 calls:

- the call with tracing off (no profiler, `<PACKAGE>_TRACE` unset): the path every call takes;
- the check that decides it, alone (`library.trace or _PROFILER._is_profiler_enabled`),
  against an empty loop: what tracing costs a call while it is off;
- the call with `<PACKAGE>_TRACE=1` and no profiler (a record_function and an NVTX range per
  launch);
- the call while a CPU torch.profiler records.

docs/benchmarks.md has the numbers.

    PYTHONPATH=<kwheel>:~/.cache/kwheel/torch python3 bench_trace.py
"""

import statistics
import sys
import time

import torch

import kwheel.torch as kt

COUNT = 20_000
REPEATS = 5


class Registry:
    package = "kwheel-bench-trace"


class Function:
    def launch(self, grid, block, args, shared_mem, stream):
        pass


def per_call_us(call):
    for _ in range(1000):
        call()
    samples = []
    for _ in range(REPEATS):
        began = time.perf_counter()
        for _ in range(COUNT):
            call()
        samples.append((time.perf_counter() - began) / COUNT * 1e6)
    return statistics.median(samples)


def loop_us(body, setup):
    """µs per iteration of `for _ in range(COUNT): body`, median of REPEATS."""
    code = compile(f"def run():\n    for _ in range({COUNT}):\n        {body}\n", "<bench>", "exec")
    namespace = dict(setup)
    exec(code, namespace)
    run = namespace["run"]
    run()
    samples = []
    for _ in range(REPEATS):
        began = time.perf_counter()
        run()
        samples.append((time.perf_counter() - began) / COUNT * 1e6)
    return statistics.median(samples)


def main():
    torch._C._cuda_getCurrentRawStream = lambda device: 0  # a CPU has no stream to ask for
    library = kt.Library(Registry())
    library.define(
        "scale(Tensor x, float s) -> Tensor",
        kernel="scale",
        shape=lambda x, s: [(x.shape, x.dtype)],
        launch=lambda constants, outputs, x, s: kt.Launch(1, 256, [outputs[0], x, x.numel(), s]),
    )
    op = library.ops["scale"]
    op.kernel._loaded[-1] = ({None: Function()}, {})
    op.kernel._labels[-1] = "kwheel:scale cu130/sm_90a prebuilt 0123456789ab cuda:-1"
    x = torch.ones(64, 256)
    call = lambda: op.cuda(x, 2.0)  # noqa: E731

    library.trace = False
    off = per_call_us(call)
    setup = {"library": library, "profiler": kt._PROFILER}
    check = loop_us("library.trace or profiler._is_profiler_enabled", setup)
    empty = loop_us("pass", setup)
    library.trace = True
    on = per_call_us(call)
    library.trace = False
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        profiled = per_call_us(call)

    print(f"torch {torch.__version__}, python {sys.version.split()[0]}")
    print(f"op call, tracing off:            {off:6.2f} µs")
    print(f"the check alone (minus a loop):  {(check - empty) * 1000:6.1f} ns")
    print(f"op call, <PACKAGE>_TRACE=1:      {on:6.2f} µs")
    print(f"op call, under torch.profiler:   {profiled:6.2f} µs")


if __name__ == "__main__":
    main()
