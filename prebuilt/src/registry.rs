//! The runtime loader: a bundle's kernels by name, loaded for this process's GPU.
//!
//! ```text
//! Registry::open(bundle)            reads index.json; touches no GPU
//!   │
//!   ├─ status() / load(name)        first time: libcuda, device, driver version, CUDA build
//!   │     │
//!   │     ├─ select_variant ─ fits ──→ read artifact: zstd frame, sha256 checked
//!   │     │     │                      → cuModuleLoadData → cuModuleGetFunction  (Prebuilt)
//!   │     │     └─ not in the bundle (slim wheel) → artifact cache, else the store
//!   │     │        (unless <PACKAGE>_NO_DOWNLOAD=1): sha256 checked, cached; see fetch
//!   │     │
//!   │     └─ no fit ─┬─ <PACKAGE>_JIT_FALLBACK=0 → LoadError::NoFit: device, build, every
//!   │                │                              shipped variant and why it did not fit
//!   │                └─ else → jit::compile_cached (cache hit: JitCache; else JitCompiled)
//!   │                          → cuModuleLoadData → cuModuleGetFunction
//!   │
//!   └─ Kernel::launch(entry, …)     arguments checked against the index's parameter sizes,
//!                                   then cuLaunchKernel in the device's primary context
//! ```
//!
//! The CUDA build is the runtime's, which torch decides: [`RegistryOptions::cuda`], else
//! `KWHEEL_CUDA_BUILD`, else the newest build in the bundle that the driver supports. The
//! primary context (PyTorch's) is retained on the first [`Registry::load`], not before:
//! [`Registry::status`] answers from the device's compute capability and driver version alone.
//! Loaded kernels are kept: a second `load` of the same name returns the same module.
//! `docs/jit.md` describes the fallback and its cache.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use serde::Serialize;

use crate::bundle::{read_stored, Bundle, BundleError};
use crate::driver::{self, Context, DeviceBuffer, Driver, DriverError, LaunchConfig, Module};
use crate::fetch::{
    self, locate, no_download_variable, obtain_remote, ArtifactCache, ArtifactLocation,
    DownloadPolicy, FetchError, StoreHandle, StoreOptions,
};
use crate::index::{Constant, Function as EntryRecord, Index, KernelRecord, Variant};
use crate::jit::{
    self, compile_cached, device_arch, fallback_variable, CompilerSearch, JitCompiler, JitError,
    JitPolicy, JitRequest,
};
use crate::key::sha256_hex;
use crate::select::{
    select_variant_with, Choice, DeviceQuery, DriverVersion, NoFit, PtxJitPolicy, Refusal,
    RefusalReason,
};
use crate::{error_chain, CudaBuild};

/// Names the runtime's CUDA build (`cu129`) when [`RegistryOptions::cuda`] does not.
pub const CUDA_BUILD_ENV: &str = "KWHEEL_CUDA_BUILD";

/// How a [`Registry`] loads: for which CUDA build, torch, device, and whether it may compile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegistryOptions {
    /// The runtime's CUDA build (torch's: `cu129` for a `+cu129` torch). `None`: read
    /// `KWHEEL_CUDA_BUILD`, else take the newest build in the bundle the driver supports.
    pub cuda: Option<CudaBuild>,
    /// The runtime's torch version (`2.13.0+cu129`), checked against each variant's pin;
    /// `None` skips that check.
    pub torch: Option<String>,
    /// Whether a kernel without a fitting cubin is compiled from its shipped sources.
    pub jit: JitPolicy,
    /// Where JIT results are cached (see [`crate::jit`]). Never inside the bundle.
    pub jit_cache: PathBuf,
    /// Where the JIT fallback looks for NVRTC and nvcc.
    pub compilers: CompilerSearch,
    /// The CUDA device ordinal.
    pub device: u32,
    /// Whether a variant that only the bundle's store has may be downloaded.
    pub downloads: DownloadPolicy,
    /// Whether PTX variants may load, which has the driver compile them on first load.
    pub ptx_jit: PtxJitPolicy,
    /// Where downloaded cubins are cached (see [`crate::fetch`]). Never inside the bundle.
    pub artifact_cache: PathBuf,
    /// Timeouts, retries and the token for the store.
    pub store: StoreOptions,
}

impl Default for RegistryOptions {
    /// No build or torch given, the JIT policy and cache and compiler search from the
    /// environment, device 0.
    fn default() -> Self {
        RegistryOptions {
            cuda: None,
            torch: None,
            jit: JitPolicy::FromEnvironment,
            jit_cache: jit::default_cache_dir(),
            compilers: CompilerSearch::from_env(),
            device: 0,
            downloads: DownloadPolicy::FromEnvironment,
            ptx_jit: PtxJitPolicy::FromEnvironment,
            artifact_cache: fetch::default_cache_dir(),
            store: StoreOptions::default(),
        }
    }
}

/// Where a loaded kernel's cubin came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Provenance {
    /// A cubin of the bundle.
    Prebuilt {
        /// The variant's label, `cu129/sm_90a`.
        variant: String,
        /// The variant's key.
        key: String,
    },
    /// A JIT result found in the cache.
    JitCache {
        /// The key it is cached under.
        key: String,
    },
    /// Compiled from the shipped sources by this load.
    JitCompiled {
        /// The key it is now cached under.
        key: String,
    },
}

impl Provenance {
    /// Which of the three it is.
    pub fn kind(&self) -> ProvenanceKind {
        match self {
            Provenance::Prebuilt { .. } => ProvenanceKind::Prebuilt,
            Provenance::JitCache { .. } => ProvenanceKind::JitCache,
            Provenance::JitCompiled { .. } => ProvenanceKind::JitCompiled,
        }
    }

