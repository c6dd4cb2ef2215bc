//! `Kernel`, `Function` and `Provenance`: a loaded kernel, its entries, where its cubin came
//! from.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use prebuilt::driver::{LaunchAttributes, LaunchConfig};
use prebuilt::index::Constant;
use prebuilt::registry::Function as EntryFunction;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::arguments::{dims, encode, launch_attributes, stream_handle};
use crate::errors::{driver_error, load_error, ArgumentError};

/// A loaded kernel on one device: its entries, constants and provenance. Launch it with
/// `launch`, on that device.
#[pyclass(frozen, module = "kwheel._kwheel")]
pub struct Kernel {
    inner: prebuilt::Kernel,
    device: u32,
    label: String,
    /// The registry it was loaded from, whose index holds its requirements.
    registry: Arc<prebuilt::Registry>,
    /// Its record with its requirements, read on the first `unsupported_shape_reason`.
    requirements: OnceLock<prebuilt::KernelRecord>,
}

impl Kernel {
    pub(crate) fn new(inner: prebuilt::Kernel, registry: Arc<prebuilt::Registry>) -> Kernel {
        Kernel {
            device: inner.device(),
            label: inner.trace_label(),
            inner,
            registry,
            requirements: OnceLock::new(),
        }
    }

    fn entry(&self, py: Python<'_>, entry: Option<&str>) -> PyResult<EntryFunction> {
        match entry {
            Some(entry) => self
                .inner
                .function(entry)
                .map_err(|error| load_error(py, &error)),
            None => match self.inner.functions() {
                [only] => Ok(only.clone()),
                functions => Err(ArgumentError::new_err(format!(
                    "`{}` has {} entries ({}): say which with entry=",
                    self.inner.name(),
                    functions.len(),
                    functions
                        .iter()
                        .map(|function| format!("`{}`", function.name()))
                        .collect::<Vec<_>>()
                        .join(", ")
                ))),
            },
        }
    }
}

#[pymethods]
impl Kernel {
    /// The kernel's name.
    #[getter]
    fn name(&self) -> &str {
        self.inner.name()
    }

    /// Where its cubin came from: `kind` (`prebuilt`, `jit-cache`, `jit-compiled`), `variant`
    /// and `key`; `str()` reads `prebuilt cu130/sm_90a (key …)`.
    #[getter]
    fn provenance(&self) -> Provenance {
        Provenance::from(self.inner.provenance())
    }

    /// Why this cubin was chosen, or compiled.
    #[getter]
    fn reason(&self) -> &str {
        self.inner.reason()
    }

