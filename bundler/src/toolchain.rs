//! CUDA toolchains: where each CUDA build's toolkit lives, and what it can compile.
//!
//! `ci/setup` installs each build's toolkit from pip wheels into its own folder. Discovery
//! looks there (or wherever the environment points), finds nvcc, libnvrtc and the toolkit
//! headers, and settles which compiler the build uses and its exact version, because both are
//! part of every kernel key.
//!
//! Where a build's toolchain folder is, and the layouts understood inside it, are the
//! runtime's one description ([`prebuilt::compile::layout`]), which the JIT's compiler search
//! reads too.
//!
//! The compiler is nvcc where the build has it and NVRTC otherwise. Its exact version comes from
//! `nvcc --version`, or for NVRTC from the wheel's metadata (a toolkit's `version.json`, and
//! last `nvrtcVersion`). Probing an NVRTC toolchain loads its libnvrtc into this process (see
//! [`crate::nvrtc`] for why a process holds only one).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use prebuilt::target::{Arch, CudaBuild};
use serde::{Deserialize, Serialize};

pub use prebuilt::compile::layout::{toolchain_env_var, TOOLCHAINS_ENV};
pub(crate) use prebuilt::compile::nvcc_command;
pub use prebuilt::compile::ptxas::max_ptx_isa;
pub use prebuilt::compile::CompilerKind;
use prebuilt::compile::{
    host_compiler, nvrtc_package_version, parse_nvcc_version, toolchain_dir_from, ToolkitLayout,
};
use prebuilt::nvrtc;

/// A compiler and its exact version, as it enters kernel keys: `nvcc 13.0.88`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct CompilerId {
    /// nvcc or NVRTC.
    pub kind: CompilerKind,
    /// The exact version, `13.0.88` (for NVRTC without package metadata, `12.9`).
    pub version: String,
}

impl fmt::Display for CompilerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.kind, self.version)
    }
}

/// One CUDA build's toolkit, as discovered on disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Toolchain {
    /// The CUDA build this toolkit serves.
    pub build: CudaBuild,
    /// The folder it was discovered in.
    pub root: PathBuf,
    /// The nvcc driver, where the build has one.
    pub nvcc: Option<PathBuf>,
    /// `libnvrtc.so.N`, where the build has one.
    pub nvrtc: Option<PathBuf>,
    /// `ptxas`, where the build has one (the CUDA 12.9 wheels have it without nvcc).
    pub ptxas: Option<PathBuf>,
    /// The host compiler nvcc preprocesses with, as its `--version` names it
    /// (`gcc (Debian 12.2.0-14+deb12u1) 12.2.0`); `None` for a build without nvcc.
    pub host_compiler: Option<String>,
    /// The toolkit's own headers: the runtime headers, then CCCL (`cub/`, `cuda/std/`).
    pub include_dirs: Vec<PathBuf>,
    /// The compiler this build uses: nvcc where it has one, NVRTC otherwise.
    pub compiler: CompilerId,
    /// The SM numbers that compiler can target (`90`, `100`, …).
    pub supported_archs: BTreeSet<u32>,
}

impl Toolchain {
    /// Whether this toolchain's compiler can build for `arch`.
    ///
    /// Architecture-specific targets (`sm_90a`, `sm_100a`) exist from SM 90 on and family
    /// targets (`sm_100f`) from SM 100 on; a compiler that targets the base SM targets those
    /// variants and its PTX (`compute_XY`) too.
    pub fn supports(&self, arch: Arch) -> bool {
        let kind_exists = match arch.kind {
            prebuilt::ArchKind::Specific => arch.sm >= 90,
            prebuilt::ArchKind::Family => arch.sm >= 100,
            prebuilt::ArchKind::Plain | prebuilt::ArchKind::Ptx => true,
        };
        self.supported_archs.contains(&arch.sm) && kind_exists
    }
}

/// The CUDA builds `ci/setup` installs; a missing toolchain of another build needs more.
const SETUP_BUILDS: [&str; 2] = ["cu129", "cu130"];

