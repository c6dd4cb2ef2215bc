//! The compilers: nvcc as a process, NVRTC in this process, and for a CUDA build that has
//! `ptxas` but no nvcc (12.9 from its wheels) a newer nvcc's PTX assembled by that `ptxas`.
//! Each turns one kernel's source into a cubin for one architecture.
//!
//! [`Compiler`] is the seam the scheduler uses, so scheduling and error paths are tested with
//! fakes; [`compiler_for`] picks the real one a [`Toolchain`] names.
//!
//! | | [`Nvcc`] | [`Nvrtc`] | [`NvccPtxas`] |
//! | --- | --- | --- | --- |
//! | runs as | `nvcc -cubin` in a temp dir, clean environment | `libnvrtc` calls, one program per compile | `nvcc -ptx -arch=compute_XYa`, PTX ISA lowered, then the build's `ptxas -arch=sm_XYa` |
//! | toolkit headers | nvcc's own (its `nvcc.profile`) | `-I` each of the toolchain's include dirs | the newer nvcc's own |
//! | host code, system headers | yes (the host compiler preprocesses) | no | yes |
//! | name expressions in `entries` | a generated unit takes each entry's address; the symbol is read from the PTX | `nvrtcAddNameExpression` / `nvrtcGetLoweredName` | as nvcc |
//! | recorded as | `nvcc 13.0.88, host gcc …` | `nvrtc 12.9.86` | `nvcc+ptxas 13.0.88 + ptxas 12.9.86, host gcc …` |
//! | log | stdout and stderr | the program log, with a note when it failed on host code | both tools' output |
//!
//! Every error names the kernel, the architecture, the CUDA build and the compiler with its
//! version, and a failed compile carries the compiler's full log.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use prebuilt::target::{Arch, CudaBuild};

use crate::toolchain::{
    max_ptx_isa, nvcc_command, ptxas_version, CompilerId, CompilerKind, Toolchain,
};
use prebuilt::compile;
use prebuilt::index::CompilerRecord;
use prebuilt::nvrtc::{self, NvrtcError, NvrtcLibrary};

/// One kernel, one architecture: everything a compiler needs.
#[derive(Clone, Copy, Debug)]
pub struct CompileRequest<'a> {
    /// The kernel's name, for messages.
    pub kernel: &'a str,
    /// The `.cu` file to compile.
    pub source: &'a Path,
    /// The kernel's include directories, searched before the toolkit's.
    pub include_dirs: &'a [PathBuf],
    /// Preprocessor definitions, passed as `-DNAME=value`.
    pub defines: &'a BTreeMap<String, String>,
    /// Further compiler flags, passed as given after everything else.
    pub flags: &'a [String],
    /// The C++ standard, `c++17`.
    pub cxx_std: &'a str,
    /// The target architecture.
    pub arch: Arch,
    /// Templated entry points to instantiate and lower, like `scale_rows<float>`.
    pub name_expressions: &'a [String],
}

/// What a successful compile produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompileOutput {
    /// The cubin.
    pub cubin: Vec<u8>,
    /// The compiler's output: warnings, or empty.
    pub log: String,
    /// NVRTC: each name expression with its mangled symbol. nvcc: empty.
    pub lowered_names: BTreeMap<String, String>,
}

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

fn sm_list(archs: &[u32]) -> String {
    let names: Vec<String> = archs.iter().map(|sm| format!("sm_{sm}")).collect();
    names.join(", ")
}

/// The compiler `toolchain` uses: nvcc where the build has it, NVRTC otherwise.
pub fn compiler_for(toolchain: &Toolchain) -> Result<Box<dyn Compiler>, CompileError> {
    Ok(match toolchain.compiler.kind {
        CompilerKind::Nvcc => Box::new(Nvcc::new(toolchain)?),
        CompilerKind::Nvrtc => Box::new(Nvrtc::new(toolchain)?),
        CompilerKind::NvccPtxas => {
            let front_end = crate::toolchain::front_end_for(toolchain.build);
            let front_end = front_end.ok_or_else(|| CompileError::NotInToolchain {
                build: toolchain.build,
                compiler: toolchain.compiler.clone(),
                root: toolchain.root.clone(),
                wanted: CompilerKind::NvccPtxas,
            })?;
            Box::new(NvccPtxas::new(toolchain, &front_end)?)
        }
    })
}

/// The toolchain behind a compiler: every error carries its build and compiler.
#[derive(Debug, Clone)]
struct Identity {
    toolchain: Toolchain,
}

