//! NVRTC in this process, through the toolchain's libnvrtc.

use std::fs;
use std::path::PathBuf;
use std::sync::Arc;

use prebuilt::compile;
use prebuilt::nvrtc::{self, NvrtcError, NvrtcLibrary};

use super::{
    absolute, absolute_dirs, compile_options, CompileError, CompileOutput, CompileRequest,
    Compiler, Identity,
};
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

    /// The NVRTC options for `request`: the kernel's include dirs, then the toolkit's.
    ///
    /// The program is named by the source's absolute path, which is how NVRTC, compiling a
    /// string, still resolves quoted includes next to the source the way nvcc does.
    pub fn options(&self, request: &CompileRequest<'_>) -> Vec<String> {
        nvrtc_options(request, &self.toolkit_include_dirs)
    }
}

pub(super) fn nvrtc_options(
    request: &CompileRequest<'_>,
    toolkit_include_dirs: &[PathBuf],
) -> Vec<String> {
    let include_dirs = absolute_dirs(request.include_dirs);
    compile::nvrtc_options(
        &compile_options(request, &include_dirs),
        toolkit_include_dirs,
    )
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
