//! `kernels.idx` on a real bundle of the embedded library: it gives back the whole index,
//! rebuilds byte for byte, serves `dev explain --against` without `index.json`, and a file of
//! another format is refused naming the file and both formats.

use std::path::Path;

use prebuilt::lookup::{
    encode, read_bundle_index, Catalog, Lookup, LOOKUP_FILE, LOOKUP_FORMAT, OLDEST_LOOKUP_FORMAT,
};

use crate::support::*;

fn bundle_into(out: &Path) {
    let output = kwheel()
        .args(["dev", "bundle-kernels", "--quiet", "--out"])
        .arg(out)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output));
}

#[test]
fn kernels_idx_of_the_default_library_round_trips_and_rebuilds_byte_for_byte() {
    if !have_toolchains() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (first, second) = (dir.path().join("first"), dir.path().join("second"));
    bundle_into(&first);
    bundle_into(&second);
    let bytes = std::fs::read(first.join(LOOKUP_FILE)).unwrap();
    assert_eq!(bytes, std::fs::read(second.join(LOOKUP_FILE)).unwrap());
    let index = prebuilt::bundle::read_index(&first).unwrap();
    assert_eq!(encode(&index), bytes);
    let lookup = Lookup::open(&first.join(LOOKUP_FILE)).unwrap();
    assert_eq!(lookup.index().unwrap(), index);
    assert!(lookup.graph_count() <= lookup.len());
    for (name, record) in &index.kernels {
        assert_eq!(
            lookup.inputs(name).unwrap().unwrap(),
            record.inputs,
            "{name}"
        );
        let load = lookup.record(name).unwrap().unwrap();
        assert_eq!(load.variants, record.variants, "{name}");
        assert_eq!(load.constants, record.constants, "{name}");
    }
    // Much smaller than index.json, which holds the same index.
    let json = std::fs::metadata(first.join("index.json")).unwrap().len();
    assert!((bytes.len() as u64) * 4 < json, "{} vs {json}", bytes.len());

    // Without index.json, the whole index is read from kernels.idx, and `dev explain
    // --against` compares with it.
    std::fs::remove_file(second.join("index.json")).unwrap();
    assert_eq!(read_bundle_index(&second).unwrap(), index);
    assert_eq!(Catalog::open(&second).unwrap().index().unwrap(), index);
    let kernel = index.kernels.keys().next().unwrap();
    let output = kwheel()
        .args(["dev", "explain", kernel, "--against"])
        .arg(&second)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output));
    assert!(stdout(&output).contains("unchanged"), "{}", text(&output));
}

#[test]
fn kernels_idx_of_another_format_is_refused_naming_the_file_and_both_formats() {
    if !have_toolchains() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("bundle");
    bundle_into(&bundle);
    let path = bundle.join(LOOKUP_FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    for format in [1, LOOKUP_FORMAT + 1] {
        bytes[8..12].copy_from_slice(&format.to_le_bytes());
        std::fs::write(&path, &bytes).unwrap();
        let message = prebuilt::error_chain(&Catalog::open(&bundle).unwrap_err());
        assert!(message.contains(&path.display().to_string()), "{message}");
        assert!(
            message.contains(&format!("has format {format}")),
            "{message}"
        );
        assert!(
            message.contains(&format!(
                "reads formats {OLDEST_LOOKUP_FORMAT} to {LOOKUP_FORMAT}"
            )),
            "{message}"
        );
    }
}
