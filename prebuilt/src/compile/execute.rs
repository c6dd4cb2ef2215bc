//! The one compile executor: the bundler's compilers and the JIT both call [`compile`], so a
//! JIT cubin is the cubin the bundler built, byte for byte.
//!
//! | [`CompilerTool`] | runs |
//! | --- | --- |
//! | `Nvcc` | `cuda/bin/nvcc -cubin` in the work folder, clean environment, TMPDIR there, a fixed memory layout ([`super::address_space`]) |
//! | `NvccPtxas` | `cuda/bin/nvcc -ptx -arch=compute_XYa`, the PTX ISA lowered, then the build's `ptxas -arch=sm_XYa` with the options nvcc would have given its own ([`super::ptxas`]) |
//! | `Nvrtc` | one NVRTC program named by its path in the work folder |
//!
//! Every compile runs in the key's work folder ([`super::work`]), with every path relative to
//! it (nvcc) or inside it (NVRTC), and its line tables lose their file times
//! ([`super::lines`]), so the output names no machine, checkout or moment.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};

use super::computed::{computed_source, Evaluation};
use super::ptxas::{lower_ptx_isa, ptx_isa, ptxas_options, UnhonouredFlag};
use super::work::{absolute, SourceTree, WorkDir};
use super::{
    entry_probes_source, nvcc_arguments, nvcc_command, nvrtc_options, read_entry_probes,
    with_preamble, CompileOptions, CompilerKind, ENTRY_PROBES_PTX, ENTRY_PROBES_SOURCE,
    PREAMBLE_FILE,
};
use crate::nvrtc::{NvrtcError, NvrtcLibrary};
use crate::target::Arch;

/// The compiler a compile runs, and where its files are.
#[derive(Clone, Copy, Debug)]
pub enum CompilerTool<'a> {
    /// nvcc, run as a process.
    Nvcc {
        /// The nvcc executable (`…/bin/nvcc`).
        nvcc: &'a Path,
    },
    /// A newer toolkit's nvcc writing PTX, assembled by this build's `ptxas`.
    NvccPtxas {
        /// The newer toolkit's nvcc.
        nvcc: &'a Path,
        /// This build's `ptxas`.
        ptxas: &'a Path,
        /// The newest PTX ISA that `ptxas` reads ([`super::ptxas::max_ptx_isa`]).
        max_isa: (u32, u32),
    },
    /// NVRTC, loaded into this process.
    Nvrtc {
        /// The library.
        library: &'a NvrtcLibrary,
        /// The toolkit headers it compiles with: the runtime's, then CCCL.
        include_dirs: &'a [PathBuf],
    },
}

impl CompilerTool<'_> {
    /// Which compiler this is.
    pub fn kind(&self) -> CompilerKind {
        match self {
            CompilerTool::Nvcc { .. } => CompilerKind::Nvcc,
            CompilerTool::NvccPtxas { .. } => CompilerKind::NvccPtxas,
            CompilerTool::Nvrtc { .. } => CompilerKind::Nvrtc,
        }
    }
}

/// One run of a compile's tool (nvcc, or the route's `ptxas`) in the key's work folder.
#[derive(Clone, Copy, Debug)]
pub struct ToolRun<'a> {
    /// The tool's name, `nvcc` or `ptxas`, for messages.
    pub name: &'a str,
    /// The executable, through the work folder's link to its toolkit where it is nvcc.
    pub program: &'a Path,
    /// Its arguments; every path among them is relative to `work`.
    pub arguments: &'a [OsString],
    /// The key's work folder: the current directory, `TMPDIR`, and where outputs go.
    pub work: &'a Path,
}

