"""The kwheel runtime from Python, as a user of an installed kernel library sees it.

Run with an interpreter that has both wheels installed (the `kwheel` runtime and
`af3-kernels`), from this directory so that nothing imports from the source tree:

    python -m unittest -v test_kwheel

`release/tests/run.rs` builds the wheels, installs them into a fresh venv without network
access, and runs this file. Needs no GPU: the tests that expect no CUDA driver skip where one
is installed.
"""

import ctypes
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import types
import unittest

import kwheel

KERNELS = [
    "layernorm_bf16",
    "masked_softmax_pair_bias",
    "scale_rows",
    "sigmoid_gate",
    "sigmoid_gate_backward",
    "swiglu",
    "wgmma_matmul_bf16",
]


def has_driver():
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def run_python(code, **environment):
    """Runs `code` in a fresh interpreter of this environment; returns its stdout."""
    env = dict(os.environ)
    env.update(environment)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    if result.returncode != 0:
        raise AssertionError(f"python -c failed:\n{result.stdout}{result.stderr}")
    return result.stdout


class Installed(unittest.TestCase):
    def test_the_runtime_is_the_abi3_extension_from_the_wheel(self):
        module = pathlib.Path(kwheel._kwheel.__file__)
        self.assertEqual(module.name, "_kwheel.abi3.so")
        self.assertIn("site-packages", module.parts)
        self.assertEqual(kwheel.__version__, kwheel._kwheel.__version__)

    def test_the_library_opens_its_own_bundle_on_import(self):
        import af3_kernels

        for name in ("status", "is_available", "unavailable_reason", "select", "load"):
            self.assertTrue(callable(getattr(af3_kernels, name)), name)
        bundle = pathlib.Path(af3_kernels._registry.path)
        self.assertEqual(bundle, pathlib.Path(af3_kernels.__file__).parent / "_prebuilt")
        self.assertEqual(af3_kernels._registry.kernels, KERNELS)
        self.assertEqual(af3_kernels._registry.package, "af3-kernels")


class BundleFolders(unittest.TestCase):
    def test_bundle_folders_follow_the_table_the_cli_passes(self):
        """The cases of `prebuilt/tests/fixtures/bundle_folders.json`, which the Rust finder
        passes too (`prebuilt/src/lookup/folder.rs`): one rule in both languages."""
        fixture = pathlib.Path(__file__).resolve().parents[2] / "tests/fixtures/bundle_folders.json"
        table = json.loads(fixture.read_text())
        self.assertGreaterEqual(len(table["cases"]), 8)
        for case in table["cases"]:
            with self.subTest(case["name"]), tempfile.TemporaryDirectory() as root:
                root = pathlib.Path(root)
                for folder in case["folders"]:
                    (root / folder).mkdir(parents=True, exist_ok=True)
                for file in case["files"]:
                    (root / file).parent.mkdir(parents=True, exist_ok=True)
                    (root / file).write_bytes(b"")
                asked = str(root / case["path"])
                if case["found"] is None:
                    with self.assertRaises(kwheel.KwheelError):
                        kwheel.find_bundle(asked)
                else:
                    self.assertEqual(kwheel.find_bundle(asked), str(root / case["found"]))


class Open(unittest.TestCase):
    def test_a_package_name_is_found_without_importing_the_package(self):
        out = run_python(
            "import sys, kwheel\n"
            "registry = kwheel.open('af3_kernels')\n"
            "print('af3_kernels' in sys.modules, registry.package)\n"
        )
        self.assertEqual(out.split(), ["False", "af3-kernels"])

    def test_a_bundle_dir_and_its_parent_open_the_same_bundle(self):
        import af3_kernels

        bundle = af3_kernels._registry.path
        self.assertEqual(kwheel.open(bundle).path, bundle)
        self.assertEqual(kwheel.open(pathlib.Path(bundle).parent).path, bundle)

    def test_a_package_without_a_bundle_is_named(self):
        with self.assertRaises(kwheel.KwheelError) as raised:
            kwheel.open("unittest")
        self.assertIn("package `unittest`", str(raised.exception))
        self.assertIn("has no `_prebuilt/kernels.idx`", str(raised.exception))
        with self.assertRaises(kwheel.KwheelError) as raised:
            kwheel.open("no_such_package_anywhere")
        self.assertIn("no package `no_such_package_anywhere`", str(raised.exception))
        with self.assertRaises(kwheel.KwheelError) as raised:
            kwheel.open("/nonexistent/bundle")
        self.assertIn("no kwheel bundle at `/nonexistent/bundle`", str(raised.exception))


