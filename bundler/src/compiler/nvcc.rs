//! nvcc as a process, and what the nvcc+ptxas route shares with it: a private work dir, running
//! a CUDA tool with a clean environment, and the generated unit that names each entry's symbol.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};

use prebuilt::compile;
use prebuilt::index::CompilerRecord;

use super::{
    absolute, absolute_dirs, compile_options, CompileError, CompileOutput, CompileRequest,
    Compiler, Identity,
};
use crate::toolchain::{nvcc_command, CompilerId, CompilerKind, Toolchain};

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
pub(super) fn nvcc_record(id: &CompilerId, host_compiler: &str) -> CompilerRecord {
    compile::nvcc_record(&id.kind.to_string(), &id.version, host_compiler)
}

/// A work dir of our own: nvcc writes its intermediate files to TMPDIR, so concurrent compiles
/// never meet and nothing is left behind.
pub(super) fn work_dir(
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
pub(super) fn run_tool(
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
pub(super) struct EntryProbes {
    pub(super) source: PathBuf,
    pub(super) entries: Vec<String>,
}

impl EntryProbes {
    /// Writes `kwheel-entries.cu` into `work`, or nothing when no entry is a name expression.
    pub(super) fn write(
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
    pub(super) fn explain(probes: Option<&EntryProbes>, error: CompileError) -> CompileError {
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
    pub(super) fn read(&self, ptx: &str) -> BTreeMap<String, String> {
        compile::read_entry_probes(ptx, &self.entries)
    }
}