/// How a compile's tools are run: the seam between what a compile runs and where it runs.
/// [`Local`] runs them here, as a process with a clean environment ([`super::nvcc_command`]);
/// the bundler may hand them to another runner (a build farm, a test's recorder). Whatever
/// runs them, the outputs land in the work folder and are validated as a local compile's are;
/// to give the same bytes it must start them as [`Local`] does, in the work folder, with the
/// memory layout fixed ([`super::address_space`]). The JIT always runs them here.
pub trait ToolRunner: Send + Sync {
    /// Runs `run` to completion: its exit status and what it printed.
    fn run(&self, run: &ToolRun<'_>) -> std::io::Result<std::process::Output>;
}

/// Runs tools on this machine.
#[derive(Clone, Copy, Debug, Default)]
pub struct Local;

impl ToolRunner for Local {
    fn run(&self, run: &ToolRun<'_>) -> std::io::Result<std::process::Output> {
        nvcc_command(run.program)
            .args(run.arguments)
            .current_dir(run.work)
            .env("TMPDIR", run.work)
            .output()
    }
}

/// One kernel, one target: what to compile, as paths of the library's [`SourceTree`].
#[derive(Clone, Copy, Debug)]
pub struct CompileJob<'a> {
    /// The target's key: it names the work folder.
    pub key: &'a str,
    /// The library's files.
    pub tree: &'a SourceTree,
    /// The translation unit, by stable path (`scale_rows/scale_rows.cu`).
    pub source: &'a str,
    /// The kernel's include dirs, by stable name (`.` for the root, `include`, `[0]`), in `-I`
    /// order.
    pub include_dirs: &'a [String],
    /// The target architecture.
    pub arch: Arch,
    /// The C++ standard, `c++17`.
    pub cxx_std: &'a str,
    /// Preprocessor definitions.
    pub defines: &'a BTreeMap<String, String>,
    /// The flags this compiler gets ([`crate::index::KernelInputs::flags_for`]).
    pub flags: &'a [String],
    /// The entries that are name expressions (`scale<float>`), to be lowered to symbols.
    pub name_expressions: &'a [String],
    /// C++ text compiled after the source, before the entries are named (empty for none):
    /// nvcc gets it in the generated unit ([`super::entry_probes_source`]), NVRTC after the
    /// source's text ([`super::with_preamble`]).
    pub preamble: &'a str,
    /// Constant expressions to evaluate, compiled after the entries
    /// ([`super::computed::computed_source`]); their values are read back from the output
    /// ([`super::computed::read_computed`]).
    pub computed: &'a [Evaluation],
}

impl<'a> CompileJob<'a> {
    /// The job's options, with its include dirs as the compiler is to see them.
    fn options(&self, include_dirs: &'a [PathBuf]) -> CompileOptions<'a> {
        CompileOptions {
            arch: self.arch,
            cxx_std: self.cxx_std,
            include_dirs,
            defines: self.defines,
            flags: self.flags,
        }
    }
}

/// What a compile produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Compiled {
    /// The cubin (PTX text for a `compute_XY` target).
    pub cubin: Vec<u8>,
    /// What the compiler printed: warnings, or empty.
    pub log: String,
    /// Each name expression with its mangled symbol.
    pub lowered_names: BTreeMap<String, String>,
}

