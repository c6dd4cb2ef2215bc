"""Prebuilt CUDA kernels from Python wheels, loaded without a compiler.

A kernel library ships its cubins in ``<package>/_prebuilt/`` and opens them from its own
``__init__``::

    import kwheel
    _registry = kwheel.open(__name__)

Its users then ask what loads here and launch kernels on torch tensors::

    _registry.status()                       # {"layernorm_bf16": "available: prebuilt ...", ...}
                                             # and {"_C (module)": "available: module ..."}
    layernorm = _registry.load("layernorm_bf16")
    block = layernorm.constants["BLOCK_SIZE"]
    layernorm.launch(rows, block, [out, x, gamma, beta, rows, cols, 1e-5])

``select`` answers for any device without a GPU, and ``unsupported_shape_reason`` for any
shape, from the kernel's declared requirements (None when the kernel takes it)::

    _registry.select("layernorm_bf16", "sm_100", cuda="13.0")   # -> cu130/sm_100a
    _registry.unsupported_shape_reason("swiglu", rows=4, width=5)
    # -> "the last dimension of x must be even: ...: requires `width % 2 == 0`, but width = 5"

The runtime's CUDA build is torch's (``torch.version.cuda``) when torch is imported, else
``KWHEEL_CUDA_BUILD``, else the newest build of the bundle that the driver supports; the torch
version checked against each variant's pin is ``torch.__version__`` when torch is imported.
``import kwheel`` never imports torch. Both are read on the first call that needs the GPU, so a
library may be imported before torch. ``<PACKAGE>_JIT_FALLBACK=0`` forbids compiling a kernel
that no prebuilt cubin fits.

``kwheel.torch`` (importable only where torch is) declares a kernel as a ``torch.library``
operator with a fake, autograd and a launch on torch's current stream; see docs/torch.md.

Kernels load once per device that asks: ``load(name, device=1)`` loads for ``cuda:1``
(selected for that GPU, in its primary context) whatever the current device is; ``device=None``
is the registry's own device (torch's current device when the registry first touched the GPU,
else 0). ``kwheel.provenance()`` lists every kernel loaded in the process, per device, with the
variant, source and key its trace ranges name (docs/provenance.md).
"""

# Imported under private names, so that ``dir(kwheel)`` is the API: ``__all__``, the
# constants below and the submodules (``kwheel.build``, ``kwheel.torch``), nothing of the
# standard library.
import importlib.util as _importlib_util
import os as _os
import site as _site
import sys as _sys
import threading as _threading
import warnings as _warnings

from . import _kwheel
from ._kwheel import (
    ArgumentError,
    Bundle,
    Function,
    Kernel,
    KwheelError,
    NoFitError,
    NoGpuError,
    Provenance,
    Selection,
    UnknownKernelError,
)

__version__ = _kwheel.__version__

__all__ = [
    "ArgumentError",
    "Bundle",
    "Function",
    "Kernel",
    "KwheelError",
    "ModuleArchWarning",
    "NoFitError",
    "NoGpuError",
    "Provenance",
    "Registry",
    "Selection",
    "TensorMap",
    "UnknownKernelError",
    "find_bundle",
    "open",
    "provenance",
    "tensor_map",
    "PREBUILT_DIR",
    "INDEX_FILE",
    "LOOKUP_FILE",
]

PREBUILT_DIR = "_prebuilt"
INDEX_FILE = "index.json"
# What marks a bundle: the loader's index, all a wheel ships (a bundle directory that
# `dev bundle-kernels` writes has `index.json` beside it).
LOOKUP_FILE = "kernels.idx"


class ModuleArchWarning(UserWarning):
    """An extension module loaded at import has no device code for a visible GPU: its CUDA ops
    would fail there with CUDA's bare "no kernel image is available". Read from NVML, without
    initialising CUDA; ``warnings.simplefilter("error", kwheel.ModuleArchWarning)`` makes it an
    error."""


