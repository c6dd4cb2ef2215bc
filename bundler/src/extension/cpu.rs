//! The CPU architectures a module's host code is built for, and for each the host compiler and
//! the torch it compiles and links with.
//!
//! | CPU | compiler | torch |
//! | --- | --- | --- |
//! | this machine's | `KWHEEL_CXX_<CPU>`, else `g++` | `KWHEEL_TORCH`, else `kwheel/torch` |
//! | another | `KWHEEL_CXX_<CPU>`, else `kwheel/cross/<cpu>/bin/<cpu>-linux-gnu-g++` (what `ci/setup-aarch64` unpacks), else `<cpu>-linux-gnu-g++` on `PATH` | `KWHEEL_TORCH_<CPU>`, else `kwheel/torch-<cpu>` |
//!
//! (`kwheel/…` is under `${XDG_CACHE_HOME:-~/.cache}`.) nvcc compiles a `.cu` unit's host half
//! with the same compiler (`-ccbin`); device code does not depend on the CPU. Another CPU
//! whose compiler or torch is missing is a skip with the reason, and the wheel is then tagged
//! for the CPUs every module has.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::manifest::{ExtensionSpec, Manifest};
use crate::toolchain::{compiler_include_dirs, host_include_dirs};
use crate::torch::{serves_modules, TorchHeaders, TorchPlace};

pub use prebuilt::module::MODULE_CPUS;

/// This machine's CPU architecture.
pub fn host_cpu() -> &'static str {
    std::env::consts::ARCH
}

/// The CPUs `spec` is built for, this machine's first (its plan is the record's inputs).
pub fn module_cpus(spec: &ExtensionSpec) -> Vec<String> {
    let mut cpus: Vec<String> = match &spec.cpus {
        Some(cpus) => cpus.clone(),
        None => MODULE_CPUS.iter().map(|cpu| (*cpu).to_owned()).collect(),
    };
    cpus.sort_by_key(|cpu| cpu != host_cpu());
    cpus
}

/// Everything that builds a module's host code for one CPU.
#[derive(Clone, Debug)]
pub struct HostTarget {
    /// The CPU architecture (`aarch64`).
    pub cpu: String,
    /// The C++ compiler, which links too.
    pub cxx: PathBuf,
    /// Its version line less the program's name (`(Debian 12.2.0-14) 12.2.0`).
    pub cxx_version: String,
    /// Whether it is not this machine's own (`g++`): nvcc is then told to use it (`-ccbin`).
    pub cross: bool,
    /// Its own include dirs and the C library's, which a module's scan follows but does not
    /// hash (the compiler's version stands for them).
    pub compiler_dirs: Vec<PathBuf>,
    /// The torch its modules compile and link against.
    pub torch: TorchHeaders,
}

/// The environment variable naming the C++ compiler for `cpu`: `KWHEEL_CXX_AARCH64`.
pub fn compiler_variable(cpu: &str) -> String {
    format!("KWHEEL_CXX_{}", cpu.to_ascii_uppercase())
}

/// Where the torch for `cpu` is looked for.
pub fn torch_place(cpu: &str) -> &'static TorchPlace {
    if cpu == host_cpu() {
        &TorchPlace::HOST
    } else if cpu == "aarch64" {
        &TorchPlace::AARCH64
    } else {
        &TorchPlace::X86_64
    }
}

/// The host target for `cpu`. `Err` is why modules cannot be built for it here: for this
/// machine's CPU the caller's error (a missing torch fails the build, as it always has), for
/// another a skip's reason.
pub fn host_target(manifest: &Manifest, cpu: &str) -> Result<HostTarget, HostTargetError> {
    host_target_from(manifest, cpu, |name| std::env::var_os(name))
}

