//! The compilers: nvcc as a process, NVRTC in this process, and for a CUDA build that has
//! `ptxas` but no nvcc (12.9 from its wheels) a newer nvcc's PTX assembled by that `ptxas`.
//! Each turns one kernel's source into a cubin for one architecture by calling the runtime's
//! one compile executor ([`prebuilt::compile::compile`]), the same function the JIT calls, in
//! the key's work folder (see `prebuilt::compile::work`).
//!
//! [`Compiler`] is the seam the scheduler uses, so scheduling and error paths are tested with
//! fakes; [`compiler_for`] picks the real one a [`Toolchain`] names.
//!
//! | | [`Nvcc`] | [`Nvrtc`] | [`NvccPtxas`] |
//! | --- | --- | --- | --- |
//! | runs as | `nvcc -cubin` in the work folder, clean environment | `libnvrtc` calls, one program per compile | `nvcc -ptx -arch=compute_XYa`, PTX ISA lowered, then the build's `ptxas -arch=sm_XYa` with the options nvcc would give its own (a flag it cannot honour is refused by name) |
//! | toolkit headers | nvcc's own (its `nvcc.profile`) | `-I` each of the toolchain's include dirs | the newer nvcc's own |
//! | host code, system headers | yes (the host compiler preprocesses) | no | yes |
//! | name expressions in `entries` | a generated unit takes each entry's address; the symbol is read from the PTX | `nvrtcAddNameExpression` / `nvrtcGetLoweredName` | as nvcc |
//! | recorded as | `nvcc 13.0.88, host gcc …` | `nvrtc 12.9.86` | `nvcc+ptxas 13.0.88 + ptxas 12.9.86, host gcc …` |
//! | log | stdout and stderr | the program log, with a note when it failed on host code | both tools' output |
//!
//! Every error names the kernel, the architecture, the CUDA build and the compiler with its
//! version, and a failed compile carries the compiler's full log.
//!
//! | module | owns |
//! | --- | --- |
//! | this one | [`CompileRequest`], [`Compiler`], [`CompileError`], [`compiler_for`], the executor's failures as errors |
//! | `nvcc` | [`Nvcc`], and the note on failed entry probes the nvcc+ptxas route shares |
//! | `nvcc_ptxas` | [`NvccPtxas`]: PTX from a newer nvcc, assembled by the build's `ptxas` |
//! | `nvrtc` | [`Nvrtc`] and the notes on its failures ([`explain_nvrtc_log`]) |

mod nvcc;
mod nvcc_ptxas;
mod nvrtc;
#[cfg(test)]
mod tests;

use std::path::PathBuf;

use prebuilt::compile::{self, computed, CompileFailure, CompileJob, CompilerTool};
use prebuilt::index::CompilerRecord;
use prebuilt::nvrtc::NvrtcError;
use prebuilt::target::{Arch, CudaBuild};

use crate::toolchain::{CompilerId, CompilerKind, Toolchain};

pub use nvcc::Nvcc;
pub use nvcc_ptxas::NvccPtxas;
pub use nvrtc::{explain_nvrtc_log, Nvrtc};

/// One kernel, one architecture: everything a compiler needs.
#[derive(Clone, Copy, Debug)]
pub struct CompileRequest<'a> {
    /// The kernel's name, for messages.
    pub kernel: &'a str,
    /// What the executor compiles: the key (which names the folder the compile runs in),
    /// the library's files laid out as a bundle's `sources/`, the source, include dirs,
    /// defines, flags, C++ standard, target arch, name expressions and preamble.
    pub job: CompileJob<'a>,
}

/// What a successful compile produced: the cubin, the compiler's output (warnings, or
/// empty), and each name expression with its mangled symbol.
pub use prebuilt::compile::Compiled as CompileOutput;

