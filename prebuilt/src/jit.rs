//! The JIT fallback: compile a kernel from the bundle's shipped sources when no prebuilt cubin
//! fits, and cache the result under the user's cache directory.
//!
//! The compile is the bundler's, step for step, so a JIT cubin is the cubin the bundler would
//! have built for the same target: the same options in the same order (see [`nvrtc_options`]
//! and [`nvcc_arguments`]), the same name expressions for templated entries (nvcc's through
//! [`entry_probes_source`]), the same validation, and the same key ([`KernelKey::compute`]
//! over the index's inputs, the device's exact architecture, the runtime's CUDA build, the
//! bundle's torch pin, and the JIT compiler's kind and exact version, for nvcc with its host
//! compiler: [`nvcc_record`]). The bundler calls these same functions. The shipped sources are checked against the digests in
//! the index before anything compiles, so the key names what is really compiled.
//!
//! # Finding a compiler
//!
//! [`CompilerSearch`] looks where a PyTorch install keeps CUDA, first match per place:
//!
//! | place | libnvrtc | nvcc |
//! | --- | --- | --- |
//! | `KWHEEL_NVRTC` | that file | |
//! | site-packages: `KWHEEL_SITE_PACKAGES` (`:`-separated), `$VIRTUAL_ENV`, `$CONDA_PREFIX`, the caller's | `nvidia/cu13/lib/libnvrtc.so.13`, `nvidia/cuda_nvrtc/lib/libnvrtc.so.12` | |
//! | `$CUDA_HOME` (else `/usr/local/cuda`) | `lib64/libnvrtc.so.N` | `bin/nvcc` |
//! | the system | `libnvrtc.so.13`, `libnvrtc.so.12`, `libnvrtc.so` by name | `nvcc` on `PATH` |
//!
//! Among those found, the first whose CUDA version equals the runtime's build wins; else the
//! newest one the driver supports. A compiler newer than the driver is never used: its cubins
//! would not load. NVRTC's exact version comes from its wheel's `.dist-info` or the toolkit's
//! `version.json` (as the bundler reads it), else from `nvrtcVersion`; nvcc's from
//! `nvcc --version`. A process holds one libnvrtc (see [`crate::nvrtc`]).
//!
//! # The cache
//!
//! ```text
//! ${KWHEEL_JIT_CACHE:-${XDG_CACHE_HOME:-~/.cache}/kwheel/jit}/
//! └── kernels-v1/                     layout version (CACHE_LAYOUT): bump when an entry changes
//!     └── 5a/                         first two hex digits of the key
//!         ├── 5a0d…e1.cubin           the cubin, renamed into place whole
//!         ├── 5a0d…e1.json            digest, entries, compiler; renamed into place last
//!         ├── 5a0d…e1.lock            empty; locked (flock) by the process compiling the key
//!         └── .5a0d…e1.cubin.<pid>.<n>.tmp   a write in progress
//! ```
//!
//! An entry counts only when its `.json` is present, names the key, and the `.cubin` matches
//! the digest and size it records and validates for the architecture; anything else is a
//! miss, and the next compile replaces it. A process that misses takes an exclusive lock on
//! `<key>.lock`, looks again (another process may have just finished), compiles, writes the
//! cubin and then the `.json` (each to a temp file in the same directory, renamed into place),
//! and unlocks. So many processes asking at once compile once. The lock is the operating
//! system's (`flock`): it dies with its process, so a process killed mid-compile leaves no
//! lock behind, only at most a temp file, which the next process to take the lock removes.
//! The lock file itself stays: deleting it would let two processes lock two different files.
//!
//! The cache never lives inside site-packages or the bundle: wheels are read-only and shared.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;
use std::fs::{self, File};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

// Called by path: `File` has inherent lock methods of the same names in newer Rust.
use fs4::fs_std::FileExt;
use serde::{Deserialize, Serialize};

use crate::bundle::SOURCES_DIR;
use crate::cubin::{inspect_cubin, validate_cubin, CubinError};
use crate::index::{CompilerRecord, Function, KernelRecord};
use crate::key::{sha256_hex, KernelKey, KeyInputs};
use crate::nvrtc::{self, NvrtcError, NvrtcLibrary};
use crate::select::DriverVersion;
use crate::{error_chain, Arch, CudaBuild};

/// Overrides where the JIT cache lives.
pub const JIT_CACHE_ENV: &str = "KWHEEL_JIT_CACHE";
/// Points the search at one `libnvrtc.so.N`.
pub const NVRTC_ENV: &str = "KWHEEL_NVRTC";
/// Extra site-packages directories to search, `:`-separated.
pub const SITE_PACKAGES_ENV: &str = "KWHEEL_SITE_PACKAGES";
/// The cache layout's directory name. Bump it when the entry format or the file names change.
pub const CACHE_LAYOUT: &str = "kernels-v1";
/// Version of an entry's `.json`; an entry of another version is a miss.
const ENTRY_FORMAT: u32 = 1;

/// Whether a kernel without a fitting prebuilt cubin may be compiled from its sources.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum JitPolicy {
    /// Read `<PACKAGE>_JIT_FALLBACK`: `0`, `false`, `no` or `off` forbid compiling; anything
    /// else, or unset, allows it.
    #[default]
    FromEnvironment,
    /// Compile when nothing fits.
    Allowed,
    /// Never compile: no fit is an error that says what was shipped and why it did not fit.
    Disabled,
}

impl JitPolicy {
    /// Whether compiling is allowed, reading `<PACKAGE>_JIT_FALLBACK` for
    /// [`JitPolicy::FromEnvironment`].
    pub fn allows_compiling(self, package: &str) -> bool {
        match self {
            JitPolicy::Allowed => true,
            JitPolicy::Disabled => false,
            JitPolicy::FromEnvironment => {
                let value = std::env::var_os(fallback_variable(package));
                value_allows(value.as_deref().and_then(|value| value.to_str()))
            }
        }
    }
}

fn value_allows(value: Option<&str>) -> bool {
    let Some(value) = value else { return true };
    !matches!(
        value.trim().to_ascii_lowercase().as_str(),
        "0" | "false" | "no" | "off"
    )
}

/// The variable that controls the fallback for a package: `af3-kernels` →
/// `AF3_KERNELS_JIT_FALLBACK`.
pub fn fallback_variable(package: &str) -> String {
    format!("{}_JIT_FALLBACK", crate::env::package_prefix(package))
}

/// The JIT cache directory: `$KWHEEL_JIT_CACHE`, else `${XDG_CACHE_HOME:-~/.cache}/kwheel/jit`.
pub fn default_cache_dir() -> PathBuf {
    cache_dir_from(|name| std::env::var_os(name))
}

fn cache_dir_from(env: impl Fn(&str) -> Option<OsString>) -> PathBuf {
    crate::cache_dir_from(env, JIT_CACHE_ENV, "jit")
}

