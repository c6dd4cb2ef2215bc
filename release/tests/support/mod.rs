//! What the areas of this binary share: the default library's wheel, built once, its
//! entries, the skips and the scratch space.

use super::*;

pub(crate) use testkit::{default_manifest, skipped, toolchains, workspace};

/// Skips (returns `false`) with the reason, or fails under `KWHEEL_REQUIRE_TOOLCHAINS=1`.
pub(crate) fn skip(reason: &str) -> bool {
    testkit::missing(reason)
}

/// A fresh directory under the target's scratch space, removed first if an earlier run left it.
pub(crate) fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("release-run")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub(crate) fn options(
    manifest: &Path,
    bundle: &Path,
    out: &Path,
    cache: &Path,
) -> LibraryWheelOptions {
    LibraryWheelOptions {
        bundle: bundle.to_owned(),
        out: out.to_owned(),
        cache_dir: cache.to_owned(),
        jobs: 2,
        progress: None,
        toolchains: toolchains(),
        ..LibraryWheelOptions::new(manifest)
    }
}

/// One cold build of the default library's wheel (bundling first, as no bundle exists yet),
/// shared by the tests that only read it.
pub(crate) struct Shared {
    pub(crate) root: PathBuf,
    pub(crate) cache: PathBuf,
    pub(crate) bundle: PathBuf,
    pub(crate) built: BuiltWheel,
    pub(crate) bytes: Vec<u8>,
}

pub(crate) fn shared() -> Option<&'static Shared> {
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

/// The default library less its extension module, copied to `<root>/library`: its manifest.
/// For tests of what a module would get in the way of (a torch-free pin, parts small enough
/// that a main wheel with modules would not fit).
pub(crate) fn library_without_module(root: &Path) -> PathBuf {
    let library = root.join("library");
    testkit::copy_tree(&workspace().join("kernels"), &library, &["target"]);
    let manifest = library.join("kernels.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let cut = text
        .find("\n[extensions._C]")
        .expect("the default library has a module");
    std::fs::write(&manifest, &text[..cut]).unwrap();
    manifest
}

/// Everything a command printed, stdout first.
pub(crate) fn output_text(output: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Asserts that a command succeeded, showing its stderr where it did not.
pub(crate) fn assert_succeeded(output: &std::process::Output) {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// An error and its causes, one per line.
pub(crate) use testkit::error_chain as chain;

/// Every entry of a zip: (name, bytes), in archive order.
pub(crate) fn entries(bytes: &[u8]) -> Vec<(String, Vec<u8>)> {
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

/// A relative name that climbs with `..` past any folder it is joined to, into
/// `outside/climbed`: for an entry of a hostile wheel.
pub(crate) fn climbing_out_into(outside: &Path) -> String {
    format!(
        "{}{}",
        "../".repeat(40),
        outside
            .join("climbed")
            .display()
            .to_string()
            .trim_start_matches('/')
    )
}

/// Writes `files` as a wheel at `path` with a RECORD that matches them (`record_name`, last),
/// as a tool that rewrites a wheel would: `.zst` and `.zdict` entries stored, the rest
/// deflated.
pub(crate) fn write_with_record(path: &Path, files: &[(String, Vec<u8>)], record_name: &str) {
    let mut record = String::new();
    for (name, data) in files {
        record.push_str(&format!("{name},{},{}\n", record_hash(data), data.len()));
    }
    record.push_str(&format!("{record_name},,\n"));
    let record = (record_name.to_owned(), record.into_bytes());
    write_entries(path, files.iter().chain([&record]));
}

/// Writes `files` as a zip at `path`, in the order given, the way a zip tool rewrites a wheel:
/// `.zst` and `.zdict` entries stored, the rest deflated; nothing checked or added.
pub(crate) fn write_entries<'f>(
    path: &Path,
    files: impl IntoIterator<Item = &'f (String, Vec<u8>)>,
) {
    let mut writer = zip::ZipWriter::new(std::fs::File::create(path).unwrap());
    for (name, data) in files {
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
}

/// The messages of a verify report's problems with `file`.
pub(crate) fn problems_about<'r>(report: &'r release::VerifyReport, file: &str) -> Vec<&'r str> {
    report
        .problems
        .iter()
        .filter(|problem| problem.file == file)
        .map(|problem| problem.message.as_str())
        .collect()
}

/// `pip install --no-deps --no-index --target <target> <wheel>`, offline; fails the test,
/// with what pip printed, where pip fails.
pub(crate) fn pip_install_into(python: &str, wheel: &Path, target: &Path) {
    let output = Command::new(python)
        .args([
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            "--no-compile",
            "--disable-pip-version-check",
            "--target",
        ])
        .arg(target)
        .arg(wheel)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "pip install `{}` failed:\n{}",
        wheel.display(),
        output_text(&output)
    );
}

pub(crate) fn entry(bytes: &[u8], name: &str) -> String {
    let (_, data) = entries(bytes)
        .into_iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no `{name}` in the wheel"));
    String::from_utf8(data).unwrap()
}

/// The whole index of the default library's wheel `bytes`, decoded from the loader index it
/// ships (`kernels.idx`; wheels carry no `index.json`).
pub(crate) fn wheel_index(bytes: &[u8]) -> prebuilt::Index {
    let lookup = "af3_kernels/_prebuilt/kernels.idx";
    let (_, data) = entries(bytes)
        .into_iter()
        .find(|(n, _)| n == lookup)
        .unwrap_or_else(|| panic!("no `{lookup}` in the wheel"));
    prebuilt::lookup::Lookup::from_bytes(Path::new(lookup), data)
        .unwrap()
        .index()
        .unwrap()
}

pub(crate) fn python() -> Option<&'static str> {
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

/// Copies the embedded library (sources, manifest, Python package; not the Rust references);
/// returns the copy's manifest.
pub(crate) fn copy_library(dir: &Path) -> PathBuf {
    testkit::copy_library(dir, testkit::NOT_SOURCES).join("kernels.toml")
}

pub(crate) fn append(path: &Path, text: &str) {
    let mut file = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    file.write_all(text.as_bytes()).unwrap();
}
