//! Property test of the loader's index file: any index written with `lookup::encode` and
//! opened with `Lookup::open` reads back as the same index, kernel by kernel and whole, through
//! the public API only. Values stay inside what the reader trusts (sha256 digests, sizes
//! under its cap). Cases are bounded (64) to keep CI time flat.

use prebuilt::bundle::artifact_path;
use prebuilt::index::{Function, Index, KernelInputs, KernelRecord};
use prebuilt::lookup::{encode, Lookup, LOOKUP_FILE};
use proptest::prelude::*;
use testkit::fixtures;

const TARGETS: [&str; 6] = [
    "cu129/sm_90a",
    "cu129/sm_100a",
    "cu130/compute_90",
    "cu130/sm_90a",
    "cu130/sm_100f",
    "cu130/sm_100a",
];

prop_compose! {
    fn kernel_record()(
        targets in prop::sample::subsequence(TARGETS.to_vec(), 0..=TARGETS.len()),
        skipped in prop::sample::subsequence(TARGETS.to_vec(), 0..=2),
        entries in prop::collection::vec("[a-z_][a-z0-9_]{0,8}(<float>)?", 1..3),
        files in prop::collection::btree_map("[a-z]{1,6}/[a-z]{1,6}\\.cuh?", "[0-9a-f]{64}", 0..4),
        defines in prop::collection::btree_map("[A-Z_]{1,8}", "[0-9a-z]{0,6}", 0..3),
        flags in prop::collection::vec("-[a-zA-Z=0-9]{1,10}", 0..3),
        digests in prop::collection::vec(("[0-9a-f]{64}", "[0-9a-f]{64}", 1u64..1 << 26, 1u64..1 << 26), TARGETS.len()),
        params in prop::collection::vec(prop::collection::vec(0u32..256, 0..5), 3),
    ) -> KernelRecord {
        let skipped: Vec<(&str, &str)> = skipped
            .into_iter()
            .filter(|target| !targets.contains(target))
            .map(|target| (target, fixtures::SKIP_REASON))
            .collect();
        let mut record = fixtures::record(&targets, &skipped);
        record.inputs = KernelInputs {
            entries: entries.clone(),
            files,
            defines,
            flags,
            cxx_std: "c++17".to_owned(),
            ..KernelInputs::default()
        };
        for (variant, (digest, key, size, stored)) in record.variants.iter_mut().zip(digests) {
            variant.key = key;
            // The canonical path of the digest, or another one (stored in full).
            variant.artifact.path = if size % 2 == 0 {
                artifact_path(&digest)
            } else {
                format!("artifacts/{}/{digest}.zst", &digest[..2])
            };
            variant.artifact.digest = digest;
            variant.artifact.size = size;
            variant.artifact.stored_size = stored;
            variant.functions = entries
                .iter()
                .zip(&params)
                .map(|(entry, sizes)| Function { computed: Default::default(),
                    name: entry.clone(),
                    symbol: format!("_Z{}{entry}v", entry.len()),
                    param_sizes: sizes.clone(),
                })
                .collect();
        }
        record
    }
}

prop_compose! {
    fn index()(
        kernels in prop::collection::btree_map("[a-z][a-z0-9_]{0,10}", kernel_record(), 1..6),
        torch in prop::sample::select(vec!["2.13.*", ">=2.9,<2.14", "*"]),
    ) -> Index {
        Index {
            torch: torch.to_owned(),
            kernels,
            ..fixtures::index()
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn an_encoded_index_reads_back_as_itself(index in index()) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOOKUP_FILE);
        std::fs::write(&path, encode(&index)).unwrap();
        let lookup = Lookup::open(&path).unwrap();
        prop_assert_eq!(lookup.len(), index.kernels.len());
        let names: Vec<String> = index.kernels.keys().cloned().collect();
        prop_assert_eq!(lookup.names().unwrap(), names);
        for (name, record) in &index.kernels {
            // The load record leaves the key inputs out; `inputs` reads them.
            let load = KernelRecord {
                inputs: KernelInputs::default(),
                ..record.clone()
            };
            prop_assert_eq!(lookup.record(name).unwrap(), Some(load));
            prop_assert_eq!(lookup.inputs(name).unwrap(), Some(record.inputs.clone()));
        }
        prop_assert_eq!(lookup.record("no_such_kernel").unwrap(), None);
        prop_assert_eq!(lookup.index().unwrap(), index.clone());
        // Encoding is deterministic: the same index, the same bytes.
        prop_assert_eq!(encode(&lookup.index().unwrap()), encode(&index));
    }
}
