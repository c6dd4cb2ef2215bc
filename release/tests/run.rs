//! The release machinery end to end: the default library's wheel (bundled with the real CUDA
//! toolchains that `ci/setup` installs), wheels written by an independent writer for
//! verification, and real ELF files compiled here with the system `cc` for the audit.
//!
//! Tests that need a toolchain (CUDA, `cc`, `python3` with pip) skip with the reason when it is
//! missing, unless `KWHEEL_REQUIRE_TOOLCHAINS=1` (CI), where they fail.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use base64::Engine as _;
use bundler::BuildToolchain;
use release::audit::{audit_file, AuditTarget, ElfKind};
use release::library::torch_requirement;
use release::wheel::{record_hash, KWHEEL_VERSION};
use release::{
    audit_elf, build_library_wheel, verify_wheel, BuiltWheel, Error, LibraryWheelOptions, Metadata,
    WheelFile, WheelFilename, WheelSpec, MANYLINUX_2_28_X86_64,
};
use sha2::Digest as _;
use zip::write::SimpleFileOptions;

const WHEEL_NAME: &str =
    "af3_kernels-0.1.0-py3-none-manylinux_2_28_x86_64.manylinux_2_28_aarch64.whl";
const DIST_INFO: &str = "af3_kernels-0.1.0.dist-info";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

fn default_manifest() -> PathBuf {
    workspace().join("kernels/kernels.toml")
}

fn required() -> bool {
    std::env::var("KWHEEL_REQUIRE_TOOLCHAINS").as_deref() == Ok("1")
}

/// Skips (returns `false`) with the reason, or fails under `KWHEEL_REQUIRE_TOOLCHAINS=1`.
fn skip(reason: &str) -> bool {
    if required() {
        panic!("toolchain required but missing: {reason}");
    }
    skipped(reason);
    false
}

/// Says that the running test passes without testing: `SKIPPED: <test>: <reason>`, written
/// to stderr past the test harness's capture, so that `ci/test` lists it in its summary.
fn skipped(reason: &str) {
    let test = std::thread::current()
        .name()
        .unwrap_or("(unnamed test)")
        .to_owned();
    let _ = writeln!(std::io::stderr(), "SKIPPED: {test}: {reason}");
}

/// The real CUDA toolchains, or `None` (with the reason printed) where they are missing.
fn toolchains() -> Option<Vec<BuildToolchain>> {
    static TOOLCHAINS: OnceLock<Result<Vec<BuildToolchain>, String>> = OnceLock::new();
    let found = TOOLCHAINS.get_or_init(|| {
        ["cu129", "cu130"]
            .iter()
            .map(|b| BuildToolchain::discover(b.parse().unwrap()).map_err(|e| format!("{e}")))
            .collect()
    });
    match found {
        Ok(toolchains) => Some(toolchains.clone()),
        Err(reason) => {
            skip(reason);
            None
        }
    }
}

/// A fresh directory under the target's scratch space, removed first if an earlier run left it.
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("release-run")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn options(manifest: &Path, bundle: &Path, out: &Path, cache: &Path) -> LibraryWheelOptions {
    LibraryWheelOptions {
        bundle: bundle.to_owned(),
        out: out.to_owned(),
        cache_dir: cache.to_owned(),
        jobs: 2,
        progress: false,
        toolchains: toolchains(),
        ..LibraryWheelOptions::new(manifest)
    }
}

/// One cold build of the default library's wheel (bundling first, as no bundle exists yet),
/// shared by the tests that only read it.
struct Shared {
    root: PathBuf,
    cache: PathBuf,
    bundle: PathBuf,
    built: BuiltWheel,
    bytes: Vec<u8>,
}

fn shared() -> Option<&'static Shared> {
    static SHARED: OnceLock<Option<Shared>> = OnceLock::new();
    SHARED
        .get_or_init(|| {
            toolchains()?;
            let root = scratch("shared");
            let cache = root.join("cache");
            let bundle = root.join("_prebuilt");
            let built = build_library_wheel(&options(
                &default_manifest(),
                &bundle,
                &root.join("wheels"),
                &cache,
            ))
            .unwrap_or_else(|error| {
                panic!("the default library's wheel builds: {}", chain(&error))
            });
            let bytes = std::fs::read(&built.path).unwrap();
            Some(Shared {
                root,
                cache,
                bundle,
                built,
                bytes,
            })
        })
        .as_ref()
}

/// Everything a command printed, stdout first.
fn output_text(output: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Asserts that a command succeeded, showing its stderr where it did not.
fn assert_succeeded(output: &std::process::Output) {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(error) = cause {
        text.push_str(&format!("\n  caused by: {error}"));
        cause = error.source();
    }
    text
}

/// Every entry of a zip: (name, bytes), in archive order.
fn entries(bytes: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(bytes)).unwrap();
    (0..archive.len())
        .map(|n| {
            let mut file = archive.by_index(n).unwrap();
            let mut data = Vec::new();
            file.read_to_end(&mut data).unwrap();
            (file.name().to_owned(), data)
        })
        .collect()
}

fn entry(bytes: &[u8], name: &str) -> String {
    let (_, data) = entries(bytes)
        .into_iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no `{name}` in the wheel"));
    String::from_utf8(data).unwrap()
}

fn python() -> Option<&'static str> {
    let found = Command::new("python3")
        .args(["-c", "import zipfile, hashlib, csv, base64"])
        .output()
        .is_ok_and(|output| output.status.success());
    if found {
        Some("python3")
    } else {
        skip("no python3");
        None
    }
}

// ---------------------------------------------------------------------------------------------
// The default library's wheel

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
    assert_eq!(
        entry(&shared.bytes, &format!("{DIST_INFO}/METADATA")),
        format!(
            "Metadata-Version: 2.1\n\
             Name: af3-kernels\n\
             Version: 0.1.0\n\
             Summary: AlphaFold3-style CUDA kernels, shipped prebuilt.\n\
             Requires-Python: >=3.9\n\
             Requires-Dist: kwheel>=0.1.0,<0.2\n\
             Requires-Dist: torch==2.13.*\n"
        )
    );
}

#[test]
fn wheel_file_has_one_tag_line_per_expanded_tag() {
    let Some(shared) = shared() else { return };
    assert_eq!(
        entry(&shared.bytes, &format!("{DIST_INFO}/WHEEL")),
        format!(
            "Wheel-Version: 1.0\n\
             Generator: kwheel {KWHEEL_VERSION}\n\
             Root-Is-Purelib: false\n\
             Tag: py3-none-manylinux_2_28_x86_64\n\
             Tag: py3-none-manylinux_2_28_aarch64\n"
        )
    );
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
    assert!(names.contains(&"af3_kernels/_prebuilt/index.json".to_owned()));
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
    assert!(String::from_utf8_lossy(&listing.stdout).contains("af3_kernels/_prebuilt/index.json"));

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
    let output = Command::new(python)
        .args([
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            "--disable-pip-version-check",
            "--target",
        ])
        .arg(target.path())
        .arg(&shared.built.path)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "pip install failed:\n{}",
        output_text(&output)
    );
    let installed = target.path().join("af3_kernels");
    assert!(installed.join("__init__.py").is_file());
    assert!(installed.join("_prebuilt/index.json").is_file());
    let index = std::fs::read(installed.join("_prebuilt/index.json")).unwrap();
    assert_eq!(
        index,
        std::fs::read(shared.bundle.join("index.json")).unwrap()
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
    assert!(names.contains(&"af3_kernels/_prebuilt/index.json".to_owned()));
    assert!(!built.report.bundles[0].sources);
    assert!(bytes.len() < shared.bytes.len());
}

#[test]
fn torch_override_pins_requires_dist_and_the_bundle() {
    let Some(shared) = shared() else { return };
    let root = scratch("torch-override");
    let built = build_library_wheel(&LibraryWheelOptions {
        torch: Some("2.11.*".into()),
        ..options(
            &default_manifest(),
            &root.join("_prebuilt"),
            &root.join("wheels"),
            &shared.cache,
        )
    })
    .unwrap();
    assert_eq!(built.bundled.as_ref().unwrap().index.torch, "2.11.*");
    let bytes = std::fs::read(&built.path).unwrap();
    let metadata = entry(&bytes, &format!("{DIST_INFO}/METADATA"));
    assert!(
        metadata.contains("\nRequires-Dist: torch==2.11.*\n"),
        "{metadata}"
    );
    assert!(!metadata.contains("2.13"), "{metadata}");
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
}

/// Copies the embedded library (sources, manifest, Python package; not the Rust references).
fn copy_library(dir: &Path) -> PathBuf {
    fn copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name();
            if name == "reference" || name == "target" || name == "__pycache__" {
                continue;
            }
            if entry.file_type().unwrap().is_dir() {
                copy(&entry.path(), &to.join(&name));
            } else {
                std::fs::copy(entry.path(), to.join(&name)).unwrap();
            }
        }
    }
    let to = dir.join("kernels");
    copy(&workspace().join("kernels"), &to);
    to.join("kernels.toml")
}

fn append(path: &Path, text: &str) {
    let mut file = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    file.write_all(text.as_bytes()).unwrap();
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
    assert!(first.bundled.as_ref().unwrap().compiled.is_empty());
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
    let mut writer = zip::ZipWriter::new(std::fs::File::create(&tampered).unwrap());
    for (name, mut data) in original.clone() {
        if name == artifact {
            let middle = data.len() / 2;
            data[middle] ^= 0x01;
        }
        let stored = name.ends_with(".zst") || name.ends_with(".zdict");
        let options = SimpleFileOptions::default().compression_method(if stored {
            zip::CompressionMethod::Stored
        } else {
            zip::CompressionMethod::Deflated
        });
        writer.start_file(name.as_str(), options).unwrap();
        writer.write_all(&data).unwrap();
    }
    writer.finish().unwrap();
    let report = verify_wheel(&tampered).unwrap();
    assert!(!report.is_ok());
    let about_artifact: Vec<&str> = report
        .problems
        .iter()
        .filter(|p| p.file == artifact)
        .map(|p| p.message.as_str())
        .collect();
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
    let about: Vec<&str> = report
        .problems
        .iter()
        .filter(|p| p.file == artifact)
        .map(|p| p.message.as_str())
        .collect();
    assert!(
        about.iter().any(|m| m.contains("by its local header")),
        "{report}"
    );
}

