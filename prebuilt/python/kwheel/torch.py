"""kwheel kernels as PyTorch operators: one declaration per op, no C++ and no CUDA host code.

A kernel library declares each op once, from its own package, with a schema, the kernel, a
shape function and a launch function (docs/torch.md has one in full; ``af3_kernels/ops.py``
declares seven).

``define`` registers a ``torch.library`` operator ``<namespace>::<name>`` with

- a CUDA implementation that allocates the outputs with torch (so inside a CUDA graph capture
  they come from the graph's pool), and launches the kernel on torch's current stream of the
  inputs' device: no host synchronization, no memory of kwheel's own;
- a Meta kernel built from the same shape function, which FakeTensorMode runs for fake
  tensors, so ``torch.compile`` traces through the op and keeps one graph;
- the torch reference, when given, as the CPU implementation (and, with ``fallback=True``, on
  CUDA where no prebuilt variant fits and the JIT is disabled);

and returns the operator overload, callable with the schema's arguments. ``declare`` defines
nothing: ``lookup`` returns the op's ``Call``, which launches the kernel straight from Python
when nothing needs the dispatcher (no gradient, tracer, mode, transform or profiler; plain CUDA
tensors) and defines the operator with torch on the first call that does, or while
``torch.compile`` traces it, so that an import declaring many ops defines none and a plain
eager call costs no dispatch. Only
public ``torch.library`` calls register it (``Library.define`` and ``Library.impl``);
``read_schema`` reads the schema for kwheel's own use, and what has no public API is in
``kwheel/_torch_private.py``. ``autograd`` attaches a backward made of other ops (with
``torch.library.register_autograd``'s contract).

The kernel loads on the op's first CUDA call on each device (the device of the op's first
tensor argument, whatever the current device is), once per process and device, under a lock,
selected for that GPU; it launches on that device's current stream. The loader's errors
(``NoFitError``, ``NoGpuError``, a failed JIT compile) are raised there with the loader's own
messages.

While a torch profiler runs, or always under ``<PACKAGE>_TRACE=1`` (read when the library is
created), each launch is marked with a ``record_function`` and an NVTX range named after the
binary that ran: ``kwheel:<kernel> <variant> <source> <key, 12 digits> cuda:<device>``
(``kwheel.provenance()`` lists the same facts; docs/provenance.md). Otherwise a call pays one
check for it. ``<NAMESPACE>_COMPILE_WRAP=disable`` (read when the library is created,
normally at import) registers nothing: ops become plain Python functions, and
``torch.compile`` breaks its graph at each of them. Only importable where torch is; ``import
kwheel`` itself never imports torch. See docs/torch.md.
"""

import ast
import inspect
import os
import threading
import types
import warnings

import torch

from . import NoFitError, TensorMap, _kwheel, _note_fallback, _trace_range
from ._torch_private import PROFILER as _PROFILER
from ._torch_private import intercepted as _intercepted
from ._torch_private import light_autograd as _light_autograd

# Dynamo knows the function, not its name: under `torch.compile` this is True.
_is_compiling = torch.compiler.is_compiling
# The tensor types a direct call takes: a parameter disables `__torch_function__` as a
# tensor does, so either is the plain tensor the dispatcher would hand the kernel.
_PLAIN = frozenset((torch.Tensor, torch.nn.Parameter))

__all__ = [
    "FallbackWarning",
    "Kept",
    "Launch",
    "Library",
    "Op",
    "read_schema",
    "ceil_div",
    "library",
]

class Launch(tuple):
    """What a launch function returns: the grid and block (an int or a tuple of up to three),
    the kernel's arguments in parameter order (tensors are passed as their device pointers; a
    ``ctypes.Structure`` or ``bytes`` as its bytes), the entry (``None`` for a kernel with
    one) and the dynamic shared memory in bytes (above 48 KB the entry's limit is raised up to
    what the device allows); then, by keyword, the launch attributes of ``Kernel.launch``:
    ``cluster`` (thread block cluster dimensions), ``cooperative``, ``programmatic``
    (programmatic dependent launch) and ``priority``, kept in ``options``. A tuple of the
    first five, as a namedtuple would be (made by hand: ``collections.namedtuple`` costs a
    third of a millisecond at import), so ``grid, block, args, entry, shared_mem = launch``
    still reads one."""

    _fields = ("grid", "block", "args", "entry", "shared_mem")

    def __new__(cls, grid, block, args, entry=None, shared_mem=0, *, cluster=None,
                cooperative=False, programmatic=False, priority=None):
        launch = tuple.__new__(cls, (grid, block, args, entry, shared_mem))
        options = {
            name: value
            for name, value, default in zip(
                _OPTION_NAMES, (cluster, cooperative, programmatic, priority), _NO_OPTIONS
            )
            if value != default
        }
        #: The launch attributes asked for, as ``Kernel.launch``'s keywords, or ``None``.
        launch.options = options or None
        return launch

    grid = property(lambda self: self[0])
    block = property(lambda self: self[1])
    args = property(lambda self: self[2])
    entry = property(lambda self: self[3])
    shared_mem = property(lambda self: self[4])
    cluster = property(lambda self: (self.options or {}).get("cluster"))
    cooperative = property(lambda self: (self.options or {}).get("cooperative", False))
    programmatic = property(lambda self: (self.options or {}).get("programmatic", False))
    priority = property(lambda self: (self.options or {}).get("priority"))

    def __repr__(self):
        fields = [f"{name}={value!r}" for name, value in zip(self._fields, self)]
        fields += [f"{name}={value!r}" for name, value in (self.options or {}).items()]
        return f"Launch({', '.join(fields)})"


# The launch attributes of `Launch` and their defaults, in order.
_OPTION_NAMES = ("cluster", "cooperative", "programmatic", "priority")
_NO_OPTIONS = (None, False, False, None)


class Constants(dict):
    """The kernel's exported constants, as the ``constants`` a launch function gets, with
    ``computed``: the constants the compiler computed on the loaded variant (the manifest's
    ``computed``), by entry (``constants.computed["conv<Traits<128>>"]["smem"]``)."""

    def __init__(self, constants, computed):
        super().__init__(constants)
        self.computed = computed


class Kept:
    """A kernel argument tensor that is neither an input nor an output and that the launch
    function keeps, unchanged, for as long as the op is used (default weights, a table): a
    launch plan keeps it too and passes its pointer again. A plain tensor of the launch
    function's own making is passed as is, and such a launch is run on every call."""

    __slots__ = ("tensor",)

    def __init__(self, tensor):
        self.tensor = tensor

    def __repr__(self):
        return f"kwheel.torch.Kept({self.tensor!r})"


class FallbackWarning(UserWarning):
    """An op runs its torch reference because no prebuilt variant of its kernel fits this
    device and the JIT is disabled. Turn it into an error to refuse instead:
    ``warnings.simplefilter("error", kwheel.torch.FallbackWarning)``."""


