//! The default library's wheel: its bytes, METADATA, WHEEL, RECORD and entries, verify,
//! pip, and the stale or tampered bundles it refuses.

use super::*;

use crate::user_text::snapshot_settings;

#[test]
fn missing_bundle_is_built_first_and_reported() {
    let Some(shared) = shared() else { return };
    let bundled = shared
        .built
        .bundled
        .as_ref()
        .expect("the bundle was built first");
    assert_eq!(bundled.index.kernels.len(), 7);
    assert!(shared.bundle.join("index.json").is_file());
    assert_eq!(shared.built.filename.to_string(), WHEEL_NAME);
    assert_eq!(shared.built.path.file_name().unwrap(), WHEEL_NAME);
}

#[test]
fn building_twice_gives_identical_bytes() {
    let Some(shared) = shared() else { return };
    let again = build_library_wheel(&options(
        &default_manifest(),
        &shared.bundle,
        &shared.root.join("wheels-again"),
        &shared.cache,
    ))
    .unwrap();
    assert!(again.bundled.is_none(), "the bundle exists and is current");
    assert_eq!(std::fs::read(&again.path).unwrap(), shared.bytes);
}

#[test]
fn metadata_pins_torch_and_the_kwheel_runtime() {
    let Some(shared) = shared() else { return };
    let metadata = entry(&shared.bytes, &format!("{DIST_INFO}/METADATA"));
    snapshot_settings().bind(|| insta::assert_snapshot!("default_metadata", metadata));
}

#[test]
fn wheel_file_has_one_tag_line_per_expanded_tag() {
    let Some(shared) = shared() else { return };
    let wheel = entry(&shared.bytes, &format!("{DIST_INFO}/WHEEL"));
    assert!(wheel.contains(&format!("Generator: kwheel {KWHEEL_VERSION}\n")));
    snapshot_settings().bind(|| insta::assert_snapshot!("default_wheel", wheel));
}

#[test]
fn record_lists_every_file_with_hash_and_size_and_itself_last() {
    let Some(shared) = shared() else { return };
    let entries = entries(&shared.bytes);
    let record = entry(&shared.bytes, &format!("{DIST_INFO}/RECORD"));
    let rows: Vec<&str> = record.lines().collect();
    assert_eq!(rows.len(), entries.len());
    assert_eq!(*rows.last().unwrap(), format!("{DIST_INFO}/RECORD,,"));
    for ((name, data), row) in entries.iter().zip(&rows) {
        if name.ends_with("/RECORD") {
            continue;
        }
        // An independent computation: sha256, urlsafe base64 without padding.
        let digest = sha2::Sha256::digest(data);
        let hash = base64::engine::general_purpose::URL_SAFE
            .encode(digest)
            .trim_end_matches('=')
            .to_owned();
        assert_eq!(*row, format!("{name},sha256={hash},{}", data.len()));
    }
}

#[test]
fn entries_are_sorted_with_dist_info_last_and_no_directories() {
    let Some(shared) = shared() else { return };
    let names: Vec<String> = entries(&shared.bytes).into_iter().map(|(n, _)| n).collect();
    let (files, dist_info): (Vec<&String>, Vec<&String>) =
        names.iter().partition(|n| !n.starts_with(DIST_INFO));
    assert!(files.windows(2).all(|w| w[0] < w[1]), "sorted: {files:?}");
    assert_eq!(
        dist_info,
        [
            &format!("{DIST_INFO}/METADATA"),
            &format!("{DIST_INFO}/WHEEL"),
            &format!("{DIST_INFO}/RECORD")
        ]
    );
    assert_eq!(
        &names[names.len() - 3..],
        dist_info.into_iter().cloned().collect::<Vec<_>>()
    );
    assert!(names.iter().all(|n| !n.ends_with('/')));
    assert!(names.contains(&"af3_kernels/__init__.py".to_owned()));
    // The loader index holds the whole index: index.json stays in the bundle directory.
    assert!(names.contains(&"af3_kernels/_prebuilt/kernels.idx".to_owned()));
    assert!(!names.contains(&"af3_kernels/_prebuilt/index.json".to_owned()));
    assert!(names.contains(&"af3_kernels/_prebuilt/sources/layernorm/layernorm.cu".to_owned()));
    assert!(names.contains(&"af3_kernels/_prebuilt/sources/include/af3/common.cuh".to_owned()));
}