def open(package_or_path, *, cuda=None, torch=None, jit=None, device=None):
    """The registry of a package's bundle, or of a bundle directory.

    ``package_or_path``: an importable package name (``"af3_kernels"``, found without importing
    it, so a package may open itself from its own ``__init__``), or a path to a bundle
    directory or to a directory holding ``_prebuilt/``. ``cuda`` (``"12.9"``), ``torch``
    (``"2.13.0+cu129"``) and ``device`` override what the runtime would read from torch and
    the environment; ``jit=True``/``False`` overrides ``<PACKAGE>_JIT_FALLBACK``.
    """
    registry = Registry(find_bundle(package_or_path), cuda=cuda, torch=torch, jit=jit, device=device)
    # A module's ops live in torch.ops: without an importable torch there is nothing to call
    # them through, and the package's cubins still load (docs/extensions.md).
    if registry._bundle.modules and _torch_importable():
        _load_modules(registry)
    return registry


def _torch_importable():
    """Whether this interpreter has torch (imported, or importable), without importing it."""
    import importlib.util

    return "torch" in _sys.modules or importlib.util.find_spec("torch") is not None


def find_bundle(package_or_path):
    """The bundle directory of a path or a package name (see ``open``).

    A path is looked at by the rule the CLI keeps (``_kwheel.bundle_at``: the path itself,
    then its ``_prebuilt/``; the cases are ``prebuilt/tests/fixtures/bundle_folders.json``);
    a name that holds no bundle as a path is a package, found by this interpreter's imports.
    """
    path = _os.fsdecode(_os.fspath(package_or_path))
    found = _kwheel.bundle_at(path)
    if found is not None:
        return _os.path.abspath(found)
    if isinstance(package_or_path, str) and _is_package_name(package_or_path):
        return _package_bundle(package_or_path)
    raise KwheelError(
        f"no kwheel bundle at `{path}`: neither it nor `{_os.path.join(path, PREBUILT_DIR)}` "
        f"holds a `{LOOKUP_FILE}` (or an `{INDEX_FILE}`)"
    )


def _is_bundle(directory):
    """Whether ``directory`` holds a bundle's index: ``kernels.idx``, or the ``index.json`` of
    a bundle written before it existed (``_kwheel.holds_bundle``, the CLI's rule)."""
    return _kwheel.holds_bundle(directory)


def _is_package_name(text):
    return all(part.isidentifier() for part in text.split("."))


def _package_bundle(name):
    """``<package dir>/_prebuilt`` for an importable package, without importing it."""
    module = _sys.modules.get(name)
    # A package that opens itself from its own __init__ is in sys.modules, with __path__ set.
    locations = list(getattr(module, "__path__", None) or [])
    if not locations:
        try:
            spec = _importlib_util.find_spec(name)
        except (ImportError, ValueError) as error:
            raise KwheelError(f"cannot find package `{name}`: {error}") from error
        if spec is None:
            raise KwheelError(f"no package `{name}` is importable from this interpreter")
        locations = list(spec.submodule_search_locations or [])
        if not locations:
            raise KwheelError(
                f"`{name}` is a module, not a package: a kwheel bundle lives in a package's "
                f"`{PREBUILT_DIR}/` directory"
            )
    for location in locations:
        bundle = _os.path.join(location, PREBUILT_DIR)
        if _is_bundle(bundle):
            return bundle
    raise KwheelError(
        f"package `{name}` ({', '.join(locations)}) has no `{PREBUILT_DIR}/{LOOKUP_FILE}`: "
        "it was not installed from a wheel that kwheel built"
    )


def _torch():
    """The torch module if this process has imported it; kwheel never imports it."""
    return _sys.modules.get("torch")


# Extension modules loaded in this process, by (bundle, module): what `provenance()` lists.
# How each came to be, in `provenance()`'s words.
_MODULE_REASONS = {
    "module": "extension module `{module}`, loaded at import",
    "jit-compiled": "extension module `{module}`, built at import by the JIT fallback",
    "jit-cache": "extension module `{module}`, read at import from the JIT cache",
}
_MODULES = {}
_MODULES_LOCK = _threading.Lock()


