//! A bundle's `kernels.idx`, the loader's index: opening it, listing it, and reading every
//! kernel it names; what it accepts must be as safe as what `index.json`'s checks accept.
#![no_main]

use std::io::Write as _;

use libfuzzer_sys::fuzz_target;
use prebuilt::lookup::Lookup;
use prebuilt::untrusted::{ArtifactPath, KernelName};

fuzz_target!(|data: &[u8]| {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(data).unwrap();
    let Ok(lookup) = Lookup::open(file.path()) else {
        return;
    };
    let Ok(names) = lookup.names() else {
        return;
    };
    for name in names.iter().take(64) {
        if let Ok(Some(record)) = lookup.record(name) {
            assert!(KernelName::parse(name).is_ok(), "accepted kernel name {name:?}");
            for variant in &record.variants {
                assert!(ArtifactPath::parse(&variant.artifact.path).is_ok());
            }
        }
        let _ = lookup.inputs(name);
    }
    let _ = lookup.record("k");
});
