//! The CUDA driver API, through `cudarc`'s bindings, loaded from libcuda when first needed:
//! this crate's only driver `unsafe`.
//!
//! ```text
//! Driver (process-wide: libcuda loaded once, cuInit once, version)
//!   └── Context (a device's primary context: the one PyTorch uses, retained and released;
//!         │          the device's launch limits, asked once)
//!         ├── Module (a verified cubin, cuModuleLoadData / cuModuleUnload)
//!         │     └── Function (an entry, cuModuleGetFunction; launched with cuLaunchKernel, or
//!         │                   cuLaunchKernelEx when the launch has attributes; its attributes,
//!         │                   cuFuncGetAttribute / cuFuncSetAttribute; its occupancy)
//!         └── DeviceBuffer (cuMemAlloc / cuMemFree, copies to and from the host)
//! ```
//!
//! `cudarc` (driver only, `dynamic-loading`) opens libcuda at run time, so nothing CUDA is
//! needed to build, and resolves each entry point on its first call. Its `sys` layer panics
//! when the library or an entry point is missing, so [`Driver::get`] checks both before any
//! call: `is_culib_present()` first (a CPU-only machine gets [`DriverError::Missing`]), then
//! every entry point this module calls (a driver too old for one gets
//! [`DriverError::Symbol`]). Nothing here panics on a machine without a GPU.
//!
//! One entry point is optional: `cuLaunchKernelEx` (CUDA 11.8 and later), which only launches
//! with attributes (a cluster, a cooperative or programmatic launch, a priority) need. Its
//! presence is noted when the library loads ([`Driver::supports_launch_attributes`]); a driver
//! without it loads and launches every kernel through `cuLaunchKernel`, and a launch that asks
//! for attributes gets [`DriverError::Unsupported`] instead of `cudarc`'s panic. So is
//! `cuTensorMapEncodeTiled` (CUDA 12.0 and later), which only encoding a tensor map for a TMA
//! kernel needs (`tensor_map.rs`).
//!
//! Its `result` layer turns a `CUresult` into an error; [`DriverError::Call`] adds the call
//! that failed and the driver's own name and description of the code. `CUresult` is a Rust
//! enum in those bindings, which must never hold a code it does not list, and drivers add
//! codes with CUDA releases; so the workspace pins the newest bindings `cudarc` has (CUDA
//! 13.4, 106 codes), and moves the `cuda-*` feature up with each CUDA release.
//!
//! Every call that works on a context's objects makes that context current for the call
//! (`cuCtxPushCurrent` / `cuCtxPopCurrent`), so the caller's thread keeps whatever context it
//! had; loading a module and looking up its entries (`Module::load_functions`) is one such
//! call. The primary context is retained by every [`Context`] value and released when the last
//! one is dropped; a process that also runs PyTorch shares the same context with it.
//!
//! A device's facts (its handle, compute capability and name) are asked of the driver once per
//! process and ordinal ([`Driver::device`]): none of them changes while the process runs (the
//! devices a process sees are fixed at `cuInit`), and every registry retains its own
//! [`Context`], which would otherwise ask again on its first load.

use std::collections::BTreeMap;
use std::ffi::{c_uint, CString};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use cudarc::driver::{result, sys};

mod launch;
mod tensor_map;
pub use launch::{DeviceLimits, FunctionAttributes, LaunchAttributes, LaunchConfig};
pub use tensor_map::{
    L2Promotion, Swizzle, TensorMapElement, TensorMapError, TensorMapSpec, TENSOR_MAP_BYTES,
};

/// The file names a missing driver library is reported by: the soname every driver install
/// provides, then the development symlink. The search itself is `cudarc`'s, which tries these
/// among others.
pub const DRIVER_LIBRARIES: [&str; 2] = ["libcuda.so.1", "libcuda.so"];

/// The driver library's base names, in the order `cudarc` searches them (`libcuda.so…` on
/// Linux, `nvcuda.dll` on Windows).
const CUDARC_LIBRARY_NAMES: [&str; 2] = ["cuda", "nvcuda"];