#[test]
fn a_loader_index_that_disagrees_with_the_index_fails_verify() {
    let Some(shared) = shared() else { return };
    let dir = tempfile::tempdir().unwrap();
    let original = entries(&shared.bytes);
    let index_name = "af3_kernels/_prebuilt/index.json";
    let lookup_name = "af3_kernels/_prebuilt/kernels.idx";
    let index: prebuilt::Index =
        serde_json::from_slice(&original.iter().find(|(n, _)| n == index_name).unwrap().1).unwrap();
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
        let mut record = String::new();
        for (name, data) in &files {
            record.push_str(&format!("{name},{},{}\n", record_hash(data), data.len()));
        }
        record.push_str(&format!("{record_name},,\n"));
        let path = dir.path().join(case).join(WHEEL_NAME);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let mut writer = zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
        for (name, data) in files
            .iter()
            .chain([&(record_name.clone(), record.into_bytes())])
        {
            let stored = name.ends_with(".zst") || name.ends_with(".zdict");
            let options = SimpleFileOptions::default().compression_method(if stored {
                zip::CompressionMethod::Stored
            } else {
                zip::CompressionMethod::Deflated
            });
            writer.start_file(name.as_str(), options).unwrap();
            writer.write_all(data).unwrap();
        }
        writer.finish().unwrap();
        let report = verify_wheel(&path).unwrap();
        let about: Vec<&str> = report
            .problems
            .iter()
            .filter(|p| p.file == lookup_name)
            .map(|p| p.message.as_str())
            .collect();
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

// ---------------------------------------------------------------------------------------------
// The wheel writer on small inputs

fn small_spec(out: &Path, platform: &str, files: Vec<WheelFile>) -> WheelSpec {
    WheelSpec {
        filename: WheelFilename::new("demo-kernels", "1.2.0", "py3", "none", platform).unwrap(),
        metadata: Metadata {
            name: "demo-kernels".into(),
            version: "1.2.0".into(),
            summary: Some("Demo.".into()),
            requires_python: None,
            requires_dist: vec![torch_requirement("2.13.*").unwrap()],
        },
        files,
        out_dir: out.to_owned(),
        modified: Some(1_700_000_000),
    }
}

#[test]
fn wheel_file_names_normalize_and_expand_tags() {
    let name = WheelFilename::new("Af3.Kernels__x", "0.1.0-rc1", "py2.py3", "none", "any").unwrap();
    assert_eq!(
        name.to_string(),
        "af3_kernels_x-0.1.0_rc1-py2.py3-none-any.whl"
    );
    assert_eq!(name.tags(), ["py2-none-any", "py3-none-any"]);
    assert_eq!(name.dist_info(), "af3_kernels_x-0.1.0_rc1.dist-info");
    assert!(name.is_purelib());
    let parsed: WheelFilename = "af3_kernels_x-0.1.0_rc1-py2.py3-none-any.whl"
        .parse()
        .unwrap();
    assert_eq!(parsed, name);
    let built = WheelFilename::parse("kwheel-0.1.0-1-cp39-abi3-manylinux_2_28_x86_64.whl").unwrap();
    assert_eq!(built.build(), Some("1"));
    assert_eq!(built.tags(), ["cp39-abi3-manylinux_2_28_x86_64"]);
    assert!(!built.is_purelib());

    for (bad, reason) in [
        ("demo-1.0-py3-none.whl", "five or six"),
        ("demo-1.0-py3-none-any.zip", "does not end in `.whl`"),
        (
            "demo-1.0-x-py3-none-any.whl",
            "build tag does not start with a digit",
        ),
    ] {
        let error = WheelFilename::parse(bad).unwrap_err().to_string();
        assert!(error.contains(reason), "{bad}: {error}");
    }
    assert!(WheelFilename::new("-demo", "1", "py3", "none", "any").is_err());
    assert!(WheelFilename::new("demo", "1 0", "py3", "none", "any").is_err());
    assert!(WheelFilename::new("demo", "1", "py3", "none", "many-linux").is_err());
}

#[test]
fn written_wheels_are_byte_identical_and_dated_as_asked() {
    let dir = tempfile::tempdir().unwrap();
    let files = || {
        vec![
            WheelFile::from_bytes("demo_kernels/__init__.py", "print('hi')\n"),
            WheelFile::from_bytes("demo_kernels/a,b \"q\".txt", "quoted\n"),
            WheelFile::from_bytes("demo_kernels/data.zst", vec![0x28, 0xb5, 0x2f, 0xfd]),
            WheelFile {
                executable: true,
                ..WheelFile::from_bytes("demo_kernels/run.sh", "#!/bin/sh\n")
            },
        ]
    };
    let first = release::write_wheel(&small_spec(&dir.path().join("a"), "any", files())).unwrap();
    let second = release::write_wheel(&small_spec(&dir.path().join("b"), "any", files())).unwrap();
    let bytes = std::fs::read(&first).unwrap();
    assert_eq!(bytes, std::fs::read(&second).unwrap());
    assert_eq!(
        first.file_name().unwrap(),
        "demo_kernels-1.2.0-py3-none-any.whl"
    );

    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(&bytes)).unwrap();
    for n in 0..archive.len() {
        let file = archive.by_index(n).unwrap();
        let time = file.last_modified().unwrap();
        // 1_700_000_000 is 2023-11-14T22:13:20Z.
        assert_eq!(
            (
                time.year(),
                time.month(),
                time.day(),
                time.hour(),
                time.minute(),
                time.second()
            ),
            (2023, 11, 14, 22, 13, 20)
        );
        let mode = if file.name().ends_with("run.sh") {
            0o100755
        } else {
            0o100644
        };
        assert_eq!(file.unix_mode(), Some(mode), "{}", file.name());
    }
    let record = entry(&bytes, "demo_kernels-1.2.0.dist-info/RECORD");
    let quoted = "\"demo_kernels/a,b \"\"q\"\".txt\",";
    assert!(record.contains(quoted), "{record}");
    assert!(record.contains(&format!(
        "demo_kernels/__init__.py,{},12\n",
        record_hash(b"print('hi')\n")
    )));
    assert!(entry(&bytes, "demo_kernels-1.2.0.dist-info/WHEEL").contains("Root-Is-Purelib: true\n"));
    let report = verify_wheel(&first).unwrap();
    assert!(report.is_ok(), "{report}");
}

#[test]
fn unusable_paths_and_mismatched_metadata_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    for (path, reason) in [
        ("../evil.py", "`..` component"),
        ("/abs.py", "absolute"),
        ("demo_kernels-1.2.0.dist-info/extra", "is reserved"),
        ("other-1.0.dist-info/METADATA", "is reserved"),
    ] {
        let spec = small_spec(dir.path(), "any", vec![WheelFile::from_bytes(path, "x")]);
        let error = release::write_wheel(&spec).unwrap_err().to_string();
        assert!(
            error.starts_with(&format!("cannot put `{path}` into a wheel: "))
                && error.contains(reason),
            "{error}"
        );
    }
    let twice = small_spec(
        dir.path(),
        "any",
        vec![
            WheelFile::from_bytes("a.py", "1"),
            WheelFile::from_bytes("a.py", "2"),
        ],
    );
    assert!(release::write_wheel(&twice)
        .unwrap_err()
        .to_string()
        .contains("two files"));
    let mut renamed = small_spec(dir.path(), "any", vec![WheelFile::from_bytes("a.py", "1")]);
    renamed.metadata.name = "other".into();
    assert!(matches!(
        release::write_wheel(&renamed),
        Err(Error::NameMismatch { .. })
    ));
    let unknown = small_spec(dir.path(), "manylinux_2_17_x86_64", Vec::new());
    assert_eq!(
        release::write_wheel(&unknown).unwrap_err().to_string(),
        "no audit policy for platform tag `manylinux_2_17_x86_64`: kwheel writes wheels tagged \
         `manylinux_2_28_x86_64`, `manylinux_2_28_aarch64`, `linux_*` or `any`"
    );
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "nothing left behind"
    );
}

// ---------------------------------------------------------------------------------------------
// The audit, on ELF files compiled here

/// Compiles `source` into a shared library `name` in `dir` with the system `cc`.
fn compile_shared(dir: &Path, name: &str, source: &str, extra: &[&str]) -> Option<Vec<u8>> {
    if Command::new("cc").arg("--version").output().is_err() {
        skip("no C compiler `cc`");
        return None;
    }
    let c = dir.join(format!("{name}.c"));
    std::fs::write(&c, source).unwrap();
    let output = Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(dir.join(name))
        .arg(&c)
        .args(extra)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "cc failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Some(std::fs::read(dir.join(name)).unwrap())
}

const NEW_GLIBC: &str = "#define _GNU_SOURCE\n#include <unistd.h>\n\
    int kw_close_all(unsigned first) { return close_range(first, ~0U, 0); }\n";
const OLD_GLIBC: &str =
    "#include <string.h>\nunsigned long kw_length(const char *s) { return strlen(s); }\n";

/// `close_range` is versioned GLIBC_2.34; a glibc older than that cannot provide it.
fn new_glibc_library(dir: &Path) -> Option<Vec<u8>> {
    let bytes = compile_shared(dir, "libnew.so", NEW_GLIBC, &[])?;
    let needs_2_34 = bytes.windows(10).any(|w| w == b"GLIBC_2.34");
    if !needs_2_34 {
        skip("this system's glibc predates close_range@GLIBC_2.34");
        return None;
    }
    Some(bytes)
}

#[test]
fn glibc_2_34_symbol_fails_the_audit_naming_file_library_and_version() {
    let dir = tempfile::tempdir().unwrap();
    let Some(bytes) = new_glibc_library(dir.path()) else {
        return;
    };
    let violations = audit_elf(
        &MANYLINUX_2_28_X86_64,
        "af3_kernels/_kwheel.abi3.so",
        &bytes,
    );
    let messages: Vec<String> = violations.iter().map(ToString::to_string).collect();
    assert_eq!(
        messages,
        [
            "af3_kernels/_kwheel.abi3.so needs GLIBC_2.34 (from libc.so.6), newer than \
          manylinux_2_28 allows (GLIBC_2.28)"
        ]
    );
}