class Status(unittest.TestCase):
    @unittest.skipIf(has_driver(), "a CUDA driver is installed here")
    def test_every_kernel_names_the_missing_driver(self):
        import af3_kernels

        status = af3_kernels.status()
        # The library's extension module is listed beside its kernels (torch loads it).
        self.assertIn("_C (module)", status)
        status = {k: v for k, v in status.items() if not k.endswith(" (module)")}
        self.assertEqual(sorted(status), KERNELS)
        for name, text in status.items():
            self.assertTrue(
                text.startswith("unavailable: no CUDA driver: libcuda.so.1 not found"),
                f"{name}: {text}",
            )
            self.assertFalse(af3_kernels.is_available(name))
            self.assertEqual(af3_kernels.unavailable_reason(name), text[len("unavailable: ") :])

    @unittest.skipIf(has_driver(), "a CUDA driver is installed here")
    def test_load_without_a_driver_raises_no_gpu_error(self):
        import af3_kernels

        with self.assertRaises(kwheel.NoGpuError) as raised:
            af3_kernels.load("swiglu")
        self.assertTrue(str(raised.exception).startswith("no CUDA driver: libcuda.so.1"))
        self.assertIsInstance(raised.exception, kwheel.KwheelError)
        self.assertIsInstance(raised.exception, RuntimeError)

    @unittest.skipIf(has_driver(), "a CUDA driver is installed here")
    def test_every_device_answers_for_itself_without_a_driver(self):
        import af3_kernels

        for device in (None, 0, 1, "cuda:1"):
            with self.assertRaises(kwheel.NoGpuError):
                af3_kernels.load("swiglu", device=device)
            status = af3_kernels.status(device=device)
            self.assertIn("_C (module)", status)
            self.assertEqual(sorted(k for k in status if not k.endswith(" (module)")), KERNELS)
            self.assertTrue(status["swiglu"].startswith("unavailable: no CUDA driver"), status)
            self.assertFalse(af3_kernels.is_available("swiglu", device=device))
        # Nothing loaded, on any device.
        self.assertEqual(af3_kernels._registry.loaded(), [])
        self.assertEqual(kwheel.provenance(), [])

    def test_a_device_is_an_ordinal_or_a_cuda_device(self):
        ordinal = kwheel._ordinal
        self.assertEqual([ordinal(None), ordinal(0), ordinal(3), ordinal("cuda:2")], [None, 0, 3, 2])
        self.assertEqual(ordinal(types.SimpleNamespace(type="cuda", index=1)), 1)
        for device in ("cpu", types.SimpleNamespace(type="cpu", index=None)):
            with self.assertRaises(ValueError) as raised:
                ordinal(device)
            self.assertIn("is not a CUDA device", str(raised.exception))

    def test_provenance_is_part_of_the_api(self):
        self.assertIn("provenance", kwheel.__all__)
        self.assertEqual(kwheel.open("af3_kernels").trace_variable, "AF3_KERNELS_TRACE")

    def test_an_unknown_kernel_lists_the_known_ones(self):
        import af3_kernels

        self.assertFalse(af3_kernels.is_available("layer_norm"))
        reason = af3_kernels.unavailable_reason("layer_norm")
        self.assertIn("no kernel `layer_norm` in the bundle", reason)
        self.assertIn("`layernorm_bf16`", reason)
        with self.assertRaises(kwheel.UnknownKernelError):
            af3_kernels.select("layer_norm", "sm_90")


