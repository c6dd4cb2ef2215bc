//! The CUDA driver API, loaded from `libcuda.so.1` when first needed: this crate's only
//! driver FFI and its only driver `unsafe`.
//!
//! ```text
//! Driver (process-wide: libcuda loaded once, cuInit once, version)
//!   └── Context (a device's primary context: the one PyTorch uses, retained and released)
//!         ├── Module (a verified cubin, cuModuleLoadData / cuModuleUnload)
//!         │     └── Function (an entry, cuModuleGetFunction; launched with cuLaunchKernel)
//!         └── DeviceBuffer (cuMemAlloc / cuMemFree, copies to and from the host)
//! ```
//!
//! The library is opened with `libloading` and its entry points resolved once, the way
//! [`crate::nvrtc`] opens libnvrtc, rather than through generated bindings, for two reasons:
//!
//! - **Nothing panics.** A missing `libcuda.so.1` (every CPU-only machine) or a missing entry
//!   point (a driver older than kwheel expects) is a [`DriverError`] that `status()` reports,
//!   never a panic inside a binding.
//! - **Result codes stay integers.** `CUresult` is a C enum that grows with every CUDA release
//!   (97 codes in 12.9, 100 in 13.0). A Rust enum bound to one release would hold a value it
//!   does not list as soon as a newer driver returned a new code, which Rust does not allow;
//!   an `int` holds any code, and `cuGetErrorName` names it.
//!
//! Every call that works on a context's objects makes that context current for the call
//! (`cuCtxPushCurrent` / `cuCtxPopCurrent`), so the caller's thread keeps whatever context it
//! had. The primary context is retained by every [`Context`] value and released when the last
//! one is dropped; a process that also runs PyTorch shares the same context with it.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::sync::{Arc, OnceLock};

/// `CUresult`: 0 is success. Kept as an integer, see the module docs.
type CuResult = c_int;
/// `CUdevice`: an ordinal-like handle.
type CuDevice = c_int;
/// `CUcontext`, `CUmodule`, `CUfunction`, `CUstream`: opaque pointers.
type CuHandle = *mut c_void;
/// `CUdeviceptr`: a device address.
type CuDevicePointer = u64;

const CUDA_SUCCESS: CuResult = 0;
const CUDA_ERROR_NO_DEVICE: CuResult = 100;
const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: c_int = 75;
const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: c_int = 76;

/// The file names the driver library is looked up by, in order: the soname every driver
/// install provides, then the development symlink.
pub const DRIVER_LIBRARIES: [&str; 2] = ["libcuda.so.1", "libcuda.so"];

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

/// The driver entry points kwheel calls, resolved once when the library loads. Signatures
/// are transcribed from `cuda.h`; the names are the ones its macros map to (`cuMemAlloc` is
/// `cuMemAlloc_v2`).
struct Api {
    init: unsafe extern "C" fn(c_uint) -> CuResult,
    driver_get_version: unsafe extern "C" fn(*mut c_int) -> CuResult,
    get_error_name: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
    get_error_string: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
    device_get_count: unsafe extern "C" fn(*mut c_int) -> CuResult,
    device_get: unsafe extern "C" fn(*mut CuDevice, c_int) -> CuResult,
    device_get_attribute: unsafe extern "C" fn(*mut c_int, c_int, CuDevice) -> CuResult,
    device_get_name: unsafe extern "C" fn(*mut c_char, c_int, CuDevice) -> CuResult,
    primary_ctx_retain: unsafe extern "C" fn(*mut CuHandle, CuDevice) -> CuResult,
    primary_ctx_release: unsafe extern "C" fn(CuDevice) -> CuResult,
    ctx_push_current: unsafe extern "C" fn(CuHandle) -> CuResult,
    ctx_pop_current: unsafe extern "C" fn(*mut CuHandle) -> CuResult,
    ctx_synchronize: unsafe extern "C" fn() -> CuResult,
    module_load_data: unsafe extern "C" fn(*mut CuHandle, *const c_void) -> CuResult,
    module_unload: unsafe extern "C" fn(CuHandle) -> CuResult,
    module_get_function: unsafe extern "C" fn(*mut CuHandle, CuHandle, *const c_char) -> CuResult,
    #[allow(clippy::type_complexity)]
    launch_kernel: unsafe extern "C" fn(
        CuHandle,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        CuHandle,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> CuResult,
    mem_alloc: unsafe extern "C" fn(*mut CuDevicePointer, usize) -> CuResult,
    mem_free: unsafe extern "C" fn(CuDevicePointer) -> CuResult,
    memcpy_htod: unsafe extern "C" fn(CuDevicePointer, *const c_void, usize) -> CuResult,
    memcpy_dtoh: unsafe extern "C" fn(*mut c_void, CuDevicePointer, usize) -> CuResult,
    stream_synchronize: unsafe extern "C" fn(CuHandle) -> CuResult,
}

/// The loaded CUDA driver. Obtained from [`Driver::get`]; lives until the process exits.
pub struct Driver {
    library_name: String,
    version: i32,
    api: Api,
    // The function pointers in `api` point into this library, which is never unloaded: the
    // `Driver` lives in a process-wide `OnceLock`.
    _library: libloading::Library,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("library", &self.library_name)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

static DRIVER: OnceLock<Result<Driver, DriverError>> = OnceLock::new();

/// Resolves one entry point and copies the function pointer out of the library.
///
/// # Safety
///
/// `T` must be the function's true C signature, and the pointer must not be called after
/// `library` is unloaded.
unsafe fn symbol<T: Copy>(
    library: &libloading::Library,
    library_name: &str,
    name: &'static str,
) -> Result<T, DriverError> {
    let mut bytes = Vec::with_capacity(name.len() + 1);
    bytes.extend_from_slice(name.as_bytes());
    bytes.push(0);
    // SAFETY: the caller guarantees `T` is the symbol's signature and keeps `library` loaded.
    let symbol = unsafe { library.get::<T>(&bytes) };
    symbol
        .map(|symbol| *symbol)
        .map_err(|_| DriverError::Symbol {
            library: library_name.to_owned(),
            symbol: name,
        })
}

impl Driver {
    /// The process's driver: loads `libcuda.so.1` and runs `cuInit` the first time, and
    /// returns the same result (the driver, or why there is none) every time after.
    pub fn get() -> Result<&'static Driver, DriverError> {
        DRIVER
            .get_or_init(Driver::open)
            .as_ref()
            .map_err(Clone::clone)
    }

