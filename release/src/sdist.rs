//! A kernel library's source distribution: what `pip install <sdist>` builds through kwheel's
//! PEP 517 backend (`kwheel.build`) into a wheel that JIT-compiles on first load.
//!
//! ```text
//! kernels/kernels.toml, pyproject.toml ─┐
//! include graph of every kernel        ─┼─► af3_kernels-0.1.0.tar.gz (PEP 625)
//! python/af3_kernels/                  ─┘   └── af3_kernels-0.1.0/
//!                                               ├── PKG-INFO           name, version, requirements
//!                                               ├── pyproject.toml     build-backend = "kwheel.build"
//!                                               ├── kernels.toml
//!                                               ├── include/…, layernorm/…   every file a kernel includes
//!                                               └── python/af3_kernels/…
//! ```
//!
//! | rule | why |
//! | --- | --- |
//! | name `{normalized name}-{version}.tar.gz`, one top directory of the same stem | PEP 625, so installers find name and version without unpacking |
//! | files: the manifest, `pyproject.toml`, `README*`/`LICENSE*` beside them, every file of every kernel's include graph under the manifest's directory, precompiled cubins, the Python package | what the backend needs to build the wheel again, nothing else (no `target/`, no caches) |
//! | a header reached only through an include dir outside the manifest's directory is refused | it would have no path inside the sdist |
//! | entries sorted, mode 0644 (0755 when executable), uid/gid 0, no user names, mtime `SOURCE_DATE_EPOCH` (default 1980-01-01), gzip without name or time | the same sources give the same bytes |
//! | `pyproject.toml` must name `kwheel.build` | otherwise pip would build it with something that knows no bundle |
//!
//! [`verify_sdist`] checks the name, the layout, `PKG-INFO`, `pyproject.toml`, and that the
//! manifest inside plans every kernel from the files inside, none outside them. It opens only
//! a regular file (not a link, FIFO or device) and reads it with [`read_archive`]: one gzip
//! member holding one tar stream, every entry under one name pip's `untar_file` would give it
//! too, streamed under caps (see the `archive` module), files unpacked to a scratch folder as
//! they come.
//!
//! Building from source (this sdist, or a recipes-only wheel) ships only files under the
//! manifest's directory: a manifest path or a file that resolves outside it, through `..`,
//! an absolute path or a symbolic link, is refused naming the manifest key
//! ([`crate::Error::OutsideRoot`]). Modes are normalised as pip-built wheels do: 0644, 0755
//! for a file its owner may execute; the sdist itself is written 0644.

use prebuilt::untrusted::Unreadable;
use std::collections::BTreeMap;
use std::fmt;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use bundler::pipeline::plan_kernel;
use bundler::Manifest;
use flate2::{Compression, GzBuilder};
use prebuilt::cache::PendingFile;

use crate::library::{
    check_file_inside, check_inside_root, kwheel_requirement, python_package_dir, summary,
    torch_requirement,
};
use crate::wheel::{
    normalize_name, parse_headers, set_readable, source_date_epoch, Metadata, DEFAULT_EPOCH,
    KWHEEL_VERSION,
};
use crate::Error;

mod archive;

pub use archive::{
    read_archive, ArchiveEntry, EntryKind, MAX_SDIST_CONTENT, MAX_SDIST_ENTRIES, MAX_SDIST_ENTRY,
    MAX_SDIST_RATIO, MAX_SDIST_SIZE, RATIO_FLOOR,
};

/// The build backend an sdist's `pyproject.toml` must name.
pub const BUILD_BACKEND: &str = "kwheel.build";

/// The project file every sdist carries.
pub const PYPROJECT: &str = "pyproject.toml";

/// What [`build_sdist`] writes.
#[derive(Clone, Debug)]
pub struct SdistOptions {
    /// The kernel manifest; its directory is the sdist's root.
    pub manifest: PathBuf,
    /// The directory the sdist is written to.
    pub out: PathBuf,
}

