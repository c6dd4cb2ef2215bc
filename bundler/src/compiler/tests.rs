use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use prebuilt::target::CudaBuild;

use super::nvcc::EntryProbes;
use super::nvcc_ptxas::{lower_ptx_isa, ptx_isa, ptxas_options};
use super::nvrtc::nvrtc_options;
use super::*;
use crate::toolchain::{error_chain, toolchain_for_tests, CUDA_12_9, CUDA_13_0};

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

/// A request for `scale_rows` in `fixture`'s source.
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

/// A request that only builds a command line: its source need not exist.
fn command_line_request<'a>(
    source: &'a str,
    include_dirs: &'a [PathBuf],
    defines: &'a BTreeMap<String, String>,
    flags: &'a [String],
    arch: &str,
) -> CompileRequest<'a> {
    CompileRequest {
        kernel: "k",
        source: Path::new(source),
        include_dirs,
        defines,
        flags,
        cxx_std: "c++17",
        arch: arch.parse().unwrap(),
        name_expressions: &[],
    }
}

/// The real compiler of `build`'s installed toolchain; `None` (the test passes vacuously)
/// where the toolchain is not installed.
fn installed_compiler(build: CudaBuild) -> Option<Box<dyn Compiler>> {
    let toolchain = toolchain_for_tests(build)?;
    Some(compiler_for(&toolchain).unwrap())
}

/// A toolchain under `/tk` that exists only as a description, for command lines and refusals.
fn described_toolchain(build: CudaBuild, kind: CompilerKind, version: &str) -> Toolchain {
    Toolchain {
        build,
        root: PathBuf::from("/tk"),
        nvcc: None,
        nvrtc: None,
        ptxas: None,
        host_compiler: None,
        include_dirs: Vec::new(),
        compiler: CompilerId {
            kind,
            version: version.into(),
        },
        supported_archs: BTreeSet::from([90, 100]),
    }
}

/// The log of a compile that must have failed in the compiler itself.
fn failure_log(result: Result<CompileOutput, CompileError>) -> (CompileError, String) {
    let error = result.unwrap_err();
    let CompileError::Failed { log, .. } = &error else {
        panic!("expected a compile failure, got {}", error_chain(&error));
    };
    let log = log.clone();
    (error, log)
}

fn assert_cubin(bytes: &[u8]) {
    assert_eq!(&bytes[..4], b"\x7fELF", "not an ELF file");
    assert_eq!(u16::from_le_bytes([bytes[18], bytes[19]]), 190, "e_machine");
}

fn compile_both_archs(build: CudaBuild, kind: CompilerKind) {
    let Some(compiler) = installed_compiler(build) else {
        return;
    };
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
    let Some(compiler) = installed_compiler(CUDA_12_9) else {
        return;
    };
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
    let Some(compiler) = installed_compiler(build) else {
        return;
    };
    let fixture = fixture("__global__ void broken(float* x) { x[0] = ; }\n");
    let (error, log) = failure_log(compiler.compile(&request(&fixture, &[], "sm_90a", &[])));
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
    let Some(compiler) = installed_compiler(CUDA_13_0) else {
        return;
    };
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
    let Some(compiler) = installed_compiler(CUDA_12_9) else {
        return;
    };
    let defines = BTreeMap::new();
    let request = CompileRequest {
        kernel: "ghost",
        ..command_line_request("/nonexistent/ghost.cu", &[], &defines, &[], "sm_90a")
    };
    let error = compiler.compile(&request).unwrap_err();
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
        cxx_std: "c++20",
        ..command_line_request("/src/k.cu", &include_dirs, &defines, &flags, "sm_100a")
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
    let Some(compiler) = installed_compiler(CUDA_12_9) else {
        return;
    };
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
        nvrtc: Some(PathBuf::from("/tk/lib/libnvrtc.so.12")),
        ..described_toolchain(CUDA_12_9, CompilerKind::Nvrtc, "12.9.86")
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
        nvcc: Some(PathBuf::from("/tk/bin/nvcc")),
        host_compiler: Some("gcc (GCC) 12.2.0".into()),
        include_dirs: vec![PathBuf::from("/tk/include")],
        ..described_toolchain(CUDA_13_0, CompilerKind::Nvcc, "13.0.88")
    };
    let nvcc = Nvcc::new(&toolchain).unwrap();
    let defines = BTreeMap::from([
        ("B".to_owned(), "2".to_owned()),
        ("A".to_owned(), "x y".to_owned()),
    ]);
    let include_dirs = [PathBuf::from("/src/include")];
    let flags = ["--use_fast_math".to_owned()];
    let request = command_line_request("/src/k.cu", &include_dirs, &defines, &flags, "sm_90a");
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
    let ptx =
        "//\n// Generated by NVIDIA NVVM Compiler\n.version 9.0\n.target sm_90a\n.address_size 64\n";
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
    let Some(compiler) = installed_compiler(CUDA_12_9) else {
        return;
    };
    let fixture = fixture(HOST_CODE_KERNEL);
    let (_, log) = failure_log(compiler.compile(&request(&fixture, &[], "sm_90a", &[])));
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
    let launch = explain_nvrtc_log("error: host functions are not allowed in JIT mode\n".into());
    assert!(launch.contains("NVRTC rejects host code"), "{launch}");
}

#[test]
fn an_entry_that_names_nothing_points_at_the_generated_line() {
    let Some(compiler) = installed_compiler(CUDA_13_0) else {
        return;
    };
    let fixture = fixture(KERNEL);
    let include_dirs = [fixture.include_dir.clone()];
    let expressions = [
        "scale_rows<float>".to_owned(),
        "scale_rows<float, 3>".to_owned(),
    ];
    let (_, log) =
        failure_log(compiler.compile(&request(&fixture, &include_dirs, "sm_90a", &expressions)));
    assert!(
        log.contains(
            "note: `kwheel-entries.cu` is the kernel's source followed by one line per name \
             expression of `entries`, taking its address (line 3: entry `scale_rows<float>`, \
             line 5: entry `scale_rows<float, 3>`)"
        ),
        "{log}"
    );
}
