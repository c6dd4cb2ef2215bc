#!/usr/bin/env python3
"""af3_kernels.ops on two GPUs of one host: kernels load and launch on the tensor's device.

With the `kwheel` and `af3-kernels` wheels installed next to torch, on a host with two or more
GPUs, this script checks

- every op on `cuda:1` tensors, with the current device set to 0 and then to 1, against its
  torch equivalent (the cases of `gpu_torch.py`), and that the outputs are on `cuda:1`;
- that those calls loaded every kernel on device 1 only (`kwheel.provenance()`: one entry per
  kernel and device, nothing on device 0 until device 0 asks), and that a torch.profiler
  trace shows the kernels running on device 1 with one `kwheel:` range per op naming
  `cuda:1`;
- the AF3-style block of `gpu_torch.py` on `cuda:1`, eager and under `torch.compile`, with
  the current device 0, and a `torch.cuda.graph` captured on `cuda:1` that replays new data
  correctly;
- a two-rank `torch.distributed` run (NCCL, one rank per GPU, one process each, NVLink
  multicast off: `NCCL_NVLS_ENABLE=0`, `TORCH_SYMM_MEM_DISABLE_MULTICAST=1`) in which each
  rank calls every op on its own device and all-reduces the outputs and the torch
  references', which must agree; each rank's provenance is printed.

With fewer than two GPUs it prints why it skips and exits 0 (`--require` makes that exit 1).

usage: gpu_multi.py [--json results.json] [--require]

Exit status 0 only when every check passes (or the skip above).
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

FAILURES = []
REPORT = {}
WORLD = 2


def check(condition, message):
    if not condition:
        FAILURES.append(message)
        print(f"FAILED: {message}", file=sys.stderr)
    return condition


def as_tuple(value):
    return value if isinstance(value, tuple) else (value,)


def compare(name, got, want, rtol, atol, device):
    ok, worst = True, 0.0
    for got_one, want_one in zip(as_tuple(got), as_tuple(want)):
        within, error = helpers.close(got_one, want_one, rtol, atol)
        on = got_one.device == torch.device("cuda", device)
        ok, worst = ok and within and on and got_one.dtype == want_one.dtype, max(worst, error)
        check(on, f"{name}: output on {got_one.device}, not cuda:{device}")
    return ok, worst


def loaded_on(device):
    return sorted(entry["kernel"] for entry in kwheel.provenance() if entry["device"] == device)


def check_ops_on_device_1():
    rows = []
    with torch.cuda.device(1):
        all_cases = {size: helpers.cases(size) for size in ("small", "large")}
        wants = {
            size: {name: reference(*args) for name, (args, reference, _) in cases.items()}
            for size, cases in all_cases.items()
        }
    torch.cuda.synchronize(1)
    check(loaded_on(0) == [] and loaded_on(1) == [], f"kernels loaded before any op: {kwheel.provenance()}")
    for current in (0, 1):
        torch.cuda.set_device(current)
        for size, cases in all_cases.items():
            for name, (args, _, (rtol, atol)) in cases.items():
                got = helpers.op_of(name)(*args)
                ok, worst = compare(name, got, wants[size][name], rtol, atol, 1)
                if name == "masked_softmax_pair_bias":
                    ok = ok and bool(torch.all(got[-1] == 0).item())
                rows.append({"op": name, "size": size, "current_device": current, "ok": ok, "max_abs_error": worst})
                check(ok, f"{name} {size} on cuda:1, current device {current}: max error {worst:.3g}")
        if current == 0:
            kernels = sorted({op.kernel.name for op in ops.library.ops.values()})
            check(loaded_on(1) == kernels, f"device 1 loaded {loaded_on(1)}, not {kernels}")
            check(loaded_on(0) == [], f"ops on cuda:1 loaded kernels on device 0: {loaded_on(0)}")
    torch.cuda.set_device(0)
    REPORT["ops_on_cuda_1"] = rows


def check_trace_on_device_1():
    with torch.cuda.device(1):
        inputs = helpers.block_inputs()
    helpers.block(*inputs)
    torch.cuda.synchronize(1)
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as profile:
        helpers.block(*inputs)
        torch.cuda.synchronize(1)
    events = list(profile.events())
    # With CUDA activity on, a `record_function` range also shows as a GPU annotation: one per
    # op on the CPU timeline is the check.
    labels = [
        event.name
        for event in events
        if event.name.startswith("kwheel:") and event.device_type == torch.autograd.DeviceType.CPU
    ]
    REPORT["trace_ranges_cuda_1"] = labels
    check(
        len(labels) == helpers.BLOCK_OPS and all(label.endswith(" cuda:1") for label in labels),
        f"trace on cuda:1: {labels}",
    )
    gpu = [
        (event.name, event.device_index)
        for event in events
        if event.device_type == torch.autograd.DeviceType.CUDA
        and any(kernel in event.name for kernel in helpers.BLOCK_KERNELS)
    ]
    REPORT["trace_gpu_kernels_cuda_1"] = sorted(set(gpu))
    check(all(device == 1 for _, device in gpu), f"kernels ran on another device than 1: {gpu}")


def check_block_and_graph_on_device_1():
    torch.cuda.set_device(0)
    with torch.cuda.device(1):
        inputs = helpers.block_inputs()
    eager = helpers.block(*inputs)
    torch._dynamo.reset()
    compiled = torch.compile(helpers.block, fullgraph=True)
    check(helpers.same(compiled(*inputs), eager), "compiled block on cuda:1 differs from eager")
    torch._dynamo.reset()
    with torch.cuda.device(1):
        static = helpers.block_inputs()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                helpers.block(*static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = helpers.block(*static)
    check(all(t.device == torch.device("cuda", 1) for t in captured), "graph outputs not on cuda:1")
    # Replayed with the current device 0: the graph runs where it was captured.
    for step in range(3):
        with torch.cuda.device(1):
            fresh = helpers.block_inputs(seed=300 + step)
        for target, value in zip(static, fresh):
            target.copy_(value)
        graph.replay()
        torch.cuda.synchronize(1)
        check(helpers.same(captured, helpers.block(*fresh)), f"cuda:1 graph replay {step} differs from eager")
    REPORT["cuda_graph_cuda_1"] = "captured on cuda:1, replayed 3 times with the current device 0"


# --- two ranks ------------------------------------------------------------------------------

RANK = r"""
import json, os, sys
sys.path.insert(0, os.environ["GPU_MULTI_DIR"])
import torch
import torch.distributed as dist
rank = int(os.environ["RANK"])
torch.cuda.set_device(rank)
dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
import kwheel
import gpu_torch as helpers
failures = []
rows = []
def floats(value):
    return tuple(t.float() for t in (value if isinstance(value, tuple) else (value,)))