/// Every entry point the calls below reach through `cudarc`, by the name it resolves (the
/// names `cuda.h`'s macros map to: `cuMemAlloc` is `cuMemAlloc_v2`). Checked once, when the
/// library loads, because `cudarc` panics on the first call of a missing one.
const ENTRY_POINTS: [&str; 25] = [
    "cuInit",
    "cuDriverGetVersion",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetAttribute",
    "cuDeviceGetName",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxPushCurrent_v2",
    "cuCtxPopCurrent_v2",
    "cuCtxSynchronize",
    "cuModuleLoadData",
    "cuModuleUnload",
    "cuModuleGetFunction",
    "cuFuncGetAttribute",
    "cuFuncSetAttribute",
    "cuOccupancyMaxActiveBlocksPerMultiprocessor",
    "cuLaunchKernel",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoH_v2",
    "cuStreamSynchronize",
];

/// The entry point of launches with attributes: looked up when the library loads, but not
/// required, since plain launches never need it.
const LAUNCH_EX: &str = "cuLaunchKernelEx";

/// Something the CUDA driver could not do, or a machine without one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DriverError {
    /// The driver library could not be loaded: no NVIDIA driver on this machine.
    #[error("no CUDA driver: {library} {}", describe_load_failure(.detail))]
    Missing {
        /// The library looked for first (`libcuda.so.1`).
        library: String,
        /// What the dynamic loader said.
        detail: String,
    },
    /// The driver library lacks an entry point kwheel calls.
    #[error(
        "the CUDA driver {library} does not export `{symbol}`: it is older than any driver \
         kwheel supports; update the NVIDIA driver"
    )]
    Symbol {
        /// The library that was loaded.
        library: String,
        /// The missing function.
        symbol: &'static str,
    },
    /// The driver lacks an entry point that only some launches need.
    #[error(
        "the CUDA driver {library} does not export `{symbol}`, which {needed_by} need; update \
         the NVIDIA driver (one for CUDA 12.0 or later has it)"
    )]
    Unsupported {
        /// The library that was loaded.
        library: String,
        /// The missing function.
        symbol: &'static str,
        /// What needs it: `launches with a cluster, cooperative, programmatic or priority
        /// attribute`.
        needed_by: &'static str,
    },
    /// The driver loaded but sees no device, or not the one asked for.
    #[error("{}", describe_no_device(*.ordinal, *.count))]
    NoDevice {
        /// The device ordinal asked for.
        ordinal: u32,
        /// How many devices the driver sees.
        count: u32,
    },
    /// A driver call returned an error.
    #[error("`{call}` failed: {name} ({code}): {description}")]
    Call {
        /// The driver function.
        call: &'static str,
        /// The `CUresult` code.
        code: i32,
        /// The driver's name for the code (`CUDA_ERROR_NO_BINARY_FOR_GPU`).
        name: String,
        /// The driver's description of the code.
        description: String,
    },
}

fn describe_load_failure(detail: &str) -> String {
    if detail.contains("No such file") || detail.contains("cannot open shared object") {
        format!("not found ({detail})")
    } else {
        format!("could not be loaded ({detail})")
    }
}

fn describe_no_device(ordinal: u32, count: u32) -> String {
    match count {
        0 => "no CUDA device: the driver sees no GPU (check CUDA_VISIBLE_DEVICES)".to_owned(),
        _ => format!(
            "no CUDA device {ordinal}: the driver sees {count} device{}",
            if count == 1 { "" } else { "s" }
        ),
    }
}

/// What the dynamic loader said (`dlerror`): libloading keeps it as the source of its own
/// error, whose message is only the failed call (`dlopen failed`).
fn loader_message(error: &libloading::Error) -> String {
    std::error::Error::source(error).map_or_else(|| error.to_string(), |source| source.to_string())
}

/// The error for `call` returning `error`, with the driver's own name and description of
/// the code.
fn call_failed(call: &'static str, error: result::DriverError) -> DriverError {
    let code = error.0 as i32;
    DriverError::Call {
        call,
        code,
        name: error
            .error_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_else(|_| format!("CUDA error {code}")),
        description: error
            .error_string()
            .map(|description| description.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "unknown to this driver".to_owned()),
    }
}

/// `result` with a failure named after `call`.
fn checked<T>(
    call: &'static str,
    result: Result<T, result::DriverError>,
) -> Result<T, DriverError> {
    result.map_err(|error| call_failed(call, error))
}

/// The loaded CUDA driver. Obtained from [`Driver::get`]; lives until the process exits.
#[derive(Debug)]
pub struct Driver {
    library_name: String,
    version: i32,
    /// Whether the library exports `cuLaunchKernelEx`.
    launch_ex: bool,
    /// Whether the library exports `cuTensorMapEncodeTiled`.
    tensor_maps: bool,
    /// The devices asked for so far, by ordinal: only what the driver answered, so that an
    /// error is asked again next time.
    devices: Mutex<BTreeMap<u32, Device>>,
}