    fn open() -> Result<Driver, DriverError> {
        let mut first_failure = None;
        for name in DRIVER_LIBRARIES {
            // SAFETY: libcuda's initialisers have no preconditions on the calling process.
            match unsafe { libloading::Library::new(name) } {
                Ok(library) => return Driver::init(library, name),
                Err(error) => {
                    first_failure.get_or_insert_with(|| error.to_string());
                }
            }
        }
        Err(DriverError::Missing {
            library: DRIVER_LIBRARIES[0].to_owned(),
            detail: first_failure.unwrap_or_default(),
        })
    }

    fn init(library: libloading::Library, name: &str) -> Result<Driver, DriverError> {
        // SAFETY: each signature in `Api` is transcribed from `cuda.h` (CUDA 12 and 13 agree);
        // the pointers live in `api`, which is stored next to `library` and never outlives it.
        let api = unsafe {
            Api {
                init: symbol(&library, name, "cuInit")?,
                driver_get_version: symbol(&library, name, "cuDriverGetVersion")?,
                get_error_name: symbol(&library, name, "cuGetErrorName")?,
                get_error_string: symbol(&library, name, "cuGetErrorString")?,
                device_get_count: symbol(&library, name, "cuDeviceGetCount")?,
                device_get: symbol(&library, name, "cuDeviceGet")?,
                device_get_attribute: symbol(&library, name, "cuDeviceGetAttribute")?,
                device_get_name: symbol(&library, name, "cuDeviceGetName")?,
                primary_ctx_retain: symbol(&library, name, "cuDevicePrimaryCtxRetain")?,
                primary_ctx_release: symbol(&library, name, "cuDevicePrimaryCtxRelease_v2")?,
                ctx_push_current: symbol(&library, name, "cuCtxPushCurrent_v2")?,
                ctx_pop_current: symbol(&library, name, "cuCtxPopCurrent_v2")?,
                ctx_synchronize: symbol(&library, name, "cuCtxSynchronize")?,
                module_load_data: symbol(&library, name, "cuModuleLoadData")?,
                module_unload: symbol(&library, name, "cuModuleUnload")?,
                module_get_function: symbol(&library, name, "cuModuleGetFunction")?,
                launch_kernel: symbol(&library, name, "cuLaunchKernel")?,
                mem_alloc: symbol(&library, name, "cuMemAlloc_v2")?,
                mem_free: symbol(&library, name, "cuMemFree_v2")?,
                memcpy_htod: symbol(&library, name, "cuMemcpyHtoD_v2")?,
                memcpy_dtoh: symbol(&library, name, "cuMemcpyDtoH_v2")?,
                stream_synchronize: symbol(&library, name, "cuStreamSynchronize")?,
            }
        };
        let mut driver = Driver {
            library_name: name.to_owned(),
            version: 0,
            api,
            _library: library,
        };
        let mut version: c_int = 0;
        // SAFETY: `version` is valid for writes of one `int`; this call needs no cuInit.
        let result = unsafe { (driver.api.driver_get_version)(&mut version) };
        driver.check("cuDriverGetVersion", result)?;
        driver.version = version;
        // SAFETY: cuInit takes flags, which must be 0.
        let result = unsafe { (driver.api.init)(0) };
        if result == CUDA_ERROR_NO_DEVICE {
            return Err(DriverError::NoDevice {
                ordinal: 0,
                count: 0,
            });
        }
        driver.check("cuInit", result)?;
        Ok(driver)
    }

