//! Python exceptions for the runtime's errors.
//!
//! | exception | raised when |
//! | --- | --- |
//! | `KwheelError` (a `RuntimeError`) | the base: a bundle that does not read or verify, a driver call that fails, a JIT compile that fails |
//! | `NoGpuError` | no CUDA driver, no device, or an unusable driver |
//! | `NoFitError` | no prebuilt variant fits and compiling is not allowed (or `select`'s dry run finds none); `.refusals` lists every variant and why |
//! | `UnknownKernelError` | the bundle has no kernel, or the kernel no entry, of that name |
//! | `ArgumentError` | launch arguments that do not match the kernel's parameters |
//!
//! A message is the error and its causes joined by `: `, as `{:#}` prints an `anyhow` chain.

use prebuilt::LoadError;
use pyo3::create_exception;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

create_exception!(
    kwheel,
    KwheelError,
    PyRuntimeError,
    "A kwheel bundle could not be read, or a kernel could not be loaded or launched."
);
create_exception!(
    kwheel,
    NoGpuError,
    KwheelError,
    "No CUDA driver, no CUDA device, or a driver kwheel cannot use."
);
create_exception!(
    kwheel,
    NoFitError,
    KwheelError,
    "No prebuilt variant of a kernel fits the device; `refusals` says why for each."
);
create_exception!(
    kwheel,
    UnknownKernelError,
    KwheelError,
    "The bundle has no kernel, or the kernel no entry, of that name."
);
create_exception!(
    kwheel,
    ArgumentError,
    KwheelError,
    "Launch arguments that do not match the kernel's parameters."
);

pub(crate) use prebuilt::error_chain as chain;

/// The Python exception for a runtime error.
pub(crate) fn load_error(py: Python<'_>, error: &LoadError) -> PyErr {
    let message = chain(error);
    match error {
        LoadError::NoGpu(_) => NoGpuError::new_err(message),
        LoadError::NoFit { refusals, .. } => {
            let refusals: Vec<(String, String)> = refusals
                .refusals
                .iter()
                .map(|refusal| (refusal.variant.clone(), refusal.reason.to_string()))
                .collect();
            no_fit(py, message, refusals)
        }
        LoadError::UnknownKernel { .. } | LoadError::UnknownEntry { .. } => {
            UnknownKernelError::new_err(message)
        }
        LoadError::ArgumentCount { .. } | LoadError::Argument { .. } => {
            ArgumentError::new_err(message)
        }
        _ => KwheelError::new_err(message),
    }
}

/// A `NoFitError` with a `refusals` attribute: `[(variant, reason), …]`.
pub(crate) fn no_fit(py: Python<'_>, message: String, refusals: Vec<(String, String)>) -> PyErr {
    let error = NoFitError::new_err(message);
    // Only the attribute is lost if it cannot be set; the message already lists every refusal.
    let _ = error.value(py).setattr("refusals", refusals);
    error
}

/// A failure to reach the driver outside loading (synchronizing), as a Python exception.
pub(crate) fn driver_error(error: &prebuilt::driver::DriverError) -> PyErr {
    match error {
        prebuilt::driver::DriverError::Call { .. } => KwheelError::new_err(chain(error)),
        _ => NoGpuError::new_err(chain(error)),
    }
}