/// A compiler could not be found, could not run, or a kernel did not compile.
#[derive(Debug, thiserror::Error)]
pub enum JitError {
    /// The kernel's cubins were precompiled: there are no sources to compile.
    #[error(
        "`{kernel}` ships no sources (its cubins were precompiled), so it cannot be compiled here"
    )]
    NoSources {
        /// The kernel.
        kernel: String,
    },
    /// No usable compiler anywhere the search looked.
    #[error(
        "no CUDA compiler for {build}{} was found: {}; install the NVRTC package that matches \
         torch's CUDA (as PyTorch's own dependencies do), or set {NVRTC_ENV} to a libnvrtc.so",
        match .driver { Some(driver) => format!(" (driver supports CUDA {driver})"), None => String::new() },
        .searched.join("; ")
    )]
    NoCompiler {
        /// The runtime's CUDA build.
        build: CudaBuild,
        /// The CUDA version the driver supports, when known.
        driver: Option<DriverVersion>,
        /// Every place looked at, and what was found there.
        searched: Vec<String>,
    },
    /// The compiler asked for builds code the driver cannot load.
    #[error(
        "{compiler} builds CUDA {version} code but the driver supports only CUDA {driver}: its \
         cubins would not load; use an NVRTC no newer than the driver"
    )]
    CompilerTooNew {
        /// The compiler and where it is.
        compiler: String,
        /// Its CUDA version.
        version: String,
        /// The driver's CUDA version.
        driver: DriverVersion,
    },
    /// A libnvrtc could not be loaded.
    #[error("could not load NVRTC from {}", path.display())]
    LoadNvrtc {
        /// The library.
        path: PathBuf,
        /// Why.
        #[source]
        source: Box<NvrtcError>,
    },
    /// nvcc, or the host compiler it runs, could not tell its version.
    #[error("could not run `{} --version`: {detail}", program.display())]
    Probe {
        /// The nvcc (or host compiler) executable.
        program: PathBuf,
        /// What went wrong.
        detail: String,
    },
    /// A shipped source could not be read.
    #[error("cannot read the shipped source `{stable}` of `{kernel}` at {}", path.display())]
    SourceRead {
        /// The kernel.
        kernel: String,
        /// The file's stable path.
        stable: String,
        /// Where it was looked for.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A shipped source is not the file the index was built from.
    #[error(
        "the shipped source `{stable}` of `{kernel}` does not match the bundle index: expected \
         sha256 {expected}, got {actual} ({}); reinstall the package",
        path.display()
    )]
    SourceMismatch {
        /// The kernel.
        kernel: String,
        /// The file's stable path.
        stable: String,
        /// Where it is.
        path: PathBuf,
        /// The digest the index records.
        expected: String,
        /// The digest of the file found.
        actual: String,
    },
    /// The compiler rejected the source; the log says why.
    #[error("failed to compile `{kernel}` for {arch} ({build}, {compiler}):\n{log}")]
    Compile {
        /// The kernel.
        kernel: String,
        /// The target architecture.
        arch: Arch,
        /// The runtime's CUDA build.
        build: CudaBuild,
        /// The compiler and its version (`nvrtc 12.9.86`).
        compiler: String,
        /// The compiler's full output.
        log: String,
    },
    /// The compiler could not run, or NVRTC failed for a reason other than the source.
    #[error("{compiler} could not compile `{kernel}` for {arch} ({build})")]
    Compiler {
        /// The kernel.
        kernel: String,
        /// The target architecture.
        arch: Arch,
        /// The runtime's CUDA build.
        build: CudaBuild,
        /// The compiler and its version (`nvrtc 12.9.86`).
        compiler: String,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The compiler produced something that is not a cubin for the target.
    #[error("{compiler} produced an unusable cubin for `{kernel}` ({arch}, {build})")]
    InvalidCubin {
        /// The kernel.
        kernel: String,
        /// The target architecture.
        arch: Arch,
        /// The runtime's CUDA build.
        build: CudaBuild,
        /// The compiler and its version (`nvrtc 12.9.86`).
        compiler: String,
        /// What is wrong with it.
        #[source]
        source: Box<CubinError>,
    },
    /// A declared entry is not in the compiled cubin.
    #[error(
        "the cubin {compiler} built for `{kernel}` ({arch}) has no kernel entry for `{entry}`; \
         its entries are {}",
        .found.join(", ")
    )]
    MissingEntry {
        /// The kernel.
        kernel: String,
        /// The target architecture.
        arch: Arch,
        /// The compiler and its version (`nvrtc 12.9.86`).
        compiler: String,
        /// The entry as declared.
        entry: String,
        /// The entry symbols the cubin has.
        found: Vec<String>,
    },
    /// The cache directory could not be written.
    #[error("cannot {action} {} in the JIT cache", path.display())]
    Cache {
        /// What was being done: "create", "lock", "write".
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// Which compiler the JIT fallback runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CompilerKind {
    /// NVRTC, loaded into this process.
    Nvrtc,
    /// nvcc, run as a process.
    Nvcc,
}

impl fmt::Display for CompilerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CompilerKind::Nvrtc => "nvrtc",
            CompilerKind::Nvcc => "nvcc",
        })
    }
}

/// A compiler the search found, before it is loaded or run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// NVRTC or nvcc.
    pub kind: CompilerKind,
    /// The library or executable: a path, or for the system library path a bare file name.
    pub location: PathBuf,
    /// Where the search found it: `KWHEEL_NVRTC`, `site-packages`, `CUDA_HOME`, `system`,
    /// `PATH`.
    pub origin: &'static str,
    /// The exact version, when known without loading or running it.
    pub version: Option<String>,
    /// The CUDA major version its file name tells (`libnvrtc.so.12` → 12).
    pub major: Option<u32>,
    /// The toolkit headers to compile with (NVRTC only): runtime headers, then CCCL.
    pub include_dirs: Vec<PathBuf>,
}

impl Candidate {
    /// The CUDA `(major, minor)` of the exact version, when known.
    fn cuda_version(&self) -> Option<(u32, u32)> {
        let build = CudaBuild::from_version(self.version.as_deref()?).ok()?;
        Some((build.major, build.minor))
    }

    /// Whether the driver can load what it builds, as far as is known before loading it.
    fn fits(&self, driver: Option<DriverVersion>) -> bool {
        let Some(driver) = driver else { return true };
        match (self.cuda_version(), self.major) {
            (Some(version), _) => version <= (driver.major, driver.minor),
            (None, Some(major)) => major <= driver.major,
            (None, None) => true,
        }
    }

    fn describe(&self) -> String {
        match &self.version {
            Some(version) => format!(
                "{} {version} ({}, {})",
                self.kind,
                self.location.display(),
                self.origin
            ),
            None => format!(
                "{} ({}, {})",
                self.kind,
                self.location.display(),
                self.origin
            ),
        }
    }
}

/// Where to look for a compiler; see the module docs for the order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompilerSearch {
    /// `KWHEEL_NVRTC`: one libnvrtc, tried first.
    pub nvrtc: Option<PathBuf>,
    /// site-packages directories holding NVIDIA's `nvidia/` packages, in order.
    pub site_packages: Vec<PathBuf>,
    /// A CUDA toolkit root (`CUDA_HOME`, `CUDA_PATH`, else `/usr/local/cuda`).
    pub cuda_home: Option<PathBuf>,
    /// `PATH`, for nvcc.
    pub path: Option<OsString>,
    /// Whether to try libnvrtc by name on the system library path.
    pub system_library_path: bool,
}

impl CompilerSearch {
    /// The search this process's environment describes.
    pub fn from_env() -> CompilerSearch {
        search_from(|name| std::env::var_os(name))
    }

    /// Every compiler that exists where the search looks, in search order. Nothing is loaded
    /// or run; NVRTC versions come from package metadata where it is.
    pub fn candidates(&self) -> Vec<Candidate> {
        let mut candidates = Vec::new();
        if let Some(library) = &self.nvrtc {
            if library.is_file() {
                candidates.push(nvrtc_candidate(library, NVRTC_ENV));
            }
        }
        for site_packages in &self.site_packages {
            for relative in [
                "nvidia/cu13/lib/libnvrtc.so.13",
                "nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
            ] {
                let library = site_packages.join(relative);
                if library.is_file() {
                    candidates.push(nvrtc_candidate(&library, "site-packages"));
                }
            }
        }
        if let Some(root) = &self.cuda_home {
            for lib in ["lib64", "lib"] {
                if let Some(library) = nvrtc::find_libnvrtc(&root.join(lib)) {
                    candidates.push(nvrtc_candidate(&library, "CUDA_HOME"));
                    break;
                }
            }
        }
        if self.system_library_path {
            for name in ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"] {
                candidates.push(Candidate {
                    kind: CompilerKind::Nvrtc,
                    location: PathBuf::from(name),
                    origin: "system",
                    version: None,
                    major: soname_major(Path::new(name)),
                    include_dirs: Vec::new(),
                });
            }
        }
        let mut nvccs = Vec::new();
        if let Some(root) = &self.cuda_home {
            nvccs.push((root.join("bin").join("nvcc"), "CUDA_HOME"));
        }
        if let Some(path) = &self.path {
            for dir in std::env::split_paths(path) {
                nvccs.push((dir.join("nvcc"), "PATH"));
            }
        }
        let mut seen = Vec::new();
        for (program, origin) in nvccs {
            let identity = fs::canonicalize(&program).unwrap_or_else(|_| program.clone());
            if program.is_file() && !seen.contains(&identity) {
                seen.push(identity);
                candidates.push(Candidate {
                    kind: CompilerKind::Nvcc,
                    location: program,
                    origin,
                    version: None,
                    major: None,
                    include_dirs: Vec::new(),
                });
            }
        }
        candidates
    }

    /// Finds, loads and returns the compiler to build for `build` on a driver supporting
    /// `driver` (`None`: no driver to respect, as when compiling without a GPU).
    pub fn find(
        &self,
        build: CudaBuild,
        driver: Option<DriverVersion>,
    ) -> Result<JitCompiler, JitError> {
        let mut candidates = self.candidates();
        // Running `nvcc --version` costs tens of milliseconds: only when no NVRTC of the
        // runtime's build is at hand.
        let exact_nvrtc = candidates.iter().any(|candidate| {
            candidate.kind == CompilerKind::Nvrtc
                && candidate.fits(driver)
                && candidate.cuda_version() == Some((build.major, build.minor))
        });
        if !exact_nvrtc {
            for candidate in &mut candidates {
                if candidate.kind == CompilerKind::Nvcc {
                    candidate.version = nvcc_version(&candidate.location).ok();
                }
            }
        }
        let mut searched = self.places();
        for index in rank(&candidates, build, driver) {
            let candidate = &candidates[index];
            match JitCompiler::realize(candidate, driver) {
                Ok(compiler) => return Ok(compiler),
                Err(error) => searched.push(format!(
                    "{}: {}",
                    candidate.describe(),
                    describe_failure(&error)
                )),
            }
        }
        for candidate in &candidates {
            if !candidate.fits(driver) {
                searched.push(format!("{}: newer than the driver", candidate.describe()));
            }
        }
        Err(JitError::NoCompiler {
            build,
            driver,
            searched,
        })
    }

    /// The places the search looks, for the message when nothing is found.
    fn places(&self) -> Vec<String> {
        let show = |path: &Option<PathBuf>| match path {
            Some(path) => path.display().to_string(),
            None => "unset".to_owned(),
        };
        let site_packages: Vec<String> = self
            .site_packages
            .iter()
            .map(|dir| dir.display().to_string())
            .collect();
        let mut places = vec![
            format!("looked in {NVRTC_ENV} ({})", show(&self.nvrtc)),
            format!(
                "site-packages ({})",
                if site_packages.is_empty() {
                    "none known: set VIRTUAL_ENV or KWHEEL_SITE_PACKAGES".to_owned()
                } else {
                    site_packages.join(", ")
                }
            ),
            format!("CUDA_HOME ({})", show(&self.cuda_home)),
        ];
        if self.system_library_path {
            places.push("the system library path".to_owned());
        }
        places.push("nvcc on PATH".to_owned());
        places
    }
}

