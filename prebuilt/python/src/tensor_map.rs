//! `tensor_map(...)`: a TMA descriptor (`CUtensorMap`) for a kernel's `__grid_constant__ const
//! CUtensorMap` parameter, encoded by the driver from what `kwheel.tensor_map` reads off a
//! tensor. The checks and the encoding are `prebuilt::driver`'s; this turns Python values into
//! its spec and its errors into exceptions.

use prebuilt::driver::{
    Driver, L2Promotion, Swizzle, TensorMapElement, TensorMapError, TensorMapSpec,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors::{chain, driver_error};

/// Encodes a tiled tensor map: 128 bytes, passed to `launch` like any struct parameter. Every
/// list is innermost dimension first; `strides` are in bytes, one per dimension but the
/// innermost. Errors number dimensions as the tensor's shape does (outermost first).
#[pyfunction]
#[pyo3(signature = (address, dtype, dims, strides, box_dims, element_strides, swizzle, l2_promotion, oob_nan))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn encode_tensor_map<'py>(
    py: Python<'py>,
    address: u64,
    dtype: &str,
    dims: Vec<u64>,
    strides: Vec<u64>,
    box_dims: Vec<u32>,
    element_strides: Vec<u32>,
    swizzle: u32,
    l2_promotion: u32,
    oob_nan: bool,
) -> PyResult<Bound<'py, PyBytes>> {
    let element = TensorMapElement::from_torch(dtype).ok_or_else(|| {
        PyValueError::new_err(format!("a tensor map cannot hold elements of {dtype}"))
    })?;
    let swizzle = Swizzle::from_bytes(swizzle).ok_or_else(|| {
        PyValueError::new_err(format!(
            "swizzle is 0, 32, 64 or 128 (bytes), not {swizzle}"
        ))
    })?;
    let l2_promotion = L2Promotion::from_bytes(l2_promotion).ok_or_else(|| {
        PyValueError::new_err(format!(
            "l2_promotion is 0, 64, 128 or 256 (bytes), not {l2_promotion}"
        ))
    })?;
    let spec = TensorMapSpec {
        element,
        address,
        dims,
        strides,
        box_dims,
        element_strides,
        swizzle,
        l2_promotion,
        oob_nan,
    };
    // The rules need no driver: a wrong map is refused the same with or without a GPU. The
    // lists are innermost first; the user counts dimensions as the tensor's shape does.
    let rank = spec.dims.len();
    spec.check_naming(|dim| rank.saturating_sub(1 + dim))
        .map_err(|why| PyValueError::new_err(format!("tensor map: {why}")))?;
    let driver = Driver::get().map_err(|error| driver_error(&error))?;
    match driver.encode_tensor_map(&spec) {
        Ok(map) => Ok(PyBytes::new(py, &map)),
        Err(TensorMapError::Invalid(why)) => {
            Err(PyValueError::new_err(format!("tensor map: {why}")))
        }
        Err(TensorMapError::Driver(error)) => Err(match error {
            prebuilt::driver::DriverError::Call { .. } => {
                PyValueError::new_err(format!("tensor map: {}", chain(&error)))
            }
            other => driver_error(&other),
        }),
    }
}
