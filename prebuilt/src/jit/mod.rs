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
//! the index before anything compiles, so the key names what is really compiled, and every
//! flag, define and path the index records is checked against an allowlist first
//! ([`refused_inputs`]): a bundle cannot make the compiler write a file or run a program.
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
//!         ├── 5a0d…e1.lock            locked (flock) by the process compiling the key; holds its pid
//!         └── .5a0d…e1.cubin.<pid>.<random>.tmp   a write in progress
//! ```
//!
//! An entry counts only when its `.json` is present, names the key, and the `.cubin` matches
//! the digest and size it records and validates for the architecture; anything else is a
//! miss, and the next compile replaces it. Only regular files are read, and never through a
//! linked `kernels-v1/` or shard folder. A process that misses takes an exclusive lock on
//! `<key>.lock` (waiting at most `KWHEEL_JIT_LOCK_TIMEOUT`, then naming the holder's pid),
//! looks again (another process may have just finished), compiles, writes the
//! cubin and then the `.json` (each to a temp file in the same directory, renamed into place),
//! and unlocks. So many processes asking at once compile once. The lock is the operating
//! system's (`flock`): it dies with its process, so a process killed mid-compile leaves no
//! lock behind, only at most a temp file, which the next process to take the lock removes.
//! The lock file itself stays: deleting it would let two processes lock two different files.
//!
//! The cache never lives inside site-packages or the bundle: wheels are read-only and shared.

mod cache;
mod flags;
pub mod module;
pub mod pack;
mod run;
mod search;
mod sources;

pub use cache::{
    compile_cached, default_cache_dir, entry_paths, is_cached, lock_timeout_from, CacheEntryPaths,
    CACHE_LAYOUT, DEFAULT_LOCK_TIMEOUT,
};
pub use flags::{check_define, check_flags, refused_inputs, RefusedInput};
use run::{compile, describe_failure};
use search::nvrtc_candidate;
pub use search::{Candidate, CompilerSearch};
use sources::{check_source_tree, verify_sources};

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;
use std::fs::{self, File};

use std::path::{Path, PathBuf};
use std::sync::Arc;

// Called by path: `File` has inherent lock methods of the same names in newer Rust.
use fs4::fs_std::FileExt;
use serde::{Deserialize, Serialize};