    /// The key of the cubin.
    pub fn key(&self) -> &str {
        match self {
            Provenance::Prebuilt { key, .. }
            | Provenance::JitCache { key }
            | Provenance::JitCompiled { key } => key,
        }
    }
}

impl fmt::Display for Provenance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Provenance::Prebuilt { variant, key } => write!(f, "prebuilt {variant} (key {key})"),
            Provenance::JitCache { key } => write!(f, "jit-cache (key {key})"),
            Provenance::JitCompiled { key } => write!(f, "jit-compiled (key {key})"),
        }
    }
}

/// [`Provenance`] without its details, as [`Status`] reports it before a load.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProvenanceKind {
    /// A cubin of the bundle.
    Prebuilt,
    /// A JIT result in the cache.
    JitCache,
    /// Compiled from the shipped sources (on the first load, for a kernel not loaded yet).
    JitCompiled,
}

impl fmt::Display for ProvenanceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ProvenanceKind::Prebuilt => "prebuilt",
            ProvenanceKind::JitCache => "jit-cache",
            ProvenanceKind::JitCompiled => "jit-compiled",
        })
    }
}

/// Whether a kernel can be loaded here, and how or why not.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Status {
    /// It loads (or has loaded).
    Available {
        /// The variant: `cu129/sm_90a`; for the JIT, the build and architecture it compiles for.
        variant: String,
        /// Why it fits, or why it is compiled.
        reason: String,
        /// Where the cubin comes from.
        provenance: ProvenanceKind,
        /// Where a prebuilt cubin is: in the wheel, in the cache, or only in the store (fetched
        /// on first load). `None` for the JIT.
        #[serde(skip_serializing_if = "Option::is_none")]
        location: Option<ArtifactLocation>,
    },
    /// It cannot load here.
    Unavailable {
        /// Why, in a sentence a user can act on.
        reason: String,
    },
}

