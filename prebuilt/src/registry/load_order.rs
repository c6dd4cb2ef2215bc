//! The load order, tamper refusals and JIT policy, on a CPU: a bundle written to a temp dir,
//! a fake device that records what it is asked to load, and a fake store.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::*;
use crate::bundle::{artifact_path, BundleError, INDEX_FILE};
use crate::device::DriverVersion;
use crate::driver::{Context, LaunchConfig};
use crate::index::{CompilerRecord, KernelInputs, StoredFile, INDEX_FORMAT, STORE_INDEX_FORMAT};
use crate::key::sha256_hex;

/// A device of capability `capability` behind a 13.0 driver, or no driver at all; every image
/// it is asked to load is kept.
struct FakeDevice {
    facts: Result<DeviceFacts, DriverError>,
    loaded: Mutex<Vec<Vec<u8>>>,
}

impl FakeDevice {
    fn new(capability: (u32, u32)) -> Arc<FakeDevice> {
        Arc::new(FakeDevice {
            facts: Ok(DeviceFacts {
                capability,
                driver: DriverVersion {
                    major: 13,
                    minor: 0,
                },
            }),
            loaded: Mutex::new(Vec::new()),
        })
    }

    fn without_driver() -> Arc<FakeDevice> {
        Arc::new(FakeDevice {
            facts: Err(DriverError::Missing {
                library: "libcuda.so.1".to_owned(),
                detail: "libcuda.so.1: cannot open shared object file".to_owned(),
            }),
            loaded: Mutex::new(Vec::new()),
        })
    }

    fn loaded(&self) -> Vec<Vec<u8>> {
        self.loaded.lock().unwrap().clone()
    }
}

struct FakeModule;

impl LoadedModule for FakeModule {
    fn context(&self) -> Option<&Arc<Context>> {
        None
    }

    unsafe fn launch(&self, _: usize, _: &LaunchConfig, _: &[&[u8]]) -> Result<(), DriverError> {
        Ok(())
    }
}

impl Device for FakeDevice {
    fn facts(&self, _ordinal: u32) -> Result<DeviceFacts, DriverError> {
        self.facts.clone()
    }

    fn load(
        &self,
        _ordinal: u32,
        image: &[u8],
        _symbols: &[&str],
    ) -> Result<Arc<dyn LoadedModule>, ModuleFailure> {
        self.loaded.lock().unwrap().push(image.to_vec());
        Ok(Arc::new(FakeModule))
    }
}

/// A store holding `objects` by digest; `tampered` hands out other bytes than asked for.
#[derive(Default)]
struct FakeStore {
    objects: BTreeMap<String, Vec<u8>>,
    tampered: bool,
    requests: AtomicUsize,
}

impl ArtifactStore for FakeStore {
    fn get_cas(
        &self,
        digest: &str,
        _size: Option<u64>,
        _what: &str,
    ) -> Result<Option<Vec<u8>>, FetchError> {
        self.requests.fetch_add(1, Ordering::SeqCst);
        Ok(self.objects.get(digest).map(|bytes| {
            let mut bytes = bytes.clone();
            if self.tampered {
                bytes[0] ^= 0xff;
            }
            bytes
        }))
    }

    fn cas_url(&self, digest: &str) -> String {
        format!("https://store.invalid/cas/{digest}")
    }
}

/// The artifact of `label` (`cu130/sm_90a`): distinct bytes per variant.
pub(super) fn artifact(label: &str) -> Vec<u8> {
    format!("image of scale for {label}").into_bytes()
}

