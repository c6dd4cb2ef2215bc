//! nvcc as a process, and what the nvcc+ptxas route shares with it: the note on a failed
//! compile of the generated unit that names each entry's symbol.

use prebuilt::compile::{self, CompilerTool};
use prebuilt::index::CompilerRecord;

use super::{CompileError, CompileOutput, CompileRequest, Compiler, Identity};
use crate::toolchain::{CompilerId, CompilerKind, Toolchain};
use std::path::PathBuf;

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
}

impl Nvcc {
    /// This nvcc, run by `runner` rather than here (see [`compile::ToolRunner`]).
    pub fn with_runner(self, runner: std::sync::Arc<dyn compile::ToolRunner>) -> Nvcc {
        Nvcc {
            identity: self.identity.with_runner(runner),
            ..self
        }
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
        let tool = CompilerTool::Nvcc {
            nvcc: &self.program,
        };
        self.identity
            .run(&tool, request)
            .map_err(|error| explain_probes(request, error))
    }
}

/// The record of an nvcc compile: nvcc's version and the host compiler it preprocessed with,
/// by the JIT's definition ([`compile::nvcc_record`]), so the two keys agree.
pub(super) fn nvcc_record(id: &CompilerId, host_compiler: &str) -> CompilerRecord {
    compile::nvcc_record(id.kind, &id.version, host_compiler)
}

/// Whether `log` reports an error on one of the `probes` lines of the generated file (entry
/// `n` is on line `3 + 2n`: `kwheel-entries.cu(3): error: ...`), not merely names the file, as
/// nvcc's summary and an include chain do for an error anywhere.
fn errs_at_probe_line(log: &str, probes: usize) -> bool {
    let file = compile::ENTRY_PROBES_SOURCE;
    let probe_line = |line: usize| line >= 3 && line < 3 + 2 * probes && line % 2 == 1;
    log.lines()
        .filter(|line| line.contains("error"))
        .any(|line| {
            line.match_indices(file).any(|(at, _)| {
                let rest = &line[at + file.len()..];
                let rest = rest
                    .strip_prefix('(')
                    .or_else(|| rest.strip_prefix(':'))
                    .unwrap_or("");
                let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
                digits.parse().is_ok_and(probe_line)
            })
        })
}

/// `error` with a note on the generated file, when nvcc failed on a compile with entry probes
/// ([`compile::entry_probes_source`]): an error in `kwheel-entries.cu` is an entry that names
/// no kernel as written.
pub(super) fn explain_probes(request: &CompileRequest<'_>, error: CompileError) -> CompileError {
    let expressions = request.job.name_expressions;
    error.explain_log(|log| {
        if !errs_at_probe_line(&log, expressions.len()) {
            return log;
        }
        let lines: Vec<String> = expressions
            .iter()
            .enumerate()
            .map(|(n, entry)| format!("line {}: entry `{entry}`", 3 + 2 * n))
            .collect();
        format!(
            "{log}\nnote: `kwheel-entries.cu` is the kernel's source followed by one line per \
             name expression of `entries`, taking its address ({}); an error there means the \
             entry names no kernel as written\n",
            lines.join(", ")
        )
    })
}
