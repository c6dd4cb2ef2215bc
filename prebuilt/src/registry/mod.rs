//! The runtime loader: a bundle's kernels by name, loaded for each GPU of this process that
//! asks for them.
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
//!                                   then cuLaunchKernel in the device's primary context;
//!                                   shared memory above the function's limit raises it, and
//!                                   launch attributes (cluster, cooperative, programmatic,
//!                                   priority) are checked against the device, then
//!                                   cuLaunchKernelEx (kernel.rs, docs/loader.md)
//! ```
//!
//! The CUDA build is the runtime's, which torch decides: [`RegistryOptions::cuda`], else
//! `KWHEEL_CUDA_BUILD`, else the newest build in the bundle that the driver supports. The
//! primary context (PyTorch's) is retained on the first [`Registry::load`], not before:
//! [`Registry::status`] answers from the device's compute capability and driver version alone.
//! Loaded kernels are kept: a second `load` of the same name returns the same module.
//! `docs/jit.md` describes the fallback and its cache.
//!
//! Every device is its own: [`Registry::load_on`] loads a kernel once per device ordinal that
//! asks (a tensor's device, not the process's current one), into that device's primary
//! context, after a selection made from that device's compute capability, so a host that
//! mixes GPUs gets each its own variant, and a refusal names the device. [`Registry::load`] is
//! `load_on` the registry's own device ([`RegistryOptions::device`]). A [`Kernel`] launches
//! only in the context it was loaded in. [`loaded_kernels`] lists what every registry of the
//! process has loaded, per device, with its provenance (`docs/provenance.md`).
//!
//! Both [`Registry::status`] and [`Registry::load`] start from one [`Plan`] per kernel
//! ([`Registry::plan`], in `plan.rs`), made from one resolved [`Policy`] (`policy.rs`): status
//! renders it, load executes it (`execute.rs`), so what status says is what load does.

mod error;
mod execute;
mod kernel;
#[cfg(test)]
mod load_order;
#[cfg(test)]
mod multi_device;
mod plan;
mod policy;
mod provenance;
mod seams;
mod status;

use error::shipped;
pub use error::{DriverFailure, LoadError};
use kernel::KernelInner;
pub use kernel::{
    trace_label, Function, Kernel, KernelArg, LaunchRefusal, LaunchRefused, SHORT_KEY_DIGITS,
};
pub use plan::{JitPlan, PackPlan, Plan, PrebuiltPlan};
pub use policy::{describe_device, describe_device_on, Policy};
pub use provenance::{loaded_kernels, LoadedKernel};
pub use seams::{CudaDevice, Device, DeviceFacts, LaunchFacts, LoadedModule, ModuleFailure};
pub use status::{Provenance, ProvenanceKind, Status};

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use serde::Serialize;

use crate::bundle::{
    locate, read_artifact_with, read_dictionary, read_prefix_from, verify_artifact, BundleError,
};
use crate::cache::ArtifactCache;
use crate::device::{default_build, device_arch, DeviceQuery};
use crate::driver::DriverError;
use crate::env::{
    fallback_variable, no_download_variable, DownloadPolicy, JitPolicy, PtxJitPolicy,
    CUDA_BUILD_ENV,
};
use crate::fetch::{self, obtain_remote, ArtifactStore, FetchError, StoreHandle, StoreOptions};
use crate::index::{
    ArtifactLocation, Constant, Function as EntryRecord, Index, KernelRecord, StructLayout,
    Variant, REFERENCE_INDEX_FORMAT,
};
use crate::jit::pack::{self, PackEntry};
use crate::jit::{self, compile_cached, CompilerSearch, JitCompiler, JitError, JitRequest};
use crate::lookup::{Catalog, Meta};
use crate::parts::{PartError, Parts};
use crate::select::{select_available, NoFit, RefusalReason};
use crate::{error_chain, Arch, CudaBuild, KernelKey};

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
    /// The device ordinal [`Registry::load`] and [`Registry::status`] use;
    /// [`Registry::load_on`] takes any other.
    pub device: u32,
    /// Whether a variant that only the bundle's store has may be downloaded.
    pub downloads: DownloadPolicy,
    /// Whether PTX variants may load, which has the driver compile them on first load.
    pub ptx_jit: PtxJitPolicy,
    /// Where downloaded cubins are cached (see [`crate::fetch`]). Never inside the bundle.
    pub artifact_cache: PathBuf,
    /// Timeouts, retries and the token for the store.
    pub store: StoreOptions,
    /// More directories to look for the bundle's companion part packages in, after the one
    /// holding its package (the Python runtime passes `sys.path`; see [`crate::parts`]).
    pub part_search: Vec<PathBuf>,
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
            part_search: Vec::new(),
        }
    }
}