/// Writes a bundle with kernel `scale` built for `labels`; `shipped` says which artifacts the
/// bundle holds (the others only the store has, as in a slim wheel).
fn write_bundle(dir: &Path, labels: &[&str], shipped: &[&str]) {
    let mut variants = Vec::new();
    for label in labels {
        let (cuda, arch) = label.split_once('/').unwrap();
        let bytes = artifact(label);
        let digest = sha256_hex(&bytes);
        let path = artifact_path(&digest);
        let frame = zstd::encode_all(&bytes[..], 3).unwrap();
        if shipped.contains(label) {
            let file = dir.join(&path);
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(&file, &frame).unwrap();
        }
        variants.push(Variant {
            arch: arch.parse().unwrap(),
            cuda: cuda.parse().unwrap(),
            torch: "2.13.*".to_owned(),
            compiler: CompilerRecord {
                kind: "nvrtc".to_owned(),
                version: "13.0.88".to_owned(),
            },
            key: sha256_hex(label.as_bytes()),
            artifact: StoredFile {
                digest,
                size: bytes.len() as u64,
                path,
                stored_size: frame.len() as u64,
                dictionary: None,
            },
            functions: vec![EntryRecord {
                name: "scale".to_owned(),
                symbol: "scale".to_owned(),
                param_sizes: vec![8, 4],
            }],
        });
    }
    let slim = shipped.len() < labels.len();
    let index = Index {
        format: if slim {
            STORE_INDEX_FORMAT
        } else {
            INDEX_FORMAT
        },
        package: "fake-kernels".to_owned(),
        torch: "2.13.*".to_owned(),
        store: slim.then(|| "https://store.invalid".to_owned()),
        dictionary: None,
        kernels: BTreeMap::from([(
            "scale".to_owned(),
            KernelRecord {
                inputs: KernelInputs::default(),
                recipe: None,
                constants: BTreeMap::new(),
                variants,
                skipped: Vec::new(),
            },
        )]),
    };
    std::fs::write(dir.join(INDEX_FILE), serde_json::to_vec(&index).unwrap()).unwrap();
}

pub(super) struct Setup {
    pub(super) bundle: tempfile::TempDir,
    cache: tempfile::TempDir,
    jit_cache: tempfile::TempDir,
}

impl Setup {
    pub(super) fn new(labels: &[&str], shipped: &[&str]) -> Setup {
        let setup = Setup {
            bundle: tempfile::tempdir().unwrap(),
            cache: tempfile::tempdir().unwrap(),
            jit_cache: tempfile::tempdir().unwrap(),
        };
        write_bundle(setup.bundle.path(), labels, shipped);
        setup
    }

    /// Options that read nothing from the environment and find no compiler.
    pub(super) fn options(&self, jit: JitPolicy, downloads: DownloadPolicy) -> RegistryOptions {
        RegistryOptions {
            cuda: Some("cu130".parse().unwrap()),
            torch: None,
            jit,
            jit_cache: self.jit_cache.path().to_owned(),
            compilers: CompilerSearch {
                nvrtc: None,
                site_packages: Vec::new(),
                cuda_home: None,
                path: None,
                system_library_path: false,
            },
            device: 0,
            downloads,
            ptx_jit: PtxJitPolicy::Allowed,
            artifact_cache: self.cache.path().to_owned(),
            store: StoreOptions::default(),
            part_search: Vec::new(),
        }
    }

    fn registry(
        &self,
        device: Arc<FakeDevice>,
        store: Option<Arc<FakeStore>>,
        jit: JitPolicy,
        downloads: DownloadPolicy,
    ) -> Registry {
        let store = store.map(|store| store as Arc<dyn ArtifactStore>);
        Registry::open_on(
            self.bundle.path(),
            self.options(jit, downloads),
            device,
            store,
        )
        .unwrap()
    }

    fn cached(&self, label: &str) -> bool {
        ArtifactCache::new(self.cache.path())
            .entry_path(&sha256_hex(&artifact(label)))
            .unwrap()
            .is_file()
    }
}

fn store_with(labels: &[&str], tampered: bool) -> Arc<FakeStore> {
    Arc::new(FakeStore {
        objects: labels
            .iter()
            .map(|label| (sha256_hex(&artifact(label)), artifact(label)))
            .collect(),
        tampered,
        requests: AtomicUsize::new(0),
    })
}

fn variant_of(kernel: &Kernel) -> &str {
    match kernel.provenance() {
        Provenance::Prebuilt { variant, .. } => variant,
        other => panic!("not prebuilt: {other:?}"),
    }
}

