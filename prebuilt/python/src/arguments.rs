//! Python launch arguments to kernel parameters, by the sizes the index records.
//!
//! | Python value | parameter of 8 bytes | of 4 bytes | of 1 or 2 bytes |
//! | --- | --- | --- | --- |
//! | has `data_ptr()` (a torch tensor), or `None` | the device pointer (`None`: null) | refused | refused |
//! | `int` (or anything with `__index__`) | `int64_t` (`uint64_t` above its range) | `int` (`unsigned` above its range) | the integer of that width |
//! | `float` (or anything with `__float__`) | `double` | `float` | refused |
//! | `bytes`, `bytearray` | its bytes, when it has exactly the parameter's size | | |
//! | anything else with the buffer protocol: a `ctypes.Structure`, a ctypes scalar or array, a `memoryview`, an `array.array` | its bytes, read at this call, when it has exactly the parameter's size | | |
//!
//! A tensor must be on the kernel's device (`get_device()`) and contiguous (`is_contiguous()`)
//! when it says so: the kernels index memory as dense rows. Pass `tensor.data_ptr()` itself to
//! hand over a strided tensor's pointer knowingly. kwheel never imports torch; it only calls
//! these methods on the objects it is given.
//!
//! A `ctypes.Structure` whose class names its C struct (`_kwheel_struct_ = "ConvParams"`,
//! one of the manifest's `structs`) is checked field by field first ([`crate::structs`]).
//! Otherwise a struct parameter is checked by its size only: the cubin's `.nv.info` records each
//! parameter's offset and size (and, for a pointer, the alignment of what it points to), not
//! the parameter's own alignment or its fields, and the index keeps the sizes. A
//! `ctypes.Structure` laid out like the C struct (the same fields, `_pack_` where the C side
//! packs) has the C struct's padding, so its bytes are what the kernel reads. Its bytes are
//! taken at every launch, so a struct rebuilt per call (pointers of this call's tensors)
//! launches with this call's values.

use prebuilt::driver::LaunchAttributes;
use prebuilt::registry::Function;
use prebuilt::KernelArg;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyByteArray, PyBytes, PyFloat, PyInt, PyMemoryView, PyTuple};

use crate::errors::ArgumentError;

/// A Python value, sorted by how it becomes parameter bytes.
enum Value {
    Pointer(u64),
    Integer(i128),
    Float(f64),
    Bytes(Vec<u8>),
    /// The bytes of an object with the buffer protocol, and its type's name (`ConvParams`).
    Buffer(Vec<u8>, String),
}

impl Value {
    fn what(&self) -> String {
        match self {
            Value::Pointer(_) => "a pointer (8 bytes)".to_owned(),
            Value::Integer(_) => "an int".to_owned(),
            Value::Float(_) => "a float".to_owned(),
            Value::Bytes(bytes) => format!("{} bytes", bytes.len()),
            Value::Buffer(bytes, type_name) => format!("a {}-byte `{type_name}`", bytes.len()),
        }
    }
}