static DRIVER: OnceLock<Result<Driver, DriverError>> = OnceLock::new();

impl Driver {
    /// The process's driver: loads libcuda and runs `cuInit` the first time, and returns the
    /// same result (the driver, or why there is none) every time after.
    pub fn get() -> Result<&'static Driver, DriverError> {
        DRIVER
            .get_or_init(Driver::open)
            .as_ref()
            .map_err(Clone::clone)
    }

    fn open() -> Result<Driver, DriverError> {
        // SAFETY: the check only opens and closes the library; libcuda's initialisers have no
        // preconditions on the calling process.
        if !unsafe { sys::is_culib_present() } {
            return Err(Driver::missing());
        }
        // SAFETY: the library is present (checked above), so `culib` loads it instead of
        // panicking; it keeps it loaded for the rest of the process.
        let library = unsafe { sys::culib() };
        // Named after `culib` loaded it, so that finding the name only reopens a loaded library.
        let library_name = Driver::library_found().unwrap_or_else(|| "libcuda".to_owned());
        for symbol in ENTRY_POINTS {
            // SAFETY: the symbol is only looked up, never called through this pointer type.
            if unsafe { library.get::<*const std::ffi::c_void>(symbol) }.is_err() {
                return Err(DriverError::Symbol {
                    library: library_name,
                    symbol,
                });
            }
        }
        // SAFETY: as above, only looked up.
        let launch_ex = unsafe { library.get::<*const std::ffi::c_void>(LAUNCH_EX) }.is_ok();
        // SAFETY: as above, only looked up.
        let tensor_maps =
            unsafe { library.get::<*const std::ffi::c_void>(tensor_map::ENCODE_TILED) }.is_ok();
        let mut version = 0;
        // SAFETY: `version` is valid for writes of one `int`; this call needs no cuInit, and
        // its entry point exists (checked above).
        let status = unsafe { sys::cuDriverGetVersion(&mut version) };
        checked("cuDriverGetVersion", status.result())?;
        match result::init() {
            Err(result::DriverError(sys::CUresult::CUDA_ERROR_NO_DEVICE)) => {
                Err(DriverError::NoDevice {
                    ordinal: 0,
                    count: 0,
                })
            }
            other => checked("cuInit", other),
        }?;
        Ok(Driver {
            library_name,
            version,
            launch_ex,
            tensor_maps,
            devices: Mutex::new(BTreeMap::new()),
        })
    }

    /// Why there is no driver: the dynamic loader's own words for the soname every driver
    /// install provides.
    fn missing() -> DriverError {
        let mut first_failure = None;
        for name in DRIVER_LIBRARIES {
            // SAFETY: as in `open`; the library is closed again when the value drops.
            if let Err(error) = unsafe { libloading::Library::new(name) } {
                first_failure.get_or_insert_with(|| loader_message(&error));
            }
        }
        DriverError::Missing {
            library: DRIVER_LIBRARIES[0].to_owned(),
            detail: first_failure
                .unwrap_or_else(|| "not found under any name cudarc looks for".to_owned()),
        }
    }

    /// The name `cudarc` loaded the driver by: the first of its candidates that opens, which is
    /// where its own search, in the same order, stopped.
    fn library_found() -> Option<String> {
        CUDARC_LIBRARY_NAMES
            .iter()
            .flat_map(|name| cudarc::get_lib_name_candidates(name))
            // SAFETY: as in `open`; the library is closed again when the value drops.
            .find(|candidate| unsafe { libloading::Library::new(candidate) }.is_ok())
    }

    /// The CUDA version the driver supports, as `cuDriverGetVersion` reports it (`13000` for
    /// 13.0).
    pub fn version(&self) -> i32 {
        self.version
    }

    /// The file the driver was loaded from, as it was looked up (`libcuda.so`, or
    /// `libcuda.so.1` where the development symlink is absent).
    pub fn library(&self) -> &str {
        &self.library_name
    }

    /// Whether the driver can launch with attributes (it exports `cuLaunchKernelEx`): a
    /// cluster, a cooperative or programmatic launch, a priority.
    pub fn supports_launch_attributes(&self) -> bool {
        self.launch_ex
    }

    /// How many devices the driver sees.
    pub fn device_count(&self) -> Result<u32, DriverError> {
        let count = checked("cuDeviceGetCount", result::device::get_count())?;
        Ok(u32::try_from(count).unwrap_or(0))
    }

    /// The device with this ordinal: its compute capability and name. Asked of the driver the
    /// first time it is found; the same answer after.
    pub fn device(&self, ordinal: u32) -> Result<Device, DriverError> {
        let known = || self.devices.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(device) = known().get(&ordinal) {
            return Ok(device.clone());
        }
        let device = self.ask_device(ordinal)?;
        known().insert(ordinal, device.clone());
        Ok(device)
    }

    fn ask_device(&self, ordinal: u32) -> Result<Device, DriverError> {
        let count = self.device_count()?;
        if ordinal >= count {
            return Err(DriverError::NoDevice { ordinal, count });
        }
        // The ordinal is below the device count, which is an `int`.
        let handle = checked("cuDeviceGet", result::device::get(ordinal as i32))?;
        let major = attribute(
            handle,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
        )?;
        let minor = attribute(
            handle,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
        )?;
        let name = checked("cuDeviceGetName", result::device::get_name(handle))?;
        Ok(Device {
            ordinal,
            handle,
            capability: (major, minor),
            name,
        })
    }
}

