"""What the GPU scripts share: their start (the command line, or a skip without a GPU), named
checks with their details, a JSON report, an exit status.

    arguments = gpu_arguments("gpu_tma", "bundle")   # None: no CUDA device, skipped
    checks = Checks("gpu_tma")
    checks.check("gemm", error < 1e-5, f"diff {error:.2e}")
    return checks.finish(json_path)      # 0 only when every check passed
"""

import argparse
import json
import subprocess
import sys


class Checks:
    """Named checks of one script: each printed as it is made, kept in ``results["checks"]``
    with whatever else the script adds to ``results`` (timings), and written as JSON."""

    def __init__(self, script, **results):
        self.script = script
        self.failures = []
        self.results = {"checks": {}, **results}

    def check(self, name, ok, detail=""):
        self.results["checks"][name] = {"ok": bool(ok), "detail": detail}
        print(f"{self.script}: {'ok  ' if ok else 'FAIL'} {name}: {detail}")
        if not ok:
            self.failures.append(name)

    def finish(self, json_path=None):
        """Writes the report where asked, says how it went, and returns the exit status."""
        if json_path:
            with open(json_path, "w") as out:
                json.dump(self.results, out, indent=2)
        failed = ", ".join(self.failures)
        print(f"{self.script}: {'FAILED: ' + failed if failed else 'all checks passed'}")
        return 1 if self.failures else 0


def gpu_arguments(script, *positional):
    """Parses the script's command line (the ``positional`` arguments, then ``--json``) and
    returns it, or ``None`` after printing the script's skip where torch sees no CUDA device."""
    parser = argparse.ArgumentParser()
    for name in positional:
        parser.add_argument(name)
    parser.add_argument("--json")
    arguments = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print(f"{script}: SKIPPED: no CUDA device")
        return None
    return arguments


def check_import_registers_without_cuda(checks, packages, ops):
    """Checks, in a fresh process, that importing ``packages`` registers every op of ``ops``
    (``"namespace.name"``) and leaves CUDA uninitialised (a forked worker must still work)."""
    has = ", ".join(f"hasattr(torch.ops.{op.rsplit('.', 1)[0]}, {op.rsplit('.', 1)[1]!r})" for op in ops)
    probe = subprocess.run(
        [sys.executable, "-c",
         f"import torch, {', '.join(packages)}; print(torch.cuda.is_initialized(), {has})"],
        capture_output=True, text=True)
    checks.check("import_registers_without_cuda",
                 probe.stdout.split() == ["False"] + ["True"] * len(ops),
                 (probe.stdout + probe.stderr).strip()[-400:])
