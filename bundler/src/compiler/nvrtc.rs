//! NVRTC in this process, through the toolchain's libnvrtc.

use std::path::PathBuf;
use std::sync::Arc;

use prebuilt::compile::CompilerTool;
use prebuilt::nvrtc::{self, NvrtcLibrary};

use super::{CompileError, CompileOutput, CompileRequest, Compiler, Identity};
use crate::toolchain::{CompilerId, CompilerKind, Toolchain};

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
}

impl Compiler for Nvrtc {
    fn id(&self) -> &CompilerId {
        self.identity.compiler()
    }

    fn compile(&self, request: &CompileRequest<'_>) -> Result<CompileOutput, CompileError> {
        let tool = CompilerTool::Nvrtc {
            library: &self.library,
            include_dirs: &self.toolkit_include_dirs,
        };
        self.identity
            .run(&tool, request)
            .map_err(|error| error.explain_log(explain_nvrtc_log))
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
