//! The nvcc+ptxas route: a newer toolkit's nvcc writes PTX, whose ISA version is lowered to what
//! the build's own `ptxas` reads, and that `ptxas` assembles the cubin with the options nvcc
//! would have given its own (`prebuilt::compile::ptxas`).

use std::path::PathBuf;

use prebuilt::compile::ptxas::max_ptx_isa;
use prebuilt::compile::CompilerTool;
use prebuilt::index::CompilerRecord;

use super::nvcc::{explain_probes, nvcc_record};
use super::{CompileError, CompileOutput, CompileRequest, Compiler, Identity};
use crate::toolchain::{ptxas_version, CompilerId, CompilerKind, Toolchain};

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
            identity: Identity {
                toolchain: route,
                runner: std::sync::Arc::new(prebuilt::compile::Local),
            },
            nvcc: nvcc.clone(),
            ptxas: ptxas.clone(),
            max_isa,
            host_compiler: front_end.host_compiler.clone().unwrap_or_default(),
        })
    }

    /// This route, its nvcc and ptxas run by `runner` rather than here (see
    /// [`prebuilt::compile::ToolRunner`]).
    pub fn with_runner(
        self,
        runner: std::sync::Arc<dyn prebuilt::compile::ToolRunner>,
    ) -> NvccPtxas {
        NvccPtxas {
            identity: self.identity.with_runner(runner),
            ..self
        }
    }
}

impl Compiler for NvccPtxas {
    fn id(&self) -> &CompilerId {
        self.identity.compiler()
    }

    fn record(&self) -> CompilerRecord {
        nvcc_record(self.id(), &self.host_compiler)
    }

    fn compile(&self, request: &CompileRequest<'_>) -> Result<CompileOutput, CompileError> {
        let tool = CompilerTool::NvccPtxas {
            nvcc: &self.nvcc,
            ptxas: &self.ptxas,
            max_isa: self.max_isa,
        };
        self.identity
            .run(&tool, request)
            .map_err(|error| explain_probes(request, error))
    }
}
