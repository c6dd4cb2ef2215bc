//! `kwheel._kwheel`: the `prebuilt` runtime as a CPython extension module (stable ABI, 3.9+).
//!
//! The pure-Python package `kwheel` (`kwheel/__init__.py` beside this crate) finds a package's
//! bundle without importing the package, reads torch's CUDA build and version from
//! `sys.modules`, and opens the classes below; a kernel library calls `kwheel.open(__name__)`
//! from its own `__init__`.
//!
//! | Python | wraps | touches the GPU |
//! | --- | --- | --- |
//! | [`Bundle`] | `prebuilt::Bundle`: the index, and `select`, a dry run for any device | never |
//! | [`Registry`] | `prebuilt::Registry`: `status`, `is_available`, `unavailable_reason`, `load` | from the first call |
//! | [`Kernel`], [`Function`] | a loaded kernel and its entries: `launch` with checked arguments | yes |
//! | [`Selection`], [`Provenance`] | what a dry run chose; where a loaded cubin came from | |
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
mod errors;
mod kernel;
mod registry;

use pyo3::prelude::*;

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
    Ok(())
}