/// A failure to open a bundle, reach the GPU, or load or launch a kernel.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The bundle's index or one of its artifacts could not be read or did not verify.
    #[error(transparent)]
    Bundle(Box<BundleError>),
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
    fn driver(
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

fn quoted(names: &[String]) -> String {
    if names.is_empty() {
        return "none".to_owned();
    }
    names
        .iter()
        .map(|name| format!("`{name}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn sizes(sizes: &[u32]) -> String {
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
fn shipped(no_fit: &NoFit) -> String {
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

/// What the process runs on, found once per registry.
#[derive(Clone, Debug)]
struct Gpu {
    capability: (u32, u32),
    driver: DriverVersion,
    cuda: CudaBuild,
    torch: Option<String>,
}

impl Gpu {
    fn query(&self) -> DeviceQuery {
        DeviceQuery {
            capability: self.capability,
            driver: self.driver,
            cuda: self.cuda,
            torch: self.torch.clone(),
        }
    }

    /// `device sm_90 (compute 9.0), CUDA build cu130, driver 13.0`.
    fn describe(&self) -> String {
        let (major, minor) = self.capability;
        let mut text = format!(
            "device sm_{major}{minor} (compute {major}.{minor}), CUDA build {}, driver {}",
            self.cuda, self.driver
        );
        if let Some(torch) = &self.torch {
            text.push_str(&format!(", torch {torch}"));
        }
        text
    }
}

/// A bundle's kernels, loaded on demand for one GPU. Cheap to open; thread-safe.
pub struct Registry {
    bundle: Bundle,
    options: RegistryOptions,
    jit_allowed: bool,
    disabled_by: String,
    downloads_allowed: bool,
    no_download: String,
    /// The setting that forbids loading PTX, when one does.
    ptx_forbidden_by: Option<String>,
    artifact_cache: ArtifactCache,
    store: OnceLock<StoreHandle>,
    gpu: OnceLock<Result<Gpu, DriverError>>,
    context: OnceLock<Result<Arc<Context>, DriverError>>,
    compiler: OnceLock<Result<JitCompiler, Arc<JitError>>>,
    dictionary: OnceLock<Option<Vec<u8>>>,
    kernels: BTreeMap<String, Mutex<Option<Kernel>>>,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("bundle", &self.bundle.root())
            .field("options", &self.options)
            .field("jit_allowed", &self.jit_allowed)
            .finish_non_exhaustive()
    }
}

impl Registry {
    /// Opens the bundle at `bundle_dir` with options from the environment. Reads the index;
    /// does not touch the GPU.
    pub fn open(bundle_dir: impl Into<PathBuf>) -> Result<Registry, LoadError> {
        Registry::open_with(bundle_dir, RegistryOptions::default())
    }

    /// Opens the bundle at `bundle_dir` with `options`. Reads the index and
    /// `KWHEEL_CUDA_BUILD` and `<PACKAGE>_JIT_FALLBACK` as the options ask; does not touch the
    /// GPU.
    pub fn open_with(
        bundle_dir: impl Into<PathBuf>,
        mut options: RegistryOptions,
    ) -> Result<Registry, LoadError> {
        let bundle = Bundle::open(bundle_dir)?;
        if options.cuda.is_none() {
            options.cuda = build_from_env()?;
        }
        let package = bundle.index().package.clone();
        let variable = fallback_variable(&package);
        let jit_allowed = options.jit.allows_compiling(&package);
        let disabled_by = match options.jit {
            JitPolicy::FromEnvironment => format!(
                "{variable}={}",
                std::env::var(&variable).unwrap_or_default()
            ),
            _ => format!("the loader's JIT policy (as {variable}=0 would)"),
        };
        let downloads_allowed = options.downloads.allows_download(&package);
        let no_download = no_download_variable(&package);
        let ptx_forbidden_by = options.ptx_jit.forbidden_by(&package);
        let artifact_cache = ArtifactCache::new(&options.artifact_cache);
        let kernels = bundle
            .index()
            .kernels
            .keys()
            .map(|name| (name.clone(), Mutex::new(None)))
            .collect();
        Ok(Registry {
            bundle,
            options,
            jit_allowed,
            disabled_by,
            downloads_allowed,
            no_download,
            ptx_forbidden_by,
            artifact_cache,
            store: OnceLock::new(),
            gpu: OnceLock::new(),
            context: OnceLock::new(),
            compiler: OnceLock::new(),
            dictionary: OnceLock::new(),
            kernels,
        })
    }

    /// The bundle.
    pub fn bundle(&self) -> &Bundle {
        &self.bundle
    }

    /// The bundle's index.
    pub fn index(&self) -> &Index {
        self.bundle.index()
    }

    /// The options, with the CUDA build from the environment filled in when it was set there.
    pub fn options(&self) -> &RegistryOptions {
        &self.options
    }

    /// Whether a kernel without a fitting cubin is compiled from its sources.
    pub fn jit_allowed(&self) -> bool {
        self.jit_allowed
    }

    /// Whether a variant only the bundle's store has may be downloaded.
    pub fn downloads_allowed(&self) -> bool {
        self.downloads_allowed
    }

    /// Where `variant`'s cubin is: the wheel, the artifact cache, or only the store.
    pub fn locate(&self, variant: &Variant) -> ArtifactLocation {
        locate(&self.bundle, variant, &self.artifact_cache)
    }

    /// What selection sees: the device's compute capability, the driver, the CUDA build and
    /// torch. Loads the driver the first time; creates no context.
    pub fn device_query(&self) -> Result<DeviceQuery, LoadError> {
        self.gpu().map(|gpu| gpu.query())
    }

    /// The device's primary context, retained for this registry (created if no one has).
    pub fn context(&self) -> Result<Arc<Context>, LoadError> {
        self.context
            .get_or_init(|| Context::primary(self.options.device))
            .clone()
            .map_err(LoadError::NoGpu)
    }

    /// Every kernel of the bundle and whether it can load here: the variant that fits and
    /// why, the JIT fallback that would compile it, or the reason it cannot. Never compiles,
    /// never creates a context, never panics: without a driver every kernel names it.
    pub fn status(&self) -> BTreeMap<String, Status> {
        self.kernels
            .keys()
            .map(|name| (name.clone(), self.status_of(name)))
            .collect()
    }

    /// Why `name` cannot load here, or `None` when it can.
    pub fn unavailable_reason(&self, name: &str) -> Option<String> {
        match self.status_of(name) {
            Status::Available { .. } => None,
            Status::Unavailable { reason } => Some(reason),
        }
    }

    /// Whether `name` can load here.
    pub fn is_available(&self, name: &str) -> bool {
        self.unavailable_reason(name).is_none()
    }

    /// The kernel `name`, loaded into the device's primary context: the prebuilt cubin that
    /// fits, else (when allowed) the JIT fallback's. Loaded once; later calls return it again.
    pub fn load(&self, name: &str) -> Result<Kernel, LoadError> {
        let (slot, record) = self.slot(name)?;
        let mut slot = slot.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(kernel) = &*slot {
            return Ok(kernel.clone());
        }
        let kernel = self.load_uncached(name, record)?;
        *slot = Some(kernel.clone());
        Ok(kernel)
    }

    fn slot(&self, name: &str) -> Result<(&Mutex<Option<Kernel>>, &KernelRecord), LoadError> {
        match (self.kernels.get(name), self.index().kernels.get(name)) {
            (Some(slot), Some(record)) => Ok((slot, record)),
            _ => Err(LoadError::UnknownKernel {
                kernel: name.to_owned(),
                bundle: self.bundle.root().to_path_buf(),
                known: self.kernels.keys().cloned().collect(),
            }),
        }
    }

    fn gpu(&self) -> Result<Gpu, LoadError> {
        self.gpu
            .get_or_init(|| {
                let driver = Driver::get()?;
                let device = driver.device(self.options.device)?;
                let driver_version = DriverVersion::from_api(driver.version());
                let cuda = self
                    .options
                    .cuda
                    .unwrap_or_else(|| default_build(self.index(), driver_version));
                Ok(Gpu {
                    capability: device.capability(),
                    driver: driver_version,
                    cuda,
                    torch: self.options.torch.clone(),
                })
            })
            .clone()
            .map_err(LoadError::NoGpu)
    }

    fn compiler(&self, gpu: &Gpu) -> Result<JitCompiler, Arc<JitError>> {
        self.compiler
            .get_or_init(|| {
                self.options
                    .compilers
                    .find(gpu.cuda, Some(gpu.driver))
                    .map_err(Arc::new)
            })
            .clone()
    }

    fn status_of(&self, name: &str) -> Status {
        let (slot, record) = match self.slot(name) {
            Ok(found) => found,
            Err(error) => {
                return Status::Unavailable {
                    reason: error.to_string(),
                }
            }
        };
        if let Some(kernel) = &*slot.lock().unwrap_or_else(PoisonError::into_inner) {
            return Status::Available {
                variant: kernel.inner.variant.clone(),
                reason: kernel.inner.reason.clone(),
                provenance: kernel.provenance().kind(),
                location: kernel.inner.location,
            };
        }
        let gpu = match self.gpu() {
            Ok(gpu) => gpu,
            Err(error) => {
                return Status::Unavailable {
                    reason: error.to_string(),
                }
            }
        };
        let no_fit = match self.choose(name, record, &gpu) {
            Ok((choice, location)) => {
                let mut reason = choice.reason;
                if location == ArtifactLocation::Store {
                    reason.push_str("; only in the store: fetched and verified on first load");
                }
                return Status::Available {
                    variant: choice.variant.label(),
                    reason,
                    provenance: ProvenanceKind::Prebuilt,
                    location: Some(location),
                };
            }
            Err(no_fit) => no_fit,
        };
        if !self.jit_allowed {
            return Status::Unavailable {
                reason: self.no_fit_error(name, &gpu, no_fit).to_string(),
            };
        }
        let planned = self.jit_plan(name, record, &gpu);
        match planned {
            Ok((compiler, request_key, arch)) => {
                let cached = jit::is_cached(&self.options.jit_cache, &request_key);
                Status::Available {
                    variant: format!("{}/{arch}", gpu.cuda),
                    reason: format!(
                        "no prebuilt cubin fits ({}); {} from the shipped sources with {compiler}",
                        shipped(&no_fit),
                        if cached {
                            "compiled before, cached"
                        } else {
                            "compiles on first load"
                        }
                    ),
                    provenance: if cached {
                        ProvenanceKind::JitCache
                    } else {
                        ProvenanceKind::JitCompiled
                    },
                    location: None,
                }
            }
            Err(source) => Status::Unavailable {
                reason: error_chain(&LoadError::Jit {
                    kernel: name.to_owned(),
                    device: gpu.describe(),
                    refusals: Box::new(no_fit),
                    source,
                }),
            },
        }
    }

    /// The compiler, key and architecture the JIT fallback would use for `name`.
    fn jit_plan(
        &self,
        name: &str,
        record: &KernelRecord,
        gpu: &Gpu,
    ) -> Result<(JitCompiler, crate::KernelKey, crate::Arch), Arc<JitError>> {
        if record.recipe.is_none() {
            return Err(Arc::new(JitError::NoSources {
                kernel: name.to_owned(),
            }));
        }
        let compiler = self.compiler(gpu)?;
        let arch = device_arch(gpu.capability);
        let key = self.jit_request(name, record, gpu).key(&compiler.record());
        Ok((compiler, key, arch))
    }

    fn jit_request<'r>(
        &'r self,
        name: &'r str,
        record: &'r KernelRecord,
        gpu: &Gpu,
    ) -> JitRequest<'r> {
        JitRequest {
            bundle_root: self.bundle.root(),
            kernel: name,
            record,
            torch: &self.index().torch,
            arch: device_arch(gpu.capability),
            cuda: gpu.cuda,
        }
    }

    fn no_fit_error(&self, name: &str, gpu: &Gpu, refusals: NoFit) -> LoadError {
        LoadError::NoFit {
            kernel: name.to_owned(),
            disabled_by: self.disabled_by.clone(),
            device: gpu.describe(),
            refusals: Box::new(refusals),
        }
    }

    /// The variant `name` loads here and where its cubin is. With downloads forbidden, a
    /// variant that only the store has does not count: another may fit, else the refusals
    /// say why it was not fetched.
    fn choose<'r>(
        &self,
        name: &str,
        record: &'r KernelRecord,
        gpu: &Gpu,
    ) -> Result<(Choice<'r>, ArtifactLocation), NoFit> {
        let query = gpu.query();
        let choice = select_variant_with(name, record, &query, self.ptx_forbidden_by.as_deref())?;
        let location = self.locate(choice.variant);
        if location != ArtifactLocation::Store || self.downloads_allowed {
            return Ok((choice, location));
        }
        let (remote, here): (Vec<&Variant>, Vec<&Variant>) = record
            .variants
            .iter()
            .partition(|variant| self.locate(variant) == ArtifactLocation::Store);
        let local = KernelRecord {
            variants: here.into_iter().cloned().collect(),
            ..record.clone()
        };
        match select_variant_with(name, &local, &query, self.ptx_forbidden_by.as_deref()) {
            Ok(choice) => {
                let variant = record
                    .variants
                    .iter()
                    .find(|v| v.cuda == choice.variant.cuda && v.arch == choice.variant.arch)
                    .expect("the local variants are the record's");
                let location = self.locate(variant);
                Ok((
                    Choice {
                        variant,
                        reason: choice.reason,
                    },
                    location,
                ))
            }
            Err(mut no_fit) => {
                let store = self.index().store.clone().unwrap_or_default();
                for variant in remote {
                    let alone = KernelRecord {
                        variants: vec![variant.clone()],
                        skipped: Vec::new(),
                        ..record.clone()
                    };
                    match select_variant_with(
                        name,
                        &alone,
                        &query,
                        self.ptx_forbidden_by.as_deref(),
                    ) {
                        Ok(_) => no_fit.refusals.push(Refusal {
                            variant: variant.label(),
                            reason: RefusalReason::NotDownloaded {
                                store: store.clone(),
                                variable: self.no_download.clone(),
                            },
                        }),
                        Err(refused) => no_fit.refusals.extend(refused.refusals),
                    }
                }
                Err(no_fit)
            }
        }
    }

    fn load_uncached(&self, name: &str, record: &KernelRecord) -> Result<Kernel, LoadError> {
        let gpu = self.gpu()?;
        match self.choose(name, record, &gpu) {
            Ok((choice, location)) => {
                self.load_prebuilt(name, record, choice.variant, choice.reason, location, &gpu)
            }
            Err(no_fit) if !self.jit_allowed => Err(self.no_fit_error(name, &gpu, no_fit)),
            Err(no_fit) => self.load_jit(name, record, no_fit, &gpu),
        }
    }

    fn load_prebuilt(
        &self,
        name: &str,
        record: &KernelRecord,
        variant: &Variant,
        reason: String,
        location: ArtifactLocation,
        gpu: &Gpu,
    ) -> Result<Kernel, LoadError> {
        let label = variant.label();
        let (cubin, location) = match location {
            ArtifactLocation::Cache | ArtifactLocation::Store => {
                // The cache and the store hand out nothing whose sha256 differs either.
                // A cache entry found damaged is fetched again only where downloads are allowed.
                let store = || {
                    if self.downloads_allowed {
                        self.store_handle()
                    } else {
                        Err(FetchError::Forbidden {
                            what: fetch::describe(name, variant),
                            variable: self.no_download.clone(),
                        })
                    }
                };
                obtain_remote(&self.bundle, name, variant, &self.artifact_cache, &store)
                    .map(|(cubin, _)| (cubin, ArtifactLocation::Cache))
                    .map_err(|source| LoadError::Fetch {
                        kernel: name.to_owned(),
                        variant: label.clone(),
                        no_download: self.no_download.clone(),
                        source: Box::new(source),
                    })?
            }
            ArtifactLocation::Bundle | ArtifactLocation::Missing => {
                let dictionary = self.dictionary(name, &label)?;
                // `read_stored` hands out nothing whose sha256 differs from the index's.
                let cubin = read_stored(
                    self.bundle.root(),
                    &variant.artifact,
                    dictionary,
                    name,
                    &label,
                )?;
                (cubin, location)
            }
        };
        let provenance = Provenance::Prebuilt {
            variant: label.clone(),
            key: variant.key.clone(),
        };
        self.finish_load(
            name,
            record,
            gpu,
            &cubin,
            &variant.functions,
            label,
            reason,
            provenance,
        )
        .map(|kernel| kernel.with_location(location))
    }

    /// The store client, made on first need.
    fn store_handle(&self) -> Result<StoreHandle, FetchError> {
        if let Some(handle) = self.store.get() {
            return Ok(handle.clone());
        }
        let url = self.index().store.as_deref().unwrap_or_default();
        let handle = StoreHandle::connect(url, &self.options.store)?;
        Ok(self.store.get_or_init(|| handle).clone())
    }

    /// The bundle's zstd dictionary, read and verified once per registry.
    fn dictionary(&self, kernel: &str, label: &str) -> Result<Option<&[u8]>, LoadError> {
        let Some(stored) = &self.index().dictionary else {
            return Ok(None);
        };
        if let Some(bytes) = self.dictionary.get() {
            return Ok(bytes.as_deref());
        }
        let path = self.bundle.root().join(&stored.path);
        let bytes = std::fs::read(&path).map_err(|source| BundleError::Read {
            path: path.clone(),
            source,
        })?;
        let actual = sha256_hex(&bytes);
        if actual != stored.digest || bytes.len() as u64 != stored.size {
            return Err(BundleError::DigestMismatch {
                kernel: kernel.to_owned(),
                variant: format!("{label} dictionary"),
                path,
                expected: stored.digest.clone(),
                actual,
            }
            .into());
        }
        Ok(self.dictionary.get_or_init(|| Some(bytes)).as_deref())
    }

    fn load_jit(
        &self,
        name: &str,
        record: &KernelRecord,
        no_fit: NoFit,
        gpu: &Gpu,
    ) -> Result<Kernel, LoadError> {
        let (compiler, _, arch) = match self.jit_plan(name, record, gpu) {
            Ok(plan) => plan,
            Err(source) => return Err(self.jit_error(name, gpu, no_fit, source)),
        };
        let request = self.jit_request(name, record, gpu);
        let output = match compile_cached(&request, &compiler, &self.options.jit_cache) {
            Ok(output) => output,
            Err(error) => return Err(self.jit_error(name, gpu, no_fit, Arc::new(error))),
        };
        let key = output.key.0.clone();
        let (provenance, verb) = if output.compiled {
            (Provenance::JitCompiled { key }, "compiled")
        } else {
            (Provenance::JitCache { key }, "cached")
        };
        let reason = format!(
            "no prebuilt cubin fits ({}); {verb} from the shipped sources with {compiler}",
            shipped(&no_fit)
        );
        let label = format!("{}/{arch}", gpu.cuda);
        self.finish_load(
            name,
            record,
            gpu,
            &output.cubin,
            &output.functions,
            label,
            reason,
            provenance,
        )
    }

    fn jit_error(
        &self,
        name: &str,
        gpu: &Gpu,
        refusals: NoFit,
        source: Arc<JitError>,
    ) -> LoadError {
        LoadError::Jit {
            kernel: name.to_owned(),
            device: gpu.describe(),
            refusals: Box::new(refusals),
            source,
        }
    }

    /// Loads a verified cubin and resolves every entry.
    #[allow(clippy::too_many_arguments)]
    fn finish_load(
        &self,
        name: &str,
        record: &KernelRecord,
        gpu: &Gpu,
        cubin: &[u8],
        entries: &[EntryRecord],
        variant: String,
        reason: String,
        provenance: Provenance,
    ) -> Result<Kernel, LoadError> {
        let context = self.context()?;
        let device = gpu.describe();
        let driver_error =
            |action, error| LoadError::driver(error, action, name, &variant, &device);
        let module = Module::load(&context, cubin).map_err(|error| driver_error("load", error))?;
        let mut functions = Vec::with_capacity(entries.len());
        for entry in entries {
            let handle = module
                .function(&entry.symbol)
                .map_err(|error| driver_error("look up an entry of", error))?;
            functions.push(Function {
                kernel: name.to_owned(),
                variant: variant.clone(),
                device: gpu.describe(),
                entry: entry.clone(),
                handle,
            });
        }
        Ok(Kernel {
            inner: Arc::new(KernelInner {
                name: name.to_owned(),
                variant,
                reason,
                provenance,
                location: None,
                constants: record.constants.clone(),
                functions,
                context,
            }),
        })
    }
}

/// `KWHEEL_CUDA_BUILD`, when set.
fn build_from_env() -> Result<Option<CudaBuild>, LoadError> {
    let Some(value) = std::env::var_os(CUDA_BUILD_ENV) else {
        return Ok(None);
    };
    let value = value.to_string_lossy().into_owned();
    if value.trim().is_empty() {
        return Ok(None);
    }
    value
        .trim()
        .parse()
        .map(Some)
        .map_err(|error: crate::ParseTargetError| LoadError::Setting {
            variable: CUDA_BUILD_ENV,
            value,
            reason: error.to_string(),
        })
}

/// The newest CUDA build of the bundle that the driver supports; else the oldest (so that
/// selection says which driver each variant needs); else the driver's own version.
fn default_build(index: &Index, driver: DriverVersion) -> CudaBuild {
    let builds: BTreeSet<CudaBuild> = index
        .kernels
        .values()
        .flat_map(|record| {
            let variants = record.variants.iter().map(|variant| variant.cuda);
            variants.chain(record.skipped.iter().map(|skip| skip.cuda))
        })
        .collect();
    builds
        .iter()
        .rev()
        .find(|build| driver.supports(**build))
        .or_else(|| builds.iter().next())
        .copied()
        .unwrap_or(CudaBuild {
            major: driver.major,
            minor: driver.minor,
        })
}

/// A loaded kernel: its module, entries and constants. Cheap to clone.
#[derive(Clone)]
pub struct Kernel {
    inner: Arc<KernelInner>,
}

#[derive(Clone)]
struct KernelInner {
    name: String,
    variant: String,
    reason: String,
    provenance: Provenance,
    location: Option<ArtifactLocation>,
    constants: BTreeMap<String, Constant>,
    functions: Vec<Function>,
    context: Arc<Context>,
}

impl fmt::Debug for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kernel")
            .field("name", &self.inner.name)
            .field("provenance", &self.inner.provenance)
            .finish_non_exhaustive()
    }
}