/// Why a compile produced nothing. The caller names the kernel, target and compiler.
#[derive(Debug, thiserror::Error)]
pub enum CompileFailure {
    /// The compiler rejected the source; `log` is everything it printed.
    #[error("the compiler rejected the source:\n{log}")]
    Rejected {
        /// The compiler's full output.
        log: String,
    },
    /// nvcc's PTX needs a newer PTX ISA than the build's `ptxas` assembles.
    #[error(
        "the PTX uses a feature of PTX ISA {}.{} that this ptxas (PTX ISA {}.{} at most) cannot \
         assemble; ptxas said:\n{log}",
        .emitted.0, .emitted.1, .supported.0, .supported.1
    )]
    NewerPtx {
        /// The PTX ISA nvcc wrote, (9, 0) for `9.0`.
        emitted: (u32, u32),
        /// The newest PTX ISA the build's ptxas reads.
        supported: (u32, u32),
        /// What ptxas printed.
        log: String,
    },
    /// A flag the nvcc+ptxas route cannot pass on.
    #[error("the nvcc+ptxas route cannot honour {0}")]
    Unhonoured(UnhonouredFlag),
    /// A compiler could not be started.
    #[error("could not run {}", program.display())]
    Spawn {
        /// The executable.
        program: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A file the compile needs could not be read or written.
    #[error("could not {action} {}", path.display())]
    Io {
        /// What was being done: "read the source", "create the work dir".
        action: &'static str,
        /// The file or folder.
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: std::io::Error,
    },
    /// An NVRTC call failed for a reason other than the source (an option it rejects, say).
    #[error("NVRTC failed")]
    Nvrtc(#[source] Box<NvrtcError>),
}

/// Compiles `job` with `tool` in the key's work folder.
pub fn compile(tool: &CompilerTool<'_>, job: &CompileJob<'_>) -> Result<Compiled, CompileFailure> {
    compile_with(tool, job, &Local)
}

/// [`compile`], its tools run by `runner`.
pub fn compile_with(
    tool: &CompilerTool<'_>,
    job: &CompileJob<'_>,
    runner: &dyn ToolRunner,
) -> Result<Compiled, CompileFailure> {
    // Refused before anything runs.
    let ptxas_flags = match tool {
        CompilerTool::NvccPtxas { .. } => {
            ptxas_options(job.flags).map_err(CompileFailure::Unhonoured)?
        }
        _ => Vec::new(),
    };
    let work = WorkDir::create(job.key, job.tree)?;
    let compiled = match *tool {
        CompilerTool::Nvcc { nvcc } => run_nvcc(&work, nvcc, job, None, runner),
        CompilerTool::NvccPtxas {
            nvcc,
            ptxas,
            max_isa,
        } => run_nvcc(
            &work,
            nvcc,
            job,
            Some((ptxas, max_isa, &ptxas_flags)),
            runner,
        ),
        CompilerTool::Nvrtc {
            library,
            include_dirs,
        } => run_nvrtc(&work, library, include_dirs, job),
    }
    .map_err(|failure| failure.in_user_terms(work.path()))?;
    // Line tables name each file's modification time, which no two checkouts share.
    Ok(Compiled {
        cubin: super::lines::without_file_times(compiled.cubin),
        log: user_paths(&compiled.log, work.path()),
        ..compiled
    })
}

impl CompileFailure {
    /// This failure with its log's paths as the library names them ([`user_paths`]).
    fn in_user_terms(self, work: &Path) -> CompileFailure {
        match self {
            CompileFailure::Rejected { log } => CompileFailure::Rejected {
                log: user_paths(&log, work),
            },
            CompileFailure::NewerPtx {
                emitted,
                supported,
                log,
            } => CompileFailure::NewerPtx {
                emitted,
                supported,
                log: user_paths(&log, work),
            },
            other => other,
        }
    }
}

/// A compiler's log with the library's files named as the library names them: the work
/// folder's `src/` (where a compile sees the library, [`in_tree`]) taken off
/// `src/kernels/softmax.cu(12): error …` and off NVRTC's absolute
/// `/tmp/kwheel-…/src/kernels/softmax.cu`, where the path is one of the work folder's.
pub(crate) fn user_paths(log: &str, work: &Path) -> String {
    let absolute = format!("{}/src/", work.display());
    let log = log.replace(&absolute, "");
    let mut out = String::with_capacity(log.len());
    let mut rest = log.as_str();
    while let Some(at) = rest.find("src/") {
        let boundary = rest[..at]
            .chars()
            .next_back()
            .is_none_or(|c| c.is_whitespace() || matches!(c, '"' | '\'' | '(' | '`'));
        let path: String = rest[at + 4..]
            .chars()
            .take_while(|c| !c.is_whitespace() && !matches!(c, '(' | ':' | '"' | '\'' | ','))
            .collect();
        let known = !path.is_empty() && work.join("src").join(&path).exists();
        out.push_str(&rest[..at]);
        if !(boundary && known) {
            out.push_str("src/");
        }
        rest = &rest[at + 4..];
    }
    out.push_str(rest);
    out
}

/// `src/<stable>`: where a stable path is in the work folder (`.` is `src` itself).
fn in_tree(stable: &str) -> PathBuf {
    match stable {
        "." | "" => PathBuf::from("src"),
        stable => Path::new("src").join(stable),
    }
}

/// nvcc, or for `assemble` = (ptxas, its PTX ISA, its options) the nvcc+ptxas route.
fn run_nvcc(
    work: &WorkDir,
    nvcc: &Path,
    job: &CompileJob<'_>,
    assemble: Option<(&Path, (u32, u32), &[String])>,
    runner: &dyn ToolRunner,
) -> Result<Compiled, CompileFailure> {
    let program = work.link_toolkit(nvcc)?;
    let source = in_tree(job.source);
    let unit =
        if job.name_expressions.is_empty() && job.preamble.is_empty() && job.computed.is_empty() {
            source.clone()
        } else {
            let mut text = entry_probes_source(&source, job.preamble, job.name_expressions);
            text.push_str(&computed_source(job.computed));
            let probes = work.path().join(ENTRY_PROBES_SOURCE);
            fs::write(&probes, text).map_err(|source| CompileFailure::Io {
                action: "write the entry probes to",
                path: probes.clone(),
                source,
            })?;
            PathBuf::from(ENTRY_PROBES_SOURCE)
        };
    let include_dirs: Vec<PathBuf> = job.include_dirs.iter().map(|dir| in_tree(dir)).collect();
    let options = job.options(&include_dirs);
    let ptx_route = assemble.is_some();
    let output = PathBuf::from(if ptx_route {
        "kernel.ptx"
    } else {
        "kernel.cubin"
    });
    let mut arguments = nvcc_arguments(&options, &unit, &output);
    if ptx_route {
        for argument in &mut arguments {
            if argument == "-cubin" {
                *argument = "-ptx".into();
            } else if *argument == *format!("-arch={}", job.arch) {
                *argument = format!("-arch=compute_{}", arch_suffix(job.arch)).into();
            }
        }
    }
    // cicc hashes the real path of the unit into the names of internal-linkage symbols
    // (`_GLOBAL__N__<hash>`); through the links that is the checkout's path, so it is told the
    // path inside the work folder instead.
    let named = work.path().join(&unit).display().to_string();
    let named = if named.contains(',') {
        work.path().join("kwheel-unit.cu").display().to_string()
    } else {
        named
    };
    let position = arguments.len() - 3;
    arguments.splice(
        position..position,
        [
            "-Xcicc".into(),
            format!("--orig_src_path_name,{named}").into(),
        ],
    );
    // First, so that a kernel's own `-frandom-seed` comes later and wins, as nvcc takes the last.
    arguments.insert(0, random_seed(work).into());
    if !job.name_expressions.is_empty() && !job.arch.is_ptx() && !ptx_route {
        // `-keep` leaves nvcc's PTX of the probes in the work folder; the cubin is unchanged.
        arguments.insert(0, "-keep".into());
    }
    let mut log = run_tool(runner, &program, &arguments, work.path(), "nvcc")?;
    let output_path = work.path().join(&output);
    let read = |path: &Path, action: &'static str| {
        fs::read(path).map_err(|source| CompileFailure::Io {
            action,
            path: path.to_path_buf(),
            source,
        })
    };
    let bytes = read(&output_path, "read what nvcc wrote to")?;
    let ptx_of_probes = if job.name_expressions.is_empty() {
        None
    } else if job.arch.is_ptx() || ptx_route {
        Some(String::from_utf8_lossy(&bytes).into_owned())
    } else {
        let kept = work.path().join(ENTRY_PROBES_PTX);
        Some(String::from_utf8_lossy(&read(&kept, "read the PTX nvcc kept in")?).into_owned())
    };
    let lowered_names = ptx_of_probes
        .map(|ptx| read_entry_probes(&ptx, job.name_expressions))
        .unwrap_or_default();
    let Some((ptxas, max_isa, ptxas_flags)) = assemble else {
        return Ok(Compiled {
            cubin: bytes,
            log,
            lowered_names,
        });
    };
    let ptx = String::from_utf8_lossy(&bytes).into_owned();
    let emitted = ptx_isa(&ptx);
    let lowered = lower_ptx_isa(&ptx, max_isa);
    if job.arch.is_ptx() {
        // A `compute_XY` target ships the PTX itself, at this build's PTX ISA.
        return Ok(Compiled {
            cubin: lowered.into_bytes(),
            log,
            lowered_names,
        });
    }
    let lowered_path = work.path().join("kernel.lowered.ptx");
    fs::write(&lowered_path, &lowered).map_err(|source| CompileFailure::Io {
        action: "write the lowered PTX to",
        path: lowered_path.clone(),
        source,
    })?;
    // nvcc's own ptxas arguments (`-arch=sm_90a -m64`), then the options its flags give ptxas.
    let mut arguments: Vec<OsString> = vec![format!("-arch={}", job.arch).into(), "-m64".into()];
    arguments.extend(ptxas_flags.iter().map(OsString::from));
    arguments.extend([
        "-o".into(),
        "kernel.cubin".into(),
        "kernel.lowered.ptx".into(),
    ]);
    match run_tool(runner, ptxas, &arguments, work.path(), "ptxas") {
        Ok(ptxas_log) => log.push_str(&ptxas_log),
        Err(CompileFailure::Rejected { log: ptxas_log })
            if emitted.is_some_and(|isa| isa > max_isa) =>
        {
            return Err(CompileFailure::NewerPtx {
                emitted: emitted.unwrap_or_default(),
                supported: max_isa,
                log: ptxas_log,
            });
        }
        Err(error) => return Err(error),
    }
    let cubin = read(
        &work.path().join("kernel.cubin"),
        "read the cubin ptxas wrote to",
    )?;
    Ok(Compiled {
        cubin,
        log,
        lowered_names,
    })
}

