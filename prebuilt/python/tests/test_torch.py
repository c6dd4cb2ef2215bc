"""kwheel.torch on a CPU: declaring ops, their registration, fakes, lazy loading per device,
fallback, and the trace ranges that name which binary ran.

Needs torch importable next to the installed `kwheel` wheel (`release/tests/run.rs` puts the
pinned torch of `ci/setup-torch` on PYTHONPATH); without torch, only the test that `kwheel.torch`
then fails to import with a clear error runs. The ops here launch nothing: a CPU has no kernel
to run, so a stub registry stands in for the loader, and the CUDA path is exercised on a GPU
by `kernels/python/tests/gpu_torch.py`.

    python -m unittest -v test_torch
"""

import importlib.util
import os
import subprocess
import sys
import threading
import unittest
import warnings

import kwheel

HAS_TORCH = importlib.util.find_spec("torch") is not None
NO_TORCH = "torch is not importable here (ci/setup-torch installs the pinned one; see docs/torch.md)"

if HAS_TORCH:
    import torch

    import kwheel.torch as kt
from kwheel import _torch_op as _op
from kwheel import _torch_plans as _plans


def run_python(code, **environment):
    env = dict(os.environ)
    env.update(environment)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    return result.returncode, result.stdout, result.stderr


def python_output(code, **environment):
    """The stdout of `code` run as `run_python` runs it, which must succeed."""
    status, out, err = run_python(code, **environment)
    if status != 0:
        raise AssertionError(f"python -c failed with {status}:\n{out}{err}")
    return out


def subprocess_run(code, *arguments):
    result = subprocess.run(
        [sys.executable, "-c", code, *arguments], capture_output=True, text=True, check=False
    )
    return result.returncode, result.stdout, result.stderr


class StubKernel:
    """What `Registry.load` returns, for the parts kwheel.torch reads."""

    def __init__(self, name, entries, constants, device=0):
        self.name = name
        self.entries = entries
        self.constants = constants
        self.trace_label = f"kwheel:{name} cu130/sm_90a prebuilt 0123456789ab cuda:{device}"

    def function(self, entry):
        return ("function", self.name, entry)


class StubRegistry:
    """A registry whose `load` counts its calls and answers or raises as told."""

    def __init__(self, package, error=None, constants=None):
        self.package = package
        self.error = error
        self.constants = constants or {"BLOCK_SIZE": 128}
        self.loads = []
        self.lock = threading.Lock()

    def load(self, name, device=None):
        with self.lock:
            self.loads.append((name, device))
        if self.error is not None:
            raise self.error
        return StubKernel(name, [name], self.constants, device)


def _double_shape(x):
    return [(x.shape, x.dtype)]


def _double_launch(constants, outputs, x):
    return kt.Launch(kt.ceil_div(x.numel(), constants["BLOCK_SIZE"]), constants["BLOCK_SIZE"], [outputs[0], x, x.numel()])


def _double_reference(x):
    return x * 2


def _define_double(library, schema="double(Tensor x) -> Tensor", kernel="double", **options):
    """Defines in `library` the op that doubles its input (`_double_shape`, `_double_launch`,
    `_double_reference` unless `options` give another), with any other `options` of `define`."""
    options = {"reference": _double_reference, **options}
    return library.define(
        schema, kernel=kernel, shape=_double_shape, launch=_double_launch, **options
    )


class ImportWithoutTorch(unittest.TestCase):
    def test_kwheel_never_imports_torch(self):
        out = python_output(
            "import sys, kwheel\nprint('torch' in sys.modules, hasattr(kwheel, 'torch'))"
        )
        self.assertEqual(out.split(), ["False", "False"])

    def test_kwheel_torch_needs_torch(self):
        # A `torch` that cannot be imported, whether or not a real one is installed.
        code, out, err = run_python(
            "import sys\nsys.modules['torch'] = None\nimport kwheel.torch\n"
        )
        self.assertNotEqual(code, 0)
        self.assertIn("ModuleNotFoundError", err)
        self.assertIn("torch", err)


@unittest.skipUnless(HAS_TORCH, NO_TORCH)
class Namespaces(unittest.TestCase):
    def test_the_namespace_is_the_package(self):
        library = kt.Library(StubRegistry("kwheel-test-ns.one"))
        self.assertEqual(library.namespace, "kwheel_test_ns_one")
        double = _define_double(library)
        self.assertIs(double, torch.ops.kwheel_test_ns_one.double.default)
        self.assertEqual(
            str(double._schema), "kwheel_test_ns_one::double(Tensor x) -> Tensor"
        )

    def test_two_libraries_define_the_same_op_name_apart(self):
        first = kt.Library(StubRegistry("kwheel-test-a"))
        second = kt.Library(StubRegistry("kwheel-test-b"))
        one = _define_double(first)
        two = _define_double(second, reference=lambda x: x * 3)
        x = torch.ones(3)
        self.assertEqual(one(x).tolist(), [2.0] * 3)
        self.assertEqual(two(x).tolist(), [3.0] * 3)

    def test_library_keeps_one_per_namespace(self):
        registry = StubRegistry("kwheel-test-once")
        self.assertIs(kt.library(registry), kt.library(registry))
        with self.assertRaises(ValueError) as raised:
            kt.library(StubRegistry("kwheel-test-once"))
        self.assertIn("the torch namespace `kwheel_test_once` is already taken", str(raised.exception))

    def test_an_op_defined_twice_is_refused(self):
        library = kt.Library(StubRegistry("kwheel-test-twice"))
        library.define("double(Tensor x) -> Tensor", kernel="double", shape=_double_shape, launch=_double_launch)
        with self.assertRaises(ValueError) as raised:
            library.define("double(Tensor x) -> Tensor", kernel="double", shape=_double_shape, launch=_double_launch)
        self.assertEqual(str(raised.exception), "`kwheel_test_twice::double` is already defined")