/// An sdist that [`build_sdist`] wrote, or that [`verify_sdist`] read.
#[derive(Clone, Debug)]
pub struct Sdist {
    /// The file.
    pub path: PathBuf,
    /// The distribution name, normalized (`af3_kernels`).
    pub name: String,
    /// The version.
    pub version: String,
    /// Files inside, by path under the top directory, `PKG-INFO` included.
    pub files: Vec<String>,
    /// Kernels the manifest inside plans from the files inside (after verification).
    pub kernels: usize,
    /// The file's size in bytes.
    pub size: u64,
    /// What is wrong with it; empty when it passes.
    pub problems: Vec<String>,
}

impl Sdist {
    /// The sdist, or [`Error::SdistVerification`] listing every problem.
    pub fn into_result(self) -> Result<Sdist, Error> {
        if self.problems.is_empty() {
            Ok(self)
        } else {
            Err(Error::SdistVerification {
                sdist: self.path,
                problems: self.problems,
            })
        }
    }
}

impl fmt::Display for Sdist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{}: {} {}, {} files, {} kernels planned from its sources",
            self.path.display(),
            self.name,
            self.version,
            self.files.len(),
            self.kernels
        )?;
        if self.problems.is_empty() {
            writeln!(f, "ok")
        } else {
            for problem in &self.problems {
                writeln!(f, "  problem: {problem}")?;
            }
            Ok(())
        }
    }
}

/// Writes the library's sdist (see the module docs), verifies it (removing it again if it
/// fails) and describes it.
pub fn build_sdist(options: &SdistOptions) -> Result<Sdist, Error> {
    let manifest = Manifest::load(&options.manifest)?;
    let root = manifest.root.clone();
    let refuse = |reason: String| Error::Sdist {
        path: options.manifest.clone(),
        reason,
    };
    let pyproject = root.join(PYPROJECT);
    let text = std::fs::read_to_string(&pyproject).map_err(|_| {
        refuse(format!(
            "`{}` is missing: an sdist needs one that names kwheel's build backend, such as\n\n\
             [build-system]\nrequires = [\"{}\"]\nbuild-backend = \"{BUILD_BACKEND}\"",
            pyproject.display(),
            kwheel_requirement(KWHEEL_VERSION)
        ))
    })?;
    if let Err(reason) = check_pyproject(&text) {
        return Err(refuse(format!("`{}` {reason}", pyproject.display())));
    }

    check_inside_root(&manifest)?;
    let mut files: BTreeMap<String, PathBuf> = BTreeMap::new();
    let manifest_name = relative_name(&root, &manifest.path)
        .ok_or_else(|| refuse("the manifest's file name is not valid UTF-8".to_owned()))?;
    files.insert(manifest_name, manifest.path.clone());
    files.insert(PYPROJECT.to_owned(), pyproject);
    for entry in std::fs::read_dir(&root).map_err(|source| {
        Error::Read(Unreadable {
            path: root.clone(),
            source,
        })
    })? {
        let entry = entry.map_err(|source| {
            Error::Read(Unreadable {
                path: root.clone(),
                source,
            })
        })?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let upper = name.to_ascii_uppercase();
        if entry.path().is_file() && (upper.starts_with("README") || upper.starts_with("LICENSE")) {
            files.insert(name, entry.path());
        }
    }
    for (name, spec) in &manifest.kernels {
        let planned = plan_kernel(&manifest, name, spec, &[])?;
        if let Some(graph) = &planned.graph {
            for stable in graph.files().keys() {
                if stable.starts_with('[') {
                    return Err(refuse(format!(
                        "kernel `{name}` includes `{stable}` through an include dir outside \
                         `{}`, which an sdist cannot hold: move the headers under the \
                         manifest's directory",
                        root.display()
                    )));
                }
                if let Some(path) = graph.absolute_path(stable) {
                    files.insert(stable.clone(), path.to_owned());
                }
            }
        }
        for cubin in &spec.cubins {
            files.insert(cubin.path.clone(), root.join(&cubin.path));
        }
    }
    let package_dir = python_package_dir(&manifest)?;
    let package = relative_name(&root, &package_dir).ok_or_else(|| {
        refuse(format!(
            "the Python package `{}` is not under the manifest's directory",
            package_dir.display()
        ))
    })?;
    let keep = |name: &str| {
        !(name.starts_with('.')
            || name == "__pycache__"
            || name.ends_with(".pyc")
            || name.ends_with(".pyo"))
    };
    for (relative, path) in crate::tree::files_under(&package_dir, keep)? {
        files.insert(format!("{package}/{relative}"), path);
    }

    let library = &manifest.library;
    let name = normalize_name(&library.package);
    let stem = format!("{name}-{}", library.version);
    let metadata = Metadata {
        name: library.package.clone(),
        version: library.version.clone(),
        summary: Some(
            summary(&package_dir)
                .unwrap_or_else(|| format!("Prebuilt CUDA kernels of {}", library.package)),
        ),
        requires_python: Some(crate::library::REQUIRES_PYTHON.to_owned()),
        requires_dist: [kwheel_requirement(KWHEEL_VERSION)]
            .into_iter()
            .chain(torch_requirement(&library.torch)?)
            .collect(),
    };
    // Every file, after symbolic links, must lie under the root: an sdist ships nothing else.
    for (relative, path) in &files {
        check_file_inside(&manifest, "files of the sdist", relative, path)?;
    }
    let mut entries: BTreeMap<String, (Vec<u8>, bool)> = BTreeMap::new();
    entries.insert(
        "PKG-INFO".to_owned(),
        (metadata.to_text().into_bytes(), false),
    );
    for (relative, path) in &files {
        let bytes = std::fs::read(path).map_err(|source| {
            Error::Read(Unreadable {
                path: path.clone(),
                source,
            })
        })?;
        entries.insert(relative.clone(), (bytes, is_executable(path)));
    }

    let mtime = source_date_epoch()?.unwrap_or(DEFAULT_EPOCH);
    let bytes = archive(&stem, &entries, mtime).map_err(|source| Error::Write {
        path: options.out.join(format!("{stem}.tar.gz")),
        source,
    })?;
    std::fs::create_dir_all(&options.out).map_err(|source| Error::Write {
        path: options.out.clone(),
        source,
    })?;
    let target = options.out.join(format!("{stem}.tar.gz"));
    let mut temp = PendingFile::new(&target).map_err(|source| Error::Write {
        path: options.out.clone(),
        source,
    })?;
    temp.write_all(&bytes).map_err(|source| Error::Write {
        path: target.clone(),
        source,
    })?;
    // A temp file is created 0600; an sdist is for others to read.
    set_readable(temp.path()).map_err(|source| Error::Write {
        path: target.clone(),
        source,
    })?;
    temp.persist().map_err(|source| Error::Write {
        path: target.clone(),
        source,
    })?;
    match verify_sdist(&target).and_then(Sdist::into_result) {
        Ok(sdist) => Ok(sdist),
        Err(error) => {
            let _ = std::fs::remove_file(&target);
            Err(error)
        }
    }
}