/// Encodes `args` for `function`: the count first, then each argument by its parameter's size.
pub(crate) fn encode(
    kernel: &str,
    function: &Function,
    args: &Bound<'_, PyAny>,
    device: u32,
) -> PyResult<Vec<KernelArg>> {
    let values: Vec<Bound<'_, PyAny>> = args
        .try_iter()
        .map_err(|_| PyTypeError::new_err("args must be a list or tuple of launch arguments"))?
        .collect::<PyResult<_>>()?;
    let sizes = function.param_sizes();
    let entry = function.name();
    if values.len() != sizes.len() {
        let sizes: Vec<String> = sizes.iter().map(u32::to_string).collect();
        return Err(ArgumentError::new_err(format!(
            "`{entry}` (kernel `{kernel}`) takes {} arguments of {} bytes, but {} were given",
            sizes.len(),
            if sizes.is_empty() {
                "0".to_owned()
            } else {
                sizes.join(", ")
            },
            values.len()
        )));
    }
    values
        .iter()
        .zip(sizes)
        .enumerate()
        .map(|(index, (value, &size))| {
            let refuse = |why: String| {
                ArgumentError::new_err(format!(
                    "argument {index} of `{entry}` (kernel `{kernel}`) {why}"
                ))
            };
            crate::structs::check_struct_argument(kernel, entry, index, value, function.structs())?;
            let value = classify(value, device).map_err(|error| match error {
                Refused::Type(what) => PyTypeError::new_err(format!(
                    "argument {index} of `{entry}` (kernel `{kernel}`) is {what}: pass a tensor \
                     (anything with data_ptr()), an int, a float, bytes, a ctypes structure \
                     (anything with the buffer protocol) or None"
                )),
                Refused::Unfit(why) => refuse(why),
                Refused::Python(error) => error,
            })?;
            to_parameter(value, index, size).map_err(refuse)
        })
        .collect()
}

enum Refused {
    /// Not a kind of value a parameter can take (its type's name).
    Type(String),
    /// A value the kernel must not get (a host tensor, an int past 64 bits): why.
    Unfit(String),
    /// Asking the object failed.
    Python(PyErr),
}

impl From<PyErr> for Refused {
    fn from(error: PyErr) -> Refused {
        Refused::Python(error)
    }
}

fn classify(value: &Bound<'_, PyAny>, device: u32) -> Result<Value, Refused> {
    if value.is_none() {
        return Ok(Value::Pointer(0));
    }
    if value.is_instance_of::<PyFloat>() {
        return Ok(Value::Float(value.extract()?));
    }
    if value.is_instance_of::<PyInt>() {
        return Ok(Value::Integer(integer(value)?));
    }
    if let Ok(bytes) = value.cast::<PyBytes>() {
        return Ok(Value::Bytes(bytes.as_bytes().to_vec()));
    }
    if let Ok(bytes) = value.cast::<PyByteArray>() {
        return Ok(Value::Bytes(bytes.to_vec()));
    }
    // Before `__index__` and `__float__`: a one-element tensor has both.
    if value.hasattr("data_ptr")? {
        return tensor_pointer(value, device).map(Value::Pointer);
    }
    if value.hasattr("__index__")? {
        return Ok(Value::Integer(integer(value)?));
    }
    if value.hasattr("__float__")? {
        return Ok(Value::Float(value.extract()?));
    }
    let type_name = value.get_type().name()?.to_string();
    // Last, so that nothing that was a number or a tensor before becomes bytes: a ctypes
    // structure, scalar or array, a memoryview, an array.array.
    match PyMemoryView::from(value) {
        Ok(view) => {
            let bytes = view.call_method0("tobytes")?;
            let bytes = bytes.cast::<PyBytes>().map_err(PyErr::from)?;
            Ok(Value::Buffer(bytes.as_bytes().to_vec(), type_name))
        }
        Err(error) if error.is_instance_of::<PyTypeError>(value.py()) => {
            Err(Refused::Type(format!("a `{type_name}`")))
        }
        Err(error) => Err(Refused::Python(error)),
    }
}

fn integer(value: &Bound<'_, PyAny>) -> Result<i128, Refused> {
    if let Ok(signed) = value.extract::<i64>() {
        return Ok(i128::from(signed));
    }
    if let Ok(unsigned) = value.extract::<u64>() {
        return Ok(i128::from(unsigned));
    }
    Err(Refused::Unfit(format!(
        "is {}, which does not fit in 64 bits",
        value.repr()?
    )))
}

