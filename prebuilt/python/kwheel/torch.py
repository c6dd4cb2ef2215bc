"""kwheel kernels as PyTorch operators: one declaration per op, no C++ and no CUDA host code.

A kernel library declares each op once, from its own package::

    import torch
    import kwheel.torch

    ops = kwheel.torch.library(_registry)        # namespace: the package, `af3_kernels`

    def _gate_shape(x, gate):                    # outputs as (shape, dtype), for every mode
        return [(x.shape, x.dtype)]

    def _gate_launch(constants, outputs, x, gate):   # geometry from the kernel's constants
        block = constants["BLOCK_SIZE"]
        count = x.numel()
        return kwheel.torch.Launch(kwheel.torch.ceil_div(count, block), block,
                                   [outputs[0], x, gate, count])

    sigmoid_gate = ops.define(
        "sigmoid_gate(Tensor x, Tensor gate) -> Tensor",
        kernel="sigmoid_gate", shape=_gate_shape, launch=_gate_launch,
        reference=lambda x, gate: x * torch.sigmoid(gate),
    )

``define`` registers a ``torch.library`` operator ``<namespace>::<name>`` with

- a CUDA implementation that allocates the outputs with torch (so inside a CUDA graph capture
  they come from the graph's pool), and launches the kernel on torch's current stream of the
  inputs' device: no host synchronization, no memory of kwheel's own;
- a fake (meta) implementation built from the same shape function, so ``torch.compile`` traces
  through the op and keeps one graph;
- the torch reference, when given, as the CPU implementation (and, with ``fallback=True``, on
  CUDA where no prebuilt variant fits and the JIT is disabled);

and returns the operator overload, callable with the schema's arguments. ``autograd`` attaches a
backward made of other ops (with ``torch.library.register_autograd``'s contract).

The kernel loads on the op's first CUDA call on each device (the device of the op's first
tensor argument, whatever the current device is), once per process and device, under a lock,
selected for that GPU; it launches on that device's current stream. The loader's errors
(``NoFitError``, ``NoGpuError``, a failed JIT compile) are raised there with the loader's own
messages.

While a torch profiler runs, or always under ``<PACKAGE>_TRACE=1`` (read when the library is
created), each launch is marked with a ``record_function`` and an NVTX range named after the
binary that ran: ``kwheel:<kernel> <variant> <source> <key, 12 digits> cuda:<device>``
(``kwheel.provenance()`` lists the same facts; docs/provenance.md). Otherwise a call pays one
check for it. ``<NAMESPACE>_COMPILE_WRAP=disable`` (read when the library is
created, normally at import) registers nothing: ops become plain Python functions, and
``torch.compile`` breaks its graph at each of them.

Only importable where torch is; ``import kwheel`` itself never imports torch. See
docs/torch.md.
"""

import collections
import inspect
import os
import threading
import warnings

import torch

from . import NoFitError, _kwheel, _note_fallback, _trace_range

__all__ = [
    "FallbackWarning",
    "Kept",
    "Launch",
    "Library",
    "Op",
    "ceil_div",
    "library",
]