/// How to get a missing toolchain: `ci/setup` for the builds it installs; for another, the
/// NVIDIA pip wheels of that CUDA version into the folder it was looked up in.
fn install_hint(build: CudaBuild, dir: &std::path::Path) -> String {
    let variable = toolchain_env_var(build);
    if std::env::var_os(&variable).is_some_and(|value| !value.is_empty()) {
        return format!(
            "that folder is what {variable} says; point it at a CUDA {} toolkit, or unset it to \
             use the one `ci/setup` installs",
            build.version()
        );
    }
    if SETUP_BUILDS.contains(&build.to_string().as_str()) {
        return format!("run `ci/setup` to install it, or set {variable} to a CUDA toolkit");
    }
    format!(
        "`ci/setup` installs only {}; install CUDA {}'s NVIDIA pip wheels (nvcc, or NVRTC with \
         the runtime headers: docs/toolchains.md) with `pip install --target {}`, or set \
         {variable} to a CUDA {} toolkit",
        SETUP_BUILDS.join(" and "),
        build.version(),
        dir.display(),
        build.version()
    )
}

/// A toolchain that is missing, incomplete, of the wrong version, or cannot be probed.
#[derive(Debug, thiserror::Error)]
pub enum ToolchainError {
    /// Nothing at the place the build's toolchain is looked up.
    #[error(
        "no CUDA {} toolchain ({build}) at {}: {}",
        .build.version(),
        .dir.display(),
        install_hint(*.build, dir)
    )]
    Missing {
        /// The build asked for.
        build: CudaBuild,
        /// Where it was looked for.
        dir: PathBuf,
    },
    /// The folder holds a toolkit of another CUDA version.
    #[error(
        "the toolchain at {dir} is CUDA {found}, not CUDA {} ({build}): run `ci/setup`, or set \
         {} to a CUDA {} toolkit",
        .build.version(),
        toolchain_env_var(*.build),
        .build.version()
    )]
    VersionMismatch {
        /// The build asked for.
        build: CudaBuild,
        /// The version found there (`13.0.88`).
        found: String,
        /// The folder.
        dir: PathBuf,
    },
    /// The folder exists but holds neither nvcc nor libnvrtc.
    #[error(
        "the CUDA {} toolchain ({build}) at {dir} has neither nvcc nor libnvrtc: run `ci/setup` \
         to reinstall it, or set {} to a CUDA toolkit",
        .build.version(),
        toolchain_env_var(*.build)
    )]
    NoCompiler {
        /// The build asked for.
        build: CudaBuild,
        /// The folder.
        dir: PathBuf,
    },
    /// Asking the compiler about itself failed.
    #[error("could not probe the CUDA {} toolchain ({build}) at {dir}: {what}", .build.version())]
    Probe {
        /// The build asked for.
        build: CudaBuild,
        /// The folder.
        dir: PathBuf,
        /// What was being done: "run `…/nvcc --version`".
        what: String,
        /// Why it failed.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Where `build`'s toolchain is looked up (see the module docs for the order).
pub fn toolchain_dir(build: CudaBuild) -> PathBuf {
    toolchain_dir_from(build, |name| std::env::var_os(name))
}

/// Discovers `build`'s toolchain where [`toolchain_dir`] says it lives.
pub fn discover(build: CudaBuild) -> Result<Toolchain, ToolchainError> {
    discover_at(build, &toolchain_dir(build))
}

/// Discovers `build`'s toolchain in `dir`: a pip `--target` folder or a toolkit root.
pub fn discover_at(build: CudaBuild, dir: &Path) -> Result<Toolchain, ToolchainError> {
    if !dir.is_dir() {
        return Err(ToolchainError::Missing {
            build,
            dir: dir.to_path_buf(),
        });
    }
    let layout = ToolkitLayout::scan(dir);
    let probe_error =
        |what: String, source: Box<dyn std::error::Error + Send + Sync>| ToolchainError::Probe {
            build,
            dir: dir.to_path_buf(),
            what,
            source,
        };
    let check_version = |found: &str| {
        if CudaBuild::from_version(found).ok() == Some(build) {
            Ok(())
        } else {
            Err(ToolchainError::VersionMismatch {
                build,
                found: found.to_owned(),
                dir: dir.to_path_buf(),
            })
        }
    };

    let (compiler, supported_archs) = if let Some(nvcc) = &layout.nvcc {
        let version_text =
            run_probe(nvcc, "--version").map_err(|(what, e)| probe_error(what, e))?;
        let version = parse_nvcc_version(&version_text).ok_or_else(|| {
            probe_error(
                format!("read the version from `{} --version`", nvcc.display()),
                format!("no `release X.Y, VX.Y.Z` in its output:\n{version_text}").into(),
            )
        })?;
        check_version(&version)?;
        let codes = run_probe(nvcc, "--list-gpu-code").map_err(|(what, e)| probe_error(what, e))?;
        let compiler = CompilerId {
            kind: CompilerKind::Nvcc,
            version,
        };
        (compiler, parse_gpu_codes(&codes))
    } else if let Some(library_path) = &layout.nvrtc {
        // Settle the version before loading, so that a wrong toolkit is reported as such
        // rather than taking this process's one libnvrtc.
        let packaged = nvrtc_package_version(dir, None);
        if let Some(version) = &packaged {
            check_version(version)?;
        }
        let library = nvrtc::load(library_path).map_err(|error| {
            probe_error(format!("load {}", library_path.display()), Box::new(error))
        })?;
        let version = match packaged {
            Some(version) => version,
            None => {
                let (major, minor) = library.version();
                let version = format!("{major}.{minor}");
                check_version(&version)?;
                version
            }
        };
        let archs = library.supported_archs().map_err(|error| {
            probe_error(
                format!("list the architectures of {}", library_path.display()),
                Box::new(error),
            )
        })?;
        let compiler = CompilerId {
            kind: CompilerKind::Nvrtc,
            version,
        };
        (compiler, archs.into_iter().collect())
    } else {
        return Err(ToolchainError::NoCompiler {
            build,
            dir: dir.to_path_buf(),
        });
    };

    let host_compiler = match &layout.nvcc {
        Some(_) => Some(host_compiler().map_err(|error| {
            probe_error(
                "read the host compiler nvcc runs".to_owned(),
                Box::new(error),
            )
        })?),
        None => None,
    };
    Ok(Toolchain {
        build,
        root: dir.to_path_buf(),
        nvcc: layout.nvcc,
        nvrtc: layout.nvrtc,
        ptxas: layout.ptxas,
        host_compiler,
        include_dirs: layout.include_dirs,
        compiler,
        supported_archs,
    })
}

type ProbeFailure = (String, Box<dyn std::error::Error + Send + Sync>);

/// The directories the host compiler searches for `#include <…>` in C++, in its order, from
/// `gcc -x c++ -E -v` (run with [`nvcc_command`]'s environment, as nvcc runs it: `CPATH`,
/// `CPLUS_INCLUDE_PATH` and the like never reach a compile), split by who owns their headers.
/// nvcc preprocesses device code with this compiler, so the include scanner follows headers
/// there (see [`crate::include`] and docs/key.md). Asked once per process; empty without `gcc`.
pub fn host_include_dirs() -> HostIncludeDirs {
    compiler_include_dirs(Path::new("gcc"))
}

/// [`host_include_dirs`] of any gcc-like compiler (`aarch64-linux-gnu-g++` for modules of
/// another CPU), asked once per compiler and process; empty where it cannot be run.
pub fn compiler_include_dirs(compiler: &Path) -> HostIncludeDirs {
    static DIRS: std::sync::Mutex<BTreeMap<PathBuf, HostIncludeDirs>> =
        std::sync::Mutex::new(BTreeMap::new());
    let mut known = DIRS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    known
        .entry(compiler.to_owned())
        .or_insert_with(|| ask_include_dirs(compiler))
        .clone()
}

fn ask_include_dirs(compiler: &Path) -> HostIncludeDirs {
    let ask = |args: &[&str]| {
        nvcc_command(compiler)
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .ok()
    };
    let Some(search) = ask(&["-x", "c++", "-E", "-v", "-o", "/dev/null", "/dev/null"]) else {
        return HostIncludeDirs::default();
    };
    let stdout = |output: Option<std::process::Output>| {
        output
            .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_owned())
            .unwrap_or_default()
    };
    let facts = HostCompilerFacts {
        triplet: stdout(ask(&["-dumpmachine"])),
        internal: PathBuf::from(stdout(ask(&["-print-file-name=include"]))),
        sysroot: PathBuf::from(stdout(ask(&["-print-sysroot"]))),
    };
    HostIncludeDirs::classify(
        parse_search_list(&String::from_utf8_lossy(&search.stderr)),
        &facts,
    )
}

