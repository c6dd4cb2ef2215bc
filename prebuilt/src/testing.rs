//! Shared test fixtures: small indexes, variants and device queries built in code, artifacts
//! written into a bundle folder, a fake GPU behind the registry's `Device` seam, and a compiler
//! search that finds nothing.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::device::{DeviceQuery, DriverVersion};
use crate::driver::{Context, DriverError, LaunchConfig};
use crate::index::{CompilerRecord, Index, KernelInputs, KernelRecord, Skip, StoredFile, Variant};
use crate::jit::CompilerSearch;
use crate::key::sha256_hex;
use crate::registry::{Device, DeviceFacts, LoadedModule, ModuleFailure};

pub const SKIP_REASON: &str = "tcgen05 needs CUDA 13";
use crate::{Arch, CudaBuild};

pub fn arch(text: &str) -> Arch {
    text.parse().unwrap()
}

pub fn build(text: &str) -> CudaBuild {
    text.parse().unwrap()
}

pub fn variant(label: &str) -> Variant {
    let (cuda, target) = label.split_once('/').unwrap();
    Variant {
        structs: Default::default(),
        arch: arch(target),
        cuda: build(cuda),
        torch: "2.13.*".to_owned(),
        compiler: CompilerRecord {
            kind: "nvrtc".to_owned(),
            version: "12.9.86".to_owned(),
        },
        key: format!("key-{label}"),
        artifact: StoredFile {
            digest: format!("digest-{label}"),
            size: 1,
            path: format!("artifacts/{label}.cubin.zst"),
            stored_size: 1,
            dictionary: None,
        },
        functions: Vec::new(),
    }
}

pub fn record(variants: &[&str], skipped: &[(&str, &str)]) -> KernelRecord {
    KernelRecord {
        inputs: KernelInputs::default(),
        recipe: None,
        constants: BTreeMap::new(),
        variants: variants.iter().map(|label| variant(label)).collect(),
        skipped: skipped
            .iter()
            .map(|(label, reason)| {
                let (cuda, target) = label.split_once('/').unwrap();
                Skip {
                    arch: arch(target),
                    cuda: build(cuda),
                    kind: crate::index::SkipKind::Unsupported,
                    reason: (*reason).to_owned(),
                }
            })
            .collect(),
    }
}

/// Both builds × sm_90a/sm_100a; one kernel missing cu129/sm_100a; one with plain sm_80.
pub fn index() -> Index {
    let kernels = [
        (
            "layernorm",
            record(
                &[
                    "cu129/sm_90a",
                    "cu129/sm_100a",
                    "cu130/sm_90a",
                    "cu130/sm_100a",
                ],
                &[],
            ),
        ),
        (
            "moe_gate",
            record(
                &["cu129/sm_90a", "cu130/sm_90a", "cu130/sm_100a"],
                &[("cu129/sm_100a", SKIP_REASON)],
            ),
        ),
        (
            "scale",
            record(
                &["cu129/sm_80", "cu129/sm_90a", "cu130/sm_80", "cu130/sm_90a"],
                &[],
            ),
        ),
    ];
    Index {
        format: crate::index::INDEX_FORMAT,
        store: None,
        package: "af3-kernels".to_owned(),
        torch: "2.13.*".to_owned(),
        dictionary: None,
        modules: Default::default(),
        kernels: kernels
            .into_iter()
            .map(|(name, record)| (name.to_owned(), record))
            .collect(),
    }
}

pub fn query(device: &str, cuda: &str, driver: &str, torch: Option<&str>) -> DeviceQuery {
    DeviceQuery {
        capability: DeviceQuery::parse_device(device).unwrap(),
        driver: DriverVersion::parse(driver).unwrap(),
        cuda: build(cuda),
        torch: torch.map(str::to_owned),
    }
}

/// Every kind of target, all built with CUDA 13.0: `a`, `f`, plain and PTX.
pub const EVERY_KIND: [&str; 6] = [
    "cu130/compute_90",
    "cu130/sm_90",
    "cu130/sm_90a",
    "cu130/sm_100f",
    "cu130/sm_100a",
    "cu130/sm_120",
];

/// Writes `bytes` into the bundle folder `root` as the loader reads an artifact (one zstd frame
/// at its content-addressed path) and returns its record.
pub fn write_artifact(root: &Path, bytes: &[u8]) -> StoredFile {
    write_frame(root, bytes, &zstd::encode_all(bytes, 19).unwrap())
}

/// Writes `frame` into the bundle folder `root` as the stored artifact whose content is
/// `content`, and returns its record.
pub fn write_frame(root: &Path, content: &[u8], frame: &[u8]) -> StoredFile {
    let stored = stored_file(content, frame);
    let file = root.join(&stored.path);
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, frame).unwrap();
    stored
}

/// The record of `frame` as the stored artifact whose content is `content`, written nowhere.
pub fn stored_file(content: &[u8], frame: &[u8]) -> StoredFile {
    StoredFile::artifact(
        sha256_hex(content),
        content.len() as u64,
        frame.len() as u64,
    )
}

/// A compiler search that finds nothing: no NVRTC, no site-packages, a `CUDA_HOME` and a
/// `PATH` under `dir` that do not exist.
pub fn no_compiler(dir: &Path) -> CompilerSearch {
    CompilerSearch {
        nvrtc: None,
        site_packages: Vec::new(),
        cuda_home: Some(dir.join("no-cuda")),
        path: Some(dir.join("no-bin").into_os_string()),
        system_library_path: false,
    }
}

/// A GPU behind the registry's [`Device`] seam, or a machine without a driver: it keeps every
/// image it is asked to load, and its modules launch nothing.
pub struct FakeDevice {
    facts: Result<DeviceFacts, DriverError>,
    loaded: Mutex<Vec<Vec<u8>>>,
}

impl FakeDevice {
    /// A device of compute capability `capability` behind a driver for CUDA `driver` (`13.0`).
    pub fn new(capability: (u32, u32), driver: &str) -> Arc<FakeDevice> {
        Arc::new(FakeDevice {
            facts: Ok(DeviceFacts {
                capability,
                driver: DriverVersion::parse(driver).unwrap(),
            }),
            loaded: Mutex::new(Vec::new()),
        })
    }

    /// A machine whose `libcuda.so.1` does not load.
    pub fn without_driver() -> Arc<FakeDevice> {
        Arc::new(FakeDevice {
            facts: Err(DriverError::Missing {
                library: "libcuda.so.1".to_owned(),
                detail: "libcuda.so.1: cannot open shared object file".to_owned(),
            }),
            loaded: Mutex::new(Vec::new()),
        })
    }

    /// The images loaded so far, in order.
    pub fn loaded(&self) -> Vec<Vec<u8>> {
        self.loaded.lock().unwrap().clone()
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

/// A module of a [`FakeDevice`]: a launch does nothing and succeeds.
struct FakeModule;

impl LoadedModule for FakeModule {
    fn context(&self) -> Option<&Arc<Context>> {
        None
    }

    unsafe fn launch(&self, _: usize, _: &LaunchConfig, _: &[&[u8]]) -> Result<(), DriverError> {
        Ok(())
    }
}