/// Compiles one kernel for one architecture. The scheduler holds these; tests substitute fakes.
pub trait Compiler: Send + Sync {
    /// Which compiler this is, with its exact version.
    fn id(&self) -> &CompilerId;
    /// Compiles `request` into a cubin.
    fn compile(&self, request: &CompileRequest<'_>) -> Result<CompileOutput, CompileError>;
    /// What the index and the key record as having produced the cubins: the compiler, its
    /// version, and for nvcc the assembler and host compiler it used.
    fn record(&self) -> CompilerRecord {
        CompilerRecord {
            kind: self.id().kind.to_string(),
            version: self.id().version.clone(),
        }
    }
}

/// A kernel that did not compile, or a compiler that could not run.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// The compiler rejected the source; `log` is everything it printed.
    #[error("failed to compile `{kernel}` for {arch} ({build}, {compiler}):\n{log}")]
    Failed {
        /// The kernel.
        kernel: String,
        /// The target architecture.
        arch: Arch,
        /// The CUDA build.
        build: CudaBuild,
        /// The compiler and its version.
        compiler: CompilerId,
        /// The compiler's full output.
        log: String,
    },
    /// nvcc's PTX needs a newer PTX ISA than this build's `ptxas` assembles.
    #[error(
        "cannot compile `{kernel}` for {arch} ({build}, {compiler}): the PTX uses a feature of \
         PTX ISA {}.{} that ptxas of CUDA {} (PTX ISA {}.{} at most) cannot assemble; ptxas \
         said:\n{log}",
        .emitted.0, .emitted.1, .build.version(), .supported.0, .supported.1
    )]
    NewerPtx {
        /// The kernel.
        kernel: String,
        /// The target architecture.
        arch: Arch,
        /// The CUDA build.
        build: CudaBuild,
        /// The compiler route and its versions.
        compiler: CompilerId,
        /// The PTX ISA nvcc wrote, (9, 0) for `9.0`.
        emitted: (u32, u32),
        /// The newest PTX ISA the build's ptxas reads, (8, 8) for `8.8`.
        supported: (u32, u32),
        /// What ptxas printed.
        log: String,
    },
    /// The nvcc+ptxas route cannot pass a flag on to the tool that obeys it.
    #[error(
        "cannot compile `{kernel}` for {arch} ({build}, {compiler}): {flag} {reason}; the \
         route compiles PTX with nvcc and assembles it with this build's ptxas (see \
         docs/toolchains.md)",
        flag = format!("`{}`", .flag.flag),
        reason = .flag.reason
    )]
    Unhonoured {
        /// The kernel.
        kernel: String,
        /// The target architecture.
        arch: Arch,
        /// The CUDA build.
        build: CudaBuild,
        /// The compiler route and its versions.
        compiler: CompilerId,
        /// The flag and why.
        flag: compile::ptxas::UnhonouredFlag,
    },
    /// The compiler cannot target the architecture at all.
    #[error(
        "cannot compile `{kernel}` for {arch} ({build}, {compiler}): the compiler targets only {}",
        sm_list(.supported)
    )]
    Unsupported {
        /// The kernel.
        kernel: String,
        /// The target architecture.
        arch: Arch,
        /// The CUDA build.
        build: CudaBuild,
        /// The compiler and its version.
        compiler: CompilerId,
        /// The SM numbers it does target.
        supported: Vec<u32>,
    },
    /// nvcc could not be started.
    #[error("could not run {program} to compile `{kernel}` for {arch} ({build}, {compiler})")]
    Spawn {
        /// The kernel.
        kernel: String,
        /// The target architecture.
        arch: Arch,
        /// The CUDA build.
        build: CudaBuild,
        /// The compiler and its version.
        compiler: CompilerId,
        /// The nvcc executable.
        program: PathBuf,
        /// Why it could not start.
        #[source]
        source: std::io::Error,
    },
    /// A file the compile needs could not be read or written.
    #[error("could not {action} {path} to compile `{kernel}` for {arch} ({build}, {compiler})")]
    Io {
        /// The kernel.
        kernel: String,
        /// The target architecture.
        arch: Arch,
        /// The CUDA build.
        build: CudaBuild,
        /// The compiler and its version.
        compiler: CompilerId,
        /// What was being done: "read the source", "read the cubin".
        action: &'static str,
        /// The file or folder.
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: std::io::Error,
    },
    /// An NVRTC call failed for a reason other than the source (an option it rejects, say).
    #[error("NVRTC could not compile `{kernel}` for {arch} ({build}, {compiler})")]
    Nvrtc {
        /// The kernel.
        kernel: String,
        /// The target architecture.
        arch: Arch,
        /// The CUDA build.
        build: CudaBuild,
        /// The compiler and its version.
        compiler: CompilerId,
        /// What NVRTC said.
        #[source]
        source: Box<NvrtcError>,
    },
    /// The toolchain's libnvrtc could not be loaded.
    #[error("could not load NVRTC for {build} ({compiler})")]
    Library {
        /// The CUDA build.
        build: CudaBuild,
        /// The compiler and its version.
        compiler: CompilerId,
        /// Why.
        #[source]
        source: Box<NvrtcError>,
    },
    /// The toolchain does not compile with the compiler asked for, or lacks its files.
    #[error("the {build} toolchain at {root} ({compiler}) has no usable {wanted}")]
    NotInToolchain {
        /// The CUDA build.
        build: CudaBuild,
        /// The compiler the toolchain names.
        compiler: CompilerId,
        /// The toolchain's folder.
        root: PathBuf,
        /// The compiler asked for.
        wanted: CompilerKind,
    },
}