class Select(unittest.TestCase):
    def test_hopper_on_cuda_12_9_loads_the_nvrtc_12_9_cubin(self):
        import af3_kernels

        for name in KERNELS:
            chosen = af3_kernels.select(name, device="sm_90", cuda="12.9", torch="2.13.0", driver="13.0")
            self.assertEqual(str(chosen), "cu129/sm_90a", name)
            self.assertEqual(chosen.arch, "sm_90a")
            self.assertEqual(chosen.cuda, "cu129")
            self.assertEqual(chosen.torch, "2.13.*")
            self.assertEqual(len(chosen.key), 64)
        chosen = af3_kernels.select("layernorm_bf16", "sm_90", "12.9", "2.13.0", "13.0")
        self.assertEqual(
            chosen.reason,
            "sm_90a cubin for a 9.0 device, cu129, driver 13.0 ≥ 12.9, torch 2.13.0 matches 2.13.*",
        )
        self.assertTrue(chosen.compiler.startswith("nvrtc 12.9."), chosen.compiler)
        self.assertEqual(chosen.entries, ["layernorm_bf16"])
        self.assertEqual(chosen.location, "local (bundle)")
        self.assertEqual(
            [variant for variant, _ in chosen.refusals],
            [
                "cu129/sm_100f",
                "cu129/sm_100a",
                "cu130/compute_90",
                "cu130/sm_90a",
                "cu130/sm_100f",
                "cu130/sm_100a",
            ],
        )
        # The PTX fits this device too, but a cubin for it is preferred: not a refusal.
        self.assertNotIn("cu129/compute_90", dict(chosen.refusals))

    def test_blackwell_on_cuda_13_0_loads_the_sm_100a_cubin(self):
        import af3_kernels

        for name in KERNELS:
            if name == "wgmma_matmul_bf16":
                continue  # Hopper only
            chosen = af3_kernels.select(name, device="sm_100", cuda="13.0", torch="2.13.0", driver="13.0")
            self.assertEqual(str(chosen), "cu130/sm_100a", name)
        self.assertEqual(
            af3_kernels.select("scale_rows", (10, 0), cuda="cu130").entries,
            ["scale_rows<float>", "scale_rows<__nv_bfloat16>"],
        )

    def test_wgmma_has_no_blackwell_cubin(self):
        import af3_kernels

        with self.assertRaises(kwheel.NoFitError) as raised:
            af3_kernels.select("wgmma_matmul_bf16", "sm_100", cuda="13.0")
        refusals = dict(raised.exception.refusals)
        self.assertEqual(
            list(refusals),
            [
                "cu129/sm_90a",
                "cu130/sm_90a",
                "cu129/compute_90",
                "cu129/sm_100f",
                "cu129/sm_100a",
                "cu130/compute_90",
                "cu130/sm_100f",
                "cu130/sm_100a",
            ],
        )
        self.assertEqual(
            refusals["cu130/sm_90a"],
            "sm_90a cubins run only on compute capability 9.0, this device is 10.0",
        )
        self.assertEqual(
            refusals["cu130/sm_100a"], "not built: declared: the kernel targets only sm_90a"
        )

    def test_ampere_is_refused_with_every_variants_reason(self):
        import af3_kernels

        with self.assertRaises(kwheel.NoFitError) as raised:
            af3_kernels.select("layernorm_bf16", "sm_86", cuda="12.9", torch="2.13.0", driver="13.0")
        self.assertEqual(
            str(raised.exception),
            "no prebuilt variant of `layernorm_bf16` fits device sm_86 (compute 8.6), CUDA build "
            "cu129, driver 13.0, torch 2.13.0:\n"
            "  cu129/compute_90: compute_90 PTX runs only on compute capability 9.0 or later, "
            "this device is 8.6\n"
            "  cu129/sm_90a: sm_90a cubins run only on compute capability 9.0, this device is 8.6\n"
            "  cu129/sm_100f: sm_100f cubins run only on their family, compute capability 10.0 or "
            "a later 10.x, this device is 8.6\n"
            "  cu129/sm_100a: sm_100a cubins run only on compute capability 10.0, this device is 8.6\n"
            "  cu130/compute_90: compute_90 PTX runs only on compute capability 9.0 or later, "
            "this device is 8.6\n"
            "  cu130/sm_90a: sm_90a cubins run only on compute capability 9.0, this device is 8.6\n"
            "  cu130/sm_100f: sm_100f cubins run only on their family, compute capability 10.0 or "
            "a later 10.x, this device is 8.6\n"
            "  cu130/sm_100a: sm_100a cubins run only on compute capability 10.0, this device is 8.6\n"
            "load() would JIT-compile it from the shipped sources instead (unless "
            "AF3_KERNELS_JIT_FALLBACK=0)",
        )
        self.assertEqual(len(raised.exception.refusals), 8)
        self.assertIsInstance(raised.exception, kwheel.KwheelError)

    def test_torch_outside_the_pin_is_refused(self):
        import af3_kernels

        with self.assertRaises(kwheel.NoFitError) as raised:
            af3_kernels.select("swiglu", "sm_90", cuda="12.9", torch="2.11.0+cu129", driver="13.0")
        refusals = dict(raised.exception.refusals)
        self.assertEqual(
            refusals["cu129/sm_90a"],
            "built for torch 2.13.*, the runtime has torch 2.11.0+cu129",
        )

    def test_an_old_driver_is_refused_naming_the_release_it_needs(self):
        import af3_kernels

        with self.assertRaises(kwheel.NoFitError) as raised:
            af3_kernels.select("swiglu", "sm_90", cuda="13.0", driver="575.57")
        self.assertIn(
            "cu130/sm_90a: built with CUDA 13.0, which needs a driver for CUDA ≥ 13.0 "
            "(release ≥ 580), this driver supports 12.9",
            str(raised.exception),
        )

    def test_defaults_take_the_newest_build_the_driver_supports(self):
        import af3_kernels

        self.assertEqual(str(af3_kernels.select("swiglu", "9.0")), "cu130/sm_90a")
        self.assertEqual(str(af3_kernels.select("swiglu", "9.0", driver="12.9")), "cu129/sm_90a")

    def test_a_device_that_is_not_one_is_a_value_error(self):
        import af3_kernels

        with self.assertRaises(ValueError) as raised:
            af3_kernels.select("swiglu", "hopper")
        self.assertIn("`hopper` is not a device", str(raised.exception))
        with self.assertRaises(ValueError):
            af3_kernels.select("swiglu", "sm_90", cuda="twelve")