@unittest.skipUnless(HAS_TORCH, NO_TORCH)
class Declarations(unittest.TestCase):
    def setUp(self):
        self.library = kt.Library(StubRegistry(f"kwheel-test-{self._testMethodName}"))

    def define(self, schema, **options):
        arguments = dict(kernel="k", shape=_double_shape, launch=_double_launch)
        arguments.update(options)
        return self.library.define(schema, **arguments)

    def test_schemas_that_cannot_be_kernels_are_refused(self):
        for schema, message in [
            ("f(Tensor(a!) x) -> Tensor", "ops are functional; no argument may alias or mutate"),
            ("f(Tensor(a) x) -> Tensor(a)", "ops are functional; no argument may alias or mutate"),
            ("f(Tensor x) -> Tensor(a)", "ops are functional; no argument may alias or mutate"),
            ("f(Tensor x, *, int n) -> Tensor", "keyword-only arguments are not supported"),
            ("f(int n) -> Tensor", "an op needs a Tensor argument to take its device from"),
            ("f(Tensor x) -> int", "an op returns one or more Tensors"),
            ("f.out(Tensor x) -> Tensor", "declare the default overload only"),
        ]:
            with self.assertRaises(ValueError) as raised:
                self.define(schema)
            self.assertEqual(str(raised.exception), f"`{schema}`: {message}")

    def test_fallback_needs_a_reference(self):
        with self.assertRaises(ValueError) as raised:
            self.define("f(Tensor x) -> Tensor", fallback=True)
        self.assertEqual(str(raised.exception), "`f(Tensor x) -> Tensor`: fallback=True needs a reference")

    def test_the_fake_comes_from_the_shape_function(self):
        def shape(x, y):
            return [((x.shape[0], y.shape[1]), torch.float32), (x.shape, torch.bfloat16)]

        op = self.define("pair(Tensor x, Tensor y) -> (Tensor, Tensor)", shape=shape)
        x = torch.empty(5, 3, device="meta", dtype=torch.bfloat16)
        y = torch.empty(3, 7, device="meta", dtype=torch.bfloat16)
        first, second = op(x, y)
        self.assertEqual((first.shape, first.dtype), (torch.Size([5, 7]), torch.float32))
        self.assertEqual((second.shape, second.dtype), (torch.Size([5, 3]), torch.bfloat16))
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode():
            x = torch.empty(2, 3, device="cuda", dtype=torch.bfloat16)
            y = torch.empty(3, 4, device="cuda", dtype=torch.bfloat16)
            first, _ = op(x, y)
        self.assertEqual(first.shape, torch.Size([2, 4]))
        self.assertEqual(first.device, torch.device("cuda", 0))

    def test_defaults_the_dispatcher_leaves_out_are_filled_in(self):
        seen = []

        def reference(x, scale, bias):
            seen.append((scale, bias))
            return x * scale

        op = self.define(
            "scaled(Tensor x, float scale=2.0, Tensor? bias=None) -> Tensor",
            shape=lambda x, scale, bias: [(x.shape, x.dtype)],
            reference=reference,
        )
        op(torch.ones(2))
        op(torch.ones(2), 3.0)
        self.assertEqual(seen, [(2.0, None), (3.0, None)])

    def test_an_op_without_reference_has_no_cpu_implementation(self):
        op = self.define("f(Tensor x) -> Tensor")
        with self.assertRaises(NotImplementedError) as raised:
            op(torch.ones(2))
        self.assertIn(
            f"Could not run '{self.library.namespace}::f' with arguments from the 'CPU' backend",
            str(raised.exception),
        )
        self.assertIn("only available for these backends: [CUDA, Meta,", str(raised.exception))

    def test_plain_calls_bind_arguments_by_name_with_the_schemas_defaults(self):
        self.define("scaled(Tensor x, float scale=2.0, Tensor? bias=None) -> Tensor")
        declared = self.library.ops["scaled"]
        x = torch.ones(2)
        self.assertEqual(declared.bind((x,), {}), [x, 2.0, None])
        self.assertEqual(declared.bind((), {"x": x, "bias": x}), [x, 2.0, x])
        with self.assertRaises(TypeError) as raised:
            declared.bind((x, 1.0, None, 4), {})
        self.assertEqual(
            str(raised.exception), f"{declared.qualified_name}(): too many positional arguments"
        )
        with self.assertRaises(TypeError) as raised:
            declared.bind((), {"scale": 1.0})
        self.assertEqual(
            str(raised.exception), f"{declared.qualified_name}(): missing a required argument: 'x'"
        )

    def test_a_cpu_call_is_refused_what_the_kernel_is_refused(self):
        # A float32-only kernel: its shape function refuses anything else, and the reference,
        # which would compute a float64 result, is not reached.
        def shape(x):
            if x.dtype != torch.float32:
                raise TypeError(f"f takes float32, got {x.dtype}")
            return [(x.shape, x.dtype)]

        op = self.define("f(Tensor x) -> Tensor", shape=shape, reference=_double_reference)
        self.assertTrue(torch.equal(op(torch.ones(2)), torch.full((2,), 2.0)))
        with self.assertRaises(TypeError) as raised:
            op(torch.ones(2, dtype=torch.float64))
        self.assertEqual(str(raised.exception), "f takes float32, got torch.float64")

    def test_opcheck_passes_on_the_reference(self):
        op = self.define("f(Tensor x) -> Tensor", reference=_double_reference)
        torch.library.opcheck(op, (torch.randn(4, 3),))


@unittest.skipUnless(HAS_TORCH, NO_TORCH)
class Schemas(unittest.TestCase):
    """`kt.read_schema`, kwheel's reader of the schemas it accepts, against torch's own parser
    (private; used here as the reference only)."""

    SCHEMAS = [
        "layer_norm(Tensor x, SymInt[] normalized_shape, Tensor? weight=None, Tensor? bias=None, "
        "float eps=1e-05) -> Tensor",
        "f(Tensor x, int[2] stride=1, float alpha=1, bool flag=True, str mode='mean', int? n=None, "
        "float[] factors=[1.5, 2.0], SymInt k=-3, str s=\"a, b\") -> (Tensor, Tensor)",
        "g(Tensor x, *, int n) -> Tensor",
        "h.out(Tensor x) -> Tensor",
        "m(Tensor(a!) x) -> Tensor(a!)",
        "n(Tensor x) -> (Tensor values, Tensor indices)",
        "e(Tensor x) -> ()",
        "p(Tensor[] xs, Tensor? y) -> Tensor[]",
    ]

    def test_the_reader_agrees_with_torchs_parser(self):
        for text in self.SCHEMAS:
            with self.subTest(schema=text):
                mine = kt.read_schema(text)
                theirs = torch._C.parse_schema(f"ns::{text}")
                self.assertEqual(f"ns::{mine.name}", theirs.name)
                self.assertEqual(mine.overload, theirs.overload_name)
                self.assertEqual(mine.keyword_only, any(a.kwarg_only for a in theirs.arguments))
                self.assertEqual(
                    [(a.name, a.has_default) for a in mine.arguments],
                    [(a.name, a.has_default_value()) for a in theirs.arguments],
                )
                for argument, reference in zip(mine.arguments, theirs.arguments):
                    # Tensor arguments are what an op keys its plans on and passes as pointers.
                    self.assertEqual("(" in argument.type, reference.alias_info is not None)
                    if "(" not in argument.type:  # an aliasing argument is refused anyway
                        self.assertEqual(
                            argument.type in ("Tensor", "Tensor?"),
                            str(reference.type) in ("Tensor", "Optional[Tensor]"),
                        )
                    if argument.has_default:
                        self.assertEqual(argument.default, reference.default_value)
                        self.assertIs(type(argument.default), type(reference.default_value))
                self.assertEqual(len(mine.returns), len(theirs.returns))
                self.assertEqual(
                    [kind.split("(")[0] == "Tensor" for kind in mine.returns],
                    [str(r.type) == "Tensor" for r in theirs.returns],
                )

    def test_text_that_is_no_schema_is_refused(self):
        for text, message in [
            ("f(Tensor x)", "not an operator schema `name(Type name, ...) -> Tensor`"),
            ("f Tensor x -> Tensor", "not an operator schema `name(Type name, ...) -> Tensor`"),
            ("1f(Tensor x) -> Tensor", "not an operator schema `name(Type name, ...) -> Tensor`"),
            ("f(Tensor) -> Tensor", "cannot read the argument `Tensor` (`Type name`)"),
            (
                "f(Tensor x, int n=two) -> Tensor",
                "the default `two` of `n` is not a number, bool, None, string or list",
            ),
        ]:
            with self.subTest(schema=text):
                with self.assertRaises(ValueError) as raised:
                    kt.read_schema(text)
                self.assertEqual(str(raised.exception), f"`{text}`: {message}")