#[test]
fn old_symbols_pass_the_audit() {
    let dir = tempfile::tempdir().unwrap();
    let Some(bytes) = compile_shared(dir.path(), "libold.so", OLD_GLIBC, &[]) else {
        return;
    };
    assert!(audit_elf(&MANYLINUX_2_28_X86_64, "pkg/libold.so", &bytes).is_empty());
    let audit = audit_file(
        &AuditTarget::Policy(&MANYLINUX_2_28_X86_64),
        "pkg/libold.so",
        &bytes,
    );
    assert_eq!(audit.kind, Some(ElfKind::Host));
    // A platform-independent wheel holds no host code at all.
    let audit = audit_file(&AuditTarget::PlatformIndependent, "pkg/libold.so", &bytes);
    assert_eq!(
        audit.violations[0].to_string(),
        "pkg/libold.so is host code, but the wheel is tagged `any` (platform-independent)"
    );
}

#[test]
fn library_outside_the_policy_fails_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    if compile_shared(
        dir.path(),
        "libkwdep.so",
        "int kw_dep(void) { return 7; }\n",
        &[],
    )
    .is_none()
    {
        return;
    }
    let library_dir = format!("-L{}", dir.path().display());
    let Some(bytes) = compile_shared(
        dir.path(),
        "libuses.so",
        "int kw_dep(void);\nint kw_uses(void) { return kw_dep() + 1; }\n",
        &[&library_dir, "-lkwdep"],
    ) else {
        return;
    };
    let messages: Vec<String> = audit_elf(&MANYLINUX_2_28_X86_64, "pkg/libuses.so", &bytes)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        messages,
        ["pkg/libuses.so links `libkwdep.so`, which manylinux_2_28 does not allow (bundle it or \
          link it statically)"]
    );
}

#[test]
fn cubins_are_recognised_and_skipped() {
    let fixtures = workspace().join("prebuilt/tests/fixtures/cubin");
    for name in ["nvrtc129_sm_90a.cubin", "nvcc130_sm_100a.cubin"] {
        let bytes = std::fs::read(fixtures.join(name)).unwrap();
        let audit = audit_file(&AuditTarget::Policy(&MANYLINUX_2_28_X86_64), name, &bytes);
        assert_eq!(audit.kind, Some(ElfKind::Cubin), "{name}");
        assert!(audit.violations.is_empty(), "{name}");
        // Even in a platform-independent wheel: a cubin is not host code.
        let audit = audit_file(&AuditTarget::PlatformIndependent, name, &bytes);
        assert!(audit.violations.is_empty(), "{name}");
    }
}

#[test]
fn writer_refuses_a_wheel_that_fails_the_audit_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let Some(bytes) = new_glibc_library(dir.path()) else {
        return;
    };
    let out = dir.path().join("wheels");
    let spec = small_spec(
        &out,
        "manylinux_2_28_x86_64",
        vec![
            WheelFile::from_bytes("demo_kernels/__init__.py", ""),
            WheelFile::from_bytes("demo_kernels/_kwheel.abi3.so", bytes),
        ],
    );
    let error = release::write_wheel(&spec).unwrap_err();
    assert_eq!(
        error.to_string(),
        "`demo_kernels-1.2.0-py3-none-manylinux_2_28_x86_64.whl` fails the manylinux_2_28_x86_64 \
         audit:\n  demo_kernels/_kwheel.abi3.so needs GLIBC_2.34 (from libc.so.6), newer than \
         manylinux_2_28 allows (GLIBC_2.28)"
    );
    assert_eq!(
        std::fs::read_dir(&out).unwrap().count(),
        0,
        "no partial wheel"
    );

    // `linux_x86_64` promises nothing about the system, so the same files pass there.
    let mut unrestricted = spec.clone();
    unrestricted.filename =
        WheelFilename::new("demo-kernels", "1.2.0", "py3", "none", "linux_x86_64").unwrap();
    let written = release::write_wheel(&unrestricted).unwrap();
    let report = verify_wheel(&written).unwrap();
    assert!(report.is_ok(), "{report}");
    assert_eq!(report.host_elfs, ["demo_kernels/_kwheel.abi3.so"]);
}

// ---------------------------------------------------------------------------------------------
// Verification of wheels written by another writer

/// Writes a wheel the plain way another tool would: given entries, then a correct RECORD.
fn foreign_wheel(path: &Path, tag: &str, files: &[(&str, &[u8])]) {
    let filename = WheelFilename::parse(&path.file_name().unwrap().to_string_lossy()).unwrap();
    let dist_info = filename.dist_info();
    let mut all: Vec<(String, Vec<u8>)> = files
        .iter()
        .map(|(n, b)| ((*n).to_owned(), b.to_vec()))
        .collect();
    all.push((
        format!("{dist_info}/METADATA"),
        format!(
            "Metadata-Version: 2.1\nName: {}\nVersion: {}\n",
            filename.name(),
            filename.version()
        )
        .into_bytes(),
    ));
    all.push((
        format!("{dist_info}/WHEEL"),
        format!("Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: {tag}\n")
            .into_bytes(),
    ));
    let mut record = String::new();
    for (name, bytes) in &all {
        record.push_str(&format!("{name},{},{}\n", record_hash(bytes), bytes.len()));
    }
    record.push_str(&format!("{dist_info}/RECORD,,\n"));
    all.push((format!("{dist_info}/RECORD"), record.into_bytes()));
    let mut writer = zip::ZipWriter::new(std::fs::File::create(path).unwrap());
    for (name, bytes) in all {
        writer
            .start_file(name.as_str(), SimpleFileOptions::default())
            .unwrap();
        writer.write_all(&bytes).unwrap();
    }
    writer.finish().unwrap();
}

#[test]
fn verify_audits_host_elfs_in_any_wheel() {
    let dir = tempfile::tempdir().unwrap();
    let Some(library) = new_glibc_library(dir.path()) else {
        return;
    };
    let path = dir
        .path()
        .join("demo-1.0-cp39-abi3-manylinux_2_28_x86_64.whl");
    foreign_wheel(
        &path,
        "cp39-abi3-manylinux_2_28_x86_64",
        &[
            ("demo/__init__.py", b""),
            ("demo/_native.abi3.so", &library),
        ],
    );
    let report = verify_wheel(&path).unwrap();
    assert_eq!(
        report
            .problems
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        [
            "demo/_native.abi3.so: needs GLIBC_2.34 (from libc.so.6), newer than manylinux_2_28 \
          allows (GLIBC_2.28)"
        ]
    );
    assert_eq!(report.host_elfs, ["demo/_native.abi3.so"]);
}

#[test]
fn verify_checks_tags_against_the_file_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir
        .path()
        .join("demo-1.0-py3-none-manylinux_2_28_x86_64.whl");
    foreign_wheel(&path, "py3-none-any", &[("demo/__init__.py", b"")]);
    let report = verify_wheel(&path).unwrap();
    let messages: Vec<String> = report.problems.iter().map(ToString::to_string).collect();
    assert_eq!(
        messages,
        [
            "demo-1.0.dist-info/WHEEL: lacks `Tag: py3-none-manylinux_2_28_x86_64`, which the \
             file name has",
            "demo-1.0.dist-info/WHEEL: has `Tag: py3-none-any`, which the file name lacks",
        ]
    );
}

#[test]
fn verify_reports_every_zip_hygiene_problem_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("demo-1.0-py3-none-any.whl");
    let mut writer = zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
    let options = SimpleFileOptions::default();
    for name in [
        "demo/../evil.py",
        "/abs.py",
        "demo/bell\u{7}.py",
        "demo/a.py",
        "demo/b.py",
    ] {
        writer.start_file(name, options).unwrap();
        writer.write_all(b"x = 1\n").unwrap();
    }
    writer.add_directory("demo/dir/", options).unwrap();
    writer
        .add_symlink("demo/link", "/etc/passwd", options)
        .unwrap();
    writer.finish().unwrap();
    // Rename `demo/b.py` to `demo/a.py` in place: a zip writer refuses duplicates.
    let mut bytes = std::fs::read(&path).unwrap();
    let (from, to) = (b"demo/b.py", b"demo/a.py");
    let mut at = 0;
    while let Some(found) = bytes[at..].windows(from.len()).position(|w| w == from) {
        bytes[at + found..at + found + from.len()].copy_from_slice(to);
        at += found + from.len();
    }
    std::fs::write(&path, bytes).unwrap();

    let report = verify_wheel(&path).unwrap();
    let has = |file: &str, text: &str| {
        report
            .problems
            .iter()
            .any(|p| p.file == file && p.message.contains(text))
    };
    assert!(has("demo/../evil.py", "`..` component"), "{report}");
    assert!(has("/abs.py", "absolute"), "{report}");
    assert!(has("demo/bell\u{7}.py", "control character"), "{report}");
    assert!(has("demo/a.py", "appears twice"), "{report}");
    assert!(has("demo/dir/", "directory entry"), "{report}");
    assert!(has("demo/link", "symbolic link"), "{report}");
    assert!(
        has("demo-1.0-py3-none-any.whl", "has no `demo-1.0.dist-info/`"),
        "{report}"
    );
}

#[test]
fn verify_names_files_missing_from_record_and_record_rows_without_files() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("demo-1.0-py3-none-any.whl");
    foreign_wheel(&good, "py3-none-any", &[("demo/__init__.py", b"")]);
    assert!(verify_wheel(&good).unwrap().is_ok());

    // Add a file RECORD does not list, and drop one it does.
    let original = entries(&std::fs::read(&good).unwrap());
    let changed = dir.path().join("changed").join("demo-1.0-py3-none-any.whl");
    std::fs::create_dir_all(changed.parent().unwrap()).unwrap();
    let mut writer = zip::ZipWriter::new(std::fs::File::create(&changed).unwrap());
    for (name, data) in original.iter().filter(|(n, _)| n != "demo/__init__.py") {
        writer
            .start_file(name.as_str(), SimpleFileOptions::default())
            .unwrap();
        writer.write_all(data).unwrap();
    }
    writer
        .start_file("demo/extra.py", SimpleFileOptions::default())
        .unwrap();
    writer.write_all(b"import os\n").unwrap();
    writer.finish().unwrap();
    let report = verify_wheel(&changed).unwrap();
    let messages: BTreeMap<String, String> = report
        .problems
        .iter()
        .map(|p| (p.file.clone(), p.message.clone()))
        .collect();
    assert_eq!(
        messages,
        BTreeMap::from([
            (
                "demo/__init__.py".to_owned(),
                "is listed in RECORD but not in the wheel".to_owned()
            ),
            (
                "demo/extra.py".to_owned(),
                "is not listed in RECORD".to_owned()
            ),
        ])
    );
    assert_eq!(
        report
            .warnings
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        ["demo/extra.py: comes after `demo-1.0.dist-info/`, which should be last"]
    );
}

