//! Compiling and linking an extension module: the one recipe the bundler (`bundle-kernels`)
//! and the module JIT (at import time) both run. Each caller describes the build in a
//! [`ModuleRecipe`] (where the sources are, what is on the include path, the flags, the
//! compilers, torch's and the toolkit's folders); [`build_module`] compiles every translation
//! unit in its own thread and links one shared library in a temporary folder, and returns its
//! bytes or the step that failed with the tail of its log.
//!
//! ```text
//! ModuleRecipe ─► module_commands ─► nvcc -c unit.cu ─┐ (one thread each)
//!                                    g++  -c unit.cpp ─┼─► g++ -shared -s ─► check ─► bytes
//!                                    …                ─┘
//! ```
//!
//! Reproducible byte for byte from any folder: the compilers run in [`ModuleRecipe::folder`]
//! on relative paths, `-ffile-prefix-map` turns that folder into `.` and the folder holding
//! torch's package into `torch` (the registration macros expand `__FILE__`), `-frandom-seed`
//! and cudafe's `--orig_src_path_name` take the source's relative path (nvcc otherwise names
//! internal symbols after its absolute path and a temporary file), and the link strips the
//! symbol table, which held nvcc's temporary file names. torch's and CUDA's libraries are
//! linked by name, with no run path: the process that loads the module has loaded them
//! already (torch has).

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::fatbin::clear_line_table_times;
use super::{write_classic_extension_h, Abi};
use crate::compile::nvcc_command;
use crate::compile::work::{absolute, toolkit_root, SourceTree, WorkDir, WORK_ROOT};
use crate::{Arch, ArchKind};

/// The flags every unit's host code is compiled with, before the recipe's: position-independent
/// code for a shared library, optimised as `cpp_extension` builds by default.
pub const BASE_FLAGS: [&str; 2] = ["-fPIC", "-O2"];

/// How many lines of a failed step's output an error keeps.
pub const LOG_TAIL_LINES: usize = 40;

/// The header every unit's host code is compiled with first (`-include`), in the build's
/// temporary folder: it keeps a module's glibc symbols at 2.28, the glibc of torch's own
/// wheels (`manylinux_2_28`), whatever glibc the build machine has ([`GLIBC_2_28_TEXT`]).
const GLIBC_2_28_HEADER: &str = "kwheel-glibc-2.28.h";