impl Identity {
    /// The identity of `toolchain`'s compiler, which must be of `kind` and present.
    fn new(toolchain: &Toolchain, kind: CompilerKind) -> Result<Identity, CompileError> {
        let present = match kind {
            CompilerKind::Nvcc => toolchain.nvcc.is_some(),
            CompilerKind::Nvrtc => toolchain.nvrtc.is_some(),
            CompilerKind::NvccPtxas => toolchain.ptxas.is_some(),
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
        })
    }

    fn build(&self) -> CudaBuild {
        self.toolchain.build
    }

    fn compiler(&self) -> &CompilerId {
        &self.toolchain.compiler
    }

    fn check_arch(&self, request: &CompileRequest<'_>) -> Result<(), CompileError> {
        if self.toolchain.supports(request.arch) {
            return Ok(());
        }
        Err(CompileError::Unsupported {
            kernel: request.kernel.to_owned(),
            arch: request.arch,
            build: self.build(),
            compiler: self.compiler().clone(),
            supported: self.toolchain.supported_archs.iter().copied().collect(),
        })
    }

    fn failed(&self, request: &CompileRequest<'_>, log: String) -> CompileError {
        CompileError::Failed {
            kernel: request.kernel.to_owned(),
            arch: request.arch,
            build: self.build(),
            compiler: self.compiler().clone(),
            log,
        }
    }

    fn io(
        &self,
        request: &CompileRequest<'_>,
        action: &'static str,
        path: &Path,
        source: std::io::Error,
    ) -> CompileError {
        CompileError::Io {
            kernel: request.kernel.to_owned(),
            arch: request.arch,
            build: self.build(),
            compiler: self.compiler().clone(),
            action,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// A path that does not depend on the working directory, since nvcc runs in a temp dir.
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// nvcc, run as `nvcc -cubin -arch=sm_90a …` with a clean environment.
#[derive(Debug, Clone)]
pub struct Nvcc {
    identity: Identity,
    program: PathBuf,
    host_compiler: String,
}

impl Nvcc {
    /// The nvcc of `toolchain`.
    pub fn new(toolchain: &Toolchain) -> Result<Nvcc, CompileError> {
        let identity = Identity::new(toolchain, CompilerKind::Nvcc)?;
        let program = toolchain.nvcc.clone().unwrap_or_default();
        Ok(Nvcc {
            identity,
            program,
            host_compiler: toolchain.host_compiler.clone().unwrap_or_default(),
        })
    }

    /// The arguments nvcc gets for `request`, writing the cubin to `output`.
    pub fn arguments(&self, request: &CompileRequest<'_>, output: &Path) -> Vec<OsString> {
        let include_dirs = absolute_dirs(request.include_dirs);
        compile::nvcc_arguments(
            &compile_options(request, &include_dirs),
            &absolute(request.source),
            output,
        )
    }
}

impl Compiler for Nvcc {
    fn id(&self) -> &CompilerId {
        self.identity.compiler()
    }

    fn record(&self) -> CompilerRecord {
        nvcc_record(self.id(), &self.host_compiler)
    }

    fn compile(&self, request: &CompileRequest<'_>) -> Result<CompileOutput, CompileError> {
        let identity = &self.identity;
        identity.check_arch(request)?;
        let work = work_dir(identity, request)?;
        let output_path = work.path().join("kernel.cubin");
        let probes = EntryProbes::write(identity, request, work.path())?;
        let mut arguments = self.arguments(request, &output_path);
        if let Some(probes) = &probes {
            // `-keep` leaves nvcc's PTX (`kwheel-entries.ptx`) in the work dir, where the
            // probes name each entry's symbol; the compile itself is unchanged.
            *arguments.last_mut().expect("the source is last") = probes.source.clone().into();
            arguments.insert(0, "-keep".into());
        }
        let log = run_tool(
            identity,
            request,
            &self.program,
            &arguments,
            work.path(),
            "nvcc",
        )
        .map_err(|error| EntryProbes::explain(probes.as_ref(), error))?;
        let cubin = fs::read(&output_path).map_err(|error| {
            identity.io(request, "read the cubin nvcc wrote to", &output_path, error)
        })?;
        let lowered_names = match &probes {
            // For a `compute_XY` target the output is that PTX itself.
            Some(probes) if request.arch.is_ptx() => probes.read(&String::from_utf8_lossy(&cubin)),
            Some(probes) => {
                let ptx_path = work.path().join(compile::ENTRY_PROBES_PTX);
                let ptx = fs::read_to_string(&ptx_path).map_err(|error| {
                    identity.io(request, "read the PTX nvcc kept in", &ptx_path, error)
                })?;
                probes.read(&ptx)
            }
            None => BTreeMap::new(),
        };
        Ok(CompileOutput {
            cubin,
            log,
            lowered_names,
        })
    }
}

/// The record of an nvcc compile: nvcc's version and the host compiler it preprocessed with,
/// by the JIT's definition ([`compile::nvcc_record`]), so the two keys agree.
fn nvcc_record(id: &CompilerId, host_compiler: &str) -> CompilerRecord {
    compile::nvcc_record(&id.kind.to_string(), &id.version, host_compiler)
}

/// A work dir of our own: nvcc writes its intermediate files to TMPDIR, so concurrent compiles
/// never meet and nothing is left behind.
fn work_dir(
    identity: &Identity,
    request: &CompileRequest<'_>,
) -> Result<tempfile::TempDir, CompileError> {
    tempfile::Builder::new()
        .prefix("kwheel-nvcc-")
        .tempdir()
        .map_err(|error| {
            identity.io(
                request,
                "create a temp dir in",
                &std::env::temp_dir(),
                error,
            )
        })
}

/// Runs nvcc or ptxas in `work` with a clean environment; its output, or the failure with it.
fn run_tool(
    identity: &Identity,
    request: &CompileRequest<'_>,
    program: &Path,
    arguments: &[OsString],
    work: &Path,
    name: &str,
) -> Result<String, CompileError> {
    let output = nvcc_command(program)
        .args(arguments)
        .current_dir(work)
        .env("TMPDIR", work)
        .output()
        .map_err(|source| CompileError::Spawn {
            kernel: request.kernel.to_owned(),
            arch: request.arch,
            build: identity.build(),
            compiler: identity.compiler().clone(),
            program: program.to_path_buf(),
            source,
        })?;
    let mut log = String::from_utf8_lossy(&output.stdout).into_owned();
    log.push_str(&String::from_utf8_lossy(&output.stderr));
    if !output.status.success() {
        if log.trim().is_empty() {
            log = format!("{name} {} and printed nothing", output.status);
        }
        return Err(identity.failed(request, log));
    }
    Ok(log)
}

/// How nvcc is asked for the symbol of a name expression (`scale<half>`, `act<float, &silu>`):
/// a generated translation unit includes the source and stores each entry's address in a
/// device variable. nvcc then instantiates the template exactly as C++ reads the expression
/// (typedefs, `half`, integer and enum arguments, function pointers), and its PTX initializes
/// `__kwheel_entry_<n>` with the mangled symbol. NVRTC does the same with
/// `nvrtcAddNameExpression`.
struct EntryProbes {
    source: PathBuf,
    entries: Vec<String>,
}

impl EntryProbes {
    /// Writes `kwheel-entries.cu` into `work`, or nothing when no entry is a name expression.
    fn write(
        identity: &Identity,
        request: &CompileRequest<'_>,
        work: &Path,
    ) -> Result<Option<EntryProbes>, CompileError> {
        if request.name_expressions.is_empty() {
            return Ok(None);
        }
        let text =
            compile::entry_probes_source(&absolute(request.source), request.name_expressions);
        let source = work.join(compile::ENTRY_PROBES_SOURCE);
        fs::write(&source, text)
            .map_err(|error| identity.io(request, "write the entry probes to", &source, error))?;
        Ok(Some(EntryProbes {
            source,
            entries: request.name_expressions.to_vec(),
        }))
    }

    /// `error` with a note on the generated file, when nvcc failed on a compile with probes:
    /// an error in `kwheel-entries.cu` is an entry that names no kernel as written.
    fn explain(probes: Option<&EntryProbes>, error: CompileError) -> CompileError {
        match (probes, error) {
            (
                Some(probes),
                CompileError::Failed {
                    kernel,
                    arch,
                    build,
                    compiler,
                    log,
                },
            ) if log.contains("kwheel-entries.cu") => {
                let lines: Vec<String> = probes
                    .entries
                    .iter()
                    .enumerate()
                    .map(|(n, entry)| format!("line {}: entry `{entry}`", 3 + 2 * n))
                    .collect();
                CompileError::Failed {
                    kernel,
                    arch,
                    build,
                    compiler,
                    log: format!(
                        "{log}\nnote: `kwheel-entries.cu` is the kernel's source followed by \
                         one line per name expression of `entries`, taking its address ({}); an \
                         error there means the entry names no kernel as written\n",
                        lines.join(", ")
                    ),
                }
            }
            (_, error) => error,
        }
    }

    /// Each entry with the symbol its probe holds in `ptx`.
    fn read(&self, ptx: &str) -> BTreeMap<String, String> {
        compile::read_entry_probes(ptx, &self.entries)
    }
}

/// The PTX ISA of a `.version X.Y` line.
fn ptx_isa(ptx: &str) -> Option<(u32, u32)> {
    let line = ptx
        .lines()
        .map(str::trim)
        .find(|line| line.starts_with(".version"))?;
    let (major, minor) = line.strip_prefix(".version")?.trim().split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// `ptx` with its `.version` lowered to `max` when it is newer. Only the header changes: PTX
/// that uses nothing newer assembles the same; PTX that does is refused by ptxas, and the
/// refusal is reported as [`CompileError::NewerPtx`].
fn lower_ptx_isa(ptx: &str, max: (u32, u32)) -> String {
    match ptx_isa(ptx) {
        Some(isa) if isa > max => {
            let mut out = String::with_capacity(ptx.len());
            let mut done = false;
            for line in ptx.split_inclusive('\n') {
                if !done && line.trim_start().starts_with(".version") {
                    out.push_str(&format!(".version {}.{}\n", max.0, max.1));
                    done = true;
                } else {
                    out.push_str(line);
                }
            }
            out
        }
        _ => ptx.to_owned(),
    }
}

/// A CUDA build without nvcc of its own (CUDA 12.9 from its wheels) compiling code with host
/// parts: a newer toolkit's nvcc (13.0) runs the front end with `-ptx -arch=compute_90a`, the
/// PTX's ISA version is lowered to what this build's `ptxas` reads, and that `ptxas` assembles
/// the cubin for `sm_90a`. The cubin is then what this build's toolkit writes (its ABI and
/// toolkit version), so a driver of this build loads it; device code is compiled against the
/// front end's headers (`__CUDACC_VER_MAJOR__` is 13). See `docs/toolchains.md`.
#[derive(Debug, Clone)]
pub struct NvccPtxas {
    identity: Identity,
    nvcc: PathBuf,
    ptxas: PathBuf,
    max_isa: (u32, u32),
    host_compiler: String,
}

impl NvccPtxas {
    /// The route for `toolchain` (which has `ptxas`) through `front_end`'s nvcc.
    pub fn new(toolchain: &Toolchain, front_end: &Toolchain) -> Result<NvccPtxas, CompileError> {
        let not_in_toolchain = || CompileError::NotInToolchain {
            build: toolchain.build,
            compiler: toolchain.compiler.clone(),
            root: toolchain.root.clone(),
            wanted: CompilerKind::NvccPtxas,
        };
        let (Some(ptxas), Some(nvcc)) = (&toolchain.ptxas, &front_end.nvcc) else {
            return Err(not_in_toolchain());
        };
        let assembler_version = ptxas_version(ptxas).map_err(|_| not_in_toolchain())?;
        let max_isa = max_ptx_isa(&assembler_version).ok_or_else(not_in_toolchain)?;
        let mut route = toolchain.clone();
        route.compiler = CompilerId {
            kind: CompilerKind::NvccPtxas,
            version: format!("{} + ptxas {assembler_version}", front_end.compiler.version),
        };
        route.supported_archs = toolchain
            .supported_archs
            .intersection(&front_end.supported_archs)
            .copied()
            .collect();
        Ok(NvccPtxas {
            identity: Identity { toolchain: route },
            nvcc: nvcc.clone(),
            ptxas: ptxas.clone(),
            max_isa,
            host_compiler: front_end.host_compiler.clone().unwrap_or_default(),
        })
    }

    /// nvcc's arguments: the bundler's nvcc recipe, emitting PTX for the virtual architecture.
    pub fn nvcc_arguments(
        &self,
        request: &CompileRequest<'_>,
        source: &Path,
        output: &Path,
    ) -> Vec<OsString> {
        let include_dirs = absolute_dirs(request.include_dirs);
        let mut arguments =
            compile::nvcc_arguments(&compile_options(request, &include_dirs), source, output);
        for argument in &mut arguments {
            if argument == "-cubin" {
                *argument = "-ptx".into();
            } else if *argument == *format!("-arch={}", request.arch) {
                *argument = format!("-arch=compute_{}", arch_suffix(request.arch)).into();
            }
        }
        arguments
    }

    /// ptxas's arguments: nvcc's own (`-arch=sm_90a -m64`), then the kernel's `-Xptxas` options.
    pub fn ptxas_arguments(
        &self,
        request: &CompileRequest<'_>,
        ptx: &Path,
        output: &Path,
    ) -> Vec<OsString> {
        let mut arguments: Vec<OsString> =
            vec![format!("-arch={}", request.arch).into(), "-m64".into()];
        arguments.extend(ptxas_options(request.flags).into_iter().map(OsString::from));
        arguments.extend(["-o".into(), output.into(), ptx.into()]);
        arguments
    }
}

/// `90a` of `sm_90a`, `90` of `compute_90`.
fn arch_suffix(arch: Arch) -> String {
    let text = arch.to_string();
    text.strip_prefix("sm_")
        .or_else(|| text.strip_prefix("compute_"))
        .map(str::to_owned)
        .unwrap_or(text)
}

/// The options `flags` hands to ptxas (`-Xptxas -v`, `-Xptxas=-v,-O2`, `--ptxas-options=…`).
fn ptxas_options(flags: &[String]) -> Vec<String> {
    let mut options = Vec::new();
    let mut next_is_option = false;
    for flag in flags {
        let value = if next_is_option {
            next_is_option = false;
            Some(flag.as_str())
        } else if flag == "-Xptxas" || flag == "--ptxas-options" {
            next_is_option = true;
            None
        } else {
            flag.strip_prefix("-Xptxas=")
                .or_else(|| flag.strip_prefix("--ptxas-options="))
        };
        if let Some(value) = value {
            options.extend(
                value
                    .split(',')
                    .filter(|o| !o.is_empty())
                    .map(str::to_owned),
            );
        }
    }
    options
}

impl Compiler for NvccPtxas {
    fn id(&self) -> &CompilerId {
        self.identity.compiler()
    }

    fn record(&self) -> CompilerRecord {
        nvcc_record(self.id(), &self.host_compiler)
    }

    fn compile(&self, request: &CompileRequest<'_>) -> Result<CompileOutput, CompileError> {
        let identity = &self.identity;
        identity.check_arch(request)?;
        let work = work_dir(identity, request)?;
        let probes = EntryProbes::write(identity, request, work.path())?;
        let source = match &probes {
            Some(probes) => probes.source.clone(),
            None => absolute(request.source),
        };
        let ptx_path = work.path().join("kernel.ptx");
        let nvcc_arguments = self.nvcc_arguments(request, &source, &ptx_path);
        let mut log = run_tool(
            identity,
            request,
            &self.nvcc,
            &nvcc_arguments,
            work.path(),
            "nvcc",
        )
        .map_err(|error| EntryProbes::explain(probes.as_ref(), error))?;
        let ptx = fs::read_to_string(&ptx_path).map_err(|error| {
            identity.io(request, "read the PTX nvcc wrote to", &ptx_path, error)
        })?;
        let lowered_names = probes.map(|p| p.read(&ptx)).unwrap_or_default();
        let emitted = ptx_isa(&ptx);
        let lowered = lower_ptx_isa(&ptx, self.max_isa);
        if request.arch.is_ptx() {
            // A `compute_XY` target ships the PTX itself, at this build's PTX ISA.
            return Ok(CompileOutput {
                cubin: lowered.into_bytes(),
                log,
                lowered_names,
            });
        }
        let lowered_path = work.path().join("kernel.lowered.ptx");
        fs::write(&lowered_path, &lowered).map_err(|error| {
            identity.io(request, "write the lowered PTX to", &lowered_path, error)
        })?;
        let cubin_path = work.path().join("kernel.cubin");
        let ptxas_arguments = self.ptxas_arguments(request, &lowered_path, &cubin_path);
        match run_tool(
            identity,
            request,
            &self.ptxas,
            &ptxas_arguments,
            work.path(),
            "ptxas",
        ) {
            Ok(ptxas_log) => log.push_str(&ptxas_log),
            Err(CompileError::Failed { log: ptxas_log, .. })
                if emitted.is_some_and(|isa| isa > self.max_isa) =>
            {
                return Err(CompileError::NewerPtx {
                    kernel: request.kernel.to_owned(),
                    arch: request.arch,
                    build: identity.build(),
                    compiler: identity.compiler().clone(),
                    emitted: emitted.unwrap_or_default(),
                    supported: self.max_isa,
                    log: ptxas_log,
                });
            }
            Err(error) => return Err(error),
        }
        let cubin = fs::read(&cubin_path).map_err(|error| {
            identity.io(request, "read the cubin ptxas wrote to", &cubin_path, error)
        })?;
        Ok(CompileOutput {
            cubin,
            log,
            lowered_names,
        })
    }
}

/// NVRTC, through the toolchain's libnvrtc loaded into this process.
#[derive(Debug, Clone)]
pub struct Nvrtc {
    identity: Identity,
    library: Arc<NvrtcLibrary>,
    toolkit_include_dirs: Vec<PathBuf>,
}

impl Nvrtc {
    /// Loads the libnvrtc of `toolchain` (or reuses it, if this process already has).
    pub fn new(toolchain: &Toolchain) -> Result<Nvrtc, CompileError> {
        let identity = Identity::new(toolchain, CompilerKind::Nvrtc)?;
        let path = toolchain.nvrtc.clone().unwrap_or_default();
        let library = nvrtc::load(&path).map_err(|source| CompileError::Library {
            build: toolchain.build,
            compiler: toolchain.compiler.clone(),
            source: Box::new(source),
        })?;
        Ok(Nvrtc {
            identity,
            library,
            toolkit_include_dirs: toolchain.include_dirs.clone(),
        })
    }

    /// The NVRTC options for `request`: the kernel's include dirs, then the toolkit's.
    ///
    /// The program is named by the source's absolute path, which is how NVRTC, compiling a
    /// string, still resolves quoted includes next to the source the way nvcc does.
    pub fn options(&self, request: &CompileRequest<'_>) -> Vec<String> {
        nvrtc_options(request, &self.toolkit_include_dirs)
    }
}

fn nvrtc_options(request: &CompileRequest<'_>, toolkit_include_dirs: &[PathBuf]) -> Vec<String> {
    let include_dirs = absolute_dirs(request.include_dirs);
    compile::nvrtc_options(
        &compile_options(request, &include_dirs),
        toolkit_include_dirs,
    )
}

/// The settings both compilers take, in the one order the bundler and the runtime's JIT share
/// (so a JIT compile reproduces a bundled cubin).
fn compile_options<'a>(
    request: &CompileRequest<'a>,
    include_dirs: &'a [PathBuf],
) -> compile::CompileOptions<'a> {
    compile::CompileOptions {
        arch: request.arch,
        cxx_std: request.cxx_std,
        include_dirs,
        defines: request.defines,
        flags: request.flags,
    }
}

fn absolute_dirs(dirs: &[PathBuf]) -> Vec<PathBuf> {
    dirs.iter().map(|dir| absolute(dir)).collect()
}

impl Compiler for Nvrtc {
    fn id(&self) -> &CompilerId {
        self.identity.compiler()
    }

    fn compile(&self, request: &CompileRequest<'_>) -> Result<CompileOutput, CompileError> {
        let identity = &self.identity;
        identity.check_arch(request)?;
        let source_path = absolute(request.source);
        let source = fs::read_to_string(&source_path)
            .map_err(|error| identity.io(request, "read the source", &source_path, error))?;
        let name = source_path.display().to_string();
        let output = self
            .library
            .compile(
                &source,
                &name,
                &self.options(request),
                request.name_expressions,
            )
            .map_err(|error| match error {
                NvrtcError::Compilation { log } => identity.failed(request, explain_nvrtc_log(log)),
                error => CompileError::Nvrtc {
                    kernel: request.kernel.to_owned(),
                    arch: request.arch,
                    build: identity.build(),
                    compiler: identity.compiler().clone(),
                    source: Box::new(error),
                },
            })?;
        Ok(CompileOutput {
            cubin: output.cubin,
            log: output.log,
            lowered_names: output.lowered_names,
        })
    }
}

/// NVRTC's log, with a note when it failed on a host header or host code: NVRTC compiles device
/// code only, which a library's launchers and `<cstdio>` are not.
pub fn explain_nvrtc_log(log: String) -> String {
    let host_header = log.contains("cannot open source file");
    let host_code = log.contains("not allowed in JIT mode")
        || log.contains("host functions are not allowed")
        || log.contains("<<<");
    if !host_header && !host_code {
        return log;
    }
    let what = if host_header {
        "NVRTC cannot open a header that is not in the kernel's include dirs or the CUDA \
         toolkit: it has no host or system headers (`<cstdio>`, `<assert.h>`, the STL)"
    } else {
        "NVRTC rejects host code (host functions, `<<<...>>>` launches)"
    };
    format!(
        "{log}\nnote: {what}, because it compiles device code only. Set `compiler = \"nvcc\"` on \
         the kernel (or the library) to compile it with nvcc: a build without its own nvcc then \
         uses the newer toolkit's nvcc and its own ptxas (see docs/toolchains.md); or keep host \
         code out of device translation units behind `#ifndef __CUDACC_RTC__`.\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::toolchain::{error_chain, toolchain_for_tests, CUDA_12_9, CUDA_13_0};
    use std::collections::BTreeSet;
    use std::time::Instant;

    const KERNEL: &str = r#"
#include "scale.cuh"

template <typename T>
__global__ void scale_rows(T* out, const T* in, T factor, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * factor * SCALE;
}

extern "C" __global__ void add_one(float* data, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) data[i] += 1.0f;
}
"#;

    struct Fixture {
        _dir: tempfile::TempDir,
        source: PathBuf,
        include_dir: PathBuf,
        defines: BTreeMap<String, String>,
    }

    fn fixture(source: &str) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let source_path = dir.path().join("scale.cu");
        fs::write(&source_path, source).unwrap();
        // A header next to the source, found the way nvcc finds quoted includes.
        fs::write(
            dir.path().join("scale.cuh"),
            "#pragma once\n#include <common.cuh>\n#include <cuda/std/type_traits>\n",
        )
        .unwrap();
        let include_dir = dir.path().join("include");
        fs::create_dir(&include_dir).unwrap();
        fs::write(include_dir.join("common.cuh"), "#pragma once\n").unwrap();
        Fixture {
            source: source_path,
            include_dir,
            defines: BTreeMap::from([("SCALE".to_owned(), "2".to_owned())]),
            _dir: dir,
        }
    }

    fn request<'a>(
        fixture: &'a Fixture,
        include_dirs: &'a [PathBuf],
        arch: &str,
        name_expressions: &'a [String],
    ) -> CompileRequest<'a> {
        CompileRequest {
            kernel: "scale_rows",
            source: &fixture.source,
            include_dirs,
            defines: &fixture.defines,
            flags: &[],
            cxx_std: "c++17",
            arch: arch.parse().unwrap(),
            name_expressions,
        }
    }

    fn assert_cubin(bytes: &[u8]) {
        assert_eq!(&bytes[..4], b"\x7fELF", "not an ELF file");
        assert_eq!(u16::from_le_bytes([bytes[18], bytes[19]]), 190, "e_machine");
    }

    fn compile_both_archs(build: CudaBuild, kind: CompilerKind) {
        let Some(toolchain) = toolchain_for_tests(build) else {
            return;
        };
        let compiler = compiler_for(&toolchain).unwrap();
        assert_eq!(compiler.id().kind, kind);
        let fixture = fixture(KERNEL);
        let include_dirs = [fixture.include_dir.clone()];
        let expressions = ["scale_rows<float>".to_owned()];
        for arch in ["sm_90a", "sm_100a"] {
            let started = Instant::now();
            let output = compiler
                .compile(&request(&fixture, &include_dirs, arch, &expressions))
                .unwrap_or_else(|error| panic!("{}", error_chain(&error)));
            eprintln!("{} {arch}: {:?}", compiler.id(), started.elapsed());
            assert_cubin(&output.cubin);
        }
    }

    #[test]
    fn nvcc_compiles_for_sm_90a_and_sm_100a() {
        compile_both_archs(CUDA_13_0, CompilerKind::Nvcc);
    }

    #[test]
    fn nvrtc_compiles_for_sm_90a_and_sm_100a() {
        compile_both_archs(CUDA_12_9, CompilerKind::Nvrtc);
    }

    #[test]
    fn nvrtc_lowers_name_expressions() {
        let Some(toolchain) = toolchain_for_tests(CUDA_12_9) else {
            return;
        };
        let compiler = compiler_for(&toolchain).unwrap();
        let fixture = fixture(KERNEL);
        let include_dirs = [fixture.include_dir.clone()];
        let expressions = [
            "scale_rows<float>".to_owned(),
            "scale_rows<double>".to_owned(),
        ];
        let output = compiler
            .compile(&request(&fixture, &include_dirs, "sm_90a", &expressions))
            .unwrap_or_else(|error| panic!("{}", error_chain(&error)));
        assert_eq!(
            output.lowered_names,
            BTreeMap::from([
                (
                    "scale_rows<double>".to_owned(),
                    "_Z10scale_rowsIdEvPT_PKS0_S0_i".to_owned()
                ),
                (
                    "scale_rows<float>".to_owned(),
                    "_Z10scale_rowsIfEvPT_PKS0_S0_i".to_owned()
                ),
            ])
        );
    }

    fn syntax_error_fails(build: CudaBuild, compiler_name: &str) {
        let Some(toolchain) = toolchain_for_tests(build) else {
            return;
        };
        let compiler = compiler_for(&toolchain).unwrap();
        let fixture = fixture("__global__ void broken(float* x) { x[0] = ; }\n");
        let error = compiler
            .compile(&request(&fixture, &[], "sm_90a", &[]))
            .unwrap_err();
        let CompileError::Failed { log, .. } = &error else {
            panic!("expected a compile failure, got {}", error_chain(&error));
        };
        assert!(log.contains("expected an expression"), "{log}");
        assert!(log.contains("scale.cu"), "{log}");
        let message = error.to_string();
        let first_line = message.lines().next().unwrap();
        assert_eq!(
            first_line,
            format!("failed to compile `scale_rows` for sm_90a ({build}, {compiler_name}):")
        );
        assert!(message.ends_with(log.as_str()));
    }

    #[test]
    fn nvcc_syntax_error_carries_the_log() {
        syntax_error_fails(CUDA_13_0, "nvcc 13.0.88");
    }

    #[test]
    fn nvrtc_syntax_error_carries_the_log() {
        syntax_error_fails(CUDA_12_9, "nvrtc 12.9.86");
    }

    #[test]
    fn unsupported_arch_is_refused_before_compiling() {
        let Some(toolchain) = toolchain_for_tests(CUDA_13_0) else {
            return;
        };
        let compiler = compiler_for(&toolchain).unwrap();
        let fixture = fixture(KERNEL);
        let error = compiler
            .compile(&request(&fixture, &[], "sm_50", &[]))
            .unwrap_err();
        assert!(matches!(error, CompileError::Unsupported { .. }), "{error}");
        assert!(
            error.to_string().starts_with(
                "cannot compile `scale_rows` for sm_50 (cu130, nvcc 13.0.88): the compiler \
                 targets only sm_75, "
            ),
            "{error}"
        );
    }

    #[test]
    fn missing_source_names_the_file() {
        let Some(toolchain) = toolchain_for_tests(CUDA_12_9) else {
            return;
        };
        let compiler = compiler_for(&toolchain).unwrap();
        let defines = BTreeMap::new();
        let error = compiler
            .compile(&CompileRequest {
                kernel: "ghost",
                source: Path::new("/nonexistent/ghost.cu"),
                include_dirs: &[],
                defines: &defines,
                flags: &[],
                cxx_std: "c++17",
                arch: "sm_90a".parse().unwrap(),
                name_expressions: &[],
            })
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "could not read the source /nonexistent/ghost.cu to compile `ghost` for sm_90a \
             (cu129, nvrtc 12.9.86)"
        );
    }

    #[test]
    fn nvrtc_options_put_kernel_includes_before_the_toolkit() {
        let defines = BTreeMap::from([("BLOCK".to_owned(), "256".to_owned())]);
        let include_dirs = [PathBuf::from("/src/include")];
        let flags = ["--use_fast_math".to_owned()];
        let request = CompileRequest {
            kernel: "k",
            source: Path::new("/src/k.cu"),
            include_dirs: &include_dirs,
            defines: &defines,
            flags: &flags,
            cxx_std: "c++20",
            arch: "sm_100a".parse().unwrap(),
            name_expressions: &[],
        };
        let toolkit = [PathBuf::from("/tk/runtime"), PathBuf::from("/tk/cccl")];
        assert_eq!(
            nvrtc_options(&request, &toolkit),
            [
                "--gpu-architecture=sm_100a",
                "-std=c++20",
                "-I/src/include",
                "-I/tk/runtime",
                "-I/tk/cccl",
                "-DBLOCK=256",
                "--use_fast_math"
            ]
        );
    }

    #[test]
    fn nvrtc_rejected_option_names_the_kernel_and_compiler() {
        let Some(toolchain) = toolchain_for_tests(CUDA_12_9) else {
            return;
        };
        let compiler = compiler_for(&toolchain).unwrap();
        let fixture = fixture(KERNEL);
        let include_dirs = [fixture.include_dir.clone()];
        let flags = ["--no-such-option".to_owned()];
        let request = CompileRequest {
            flags: &flags,
            ..request(&fixture, &include_dirs, "sm_90a", &[])
        };
        let error = compiler.compile(&request).unwrap_err();
        assert!(matches!(error, CompileError::Nvrtc { .. }), "{error}");
        assert_eq!(
            error.to_string(),
            "NVRTC could not compile `scale_rows` for sm_90a (cu129, nvrtc 12.9.86)"
        );
        assert!(
            error_chain(&error).contains("--no-such-option"),
            "{}",
            error_chain(&error)
        );
    }

    #[test]
    fn compiler_must_be_the_toolchains_own() {
        let toolchain = Toolchain {
            build: CUDA_12_9,
            root: PathBuf::from("/tk"),
            nvcc: None,
            nvrtc: Some(PathBuf::from("/tk/lib/libnvrtc.so.12")),
            ptxas: None,
            host_compiler: None,
            include_dirs: Vec::new(),
            compiler: CompilerId {
                kind: CompilerKind::Nvrtc,
                version: "12.9.86".into(),
            },
            supported_archs: BTreeSet::from([90, 100]),
        };
        let error = Nvcc::new(&toolchain).unwrap_err();
        assert_eq!(
            error.to_string(),
            "the cu129 toolchain at /tk (nvrtc 12.9.86) has no usable nvcc"
        );
    }

    #[test]
    fn nvcc_command_line_is_fixed() {
        let toolchain = Toolchain {
            build: CUDA_13_0,
            root: PathBuf::from("/tk"),
            nvcc: Some(PathBuf::from("/tk/bin/nvcc")),
            nvrtc: None,
            ptxas: None,
            host_compiler: Some("gcc (GCC) 12.2.0".into()),
            include_dirs: vec![PathBuf::from("/tk/include")],
            compiler: CompilerId {
                kind: CompilerKind::Nvcc,
                version: "13.0.88".into(),
            },
            supported_archs: BTreeSet::from([90, 100]),
        };
        let nvcc = Nvcc::new(&toolchain).unwrap();
        let defines = BTreeMap::from([
            ("B".to_owned(), "2".to_owned()),
            ("A".to_owned(), "x y".to_owned()),
        ]);
        let include_dirs = [PathBuf::from("/src/include")];
        let flags = ["--use_fast_math".to_owned()];
        let request = CompileRequest {
            kernel: "k",
            source: Path::new("/src/k.cu"),
            include_dirs: &include_dirs,
            defines: &defines,
            flags: &flags,
            cxx_std: "c++17",
            arch: "sm_90a".parse().unwrap(),
            name_expressions: &[],
        };
        let arguments: Vec<String> = nvcc
            .arguments(&request, Path::new("/tmp/out.cubin"))
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
    fn ptx_isa_is_lowered_only_when_newer() {
        let ptx = "//\n// Generated by NVIDIA NVVM Compiler\n.version 9.0\n.target sm_90a\n.address_size 64\n";
        assert_eq!(ptx_isa(ptx), Some((9, 0)));
        let lowered = lower_ptx_isa(ptx, (8, 8));
        assert_eq!(lowered, ptx.replace(".version 9.0", ".version 8.8"));
        assert_eq!(lower_ptx_isa(&lowered, (8, 8)), lowered);
        assert_eq!(lower_ptx_isa(ptx, (9, 0)), ptx);
    }

    #[test]
    fn probes_name_each_entry_from_the_ptx() {
        let probes = EntryProbes {
            source: PathBuf::from("kwheel-entries.cu"),
            entries: (0..11).map(|n| format!("e<{n}>")).collect(),
        };
        let mut ptx = String::new();
        for n in 0..11 {
            ptx.push_str(&format!(
                ".global .align 8 .u64 __kwheel_entry_{n} = _Z1eILi{n}EEvv;\n"
            ));
        }
        ptx = ptx.replace("_Z1eILi10EEvv;", "generic(_Z1eILi10EEvv);");
        let names = probes.read(&ptx);
        assert_eq!(names["e<1>"], "_Z1eILi1EEvv");
        assert_eq!(names["e<10>"], "_Z1eILi10EEvv");
        assert_eq!(names.len(), 11);
    }

    #[test]
    fn ptxas_options_come_from_the_nvcc_flags() {
        let flags: Vec<String> = [
            "-lineinfo",
            "-Xptxas",
            "-v",
            "-Xptxas=-O2,-warn-spills",
            "--ptxas-options=--allow-expensive-optimizations=true",
        ]
        .map(str::to_owned)
        .to_vec();
        assert_eq!(
            ptxas_options(&flags),
            [
                "-v",
                "-O2",
                "-warn-spills",
                "--allow-expensive-optimizations=true"
            ]
        );
    }

    const HOST_CODE_KERNEL: &str = r#"
#include <cstdio>
#include <vector>

template <typename T>
__global__ void twice(T* x) { x[threadIdx.x] *= T(2); }
using floatX = float;

void launch(float* x) {
    std::vector<int> sizes{1};
    std::printf("%d\n", sizes[0]);
    twice<<<1, 32>>>(x);
}
"#;

    #[test]
    fn host_code_builds_for_cu129_through_nvcc_and_ptxas() {
        let (Some(cu129), Some(cu130)) = (
            toolchain_for_tests(CUDA_12_9),
            toolchain_for_tests(CUDA_13_0),
        ) else {
            return;
        };
        let route = NvccPtxas::new(&cu129, &cu130).unwrap();
        assert_eq!(route.id().to_string(), "nvcc+ptxas 13.0.88 + ptxas 12.9.86");
        assert!(route
            .record()
            .version
            .starts_with("13.0.88 + ptxas 12.9.86, host "));
        let fixture = fixture(HOST_CODE_KERNEL);
        let expressions = ["twice<floatX>".to_owned()];
        for (arch, header) in [("sm_90a", (7, 0x5a0d5a)), ("sm_100a", (8, 0x600640a))] {
            let output = route
                .compile(&request(&fixture, &[], arch, &expressions))
                .unwrap_or_else(|error| panic!("{}", error_chain(&error)));
            let info = prebuilt::cubin::inspect_cubin(&output.cubin).unwrap();
            // The header CUDA 12.9 writes (NVRTC 12.9's too), so a 12.9 driver loads it.
            assert_eq!((info.abi_version, info.elf_flags), header, "{arch}");
            assert_eq!(output.lowered_names["twice<floatX>"], "_Z5twiceIfEvPT_");
            assert!(info.function("_Z5twiceIfEvPT_").is_some());
        }
    }

    #[test]
    fn nvrtc_explains_host_headers_and_host_code() {
        let Some(toolchain) = toolchain_for_tests(CUDA_12_9) else {
            return;
        };
        let compiler = compiler_for(&toolchain).unwrap();
        let fixture = fixture(HOST_CODE_KERNEL);
        let error = compiler
            .compile(&request(&fixture, &[], "sm_90a", &[]))
            .unwrap_err();
        let CompileError::Failed { log, .. } = &error else {
            panic!("{}", error_chain(&error));
        };
        assert!(log.contains("cannot open source file"), "{log}");
        assert!(
            log.contains(
                "note: NVRTC cannot open a header that is not in the kernel's include dirs or \
                 the CUDA toolkit"
            ),
            "{log}"
        );
        assert!(log.contains("compiler = \"nvcc\""), "{log}");
        let plain = explain_nvrtc_log("error: expected an expression\n".to_owned());
        assert_eq!(plain, "error: expected an expression\n");
        let launch =
            explain_nvrtc_log("error: host functions are not allowed in JIT mode\n".into());
        assert!(launch.contains("NVRTC rejects host code"), "{launch}");
    }

    #[test]
    fn an_entry_that_names_nothing_points_at_the_generated_line() {
        let Some(toolchain) = toolchain_for_tests(CUDA_13_0) else {
            return;
        };
        let compiler = compiler_for(&toolchain).unwrap();
        let fixture = fixture(KERNEL);
        let include_dirs = [fixture.include_dir.clone()];
        let expressions = [
            "scale_rows<float>".to_owned(),
            "scale_rows<float, 3>".to_owned(),
        ];
        let error = compiler
            .compile(&request(&fixture, &include_dirs, "sm_90a", &expressions))
            .unwrap_err();
        let CompileError::Failed { log, .. } = &error else {
            panic!("{}", error_chain(&error));
        };
        assert!(
            log.contains(
                "note: `kwheel-entries.cu` is the kernel's source followed by one line per name \
                 expression of `entries`, taking its address (line 3: entry `scale_rows<float>`, \
                 line 5: entry `scale_rows<float, 3>`)"
            ),
            "{log}"
        );
    }
}
