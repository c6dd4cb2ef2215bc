//! The load order, tamper refusals and JIT policy, on a CPU: a bundle written to a temp dir,
//! a fake device that records what it is asked to load, and a fake store.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::*;
use crate::bundle::{artifact_path, INDEX_FILE};
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
fn artifact(label: &str) -> Vec<u8> {
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

struct Setup {
    bundle: tempfile::TempDir,
    cache: tempfile::TempDir,
    jit_cache: tempfile::TempDir,
}

impl Setup {
    fn new(labels: &[&str], shipped: &[&str]) -> Setup {
        let setup = Setup {
            bundle: tempfile::tempdir().unwrap(),
            cache: tempfile::tempdir().unwrap(),
            jit_cache: tempfile::tempdir().unwrap(),
        };
        write_bundle(setup.bundle.path(), labels, shipped);
        setup
    }

    /// Options that read nothing from the environment and find no compiler.
    fn options(&self, jit: JitPolicy, downloads: DownloadPolicy) -> RegistryOptions {
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
    let kernel = registry.load("scale").unwrap();
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
    let kernel = registry.load("scale").unwrap();
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
    let kernel = registry.load("scale").unwrap();
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
        Some(store),
        JitPolicy::Disabled,
        DownloadPolicy::Allowed,
    );
    let error = registry.load("scale").unwrap_err();
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
    let error = registry.load("scale").unwrap_err();
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
    let error = registry.load("scale").unwrap_err();
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
    let error = registry.load("scale").unwrap_err();
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
    let error = registry.load("scale").unwrap_err();
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
    let error = registry.load("scale").unwrap_err();
    assert!(matches!(error, LoadError::NoGpu(_)), "{error}");
    let reason = registry.unavailable_reason("scale").unwrap();
    assert!(reason.contains("no CUDA driver"), "{reason}");
}