fn attribute(
    device: sys::CUdevice,
    attribute: sys::CUdevice_attribute,
) -> Result<u32, DriverError> {
    // SAFETY: `device` came from cuDeviceGet.
    let value = unsafe { result::device::get_attribute(device, attribute) };
    Ok(u32::try_from(checked("cuDeviceGetAttribute", value)?).unwrap_or(0))
}

/// A GPU as the driver reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Device {
    ordinal: u32,
    handle: sys::CUdevice,
    capability: (u32, u32),
    name: String,
}

impl Device {
    /// The device's ordinal among the devices the driver sees.
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// The compute capability, `(9, 0)` for an H100 or H200.
    pub fn capability(&self) -> (u32, u32) {
        self.capability
    }

    /// The product name, `NVIDIA H200`.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// A device's primary context, retained for as long as this value lives.
///
/// The primary context is the one PyTorch and the CUDA runtime use, so kernels loaded here
/// run on PyTorch's tensors and streams. Creating it is the expensive step of a process's
/// first CUDA call (hundreds of milliseconds); retaining it again is cheap.
pub struct Context {
    driver: &'static Driver,
    device: Device,
    handle: sys::CUcontext,
    /// The device's launch limits, once asked: none of them changes while the process runs.
    limits: OnceLock<DeviceLimits>,
}

// SAFETY: a CUDA context handle may be used from any thread (the driver API is thread-safe);
// every operation here makes the context current on the calling thread first.
unsafe impl Send for Context {}
// SAFETY: as above; `Context` has no interior mutability of its own.
unsafe impl Sync for Context {}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

impl Context {
    /// Retains the primary context of device `ordinal`, creating it if no one has yet.
    pub fn primary(ordinal: u32) -> Result<Arc<Context>, DriverError> {
        let driver = Driver::get()?;
        let device = driver.device(ordinal)?;
        // SAFETY: `device.handle` came from cuDeviceGet.
        let handle = unsafe { result::primary_ctx::retain(device.handle) };
        let handle = checked("cuDevicePrimaryCtxRetain", handle)?;
        Ok(Arc::new(Context {
            driver,
            device,
            handle,
            limits: OnceLock::new(),
        }))
    }

    /// The device this context belongs to.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The driver.
    pub fn driver(&self) -> &'static Driver {
        self.driver
    }

    /// Waits for all work in this context to finish, and reports the first error any of it
    /// raised (a kernel's illegal address, say).
    pub fn synchronize(&self) -> Result<(), DriverError> {
        let _current = self.make_current()?;
        checked("cuCtxSynchronize", result::ctx::synchronize())
    }

    /// Waits for the work on one stream (`0`: the legacy default stream) to finish.
    ///
    /// # Safety
    ///
    /// `stream` must be 0 or a live stream of this context (from PyTorch,
    /// `torch.cuda.current_stream().cuda_stream`): the driver dereferences the handle, and
    /// cannot tell a stale or foreign one from a live one.
    pub unsafe fn synchronize_stream(&self, stream: u64) -> Result<(), DriverError> {
        let _current = self.make_current()?;
        // SAFETY: the caller guarantees the handle is 0 (the legacy default stream) or a live
        // stream of this context, which is current.
        let result = unsafe { result::stream::synchronize(stream as usize as sys::CUstream) };
        checked("cuStreamSynchronize", result)
    }