    /// The manifest's exported constants (`{"BLOCK_SIZE": 256}`): launch geometry comes from
    /// here, never from a hard-coded number.
    #[getter]
    fn constants<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        constants_dict(py, self.inner.constants())
    }

    /// The constants the compiler computed on the loaded variant (the manifest's
    /// `computed`), by entry: `{"conv<Traits<128>>": {"smem": 1024, "threads": 128}}`.
    #[getter]
    fn computed<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        for function in self.inner.functions() {
            dict.set_item(function.name(), function.computed().clone())?;
        }
        Ok(dict)
    }

    /// The layout of each C struct the manifest names (`structs`) on the loaded variant:
    /// `{"ConvParams": {"size": 40, "align": 8, "fields": [("batch", 0, 4), ...]}}`; a
    /// `ctypes.Structure` argument with `_kwheel_struct_` is checked against it at launch.
    #[getter]
    fn structs<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        crate::structs::structs_dict(py, self.inner.structs())
    }

    /// Why this kernel cannot run with `inputs` (its manifest's `inputs`, by keyword: ints,
    /// torch sizes, bools), or `None`: its first requirement those values break, in words with
    /// the values, over the constants of the variant it loaded.
    #[pyo3(signature = (**inputs))]
    fn unsupported_shape_reason(
        &self,
        py: Python<'_>,
        inputs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Option<String>> {
        let name = self.inner.name();
        let record = match self.requirements.get() {
            Some(record) => record,
            None => {
                let catalog = self.registry.catalog();
                let found = catalog.requirements(name);
                let record = crate::requires::known_record(py, catalog, name, found)?;
                self.requirements.get_or_init(|| record)
            }
        };
        crate::requires::answer(name, record, self.inner.constants(), inputs)
    }

    /// The entries as declared (`["scale_rows<float>", "scale_rows<__nv_bfloat16>"]`).
    #[getter]
    fn entries(&self) -> Vec<String> {
        self.inner
            .functions()
            .iter()
            .map(|function| function.name().to_owned())
            .collect()
    }

    /// The device ordinal it is loaded on, and launches on.
    #[getter]
    fn device(&self) -> u32 {
        self.device
    }

    /// The variant it runs (`cu130/sm_90a`); for the JIT, the build and architecture it was
    /// compiled for.
    #[getter]
    fn variant(&self) -> &str {
        self.inner.variant()
    }

    /// The range name its traced launches carry in profiler and NVTX traces:
    /// `kwheel:<kernel> <variant> <source> <key, 12 hex digits> cuda:<device>`.
    #[getter]
    fn trace_label(&self) -> &str {
        &self.label
    }

    /// The entry `entry` (as declared, or its symbol), to launch or inspect.
    fn function(&self, py: Python<'_>, entry: &str) -> PyResult<Function> {
        Ok(Function {
            kernel: self.inner.name().to_owned(),
            inner: self.entry(py, Some(entry))?,
            device: self.device,
            label: self.label.clone(),
        })
    }

    fn __getitem__(&self, py: Python<'_>, entry: &str) -> PyResult<Function> {
        self.function(py, entry)
    }

    /// Launches an entry (`entry=`; optional when the kernel has one) with `grid` and `block`
    /// (an int or a tuple of up to three) and `args` in parameter order: objects with
    /// `data_ptr()` (torch tensors on this device, contiguous) and `None` as pointers, ints
    /// and floats as their parameter's size says, `bytes` and anything with the buffer
    /// protocol (a `ctypes.Structure`, a `bytearray`, a `memoryview`) as their bytes, packed at
    /// each call. `shared_mem`: dynamic shared memory per block, in bytes; above 48 KB the
    /// entry's limit is raised up to what the device allows. `stream`: `None` for torch's
    /// current stream (the legacy default stream when torch has not started CUDA), an int
    /// handle, or an object with `cuda_stream` or `__cuda_stream__`. `trace=True` marks the
    /// launch with a range named `trace_label` in torch.profiler and NVTX traces (see
    /// docs/provenance.md).
    ///
    /// Launch attributes, keyword only, checked against the device before the launch:
    /// `cluster` (an int or a tuple of up to three: thread block cluster dimensions, compute
    /// capability 9.0+, dividing the grid), `cooperative=True` (every block resident at once,
    /// for a grid-wide sync), `programmatic=True` (programmatic dependent launch, 9.0+: the
    /// kernel may start before the one before it on the stream ends, and waits for it with
    /// `griddepcontrol.wait`), `priority` (an int, as stream priorities: lower is higher).
    /// Returns once the launch is queued.
    #[pyo3(signature = (
        grid, block, args, shared_mem=0, stream=None, entry=None, trace=false,
        *, cluster=None, cooperative=false, programmatic=false, priority=None
    ))]
    #[allow(clippy::too_many_arguments)] // the Python signature, one parameter each
    fn launch(
        &self,
        py: Python<'_>,
        grid: &Bound<'_, PyAny>,
        block: &Bound<'_, PyAny>,
        args: &Bound<'_, PyAny>,
        shared_mem: u32,
        stream: Option<&Bound<'_, PyAny>>,
        entry: Option<&str>,
        trace: bool,
        cluster: Option<&Bound<'_, PyAny>>,
        cooperative: bool,
        programmatic: bool,
        priority: Option<i32>,
    ) -> PyResult<()> {
        let function = self.entry(py, entry)?;
        let attributes = launch_attributes(cluster, cooperative, programmatic, priority)?;
        let request = Launch::new(grid, block, args, shared_mem, stream, attributes);
        request.run_traced(
            py,
            self.inner.name(),
            &function,
            self.device,
            &self.label,
            trace,
        )
    }

    /// Waits for all work in the kernel's context, and raises the first error any of it hit.
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        let Some(context) = self.inner.context().cloned() else {
            // Only a CUDA device has a context; the runtime loads on nothing else.
            return Ok(());
        };
        py.detach(move || context.synchronize())
            .map_err(|error| driver_error(&error))
    }

    fn __repr__(&self) -> String {
        format!(
            "Kernel({:?}, provenance={:?})",
            self.inner.name(),
            self.inner.provenance().to_string()
        )
    }
}