/// A tensor's device pointer, after the checks it allows: on `device`, and dense.
fn tensor_pointer(value: &Bound<'_, PyAny>, device: u32) -> Result<u64, Refused> {
    if value.hasattr("get_device")? {
        let on: i64 = value.call_method0("get_device")?.extract()?;
        if on < 0 {
            return Err(Refused::Unfit(
                "is a tensor in host memory; the kernel needs it on the GPU (.cuda())".to_owned(),
            ));
        }
        if on != i64::from(device) {
            return Err(Refused::Unfit(format!(
                "is a tensor on device {on}, but the kernel is loaded on device {device}"
            )));
        }
    }
    if value.hasattr("is_contiguous")? && !value.call_method0("is_contiguous")?.is_truthy()? {
        return Err(Refused::Unfit(
            "is a non-contiguous tensor; pass .contiguous(), or its data_ptr() to mean the \
             strided memory"
                .to_owned(),
        ));
    }
    let pointer = value.call_method0("data_ptr")?;
    pointer.extract::<u64>().map_err(|_| {
        Refused::Unfit(format!(
            "has a data_ptr() that is not an address: {}",
            pointer
                .repr()
                .map(|repr| repr.to_string())
                .unwrap_or_default()
        ))
    })
}

/// The bytes of `value` for parameter `index` of `size` bytes; `Err` says why not.
fn to_parameter(value: Value, index: usize, size: u32) -> Result<KernelArg, String> {
    let mismatch =
        |value: &Value| format!("is {}, but parameter {index} is {size} bytes", value.what());
    let value = match value {
        Value::Buffer(bytes, _) if bytes.len() == size as usize => Value::Bytes(bytes),
        Value::Buffer(..) => return Err(mismatch(&value)),
        other => other,
    };
    match value {
        Value::Pointer(pointer) if size == 8 => Ok(KernelArg::Ptr(pointer)),
        Value::Integer(integer) => {
            let out_of_range =
                || format!("is {integer}, which does not fit parameter {index} ({size} bytes)");
            match size {
                8 => i64::try_from(integer)
                    .map(KernelArg::I64)
                    .or_else(|_| u64::try_from(integer).map(KernelArg::U64))
                    .map_err(|_| out_of_range()),
                4 => i32::try_from(integer)
                    .map(KernelArg::I32)
                    .or_else(|_| u32::try_from(integer).map(KernelArg::U32))
                    .map_err(|_| out_of_range()),
                2 => i16::try_from(integer)
                    .map(|value| value.to_ne_bytes().to_vec())
                    .or_else(|_| u16::try_from(integer).map(|value| value.to_ne_bytes().to_vec()))
                    .map(KernelArg::Bytes)
                    .map_err(|_| out_of_range()),
                1 => i8::try_from(integer)
                    .map(|value| value.to_ne_bytes().to_vec())
                    .or_else(|_| u8::try_from(integer).map(|value| value.to_ne_bytes().to_vec()))
                    .map(KernelArg::Bytes)
                    .map_err(|_| out_of_range()),
                _ => Err(mismatch(&Value::Integer(integer))),
            }
        }
        Value::Float(float) if size == 8 => Ok(KernelArg::F64(float)),
        Value::Float(float) if size == 4 => {
            let narrowed = float as f32;
            if float.is_finite() && !narrowed.is_finite() {
                return Err(format!(
                    "is {float}, which does not fit parameter {index} (a 4-byte float)"
                ));
            }
            Ok(KernelArg::F32(narrowed))
        }
        Value::Bytes(bytes) if bytes.len() == size as usize => Ok(KernelArg::Bytes(bytes)),
        other => Err(mismatch(&other)),
    }
}

/// Grid or block dimensions: an int, or a tuple or list of one to three ints.
pub(crate) fn dims(value: &Bound<'_, PyAny>, what: &str) -> PyResult<[u32; 3]> {
    let invalid = || {
        PyValueError::new_err(format!(
            "{what} must be a positive int or a tuple of one to three positive ints, not {}",
            value
                .repr()
                .map(|repr| repr.to_string())
                .unwrap_or_default()
        ))
    };
    let numbers: Vec<u32> = if let Ok(single) = value.extract::<u32>() {
        vec![single]
    } else if value.is_instance_of::<PyTuple>() || value.hasattr("__len__")? {
        value.extract().map_err(|_| invalid())?
    } else {
        return Err(invalid());
    };
    if numbers.is_empty() || numbers.len() > 3 || numbers.contains(&0) {
        return Err(invalid());
    }
    let mut dims = [1; 3];
    dims[..numbers.len()].copy_from_slice(&numbers);
    Ok(dims)
}