/// The host compiler's search dirs, in its order, split by who owns the headers in them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostIncludeDirs {
    /// The compiler's own (libstdc++'s `…/c++/…`, gcc's internal `/usr/lib/gcc/<triplet>/<N>/…`)
    /// and the C library's (`/usr/include`, `/usr/include/<triplet>`): the host compiler's
    /// identity in the key stands for them, so their headers are followed but not hashed.
    pub compiler: Vec<PathBuf>,
    /// Every other one (`/usr/local/include`, where `make install` puts CUTLASS): headers found
    /// there are library files, hashed like any other.
    pub library: Vec<PathBuf>,
}

/// What tells the host compiler's own directories from the others.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostCompilerFacts {
    /// `gcc -dumpmachine`: `x86_64-linux-gnu`.
    pub triplet: String,
    /// `gcc -print-file-name=include`: `/usr/lib/gcc/x86_64-linux-gnu/12/include`.
    pub internal: PathBuf,
    /// `gcc -print-sysroot`: empty for the system's own compiler.
    pub sysroot: PathBuf,
}

impl HostIncludeDirs {
    /// Splits `dirs` (in search order) by [`HostCompilerFacts`]: a directory is the compiler's
    /// own when it lies under gcc's internal folder (the parent of its `include`), is a
    /// libstdc++ folder (a `c++` component: `/usr/include/c++/12`,
    /// `/usr/include/x86_64-linux-gnu/c++/12`), or is the C library's `<sysroot>/usr/include`
    /// or `<sysroot>/usr/include/<triplet>`, or a cross compiler's C library
    /// (`<prefix>/<triplet>/include` beside its `<prefix>/lib/gcc-cross/<triplet>/<N>`). Every
    /// other is a library dir.
    pub fn classify(dirs: Vec<PathBuf>, facts: &HostCompilerFacts) -> HostIncludeDirs {
        let internal = facts
            .internal
            .parent()
            .filter(|parent| facts.internal.is_absolute() && parent.components().count() > 2);
        let tool_include = internal
            .and_then(|internal| internal.ancestors().nth(4))
            .filter(|_| !facts.triplet.is_empty())
            .map(|prefix| normalized(&prefix.join(&facts.triplet).join("include")));
        let usr_include = Path::new("/")
            .join(facts.sysroot.strip_prefix("/").unwrap_or(&facts.sysroot))
            .join("usr/include");
        let libc = [usr_include.clone(), usr_include.join(&facts.triplet)];
        let mut out = HostIncludeDirs::default();
        for dir in dirs {
            let own = internal.is_some_and(|internal| dir.starts_with(internal))
                || dir.components().any(|c| c.as_os_str() == "c++")
                || libc.contains(&dir)
                || tool_include.as_ref() == Some(&normalized(&dir));
            if own {
                out.compiler.push(dir);
            } else {
                out.library.push(dir);
            }
        }
        out
    }