impl CompileError {
    /// The same error, a failed compile's log rewritten by `explain` (a note appended).
    fn explain_log(self, explain: impl FnOnce(String) -> String) -> CompileError {
        match self {
            CompileError::Failed {
                kernel,
                arch,
                build,
                compiler,
                log,
            } => CompileError::Failed {
                kernel,
                arch,
                build,
                compiler,
                log: explain(log),
            },
            error => error,
        }
    }
}

/// `error` with a note naming what a failed line of the generated evaluations computes
/// ([`prebuilt::compile::computed`]): the constant and its entry, or the struct and field.
pub(crate) fn explain_computed(request: &CompileRequest<'_>, error: CompileError) -> CompileError {
    let evaluations = request.job.computed;
    if evaluations.is_empty() {
        return error;
    }
    error.explain_log(|log| {
        let Some(evaluation) = computed::evaluation_of_error(&log).and_then(|n| evaluations.get(n))
        else {
            return log;
        };
        format!(
            "{log}\nnote: `{}` is the kernel's `computed` and `structs` expressions, one line \
             each; the error is in {} of kernel `{}`\n",
            computed::COMPUTED_FILE,
            evaluation.label,
            request.kernel
        )
    })
}

fn sm_list(archs: &[u32]) -> String {
    let names: Vec<String> = archs.iter().map(|sm| format!("sm_{sm}")).collect();
    names.join(", ")
}

/// The compiler `toolchain` uses: nvcc where the build has it, NVRTC otherwise.
pub fn compiler_for(toolchain: &Toolchain) -> Result<Box<dyn Compiler>, CompileError> {
    compiler_run_by(toolchain, None)
}

/// [`compiler_for`], its nvcc and `ptxas` run by `runner` where one is given (a build farm;
/// NVRTC always runs in this process).
pub fn compiler_run_by(
    toolchain: &Toolchain,
    runner: Option<std::sync::Arc<dyn compile::ToolRunner>>,
) -> Result<Box<dyn Compiler>, CompileError> {
    Ok(match toolchain.compiler.kind {
        CompilerKind::Nvcc => match runner {
            Some(runner) => Box::new(Nvcc::new(toolchain)?.with_runner(runner)),
            None => Box::new(Nvcc::new(toolchain)?),
        },
        CompilerKind::Nvrtc => Box::new(Nvrtc::new(toolchain)?),
        CompilerKind::Precompiled => {
            return Err(CompileError::NotInToolchain {
                build: toolchain.build,
                compiler: toolchain.compiler.clone(),
                root: toolchain.root.clone(),
                wanted: CompilerKind::Precompiled,
            })
        }
        CompilerKind::NvccPtxas => {
            let front_end = crate::toolchain::front_end_for(toolchain.build);
            let front_end = front_end.ok_or_else(|| CompileError::NotInToolchain {
                build: toolchain.build,
                compiler: toolchain.compiler.clone(),
                root: toolchain.root.clone(),
                wanted: CompilerKind::NvccPtxas,
            })?;
            let route = NvccPtxas::new(toolchain, &front_end)?;
            match runner {
                Some(runner) => Box::new(route.with_runner(runner)),
                None => Box::new(route),
            }
        }
    })
}