impl Kernel {
    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Where its cubin came from, with the key.
    pub fn provenance(&self) -> &Provenance {
        &self.inner.provenance
    }

    /// Why this cubin was chosen (or compiled).
    pub fn reason(&self) -> &str {
        &self.inner.reason
    }

    /// Where a prebuilt cubin was read from: the wheel, or the artifact cache (after a
    /// download, or from an earlier one). `None` for the JIT.
    pub fn location(&self) -> Option<ArtifactLocation> {
        self.inner.location
    }

    fn with_location(self, location: ArtifactLocation) -> Kernel {
        let mut inner = Arc::try_unwrap(self.inner).unwrap_or_else(|shared| (*shared).clone());
        inner.location = Some(location);
        Kernel {
            inner: Arc::new(inner),
        }
    }

    /// The manifest's exported constants (`BLOCK_SIZE`), so callers never hard-code them.
    pub fn constants(&self) -> &BTreeMap<String, Constant> {
        &self.inner.constants
    }

    /// Every entry, in declaration order.
    pub fn functions(&self) -> &[Function] {
        &self.inner.functions
    }

    /// The entry declared as `entry` (`scale_rows<float>`), or with that symbol.
    pub fn function(&self, entry: &str) -> Result<Function, LoadError> {
        self.find_function(entry).cloned()
    }