@unittest.skipUnless(HAS_TORCH, NO_TORCH)
class Registration(unittest.TestCase):
    """What `define` registers: public `torch.library` calls only, cheap at import."""

    def define(self, library, schema="scaled(Tensor x, float scale=2.0) -> Tensor"):
        return library.define(
            schema,
            kernel="scaled",
            shape=lambda x, scale: [(x.shape, x.dtype)],
            launch=None,
            reference=lambda x, scale: x * scale,
        )

    def test_a_definition_scans_no_modules_and_reads_no_source(self):
        # torch.library.register_fake asks `inspect` for its caller's source line, which scans
        # every loaded module and stats source files: most of what importing seven ops cost.
        # (torch.library.Library reads one stack frame when made: once per namespace, with
        # the first op it defines.)
        import inspect
        import linecache

        library = kt.Library(StubRegistry("kwheel-test-cheap-definition"))
        self.define(library, "first(Tensor x, float scale=2.0) -> Tensor")
        asked = []
        for module, name in ((inspect, "getmodule"), (linecache, "getlines"), (linecache, "checkcache")):
            original = getattr(module, name)
            self.addCleanup(setattr, module, name, original)

            def spy(*args, _name=name, _original=original, **kwargs):
                asked.append(_name)
                return _original(*args, **kwargs)

            setattr(module, name, spy)
        op = self.define(library)
        self.assertEqual(asked, [])
        self.assertEqual(op(torch.ones(2)).tolist(), [2.0, 2.0])

    def test_the_fake_is_the_meta_kernel_and_opcheck_passes(self):
        library = kt.Library(StubRegistry("kwheel-test-meta-fake"))
        op = self.define(library)
        name = "kwheel_test_meta_fake::scaled"
        for key in ("CUDA", "CPU", "Meta"):
            self.assertTrue(torch._C._dispatch_has_kernel_for_dispatch_key(name, key), key)
        out = op(torch.empty(3, 4, device="meta"))
        self.assertEqual((out.shape, out.device.type), (torch.Size([3, 4]), "meta"))
        # The trailing default left out by the caller, and given.
        torch.library.opcheck(op, (torch.randn(4, 3),))
        torch.library.opcheck(op, (torch.randn(4, 3), 0.5))

    def test_an_op_refuses_inputs_that_break_a_requirement_by_the_kernels_answer(self):
        asked = []

        class Answering(StubRegistry):
            def unsupported_shape_reason(self, name, **values):
                asked.append((name, values))
                if values["count"] > 8:
                    return f"requires `count <= 8`, but count = {values['count']}"
                return None

        library = kt.Library(Answering("kwheel-test-requires"))
        op = _define_double(
            library, "twice(Tensor x) -> Tensor", inputs=lambda x: {"count": x.numel()}
        )
        # While tracing, from the index (no device): the op, the kernel, the requirement.
        self.assertEqual(op(torch.empty(2, 4, device="meta")).shape, torch.Size([2, 4]))
        with self.assertRaises(ValueError) as raised:
            op(torch.empty(3, 3, device="meta"))
        self.assertEqual(
            str(raised.exception),
            "kwheel_test_requires::twice: kernel `double` does not take these inputs: "
            "requires `count <= 8`, but count = 9",
        )
        self.assertEqual(asked, [("double", {"count": 8}), ("double", {"count": 9})])
        # On a device whose kernel is loaded, that kernel answers (its variant's constants).
        declared = library.ops["twice"]
        kernel = declared.kernel
        kernel.get(0)
        answers = []
        kernel._kernels[0].unsupported_shape_reason = lambda **values: answers.append(values)
        declared._refuse_unsupported([torch.empty(3, 3)], 0)
        self.assertEqual(answers, [{"count": 9}])
        self.assertEqual(len(asked), 2)
        # A CPU call runs the reference, which has no such limit.
        self.assertEqual(op(torch.ones(3, 3)).sum().item(), 18.0)

    def test_torch_compile_keeps_one_graph_with_dynamic_shapes(self):
        library = kt.Library(StubRegistry("kwheel-test-compile-dynamic"))
        op = self.define(library)

        def model(x):
            return op(op(x) + 1, 0.5)

        torch._dynamo.reset()
        self.addCleanup(torch._dynamo.reset)
        explained = torch._dynamo.explain(model)(torch.randn(4, 3))
        self.assertEqual((explained.graph_count, explained.graph_break_count), (1, 0))
        targets = [str(node.target) for graph in explained.graphs for node in graph.graph.nodes]
        self.assertEqual(targets.count("kwheel_test_compile_dynamic.scaled.default"), 2)
        compiled = torch.compile(model, backend="aot_eager", fullgraph=True, dynamic=True)
        for rows in (4, 7):
            x = torch.randn(rows, 3)
            torch.testing.assert_close(compiled(x), model(x))

    def test_library_autograd_finds_the_op_by_what_define_returned(self):
        library = kt.Library(StubRegistry("kwheel-test-find-op"))
        op = self.define(library)
        self.assertIs(library._op(op), library.ops["scaled"])
        self.assertIs(library._op("scaled"), library.ops["scaled"])
        with self.assertRaises(ValueError) as raised:
            library._op(torch.ops.aten.relu.default)
        self.assertEqual(
            str(raised.exception), "`<OpOverload(op='aten.relu', overload='default')>` is no op of "
            "the library `kwheel_test_find_op`"
        )


LAZY_MODULE = """
import torch
import kwheel.torch as kt

class Registry:
    package = "kwheel-test-lazy-module"

library = kt.library(Registry())
library.declare(
    "twice(Tensor x) -> Tensor", kernel="twice", shape=lambda x: [(x.shape, x.dtype)],
    launch=None, reference=lambda x: x * 2,
)

def __getattr__(name):
    value = library.lookup(name)
    globals()[name] = value
    return value
"""

FIRST_LOOKUP_INSIDE_COMPILE = """
import sys, torch
sys.path.insert(0, sys.argv[1])
import lazy_ops
print(hasattr(torch.ops.kwheel_test_lazy_module, "twice"))
def model(x):
    return lazy_ops.twice(x) + 1
explained = torch._dynamo.explain(model)(torch.ones(3))
print(explained.graph_count, explained.graph_break_count)
print(hasattr(torch.ops.kwheel_test_lazy_module, "twice"), [
    str(node.target) for graph in explained.graphs for node in graph.graph.nodes
    if node.op == "call_function" and "twice" in str(node.target)
])
print(lazy_ops.twice.default is torch.ops.kwheel_test_lazy_module.twice.default)
print(torch.compile(model, backend="aot_eager", fullgraph=True)(torch.ones(2)).tolist())
"""