// ---------------------------------------------------------------------------------------------
// The kwheel runtime wheel (prebuilt/python) and its Python API, installed into a fresh venv

mod python_runtime {
    use super::*;
    use release::audit::ViolationKind;
    use release::runtime::{command_path, find_cargo_zigbuild, find_zig, MODULE_PATH};
    use release::{
        build_runtime_wheel, NativeCommand, NativeModule, RuntimeArch, RuntimeWheelOptions,
        MANYLINUX_2_28_AARCH64,
    };

    const RUNTIME_DIST_INFO: &str = "kwheel-0.1.0.dist-info";

    /// Where the module and the command are built: `KWHEEL_PYTHON_TARGET_DIR` (`ci/test` keeps
    /// it under ~/.cache), else the workspace's `target/kwheel/runtime`, as `release
    /// build-kwheel` and `release check` build them (a second run builds nothing). Apart from
    /// the workspace's own target directory, whose lock the running `cargo test` holds.
    fn module_target_dir() -> PathBuf {
        release::runtime::default_target_dir(&workspace())
    }

    /// A zig-built `kwheel` wheel, built once per run (as `release build-kwheel` builds it).
    struct Runtime {
        built: BuiltWheel,
        bytes: Vec<u8>,
    }

    fn build_for(arch: RuntimeArch) -> Option<Runtime> {
        if find_cargo_zigbuild().is_none() {
            skip("cargo-zigbuild is not installed (`bash ci/setup` installs it)");
            return None;
        }
        if find_zig().is_none() {
            skip("no zig for cargo-zigbuild (`bash ci/setup` installs ziglang)");
            return None;
        }
        if let Some(target) = release::runtime::missing_rust_target(arch) {
            skip(&format!(
                "no Rust standard library for {target} (`bash ci/setup` adds it)"
            ));
            return None;
        }
        let built = build_runtime_wheel(&RuntimeWheelOptions {
            arch,
            module: NativeModule::Build {
                target_dir: Some(module_target_dir()),
            },
            ..RuntimeWheelOptions::new(workspace(), scratch(&format!("runtime-wheel-{arch}")))
        })
        .unwrap_or_else(|error| panic!("the {arch} kwheel wheel builds: {}", chain(&error)));
        let bytes = std::fs::read(&built.path).unwrap();
        Some(Runtime { built, bytes })
    }