    fn make_current(&self) -> Result<Current<'_>, DriverError> {
        // SAFETY: `handle` is a primary context this value retains, so it stays alive while it
        // is current; `Current` pops it again on this thread.
        let result = unsafe { sys::cuCtxPushCurrent_v2(self.handle) };
        checked("cuCtxPushCurrent", result.result())?;
        Ok(Current { context: self })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: this value retained the primary context of a device that came from
        // cuDeviceGet once, and releases it once. A failure is ignored: there is no one to
        // report it to, and the context is the driver's to clean up at exit.
        let _ = unsafe { result::primary_ctx::release(self.device.handle) };
    }
}

/// The context made current on this thread until dropped; the previous one is restored.
/// Borrows the context so that it cannot be released while current.
struct Current<'a> {
    context: &'a Context,
}

impl Current<'_> {
    /// Whether `context` is the one made current.
    fn is(&self, context: &Context) -> bool {
        std::ptr::eq(self.context, context)
    }
}

impl Drop for Current<'_> {
    fn drop(&mut self) {
        let mut popped: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: `make_current` pushed this context on this thread, so the stack is not
        // empty; popping restores the caller's context; `popped` is valid for writes.
        let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
    }
}

/// A cubin loaded into a context. Unloaded when the last [`Function`] of it is dropped.
pub struct Module {
    context: Arc<Context>,
    handle: sys::CUmodule,
}

// SAFETY: module handles are usable from any thread with their context current, which every
// operation here ensures.
unsafe impl Send for Module {}
// SAFETY: as above; `Module` has no interior mutability of its own.
unsafe impl Sync for Module {}

impl std::fmt::Debug for Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Module")
            .field("device", &self.context.device.ordinal)
            .finish_non_exhaustive()
    }
}

impl Module {
    /// Loads a cubin into `context`, or PTX, which the driver compiles for the device (its
    /// PTX JIT, cached in the driver's compute cache), then looks up each of `symbols` in it,
    /// in order, as [`Module::function`] does. The context is made current once for the load
    /// and every lookup, not once per call: a kernel's first load pays for each push and pop.
    ///
    /// Crate-private on purpose: the only callers hand over bytes whose sha256 was checked
    /// against the bundle index, or that the JIT fallback just compiled or verified.
    pub(crate) fn load_functions(
        context: &Arc<Context>,
        cubin: &[u8],
        symbols: &[&str],
    ) -> Result<(Arc<Module>, Vec<Function>), ModuleStep> {
        // The driver reads PTX as a NUL-terminated string; the artifact has no NUL of its own.
        let terminated;
        let image = if cubin.starts_with(b"\x7fELF") || cubin.last() == Some(&0) {
            cubin
        } else {
            terminated = [cubin, &[0]].concat();
            &terminated
        };
        let current = context.make_current().map_err(ModuleStep::Load)?;
        // SAFETY: `image` is a whole ELF image or NUL-terminated PTX (validated before it
        // reached here), readable for the duration of the call, which copies it; the context
        // is current.
        let handle = unsafe { result::module::load_data(image.as_ptr().cast()) };
        let handle = checked("cuModuleLoadData", handle).map_err(ModuleStep::Load)?;
        let module = Arc::new(Module {
            context: Arc::clone(context),
            handle,
        });
        let functions = symbols
            .iter()
            .map(|symbol| module.get_function(&current, entry_name(symbol)?))
            .collect::<Result<Vec<_>, _>>()
            .map_err(ModuleStep::Lookup)?;
        Ok((module, functions))
    }

    /// The context the module is loaded in.
    pub fn context(&self) -> &Arc<Context> {
        &self.context
    }

    /// The kernel entry with this symbol (mangled, for a C++ template).
    pub fn function(self: &Arc<Self>, symbol: &str) -> Result<Function, DriverError> {
        let name = entry_name(symbol)?;
        let current = self.context.make_current()?;
        self.get_function(&current, name)
    }