def _load_modules(registry):
    """Loads every extension module of ``registry``'s bundle, once per process: the build for
    the running torch (version, CUDA build) and CPU, its bytes verified against the index's
    sha256 and loaded from a sealed memory file, so what runs is what was verified, never a
    path read again. Registration (``STABLE_TORCH_LIBRARY``, ``TORCH_LIBRARY``) runs as the
    library loads, so ``torch.ops.<namespace>.<op>`` works from here on. CUDA is not
    initialised: a visible GPU (read from NVML) that a module's archs do not cover gets a
    ``ModuleArchWarning``. A module is torch code: this imports torch (docs/extensions.md)."""
    import platform

    import torch

    # A `torch` with no file is no installed torch (a stand-in module): nothing to load into.
    torch_file = getattr(torch, "__file__", None)
    if not torch_file:
        return
    torch_cuda = registry._cuda or torch.version.cuda
    with _MODULES_LOCK:
        for name in registry._bundle.modules:
            key = (registry.path, name)
            if key in _MODULES:
                continue
            # No fitting build: the JIT fallback builds one from the shipped sources against
            # this torch (its folder), unless jit=False or <PACKAGE>_JIT_FALLBACK=0.
            data, variant, module_key, source = registry._bundle.read_module(
                name, torch=registry._torch or torch.__version__, cuda=torch_cuda,
                cpu=platform.machine(), torch_dir=_os.path.dirname(torch_file),
                jit=registry._jit,
            )
            _load_native(f"{registry.package}.{name}", data)
            # NVML, not CUDA: a forked DataLoader worker must still be able to initialise it.
            warning = _kwheel.module_device_warning(registry._bundle, name, variant)
            if warning is not None:
                _warnings.warn(f"{registry.package}: {warning}", ModuleArchWarning, stacklevel=3)
            _MODULES[key] = {
                "package": registry.package,
                "bundle": str(registry.path),
                "module": name,
                "variant": variant,
                "source": "module" if source == "module" else "jit",
                "how": source,
                "key": module_key,
            }


# The sealed memory files of the native libraries loaded from verified bytes, kept open for
# the life of the process: the dynamic loader knows a library by the name it was opened by
# (`/proc/self/fd/N`), so a closed file's number, reused by the next one, would hand back
# the library loaded first instead of loading the new one.
_NATIVE_FILES = []