/// The launch attributes of `Kernel.launch`'s keywords: `cluster` as grid dimensions are
/// written (an int, or a tuple of one to three); the device checks come at the launch.
pub(crate) fn launch_attributes(
    cluster: Option<&Bound<'_, PyAny>>,
    cooperative: bool,
    programmatic: bool,
    priority: Option<i32>,
) -> PyResult<LaunchAttributes> {
    let cluster = match cluster.filter(|cluster| !cluster.is_none()) {
        Some(cluster) => Some(dims(cluster, "cluster")?),
        None => None,
    };
    Ok(LaunchAttributes {
        cluster,
        cooperative,
        programmatic,
        priority,
    })
}

/// The `CUstream` to launch on: `None` is torch's current stream on `device` when torch has
/// started CUDA (its non-default streams do not wait for the legacy default stream), else the
/// legacy default stream 0; an int is a handle; an object with `__cuda_stream__` (the CUDA
/// stream protocol) or `cuda_stream` (`torch.cuda.Stream`) gives its handle.
pub(crate) fn stream_handle(
    py: Python<'_>,
    stream: Option<&Bound<'_, PyAny>>,
    device: u32,
) -> PyResult<u64> {
    let Some(stream) = stream.filter(|stream| !stream.is_none()) else {
        return torch_current_stream(py, device);
    };
    if stream.is_instance_of::<PyInt>() {
        return stream.extract::<u64>().map_err(|_| {
            PyValueError::new_err(format!("stream handle {} is not an address", stream))
        });
    }
    if stream.hasattr("__cuda_stream__")? {
        let (_version, handle): (i64, u64) = stream.call_method0("__cuda_stream__")?.extract()?;
        return Ok(handle);
    }
    if stream.hasattr("cuda_stream")? {
        return stream.getattr("cuda_stream")?.extract::<u64>();
    }
    Err(PyTypeError::new_err(format!(
        "stream must be None, an int handle, or an object with `cuda_stream` (torch.cuda.Stream), \
         not {}",
        stream.repr()?
    )))
}

fn torch_current_stream(py: Python<'_>, device: u32) -> PyResult<u64> {
    // Once torch has started CUDA (which a process does not undo), the launch asks torch's
    // raw current stream and nothing else: a launch after the first pays one call.
    static RAW_STREAM: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    if let Some(raw) = RAW_STREAM.get(py) {
        return raw.bind(py).call1((device,))?.extract();
    }
    // `sys.modules` is one dict for the life of the interpreter; looking it up once saves an
    // import per launch.
    static MODULES: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let modules = MODULES.get_or_try_init(py, || {
        py.import("sys")?.getattr("modules").map(Bound::unbind)
    })?;
    let torch = modules.bind(py).call_method1("get", ("torch",))?;
    if torch.is_none() {
        return Ok(0);
    }
    let cuda = torch.getattr("cuda")?;
    if !cuda.call_method0("is_initialized")?.is_truthy()? {
        return Ok(0);
    }
    // What `torch.cuda.current_stream(device).cuda_stream` returns, without building a
    // Stream object on every launch (Triton asks torch the same way); the public call where a
    // torch lacks it.
    let raw = torch.getattr("_C")?.getattr("_cuda_getCurrentRawStream");
    match raw {
        Ok(raw) => {
            let stream = raw.call1((device,))?.extract();
            let _ = RAW_STREAM.set(py, raw.unbind());
            stream
        }
        Err(_) => cuda
            .call_method1("current_stream", (device,))?
            .getattr("cuda_stream")?
            .extract(),
    }
}