/// `-frandom-seed=kwheel-<first 16 hex digits of the key>`, the work folder's name, for nvcc and
/// NVRTC alike. Their front end names a unit's internal-linkage symbols
/// (`_INTERNAL_<path hash>_<n>_<file>_<id>`) after its first external definition, unless
/// something needs the name before one is seen (a class template with a virtual function
/// instantiated with a class local to a `static` function, as ggml's `common.cuh` does): then
/// `<id>` is a number drawn from the process id and the real folder, different on every run.
/// Seeded, it is the seed's; the work folder's name differs from key to key as seeds should
/// between units. See docs/toolchains.md, "Where a compile runs".
fn random_seed(work: &WorkDir) -> String {
    let name = work.path().file_name().unwrap_or_default();
    format!("-frandom-seed={}", name.to_string_lossy())
}

/// `90a` of `sm_90a`, `90` of `compute_90`.
fn arch_suffix(arch: Arch) -> String {
    let text = arch.to_string();
    text.strip_prefix("sm_")
        .or_else(|| text.strip_prefix("compute_"))
        .map(str::to_owned)
        .unwrap_or(text)
}

/// Runs nvcc or ptxas in `work` through `runner`: its output, or the failure with it.
fn run_tool(
    runner: &dyn ToolRunner,
    program: &Path,
    arguments: &[OsString],
    work: &Path,
    name: &str,
) -> Result<String, CompileFailure> {
    let run = ToolRun {
        name,
        program,
        arguments,
        work,
    };
    let output = runner.run(&run).map_err(|source| CompileFailure::Spawn {
        program: program.to_path_buf(),
        source,
    })?;
    let mut log = String::from_utf8_lossy(&output.stdout).into_owned();
    log.push_str(&String::from_utf8_lossy(&output.stderr));
    if !output.status.success() {
        if log.trim().is_empty() {
            log = format!("{name} {} and printed nothing", output.status);
        }
        return Err(CompileFailure::Rejected { log });
    }
    Ok(log)
}