/// A bundle's kernels, loaded on demand for each GPU that asks. Cheap to open; thread-safe.
pub struct Registry {
    catalog: Catalog,
    options: RegistryOptions,
    policy: Policy,
    artifact_cache: ArtifactCache,
    store: OnceLock<StoreHandle>,
    device: Arc<dyn Device>,
    /// What selection sees, per device ordinal, asked of the driver on first need.
    gpus: Mutex<BTreeMap<u32, Result<DeviceQuery, DriverError>>>,
    compiler: OnceLock<Result<JitCompiler, Arc<JitError>>>,
    dictionary: OnceLock<Option<Vec<u8>>>,
    /// Family dictionaries read so far, by the sha256 of their raw content.
    prefixes: Mutex<BTreeMap<String, Arc<[u8]>>>,
    /// The companion packages holding artifacts of a registry-sized wheel set.
    parts: Parts,
    /// Kernels asked for so far, with their records; a kernel's record is read on first use.
    kernels: Mutex<BTreeMap<String, Arc<Slot>>>,
}

/// One kernel's record and, per device ordinal, the kernel once loaded there. Each device
/// loads under its own lock: a load on one device never waits for another's.
struct Slot {
    record: KernelRecord,
    devices: Mutex<BTreeMap<u32, Arc<Mutex<Option<Kernel>>>>>,
}

impl Slot {
    /// The lock and, once loaded, the kernel of device `ordinal`.
    fn on(&self, ordinal: u32) -> Arc<Mutex<Option<Kernel>>> {
        let mut devices = self.devices.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(devices.entry(ordinal).or_default())
    }