/// Opens the sdist at `path` only if it is a regular file itself: a symbolic link, a FIFO
/// (whose open would block) or a device (`/dev/zero`, endless) is refused before any read.
fn open_sdist(path: &Path) -> Result<std::fs::File, Error> {
    let refuse = |reason: &str| {
        Error::Read(Unreadable {
            path: path.to_owned(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, reason.to_owned()),
        })
    };
    let metadata = std::fs::symlink_metadata(path).map_err(|source| {
        Error::Read(Unreadable {
            path: path.to_owned(),
            source,
        })
    })?;
    if metadata.file_type().is_symlink() {
        return Err(refuse(
            "is a symbolic link: give the sdist itself, not a link to it",
        ));
    }
    prebuilt::untrusted::open_regular_file(path).map_err(|source| {
        Error::Read(Unreadable {
            path: path.to_owned(),
            source,
        })
    })
}

/// Whether a `pyproject.toml` names kwheel's backend; the reason when it does not.
fn check_pyproject(text: &str) -> Result<(), String> {
    let value: toml::Value =
        toml::from_str(text).map_err(|error| format!("is not valid TOML: {error}"))?;
    let backend = value
        .get("build-system")
        .and_then(|system| system.get("build-backend"))
        .and_then(toml::Value::as_str);
    match backend {
        Some(BUILD_BACKEND) => Ok(()),
        Some(other) => Err(format!(
            "names build backend `{other}`, not `{BUILD_BACKEND}`, which builds kernel wheels"
        )),
        None => Err(format!(
            "has no `build-system.build-backend`: set it to `{BUILD_BACKEND}`"
        )),
    }
}