@unittest.skipUnless(HAS_TORCH, NO_TORCH)
class Declaring(unittest.TestCase):
    """`declare`: ops defined with torch on their first lookup, not at import."""

    def declare(self, library, name="scaled"):
        return library.declare(
            f"{name}(Tensor x, float scale=3.0) -> Tensor",
            kernel=name,
            shape=lambda x, scale: [(x.shape, x.dtype)],
            launch=None,
            reference=lambda x, scale: x * scale,
        )

    def test_a_declared_op_is_defined_when_a_call_needs_the_dispatcher(self):
        library = kt.Library(StubRegistry("kwheel-test-declare"))
        declared = self.declare(library)
        self.assertIsInstance(declared, kt.Op)
        namespace = torch.ops.kwheel_test_declare
        op = library.lookup("scaled")
        self.assertIsInstance(op, kt.Call)
        self.assertIs(library.lookup("scaled"), op)
        self.assertFalse(hasattr(namespace, "scaled"), "a lookup defines nothing")
        # CPU tensors go through the dispatcher (to the reference): the op is defined then.
        self.assertEqual(op(torch.ones(2)).tolist(), [3.0, 3.0])
        self.assertTrue(hasattr(namespace, "scaled"))
        self.assertIs(op.default, namespace.scaled.default)
        self.assertIs(library.overloads.scaled, op.default)
        # One per op, as an OpOverload: a module holding it copies with the same op.
        import copy

        self.assertIs(copy.deepcopy({"op": op})["op"], op)
        self.assertIs(copy.copy(op), op)
        with self.assertRaises(AttributeError) as raised:
            library.lookup("missing")
        self.assertEqual(str(raised.exception), "the library `kwheel_test_declare` declares no op `missing`")

    def test_a_declared_schema_is_read_on_its_first_lookup(self):
        library = kt.Library(StubRegistry("kwheel-test-read-late"))
        good = self.declare(library)
        bad = library.declare("late(Tensor x) -> int", kernel="late", shape=None, launch=None)
        for op in (good, bad):
            self.assertNotIn("_argument_count", vars(op), "declaring reads no schema")
        self.assertEqual(good.name, "scaled")
        library.lookup("scaled")
        self.assertEqual(good.argument_names, ["x", "scale"])
        self.assertNotIn("_argument_count", vars(bad), "a lookup reads its own op only")
        with self.assertRaises(ValueError) as raised:
            library.lookup("late")
        self.assertEqual(str(raised.exception), "`late(Tensor x) -> int`: an op returns one or more Tensors")
        with self.assertRaises(ValueError):
            library.define_all()
        # What has no op name is refused as it is declared; `define` reads at once, and a
        # schema it refuses leaves its name free.
        with self.assertRaises(ValueError) as raised:
            library.declare("not a schema", kernel="k", shape=None, launch=None)
        self.assertEqual(str(raised.exception), "`not a schema`: not an operator schema `name(Type name, ...) -> Tensor`")
        with self.assertRaises(ValueError):
            library.define("twice(Tensor x) -> int", kernel="k", shape=None, launch=None)
        self.assertNotIn("twice", library.ops)
        library.define("twice(Tensor x) -> Tensor", kernel="k", shape=_double_shape, launch=_double_launch)
        self.assertIn("twice", library.ops)

    def test_a_refused_read_leaves_nothing_behind(self):
        library = kt.Library(StubRegistry("kwheel-test-read-refused"))
        # An overload is refused as it is declared, and takes no name.
        with self.assertRaises(ValueError) as raised:
            library.declare("f.out(Tensor x) -> Tensor", kernel="k", shape=None, launch=None)
        self.assertEqual(str(raised.exception), "`f.out(Tensor x) -> Tensor`: declare the default overload only")
        self.assertNotIn("f", library.ops)
        # A default that is no literal is refused naming the schema, and `define` frees the name.
        with self.assertRaises(ValueError) as raised:
            library.define("d(Tensor x, int y={[]}) -> Tensor", kernel="k", shape=_double_shape, launch=_double_launch)
        self.assertIn("`d(Tensor x, int y={[]}) -> Tensor`: the default `{[]}` of `y`", str(raised.exception))
        self.assertNotIn("d", library.ops)
        # A read refused half way keeps none of what it read.
        bad = library.declare("late(Tensor x) -> int", kernel="k", shape=None, launch=None)
        for _ in range(2):
            with self.assertRaises(ValueError):
                library.lookup("late")
        self.assertFalse(set(vars(bad)) & _op._READ, "nothing of a refused schema is kept")

    def test_an_attribute_error_inside_a_property_is_not_hidden(self):
        library = kt.Library(StubRegistry("kwheel-test-read-property"))
        declared = self.declare(library)

        def register(torch_library):
            raise AttributeError("the real cause")

        declared.register = register
        with self.assertRaises(AttributeError) as raised:
            declared.callable
        self.assertEqual(str(raised.exception), "the real cause")

    def test_a_lookup_while_dynamo_traces_keeps_one_graph(self):
        library = kt.Library(StubRegistry("kwheel-test-read-traced"))
        self.declare(library)
        explained = torch._dynamo.explain(lambda x: (x.cos() + library.lookup("scaled")(x)).sin())(torch.ones(3))
        self.assertEqual((explained.graph_count, explained.graph_break_count), (1, 0))

    def test_define_all_defines_every_declared_op(self):
        library = kt.Library(StubRegistry("kwheel-test-define-all"))
        for name in ("one", "two"):
            self.declare(library, name)
        library.define_all()
        self.assertTrue(hasattr(torch.ops.kwheel_test_define_all, "one"))
        self.assertTrue(hasattr(torch.ops.kwheel_test_define_all, "two"))

    def test_a_backward_given_before_the_definition_is_registered_with_it(self):
        for light in (True, False):
            with self.subTest(light=light):
                if not light:
                    checked = kt.LIGHT_AUTOGRAD_TORCH
                    kt.LIGHT_AUTOGRAD_TORCH = ()
                    self.addCleanup(setattr, kt, "LIGHT_AUTOGRAD_TORCH", checked)
                library = kt.Library(StubRegistry(f"kwheel-test-declare-grad-{int(light)}"))
                declared = self.declare(library)
                library.autograd(declared, lambda ctx, grad: (grad * 3.0, None), lambda ctx, inputs, output: None)
                x = torch.randn(4, 3, requires_grad=True)
                library.lookup("scaled")(x).sum().backward()
                self.assertEqual(x.grad.tolist(), [[3.0] * 3] * 4)

    def test_a_first_lookup_inside_torch_compile_keeps_one_graph(self):
        import tempfile

        with tempfile.TemporaryDirectory() as directory:
            with open(os.path.join(directory, "lazy_ops.py"), "w") as handle:
                handle.write(LAZY_MODULE)
            status, out, err = subprocess_run(FIRST_LOOKUP_INSIDE_COMPILE, directory)
        self.assertEqual(status, 0, err)
        # Tracing defined the op, and the graph holds the operator itself.
        self.assertEqual(
            out.splitlines(),
            ["False", "1 0", "True ['kwheel_test_lazy_module.twice.default']", "True", "[3.0, 3.0]"],
        )


def _library_code(package):
    """The start of a child program with `library`, a `kt.Library` of `package`."""
    return (
        "import torch, kwheel.torch as kt\n"
        "class R:\n"
        f"    package = '{package}'\n"
        "library = kt.Library(R())\n"
    )


