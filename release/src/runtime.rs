//! The `kwheel` runtime wheel: `prebuilt`'s loader as a CPython extension module (stable ABI,
//! 3.9+), built for glibc 2.28 with `cargo zigbuild`, inside the small `kwheel` package that
//! every kernel library's wheel requires.
//!
//! ```text
//! prebuilt/python/kwheel/__init__.py ──────────────────────┐
//! cargo zigbuild --release -p kwheel-python                │
//!   --target x86_64-unknown-linux-gnu.2.28 → lib_kwheel.so ┴─► kwheel-0.1.0-cp39-abi3-manylinux_2_28_x86_64.whl
//!                                                              ├── kwheel/__init__.py
//!                                                              ├── kwheel/_kwheel.abi3.so   GLIBC ≤ 2.28
//!                                                              └── kwheel-0.1.0.dist-info/
//! ```
//!
//! | step | what happens |
//! | --- | --- |
//! | module | built with `cargo zigbuild` (the `.2.28` suffix makes zig link against glibc 2.28's symbol versions), or taken from a path given |
//! | package | every file of `prebuilt/python/kwheel/` but caches, plus the module as `kwheel/_kwheel.abi3.so` |
//! | writing | [`write_wheel`] audits the module against manylinux_2_28 before the wheel exists: a symbol version newer than GLIBC_2.28 fails the build, naming it |
//! | after writing | the wheel is verified as `kwheel wheel verify` would; a failure removes it |
//!
//! `cargo zigbuild` finds zig itself (`python3 -m ziglang`, then `zig` on `PATH`); before it,
//! the build points it at the `ziglang` that `ci/setup` installs:
//!
//! | where | used when |
//! | --- | --- |
//! | `CARGO_ZIGBUILD_ZIG_PATH` | set: a zig executable, left to `cargo zigbuild` |
//! | `$KWHEEL_ZIG/ziglang/zig`, default `${XDG_CACHE_HOME:-~/.cache}/kwheel/zig/ziglang/zig` | the file exists (`ci/setup` puts `ziglang` there) |
//! | `python3 -m ziglang`, then `zig` on `PATH` | otherwise, as `cargo zigbuild` searches |

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::library::{write_verified_wheel, BuiltWheel, PLATFORM_TAG, REQUIRES_PYTHON};
use crate::wheel::{Metadata, WheelFile, WheelFilename, WheelSpec, KWHEEL_VERSION};
use crate::Error;

/// The runtime's distribution name.
pub const DISTRIBUTION: &str = "kwheel";

/// The Python tag: CPython 3.9 and later, through the stable ABI.
pub const PYTHON_TAG: &str = "cp39";

/// The ABI tag: the stable ABI (`abi3`), so one wheel serves every CPython from 3.9 on.
pub const ABI_TAG: &str = "abi3";

/// The Rust package of the Python module (`prebuilt/python`).
pub const PYTHON_CRATE: &str = "kwheel-python";

/// The directory of the module's crate, relative to the workspace; it holds the `kwheel/`
/// package too.
pub const PYTHON_CRATE_DIR: &str = "prebuilt/python";

/// The Python package's directory name, in the crate directory and in the wheel.
pub const PACKAGE_DIR: &str = "kwheel";

/// The extension module's path inside the wheel.
pub const MODULE_PATH: &str = "kwheel/_kwheel.abi3.so";

/// The Rust target the module is built for; zig links it against glibc 2.28.
pub const ZIGBUILD_TARGET: &str = "x86_64-unknown-linux-gnu.2.28";

/// The target directory's name for [`ZIGBUILD_TARGET`] (cargo drops the glibc suffix).
const TARGET_TRIPLE: &str = "x86_64-unknown-linux-gnu";

/// The shared library cargo writes for `[lib] name = "_kwheel"`.
const LIBRARY_FILE: &str = "lib_kwheel.so";

/// Where `ci/setup` installs `ziglang` (with `pip --target`), when set.
pub const ZIG_DIR_ENV: &str = "KWHEEL_ZIG";

/// The variable `cargo zigbuild` reads for a zig executable.
pub const ZIGBUILD_ZIG_PATH_ENV: &str = "CARGO_ZIGBUILD_ZIG_PATH";

/// Where the Python module comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NativeModule {
    /// Built from the workspace with `cargo zigbuild`, in `target_dir` (default: the
    /// workspace's `target/kwheel/runtime`, apart from the workspace's own builds so that a
    /// running `cargo` never holds its lock).
    Build {
        /// The cargo target directory.
        target_dir: Option<PathBuf>,
    },
    /// A module built before (`lib_kwheel.so`); it is audited like a built one.
    Prebuilt(PathBuf),
}

/// What [`build_runtime_wheel`] builds.
#[derive(Clone, Debug)]
pub struct RuntimeWheelOptions {
    /// The kwheel workspace: the root `Cargo.toml` and `prebuilt/python/`.
    pub workspace: PathBuf,
    /// The directory the wheel is written to.
    pub out: PathBuf,
    /// Where the Python module comes from.
    pub module: NativeModule,
    /// Show cargo's output as it builds (otherwise it is kept for the error message).
    pub progress: bool,
}

