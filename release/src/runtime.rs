//! The `kwheel` wheels: the `kwheel` command and `prebuilt`'s loader as a CPython extension
//! module (stable ABI, 3.9+), for glibc 2.28 on x86_64 and aarch64, built with `cargo zigbuild`
//! from this workspace. Every kernel library's wheel requires one of them. Building them is
//! kwheel's own release job (`kwheel release build-kwheel`), never a kernel library's.
//!
//! ```text
//! prebuilt/python/kwheel/{__init__,build}.py ──────────────────┐
//! cargo zigbuild --release -p kwheel-python -p kwheel          │
//!   --target {x86_64,aarch64}-unknown-linux-gnu.2.28           │
//!   → lib_kwheel.so, kwheel ───────────────────────────────────┴─► kwheel-0.1.0-cp39-abi3-manylinux_2_28_{x86_64,aarch64}.whl
//!                                                                  ├── kwheel/__init__.py
//!                                                                  ├── kwheel/_kwheel.abi3.so      GLIBC ≤ 2.28
//!                                                                  ├── kwheel/build.py             the PEP 517 backend
//!                                                                  ├── kwheel-0.1.0.data/scripts/kwheel
//!                                                                  └── kwheel-0.1.0.dist-info/
//! ```
//!
//! | step | what happens |
//! | --- | --- |
//! | build | one `cargo zigbuild` for the module and the command (the `.2.28` suffix makes zig link against glibc 2.28's symbol versions); either may be given prebuilt instead |
//! | package | every file of `prebuilt/python/kwheel/` but caches, the module as `kwheel/_kwheel.abi3.so`, the command as a script, installed on `PATH` by pip as maturin's and uv's are |
//! | writing | [`write_wheel`](crate::write_wheel) audits the module and the command against manylinux_2_28 for the wheel's architecture before the wheel exists: a symbol version newer than GLIBC_2.28 fails the build, naming it |
//! | after writing | the wheel is verified as `kwheel wheel verify` would; a failure removes it |
//!
//! Where zig comes from, first found wins (none of them moves when `XDG_CACHE_HOME` changes
//! after `ci/setup-wheel`, unless it was set when `ci/setup-wheel` ran):
//!
//! | where | used when |
//! | --- | --- |
//! | `CARGO_ZIGBUILD_ZIG_PATH` | set: a zig executable, left to `cargo zigbuild` |
//! | `KWHEEL_ZIG` | set: the `ziglang` directory `ci/setup-wheel` fills (`ziglang/zig` inside), or a zig executable |
//! | `${XDG_CACHE_HOME}/kwheel/zig/ziglang/zig`, then `~/.cache/kwheel/zig/ziglang/zig` | the file exists (`ci/setup-wheel` puts `ziglang` there) |
//! | `python3 -m ziglang`, then `zig` on `PATH` | otherwise, as `cargo zigbuild` searches (`pip install ziglang`) |

use prebuilt::untrusted::Unreadable;
use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::str::FromStr;

use crate::library::{write_verified_wheel, BuiltWheel, REQUIRES_PYTHON};
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

/// The Rust package of the `kwheel` command (the workspace root).
pub const COMMAND_CRATE: &str = "kwheel";

/// The directory of the module's crate, relative to the workspace; it holds the `kwheel/`
/// package too.
pub const PYTHON_CRATE_DIR: &str = "prebuilt/python";

/// The Python package's directory name, in the crate directory and in the wheel.
pub const PACKAGE_DIR: &str = "kwheel";

/// The extension module's path inside the wheel.
pub const MODULE_PATH: &str = "kwheel/_kwheel.abi3.so";

/// The Rust target of the x86_64 module; zig links it against glibc 2.28.
pub const ZIGBUILD_TARGET: &str = "x86_64-unknown-linux-gnu.2.28";

/// The shared library cargo writes for `[lib] name = "_kwheel"`.
const LIBRARY_FILE: &str = "lib_kwheel.so";

/// The variable that names zig's `ziglang` directory (or a zig executable).
pub const ZIG_DIR_ENV: &str = "KWHEEL_ZIG";