/// NVRTC: the program is named by its absolute path in the work folder, which is its
/// `__FILE__` and where its quoted includes resolve; the include dirs are in the folder too.
fn run_nvrtc(
    work: &WorkDir,
    library: &NvrtcLibrary,
    toolkit_include_dirs: &[PathBuf],
    job: &CompileJob<'_>,
) -> Result<Compiled, CompileFailure> {
    let real_source = absolute(&job.tree.root).join(job.source);
    let text = fs::read_to_string(&real_source).map_err(|source| CompileFailure::Io {
        action: "read the source",
        path: real_source.clone(),
        source,
    })?;
    let mut toolkit = Vec::new();
    for (n, dir) in toolkit_include_dirs.iter().enumerate() {
        let at = work.path().join("include").join(n.to_string());
        work.link(&absolute(dir), &at)?;
        toolkit.push(at);
    }
    let include_dirs: Vec<PathBuf> = job
        .include_dirs
        .iter()
        .map(|dir| work.path().join(in_tree(dir)))
        .collect();
    let options = job.options(&include_dirs);
    // Absolute: NVRTC resolves a relative `#line` name against this process's directory.
    let preamble_file = work.path().join(PREAMBLE_FILE).display().to_string();
    let mut text = with_preamble(&text, job.preamble, &preamble_file);
    if !job.computed.is_empty() {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&computed_source(job.computed));
    }
    let name = work.path().join(in_tree(job.source));
    // First, so that a kernel's own `-frandom-seed` comes later and wins.
    let mut arguments = nvrtc_options(&options, &toolkit);
    arguments.insert(0, random_seed(work));
    let output = library
        .compile(
            &text,
            &name.display().to_string(),
            &arguments,
            job.name_expressions,
        )
        .map_err(|error| match error {
            NvrtcError::Compilation { log } => CompileFailure::Rejected { log },
            error => CompileFailure::Nvrtc(Box::new(error)),
        })?;
    Ok(Compiled {
        cubin: output.cubin,
        log: output.log,
        lowered_names: output.lowered_names,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compiler_logs_name_the_librarys_files_as_the_library_does() {
        let work = tempfile::tempdir().unwrap();
        fs::create_dir_all(work.path().join("src/kernels")).unwrap();
        fs::write(work.path().join("src/kernels/softmax.cu"), "").unwrap();
        let absolute = work
            .path()
            .join("src/kernels/softmax.cu")
            .display()
            .to_string();
        let log = format!(
            "src/kernels/softmax.cu(12): error: identifier \"x\" is undefined\n\
             1 error detected in the compilation of \"src/kernels/softmax.cu\".\n\
             {absolute}(3): warning: unused\n\
             In file included from src/kernels/softmax.cu:1:\n\
             kwheel-entries.cu(3): error: no instance; see resrc/other.cu and src/missing.cu\n"
        );
        assert_eq!(
            user_paths(&log, work.path()),
            "kernels/softmax.cu(12): error: identifier \"x\" is undefined\n\
             1 error detected in the compilation of \"kernels/softmax.cu\".\n\
             kernels/softmax.cu(3): warning: unused\n\
             In file included from kernels/softmax.cu:1:\n\
             kwheel-entries.cu(3): error: no instance; see resrc/other.cu and src/missing.cu\n"
        );
    }
}