    /// The CUDA version the driver supports, as `cuDriverGetVersion` reports it (`13000` for
    /// 13.0).
    pub fn version(&self) -> i32 {
        self.version
    }

    /// The file the driver was loaded from, as it was looked up (`libcuda.so.1`).
    pub fn library(&self) -> &str {
        &self.library_name
    }

    /// How many devices the driver sees.
    pub fn device_count(&self) -> Result<u32, DriverError> {
        let mut count: c_int = 0;
        // SAFETY: `count` is valid for writes of one `int`.
        let result = unsafe { (self.api.device_get_count)(&mut count) };
        self.check("cuDeviceGetCount", result)?;
        Ok(u32::try_from(count).unwrap_or(0))
    }

    /// The device with this ordinal: its compute capability and name.
    pub fn device(&self, ordinal: u32) -> Result<Device, DriverError> {
        let count = self.device_count()?;
        if ordinal >= count {
            return Err(DriverError::NoDevice { ordinal, count });
        }
        let mut handle: CuDevice = 0;
        // SAFETY: `handle` is valid for writes; the ordinal is below the device count.
        let result = unsafe { (self.api.device_get)(&mut handle, ordinal as c_int) };
        self.check("cuDeviceGet", result)?;
        let major = self.attribute(handle, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = self.attribute(handle, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let mut name = [0 as c_char; 256];
        // SAFETY: `name` has room for the 256 bytes passed as its length; the driver writes a
        // NUL-terminated string that fits.
        let result =
            unsafe { (self.api.device_get_name)(name.as_mut_ptr(), name.len() as c_int, handle) };
        self.check("cuDeviceGetName", result)?;
        // SAFETY: the driver NUL-terminated the name within the buffer.
        let name = unsafe { CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        Ok(Device {
            ordinal,
            handle,
            capability: (major, minor),
            name,
        })
    }

    fn attribute(&self, device: CuDevice, attribute: c_int) -> Result<u32, DriverError> {
        let mut value: c_int = 0;
        // SAFETY: `value` is valid for writes; `device` came from cuDeviceGet.
        let result = unsafe { (self.api.device_get_attribute)(&mut value, attribute, device) };
        self.check("cuDeviceGetAttribute", result)?;
        Ok(u32::try_from(value).unwrap_or(0))
    }

    fn check(&self, call: &'static str, result: CuResult) -> Result<(), DriverError> {
        if result == CUDA_SUCCESS {
            return Ok(());
        }
        Err(DriverError::Call {
            call,
            code: result,
            name: self
                .error_text(self.api.get_error_name, result)
                .unwrap_or_else(|| format!("CUDA error {result}")),
            description: self
                .error_text(self.api.get_error_string, result)
                .unwrap_or_else(|| "unknown to this driver".to_owned()),
        })
    }

    fn error_text(
        &self,
        lookup: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
        code: CuResult,
    ) -> Option<String> {
        let mut text: *const c_char = std::ptr::null();
        // SAFETY: `text` is valid for writes; the driver answers any code, with an error for
        // codes it does not know, and otherwise points `text` at a static string.
        let result = unsafe { lookup(code, &mut text) };
        if result != CUDA_SUCCESS || text.is_null() {
            return None;
        }
        // SAFETY: non-null, NUL-terminated, static.
        Some(
            unsafe { CStr::from_ptr(text) }
                .to_string_lossy()
                .into_owned(),
        )
    }
}

/// A GPU as the driver reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Device {
    ordinal: u32,
    handle: CuDevice,
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
    handle: CuHandle,
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
        let mut handle: CuHandle = std::ptr::null_mut();
        // SAFETY: `handle` is valid for writes; `device.handle` came from cuDeviceGet.
        let result = unsafe { (driver.api.primary_ctx_retain)(&mut handle, device.handle) };
        driver.check("cuDevicePrimaryCtxRetain", result)?;
        Ok(Arc::new(Context {
            driver,
            device,
            handle,
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
        // SAFETY: the context is current on this thread.
        let result = unsafe { (self.driver.api.ctx_synchronize)() };
        self.driver.check("cuCtxSynchronize", result)
    }

    /// Waits for the work on one stream (`0`: the legacy default stream) to finish.
    pub fn synchronize_stream(&self, stream: u64) -> Result<(), DriverError> {
        let _current = self.make_current()?;
        // SAFETY: the stream handle is the caller's: 0 or a stream of this context.
        let result = unsafe { (self.driver.api.stream_synchronize)(stream as usize as CuHandle) };
        self.driver.check("cuStreamSynchronize", result)
    }

    fn make_current(&self) -> Result<Current<'_>, DriverError> {
        // SAFETY: `handle` is a retained primary context.
        let result = unsafe { (self.driver.api.ctx_push_current)(self.handle) };
        self.driver.check("cuCtxPushCurrent", result)?;
        Ok(Current { context: self })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: this value retained the primary context once, and releases it once.
        unsafe { (self.driver.api.primary_ctx_release)(self.device.handle) };
    }
}

/// The context made current on this thread until dropped; the previous one is restored.
struct Current<'a> {
    context: &'a Context,
}

impl Drop for Current<'_> {
    fn drop(&mut self) {
        let mut popped: CuHandle = std::ptr::null_mut();
        // SAFETY: `make_current` pushed this context on this thread; popping restores the
        // caller's context.
        unsafe { (self.context.driver.api.ctx_pop_current)(&mut popped) };
    }
}

/// A cubin loaded into a context. Unloaded when the last [`Function`] of it is dropped.
pub struct Module {
    context: Arc<Context>,
    handle: CuHandle,
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
    /// PTX JIT, cached in the driver's compute cache).
    ///
    /// Crate-private on purpose: the only callers hand over bytes whose sha256 was checked
    /// against the bundle index, or that the JIT fallback just compiled or verified.
    pub(crate) fn load(context: &Arc<Context>, cubin: &[u8]) -> Result<Arc<Module>, DriverError> {
        let driver = context.driver;
        // The driver reads PTX as a NUL-terminated string; the artifact has no NUL of its own.
        let terminated;
        let image = if cubin.starts_with(b"\x7fELF") || cubin.last() == Some(&0) {
            cubin
        } else {
            terminated = [cubin, &[0]].concat();
            &terminated
        };
        let _current = context.make_current()?;
        let mut handle: CuHandle = std::ptr::null_mut();
        // SAFETY: `image` is a whole ELF image or NUL-terminated PTX (validated before it
        // reached here), readable for the duration of the call, which copies it; `handle` is
        // valid for writes.
        let result = unsafe { (driver.api.module_load_data)(&mut handle, image.as_ptr().cast()) };
        driver.check("cuModuleLoadData", result)?;
        Ok(Arc::new(Module {
            context: Arc::clone(context),
            handle,
        }))
    }