/// One entry of a loaded kernel.
#[pyclass(frozen, module = "kwheel._kwheel")]
pub struct Function {
    kernel: String,
    inner: EntryFunction,
    device: u32,
    label: String,
}

#[pymethods]
impl Function {
    /// The entry as declared (`scale_rows<float>`).
    #[getter]
    fn name(&self) -> &str {
        self.inner.name()
    }

    /// The constants the compiler computed for this entry on the loaded variant
    /// (`{"smem": 1024, "threads": 128}`).
    #[getter]
    fn computed(&self) -> BTreeMap<String, i64> {
        self.inner.computed().clone()
    }

    /// Its symbol in the cubin (mangled for a template).
    #[getter]
    fn symbol(&self) -> &str {
        self.inner.symbol()
    }

    /// Each parameter's size in bytes, from the index.
    #[getter]
    fn param_sizes(&self) -> Vec<u32> {
        self.inner.param_sizes().to_vec()
    }

    /// The device ordinal it launches on.
    #[getter]
    fn device(&self) -> u32 {
        self.device
    }

    /// As `Kernel.trace_label`.
    #[getter]
    fn trace_label(&self) -> &str {
        &self.label
    }

    /// As `Kernel.launch`, for this entry.
    #[pyo3(signature = (
        grid, block, args, shared_mem=0, stream=None, trace=false,
        *, cluster=None, cooperative=false, programmatic=false, priority=None
    ))]
    #[allow(clippy::too_many_arguments)] // the Python signature, one parameter each
    fn launch(
        &self,
        py: Python<'_>,
        grid: &Bound<'_, PyAny>,
        block: &Bound<'_, PyAny>,
        args: &Bound<'_, PyAny>,
        shared_mem: u32,
        stream: Option<&Bound<'_, PyAny>>,
        trace: bool,
        cluster: Option<&Bound<'_, PyAny>>,
        cooperative: bool,
        programmatic: bool,
        priority: Option<i32>,
    ) -> PyResult<()> {
        let attributes = launch_attributes(cluster, cooperative, programmatic, priority)?;
        let request = Launch::new(grid, block, args, shared_mem, stream, attributes);
        request.run_traced(
            py,
            &self.kernel,
            &self.inner,
            self.device,
            &self.label,
            trace,
        )
    }

    fn __repr__(&self) -> String {
        format!(
            "Function({:?}, kernel={:?}, param_sizes={:?})",
            self.inner.name(),
            self.kernel,
            self.inner.param_sizes()
        )
    }
}

/// One launch as Python asked for it.
struct Launch<'a, 'py> {
    grid: &'a Bound<'py, PyAny>,
    block: &'a Bound<'py, PyAny>,
    args: &'a Bound<'py, PyAny>,
    shared_mem: u32,
    stream: Option<&'a Bound<'py, PyAny>>,
    attributes: LaunchAttributes,
}

impl<'a, 'py> Launch<'a, 'py> {
    fn new(
        grid: &'a Bound<'py, PyAny>,
        block: &'a Bound<'py, PyAny>,
        args: &'a Bound<'py, PyAny>,
        shared_mem: u32,
        stream: Option<&'a Bound<'py, PyAny>>,
        attributes: LaunchAttributes,
    ) -> Self {
        Launch {
            grid,
            block,
            args,
            shared_mem,
            stream,
            attributes,
        }
    }

