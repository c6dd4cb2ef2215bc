"""af3_kernels.ops on a CPU: schemas, namespacing, fakes, the CPU (reference) implementations,
opcheck, gradients through the backward op, one graph under torch.compile, and the
AF3_KERNELS_COMPILE_WRAP escape hatch.

Needs the `kwheel` and `af3-kernels` wheels installed and torch importable
(`release/tests/run.rs` runs it with the pinned torch of `ci/setup-torch` on PYTHONPATH); skips,
saying so, where torch is not. The CUDA implementations are tested on a GPU by
`gpu_torch.py`.

    python -m unittest -v test_ops
"""

import importlib.util
import os
import subprocess
import sys
import unittest
import warnings

HAS_TORCH = importlib.util.find_spec("torch") is not None
NO_TORCH = "torch is not importable here (ci/setup-torch installs the pinned one; see docs/torch.md)"

if HAS_TORCH:
    import torch
    import torch.nn.functional as F

    import kwheel
    import kwheel.torch
    from af3_kernels import ops

SCHEMAS = {
    "layer_norm": "af3_kernels::layer_norm(Tensor x, SymInt[] normalized_shape, "
    "Tensor? weight=None, Tensor? bias=None, float eps=1.0000000000000001e-05) -> Tensor",
    "swiglu": "af3_kernels::swiglu(Tensor x) -> Tensor",
    "sigmoid_gate": "af3_kernels::sigmoid_gate(Tensor x, Tensor gate) -> Tensor",
    "sigmoid_gate_backward": "af3_kernels::sigmoid_gate_backward(Tensor grad, Tensor x, "
    "Tensor gate) -> (Tensor, Tensor)",
    "masked_softmax_pair_bias": "af3_kernels::masked_softmax_pair_bias(Tensor logits, "
    "Tensor bias, Tensor mask, float scale) -> Tensor",
    "scale_rows": "af3_kernels::scale_rows(Tensor x, Tensor scale) -> Tensor",
    "matmul": "af3_kernels::matmul(Tensor a, Tensor b) -> Tensor",
}

# Each op's kernel, by the name the registry loads.
KERNELS = {
    "layer_norm": "layernorm_bf16",
    "swiglu": "swiglu",
    "sigmoid_gate": "sigmoid_gate",
    "sigmoid_gate_backward": "sigmoid_gate_backward",
    "masked_softmax_pair_bias": "masked_softmax_pair_bias",
    "scale_rows": "scale_rows",
    "matmul": "wgmma_matmul_bf16",
}


def bf16(*shape, low=-2.0, high=2.0, generator=None, device="cpu"):
    values = torch.rand(shape, generator=generator, device=device) * (high - low) + low
    return values.to(torch.bfloat16)


def examples(device="cpu"):
    """One call of every op: {name: args}, small ragged shapes, on `device`."""
    if device == "meta":
        return {
            name: tuple(arg.to("meta") if isinstance(arg, torch.Tensor) else arg for arg in args)
            for name, args in examples().items()
        }
    generator = torch.Generator(device=device).manual_seed(7)
    rows, cols, n = 5, 37, 9
    mask = (torch.rand((2, n), generator=generator, device=device) < 0.7).float()
    mask[1] = 0.0
    return {
        "layer_norm": (
            bf16(rows, cols, generator=generator, device=device),
            (cols,),
            bf16(cols, low=0.5, high=1.5, generator=generator, device=device),
            bf16(cols, generator=generator, device=device),
            1e-5,
        ),
        "swiglu": (bf16(rows, 2 * cols, generator=generator, device=device),),
        "sigmoid_gate": (
            bf16(rows, cols, generator=generator, device=device),
            bf16(rows, cols, low=-6, high=6, generator=generator, device=device),
        ),
        "sigmoid_gate_backward": (
            bf16(rows, cols, generator=generator, device=device),
            bf16(rows, cols, generator=generator, device=device),
            bf16(rows, cols, low=-6, high=6, generator=generator, device=device),
        ),
        "masked_softmax_pair_bias": (
            torch.randn((2, 3, n, n), generator=generator, device=device),
            torch.randn((3, n, n), generator=generator, device=device),
            mask,
            0.25,
        ),
        "scale_rows": (
            torch.randn((rows, cols), generator=generator, device=device),
            torch.randn((rows,), generator=generator, device=device),
        ),
        "matmul": (
            bf16(rows, 20, generator=generator, device=device),
            bf16(20, 11, generator=generator, device=device),
        ),
    }