@unittest.skipUnless(HAS_TORCH, NO_TORCH)
class CompileWrap(unittest.TestCase):
    def test_define_all_reads_every_schema_under_disable(self):
        code = _library_code("kwheel-test-plain-all") + (
            "library.declare('bad(Tensor x) -> int', kernel='k', shape=None, launch=None)\n"
            "try:\n"
            "    library.define_all()\n"
            "except ValueError as error:\n"
            "    print(library.compile_wrap, error)\n"
        )
        out = python_output(code, KWHEEL_TEST_PLAIN_ALL_COMPILE_WRAP="disable")
        self.assertEqual(out.strip(), "False `bad(Tensor x) -> int`: an op returns one or more Tensors")

    def test_disable_defines_no_operator(self):
        code = _library_code("kwheel-test-plain") + (
            "op = library.define('double(Tensor x) -> Tensor', kernel='k', "
            "shape=lambda x: [(x.shape, x.dtype)], launch=None, reference=lambda x: x * 2)\n"
            "print(library.compile_wrap, type(op).__name__, op.__name__)\n"
            "print(op(torch.ones(2), ).tolist())\n"
            "print(hasattr(torch.ops.kwheel_test_plain, 'double'))\n"
        )
        out = python_output(code, KWHEEL_TEST_PLAIN_COMPILE_WRAP="disable")
        self.assertEqual(out.splitlines(), ["False function double", "[2.0, 2.0]", "False"])
        out = python_output(code)
        self.assertEqual(out.splitlines()[0], "True OpOverload double.default")
        self.assertEqual(out.splitlines()[2], "True")

    def test_an_unknown_value_is_refused_naming_the_variable(self):
        code = (
            "import kwheel.torch as kt\n"
            "class R:\n"
            "    package = 'kwheel-test-bad'\n"
            "kt.Library(R())\n"
        )
        status, _, err = run_python(code, KWHEEL_TEST_BAD_COMPILE_WRAP="off")
        self.assertNotEqual(status, 0)
        self.assertIn(
            "ValueError: KWHEEL_TEST_BAD_COMPILE_WRAP='off': expected `disable` (plain Python "
            "calls, a graph break at each op) or `enable` (the default)",
            err,
        )