    /// The kernel loaded on `ordinal`, if it is.
    fn loaded_on(&self, ordinal: u32) -> Option<Kernel> {
        self.on(ordinal)
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("bundle", &self.catalog.root())
            .field("options", &self.options)
            .field("policy", &self.policy)
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
        let parts = Parts::open(catalog.root(), &options.part_search)
            .map_err(|source| LoadError::Parts(Box::new(source)))?;
        if options.cuda.is_none() {
            options.cuda = policy::build_from_env()?;
        }
        let policy = Policy::resolve(&options, &catalog.meta().package);
        let artifact_cache = ArtifactCache::new(&options.artifact_cache);
        Ok(Registry {
            catalog,
            options,
            policy,
            artifact_cache,
            store: store
                .map(StoreHandle::new)
                .map(OnceLock::from)
                .unwrap_or_default(),
            device,
            gpus: Mutex::new(BTreeMap::new()),
            compiler: OnceLock::new(),
            dictionary: OnceLock::new(),
            prefixes: Mutex::new(BTreeMap::new()),
            parts,
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

    /// The load policy the options and the environment set, resolved at open.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Whether a kernel without a fitting cubin is compiled from its sources.
    pub fn jit_allowed(&self) -> bool {
        self.policy.jit_forbidden_by.is_none()
    }

    /// Whether a variant only the bundle's store has may be downloaded.
    pub fn downloads_allowed(&self) -> bool {
        self.policy.downloads_allowed
    }

    /// Where `variant`'s cubin is: the wheel, the artifact cache, or only the store.
    pub fn locate(&self, variant: &Variant) -> ArtifactLocation {
        if self.parts.part_of(&variant.artifact.path).is_some() {
            // In a companion package of the wheel set: installed with it, or named by the plan.
            return ArtifactLocation::Bundle;
        }
        locate(
            self.catalog.root(),
            self.meta().store.as_deref(),
            variant,
            &self.artifact_cache,
        )
    }

    /// What selection sees on the registry's device: its compute capability, the driver,
    /// the CUDA build and torch. Loads the driver the first time; creates no context.
    pub fn device_query(&self) -> Result<DeviceQuery, LoadError> {
        self.gpu(self.options.device)
    }

    /// [`Registry::device_query`] of device `ordinal`.
    pub fn device_query_on(&self, ordinal: u32) -> Result<DeviceQuery, LoadError> {
        self.gpu(ordinal)
    }

    /// Every kernel of the bundle and whether it can load on the registry's device: the
    /// variant that fits and why, the JIT fallback that would compile it, or the reason it
    /// cannot. Never compiles, never creates a context, never panics: without a driver every
    /// kernel names it.
    pub fn status(&self) -> BTreeMap<String, Status> {
        self.status_on(self.options.device)
    }

    /// [`Registry::status`] for device `ordinal`.
    pub fn status_on(&self, ordinal: u32) -> BTreeMap<String, Status> {
        match self.catalog.names() {
            Ok(names) => names
                .into_iter()
                .map(|name| {
                    let status = self.plan_on(&name, ordinal).status();
                    (name, status)
                })
                .collect(),
            // An unreadable table: no kernel can be named, so none is listed.
            Err(_) => BTreeMap::new(),
        }
    }

    /// Why `name` cannot load here, or `None` when it can.
    pub fn unavailable_reason(&self, name: &str) -> Option<String> {
        match self.plan(name).status() {
            Status::Available { .. } => None,
            Status::Unavailable { reason } => Some(reason),
        }
    }

    /// Whether `name` can load here.
    pub fn is_available(&self, name: &str) -> bool {
        self.unavailable_reason(name).is_none()
    }

    /// What [`Registry::load`] would do for `name` now, and what [`Registry::status`] says:
    /// the variant and where its bytes are, the JIT's compiler and key, or the refusal. Never
    /// compiles, fetches or creates a context.
    pub fn plan(&self, name: &str) -> Plan {
        self.plan_on(name, self.options.device)
    }

    /// [`Registry::plan`] for device `ordinal`: what [`Registry::load_on`] would do there.
    pub fn plan_on(&self, name: &str, ordinal: u32) -> Plan {
        let slot = match self.slot(name) {
            Ok(slot) => slot,
            Err(error) => return Plan::Refused(error),
        };
        match slot.loaded_on(ordinal) {
            Some(kernel) => Plan::Loaded(kernel),
            None => self.decide(name, &slot.record, ordinal),
        }
    }

    /// The kernel `name`, loaded into the primary context of the registry's device: the
    /// prebuilt cubin that fits, else (when allowed) the JIT fallback's. Loaded once; later
    /// calls return it again.
    pub fn load(&self, name: &str) -> Result<Kernel, LoadError> {
        self.load_on(name, self.options.device)
    }

    /// The kernel `name`, loaded into the primary context of device `ordinal`, selected for
    /// that device. Loaded once per device, under that device's lock; later calls return it
    /// again, and a load on another device neither waits for it nor shares its module.
    pub fn load_on(&self, name: &str, ordinal: u32) -> Result<Kernel, LoadError> {
        let slot = self.slot(name)?;
        let device = slot.on(ordinal);
        let mut loaded = device.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(kernel) = &*loaded {
            return Ok(kernel.clone());
        }
        let plan = self.decide(name, &slot.record, ordinal);
        let kernel = self.execute(name, &slot.record, plan, ordinal)?;
        provenance::record(&self.meta().package, self.catalog.root(), &kernel);
        *loaded = Some(kernel.clone());
        Ok(kernel)
    }

    /// Every kernel this registry has loaded, on every device, by name then device ordinal.
    pub fn loaded(&self) -> Vec<Kernel> {
        let slots: Vec<Arc<Slot>> = self
            .kernels
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect();
        let mut kernels = Vec::new();
        for slot in slots {
            let ordinals: Vec<u32> = slot
                .devices
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .keys()
                .copied()
                .collect();
            kernels.extend(
                ordinals
                    .into_iter()
                    .filter_map(|ordinal| slot.loaded_on(ordinal)),
            );
        }
        kernels
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
            devices: Mutex::new(BTreeMap::new()),
        });
        kernels.insert(name.to_owned(), Arc::clone(&slot));
        Ok(slot)
    }

    /// Device `ordinal` as selection sees it, asked of the driver once per registry and
    /// device.
    fn gpu(&self, ordinal: u32) -> Result<DeviceQuery, LoadError> {
        let mut gpus = self.gpus.lock().unwrap_or_else(PoisonError::into_inner);
        gpus.entry(ordinal)
            .or_insert_with(|| {
                let facts = self.device.facts(ordinal)?;
                let cuda = self
                    .options
                    .cuda
                    .unwrap_or_else(|| default_build(&self.meta().builds, Some(facts.driver)));
                Ok(DeviceQuery {
                    capability: facts.capability,
                    driver: facts.driver,
                    cuda,
                    torch: self.options.torch.clone(),
                })
            })
            .clone()
            .map_err(LoadError::NoGpu)
    }

    /// The JIT's compiler for the device's CUDA build, found once per registry: the build and
    /// the driver are the host's, the same for every device.
    fn compiler(&self, query: &DeviceQuery) -> Result<JitCompiler, Arc<JitError>> {
        self.compiler
            .get_or_init(|| {
                self.options
                    .compilers
                    .find(query.cuda, Some(query.driver))
                    .map_err(Arc::new)
            })
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::DriverVersion;
    use crate::select::Refusal;

    fn gpu() -> DeviceQuery {
        DeviceQuery {
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
            device: describe_device_on(1, &gpu()),
            refusals: Box::new(refusals),
        };
        assert_eq!(
            error.to_string(),
            "`layernorm_bf16` has no prebuilt cubin for this GPU and AF3_KERNELS_JIT_FALLBACK=0 \
             forbids compiling: device 1 (sm_86, compute 8.6), CUDA build cu129, driver 12.9; \
             shipped: cu129/sm_90a: sm_90a cubins run only on compute capability 9.0, this \
             device is 8.6; cu130/sm_90a: built for CUDA 13.0 (cu130), the runtime is CUDA 12.9 \
             (cu129)"
        );
    }

    #[test]
    fn the_newest_build_the_driver_supports_is_the_default() {
        let mut index = crate::testing::index();
        index.kernels = BTreeMap::from([(
            "k".to_owned(),
            crate::testing::record(&["cu129/sm_90a", "cu130/sm_90a"], &[]),
        )]);
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
