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

mod error;
mod kernel;
#[cfg(test)]
mod load_order;
mod seams;

use error::shipped;
pub use error::{DriverFailure, LoadError};
use kernel::KernelInner;
pub use kernel::{Function, Kernel, KernelArg};
pub use seams::{CudaDevice, Device, DeviceFacts, LoadedModule, ModuleFailure};

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use serde::Serialize;

use crate::bundle::locate;
use crate::bundle::{read_dictionary, read_prefix, read_stored, FrameDictionary};
use crate::cache::ArtifactCache;
use crate::device::device_arch;
use crate::device::{default_build, DeviceQuery, DriverVersion};
use crate::driver::DriverError;
use crate::env::{
    fallback_variable, no_download_variable, DownloadPolicy, JitPolicy, PtxJitPolicy,
    CUDA_BUILD_ENV,
};
use crate::fetch::{self, obtain_remote, ArtifactStore, FetchError, StoreHandle, StoreOptions};
use crate::index::{
    ArtifactLocation, Constant, Function as EntryRecord, Index, KernelRecord, Variant,
};
use crate::jit::{self, compile_cached, CompilerSearch, JitCompiler, JitError, JitRequest};
use crate::lookup::{Catalog, Meta};
use crate::select::{select_variant_with, Choice, NoFit, Refusal, RefusalReason};
use crate::{error_chain, CudaBuild};

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
            artifact_cache: crate::cache::default_artifact_cache_dir(),
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
    catalog: Catalog,
    options: RegistryOptions,
    jit_allowed: bool,
    disabled_by: String,
    downloads_allowed: bool,
    no_download: String,
    /// The setting that forbids loading PTX, when one does.
    ptx_forbidden_by: Option<String>,
    artifact_cache: ArtifactCache,
    store: OnceLock<StoreHandle>,
    device: Arc<dyn Device>,
    gpu: OnceLock<Result<Gpu, DriverError>>,
    compiler: OnceLock<Result<JitCompiler, Arc<JitError>>>,
    dictionary: OnceLock<Option<Vec<u8>>>,
    /// Family dictionaries read so far, by the sha256 of their raw content.
    prefixes: Mutex<BTreeMap<String, Arc<Vec<u8>>>>,
    /// Kernels asked for so far, with their records; a kernel's record is read on first use.
    kernels: Mutex<BTreeMap<String, Arc<Slot>>>,
}