/// What [`GLIBC_2_28_HEADER`] says. libstdc++'s headers (GCC 11 and later) read glibc 2.32's
/// `__libc_single_threaded` wherever `<sys/single_threaded.h>` exists, to skip atomic
/// reference counts in a process with one thread; here it is a hidden variable of the module
/// that says "not single-threaded", so the counts are always atomic, as with an older glibc.
/// And functions that newer glibcs version anew bind their first version (`GLIBC_2.2.5` on
/// x86_64, `GLIBC_2.17` on aarch64): `pthread_once`, which `std::call_once` calls (moved into
/// libc in 2.34), and `exp`, `exp2`, `log`, `log2`, `pow` (2.29). Device code is left alone.
const GLIBC_2_28_TEXT: &str = "\
/* Written by kwheel: glibc symbols no newer than 2.28 (manylinux_2_28). */
#if defined(__cplusplus) && !defined(__CUDA_ARCH__)
#define __libc_single_threaded kwheel_libc_single_threaded
extern \"C\" {
__attribute__((weak, visibility(\"hidden\"))) char kwheel_libc_single_threaded = 0;
}
#if defined(__x86_64__)
#define KWHEEL_GLIBC_FIRST \"GLIBC_2.2.5\"
#elif defined(__aarch64__)
#define KWHEEL_GLIBC_FIRST \"GLIBC_2.17\"
#endif
#ifdef KWHEEL_GLIBC_FIRST
__asm__(\".symver pthread_once,pthread_once@\" KWHEEL_GLIBC_FIRST);
__asm__(\".symver exp,exp@\" KWHEEL_GLIBC_FIRST);
__asm__(\".symver exp2,exp2@\" KWHEEL_GLIBC_FIRST);
__asm__(\".symver log,log@\" KWHEEL_GLIBC_FIRST);
__asm__(\".symver log2,log2@\" KWHEEL_GLIBC_FIRST);
__asm__(\".symver pow,pow@\" KWHEEL_GLIBC_FIRST);
#endif
#endif
";

/// The folder under the build's temporary folder that holds the classic-ABI
/// `<torch/extension.h>` ([`write_classic_extension_h`]).
const SHIM_DIR: &str = "torch-shim";

/// Everything one module's build needs, as plain data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleRecipe {
    /// The module's name (`_C`): the library's file is `<name>.so`.
    pub name: String,
    /// The module's key: it names the work folder the compilers run in
    /// (`/tmp/kwheel-<first 16 hex digits>`), whose path line tables record.
    pub key: String,
    /// Its ABI: a classic module gets kwheel's `<torch/extension.h>` first on its include path
    /// and links `libtorch` too.
    pub abi: Abi,
    /// The folder the compilers run in, which the sources are relative to; mapped to `.` in
    /// the module (`-ffile-prefix-map`).
    pub folder: PathBuf,
    /// The translation units, relative to [`Self::folder`], in link order: a `.cu` is compiled
    /// by nvcc, anything else by the host compiler.
    pub sources: Vec<String>,
    /// Include directories (`-I`), in order: the library's, then torch's.
    pub include_dirs: Vec<PathBuf>,
    /// The toolkit's include directories (`-I`), after [`Self::include_dirs`].
    pub toolkit_include_dirs: Vec<PathBuf>,
    /// System include directories (`-isystem`), last: Python's headers for a classic module.
    pub system_dirs: Vec<PathBuf>,
    /// The defines (`-DNAME=VALUE`).
    pub defines: BTreeMap<String, String>,
    /// nvcc's own flags, for `.cu` units.
    pub nvcc_flags: Vec<String>,
    /// The host compiler's flags, for every unit (through `-Xcompiler` for nvcc's).
    pub cxx_flags: Vec<String>,
    /// The C++ standard (`c++17`).
    pub cxx_std: String,
    /// The device code's targets, one `-gencode` each.
    pub archs: Vec<Arch>,
    /// torch's package folder (`…/site-packages/torch`): its `lib/` is linked against, and its
    /// parent folder is mapped to `torch` in the module.
    pub torch_package: PathBuf,
    /// The folders the CUDA runtime (`libcudart.so.N`) is looked for in, in order; a module
    /// with a `.cu` unit links the newest one of the first folder that has one.
    pub cuda_lib_dirs: Vec<PathBuf>,
    /// nvcc.
    pub nvcc: PathBuf,
    /// The host compiler nvcc compiles a `.cu` unit's host half with (`-ccbin`), where it is
    /// not nvcc's own choice: [`Self::cxx`] when that builds for another CPU.
    pub ccbin: Option<PathBuf>,
    /// The host C++ compiler, which also links.
    pub cxx: PathBuf,
}

/// One step of a module's build.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModuleStep {
    /// Compiling the translation unit at this relative path.
    Unit(String),
    /// Linking the shared library.
    Link,
}

impl fmt::Display for ModuleStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModuleStep::Unit(source) => write!(f, "`{source}`"),
            ModuleStep::Link => f.write_str("the link"),
        }
    }
}

/// Why a module's build failed.
#[derive(Debug, thiserror::Error)]
pub enum ModuleCompileError {
    /// No temporary folder to build in, or no shim could be written there.
    #[error("cannot prepare the build folder {}", path.display())]
    Scratch {
        /// The folder or file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A module with a `.cu` unit needs the CUDA runtime, and none was found.
    #[error(
        "no CUDA runtime (`libcudart.so.*`) in {}",
        searched.iter().map(|dir| dir.display().to_string()).collect::<Vec<_>>().join(", ")
    )]
    NoCudaRuntime {
        /// Every folder looked in.
        searched: Vec<PathBuf>,
    },
    /// A compiler could not be started.
    #[error("cannot run `{program}` for {step}")]
    Spawn {
        /// The step.
        step: ModuleStep,
        /// The program.
        program: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A compiler or the link failed.
    #[error("{step} failed (`{program}`, {status}):\n{log}")]
    Failed {
        /// The step.
        step: ModuleStep,
        /// The program.
        program: String,
        /// Its exit status.
        status: String,
        /// The last [`LOG_TAIL_LINES`] lines of its output (stdout, then stderr).
        log: String,
    },
    /// The link's output could not be read, or is no shared library.
    #[error("the link wrote no shared library at {}: {reason}", path.display())]
    NoLibrary {
        /// The file the link was to write.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}

impl ModuleCompileError {
    /// The step that failed, where one did.
    pub fn step(&self) -> Option<&ModuleStep> {
        match self {
            ModuleCompileError::Spawn { step, .. } | ModuleCompileError::Failed { step, .. } => {
                Some(step)
            }
            ModuleCompileError::NoCudaRuntime { .. } | ModuleCompileError::NoLibrary { .. } => {
                Some(&ModuleStep::Link)
            }
            ModuleCompileError::Scratch { .. } => None,
        }
    }
}

/// The commands of a module's build in a temporary folder: every unit's compile, then the
/// link.
#[derive(Debug)]
pub struct ModuleCommands {
    /// Each unit's relative path and its compile command, in the recipe's order.
    pub units: Vec<(String, Command)>,
    /// The link.
    pub link: Command,
    /// The library the link writes.
    pub output: PathBuf,
}

/// nvcc's `-gencode` for a target: SASS for `sm_90a`/`sm_100f`/`sm_90`, PTX for `compute_90`.
pub fn gencode(arch: Arch) -> String {
    let spelled = arch.to_string();
    match arch.kind {
        ArchKind::Ptx => format!("arch={spelled},code={spelled}"),
        _ => {
            let suffix = spelled.trim_start_matches("sm_");
            format!("arch=compute_{suffix},code=sm_{suffix}")
        }
    }
}

/// Whether `source` is compiled by nvcc.
pub fn is_cuda_source(source: &str) -> bool {
    source.ends_with(".cu")
}

/// Where a module's CUDA runtime is looked for, in order ([`ModuleRecipe::cuda_lib_dirs`]):
/// the toolkit `nvcc` comes from (a system install keeps it in `lib64/` or
/// `targets/<cpu>-linux/lib`, the registry's toolkit wheels in `lib/`), then the CUDA wheels
/// installed beside torch (`site-packages/nvidia/cu13/lib`, `nvidia/cuda_runtime/lib`). The
/// module links it by name only, so any copy of the same major version serves.
pub fn cuda_runtime_dirs(nvcc: &Path, torch_package: &Path) -> Vec<PathBuf> {
    let toolkit = toolkit_root(nvcc);
    let target = format!("targets/{}-linux/lib", std::env::consts::ARCH);
    let mut dirs: Vec<PathBuf> = ["lib64", "lib", target.as_str()]
        .iter()
        .map(|dir| toolkit.join(dir))
        .collect();
    dirs.extend(site_cuda_runtime_dirs(torch_package));
    dirs
}

/// The folders of the CUDA wheels installed beside torch (`site-packages/nvidia/cu13/lib`,
/// `nvidia/cuda_runtime/lib`): where a module for another CPU finds that CPU's runtime.
pub fn site_cuda_runtime_dirs(torch_package: &Path) -> Vec<PathBuf> {
    let Some(site) = torch_package.parent() else {
        return Vec::new();
    };
    let nvidia = site.join("nvidia");
    ["cu13/lib", "cuda_runtime/lib"]
        .iter()
        .map(|dir| nvidia.join(dir))
        .collect()
}

/// The newest CUDA runtime (`libcudart.so.13`) of the first folder in `dirs` that has one.
pub fn find_cuda_runtime(dirs: &[PathBuf]) -> Option<PathBuf> {
    dirs.iter().find_map(|lib| {
        let mut names: Vec<String> = std::fs::read_dir(lib)
            .ok()?
            .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
            .filter(|name| {
                name.strip_prefix("libcudart.so.")
                    .is_some_and(|major| major.chars().all(|c| c.is_ascii_digit()))
            })
            .collect();
        names.sort();
        Some(lib.join(names.pop()?))
    })
}

/// The CPU an ELF file's code is for, from its header's `e_machine` (offset 18, little-endian):
/// `x86_64`, `aarch64`, or "another CPU" (a short or foreign header included).
pub fn elf_cpu(bytes: &[u8]) -> &'static str {
    match bytes
        .get(18..20)
        .map(|machine| u16::from_le_bytes([machine[0], machine[1]]))
    {
        Some(62) => "x86_64",
        Some(183) => "aarch64",
        _ => "another CPU",
    }
}

/// A compiler's version from the first line of its `--version`, less the program's name:
/// `g++ (Debian 12.2.0-14+deb12u1) 12.2.0` and `aarch64-linux-gnu-g++-12 (Debian 12.2.0-14)
/// 12.2.0` give `(Debian …) 12.2.0`. The bundler and the module JIT key modules by it alike.
pub fn compiler_version_line(stdout: &str) -> Option<String> {
    let line = stdout.lines().next()?.trim();
    let version = match (line.starts_with('('), line.split_once(' ')) {
        (true, _) => line,
        (false, Some((_, rest))) => rest.trim(),
        // The program's name alone.
        (false, None) => "",
    };
    (!version.is_empty()).then(|| version.to_owned())
}

/// Checks that `bytes` are a shared library: a little-endian ELF file of type `ET_DYN`.
/// (What it needs of glibc and libstdc++ is the wheel audit's to judge.)
pub fn check_shared_library(bytes: &[u8]) -> Result<(), String> {
    if bytes.len() < 20 || &bytes[..4] != b"\x7fELF" {
        return Err("the link wrote no ELF file".into());
    }
    // e_type (offset 16), little-endian: 3 is ET_DYN.
    if bytes[5] != 1 || u16::from_le_bytes([bytes[16], bytes[17]]) != 3 {
        return Err("the link wrote no little-endian shared library (ET_DYN)".into());
    }
    Ok(())
}

/// The commands that build `recipe` in `scratch` (objects `<n>.o`, the library
/// `<name>.so`, a classic module's shim under `torch-shim/`); nothing is run or written.
pub fn module_commands(
    recipe: &ModuleRecipe,
    scratch: &Path,
) -> Result<ModuleCommands, ModuleCompileError> {
    let torch_root = recipe
        .torch_package
        .parent()
        .unwrap_or(&recipe.torch_package);
    let prefix_maps = [
        format!("-ffile-prefix-map={}=.", recipe.folder.display()),
        format!("-ffile-prefix-map={}=torch", torch_root.display()),
    ];
    let glibc = scratch.join(GLIBC_2_28_HEADER).display().to_string();
    let mut common: Vec<String> = vec![format!("-std={}", recipe.cxx_std)];
    if recipe.abi == Abi::Torch {
        common.push(format!("-I{}", scratch.join(SHIM_DIR).display()));
    }
    common.extend(
        recipe
            .defines
            .iter()
            .map(|(name, value)| format!("-D{name}={value}")),
    );
    common.extend(
        recipe
            .include_dirs
            .iter()
            .chain(&recipe.toolkit_include_dirs)
            .map(|dir| format!("-I{}", dir.display())),
    );
    for dir in &recipe.system_dirs {
        common.push("-isystem".into());
        common.push(dir.display().to_string());
    }
    let object = |n: usize| scratch.join(format!("{n}.o"));
    let units = recipe
        .sources
        .iter()
        .enumerate()
        .map(|(n, source)| {
            let mut command = if is_cuda_source(source) {
                let mut command = nvcc_command(&recipe.nvcc);
                if let Some(ccbin) = &recipe.ccbin {
                    command.arg("-ccbin").arg(ccbin);
                }
                command.arg("-c").args(&common);
                for flag in BASE_FLAGS
                    .iter()
                    .copied()
                    .chain(prefix_maps.iter().map(String::as_str))
                    .chain(["-include", &glibc])
                {
                    command.arg("-Xcompiler").arg(flag);
                }
                for arch in &recipe.archs {
                    command.arg("-gencode").arg(gencode(*arch));
                }
                command
                    .arg(format!("-frandom-seed={source}"))
                    .arg("-Xcudafe")
                    .arg(format!("--orig_src_path_name={source}"))
                    .args(&recipe.nvcc_flags)
                    .args(
                        recipe
                            .cxx_flags
                            .iter()
                            .flat_map(|flag| ["-Xcompiler", flag]),
                    );
                command
            } else {
                let mut command = Command::new(&recipe.cxx);
                command
                    .arg("-c")
                    .args(BASE_FLAGS)
                    .args(&prefix_maps)
                    .args(["-include", &glibc])
                    .arg(format!("-frandom-seed={source}"))
                    .args(&common)
                    .args(&recipe.cxx_flags);
                command
            };
            command
                .arg(source)
                .arg("-o")
                .arg(object(n))
                .current_dir(&recipe.folder);
            (source.clone(), command)
        })
        .collect();
    let output = scratch.join(format!("{}.so", recipe.name));
    let torch_lib = recipe.torch_package.join("lib");
    let mut link = Command::new(&recipe.cxx);
    link.args(["-shared", "-s"])
        .arg(build_id(&recipe.key))
        .arg("-o")
        .arg(&output)
        .args((0..recipe.sources.len()).map(object))
        .arg(format!("-L{}", torch_lib.display()))
        .args(["-Wl,--as-needed", "-lc10", "-ltorch_cpu"]);
    if recipe.abi == Abi::Torch {
        link.arg("-ltorch");
    }
    if recipe.sources.iter().any(|source| is_cuda_source(source)) {
        let runtime = find_cuda_runtime(&recipe.cuda_lib_dirs).ok_or_else(|| {
            ModuleCompileError::NoCudaRuntime {
                searched: recipe.cuda_lib_dirs.clone(),
            }
        })?;
        let (Some(dir), Some(file)) = (runtime.parent(), runtime.file_name()) else {
            unreachable!("a runtime found in a folder has a folder and a name");
        };
        link.args(["-lc10_cuda", "-ltorch_cuda"])
            .arg(format!("-L{}", dir.display()))
            .arg(format!("-l:{}", file.to_string_lossy()));
    }
    link.current_dir(scratch);
    Ok(ModuleCommands {
        units,
        link,
        output,
    })
}

/// Builds `recipe` in a temporary folder: every unit compiled in its own thread, then the
/// link; the shared library's bytes, checked to be one. `progress` hears each step.
pub fn build_module(
    recipe: &ModuleRecipe,
    progress: &dyn Fn(&str),
) -> Result<Vec<u8>, ModuleCompileError> {
    let scratch = tempfile::tempdir().map_err(|source| ModuleCompileError::Scratch {
        path: std::env::temp_dir(),
        source,
    })?;
    let glibc = scratch.path().join(GLIBC_2_28_HEADER);
    std::fs::write(&glibc, GLIBC_2_28_TEXT).map_err(|source| ModuleCompileError::Scratch {
        path: glibc,
        source,
    })?;
    if recipe.abi == Abi::Torch {
        let shim = scratch.path().join(SHIM_DIR);
        write_classic_extension_h(&shim)
            .map_err(|source| ModuleCompileError::Scratch { path: shim, source })?;
    }
    let tree = source_tree(recipe);
    let work = WorkDir::create(&recipe.key, &tree)
        .map_err(|failure| work_failure(Path::new(WORK_ROOT), failure))?;
    let in_work = in_work_folder(recipe, &tree, &work)?;
    let ModuleCommands {
        units,
        mut link,
        output,
    } = module_commands(&in_work, scratch.path())?;
    let results: Vec<Result<(), ModuleCompileError>> = std::thread::scope(|scope| {
        let running: Vec<_> = units
            .into_iter()
            .map(|(source, mut command)| {
                progress(&format!("compiling {source}"));
                scope.spawn(move || run_step(&mut command, ModuleStep::Unit(source)))
            })
            .collect();
        running
            .into_iter()
            .map(|job| job.join().expect("a compile thread does not panic"))
            .collect()
    });
    results.into_iter().collect::<Result<(), _>>()?;
    progress("linking");
    run_step(&mut link, ModuleStep::Link)?;
    let no_library = |reason: String| ModuleCompileError::NoLibrary {
        path: output.clone(),
        reason,
    };
    let mut bytes = std::fs::read(&output).map_err(|error| no_library(error.to_string()))?;
    check_shared_library(&bytes).map_err(no_library)?;
    clear_line_table_times(&mut bytes).map_err(|error| no_library(error.to_string()))?;
    Ok(bytes)
}

/// The link's build id: the module's key (its first 40 hex digits), not the linker's hash of
/// its output, which it takes before [`clear_line_table_times`] clears any file times.
fn build_id(key: &str) -> String {
    let digits: String = key
        .chars()
        .take_while(char::is_ascii_hexdigit)
        .take(40)
        .collect();
    if digits.len() < 2 || digits.len() % 2 == 1 {
        return "-Wl,--build-id=none".to_owned();
    }
    format!("-Wl,--build-id=0x{digits}")
}

/// The library's files as the work folder lays them out under `src/`: the recipe's folder,
/// and each include dir that is neither in it nor in torch's or the toolkit's folders as
/// `src/[n]`.
fn source_tree(recipe: &ModuleRecipe) -> SourceTree {
    let roots = Roots::of(recipe);
    SourceTree {
        root: roots.folder.clone(),
        outside: recipe
            .include_dirs
            .iter()
            .chain(&recipe.toolkit_include_dirs)
            .map(|dir| absolute(dir))
            .filter(|dir| roots.inside(dir).is_none())
            .enumerate()
            .collect(),
    }
}

/// The folders a module's build reads from, each reached through a link in the work folder.
struct Roots {
    folder: PathBuf,
    toolkit: PathBuf,
    torch: PathBuf,
}

impl Roots {
    fn of(recipe: &ModuleRecipe) -> Roots {
        let torch = absolute(&recipe.torch_package);
        Roots {
            folder: absolute(&recipe.folder),
            toolkit: toolkit_root(&recipe.nvcc),
            torch: torch.parent().map_or(torch.clone(), Path::to_path_buf),
        }
    }

    /// `dir` inside the work folder (`src/…`, `cuda/…`, `torch/…`), when it is under one of
    /// the roots; the library's folder first, then the toolkit's (which may sit in torch's).
    fn inside(&self, dir: &Path) -> Option<PathBuf> {
        [
            (&self.folder, "src"),
            (&self.toolkit, "cuda"),
            (&self.torch, "torch"),
        ]
        .into_iter()
        .filter(|(root, _)| !root.as_os_str().is_empty())
        .find_map(|(root, at)| Some(Path::new(at).join(dir.strip_prefix(root).ok()?)))
    }
}

/// A failure to prepare the work folder at `path`, as a module build's error.
fn work_failure(path: &Path, failure: crate::compile::CompileFailure) -> ModuleCompileError {
    ModuleCompileError::Scratch {
        path: path.to_path_buf(),
        source: std::io::Error::other(failure.to_string()),
    }
}

/// `recipe` as it runs in `work`: the compilers in `work/src` (the library's folder), nvcc
/// through `work/cuda` (the toolkit), torch's headers through `work/torch`, so that the
/// folders line tables name (absolute from the compiler's folder, whatever `-I` says) are the
/// same from any checkout. `tree` is what [`WorkDir::create`] laid out ([`source_tree`]).
fn in_work_folder(
    recipe: &ModuleRecipe,
    tree: &SourceTree,
    work: &WorkDir,
) -> Result<ModuleRecipe, ModuleCompileError> {
    let roots = Roots::of(recipe);
    let failed = |failure| work_failure(work.path(), failure);
    let nvcc = work.link_toolkit(&recipe.nvcc).map_err(failed)?;
    work.link(&roots.torch, &work.path().join("torch"))
        .map_err(failed)?;
    let place = |dir: &PathBuf| {
        let dir = absolute(dir);
        let inside = roots.inside(&dir).or_else(|| {
            let (n, _) = tree.outside.iter().find(|(_, outside)| *outside == dir)?;
            Some(Path::new("src").join(format!("[{n}]")))
        });
        inside.map_or(dir, |inside| work.path().join(inside))
    };
    Ok(ModuleRecipe {
        folder: work.path().join("src"),
        include_dirs: recipe.include_dirs.iter().map(place).collect(),
        toolkit_include_dirs: recipe.toolkit_include_dirs.iter().map(place).collect(),
        torch_package: work
            .path()
            .join("torch")
            .join(recipe.torch_package.file_name().unwrap_or_default()),
        nvcc,
        ..recipe.clone()
    })
}

/// Runs one step; on failure its exit status and the last [`LOG_TAIL_LINES`] lines of its
/// output.
fn run_step(command: &mut Command, step: ModuleStep) -> Result<(), ModuleCompileError> {
    let program = command.get_program().to_string_lossy().into_owned();
    let output = match command.output() {
        Ok(output) => output,
        Err(source) => {
            return Err(ModuleCompileError::Spawn {
                step,
                program,
                source,
            })
        }
    };
    if output.status.success() {
        return Ok(());
    }
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<&str> = text.lines().collect();
    Err(ModuleCompileError::Failed {
        step,
        program,
        status: output.status.to_string(),
        log: lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recipe(abi: Abi, cuda_lib: &Path) -> ModuleRecipe {
        ModuleRecipe {
            name: "_C".into(),
            key: "0123456789abcdef0123".into(),
            abi,
            folder: PathBuf::from("/lib"),
            sources: vec!["ops.cpp".into(), "csrc/kernels.cu".into()],
            include_dirs: vec![
                PathBuf::from("/lib/csrc"),
                PathBuf::from("/site/torch/include"),
            ],
            toolkit_include_dirs: vec![PathBuf::from("/cuda/include")],
            system_dirs: vec![PathBuf::from("/py/include")],
            defines: BTreeMap::from([
                ("TORCH_EXTENSION_NAME".to_owned(), "_C".to_owned()),
                ("USE_CUDA".to_owned(), "1".to_owned()),
            ]),
            nvcc_flags: vec!["--expt-relaxed-constexpr".into()],
            cxx_flags: vec!["-O3".into()],
            cxx_std: "c++17".into(),
            archs: vec!["sm_90a".parse().unwrap(), "compute_90".parse().unwrap()],
            torch_package: PathBuf::from("/site/torch"),
            cuda_lib_dirs: vec![PathBuf::from("/nowhere"), cuda_lib.to_owned()],
            nvcc: PathBuf::from("/cuda/bin/nvcc"),
            ccbin: None,
            cxx: PathBuf::from("/usr/bin/g++"),
        }
    }

    fn args(command: &Command) -> Vec<String> {
        command
            .get_args()
            .map(|arg| arg.to_string_lossy().into_owned())
            .collect()
    }

    /// A `libcudart.so.12` and a `libcudart.so.13` in a temporary folder.
    fn cuda_lib() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for name in ["libcudart.so.12", "libcudart.so.13", "libcudart.so"] {
            std::fs::write(dir.path().join(name), b"").unwrap();
        }
        dir
    }

    /// What every unit of the test recipe is compiled with: its defines, then its include
    /// dirs (the library's, torch's, the toolkit's, then Python's as a system dir).
    const DEFINES_AND_INCLUDES: [&str; 7] = [
        "-DTORCH_EXTENSION_NAME=_C",
        "-DUSE_CUDA=1",
        "-I/lib/csrc",
        "-I/site/torch/include",
        "-I/cuda/include",
        "-isystem",
        "/py/include",
    ];

    /// Unit `n` of the recipe for `abi` (scratch folder `/tmp/s`), checked to run in the
    /// library's folder: its source, its program and its arguments.
    fn unit(abi: Abi, n: usize) -> (String, String, Vec<String>) {
        let lib = cuda_lib();
        let commands = module_commands(&recipe(abi, lib.path()), Path::new("/tmp/s")).unwrap();
        let (source, command) = &commands.units[n];
        assert_eq!(command.get_current_dir(), Some(Path::new("/lib")));
        let program = command.get_program().to_string_lossy().into_owned();
        (source.clone(), program, args(command))
    }

    /// The compilers see every folder through the work folder (`/tmp/kwheel-<key>`): the
    /// library under `src/`, an include dir outside it as `src/[n]`, the toolkit under `cuda/`
    /// (even inside torch's folder), torch under `torch/`.
    #[test]
    fn a_module_compiles_in_the_work_folder_of_its_key_whatever_the_checkout() {
        let root = tempfile::tempdir().unwrap();
        let at = |path: &str| {
            let path = root.path().join(path);
            std::fs::create_dir_all(&path).unwrap();
            path
        };
        let (lib, outside, site, toolkit) = (
            at("checkout/lib"),
            at("vendored/include"),
            at("site"),
            at("site/nvidia/cu13"),
        );
        std::fs::write(lib.join("ops.cpp"), b"").unwrap();
        let key = format!("{:016x}aa", std::process::id() as u64 * 7919);
        let recipe = ModuleRecipe {
            key: key.clone(),
            folder: lib.clone(),
            include_dirs: vec![
                lib.join("csrc"),
                outside.clone(),
                site.join("torch/include"),
            ],
            toolkit_include_dirs: vec![toolkit.join("include")],
            torch_package: site.join("torch"),
            nvcc: toolkit.join("bin/nvcc"),
            nvcc_flags: vec!["-lineinfo".into()],
            ..recipe(Abi::Stable, root.path())
        };
        let tree = source_tree(&recipe);
        let work = WorkDir::create(&key, &tree).unwrap();
        let placed = in_work_folder(&recipe, &tree, &work).unwrap();
        let w = work.path();
        assert_eq!(
            w,
            Path::new(WORK_ROOT).join(format!("kwheel-{}", &key[..16]))
        );
        assert_eq!(placed.folder, w.join("src"));
        assert_eq!(
            placed.include_dirs,
            [
                w.join("src/csrc"),
                w.join("src/[0]"),
                w.join("torch/torch/include")
            ]
        );
        assert_eq!(placed.toolkit_include_dirs, [w.join("cuda/include")]);
        assert_eq!(placed.torch_package, w.join("torch/torch"));
        assert_eq!(placed.nvcc, w.join("cuda/bin/nvcc"));
        assert_eq!(placed.nvcc_flags, ["-lineinfo"]);
        for (link, target) in [
            ("src/ops.cpp", lib.join("ops.cpp")),
            ("src/[0]", outside),
            ("cuda", toolkit),
            ("torch", site),
        ] {
            assert_eq!(std::fs::read_link(w.join(link)).unwrap(), target, "{link}");
        }
        let path = w.to_owned();
        drop(work);
        assert!(!path.exists());
        let _ = std::fs::remove_file(path.with_extension("lock"));
    }

    #[test]
    fn a_cpp_unit_is_compiled_by_the_host_compiler_reproducibly_in_the_folder() {
        let (source, program, args) = unit(Abi::Torch, 0);
        assert_eq!(source, "ops.cpp");
        assert_eq!(program, "/usr/bin/g++");
        let head = [
            "-c",
            "-fPIC",
            "-O2",
            "-ffile-prefix-map=/lib=.",
            "-ffile-prefix-map=/site=torch",
            "-include",
            "/tmp/s/kwheel-glibc-2.28.h",
            "-frandom-seed=ops.cpp",
            "-std=c++17",
            "-I/tmp/s/torch-shim",
        ];
        let tail = ["-O3", "ops.cpp", "-o", "/tmp/s/0.o"];
        assert_eq!(args, [&head[..], &DEFINES_AND_INCLUDES, &tail].concat());
    }

    #[test]
    fn a_cu_unit_is_compiled_by_nvcc_for_every_arch_reproducibly_in_the_folder() {
        let (source, program, args) = unit(Abi::Stable, 1);
        assert_eq!(source, "csrc/kernels.cu");
        assert_eq!(program, "/cuda/bin/nvcc");
        // A stable module has no `<torch/extension.h>` shim.
        assert_eq!(
            args,
            [
                &["-c", "-std=c++17"][..],
                &DEFINES_AND_INCLUDES,
                &[
                    "-Xcompiler",
                    "-fPIC",
                    "-Xcompiler",
                    "-O2",
                    "-Xcompiler",
                    "-ffile-prefix-map=/lib=.",
                    "-Xcompiler",
                    "-ffile-prefix-map=/site=torch",
                    "-Xcompiler",
                    "-include",
                    "-Xcompiler",
                    "/tmp/s/kwheel-glibc-2.28.h",
                    "-gencode",
                    "arch=compute_90a,code=sm_90a",
                    "-gencode",
                    "arch=compute_90,code=compute_90",
                    "-frandom-seed=csrc/kernels.cu",
                    "-Xcudafe",
                    "--orig_src_path_name=csrc/kernels.cu",
                    "--expt-relaxed-constexpr",
                    "-Xcompiler",
                    "-O3",
                    "csrc/kernels.cu",
                    "-o",
                    "/tmp/s/1.o",
                ],
            ]
            .concat()
        );
    }

    #[test]
    fn the_link_names_torchs_libraries_and_the_newest_cuda_runtime_found_first() {
        let lib = cuda_lib();
        let commands =
            module_commands(&recipe(Abi::Torch, lib.path()), Path::new("/tmp/s")).unwrap();
        assert_eq!(commands.link.get_program(), "/usr/bin/g++");
        assert_eq!(commands.link.get_current_dir(), Some(Path::new("/tmp/s")));
        assert_eq!(commands.output, Path::new("/tmp/s/_C.so"));
        assert_eq!(
            args(&commands.link),
            [
                "-shared".to_owned(),
                "-s".into(),
                "-Wl,--build-id=0x0123456789abcdef0123".into(),
                "-o".into(),
                "/tmp/s/_C.so".into(),
                "/tmp/s/0.o".into(),
                "/tmp/s/1.o".into(),
                "-L/site/torch/lib".into(),
                "-Wl,--as-needed".into(),
                "-lc10".into(),
                "-ltorch_cpu".into(),
                "-ltorch".into(),
                "-lc10_cuda".into(),
                "-ltorch_cuda".into(),
                format!("-L{}", lib.path().display()),
                "-l:libcudart.so.13".into(),
            ]
        );
        // A module without device code links neither CUDA nor its runtime.
        let mut host_only = recipe(Abi::Stable, Path::new("/nowhere"));
        host_only.sources.pop();
        let link = args(
            &module_commands(&host_only, Path::new("/tmp/s"))
                .unwrap()
                .link,
        );
        assert_eq!(link.last().unwrap(), "-ltorch_cpu");
    }

    #[test]
    fn device_code_without_a_cuda_runtime_names_where_it_looked() {
        let error = module_commands(&recipe(Abi::Stable, Path::new("/empty")), Path::new("/s"))
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "no CUDA runtime (`libcudart.so.*`) in /nowhere, /empty"
        );
        assert_eq!(error.step(), Some(&ModuleStep::Link));
    }

    #[test]
    fn gencode_spells_sass_and_ptx_targets() {
        let arch = |text: &str| text.parse::<Arch>().unwrap();
        assert_eq!(gencode(arch("sm_90a")), "arch=compute_90a,code=sm_90a");
        assert_eq!(gencode(arch("sm_100f")), "arch=compute_100f,code=sm_100f");
        assert_eq!(
            gencode(arch("compute_90")),
            "arch=compute_90,code=compute_90"
        );
    }

    #[test]
    fn a_compiler_version_is_its_first_line_less_the_programs_name() {
        for (stdout, version) in [
            (
                "g++ (Debian 12.2.0-14+deb12u1) 12.2.0\nCopyright",
                "(Debian 12.2.0-14+deb12u1) 12.2.0",
            ),
            (
                "aarch64-linux-gnu-g++-12 (Debian 12.2.0-14) 12.2.0\n",
                "(Debian 12.2.0-14) 12.2.0",
            ),
            ("(GCC) 13.2.0", "(GCC) 13.2.0"),
        ] {
            assert_eq!(compiler_version_line(stdout).as_deref(), Some(version));
        }
        assert_eq!(compiler_version_line(""), None);
        assert_eq!(compiler_version_line("g++ \n"), None);
    }

    #[test]
    fn the_cpu_of_an_elf_file_is_read_from_its_machine() {
        let mut header = [0u8; 20];
        for (machine, cpu) in [(62u16, "x86_64"), (183, "aarch64"), (190, "another CPU")] {
            header[18..20].copy_from_slice(&machine.to_le_bytes());
            assert_eq!(elf_cpu(&header), cpu);
        }
        assert_eq!(elf_cpu(&header[..10]), "another CPU");
    }

    #[test]
    fn only_a_shared_library_is_a_module() {
        assert!(check_shared_library(b"not an elf at all!!!").is_err());
        let mut elf = vec![0u8; 64];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[5] = 1;
        elf[16] = 2; // ET_EXEC
        assert!(check_shared_library(&elf).is_err());
        elf[16] = 3;
        assert_eq!(check_shared_library(&elf), Ok(()));
    }

    #[test]
    fn a_failed_step_names_it_and_keeps_the_tail_of_its_log() {
        let mut command = Command::new("sh");
        command.args(["-c", "seq 1 100; exit 3"]);
        let error = run_step(&mut command, ModuleStep::Unit("csrc/ops.cu".into())).unwrap_err();
        assert_eq!(error.step(), Some(&ModuleStep::Unit("csrc/ops.cu".into())));
        let text = error.to_string();
        assert!(
            text.starts_with("`csrc/ops.cu` failed (`sh`, exit status: 3):\n61\n"),
            "{text}"
        );
        assert!(
            text.ends_with("\n100") && !text.contains("\n60\n"),
            "{text}"
        );
    }
}