#: What a launch function returns: the grid and block (an int or a tuple of up to three),
#: the kernel's arguments in parameter order (tensors are passed as their device pointers),
#: the entry (``None`` for a kernel with one) and the dynamic shared memory in bytes.
Launch = collections.namedtuple("Launch", "grid block args entry shared_mem", defaults=(None, 0))


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
        if existing is not None:
            if existing.registry is not registry:
                raise ValueError(
                    f"the torch namespace `{namespace}` is already taken by the kernels of "
                    f"{existing.registry!r}; pass namespace= to use another"
                )
            return existing
        created = Library(registry, namespace=namespace, fallback=fallback)
        _LIBRARIES[namespace] = created
        return created


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
        self._torch_library = (
            torch.library.Library(self.namespace, "DEF") if self.compile_wrap else None
        )
        self._kernels = {}
        self._kernels_lock = threading.Lock()
        self.ops = {}

    def __repr__(self):
        mode = "operators" if self.compile_wrap else "plain Python calls"
        return f"kwheel.torch.Library({self.namespace!r}, {len(self.ops)} ops, {mode})"

    def kernel(self, name):
        """The lazily loaded kernel ``name`` of the registry, shared by every op that launches
        it."""
        with self._kernels_lock:
            found = self._kernels.get(name)
            if found is None:
                found = LazyKernel(self.registry, name)
                self._kernels[name] = found
            return found

    def define(self, schema, *, kernel, shape, launch, reference=None, fallback=None):
        """Declares op ``<namespace>::<name>`` and returns what to call.

        ``schema``: the operator schema without namespace, ``"name(Tensor x, ...) -> Tensor"``
        (functional: no aliasing or mutation). ``kernel``: the registry's kernel it launches.
        ``shape(*args)``: a list of ``(shape, dtype)``, one per output, computed from the
        arguments' shapes and dtypes only (it also runs on fake tensors). ``launch(constants,
        outputs, *args)``: a ``Launch`` from the kernel's exported constants, the allocated
        outputs and the arguments (tensors made contiguous). ``reference(*args)``: the same op
        in torch, the implementation for CPU tensors. ``fallback``: run ``reference`` on CUDA,
        with a ``FallbackWarning``, where the kernel has no fitting variant and the JIT is
        disabled (``NoFitError``); default the library's.

        Returns the ``torch.ops`` overload (``torch.ops.<namespace>.<name>.default``), or, under
        ``<NAMESPACE>_COMPILE_WRAP=disable``, a plain function with the same arguments.
        """
        if fallback is None:
            fallback = self.fallback
        if fallback and reference is None:
            raise ValueError(f"`{schema}`: fallback=True needs a reference")
        op = Op(
            self,
            schema,
            self.kernel(kernel),
            shape=shape,
            launch=launch,
            reference=reference,
            fallback=fallback,
        )
        if op.name in self.ops:
            raise ValueError(f"`{self.namespace}::{op.name}` is already defined")
        self.ops[op.name] = op
        if self.compile_wrap:
            op.register(self._torch_library)
        return op.callable

    def autograd(self, op, backward, setup_context):
        """Gives op (a name or what ``define`` returned) a backward: ``setup_context(ctx,
        inputs, output)`` saves what ``backward(ctx, *grads)`` needs; ``backward`` returns one
        gradient (or ``None``) per input, computed with other ops of the library, so the
        backward is kernels too. The contract of ``torch.library.register_autograd``; see
        ``Op.register_autograd`` for how it differs."""
        found = self._op(op)
        found.backward = (backward, setup_context)
        if self.compile_wrap:
            found.register_autograd(self._torch_library)
        else:
            found.use_autograd_function()

    def _op(self, op):
        if isinstance(op, str):
            name = op
        else:
            schema = getattr(op, "_schema", None)  # a torch.ops overload
            name = schema.name.split("::", 1)[-1] if schema is not None else None
            name = getattr(op, "_kwheel_op_name", name)
        found = self.ops.get(name)
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
        label = self._labels.get(device)
        if label is None:
            label = _kwheel.trace_label(self.name, "unknown", "unknown", "", device)
        return label

    def _load(self, device):
        kernel = self.registry.load(self.name, device=device)
        entries = list(kernel.entries)
        functions = {entry: kernel.function(entry) for entry in entries}
        if len(entries) == 1:
            functions[None] = functions[entries[0]]
        self._labels[device] = kernel.trace_label
        return functions, dict(kernel.constants)