impl RuntimeWheelOptions {
    /// Builds the module from `workspace` into its default target directory, quietly.
    pub fn new(workspace: impl Into<PathBuf>, out: impl Into<PathBuf>) -> RuntimeWheelOptions {
        RuntimeWheelOptions {
            workspace: workspace.into(),
            out: out.into(),
            module: NativeModule::Build { target_dir: None },
            progress: false,
        }
    }
}

/// The kwheel workspace this crate was compiled from, when it is still there: what
/// `dev build-wheel` builds the runtime from. `None` for an installed `kwheel` binary whose
/// sources are gone.
pub fn source_workspace() -> Option<PathBuf> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent()?;
    workspace
        .join(PYTHON_CRATE_DIR)
        .join("Cargo.toml")
        .is_file()
        .then(|| workspace.to_owned())
}

/// Builds the `kwheel` runtime wheel (see the module docs for the steps).
pub fn build_runtime_wheel(options: &RuntimeWheelOptions) -> Result<BuiltWheel, Error> {
    let module = match &options.module {
        NativeModule::Prebuilt(path) => path.clone(),
        NativeModule::Build { target_dir } => {
            let target_dir = target_dir
                .clone()
                .unwrap_or_else(|| options.workspace.join("target/kwheel/runtime"));
            build_python_module(&options.workspace, &target_dir, options.progress)?
        }
    };
    let mut files = package_files(&options.workspace.join(PYTHON_CRATE_DIR).join(PACKAGE_DIR))?;
    files.push(WheelFile::from_disk(MODULE_PATH, &module)?);
    let filename = WheelFilename::new(
        DISTRIBUTION,
        KWHEEL_VERSION,
        PYTHON_TAG,
        ABI_TAG,
        PLATFORM_TAG,
    )?;
    let metadata = Metadata {
        name: DISTRIBUTION.to_owned(),
        version: KWHEEL_VERSION.to_owned(),
        summary: Some("Loads prebuilt CUDA kernels shipped in Python wheels".to_owned()),
        requires_python: Some(REQUIRES_PYTHON.to_owned()),
        requires_dist: Vec::new(),
    };
    write_verified_wheel(
        WheelSpec {
            filename,
            metadata,
            files,
            out_dir: options.out.clone(),
            modified: None,
        },
        None,
    )
}

/// Builds the Python module with `cargo zigbuild --release` for [`ZIGBUILD_TARGET`] in
/// `target_dir` and returns the shared library's path. Cargo's output goes to stderr when
/// `progress` is set; otherwise its end is part of the error.
pub fn build_python_module(
    workspace: &Path,
    target_dir: &Path,
    progress: bool,
) -> Result<PathBuf, Error> {
    if find_cargo_subcommand("cargo-zigbuild").is_none() {
        return Err(Error::MissingTool {
            tool: "cargo-zigbuild".into(),
            hint: "run `bash ci/setup`, or `cargo install cargo-zigbuild --locked`".into(),
        });
    }
    let mut command = Command::new(cargo());
    command
        .arg("zigbuild")
        .args(["--release", "--locked", "-p", PYTHON_CRATE, "--target"])
        .arg(ZIGBUILD_TARGET)
        .arg("--manifest-path")
        .arg(workspace.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(target_dir)
        // The module needs no debug info, and the standard library's would triple its size.
        .env("CARGO_PROFILE_RELEASE_STRIP", "debuginfo");
    if let Some(zig) = installed_zig() {
        command.env(ZIGBUILD_ZIG_PATH_ENV, zig);
    }
    run(command, progress)?;
    let library = target_dir
        .join(TARGET_TRIPLE)
        .join("release")
        .join(LIBRARY_FILE);
    if !library.is_file() {
        return Err(Error::Build {
            command: format!("cargo zigbuild --release -p {PYTHON_CRATE}"),
            outcome: format!("succeeded but wrote no `{}`", library.display()),
            output: String::new(),
        });
    }
    Ok(library)
}

/// How `cargo zigbuild` will find zig, or `None` when it will not: the `ziglang` of
/// `ci/setup`, `CARGO_ZIGBUILD_ZIG_PATH`, `python3 -m ziglang`, or `zig` on `PATH`.
pub fn find_zig() -> Option<String> {
    if let Some(path) = std::env::var_os(ZIGBUILD_ZIG_PATH_ENV).filter(|path| !path.is_empty()) {
        return Some(format!(
            "{ZIGBUILD_ZIG_PATH_ENV}={}",
            Path::new(&path).display()
        ));
    }
    if let Some(zig) = installed_zig() {
        return Some(zig.display().to_string());
    }
    let python_module = Command::new("python3")
        .args(["-m", "ziglang", "version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if python_module {
        return Some("python3 -m ziglang".into());
    }
    search_path("zig").map(|zig| zig.display().to_string())
}

/// Whether `cargo zigbuild` is installed: `cargo-zigbuild` on `PATH` or in `$CARGO_HOME/bin`.
pub fn find_cargo_zigbuild() -> Option<PathBuf> {
    find_cargo_subcommand("cargo-zigbuild")
}

/// The `zig` of the `ziglang` that `ci/setup` installs, when it is there.
fn installed_zig() -> Option<PathBuf> {
    let dir = match std::env::var_os(ZIG_DIR_ENV).filter(|dir| !dir.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => cache_home()?.join("kwheel/zig"),
    };
    let zig = dir.join("ziglang/zig");
    zig.is_file().then_some(zig)
}

fn cache_home() -> Option<PathBuf> {
    std::env::var_os("XDG_CACHE_HOME")
        .filter(|dir| !dir.is_empty())
        .map(PathBuf::from)
        .or_else(|| home().map(|home| home.join(".cache")))
}

fn home() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .filter(|dir| !dir.is_empty())
        .map(PathBuf::from)
}

/// The cargo that runs this process (`CARGO`), else `cargo` on `PATH`.
fn cargo() -> OsString {
    std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into())
}