cases = helpers.cases("small")  # on this rank's device, the current one
for name, (args, reference, (rtol, atol)) in cases.items():
    got = floats(helpers.op_of(name)(*args))
    want = floats(reference(*args))
    ok, worst = True, 0.0
    for g, w in zip(got, want):
        if g.device != torch.device("cuda", rank):
            failures.append(f"rank {rank}: {name} output on {g.device}")
        dist.all_reduce(g)
        dist.all_reduce(w)
        within, error = helpers.close(g, w, rtol, 2 * atol)
        ok, worst = ok and within, max(worst, error)
    rows.append({"op": name, "ok": ok, "max_abs_error": worst})
    if not ok:
        failures.append(f"rank {rank}: all-reduced {name} differs from torch's: {worst:.3g}")
provenance = kwheel.provenance()
others = [entry for entry in provenance if entry["device"] != rank]
if others:
    failures.append(f"rank {rank} loaded kernels on other devices: {others}")
gathered = [None] * dist.get_world_size()
dist.all_gather_object(gathered, {"rank": rank, "provenance": provenance})
dist.destroy_process_group()
with open(os.environ["GPU_MULTI_OUT"], "w") as handle:
    json.dump({"rank": rank, "ops": rows, "failures": failures, "gathered": gathered}, handle)
"""


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def check_two_ranks():
    port = free_port()
    results = []
    with tempfile.TemporaryDirectory(prefix="gpu-multi-") as directory:
        processes = []
        for rank in range(WORLD):
            environment = dict(os.environ)
            environment.update(
                RANK=str(rank),
                LOCAL_RANK=str(rank),
                WORLD_SIZE=str(WORLD),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                NCCL_NVLS_ENABLE="0",
                TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
                GPU_MULTI_DIR=HERE,
                GPU_MULTI_OUT=os.path.join(directory, f"rank{rank}.json"),
            )
            processes.append(
                subprocess.Popen(
                    [sys.executable, "-c", RANK], env=environment, stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT, text=True,
                )
            )
        for rank, process in enumerate(processes):
            try:
                output, _ = process.communicate(timeout=300)
            except subprocess.TimeoutExpired:
                process.kill()
                output, _ = process.communicate()
            if not check(process.returncode == 0, f"rank {rank} exited {process.returncode}:\n{output[-4000:]}"):
                continue
            with open(os.path.join(directory, f"rank{rank}.json")) as handle:
                results.append(json.load(handle))
    for result in results:
        for failure in result["failures"]:
            check(False, failure)
    REPORT["two_ranks"] = [{"rank": r["rank"], "ops": r["ops"]} for r in results]
    if results:
        REPORT["two_ranks_provenance"] = results[0]["gathered"]
        for entry in results[0]["gathered"]:
            for loaded in entry["provenance"]:
                print(f"rank {entry['rank']}: {loaded['label']}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results as JSON here")
    parser.add_argument("--require", action="store_true", help="fewer than two GPUs is a failure")
    options = parser.parse_args()
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count < 2:
        print(f"gpu_multi: skipped: this host has {count} CUDA device(s); the checks need two")
        sys.exit(1 if options.require else 0)

    global helpers, kwheel, ops
    import gpu_torch as helpers
    import kwheel
    from af3_kernels import ops

    torch.backends.cuda.matmul.allow_tf32 = False
    REPORT["devices"] = [torch.cuda.get_device_name(index) for index in range(count)]
    REPORT["torch"] = torch.__version__
    REPORT["kwheel"] = kwheel.__version__
    REPORT["status_cuda_1"] = ops.library.registry.status(device=1)
    helpers.run_steps(
        (check_ops_on_device_1, check_trace_on_device_1, check_block_and_graph_on_device_1, check_two_ranks),
        check,
    )
    REPORT["provenance"] = kwheel.provenance()
    for entry in REPORT["provenance"]:
        print(f"{entry['label']}")
        check(entry["source"] == "prebuilt", f"{entry['kernel']} on device {entry['device']}: {entry['source']}")
    helpers.finish("gpu_multi", REPORT, FAILURES, options.json)


if __name__ == "__main__":
    main()