    fn find_function(&self, entry: &str) -> Result<&Function, LoadError> {
        self.inner
            .functions
            .iter()
            .find(|function| function.entry.name == entry || function.entry.symbol == entry)
            .ok_or_else(|| LoadError::UnknownEntry {
                kernel: self.inner.name.clone(),
                entry: entry.to_owned(),
                entries: self
                    .inner
                    .functions
                    .iter()
                    .map(|function| function.entry.name.clone())
                    .collect(),
            })
    }

    /// The primary context the kernel is loaded in, to allocate [`DeviceBuffer`]s in.
    pub fn context(&self) -> &Arc<Context> {
        &self.inner.context
    }

    /// Launches `entry` on the legacy default stream (0). The arguments are checked against
    /// the parameter sizes the index records before anything is launched.
    ///
    /// # Safety
    ///
    /// As [`Function::launch`]: every pointer argument must be a device address the kernel
    /// may access over the whole range it accesses, alive until the kernel finishes.
    pub unsafe fn launch(
        &self,
        entry: &str,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem_bytes: u32,
        args: &[KernelArg],
    ) -> Result<(), LoadError> {
        let config = LaunchConfig {
            grid,
            block,
            shared_mem_bytes,
            stream: 0,
        };
        // SAFETY: the caller upholds `Function::launch`'s contract for these arguments.
        unsafe { self.launch_with(entry, &config, args) }
    }