/// The variable `cargo zigbuild` reads for a zig executable.
pub const ZIGBUILD_ZIG_PATH_ENV: &str = "CARGO_ZIGBUILD_ZIG_PATH";

/// An architecture the `kwheel` wheels are built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RuntimeArch {
    /// x86-64 hosts.
    X86_64,
    /// aarch64 hosts: Grace Hopper (GH200) and Grace Blackwell (GB200).
    Aarch64,
}

impl RuntimeArch {
    /// Every architecture, in the order wheels are built.
    pub const ALL: [RuntimeArch; 2] = [RuntimeArch::X86_64, RuntimeArch::Aarch64];

    /// The architecture of this process, when wheels are built for it.
    pub fn host() -> Option<RuntimeArch> {
        match std::env::consts::ARCH {
            "x86_64" => Some(RuntimeArch::X86_64),
            "aarch64" => Some(RuntimeArch::Aarch64),
            _ => None,
        }
    }

    /// The name in platform tags (`x86_64`, `aarch64`).
    pub fn name(self) -> &'static str {
        match self {
            RuntimeArch::X86_64 => "x86_64",
            RuntimeArch::Aarch64 => "aarch64",
        }
    }

    /// The Rust target triple (`aarch64-unknown-linux-gnu`).
    pub fn rust_target(self) -> String {
        format!("{}-unknown-linux-gnu", self.name())
    }

    /// The target `cargo zigbuild` builds: the triple with the glibc version to link against.
    pub fn zigbuild_target(self) -> String {
        format!("{}.2.28", self.rust_target())
    }

    /// The wheel's platform tag (`manylinux_2_28_aarch64`).
    pub fn platform_tag(self) -> String {
        format!("manylinux_2_28_{}", self.name())
    }
}

impl fmt::Display for RuntimeArch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for RuntimeArch {
    type Err = String;

    fn from_str(text: &str) -> Result<RuntimeArch, String> {
        match text {
            "x86_64" | "amd64" => Ok(RuntimeArch::X86_64),
            "aarch64" | "arm64" => Ok(RuntimeArch::Aarch64),
            other => Err(format!(
                "unknown architecture `{other}`: the kwheel wheels are built for x86_64 and aarch64"
            )),
        }
    }
}

/// Where the Python module comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NativeModule {
    /// Built from the workspace with `cargo zigbuild`, in `target_dir` (default:
    /// [`default_target_dir`], apart from the workspace's own builds so that a running `cargo`
    /// never holds its lock). The command, when built, is built there too.
    Build {
        /// The cargo target directory.
        target_dir: Option<PathBuf>,
    },
    /// A module built before (`lib_kwheel.so`); it is audited like a built one.
    Prebuilt(PathBuf),
}

/// Where the `kwheel` command in the wheel's scripts comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NativeCommand {
    /// Built with the module, by the same `cargo zigbuild`.
    Build,
    /// A `kwheel` executable built before; it is audited like a built one.
    Prebuilt(PathBuf),
    /// No command: a wheel with the runtime module only (for tests of the module alone).
    Omit,
}

/// What [`build_runtime_wheel`] builds.
#[derive(Clone, Debug)]
pub struct RuntimeWheelOptions {
    /// The kwheel workspace: the root `Cargo.toml` and `prebuilt/python/`.
    pub workspace: PathBuf,
    /// The directory the wheel is written to.
    pub out: PathBuf,
    /// The architecture.
    pub arch: RuntimeArch,
    /// Where the Python module comes from.
    pub module: NativeModule,
    /// Where the `kwheel` command comes from.
    pub command: NativeCommand,
    /// Show cargo's output as it builds (otherwise it is kept for the error message).
    pub progress: bool,
}

impl RuntimeWheelOptions {
    /// Builds the module and the command from `workspace` for this machine's architecture
    /// (x86_64 elsewhere) into the default target directory, quietly.
    pub fn new(workspace: impl Into<PathBuf>, out: impl Into<PathBuf>) -> RuntimeWheelOptions {
        RuntimeWheelOptions {
            workspace: workspace.into(),
            out: out.into(),
            arch: RuntimeArch::host().unwrap_or(RuntimeArch::X86_64),
            module: NativeModule::Build { target_dir: None },
            command: NativeCommand::Build,
            progress: false,
        }
    }
}