    /// The x86_64 wheel, the one this machine installs.
    fn runtime() -> Option<&'static Runtime> {
        static RUNTIME: OnceLock<Option<Runtime>> = OnceLock::new();
        RUNTIME
            .get_or_init(|| build_for(RuntimeArch::X86_64))
            .as_ref()
    }

    /// The aarch64 wheel (cross-compiled: the slowest build of the suite, cached in
    /// [`module_target_dir`]).
    fn runtime_aarch64() -> Option<&'static Runtime> {
        static RUNTIME: OnceLock<Option<Runtime>> = OnceLock::new();
        RUNTIME
            .get_or_init(|| build_for(RuntimeArch::Aarch64))
            .as_ref()
    }

    fn module_bytes(runtime: &Runtime) -> Vec<u8> {
        entries(&runtime.bytes)
            .into_iter()
            .find(|(name, _)| name == MODULE_PATH)
            .map(|(_, data)| data)
            .expect("the module is in the wheel")
    }

    #[test]
    fn runtime_wheel_holds_the_package_and_the_abi3_module_for_glibc_2_28() {
        let Some(runtime) = runtime() else { return };
        assert_eq!(
            runtime.built.filename.to_string(),
            format!("kwheel-{KWHEEL_VERSION}-cp39-abi3-manylinux_2_28_x86_64.whl")
        );
        let names: Vec<String> = entries(&runtime.bytes)
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        // Every Python file of the package (the build backend among them), the module, the
        // command; sorted, `.dist-info` last.
        let mut expected = vec![command_path(), MODULE_PATH.to_owned()];
        for entry in std::fs::read_dir(workspace().join("prebuilt/python/kwheel")).unwrap() {
            let name = entry.unwrap().file_name().to_string_lossy().into_owned();
            if name.ends_with(".py") {
                expected.push(format!("kwheel/{name}"));
            }
        }
        assert!(expected.contains(&"kwheel/build.py".to_owned()));
        expected.sort();
        expected.extend(
            ["METADATA", "WHEEL", "RECORD"].map(|file| format!("{RUNTIME_DIST_INFO}/{file}")),
        );
        assert_eq!(names, expected);
        let command = entries(&runtime.bytes)
            .into_iter()
            .find(|(name, _)| *name == command_path())
            .map(|(_, bytes)| bytes)
            .unwrap();
        assert!(
            audit_elf(&MANYLINUX_2_28_X86_64, &command_path(), &command).is_empty(),
            "the command keeps to manylinux_2_28"
        );
        let wheel = entry(&runtime.bytes, &format!("{RUNTIME_DIST_INFO}/WHEEL"));
        assert!(
            wheel.ends_with("Root-Is-Purelib: false\nTag: cp39-abi3-manylinux_2_28_x86_64\n"),
            "{wheel}"
        );
        let metadata = entry(&runtime.bytes, &format!("{RUNTIME_DIST_INFO}/METADATA"));
        assert!(metadata.contains("Name: kwheel\n"), "{metadata}");
        assert!(metadata.contains("Requires-Python: >=3.9\n"), "{metadata}");
        assert!(!metadata.contains("Requires-Dist"), "{metadata}");
        verify_wheel(&runtime.built.path)
            .unwrap()
            .into_result()
            .unwrap();
    }

    #[test]
    fn zig_built_module_needs_nothing_newer_than_glibc_2_28() {
        let Some(runtime) = runtime() else { return };
        let violations = audit_elf(&MANYLINUX_2_28_X86_64, MODULE_PATH, &module_bytes(runtime));
        assert!(violations.is_empty(), "{violations:?}");
    }

    #[test]
    fn runtime_wheel_builds_twice_to_identical_bytes() {
        let Some(runtime) = runtime() else { return };
        let again = build_runtime_wheel(&RuntimeWheelOptions {
            arch: RuntimeArch::X86_64,
            module: NativeModule::Build {
                target_dir: Some(module_target_dir()),
            },
            ..RuntimeWheelOptions::new(workspace(), scratch("runtime-wheel-again"))
        })
        .unwrap();
        assert_eq!(std::fs::read(&again.path).unwrap(), runtime.bytes);
    }

    /// glibc's version on this machine, from `getconf`, as (major, minor).
    fn host_glibc() -> Option<(u32, u32)> {
        let output = Command::new("getconf")
            .arg("GNU_LIBC_VERSION")
            .output()
            .ok()?;
        let text = String::from_utf8(output.stdout).ok()?;
        let version = text.trim().strip_prefix("glibc ")?;
        let (major, minor) = version.split_once('.')?;
        Some((major.parse().ok()?, minor.parse().ok()?))
    }

    #[test]
    fn module_linked_without_zig_fails_the_audit_naming_the_symbol_version() {
        match host_glibc() {
            // Rust's standard library takes the GLIBC_2.34 symbols where glibc has them.
            Some(version) if version >= (2, 34) => {}
            other => {
                skip(&format!(
                    "this machine's glibc ({other:?}) is older than 2.34, which a plain build \
                     would need"
                ));
                return;
            }
        }
        let target_dir = module_target_dir();
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        // The debug profile: the linker, not the optimizer, decides the symbol versions, and
        // it builds in two thirds of the time.
        let output = Command::new(cargo)
            .args(["build", "--locked", "-p", "kwheel-python"])
            .arg("--manifest-path")
            .arg(workspace().join("Cargo.toml"))
            .arg("--target-dir")
            .arg(&target_dir)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "cargo build failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let plain = target_dir.join("debug/lib_kwheel.so");
        let violations = audit_elf(
            &MANYLINUX_2_28_X86_64,
            MODULE_PATH,
            &std::fs::read(&plain).unwrap(),
        );
        let too_new: Vec<&str> = violations
            .iter()
            .filter_map(|violation| match &violation.kind {
                ViolationKind::SymbolVersion {
                    version, library, ..
                } if library == "libc.so.6" => Some(version.as_str()),
                _ => None,
            })
            .collect();
        assert!(
            too_new
                .iter()
                .any(|version| ["GLIBC_2.33", "GLIBC_2.34"].contains(version)),
            "{violations:?}"
        );
        let message = violations
            .iter()
            .find(|violation| violation.to_string().contains("GLIBC_2.3"))
            .unwrap()
            .to_string();
        assert!(
            message.starts_with("kwheel/_kwheel.abi3.so needs GLIBC_2.3")
                && message
                    .ends_with(" (from libc.so.6), newer than manylinux_2_28 allows (GLIBC_2.28)"),
            "{message}"
        );

        // Packed as the runtime, it fails the writer's audit and leaves no wheel.
        let out = scratch("runtime-wheel-plain");
        let error = build_runtime_wheel(&RuntimeWheelOptions {
            arch: RuntimeArch::X86_64,
            module: NativeModule::Prebuilt(plain),
            command: NativeCommand::Omit,
            ..RuntimeWheelOptions::new(workspace(), &out)
        })
        .unwrap_err();
        assert!(matches!(error, Error::Audit { .. }), "{error}");
        let text = error.to_string();
        assert!(
            text.starts_with(
                "`kwheel-0.1.0-cp39-abi3-manylinux_2_28_x86_64.whl` fails the \
                 manylinux_2_28_x86_64 audit:\n  kwheel/_kwheel.abi3.so needs GLIBC_2."
            ),
            "{text}"
        );
        assert!(
            text.lines().any(|line| line
                == "  kwheel/_kwheel.abi3.so needs GLIBC_2.34 (from libc.so.6), newer than \
                    manylinux_2_28 allows (GLIBC_2.28)"),
            "{text}"
        );
        assert_eq!(std::fs::read_dir(&out).unwrap().count(), 0);
    }

    /// A fresh venv with both wheels installed by pip, offline.
    struct Venv {
        python: PathBuf,
        site_packages: PathBuf,
    }

    fn venv() -> Option<&'static Venv> {
        static VENV: OnceLock<Option<Venv>> = OnceLock::new();
        VENV.get_or_init(|| {
            let runtime = runtime()?;
            let library = shared()?;
            let root = scratch("python-venv");
            let created = Command::new("python3")
                .args(["-m", "venv"])
                .arg(&root)
                .output();
            match created {
                Ok(output) if output.status.success() => {}
                Ok(output) => {
                    skip(&format!(
                        "python3 -m venv failed: {}",
                        String::from_utf8_lossy(&output.stderr)
                    ));
                    return None;
                }
                Err(error) => {
                    skip(&format!("no python3: {error}"));
                    return None;
                }
            }
            let python = root.join("bin/python");
            let output = Command::new(&python)
                .args([
                    "-m",
                    "pip",
                    "install",
                    "--no-index",
                    "--no-deps",
                    "--disable-pip-version-check",
                    "--no-input",
                ])
                .arg(&runtime.built.path)
                .arg(&library.built.path)
                .output()
                .unwrap();
            assert!(
                output.status.success(),
                "pip install of both wheels failed:\n{}",
                output_text(&output)
            );
            let site_packages =
                python_output(&python, "import site; print(site.getsitepackages()[0])");
            Some(Venv {
                python,
                site_packages: PathBuf::from(site_packages.trim()),
            })
        })
        .as_ref()
    }

    /// A `Command` for the venv's python with the variables the runtime reads cleared.
    fn python_command(python: &Path) -> Command {
        let mut command = Command::new(python);
        for variable in [
            "PYTHONPATH",
            "PYTHONHOME",
            "KWHEEL_CUDA_BUILD",
            "AF3_KERNELS_JIT_FALLBACK",
            "VIRTUAL_ENV",
        ] {
            command.env_remove(variable);
        }
        command.env("PYTHONDONTWRITEBYTECODE", "1");
        command
    }

    fn python_output(python: &Path, code: &str) -> String {
        let output = python_command(python).args(["-c", code]).output().unwrap();
        assert!(
            output.status.success(),
            "python -c {code:?} failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    }

    #[test]
    fn both_wheels_install_offline_and_import() {
        let Some(venv) = venv() else { return };
        assert!(venv.site_packages.join(MODULE_PATH).is_file());
        assert!(venv
            .site_packages
            .join("af3_kernels/_prebuilt/index.json")
            .is_file());
        assert!(venv
            .site_packages
            .join(RUNTIME_DIST_INFO)
            .join("RECORD")
            .is_file());
        let out = python_output(
            &venv.python,
            "import kwheel, af3_kernels\n\
             print(kwheel.__version__)\n\
             print(af3_kernels._registry.package, len(af3_kernels._registry.kernels))\n",
        );
        assert_eq!(out, format!("{KWHEEL_VERSION}\naf3-kernels 7\n"));
    }

    #[test]
    fn python_api_tests_pass_in_the_venv() {
        let Some(venv) = venv() else { return };
        let tests = workspace().join("prebuilt/python/tests");
        // From the tests' own directory: `-m` puts it first on sys.path, and it holds no
        // `kwheel`, so the installed package is the one imported.
        let output = python_command(&venv.python)
            .args(["-m", "unittest", "-v", "test_kwheel"])
            .current_dir(&tests)
            .output()
            .unwrap();
        let report = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "Python tests failed:\n{report}");
        assert!(
            report.trim_end().ends_with("OK") || report.contains("OK (skipped="),
            "{report}"
        );
        eprintln!("{report}");
    }

    /// The pinned torch that `ci/setup-torch` installs: `KWHEEL_TORCH`, else
    /// `${XDG_CACHE_HOME:-~/.cache}/kwheel/torch`; `None` (skipped, or failed under
    /// `KWHEEL_REQUIRE_TOOLCHAINS=1`) where it is not installed.
    fn torch_site() -> Option<PathBuf> {
        let dir = match std::env::var_os("KWHEEL_TORCH").filter(|dir| !dir.is_empty()) {
            Some(dir) => PathBuf::from(dir),
            None => std::env::var_os("XDG_CACHE_HOME")
                .filter(|dir| !dir.is_empty())
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|home| Path::new(&home).join(".cache")))?
                .join("kwheel/torch"),
        };
        if dir.join("torch/__init__.py").is_file() {
            Some(dir)
        } else {
            skip(&format!(
                "no torch in {} (`bash ci/setup-torch` installs the pinned one)",
                dir.display()
            ));
            None
        }
    }

    #[test]
    fn torch_op_tests_pass_in_the_venv() {
        let Some(venv) = venv() else { return };
        let Some(torch) = torch_site() else { return };
        for (dir, module) in [
            ("prebuilt/python/tests", "test_torch"),
            ("kernels/python/tests", "test_ops"),
        ] {
            let output = python_command(&venv.python)
                .env("PYTHONPATH", &torch)
                .args(["-m", "unittest", "-v", module])
                .current_dir(workspace().join(dir))
                .output()
                .unwrap();
            let report = String::from_utf8_lossy(&output.stderr);
            assert!(output.status.success(), "{module} failed:\n{report}");
            // Every test ran: nothing skips for want of torch.
            assert!(report.trim_end().ends_with("OK"), "{report}");
            eprintln!("{report}");
        }
    }
    /// A fresh venv under `dir` (outside the repository when `dir` is); `None` (skipped)
    /// without a Python that makes one.
    fn fresh_venv(dir: &Path) -> Option<PathBuf> {
        match Command::new("python3")
            .args(["-m", "venv"])
            .arg(dir)
            .output()
        {
            Ok(output) if output.status.success() => Some(dir.join("bin/python")),
            Ok(output) => {
                skip(&format!(
                    "python3 -m venv failed: {}",
                    String::from_utf8_lossy(&output.stderr)
                ));
                None
            }
            Err(error) => {
                skip(&format!("no python3: {error}"));
                None
            }
        }
    }

    /// `python -m pip install --no-index --disable-pip-version-check <args>`, which must pass.
    fn pip_install(python: &Path, args: &[&std::ffi::OsStr]) -> String {
        let output = python_command(python)
            .args([
                "-m",
                "pip",
                "install",
                "--no-index",
                "--disable-pip-version-check",
            ])
            .args(args)
            .output()
            .unwrap();
        let text = output_text(&output);
        assert!(
            output.status.success(),
            "pip install {args:?} failed:\n{text}"
        );
        text
    }

    #[test]
    fn the_kwheel_wheel_puts_kwheel_on_path_and_it_builds_a_library_outside_the_repository() {
        let Some(runtime) = runtime() else { return };
        let Some(shared) = shared() else { return };
        let outside = tempfile::tempdir().unwrap();
        let Some(python) = fresh_venv(&outside.path().join("venv")) else {
            return;
        };
        pip_install(
            &python,
            &["--no-deps".as_ref(), runtime.built.path.as_os_str()],
        );
        let bin = python.parent().unwrap();
        assert!(bin.join("kwheel").is_file(), "pip installs the command");
        let path = std::env::join_paths(std::iter::once(bin.to_owned()).chain(
            std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
        ))
        .unwrap();
        let project = outside.path().join("project");
        copy_library(&project);
        // `kwheel` as a shell finds it on PATH, in a directory that is no kwheel checkout.
        let run = |args: &[&str]| {
            let output = Command::new("kwheel")
                .args(args)
                .env("PATH", &path)
                .current_dir(&project)
                .output()
                .unwrap();
            let text = output_text(&output);
            assert!(output.status.success(), "kwheel {args:?}:\n{text}");
            text
        };
        assert_eq!(run(&["--version"]), format!("kwheel {KWHEEL_VERSION}\n"));
        let cache = shared.cache.to_str().unwrap();
        let bundled = run(&["dev", "bundle-kernels", "--quiet", "--cache-dir", cache]);
        assert!(
            bundled.contains("bundle target/kwheel/_prebuilt"),
            "{bundled}"
        );
        let built = run(&["dev", "build-wheel", "--quiet", "--cache-dir", cache]);
        let wheel = project.join("target/kwheel/wheels").join(WHEEL_NAME);
        assert!(built.starts_with("target/kwheel/wheels/"), "{built}");
        verify_wheel(&wheel).unwrap().into_result().unwrap();
        let only = std::fs::read_dir(project.join("target/kwheel/wheels"))
            .unwrap()
            .count();
        assert_eq!(only, 1, "dev build-wheel builds the library's wheel only");
    }

    /// What an installed `af3_kernels` says: cubins in its index, `select()`'s answer (or its
    /// refusal), `status()` of one kernel.
    const REPORT_SCRIPT: &str = r#"
import json, os, af3_kernels, kwheel
index = json.load(open(os.path.join(af3_kernels._registry.path, "index.json")))
variants = sum(len(k["variants"]) for k in index["kernels"].values())
sources = os.path.isdir(os.path.join(af3_kernels._registry.path, "sources"))
try:
    chosen = af3_kernels.select("layernorm_bf16", "sm_90", cuda="12.9")
    selected = [str(chosen), chosen.location]
except kwheel.NoFitError as error:
    selected = [None, str(error)]