    /// The library dirs that are not (inside) one of `toolkit_dirs`: a toolkit installed where
    /// the host compiler looks is still the toolkit.
    pub fn library_outside(&self, toolkit_dirs: &[PathBuf]) -> Vec<PathBuf> {
        self.library
            .iter()
            .filter(|dir| !toolkit_dirs.iter().any(|toolkit| dir.starts_with(toolkit)))
            .cloned()
            .collect()
    }
}

/// `path` with its `..` and `.` resolved against the folders before them (gcc prints its
/// search dirs as `<bin>/../lib/gcc-cross/…/../../../../<triplet>/include`).
fn normalized(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// The directories between `#include <...> search starts here:` and `End of search list.`
fn parse_search_list(text: &str) -> Vec<PathBuf> {
    text.lines()
        .skip_while(|line| !line.starts_with("#include <...> search starts here:"))
        .skip(1)
        .take_while(|line| !line.starts_with("End of search list."))
        .map(|line| PathBuf::from(line.trim()))
        .filter(|dir| dir.is_dir())
        .collect()
}

/// The exact version of a `ptxas` (`12.9.86`), from `ptxas --version`.
pub(crate) fn ptxas_version(ptxas: &Path) -> Result<String, ProbeFailure> {
    let text = run_probe(ptxas, "--version")?;
    parse_nvcc_version(&text).ok_or_else(|| {
        (
            format!("read the version from `{} --version`", ptxas.display()),
            format!("no `release X.Y, VX.Y.Z` in its output:\n{text}").into(),
        )
    })
}

/// The toolchain whose nvcc compiles device code for `build` when `build` has `ptxas` but no
/// nvcc of its own (the CUDA 12.9 wheels): the next major release's `.0` toolchain (`cu130` for
/// `cu129`), if it is installed and has nvcc.
pub fn front_end_for(build: CudaBuild) -> Option<Toolchain> {
    let next = CudaBuild {
        major: build.major + 1,
        minor: 0,
    };
    discover(next)
        .ok()
        .filter(|toolchain| toolchain.nvcc.is_some())
}

/// Runs `nvcc <flag>` and returns its standard output.
fn run_probe(nvcc: &Path, flag: &str) -> Result<String, ProbeFailure> {
    let what = || format!("run `{} {flag}`", nvcc.display());
    let output = nvcc_command(nvcc)
        .arg(flag)
        .output()
        .map_err(|error| (what(), Box::new(error) as _))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err((
            what(),
            format!("{}: {}", output.status, stderr.trim()).into(),
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The SM numbers in `nvcc --list-gpu-code` output (`sm_90`, `sm_100`; `compute_*` ignored).
fn parse_gpu_codes(text: &str) -> BTreeSet<u32> {
    text.split_whitespace()
        .filter_map(|code| code.strip_prefix("sm_"))
        .filter_map(|sm| sm.trim_end_matches(['a', 'f']).parse().ok())
        .collect()
}

#[cfg(test)]
pub(crate) const CUDA_12_9: CudaBuild = CudaBuild {
    major: 12,
    minor: 9,
};
#[cfg(test)]
pub(crate) const CUDA_13_0: CudaBuild = CudaBuild {
    major: 13,
    minor: 0,
};

/// The real toolchain for `build`, or `None` (with the reason said, as `testkit::missing`
/// says it) when it is not installed. With `KWHEEL_REQUIRE_TOOLCHAINS=1`, as CI sets it, a
/// missing toolchain fails.
#[cfg(test)]
pub(crate) fn toolchain_for_tests(build: CudaBuild) -> Option<Toolchain> {
    match discover(build) {
        Ok(toolchain) => Some(toolchain),
        Err(error @ (ToolchainError::Missing { .. } | ToolchainError::NoCompiler { .. })) => {
            testkit::missing(&error.to_string());
            None
        }
        Err(error) => panic!("{build} toolchain: {}", testkit::error_chain(&error)),
    }
}

/// Both CUDA builds' real toolchains, (cu129, cu130), or `None` as [`toolchain_for_tests`].
#[cfg(test)]
pub(crate) fn both_toolchains() -> Option<(Toolchain, Toolchain)> {
    Some((
        toolchain_for_tests(CUDA_12_9)?,
        toolchain_for_tests(CUDA_13_0)?,
    ))
}

/// A toolchain under `/tk` that exists only as a description, for command lines and refusals.
#[cfg(test)]
pub(crate) fn described_toolchain(
    build: CudaBuild,
    kind: CompilerKind,
    version: &str,
) -> Toolchain {
    Toolchain {
        build,
        root: PathBuf::from("/tk"),
        nvcc: None,
        nvrtc: None,
        ptxas: None,
        host_compiler: None,
        include_dirs: Vec::new(),
        compiler: CompilerId {
            kind,
            version: version.into(),
        },
        supported_archs: BTreeSet::from([90, 100]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn missing_toolchain_says_how_to_install_it() {
        let error = discover_at(CUDA_12_9, Path::new("/nonexistent/cu129")).unwrap_err();
        assert!(matches!(error, ToolchainError::Missing { .. }));
        assert_eq!(
            error.to_string(),
            "no CUDA 12.9 toolchain (cu129) at /nonexistent/cu129: run `ci/setup` to install it, \
             or set KWHEEL_CUDA_CU129 to a CUDA toolkit"
        );
    }

    #[test]
    fn empty_toolchain_has_no_compiler() {
        let dir = tempfile::tempdir().unwrap();
        let error = discover_at(CUDA_13_0, dir.path()).unwrap_err();
        assert!(
            matches!(error, ToolchainError::NoCompiler { .. }),
            "{error}"
        );
        assert!(error.to_string().contains("KWHEEL_CUDA_CU130"), "{error}");
    }

    #[test]
    fn nvcc_version_is_exact() {
        let text = "nvcc: NVIDIA (R) Cuda compiler driver\n\
                    Cuda compilation tools, release 13.0, V13.0.88\n\
                    Build cuda_13.0.r13.0/compiler.36424714_0\n";
        assert_eq!(parse_nvcc_version(text).as_deref(), Some("13.0.88"));
        let old = "Cuda compilation tools, release 12.9\n";
        assert_eq!(parse_nvcc_version(old).as_deref(), Some("12.9"));
        assert_eq!(parse_nvcc_version("nvcc: hello"), None);
    }

    #[test]
    fn gpu_codes_are_sm_numbers() {
        let text = "sm_75\nsm_90\nsm_100\nsm_100a\ncompute_90\n";
        assert_eq!(parse_gpu_codes(text), BTreeSet::from([75, 90, 100]));
    }

    #[test]
    fn nvrtc_version_comes_from_the_wheel_metadata() {
        let dir = tempfile::tempdir().unwrap();
        let info = dir.path().join("nvidia_cuda_nvrtc_cu12-12.9.86.dist-info");
        fs::create_dir(&info).unwrap();
        assert_eq!(
            nvrtc_package_version(dir.path(), None).as_deref(),
            Some("12.9.86")
        );
        fs::write(
            info.join("METADATA"),
            "Metadata-Version: 2.4\nName: nvidia-cuda-nvrtc-cu12\nVersion: 12.9.86.post1\n\nbody\n",
        )
        .unwrap();
        assert_eq!(
            nvrtc_package_version(dir.path(), None).as_deref(),
            Some("12.9.86.post1")
        );
    }

    #[test]
    fn nvrtc_version_comes_from_a_toolkit_version_json() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(
            dir.path().join("version.json"),
            r#"{"cuda": {"version": "12.9.1"}, "cuda_nvrtc": {"name": "CUDA NVRTC", "version": "12.9.86"}}"#,
        )
        .unwrap();
        assert_eq!(
            nvrtc_package_version(dir.path(), None).as_deref(),
            Some("12.9.86")
        );
    }

    #[test]
    fn a_architectures_need_sm_90_or_newer() {
        let toolchain = Toolchain {
            supported_archs: BTreeSet::from([80, 90, 100]),
            ..described_toolchain(CUDA_13_0, CompilerKind::Nvcc, "13.0.88")
        };
        let arch = |text: &str| text.parse::<Arch>().unwrap();
        assert!(toolchain.supports(arch("sm_90a")));
        assert!(toolchain.supports(arch("sm_100a")));
        assert!(toolchain.supports(arch("sm_80")));
        assert!(!toolchain.supports(arch("sm_80a")));
        assert!(!toolchain.supports(arch("sm_120a")));
    }

    #[test]
    fn compiler_id_reads_like_the_command() {
        let id = CompilerId {
            kind: CompilerKind::Nvrtc,
            version: "12.9.86".into(),
        };
        assert_eq!(id.to_string(), "nvrtc 12.9.86");
        assert_eq!(
            serde_json::to_string(&id).unwrap(),
            r#"{"kind":"nvrtc","version":"12.9.86"}"#
        );
    }

    #[test]
    fn host_dirs_of_the_compiler_and_libc_are_told_from_library_dirs() {
        let debian = HostCompilerFacts {
            triplet: "x86_64-linux-gnu".into(),
            internal: "/usr/lib/gcc/x86_64-linux-gnu/12/include".into(),
            sysroot: PathBuf::new(),
        };
        let dirs: Vec<PathBuf> = [
            "/usr/include/c++/12",
            "/usr/include/x86_64-linux-gnu/c++/12",
            "/usr/include/c++/12/backward",
            "/usr/lib/gcc/x86_64-linux-gnu/12/include",
            "/usr/local/include",
            "/usr/include/x86_64-linux-gnu",
            "/usr/include",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        let split = HostIncludeDirs::classify(dirs.clone(), &debian);
        assert_eq!(split.library, [PathBuf::from("/usr/local/include")]);
        assert_eq!(split.compiler.len(), 6);
        // A gcc with its own prefix and sysroot (conda's): its libc is the sysroot's.
        let conda = HostCompilerFacts {
            triplet: "x86_64-conda-linux-gnu".into(),
            internal: "/opt/conda/lib/gcc/x86_64-conda-linux-gnu/13.3.0/include".into(),
            sysroot: "/opt/conda/x86_64-conda-linux-gnu/sysroot".into(),
        };
        let dirs: Vec<PathBuf> = [
            "/opt/conda/x86_64-conda-linux-gnu/include/c++/13.3.0",
            "/opt/conda/lib/gcc/x86_64-conda-linux-gnu/13.3.0/include",
            "/opt/conda/lib/gcc/x86_64-conda-linux-gnu/13.3.0/include-fixed",
            "/opt/conda/include",
            "/opt/conda/x86_64-conda-linux-gnu/sysroot/usr/include",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        let split = HostIncludeDirs::classify(dirs, &conda);
        assert_eq!(split.library, [PathBuf::from("/opt/conda/include")]);
        // The system's /usr/include is not that compiler's libc.
        let split = HostIncludeDirs::classify(vec!["/usr/include".into()], &conda);
        assert_eq!(split.library, [PathBuf::from("/usr/include")]);
        // A toolkit installed where the compiler looks stays the toolkit.
        let split = HostIncludeDirs {
            compiler: Vec::new(),
            library: vec![
                "/usr/local/cuda/include".into(),
                "/usr/local/include".into(),
            ],
        };
        assert_eq!(
            split.library_outside(&[PathBuf::from("/usr/local/cuda/include")]),
            [PathBuf::from("/usr/local/include")]
        );
    }

    #[test]
    fn this_machines_host_dirs_keep_usr_include_with_the_compiler() {
        let dirs = host_include_dirs();
        if dirs.compiler.is_empty() {
            eprintln!("skipped: no gcc on PATH");
            return;
        }
        assert!(
            dirs.compiler.contains(&PathBuf::from("/usr/include")),
            "{dirs:?}"
        );
        assert!(
            !dirs.library.contains(&PathBuf::from("/usr/include")),
            "{dirs:?}"
        );
        if Path::new("/usr/local/include").is_dir() {
            assert!(
                dirs.library.contains(&PathBuf::from("/usr/local/include")),
                "{dirs:?}"
            );
        }
    }

    /// The toolchain's include dirs, relative to its root.
    fn include_dirs_in_root(toolchain: &Toolchain) -> Vec<PathBuf> {
        let root = &toolchain.root;
        let relative = |dir: &PathBuf| dir.strip_prefix(root).unwrap().to_owned();
        toolchain.include_dirs.iter().map(relative).collect()
    }

    #[test]
    fn cu130_toolchain_uses_nvcc() {
        let Some(toolchain) = toolchain_for_tests(CUDA_13_0) else {
            return;
        };
        assert_eq!(toolchain.compiler.to_string(), "nvcc 13.0.88");
        assert!(toolchain.nvcc.is_some());
        assert!(toolchain.supports("sm_90a".parse().unwrap()));
        assert!(toolchain.supports("sm_100a".parse().unwrap()));
        assert_eq!(
            include_dirs_in_root(&toolchain),
            [
                PathBuf::from("nvidia/cu13/include"),
                PathBuf::from("nvidia/cu13/include/cccl")
            ]
        );
    }

    #[test]
    fn cu129_toolchain_uses_nvrtc() {
        let Some(toolchain) = toolchain_for_tests(CUDA_12_9) else {
            return;
        };
        assert_eq!(toolchain.compiler.to_string(), "nvrtc 12.9.86");
        assert!(toolchain.nvcc.is_none());
        assert!(toolchain
            .nvrtc
            .as_ref()
            .unwrap()
            .ends_with("nvidia/cuda_nvrtc/lib/libnvrtc.so.12"));
        assert!(toolchain.supports("sm_90a".parse().unwrap()));
        assert!(toolchain.supports("sm_100a".parse().unwrap()));
        assert_eq!(
            include_dirs_in_root(&toolchain),
            [
                PathBuf::from("nvidia/cuda_runtime/include"),
                PathBuf::from("nvidia/cuda_cccl/include"),
                PathBuf::from("nvidia/cublas/include"),
                PathBuf::from("nvidia/cufft/include"),
                PathBuf::from("nvidia/curand/include"),
                PathBuf::from("nvidia/cusolver/include"),
                PathBuf::from("nvidia/cusparse/include"),
            ]
        );
    }

    #[test]
    fn cu130_toolkit_given_for_cu129_is_a_version_mismatch() {
        let Some(cu130) = toolchain_for_tests(CUDA_13_0) else {
            return;
        };
        let env =
            |name: &str| (name == "KWHEEL_CUDA_CU129").then(|| cu130.root.clone().into_os_string());
        let dir = toolchain_dir_from(CUDA_12_9, env);
        let error = discover_at(CUDA_12_9, &dir).unwrap_err();
        let ToolchainError::VersionMismatch { found, .. } = &error else {
            panic!("expected a version mismatch, got {error}");
        };
        assert_eq!(found, "13.0.88");
        assert_eq!(
            error.to_string(),
            format!(
                "the toolchain at {} is CUDA 13.0.88, not CUDA 12.9 (cu129): run `ci/setup`, or \
                 set KWHEEL_CUDA_CU129 to a CUDA 12.9 toolkit",
                cu130.root.display()
            )
        );
    }
}

/// The NVRTC loader (in `prebuilt`) against the real libraries this module discovers.
#[cfg(test)]
mod nvrtc_library_tests {
    use super::{both_toolchains, toolchain_for_tests, CUDA_12_9, CUDA_13_0};

    #[test]
    fn real_library_reports_version_and_archs() {
        let Some(toolchain) = toolchain_for_tests(CUDA_12_9) else {
            return;
        };
        let library = prebuilt::nvrtc::load(toolchain.nvrtc.as_ref().unwrap()).unwrap();
        assert_eq!(library.version(), (12, 9));
        let archs = library.supported_archs().unwrap();
        assert!(archs.contains(&90) && archs.contains(&100), "{archs:?}");
        // Asking again for the same file is fine and returns the same library.
        let again = prebuilt::nvrtc::load(toolchain.nvrtc.as_ref().unwrap()).unwrap();
        assert_eq!(again.path(), library.path());
    }

    /// Loading two different libnvrtc files must be an error, not a crash. It runs in a child
    /// process so that no other test in this process ever sees a second libnvrtc.
    #[test]
    fn second_library_in_one_process_is_an_error() {
        if both_toolchains().is_none() {
            return;
        }
        let output = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "toolchain::nvrtc_library_tests::child_loads_two_libraries",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success() && stdout.contains("1 passed"),
            "child failed:\n{stdout}\n{stderr}"
        );
        assert!(
            stdout.contains("one process can hold only one libnvrtc"),
            "{stdout}"
        );
    }

    const CHILD_ENV: &str = "KWHEEL_NVRTC_TEST_CHILD";

    /// The child half of the test above: does nothing unless that test started it.
    #[test]
    fn child_loads_two_libraries() {
        if std::env::var_os(CHILD_ENV).is_none() {
            return;
        }
        let cu129 = toolchain_for_tests(CUDA_12_9).unwrap();
        let cu130 = toolchain_for_tests(CUDA_13_0).unwrap();
        prebuilt::nvrtc::load(cu129.nvrtc.as_ref().unwrap()).unwrap();
        let error = prebuilt::nvrtc::load(cu130.nvrtc.as_ref().unwrap()).unwrap_err();
        assert!(matches!(
            error,
            prebuilt::nvrtc::NvrtcError::AnotherLibraryLoaded { .. }
        ));
        println!("{error}");
    }
}