    /// The entry `name`, with the module's context made current by `current`.
    fn get_function(
        self: &Arc<Self>,
        current: &Current<'_>,
        name: CString,
    ) -> Result<Function, DriverError> {
        debug_assert!(current.is(&self.context));
        // SAFETY: the module is loaded (this value unloads it only when dropped) and its
        // context is current (`current`).
        let handle = unsafe { result::module::get_function(self.handle, name) };
        let handle = checked("cuModuleGetFunction", handle)?;
        Ok(Function {
            module: Arc::clone(self),
            handle,
        })
    }
}

/// `symbol` as the driver reads it: NUL-terminated, so it must hold no NUL of its own.
fn entry_name(symbol: &str) -> Result<CString, DriverError> {
    CString::new(symbol).map_err(|_| DriverError::Call {
        call: "cuModuleGetFunction",
        code: 1,
        name: "CUDA_ERROR_INVALID_VALUE".to_owned(),
        description: format!("the symbol {symbol:?} contains a NUL byte"),
    })
}

/// Which step of [`Module::load_functions`] failed.
#[derive(Debug)]
pub(crate) enum ModuleStep {
    /// The context could not be made current, or the driver refused the image.
    Load(DriverError),
    /// An entry symbol is not in the loaded module.
    Lookup(DriverError),
}

impl Drop for Module {
    fn drop(&mut self) {
        if let Ok(_current) = self.context.make_current() {
            // SAFETY: the module was loaded by `Module::load_functions` and is unloaded exactly
            // once; no `Function` of it is alive, since each holds an `Arc` of this module.
            let _ = unsafe { result::module::unload(self.handle) };
        }
    }
}

/// A kernel entry of a loaded [`Module`].
#[derive(Clone)]
pub struct Function {
    module: Arc<Module>,
    handle: sys::CUfunction,
}

// SAFETY: function handles are usable from any thread with their context current, which
// `launch` ensures.
unsafe impl Send for Function {}
// SAFETY: as above; `Function` has no interior mutability of its own.
unsafe impl Sync for Function {}

impl std::fmt::Debug for Function {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Function").finish_non_exhaustive()
    }
}

impl Function {
    /// The module this entry belongs to.
    pub fn module(&self) -> &Arc<Module> {
        &self.module
    }
}

/// Device memory in a context, freed when dropped. For tests, benchmarks and examples: a
/// library that runs with PyTorch passes PyTorch's tensors instead.
pub struct DeviceBuffer {
    context: Arc<Context>,
    pointer: sys::CUdeviceptr,
    len: usize,
}