print(json.dumps([variants, sources, selected, af3_kernels.status()["layernorm_bf16"]]))
"#;

    type Report = (usize, bool, (Option<String>, String), String);

    fn report(python: &Path) -> Report {
        let scratch = tempfile::tempdir().unwrap();
        let output = python_command(python)
            .args(["-c", REPORT_SCRIPT])
            .current_dir(scratch.path())
            .output()
            .unwrap();
        assert_succeeded(&output);
        serde_json::from_slice(&output.stdout).unwrap()
    }

    /// The JIT path, as an installed package built from source reports it.
    fn assert_jit_path(report: &Report, how: &str) {
        let (variants, sources, (chosen, refusal), status) = report;
        assert_eq!(*variants, 0, "{how}: no cubin");
        assert!(*sources, "{how}: the sources are shipped");
        assert_eq!(*chosen, None, "{how}");
        assert!(
            refusal.contains(release::library::RECIPES_ONLY_REASON),
            "{how}: select() names the JIT path: {refusal}"
        );
        // Without a GPU status() names the missing driver; with one, the compile to come.
        assert!(
            status.contains("compiles on first load")
                || (status.starts_with("unavailable") && status.contains("driver")),
            "{how}: {status}"
        );
    }

    #[test]
    fn pip_builds_the_library_from_its_directory_and_its_sdist_into_the_jit_path() {
        let Some(runtime) = runtime() else { return };
        let Some(shared) = shared() else { return };
        let outside = tempfile::tempdir().unwrap();
        let Some(python) = fresh_venv(&outside.path().join("venv")) else {
            return;
        };
        // Build isolation installs `kwheel` for the backend from the same wheel, offline.
        let find_links = runtime.built.path.parent().unwrap().as_os_str().to_owned();
        let from = |target: &std::ffi::OsStr| {
            pip_install(
                &python,
                &[
                    "--find-links".as_ref(),
                    &find_links,
                    "--no-deps".as_ref(),
                    "--force-reinstall".as_ref(),
                    target,
                ],
            )
        };
        pip_install(
            &python,
            &["--no-deps".as_ref(), runtime.built.path.as_os_str()],
        );
        let project = outside.path().join("project");
        let manifest = copy_library(&project);
        let directory = from(manifest.parent().unwrap().as_os_str());
        assert!(
            directory.contains("Successfully installed af3-kernels-0.1.0"),
            "{directory}"
        );
        assert_jit_path(&report(&python), "pip install <directory>");

        let sdist = release::build_sdist(&release::SdistOptions {
            manifest: manifest.clone(),
            out: outside.path().join("sdist"),
        })
        .unwrap_or_else(|error| panic!("{}", chain(&error)));
        from(sdist.path.as_os_str());
        assert_jit_path(&report(&python), "pip install <sdist>");

        // The wheel `dev build-wheel` builds instead: prebuilt cubins, in the wheel.
        from(shared.built.path.as_os_str());
        let (variants, _, (chosen, location), status) = report(&python);
        assert!(variants > 0);
        assert_eq!(chosen.as_deref(), Some("cu129/sm_90a"));
        assert_eq!(location, "local (bundle)");
        assert!(
            status.contains("prebuilt")
                || (status.starts_with("unavailable") && status.contains("driver")),
            "{status}"
        );
    }

    /// PyPA's auditwheel, as `ci/setup` installs it; `None` (skipped) without it.
    fn auditwheel(wheel: &Path) -> Option<String> {
        let dir = std::env::var_os("KWHEEL_AUDITWHEEL")
            .map(PathBuf::from)
            .or_else(|| {
                let cache = std::env::var_os("XDG_CACHE_HOME")
                    .map(PathBuf::from)
                    .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))?;
                Some(cache.join("kwheel/auditwheel"))
            })
            .filter(|dir| dir.join("auditwheel").is_dir());
        let Some(dir) = dir else {
            skip("no auditwheel (`bash ci/setup` installs it)");
            return None;
        };
        let output = Command::new("python3")
            .args(["-m", "auditwheel", "show"])
            .arg(wheel)
            .env("PYTHONPATH", &dir)
            .output()
            .unwrap();
        let text = output_text(&output);
        assert!(
            output.status.success(),
            "auditwheel show {}:\n{text}",
            wheel.display()
        );
        Some(text.split_whitespace().collect::<Vec<_>>().join(" "))
    }

    #[test]
    fn auditwheel_accepts_both_kwheel_wheels() {
        for (runtime, arch) in [
            (runtime(), RuntimeArch::X86_64),
            (runtime_aarch64(), RuntimeArch::Aarch64),
        ] {
            let Some(runtime) = runtime else { return };
            let Some(shown) = auditwheel(&runtime.built.path) else {
                return;
            };
            let tag = arch.platform_tag();
            assert!(
                shown.contains(&format!(
                    "consistent with the following platform tag: \"{tag}\""
                )),
                "{shown}"
            );
        }
    }

    #[test]
    fn the_aarch64_wheel_holds_aarch64_code_for_glibc_2_28() {
        let Some(runtime) = runtime_aarch64() else {
            return;
        };
        assert_eq!(
            runtime.built.filename.to_string(),
            format!("kwheel-{KWHEEL_VERSION}-cp39-abi3-manylinux_2_28_aarch64.whl")
        );
        for (name, bytes) in entries(&runtime.bytes) {
            if name == MODULE_PATH || name == command_path() {
                assert_eq!(
                    u16::from_le_bytes([bytes[18], bytes[19]]),
                    183,
                    "{name}: EM_AARCH64"
                );
                let violations = audit_elf(&MANYLINUX_2_28_AARCH64, &name, &bytes);
                assert!(violations.is_empty(), "{violations:?}");
                // The x86_64 policy refuses it, naming the machine.
                assert!(!audit_elf(&MANYLINUX_2_28_X86_64, &name, &bytes).is_empty());
            }
        }
    }

    /// `qemu-aarch64-static` and the arm64 sysroot `ci/setup` unpacks; `None` (skipped) without.
    fn arm64_emulation() -> Option<(PathBuf, PathBuf)> {
        let root = std::env::var_os("KWHEEL_ARM64_ROOT")
            .map(PathBuf::from)
            .or_else(|| {
                let cache = std::env::var_os("XDG_CACHE_HOME")
                    .map(PathBuf::from)
                    .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))?;
                Some(cache.join("kwheel/arm64"))
            })?;
        let qemu = root.join("qemu-aarch64-static");
        let sysroot = root.join("sysroot");
        if qemu.is_file() && sysroot.join("usr/bin/python3.11").is_file() {
            Some((qemu, sysroot))
        } else {
            skip(&format!(
                "no arm64 emulation at {} (`bash ci/setup` unpacks qemu-user and an arm64 Python)",
                root.display()
            ));
            None
        }
    }

    #[test]
    fn the_aarch64_wheel_imports_and_answers_under_emulation() {
        let Some(runtime) = runtime_aarch64() else {
            return;
        };
        let Some(shared) = shared() else { return };
        let Some((qemu, sysroot)) = arm64_emulation() else {
            return;
        };
        // pip installs both wheels for an aarch64 CPython 3.11, as it would on the machine.
        let target = scratch("arm64-site");
        let output = Command::new("python3")
            .args(["-m", "pip", "install", "--no-index", "--no-deps", "--quiet"])
            .args(["--disable-pip-version-check", "--only-binary=:all:"])
            .args([
                "--platform",
                "manylinux_2_28_aarch64",
                "--python-version",
                "3.11",
            ])
            .args(["--implementation", "cp", "--target"])
            .arg(&target)
            .arg(&runtime.built.path)
            .arg(&shared.built.path)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "pip install for aarch64:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let script = "import json, platform, kwheel, af3_kernels\n\
                      chosen = af3_kernels.select('layernorm_bf16', 'sm_90', cuda='12.9')\n\
                      print(json.dumps([platform.machine(), kwheel.__version__, str(chosen),\n\
                      af3_kernels.status()['layernorm_bf16']]))\n";
        let output = Command::new(&qemu)
            .arg("-L")
            .arg(&sysroot)
            .arg(sysroot.join("usr/bin/python3.11"))
            .args(["-c", script])
            .env("PYTHONPATH", &target)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env_remove("PYTHONHOME")
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "python under qemu-aarch64:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let (machine, version, chosen, status): (String, String, String, String) =
            serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(machine, "aarch64");
        assert_eq!(version, KWHEEL_VERSION);
        assert_eq!(chosen, "cu129/sm_90a");
        assert!(
            status.starts_with("unavailable") && status.contains("driver"),
            "{status}"
        );
        // The command from the wheel's scripts runs there too.
        let output = Command::new(&qemu)
            .arg("-L")
            .arg(&sysroot)
            .arg(target.join("bin/kwheel"))
            .arg("--version")
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&output.stdout),
            format!("kwheel {KWHEEL_VERSION}\n")
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Distribution: slim wheels, publishing to a store, prefetch from it. The store is the server
// `.ci/run` starts (nginx with WebDAV PUT, `KWHEEL_TEST_STORE`; skipped without it unless
// `KWHEEL_REQUIRE_STORE=1`), or the fault-injecting loopback store of the prebuilt tests.

mod archives;

mod diff;

// wheel verify names recorded flags the JIT refuses.
mod jit_flags;
// Registry-sized wheels: a main wheel and its companion parts.
mod parts;

#[path = "../../prebuilt/tests/support/loopback_store.rs"]
mod loopback_store;

mod distribution {
    use super::loopback_store::{Fault, LoopbackStore};
    use super::*;
    use prebuilt::bundle::find_bundle;
    use prebuilt::cache::ArtifactCache;
    use prebuilt::coverage::bundle_coverage as coverage;
    use prebuilt::device::{DeviceQuery, DriverVersion};
    use prebuilt::fetch::{prefetch, Prefetched, StoreOptions};
    use prebuilt::index::ArtifactLocation;
    use release::publish::{publish, PublishOptions, Published, ShipFilter};
    use std::time::Duration;

    /// A device of `capability` with a CUDA 13.0 driver and runtime, any torch.
    fn cuda_13_0_device(capability: (u32, u32)) -> DeviceQuery {
        DeviceQuery {
            capability,
            driver: DriverVersion {
                major: 13,
                minor: 0,
            },
            cuda: "cu130".parse().unwrap(),
            torch: None,
        }
    }

    /// The server `.ci/run` starts, under a path prefix of this run's own; `None` (skipped)
    /// without one.
    fn test_store(test: &str) -> Option<String> {
        match std::env::var("KWHEEL_TEST_STORE") {
            Ok(url) if !url.is_empty() => {
                let nanos = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos();
                Some(format!("{url}/{test}-{}-{nanos}", std::process::id()))
            }
            _ if std::env::var("KWHEEL_REQUIRE_STORE").as_deref() == Ok("1") => {
                panic!("KWHEEL_REQUIRE_STORE=1 but KWHEEL_TEST_STORE names no server")
            }
            _ => {
                skipped("KWHEEL_TEST_STORE names no server (`.ci/run` starts one)");
                None
            }
        }
    }

    fn quick() -> StoreOptions {
        StoreOptions {
            connect_timeout: Duration::from_millis(500),
            timeout: Duration::from_secs(2),
            attempts: 2,
            backoff: Duration::from_millis(10),
            token: None,
        }
    }

    fn slim_wheel(shared: &Shared, name: &str, ship: &str, store: &str) -> BuiltWheel {
        build_library_wheel(&LibraryWheelOptions {
            ship: Some(ship.parse().unwrap()),
            store: Some(store.to_owned()),
            ..options(
                &default_manifest(),
                &shared.bundle,
                &shared.root.join(name),
                &shared.cache,
            )
        })
        .unwrap_or_else(|error| panic!("{}", chain(&error)))
    }

    /// Unzips `wheel` into `site` as pip would (enough for a package with no scripts).
    fn install(wheel: &Path, site: &Path) {
        let bytes = std::fs::read(wheel).unwrap();
        for (name, data) in entries(&bytes) {
            let path = site.join(&name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, data).unwrap();
        }
    }