/// One kernel's record and, once loaded, the kernel.
struct Slot {
    record: KernelRecord,
    kernel: Mutex<Option<Kernel>>,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("bundle", &self.catalog.root())
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
        options: RegistryOptions,
    ) -> Result<Registry, LoadError> {
        Registry::open_on(bundle_dir, options, Arc::new(CudaDevice::default()), None)
    }

    /// [`Registry::open_with`] on `device`, with `store` (when given) in place of an HTTP
    /// client for the bundle's store: the seams a test drives the whole load order through.
    pub fn open_on(
        bundle_dir: impl Into<PathBuf>,
        mut options: RegistryOptions,
        device: Arc<dyn Device>,
        store: Option<Arc<dyn ArtifactStore>>,
    ) -> Result<Registry, LoadError> {
        let catalog = Catalog::open(bundle_dir)?;
        if options.cuda.is_none() {
            options.cuda = build_from_env()?;
        }
        let package = catalog.meta().package.clone();
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
        Ok(Registry {
            catalog,
            options,
            jit_allowed,
            disabled_by,
            downloads_allowed,
            no_download,
            ptx_forbidden_by,
            artifact_cache,
            store: store
                .map(StoreHandle::new)
                .map(OnceLock::from)
                .unwrap_or_default(),
            device,
            gpu: OnceLock::new(),
            compiler: OnceLock::new(),
            dictionary: OnceLock::new(),
            prefixes: Mutex::new(BTreeMap::new()),
            kernels: Mutex::new(BTreeMap::new()),
        })
    }

    /// The bundle, as the loader reads it.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// Package, torch pin, store and dictionary of the bundle.
    pub fn meta(&self) -> &Meta {
        self.catalog.meta()
    }

    /// The bundle's whole index (`index.json`): for tools and tests, never on a load's path.
    pub fn index(&self) -> Result<Index, LoadError> {
        Ok(self.catalog.index()?)
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
        locate(
            self.catalog.root(),
            self.meta().store.as_deref(),
            variant,
            &self.artifact_cache,
        )
    }

    /// What selection sees: the device's compute capability, the driver, the CUDA build and
    /// torch. Loads the driver the first time; creates no context.
    pub fn device_query(&self) -> Result<DeviceQuery, LoadError> {
        self.gpu().map(|gpu| gpu.query())
    }

    /// Every kernel of the bundle and whether it can load here: the variant that fits and
    /// why, the JIT fallback that would compile it, or the reason it cannot. Never compiles,
    /// never creates a context, never panics: without a driver every kernel names it.
    pub fn status(&self) -> BTreeMap<String, Status> {
        match self.catalog.names() {
            Ok(names) => names
                .into_iter()
                .map(|name| {
                    let status = self.status_of(&name);
                    (name, status)
                })
                .collect(),
            // An unreadable table: no kernel can be named, so none is listed.
            Err(_) => BTreeMap::new(),
        }
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
        let slot = self.slot(name)?;
        let mut loaded = slot.kernel.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(kernel) = &*loaded {
            return Ok(kernel.clone());
        }
        let kernel = self.load_uncached(name, &slot.record)?;
        *loaded = Some(kernel.clone());
        Ok(kernel)
    }

    /// The slot of `name`, its record read from the bundle on first use.
    fn slot(&self, name: &str) -> Result<Arc<Slot>, LoadError> {
        let mut kernels = self.kernels.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(slot) = kernels.get(name) {
            return Ok(Arc::clone(slot));
        }
        let Some(record) = self.catalog.record(name)? else {
            return Err(LoadError::UnknownKernel {
                kernel: name.to_owned(),
                bundle: self.catalog.root().to_path_buf(),
                known: self.catalog.names()?,
            });
        };
        let slot = Arc::new(Slot {
            record,
            kernel: Mutex::new(None),
        });
        kernels.insert(name.to_owned(), Arc::clone(&slot));
        Ok(slot)
    }

    fn gpu(&self) -> Result<Gpu, LoadError> {
        self.gpu
            .get_or_init(|| {
                let facts = self.device.facts(self.options.device)?;
                let cuda = self
                    .options
                    .cuda
                    .unwrap_or_else(|| default_build(&self.meta().builds, Some(facts.driver)));
                Ok(Gpu {
                    capability: facts.capability,
                    driver: facts.driver,
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
        let slot = match self.slot(name) {
            Ok(found) => found,
            Err(error) => {
                return Status::Unavailable {
                    reason: error.to_string(),
                }
            }
        };
        let record = &slot.record;
        if let Some(kernel) = &*slot.kernel.lock().unwrap_or_else(PoisonError::into_inner) {
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
        // The JIT's key needs the kernel's key inputs, read only now.
        let record = match self.with_inputs(name, record) {
            Ok(record) => record,
            Err(error) => {
                return Status::Unavailable {
                    reason: error_chain(&error),
                }
            }
        };
        let planned = self.jit_plan(name, &record, &gpu);
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

    /// `record` with the key inputs the loader's record leaves out, for the JIT.
    fn with_inputs(&self, name: &str, record: &KernelRecord) -> Result<KernelRecord, LoadError> {
        let inputs = self.catalog.inputs(name)?.unwrap_or_default();
        Ok(KernelRecord {
            inputs,
            ..record.clone()
        })
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
            bundle_root: self.catalog.root(),
            kernel: name,
            record,
            torch: &self.meta().torch,
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
                let store = self.meta().store.clone().unwrap_or_default();
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
                obtain_remote(
                    self.catalog.root(),
                    self.meta().store.as_deref(),
                    name,
                    variant,
                    &self.artifact_cache,
                    &store,
                )
                .map(|(cubin, _)| (cubin, ArtifactLocation::Cache))
                .map_err(|source| LoadError::Fetch {
                    kernel: name.to_owned(),
                    variant: label.clone(),
                    no_download: self.no_download.clone(),
                    source: Box::new(source),
                })?
            }
            ArtifactLocation::Bundle | ArtifactLocation::Missing => {
                let prefix;
                let dictionary = match &variant.artifact.dictionary {
                    Some(digest) => {
                        prefix = self.prefix(digest, name, &label)?;
                        FrameDictionary::Prefix(&prefix)
                    }
                    None => match self.dictionary(name, &label)? {
                        Some(trained) => FrameDictionary::Trained(trained),
                        None => FrameDictionary::None,
                    },
                };
                // `read_stored` hands out nothing whose sha256 differs from the index's.
                let cubin = read_stored(
                    self.catalog.root(),
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
        let url = self.meta().store.as_deref().unwrap_or_default();
        let handle = StoreHandle::connect(url, &self.options.store)?;
        Ok(self.store.get_or_init(|| handle).clone())
    }

    /// The family dictionary with raw-content sha256 `digest`, read once per registry and kept
    /// for the family's other kernels. Not hashed: see [`read_prefix`].
    fn prefix(&self, digest: &str, kernel: &str, label: &str) -> Result<Arc<Vec<u8>>, LoadError> {
        if let Some(bytes) = self
            .prefixes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(digest)
        {
            return Ok(Arc::clone(bytes));
        }
        let bytes = Arc::new(read_prefix(
            self.catalog.root(),
            digest,
            false,
            kernel,
            label,
        )?);
        self.prefixes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(digest.to_owned(), Arc::clone(&bytes));
        Ok(bytes)
    }

    /// The bundle's zstd dictionary, read and verified once per registry.
    fn dictionary(&self, kernel: &str, label: &str) -> Result<Option<&[u8]>, LoadError> {
        let Some(stored) = &self.meta().dictionary else {
            return Ok(None);
        };
        if let Some(bytes) = self.dictionary.get() {
            return Ok(bytes.as_deref());
        }
        let bytes = read_dictionary(self.catalog.root(), stored, kernel, label)?;
        Ok(self.dictionary.get_or_init(|| Some(bytes)).as_deref())
    }

    fn load_jit(
        &self,
        name: &str,
        record: &KernelRecord,
        no_fit: NoFit,
        gpu: &Gpu,
    ) -> Result<Kernel, LoadError> {
        let record = &self.with_inputs(name, record)?;
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
        let device = gpu.describe();
        let symbols: Vec<&str> = entries.iter().map(|entry| entry.symbol.as_str()).collect();
        let module = self
            .device
            .load(self.options.device, cubin, &symbols)
            .map_err(|failure| match failure {
                ModuleFailure::Context(error) => LoadError::NoGpu(error),
                ModuleFailure::Load(error) => {
                    LoadError::driver(error, "load", name, &variant, &device)
                }
                ModuleFailure::Lookup(error) => {
                    LoadError::driver(error, "look up an entry of", name, &variant, &device)
                }
            })?;
        let functions = entries
            .iter()
            .enumerate()
            .map(|(index, entry)| Function {
                kernel: name.to_owned(),
                variant: variant.clone(),
                device: device.clone(),
                entry: entry.clone(),
                module: Arc::clone(&module),
                index,
            })
            .collect();
        Ok(Kernel {
            inner: Arc::new(KernelInner {
                name: name.to_owned(),
                variant,
                reason,
                provenance,
                location: None,
                constants: record.constants.clone(),
                functions,
                module,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::select::{Refusal, RefusalReason};

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
                dictionary: None,
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
        let builds = Meta::of(&index).builds;
        assert_eq!(
            default_build(&builds, Some(driver("13.0"))).to_string(),
            "cu130"
        );
        assert_eq!(
            default_build(&builds, Some(driver("12.9"))).to_string(),
            "cu129"
        );
        assert_eq!(
            default_build(&builds, Some(driver("12.4"))).to_string(),
            "cu129"
        );
        assert_eq!(
            default_build(&[], Some(driver("12.4"))).to_string(),
            "cu124"
        );
    }
}