def torch_equivalent(name, *args):
    """The op in plain torch, as a user would write it, in fp32 and rounded once."""
    if name == "layer_norm":
        x, shape, weight, bias, eps = args
        return F.layer_norm(x.float(), shape, weight.float(), bias.float(), eps).to(x.dtype)
    if name == "swiglu":
        (x,) = args
        hidden = x.shape[-1] // 2
        return (F.silu(x[..., :hidden].float()) * x[..., hidden:].float()).to(x.dtype)
    if name == "sigmoid_gate":
        x, gate = args
        return (x.float() * torch.sigmoid(gate.float())).to(x.dtype)
    if name == "sigmoid_gate_backward":
        grad, x, gate = args
        x32 = x.float().requires_grad_()
        gate32 = gate.float().requires_grad_()
        (x32 * torch.sigmoid(gate32)).backward(grad.float())
        return x32.grad.to(x.dtype), gate32.grad.to(gate.dtype)
    if name == "masked_softmax_pair_bias":
        logits, bias, mask, scale = args
        scores = logits * scale + bias
        scores = scores.masked_fill(mask[:, None, None, :] == 0, float("-inf"))
        return torch.softmax(scores, dim=-1).nan_to_num(0.0)
    if name == "scale_rows":
        x, scale = args
        return (x.float() * scale[:, None]).to(x.dtype)
    if name == "matmul":
        a, b = args
        return a.float() @ b.float()
    raise AssertionError(name)


def run_python(code, **environment):
    env = dict(os.environ)
    env.update(environment)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    if result.returncode != 0:
        raise AssertionError(f"python -c failed:\n{result.stdout}{result.stderr}")
    return result.stdout