class Runtime(unittest.TestCase):
    """What the first GPU call fixes: the CUDA build, torch, the JIT policy."""

    def test_an_imported_torch_gives_the_cuda_build_and_version(self):
        fake = types.ModuleType("torch")
        fake.__version__ = "2.11.0+cu130"
        fake.version = types.SimpleNamespace(cuda="13.0")
        fake.cuda = types.SimpleNamespace(is_initialized=lambda: False)
        saved = sys.modules.get("torch")
        sys.modules["torch"] = fake
        try:
            runtime = kwheel.open("af3_kernels").runtime()
        finally:
            if saved is None:
                del sys.modules["torch"]
            else:
                sys.modules["torch"] = saved
        self.assertEqual(runtime.cuda, "cu130")
        self.assertEqual(runtime.torch, "2.11.0+cu130")
        self.assertEqual(runtime.device, 0)

    def test_without_torch_the_build_comes_from_the_environment(self):
        out = run_python(
            "import kwheel; r = kwheel.open('af3_kernels').runtime(); print(r.cuda, r.torch)",
            KWHEEL_CUDA_BUILD="cu129",
        )
        self.assertEqual(out.split(), ["cu129", "None"])

    def test_the_jit_fallback_follows_the_packages_variable(self):
        code = "import af3_kernels; print(af3_kernels._registry.runtime().jit_allowed)"
        self.assertEqual(run_python(code, AF3_KERNELS_JIT_FALLBACK="0").strip(), "False")
        self.assertEqual(run_python(code, AF3_KERNELS_JIT_FALLBACK="1").strip(), "True")
        self.assertFalse(kwheel.open("af3_kernels", jit=False).runtime().jit_allowed)

    def test_explicit_options_win(self):
        runtime = kwheel.open("af3_kernels", cuda="12.9", torch="2.13.1", device=0).runtime()
        self.assertEqual((runtime.cuda, runtime.torch), ("cu129", "2.13.1"))

    def test_a_bad_cuda_build_in_the_environment_is_named(self):
        out = run_python(
            "import kwheel\n"
            "try:\n"
            "    kwheel.open('af3_kernels').runtime()\n"
            "except kwheel.KwheelError as error:\n"
            "    print(error)\n",
            KWHEEL_CUDA_BUILD="cuda-twelve",
        )
        self.assertIn("KWHEEL_CUDA_BUILD=`cuda-twelve` is not a CUDA build", out)