fn search_from(env: impl Fn(&str) -> Option<OsString>) -> CompilerSearch {
    let env = |name: &str| env(name).filter(|value| !value.is_empty());
    let mut site_packages = Vec::new();
    if let Some(list) = env(SITE_PACKAGES_ENV) {
        site_packages.extend(std::env::split_paths(&list));
    }
    for prefix in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(prefix) = env(prefix) {
            site_packages.extend(python_site_packages(Path::new(&prefix)));
        }
    }
    let cuda_home = env("CUDA_HOME")
        .or_else(|| env("CUDA_PATH"))
        .map(PathBuf::from)
        .or_else(|| Some(PathBuf::from("/usr/local/cuda")));
    CompilerSearch {
        nvrtc: env(NVRTC_ENV).map(PathBuf::from),
        site_packages,
        cuda_home,
        path: env("PATH"),
        system_library_path: true,
    }
}

/// `<prefix>/lib/python3.*/site-packages`, newest Python first.
pub fn python_site_packages(prefix: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(prefix.join("lib")) else {
        return Vec::new();
    };
    let mut found: Vec<(u32, PathBuf)> = entries
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let name = entry.file_name().into_string().ok()?;
            let minor = name.strip_prefix("python3.")?.parse().ok()?;
            let site_packages = entry.path().join("site-packages");
            site_packages.is_dir().then_some((minor, site_packages))
        })
        .collect();
    found.sort_by(|a, b| b.cmp(a));
    found.into_iter().map(|(_, path)| path).collect()
}

/// The order to try candidates in: those whose CUDA version is the runtime's build first
/// (search order), then the rest the driver supports by version, newest first, then those of
/// unknown version. Candidates newer than the driver are left out.
fn rank(candidates: &[Candidate], build: CudaBuild, driver: Option<DriverVersion>) -> Vec<usize> {
    let fitting: Vec<usize> = (0..candidates.len())
        .filter(|&index| candidates[index].fits(driver))
        .collect();
    let exact: Vec<usize> = fitting
        .iter()
        .copied()
        .filter(|&index| candidates[index].cuda_version() == Some((build.major, build.minor)))
        .collect();
    let mut known: Vec<usize> = fitting
        .iter()
        .copied()
        .filter(|index| !exact.contains(index) && candidates[*index].cuda_version().is_some())
        .collect();
    // Stable: equal versions keep search order.
    known.sort_by(|&a, &b| {
        candidates[b]
            .cuda_version()
            .cmp(&candidates[a].cuda_version())
    });
    let unknown = fitting
        .iter()
        .copied()
        .filter(|&index| candidates[index].cuda_version().is_none());
    exact.iter().copied().chain(known).chain(unknown).collect()
}

fn soname_major(library: &Path) -> Option<u32> {
    library
        .file_name()?
        .to_str()?
        .strip_prefix("libnvrtc.so.")?
        .split('.')
        .next()?
        .parse()
        .ok()
}

/// A libnvrtc at `library`, with its version from package metadata and its toolkit headers.
fn nvrtc_candidate(library: &Path, origin: &'static str) -> Candidate {
    let major = soname_major(library);
    // `<site-packages>/nvidia/<component>/lib/libnvrtc.so.N`, or `<toolkit>/lib64/libnvrtc.so.N`.
    let component = library.parent().and_then(Path::parent);
    let nvidia_dir = component
        .and_then(Path::parent)
        .filter(|dir| dir.file_name().is_some_and(|name| name == "nvidia"));
    let (version, components) = match (component, nvidia_dir) {
        (Some(component), Some(nvidia_dir)) => {
            let site_packages = nvidia_dir.parent().unwrap_or(nvidia_dir);
            let mut components = vec![component.to_path_buf()];
            components.extend(release_components(nvidia_dir, major));
            (wheel_nvrtc_version(site_packages, major), components)
        }
        (Some(root), None) => (toolkit_nvrtc_version(root), vec![root.to_path_buf()]),
        _ => (None, Vec::new()),
    };
    Candidate {
        kind: CompilerKind::Nvrtc,
        location: library.to_path_buf(),
        origin,
        version,
        major,
        include_dirs: toolkit_include_dirs(&components),
    }
}

/// The `nvidia/` packages of one CUDA release: `cu13/` for CUDA 13 and later, the
/// `cuda_*/` packages (runtime, CCCL, …) for CUDA 12.
fn release_components(nvidia_dir: &Path, major: Option<u32>) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(nvidia_dir) else {
        return Vec::new();
    };
    let wanted = |name: &str| match major {
        Some(major) if major >= 13 => name == format!("cu{major}"),
        _ => name.starts_with("cuda_"),
    };
    let mut components: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok())
        .filter(|entry| entry.path().is_dir())
        .filter(|entry| entry.file_name().to_str().is_some_and(wanted))
        .map(|entry| entry.path())
        .collect();
    components.sort();
    components
}

/// The runtime headers (`cuda_runtime.h`), then CCCL (`cub/`), as the bundler finds them.
fn toolkit_include_dirs(components: &[PathBuf]) -> Vec<PathBuf> {
    let mut runtime = None;
    let mut cccl = None;
    for component in components {
        let include = component.join("include");
        if runtime.is_none() && include.join("cuda_runtime.h").is_file() {
            runtime = Some(include.clone());
        }
        if cccl.is_none() {
            if include.join("cccl").join("cub").is_dir() {
                cccl = Some(include.join("cccl"));
            } else if include.join("cub").is_dir() {
                cccl = Some(include);
            }
        }
    }
    let mut dirs = Vec::new();
    for dir in [runtime, cccl].into_iter().flatten() {
        if !dirs.contains(&dir) {
            dirs.push(dir);
        }
    }
    dirs
}

/// The version of the NVRTC wheel in `site_packages` for CUDA `major`: its `METADATA`
/// `Version:`, else the version in its `.dist-info` name.
fn wheel_nvrtc_version(site_packages: &Path, major: Option<u32>) -> Option<String> {
    let mut dist_infos: Vec<(PathBuf, String)> = fs::read_dir(site_packages)
        .ok()?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let name = entry.file_name().into_string().ok()?;
            let (package, version) = name.strip_suffix(".dist-info")?.rsplit_once('-')?;
            let is_nvrtc = package == "nvidia_cuda_nvrtc"
                || package
                    .strip_prefix("nvidia_cuda_nvrtc_cu")
                    .is_some_and(|major| major.bytes().all(|b| b.is_ascii_digit()));
            let same_major = match major {
                Some(major) => version.split('.').next() == Some(major.to_string().as_str()),
                None => true,
            };
            (is_nvrtc && same_major).then(|| (entry.path(), version.to_owned()))
        })
        .collect();
    dist_infos.sort();
    let (path, name_version) = dist_infos.into_iter().next()?;
    let metadata = fs::read_to_string(path.join("METADATA")).unwrap_or_default();
    let version = metadata
        .lines()
        .take_while(|line| !line.is_empty())
        .find_map(|line| line.strip_prefix("Version:"))
        .map(|version| version.trim().to_owned());
    Some(version.unwrap_or(name_version))
}

/// The NVRTC version a toolkit root's `version.json` records.
fn toolkit_nvrtc_version(root: &Path) -> Option<String> {
    let manifest = fs::read_to_string(root.join("version.json")).ok()?;
    let manifest: serde_json::Value = serde_json::from_str(&manifest).ok()?;
    manifest["cuda_nvrtc"]["version"]
        .as_str()
        .map(str::to_owned)
}

/// A `Command` for nvcc that does not depend on the caller's environment: `NVCC_PREPEND_FLAGS`
/// and the like would change what gets built without changing the key. Only `PATH` is kept,
/// for the host compiler nvcc runs. The bundler runs nvcc the same way.
fn nvcc_command(nvcc: &Path) -> Command {
    let mut command = Command::new(nvcc);
    command.env_clear();
    if let Some(path) = std::env::var_os("PATH") {
        command.env("PATH", path);
    }
    command
}