#[test]
fn entries_have_fixed_modes_times_and_compression() {
    let Some(shared) = shared() else { return };
    let expected_year = match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(_) => None,
        Err(_) => Some(1980),
    };
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(&shared.bytes)).unwrap();
    let mut artifacts = 0;
    for n in 0..archive.len() {
        let file = archive.by_index(n).unwrap();
        let name = file.name().to_owned();
        assert_eq!(file.unix_mode(), Some(0o100644), "{name}");
        let modified = file.last_modified().unwrap();
        if let Some(year) = expected_year {
            assert_eq!(
                (
                    modified.year(),
                    modified.month(),
                    modified.day(),
                    modified.hour()
                ),
                (year, 1, 1, 0),
                "{name}"
            );
        }
        let stored = name.ends_with(".zst") || name.ends_with(".zdict");
        let expected = if stored {
            zip::CompressionMethod::Stored
        } else {
            zip::CompressionMethod::Deflated
        };
        assert_eq!(file.compression(), expected, "{name}");
        artifacts += usize::from(name.ends_with(".cubin.zst"));
    }
    assert!(artifacts >= 20, "{artifacts} artifacts");
}

#[test]
fn verify_passes_the_built_wheel() {
    let Some(shared) = shared() else { return };
    let report = verify_wheel(&shared.built.path).unwrap();
    assert!(report.is_ok(), "{report}");
    assert!(report.warnings.is_empty(), "{report}");
    assert_eq!(report.bundles.len(), 1);
    let bundle = &report.bundles[0];
    assert_eq!(bundle.root, "af3_kernels/_prebuilt/");
    assert_eq!(bundle.kernels, 7);
    let variants: usize = shared
        .built
        .bundled
        .as_ref()
        .unwrap()
        .index
        .kernels
        .values()
        .map(|k| k.variants.len())
        .sum();
    assert_eq!(bundle.variants, variants);
    assert!(bundle.sources);
    assert!(report.host_elfs.is_empty());
    assert_eq!(report.files, shared.built.files);
}

#[test]
fn python_zipfile_reads_the_wheel_and_agrees_with_record() {
    let Some(shared) = shared() else { return };
    let Some(python) = python() else { return };
    let listing = Command::new(python)
        .args(["-m", "zipfile", "-l"])
        .arg(&shared.built.path)
        .output()
        .unwrap();
    assert!(listing.status.success(), "{listing:?}");
    assert!(String::from_utf8_lossy(&listing.stdout).contains("af3_kernels/_prebuilt/kernels.idx"));

    let script = r#"
import base64, csv, hashlib, io, sys, zipfile
wheel = zipfile.ZipFile(sys.argv[1])
assert wheel.testzip() is None
record = [n for n in wheel.namelist() if n.endswith(".dist-info/RECORD")][0]
rows = list(csv.reader(io.TextIOWrapper(wheel.open(record), encoding="utf-8")))
assert sorted(r[0] for r in rows) == sorted(wheel.namelist()), "RECORD lists every file"
for path, digest, size in rows:
    if path == record:
        assert digest == "" and size == "", path
        continue
    data = wheel.read(path)
    expected = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    assert digest == expected and int(size) == len(data), path
print("checked", len(rows))
"#;
    let output = Command::new(python)
        .args(["-c", script])
        .arg(&shared.built.path)
        .output()
        .unwrap();
    assert_succeeded(&output);
    assert!(String::from_utf8_lossy(&output.stdout).starts_with("checked "));
}