    /// The context the module is loaded in.
    pub fn context(&self) -> &Arc<Context> {
        &self.context
    }

    /// The kernel entry with this symbol (mangled, for a C++ template).
    pub fn function(self: &Arc<Self>, symbol: &str) -> Result<Function, DriverError> {
        let driver = self.context.driver;
        let name = CString::new(symbol).map_err(|_| DriverError::Call {
            call: "cuModuleGetFunction",
            code: 1,
            name: "CUDA_ERROR_INVALID_VALUE".to_owned(),
            description: format!("the symbol {symbol:?} contains a NUL byte"),
        })?;
        let _current = self.context.make_current()?;
        let mut handle: CuHandle = std::ptr::null_mut();
        // SAFETY: the module is loaded; `name` is NUL-terminated; `handle` is valid for writes.
        let result =
            unsafe { (driver.api.module_get_function)(&mut handle, self.handle, name.as_ptr()) };
        driver.check("cuModuleGetFunction", result)?;
        Ok(Function {
            module: Arc::clone(self),
            handle,
        })
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        if let Ok(_current) = self.context.make_current() {
            // SAFETY: the module was loaded by `Module::load` and is unloaded exactly once; no
            // `Function` of it is alive, since each holds an `Arc` of this module.
            unsafe { (self.context.driver.api.module_unload)(self.handle) };
        }
    }
}

/// A kernel entry of a loaded [`Module`].
#[derive(Clone)]
pub struct Function {
    module: Arc<Module>,
    handle: CuHandle,
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

/// Launch geometry: grid and block dimensions, dynamic shared memory, and the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Grid dimensions, in blocks.
    pub grid: [u32; 3],
    /// Block dimensions, in threads.
    pub block: [u32; 3],
    /// Dynamic shared memory per block, in bytes.
    pub shared_mem_bytes: u32,
    /// The `CUstream` handle as an integer: `0` is the legacy default stream; from PyTorch,
    /// `torch.cuda.current_stream().cuda_stream`.
    pub stream: u64,
}

impl Function {
    /// The module this entry belongs to.
    pub fn module(&self) -> &Arc<Module> {
        &self.module
    }