/// nvcc's exact version, from `nvcc --version`.
fn nvcc_version(nvcc: &Path) -> Result<String, JitError> {
    let probe = |detail: String| JitError::Probe {
        program: nvcc.to_path_buf(),
        detail,
    };
    let output = nvcc_command(nvcc)
        .arg("--version")
        .output()
        .map_err(|error| probe(error.to_string()))?;
    if !output.status.success() {
        return Err(probe(format!(
            "{}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    let text = String::from_utf8_lossy(&output.stdout);
    parse_nvcc_version(&text).ok_or_else(|| probe(format!("no version in its output:\n{text}")))
}

/// The host compiler nvcc runs to preprocess device code (`gcc` on `PATH`, as nvcc itself finds
/// it), named by the first line of its `--version`: the distribution's build of gcc, and so its
/// libstdc++ and the system headers nvcc reads, is part of every nvcc key. The bundler and the
/// JIT both record it through [`nvcc_record`], so their nvcc keys agree on one machine.
pub fn host_compiler() -> Result<String, JitError> {
    let gcc = Path::new("gcc");
    let probe = |detail: String| JitError::Probe {
        program: gcc.to_path_buf(),
        detail,
    };
    let output = nvcc_command(gcc)
        .arg("--version")
        .output()
        .map_err(|error| probe(error.to_string()))?;
    if !output.status.success() {
        return Err(probe(format!(
            "{}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    parse_host_compiler(&String::from_utf8_lossy(&output.stdout))
        .ok_or_else(|| probe("it printed nothing".to_owned()))
}

/// The first line of `gcc --version`, trimmed: `gcc (Debian 12.2.0-14+deb12u1) 12.2.0`.
fn parse_host_compiler(text: &str) -> Option<String> {
    text.lines()
        .next()
        .map(|line| line.trim().to_owned())
        .filter(|line| !line.is_empty())
}

/// The record of an nvcc compile (`kind` is `nvcc`, or `nvcc+ptxas` for the bundler's route
/// through another build's `ptxas`): the compiler's version and the host compiler it
/// preprocessed with, `13.0.88, host gcc (Debian 12.2.0-14+deb12u1) 12.2.0`.
pub fn nvcc_record(kind: &str, version: &str, host_compiler: &str) -> CompilerRecord {
    CompilerRecord {
        kind: kind.to_owned(),
        version: format!("{version}, host {host_compiler}"),
    }
}

/// nvcc's exact version from `nvcc --version`: `13.0.88` from
/// `Cuda compilation tools, release 13.0, V13.0.88` (the release, `12.9`, when there is no
/// `V` part). The bundler's toolchain discovery and the JIT's compiler search both use it.
pub fn parse_nvcc_version(text: &str) -> Option<String> {
    let line = text.lines().find(|line| line.contains("release "))?;
    let exact = line
        .split([',', ' '])
        .filter_map(|word| word.strip_prefix('V'))
        .find(|version| version.starts_with(|c: char| c.is_ascii_digit()));
    match exact {
        Some(version) => Some(version.to_owned()),
        None => {
            let release = line.split("release ").nth(1)?;
            Some(release.split(',').next()?.trim().to_owned())
        }
    }
}

/// A compiler ready to build: NVRTC loaded into this process, or nvcc with its version.
#[derive(Clone)]
pub struct JitCompiler {
    kind: CompilerKind,
    version: String,
    location: PathBuf,
    include_dirs: Vec<PathBuf>,
    /// nvcc's host compiler ([`host_compiler`]); `None` for NVRTC.
    host_compiler: Option<String>,
    nvrtc: Option<Arc<NvrtcLibrary>>,
}

impl fmt::Debug for JitCompiler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JitCompiler")
            .field("kind", &self.kind)
            .field("version", &self.version)
            .field("location", &self.location)
            .field("include_dirs", &self.include_dirs)
            .field("host_compiler", &self.host_compiler)
            .finish()
    }
}

impl fmt::Display for JitCompiler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} ({})",
            self.kind,
            self.version,
            self.location.display()
        )
    }
}

impl JitCompiler {
    /// The libnvrtc at `library`, loaded into this process, with its version and headers
    /// found the way [`CompilerSearch`] finds them.
    pub fn nvrtc_at(library: &Path) -> Result<JitCompiler, JitError> {
        JitCompiler::realize(&nvrtc_candidate(library, "given"), None)
    }

    /// The nvcc at `program`, with its version from `nvcc --version` and its host compiler
    /// ([`host_compiler`]).
    pub fn nvcc_at(program: &Path) -> Result<JitCompiler, JitError> {
        Ok(JitCompiler {
            kind: CompilerKind::Nvcc,
            version: nvcc_version(program)?,
            location: program.to_path_buf(),
            include_dirs: Vec::new(),
            host_compiler: Some(host_compiler()?),
            nvrtc: None,
        })
    }

    fn realize(
        candidate: &Candidate,
        driver: Option<DriverVersion>,
    ) -> Result<JitCompiler, JitError> {
        let compiler = match candidate.kind {
            CompilerKind::Nvcc => {
                let version = match &candidate.version {
                    Some(version) => version.clone(),
                    None => nvcc_version(&candidate.location)?,
                };
                JitCompiler {
                    kind: CompilerKind::Nvcc,
                    version,
                    location: candidate.location.clone(),
                    include_dirs: Vec::new(),
                    host_compiler: Some(host_compiler()?),
                    nvrtc: None,
                }
            }
            CompilerKind::Nvrtc => {
                let library =
                    nvrtc::load(&candidate.location).map_err(|source| JitError::LoadNvrtc {
                        path: candidate.location.clone(),
                        source: Box::new(source),
                    })?;
                let version = candidate.version.clone().unwrap_or_else(|| {
                    let (major, minor) = library.version();
                    format!("{major}.{minor}")
                });
                JitCompiler {
                    kind: CompilerKind::Nvrtc,
                    version,
                    location: candidate.location.clone(),
                    include_dirs: candidate.include_dirs.clone(),
                    host_compiler: None,
                    nvrtc: Some(library),
                }
            }
        };
        if let (Some(driver), Ok(build)) = (driver, CudaBuild::from_version(&compiler.version)) {
            if !driver.supports(build) {
                return Err(JitError::CompilerTooNew {
                    compiler: compiler.to_string(),
                    version: build.version(),
                    driver,
                });
            }
        }
        Ok(compiler)
    }

    /// NVRTC or nvcc.
    pub fn kind(&self) -> CompilerKind {
        self.kind
    }

    /// The exact version (`12.9.86`; `12.9` for an NVRTC without package metadata).
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The library or executable.
    pub fn location(&self) -> &Path {
        &self.location
    }

    /// The toolkit headers NVRTC compiles with (empty for nvcc, which has its own).
    pub fn include_dirs(&self) -> &[PathBuf] {
        &self.include_dirs
    }

    /// The host compiler nvcc preprocesses with; `None` for NVRTC.
    pub fn host_compiler(&self) -> Option<&str> {
        self.host_compiler.as_deref()
    }

    /// The compiler as keys and indexes record it, as the bundler records it: NVRTC's kind and
    /// version; nvcc's with its host compiler ([`nvcc_record`]).
    pub fn record(&self) -> CompilerRecord {
        match &self.host_compiler {
            Some(host) => nvcc_record(&self.kind.to_string(), &self.version, host),
            None => CompilerRecord {
                kind: self.kind.to_string(),
                version: self.version.clone(),
            },
        }
    }
}

/// The exact architecture to JIT for on a device: `sm_90a` on 9.0 and `sm_100a` on 10.0,
/// where the architecture-specific instructions (wgmma, tcgen05) live; plain `sm_XY` elsewhere.
pub fn device_arch(capability: (u32, u32)) -> Arch {
    let sm = capability.0 * 10 + capability.1;
    let kind = if matches!(capability, (9, 0) | (10, 0)) {
        crate::ArchKind::Specific
    } else {
        crate::ArchKind::Plain
    };
    Arch { sm, kind }
}

/// One kernel to compile for one target.
#[derive(Clone, Copy, Debug)]
pub struct JitRequest<'a> {
    /// The bundle's root; the sources are under its `sources/`.
    pub bundle_root: &'a Path,
    /// The kernel's name.
    pub kernel: &'a str,
    /// The kernel's index record: key inputs and recipe.
    pub record: &'a KernelRecord,
    /// The bundle's torch pin, as the bundler keys it.
    pub torch: &'a str,
    /// The device's exact architecture ([`device_arch`]).
    pub arch: Arch,
    /// The runtime's CUDA build.
    pub cuda: CudaBuild,
}

impl JitRequest<'_> {
    /// The key of this request compiled by `compiler`: the bundler's definition.
    pub fn key(&self, compiler: &CompilerRecord) -> KernelKey {
        KernelKey::compute(&KeyInputs {
            kernel: self.kernel,
            inputs: &self.record.inputs,
            arch: self.arch,
            cuda: self.cuda,
            torch: self.torch,
            compiler,
        })
    }
}