class FakeTensor:
    """What ``kwheel.tensor_map`` reads off a tensor, without torch."""

    def __init__(self, shape, strides, address=0x7F0000000000, dtype="torch.bfloat16", size=2):
        self.shape, self._strides, self._address = shape, strides, address
        self.dtype, self._size = dtype, size

    def stride(self):
        return self._strides

    def element_size(self):
        return self._size

    def data_ptr(self):
        return self._address


class TensorMaps(unittest.TestCase):
    def test_a_map_that_breaks_the_drivers_rules_is_refused_naming_it(self):
        cases = [
            (FakeTensor((256, 100), (100, 1)), (128, 64), {}, "dimension 0's stride is 200 bytes"),
            (FakeTensor((256, 128), (128, 1)), (128, 128), {"swizzle": 128}, "at most 64 elements wide"),
            (FakeTensor((256, 128), (128, 1)), (512, 64), {}, "the box has 512 elements in dimension 0"),
            (FakeTensor((256, 128), (128, 1), address=0x7F0000000002), (64, 64), {}, "not a multiple of 16 bytes"),
            (FakeTensor((256, 128), (1, 256)), (64, 64), {}, "last dimension has stride 256"),
            (FakeTensor((256, 128), (128, 1)), (64,), {}, "the box (64,) has 1 dimensions"),
            (FakeTensor((256, 128), (128, 1)), (64, 64), {"swizzle": 48}, "swizzle is 0, 32, 64 or 128"),
            (FakeTensor((8,), (1,), dtype="torch.bool", size=1), (8,), {}, "cannot hold elements of torch.bool"),
        ]
        for tensor, box, options, words in cases:
            with self.subTest(words=words):
                with self.assertRaises(ValueError) as raised:
                    kwheel.tensor_map(tensor, box, **options)
                self.assertIn(words, str(raised.exception))

    @unittest.skipIf(has_driver(), "a CUDA driver is installed here")
    def test_a_good_map_needs_the_driver_to_encode_it(self):
        with self.assertRaises(kwheel.NoGpuError) as raised:
            kwheel.tensor_map(FakeTensor((256, 128), (128, 1)), (128, 64), swizzle=128)
        self.assertTrue(str(raised.exception).startswith("no CUDA driver"), raised.exception)