    #[test]
    fn a_slim_wheel_ships_only_its_filter_and_lists_everything() {
        let Some(shared) = shared() else { return };
        let built = slim_wheel(
            shared,
            "wheels-slim",
            "sm_90a",
            "https://cache.example.com/",
        );
        let bytes = std::fs::read(&built.path).unwrap();
        let names: Vec<String> = entries(&bytes).into_iter().map(|(n, _)| n).collect();
        let index: prebuilt::Index =
            serde_json::from_str(&entry(&bytes, "af3_kernels/_prebuilt/index.json")).unwrap();
        // A store needs format 2 at least; family dictionaries make it 3.
        assert!(index.format >= prebuilt::index::STORE_INDEX_FORMAT);
        assert_eq!(index.format, index.required_format());
        assert_eq!(index.store.as_deref(), Some("https://cache.example.com"));
        let full = prebuilt::Bundle::open(&shared.bundle).unwrap();
        let mut remote = 0;
        for (kernel, record) in &index.kernels {
            assert_eq!(
                record,
                &full.index().kernels[kernel],
                "every variant listed"
            );
            for variant in &record.variants {
                let path = format!("af3_kernels/_prebuilt/{}", variant.artifact.path);
                let shipped = names.contains(&path);
                assert_eq!(shipped, variant.arch.to_string() == "sm_90a", "{path}");
                remote += usize::from(!shipped);
            }
        }
        assert_eq!(
            remote, 36,
            "6 kernels × 2 builds have sm_100a, sm_100f and compute_90"
        );
        assert_eq!(built.report.bundles[0].remote, 36);
        assert_eq!(built.report.bundles[0].variants, 14);
        assert!(built.size < shared.built.size);
        // The bundle on disk is unchanged: no store, and the format its artifacts need.
        assert_eq!(full.index().format, full.index().required_format());
        assert!(!std::fs::read_to_string(shared.bundle.join("index.json"))
            .unwrap()
            .contains("\"store\""));

        let error = build_library_wheel(&LibraryWheelOptions {
            ship: Some("sm_90a".parse().unwrap()),
            ..options(
                &default_manifest(),
                &shared.bundle,
                &shared.root.join("wheels-no-store"),
                &shared.cache,
            )
        })
        .unwrap_err();
        assert!(
            matches!(error, Error::NoStore { left_out: 36, .. }),
            "{error}"
        );
        assert!(error.to_string().contains("--store <url>"), "{error}");
        let error = build_library_wheel(&LibraryWheelOptions {
            ship: Some("cu128:sm_90a".parse().unwrap()),
            store: Some("https://cache.example.com".into()),
            ..options(
                &default_manifest(),
                &shared.bundle,
                &shared.root.join("wheels-typo"),
                &shared.cache,
            )
        })
        .unwrap_err();
        assert!(
            error.to_string().starts_with(
                "invalid --ship filter `cu128:sm_90a`: `cu128:sm_90a`: no variant of the bundle \
                 matches it (it has cu129:compute_90, cu129:sm_100a, cu129:sm_100f, cu129:sm_90a,"
            ),
            "{error}"
        );
        assert!("cu130:".parse::<ShipFilter>().is_err());
    }

    /// The issue's acceptance run: a slim wheel holding only sm_90a, installed; the full
    /// bundle published to the loopback server; a prefetch for sm_100 brings the sm_100a
    /// variants, verified, into the cache; selection for sm_100 then reports them local.
    #[test]
    fn publish_then_prefetch_for_another_device_makes_its_variants_local() {
        let Some(shared) = shared() else { return };
        let Some(store) = test_store("publish") else {
            return;
        };
        let built = slim_wheel(shared, "wheels-published", "sm_90a", &store);

        let options = PublishOptions {
            bundles: vec![shared.bundle.clone()],
            wheels: vec![built.path.clone(), built.path.clone()],
            client: quick(),
            ..PublishOptions::new(&store)
        };
        let report = publish(&options).unwrap();
        // 50 variants; the wheel once, though named twice.
        let cubins = report.objects.len() - 1;
        assert!(cubins > 0 && cubins <= 50, "{report}");
        assert_eq!(report.uploaded(), report.objects.len(), "{report}");
        assert!(report.to_string().contains("all verified by download"));
        let again = publish(&options).unwrap();
        assert!(again
            .objects
            .iter()
            .all(|object| object.outcome == Published::AlreadyThere));

        let site = scratch("distribution-site");
        install(&built.path, &site);
        let bundle_dir = find_bundle(site.join("af3_kernels").to_str().unwrap()).unwrap();
        let bundle = prebuilt::Bundle::open(&bundle_dir).unwrap();
        let cache = ArtifactCache::new(site.join("artifact-cache"));
        let b200 = cuda_13_0_device((10, 0));
        let before = coverage(&bundle, &b200, &cache);
        assert!(before.to_string().contains("remote"), "{before}");

        let prefetched = prefetch(&bundle, &b200, &cache, &quick()).unwrap();
        assert!(prefetched.complete(), "{prefetched}");
        let fetched = prefetched
            .kernels
            .values()
            .filter(|outcome| matches!(outcome, Prefetched::Fetched { .. }))
            .count();
        // Every kernel but wgmma (sm_90a only) has an sm_100a cubin in the store.
        assert_eq!(fetched, 6, "{prefetched}");
        assert!(matches!(
            prefetched.kernels["wgmma_matmul_bf16"],
            Prefetched::NothingFits { .. }
        ));

        let after = coverage(&bundle, &b200, &cache);
        for (name, kernel) in &after.kernels {
            match &kernel.loads {
                Some(label) => {
                    assert_eq!(label, "cu130/sm_100a", "{name}");
                    assert_eq!(kernel.location, Some(ArtifactLocation::Cache), "{name}");
                }
                None => assert_eq!(name, "wgmma_matmul_bf16"),
            }
        }
        // What was cached is what the index names, byte for byte.
        for (name, record) in &bundle.index().kernels {
            for variant in record
                .variants
                .iter()
                .filter(|v| v.label() == "cu130/sm_100a")
            {
                let cached =
                    std::fs::read(cache.entry_path(&variant.artifact.digest).unwrap()).unwrap();
                let full = prebuilt::Bundle::open(&shared.bundle).unwrap();
                assert_eq!(cached, full.read_artifact(name, variant).unwrap(), "{name}");
            }
        }
    }

    /// `cargo test --release -p release --test run bench_first_call -- --ignored --nocapture`
    /// with `KWHEEL_TEST_STORE` set: the CPU side of a first call, per kernel, for the
    /// cu130/sm_90a variant — from the wheel (select, read, decompress, verify) against a
    /// lazy fetch from the loopback store (select, GET, verify, write to the cache) and the
    /// next process's read from the cache (select, read, verify). Medians of 25.
    #[test]
    #[ignore = "a benchmark: run it by name with --ignored"]
    fn bench_first_call_fetch_vs_wheel() {
        use prebuilt::fetch::{obtain_remote, StoreHandle};
        use prebuilt::select::select_variant;
        use std::time::Instant;
        let Some(shared) = shared() else { return };
        let Some(store) = test_store("bench") else {
            return;
        };
        let built = slim_wheel(shared, "wheels-bench", "sm_100a", &store);
        publish(&PublishOptions {
            bundles: vec![shared.bundle.clone()],
            client: quick(),
            ..PublishOptions::new(&store)
        })
        .unwrap();
        let site = scratch("bench-site");
        install(&built.path, &site);
        let slim = site.join("af3_kernels/_prebuilt");
        let h200 = cuda_13_0_device((9, 0));
        let median = |mut times: Vec<f64>| {
            times.sort_by(f64::total_cmp);
            times[times.len() / 2]
        };
        println!(
            "| kernel | cubin | from the wheel | lazy fetch: client setup | GET + verify + \
             cache write | from the cache |"
        );
        println!("| --- | ---: | ---: | ---: | ---: | ---: |");
        let kernels: Vec<String> = prebuilt::Bundle::open(&shared.bundle)
            .unwrap()
            .index()
            .kernels
            .keys()
            .cloned()
            .collect();
        for name in &kernels {
            let (mut wheel, mut setup, mut fetch, mut cached) =
                (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            let mut size = 0;
            for run in 0..25 {
                let started = Instant::now();
                let bundle = prebuilt::Bundle::open(&shared.bundle).unwrap();
                let record = &bundle.index().kernels[name];
                let choice = select_variant(name, record, &h200).unwrap();
                let cubin = bundle.read_artifact(name, choice.variant).unwrap();
                wheel.push(started.elapsed().as_secs_f64() * 1e3);
                size = cubin.len();

                let cache = ArtifactCache::new(site.join(format!("cache-{name}-{run}")));
                let started = Instant::now();
                let handle = StoreHandle::connect(&store, &quick()).unwrap();
                setup.push(started.elapsed().as_secs_f64() * 1e3);
                let started = Instant::now();
                let bundle = prebuilt::Bundle::open(&slim).unwrap();
                let record = &bundle.index().kernels[name];
                let choice = select_variant(name, record, &h200).unwrap();
                let connect = || Ok(handle.clone());
                let (fetched, _) = obtain_remote(
                    bundle.root(),
                    bundle.index().store.as_deref(),
                    name,
                    choice.variant,
                    &cache,
                    &connect,
                )
                .unwrap();
                fetch.push(started.elapsed().as_secs_f64() * 1e3);
                assert_eq!(fetched, cubin);

                let started = Instant::now();
                let bundle = prebuilt::Bundle::open(&slim).unwrap();
                let record = &bundle.index().kernels[name];
                let choice = select_variant(name, record, &h200).unwrap();
                let again = cache.read(&choice.variant.artifact).unwrap();
                cached.push(started.elapsed().as_secs_f64() * 1e3);
                assert_eq!(again, cubin);
            }
            println!(
                "| `{name}` | {:.1} KiB | {:.3} ms | {:.3} ms | {:.3} ms | {:.3} ms |",
                size as f64 / 1024.0,
                median(wheel),
                median(setup),
                median(fetch),
                median(cached)
            );
        }
    }

    #[test]
    fn publishing_names_the_object_and_url_that_failed() {
        let Some(shared) = shared() else { return };
        let store = LoopbackStore::start();
        let options = PublishOptions {
            bundles: vec![shared.bundle.clone()],
            client: quick(),
            ..PublishOptions::new(store.url())
        };
        store.fail_always(Some(Fault::Status(500)));
        let error = publish(&options).unwrap_err().to_string();
        assert!(error.starts_with("cannot publish `"), "{error}");
        assert!(error.contains(&format!("{}/cas/", store.url())), "{error}");
        assert!(error.contains("answered 500 (2 attempts)"), "{error}");

        // Stored bytes that come back different are not "published".
        store.fail_always(None);
        // HEAD and PUT answered normally (a zero wait), then the read-back is wrong.
        let normally = Fault::Slow(Duration::ZERO);
        store.fail_next([normally.clone(), normally, Fault::WrongBytes]);
        let error = publish(&options).unwrap_err().to_string();
        assert!(error.contains("failed verification"), "{error}");
    }
}

// ---------------------------------------------------------------------------------------------
// Building from source: the sdist and the recipes-only wheel the build backend ships

mod from_source {
    use super::*;
    use release::library::RECIPES_ONLY_REASON;
    use release::{build_sdist, verify_sdist, SdistOptions};