/// A JIT result: the cubin and its entries, from the cache or just compiled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JitOutput {
    /// The key it is cached under.
    pub key: KernelKey,
    /// The cubin, validated for the request's architecture.
    pub cubin: Vec<u8>,
    /// The kernel's entries, in declaration order, with symbols and parameter sizes.
    pub functions: Vec<Function>,
    /// `true` when this call compiled it, `false` when it came from the cache.
    pub compiled: bool,
    /// The cached cubin's path.
    pub path: PathBuf,
}

/// The files of one cache entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheEntryPaths {
    /// `<cache>/kernels-v1/<key[..2]>/`.
    pub dir: PathBuf,
    /// `<key>.cubin`.
    pub cubin: PathBuf,
    /// `<key>.json`, written last: an entry without it does not exist.
    pub metadata: PathBuf,
    /// `<key>.lock`, locked while the key compiles.
    pub lock: PathBuf,
}

/// Where the entry for `key` lives under `cache_dir`.
pub fn entry_paths(cache_dir: &Path, key: &KernelKey) -> CacheEntryPaths {
    let key = key.0.as_str();
    let dir = cache_dir.join(CACHE_LAYOUT).join(&key[..2.min(key.len())]);
    CacheEntryPaths {
        cubin: dir.join(format!("{key}.cubin")),
        metadata: dir.join(format!("{key}.json")),
        lock: dir.join(format!("{key}.lock")),
        dir,
    }
}

/// What an entry's `.json` records.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CacheEntry {
    format: u32,
    kernel: String,
    key: String,
    arch: Arch,
    cuda: CudaBuild,
    torch: String,
    compiler: CompilerRecord,
    digest: String,
    size: u64,
    functions: Vec<Function>,
}

/// Whether a complete entry for `key` is in the cache (without verifying its cubin).
pub fn is_cached(cache_dir: &Path, key: &KernelKey) -> bool {
    entry_paths(cache_dir, key).metadata.is_file()
}

/// The cubin of `request`: from the cache under `cache_dir`, else compiled with `compiler`
/// and cached. Needs no GPU. Safe to call from many processes and threads at once: one
/// compiles, the others wait for it and read its result.
pub fn compile_cached(
    request: &JitRequest<'_>,
    compiler: &JitCompiler,
    cache_dir: &Path,
) -> Result<JitOutput, JitError> {
    let record = compiler.record();
    let key = request.key(&record);
    let paths = entry_paths(cache_dir, &key);
    if let Some(hit) = read_entry(&paths, request, &key) {
        return Ok(hit);
    }
    let cache_error = |action, path: &Path| {
        let path = path.to_path_buf();
        move |source| JitError::Cache {
            action,
            path,
            source,
        }
    };
    fs::create_dir_all(&paths.dir).map_err(cache_error("create", &paths.dir))?;
    let lock = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&paths.lock)
        .map_err(cache_error("open", &paths.lock))?;
    FileExt::lock_exclusive(&lock).map_err(cache_error("lock", &paths.lock))?;
    // Whoever held the lock before may have just written the entry.
    if let Some(hit) = read_entry(&paths, request, &key) {
        return Ok(hit);
    }
    remove_leftovers(&paths.dir, &key);
    let (cubin, functions) = compile(request, compiler)?;
    let entry = CacheEntry {
        format: ENTRY_FORMAT,
        kernel: request.kernel.to_owned(),
        key: key.0.clone(),
        arch: request.arch,
        cuda: request.cuda,
        torch: request.torch.to_owned(),
        compiler: record,
        digest: sha256_hex(&cubin),
        size: cubin.len() as u64,
        functions: functions.clone(),
    };
    let mut metadata = serde_json::to_string_pretty(&entry).expect("a cache entry serializes");
    metadata.push('\n');
    write_atomically(&paths.cubin, &cubin).map_err(cache_error("write", &paths.cubin))?;
    write_atomically(&paths.metadata, metadata.as_bytes())
        .map_err(cache_error("write", &paths.metadata))?;
    // Closing the file releases the lock too; unlocking first makes the order explicit.
    let _ = FileExt::unlock(&lock);
    Ok(JitOutput {
        key,
        cubin,
        functions,
        compiled: true,
        path: paths.cubin,
    })
}

/// The cached entry, if it is complete, matches the request and verifies.
fn read_entry(
    paths: &CacheEntryPaths,
    request: &JitRequest<'_>,
    key: &KernelKey,
) -> Option<JitOutput> {
    let metadata = fs::read(&paths.metadata).ok()?;
    let entry: CacheEntry = serde_json::from_slice(&metadata).ok()?;
    if entry.format != ENTRY_FORMAT || entry.key != key.0 || entry.arch != request.arch {
        return None;
    }
    let cubin = fs::read(&paths.cubin).ok()?;
    if cubin.len() as u64 != entry.size || sha256_hex(&cubin) != entry.digest {
        return None;
    }
    let symbols: Vec<&str> = entry.functions.iter().map(|f| f.symbol.as_str()).collect();
    validate_cubin(&cubin, request.arch, &symbols).ok()?;
    Some(JitOutput {
        key: key.clone(),
        cubin,
        functions: entry.functions,
        compiled: false,
        path: paths.cubin.clone(),
    })
}

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Writes `bytes` to a temp file next to `path`, flushes it to disk, and renames it over
/// `path`: readers see the old file or the new one, never a part.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temp = dir.join(format!(
        ".{name}.{}.{}.tmp",
        std::process::id(),
        TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| {
        let mut file = File::options().write(true).create_new(true).open(&temp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        fs::rename(&temp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&temp);
    }
    result
}

