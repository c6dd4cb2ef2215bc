//! A bundle's `kernels.idx`, the loader's index: opening it, looking kernels up before the
//! table is checked whole (a first call's path, which checks only what it reads), listing it,
//! and reading every kernel it names both ways; what it accepts must be as safe as what
//! `index.json`'s checks accept, and the two ways must agree.
#![no_main]

use std::io::Write as _;
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use prebuilt::lookup::Lookup;
use prebuilt::untrusted::{ArtifactPath, KernelName};

fuzz_target!(|data: &[u8]| {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(data).unwrap();
    let Ok(lookup) = Lookup::open(file.path()) else {
        assert!(Lookup::from_bytes(Path::new("kernels.idx"), data.to_vec()).is_err());
        return;
    };
    // Lazily: nothing of the table checked yet.
    for name in ["k", "k00000", "a", "swiglu", "zzzz"] {
        if let Ok(Some(record)) = lookup.record(name) {
            for variant in &record.variants {
                assert!(ArtifactPath::parse(&variant.artifact.path).is_ok());
            }
        }
        let _ = lookup.inputs(name);
    }
    let Ok(names) = lookup.names() else {
        return;
    };
    let lazy = Lookup::from_bytes(Path::new("kernels.idx"), data.to_vec()).unwrap();
    for name in names.iter().take(64) {
        let record = lookup.record(name);
        if let Ok(Some(record)) = &record {
            assert!(KernelName::parse(name).is_ok(), "accepted kernel name {name:?}");
            for variant in &record.variants {
                assert!(ArtifactPath::parse(&variant.artifact.path).is_ok());
            }
        }
        // The table passed the whole check: a lookup that reads it entry by entry finds the
        // same record.
        match (&record, lazy.record(name)) {
            (Ok(whole), Ok(one)) => assert_eq!(whole, &one, "{name}"),
            (Err(_), Err(_)) => {}
            (whole, one) => panic!("{name}: whole {:?}, lazily {:?}", whole.is_ok(), one.is_ok()),
        }
        let _ = lookup.inputs(name);
        let _ = lazy.inputs(name);
    }
    let _ = lookup.record("k");
});
