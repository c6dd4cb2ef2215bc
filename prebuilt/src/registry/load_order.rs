//! The load order, tamper refusals and JIT policy, on a CPU: a bundle written to a temp dir,
//! a fake device that records what it is asked to load, and a fake store.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::*;
use crate::bundle::{artifact_path, BundleError, INDEX_FILE};
use crate::index::{CompilerRecord, KernelInputs, INDEX_FORMAT, STORE_INDEX_FORMAT};
use crate::key::sha256_hex;
use crate::testing::{stored_file, write_artifact, FakeDevice};

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
        let bytes = artifact(label);
        let stored = if shipped.contains(label) {
            write_artifact(dir, &bytes)
        } else {
            stored_file(&bytes, &zstd::encode_all(&bytes[..], 3).unwrap())
        };
        variants.push(Variant {
            compiler: CompilerRecord {
                kind: "nvrtc".to_owned(),
                version: "13.0.88".to_owned(),
            },
            key: sha256_hex(label.as_bytes()),
            artifact: stored,
            functions: vec![EntryRecord {
                computed: Default::default(),
                name: "scale".to_owned(),
                symbol: "scale".to_owned(),
                param_sizes: vec![8, 4],
            }],
            ..crate::testing::variant(label)
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
        modules: Default::default(),
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

    /// The registry of `case` on this bundle, with its device and store.
    fn run(&self, case: Case) -> Run {
        let device = match case.capability {
            Some(capability) => FakeDevice::new(capability, "13.0"),
            None => FakeDevice::without_driver(),
        };
        let store = case.store.map(|answers| store_with(&BOTH, answers));
        let registry = Registry::open_on(
            self.bundle.path(),
            self.options(case.jit, case.downloads),
            device.clone(),
            store.clone().map(|store| store as Arc<dyn ArtifactStore>),
        )
        .unwrap();
        Run {
            device,
            store,
            registry,
        }
    }

    fn cached(&self, label: &str) -> bool {
        ArtifactCache::new(self.cache.path())
            .entry_path(&sha256_hex(&artifact(label)))
            .unwrap()
            .is_file()
    }
}

/// What a case's store answers.
#[derive(Clone, Copy)]
enum Answers {
    /// The bytes asked for.
    Honest,
    /// Other bytes than those asked for.
    Tampered,
}

fn store_with(labels: &[&str], answers: Answers) -> Arc<FakeStore> {
    Arc::new(FakeStore {
        objects: labels
            .iter()
            .map(|label| (sha256_hex(&artifact(label)), artifact(label)))
            .collect(),
        tampered: matches!(answers, Answers::Tampered),
        requests: AtomicUsize::new(0),
    })
}

/// The device, store and policies a case loads with.
#[derive(Clone, Copy)]
struct Case {
    /// The device's compute capability; `None`: a machine without a driver.
    capability: Option<(u32, u32)>,
    /// A store holding every variant, or none.
    store: Option<Answers>,
    jit: JitPolicy,
    downloads: DownloadPolicy,
}

impl Default for Case {
    /// Compute 9.0, no store, the JIT forbidden, downloads allowed.
    fn default() -> Case {
        Case {
            capability: Some((9, 0)),
            store: None,
            jit: JitPolicy::Disabled,
            downloads: DownloadPolicy::Allowed,
        }
    }
}

/// A case's registry, and the device and store it loads from.
struct Run {
    device: Arc<FakeDevice>,
    store: Option<Arc<FakeStore>>,
    registry: Registry,
}

impl Run {
    /// [`status_then_load`] of `scale`.
    fn load(&self) -> Result<Kernel, LoadError> {
        status_then_load(&self.registry, self.store.as_deref())
    }

    /// A load that is refused: the error and its chain, after checking that nothing reached
    /// the device.
    fn refused(&self) -> (LoadError, String) {
        let error = self.load().unwrap_err();
        let message = crate::error_chain(&error);
        assert!(self.device.loaded().is_empty(), "{message}");
        (error, message)
    }

    /// How many times the store was asked for an object.
    fn requests(&self) -> usize {
        self.store
            .as_ref()
            .map_or(0, |store| store.requests.load(Ordering::SeqCst))
    }
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

/// A case whose store holds every variant and answers `answers`.
fn with_store(answers: Answers) -> Case {
    Case {
        store: Some(answers),
        ..Case::default()
    }
}

#[test]
fn the_wheel_comes_first_and_its_bytes_are_what_loads() {
    let setup = Setup::new(&BOTH, &BOTH);
    let run = setup.run(with_store(Answers::Honest));
    let kernel = run.load().unwrap();
    assert_eq!(variant_of(&kernel), "cu130/sm_90a");
    assert_eq!(kernel.location(), Some(ArtifactLocation::Bundle));
    assert_eq!(run.device.loaded(), [artifact("cu130/sm_90a")]);
    assert_eq!(run.requests(), 0);
    // Loaded once: a second load is the same kernel, not a second module.
    run.registry.load("scale").unwrap();
    assert_eq!(run.device.loaded().len(), 1);
}

#[test]
fn the_cache_comes_before_the_store() {
    let setup = Setup::new(&BOTH, &["cu130/sm_100a"]);
    let bytes = artifact("cu130/sm_90a");
    ArtifactCache::new(setup.cache.path())
        .write(&sha256_hex(&bytes), &bytes)
        .unwrap();
    let run = setup.run(with_store(Answers::Honest));
    let kernel = run.load().unwrap();
    assert_eq!(kernel.location(), Some(ArtifactLocation::Cache));
    assert_eq!((run.device.loaded(), run.requests()), (vec![bytes], 0));
}

#[test]
fn the_store_fills_the_cache_then_loads() {
    let setup = Setup::new(&BOTH, &["cu130/sm_100a"]);
    let run = setup.run(with_store(Answers::Honest));
    assert!(!setup.cached("cu130/sm_90a"));
    let kernel = run.load().unwrap();
    assert_eq!(variant_of(&kernel), "cu130/sm_90a");
    assert_eq!(
        (run.device.loaded(), run.requests()),
        (vec![artifact("cu130/sm_90a")], 1)
    );
    assert!(setup.cached("cu130/sm_90a"));
}

#[test]
fn a_tampered_store_answer_is_refused_and_nothing_is_cached_or_loaded() {
    let setup = Setup::new(&BOTH, &["cu130/sm_100a"]);
    let (error, message) = setup.run(with_store(Answers::Tampered)).refused();
    assert!(matches!(error, LoadError::Fetch { .. }), "{message}");
    let digest = sha256_hex(&artifact("cu130/sm_90a"));
    assert!(
        message.contains("cu130/sm_90a") && message.contains(&digest),
        "{message}"
    );
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
    let (_, message) = setup.run(Case::default()).refused();
    for named in ["`scale` (cu130/sm_90a)", &expected, &sha256_hex(&other)] {
        assert!(message.contains(named), "{named}: {message}");
    }
}

#[test]
fn with_downloads_forbidden_a_store_only_variant_does_not_count() {
    let setup = Setup::new(&BOTH, &["cu130/sm_100a"]);
    let run = setup.run(Case {
        downloads: DownloadPolicy::Forbidden,
        ..with_store(Answers::Honest)
    });
    let (error, message) = run.refused();
    assert!(matches!(error, LoadError::NoFit { .. }), "{message}");
    assert!(message.contains("FAKE_KERNELS_NO_DOWNLOAD"), "{message}");
    assert_eq!(run.requests(), 0);
}

/// Compute 8.0, which no variant of [`BOTH`] fits, with the JIT `jit`.
fn no_fit(jit: JitPolicy) -> Case {
    Case {
        capability: Some((8, 0)),
        jit,
        ..Case::default()
    }
}

#[test]
fn no_fit_with_the_jit_forbidden_is_a_refusal_naming_the_setting() {
    let setup = Setup::new(&BOTH, &BOTH);
    let run = setup.run(no_fit(JitPolicy::Disabled));
    let (error, message) = run.refused();
    assert!(matches!(error, LoadError::NoFit { .. }), "{message}");
    for named in [
        "FAKE_KERNELS_JIT_FALLBACK=0",
        "cu130/sm_90a",
        "cu130/sm_100a",
    ] {
        assert!(message.contains(named), "{named}: {message}");
    }
    let status = run.registry.unavailable_reason("scale").unwrap();
    assert!(status.contains("FAKE_KERNELS_JIT_FALLBACK"), "{status}");
}

#[test]
fn no_fit_with_the_jit_allowed_tries_it_and_says_why_it_could_not() {
    let setup = Setup::new(&BOTH, &BOTH);
    let run = setup.run(no_fit(JitPolicy::Allowed));
    let (error, message) = run.refused();
    assert!(matches!(error, LoadError::Jit { .. }), "{message}");
    // The bundle ships no sources for `scale`, and the refusals are kept.
    assert!(message.contains("cu130/sm_90a"), "{message}");
}

#[test]
fn no_driver_is_an_answer_not_a_panic() {
    let setup = Setup::new(&BOTH, &BOTH);
    let run = setup.run(Case {
        capability: None,
        ..Case::default()
    });
    let (error, _) = run.refused();
    assert!(matches!(error, LoadError::NoGpu(_)), "{error}");
    let reason = run.registry.unavailable_reason("scale").unwrap();
    assert!(reason.contains("no CUDA driver"), "{reason}");
}

#[test]
fn a_store_only_variant_refused_for_downloads_is_a_refusal_in_index_order() {
    let setup = Setup::new(&BOTH, &["cu130/sm_100a"]);
    let registry = setup
        .run(Case {
            downloads: DownloadPolicy::Forbidden,
            ..Case::default()
        })
        .registry;
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
    let registry = setup.run(Case::default()).registry;
    let Plan::Prebuilt(plan) = registry.plan("scale") else {
        panic!("{:?}", registry.plan("scale"));
    };
    assert_eq!(
        (plan.variant.label(), plan.location),
        ("cu130/sm_90a".to_owned(), ArtifactLocation::Store)
    );
}