def _load_native(label, data):
    """Loads the shared library ``data`` (verified bytes) into the process, ``RTLD_GLOBAL``,
    from a sealed memory file: what runs is these bytes, never a path read again. Raises
    ``KwheelError`` when the dynamic loader did not map this file (it returned a library it
    already had under the same name)."""
    import ctypes
    import fcntl

    fd = _os.memfd_create(label, _os.MFD_CLOEXEC | _os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(data)
        while view:
            view = view[_os.write(fd, view):]
        seals = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
        inode = _os.fstat(fd).st_ino
        # Not torch.ops.load_library: it resolves the path, which names no file here.
        ctypes.CDLL(f"/proc/self/fd/{fd}", mode=ctypes.RTLD_GLOBAL)
        if not _maps_file(inode, label):
            raise KwheelError(
                f"{label}: the dynamic loader did not load the module's verified bytes from "
                f"/proc/self/fd/{fd}: it returned a library it had already loaded under that name"
            )
    except BaseException:
        _os.close(fd)
        raise
    _NATIVE_FILES.append(fd)


def _maps_file(inode, label):
    """Whether this process maps the memory file ``label`` with this inode."""
    import builtins

    with builtins.open("/proc/self/maps") as maps:  # this module's `open` is kwheel's
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[4] == str(inode) and f"memfd:{label}" in fields[5]:
                return True
    return False


# Kernels whose torch op ran its reference on a device instead (kwheel.torch's fallback), by
# (package, kernel, device): what `provenance()` lists with source `fallback`.
_FALLBACKS = {}
_FALLBACKS_LOCK = _threading.Lock()


def _note_fallback(package, kernel, device, reason):
    """Records that ``kernel`` of ``package`` runs its torch reference on ``device``."""
    with _FALLBACKS_LOCK:
        _FALLBACKS.setdefault((package, kernel, int(device)), str(reason))


def provenance():
    """Every kernel loaded in this process (and still held), per device, in load order, then
    every kernel whose torch op fell back to its reference: one dict each, with ``package``,
    ``kernel``, ``device`` (ordinal), ``variant`` (``cu130/sm_90a``; for the JIT the target it
    was compiled for; ``reference`` for a fallback), ``source`` (``prebuilt``, ``jit-cache``,
    ``jit-compiled`` or ``fallback``), ``key`` (in full; ``""`` for a fallback), ``reason``,
    ``bundle`` and ``label``, the name of its ranges in profiler and NVTX traces. Extension
    modules loaded at import follow, with source ``module`` (a shipped build) or ``jit`` (built
    by the JIT fallback, or read from its cache), the module's name as ``kernel``, ``variant``
    ``cu130/x86_64`` and device -1."""
    listed = _kwheel.loaded_kernels()
    with _MODULES_LOCK:
        # Extension modules: one entry each, `kernel` naming the module, on no device.
        for loaded in _MODULES.values():
            module = loaded["module"]
            listed.append(
                {
                    "package": loaded["package"],
                    "bundle": loaded["bundle"],
                    "kernel": module,
                    "device": -1,
                    "variant": loaded["variant"],
                    "source": loaded["source"],
                    "key": loaded["key"],
                    "reason": _MODULE_REASONS[loaded["how"]].format(module=module),
                    "label": _kwheel.trace_label(module, loaded["variant"], loaded["source"], loaded["key"], -1),
                }
            )
    with _FALLBACKS_LOCK:
        fallbacks = list(_FALLBACKS.items())
    for (package, kernel, device), reason in fallbacks:
        listed.append(
            {
                "package": package,
                "bundle": None,
                "kernel": kernel,
                "device": device,
                "variant": "reference",
                "source": "fallback",
                "key": "",
                "reason": reason,
                "label": _kwheel.trace_label(kernel, "reference", "fallback", "", device),
            }
        )
    return listed


class _trace_range:
    """A range named ``label`` in torch.profiler traces (``torch.profiler.record_function``,
    while a profiler records) and, where torch has NVTX, in Nsight's (``torch.cuda.nvtx``);
    nothing without torch.
    ``Kernel.launch(trace=True)`` and kwheel.torch's ops mark their launches with it."""

    __slots__ = ("label", "_record", "_nvtx")

    def __init__(self, label):
        self.label = label
        self._record = None
        self._nvtx = None

    def __enter__(self):
        torch = _torch()
        if torch is None:
            return self
        # A profiler range only while a profiler records: outside one it costs ~15 µs and
        # nothing reads it; NVTX is there for tools that attach from outside (Nsight).
        if torch.autograd._profiler_enabled():
            record = torch.profiler.record_function(self.label)
            record.__enter__()
            self._record = record
        # A torch built without NVTX has stubs that raise; such a torch has no `_C._nvtx`.
        if hasattr(torch._C, "_nvtx"):
            nvtx = torch.cuda.nvtx
            nvtx.range_push(self.label)
            self._nvtx = nvtx
        return self

    def __exit__(self, kind, value, traceback):
        nvtx, record = self._nvtx, self._record
        self._nvtx = self._record = None
        if nvtx is not None:
            nvtx.range_pop()
        if record is not None:
            record.__exit__(kind, value, traceback)
        return False


def _torch_runtime():
    """(CUDA version, torch version, current device) of an imported torch, each or None."""
    torch = _torch()
    if torch is None:
        return None, None, None
    version = getattr(torch, "__version__", None)
    cuda = getattr(getattr(torch, "version", None), "cuda", None)
    device = None
    torch_cuda = getattr(torch, "cuda", None)
    try:
        if torch_cuda is not None and torch_cuda.is_initialized():
            device = torch_cuda.current_device()
    except Exception:  # a torch without CUDA: no device to follow
        device = None
    return (str(cuda) if cuda else None), (str(version) if version else None), device


def _site_packages():
    """Where this interpreter installs packages: NVIDIA's NVRTC wheels that torch pulls in."""
    found = []
    try:
        found.extend(_site.getsitepackages())
    except AttributeError:  # some virtualenv builds lack it
        pass
    try:
        found.append(_site.getusersitepackages())
    except AttributeError:
        pass
    found.extend(entry for entry in _sys.path if entry)
    unique = []
    for entry in found:
        if _os.path.isdir(_os.path.join(entry, "nvidia")) and entry not in unique:
            unique.append(entry)
    return unique


class Registry:
    """A bundle's kernels. ``select`` and ``kernels`` read the index only; ``status``,
    ``is_available``, ``unavailable_reason`` and ``load`` use the GPU, and the first of them
    fixes the CUDA build, torch version and device (see the module docs)."""

    def __init__(self, bundle, *, cuda=None, torch=None, jit=None, device=None):
        self._bundle = Bundle(_os.fspath(bundle))
        self._cuda = cuda
        self._torch = torch
        self._jit = jit
        self._device = device
        self._runtime = None
        self._lock = _threading.Lock()

    @property
    def path(self):
        """The bundle directory."""
        return self._bundle.path

    @property
    def package(self):
        """The kernel library's distribution name (``af3-kernels``)."""
        return self._bundle.package

    @property
    def kernels(self):
        """Every kernel's name."""
        return self._bundle.kernels

    @property
    def bundle(self):
        """The bundle's index (``kwheel.Bundle``)."""
        return self._bundle

    def constants(self, name):
        """Kernel ``name``'s exported constants (``{"BLOCK_SIZE": 256}``), without a GPU."""
        return self._bundle.constants(name)

    def unsupported_shape_reason(self, name, /, device=None, **inputs):
        """Why kernel ``name`` cannot run with ``inputs`` (the manifest's ``inputs`` of the
        kernel, by keyword: ints, torch sizes, bools), or None: the first of its ``requires``
        those values break, in words with the values. Reads the index only: no GPU, nothing
        loaded, so a library can call it at setup. ``device`` (as for ``select``) names the
        variant to answer for; every variant shares the kernel's constants, so the answer is
        the same for any device and for none. Raises ``TypeError`` for inputs the kernel does
        not declare, or a missing one."""
        return self._bundle.unsupported_shape_reason(name, device, **inputs)

    def select(self, name, device, cuda=None, torch=None, driver=None):
        """Which variant of ``name`` a device would load: a dry run, no GPU needed.

        ``device``: ``"sm_90"``, ``"9.0"`` or ``(9, 0)``; ``cuda``: the runtime's CUDA build
        (``"12.9"``; default the newest of the bundle the driver supports); ``torch``: its
        version (default: not checked); ``driver``: the CUDA version the driver supports
        (``"13.0"``) or its release (``"580.65"``; default: just new enough). Returns a
        ``Selection`` (``str()`` is ``cu129/sm_90a``); raises ``NoFitError`` listing every
        variant and why it does not fit.
        """
        return self._bundle.select(name, device, cuda, torch, driver)

    def fetch(self, device, cuda=None, torch=None, driver=None):
        """Download, verify and cache what ``device`` would load and this wheel leaves in its
        store, so the machine can run offline. Arguments as for ``select``; returns the report
        as text and raises ``KwheelError`` when anything could not be fetched."""
        return self._bundle.fetch(device, cuda, torch, driver)

    def runtime(self):
        """The ``kwheel._kwheel.Registry`` for this process, opened on first use."""
        runtime = self._runtime
        if runtime is not None:
            return runtime
        with self._lock:
            if self._runtime is None:
                torch_cuda, torch_version, torch_device = _torch_runtime()
                cuda = self._cuda or torch_cuda
                device = self._device
                if device is None:
                    device = torch_device if torch_device is not None else 0
                self._runtime = _kwheel.Registry(
                    self._bundle.path,
                    cuda=cuda,
                    torch=self._torch or torch_version,
                    jit=self._jit,
                    site_packages=_site_packages(),
                    device=device,
                    # Companion part packages of a registry-sized wheel set, wherever pip put them.
                    search_path=[entry for entry in _sys.path if entry],
                )
            return self._runtime

    @property
    def trace(self):
        """Whether ``<PACKAGE>_TRACE=1`` asks for every op call to be marked in traces."""
        return self.runtime().trace

    @property
    def trace_variable(self):
        """The variable that turns tracing on: ``AF3_KERNELS_TRACE`` for ``af3-kernels``."""
        return _kwheel.trace_variable(self.package)

    def status(self, device=None):
        """Every kernel and extension module and whether it loads on ``device`` (an ordinal;
        ``None``: the registry's own), as text (``available: prebuilt cu130/sm_90a: ...`` or
        ``unavailable: <why>``). A module is listed as ``"<module> (module)"`` (as ``kwheel
        bundle list`` shows it): ``available: module cu130/x86_64: loaded at import (...); its
        fatbin covers sm_90 (sm_90a) on cuda:0 (...)``. Never compiles; a module's device is
        read from NVML unless CUDA is already initialised, so this never initialises CUDA for
        one."""
        ordinal = _ordinal(device)
        statuses = self.runtime().status(ordinal)
        if self._bundle.modules:
            # The device is read once (NVML, or torch), for every module.
            ordinal = self.runtime().device if ordinal is None else ordinal
            sight = _module_device(ordinal)
            for name in self._bundle.modules:
                statuses[_module_entry(name)] = self._module_status(name, ordinal, sight)[1]
        return statuses

    def is_available(self, name, device=None):
        """Whether kernel ``name`` (or extension module ``name``, or ``"<name> (module)"``)
        loads on ``device``."""
        return self.unavailable_reason(name, device) is None

    def unavailable_reason(self, name, device=None):
        """Why kernel ``name`` (or extension module ``name``, or ``"<name> (module)"``) does
        not load on ``device``, or None when it does."""
        module = self._module_named(name)
        if module is not None:
            available, text = self._module_status(module, _ordinal(device))
            return None if available else text.removeprefix("unavailable: ")
        return self.runtime().unavailable_reason(name, _ordinal(device))

    def _module_named(self, name):
        """The extension module ``name`` names (itself or ``"<module> (module)"``), or None: a
        kernel's name wins over a module's."""
        modules = self._bundle.modules
        if not modules:
            return None
        if name.endswith(_MODULE_SUFFIX) and name[: -len(_MODULE_SUFFIX)] in modules:
            return name[: -len(_MODULE_SUFFIX)]
        if name in modules and name not in self._bundle.kernels:
            return name
        return None

    def _module_status(self, name, ordinal, sight=None):
        """``(available, text)`` of extension module ``name`` on device ``ordinal`` (``None``:
        the registry's own); ``sight``: that device as ``_module_device`` read it, when the
        caller has."""
        import platform

        if ordinal is None:
            ordinal = self.runtime().device
        with _MODULES_LOCK:
            loaded = _MODULES.get((self.path, name))
        torch = _torch()
        version = cuda = None
        if torch is not None:
            version = self._torch or getattr(torch, "__version__", None)
            cuda = self._cuda or getattr(getattr(torch, "version", None), "cuda", None)
        seen, unseen = sight if sight is not None else _module_device(ordinal)
        return _kwheel.module_status_text(
            self._bundle,
            name,
            loaded=None if loaded is None else (loaded["variant"], loaded["how"]),
            torch=None if version is None else str(version),
            cuda=None if cuda is None else str(cuda),
            cpu=platform.machine(),
            device=seen,
            unseen=unseen,
        )

    def load(self, name, device=None):
        """Kernel ``name``, loaded in ``device``'s primary context (PyTorch's), selected for
        that GPU, once per device. ``device``: an ordinal, a ``torch.device('cuda', n)`` or
        ``"cuda:n"``; ``None``: the registry's own device."""
        return self.runtime().load(name, _ordinal(device))

    def loaded(self):
        """Every kernel this registry has loaded, on every device."""
        return self.runtime().loaded()

    def query(self, device=None):
        """What selection sees on ``device``: capability, driver, CUDA build, torch. Needs a
        GPU."""
        return self.runtime().query(_ordinal(device))

    def __repr__(self):
        return f"kwheel.Registry({str(self.path)!r}, package={self.package!r})"


# How `status()` names an extension module: as `kwheel bundle list` does, apart from kernels.
_MODULE_SUFFIX = " (module)"


def _module_entry(name):
    """``"_C (module)"``: a module's key in ``status()``."""
    return f"{name}{_MODULE_SUFFIX}"


def _module_device(ordinal):
    """``((ordinal, name, (major, minor)), None)`` for device ``ordinal``, else ``(None,
    why)``: from torch where this process has initialised CUDA, else from NVML, which needs no
    CUDA context (a forked worker can still initialise CUDA after it)."""
    torch = _torch()
    torch_cuda = getattr(torch, "cuda", None) if torch is not None else None
    try:
        initialised = torch_cuda is not None and torch_cuda.is_initialized()
    except Exception:  # a torch without CUDA
        initialised = False
    if initialised:
        try:
            name = torch_cuda.get_device_name(ordinal)
            capability = tuple(torch_cuda.get_device_capability(ordinal))
        except Exception as error:  # an ordinal past the device count
            return None, f"torch cannot read cuda:{ordinal}: {error}"
        return (ordinal, name, capability), None
    devices, why = _kwheel.visible_devices()
    if devices is None:
        return None, why
    for found in devices:
        if found["ordinal"] == ordinal:
            return (ordinal, found["name"], tuple(found["capability"])), None
    return None, f"NVML shows {len(devices)} visible device(s), no cuda:{ordinal}"


def _ordinal(device):
    """A device ordinal from an int, ``torch.device('cuda', n)``, ``"cuda:n"``, or None."""
    if device is None or isinstance(device, int):
        return device
    index = getattr(device, "index", None)
    kind = getattr(device, "type", None)
    if kind is None and isinstance(device, str):
        kind, _, number = device.partition(":")
        index = int(number) if number.isdigit() else None
    if kind != "cuda":
        raise ValueError(f"{device!r} is not a CUDA device")
    if index is None:  # `cuda` alone: torch's current device, as torch reads it
        torch = _torch()
        if torch is not None and torch.cuda.is_initialized():
            index = torch.cuda.current_device()
    return index


class TensorMap(bytes):
    """An encoded tensor map (``CUtensorMap``): 128 bytes, passed to ``launch`` as they are.
    A type of its own so that ``kwheel.torch`` never keeps one in a plan: it records a
    tensor's address in an encoding of the driver's."""

    __slots__ = ()


def tensor_map(
    tensor,
    box,
    *,
    swizzle=0,
    element_strides=None,
    l2_promotion=0,
    oob_nan=False,
):
    """A TMA descriptor (``CUtensorMap``, 128 bytes) for ``tensor``, tiled by ``box``.

    What a kernel that copies tiles with the Tensor Memory Accelerator takes as a
    ``__grid_constant__ const CUtensorMap`` parameter (CUTLASS 3 and CuTe kernels on Hopper and
    Blackwell): pass the returned ``bytes`` to ``launch`` like any struct argument.

    ``box`` is the tile one copy moves into shared memory, in the tensor's own order (for a
    row-major ``[rows, cols]`` tensor, ``(box_rows, box_cols)``), as are ``element_strides``
    (default: all 1). ``swizzle`` is the shared-memory swizzle span in bytes (0, 32, 64, 128),
    ``l2_promotion`` the L2 promotion in bytes (0, 64, 128, 256); ``oob_nan`` fills elements
    outside the tensor with NaN instead of zero. The tensor's last dimension must be dense
    (stride 1), its address and every other stride a multiple of 16 bytes.

    The map records the tensor's address: make it again for each tensor, as a launch function
    of ``kwheel.torch`` does on every call (a plan never keeps it). A map that breaks one of
    the driver's rules raises ``ValueError`` naming the rule and the dimension, with or
    without a GPU.
    """
    shape = tuple(tensor.shape)
    strides = tuple(tensor.stride())
    rank = len(shape)
    box = tuple(box)
    if len(box) != rank:
        raise ValueError(f"the box {box} has {len(box)} dimensions; the tensor has {rank} ({shape})")
    if element_strides is None:
        element_strides = (1,) * rank
    element_strides = tuple(element_strides)
    if len(element_strides) != rank:
        raise ValueError(
            f"element_strides {element_strides} has {len(element_strides)} dimensions; "
            f"the tensor has {rank}"
        )
    if rank and strides[-1] != 1:
        raise ValueError(
            f"the tensor's last dimension has stride {strides[-1]}; a tensor map needs it dense "
            "(stride 1): map a contiguous copy, or transpose the map"
        )
    if getattr(tensor, "device", None) is not None and getattr(tensor.device, "type", "cuda") != "cuda":
        raise ValueError(f"a tensor map needs a CUDA tensor, not one on {tensor.device}")
    size = tensor.element_size()
    return TensorMap(_kwheel.encode_tensor_map(
        tensor.data_ptr(),
        str(tensor.dtype),
        [int(n) for n in reversed(shape)],
        [int(n) * size for n in reversed(strides[:-1])],
        [int(n) for n in reversed(box)],
        [int(n) for n in reversed(element_strides)],
        int(swizzle),
        int(l2_promotion),
        bool(oob_nan),
    ))