    /// Launches `entry` with `config`, on `config.stream` (PyTorch's current stream, say).
    ///
    /// # Safety
    ///
    /// As [`Function::launch`].
    pub unsafe fn launch_with(
        &self,
        entry: &str,
        config: &LaunchConfig,
        args: &[KernelArg],
    ) -> Result<(), LoadError> {
        // SAFETY: the caller upholds `Function::launch`'s contract for these arguments.
        unsafe { self.find_function(entry)?.launch(config, args) }
    }
}

/// One kernel argument, by value: its bytes are what the kernel's parameter receives.
#[derive(Clone, Debug, PartialEq)]
pub enum KernelArg {
    /// A device pointer (8 bytes), from [`DeviceBuffer::pointer`] or `tensor.data_ptr()`.
    Ptr(u64),
    /// An `int`.
    I32(i32),
    /// An `unsigned int`.
    U32(u32),
    /// A `long long` / `int64_t`.
    I64(i64),
    /// An `unsigned long long` / `uint64_t`.
    U64(u64),
    /// A `float`.
    F32(f32),
    /// A `double`.
    F64(f64),
    /// Any other parameter (a struct, a `char`), as its exact bytes.
    Bytes(Vec<u8>),
}

impl KernelArg {
    /// The argument's size in bytes.
    pub fn size(&self) -> usize {
        match self {
            KernelArg::I32(_) | KernelArg::U32(_) | KernelArg::F32(_) => 4,
            KernelArg::Ptr(_) | KernelArg::I64(_) | KernelArg::U64(_) | KernelArg::F64(_) => 8,
            KernelArg::Bytes(bytes) => bytes.len(),
        }
    }

