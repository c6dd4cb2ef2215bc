//! The loader's two side effects behind narrow traits: the GPU ([`Device`]) and the store a
//! slim wheel leaves artifacts in ([`crate::fetch::ArtifactStore`]). The registry's load order
//! (wheel → cache → store → JIT → refusal), its tamper refusals and its JIT policy are tested
//! on a CPU through fakes of both; [`CudaDevice`] is the real device, tested on a GPU.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::device::DriverVersion;
use crate::driver::{self, Context, Driver, DriverError, LaunchConfig, Module, ModuleStep};

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
        let function = self
            .functions
            .get(function)
            .ok_or_else(|| DriverError::Call {
                call: "cuLaunchKernel",
                code: 0,
                name: "CUDA_ERROR_NOT_FOUND".to_owned(),
                description: format!("the module has {} entry functions", self.functions.len()),
            })?;
        // SAFETY: the caller upholds `driver::Function::launch`'s contract.
        unsafe { function.launch(config, params) }
    }
}