/// The kwheel clone at or above the current directory: what `release build-kwheel` builds
/// the wheels from when not given `--workspace`. `None` outside a clone. Never the directory
/// this binary was compiled in: an installed `kwheel` carries no path of the machine it was
/// built on.
pub fn source_workspace() -> Option<PathBuf> {
    let here = std::env::current_dir().ok()?;
    find_source_workspace(&here)
}

/// The first of `start` and its ancestors that is a kwheel clone (a `Cargo.toml` beside
/// `prebuilt/python/Cargo.toml` and the `kwheel` Python package).
pub fn find_source_workspace(start: &Path) -> Option<PathBuf> {
    start
        .ancestors()
        .find(|dir| {
            let python = dir.join(PYTHON_CRATE_DIR);
            dir.join("Cargo.toml").is_file()
                && python.join("Cargo.toml").is_file()
                && python.join(PACKAGE_DIR).join("__init__.py").is_file()
        })
        .map(Path::to_owned)
}

/// The variable naming the cargo target directory of the cross builds, so that every build
/// of kwheel's wheels (`release build-kwheel`, `release check`, the tests) shares one, kept
/// between runs.
pub const TARGET_DIR_ENV: &str = "KWHEEL_PYTHON_TARGET_DIR";

/// Where the wheels' module and command are built unless told: `KWHEEL_PYTHON_TARGET_DIR`,
/// else `${XDG_CACHE_HOME:-~/.cache}/kwheel/runtime-target`. One directory for every build of
/// kwheel's own wheels (`release build-kwheel`, `release check`, the tests, every clone), so
/// none of them compiles from cold what another already built; apart from the workspace's own
/// `target/`, whose lock a running `cargo` holds. `_workspace` is the clone being built, for a
/// default that would follow it (none does).
pub fn default_target_dir(_workspace: &Path) -> PathBuf {
    if let Some(dir) = std::env::var_os(TARGET_DIR_ENV).filter(|dir| !dir.is_empty()) {
        return PathBuf::from(dir);
    }
    prebuilt::cache::cache_home_or_unwritable()
        .join("kwheel")
        .join("runtime-target")
}

/// The wheel's file name for `arch`.
pub fn runtime_wheel_filename(arch: RuntimeArch) -> Result<WheelFilename, Error> {
    WheelFilename::new(
        DISTRIBUTION,
        KWHEEL_VERSION,
        PYTHON_TAG,
        ABI_TAG,
        &arch.platform_tag(),
    )
}

