//! The loader's two side effects behind narrow traits: the GPU ([`Device`]) and the store a
//! slim wheel leaves artifacts in ([`crate::fetch::ArtifactStore`]). The registry's load order
//! (wheel → cache → store → JIT → refusal), its tamper refusals and its JIT policy are tested
//! on a CPU through fakes of both; [`CudaDevice`] is the real device, tested on a GPU.
//!
//! A [`LoadedModule`] also answers what checking a launch needs ([`LaunchFacts`]) and does the
//! few things a launch beyond the plain one asks of the driver (raising a function's dynamic
//! shared memory, occupancy, launch attributes), so that the launch checks and the raise-only
//! shared-memory rule of `kernel.rs` run against a fake too. Their default implementations
//! describe a device that knows only plain launches: a fake that never asks for more need not
//! implement them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::device::DriverVersion;
use crate::driver::{
    self, Context, DeviceLimits, Driver, DriverError, FunctionAttributes, LaunchAttributes,
    LaunchConfig, Module, ModuleStep,
};

/// What selection needs from the device: its compute capability and the CUDA version its
/// driver supports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceFacts {
    /// The compute capability, `(9, 0)` for an H200.
    pub capability: (u32, u32),
    /// The CUDA version the driver supports.
    pub driver: DriverVersion,
}

/// Which step of loading a module failed, for the message.
#[derive(Debug)]
pub enum ModuleFailure {
    /// No context: no driver, no such device, or the context could not be made.
    Context(DriverError),
    /// The driver refused the image.
    Load(DriverError),
    /// An entry symbol is not in the loaded module.
    Lookup(DriverError),
}

/// What checking a launch of one entry function needs to know: of the device, of the
/// function, and of the driver. Asked once per function, the first time a launch needs more
/// than a plain launch within the function's current shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchFacts {
    /// The device's compute capability, `(9, 0)` for an H200.
    pub capability: (u32, u32),
    /// What the device allows one launch.
    pub device: DeviceLimits,
    /// What the driver says about the function, as it was before any launch raised anything.
    pub function: FunctionAttributes,
    /// Whether the driver launches with attributes (it exports `cuLaunchKernelEx`).
    pub launch_attributes: bool,
}

/// The error of a [`LoadedModule`] method that a device knowing only plain launches lacks.
fn plain_launches_only(call: &'static str) -> DriverError {
    DriverError::Call {
        call,
        code: 801,
        name: "CUDA_ERROR_NOT_SUPPORTED".to_owned(),
        description: "this device knows only plain launches".to_owned(),
    }
}

/// The GPU as the loader uses it. Implementations never panic on a machine without a driver:
/// they return the error.
pub trait Device: Send + Sync {
    /// The facts of device `ordinal`. Loads the driver; creates no context.
    fn facts(&self, ordinal: u32) -> Result<DeviceFacts, DriverError>;

    /// Loads a verified `image` (cubin or PTX) into device `ordinal`'s primary context and
    /// looks up each of `symbols` in it, in order.
    fn load(
        &self,
        ordinal: u32,
        image: &[u8],
        symbols: &[&str],
    ) -> Result<Arc<dyn LoadedModule>, ModuleFailure>;
}

/// A module on the device with its entry functions, in the order they were looked up.
pub trait LoadedModule: Send + Sync {
    /// The primary context the module lives in; `None` for a device that is not CUDA's.
    fn context(&self) -> Option<&Arc<Context>>;

    /// Launches entry function number `function` with `params` (one byte image per
    /// parameter).
    ///
    /// # Safety
    ///
    /// As [`driver::Function::launch`]: the parameters' count and sizes match the entry, every
    /// pointer among them is a device address the kernel may access, and `config.stream` is 0
    /// or a live stream of the module's context.
    unsafe fn launch(
        &self,
        function: usize,
        config: &LaunchConfig,
        params: &[&[u8]],
    ) -> Result<(), DriverError>;

    /// What checking a launch of entry function number `function` needs to know.
    fn launch_facts(&self, function: usize) -> Result<LaunchFacts, DriverError> {
        let _ = function;
        Err(plain_launches_only("cuFuncGetAttribute"))
    }

    /// Sets entry function number `function`'s maximum dynamic shared memory to `bytes`
    /// (`CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`). The caller only ever raises it.
    fn set_max_dynamic_shared_memory(
        &self,
        function: usize,
        bytes: u32,
    ) -> Result<(), DriverError> {
        let _ = (function, bytes);
        Err(plain_launches_only("cuFuncSetAttribute"))
    }

    /// How many blocks of entry function number `function`, of `block_threads` threads and
    /// `dynamic_shared_memory` bytes, one multiprocessor holds at once.
    fn max_active_blocks_per_multiprocessor(
        &self,
        function: usize,
        block_threads: u32,
        dynamic_shared_memory: u32,
    ) -> Result<u32, DriverError> {
        let _ = (function, block_threads, dynamic_shared_memory);
        Err(plain_launches_only(
            "cuOccupancyMaxActiveBlocksPerMultiprocessor",
        ))
    }