@unittest.skipUnless(HAS_TORCH, NO_TORCH)
class Registration(unittest.TestCase):
    def test_every_op_is_an_operator_of_the_package_namespace(self):
        self.assertEqual(ops.library.namespace, "af3_kernels")
        self.assertTrue(ops.library.compile_wrap)
        self.assertEqual(sorted(ops.library.ops), sorted(SCHEMAS))
        for name, schema in SCHEMAS.items():
            overload = getattr(ops, name).default
            self.assertIs(overload, getattr(torch.ops.af3_kernels, name).default, name)
            self.assertEqual(str(overload._schema), schema)

    def test_each_op_launches_its_kernel_of_the_bundle(self):
        import af3_kernels

        for name, kernel in KERNELS.items():
            self.assertEqual(ops.library.ops[name].kernel.name, kernel)
            self.assertIn(kernel, af3_kernels._registry.kernels)

    def test_the_library_is_the_one_of_its_namespace(self):
        import af3_kernels

        self.assertIs(kwheel.torch.library(af3_kernels._registry), ops.library)

    def test_launch_geometry_comes_from_the_exported_constants(self):
        # The launch functions on meta tensors, with constants that differ from the
        # manifest's: the geometry follows them.
        args = examples("meta")
        constants = {"BLOCK_SIZE": 64, "TILE_M": 32, "TILE_N": 16}
        for name, op in ops.library.ops.items():
            outputs = [torch.empty(shape, dtype=dtype, device="meta") for shape, dtype in op.shape(*args[name])]
            grid, block, kernel_args, entry, shared_mem = op.launch(constants, outputs, *args[name])
            self.assertEqual(block, 64, name)
            self.assertEqual(shared_mem, 0, name)
            self.assertIs(kernel_args[0], outputs[0], name)
            if name == "matmul":
                self.assertEqual(grid, (1, 1))  # n = 11 <= 16, m = 5 <= 32
            elif name in ("layer_norm",):
                self.assertEqual(grid, 5)
            elif name == "masked_softmax_pair_bias":
                self.assertEqual(grid, 2 * 3 * 9)
            else:
                count = outputs[0].numel()
                self.assertEqual(grid, -(-count // 64), name)
            if name == "scale_rows":
                self.assertEqual(entry, "scale_rows<float>")


@unittest.skipUnless(HAS_TORCH, NO_TORCH)
class LaunchPlans(unittest.TestCase):
    """The CUDA implementation's bookkeeping, on CPU tensors (device -1) with a recording
    kernel in place of the loaded one."""

    def test_layer_norm_without_weight_or_bias_keeps_one_plan(self):
        op = ops.library.ops["layer_norm"]
        launches = []

        class Recording:
            def launch(self, grid, block, args, shared_mem, stream):
                launches.append(list(args))

        function = Recording()
        op.kernel._loaded[-1] = ({None: function, "layernorm_bf16": function}, {"BLOCK_SIZE": 128})
        self.addCleanup(op.kernel._loaded.pop, -1, None)
        self.addCleanup(op._plans.clear)
        raw_stream = torch._C._cuda_getCurrentRawStream
        torch._C._cuda_getCurrentRawStream = lambda device: 0
        self.addCleanup(setattr, torch._C, "_cuda_getCurrentRawStream", raw_stream)
        shape = op.shape
        planned = []
        op.shape = lambda *args: planned.append(args[0].shape) or shape(*args)
        self.addCleanup(setattr, op, "shape", shape)

        x = bf16(4, 37)
        for _ in range(3):
            op.cuda(x, (37,), None, None, 1e-5)
        self.assertEqual(planned, [x.shape])  # planned once: no tensor made per call
        ones, zeros = (kept.tensor for kept in ops._affine_defaults(x, 37))
        self.assertEqual(ones.tolist(), [1.0] * 37)
        self.assertEqual(zeros.tolist(), [0.0] * 37)
        self.assertEqual({(args[2], args[3]) for args in launches}, {(ones.data_ptr(), zeros.data_ptr())})
        weight = bf16(37)
        op.cuda(x, (37,), weight, None, 1e-5)
        self.assertEqual(launches[-1][2:4], [weight.data_ptr(), zeros.data_ptr()])


@unittest.skipUnless(HAS_TORCH, NO_TORCH)
class Fakes(unittest.TestCase):
    def test_meta_outputs_match_the_cpu_implementation(self):
        cpu = examples("cpu")
        meta = examples("meta")
        for name in SCHEMAS:
            op = getattr(ops, name)
            got = op(*meta[name])
            want = op(*cpu[name])
            got = got if isinstance(got, tuple) else (got,)
            want = want if isinstance(want, tuple) else (want,)
            self.assertEqual([(t.shape, t.dtype) for t in got], [(t.shape, t.dtype) for t in want], name)
            self.assertTrue(all(t.device.type == "meta" for t in got), name)

    def test_fake_cuda_tensors_trace_without_a_gpu(self):
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode():
            x = torch.empty(4, 3, 64, device="cuda", dtype=torch.bfloat16)
            out = ops.swiglu(x)
            product = ops.matmul(x[0, :, :8].contiguous(), torch.empty(8, 5, device="cuda", dtype=torch.bfloat16))
        self.assertEqual((out.shape, out.dtype, out.device.type), (torch.Size([4, 3, 32]), torch.bfloat16, "cuda"))
        self.assertEqual((product.shape, product.dtype), (torch.Size([3, 5]), torch.float32))

    def test_unsupported_inputs_are_refused_while_tracing(self):
        meta = torch.empty(4, 6, device="meta")
        cases = [
            (lambda: ops.swiglu(meta), "af3_kernels.ops.swiglu: x must be bfloat16, not float32"),
            (
                lambda: ops.swiglu(torch.empty(4, 5, device="meta", dtype=torch.bfloat16)),
                "af3_kernels::swiglu: kernel `swiglu` does not take these inputs: the last "
                "dimension of x must be even: [..., 2 * hidden]: requires `width % 2 == 0`, but "
                "width = 5",
            ),
            (
                lambda: ops.layer_norm(meta.bfloat16(), (4, 6)),
                "af3_kernels.ops.layer_norm: normalizes over the last dimension only: "
                "normalized_shape [4, 6] for x of shape [4, 6]",
            ),
            (
                lambda: ops.sigmoid_gate(meta.bfloat16(), meta[:, :3].bfloat16()),
                "af3_kernels.ops.sigmoid_gate: takes tensors of one shape (no broadcasting): "
                "x [4, 6], gate [4, 3]",
            ),
            (
                lambda: ops.matmul(meta.bfloat16(), meta.bfloat16()),
                "af3_kernels.ops.matmul: takes a [m, k] and b [k, n], not [4, 6] and [4, 6]",
            ),
            (
                lambda: ops.scale_rows(meta, torch.empty(4, device="meta", dtype=torch.bfloat16)),
                "af3_kernels.ops.scale_rows: scale must be float32, not bfloat16",
            ),
        ]
        for call, message in cases:
            with self.assertRaises(Exception) as raised:
                call()
            self.assertIn(message, str(raised.exception))


INT32 = 2**31 - 1

# Every requirement the library's kernels declare (kernels.toml `requires`): the inputs just
# inside its boundary, those just past it, and the words of the refusal.
BOUNDARIES = [
    (
        "layernorm_bf16",
        {"rows": INT32, "cols": 4096},
        {"rows": INT32 + 1, "cols": 4096},
        "one block per row: the number of rows must fit the kernel's 32-bit int: requires "
        "`rows <= 2147483647`, but rows = 2147483648",
    ),
    (
        "layernorm_bf16",
        {"rows": 1, "cols": INT32},
        {"rows": 1, "cols": INT32 + 1},
        "requires `cols <= 2147483647`, but cols = 2147483648",
    ),
    (
        "swiglu",
        {"rows": 3, "width": 6},
        {"rows": 3, "width": 7},
        "the last dimension of x must be even: [..., 2 * hidden]: requires `width % 2 == 0`, "
        "but width = 7",
    ),
    (
        "swiglu",
        {"rows": 1, "width": 2 * INT32},
        {"rows": 1, "width": 2 * INT32 + 2},
        "the number of outputs must fit the kernel's 32-bit int: requires "
        "`rows * (width / 2) <= 2147483647`, but rows = 1, width = 4294967296",
    ),
    (
        "masked_softmax_pair_bias",
        {"batch": 2, "heads": 4, "n": 268435455},
        {"batch": 2, "heads": 4, "n": 268435456},
        "requires `batch * heads * n <= 2147483647`, but batch = 2, heads = 4, n = 268435456",
    ),
    (
        "sigmoid_gate",
        {"count": INT32},
        {"count": INT32 + 1},
        "requires `count <= 2147483647`, but count = 2147483648",
    ),
    (
        "sigmoid_gate_backward",
        {"count": INT32},
        {"count": INT32 + 1},
        "requires `count <= 2147483647`, but count = 2147483648",
    ),
    (
        "scale_rows",
        {"rows": 46341, "cols": 46340},
        {"rows": 46341, "cols": 46341},
        "requires `rows * cols <= 2147483647`, but rows = 46341, cols = 46341",
    ),
    (
        "wgmma_matmul_bf16",
        {"m": 65535 * 64, "n": 8, "k": 16},
        {"m": 65535 * 64 + 1, "n": 8, "k": 16},
        "one block per TILE_M rows of a: m must fit 65535 blocks of the grid's y dimension: "
        "requires `(m + TILE_M - 1) / TILE_M <= 65535`, but m = 4194241, TILE_M = 64",
    ),
    (
        "wgmma_matmul_bf16",
        {"m": 64, "n": INT32, "k": 16},
        {"m": 64, "n": INT32 + 1, "k": 16},
        "requires `n <= 2147483647`, but n = 2147483648",
    ),
    (
        "wgmma_matmul_bf16",
        {"m": 64, "n": 8, "k": INT32},
        {"m": 64, "n": 8, "k": INT32 + 1},
        "requires `k <= 2147483647`, but k = 2147483648",
    ),
]


@unittest.skipUnless(HAS_TORCH, NO_TORCH)
class Requirements(unittest.TestCase):
    """What each kernel requires of its sizes is declared in kernels.toml and answered from
    the index on a CPU, without a GPU; the ops refuse what breaks it, by the same answer."""

    def test_every_kernel_of_an_op_declares_its_inputs(self):
        registry = ops.library.registry
        for op, kernel in KERNELS.items():
            self.assertEqual(ops.library.ops[op].kernel.name, kernel)
            self.assertIsNotNone(ops.library.ops[op].inputs, op)
        covered = {kernel for kernel, *_ in BOUNDARIES}
        self.assertEqual(covered, set(KERNELS.values()))
        self.assertEqual(registry.kernels, sorted(covered))

    def test_every_requirement_answers_on_both_sides_of_its_boundary(self):
        import af3_kernels

        for kernel, inside, past, message in BOUNDARIES:
            with self.subTest(kernel=kernel, inputs=past):
                self.assertIsNone(af3_kernels.unsupported_shape_reason(kernel, **inside))
                reason = af3_kernels.unsupported_shape_reason(kernel, **past)
                self.assertIsNotNone(reason)
                self.assertIn(message, reason)
                # For a device, the variant it would get: the same constants, the same answer.
                self.assertEqual(
                    af3_kernels.unsupported_shape_reason(kernel, device="sm_90", **past), reason
                )

    def test_torch_sizes_are_inputs_and_wrong_inputs_are_type_errors(self):
        import af3_kernels

        x = torch.empty(46341, 46341, device="meta")
        rows, cols = x.shape
        self.assertIn("rows = 46341", af3_kernels.unsupported_shape_reason("scale_rows", rows=rows, cols=cols))
        for inputs, message in [
            ({"rows": 1}, "missing input `cols`"),
            ({"rows": 1, "cols": 2, "depth": 3}, "no input `depth`"),
            ({"rows": 1, "cols": True}, "input `cols` is an integer, not a boolean"),
            ({"rows": 1, "cols": 2.0}, "input `cols` must be an int or a bool"),
        ]:
            with self.assertRaises(TypeError) as raised:
                af3_kernels.unsupported_shape_reason("scale_rows", **inputs)
            self.assertIn(message, str(raised.exception))

    def test_ops_refuse_while_tracing_naming_the_op_the_requirement_and_the_values(self):
        meta = {"device": "meta"}
        cases = [
            (
                lambda: ops.scale_rows(torch.empty(46341, 46341, **meta), torch.empty(46341, **meta)),
                "af3_kernels::scale_rows: kernel `scale_rows` does not take these inputs: the "
                "number of elements must fit the kernel's 32-bit int: requires "
                "`rows * cols <= 2147483647`, but rows = 46341, cols = 46341",
            ),
            (
                lambda: ops.matmul(
                    torch.empty(65535 * 64 + 1, 16, dtype=torch.bfloat16, **meta),
                    torch.empty(16, 8, dtype=torch.bfloat16, **meta),
                ),
                "af3_kernels::matmul: kernel `wgmma_matmul_bf16` does not take these inputs: "
                "one block per TILE_M rows of a",
            ),
            (
                lambda: ops.sigmoid_gate(
                    torch.empty(2**16, 2**15, dtype=torch.bfloat16, **meta),
                    torch.empty(2**16, 2**15, dtype=torch.bfloat16, **meta),
                ),
                "but count = 2147483648",
            ),
        ]
        for call, message in cases:
            with self.assertRaises(ValueError) as raised:
                call()
            self.assertIn(message, str(raised.exception))
        # Just inside the boundaries, the same ops trace.
        out = ops.scale_rows(torch.empty(46341, 46340, **meta), torch.empty(46341, **meta))
        self.assertEqual(out.shape, torch.Size([46341, 46340]))

    def test_the_ops_have_no_size_checks_of_their_own(self):
        import inspect

        source = inspect.getsource(ops)
        for check in ("_require_int", "2**31", "% 2 == 0", "65535"):
            self.assertNotIn(check, source)


@unittest.skipUnless(HAS_TORCH, NO_TORCH)
class CpuImplementations(unittest.TestCase):
    def test_every_op_matches_its_torch_equivalent(self):
        for name, args in examples().items():
            got = getattr(ops, name)(*args)
            want = torch_equivalent(name, *args)
            got = got if isinstance(got, tuple) else (got,)
            want = want if isinstance(want, tuple) else (want,)
            for got_one, want_one in zip(got, want):
                torch.testing.assert_close(got_one, want_one, rtol=1 / 128, atol=1e-5, msg=name)

    def test_layer_norm_takes_f_layer_norms_arguments(self):
        x, shape, weight, bias, eps = examples()["layer_norm"]
        torch.testing.assert_close(
            ops.layer_norm(x, shape, weight, bias, eps), F.layer_norm(x, shape, weight, bias, eps)
        )
        torch.testing.assert_close(ops.layer_norm(x, shape), F.layer_norm(x, shape))
        torch.testing.assert_close(
            ops.layer_norm(x, normalized_shape=shape, eps=0.1), F.layer_norm(x, shape, eps=0.1)
        )

    def test_fully_masked_rows_are_zero(self):
        logits, bias, mask, scale = examples()["masked_softmax_pair_bias"]
        out = ops.masked_softmax_pair_bias(logits, bias, mask, scale)
        self.assertTrue(torch.all(out[1] == 0))
        torch.testing.assert_close(out[0].sum(-1), torch.ones(3, 9))

    def test_opcheck(self):
        for name, args in examples().items():
            with self.subTest(op=name):
                torch.library.opcheck(getattr(ops, name).default, args)

    def test_opcheck_with_gradients(self):
        x, gate = examples()["sigmoid_gate"]
        torch.library.opcheck(ops.sigmoid_gate.default, (x.requires_grad_(), gate.requires_grad_()))


@unittest.skipUnless(HAS_TORCH, NO_TORCH)
class ExtensionModule(unittest.TestCase):
    """`torch.ops.af3_native.gated_residual`: the library's extension module (a C++ launcher
    on the stable ABI), registered by `import af3_kernels` from its verified bytes."""

    @staticmethod
    def reference(x, gate, residual):
        return (residual.float() + x.float() * torch.sigmoid(gate.float())).to(x.dtype)

    def test_the_import_registers_the_op_without_initialising_cuda(self):
        code = (
            "import torch, af3_kernels, kwheel\n"
            "x = torch.randn(4, 5)\n"
            "assert torch.equal(torch.ops.af3_native.gated_residual(x, x, x), x + x * torch.sigmoid(x))\n"
            "assert not torch.cuda.is_initialized()\n"
            "print([e['source'] for e in kwheel.provenance() if e['kernel'] == '_C'])\n"
        )
        self.assertEqual(run_python(code).strip(), "['module']")

    def test_cpu_matches_torch_in_both_dtypes(self):
        generator = torch.Generator().manual_seed(2)
        for dtype in (torch.float32, torch.bfloat16):
            for shape in ((3, 7), (2, 33, 65), (0, 4)):
                with self.subTest(dtype=dtype, shape=shape):
                    x, gate, residual = (
                        (torch.rand(shape, generator=generator) * 8 - 4).to(dtype) for _ in range(3)
                    )
                    got = torch.ops.af3_native.gated_residual(x, gate, residual)
                    self.assertEqual(got.dtype, dtype)
                    torch.testing.assert_close(got, self.reference(x, gate, residual))

    def test_bad_inputs_are_refused_by_the_launcher(self):
        op = torch.ops.af3_native.gated_residual
        x = torch.randn(4, 6)
        for args, words in (
            ((x, x.double(), x), "one dtype"),
            ((x.double(), x.double(), x.double()), "float32 or bfloat16"),
            ((x, x[:, :3], x), "same number of elements"),
            ((x.t(), x.t(), x.t()), "contiguous"),
        ):
            with self.subTest(words=words):
                with self.assertRaisesRegex(RuntimeError, words):
                    op(*args)

    def test_the_meta_implementation_keeps_one_graph(self):
        op = torch.ops.af3_native.gated_residual
        meta = op(*(torch.empty(3, 8, device="meta") for _ in range(3)))
        self.assertEqual((meta.shape, meta.device.type), ((3, 8), "meta"))
        torch.library.opcheck(op.default, tuple(torch.randn(5, 9) for _ in range(3)))

        def block(x, gate, residual):
            return ops.sigmoid_gate(op(x, gate, residual), gate)

        args = tuple(torch.randn(8, 16).bfloat16() for _ in range(3))
        torch._dynamo.reset()
        explained = torch._dynamo.explain(block)(*args)
        self.assertEqual((explained.graph_count, explained.graph_break_count), (1, 0))
        torch._dynamo.reset()


@unittest.skipUnless(HAS_TORCH, NO_TORCH)
class Gradients(unittest.TestCase):
    def test_sigmoid_gate_gradients_come_from_the_backward_op_and_match_autograd(self):
        x, gate = examples()["sigmoid_gate"]
        grad = bf16(*x.shape, generator=torch.Generator().manual_seed(3))
        x1, gate1 = x.clone().requires_grad_(), gate.clone().requires_grad_()
        out = ops.sigmoid_gate(x1, gate1)
        self.assertIn("af3_kernels_sigmoid_gate", type(out.grad_fn).__name__)
        out.backward(grad)
        x2, gate2 = x.float().requires_grad_(), gate.float().requires_grad_()
        (x2 * torch.sigmoid(gate2)).backward(grad.float())
        torch.testing.assert_close(x1.grad, x2.grad.bfloat16(), rtol=1 / 128, atol=1e-5)
        torch.testing.assert_close(gate1.grad, gate2.grad.bfloat16(), rtol=1 / 128, atol=1e-5)


def block(ops_module, x, weight, bias, gate, logits, pair_bias, mask, factors):
    """A small AF3-style block: LayerNorm, a gated SwiGLU transition, the triangle-attention
    softmax, a row scale."""
    h = ops_module.layer_norm(x, (x.shape[-1],), weight, bias, 1e-5)
    h = ops_module.swiglu(torch.cat([h, h], dim=-1))
    h = ops_module.sigmoid_gate(h, gate)
    p = ops_module.masked_softmax_pair_bias(logits, pair_bias, mask, 0.125)
    return ops_module.scale_rows(h.float(), factors), p


def block_inputs(device="cpu"):
    generator = torch.Generator(device=device).manual_seed(11)
    rows, cols, n = 6, 32, 8
    return (
        bf16(rows, cols, generator=generator, device=device),
        bf16(cols, low=0.5, high=1.5, generator=generator, device=device),
        bf16(cols, generator=generator, device=device),
        bf16(rows, cols, generator=generator, device=device),
        torch.randn((1, 2, n, n), generator=generator, device=device),
        torch.randn((2, n, n), generator=generator, device=device),
        torch.ones((1, n), device=device),
        torch.randn((rows,), generator=generator, device=device),
    )


@unittest.skipUnless(HAS_TORCH, NO_TORCH)
class Compile(unittest.TestCase):
    def test_the_block_traces_to_one_graph(self):
        torch._dynamo.reset()
        inputs = block_inputs()
        explained = torch._dynamo.explain(lambda *args: block(ops, *args))(*inputs)
        self.assertEqual((explained.graph_count, explained.graph_break_count), (1, 0))
        targets = {str(node.target) for graph in explained.graphs for node in graph.graph.nodes}
        for name in ("layer_norm", "swiglu", "sigmoid_gate", "masked_softmax_pair_bias", "scale_rows"):
            self.assertIn(f"af3_kernels.{name}.default", targets)

    def test_compiled_block_matches_eager(self):
        torch._dynamo.reset()
        inputs = block_inputs()
        compiled = torch.compile(lambda *args: block(ops, *args), backend="aot_eager", fullgraph=True)
        for got, want in zip(compiled(*inputs), block(ops, *inputs)):
            torch.testing.assert_close(got, want)


@unittest.skipUnless(HAS_TORCH, NO_TORCH)
class EscapeHatch(unittest.TestCase):
    def test_compile_wrap_disable_makes_plain_calls(self):
        out = run_python(
            "import torch\n"
            "from af3_kernels import ops\n"
            "print(ops.library.compile_wrap, type(ops.layer_norm).__name__)\n"
            "print(hasattr(torch.ops.af3_kernels, 'layer_norm'))\n"
            "x = torch.randn(3, 8).bfloat16().requires_grad_()\n"
            "g = torch.randn(3, 8).bfloat16().requires_grad_()\n"
            "ops.sigmoid_gate(x, g).sum().backward()\n"
            "print(torch.allclose(x.grad.float(), torch.sigmoid(g.detach().float()), atol=1e-2))\n"
            "print(ops.layer_norm(x.detach(), (8,)).shape)\n",
            AF3_KERNELS_COMPILE_WRAP="disable",
        )
        self.assertEqual(
            out.splitlines(), ["False function", "False", "True", "torch.Size([3, 8])"]
        )

    def test_compile_wrap_disable_breaks_the_graph_at_each_op(self):
        here = os.path.dirname(os.path.abspath(__file__))
        out = run_python(
            "import sys, torch\n"
            f"sys.path.insert(0, {here!r})\n"
            "from torch._dynamo.utils import counters\n"
            "from af3_kernels import ops\n"
            "import test_ops\n"
            "graphs = []\n"
            "def backend(gm, inputs):\n"
            "    graphs.append(gm)\n"
            "    return gm.forward\n"
            "inputs = test_ops.block_inputs()\n"
            "got = torch.compile(lambda *a: test_ops.block(ops, *a), backend=backend)(*inputs)\n"
            "want = test_ops.block(ops, *inputs)\n"
            "names = sorted(reason.split('<function ')[1].split(' ')[0] for reason in counters['graph_break'])\n"
            "print(' '.join(names))\n"
            "print(all(reason.startswith('Skip calling `torch.compiler.disable()`d function') for reason in counters['graph_break']))\n"
            "print(all(torch.equal(g, w) for g, w in zip(got, want)))\n",
            AF3_KERNELS_COMPILE_WRAP="disable",
        )
        # A break at each op of the block, for the op and nothing else.
        self.assertEqual(
            out.splitlines(),
            [
                "layer_norm masked_softmax_pair_bias scale_rows sigmoid_gate swiglu",
                "True",
                "True",
            ],
        )

    def test_the_variable_is_read_at_import(self):
        out = run_python(
            "import os, torch\n"
            "from af3_kernels import ops\n"
            "os.environ['AF3_KERNELS_COMPILE_WRAP'] = 'disable'\n"
            "import importlib\n"
            "print(ops.library.compile_wrap, type(ops.swiglu).__name__)\n"
        )
        self.assertEqual(out.split(), ["True", "Call"])


@unittest.skipUnless(HAS_TORCH, NO_TORCH)
class LoaderErrors(unittest.TestCase):
    def test_the_first_cuda_use_raises_the_loaders_own_error(self):
        # What the CUDA implementation loads, asked directly: on a machine without a driver
        # the op's error is exactly `af3_kernels.load`'s.
        import af3_kernels

        try:
            af3_kernels.load("swiglu")
        except kwheel.KwheelError as error:
            expected = (type(error), str(error))
        else:
            self.skipTest("the kernel loads here (a GPU machine): gpu_torch.py covers it")
        with self.assertRaises(kwheel.KwheelError) as raised:
            ops.library.ops["swiglu"].kernel.get(0)
        self.assertEqual((type(raised.exception), str(raised.exception)), expected)

    def test_no_fit_with_the_jit_disabled_falls_back_with_a_warning(self):
        # The loader's refusal for a device nothing in the bundle fits (sm_80 is older than
        # every variant), with the JIT off; the op then takes its documented fallback.
        import af3_kernels

        registry = kwheel.open(af3_kernels._registry.path, jit=False)
        with self.assertRaises(kwheel.NoFitError) as raised:
            registry.select("swiglu", "sm_80", cuda="13.0")
        message = str(raised.exception)
        self.assertIn("no prebuilt variant of `swiglu` fits device sm_80", message)
        library = kwheel.torch.Library(registry, namespace="af3_kernels_fallback_test", fallback=True)
        library.define(
            "swiglu(Tensor x) -> Tensor",
            kernel="swiglu",
            shape=ops._swiglu_shape,
            launch=ops._swiglu_launch,
            reference=ops._swiglu_reference,
        )

        class NoFit:
            package = "af3-kernels"

            def load(self, name, device=None):
                raise kwheel.NoFitError(message)

        library.ops["swiglu"].kernel.registry = NoFit()
        (x,) = examples()["swiglu"]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = library.ops["swiglu"].cuda(x)
        torch.testing.assert_close(out, torch_equivalent("swiglu", x))
        self.assertEqual([w.category for w in caught], [kwheel.torch.FallbackWarning])
        self.assertIn(message, str(caught[0].message))


if __name__ == "__main__":
    unittest.main()
