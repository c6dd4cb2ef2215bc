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

import os
import threading
import types

import torch

from . import _kwheel
from ._torch_op import LIGHT_AUTOGRAD_TORCH, Call  # noqa: F401 - kwheel.torch's names too
from ._torch_op import FallbackWarning, Op, _is_compiling
from ._torch_plans import Kept
from ._torch_schema import read_schema


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
        return functions, Constants(kernel.constants, dict(getattr(kernel, "computed", {})))

    def unsupported_shape_reason(self, device, values):
        """Why the kernel loaded on ``device`` cannot run with ``values`` (its inputs), or
        None; without a loaded kernel there (a stand-in registry's), the registry's answer."""
        kernel = self._kernels.get(device)
        if kernel is not None:
            return kernel.unsupported_shape_reason(**values)
        answer = getattr(self.registry, "unsupported_shape_reason", None)
        return None if answer is None else answer(self.name, **values)


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