// SAFETY: a device allocation may be used and freed from any thread with its context current,
// which every operation here ensures.
unsafe impl Send for DeviceBuffer {}
// SAFETY: shared references only read the fields; copies to the device need `&mut self`.
unsafe impl Sync for DeviceBuffer {}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("pointer", &format_args!("{:#x}", self.pointer))
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl DeviceBuffer {
    /// Allocates `len` bytes of uninitialised device memory (at least one byte is allocated).
    pub fn alloc(context: &Arc<Context>, len: usize) -> Result<DeviceBuffer, DriverError> {
        let _current = context.make_current()?;
        // SAFETY: the context is current; the memory is handed out as bytes, which any
        // content is valid for, and only ever read back as bytes.
        let pointer = unsafe { result::malloc_sync(len.max(1)) };
        let pointer = checked("cuMemAlloc", pointer)?;
        Ok(DeviceBuffer {
            context: Arc::clone(context),
            pointer,
            len,
        })
    }

    /// Allocates a buffer holding a copy of `bytes`.
    pub fn from_host(context: &Arc<Context>, bytes: &[u8]) -> Result<DeviceBuffer, DriverError> {
        let mut buffer = DeviceBuffer::alloc(context, bytes.len())?;
        buffer.copy_from_host(bytes)?;
        Ok(buffer)
    }

    /// The device address, to pass as a pointer parameter.
    pub fn pointer(&self) -> u64 {
        self.pointer
    }

    /// The size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Overwrites the start of the buffer with `bytes` (at most [`DeviceBuffer::len`] bytes);
    /// returns when the copy is done.
    pub fn copy_from_host(&mut self, bytes: &[u8]) -> Result<(), DriverError> {
        let count = bytes.len().min(self.len);
        if count == 0 {
            return Ok(());
        }
        let _current = self.context.make_current()?;
        // SAFETY: the allocation is live and holds `self.len ≥ count` bytes; the source is
        // the first `count` bytes of `bytes`; the copy is synchronous.
        let result = unsafe { result::memcpy_htod_sync(self.pointer, &bytes[..count]) };
        checked("cuMemcpyHtoD", result)
    }

    /// Copies the whole buffer to the host, after the work queued on the legacy default
    /// stream before it.
    pub fn copy_to_host(&self) -> Result<Vec<u8>, DriverError> {
        let mut bytes = vec![0u8; self.len];
        if self.len == 0 {
            return Ok(bytes);
        }
        let _current = self.context.make_current()?;
        // SAFETY: `bytes` is writable for `self.len` bytes, the live allocation holds as
        // many; the copy is synchronous.
        let result = unsafe { result::memcpy_dtoh_sync(&mut bytes, self.pointer) };
        checked("cuMemcpyDtoH", result)?;
        Ok(bytes)
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if let Ok(_current) = self.context.make_current() {
            // SAFETY: the allocation came from cuMemAlloc and is freed exactly once.
            let _ = unsafe { result::free_sync(self.pointer) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_driver_is_an_error_that_names_the_library() {
        let error = DriverError::Missing {
            library: "libcuda.so.1".into(),
            detail: "libcuda.so.1: cannot open shared object file: No such file or directory"
                .into(),
        };
        assert_eq!(
            error.to_string(),
            "no CUDA driver: libcuda.so.1 not found (libcuda.so.1: cannot open shared object \
             file: No such file or directory)"
        );
        let error = DriverError::Missing {
            library: "libcuda.so.1".into(),
            detail: "wrong ELF class: ELFCLASS32".into(),
        };
        assert_eq!(
            error.to_string(),
            "no CUDA driver: libcuda.so.1 could not be loaded (wrong ELF class: ELFCLASS32)"
        );
    }

    #[test]
    fn no_device_says_how_many_there_are() {
        let none = DriverError::NoDevice {
            ordinal: 0,
            count: 0,
        };
        assert_eq!(
            none.to_string(),
            "no CUDA device: the driver sees no GPU (check CUDA_VISIBLE_DEVICES)"
        );
        let out_of_range = DriverError::NoDevice {
            ordinal: 3,
            count: 1,
        };
        assert_eq!(
            out_of_range.to_string(),
            "no CUDA device 3: the driver sees 1 device"
        );
    }

    #[test]
    fn a_missing_optional_entry_point_names_what_needs_it() {
        let error = DriverError::Unsupported {
            library: "libcuda.so.1".into(),
            symbol: LAUNCH_EX,
            needed_by: "launches with a cluster, cooperative, programmatic or priority attribute",
        };
        assert_eq!(
            error.to_string(),
            "the CUDA driver libcuda.so.1 does not export `cuLaunchKernelEx`, which launches \
             with a cluster, cooperative, programmatic or priority attribute need; update the \
             NVIDIA driver (one for CUDA 12.0 or later has it)"
        );
        // Optional: a driver without it loads.
        assert!(!ENTRY_POINTS.contains(&LAUNCH_EX));
    }

    #[test]
    fn driver_is_there_or_its_absence_is_named() {
        // Whatever this machine has, asking twice gives the same answer and no panic.
        let first = Driver::get();
        let second = Driver::get();
        assert_eq!(
            first.clone().map(|driver| driver.version()),
            second.map(|driver| driver.version())
        );
        // SAFETY: the check only opens and closes the library.
        let present = unsafe { sys::is_culib_present() };
        match first {
            Ok(driver) => {
                assert!(present, "a driver loaded where cudarc finds no libcuda");
                assert!(driver.version() > 0, "{driver:?}");
                assert!(driver.library().contains("cuda"), "{driver:?}");
            }
            // A CPU-only machine, this one: the error names the library and says it is absent.
            Err(error @ DriverError::Missing { .. }) => {
                assert!(!present, "libcuda is present but reported missing: {error}");
                let message = error.to_string();
                assert!(
                    message.starts_with("no CUDA driver: libcuda.so.1 "),
                    "{message}"
                );
                // The dynamic loader's own words, which name the file.
                assert!(message.contains("(libcuda.so.1: "), "{message}");
            }
            // A driver installed without a usable GPU (or with none visible).
            Err(error @ DriverError::NoDevice { .. }) => {
                assert!(present, "{error}");
                assert!(error.to_string().starts_with("no CUDA device"), "{error}");
            }
            Err(error) => panic!("unexpected driver error: {error}"),
        }
    }
}