/// The toolchain behind a compiler: every error carries its build and compiler. Its tools
/// run through `runner`: here ([`compile::Local`]) unless [`Identity::with_runner`] says
/// otherwise.
#[derive(Clone)]
struct Identity {
    toolchain: Toolchain,
    runner: std::sync::Arc<dyn compile::ToolRunner>,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("toolchain", &self.toolchain)
            .finish_non_exhaustive()
    }
}

impl Identity {
    /// The identity of `toolchain`'s compiler, which must be of `kind` and present.
    fn new(toolchain: &Toolchain, kind: CompilerKind) -> Result<Identity, CompileError> {
        let present = match kind {
            CompilerKind::Nvcc => toolchain.nvcc.is_some(),
            CompilerKind::Nvrtc => toolchain.nvrtc.is_some(),
            CompilerKind::NvccPtxas => toolchain.ptxas.is_some(),
            CompilerKind::Precompiled => false,
        };
        if toolchain.compiler.kind != kind || !present {
            return Err(CompileError::NotInToolchain {
                build: toolchain.build,
                compiler: toolchain.compiler.clone(),
                root: toolchain.root.clone(),
                wanted: kind,
            });
        }
        Ok(Identity {
            toolchain: toolchain.clone(),
            runner: std::sync::Arc::new(compile::Local),
        })
    }

    /// This identity, its tools run by `runner`.
    fn with_runner(self, runner: std::sync::Arc<dyn compile::ToolRunner>) -> Identity {
        Identity { runner, ..self }
    }

    fn build(&self) -> CudaBuild {
        self.toolchain.build
    }

    fn compiler(&self) -> &CompilerId {
        &self.toolchain.compiler
    }

    fn check_arch(&self, request: &CompileRequest<'_>) -> Result<(), CompileError> {
        if self.toolchain.supports(request.job.arch) {
            return Ok(());
        }
        Err(CompileError::Unsupported {
            kernel: request.kernel.to_owned(),
            arch: request.job.arch,
            build: self.build(),
            compiler: self.compiler().clone(),
            supported: self.toolchain.supported_archs.iter().copied().collect(),
        })
    }

    /// Runs the executor for `request` with `tool`; its failures as this crate's errors.
    fn run(
        &self,
        tool: &CompilerTool<'_>,
        request: &CompileRequest<'_>,
    ) -> Result<CompileOutput, CompileError> {
        self.check_arch(request)?;
        compile::compile_with(tool, &request.job, self.runner.as_ref())
            .map_err(|failure| self.error(request, failure))
    }

    fn error(&self, request: &CompileRequest<'_>, failure: CompileFailure) -> CompileError {
        let kernel = request.kernel.to_owned();
        let arch = request.job.arch;
        let build = self.build();
        let compiler = self.compiler().clone();
        match failure {
            CompileFailure::Rejected { log } => CompileError::Failed {
                kernel,
                arch,
                build,
                compiler,
                log,
            },
            CompileFailure::NewerPtx {
                emitted,
                supported,
                log,
            } => CompileError::NewerPtx {
                kernel,
                arch,
                build,
                compiler,
                emitted,
                supported,
                log,
            },
            CompileFailure::Unhonoured(flag) => CompileError::Unhonoured {
                kernel,
                arch,
                build,
                compiler,
                flag,
            },
            CompileFailure::Spawn { program, source } => CompileError::Spawn {
                kernel,
                arch,
                build,
                compiler,
                program,
                source,
            },
            CompileFailure::Io {
                action,
                path,
                source,
            } => CompileError::Io {
                kernel,
                arch,
                build,
                compiler,
                action,
                path,
                source,
            },
            CompileFailure::Nvrtc(source) => CompileError::Nvrtc {
                kernel,
                arch,
                build,
                compiler,
                source,
            },
        }
    }
}
