//! A bundle's `index.json`: parsing and every check on it; what it accepts must be safe to
//! join paths with.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use prebuilt::bundle::{artifact_path, parse_index};
use prebuilt::untrusted::{ArtifactPath, KernelName};

fuzz_target!(|data: &[u8]| {
    let Ok(index) = parse_index(Path::new("index.json"), data) else {
        return;
    };
    for (name, record) in &index.kernels {
        assert!(
            KernelName::parse(name).is_ok(),
            "accepted kernel name {name:?}"
        );
        for variant in &record.variants {
            assert!(ArtifactPath::parse(&variant.artifact.path).is_ok());
            assert!(ArtifactPath::parse(&artifact_path(&variant.artifact.digest)).is_ok());
        }
    }
    let _ = index.to_json();
});