    /// The argument's bytes, as the parameter receives them (native byte order).
    pub fn to_bytes(&self) -> Vec<u8> {
        match self {
            KernelArg::Ptr(value) | KernelArg::U64(value) => value.to_ne_bytes().to_vec(),
            KernelArg::I32(value) => value.to_ne_bytes().to_vec(),
            KernelArg::U32(value) => value.to_ne_bytes().to_vec(),
            KernelArg::I64(value) => value.to_ne_bytes().to_vec(),
            KernelArg::F32(value) => value.to_ne_bytes().to_vec(),
            KernelArg::F64(value) => value.to_ne_bytes().to_vec(),
            KernelArg::Bytes(bytes) => bytes.clone(),
        }
    }
}

impl From<&DeviceBuffer> for KernelArg {
    fn from(buffer: &DeviceBuffer) -> Self {
        KernelArg::Ptr(buffer.pointer())
    }
}

/// One entry of a loaded kernel, ready to launch.
#[derive(Clone)]
pub struct Function {
    kernel: String,
    variant: String,
    device: String,
    entry: EntryRecord,
    handle: driver::Function,
}

impl fmt::Debug for Function {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Function")
            .field("kernel", &self.kernel)
            .field("entry", &self.entry)
            .finish_non_exhaustive()
    }
}

impl Function {
    /// The entry as declared (`scale_rows<float>`).
    pub fn name(&self) -> &str {
        &self.entry.name
    }

    /// The symbol in the cubin (mangled for a template).
    pub fn symbol(&self) -> &str {
        &self.entry.symbol
    }

    /// Each parameter's size in bytes, from the index.
    pub fn param_sizes(&self) -> &[u32] {
        &self.entry.param_sizes
    }

    /// Checks `args` against the parameter sizes: the count, then each size in order.
    pub fn check_arguments(&self, args: &[KernelArg]) -> Result<(), LoadError> {
        check_arguments(&self.kernel, &self.entry, args)
    }

    /// Launches the entry after checking the arguments against the recorded parameter sizes.
    ///
    /// # Safety
    ///
    /// The sizes are checked, their meaning cannot be: every pointer argument must be a device
    /// address the kernel may access over the whole range it accesses, alive until the kernel
    /// finishes, and `config.stream` 0 or a live stream of the kernel's context. A kernel
    /// given wrong pointers can write anywhere the device reaches, host memory included on
    /// systems with unified memory.
    pub unsafe fn launch(
        &self,
        config: &LaunchConfig,
        args: &[KernelArg],
    ) -> Result<(), LoadError> {
        self.check_arguments(args)?;
        let images: Vec<Vec<u8>> = args.iter().map(KernelArg::to_bytes).collect();
        let params: Vec<&[u8]> = images.iter().map(Vec::as_slice).collect();
        // SAFETY: the count and sizes match the cubin's parameters (checked above); the
        // caller vouches for the pointers and the stream.
        unsafe { self.handle.launch(config, &params) }.map_err(|error| {
            LoadError::driver(error, "launch", &self.kernel, &self.variant, &self.device)
        })
    }
}

