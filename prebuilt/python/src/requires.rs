//! `unsupported_shape_reason`: a kernel's requirements (its manifest's `requires`) evaluated by
//! `prebuilt::requires` for values Python passes by keyword.
//!
//! A value is a `bool` or anything an `int` is made from without loss (`int`, a torch size, a
//! numpy integer: `__index__`). Values that do not match the kernel's `inputs` (a missing or
//! unknown name, a boolean for an integer) raise `TypeError`, as a call with the wrong
//! keywords does; requirements that do not check (an index that no kwheel bundler wrote)
//! raise `KwheelError`.

use std::collections::BTreeMap;

use prebuilt::index::{Constant, KernelRecord};
use prebuilt::lookup::Catalog;
use prebuilt::requires::{unsupported_reason, Mismatch, Value};
use prebuilt::LoadError;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt};

use crate::errors::{load_error, KwheelError};

/// The first requirement of `kernel` (`record`'s, over `constants`) that `inputs` break, in
/// words, or `None`.
pub(crate) fn answer(
    kernel: &str,
    record: &KernelRecord,
    constants: &BTreeMap<String, Constant>,
    inputs: Option<&Bound<'_, PyDict>>,
) -> PyResult<Option<String>> {
    let values = values_of(kernel, inputs)?;
    unsupported_reason(&record.inputs.requires, constants, &values).map_err(|mismatch| {
        let message = format!("unsupported_shape_reason() of `{kernel}`: {mismatch}");
        match mismatch {
            Mismatch::Inputs(_) => PyTypeError::new_err(message),
            Mismatch::Refused(_) => KwheelError::new_err(message),
        }
    })
}

fn values_of(
    kernel: &str,
    inputs: Option<&Bound<'_, PyDict>>,
) -> PyResult<BTreeMap<String, Value>> {
    let mut values = BTreeMap::new();
    for (name, value) in inputs.into_iter().flat_map(|dict| dict.iter()) {
        let name: String = name.extract()?;
        let converted = if let Ok(flag) = value.cast::<PyBool>() {
            Value::Bool(flag.is_true())
        } else if let Ok(integer) = value.extract::<i64>() {
            Value::Int(integer)
        } else if value.cast::<PyInt>().is_ok() {
            return Err(PyValueError::new_err(format!(
                "unsupported_shape_reason() of `{kernel}`: input `{name}` = {} is outside the \
                 64-bit signed range requirements compute in",
                value.repr()?
            )));
        } else {
            return Err(PyTypeError::new_err(format!(
                "unsupported_shape_reason() of `{kernel}`: input `{name}` must be an int or a \
                 bool, not {}",
                value.repr()?
            )));
        };
        values.insert(name, converted);
    }
    Ok(values)
}

/// The record `found` of kernel `name`, or the error that names what the bundle has instead.
pub(crate) fn known_record(
    py: Python<'_>,
    catalog: &Catalog,
    name: &str,
    found: Result<Option<prebuilt::KernelRecord>, prebuilt::BundleError>,
) -> PyResult<prebuilt::KernelRecord> {
    let error = |error: prebuilt::BundleError| load_error(py, &LoadError::from(error));
    match found.map_err(error)? {
        Some(record) => Ok(record),
        None => Err(load_error(
            py,
            &LoadError::UnknownKernel {
                kernel: name.to_owned(),
                bundle: catalog.root().to_path_buf(),
                known: catalog.names().map_err(error)?,
            },
        )),
    }
}