class Op:
    """One declared op: its schema, kernel, shape and launch functions, and reference."""

    def __init__(self, library, schema, kernel, *, shape, launch, reference, fallback):
        self.library = library
        self.schema = schema
        self.kernel = kernel
        self.shape = shape
        self.launch = launch
        self.reference = reference
        self.fallback = fallback
        self.backward = None
        parsed = _parse_schema(f"{library.namespace}::{schema}")
        self.name = parsed.name.split("::", 1)[1]
        if parsed.overload_name:
            raise ValueError(f"`{schema}`: declare the default overload only")
        self.qualified_name = f"{library.namespace}::{self.name}"
        arguments = list(parsed.arguments)
        if any(argument.kwarg_only for argument in arguments):
            raise ValueError(f"`{schema}`: keyword-only arguments are not supported")
        if any(argument.alias_info is not None for argument in arguments):
            raise ValueError(f"`{schema}`: ops are functional; no argument may alias or mutate")
        self.argument_names = [argument.name for argument in arguments]
        # The schema's arguments as a Python signature: binding and defaults are Python's.
        self.signature = inspect.Signature(
            [
                inspect.Parameter(
                    argument.name,
                    inspect.Parameter.POSITIONAL_OR_KEYWORD,
                    default=argument.default_value
                    if argument.has_default_value()
                    else inspect.Parameter.empty,
                )
                for argument in arguments
            ]
        )
        self.tensor_positions = tuple(
            index
            for index, argument in enumerate(arguments)
            if str(argument.type) in ("Tensor", "Optional[Tensor]")
        )
        required_tensors = [
            index for index, argument in enumerate(arguments) if str(argument.type) == "Tensor"
        ]
        if not required_tensors:
            raise ValueError(f"`{schema}`: an op needs a Tensor argument to take its device from")
        self.device_position = required_tensors[0]
        self.output_count = len(parsed.returns)
        if self.output_count == 0 or any(str(r.type) != "Tensor" for r in parsed.returns):
            raise ValueError(f"`{schema}`: an op returns one or more Tensors")
        self._fallen_back = set()
        self._plans = {}
        self.callable = None
        if not library.compile_wrap:
            self.callable = self._plain_callable()

    def __repr__(self):
        return f"kwheel.torch.Op({self.qualified_name!r}, kernel={self.kernel.name!r})"

    # --- registration ------------------------------------------------------------------

    def register(self, torch_library):
        torch_library.define(self.schema)
        torch_library.impl(self.name, self.cuda, "CUDA")
        if self.reference is not None:
            torch_library.impl(self.name, self.reference_call, "CPU")
        torch.library.register_fake(self.qualified_name, self.fake, lib=torch_library)
        overload = getattr(getattr(torch.ops, self.library.namespace), self.name).default
        self.callable = overload

    def register_autograd(self, torch_library):
        """The op's Autograd kernel, with ``torch.library.register_autograd``'s contract. On
        the torch versions it was checked on, the lighter kernel of ``_light_autograd``
        (a call that needs no gradient goes straight to the CUDA implementation); elsewhere
        ``register_autograd`` itself."""
        backward, setup_context = self.backward
        op = self

        def setup(ctx, inputs, output):
            setup_context(ctx, list(op._complete(inputs)), output)

        if not _light_autograd(self, torch_library, backward, setup):
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

        call.__name__ = self.name
        call.__qualname__ = self.name
        call.__doc__ = f"{self.qualified_name}: {self.schema} (plain Python call)"
        call._kwheel_op_name = self.name
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

        call.__name__ = self.name
        call.__qualname__ = self.name
        call.__doc__ = plain.__doc__
        call._kwheel_op_name = self.name
        self.callable = torch.compiler.disable(call)

    # --- implementations ---------------------------------------------------------------

    def bind(self, args, kwargs):
        """Positional arguments with the schema's defaults filled in."""
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as error:
            raise TypeError(f"{self.qualified_name}(): {error}") from None
        bound.apply_defaults()
        return list(bound.args)

    def _complete(self, args):
        """The dispatcher leaves trailing defaults out; put them back."""
        if len(args) == len(self.argument_names):
            return args
        bound = self.signature.bind(*args)
        bound.apply_defaults()
        return bound.args

    def fake(self, *args):
        args = self._complete(args)
        like = args[self.device_position]
        outputs = [like.new_empty(shape, dtype=dtype) for shape, dtype in self.shape(*args)]
        return outputs[0] if self.output_count == 1 else tuple(outputs)

    def reference_call(self, *args):
        if self.reference is None:
            raise NotImplementedError(
                f"{self.qualified_name} runs on CUDA tensors only (it declares no reference)"
            )
        return self.reference(*self._complete(args))

    def cuda(self, *args):
        args = self._complete(args)
        like = args[self.device_position]
        device = like.get_device()
        try:
            functions, constants = self.kernel.get(device)
        except NoFitError as error:
            if not self.fallback:
                raise
            self._warn_fallback(like.device, device, error)
            if self.library.trace or _PROFILER._is_profiler_enabled:
                label = _kwheel.trace_label(self.kernel.name, "reference", "fallback", "", device)
                with _trace_range(label):
                    return self.reference(*args)
            return self.reference(*args)
        key = [device]
        for position, value in enumerate(args):
            if position in self.tensor_positions and value is not None:
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
            else:
                key.append(tuple(value) if isinstance(value, list) else value)
        key = tuple(key)
        plan = self._plans.get(key)
        if plan is None:
            return self._plan_and_launch(key, functions, constants, like, device, args)
        if plan is _UNCACHEABLE:
            return self._launch_uncached(functions, constants, like, device, args)
        function, grid, block, shared_mem, output_specs, template, nothing_to_do, _ = plan
        outputs = [like.new_empty(shape, dtype=dtype) for shape, dtype in output_specs]
        if not nothing_to_do:
            pointers = []
            for source, slot in template:
                if source is _INPUT:
                    pointers.append(args[slot].data_ptr())
                elif source is _OUTPUT:
                    pointers.append(outputs[slot].data_ptr())
                else:
                    pointers.append(slot)
            stream = torch._C._cuda_getCurrentRawStream(device)
            if self.library.trace or _PROFILER._is_profiler_enabled:
                with _trace_range(self.kernel.label(device)):
                    function.launch(grid, block, pointers, shared_mem, stream)
            else:
                function.launch(grid, block, pointers, shared_mem, stream)
        return outputs[0] if self.output_count == 1 else tuple(outputs)

    def _plan_and_launch(self, key, functions, constants, like, device, args):
        """The first call with these shapes, dtypes and scalars: runs the shape and launch
        functions once, launches what they said, and keeps it as the plan of the next calls
        with the same ones: the outputs to allocate, the entry, the geometry, and each kernel
        argument as an input, an output or a constant (a ``Kept`` tensor's pointer). A launch
        that passes a plain tensor of its own making is not kept (``_UNCACHEABLE``)."""
        output_specs = [(tuple(shape), dtype) for shape, dtype in self.shape(*args)]
        outputs = [like.new_empty(shape, dtype=dtype) for shape, dtype in output_specs]
        nothing_to_do = all(output.numel() == 0 for output in outputs)
        grid, block, kernel_args, entry, shared_mem = self.launch(constants, outputs, *args)
        function = self._entry(functions, entry)
        template = []
        kept = []
        plan = None
        for value in kernel_args:
            if isinstance(value, Kept):
                self._check_device(value.tensor, device, len(template))
                kept.append(value.tensor)
                template.append((_CONSTANT, value.tensor.data_ptr()))
                continue
            if isinstance(value, torch.Tensor):
                slot = _find(args, value, self.tensor_positions)
                if slot is not None:
                    template.append((_INPUT, slot))
                    continue
                slot = _find(outputs, value, range(len(outputs)))
                if slot is not None:
                    template.append((_OUTPUT, slot))
                    continue
                plan = _UNCACHEABLE
                break
            template.append((_CONSTANT, value))
        if plan is None:
            plan = (
                function, grid, block, shared_mem, output_specs, template, nothing_to_do,
                tuple(kept),
            )
        if len(self._plans) >= _PLANS_PER_OP:
            self._plans.clear()  # shapes that keep changing: start over rather than grow
        self._plans[key] = plan
        if not nothing_to_do:
            self._launch(function, grid, block, kernel_args, shared_mem, device)
        return outputs[0] if self.output_count == 1 else tuple(outputs)

    def _launch_uncached(self, functions, constants, like, device, args):
        outputs = [like.new_empty(shape, dtype=dtype) for shape, dtype in self.shape(*args)]
        if all(output.numel() == 0 for output in outputs):
            # Nothing to compute, and CUDA refuses an empty grid.
            return outputs[0] if self.output_count == 1 else tuple(outputs)
        grid, block, kernel_args, entry, shared_mem = self.launch(constants, outputs, *args)
        function = self._entry(functions, entry)
        self._launch(function, grid, block, kernel_args, shared_mem, device)
        return outputs[0] if self.output_count == 1 else tuple(outputs)

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

    def _launch(self, function, grid, block, kernel_args, shared_mem, device):
        """Launches with what the launch function returned, tensors as their pointers."""
        pointers = []
        for index, value in enumerate(kernel_args):
            if isinstance(value, Kept):
                value = value.tensor
            if isinstance(value, torch.Tensor):
                self._check_device(value, device, index)
                value = value.data_ptr()
            pointers.append(value)
        stream = torch._C._cuda_getCurrentRawStream(device)
        if self.library.trace or _PROFILER._is_profiler_enabled:
            with _trace_range(self.kernel.label(device)):
                function.launch(grid, block, pointers, shared_mem, stream)
        else:
            function.launch(grid, block, pointers, shared_mem, stream)

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