/// `path` relative to `root`, with `/`, when it lies under it.
fn relative_name(root: &Path, path: &Path) -> Option<String> {
    let root = root.canonicalize().unwrap_or_else(|_| root.to_owned());
    let path = path.canonicalize().unwrap_or_else(|_| path.to_owned());
    let relative = path.strip_prefix(&root).ok()?;
    let parts: Option<Vec<&str>> = relative
        .components()
        .map(|c| c.as_os_str().to_str())
        .collect();
    let parts = parts?;
    (!parts.is_empty()).then(|| parts.join("/"))
}

#[cfg(unix)]
fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|metadata| metadata.permissions().mode() & 0o100 != 0)
}

#[cfg(not(unix))]
fn is_executable(_: &Path) -> bool {
    false
}

/// The gzipped tar of `entries` under `stem/`, deterministic (see the module docs).
fn archive(
    stem: &str,
    entries: &BTreeMap<String, (Vec<u8>, bool)>,
    mtime: u64,
) -> std::io::Result<Vec<u8>> {
    // No file name and time 0 in the gzip header; miniz_oxide at a fixed level.
    let gzip = GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), Compression::new(9));
    let mut builder = tar::Builder::new(gzip);
    builder.mode(tar::HeaderMode::Deterministic);
    for (relative, (bytes, executable)) in entries {
        let mut header = tar::Header::new_ustar();
        header.set_size(bytes.len() as u64);
        header.set_mode(if *executable { 0o755 } else { 0o644 });
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(mtime);
        header.set_entry_type(tar::EntryType::Regular);
        builder.append_data(&mut header, format!("{stem}/{relative}"), bytes.as_slice())?;
    }
    builder.into_inner()?.finish()
}