@unittest.skipUnless(HAS_TORCH, NO_TORCH)
class Loading(unittest.TestCase):
    def test_a_kernel_loads_once_per_device_across_threads(self):
        registry = StubRegistry("kwheel-test-threads", constants={"BLOCK_SIZE": 64})
        kernel = kt.LazyKernel(registry, "double")
        barrier = threading.Barrier(8)
        results = []

        def first_use(device):
            barrier.wait()
            results.append(kernel.get(device))

        threads = [threading.Thread(target=first_use, args=(index % 2,)) for index in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        # Each device asked for by its own ordinal, once.
        self.assertEqual(sorted(registry.loads), [("double", 0), ("double", 1)])
        self.assertEqual(kernel.label(1), "kwheel:double cu130/sm_90a prebuilt 0123456789ab cuda:1")
        functions, constants = results[0]
        self.assertEqual(constants, {"BLOCK_SIZE": 64})
        self.assertEqual(functions[None], ("function", "double", "double"))

    def test_a_failed_load_raises_the_loaders_error_and_tries_again(self):
        error = kwheel.NoGpuError("no CUDA driver: libcuda.so.1 not found")
        registry = StubRegistry("kwheel-test-fail", error=error)
        kernel = kt.LazyKernel(registry, "double")
        for _ in range(2):
            with self.assertRaises(kwheel.NoGpuError) as raised:
                kernel.get(0)
            self.assertIs(raised.exception, error)
        self.assertEqual(registry.loads, [("double", 0), ("double", 0)])


def cpu_alignment(test):
    """Plans tell alignments apart up to what a CPU's allocator guarantees (64 bytes, where
    CUDA's places every block at 512): CPU tensors of one shape then share a plan as CUDA
    tensors do."""
    for module in (_plans, _op):  # the plan's key (`Op._run`) and the probe read it
        test.addCleanup(setattr, module, "_ALIGNMENT", module._ALIGNMENT)
        module._ALIGNMENT = 64


class RecordingFunction:
    """A kernel entry whose launch records what it was given."""

    def __init__(self):
        self.launches = []
        self.options = []

    def launch(self, grid, block, args, shared_mem, stream, **options):
        self.launches.append((grid, block, list(args), shared_mem, stream))
        self.options.append(options)


@unittest.skipUnless(HAS_TORCH, NO_TORCH)
class Launching(unittest.TestCase):
    """The CUDA implementation's bookkeeping, on CPU tensors (device -1) with a recording
    kernel: what it passes to `launch`, and which calls reuse a launch plan."""

    def setUp(self):
        self.function = RecordingFunction()
        self.calls = []
        cpu_alignment(self)

    def op(self, launch):
        library = kt.Library(StubRegistry(f"kwheel-test-{self._testMethodName}"))

        def shape(x, scale):
            self.calls.append(tuple(x.shape))
            return [(x.shape, x.dtype)]

        library.define("f(Tensor x, float scale) -> Tensor", kernel="f", shape=shape, launch=launch)
        op = library.ops["f"]
        op.kernel._loaded[-1] = ({None: self.function, "f": self.function}, {"BLOCK_SIZE": 4})
        return op

    def test_tensors_go_as_pointers_and_a_plan_serves_the_same_shapes(self):
        def launch(constants, outputs, x, scale):
            block = constants["BLOCK_SIZE"]
            return kt.Launch(kt.ceil_div(x.numel(), block), block, [outputs[0], x, x.numel(), scale])

        op = self.op(launch)
        x = torch.ones(3, 5)
        first = op.cuda(x, 2.0)
        second = op.cuda(x.t().contiguous().t(), 2.0)  # non-contiguous: copied first
        other = op.cuda(torch.ones(2, 2), 2.0)
        self.assertEqual(self.calls, [(3, 5), (2, 2)])  # the second call reused the plan
        grid, block, args, shared_mem, stream = self.function.launches[0]
        # Stream None: the runtime launches on torch's current stream of the function's device.
        self.assertEqual((grid, block, shared_mem, stream), (4, 4, 0, None))
        self.assertEqual(args, [first.data_ptr(), x.data_ptr(), 15, 2.0])
        self.assertNotEqual(self.function.launches[1][2][1], x.data_ptr())
        self.assertEqual(self.function.launches[2][2], [other.data_ptr(), self.function.launches[2][2][1], 4, 2.0])
        self.assertEqual((first.shape, second.shape), (x.shape, x.shape))

    def test_a_launch_with_a_tensor_of_its_own_is_never_cached(self):
        def launch(constants, outputs, x, scale):
            ones = x.new_ones(x.shape)
            return kt.Launch(1, 4, [outputs[0], ones, x.numel(), scale])

        op = self.op(launch)
        x = torch.ones(3, 5)
        op.cuda(x, 1.0)
        op.cuda(x, 1.0)
        # Once per call: the first call's plan is not kept, and it allocated its outputs once.
        self.assertEqual(self.calls, [(3, 5), (3, 5)])
        self.assertEqual(len(self.function.launches), 2)

    def test_a_kept_tensor_is_planned_and_its_pointer_passed_again(self):
        table = torch.arange(4.0)

        def launch(constants, outputs, x, scale):
            return kt.Launch(1, 4, [outputs[0], kt.Kept(table), x.numel(), scale])

        op = self.op(launch)
        x = torch.ones(3, 5)
        first = op.cuda(x, 1.0)
        second = op.cuda(x, 1.0)
        self.assertEqual(self.calls, [(3, 5)])  # planned on the first call, reused after
        self.assertEqual(
            [args for _, _, args, _, _ in self.function.launches],
            [[first.data_ptr(), table.data_ptr(), 15, 1.0], [second.data_ptr(), table.data_ptr(), 15, 1.0]],
        )

    def test_a_plan_miss_launches_the_outputs_it_returns(self):
        def launch(constants, outputs, x, scale):
            return kt.Launch(1, 4, [outputs[0], x, x.numel(), scale])

        op = self.op(launch)
        for _ in range(2):
            out = op.cuda(torch.ones(2, 3), 1.0)
            self.assertEqual(self.function.launches[-1][2][0], out.data_ptr())


    def test_outputs_are_allocated_like_an_input_of_their_shape_or_anew(self):
        library = kt.Library(StubRegistry("kwheel-test-allocations"))
        library.define(
            "pair(Tensor x, Tensor y) -> (Tensor, Tensor)",
            kernel="pair",
            shape=lambda x, y: [(y.shape, y.dtype), ((x.shape[0], 2), torch.float64)],
            launch=lambda constants, outputs, x, y: kt.Launch(1, 4, [outputs[0], outputs[1], x, y]),
        )
        op = library.ops["pair"]
        op.kernel._loaded[-1] = ({None: self.function}, {})
        x = torch.ones(3, 5)
        y = torch.ones(4, 2, dtype=torch.bfloat16).t()  # not contiguous: copied first
        for _ in range(2):  # a plan miss, then a hit
            first, second = op.cuda(x, y)
            self.assertEqual((first.shape, first.dtype), (torch.Size([2, 4]), torch.bfloat16))
            self.assertEqual((second.shape, second.dtype), (torch.Size([3, 2]), torch.float64))
            self.assertTrue(first.is_contiguous() and second.is_contiguous())
            self.assertEqual(self.function.launches[-1][2][:2], [first.data_ptr(), second.data_ptr()])
        self.assertEqual(len(op._plans), 1)

    def test_defaults_the_dispatcher_leaves_out_reach_the_launch(self):
        library = kt.Library(StubRegistry("kwheel-test-trailing"))
        library.define(
            "f(Tensor x, float scale=2.5, int? n=None) -> Tensor",
            kernel="f",
            shape=lambda x, scale, n: [(x.shape, x.dtype)],
            launch=lambda constants, outputs, x, scale, n: kt.Launch(1, 4, [outputs[0], x, scale, n]),
        )
        op = library.ops["f"]
        op.kernel._loaded[-1] = ({None: self.function}, {})
        x = torch.ones(3)
        op.cuda(x)
        op.cuda(x, 2.5)
        op.cuda(x, 1.0, 3)
        self.assertEqual([args[2:] for _, _, args, _, _ in self.function.launches], [[2.5, None], [2.5, None], [1.0, 3]])
        self.assertEqual(len(op._plans), 2)  # the first two are one call
        with self.assertRaises(TypeError) as raised:
            op.cuda()
        self.assertEqual(
            str(raised.exception),
            "kwheel_test_trailing::f(): takes 3 arguments (x, scale, n), got 0",
        )


@unittest.skipUnless(HAS_TORCH, NO_TORCH)
class PlansNeverGoStale(unittest.TestCase):
    """A launch plan keeps only what does not depend on where the tensors are: a later call
    with other tensors of the same shapes must launch with its own addresses."""

    def setUp(self):
        self.entries = {name: RecordingFunction() for name in ("f", "vector", "scalar")}
        self.launch_calls = 0
        cpu_alignment(self)

    def op(self, launch, name=""):
        library = kt.Library(StubRegistry(f"kwheel-test-{self._testMethodName}{name}"))

        def counted(constants, outputs, x, scale):
            self.launch_calls += 1
            return launch(constants, outputs, x, scale)

        library.define(
            "f(Tensor x, float scale) -> Tensor",
            kernel="f",
            shape=lambda x, scale: [(x.shape, x.dtype)],
            launch=counted,
        )
        op = library.ops["f"]
        functions = {None: self.entries["f"], **self.entries}
        op.kernel._loaded[-1] = (functions, {"BLOCK_SIZE": 4})
        return op

    def launched(self, entry="f"):
        return [args for _, _, args, _, _ in self.entries[entry].launches]

    def test_a_struct_holding_pointers_is_written_with_each_calls_addresses(self):
        import struct

        def launch(constants, outputs, x, scale):
            params = struct.pack("<QQqd", x.data_ptr(), outputs[0].data_ptr(), x.numel(), scale)
            return kt.Launch(1, 4, [params])

        op = self.op(launch)
        for _ in range(3):
            x = torch.randn(3, 5)
            out = op.cuda(x, 2.0)
            expected = struct.pack("<QQqd", x.data_ptr(), out.data_ptr(), 15, 2.0)
            self.assertEqual(bytes(self.launched()[-1][0]), expected)
        # Planned once (the launch function ran on the tensors and on their stand-ins).
        self.assertEqual(self.launch_calls, 2)

    def test_a_ctypes_struct_holding_pointers_is_written_with_each_calls_addresses(self):
        import ctypes

        class Params(ctypes.Structure):
            _fields_ = [
                ("batch", ctypes.c_int32),  # padding follows: the pointer sits at offset 8
                ("x_ptr", ctypes.c_void_p),
                ("row_end", ctypes.c_void_p),
                ("out_ptr", ctypes.c_void_p),
            ]

        def launch(constants, outputs, x, scale):
            params = Params(x.shape[0], x.data_ptr(), x.data_ptr() + x.shape[1] * 4, outputs[0].data_ptr())
            return kt.Launch(1, 4, [params])

        op = self.op(launch)
        for _ in range(3):
            x = torch.randn(3, 5)
            out = op.cuda(x, 1.0)
            sent = Params.from_buffer_copy(bytes(self.launched()[-1][0]))
            self.assertEqual(
                (sent.batch, sent.x_ptr, sent.row_end, sent.out_ptr),
                (3, x.data_ptr(), x.data_ptr() + 20, out.data_ptr()),
            )

    def test_a_pointer_passed_as_an_int_follows_its_tensor(self):
        def launch(constants, outputs, x, scale):
            return kt.Launch(1, 4, [outputs[0].data_ptr(), x.data_ptr() + 4, x.numel()])

        op = self.op(launch)
        for _ in range(3):
            x = torch.randn(6)
            out = op.cuda(x, 1.0)
            self.assertEqual(self.launched()[-1], [out.data_ptr(), x.data_ptr() + 4, 6])
        self.assertEqual(self.launch_calls, 2)

    def test_an_entry_chosen_by_the_alignment_of_a_pointer_is_chosen_per_call(self):
        def launch(constants, outputs, x, scale):
            entry = "vector" if x.data_ptr() % 16 == 0 else "scalar"
            return kt.Launch(1, 4, [outputs[0], x], entry=entry)

        op = self.op(launch)
        aligned = torch.randn(8)
        misaligned = torch.randn(9)[1:]  # contiguous, 4 bytes past an aligned address
        self.assertEqual((aligned.data_ptr() % 16, misaligned.data_ptr() % 16), (0, 4))
        op.cuda(aligned, 1.0)
        op.cuda(misaligned, 1.0)
        op.cuda(torch.randn(8), 1.0)
        op.cuda(misaligned, 1.0)
        self.assertEqual(len(self.launched("vector")), 2)
        self.assertEqual([args[1] for args in self.launched("scalar")], [misaligned.data_ptr()] * 2)

    def test_an_address_transformed_otherwise_runs_the_launch_function_every_call(self):
        def launch(constants, outputs, x, scale):
            return kt.Launch(1, 4, [outputs[0], x.data_ptr() >> 4])

        op = self.op(launch)
        for _ in range(3):
            x = torch.randn(8)
            op.cuda(x, 1.0)
            self.assertEqual(self.launched()[-1][1], x.data_ptr() >> 4)
        # The first call ran it on the stand-ins too, found it moved, and kept no plan.
        self.assertEqual(self.launch_calls, 4)

    def test_a_tensor_map_is_made_again_on_every_call(self):
        # A map holding the address as a plain word would be relocatable like a struct; its
        # type says it is the driver's encoding, so the plan keeps none.
        def launch(constants, outputs, x, scale):
            encoded = kwheel.TensorMap(x.data_ptr().to_bytes(8, "little") + bytes(120))
            return kt.Launch(1, 4, [outputs[0], encoded])

        op = self.op(launch)
        for _ in range(3):
            x = torch.randn(8)
            op.cuda(x, 1.0)
            self.assertEqual(bytes(self.launched()[-1][1])[:8], x.data_ptr().to_bytes(8, "little"))
        self.assertEqual(self.launch_calls, 4)

    def test_an_address_two_tensors_could_explain_is_its_own_tensors(self):
        # Two tensors as far apart as their stand-ins: the field of `y`'s address fits `x`
        # plus that distance too, which holds only as long as the allocator repeats itself.
        probe = _plans._Probe.__new__(_plans._Probe)
        size = 64 * 4
        probe.real = [(1 << 20, size, _plans._INPUT, 0), ((1 << 20) + 4096, size, _plans._INPUT, 1)]
        probe.moved = [(3 << 20, size, _plans._INPUT, 0), ((3 << 20) + 4096, size, _plans._INPUT, 1)]
        self.assertEqual(probe._address((1 << 20) + 4096 + 8, (3 << 20) + 4096 + 8), (_plans._INPUT, 1, 8))
        self.assertEqual(probe._address(1 << 20, 3 << 20), (_plans._INPUT, 0, 0))
        # Past both ends and matching both: no tensor is its own, no plan is kept.
        self.assertIsNone(probe._address((1 << 20) + 8192, (3 << 20) + 8192))

    def test_launch_attributes_reach_every_launch_planned_or_not(self):
        def launch(constants, outputs, x, scale):
            return kt.Launch((4, 2), 128, [outputs[0], x], shared_mem=100 << 10, cluster=(2, 1, 1), programmatic=True)

        op = self.op(launch)
        for _ in range(3):
            op.cuda(torch.randn(8), 1.0)
        self.assertEqual(self.launch_calls, 2)  # planned once
        self.assertEqual(self.entries["f"].options, [{"cluster": (2, 1, 1), "programmatic": True}] * 3)
        self.assertEqual([launch[3] for launch in self.entries["f"].launches], [100 << 10] * 3)
        self.assertIsNone(kt.Launch(1, 1, []).options)
        self.assertEqual(kt.Launch(1, 1, [], cooperative=True, priority=-1).options, {"cooperative": True, "priority": -1})

    def test_tensors_too_large_to_place_twice_keep_only_launches_without_addresses(self):
        import struct

        self.addCleanup(setattr, _plans, "_PROBE_BYTES", _plans._PROBE_BYTES)
        _plans._PROBE_BYTES = 16

        def plain(constants, outputs, x, scale):
            return kt.Launch(1, 4, [outputs[0], x, x.numel(), scale])

        op = self.op(plain)
        for _ in range(2):
            op.cuda(torch.randn(8), 1.0)
        self.assertEqual(self.launch_calls, 1)  # kept, with no second run

        self.launch_calls = 0

        def addressed(constants, outputs, x, scale):
            return kt.Launch(1, 4, [struct.pack("<Q", x.data_ptr())])

        op = self.op(addressed, "-addressed")
        for _ in range(2):
            x = torch.randn(8)
            op.cuda(x, 1.0)
            self.assertEqual(bytes(self.launched()[-1][0]), struct.pack("<Q", x.data_ptr()))
        self.assertEqual(self.launch_calls, 2)


@unittest.skipUnless(HAS_TORCH, NO_TORCH)
class Autograd(unittest.TestCase):
    """Both Autograd kernels, on the CPU reference: the light one of the torch releases it was
    checked on, and torch.library.register_autograd's everywhere else."""

    def op(self, light):
        if not light:
            checked = kt.LIGHT_AUTOGRAD_TORCH
            kt.LIGHT_AUTOGRAD_TORCH = ()
            self.addCleanup(setattr, kt, "LIGHT_AUTOGRAD_TORCH", checked)
        library = kt.Library(StubRegistry(f"kwheel-test-autograd-{'light' if light else 'public'}"))
        op = library.define(
            "scaled(Tensor x, float scale=3.0) -> Tensor",
            kernel="scaled",
            shape=lambda x, scale: [(x.shape, x.dtype)],
            launch=None,
            reference=lambda x, scale: x * scale,
        )
        seen = []

        def setup_context(ctx, inputs, output):
            seen.append(len(inputs))
            ctx.scale = inputs[1]

        def backward(ctx, grad):
            return grad * ctx.scale, None

        library.autograd(op, backward, setup_context)
        return op, seen

    def test_gradients_and_opcheck_through_either_kernel(self):
        for light in (True, False):
            with self.subTest(light=light):
                op, seen = self.op(light)
                x = torch.randn(4, 3, requires_grad=True)
                op(x).sum().backward()
                self.assertEqual(x.grad.tolist(), [[3.0] * 3] * 4)
                self.assertEqual(seen, [2])  # the dispatcher's left-out default filled in
                with torch.no_grad():
                    self.assertEqual(op(x, 2.0).tolist(), (x * 2).tolist())
                torch.library.opcheck(op, (torch.randn(4, 3, requires_grad=True), 0.5))

    def test_the_light_kernel_is_used_only_on_checked_releases(self):
        release = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
        self.assertEqual(_op._torch_release(), release)
        self.assertEqual(_op._torch_release() in kt.LIGHT_AUTOGRAD_TORCH, release == (2, 11))


@unittest.skipUnless(HAS_TORCH, NO_TORCH)
class Fallback(unittest.TestCase):
    """The CUDA implementation's choice between the kernel and the reference, reached
    directly: on a CPU there is no CUDA tensor to dispatch on."""

    MESSAGE = (
        "no prebuilt variant of `double` fits device sm_120 (compute 12.0), CUDA build cu130, "
        "driver 13.0, and the JIT fallback is disabled (KWHEEL_TEST_JIT_FALLBACK=0)"
    )

    def op(self, namespace, fallback):
        registry = StubRegistry(namespace, error=kwheel.NoFitError(self.MESSAGE))
        library = kt.Library(registry)
        _define_double(library, fallback=fallback)
        return library.ops["double"]

    def test_no_fit_runs_the_reference_with_one_warning(self):
        op = self.op("kwheel-test-fallback", fallback=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            first = op.cuda(torch.ones(3))
            second = op.cuda(torch.ones(3))
        self.assertEqual(first.tolist(), [2.0] * 3)
        self.assertEqual(second.tolist(), [2.0] * 3)
        self.assertEqual(len(caught), 1)
        self.assertIs(caught[0].category, kt.FallbackWarning)
        self.assertEqual(
            str(caught[0].message),
            f"kwheel_test_fallback::double on cpu runs its torch reference: {self.MESSAGE}",
        )

    def test_the_warning_as_an_error_refuses(self):
        op = self.op("kwheel-test-strict", fallback=True)
        with warnings.catch_warnings():
            warnings.simplefilter("error", kt.FallbackWarning)
            with self.assertRaises(kt.FallbackWarning):
                op.cuda(torch.ones(3))

    def test_without_fallback_the_no_fit_error_is_raised_as_is(self):
        op = self.op("kwheel-test-refuse", fallback=False)
        with self.assertRaises(kwheel.NoFitError) as raised:
            op.cuda(torch.ones(3))
        self.assertEqual(str(raised.exception), self.MESSAGE)


class RecordingNvtx:
    """`torch.cuda.nvtx.range_push`/`range_pop` replaced, recording each call in order."""

    def __init__(self, test):
        self.calls = []
        nvtx = torch.cuda.nvtx
        push, pop = nvtx.range_push, nvtx.range_pop
        nvtx.range_push = lambda message: self.calls.append(("push", message))
        nvtx.range_pop = lambda: self.calls.append(("pop",))
        test.addCleanup(setattr, nvtx, "range_push", push)
        test.addCleanup(setattr, nvtx, "range_pop", pop)


def profiled(call):
    """The names of the events a CPU torch.profiler run of `call` records, and its result."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        result = call()
    return [event.name for event in profile.events()], result


LABEL = "kwheel:f cu130/sm_90a prebuilt 0123456789ab cuda:-1"


@unittest.skipUnless(HAS_TORCH, NO_TORCH)
class Tracing(unittest.TestCase):
    """The ranges an op's launches are marked with: none while no profiler runs and
    `<PACKAGE>_TRACE` is off, one per launch, named after the binary, while a profiler runs
    (torch.profiler's events, read back) or the variable is on (NVTX calls, captured)."""

    def setUp(self):
        self.nvtx = RecordingNvtx(self)
        self.function = RecordingFunction()

    def op(self, trace=False):
        library = kt.Library(StubRegistry(f"kwheel-test-{self._testMethodName}"))
        library.trace = trace

        def launch(constants, outputs, x):
            return kt.Launch(1, 4, [outputs[0], x, x.numel()])

        library.define("f(Tensor x) -> Tensor", kernel="f", shape=_double_shape, launch=launch)
        op = library.ops["f"]
        # CPU tensors are device -1: the kernel of that "device" is a recording one.
        op.kernel._loaded[-1] = ({None: self.function}, {"BLOCK_SIZE": 4})
        op.kernel._labels[-1] = LABEL
        return op

    def test_off_nothing_is_marked(self):
        op = self.op()
        for _ in range(3):  # a plan miss, then plan hits
            op.cuda(torch.ones(3))
        self.assertEqual(self.nvtx.calls, [])
        self.assertEqual(len(self.function.launches), 3)

    def test_the_variable_marks_every_launch_with_an_nvtx_range(self):
        op = self.op(trace=True)
        op.cuda(torch.ones(3))  # plan miss
        op.cuda(torch.ones(3))  # plan hit
        op.cuda(torch.ones(5))  # another shape: a miss again
        self.assertEqual(self.nvtx.calls, [("push", LABEL), ("pop",)] * 3)
        self.assertEqual(len(self.function.launches), 3)

    def test_a_running_profiler_shows_one_range_per_launch_named_after_the_binary(self):
        op = self.op()
        events, _ = profiled(lambda: [op.cuda(torch.ones(3)) for _ in range(3)])
        self.assertEqual(events.count(LABEL), 3, events)
        self.assertEqual(self.nvtx.calls, [("push", LABEL), ("pop",)] * 3)
        # The profiler stopped: unmarked again.
        op.cuda(torch.ones(3))
        self.assertEqual(len(self.nvtx.calls), 6)

    def test_the_range_closes_when_the_launch_raises(self):
        op = self.op(trace=True)

        def refuse(*args):
            raise kwheel.ArgumentError("argument 2 of `f` is a float, but parameter 2 is 8 bytes")

        self.function.launch = refuse
        with self.assertRaises(kwheel.ArgumentError):
            op.cuda(torch.ones(3))
        self.assertEqual(self.nvtx.calls, [("push", LABEL), ("pop",)])

    def test_a_fallback_is_marked_and_listed_as_such(self):
        message = "no prebuilt variant of `double` fits device 3 (sm_120, compute 12.0)"
        library = kt.Library(
            StubRegistry("kwheel-test-trace-fallback", error=kwheel.NoFitError(message))
        )
        _define_double(library, kernel="double_fallback_kernel", fallback=True)
        op = library.ops["double"]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", kt.FallbackWarning)
            events, out = profiled(lambda: op.cuda(torch.ones(3)))
        self.assertEqual(out.tolist(), [2.0] * 3)
        label = "kwheel:double_fallback_kernel reference fallback - cuda:-1"
        self.assertIn(label, events)
        listed = [entry for entry in kwheel.provenance() if entry["kernel"] == "double_fallback_kernel"]
        self.assertEqual(
            listed,
            [
                {
                    "package": "kwheel-test-trace-fallback",
                    "bundle": None,
                    "kernel": "double_fallback_kernel",
                    "device": -1,
                    "variant": "reference",
                    "source": "fallback",
                    "key": "",
                    "reason": message,
                    "label": label,
                }
            ],
        )

    def test_trace_range_marks_both_and_nests(self):
        def run():
            with kwheel._trace_range("outer"):
                with kwheel._trace_range("inner"):
                    pass

        events, _ = profiled(run)
        self.assertEqual([name for name in events if name in ("outer", "inner")], ["outer", "inner"])
        self.assertEqual(
            self.nvtx.calls,
            [("push", "outer"), ("push", "inner"), ("pop",), ("pop",)],
        )

    def test_the_variable_is_read_when_the_library_is_made(self):
        code = (
            "import kwheel.torch as kt\n"
            "class R:\n"
            "    package = 'kwheel-test-trace-env'\n"
            "print(kt.Library(R()).trace)\n"
        )
        for value, expected in (("1", "True"), ("on", "True"), ("0", "False"), ("", "False")):
            out = python_output(code, KWHEEL_TEST_TRACE_ENV_TRACE=value)
            self.assertEqual(out.strip(), expected, value)

    def test_labels_and_the_variable_come_from_the_runtime(self):
        self.assertEqual(
            kwheel._kwheel.trace_label("layernorm_bf16", "cu130/sm_90a", "prebuilt", "ab" * 32, 1),
            f"kwheel:layernorm_bf16 cu130/sm_90a prebuilt {'ab' * 6} cuda:1",
        )
        self.assertEqual(kwheel._kwheel.trace_variable("af3-kernels"), "AF3_KERNELS_TRACE")


class WithoutTorch(unittest.TestCase):
    def test_a_trace_range_without_torch_does_nothing(self):
        out = python_output(
            "import sys, kwheel\n"
            "with kwheel._trace_range('x'):\n"
            "    pass\n"
            "print('torch' in sys.modules, kwheel.provenance())\n"
        )
        self.assertEqual(out.split(), ["False", "[]"])


if __name__ == "__main__":
    unittest.main()