# --- torch internals ------------------------------------------------------------------------
# Everything of torch's that is not its public API is used in the two functions below (and
# `torch._C._cuda_getCurrentRawStream`, the current stream's raw handle, on each launch, and
# `_PROFILER._is_profiler_enabled`, whether a profiler runs, on each launch).


class _PublicProfilerCheck:
    """Whether a profiler runs, asked through torch's public function: for a torch whose
    ``torch.autograd.profiler`` has no ``_is_profiler_enabled`` flag."""

    @property
    def _is_profiler_enabled(self):
        return torch.autograd._profiler_enabled()


#: What a launch asks whether a profiler runs: torch's module flag, set by torch.profiler and
#: torch.autograd.profiler while they record (one attribute read, ~30 ns), where it exists.
_PROFILER = (
    torch.autograd.profiler
    if isinstance(getattr(torch.autograd.profiler, "_is_profiler_enabled", None), bool)
    else _PublicProfilerCheck()
)

#: Torch releases (major, minor) the light Autograd kernel was checked on (2.11: the CPU tests
#: and the H200 runs). On any other, ops get torch.library.register_autograd's kernel: the
#: same gradients, and 4-15 µs more per call that needs none (docs/benchmarks.md, "Host cost
#: of one call").
LIGHT_AUTOGRAD_TORCH = ((2, 11),)