    /// [`Launch::run`], inside the trace range `label` when `trace` asks for one.
    fn run_traced(
        &self,
        py: Python<'_>,
        kernel: &str,
        function: &EntryFunction,
        device: u32,
        label: &str,
        trace: bool,
    ) -> PyResult<()> {
        let launch = || self.run(py, kernel, function, device);
        if trace {
            traced(py, label, launch)
        } else {
            launch()
        }
    }

    fn run(
        &self,
        py: Python<'_>,
        kernel: &str,
        function: &EntryFunction,
        device: u32,
    ) -> PyResult<()> {
        let config = LaunchConfig {
            grid: dims(self.grid, "grid")?,
            block: dims(self.block, "block")?,
            shared_mem_bytes: self.shared_mem,
            stream: stream_handle(py, self.stream, device)?,
        };
        let args = encode(kernel, function, self.args, device)?;
        // SAFETY: `Function::launch_with_attributes` checks the count and size of every
        // argument against the cubin's parameters, and the shared memory and attributes
        // against the device. What the pointers mean is the caller's promise, as for any CUDA
        // launch from Python: tensors on this device (checked where the object tells, with
        // `get_device()`), alive until the kernel finishes (PyTorch's caching allocator keeps
        // a tensor's memory for work queued on its stream), and a stream that is 0, torch's
        // current one, or one the caller passed for this device's primary context.
        unsafe { function.launch_with_attributes(&config, &self.attributes, &args) }
            .map_err(|error| load_error(py, &error))
    }
}

/// Runs `launch` inside the range `label` of `kwheel._trace_range` (torch.profiler's
/// `record_function` and torch's NVTX, where torch is imported), which the Python package
/// keeps in one place for ops and launches alike.
fn traced(py: Python<'_>, label: &str, launch: impl FnOnce() -> PyResult<()>) -> PyResult<()> {
    let range = py
        .import("kwheel")?
        .getattr("_trace_range")?
        .call1((label,))?;
    range.call_method0("__enter__")?;
    let result = launch();
    let none = py.None();
    range.call_method1("__exit__", (&none, &none, &none))?;
    result
}

/// Where a loaded kernel's cubin came from.
#[pyclass(frozen, module = "kwheel._kwheel")]
pub struct Provenance {
    /// `prebuilt`, `pack`, `jit-cache` or `jit-compiled`.
    #[pyo3(get)]
    kind: String,
    /// The variant, `cu130/sm_90a`, for a prebuilt cubin or a warm pack's; `None` for the JIT's.
    #[pyo3(get)]
    variant: Option<String>,
    /// The cubin's key.
    #[pyo3(get)]
    key: String,
    text: String,
}

impl From<&prebuilt::Provenance> for Provenance {
    fn from(provenance: &prebuilt::Provenance) -> Provenance {
        let variant = match provenance {
            prebuilt::Provenance::Prebuilt { variant, .. }
            | prebuilt::Provenance::Pack { variant, .. } => Some(variant.clone()),
            _ => None,
        };
        Provenance {
            kind: provenance.kind().to_string(),
            variant,
            key: provenance.key().to_owned(),
            text: provenance.to_string(),
        }
    }
}

#[pymethods]
impl Provenance {
    /// Whether the cubin is one the bundle shipped (nothing was compiled).
    #[getter]
    fn is_prebuilt(&self) -> bool {
        self.kind == "prebuilt"
    }

    fn __str__(&self) -> String {
        self.text.clone()
    }

    fn __repr__(&self) -> String {
        let variant = match &self.variant {
            Some(variant) => format!("{variant:?}"),
            None => "None".to_owned(),
        };
        format!(
            "Provenance(kind={:?}, variant={variant}, key={:?})",
            self.kind, self.key
        )
    }
}

/// A dict of a kernel's constants, each as the Python value of its type.
pub(crate) fn constants_dict<'py>(
    py: Python<'py>,
    constants: &BTreeMap<String, Constant>,
) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    for (name, value) in constants {
        match value {
            Constant::Integer(value) => dict.set_item(name, value)?,
            Constant::Float(value) => dict.set_item(name, value)?,
            Constant::Bool(value) => dict.set_item(name, value)?,
            Constant::String(value) => dict.set_item(name, value)?,
        }
    }
    Ok(dict)
}
