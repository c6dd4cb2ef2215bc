//! `kwheel._kwheel`: the `prebuilt` runtime as a CPython extension module (stable ABI, 3.9+).
//!
//! The pure-Python package `kwheel` (`kwheel/__init__.py` beside this crate) finds a package's
//! bundle without importing the package, reads torch's CUDA build and version from
//! `sys.modules`, and opens the classes below; a kernel library calls `kwheel.open(__name__)`
//! from its own `__init__`.
//!
//! | Python | wraps | touches the GPU |
//! | --- | --- | --- |
//! | [`Bundle`] | `prebuilt::Bundle`: the index, `select`, a dry run for any device, and `unsupported_shape_reason` | never |
//! | [`Registry`] | `prebuilt::Registry`: `status`, `is_available`, `unavailable_reason`, `load` | from the first call |
//! | [`Kernel`], [`Function`] | a loaded kernel and its entries: `launch` with checked arguments, `unsupported_shape_reason` | yes |
//! | [`Selection`], [`Provenance`] | what a dry run chose; where a loaded cubin came from | |
//! | `loaded_kernels()`, `trace_label()`, `trace_variable()`, `trace_enabled()` | every kernel loaded in the process, per device; the trace range names (docs/provenance.md) | never |
//! | `encode_tensor_map()` | a TMA descriptor for a `CUtensorMap` parameter (`kwheel.tensor_map`) | no context; the driver encodes it |
//! | `visible_devices()`, `module_status_text()`, `module_device_warning()` | the GPUs NVML shows, and what they mean for an extension module: its `status()`, the import's warning (`prebuilt::nvml`, `prebuilt::module_coverage`) | never: NVML, no CUDA context |
//! | `bundle_at()`, `holds_bundle()` | the bundle-finder rule `kwheel.find_bundle` shares with the CLI (`prebuilt::lookup::bundle_at`) | never |
//! | `KwheelError` and its subclasses | `prebuilt::LoadError` and friends, message with every cause | |
//!
//! Launch arguments are Python objects encoded by the parameter sizes the index records
//! ([`arguments`]): anything with `data_ptr()` (a torch tensor) is a device pointer, an `int`
//! or a `float` takes its parameter's size. kwheel never imports torch.
//!
//! Nothing here panics on a user's input or a machine without a GPU: every failure is a
//! Python exception whose message is the Rust error and its causes on one line.
#![deny(missing_docs)]

mod arguments;
mod devices;
mod errors;
mod kernel;
mod registry;
mod requires;
mod structs;
mod tensor_map;

use pyo3::prelude::*;
use pyo3::types::PyDict;

pub use errors::{ArgumentError, KwheelError, NoFitError, NoGpuError, UnknownKernelError};
pub use kernel::{Function, Kernel, Provenance};
pub use registry::{Bundle, Registry, Selection};

/// The extension module `kwheel._kwheel`.
#[pymodule]
fn _kwheel(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    module.add("__version__", env!("CARGO_PKG_VERSION"))?;
    module.add_class::<Bundle>()?;
    module.add_class::<Registry>()?;
    module.add_class::<Selection>()?;
    module.add_class::<Kernel>()?;
    module.add_class::<Function>()?;
    module.add_class::<Provenance>()?;
    module.add("KwheelError", py.get_type::<KwheelError>())?;
    module.add("NoGpuError", py.get_type::<NoGpuError>())?;
    module.add("NoFitError", py.get_type::<NoFitError>())?;
    module.add("UnknownKernelError", py.get_type::<UnknownKernelError>())?;
    module.add("ArgumentError", py.get_type::<ArgumentError>())?;
    module.add_function(wrap_pyfunction!(loaded_kernels, module)?)?;
    module.add_function(wrap_pyfunction!(trace_label, module)?)?;
    module.add_function(wrap_pyfunction!(structs::check_struct_layout, module)?)?;
    module.add_function(wrap_pyfunction!(trace_variable, module)?)?;
    module.add_function(wrap_pyfunction!(trace_enabled, module)?)?;
    module.add_function(wrap_pyfunction!(tensor_map::encode_tensor_map, module)?)?;
    module.add_function(wrap_pyfunction!(bundle_at, module)?)?;
    module.add_function(wrap_pyfunction!(holds_bundle, module)?)?;
    module.add_function(wrap_pyfunction!(devices::visible_devices, module)?)?;
    module.add_function(wrap_pyfunction!(devices::module_status_text, module)?)?;
    module.add_function(wrap_pyfunction!(devices::module_device_warning, module)?)?;
    Ok(())
}

/// Every kernel loaded in this process and still held, in load order, one dict per kernel and
/// device: `package`, `bundle`, `kernel`, `device`, `variant`, `source` (`prebuilt`,
/// `jit-cache`, `jit-compiled`), `key`, `reason` and `label` (its trace range name).
#[pyfunction]
fn loaded_kernels(py: Python<'_>) -> PyResult<Vec<Bound<'_, PyDict>>> {
    prebuilt::registry::loaded_kernels()
        .into_iter()
        .map(|loaded| {
            let dict = PyDict::new(py);
            dict.set_item("package", loaded.package)?;
            // Text, not a pathlib.Path: the list goes into JSON reports as it is.
            dict.set_item("bundle", loaded.bundle.display().to_string())?;
            dict.set_item("kernel", loaded.kernel)?;
            dict.set_item("device", loaded.device)?;
            dict.set_item("variant", loaded.variant)?;
            dict.set_item("source", loaded.source.to_string())?;
            dict.set_item("key", loaded.key)?;
            dict.set_item("reason", loaded.reason)?;
            dict.set_item("label", loaded.label)?;
            Ok(dict)
        })
        .collect()
}

/// The trace range name of a kernel: `kwheel:<kernel> <variant> <source> <key, 12 hex digits>
/// cuda:<device>` (`-` for an empty key).
/// (A torch op on CPU tensors, as the tests run it, is on device -1.)
#[pyfunction]
fn trace_label(kernel: &str, variant: &str, source: &str, key: &str, device: i64) -> String {
    prebuilt::registry::trace_label(kernel, variant, source, key, device)
}

/// The variable that turns tracing on for a package: `af3-kernels` → `AF3_KERNELS_TRACE`.
#[pyfunction]
fn trace_variable(package: &str) -> String {
    prebuilt::env::trace_variable(package)
}

/// Whether that variable is on now (`1`, `true`, `yes`, `on`).
#[pyfunction]
fn trace_enabled(package: &str) -> bool {
    prebuilt::env::trace_enabled(package)
}

/// The bundle at `path`: `path` itself or its `_prebuilt/`, whichever holds a bundle's index
/// first, else `None` (`prebuilt::lookup::bundle_at`, the rule the CLI finds bundles by).
#[pyfunction]
fn bundle_at(path: std::path::PathBuf) -> Option<std::ffi::OsString> {
    prebuilt::lookup::bundle_at(&path).map(std::path::PathBuf::into_os_string)
}

/// Whether the folder `path` holds a bundle's index: `kernels.idx`, or an old bundle's
/// `index.json` (`prebuilt::lookup::holds_bundle`).
#[pyfunction]
fn holds_bundle(path: std::path::PathBuf) -> bool {
    prebuilt::lookup::holds_bundle(&path)
}
