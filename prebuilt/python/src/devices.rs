//! The visible GPUs as NVML reports them, without a CUDA context, and what they mean for a
//! bundle's extension modules: `status()` and the import's warning (`prebuilt::nvml`,
//! `prebuilt::module_coverage`).

use prebuilt::module::{ModuleHost, ModuleRecord};
use prebuilt::module_coverage::{
    module_status, uncovered_warning, visible_module_devices, DeviceSight, ModuleDevice,
    ModuleLoad, ModuleSource,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::registry::Bundle;

/// One device as `visible_devices` gives it.
type DeviceDict<'py> = Bound<'py, PyDict>;

/// `(devices, None)`: every GPU the process sees, read from NVML without initialising CUDA,
/// each `{"ordinal", "index", "name", "uuid", "capability": (9, 0)}`; `(None, why)` when NVML
/// cannot say (no driver: a CPU machine; MIG instances in `CUDA_VISIBLE_DEVICES`).
#[pyfunction]
pub(crate) fn visible_devices(
    py: Python<'_>,
) -> PyResult<(Option<Vec<DeviceDict<'_>>>, Option<String>)> {
    match py.detach(prebuilt::nvml::visible_devices) {
        Ok(devices) => {
            let listed = devices
                .into_iter()
                .map(|device| {
                    let dict = PyDict::new(py);
                    dict.set_item("ordinal", device.ordinal)?;
                    dict.set_item("index", device.index)?;
                    dict.set_item("name", device.name)?;
                    dict.set_item("uuid", device.uuid)?;
                    dict.set_item("capability", device.capability)?;
                    Ok(dict)
                })
                .collect::<PyResult<Vec<_>>>()?;
            Ok((Some(listed), None))
        }
        Err(error) => Ok((None, Some(prebuilt::error_chain(&error)))),
    }
}

/// Module `name` of `bundle`'s record, or `UnknownKernelError`.
fn record<'b>(bundle: &'b Bundle, name: &str) -> PyResult<&'b ModuleRecord> {
    bundle.catalog().meta().modules.get(name).ok_or_else(|| {
        crate::errors::UnknownKernelError::new_err(format!(
            "no extension module `{name}` in the bundle at {}",
            bundle.catalog().root().display()
        ))
    })
}

/// What `status()` says of extension module `name` of `bundle`: `(available, text)`, the text
/// `available: module cu130/x86_64: …` or `unavailable: <why>`. `loaded`: `(variant, source)`
/// when this process loaded it (`source` `module`, `jit-compiled` or `jit-cache`); `torch`,
/// `cuda`, `cpu`: the running torch (`None`: not imported), its CUDA build, the CPU; `device`:
/// `(ordinal, name, (major, minor))` of the device, or `None` with `unseen` saying why it was
/// not read.
#[pyfunction]
#[pyo3(signature = (bundle, name, *, loaded=None, torch=None, cuda=None, cpu, device=None, unseen=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn module_status_text(
    bundle: &Bundle,
    name: &str,
    loaded: Option<(String, String)>,
    torch: Option<String>,
    cuda: Option<String>,
    cpu: String,
    device: Option<(u32, String, (u32, u32))>,
    unseen: Option<String>,
) -> PyResult<(bool, String)> {
    let record = record(bundle, name)?;
    let cuda = cuda
        .map(|text| prebuilt::device::parse_cuda_build(&text))
        .transpose()
        .map_err(|error| PyValueError::new_err(error.to_string()))?;
    let load = match &loaded {
        Some((variant, source)) => ModuleLoad::Loaded {
            variant,
            source: ModuleSource::parse(source).ok_or_else(|| {
                PyValueError::new_err(format!(
                    "`{source}` is not how a module loads: module, jit-compiled or jit-cache"
                ))
            })?,
            torch: torch.as_deref().unwrap_or("unknown"),
        },
        None => ModuleLoad::NotLoaded {
            host: torch.as_deref().map(|torch| ModuleHost {
                torch,
                cuda,
                cpu: &cpu,
            }),
        },
    };
    let sight = match device {
        Some((ordinal, name, capability)) => DeviceSight::Seen(ModuleDevice {
            ordinal,
            name,
            capability,
        }),
        None => DeviceSight::Unseen(unseen.unwrap_or_else(|| "no device was read".to_owned())),
    };
    let status = module_status(name, record, &load, &sight);
    Ok((status.is_available(), status.to_string()))
}

/// The warning for extension module `name` of `bundle`, just loaded as `variant`, when NVML
/// shows a visible device its archs do not cover (its CUDA ops would fail there with CUDA's
/// bare "no kernel image is available"); `None` when every device is covered or NVML cannot
/// say. Never initialises CUDA.
#[pyfunction]
pub(crate) fn module_device_warning(
    py: Python<'_>,
    bundle: &Bundle,
    name: &str,
    variant: &str,
) -> PyResult<Option<String>> {
    let record = record(bundle, name)?;
    let Ok(devices) = py.detach(visible_module_devices) else {
        return Ok(None);
    };
    Ok(uncovered_warning(name, variant, record, &devices))
}