/// Where cargo finds a subcommand: `$CARGO_HOME/bin` (default `~/.cargo/bin`), then `PATH`.
fn find_cargo_subcommand(name: &str) -> Option<PathBuf> {
    let cargo_home = std::env::var_os("CARGO_HOME")
        .filter(|dir| !dir.is_empty())
        .map(PathBuf::from)
        .or_else(|| home().map(|home| home.join(".cargo")));
    cargo_home
        .map(|home| home.join("bin").join(name))
        .filter(|path| path.is_file())
        .or_else(|| search_path(name))
}

fn search_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// Runs a build command; a failure carries the end of its output.
fn run(mut command: Command, progress: bool) -> Result<(), Error> {
    let shown = describe(&command);
    let output = if progress {
        command.stdout(Stdio::inherit()).stderr(Stdio::inherit());
        command.status().map(|status| (status, String::new()))
    } else {
        command.output().map(|output| {
            let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
            text.push_str(&String::from_utf8_lossy(&output.stderr));
            (output.status, text)
        })
    };
    let (status, text) = output.map_err(|error| Error::Build {
        command: shown.clone(),
        outcome: format!("could not start: {error}"),
        output: String::new(),
    })?;
    if status.success() {
        return Ok(());
    }
    Err(Error::Build {
        command: shown,
        outcome: format!("failed ({status})"),
        output: last_lines(&text, 40),
    })
}

fn describe(command: &Command) -> String {
    let mut text = Path::new(command.get_program())
        .file_name()
        .unwrap_or(command.get_program())
        .to_string_lossy()
        .into_owned();
    for arg in command.get_args() {
        text.push(' ');
        text.push_str(&arg.to_string_lossy());
    }
    text
}

fn last_lines(text: &str, count: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(count)..].join("\n")
}

/// The package's files as `kwheel/<relative path>`, without caches and hidden files, sorted.
fn package_files(dir: &Path) -> Result<Vec<WheelFile>, Error> {
    let mut files = Vec::new();
    let mut pending = vec![(PACKAGE_DIR.to_owned(), dir.to_owned())];
    while let Some((prefix, dir)) = pending.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|source| Error::Read {
            path: dir.clone(),
            source,
        })?;
        for entry in entries {
            let entry = entry.map_err(|source| Error::Read {
                path: dir.clone(),
                source,
            })?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let skip = name.starts_with('.')
                || name == "__pycache__"
                || name.ends_with(".pyc")
                || name.ends_with(".so");
            if skip {
                continue;
            }
            let path = entry.path();
            let relative = format!("{prefix}/{name}");
            if path.is_dir() {
                pending.push((relative, path));
            } else {
                files.push(WheelFile::from_disk(relative, path)?);
            }
        }
    }
    if !files.iter().any(|file| file.path == "kwheel/__init__.py") {
        return Err(Error::Read {
            path: dir.join("__init__.py"),
            source: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "the kwheel package has no __init__.py",
            ),
        });
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runtime_wheel_is_named_for_cpython_3_9_abi3_and_glibc_2_28() {
        let filename =
            WheelFilename::new(DISTRIBUTION, "0.1.0", PYTHON_TAG, ABI_TAG, PLATFORM_TAG).unwrap();
        assert_eq!(
            filename.to_string(),
            "kwheel-0.1.0-cp39-abi3-manylinux_2_28_x86_64.whl"
        );
    }

    #[test]
    fn this_checkout_is_a_source_workspace() {
        let workspace = source_workspace().expect("the checkout has prebuilt/python");
        assert!(workspace
            .join("prebuilt/python/kwheel/__init__.py")
            .is_file());
    }

    #[test]
    fn a_failed_build_keeps_the_end_of_its_output() {
        let text: String = (1..=50).map(|n| format!("line {n}\n")).collect();
        let tail = last_lines(&text, 3);
        assert_eq!(tail, "line 48\nline 49\nline 50");
    }
}