#[test]
fn pip_installs_the_wheel_offline() {
    let Some(shared) = shared() else { return };
    let Some(python) = python() else { return };
    let has_pip = Command::new(python)
        .args(["-m", "pip", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_pip {
        skip("python3 has no pip");
        return;
    }
    let target = tempfile::tempdir().unwrap();
    pip_install_into(python, &shared.built.path, target.path());
    let installed = target.path().join("af3_kernels");
    assert!(installed.join("__init__.py").is_file());
    assert!(!installed.join("_prebuilt/index.json").exists());
    let index = std::fs::read(installed.join("_prebuilt/kernels.idx")).unwrap();
    assert_eq!(
        index,
        std::fs::read(shared.bundle.join("kernels.idx")).unwrap()
    );
    assert!(target.path().join(DIST_INFO).join("RECORD").is_file());
}

#[test]
fn sources_can_be_left_out() {
    let Some(shared) = shared() else { return };
    let built = build_library_wheel(&LibraryWheelOptions {
        ship_sources: false,
        ..options(
            &default_manifest(),
            &shared.bundle,
            &shared.root.join("wheels-no-sources"),
            &shared.cache,
        )
    })
    .unwrap();
    let bytes = std::fs::read(&built.path).unwrap();
    let names: Vec<String> = entries(&bytes).into_iter().map(|(n, _)| n).collect();
    assert!(!names.iter().any(|n| n.contains("_prebuilt/sources/")));
    assert!(names.contains(&"af3_kernels/_prebuilt/kernels.idx".to_owned()));
    assert!(!built.report.bundles[0].sources);
    assert!(bytes.len() < shared.bytes.len());
}

/// The default library's wheel with the torch pin `torch`, bundled in a scratch folder `name`,
/// and its METADATA.
fn wheel_pinned(shared: &Shared, name: &str, torch: &str) -> (release::BuiltWheel, String) {
    let root = scratch(name);
    let built = build_library_wheel(&LibraryWheelOptions {
        torch: Some(torch.into()),
        ..options(
            &default_manifest(),
            &root.join("_prebuilt"),
            &root.join("wheels"),
            &shared.cache,
        )
    })
    .unwrap();
    let bytes = std::fs::read(&built.path).unwrap();
    let metadata = entry(&bytes, &format!("{DIST_INFO}/METADATA"));
    (built, metadata)
}

#[test]
fn torch_override_pins_requires_dist_and_the_bundle() {
    let Some(shared) = shared() else { return };
    let (built, metadata) = wheel_pinned(shared, "torch-override", "2.11.*");
    assert_eq!(built.bundled.as_ref().unwrap().index.torch, "2.11.*");
    assert!(
        metadata.contains("\nRequires-Dist: torch==2.11.*\n"),
        "{metadata}"
    );
    assert!(!metadata.contains("2.13"), "{metadata}");
}

/// A library whose kernels never touch torch says `torch = "none"`: its wheel requires no
/// torch (so its users do not download one), and its variants load with any torch or none.
#[test]
fn a_library_without_torch_requires_none() {
    let Some(shared) = shared() else { return };
    // The default library less its extension module, which is built against torch (a
    // manifest with both is refused with `torch = "none"`).
    let root = scratch("no-torch");
    let library = root.join("library");
    testkit::copy_tree(&workspace().join("kernels"), &library, &["target"]);
    let manifest = library.join("kernels.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let cut = text
        .find("\n[extensions._C]")
        .expect("the default library has a module");
    std::fs::write(&manifest, &text[..cut]).unwrap();
    let built = build_library_wheel(&LibraryWheelOptions {
        torch: Some("none".into()),
        ..options(
            &manifest,
            &root.join("_prebuilt"),
            &root.join("wheels"),
            &shared.cache,
        )
    })
    .unwrap();
    let metadata = entry(
        &std::fs::read(&built.path).unwrap(),
        &format!("{DIST_INFO}/METADATA"),
    );
    let index = &built.bundled.as_ref().unwrap().index;
    assert_eq!(index.torch, "none");
    assert!(!metadata.contains("torch"), "{metadata}");
    assert!(metadata.contains("\nRequires-Dist: kwheel"), "{metadata}");
    let query = |torch: Option<&str>| {
        prebuilt::device::DeviceQuery::simulated(
            (9, 0),
            "cu130".parse().unwrap(),
            None,
            torch.map(str::to_owned),
        )
    };
    for torch in [Some("2.13.0+cu130"), Some("2.9.1"), None] {
        let report = prebuilt::coverage::coverage(index, &query(torch));
        assert!(
            report.kernels.values().all(|kernel| kernel.loads.is_some()),
            "{torch:?}: {report}"
        );
    }
}

#[test]
fn bundle_for_another_torch_pin_is_refused() {
    let Some(shared) = shared() else { return };
    let error = build_library_wheel(&LibraryWheelOptions {
        torch: Some("2.11.*".into()),
        ..options(
            &default_manifest(),
            &shared.bundle,
            &shared.root.join("wheels-refused"),
            &shared.cache,
        )
    })
    .unwrap_err();
    let Error::StaleBundle { stale, .. } = &error else {
        panic!("expected a stale bundle, got {}", chain(&error));
    };
    assert_eq!(stale.len(), 7);
    assert!(stale
        .iter()
        .all(|k| k.changes == ["torch pin: 2.13.* → 2.11.*"]));
    assert!(!shared.root.join("wheels-refused").join(WHEEL_NAME).exists());
    snapshot_settings().bind(|| insta::assert_snapshot!("stale_bundle", chain(&error)));
}

#[test]
fn source_edited_after_bundling_is_refused_naming_kernel_and_file() {
    let Some(shared) = shared() else { return };
    let dir = tempfile::tempdir().unwrap();
    let manifest = copy_library(dir.path());
    let root = manifest.parent().unwrap();
    let bundle = dir.path().join("_prebuilt");
    let out = dir.path().join("wheels");
    // Same stable paths and contents as the shared build: every key is a cache hit.
    let first = build_library_wheel(&options(&manifest, &bundle, &out, &shared.cache)).unwrap();
    assert!(first.bundled.as_ref().unwrap().compiled().is_empty());
    assert_eq!(std::fs::read(&first.path).unwrap(), shared.bytes);

    append(&root.join("swiglu/swiglu.cu"), "\n// tuned\n");
    std::fs::remove_file(&first.path).unwrap();
    let error = build_library_wheel(&options(&manifest, &bundle, &out, &shared.cache)).unwrap_err();
    let Error::StaleBundle { stale, .. } = &error else {
        panic!("expected a stale bundle, got {}", chain(&error));
    };
    assert_eq!(stale.len(), 1, "{error}");
    assert_eq!(stale[0].kernel, "swiglu");
    assert_eq!(stale[0].changes.len(), 1);
    assert!(
        stale[0].changes[0].starts_with("file swiglu/swiglu.cu: content changed (sha256 "),
        "{}",
        stale[0].changes[0]
    );
    let message = error.to_string();
    assert!(
        message.starts_with(&format!(
            "bundle `{}` is stale; rebuild it with `kwheel dev bundle-kernels` before building \
             the wheel:\n  `swiglu`: file swiglu/swiglu.cu: content changed (sha256 ",
            bundle.display()
        )),
        "{message}"
    );
    assert!(
        !out.join(WHEEL_NAME).exists(),
        "no wheel from a stale bundle"
    );

    // A shared header names every kernel that includes it.
    append(&root.join("include/af3/common.cuh"), "\n// tuned\n");
    let error = build_library_wheel(&options(&manifest, &bundle, &out, &shared.cache)).unwrap_err();
    let Error::StaleBundle { stale, .. } = &error else {
        panic!("expected a stale bundle, got {}", chain(&error));
    };
    let with_header: Vec<&str> = stale
        .iter()
        .filter(|k| {
            k.changes
                .iter()
                .any(|c| c.starts_with("file include/af3/common.cuh: content changed"))
        })
        .map(|k| k.kernel.as_str())
        .collect();
    assert!(with_header.len() >= 2, "{error}");
    assert!(with_header.contains(&"layernorm_bf16"), "{error}");
}

#[test]
fn tampered_artifact_fails_verify_naming_the_file() {
    let Some(shared) = shared() else { return };
    let dir = tempfile::tempdir().unwrap();
    let original = entries(&shared.bytes);
    let (artifact, _) = original
        .iter()
        .find(|(n, _)| n.ends_with(".cubin.zst"))
        .unwrap()
        .clone();

    // One byte changed, the zip rewritten with a valid CRC, RECORD untouched: what someone
    // who edits a wheel with a zip tool produces.
    let tampered = dir.path().join(WHEEL_NAME);
    let mut edited = original.clone();
    for (name, data) in &mut edited {
        if *name == artifact {
            let middle = data.len() / 2;
            data[middle] ^= 0x01;
        }
    }
    write_entries(&tampered, &edited);
    let report = verify_wheel(&tampered).unwrap();
    assert!(!report.is_ok());
    let about_artifact = problems_about(&report, &artifact);
    assert!(
        about_artifact
            .iter()
            .any(|m| m.contains("but RECORD says") && m.contains("the file changed")),
        "{report}"
    );
    assert_eq!(
        about_artifact.len(),
        2,
        "RECORD and the bundle's digest both name it: {report}"
    );
    assert!(
        report.problems.iter().all(|p| p.file == artifact),
        "{report}"
    );
    let error = report.into_result().unwrap_err();
    assert!(error.to_string().contains(&artifact), "{error}");

    // The same byte flipped in place: the zip's own CRC catches it, naming the file.
    let mut bytes = shared.bytes.clone();
    let data = &original.iter().find(|(n, _)| *n == artifact).unwrap().1;
    let at = bytes
        .windows(data.len())
        .position(|w| w == data.as_slice())
        .expect("stored artifacts appear verbatim");
    bytes[at + data.len() / 2] ^= 0x01;
    let flipped = dir.path().join("flipped").join(WHEEL_NAME);
    std::fs::create_dir_all(flipped.parent().unwrap()).unwrap();
    std::fs::write(&flipped, bytes).unwrap();
    let report = verify_wheel(&flipped).unwrap();
    assert!(
        report.problems.iter().any(|p| p.file == artifact),
        "{report}"
    );
}

#[test]
fn a_local_header_naming_another_path_fails_verify() {
    let Some(shared) = shared() else { return };
    let (artifact, _) = entries(&shared.bytes)
        .into_iter()
        .find(|(name, _)| name.ends_with(".cubin.zst"))
        .unwrap();
    // The first occurrence of the name is its local header (the central directory is last);
    // one character changed there only, as a byte flipped in transit or a crafted zip does.
    let mut bytes = shared.bytes.clone();
    let at = bytes
        .windows(artifact.len())
        .position(|window| window == artifact.as_bytes())
        .unwrap();
    let digit = at + artifact.len() - ".cubin.zst".len() - 1;
    bytes[digit] = if bytes[digit] == b'0' { b'1' } else { b'0' };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(WHEEL_NAME);
    std::fs::write(&path, bytes).unwrap();
    let report = verify_wheel(&path).unwrap();
    let about = problems_about(&report, &artifact);
    assert!(
        about.iter().any(|m| m.contains("by its local header")),
        "{report}"
    );
}

#[test]
fn a_loader_index_that_disagrees_with_the_index_fails_verify() {
    let Some(shared) = shared() else { return };
    let dir = tempfile::tempdir().unwrap();
    // A wheel of an older kwheel, which shipped index.json beside kernels.idx: the two must be
    // one index.
    let mut original = entries(&shared.bytes);
    let index_name = "af3_kernels/_prebuilt/index.json";
    let lookup_name = "af3_kernels/_prebuilt/kernels.idx";
    let json = std::fs::read(shared.bundle.join("index.json")).unwrap();
    let index: prebuilt::Index = serde_json::from_slice(&json).unwrap();
    let at = original.iter().position(|(n, _)| n == lookup_name).unwrap();
    original.insert(at, (index_name.to_owned(), json));
    assert_eq!(
        original.iter().find(|(n, _)| n == lookup_name).unwrap().1,
        prebuilt::lookup::encode(&index),
        "the built wheel's kernels.idx is its index's"
    );
    // A kernel dropped from the loader's index only: RECORD rewritten to match, so only the
    // bundle check can see it.
    let mut fewer = index.clone();
    fewer.kernels.remove("swiglu");
    let cases: [(&str, Option<Vec<u8>>); 2] = [
        ("disagrees", Some(prebuilt::lookup::encode(&fewer))),
        ("missing", None),
    ];
    for (case, replacement) in cases {
        let files: Vec<(String, Vec<u8>)> = original
            .iter()
            .filter(|(name, _)| !name.ends_with("RECORD"))
            .filter_map(|(name, data)| match (name.as_str(), &replacement) {
                (n, None) if n == lookup_name => None,
                (n, Some(bytes)) if n == lookup_name => Some((name.clone(), bytes.clone())),
                _ => Some((name.clone(), data.clone())),
            })
            .collect();
        let record_name = original
            .iter()
            .map(|(name, _)| name)
            .find(|name| name.ends_with("RECORD"))
            .unwrap()
            .clone();
        let path = dir.path().join(case).join(WHEEL_NAME);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        write_with_record(&path, &files, &record_name);
        let report = verify_wheel(&path).unwrap();
        let about = problems_about(&report, lookup_name);
        assert_eq!(about.len(), 1, "{case}: {report}");
        let expected = if replacement.is_some() {
            "does not match"
        } else {
            "is missing"
        };
        assert!(about[0].contains(expected), "{case}: {report}");
        assert_eq!(
            report.problems.len(),
            1,
            "{case}: only kernels.idx is wrong: {report}"
        );
    }
}