use crate::bundle::SOURCES_DIR;
use crate::cache::{cache_dir_from as cache_dir_in, write_atomically};
use crate::compile::{
    is_name_expression, nvcc_record, nvcc_version, nvrtc_package_version, resolve_entries,
    CompilerKind, ProbeError,
};
use crate::cubin::{validate_cubin, CubinError};
use crate::device::DriverVersion;
use crate::env::{JIT_CACHE_ENV, JIT_LOCK_TIMEOUT_ENV, NVRTC_ENV};
use crate::index::{CompilerRecord, Function, KernelRecord, SourceRecipe, StructLayout};
use crate::key::{sha256_hex, KernelKey, KeyInputs};
use crate::nvrtc::{self, NvrtcError, NvrtcLibrary};
use crate::{error_chain, Arch, CudaBuild};

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
    #[error(transparent)]
    Probe(#[from] ProbeError),
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
    /// The bundle asks the compiler for something the JIT does not pass on: a flag off the
    /// allowlist ([`flags`]), a define, standard or recipe path that could smuggle one.
    #[error(
        "`{kernel}` is not compiled from its shipped sources: the bundle index's {refused}. The \
         JIT passes a bundle's compiler flags only from a list that cannot name a file, a \
         folder or a program (see kwheel's docs/jit.md), so that a wheel cannot make the \
         compiler write files or run programs; its prebuilt cubins still load where they fit. \
         Ask the package's maintainers for a build without it"
    )]
    UnsafeInput {
        /// The kernel.
        kernel: String,
        /// What is refused, where in the index, and why.
        refused: RefusedInput,
    },
    /// Something under the bundle's `sources/` that the compiler would open is not a regular
    /// file or folder inside the bundle.
    #[error("`{kernel}` is not compiled from its shipped sources: {} is refused", path.display())]
    SourceTree {
        /// The kernel.
        kernel: String,
        /// The file, folder or link.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Another process held the cache lock of a key for longer than the lock timeout.
    #[error(
        "waited {waited_s} s for the JIT cache lock {} of `{kernel}`: {}; if that process is \
         stuck, end it, or set {JIT_LOCK_TIMEOUT_ENV} to wait longer (seconds)",
        path.display(),
        match .holder {
            Some(pid) => format!("process {pid} holds it, compiling this kernel"),
            None => "another process holds it (it recorded no pid)".to_owned(),
        }
    )]
    LockTimeout {
        /// The kernel.
        kernel: String,
        /// The lock file.
        path: PathBuf,
        /// How long this process waited, in seconds.
        waited_s: u64,
        /// The holder's pid, as it wrote it into the lock file.
        holder: Option<u32>,
    },
    /// The lock timeout setting is not a number of seconds.
    #[error("{JIT_LOCK_TIMEOUT_ENV}=`{value}` is not a whole number of seconds")]
    LockTimeoutSetting {
        /// The value.
        value: String,
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
    /// The source compiles the kernel only for other targets: every entry's body for this one
    /// only reports and aborts (see [`crate::cubin::stub_entries`]), so it is not loaded.
    #[error(
        "`{kernel}` has no real code for {arch}: the source compiles it only for other \
         targets, and what {compiler} built for {arch} is a stub that aborts ({})",
        .stubs.join("; ")
    )]
    Stub {
        /// The kernel.
        kernel: String,
        /// The target compiled.
        arch: Arch,
        /// The compiler that ran.
        compiler: String,
        /// Each entry and what its body does.
        stubs: Vec<String>,
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
    /// No nvcc of the module's CUDA build, or no host compiler, was found.
    #[error(
        "cannot build extension module `{module}` for {build}: {missing}; looked in {}; install \
         the CUDA {build} compiler (nvcc) and a host C++ compiler (g++), set CUDA_HOME, or \
         install a torch the module was built for",
        .searched.join("; ")
    )]
    NoModuleCompiler {
        /// The module.
        module: String,
        /// torch's CUDA build.
        build: CudaBuild,
        /// What is missing (`no nvcc of CUDA 13.0`).
        missing: String,
        /// Every place looked at, and what was found there.
        searched: Vec<String>,
    },
    /// A module's compile or link failed; the error names the step and keeps its log's tail.
    /// Nothing was cached.
    #[error("building extension module `{module}` ({build}) failed")]
    ModuleCompile {
        /// The module.
        module: String,
        /// torch's CUDA build.
        build: CudaBuild,
        /// The step that failed, with the tail of its log.
        #[source]
        source: Box<crate::module::ModuleCompileError>,
    },
    /// A module was built, but its fatbin does not hold the device code its recipe asks for
    /// (a cubin of each arch it was built for, read as a cubin of that SM). Nothing was cached.
    #[error(
        "building extension module `{module}` ({build}) gave a module whose device code is not \
         what it was built for"
    )]
    ModuleDeviceCode {
        /// The module.
        module: String,
        /// torch's CUDA build.
        build: CudaBuild,
        /// What the fatbin lacks or what in it does not read.
        #[source]
        source: Box<crate::module::fatbin::FatbinError>,
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

/// Checks everything of `record` that the JIT would put on a compiler's command line
/// ([`refused_inputs`]): the first refusal, as the error [`compile_cached`] returns for it.
/// The registry's status and load both ask this, so they say the same.
pub fn check_inputs(kernel: &str, record: &KernelRecord) -> Result<(), JitError> {
    match refused_inputs(&record.inputs, record.recipe.as_ref())
        .into_iter()
        .next()
    {
        Some(refused) => Err(JitError::UnsafeInput {
            kernel: kernel.to_owned(),
            refused,
        }),
        None => Ok(()),
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
            host_compiler: Some(crate::compile::host_compiler()?),
            nvrtc: None,
        })
    }

    fn realize(
        candidate: &Candidate,
        driver: Option<DriverVersion>,
    ) -> Result<JitCompiler, JitError> {
        let compiler = match candidate.kind {
            // The search finds nvcc executables and NVRTC libraries only; `nvcc+ptxas` is the
            // bundler's route and never a candidate.
            CompilerKind::Nvcc | CompilerKind::NvccPtxas | CompilerKind::Precompiled => {
                let version = match &candidate.version {
                    Some(version) => version.clone(),
                    None => nvcc_version(&candidate.location)?,
                };
                JitCompiler {
                    kind: CompilerKind::Nvcc,
                    version,
                    location: candidate.location.clone(),
                    include_dirs: Vec::new(),
                    host_compiler: Some(crate::compile::host_compiler()?),
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
            Some(host) => nvcc_record(self.kind, &self.version, host),
            None => CompilerRecord {
                kind: self.kind.to_string(),
                version: self.version.clone(),
            },
        }
    }
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
    /// The layouts of the structs the kernel declares, as the compiler computed them.
    pub structs: BTreeMap<String, StructLayout>,
    /// `true` when this call compiled it, `false` when it came from the cache.
    pub compiled: bool,
    /// The cached cubin's path.
    pub path: PathBuf,
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn env<'a>(
        pairs: &'a [(&'a str, &'a str)],
    ) -> impl Fn(&str) -> Option<OsString> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| OsString::from(value))
        }
    }

    pub(crate) fn touch(path: &Path) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, b"").unwrap();
    }

    pub(crate) fn nvcc_with_host(host: &str) -> JitCompiler {
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
                ..Default::default()
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
}
