//! Why a kernel did not load or launch: every message names the kernel, the variant and what
//! to do about it.

use super::*;
use crate::bundle::BundleError;

/// A failure to open a bundle, reach the GPU, or load or launch a kernel.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The bundle's index or one of its artifacts could not be read or did not verify.
    #[error(transparent)]
    Bundle(Box<BundleError>),
    /// The bundle's `parts.json` (the companion packages of a registry-sized wheel set) could
    /// not be read or is refused.
    #[error(transparent)]
    Parts(Box<PartError>),
    /// The companion package holding the chosen cubin is not installed, or is another version.
    #[error("`{kernel}` ({variant}) cannot load its prebuilt cubin")]
    Part {
        /// The kernel.
        kernel: String,
        /// The variant label (`cu130/sm_90a`).
        variant: String,
        /// Which package is missing, and how to install it.
        #[source]
        source: Box<PartError>,
    },
    /// A setting from the environment is not valid.
    #[error("{variable}=`{value}` is not a CUDA build: {reason}")]
    Setting {
        /// The variable.
        variable: &'static str,
        /// Its value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No CUDA driver, no device, or a driver that cannot be used.
    #[error(transparent)]
    NoGpu(DriverError),
    /// The bundle has no kernel of that name.
    #[error("no kernel `{kernel}` in the bundle at {}; it has {}", bundle.display(), quoted(.known))]
    UnknownKernel {
        /// The name asked for.
        kernel: String,
        /// The bundle.
        bundle: PathBuf,
        /// The kernels it has.
        known: Vec<String>,
    },
    /// No prebuilt variant fits and the JIT fallback is disabled.
    #[error(
        "`{kernel}` has no prebuilt cubin for this GPU and {disabled_by} forbids compiling: \
         {device}; shipped: {}",
        shipped(.refusals)
    )]
    NoFit {
        /// The kernel.
        kernel: String,
        /// What disabled the fallback: `AF3_KERNELS_JIT_FALLBACK=0`.
        disabled_by: String,
        /// The device, CUDA build and driver: `device sm_90 (compute 9.0), CUDA build cu130,
        /// driver 13.0`.
        device: String,
        /// Every shipped variant (and skipped target) and why it does not fit.
        refusals: Box<NoFit>,
    },
    /// No prebuilt variant fits and the JIT fallback failed.
    #[error(
        "`{kernel}` has no prebuilt cubin for this GPU ({device}; shipped: {}) and compiling it \
         from the shipped sources failed",
        shipped(.refusals)
    )]
    Jit {
        /// The kernel.
        kernel: String,
        /// The device, CUDA build and driver.
        device: String,
        /// Every shipped variant and why it does not fit.
        refusals: Box<NoFit>,
        /// Why the fallback failed.
        #[source]
        source: Arc<JitError>,
    },
    /// The variant that fits is only in the store, and downloading it failed.
    #[error(
        "`{kernel}` ({variant}) is not in the wheel and could not be fetched; run `kwheel fetch` \
         where the store is reachable, or set {no_download}=1 to use the JIT rules instead"
    )]
    Fetch {
        /// The kernel.
        kernel: String,
        /// The variant label.
        variant: String,
        /// The variable that forbids downloading: `AF3_KERNELS_NO_DOWNLOAD`.
        no_download: String,
        /// What failed, with the URL.
        #[source]
        source: Box<FetchError>,
    },
    /// A driver call failed while loading or launching a kernel.
    #[error(transparent)]
    Driver(Box<DriverFailure>),
    /// A warm pack's entry for the kernel is not what the package's sources compile to, or
    /// its cubin did not verify (the error names the pack and the kernel).
    #[error(transparent)]
    Pack(Box<crate::jit::pack::PackError>),
    /// The kernel has no entry of that name.
    #[error("`{kernel}` has no entry `{entry}`; its entries are {}", quoted(.entries))]
    UnknownEntry {
        /// The kernel.
        kernel: String,
        /// The entry asked for.
        entry: String,
        /// The entries it has, as declared.
        entries: Vec<String>,
    },
    /// A launch was given the wrong number of arguments.
    #[error(
        "`{entry}` (kernel `{kernel}`) takes {} arguments of {} bytes, but {} were given",
        .expected.len(),
        sizes(.expected),
        .given.len()
    )]
    ArgumentCount {
        /// The kernel.
        kernel: String,
        /// The entry.
        entry: String,
        /// Each parameter's size, from the index.
        expected: Vec<u32>,
        /// Each argument's size.
        given: Vec<usize>,
    },
    /// A launch argument's size differs from its parameter's.
    #[error(
        "argument {index} of `{entry}` (kernel `{kernel}`) is {given} bytes, but parameter \
         {index} is {expected} bytes"
    )]
    Argument {
        /// The kernel.
        kernel: String,
        /// The entry.
        entry: String,
        /// The parameter's position, from 0.
        index: usize,
        /// The parameter's size, from the index.
        expected: u32,
        /// The argument's size.
        given: usize,
    },
    /// A launch the device cannot run as asked (shared memory, a cluster, a cooperative
    /// grid), refused before the driver saw it.
    #[error(transparent)]
    Launch(Box<LaunchRefused>),
}

/// A driver call that failed while loading or launching a kernel, with what it was for.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "cannot {action} `{kernel}` ({variant}) on {device}: `{call}` failed: {name} ({code}): \
     {description}"
)]
pub struct DriverFailure {
    /// The kernel.
    pub kernel: String,
    /// The variant label, or the JIT target.
    pub variant: String,
    /// The device, CUDA build and driver.
    pub device: String,
    /// What was being done: `load`, `look up an entry of`, `launch`.
    pub action: &'static str,
    /// The driver function.
    pub call: &'static str,
    /// The `CUresult` code.
    pub code: i32,
    /// The driver's name for the code (`CUDA_ERROR_NO_BINARY_FOR_GPU`).
    pub name: String,
    /// The driver's description of the code.
    pub description: String,
}

impl From<BundleError> for LoadError {
    fn from(error: BundleError) -> Self {
        LoadError::Bundle(Box::new(error))
    }
}

impl LoadError {
    /// A driver error while doing `action` to a kernel: a failed call, or no usable GPU.
    pub(super) fn driver(
        error: DriverError,
        action: &'static str,
        kernel: &str,
        variant: &str,
        device: &str,
    ) -> LoadError {
        match error {
            DriverError::Call {
                call,
                code,
                name,
                description,
            } => LoadError::Driver(Box::new(DriverFailure {
                kernel: kernel.to_owned(),
                variant: variant.to_owned(),
                device: device.to_owned(),
                action,
                call,
                code,
                name,
                description,
            })),
            other => LoadError::NoGpu(other),
        }
    }
}

pub(super) fn quoted(names: &[String]) -> String {
    crate::untrusted::listed_names(names)
}

pub(super) fn sizes(sizes: &[u32]) -> String {
    if sizes.is_empty() {
        return "0".to_owned();
    }
    sizes
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Every refusal on one line: `cu129/sm_90a: …; cu130/sm_90a: …`, or `none`.
pub(super) fn shipped(no_fit: &NoFit) -> String {
    if no_fit.refusals.is_empty() {
        return "none".to_owned();
    }
    no_fit
        .refusals
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}