/// Builds a `kwheel` wheel (see the module docs for the steps).
pub fn build_runtime_wheel(options: &RuntimeWheelOptions) -> Result<BuiltWheel, Error> {
    let target_dir = match &options.module {
        NativeModule::Build {
            target_dir: Some(dir),
        } => dir.clone(),
        _ => default_target_dir(&options.workspace),
    };
    let build_module = matches!(options.module, NativeModule::Build { .. });
    let build_command = options.command == NativeCommand::Build;
    let mut packages = Vec::new();
    if build_module {
        packages.push(PYTHON_CRATE);
    }
    if build_command {
        packages.push(COMMAND_CRATE);
    }
    if !packages.is_empty() {
        zigbuild(
            &options.workspace,
            &target_dir,
            options.arch,
            &packages,
            options.progress,
        )?;
    }
    let built = |name: &str| -> Result<PathBuf, Error> {
        let path = target_dir
            .join(options.arch.rust_target())
            .join("release")
            .join(name);
        if path.is_file() {
            Ok(path)
        } else {
            Err(Error::Build {
                command: format!(
                    "cargo zigbuild --release --target {}",
                    options.arch.zigbuild_target()
                ),
                outcome: format!("succeeded but wrote no `{}`", path.display()),
                output: String::new(),
            })
        }
    };
    let module = match &options.module {
        NativeModule::Prebuilt(path) => path.clone(),
        NativeModule::Build { .. } => built(LIBRARY_FILE)?,
    };
    let mut files = package_files(&options.workspace.join(PYTHON_CRATE_DIR).join(PACKAGE_DIR))?;
    files.push(WheelFile::from_disk(MODULE_PATH, &module)?);
    let command = match &options.command {
        NativeCommand::Build => Some(built(COMMAND_CRATE)?),
        NativeCommand::Prebuilt(path) => Some(path.clone()),
        NativeCommand::Omit => None,
    };
    if let Some(command) = command {
        let mut file = WheelFile::from_disk(command_path(), command)?;
        file.executable = true;
        files.push(file);
    }
    let metadata = Metadata {
        name: DISTRIBUTION.to_owned(),
        version: KWHEEL_VERSION.to_owned(),
        summary: Some(
            "Prebuilt CUDA kernels in Python wheels: the kwheel command, the loader and the \
             build backend"
                .to_owned(),
        ),
        requires_python: Some(REQUIRES_PYTHON.to_owned()),
        // The build backend asks for `tomli` itself where there is no `tomllib` (PEP 517's
        // get_requires_for_build_*), so the runtime depends on nothing.
        requires_dist: Vec::new(),
    };
    write_verified_wheel(
        WheelSpec {
            filename: runtime_wheel_filename(options.arch)?,
            metadata,
            files,
            out_dir: options.out.clone(),
            modified: None,
        },
        None,
    )
}

/// The `kwheel` command's path inside the wheel (`kwheel-0.1.0.data/scripts/kwheel`): a
/// script, which pip installs on `PATH`.
pub fn command_path() -> String {
    format!("{DISTRIBUTION}-{KWHEEL_VERSION}.data/scripts/{COMMAND_CRATE}")
}

/// Builds the Python module alone with `cargo zigbuild --release` for x86_64 in `target_dir`
/// and returns the shared library's path.
pub fn build_python_module(
    workspace: &Path,
    target_dir: &Path,
    progress: bool,
) -> Result<PathBuf, Error> {
    zigbuild(
        workspace,
        target_dir,
        RuntimeArch::X86_64,
        &[PYTHON_CRATE],
        progress,
    )?;
    Ok(target_dir
        .join(RuntimeArch::X86_64.rust_target())
        .join("release")
        .join(LIBRARY_FILE))
}

/// Runs `cargo zigbuild --release` for `packages` and `arch` in `target_dir`. Cargo's output
/// is reported line by line when `progress` is set, under a heading; otherwise its end is part
/// of the error.
fn zigbuild(
    workspace: &Path,
    target_dir: &Path,
    arch: RuntimeArch,
    packages: &[&str],
    progress: bool,
) -> Result<(), Error> {
    if find_cargo_subcommand("cargo-zigbuild").is_none() {
        return Err(Error::MissingTool {
            tool: "cargo-zigbuild".into(),
            hint: "run `bash ci/setup-wheel`, or `cargo install cargo-zigbuild --locked`".into(),
        });
    }
    let zig = locate_zig().ok_or_else(|| Error::MissingTool {
        tool: "zig".into(),
        hint: format!(
            "run `bash ci/setup-wheel` (it installs `ziglang` under ~/.cache/kwheel/zig), `pip \
             install ziglang`, or set {ZIG_DIR_ENV} to a `ziglang` directory"
        ),
    })?;
    if let Some(missing) = missing_rust_target(arch) {
        return Err(Error::MissingTool {
            tool: format!("the Rust standard library for {}", arch.rust_target()),
            hint: format!("run `rustup target add {missing}` (`bash ci/setup-tests` does)"),
        });
    }
    let mut command = Command::new(cargo());
    command
        .arg("zigbuild")
        .args(["--release", "--locked"])
        .args(packages.iter().flat_map(|package| ["-p", package]))
        .arg("--target")
        .arg(arch.zigbuild_target())
        .arg("--manifest-path")
        .arg(workspace.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(target_dir)
        // The wheel needs no debug info, and the standard library's would triple its size.
        .env("CARGO_PROFILE_RELEASE_STRIP", "debuginfo");
    if let Zig::Path(path) = &zig {
        command.env(ZIGBUILD_ZIG_PATH_ENV, path);
    }
    if progress {
        tracing::info!(
            "building {} for {} with cargo zigbuild (zig: {zig}; target dir {})",
            packages.join(" and "),
            arch.zigbuild_target(),
            target_dir.display()
        );
    }
    run(command, progress)
}

/// A zig that `cargo zigbuild` can use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Zig {
    /// An executable, passed on as `CARGO_ZIGBUILD_ZIG_PATH`.
    Path(PathBuf),
    /// Found by `cargo zigbuild` itself: `python3 -m ziglang` or `zig` on `PATH`.
    Search(&'static str),
}

impl fmt::Display for Zig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Zig::Path(path) => write!(f, "{}", path.display()),
            Zig::Search(how) => f.write_str(how),
        }
    }
}