    /// Launches entry function number `function` with launch `attributes` (none: as
    /// [`LoadedModule::launch`]).
    ///
    /// # Safety
    ///
    /// As [`LoadedModule::launch`].
    unsafe fn launch_with_attributes(
        &self,
        function: usize,
        config: &LaunchConfig,
        attributes: &LaunchAttributes,
        params: &[&[u8]],
    ) -> Result<(), DriverError> {
        if attributes.is_empty() {
            // SAFETY: the caller upholds `launch`'s contract.
            return unsafe { self.launch(function, config, params) };
        }
        Err(plain_launches_only("cuLaunchKernelEx"))
    }
}

/// The CUDA driver: device facts from `cuDeviceGetAttribute`/`cuDriverGetVersion`, modules
/// in each device's primary context (PyTorch's), retained once per device and [`CudaDevice`].
#[derive(Default)]
pub struct CudaDevice {
    contexts: Mutex<BTreeMap<u32, Result<Arc<Context>, DriverError>>>,
}

impl CudaDevice {
    /// The primary context of `ordinal`, retained on first use.
    pub fn context(&self, ordinal: u32) -> Result<Arc<Context>, DriverError> {
        self.contexts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(ordinal)
            .or_insert_with(|| Context::primary(ordinal))
            .clone()
    }
}

impl Device for CudaDevice {
    /// Asked of the driver once per process ([`Driver::device`] keeps each device it found):
    /// every registry opens its own [`CudaDevice`].
    fn facts(&self, ordinal: u32) -> Result<DeviceFacts, DriverError> {
        let driver = Driver::get()?;
        let device = driver.device(ordinal)?;
        Ok(DeviceFacts {
            capability: device.capability(),
            driver: DriverVersion::from_api(driver.version()),
        })
    }

    fn load(
        &self,
        ordinal: u32,
        image: &[u8],
        symbols: &[&str],
    ) -> Result<Arc<dyn LoadedModule>, ModuleFailure> {
        let context = self.context(ordinal).map_err(ModuleFailure::Context)?;
        let (_module, functions) =
            Module::load_functions(&context, image, symbols).map_err(|step| match step {
                ModuleStep::Load(error) => ModuleFailure::Load(error),
                ModuleStep::Lookup(error) => ModuleFailure::Lookup(error),
            })?;
        Ok(Arc::new(CudaModule { context, functions }))
    }
}

struct CudaModule {
    context: Arc<Context>,
    functions: Vec<driver::Function>,
}

impl CudaModule {
    /// Entry function number `function`, for `call`.
    fn function(
        &self,
        function: usize,
        call: &'static str,
    ) -> Result<&driver::Function, DriverError> {
        self.functions
            .get(function)
            .ok_or_else(|| DriverError::Call {
                call,
                code: 500,
                name: "CUDA_ERROR_NOT_FOUND".to_owned(),
                description: format!("the module has {} entry functions", self.functions.len()),
            })
    }
}

impl LoadedModule for CudaModule {
    fn context(&self) -> Option<&Arc<Context>> {
        Some(&self.context)
    }

    unsafe fn launch(
        &self,
        function: usize,
        config: &LaunchConfig,
        params: &[&[u8]],
    ) -> Result<(), DriverError> {
        let function = self.function(function, "cuLaunchKernel")?;
        // SAFETY: the caller upholds `driver::Function::launch`'s contract.
        unsafe { function.launch(config, params) }
    }

    fn launch_facts(&self, function: usize) -> Result<LaunchFacts, DriverError> {
        let function = self.function(function, "cuFuncGetAttribute")?;
        Ok(LaunchFacts {
            capability: self.context.device().capability(),
            device: self.context.limits()?,
            function: function.attributes()?,
            launch_attributes: self.context.driver().supports_launch_attributes(),
        })
    }

    fn set_max_dynamic_shared_memory(
        &self,
        function: usize,
        bytes: u32,
    ) -> Result<(), DriverError> {
        self.function(function, "cuFuncSetAttribute")?
            .set_max_dynamic_shared_memory(bytes)
    }

    fn max_active_blocks_per_multiprocessor(
        &self,
        function: usize,
        block_threads: u32,
        dynamic_shared_memory: u32,
    ) -> Result<u32, DriverError> {
        self.function(function, "cuOccupancyMaxActiveBlocksPerMultiprocessor")?
            .max_active_blocks_per_multiprocessor(block_threads, dynamic_shared_memory)
    }

    unsafe fn launch_with_attributes(
        &self,
        function: usize,
        config: &LaunchConfig,
        attributes: &LaunchAttributes,
        params: &[&[u8]],
    ) -> Result<(), DriverError> {
        let function = self.function(function, "cuLaunchKernelEx")?;
        // SAFETY: the caller upholds `driver::Function::launch`'s contract.
        unsafe { function.launch_with_attributes(config, attributes, params) }
    }
}
