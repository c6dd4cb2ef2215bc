//! Shared test fixtures: small indexes, variants and device queries built in code.

use std::collections::BTreeMap;

use crate::device::{DeviceQuery, DriverVersion};
use crate::index::{CompilerRecord, Index, KernelInputs, KernelRecord, Skip, StoredFile, Variant};

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
