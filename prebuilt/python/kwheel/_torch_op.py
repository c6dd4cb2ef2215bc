"""``kwheel.torch``'s ops: ``Op`` (one declared op: its schema read and checked, its shape and
launch functions, its plans, its fallback and its registration with torch) and ``Call``
(what ``Library.lookup`` returns under ``torch.compile``). The public names are
``kwheel.torch``'s; see docs/torch.md."""

import inspect
import warnings

import torch

from . import NoFitError, _kwheel, _note_fallback, _trace_range
from ._torch_plans import (
    _ALIGNMENT,
    _CONSTANT,
    _INPUT,
    _OUTPUT,
    _PLANS_PER_OP,
    _UNCACHEABLE,
    Kept,
    _find,
    _is_buffer,
    _looks_addressed,
    _Probe,
    _same,
)
from ._torch_private import PROFILER as _PROFILER
from ._torch_private import intercepted as _intercepted
from ._torch_private import light_autograd as _light_autograd
from ._torch_schema import _scalar_check, _schema_name, read_schema

# Dynamo knows the function, not its name: under `torch.compile` this is True.
_is_compiling = torch.compiler.is_compiling
# The tensor types a direct call takes: a parameter disables `__torch_function__` as a
# tensor does, so either is the plain tensor the dispatcher would hand the kernel.
_PLAIN = frozenset((torch.Tensor, torch.nn.Parameter))


class FallbackWarning(UserWarning):
    """An op runs its torch reference because no prebuilt variant of its kernel fits this
    device and the JIT is disabled. Turn it into an error to refuse instead:
    ``warnings.simplefilter("error", kwheel.torch.FallbackWarning)``."""

    __module__ = "kwheel.torch"  # where it is documented and imported from


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

    __module__ = "kwheel.torch"  # where it is documented and imported from

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

    __module__ = "kwheel.torch"  # where it is documented and imported from

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