/// How `cargo zigbuild` will find zig (see the module docs for the order), or `None`.
pub fn locate_zig() -> Option<Zig> {
    let set = |name: &str| std::env::var_os(name).filter(|value| !value.is_empty());
    if let Some(path) = set(ZIGBUILD_ZIG_PATH_ENV) {
        return Some(Zig::Path(PathBuf::from(path)));
    }
    if let Some(dir) = set(ZIG_DIR_ENV) {
        let dir = PathBuf::from(dir);
        let zig = if dir.is_file() {
            dir
        } else {
            dir.join("ziglang/zig")
        };
        return zig.is_file().then_some(Zig::Path(zig));
    }
    let mut homes: Vec<PathBuf> = set("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    homes.extend(home().map(|home| home.join(".cache")));
    for cache in homes {
        let zig = cache.join("kwheel/zig/ziglang/zig");
        if zig.is_file() {
            return Some(Zig::Path(zig));
        }
    }
    let python_module = Command::new("python3")
        .args(["-m", "ziglang", "version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if python_module {
        return Some(Zig::Search("python3 -m ziglang"));
    }
    prebuilt::env::program_on_path("zig").map(|_| Zig::Search("zig on PATH"))
}

/// How `cargo zigbuild` will find zig, as text, or `None` when it will not.
pub fn find_zig() -> Option<String> {
    locate_zig().map(|zig| zig.to_string())
}

/// Whether `cargo zigbuild` is installed: `cargo-zigbuild` on `PATH` or in `$CARGO_HOME/bin`.
pub fn find_cargo_zigbuild() -> Option<PathBuf> {
    find_cargo_subcommand("cargo-zigbuild")
}

/// The target to `rustup target add` when the standard library for `arch` is missing from
/// the active toolchain; `None` when it is there (or the sysroot cannot be read, in which
/// case cargo says what is wrong).
pub fn missing_rust_target(arch: RuntimeArch) -> Option<String> {
    let output = Command::new(rustc())
        .args(["--print", "sysroot"])
        .output()
        .ok()
        .filter(|output| output.status.success())?;
    let sysroot = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    let target = arch.rust_target();
    let lib = sysroot.join("lib/rustlib").join(&target).join("lib");
    (!lib.is_dir()).then_some(target)
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

/// The rustc cargo would use (`RUSTC`), else `rustc` on `PATH`.
fn rustc() -> OsString {
    std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into())
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
        .or_else(|| prebuilt::env::program_on_path(name))
}

/// Runs a build command; a failure carries the end of its output. With `progress`, each line
/// it prints is also a diagnostic (`tracing`) as it comes, so the caller decides where it goes.
fn run(mut command: Command, progress: bool) -> Result<(), Error> {
    let shown = describe(&command);
    let output = if progress {
        run_reporting_lines(&mut command)
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

/// Runs `command` with its stdout and stderr read line by line, each line reported as it
/// comes; its exit status and everything it printed (stdout's lines, then stderr's).
fn run_reporting_lines(
    command: &mut Command,
) -> std::io::Result<(std::process::ExitStatus, String)> {
    use std::io::BufRead as _;
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let report = |stream: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            for line in std::io::BufReader::new(stream)
                .lines()
                .map_while(Result::ok)
            {
                tracing::info!("{line}");
                text.push_str(&line);
                text.push('\n');
            }
            text
        })
    };
    let stdout = child.stdout.take().map(|out| report(Box::new(out)));
    let stderr = child.stderr.take().map(|err| report(Box::new(err)));
    let status = child.wait()?;
    let text = [stdout, stderr]
        .into_iter()
        .flatten()
        .map(|reader| reader.join().unwrap_or_default())
        .collect();
    Ok((status, text))
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
    let keep = |name: &str| {
        !(name.starts_with('.')
            || name == "__pycache__"
            || name.ends_with(".pyc")
            || name.ends_with(".so"))
    };
    let files = crate::tree::files_under(dir, keep)?
        .into_iter()
        .map(|(relative, path)| WheelFile::from_disk(format!("{PACKAGE_DIR}/{relative}"), path))
        .collect::<Result<Vec<_>, _>>()?;
    if !files.iter().any(|file| file.path == "kwheel/__init__.py") {
        return Err(Error::Read(Unreadable {
            path: dir.join("__init__.py"),
            source: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "the kwheel package has no __init__.py",
            ),
        }));
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runtime_wheels_are_named_for_cpython_3_9_abi3_and_glibc_2_28() {
        assert_eq!(
            runtime_wheel_filename(RuntimeArch::X86_64)
                .unwrap()
                .to_string(),
            format!("kwheel-{KWHEEL_VERSION}-cp39-abi3-manylinux_2_28_x86_64.whl")
        );
        assert_eq!(
            runtime_wheel_filename(RuntimeArch::Aarch64)
                .unwrap()
                .to_string(),
            format!("kwheel-{KWHEEL_VERSION}-cp39-abi3-manylinux_2_28_aarch64.whl")
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
    fn a_directory_outside_a_clone_has_no_source_workspace() {
        let outside = std::env::temp_dir().join(format!("kwheel-no-clone-{}", std::process::id()));
        std::fs::create_dir_all(outside.join("prebuilt/python")).unwrap();
        // A Cargo.toml alone is not a kwheel clone.
        std::fs::write(outside.join("Cargo.toml"), "[workspace]\n").unwrap();
        std::fs::write(outside.join("prebuilt/python/Cargo.toml"), "").unwrap();
        assert_eq!(find_source_workspace(&outside.join("prebuilt")), None);
        std::fs::create_dir_all(outside.join("prebuilt/python/kwheel")).unwrap();
        std::fs::write(outside.join("prebuilt/python/kwheel/__init__.py"), "").unwrap();
        assert_eq!(
            find_source_workspace(&outside.join("prebuilt/python")),
            Some(outside.clone())
        );
        std::fs::remove_dir_all(&outside).unwrap();
    }

    #[test]
    fn architectures_parse_and_name_their_targets() {
        assert_eq!("arm64".parse(), Ok(RuntimeArch::Aarch64));
        assert_eq!("x86_64".parse(), Ok(RuntimeArch::X86_64));
        assert_eq!(
            RuntimeArch::Aarch64.zigbuild_target(),
            "aarch64-unknown-linux-gnu.2.28"
        );
        assert_eq!(RuntimeArch::X86_64.zigbuild_target(), ZIGBUILD_TARGET);
        let error = "riscv64".parse::<RuntimeArch>().unwrap_err();
        assert!(error.contains("x86_64 and aarch64"), "{error}");
    }

    #[test]
    fn the_command_is_a_script_of_this_version() {
        assert_eq!(
            command_path(),
            format!("kwheel-{KWHEEL_VERSION}.data/scripts/kwheel")
        );
    }

    #[test]
    fn a_failed_build_keeps_the_end_of_its_output() {
        let text: String = (1..=50).map(|n| format!("line {n}\n")).collect();
        let tail = last_lines(&text, 3);
        assert_eq!(tail, "line 48\nline 49\nline 50");
    }
}