def _parse_schema(text):
    """The schema ``text`` as the dispatcher reads it. torch has no public parser;
    ``torch.library.Library.define`` parses the same text with this one."""
    return torch._C.parse_schema(text)


def _torch_release():
    release = torch.__version__.split("+", 1)[0].split(".")
    try:
        return int(release[0]), int(release[1])
    except (IndexError, ValueError):
        return None


def _light_autograd(op, torch_library, backward, setup_context):
    """Registers ``op``'s Autograd kernel made lighter for the common call that needs no
    gradient: it goes straight to the CUDA implementation when nothing but fallthrough keys
    lies between (no fake tensors, no functionalization, no mode), instead of the second trip
    through the dispatcher that ``register_autograd``'s kernel makes. Only on the torch
    releases of ``LIGHT_AUTOGRAD_TORCH``, whose private dispatcher API it uses (the keyset
    after Autograd, redispatch, ``_AutoDispatchBelowAutograd``, ``_any_requires_grad``);
    returns whether it registered."""
    if _torch_release() not in LIGHT_AUTOGRAD_TORCH:
        return False
    overload = op.callable
    below_autograd = torch._C._after_autograd_keyset
    cuda = torch._C.DispatchKey.CUDA

    def forward(ctx, keyset, *args):
        with torch._C._AutoDispatchBelowAutograd():
            output = overload.redispatch(keyset & below_autograd, *args)
        setup_context(ctx, args, output)
        return output

    def backward_with_keyset(ctx, *grads):
        needs_input_grad = ctx.needs_input_grad
        ctx.needs_input_grad = needs_input_grad[1:]
        try:
            grads = backward(ctx, *grads)
        finally:
            ctx.needs_input_grad = needs_input_grad
        return (None, *grads) if isinstance(grads, tuple) else (None, grads)

    function = type(
        f"{op.library.namespace}_{op.name}_backward",
        (torch.autograd.Function,),
        {"forward": staticmethod(forward), "backward": staticmethod(backward_with_keyset)},
    )

    def autograd_kernel(keyset, *args):
        if torch._C.is_grad_enabled() and torch._C._any_requires_grad(*args):
            return function.apply(keyset, *args)
        below = keyset & below_autograd
        if below.highestPriorityTypeId() == cuda:
            return op.cuda(*args)
        with torch._C._AutoDispatchBelowAutograd():
            return overload.redispatch(below, *args)

    torch_library.impl(op.name, autograd_kernel, "Autograd", with_keyset=True)
    return True