/// Removes temp files a killed writer of `key` left. Only called with the key's lock held, so
/// no live process is writing them.
fn remove_leftovers(dir: &Path, key: &KernelKey) {
    let prefix = format!(".{}.", key.0);
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(&prefix) && name.ends_with(".tmp") {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// Verifies the shipped sources and compiles them: the cubin and its entries.
fn compile(
    request: &JitRequest<'_>,
    compiler: &JitCompiler,
) -> Result<(Vec<u8>, Vec<Function>), JitError> {
    let kernel = request.kernel;
    let recipe = request
        .record
        .recipe
        .as_ref()
        .ok_or_else(|| JitError::NoSources {
            kernel: kernel.to_owned(),
        })?;
    let sources = absolute(&request.bundle_root.join(SOURCES_DIR));
    verify_sources(kernel, &sources, &request.record.inputs.files)?;
    let source_path = sources.join(&recipe.source);
    let include_dirs: Vec<PathBuf> = recipe
        .include_dirs
        .iter()
        .map(|dir| {
            if dir == "." {
                sources.clone()
            } else {
                sources.join(dir)
            }
        })
        .collect();
    let inputs = &request.record.inputs;
    let flags = inputs.flags_for(&compiler.record().kind);
    let options = CompileOptions {
        arch: request.arch,
        cxx_std: &inputs.cxx_std,
        include_dirs: &include_dirs,
        defines: &inputs.defines,
        flags: &flags,
    };
    let record = compiler.record().to_string();
    let failed = |log: String| JitError::Compile {
        kernel: kernel.to_owned(),
        arch: request.arch,
        build: request.cuda,
        compiler: record.clone(),
        log,
    };
    let could_not = |source: Box<dyn std::error::Error + Send + Sync>| JitError::Compiler {
        kernel: kernel.to_owned(),
        arch: request.arch,
        build: request.cuda,
        compiler: record.clone(),
        source,
    };
    let name_expressions: Vec<String> = inputs
        .entries
        .iter()
        .filter(|entry| is_name_expression(entry))
        .cloned()
        .collect();
    let (cubin, lowered_names) = match &compiler.nvrtc {
        Some(library) => {
            let source =
                fs::read_to_string(&source_path).map_err(|source| JitError::SourceRead {
                    kernel: kernel.to_owned(),
                    stable: recipe.source.clone(),
                    path: source_path.clone(),
                    source,
                })?;
            let output = library
                .compile(
                    &source,
                    &source_path.display().to_string(),
                    &nvrtc_options(&options, &compiler.include_dirs),
                    &name_expressions,
                )
                .map_err(|error| match error {
                    NvrtcError::Compilation { log } => failed(log),
                    error => could_not(Box::new(error)),
                })?;
            (output.cubin, output.lowered_names)
        }
        None => {
            let work = tempfile::Builder::new()
                .prefix("kwheel-jit-")
                .tempdir()
                .map_err(|error| could_not(Box::new(error)))?;
            let output_path = work.path().join("kernel.cubin");
            let mut arguments = nvcc_arguments(&options, &source_path, &output_path);
            if !name_expressions.is_empty() {
                // The bundler's compile exactly: the probes' translation unit in place of the
                // source, with `-keep` leaving its PTX in the work dir.
                let probes = work.path().join(ENTRY_PROBES_SOURCE);
                fs::write(
                    &probes,
                    entry_probes_source(&source_path, &name_expressions),
                )
                .map_err(|error| could_not(Box::new(error)))?;
                *arguments.last_mut().expect("the source is last") = probes.into();
                arguments.insert(0, "-keep".into());
            }
            let output = nvcc_command(&compiler.location)
                .args(arguments)
                .current_dir(work.path())
                .env("TMPDIR", work.path())
                .output()
                .map_err(|error| could_not(Box::new(error)))?;
            if !output.status.success() {
                let mut log = String::from_utf8_lossy(&output.stdout).into_owned();
                log.push_str(&String::from_utf8_lossy(&output.stderr));
                if log.trim().is_empty() {
                    log = format!("nvcc {} and printed nothing", output.status);
                }
                return Err(failed(log));
            }
            let cubin = fs::read(&output_path).map_err(|error| could_not(Box::new(error)))?;
            let lowered_names = if name_expressions.is_empty() {
                BTreeMap::new()
            } else if request.arch.is_ptx() {
                // For a `compute_XY` target the output is that PTX itself.
                read_entry_probes(&String::from_utf8_lossy(&cubin), &name_expressions)
            } else {
                let ptx_path = work.path().join(ENTRY_PROBES_PTX);
                let ptx =
                    fs::read_to_string(&ptx_path).map_err(|error| could_not(Box::new(error)))?;
                read_entry_probes(&ptx, &name_expressions)
            };
            (cubin, lowered_names)
        }
    };
    let invalid = |source| JitError::InvalidCubin {
        kernel: kernel.to_owned(),
        arch: request.arch,
        build: request.cuda,
        compiler: record.clone(),
        source: Box::new(source),
    };
    let info = inspect_cubin(&cubin).map_err(invalid)?;
    let mut symbols = Vec::new();
    for entry in &inputs.entries {
        let symbol = lowered_names
            .get(entry)
            .filter(|symbol| !symbol.is_empty())
            .cloned()
            .or_else(|| info.resolve_entry(entry))
            .ok_or_else(|| JitError::MissingEntry {
                kernel: kernel.to_owned(),
                arch: request.arch,
                compiler: record.clone(),
                entry: entry.clone(),
                found: info.symbols(),
            })?;
        symbols.push(symbol);
    }
    let symbol_refs: Vec<&str> = symbols.iter().map(String::as_str).collect();
    let info = validate_cubin(&cubin, request.arch, &symbol_refs).map_err(invalid)?;
    let functions = inputs
        .entries
        .iter()
        .zip(symbols)
        .map(|(name, symbol)| Function {
            name: name.clone(),
            param_sizes: info
                .function(&symbol)
                .map(|function| function.param_sizes.clone())
                .unwrap_or_default(),
            symbol,
        })
        .collect();
    Ok((cubin, functions))
}

/// Checks every shipped file of the include graph against the digest the index records.
fn verify_sources(
    kernel: &str,
    sources: &Path,
    files: &BTreeMap<String, String>,
) -> Result<(), JitError> {
    for (stable, expected) in files {
        let path = sources.join(stable);
        let bytes = fs::read(&path).map_err(|source| JitError::SourceRead {
            kernel: kernel.to_owned(),
            stable: stable.clone(),
            path: path.clone(),
            source,
        })?;
        let actual = sha256_hex(&bytes);
        if actual != *expected {
            return Err(JitError::SourceMismatch {
                kernel: kernel.to_owned(),
                stable: stable.clone(),
                path,
                expected: expected.clone(),
                actual,
            });
        }
    }
    Ok(())
}

/// A path that does not depend on the working directory, since nvcc runs in a temp dir.
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// The target-dependent compile settings both compilers take.
#[derive(Clone, Copy, Debug)]
pub struct CompileOptions<'a> {
    /// The target architecture.
    pub arch: Arch,
    /// The C++ standard, `c++17`.
    pub cxx_std: &'a str,
    /// The kernel's include directories (absolute), in `-I` order.
    pub include_dirs: &'a [PathBuf],
    /// Preprocessor definitions, as `-DNAME=value` in name order.
    pub defines: &'a BTreeMap<String, String>,
    /// Further flags, last and as given.
    pub flags: &'a [String],
}

/// NVRTC's options, in the bundler's order: architecture, standard, the kernel's include
/// dirs, the toolkit's, defines, flags.
pub fn nvrtc_options(
    options: &CompileOptions<'_>,
    toolkit_include_dirs: &[PathBuf],
) -> Vec<String> {
    let mut arguments = vec![
        format!("--gpu-architecture={}", options.arch),
        format!("-std={}", options.cxx_std),
    ];
    let include_dirs = options
        .include_dirs
        .iter()
        .chain(toolkit_include_dirs)
        .map(|dir| format!("-I{}", dir.display()));
    arguments.extend(include_dirs);
    arguments.extend(
        options
            .defines
            .iter()
            .map(|(name, value)| format!("-D{name}={value}")),
    );
    arguments.extend(options.flags.iter().cloned());
    arguments
}

/// nvcc's arguments, in the bundler's order: `-cubin` (`-ptx` for a `compute_XY` target),
/// architecture, standard, include dirs, defines, flags, output, source.
pub fn nvcc_arguments(options: &CompileOptions<'_>, source: &Path, output: &Path) -> Vec<OsString> {
    // A `compute_XY` target's artifact is PTX.
    let output_kind = if options.arch.is_ptx() {
        "-ptx"
    } else {
        "-cubin"
    };
    let mut arguments: Vec<OsString> = vec![
        output_kind.into(),
        format!("-arch={}", options.arch).into(),
        format!("-std={}", options.cxx_std).into(),
    ];
    for dir in options.include_dirs {
        let mut flag = OsString::from("-I");
        flag.push(dir);
        arguments.push(flag);
    }
    arguments.extend(
        options
            .defines
            .iter()
            .map(|(name, value)| OsString::from(format!("-D{name}={value}"))),
    );
    arguments.extend(options.flags.iter().map(OsString::from));
    arguments.push("-o".into());
    arguments.push(output.into());
    arguments.push(source.into());
    arguments
}

/// The translation unit nvcc compiles when a kernel has name expressions: the kernel's source,
/// then one probe per name expression (see [`entry_probes_source`]).
pub const ENTRY_PROBES_SOURCE: &str = "kwheel-entries.cu";
/// The PTX nvcc leaves (`-keep`) of [`ENTRY_PROBES_SOURCE`] in its work dir.
pub const ENTRY_PROBES_PTX: &str = "kwheel-entries.ptx";
/// The prefix of the device variables that make nvcc name an entry's symbol.
const PROBE_PREFIX: &str = "__kwheel_entry_";

/// Whether an entry is a name expression (`scale<half>`, `ns::kernel`) rather than a plain
/// `extern "C"` symbol: NVRTC lowers those, and nvcc compiles them through entry probes.
pub fn is_name_expression(entry: &str) -> bool {
    !entry.chars().all(|c| c == '_' || c.is_ascii_alphanumeric())
}

/// [`ENTRY_PROBES_SOURCE`]'s text: how nvcc is asked for the symbol of a name expression
/// (`scale<half>`, `act<float, &silu>`). It includes `source` (absolute) and stores each
/// entry's address in a device variable; nvcc then instantiates the template exactly as C++
/// reads the expression (typedefs, `half`, integer and enum arguments, function pointers),
/// and its PTX initializes `__kwheel_entry_<n>` with the mangled symbol ([`read_entry_probes`]).
/// NVRTC does the same with `nvrtcAddNameExpression`. Entry `n` is on line `3 + 2n`. The
/// bundler and the JIT compile this same text, so their cubins are the same bytes.
pub fn entry_probes_source(source: &Path, name_expressions: &[String]) -> String {
    let mut text = format!(
        "#include \"{}\"\n",
        source
            .display()
            .to_string()
            .replace('\\', "\\\\")
            .replace('"', "\\\"")
    );
    for (n, entry) in name_expressions.iter().enumerate() {
        text.push_str(&format!(
            "// entry `{entry}`\n__device__ void* {PROBE_PREFIX}{n} = (void*)&{entry};\n"
        ));
    }
    text
}

/// Each name expression with the symbol its probe holds in `ptx` (nvcc's PTX of
/// [`entry_probes_source`]); an entry whose probe is missing is left out.
pub fn read_entry_probes(ptx: &str, name_expressions: &[String]) -> BTreeMap<String, String> {
    name_expressions
        .iter()
        .enumerate()
        .filter_map(|(n, entry)| {
            let needle = format!("{PROBE_PREFIX}{n} = ");
            let line = ptx.lines().find(|line| line.contains(&needle))?;
            let value = line.split_once(&needle)?.1;
            let value = value.trim_end().trim_end_matches(';').trim();
            let value = value
                .strip_prefix("generic(")
                .and_then(|inner| inner.strip_suffix(')'))
                .unwrap_or(value);
            Some((entry.clone(), value.to_owned()))
        })
        .collect()
}

/// Why a candidate could not be used, on one line: for a library the loader could not open,
/// just the loader's words (they name the file); else the error and its causes.
fn describe_failure(error: &JitError) -> String {
    if let JitError::LoadNvrtc { source, .. } = error {
        if let NvrtcError::Load { source, .. } = source.as_ref() {
            return source.to_string();
        }
    }
    error_chain(error)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<OsString> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| OsString::from(value))
        }
    }

    fn touch(path: &Path) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, b"").unwrap();
    }

    #[test]
    fn fallback_variable_is_the_package_upper_cased() {
        assert_eq!(fallback_variable("af3-kernels"), "AF3_KERNELS_JIT_FALLBACK");
        assert_eq!(fallback_variable("my.ops"), "MY_OPS_JIT_FALLBACK");
    }

    #[test]
    fn zero_and_its_spellings_forbid_compiling() {
        for value in ["0", "false", "OFF", " no "] {
            assert!(!value_allows(Some(value)), "{value}");
        }
        for value in [None, Some("1"), Some(""), Some("yes")] {
            assert!(value_allows(value), "{value:?}");
        }
        assert!(JitPolicy::Allowed.allows_compiling("x"));
        assert!(!JitPolicy::Disabled.allows_compiling("x"));
    }

    #[test]
    fn cache_dir_follows_the_environment() {
        let pairs = [("KWHEEL_JIT_CACHE", "/jit"), ("HOME", "/home/me")];
        assert_eq!(cache_dir_from(env(&pairs)), PathBuf::from("/jit"));
        let pairs = [("XDG_CACHE_HOME", "/xdg"), ("HOME", "/home/me")];
        assert_eq!(
            cache_dir_from(env(&pairs)),
            PathBuf::from("/xdg/kwheel/jit")
        );
        let pairs = [("HOME", "/home/me"), ("KWHEEL_JIT_CACHE", "")];
        assert_eq!(
            cache_dir_from(env(&pairs)),
            PathBuf::from("/home/me/.cache/kwheel/jit")
        );
    }

    #[test]
    fn entries_are_sharded_by_key_prefix() {
        let key = KernelKey("5a0de1".repeat(10) + "abcd");
        let paths = entry_paths(Path::new("/cache"), &key);
        assert_eq!(paths.dir, PathBuf::from("/cache/kernels-v1/5a"));
        assert_eq!(paths.cubin, paths.dir.join(format!("{}.cubin", key.0)));
        assert_eq!(paths.metadata, paths.dir.join(format!("{}.json", key.0)));
        assert_eq!(paths.lock, paths.dir.join(format!("{}.lock", key.0)));
    }

    #[test]
    fn device_arch_is_architecture_specific_where_it_matters() {
        let arch = |capability| device_arch(capability).to_string();
        assert_eq!(arch((9, 0)), "sm_90a");
        assert_eq!(arch((10, 0)), "sm_100a");
        assert_eq!(arch((8, 6)), "sm_86");
        assert_eq!(arch((10, 3)), "sm_103");
        assert_eq!(arch((12, 0)), "sm_120");
    }

    #[test]
    fn search_reads_site_packages_from_the_environment() {
        let venv = tempfile::tempdir().unwrap();
        for python in ["python3.11", "python3.12"] {
            fs::create_dir_all(venv.path().join("lib").join(python).join("site-packages")).unwrap();
        }
        let venv_path = venv.path().to_str().unwrap();
        let pairs = [
            ("KWHEEL_SITE_PACKAGES", "/extra/a:/extra/b"),
            ("VIRTUAL_ENV", venv_path),
            ("KWHEEL_NVRTC", "/x/libnvrtc.so.13"),
            ("CUDA_HOME", "/opt/cuda"),
            ("PATH", "/usr/bin"),
        ];
        let search = search_from(env(&pairs));
        assert_eq!(search.nvrtc, Some(PathBuf::from("/x/libnvrtc.so.13")));
        assert_eq!(
            search.site_packages,
            [
                PathBuf::from("/extra/a"),
                PathBuf::from("/extra/b"),
                venv.path().join("lib/python3.12/site-packages"),
                venv.path().join("lib/python3.11/site-packages"),
            ]
        );
        assert_eq!(search.cuda_home, Some(PathBuf::from("/opt/cuda")));
        let search = search_from(env(&[]));
        assert_eq!(search.cuda_home, Some(PathBuf::from("/usr/local/cuda")));
        assert!(search.system_library_path);
    }

    /// A site-packages with the CUDA 13 and 12 NVRTC wheels as pip lays them out.
    fn site_packages() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for file in [
            "nvidia/cu13/lib/libnvrtc.so.13",
            "nvidia/cu13/include/cuda_runtime.h",
            "nvidia/cu13/include/cccl/cub/cub.cuh",
            "nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
            "nvidia/cuda_runtime/include/cuda_runtime.h",
            "nvidia/cuda_cccl/include/cub/cub.cuh",
        ] {
            touch(&root.join(file));
        }
        fs::create_dir_all(root.join("nvidia_cuda_nvrtc-13.0.88.dist-info")).unwrap();
        let cu12 = root.join("nvidia_cuda_nvrtc_cu12-12.9.86.dist-info");
        fs::create_dir_all(&cu12).unwrap();
        fs::write(
            cu12.join("METADATA"),
            "Metadata-Version: 2.1\nName: nvidia-cuda-nvrtc-cu12\nVersion: 12.9.86\n\n",
        )
        .unwrap();
        dir
    }

    #[test]
    fn wheel_candidates_carry_their_version_and_headers() {
        let dir = site_packages();
        let root = dir.path();
        let search = CompilerSearch {
            site_packages: vec![root.to_path_buf()],
            ..CompilerSearch::default()
        };
        let candidates = search.candidates();
        assert_eq!(candidates.len(), 2, "{candidates:#?}");
        assert_eq!(candidates[0].version.as_deref(), Some("13.0.88"));
        assert_eq!(
            candidates[0].include_dirs,
            [
                root.join("nvidia/cu13/include"),
                root.join("nvidia/cu13/include/cccl")
            ]
        );
        assert_eq!(candidates[1].version.as_deref(), Some("12.9.86"));
        assert_eq!(
            candidates[1].include_dirs,
            [
                root.join("nvidia/cuda_runtime/include"),
                root.join("nvidia/cuda_cccl/include")
            ]
        );
    }

    #[test]
    fn toolkit_and_path_candidates_are_found() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        touch(&root.join("lib64/libnvrtc.so.12"));
        touch(&root.join("lib64/libnvrtc.so.12.9.86"));
        touch(&root.join("include/cuda_runtime.h"));
        touch(&root.join("bin/nvcc"));
        fs::write(
            root.join("version.json"),
            r#"{"cuda_nvrtc": {"version": "12.9.86"}}"#,
        )
        .unwrap();
        let search = CompilerSearch {
            cuda_home: Some(root.to_path_buf()),
            path: Some(std::env::join_paths([root.join("bin")]).unwrap()),
            system_library_path: true,
            ..CompilerSearch::default()
        };
        let found: Vec<(CompilerKind, PathBuf, &str, Option<String>)> = search
            .candidates()
            .into_iter()
            .map(|c| (c.kind, c.location, c.origin, c.version))
            .collect();
        assert_eq!(
            found,
            [
                (
                    CompilerKind::Nvrtc,
                    root.join("lib64/libnvrtc.so.12"),
                    "CUDA_HOME",
                    Some("12.9.86".to_owned())
                ),
                (CompilerKind::Nvrtc, "libnvrtc.so.13".into(), "system", None),
                (CompilerKind::Nvrtc, "libnvrtc.so.12".into(), "system", None),
                (CompilerKind::Nvrtc, "libnvrtc.so".into(), "system", None),
                // The same nvcc through CUDA_HOME and PATH is one candidate.
                (CompilerKind::Nvcc, root.join("bin/nvcc"), "CUDA_HOME", None),
            ]
        );
    }

    fn candidate(kind: CompilerKind, version: Option<&str>, major: Option<u32>) -> Candidate {
        Candidate {
            kind,
            location: PathBuf::from(format!("{kind}-{version:?}")),
            origin: "test",
            version: version.map(str::to_owned),
            major,
            include_dirs: Vec::new(),
        }
    }

    #[test]
    fn the_runtime_build_wins_then_the_newest_the_driver_runs() {
        let candidates = [
            candidate(CompilerKind::Nvrtc, Some("13.0.88"), Some(13)),
            candidate(CompilerKind::Nvrtc, Some("12.9.86"), Some(12)),
            candidate(CompilerKind::Nvrtc, None, Some(13)),
            candidate(CompilerKind::Nvcc, Some("12.8.93"), None),
            candidate(CompilerKind::Nvcc, Some("13.0.88"), None),
        ];
        let cu129: CudaBuild = "cu129".parse().unwrap();
        let cu130: CudaBuild = "cu130".parse().unwrap();
        let driver = |text: &str| Some(DriverVersion::parse(text).unwrap());
        assert_eq!(rank(&candidates, cu130, driver("13.0")), [0, 4, 1, 3, 2]);
        assert_eq!(rank(&candidates, cu129, driver("13.0")), [1, 0, 4, 3, 2]);
        // A 12.9 driver cannot run CUDA 13 cubins: those compilers are never tried.
        assert_eq!(rank(&candidates, cu130, driver("12.9")), [1, 3]);
        assert_eq!(rank(&candidates, cu129, None), [1, 0, 4, 3, 2]);
    }

    #[test]
    fn nothing_found_lists_every_place() {
        let search = CompilerSearch {
            site_packages: vec![PathBuf::from("/nonexistent/site-packages")],
            ..CompilerSearch::default()
        };
        let error = search
            .find(
                "cu130".parse().unwrap(),
                Some(DriverVersion::parse("13.0").unwrap()),
            )
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "no CUDA compiler for cu130 (driver supports CUDA 13.0) was found: looked in \
             KWHEEL_NVRTC (unset); site-packages (/nonexistent/site-packages); CUDA_HOME \
             (unset); nvcc on PATH; install the NVRTC package that matches torch's CUDA (as \
             PyTorch's own dependencies do), or set KWHEEL_NVRTC to a libnvrtc.so"
        );
    }

    #[test]
    fn host_compiler_is_the_first_line_of_its_version() {
        let text = "gcc (Debian 12.2.0-14+deb12u1) 12.2.0\nCopyright (C) 2022 Free Software \
                    Foundation, Inc.\n";
        assert_eq!(
            parse_host_compiler(text).as_deref(),
            Some("gcc (Debian 12.2.0-14+deb12u1) 12.2.0")
        );
        assert_eq!(parse_host_compiler("\n"), None);
        assert_eq!(parse_host_compiler(""), None);
    }

    fn nvcc_with_host(host: &str) -> JitCompiler {
        JitCompiler {
            kind: CompilerKind::Nvcc,
            version: "13.0.88".into(),
            location: PathBuf::from("/cuda/bin/nvcc"),
            include_dirs: Vec::new(),
            host_compiler: Some(host.into()),
            nvrtc: None,
        }
    }

    #[test]
    fn nvcc_record_names_the_host_compiler() {
        let debian = nvcc_with_host("gcc (Debian 12.2.0-14+deb12u1) 12.2.0");
        assert_eq!(
            debian.record(),
            CompilerRecord {
                kind: "nvcc".into(),
                version: "13.0.88, host gcc (Debian 12.2.0-14+deb12u1) 12.2.0".into(),
            }
        );
        // Another host compiler is another key.
        let record = KernelRecord {
            inputs: crate::index::KernelInputs {
                files: BTreeMap::new(),
                entries: vec!["k".into()],
                cxx_std: "c++17".into(),
                defines: BTreeMap::new(),
                flags: Vec::new(),
                nvcc_flags: Vec::new(),
                nvrtc_flags: Vec::new(),
            },
            recipe: None,
            constants: BTreeMap::new(),
            variants: Vec::new(),
            skipped: Vec::new(),
        };
        let request = JitRequest {
            bundle_root: Path::new("/bundle"),
            kernel: "k",
            record: &record,
            torch: "2.11.*",
            arch: "sm_90a".parse().unwrap(),
            cuda: CudaBuild::from_version("13.0").unwrap(),
        };
        let ubuntu = nvcc_with_host("gcc (Ubuntu 13.3.0-6ubuntu2~24.04) 13.3.0");
        assert_ne!(request.key(&debian.record()), request.key(&ubuntu.record()));
    }

    #[test]
    fn host_compiler_is_found_on_path() {
        // The machine's gcc, as nvcc finds it; where there is none, the probe says so.
        match host_compiler() {
            Ok(host) => assert!(!host.contains('\n') && !host.is_empty(), "{host:?}"),
            Err(error) => assert!(
                error
                    .to_string()
                    .starts_with("could not run `gcc --version`: "),
                "{error}"
            ),
        }
    }

    #[test]
    fn entry_probes_name_each_entry() {
        let entries: Vec<String> = vec!["scale<float>".into(), "ns::k".into()];
        let text = entry_probes_source(Path::new("/src/a \"b\".cu"), &entries);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], r#"#include "/src/a \"b\".cu""#);
        // Entry `n` is on line `3 + 2n` (1-based), as nvcc's errors count.
        assert_eq!(
            lines[2],
            "__device__ void* __kwheel_entry_0 = (void*)&scale<float>;"
        );
        assert_eq!(
            lines[4],
            "__device__ void* __kwheel_entry_1 = (void*)&ns::k;"
        );
        let ptx = ".global .align 8 .u64 __kwheel_entry_0 = _Z5scaleIfEvv;\n\
                   .global .align 8 .u64 __kwheel_entry_1 = generic(_ZN2ns1kEv);\n";
        let names = read_entry_probes(ptx, &entries);
        assert_eq!(names["scale<float>"], "_Z5scaleIfEvv");
        assert_eq!(names["ns::k"], "_ZN2ns1kEv");
        assert!(is_name_expression("scale<float>") && is_name_expression("ns::k"));
        assert!(!is_name_expression("layernorm_bf16"));
    }

    #[test]
    fn nvcc_version_is_exact() {
        let text = "Cuda compilation tools, release 13.0, V13.0.88\n";
        assert_eq!(parse_nvcc_version(text).as_deref(), Some("13.0.88"));
        assert_eq!(
            parse_nvcc_version("Cuda compilation tools, release 12.9\n").as_deref(),
            Some("12.9")
        );
        assert_eq!(parse_nvcc_version("hello"), None);
    }

    fn options_fixture() -> (Vec<PathBuf>, BTreeMap<String, String>, Vec<String>) {
        (
            vec![PathBuf::from("/src/include")],
            BTreeMap::from([
                ("B".to_owned(), "2".to_owned()),
                ("A".to_owned(), "x y".to_owned()),
            ]),
            vec!["--use_fast_math".to_owned()],
        )
    }

    #[test]
    fn nvrtc_options_are_the_bundlers() {
        let (include_dirs, defines, flags) = options_fixture();
        let options = CompileOptions {
            arch: "sm_100a".parse().unwrap(),
            cxx_std: "c++20",
            include_dirs: &include_dirs,
            defines: &defines,
            flags: &flags,
        };
        let toolkit = [PathBuf::from("/tk/runtime"), PathBuf::from("/tk/cccl")];
        assert_eq!(
            nvrtc_options(&options, &toolkit),
            [
                "--gpu-architecture=sm_100a",
                "-std=c++20",
                "-I/src/include",
                "-I/tk/runtime",
                "-I/tk/cccl",
                "-DA=x y",
                "-DB=2",
                "--use_fast_math"
            ]
        );
    }

    #[test]
    fn nvcc_arguments_are_the_bundlers() {
        let (include_dirs, defines, flags) = options_fixture();
        let options = CompileOptions {
            arch: "sm_90a".parse().unwrap(),
            cxx_std: "c++17",
            include_dirs: &include_dirs,
            defines: &defines,
            flags: &flags,
        };
        let arguments: Vec<String> = nvcc_arguments(
            &options,
            Path::new("/src/k.cu"),
            Path::new("/tmp/out.cubin"),
        )
        .into_iter()
        .map(|argument| argument.into_string().unwrap())
        .collect();
        assert_eq!(
            arguments,
            [
                "-cubin",
                "-arch=sm_90a",
                "-std=c++17",
                "-I/src/include",
                "-DA=x y",
                "-DB=2",
                "--use_fast_math",
                "-o",
                "/tmp/out.cubin",
                "/src/k.cu"
            ]
        );
    }

    #[test]
    fn atomic_writes_leave_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.cubin");
        write_atomically(&path, b"one").unwrap();
        write_atomically(&path, b"two").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|entry| entry.unwrap().file_name())
            .collect();
        assert_eq!(names, ["k.cubin"]);
    }

    #[test]
    fn leftovers_of_a_key_are_removed_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let key = KernelKey("ab".repeat(32));
        let other = KernelKey("cd".repeat(32));
        let leftover = dir.path().join(format!(".{}.cubin.123.0.tmp", key.0));
        let foreign = dir.path().join(format!(".{}.cubin.123.0.tmp", other.0));
        let entry = dir.path().join(format!("{}.cubin", key.0));
        for path in [&leftover, &foreign, &entry] {
            fs::write(path, b"x").unwrap();
        }
        remove_leftovers(dir.path(), &key);
        assert!(!leftover.exists());
        assert!(foreign.exists() && entry.exists());
    }
}