fn check_arguments(kernel: &str, entry: &EntryRecord, args: &[KernelArg]) -> Result<(), LoadError> {
    if args.len() != entry.param_sizes.len() {
        return Err(LoadError::ArgumentCount {
            kernel: kernel.to_owned(),
            entry: entry.name.clone(),
            expected: entry.param_sizes.clone(),
            given: args.iter().map(KernelArg::size).collect(),
        });
    }
    for (index, (arg, &expected)) in args.iter().zip(&entry.param_sizes).enumerate() {
        if arg.size() != expected as usize {
            return Err(LoadError::Argument {
                kernel: kernel.to_owned(),
                entry: entry.name.clone(),
                index,
                expected,
                given: arg.size(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::select::{Refusal, RefusalReason};

    fn entry() -> EntryRecord {
        EntryRecord {
            name: "layernorm_bf16".into(),
            symbol: "layernorm_bf16".into(),
            param_sizes: vec![8, 8, 8, 8, 4, 4, 4],
        }
    }

    fn good_args() -> Vec<KernelArg> {
        vec![
            KernelArg::Ptr(1),
            KernelArg::Ptr(2),
            KernelArg::Ptr(3),
            KernelArg::Ptr(4),
            KernelArg::I32(37),
            KernelArg::I32(300),
            KernelArg::F32(1e-5),
        ]
    }

    #[test]
    fn loaded_things_cross_threads() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<Registry>();
        send_sync::<Kernel>();
        send_sync::<Function>();
        send_sync::<LoadError>();
    }

    #[test]
    fn matching_arguments_pass() {
        check_arguments("layernorm_bf16", &entry(), &good_args()).unwrap();
    }

    #[test]
    fn a_wrong_size_names_the_parameter() {
        let mut args = good_args();
        args[5] = KernelArg::I64(300);
        let error = check_arguments("layernorm_bf16", &entry(), &args).unwrap_err();
        assert!(matches!(
            error,
            LoadError::Argument {
                index: 5,
                expected: 4,
                given: 8,
                ..
            }
        ));
        assert_eq!(
            error.to_string(),
            "argument 5 of `layernorm_bf16` (kernel `layernorm_bf16`) is 8 bytes, but parameter \
             5 is 4 bytes"
        );
    }

    #[test]
    fn a_wrong_count_lists_the_parameters() {
        let mut args = good_args();
        args.pop();
        let error = check_arguments("layernorm_bf16", &entry(), &args).unwrap_err();
        assert_eq!(
            error.to_string(),
            "`layernorm_bf16` (kernel `layernorm_bf16`) takes 7 arguments of 8, 8, 8, 8, 4, 4, 4 \
             bytes, but 6 were given"
        );
    }

    #[test]
    fn argument_bytes_are_native() {
        assert_eq!(KernelArg::I32(-2).to_bytes(), (-2i32).to_ne_bytes());
        assert_eq!(KernelArg::F64(1.5).to_bytes(), 1.5f64.to_ne_bytes());
        assert_eq!(KernelArg::Bytes(vec![1, 2, 3]).size(), 3);
        assert_eq!(KernelArg::Ptr(7).size(), 8);
    }

    fn gpu() -> Gpu {
        Gpu {
            capability: (8, 6),
            driver: DriverVersion {
                major: 12,
                minor: 9,
            },
            cuda: "cu129".parse().unwrap(),
            torch: None,
        }
    }

    #[test]
    fn no_fit_names_device_build_driver_and_every_variant() {
        let refusals = NoFit {
            kernel: "layernorm_bf16".into(),
            refusals: vec![
                Refusal {
                    variant: "cu129/sm_90a".into(),
                    reason: RefusalReason::Arch {
                        arch: "sm_90a".parse().unwrap(),
                        device: (8, 6),
                    },
                },
                Refusal {
                    variant: "cu130/sm_90a".into(),
                    reason: RefusalReason::CudaBuild {
                        variant: "cu130".parse().unwrap(),
                        runtime: "cu129".parse().unwrap(),
                    },
                },
            ],
        };
        let error = LoadError::NoFit {
            kernel: "layernorm_bf16".into(),
            disabled_by: "AF3_KERNELS_JIT_FALLBACK=0".into(),
            device: gpu().describe(),
            refusals: Box::new(refusals),
        };
        assert_eq!(
            error.to_string(),
            "`layernorm_bf16` has no prebuilt cubin for this GPU and AF3_KERNELS_JIT_FALLBACK=0 \
             forbids compiling: device sm_86 (compute 8.6), CUDA build cu129, driver 12.9; \
             shipped: cu129/sm_90a: sm_90a cubins run only on compute capability 9.0, this \
             device is 8.6; cu130/sm_90a: built for CUDA 13.0 (cu130), the runtime is CUDA 12.9 \
             (cu129)"
        );
    }

    #[test]
    fn the_newest_build_the_driver_supports_is_the_default() {
        let variant = |cuda: &str| Variant {
            arch: "sm_90a".parse().unwrap(),
            cuda: cuda.parse().unwrap(),
            torch: "2.13.*".into(),
            compiler: crate::index::CompilerRecord {
                kind: "nvrtc".into(),
                version: "12.9.86".into(),
            },
            key: String::new(),
            artifact: crate::index::StoredFile {
                digest: String::new(),
                size: 0,
                path: String::new(),
                stored_size: 0,
            },
            functions: Vec::new(),
        };
        let index = Index {
            format: crate::index::INDEX_FORMAT,
            store: None,
            package: "p".into(),
            torch: "2.13.*".into(),
            dictionary: None,
            kernels: BTreeMap::from([(
                "k".to_owned(),
                KernelRecord {
                    inputs: Default::default(),
                    recipe: None,
                    constants: BTreeMap::new(),
                    variants: vec![variant("cu129"), variant("cu130")],
                    skipped: Vec::new(),
                },
            )]),
        };
        let driver = |text| DriverVersion::parse(text).unwrap();
        assert_eq!(default_build(&index, driver("13.0")).to_string(), "cu130");
        assert_eq!(default_build(&index, driver("12.9")).to_string(), "cu129");
        assert_eq!(default_build(&index, driver("12.4")).to_string(), "cu129");
        let empty = Index {
            kernels: BTreeMap::new(),
            ..index
        };
        assert_eq!(default_build(&empty, driver("12.4")).to_string(), "cu124");
    }
}