/// Re-checks an sdist: its name (PEP 625), one top directory, regular files only with safe
/// paths, `PKG-INFO` agreeing with the name, a `pyproject.toml` naming `kwheel.build`, and a
/// manifest that plans every kernel from the files inside. Problems are listed, not raised;
/// an unreadable file is an error.
pub fn verify_sdist(path: &Path) -> Result<Sdist, Error> {
    let file_name = path
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut problems = Vec::new();
    let stem = file_name.strip_suffix(".tar.gz").unwrap_or_else(|| {
        problems.push(format!("`{file_name}` does not end in `.tar.gz` (PEP 625)"));
        file_name.as_str()
    });
    let (name, version) = match stem.split_once('-') {
        Some((name, version)) if !version.contains('-') => (name.to_owned(), version.to_owned()),
        _ => {
            problems.push(format!(
                "`{file_name}` is not `{{name}}-{{version}}.tar.gz` with one `-` (PEP 625)"
            ));
            (stem.to_owned(), String::new())
        }
    };
    if normalize_name(&name) != name {
        problems.push(format!(
            "`{file_name}`: the name `{name}` is not normalized (PEP 625 wants `{}`)",
            normalize_name(&name)
        ));
    }
    let file = open_sdist(path)?;
    let size = file.metadata().map_or(0, |metadata| metadata.len());
    if size > MAX_SDIST_SIZE {
        return Err(Error::Read(Unreadable {
            path: path.to_owned(),
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{size} bytes, over the {MAX_SDIST_SIZE}-byte cap on an sdist"),
            ),
        }));
    }
    let scratch = tempfile::tempdir().map_err(|source| Error::Write {
        path: std::env::temp_dir(),
        source,
    })?;
    // The files that unpack under the top directory, written to the scratch directory as they
    // stream by; the small texts checked below are kept.
    let top = format!("{stem}/");
    let mut files = Vec::new();
    let mut contents: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut on_file = |entry: &str, data: &mut dyn std::io::Read| -> std::io::Result<()> {
        let Some(relative) = entry.strip_prefix(&top) else {
            return Ok(());
        };
        let target = scratch.path().join(relative);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let mut out = std::fs::File::create(&target)?;
        if relative == "PKG-INFO" || relative == PYPROJECT {
            let mut text = Vec::new();
            data.read_to_end(&mut text)?;
            out.write_all(&text)?;
            contents.insert(relative.to_owned(), text);
        } else {
            std::io::copy(data, &mut out)?;
        }
        files.push(relative.to_owned());
        Ok(())
    };
    match read_archive(file, &mut on_file) {
        Ok(entries) => {
            for entry in &entries {
                if entry.path != stem && !entry.path.starts_with(&top) {
                    problems.push(format!(
                        "`{}` is outside the top directory `{top}`",
                        entry.path
                    ));
                }
            }
        }
        Err(reason) => {
            problems.push(format!(
                "`{file_name}` is not one gzip member holding one tar stream that every \
                 reader unpacks alike: {reason}"
            ));
            return Ok(Sdist {
                path: path.to_owned(),
                name,
                version,
                files,
                kernels: 0,
                size,
                problems,
            });
        }
    }
    files.sort();
    match contents
        .get("PKG-INFO")
        .map(|data| String::from_utf8_lossy(data).into_owned())
    {
        None => problems.push("PKG-INFO is missing".to_owned()),
        Some(text) => {
            let headers = parse_headers(&text);
            let field = |key: &str| {
                headers
                    .iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case(key))
                    .map(|(_, value)| value.clone())
            };
            if field("Metadata-Version").is_none() {
                problems.push("PKG-INFO has no Metadata-Version".to_owned());
            }
            match field("Name") {
                Some(found) if normalize_name(&found) == normalize_name(&name) => {}
                found => problems.push(format!(
                    "PKG-INFO names `{}`, the file name `{name}`",
                    found.unwrap_or_default()
                )),
            }
            match field("Version") {
                Some(found) if found == version => {}
                found => problems.push(format!(
                    "PKG-INFO has version `{}`, the file name `{version}`",
                    found.unwrap_or_default()
                )),
            }
        }
    }
    let mut manifest_name = "kernels.toml".to_owned();
    match contents
        .get(PYPROJECT)
        .map(|data| String::from_utf8_lossy(data).into_owned())
    {
        None => problems.push(format!(
            "{PYPROJECT} is missing: pip would not know to build it with `{BUILD_BACKEND}`"
        )),
        Some(text) => {
            if let Err(reason) = check_pyproject(&text) {
                problems.push(format!("{PYPROJECT} {reason}"));
            }
            if let Some(name) = toml::from_str::<toml::Value>(&text).ok().and_then(|value| {
                value
                    .get("tool")?
                    .get("kwheel")?
                    .get("manifest")?
                    .as_str()
                    .map(str::to_owned)
            }) {
                manifest_name = name;
            }
        }
    }

    let mut kernels = 0;
    if files.contains(&manifest_name) {
        match plan_unpacked(scratch.path(), &manifest_name) {
            Ok(planned) => kernels = planned,
            Err(reason) => problems.push(format!("{manifest_name}: {reason}")),
        }
    } else {
        problems.push(format!(
            "the manifest `{manifest_name}` is missing (`[tool.kwheel] manifest` of {PYPROJECT})"
        ));
    }
    Ok(Sdist {
        path: path.to_owned(),
        name,
        version,
        files,
        kernels,
        size,
        problems,
    })
}

/// Plans every kernel of the manifest in the unpacked sdist at `scratch`: the number of
/// kernels, or why the sources inside do not build (a path the manifest names outside the
/// sdist is one such reason).
fn plan_unpacked(scratch: &Path, manifest_name: &str) -> Result<usize, String> {
    let manifest = Manifest::load(&scratch.join(manifest_name))
        .map_err(|error| error_text(&error, scratch))?;
    check_inside_root(&manifest).map_err(|error| error_text(&error, scratch))?;
    python_package_dir(&manifest).map_err(|error| error_text(&error, scratch))?;
    for (name, spec) in &manifest.kernels {
        plan_kernel(&manifest, name, spec, &[]).map_err(|error| error_text(&error, scratch))?;
    }
    Ok(manifest.kernels.len())
}

/// An error and its causes, with the scratch directory left out of paths.
fn error_text(error: &dyn std::error::Error, scratch: &Path) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(next) = cause {
        text.push_str(&format!(": {next}"));
        cause = next.source();
    }
    text.replace(&format!("{}/", scratch.display()), "")
}
