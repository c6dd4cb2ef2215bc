//! The two compilers: nvcc as a process, NVRTC in this process. Both turn one kernel's source
//! into a cubin for one architecture.
//!
//! [`Compiler`] is the seam the scheduler uses, so scheduling and error paths are tested with
//! fakes; [`compiler_for`] picks the real one a [`Toolchain`] names.
//!
//! | | [`Nvcc`] | [`Nvrtc`] |
//! | --- | --- | --- |
//! | runs as | `nvcc -cubin` in a temp dir, clean environment | `libnvrtc` calls, one program per compile |
//! | toolkit headers | nvcc's own (its `nvcc.profile`) | `-I` each of the toolchain's include dirs |
//! | templated entries | mangled names read from the cubin later | `nvrtcGetLoweredName` |
//! | log | stdout and stderr | the program log |
//!
//! Every error names the kernel, the architecture, the CUDA build and the compiler with its
//! version, and a failed compile carries the compiler's full log.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use prebuilt::target::{Arch, CudaBuild};

use crate::toolchain::{nvcc_command, CompilerId, CompilerKind, Toolchain};
use prebuilt::jit;
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
}

impl Nvcc {
    /// The nvcc of `toolchain`.
    pub fn new(toolchain: &Toolchain) -> Result<Nvcc, CompileError> {
        let identity = Identity::new(toolchain, CompilerKind::Nvcc)?;
        let program = toolchain.nvcc.clone().unwrap_or_default();
        Ok(Nvcc { identity, program })
    }

    /// The arguments nvcc gets for `request`, writing the cubin to `output`.
    pub fn arguments(&self, request: &CompileRequest<'_>, output: &Path) -> Vec<OsString> {
        let include_dirs = absolute_dirs(request.include_dirs);
        jit::nvcc_arguments(
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

    fn compile(&self, request: &CompileRequest<'_>) -> Result<CompileOutput, CompileError> {
        let identity = &self.identity;
        identity.check_arch(request)?;
        // nvcc writes its intermediate files to TMPDIR: keep them in a folder of our own, so
        // that concurrent compiles never meet and nothing is left behind.
        let work = tempfile::Builder::new()
            .prefix("kwheel-nvcc-")
            .tempdir()
            .map_err(|error| {
                identity.io(
                    request,
                    "create a temp dir in",
                    &std::env::temp_dir(),
                    error,
                )
            })?;
        let output_path = work.path().join("kernel.cubin");
        let output = nvcc_command(&self.program)
            .args(self.arguments(request, &output_path))
            .current_dir(work.path())
            .env("TMPDIR", work.path())
            .output()
            .map_err(|source| CompileError::Spawn {
                kernel: request.kernel.to_owned(),
                arch: request.arch,
                build: identity.build(),
                compiler: identity.compiler().clone(),
                program: self.program.clone(),
                source,
            })?;
        let mut log = String::from_utf8_lossy(&output.stdout).into_owned();
        log.push_str(&String::from_utf8_lossy(&output.stderr));
        if !output.status.success() {
            if log.trim().is_empty() {
                log = format!("nvcc {} and printed nothing", output.status);
            }
            return Err(identity.failed(request, log));
        }
        let cubin = fs::read(&output_path).map_err(|error| {
            identity.io(request, "read the cubin nvcc wrote to", &output_path, error)
        })?;
        Ok(CompileOutput {
            cubin,
            log,
            lowered_names: BTreeMap::new(),
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
    jit::nvrtc_options(
        &compile_options(request, &include_dirs),
        toolkit_include_dirs,
    )
}

/// The settings both compilers take, in the one order the bundler and the runtime's JIT share
/// (so a JIT compile reproduces a bundled cubin).
fn compile_options<'a>(
    request: &CompileRequest<'a>,
    include_dirs: &'a [PathBuf],
) -> jit::CompileOptions<'a> {
    jit::CompileOptions {
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
                NvrtcError::Compilation { log } => identity.failed(request, log),
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
}