class NativeLibraries(unittest.TestCase):
    """Extension modules load from sealed memory files (``/proc/self/fd/N``)."""

    @unittest.skipUnless(shutil.which("cc"), "no C compiler to build the test libraries")
    def test_two_libraries_loaded_one_after_the_other_are_both_loaded(self):
        # The dynamic loader knows a library by the name it was opened by: with the first
        # file closed, the second got its number and the loader handed back the first
        # library (the second package's ops were silently missing).
        import tempfile

        with tempfile.TemporaryDirectory() as folder:
            code = []
            for name in ("first", "second"):
                source = os.path.join(folder, f"{name}.c")
                with open(source, "w") as out:
                    out.write(f"int kwheel_test_{name}(void) {{ return {len(name)}; }}\n")
                library = os.path.join(folder, f"{name}.so")
                subprocess.run(["cc", "-shared", "-fPIC", "-o", library, source], check=True)
                with open(library, "rb") as built:
                    code.append((name, built.read()))
            script = (
                "import ctypes, sys, kwheel\n"
                "for name, path in [('first', sys.argv[1]), ('second', sys.argv[2])]:\n"
                "    kwheel._load_native(f'test.{name}', open(path, 'rb').read())\n"
                "process = ctypes.CDLL(None)\n"
                "print(process.kwheel_test_first(), process.kwheel_test_second())\n"
            )
            paths = [os.path.join(folder, f"{name}.so") for name, _ in code]
            result = subprocess.run([sys.executable, "-c", script, *paths], capture_output=True, text=True)
            self.assertEqual(result.stdout.split(), ["5", "6"], result.stderr)

CONV_PARAMS = {
    "ConvParams": {
        "size": 32,
        "align": 8,
        "fields": [("batch", 0, 4), ("dim", 4, 4), ("seqlen", 8, 8), ("x_ptr", 16, 8), ("width", 24, 2)],
    }
}


class StructLayouts(unittest.TestCase):
    """A ctypes.Structure that names its C struct is checked field by field, without a GPU."""

    def fields(self, swap=False, width=ctypes.c_short):
        fields = [
            ("batch", ctypes.c_int),
            ("dim", ctypes.c_int),
            ("seqlen", ctypes.c_longlong),
            ("x_ptr", ctypes.c_void_p),
            ("width", width),
        ]
        if swap:
            fields[0], fields[1] = fields[1], fields[0]
        return type("Params", (ctypes.Structure,), {"_kwheel_struct_": "ConvParams", "_fields_": fields})

    def test_a_structure_laid_out_as_compiled_passes(self):
        kwheel._kwheel.check_struct_layout(self.fields()(), CONV_PARAMS)

    def test_a_moved_field_is_refused_naming_kernel_struct_field_and_offsets(self):
        with self.assertRaises(kwheel.ArgumentError) as raised:
            kwheel._kwheel.check_struct_layout(self.fields(swap=True)(), CONV_PARAMS, "conv_fwd", "conv<T>", 1)
        self.assertEqual(
            str(raised.exception),
            "argument 1 of `conv<T>` (kernel `conv_fwd`): field `batch` of struct `ConvParams` is at "
            "offset 4 with 4 bytes in `Params`, but the kernel was compiled with it at offset 0 with 4 bytes",
        )

    def test_a_resized_field_is_refused_naming_it(self):
        with self.assertRaises(kwheel.ArgumentError) as raised:
            kwheel._kwheel.check_struct_layout(self.fields(width=ctypes.c_int)(), CONV_PARAMS)
        self.assertIn("field `width` of struct `ConvParams` is at offset 24 with 4 bytes", str(raised.exception))

    def test_a_structure_without_the_attribute_is_left_to_the_size_check(self):
        plain = type("Plain", (ctypes.Structure,), {"_fields_": [("dim", ctypes.c_int)]})
        kwheel._kwheel.check_struct_layout(plain(), CONV_PARAMS)

    def test_an_unknown_struct_name_is_refused(self):
        other = type("Other", (ctypes.Structure,), {"_kwheel_struct_": "Nope", "_fields_": [("a", ctypes.c_int)]})
        with self.assertRaises(kwheel.ArgumentError) as raised:
            kwheel._kwheel.check_struct_layout(other(), CONV_PARAMS)
        self.assertIn("names no such struct (its `structs`: ConvParams)", str(raised.exception))


if __name__ == "__main__":
    unittest.main()