/// Why a CPU has no host target.
#[derive(Debug, thiserror::Error)]
pub enum HostTargetError {
    /// No torch for it (or not the pinned one).
    #[error(transparent)]
    Torch(#[from] Box<crate::torch::TorchError>),
    /// No compiler for it, or one that is not for it.
    #[error("{0}")]
    Compiler(String),
    /// Another CPU's compiler or torch, named by its variable, cannot serve: an error where
    /// what is merely missing is a skip.
    #[error("{0} (named by {1})")]
    Named(String, String),
}

/// [`host_target`] with the environment read through `env`.
pub fn host_target_from(
    manifest: &Manifest,
    cpu: &str,
    env: impl Fn(&str) -> Option<OsString>,
) -> Result<HostTarget, HostTargetError> {
    let place = torch_place(cpu);
    let cross = cpu != host_cpu();
    let variable = compiler_variable(cpu);
    let named = env(&variable)
        .filter(|value| !value.is_empty())
        .map(PathBuf::from);
    // Another CPU's torch or compiler named outright that cannot serve is an error.
    let torch_named = cross && env(place.variable).is_some_and(|value| !value.is_empty());
    let escalate = |named: bool, variable: &str, error: HostTargetError| match named {
        true => HostTargetError::Named(error.to_string(), variable.to_owned()),
        false => error,
    };
    let torch = TorchHeaders::find_where(&env, place)
        .and_then(|torch| serves_modules(manifest, torch, place))
        .map_err(|error| escalate(torch_named, place.variable, Box::new(error).into()))?;
    check_torch_cpu(&torch, cpu).map_err(|reason| {
        escalate(
            torch_named,
            place.variable,
            HostTargetError::Compiler(reason),
        )
    })?;
    let cxx_named = cross && named.is_some();
    let candidates: Vec<PathBuf> = match (named, cross) {
        (Some(path), _) => vec![path],
        (None, false) => vec![PathBuf::from("g++")],
        (None, true) => {
            let program = format!("{cpu}-linux-gnu-g++");
            let unpacked = prebuilt::cache::cache_home_from(&env).ok().map(|home| {
                home.join("kwheel/cross")
                    .join(cpu)
                    .join("bin")
                    .join(&program)
            });
            unpacked
                .into_iter()
                .chain([PathBuf::from(&program)])
                .collect()
        }
    };
    let mut tried = Vec::new();
    for cxx in candidates {
        if cxx.components().count() > 1 && !cxx.is_file() {
            tried.push(format!("no file at {}", cxx.display()));
            continue;
        }
        match compiler_version(&cxx) {
            Ok(version) => {
                check_compiler_cpu(&cxx, cpu).map_err(|reason| {
                    escalate(cxx_named, &variable, HostTargetError::Compiler(reason))
                })?;
                // A cross compiler's C library is its sysroot's, not the distribution's: its
                // version joins the compiler's in the key.
                let cxx_version = match (cross, c_library_version(&cxx)) {
                    (true, Some(libc)) => format!("{version}, {libc}"),
                    _ => version,
                };
                let dirs = match cross {
                    false => host_include_dirs(),
                    true => compiler_include_dirs(&cxx),
                };
                return Ok(HostTarget {
                    cpu: cpu.to_owned(),
                    cxx,
                    cxx_version,
                    cross,
                    compiler_dirs: dirs.compiler,
                    torch,
                });
            }
            Err(reason) => tried.push(reason),
        }
    }
    let how = if cpu == "aarch64" {
        " (`bash ci/setup-aarch64` unpacks Debian's; `apt install g++-aarch64-linux-gnu` installs it)"
    } else {
        ""
    };
    let error = HostTargetError::Compiler(format!(
        "no C++ compiler for {cpu}{how}: {}; name one in {variable}",
        tried.join("; ")
    ));
    Err(escalate(cxx_named, &variable, error))
}

/// The C library a compiler compiles against, from its own preprocessor: `glibc 2.36`.
fn c_library_version(cxx: &Path) -> Option<String> {
    use std::io::Write as _;
    let mut child = Command::new(cxx)
        .args(["-E", "-P", "-x", "c++", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    child
        .stdin
        .take()?
        .write_all(b"#include <features.h>\nkwheel_glibc __GLIBC__ __GLIBC_MINOR__\n")
        .ok()?;
    let output = child.wait_with_output().ok()?;
    let text = String::from_utf8_lossy(&output.stdout);
    let line = text
        .lines()
        .find_map(|line| line.strip_prefix("kwheel_glibc "))?;
    let mut parts = line.split_whitespace();
    let (major, minor) = (parts.next()?, parts.next()?);
    let numeric = |part: &str| !part.is_empty() && part.chars().all(|c| c.is_ascii_digit());
    (numeric(major) && numeric(minor)).then(|| format!("glibc {major}.{minor}"))
}

/// A compiler's `--version` first line less the program's name: `(Debian 12.2.0-14) 12.2.0`.
pub fn compiler_version(cxx: &Path) -> Result<String, String> {
    let output = Command::new(cxx)
        .arg("--version")
        .output()
        .map_err(|error| format!("cannot run `{}`: {error}", cxx.display()))?;
    prebuilt::module::compile::compiler_version_line(&String::from_utf8_lossy(&output.stdout))
        .filter(|_| output.status.success())
        .ok_or_else(|| format!("`{} --version` printed no version", cxx.display()))
}

/// The GNU triplet's CPU a compiler targets (`-dumpmachine`) must be `cpu`.
fn check_compiler_cpu(cxx: &Path, cpu: &str) -> Result<(), String> {
    let output = Command::new(cxx)
        .arg("-dumpmachine")
        .output()
        .map_err(|error| format!("cannot run `{} -dumpmachine`: {error}", cxx.display()))?;
    let machine = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    if !output.status.success() || machine.is_empty() || machine.contains(char::is_whitespace) {
        return Err(format!(
            "`{} -dumpmachine` names no target (`{machine}`): not a gcc-like compiler; name \
             one for {cpu} in {}",
            cxx.display(),
            compiler_variable(cpu)
        ));
    }
    let target = machine.split('-').next().unwrap_or_default();
    if target == cpu {
        Ok(())
    } else {
        Err(format!(
            "`{}` builds for {machine}, not {cpu}: name a compiler for {cpu} in {}",
            cxx.display(),
            compiler_variable(cpu)
        ))
    }
}

/// torch's `lib/libc10.so` must be a library for `cpu`: a torch for another CPU links nothing.
fn check_torch_cpu(torch: &TorchHeaders, cpu: &str) -> Result<(), String> {
    let library = torch.package.join("lib").join("libc10.so");
    let mut header = [0u8; 20];
    let read = std::fs::File::open(&library)
        .and_then(|mut file| std::io::Read::read_exact(&mut file, &mut header));
    if read.is_err() {
        // A torch of headers only (some tests' fixtures) links nothing either way.
        return Ok(());
    }
    let found = prebuilt::module::compile::elf_cpu(&header);
    if found == cpu {
        return Ok(());
    }
    let place = torch_place(cpu);
    Err(format!(
        "the torch at {} ({}) is built for {found}, not {cpu}: point {} at a torch for {cpu} \
         (`bash {}` installs one)",
        torch.package.display(),
        torch.found_by,
        place.variable,
        place.setup
    ))
}