    fn sdist_of(manifest: &Path, out: &Path) -> release::sdist::Sdist {
        build_sdist(&SdistOptions {
            manifest: manifest.to_owned(),
            out: out.to_owned(),
        })
        .unwrap_or_else(|error| panic!("the sdist builds: {}", chain(&error)))
    }

    #[test]
    fn the_sdist_holds_what_the_backend_needs_and_builds_to_identical_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let manifest = copy_library(dir.path());
        let sdist = sdist_of(&manifest, &dir.path().join("one"));
        assert_eq!(
            sdist.path.file_name().unwrap(),
            "af3_kernels-0.1.0.tar.gz",
            "PEP 625: normalized name"
        );
        for expected in [
            "PKG-INFO",
            "pyproject.toml",
            "kernels.toml",
            "include/af3/common.cuh",
            "layernorm/layernorm.cu",
            "python/af3_kernels/__init__.py",
        ] {
            assert!(
                sdist.files.iter().any(|file| file == expected),
                "{expected} in {:?}",
                sdist.files
            );
        }
        assert!(
            !sdist
                .files
                .iter()
                .any(|file| file.starts_with("python/tests/")),
            "only the manifest's Python package: {:?}",
            sdist.files
        );
        let manifest_kernels = bundler::Manifest::load(&manifest).unwrap().kernels.len();
        assert_eq!(sdist.kernels, manifest_kernels);
        let bytes = std::fs::read(&sdist.path).unwrap();
        // Another checkout, another time: the same bytes.
        let other = tempfile::tempdir().unwrap();
        let again = sdist_of(&copy_library(other.path()), &other.path().join("two"));
        assert_eq!(std::fs::read(&again.path).unwrap(), bytes);

        let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(bytes.as_slice()));
        let mut names = Vec::new();
        for entry in archive.entries().unwrap() {
            let entry = entry.unwrap();
            let header = entry.header();
            assert_eq!(
                header.mtime().unwrap(),
                315_532_800,
                "SOURCE_DATE_EPOCH default"
            );
            assert_eq!((header.uid().unwrap(), header.gid().unwrap()), (0, 0));
            assert_eq!(header.mode().unwrap(), 0o644);
            names.push(entry.path().unwrap().to_string_lossy().into_owned());
        }
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted, "entries are sorted");
        assert!(names.iter().all(|n| n.starts_with("af3_kernels-0.1.0/")));
        let pkg_info = entry_of(&bytes, "af3_kernels-0.1.0/PKG-INFO");
        assert!(
            pkg_info.starts_with("Metadata-Version: 2.1\nName: af3-kernels\nVersion: 0.1.0\n")
                && pkg_info.contains("Requires-Dist: kwheel>=0.1.0,<0.2\n"),
            "{pkg_info}"
        );
    }

    fn entry_of(bytes: &[u8], name: &str) -> String {
        let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(bytes));
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            if entry.path().unwrap().to_string_lossy() == name {
                let mut text = String::new();
                entry.read_to_string(&mut text).unwrap();
                return text;
            }
        }
        panic!("no {name}")
    }

    /// Writes `name` as a gzipped tar of `files` (path, bytes), as another tool might.
    fn handmade(dir: &Path, name: &str, files: &[(&str, &[u8])]) -> PathBuf {
        let path = dir.join(name);
        let gzip = flate2::write::GzEncoder::new(
            std::fs::File::create(&path).unwrap(),
            flate2::Compression::fast(),
        );
        let mut builder = tar::Builder::new(gzip);
        for (file, bytes) in files {
            let mut header = tar::Header::new_gnu();
            header.set_size(bytes.len() as u64);
            header.set_mode(0o644);
            header.set_cksum();
            builder.append_data(&mut header, file, *bytes).unwrap();
        }
        builder.into_inner().unwrap().finish().unwrap();
        path
    }

    #[test]
    fn sdist_verification_names_every_problem() {
        let dir = tempfile::tempdir().unwrap();
        let manifest = copy_library(dir.path());
        let good = sdist_of(&manifest, &dir.path().join("good"));
        let bytes = std::fs::read(&good.path).unwrap();
        let stem = "af3_kernels-0.1.0";
        let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(bytes.as_slice()));
        let mut files: Vec<(String, Vec<u8>)> = Vec::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let name = entry.path().unwrap().to_string_lossy().into_owned();
            let mut data = Vec::new();
            entry.read_to_end(&mut data).unwrap();
            files.push((name, data));
        }
        // A source the manifest's layernorm compiles is gone, PKG-INFO says another version,
        // and a file sits outside the top directory.
        let mut broken: Vec<(&str, &[u8])> = files
            .iter()
            .filter(|(name, _)| name != &format!("{stem}/layernorm/layernorm.cu"))
            .map(|(name, data)| {
                if name.ends_with("/PKG-INFO") {
                    (
                        name.as_str(),
                        b"Metadata-Version: 2.1\nName: af3-kernels\nVersion: 0.2.0\n".as_slice(),
                    )
                } else {
                    (name.as_str(), data.as_slice())
                }
            })
            .collect();
        broken.push(("stray.txt", b"x"));
        let path = handmade(dir.path(), "af3_kernels-0.1.0.tar.gz", &broken);
        let report = verify_sdist(&path).unwrap();
        let problems = report.problems.join("\n");
        assert!(
            problems.contains("`stray.txt` is outside the top directory"),
            "{problems}"
        );
        assert!(
            problems.contains("PKG-INFO has version `0.2.0`, the file name `0.1.0`"),
            "{problems}"
        );
        assert!(
            problems.contains("kernels.toml: ") && problems.contains("layernorm"),
            "the missing source is named: {problems}"
        );
        let error = report.into_result().unwrap_err().to_string();
        assert!(error.starts_with(&format!("`{}` failed verification:", path.display())));

        // A name PEP 625 does not allow, and no pyproject.toml.
        let bad = handmade(
            dir.path(),
            "AF3-Kernels-0.1.0.tar.gz",
            &[("AF3-Kernels-0.1.0/PKG-INFO", b"")],
        );
        let problems = verify_sdist(&bad).unwrap().problems.join("\n");
        assert!(
            problems.contains("is not `{name}-{version}.tar.gz` with one `-`"),
            "{problems}"
        );
        assert!(problems.contains("pyproject.toml is missing"), "{problems}");
    }

    #[test]
    fn a_library_without_a_kwheel_pyproject_gets_no_sdist() {
        let dir = tempfile::tempdir().unwrap();
        let manifest = copy_library(dir.path());
        let pyproject = manifest.parent().unwrap().join("pyproject.toml");
        std::fs::remove_file(&pyproject).unwrap();
        let options = SdistOptions {
            manifest: manifest.clone(),
            out: dir.path().join("out"),
        };
        let error = build_sdist(&options).unwrap_err().to_string();
        assert!(
            error.contains("pyproject.toml` is missing")
                && error.contains("build-backend = \"kwheel.build\""),
            "{error}"
        );
        std::fs::write(
            &pyproject,
            "[build-system]\nbuild-backend = \"setuptools.build_meta\"\n",
        )
        .unwrap();
        let error = build_sdist(&options).unwrap_err().to_string();
        assert!(
            error.contains("names build backend `setuptools.build_meta`, not `kwheel.build`"),
            "{error}"
        );
        assert!(!dir.path().join("out/af3_kernels-0.1.0.tar.gz").exists());
    }

    #[test]
    fn the_recipes_only_wheel_ships_sources_and_recipes_and_no_cubin() {
        let dir = tempfile::tempdir().unwrap();
        let manifest = copy_library(dir.path());
        let built = build_library_wheel(&LibraryWheelOptions {
            out: dir.path().join("wheels"),
            recipes_only: true,
            // No toolchain: nothing is compiled or checked against a compiler.
            toolchains: Some(Vec::new()),
            ..LibraryWheelOptions::new(&manifest)
        })
        .unwrap_or_else(|error| panic!("{}", chain(&error)));
        assert_eq!(built.filename.to_string(), WHEEL_NAME);
        let bytes = std::fs::read(&built.path).unwrap();
        let index: prebuilt::Index =
            serde_json::from_str(&entry(&bytes, "af3_kernels/_prebuilt/index.json")).unwrap();
        let planned = bundler::Manifest::load(&manifest).unwrap();
        assert_eq!(index.kernels.len(), planned.kernels.len());
        let names: Vec<String> = entries(&bytes).into_iter().map(|(name, _)| name).collect();
        for (name, record) in &index.kernels {
            assert!(record.variants.is_empty(), "{name}");
            let recipe = record.recipe.as_ref().unwrap();
            assert!(names.contains(&format!("af3_kernels/_prebuilt/sources/{}", recipe.source)));
            for file in record.inputs.files.keys() {
                assert!(
                    names.contains(&format!("af3_kernels/_prebuilt/sources/{file}")),
                    "{file}"
                );
            }
            let targets = planned.library.archs.len() * planned.library.cuda_builds.len();
            assert_eq!(record.skipped.len(), targets, "{name}: every target listed");
            for skip in &record.skipped {
                assert!(
                    skip.reason == RECIPES_ONLY_REASON || skip.reason.starts_with("declared"),
                    "{name}: {skip:?}"
                );
            }
        }
        assert!(!names.iter().any(|name| name.contains("/artifacts/")));
        let report = verify_wheel(&built.path).unwrap().into_result().unwrap();
        assert_eq!(report.cubins, 0);
    }
}