/// What a load reaches, or what a status says it will: a prebuilt variant and where its bytes
/// came from, the JIT, or a refusal and its text.
#[derive(Debug, PartialEq)]
enum Outcome {
    Prebuilt { variant: String, from: &'static str },
    Jit { variant: String },
    Refused(String),
}

/// The outcome `status` names.
fn named(status: &Status) -> Outcome {
    match status {
        Status::Available {
            variant,
            provenance: ProvenanceKind::Prebuilt,
            location,
            ..
        } => Outcome::Prebuilt {
            variant: variant.clone(),
            from: match location.unwrap() {
                ArtifactLocation::Bundle | ArtifactLocation::Missing => "wheel",
                ArtifactLocation::Cache => "cache",
                ArtifactLocation::Store => "store",
            },
        },
        Status::Available { variant, .. } => Outcome::Jit {
            variant: variant.clone(),
        },
        Status::Unavailable { reason } => Outcome::Refused(reason.clone()),
    }
}

/// The outcome a load reached; `fetched`: whether it asked the store.
fn reached(load: &Result<Kernel, LoadError>, fetched: bool) -> Outcome {
    let remote = if fetched { "store" } else { "cache" };
    match load {
        Ok(kernel) => match kernel.provenance() {
            Provenance::Prebuilt { variant, .. } => Outcome::Prebuilt {
                variant: variant.clone(),
                from: match kernel.location() {
                    Some(ArtifactLocation::Bundle) => "wheel",
                    _ => remote,
                },
            },
            _ => Outcome::Jit {
                variant: kernel.inner.variant.clone(),
            },
        },
        // Failed while reading the bytes the plan named: the plan was that variant.
        Err(LoadError::Fetch { variant, .. }) => Outcome::Prebuilt {
            variant: variant.clone(),
            from: remote,
        },
        Err(LoadError::Bundle(error)) => match &**error {
            BundleError::DigestMismatch { variant, .. } | BundleError::Corrupt { variant, .. } => {
                Outcome::Prebuilt {
                    variant: variant.clone(),
                    from: "wheel",
                }
            }
            other => Outcome::Refused(crate::error_chain(other)),
        },
        Err(error) => Outcome::Refused(crate::error_chain(error)),
    }
}

/// `registry.load("scale")`, after checking that the status before it names the outcome the
/// load reaches (the same variant from the same place, the JIT, or the same refusal text), and
/// that the status after a load reports the kernel loaded.
fn status_then_load(registry: &Registry, store: Option<&FakeStore>) -> Result<Kernel, LoadError> {
    let requests = || store.map_or(0, |store| store.requests.load(Ordering::SeqCst));
    let before = registry.status().remove("scale").unwrap();
    assert_eq!(registry.plan("scale").status(), before);
    let asked = requests();
    let load = registry.load("scale");
    assert_eq!(
        named(&before),
        reached(&load, requests() > asked),
        "{before:?}"
    );
    if let Ok(kernel) = &load {
        assert_eq!(
            registry.status()["scale"],
            Status::Available {
                variant: kernel.inner.variant.clone(),
                reason: kernel.reason().to_owned(),
                provenance: kernel.provenance().kind(),
                location: kernel.location(),
            }
        );
        assert!(matches!(registry.plan("scale"), Plan::Loaded(_)));
    }
    load
}

const BOTH: [&str; 2] = ["cu130/sm_90a", "cu130/sm_100a"];

#[test]
fn the_wheel_comes_first_and_its_bytes_are_what_loads() {
    let setup = Setup::new(&BOTH, &BOTH);
    let device = FakeDevice::new((9, 0));
    let store = store_with(&BOTH, false);
    let registry = setup.registry(
        device.clone(),
        Some(store.clone()),
        JitPolicy::Disabled,
        DownloadPolicy::Allowed,
    );
    let kernel = status_then_load(&registry, Some(&*store)).unwrap();
    assert_eq!(variant_of(&kernel), "cu130/sm_90a");
    assert_eq!(kernel.location(), Some(ArtifactLocation::Bundle));
    assert_eq!(device.loaded(), [artifact("cu130/sm_90a")]);
    assert_eq!(store.requests.load(Ordering::SeqCst), 0);
    // Loaded once: a second load is the same kernel, not a second module.
    registry.load("scale").unwrap();
    assert_eq!(device.loaded().len(), 1);
}

#[test]
fn the_cache_comes_before_the_store() {
    let setup = Setup::new(&BOTH, &["cu130/sm_100a"]);
    ArtifactCache::new(setup.cache.path())
        .write(
            &sha256_hex(&artifact("cu130/sm_90a")),
            &artifact("cu130/sm_90a"),
        )
        .unwrap();
    let device = FakeDevice::new((9, 0));
    let store = store_with(&BOTH, false);
    let registry = setup.registry(
        device.clone(),
        Some(store.clone()),
        JitPolicy::Disabled,
        DownloadPolicy::Allowed,
    );
    let kernel = status_then_load(&registry, Some(&*store)).unwrap();
    assert_eq!(kernel.location(), Some(ArtifactLocation::Cache));
    assert_eq!(device.loaded(), [artifact("cu130/sm_90a")]);
    assert_eq!(store.requests.load(Ordering::SeqCst), 0);
}

#[test]
fn the_store_fills_the_cache_then_loads() {
    let setup = Setup::new(&BOTH, &["cu130/sm_100a"]);
    let device = FakeDevice::new((9, 0));
    let store = store_with(&BOTH, false);
    let registry = setup.registry(
        device.clone(),
        Some(store.clone()),
        JitPolicy::Disabled,
        DownloadPolicy::Allowed,
    );
    assert!(!setup.cached("cu130/sm_90a"));
    let kernel = status_then_load(&registry, Some(&*store)).unwrap();
    assert_eq!(variant_of(&kernel), "cu130/sm_90a");
    assert_eq!(device.loaded(), [artifact("cu130/sm_90a")]);
    assert_eq!(store.requests.load(Ordering::SeqCst), 1);
    assert!(setup.cached("cu130/sm_90a"));
}

#[test]
fn a_tampered_store_answer_is_refused_and_nothing_is_cached_or_loaded() {
    let setup = Setup::new(&BOTH, &["cu130/sm_100a"]);
    let device = FakeDevice::new((9, 0));
    let store = store_with(&BOTH, true);
    let registry = setup.registry(
        device.clone(),
        Some(store.clone()),
        JitPolicy::Disabled,
        DownloadPolicy::Allowed,
    );
    let error = status_then_load(&registry, Some(&*store)).unwrap_err();
    let message = crate::error_chain(&error);
    assert!(matches!(error, LoadError::Fetch { .. }), "{message}");
    assert!(message.contains("cu130/sm_90a"), "{message}");
    assert!(
        message.contains(&sha256_hex(&artifact("cu130/sm_90a"))),
        "{message}"
    );
    assert!(device.loaded().is_empty());
    assert!(!setup.cached("cu130/sm_90a"));
}

#[test]
fn a_tampered_wheel_artifact_is_refused_naming_kernel_variant_and_digests() {
    let setup = Setup::new(&BOTH, &BOTH);
    // Another valid frame in the place of the sm_90a cubin.
    let expected = sha256_hex(&artifact("cu130/sm_90a"));
    let path = setup.bundle.path().join(artifact_path(&expected));
    let mut other = artifact("cu130/sm_90a");
    other[0] ^= 0xff;
    std::fs::write(&path, zstd::encode_all(&other[..], 3).unwrap()).unwrap();
    let device = FakeDevice::new((9, 0));
    let registry = setup.registry(
        device.clone(),
        None,
        JitPolicy::Disabled,
        DownloadPolicy::Allowed,
    );
    let error = status_then_load(&registry, None).unwrap_err();
    let message = crate::error_chain(&error);
    assert!(message.contains("`scale` (cu130/sm_90a)"), "{message}");
    assert!(message.contains(&expected), "{message}");
    assert!(message.contains(&sha256_hex(&other)), "{message}");
    assert!(device.loaded().is_empty());
}

#[test]
fn with_downloads_forbidden_a_store_only_variant_does_not_count() {
    let setup = Setup::new(&BOTH, &["cu130/sm_100a"]);
    let device = FakeDevice::new((9, 0));
    let store = store_with(&BOTH, false);
    let registry = setup.registry(
        device.clone(),
        Some(store.clone()),
        JitPolicy::Disabled,
        DownloadPolicy::Forbidden,
    );
    let error = status_then_load(&registry, Some(&*store)).unwrap_err();
    let message = crate::error_chain(&error);
    assert!(matches!(error, LoadError::NoFit { .. }), "{message}");
    assert!(message.contains("FAKE_KERNELS_NO_DOWNLOAD"), "{message}");
    assert_eq!(store.requests.load(Ordering::SeqCst), 0);
    assert!(device.loaded().is_empty());
}

#[test]
fn no_fit_with_the_jit_forbidden_is_a_refusal_naming_the_setting() {
    let setup = Setup::new(&BOTH, &BOTH);
    let device = FakeDevice::new((8, 0));
    let registry = setup.registry(
        device.clone(),
        None,
        JitPolicy::Disabled,
        DownloadPolicy::Allowed,
    );
    let error = status_then_load(&registry, None).unwrap_err();
    let message = crate::error_chain(&error);
    assert!(matches!(error, LoadError::NoFit { .. }), "{message}");
    assert!(message.contains("FAKE_KERNELS_JIT_FALLBACK=0"), "{message}");
    assert!(message.contains("cu130/sm_90a") && message.contains("cu130/sm_100a"));
    assert!(device.loaded().is_empty());
    let status = registry.unavailable_reason("scale").unwrap();
    assert!(status.contains("FAKE_KERNELS_JIT_FALLBACK"), "{status}");
}

#[test]
fn no_fit_with_the_jit_allowed_tries_it_and_says_why_it_could_not() {
    let setup = Setup::new(&BOTH, &BOTH);
    let device = FakeDevice::new((8, 0));
    let registry = setup.registry(
        device.clone(),
        None,
        JitPolicy::Allowed,
        DownloadPolicy::Allowed,
    );
    let error = status_then_load(&registry, None).unwrap_err();
    let message = crate::error_chain(&error);
    assert!(matches!(error, LoadError::Jit { .. }), "{message}");
    // The bundle ships no sources for `scale`, and the refusals are kept.
    assert!(message.contains("cu130/sm_90a"), "{message}");
    assert!(device.loaded().is_empty());
}

#[test]
fn no_driver_is_an_answer_not_a_panic() {
    let setup = Setup::new(&BOTH, &BOTH);
    let registry = setup.registry(
        FakeDevice::without_driver(),
        None,
        JitPolicy::Disabled,
        DownloadPolicy::Allowed,
    );
    let error = status_then_load(&registry, None).unwrap_err();
    assert!(matches!(error, LoadError::NoGpu(_)), "{error}");
    let reason = registry.unavailable_reason("scale").unwrap();
    assert!(reason.contains("no CUDA driver"), "{reason}");
}

#[test]
fn a_store_only_variant_refused_for_downloads_is_a_refusal_in_index_order() {
    let setup = Setup::new(&BOTH, &["cu130/sm_100a"]);
    let registry = setup.registry(
        FakeDevice::new((9, 0)),
        None,
        JitPolicy::Disabled,
        DownloadPolicy::Forbidden,
    );
    let Plan::Refused(LoadError::NoFit { refusals, .. }) = registry.plan("scale") else {
        panic!("{:?}", registry.plan("scale"));
    };
    let refusals: Vec<String> = refusals.refusals.iter().map(ToString::to_string).collect();
    assert_eq!(
        refusals,
        [
            "cu130/sm_90a: fits, but is only in the store (https://store.invalid) and \
             FAKE_KERNELS_NO_DOWNLOAD=1 forbids downloading it",
            "cu130/sm_100a: sm_100a cubins run only on compute capability 10.0, this device is 9.0",
        ]
    );
    // Downloads allowed: the same variant, planned from the store.
    let registry = setup.registry(
        FakeDevice::new((9, 0)),
        None,
        JitPolicy::Disabled,
        DownloadPolicy::Allowed,
    );
    let Plan::Prebuilt(plan) = registry.plan("scale") else {
        panic!("{:?}", registry.plan("scale"));
    };
    assert_eq!(
        (plan.variant.label(), plan.location),
        ("cu130/sm_90a".to_owned(), ArtifactLocation::Store)
    );
}