def ceil_div(numerator, denominator):
    """The number of blocks of ``denominator`` that cover ``numerator``."""
    return -(-numerator // denominator)


_LIBRARIES = {}
_LIBRARIES_LOCK = threading.Lock()


def library(registry, *, namespace=None, fallback=False):
    """The ``Library`` of a kernel library's registry, one per namespace in a process (a second
    call returns the first one). ``namespace``: default the registry's package with ``-`` as
    ``_`` (``af3-kernels`` → ``af3_kernels``)."""
    namespace = namespace or _namespace_of(registry)
    with _LIBRARIES_LOCK:
        existing = _LIBRARIES.get(namespace)
        if existing is None:
            existing = _LIBRARIES[namespace] = Library(registry, namespace=namespace, fallback=fallback)
        elif existing.registry is not registry:
            raise ValueError(
                f"the torch namespace `{namespace}` is already taken by the kernels of "
                f"{existing.registry!r}; pass namespace= to use another"
            )
        return existing


def _namespace_of(registry):
    package = getattr(registry, "package", None)
    if not package:
        raise ValueError(f"{registry!r} names no package: pass namespace=")
    return package.replace("-", "_").replace(".", "_")


def _compile_wrap(namespace):
    """Whether ops are ``torch.library`` operators: ``<NAMESPACE>_COMPILE_WRAP``, unset or
    ``enable`` (yes) or ``disable`` (plain Python functions)."""
    variable = f"{namespace.upper()}_COMPILE_WRAP"
    value = os.environ.get(variable, "").strip().lower()
    if value in ("", "enable", "1"):
        return True
    if value in ("disable", "0"):
        return False
    raise ValueError(
        f"{variable}={os.environ[variable]!r}: expected `disable` (plain Python calls, a graph "
        "break at each op) or `enable` (the default)"
    )


class Library:
    """The ops of one kernel library under one ``torch.library`` namespace.

    ``registry``: the library's ``kwheel.Registry`` (``kwheel.open(__name__)``); ``namespace``:
    the torch namespace, default the registry's package; ``fallback``: the default of
    ``define``'s ``fallback``. Prefer ``kwheel.torch.library``, which keeps one per namespace.
    """

    def __init__(self, registry, *, namespace=None, fallback=False):
        self.registry = registry
        self.namespace = namespace or _namespace_of(registry)
        if not self.namespace.isidentifier():
            raise ValueError(f"`{self.namespace}` is not a valid torch namespace")
        self.fallback = fallback
        package = getattr(registry, "package", None) or self.namespace
        #: Whether every launch is marked in traces, a profiler running or not:
        #: ``<PACKAGE>_TRACE``, read here once.
        self.trace = _kwheel.trace_enabled(package)
        self.compile_wrap = _compile_wrap(self.namespace)
        self._torch_library = None  # made with the first operator it defines
        self._registering = threading.RLock()
        self._kernels = {}
        self._kernels_lock = threading.Lock()
        self.ops = {}
        #: The ops as ``torch.ops`` overloads, each defined on its first lookup (``_Overloads``).
        self.overloads = _Overloads(self)

    def __repr__(self):
        mode = "operators" if self.compile_wrap else "plain Python calls"
        return f"kwheel.torch.Library({self.namespace!r}, {len(self.ops)} ops, {mode})"

    def kernel(self, name):
        """The lazily loaded kernel ``name`` of the registry, shared by the ops that launch it."""
        with self._kernels_lock:
            found = self._kernels.get(name)
            if found is None:
                found = LazyKernel(self.registry, name)
                self._kernels[name] = found
            return found

    def define(self, schema, *, kernel, shape, launch, reference=None, fallback=None,
               inputs=None):
        """Declares op ``<namespace>::<name>``, defines it with torch now, and returns what to
        call. ``declare`` takes the same arguments and leaves torch's definition for the op's
        first ``lookup``.

        ``schema``: the operator schema without namespace, ``"name(Tensor x, ...) -> Tensor"``
        (functional: no aliasing or mutation). ``kernel``: the registry's kernel it launches.
        ``shape(*args)``: a list of ``(shape, dtype)``, one per output, computed from the
        arguments' shapes and dtypes only (it also runs on fake tensors). ``launch(constants,
        outputs, *args)``: a ``Launch`` from the kernel's exported constants (a dict, whose
        ``computed`` attribute holds the compiler's computed constants by entry), the allocated
        outputs and the arguments (tensors made contiguous). ``reference(*args)``: the same op
        in torch, the implementation for CPU tensors. ``fallback``: run ``reference`` on CUDA,
        with a ``FallbackWarning``, where the kernel has no fitting variant and the JIT is
        disabled (``NoFitError``); default the library's. ``inputs(*args)``: the kernel's
        manifest ``inputs`` as a dict (``{"rows": ..., "cols": ...}``) from the arguments: the
        op then refuses, with ``ValueError`` naming the op, the requirement and the values,
        arguments that break one of the kernel's ``requires``, on the first CUDA call with
        their shapes (the loaded variant's) and while tracing (the index's, no GPU).

        Returns the ``torch.ops`` overload (``torch.ops.<namespace>.<name>.default``), or, under
        ``<NAMESPACE>_COMPILE_WRAP=disable``, a plain function with the same arguments.
        """
        options = dict(kernel=kernel, shape=shape, launch=launch, reference=reference,
                       inputs=inputs)
        op = self.declare(schema, fallback=fallback, **options)
        try:
            op._read()
        except BaseException:
            del self.ops[op.name]  # refused whole: the name stays free
            raise
        return op.callable

    def declare(self, schema, *, kernel, shape, launch, reference=None, fallback=None,
                inputs=None):
        """As ``define``, but returns the ``Op`` and defines it with torch only when a call needs
        the dispatcher (or ``define_all``); its schema is read and checked on its first
        ``lookup`` (``ValueError`` there for one an op cannot have; text with no op name, or an
        overload's, is refused here): an import that declares many ops costs what keeping their
        arguments does."""
        if fallback is None:
            fallback = self.fallback
        if fallback and reference is None:
            raise ValueError(f"`{schema}`: fallback=True needs a reference")
        op = Op(self, schema, self.kernel(kernel), shape=shape, launch=launch,
                reference=reference, fallback=fallback, inputs=inputs)
        if op.name in self.ops:
            raise ValueError(f"`{self.namespace}::{op.name}` is already defined")
        self.ops[op.name] = op
        return op

    def lookup(self, name):
        """What to call for op ``name``: its ``Call``, which defines nothing with torch until a
        call needs the dispatcher (``Call.default`` is the ``torch.ops`` overload); under
        ``<NAMESPACE>_COMPILE_WRAP=disable``, the plain function. ``AttributeError`` for a name
        the library does not declare."""
        return self._declared(name).call

    def _declared(self, name):
        """The ``Op`` declared as ``name``; ``AttributeError`` for a name the library does not
        declare."""
        op = self.ops.get(name)
        if op is None:
            raise self._no_op(name)
        if not _is_compiling():
            # Not while dynamo traces: reading is Python it would break the graph at. A call
            # under `torch.compile` defines the op, which reads it then, outside the trace.
            op._read()
        return op

    def _no_op(self, name):
        return AttributeError(f"the library `{self.namespace}` declares no op `{name}`")

    def define_all(self):
        """Reads every declared op's schema and defines the op with torch (for a program that
        names ``torch.ops`` ops before it calls them, such as one loading a saved graph)."""
        for op in list(self.ops.values()):
            op._read()  # under COMPILE_WRAP=disable, `callable` exists before any read
            op.callable

    def _register(self, op):
        """Defines ``op`` with torch, once, with its Autograd kernel if it has a backward."""
        op._read()
        with self._registering:
            if op._callable is None:
                if self._torch_library is None:
                    self._torch_library = torch.library.Library(self.namespace, "DEF")
                overload = op.register(self._torch_library)
                if op.backward is not None:
                    op.register_autograd(self._torch_library, overload)
                # Published last: a call on another thread that reads it unlocked finds the
                # op whole, its Autograd kernel included.
                op._callable = overload

    def autograd(self, op, backward, setup_context):
        """Gives op (a name or what ``define`` returned) a backward: ``setup_context(ctx,
        inputs, output)`` saves what ``backward(ctx, *grads)`` needs; ``backward`` returns one
        gradient (or ``None``) per input, computed with other ops of the library, so the
        backward is kernels too. The contract of ``torch.library.register_autograd``; see
        ``Op.register_autograd`` for how it differs."""
        found = self._op(op)
        with self._registering:
            found.backward = (backward, setup_context)
            if not self.compile_wrap:
                found.use_autograd_function()
            elif found._callable is not None:  # defined already: else when it is
                found.register_autograd(self._torch_library)

    def _op(self, op):
        """The ``Op`` of a name, or of what ``define`` or ``declare`` returned."""
        if isinstance(op, Op):
            found = op if self.ops.get(op.name) is op else None
        elif isinstance(op, str):
            found = self.ops.get(op)
        else:
            found = next(
                (each for each in self.ops.values() if op is each._callable or op is each.call),
                None,
            )
        if found is None:
            raise ValueError(f"`{op!r}` is no op of the library `{self.namespace}`")
        return found


class LazyKernel:
    """One kernel of a registry, loaded on first use per device (``registry.load(name,
    device=ordinal)``), once per process, under a lock. ``get(device)`` returns ``(functions by
    entry, constants)``; a load that fails raises the loader's error, and the next call tries
    again. ``label(device)`` is the trace range name of what loaded there."""

    def __init__(self, registry, name):
        self.registry = registry
        self.name = name
        self._loaded = {}
        self._kernels = {}
        self._labels = {}
        self._lock = threading.Lock()

    def __repr__(self):
        return f"kwheel.torch.LazyKernel({self.name!r}, devices={sorted(self._loaded)})"

    def get(self, device):
        loaded = self._loaded.get(device)
        if loaded is not None:
            return loaded
        with self._lock:
            loaded = self._loaded.get(device)
            if loaded is None:
                loaded = self._load(device)
                self._loaded[device] = loaded
            return loaded

    def label(self, device):
        """The trace range name of the kernel loaded on ``device``."""
        found = self._labels.get(device)
        return found or _kwheel.trace_label(self.name, "unknown", "unknown", "", device)

    def _load(self, device):
        kernel = self.registry.load(self.name, device=device)
        entries = list(kernel.entries)
        functions = {entry: kernel.function(entry) for entry in entries}
        if len(entries) == 1:
            functions[None] = functions[entries[0]]
        self._labels[device] = kernel.trace_label
        self._kernels[device] = kernel
        return functions, Constants(kernel.constants, dict(kernel.computed))

    def unsupported_shape_reason(self, device, values):
        """Why the kernel loaded on ``device`` cannot run with ``values`` (its inputs), or
        None; without a loaded kernel there (a stand-in registry's), the registry's answer."""
        kernel = self._kernels.get(device)
        if kernel is not None:
            return kernel.unsupported_shape_reason(**values)
        answer = getattr(self.registry, "unsupported_shape_reason", None)
        return None if answer is None else answer(self.name, **values)


class Argument:
    """One argument of a schema: its name, its type as written (``Tensor?``, ``Tensor(a!)``)
    and its default, if it has one."""

    __slots__ = ("name", "type", "has_default", "default")

    def __init__(self, name, type, has_default, default):
        self.name, self.type, self.has_default, self.default = name, type, has_default, default


class Schema:
    """A schema as ``read_schema`` reads it: the name, the overload name (``""`` for the
    default overload), the ``Argument`` list, the return types, and whether a ``*`` made some
    arguments keyword-only."""

    __slots__ = ("name", "overload", "arguments", "returns", "keyword_only")

    def __init__(self, name, overload, arguments, returns, keyword_only):
        self.name, self.overload, self.arguments = name, overload, arguments
        self.returns, self.keyword_only = returns, keyword_only


def read_schema(text):
    """The name, arguments and returns of an operator schema, ``name(Type name=default, ...)
    -> Tensor``, read without torch: torch reads the same text again when it defines the
    operator and refuses what it cannot parse (a type it does not know, say). Raises
    ``ValueError`` for text that is no schema, or a default that is not a number, bool,
    ``None``, string or list."""
    name, overload, argument_text, returns_text = _schema_parts(text)
    arguments = []
    keyword_only = False
    for part in _split_top_level(argument_text):
        if part == "*":
            keyword_only = True
            continue
        declaration, equals, default = part.partition("=")
        pieces = declaration.split()
        if len(pieces) != 2:
            raise ValueError(f"`{text}`: cannot read the argument `{part}` (`Type name`)")
        argument_type, argument_name = pieces
        value = _read_default(text, argument_type, argument_name, default.strip()) if equals else None
        arguments.append(Argument(argument_name, argument_type, bool(equals), value))
    returns_text = returns_text.strip()
    if returns_text.startswith("(") and returns_text.endswith(")"):
        returns = [part.split()[0] for part in _split_top_level(returns_text[1:-1])]
    else:
        returns = [returns_text.split()[0]] if returns_text else []
    return Schema(name, overload, arguments, returns, keyword_only)


def _schema_parts(text):
    """The name, overload name, argument text and return text of schema ``text``
    (``name.overload(arguments) -> returns``); ``ValueError`` for text that is no schema."""
    head, arrow, returns_text = text.rpartition("->")
    head = head.strip()
    opening = head.find("(")
    name, _, overload = head[:opening].strip().partition(".")
    well_formed = arrow and opening >= 0 and head.endswith(")") and name.isidentifier()
    if not well_formed or not (overload == "" or overload.isidentifier()):
        raise ValueError(f"`{text}`: not an operator schema `name(Type name, ...) -> Tensor`")
    return name, overload, head[opening + 1 : -1], returns_text


def _split_top_level(text):
    """``text`` cut at the commas outside brackets and quotes, each part stripped: cut at
    every comma, then pieces glued back while a bracket or quote is open."""
    parts = []
    for piece in text.split(","):
        if parts and _open(parts[-1]):
            parts[-1] += "," + piece
        else:
            parts.append(piece)
    return [part.strip() for part in parts if part.strip()]


def _open(text):
    return (
        text.count("[") > text.count("]")
        or text.count("(") > text.count(")")
        or text.count("'") % 2 == 1
        or text.count('"') % 2 == 1
    )


# The defaults a schema writes most, read without compiling them (`ast.literal_eval` compiles
# its text: tens of µs an argument, at import).
_PLAIN_DEFAULTS = {"None": None, "True": True, "False": False}


def _read_default(schema, argument_type, name, text):
    try:
        value = _PLAIN_DEFAULTS[text] if text in _PLAIN_DEFAULTS else _read_number(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        raise ValueError(
            f"`{schema}`: the default `{text}` of `{name}` is not a number, bool, None, string "
            "or list"
        ) from None
    size = argument_type.rstrip("?").rpartition("[")[2][:-1]
    if argument_type.rstrip("?").endswith("]") and size.isdigit() and type(value) is int:
        return [value] * int(size)  # `int[2] stride=1` is [1, 1], as torch reads it
    if argument_type.startswith("float") and type(value) is int:
        return float(value)
    return value


def _read_number(text):
    """An ``int`` or ``float`` written as Python writes one, else ``ast.literal_eval``'s
    reading (strings, lists)."""
    if text[:1].isdigit() or text[:1] in "-.":
        try:
            return int(text)
        except ValueError:
            pass
        try:
            return float(text)
        except ValueError:
            pass
    return ast.literal_eval(text)


def _schema_name(text):
    """The op name of schema ``text`` (``f`` of ``f(Tensor x) -> Tensor``), read as
    ``read_schema`` reads it, without the arguments; ``ValueError`` for text with no op name
    and for an overload (``f.out``), which an op cannot declare."""
    name, overload, _, _ = _schema_parts(text)
    if overload:
        raise ValueError(f"`{text}`: declare the default overload only")
    return name


# What `Op._read` keeps of a schema, read on the first use of any of it.
_READ = frozenset((
    "arguments", "argument_names", "tensor_positions", "_other_positions", "device_position",
    "output_count", "_trailing_defaults", "_argument_count", "_required_tensors",
    "_required_count", "_scalar_checks",
))


class Op:
    """One declared op: its schema, kernel, shape and launch functions, and reference. The
    schema is read and checked (``_read``) when the op is first looked up or defined, not when
    it is declared."""

    def __init__(self, library, schema, kernel, *, shape, launch, reference, fallback,
                 inputs=None):
        self.library = library
        self.schema = schema
        self.kernel = kernel
        self.shape = shape
        self.inputs = inputs
        self.launch = launch
        self.reference = reference
        self.fallback = fallback
        self.backward = None
        self.name = _schema_name(schema)
        self.qualified_name = f"{library.namespace}::{self.name}"
        self._signature = None
        self._fallen_back = set()
        self._plans = {}
        self._callable = None if library.compile_wrap else self._plain_callable()
        # What `lookup` returns: calls that need no dispatcher go straight to the kernel.
        self.call = Call(self) if library.compile_wrap else self._callable

    def __getattr__(self, name):
        # What the schema says (`_read`), read on the first use of any of it.
        if name in _READ:
            self._read()
            return self.__dict__[name]
        attribute = getattr(type(self), name, None)
        if isinstance(attribute, property):
            # Its getter raised AttributeError, which Python turned into this call: run it
            # again so that its own error, not "no attribute", reaches the caller.
            return attribute.fget(self)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _read(self):
        """Reads and checks the schema (``ValueError`` for one an op cannot have) and keeps what
        the calls need of it; once."""
        if "_argument_count" in self.__dict__:
            return
        schema = self.schema
        read = read_schema(schema)  # its name and overload were checked as it was declared
        arguments = read.arguments
        if read.keyword_only:
            raise ValueError(f"`{schema}`: keyword-only arguments are not supported")
        if any("(" in kind for kind in [argument.type for argument in arguments] + read.returns):
            raise ValueError(f"`{schema}`: ops are functional; no argument may alias or mutate")
        types = [argument.type for argument in arguments]
        tensor_positions = tuple(i for i, kind in enumerate(types) if kind in ("Tensor", "Tensor?"))
        required_tensors = [i for i, kind in enumerate(types) if kind == "Tensor"]
        if not required_tensors:
            raise ValueError(f"`{schema}`: an op needs a Tensor argument to take its device from")
        if not read.returns or any(kind != "Tensor" for kind in read.returns):
            raise ValueError(f"`{schema}`: an op returns one or more Tensors")
        # The dispatcher leaves out trailing arguments that equal their defaults.
        required = 0
        for i, argument in enumerate(arguments):
            if not argument.has_default:
                required = i + 1
        # Kept only once every check passed: a refused schema leaves nothing half read.
        self.arguments = arguments
        self.argument_names = [argument.name for argument in arguments]
        self.tensor_positions = tensor_positions
        self._other_positions = tuple(i for i in range(len(types)) if i not in tensor_positions)
        self.device_position = required_tensors[0]
        self.output_count = len(read.returns)
        self._trailing_defaults = tuple(argument.default for argument in arguments[required:])
        self._required_tensors = frozenset(required_tensors)
        self._required_count = required
        self._scalar_checks = tuple(
            (i, check) for i, check in enumerate(map(_scalar_check, types)) if check is not None
        )
        # Set last: its presence says the schema was read whole.
        self._argument_count = len(arguments)

    @property
    def callable(self):
        """What to call: the ``torch.ops`` overload, the op defined with torch on first use; a
        plain function under ``<NAMESPACE>_COMPILE_WRAP=disable``."""
        found = self._callable
        if found is None:
            self.library._register(self)
            found = self._callable
        return found

    def __repr__(self):
        return f"kwheel.torch.Op({self.qualified_name!r}, kernel={self.kernel.name!r})"

    # --- registration ------------------------------------------------------------------

    def register(self, torch_library):
        """Defines the operator and its CUDA, CPU (the reference) and Meta (the fake)
        kernels, and returns the overload. FakeTensorMode runs a Meta kernel for fake
        tensors, so ``torch.compile`` traces through the op with no ``register_fake`` (which
        reads the caller's source file and scans every loaded module: most of an import's
        cost)."""
        torch_library.define(self.schema)
        torch_library.impl(self.name, self.cuda, "CUDA")
        if self.reference is not None:
            torch_library.impl(self.name, self.reference_call, "CPU")
        torch_library.impl(self.name, self.fake, "Meta")
        return getattr(getattr(torch.ops, self.library.namespace), self.name).default

    def register_autograd(self, torch_library, overload=None):
        """The op's Autograd kernel: on the torch releases of ``LIGHT_AUTOGRAD_TORCH``, the
        lighter one of ``kwheel._torch_private``; elsewhere ``register_autograd``'s.
        ``overload``: the op's, while it is being defined (default: the defined one)."""
        backward, setup_context = self.backward
        op = self

        def setup(ctx, inputs, output):
            setup_context(ctx, list(op._complete(inputs)), output)

        if _torch_release() in LIGHT_AUTOGRAD_TORCH:
            _light_autograd(self, overload or self.callable, torch_library, backward, setup)
        else:
            torch.library.register_autograd(
                self.qualified_name, backward, setup_context=setup, lib=torch_library
            )

    def _plain_callable(self):
        op = self

        def call(*args, **kwargs):
            args = op.bind(args, kwargs)
            if args[op.device_position].is_cuda:
                return op.cuda(*args)
            return op.reference_call(*args)

        return self._named(call, f"{self.qualified_name}: {self.schema} (plain Python call)")

    def _named(self, call, doc):
        call.__name__ = call.__qualname__ = call._kwheel_op_name = self.name
        call.__doc__ = doc
        # What the escape hatch is for: exactly one graph break per op, never a trace into
        # the launch.
        return torch.compiler.disable(call)

    def use_autograd_function(self):
        """Under ``COMPILE_WRAP=disable``: gradients through a ``torch.autograd.Function``."""
        backward, setup_context = self.backward
        plain = self.callable
        op = self

        class Function(torch.autograd.Function):
            @staticmethod
            def forward(*args):
                return plain(*args)

            @staticmethod
            def setup_context(ctx, inputs, output):
                setup_context(ctx, inputs, output)

            @staticmethod
            def backward(ctx, *grads):
                return backward(ctx, *grads)

        def call(*args, **kwargs):
            return Function.apply(*op.bind(args, kwargs))

        self._callable = self.call = self._named(call, plain.__doc__)

    # --- implementations ---------------------------------------------------------------

    @property
    def signature(self):
        """The schema's arguments as a Python signature (made on first use)."""
        if self._signature is None:
            empty = inspect.Parameter.empty
            self._signature = inspect.Signature(
                [
                    inspect.Parameter(
                        argument.name,
                        inspect.Parameter.POSITIONAL_OR_KEYWORD,
                        default=argument.default if argument.has_default else empty,
                    )
                    for argument in self.arguments
                ]
            )
        return self._signature

    def bind(self, args, kwargs):
        """Positional arguments with the schema's defaults filled in, as Python binds them."""
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as error:
            raise TypeError(f"{self.qualified_name}(): {error}") from None
        bound.apply_defaults()
        return list(bound.args)

    def _complete(self, args):
        """``args`` with the trailing defaults the dispatcher leaves out put back."""
        missing = self._argument_count - len(args)
        if not missing:
            return args
        if missing > len(self._trailing_defaults):
            raise TypeError(
                f"{self.qualified_name}(): takes {self._argument_count} arguments "
                f"({', '.join(self.argument_names)}), got {len(args)}"
            )
        return (*args, *self._trailing_defaults[len(self._trailing_defaults) - missing :])

    def fake(self, *args):
        """The Meta kernel: outputs of the shape function's shapes, on the inputs' device
        (a fake tensor's, while tracing)."""
        args = self._complete(args)
        like = args[self.device_position]
        outputs = [like.new_empty(shape, dtype=dtype) for shape, dtype in self.shape(*args)]
        self._refuse_unsupported(args, None)
        return outputs[0] if self.output_count == 1 else tuple(outputs)

    def _refuse_unsupported(self, args, device):
        """Raises ``ValueError`` naming the op, the requirement and the values where ``args``
        break one of the kernel's requirements: the kernel's loaded on ``device``, else the
        index's (``device`` None: no GPU). Symbolic sizes (dynamic shapes while tracing) are
        left to the call that runs."""
        if self.inputs is None:
            return
        values = self.inputs(*args)
        if any(type(value) not in (int, bool) for value in values.values()):
            return
        reason = self.kernel.unsupported_shape_reason(device, values)
        if reason is not None:
            raise ValueError(
                f"{self.qualified_name}: kernel `{self.kernel.name}` does not take these "
                f"inputs: {reason}"
            )

    def reference_call(self, *args):
        if self.reference is None:
            raise NotImplementedError(
                f"{self.qualified_name} runs on CUDA tensors only (it declares no reference)"
            )
        args = self._complete(args)
        # The shape function's checks hold on CPU too: the op takes on CPU exactly what its
        # kernel takes on CUDA (a float64 input is refused, not computed by the reference).
        self.shape(*args)
        return self.reference(*args)

    def cuda(self, *args):
        """The CUDA kernel. A call with the shapes, dtypes and scalars of an earlier one
        reuses that call's launch plan: it allocates the outputs, gathers pointers and
        launches, running neither the shape nor the launch function."""
        return self._run(args, False)

    def _run(self, args, direct):
        """``cuda``'s body. ``direct``: a ``Call`` with no mode, trace, transform or profiler
        about, not the dispatcher; the call goes to the dispatcher instead (which also raises
        the schema's own errors) unless every tensor argument is a plain CUDA tensor where the
        schema has one and none needs a gradient, and, for a call that makes a plan, every
        scalar has its schema type (``_scalars_fit``)."""
        count = len(args)
        if count != self._argument_count:
            if direct and not self._required_count <= count < self._argument_count:
                return self.callable(*args)
            args = self._complete(args)
        like = args[self.device_position]
        if direct and (type(like) not in _PLAIN or not like.is_cuda):
            return self.callable(*args)
        grad = direct and torch.is_grad_enabled()
        device = like.get_device()
        loaded = self.kernel._loaded.get(device)
        if loaded is None:
            try:
                loaded = self.kernel.get(device)
            except NoFitError as error:
                if not self.fallback:
                    raise
                if direct:  # the reference, as the dispatcher's path runs it (with autograd)
                    return self.callable(*args)
                return self._fall_back(like.device, device, error, args)
        key = [device]
        for position in self.tensor_positions:
            value = args[position]
            if value is None:
                if direct and position in self._required_tensors:
                    return self.callable(*args)
                key.append(None)
                continue
            if direct and (
                type(value) not in _PLAIN
                or value.is_neg()
                or value.is_conj()
                or value._is_zerotensor()
                or (grad and value.requires_grad)
            ):
                # The dispatcher resolves a negative or conjugate view and a zero tensor
                # (whose data pointer is null) before the kernel sees them.
                return self.callable(*args)
            if not value.is_contiguous():
                args = list(args)
                args[position] = value = value.contiguous()
            if value.get_device() != device:
                raise ValueError(
                    f"{self.qualified_name}: argument `{self.argument_names[position]}` is "
                    f"on {value.device}, but the op runs on cuda:{device}"
                )
            key.append(value.shape)
            key.append(value.dtype)
            # The address's alignment, up to 512 bytes: a launch function may choose by it (a
            # contiguous slice can be misaligned), so a plan serves only its own.
            address = value.data_ptr() | _ALIGNMENT
            key.append(address & -address)
        for position in self._other_positions:
            value = args[position]
            key.append(tuple(value) if type(value) is list else value)
        key = tuple(key)
        plan = self._plans.get(key)
        if plan is None or plan is _UNCACHEABLE:
            if direct and not self._scalars_fit(args):
                return self.callable(*args)  # the dispatcher converts or refuses them
            return self._plan_and_launch(key, loaded, like, device, args, plan is None)
        function, grid, block, shared_mem, allocations, template, nothing_to_do, _, options = plan
        outputs = [
            torch.empty(shape, dtype=dtype, device=place) if slot is None else
            torch.empty_like(args[slot]) for slot, shape, dtype, place in allocations
        ]
        if not nothing_to_do:
            pointers = [
                args[slot].data_ptr() if source is _INPUT else
                outputs[slot].data_ptr() if source is _OUTPUT else
                slot if source is _CONSTANT else
                source(slot, args, outputs)  # an address, or a struct holding addresses
                for source, slot in template
            ]
            # Stream None: the current stream of the function's device, as torch has it.
            if options is not None:
                self._launch_with(function, grid, block, pointers, shared_mem, options, device)
            elif self.library.trace or _PROFILER._is_profiler_enabled:
                with _trace_range(self.kernel.label(device)):
                    function.launch(grid, block, pointers, shared_mem, None)
            else:
                function.launch(grid, block, pointers, shared_mem, None)
        return outputs[0] if self.output_count == 1 else tuple(outputs)

    def _scalars_fit(self, args):
        """Whether every ``int``, ``float``, ``bool`` and ``int[]`` argument has exactly its
        schema type, as the dispatcher hands them to ``cuda`` (it converts an ``int`` given
        for a ``float``, which a launch would otherwise pass as an integer)."""
        return all(check(args[position]) for position, check in self._scalar_checks)

    def _plan_and_launch(self, key, loaded, like, device, args, keep=True):
        """The first call with these shapes, dtypes, scalars and alignments: runs the
        shape and launch functions, launches what they said, and keeps it as the plan of the
        next calls with the same ones: how to allocate each output (``empty_like`` of an input
        of its shape and dtype, else ``empty``), the entry, the geometry, and each kernel
        argument as an input, an output, a constant (a ``Kept`` tensor's pointer) or a value
        made of their addresses (an ``int`` address, a struct holding addresses). What a plan
        keeps is what ``_template`` showed not to depend on where the tensors are; a launch
        that depends on it some other way, or passes a plain tensor of its own making, is not
        kept (``_UNCACHEABLE``): such calls come here every time, with ``keep`` false."""
        functions, constants = loaded
        allocations = tuple(
            (self._input_like(args, shape, dtype), tuple(shape), dtype, like.device)
            for shape, dtype in self.shape(*args)
        )
        self._refuse_unsupported(args, device)
        outputs = [
            torch.empty(shape, dtype=dtype, device=place) if slot is None else
            torch.empty_like(args[slot]) for slot, shape, dtype, place in allocations
        ]
        nothing_to_do = all(output.numel() == 0 for output in outputs)
        launch = self.launch(constants, outputs, *args)
        grid, block, kernel_args, entry, shared_mem = launch
        options = getattr(launch, "options", None)
        function = self._entry(functions, entry)
        if keep:
            if nothing_to_do:  # nothing launches: only the allocations are kept
                plan = (function, grid, block, shared_mem, allocations, (), True, (), None)
            else:
                template = self._template(launch, constants, outputs, args, device)
                plan = _UNCACHEABLE if template is None else (
                    function, grid, block, shared_mem, allocations, template, False,
                    tuple(value.tensor for value in kernel_args if isinstance(value, Kept)),
                    options,
                )
            if len(self._plans) >= _PLANS_PER_OP:
                self._plans.clear()  # shapes that keep changing: start over rather than grow
            self._plans[key] = plan
        if not nothing_to_do:
            self._launch(function, grid, block, kernel_args, shared_mem, options, device)
        return outputs[0] if self.output_count == 1 else tuple(outputs)

    def _template(self, launch, constants, outputs, args, device):
        """Each kernel argument of ``launch`` as the plan passes it again, or ``None`` where
        the launch cannot be kept. The launch function runs a second time, on tensors of the
        same shapes, dtypes, strides and alignment placed elsewhere (``_Probe``): every
        other field must come out equal, and every argument equal or moved exactly as the
        tensors moved. Tensors too large to place twice are checked by ``_looks_addressed``
        alone."""
        kernel_args = launch[2]
        roles = []
        for index, value in enumerate(kernel_args):
            if isinstance(value, Kept):
                self._check_device(value.tensor, device, index)
                roles.append((_CONSTANT, value.tensor.data_ptr()))
                continue
            if isinstance(value, torch.Tensor):
                slot = _find(args, value, self.tensor_positions)
                if slot is not None:
                    roles.append((_INPUT, slot))
                    continue
                slot = _find(outputs, value, range(len(outputs)))
                if slot is None:
                    return None  # a tensor of the launch function's own making
                roles.append((_OUTPUT, slot))
                continue
            # A struct is kept as its bytes of this call: the object may change after.
            roles.append((_CONSTANT, bytes(memoryview(value)) if _is_buffer(value) else value))
        probe = _Probe(args, self.tensor_positions, outputs)
        if probe.args is None:
            return None if _looks_addressed(kernel_args, probe.real) else tuple(roles)
        try:
            moved = self.launch(constants, probe.outputs, *probe.args)
        except Exception:  # noqa: BLE001 - it depends on the tensors in a way no plan keeps
            return None
        if not isinstance(moved, tuple) or len(moved) != len(launch):
            return None
        if getattr(launch, "options", None) != getattr(moved, "options", None):
            return None
        if any(
            index != 2 and not _same(first, second)
            for index, (first, second) in enumerate(zip(launch, moved))
        ):
            return None
        moved_args = list(moved[2])
        if len(moved_args) != len(roles):
            return None
        template = []
        for (role, slot), value, other in zip(roles, kernel_args, moved_args):
            if role is _INPUT or role is _OUTPUT:
                moved_to = probe.args if role is _INPUT else probe.outputs
                if other is not moved_to[slot]:
                    return None
                template.append((role, slot))
            elif isinstance(value, Kept):
                if not (isinstance(other, Kept) and other.tensor is value.tensor):
                    return None
                template.append((role, slot))
            elif _same(value, other):
                template.append((role, slot))
            else:
                moved_value = probe.relocation(value, other)
                if moved_value is None:
                    return None
                template.append(moved_value)
        return tuple(template)

    def _input_like(self, args, shape, dtype):
        """The position of a tensor argument of this shape and dtype (contiguous by now), whose
        ``empty_like`` is cheaper than ``empty``; or ``None``."""
        for position in self.tensor_positions:
            value = args[position]
            if value is not None and value.dtype == dtype and value.shape == tuple(shape):
                return position
        return None

    def _fall_back(self, place, device, error, args):  # no variant fits, the JIT is off
        self._warn_fallback(place, device, error)
        if self.library.trace or _PROFILER._is_profiler_enabled:
            label = _kwheel.trace_label(self.kernel.name, "reference", "fallback", "", device)
            with _trace_range(label):
                return self.reference(*args)
        return self.reference(*args)

    def _entry(self, functions, entry):
        try:
            return functions[entry]
        except KeyError:
            raise ValueError(
                f"{self.qualified_name}: kernel `{self.kernel.name}` has no entry {entry!r}; "
                f"its entries are {sorted(name for name in functions if name is not None)}"
            ) from None

    def _check_device(self, tensor, device, index):
        if tensor.get_device() != device:
            raise ValueError(
                f"{self.qualified_name}: kernel argument {index} is a tensor on "
                f"{tensor.device}, but the op runs on cuda:{device}"
            )

    def _launch(self, function, grid, block, kernel_args, shared_mem, options, device):
        """Launches with what the launch function returned, tensors as their pointers."""
        pointers = []
        for index, value in enumerate(kernel_args):
            if isinstance(value, Kept):
                value = value.tensor
            if isinstance(value, torch.Tensor):
                self._check_device(value, device, index)
                value = value.data_ptr()
            pointers.append(value)
        self._launch_with(function, grid, block, pointers, shared_mem, options, device)

    def _launch_with(self, function, grid, block, pointers, shared_mem, options, device):
        """One launch, with its attributes (``options``, or ``None``) and its trace range."""
        options = options or {}
        if self.library.trace or _PROFILER._is_profiler_enabled:
            with _trace_range(self.kernel.label(device)):
                function.launch(grid, block, pointers, shared_mem, None, **options)
        else:
            function.launch(grid, block, pointers, shared_mem, None, **options)

    def _warn_fallback(self, device, ordinal, error):
        if device in self._fallen_back:
            return
        self._fallen_back.add(device)
        _note_fallback(getattr(self.library.registry, "package", None), self.kernel.name, ordinal, error)
        warnings.warn(
            f"{self.qualified_name} on {device} runs its torch reference: {error}",
            FallbackWarning,
            stacklevel=3,
        )


class Call:
    """An op as ``Library.lookup`` returns it (``ops.layer_norm``): called like its
    ``torch.ops`` overload and with the same results, it launches the kernel straight from
    Python when nothing needs the dispatcher (``Op._run``), so the op is not defined with
    torch until a call does: one that needs gradients, runs on CPU or fake tensors, under a
    mode, a transform, a profiler or ``torch.compile``. While dynamo traces, the call reads
    the overload from the library's ``overloads`` module, which dynamo reads for real, so the
    graph holds the operator itself (one graph, no break). ``default`` is the overload, for
    what takes one (``torch.library.opcheck``)."""

    def __init__(self, op):
        self.op = op
        self.__name__ = self.__qualname__ = op.name
        self.__doc__ = f"{op.qualified_name}: {op.schema}"

    def __repr__(self):
        return f"kwheel.torch.Call({self.op.qualified_name!r})"

    # One per op and process, as an `OpOverload` is: a copied module keeps the same op.
    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    @property
    def default(self):
        """The ``torch.ops`` overload, defined with torch now if it is not yet."""
        return self.op.callable

    def __call__(self, *args, **kwargs):
        op = self.op
        if _is_compiling():
            return getattr(op.library.overloads, op.name)(*args, **kwargs)
        # A profiler names the op, modes, traces and transforms see it: the dispatcher's.
        if kwargs or _PROFILER._is_profiler_enabled or _intercepted():
            return op.callable(*args, **kwargs)
        return op._run(args, True)


class _Overloads(types.ModuleType):
    """A library's ops as ``torch.ops`` overloads, each defined with torch on its first
    attribute lookup. A module, because dynamo looks a module's attributes up for real while
    it traces (a lazily defined op is defined then, not traced into)."""

    def __init__(self, library):
        super().__init__(f"kwheel.torch.overloads.{library.namespace}")
        self._library = library

    def __getattr__(self, name):
        if name.startswith("__"):  # what Python asks of any module, never an op here
            raise self._library._no_op(name)
        overload = self._library._declared(name).callable
        setattr(self, name, overload)
        return overload


# The Python type a direct call's scalar argument must have, by schema type (`int[2]`,
# `float?` included): what the dispatcher would hand the CUDA implementation.
_SCALAR_TYPES = {"int": int, "SymInt": int, "float": float, "bool": bool}


def _scalar_check(kind):
    """The check of one argument of schema type ``kind``, or ``None`` for a type a direct call
    passes as it is (tensors, strings, dtypes)."""
    optional = kind.endswith("?")
    base = kind.rstrip("?")
    listed = base.endswith("]")
    wanted = _SCALAR_TYPES.get(base.split("[", 1)[0])
    if wanted is None:
        return None

    def check(value):
        if value is None:
            return optional
        if listed:
            return type(value) in (list, tuple) and all(type(item) is wanted for item in value)
        return type(value) is wanted

    return check


class _Probe:
    """Stand-ins for an op's tensor arguments and outputs at other addresses: same shape,
    dtype, strides, device and alignment (up to ``_ALIGNMENT``: a plan's key holds it), but
    other low bits (an offset within a line shows as a difference) with the bit of
    ``_ALIGNMENT`` flipped (so does a larger alignment), and the rest wherever the allocator
    put them. The launch function runs on them once per new plan; a kernel never does.
    ``real`` and ``moved`` list each tensor's address and size, for ``relocation``; ``args``
    is ``None`` when the tensors are too large to place twice (``_PROBE_BYTES``)."""

    __slots__ = ("args", "outputs", "real", "moved")

    def __init__(self, args, positions, outputs):
        places = [(_INPUT, position) for position in positions if args[position] is not None]
        places += [(_OUTPUT, slot) for slot in range(len(outputs))]
        self.real = [_located(args, outputs, role, slot) for role, slot in places]
        self.args = self.outputs = None
        self.moved = []
        if sum(size for _, size, _, _ in self.real) > _PROBE_BYTES:
            return
        placed = {}
        try:
            # Placed in reverse: the stand-ins' distances apart are then not the tensors' own
            # (which the allocator made in order), so an address matches its own tensor only.
            moved_args = list(args)
            moved_outputs = list(outputs)
            for role, slot in reversed(places):
                moved = moved_args if role is _INPUT else moved_outputs
                source = args if role is _INPUT else outputs
                moved[slot] = self._place(source[slot], placed)
        except (RuntimeError, ValueError):  # out of memory, or an address no probe can mirror
            return
        self.moved = [_located(moved_args, moved_outputs, role, slot) for role, slot in places]
        self.args, self.outputs = moved_args, moved_outputs

    @staticmethod
    def _place(tensor, placed):
        found = placed.get(id(tensor))
        if found is not None:  # one tensor passed twice stays one tensor
            return found
        item = tensor.element_size()
        address = tensor.data_ptr()
        if tensor.numel() == 0:
            moved = torch.empty_like(tensor)
        else:
            if address % item:
                raise ValueError("an address that is no multiple of the element size")
            span = 1 + sum(
                (size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride())
            )
            base = torch.empty(span + 2 * _ALIGNMENT // item, dtype=tensor.dtype, device=tensor.device)
            # Same alignment (up to `_ALIGNMENT`), other low bits: the bit above the
            # alignment and the bit of `_ALIGNMENT` flipped.
            alignment = (address | _ALIGNMENT) & -(address | _ALIGNMENT)
            flip = (alignment * 2 if alignment * 2 < _ALIGNMENT else 0) | _ALIGNMENT
            target = (address ^ flip) % (2 * _ALIGNMENT)
            shift = (target - base.data_ptr()) % (2 * _ALIGNMENT)
            moved = base.as_strided(tensor.shape, tensor.stride(), shift // item)
        placed[id(tensor)] = moved
        return moved

    def relocation(self, value, other):
        """The template entry of a kernel argument that differs between the real launch and
        the probe's: an ``int`` that is a tensor's address plus the same offset in both, or a
        struct whose differing 8-byte words are such addresses; ``None`` for anything else."""
        if type(value) is int and type(other) is int:
            found = self._address(value, other)
            return None if found is None else (_address_of, found)
        if not (_is_buffer(value) and _is_buffer(other)):
            return None
        if isinstance(value, TensorMap):
            return None  # the driver's encoding of an address: made again on every call
        first = bytes(memoryview(value))
        second = bytes(memoryview(other))
        if len(first) != len(second):
            return None
        fields = []
        for offset in range(0, len(first) - 7, 8):
            word, moved_word = first[offset:offset + 8], second[offset:offset + 8]
            if word == moved_word:
                continue
            found = self._address(int.from_bytes(word, "little"), int.from_bytes(moved_word, "little"))
            if found is None:
                return None
            fields.append((offset, *found))
        # Proof: the real struct, its addresses written as the probe's, is the probe's struct.
        fields = tuple(fields)
        if _struct_of((first, fields), self.args, self.outputs) != second:
            return None
        return (_struct_of, (first, fields))

    def _address(self, value, other):
        """``(role, slot, offset)``: ``value`` is that tensor's address plus ``offset`` and
        ``other`` its stand-in's plus the same offset. Where several tensors fit (two tensors
        the allocator placed as far apart as their stand-ins), the one the address lies
        inside is it; where that does not decide, none is (the launch keeps no plan)."""
        found = [
            (role, slot, value - address, 0 <= value - address <= size)
            for (address, size, role, slot), (moved, _, _, _) in zip(self.real, self.moved)
            if address and value - address == other - moved
        ]
        inside = [candidate for candidate in found if candidate[3]]
        found = inside or found
        if len(found) != 1:
            return None
        role, slot, offset, _ = found[0]
        return role, slot, offset


def _looks_addressed(kernel_args, tensors):
    """Whether a kernel argument could hold an address near one of ``tensors`` (``_Probe``'s
    ``real``): an ``int``, or an 8-byte word of a struct, within 64 KiB of one, or a value of
    a kind that cannot be read. The check of launches whose tensors are too large to place
    twice: unlike the probe, it cannot see an address transformed (shifted, hashed)."""

    def near(word):
        return any(
            address and address - 65536 <= word <= address + size + 65536
            for address, size, _, _ in tensors
        )

    for value in kernel_args:
        if value is None or isinstance(value, (Kept, torch.Tensor, float, bool)):
            continue
        if type(value) is int:
            if near(value):
                return True
        elif _is_buffer(value):
            data = bytes(memoryview(value))
            if any(near(int.from_bytes(data[i:i + 8], "little")) for i in range(0, len(data) - 7, 8)):
                return True
        else:
            return True
    return False


def _located(args, outputs, role, slot):
    """``(address, size in bytes, role, slot)`` of an input (``args[slot]``) or output."""
    tensor = (args if role is _INPUT else outputs)[slot]
    return tensor.data_ptr(), tensor.numel() * tensor.element_size(), role, slot


def _is_buffer(value):
    """Bytes, or an object with the buffer protocol (a ``ctypes.Structure``), that a launch
    passes as its bytes."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return True
    if isinstance(value, (torch.Tensor, int, float, str)) or value is None:
        return False
    try:
        memoryview(value)
    except TypeError:
        return False
    return True


def _same(first, second):
    """Equal and of one type (``1``, ``True`` and ``1.0`` are three arguments); buffers by
    their bytes."""
    if _is_buffer(first) or _is_buffer(second):
        return (
            _is_buffer(first)
            and _is_buffer(second)
            and bytes(memoryview(first)) == bytes(memoryview(second))
        )
    if type(first) is not type(second):
        return False
    try:
        return bool(first == second)
    except Exception:  # noqa: BLE001 - a value that cannot say it is equal is not kept
        return False


def _address_of(found, args, outputs):
    """A planned ``int`` argument: a tensor's address plus an offset (``_Probe._address``)."""
    role, slot, offset = found
    return (args if role is _INPUT else outputs)[slot].data_ptr() + offset


def _struct_of(planned, args, outputs):
    """A planned struct argument: its bytes, each address field ``(offset, role, slot,
    delta)`` written with that tensor's address of this call."""
    data, fields = planned
    written = bytearray(data)
    for offset, role, slot, delta in fields:
        address = (args if role is _INPUT else outputs)[slot].data_ptr() + delta
        written[offset:offset + 8] = (address & _WORD).to_bytes(8, "little")
    return bytes(written)


def _find(tensors, tensor, positions):
    for position in positions:
        if tensors[position] is tensor:
            return position
    return None


# How many launch plans an op keeps before it starts over.
_PLANS_PER_OP = 256
_INPUT = "input"
_OUTPUT = "output"
_CONSTANT = "constant"
_UNCACHEABLE = "uncacheable"
# The most bytes of tensors a new plan places a second time to check its launch; past it, a
# launch is checked by `_looks_addressed` alone.
_PROBE_BYTES = 256 << 20
# The largest alignment of an input's address a plan tells apart: CUDA's caching allocator
# places every block at 512 bytes, so a plain tensor's is this, a slice's its own.
_ALIGNMENT = 512
_WORD = (1 << 64) - 1


#: Torch releases (major, minor) the light Autograd kernel of ``kwheel._torch_private`` was
#: checked on (2.11: the CPU tests and the H200 runs). On any other, ops get
#: torch.library.register_autograd's kernel: the same gradients, and 4-15 µs more per call
#: that needs none (docs/benchmarks.md, "Host cost of one call").
LIGHT_AUTOGRAD_TORCH = ((2, 11),)


def _torch_release():
    release = torch.__version__.split("+", 1)[0].split(".")
    try:
        return int(release[0]), int(release[1])
    except (IndexError, ValueError):
        return None