    /// Launches the kernel with one byte image per parameter, in order. Returns once the
    /// launch is queued; errors of the kernel itself surface at the next synchronization.
    ///
    /// # Safety
    ///
    /// `params` must match the kernel's parameters one for one, in size and meaning: every
    /// pointer a device address the kernel may access as it does, over the whole range it
    /// accesses, and alive until the kernel finishes. A kernel given wrong pointers can write
    /// anywhere the device can reach, host memory included on systems with unified memory.
    /// `config.stream` must be 0 or a live stream of this function's context.
    pub unsafe fn launch(
        &self,
        config: &LaunchConfig,
        params: &[&[u8]],
    ) -> Result<(), DriverError> {
        let context = &self.module.context;
        let driver = context.driver;
        let mut pointers: Vec<*mut c_void> = params
            .iter()
            .map(|param| param.as_ptr().cast_mut().cast())
            .collect();
        let _current = context.make_current()?;
        let [grid_x, grid_y, grid_z] = config.grid;
        let [block_x, block_y, block_z] = config.block;
        // SAFETY: the function is loaded in the current context; `pointers` holds one pointer
        // per parameter into `params`, which the driver copies before returning (the caller
        // vouches for their sizes and meaning); `extra` is null.
        let result = unsafe {
            (driver.api.launch_kernel)(
                self.handle,
                grid_x,
                grid_y,
                grid_z,
                block_x,
                block_y,
                block_z,
                config.shared_mem_bytes,
                config.stream as usize as CuHandle,
                pointers.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        driver.check("cuLaunchKernel", result)
    }
}

/// Device memory in a context, freed when dropped. For tests, benchmarks and examples: a
/// library that runs with PyTorch passes PyTorch's tensors instead.
pub struct DeviceBuffer {
    context: Arc<Context>,
    pointer: CuDevicePointer,
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
        let driver = context.driver;
        let _current = context.make_current()?;
        let mut pointer: CuDevicePointer = 0;
        // SAFETY: `pointer` is valid for writes; the context is current.
        let result = unsafe { (driver.api.mem_alloc)(&mut pointer, len.max(1)) };
        driver.check("cuMemAlloc", result)?;
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
        let driver = self.context.driver;
        let _current = self.context.make_current()?;
        // SAFETY: the allocation holds `self.len ≥ count` bytes; `bytes` is readable for
        // `count` bytes; the copy is synchronous.
        let result =
            unsafe { (driver.api.memcpy_htod)(self.pointer, bytes.as_ptr().cast(), count) };
        driver.check("cuMemcpyHtoD", result)
    }

    /// Copies the whole buffer to the host, after the work queued on the legacy default
    /// stream before it.
    pub fn copy_to_host(&self) -> Result<Vec<u8>, DriverError> {
        let mut bytes = vec![0u8; self.len];
        if self.len == 0 {
            return Ok(bytes);
        }
        let driver = self.context.driver;
        let _current = self.context.make_current()?;
        // SAFETY: `bytes` is writable for `self.len` bytes, the allocation holds as many; the
        // copy is synchronous.
        let result =
            unsafe { (driver.api.memcpy_dtoh)(bytes.as_mut_ptr().cast(), self.pointer, self.len) };
        driver.check("cuMemcpyDtoH", result)?;
        Ok(bytes)
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if let Ok(_current) = self.context.make_current() {
            // SAFETY: the allocation came from cuMemAlloc and is freed exactly once.
            unsafe { (self.context.driver.api.mem_free)(self.pointer) };
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
    fn driver_is_loaded_once_and_never_panics() {
        // Whatever this machine has, asking twice gives the same answer and no panic.
        let first = Driver::get().map(|driver| driver.version());
        let second = Driver::get().map(|driver| driver.version());
        assert_eq!(first, second);
        if let Err(error) = first {
            assert!(
                matches!(
                    error,
                    DriverError::Missing { .. } | DriverError::NoDevice { .. }
                ),
                "{error}"
            );
        }
    }
}
