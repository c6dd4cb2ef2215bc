//! The nvcc+ptxas route: a newer toolkit's nvcc writes PTX, whose ISA version is lowered to what
//! the build's own `ptxas` reads, and that `ptxas` assembles the cubin.

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};

use prebuilt::compile;
use prebuilt::index::CompilerRecord;
use prebuilt::target::Arch;

use super::nvcc::{nvcc_record, run_tool, work_dir, EntryProbes};
use super::{
    absolute, absolute_dirs, compile_options, CompileError, CompileOutput, CompileRequest,
    Compiler, Identity,
};
use crate::toolchain::{max_ptx_isa, ptxas_version, CompilerId, CompilerKind, Toolchain};

/// The PTX ISA of a `.version X.Y` line.
pub(super) fn ptx_isa(ptx: &str) -> Option<(u32, u32)> {
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
pub(super) fn lower_ptx_isa(ptx: &str, max: (u32, u32)) -> String {
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
pub(super) fn ptxas_options(flags: &[String]) -> Vec<String> {
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
