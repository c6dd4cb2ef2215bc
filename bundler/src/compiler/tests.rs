use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use prebuilt::compile::{CompileJob, SourceTree};
use prebuilt::key::sha256_hex;
use prebuilt::target::CudaBuild;

use super::*;
use crate::toolchain::{
    both_toolchains, described_toolchain, toolchain_for_tests, CUDA_12_9, CUDA_13_0,
};
use testkit::error_chain;

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
    tree: SourceTree,
    defines: BTreeMap<String, String>,
    include: Vec<String>,
}

/// A library in a temp dir: `scale.cu` (`source`), `scale.cuh` beside it, `include/common.cuh`.
fn fixture(source: &str) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("scale.cu"), source).unwrap();
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
        tree: SourceTree {
            root: dir.path().to_path_buf(),
            outside: Vec::new(),
        },
        defines: BTreeMap::from([("SCALE".to_owned(), "2".to_owned())]),
        include: vec!["include".to_owned()],
        _dir: dir,
    }
}

/// A key of its own for each fixture and target, as the build gives each job.
fn fixture_key(fixture: &Fixture, arch: &str) -> String {
    sha256_hex(format!("{} {arch}", fixture.tree.root.display()).as_bytes())
}

/// A request for `scale_rows` in `fixture`'s source, with its include dir when `include`.
fn request<'a>(
    fixture: &'a Fixture,
    key: &'a str,
    include: bool,
    arch: &str,
    name_expressions: &'a [String],
) -> CompileRequest<'a> {
    CompileRequest {
        kernel: "scale_rows",
        job: CompileJob {
            computed: Default::default(),
            key,
            tree: &fixture.tree,
            source: "scale.cu",
            include_dirs: if include { &fixture.include } else { &[] },
            defines: &fixture.defines,
            flags: &[],
            cxx_std: "c++17",
            arch: arch.parse().unwrap(),
            name_expressions,
            preamble: "",
        },
    }
}

/// The real compiler of `build`'s installed toolchain; `None` (the test passes vacuously)
/// where the toolchain is not installed.
fn installed_compiler(build: CudaBuild) -> Option<Box<dyn Compiler>> {
    let toolchain = toolchain_for_tests(build)?;
    Some(compiler_for(&toolchain).unwrap())
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
    let key = fixture_key(&fixture, "");
    let expressions = ["scale_rows<float>".to_owned()];
    for arch in ["sm_90a", "sm_100a"] {
        let started = Instant::now();
        let output = compiler
            .compile(&request(&fixture, &key, true, arch, &expressions))
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
    let key = fixture_key(&fixture, "");
    let expressions = [
        "scale_rows<float>".to_owned(),
        "scale_rows<double>".to_owned(),
    ];
    let output = compiler
        .compile(&request(&fixture, &key, true, "sm_90a", &expressions))
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
    let (error, log) = failure_log(compiler.compile(&request(
        &fixture,
        &fixture_key(&fixture, ""),
        false,
        "sm_90a",
        &[],
    )));
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
        .compile(&request(
            &fixture,
            &fixture_key(&fixture, ""),
            false,
            "sm_50",
            &[],
        ))
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
fn nvrtc_rejected_option_names_the_kernel_and_compiler() {
    let Some(compiler) = installed_compiler(CUDA_12_9) else {
        return;
    };
    let fixture = fixture(KERNEL);
    let key = fixture_key(&fixture, "");
    let flags = ["--no-such-option".to_owned()];
    let mut request = request(&fixture, &key, true, "sm_90a", &[]);
    request.job.flags = &flags;
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
fn host_code_builds_for_cu129_through_nvcc_and_ptxas() {
    let Some((cu129, cu130)) = both_toolchains() else {
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
            .compile(&request(
                &fixture,
                &fixture_key(&fixture, ""),
                false,
                arch,
                &expressions,
            ))
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
    let (_, log) = failure_log(compiler.compile(&request(
        &fixture,
        &fixture_key(&fixture, ""),
        false,
        "sm_90a",
        &[],
    )));
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
    let key = fixture_key(&fixture, "");
    let expressions = [
        "scale_rows<float>".to_owned(),
        "scale_rows<float, 3>".to_owned(),
    ];
    let (_, log) =
        failure_log(compiler.compile(&request(&fixture, &key, true, "sm_90a", &expressions)));
    assert!(
        log.contains(
            "note: `kwheel-entries.cu` is the kernel's source followed by one line per name \
             expression of `entries`, taking its address (line 3: entry `scale_rows<float>`, \
             line 5: entry `scale_rows<float, 3>`)"
        ),
        "{log}"
    );
}

#[test]
fn an_error_in_the_source_gets_no_note_on_the_generated_file() {
    let Some(compiler) = installed_compiler(CUDA_13_0) else {
        return;
    };
    // nvcc's summary names `kwheel-entries.cu` ("1 error detected in the compilation of"),
    // but the error is in the kernel's own file: the entries are not at fault.
    let fixture = fixture(&KERNEL.replace("* factor", "* undefined_factor"));
    let key = fixture_key(&fixture, "");
    let expressions = ["scale_rows<float>".to_owned()];
    let (_, log) =
        failure_log(compiler.compile(&request(&fixture, &key, true, "sm_90a", &expressions)));
    assert!(log.contains("\"undefined_factor\" is undefined"), "{log}");
    assert!(log.contains("kwheel-entries.cu"), "{log}");
    assert!(!log.contains("note: `kwheel-entries.cu`"), "{log}");
}

/// The registers each kernel of `cubin` uses, by symbol: the `EIATTR_REGCOUNT` (0x2f) records
/// of its `.nv.info` section, each (symbol index, count).
fn register_counts(cubin: &[u8]) -> BTreeMap<String, u32> {
    let u16_at = |at: usize| u16::from_le_bytes(cubin[at..at + 2].try_into().unwrap()) as usize;
    let u32_at = |at: usize| u32::from_le_bytes(cubin[at..at + 4].try_into().unwrap()) as usize;
    let u64_at = |at: usize| u64::from_le_bytes(cubin[at..at + 8].try_into().unwrap()) as usize;
    let (shoff, shentsize, shnum, shstrndx) =
        (u64_at(0x28), u16_at(0x3a), u16_at(0x3c), u16_at(0x3e));
    // (name offset, type, offset, size, link) of section `n`.
    let section = |n: usize| {
        let at = shoff + n * shentsize;
        (
            u32_at(at),
            u32_at(at + 4),
            u64_at(at + 0x18),
            u64_at(at + 0x20),
            u32_at(at + 0x28),
        )
    };
    let text = |at: usize| {
        let end = cubin[at..].iter().position(|&b| b == 0).unwrap();
        String::from_utf8_lossy(&cubin[at..at + end]).into_owned()
    };
    let names = section(shstrndx).2;
    let sections: Vec<_> = (0..shnum).map(section).collect();
    let (_, _, symtab, _, strtab) = *sections.iter().find(|s| s.1 == 2).expect(".symtab");
    let strings = sections[strtab].2;
    let symbol = |index: usize| text(strings + u32_at(symtab + index * 24));
    let (_, _, info, size, _) = *sections
        .iter()
        .find(|s| text(names + s.0) == ".nv.info")
        .expect(".nv.info");
    let mut counts = BTreeMap::new();
    let mut at = info;
    while at < info + size {
        let (format, attribute) = (cubin[at], cubin[at + 1]);
        if format != 4 {
            at += 4;
            continue;
        }
        let length = u16_at(at + 2);
        if attribute == 0x2f {
            counts.insert(symbol(u32_at(at + 4)), u32_at(at + 8) as u32);
        }
        at += 4 + length;
    }
    counts
}

/// Enough live values that ptxas wants far more than 32 registers unless it is capped.
const REGISTER_HUNGRY: &str = r#"
extern "C" __global__ void hungry(float* out, const float* in, int n) {
    float v[48];
#pragma unroll
    for (int j = 0; j < 48; ++j) v[j] = in[threadIdx.x + j * n];
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < 48; ++j) acc += v[j] * v[(j * 7) % 48];
    out[threadIdx.x] = acc;
}
"#;

/// Both CUDA builds' compilers, the way a kernel with host code (or `nvcc-flags`) builds:
/// cu130's nvcc and cu129's nvcc+ptxas route.
fn nvcc_and_route() -> Option<(Box<dyn Compiler>, NvccPtxas)> {
    let (cu129, cu130) = both_toolchains()?;
    Some((
        compiler_for(&cu130).unwrap(),
        NvccPtxas::new(&cu129, &cu130).unwrap(),
    ))
}

#[test]
fn maxrregcount_reaches_ptxas_on_the_cu129_route_as_on_cu130() {
    let Some((nvcc, route)) = nvcc_and_route() else {
        return;
    };
    let fixture = fixture(REGISTER_HUNGRY);
    let key = fixture_key(&fixture, "");
    let registers = |compiler: &dyn Compiler, flags: &[String]| {
        let mut request = request(&fixture, &key, false, "sm_90a", &[]);
        request.kernel = "hungry";
        request.job.flags = flags;
        let output = compiler
            .compile(&request)
            .unwrap_or_else(|error| panic!("{}", error_chain(&error)));
        register_counts(&output.cubin)["hungry"]
    };
    let capped = ["-maxrregcount=32".to_owned()];
    let (cu130_free, cu129_free) = (registers(&*nvcc, &[]), registers(&route, &[]));
    let (cu130, cu129) = (registers(&*nvcc, &capped), registers(&route, &capped));
    eprintln!("registers: cu130 {cu130_free} → {cu130}, cu129 {cu129_free} → {cu129}");
    // Uncapped, the kernel wants more; capped, both builds' cubins obey the cap alike.
    assert!(
        cu130_free > 32 && cu129_free > 32,
        "{cu130_free} {cu129_free}"
    );
    assert!(cu130 <= 32 && cu129 <= 32, "cu130 {cu130}, cu129 {cu129}");
    assert_eq!(cu130, cu129);
}

#[test]
fn a_flag_the_cu129_route_cannot_honour_is_refused_by_name() {
    let Some((_, route)) = nvcc_and_route() else {
        return;
    };
    let fixture = fixture(REGISTER_HUNGRY);
    let key = fixture_key(&fixture, "");
    let flags = ["-lineinfo".to_owned(), "-rdc=true".to_owned()];
    let mut request = request(&fixture, &key, false, "sm_90a", &[]);
    request.kernel = "hungry";
    request.job.flags = &flags;
    let error = route.compile(&request).unwrap_err();
    assert!(matches!(error, CompileError::Unhonoured { .. }), "{error}");
    let message = error.to_string();
    assert!(
        message.starts_with(
            "cannot compile `hungry` for sm_90a (cu129, nvcc+ptxas 13.0.88 + ptxas 12.9.86): \
             `-rdc=true` asks for relocatable or link-time device code"
        ),
        "{message}"
    );
}

/// The nvcc flags real libraries build their kernels with (less `-arch`/`-gencode`, include
/// dirs and output files, which a manifest says in its own keys), and the options nvcc 13.0
/// gives its own ptxas for them (`nvcc -dryrun -cubin`), which the cu129 route must give the
/// 12.9 ptxas.
const REAL_FLAG_SETS: &[(&str, &[&str], &[&str])] = &[
    (
        // `kernels/common.mk` and the kernels' Makefiles, for Hopper.
        "ThunderKittens",
        &[
            "-DNDEBUG",
            "-lineinfo",
            "--expt-extended-lambda",
            "--expt-relaxed-constexpr",
            "-Xcompiler=-fPIE",
            "-Xcompiler=-Wno-psabi",
            "-Xcompiler=-fno-strict-aliasing",
            "-forward-unknown-to-host-compiler",
            "-ftemplate-backtrace-limit=0",
            "-std=c++20",
            "-O3",
            "--use_fast_math",
            "-Xnvlink=--verbose",
            "-Xptxas=--verbose",
            "-Xptxas=--warn-on-spills",
            "-DKITTENS_HOPPER",
            "-D__CUDA_NO_HALF_OPERATORS__",
            "-D__CUDA_NO_HALF_CONVERSIONS__",
            "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
            "-D__CUDA_NO_HALF2_OPERATORS__",
            "-diag-suppress",
            "3189",
            "-lrt",
            "-lpthread",
            "-ldl",
            "-lcuda",
            "-lcudadevrt",
            "-lcudart_static",
            "-shared",
            "-fPIC",
        ],
        &["--generate-line-info", "--verbose", "--warn-on-spills"],
    ),
    (
        // CMakeLists.txt (RelWithDebInfo) with the flags torch's CMake config adds.
        "vLLM",
        &[
            "-DTORCH_EXTENSION_NAME=_C",
            "-DUSE_C10D_GLOO",
            "-DUSE_C10D_NCCL",
            "-DUSE_DISTRIBUTED",
            "-D_C_EXPORTS",
            "-Xcudafe",
            "--diag_suppress=cc_clobber_ignored,--diag_suppress=field_without_dll_interface,\
             --diag_suppress=base_class_has_different_dll_interface,\
             --diag_suppress=dll_interface_conflict_none_assumed,\
             --diag_suppress=dll_interface_conflict_dllexport_assumed,\
             --diag_suppress=bad_friend_decl",
            "--expt-relaxed-constexpr",
            "--expt-extended-lambda",
            "-O2",
            "-g",
            "-DNDEBUG",
            "-std=c++17",
            "-Xcompiler=-fPIC",
            "--threads=1",
            "-D_GLIBCXX_USE_CXX11_ABI=1",
            "-DENABLE_FP8",
            "-DENABLE_SCALED_MM_SM90=1",
            "-static-global-template-stub=false",
            "-D__CUDA_NO_HALF_OPERATORS__",
            "-D__CUDA_NO_HALF_CONVERSIONS__",
            "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
            "-D__CUDA_NO_HALF2_OPERATORS__",
        ],
        &[],
    ),
    (
        // flashinfer/jit (`gen_jit_spec` with FLASHINFER_JIT_VERBOSE=1, `build_cuda_cflags`).
        "FlashInfer",
        &[
            "-DPy_LIMITED_API=0x03090000",
            "-D_GLIBCXX_USE_CXX11_ABI=1",
            "--compiler-options=-fPIC",
            "--expt-relaxed-constexpr",
            "-static-global-template-stub=false",
            "-DFLASHINFER_ENABLE_FP8_E8M0",
            "-DFLASHINFER_ENABLE_FP4_E2M1",
            "-O3",
            "-std=c++17",
            "--threads=4",
            "-use_fast_math",
            "-DFLASHINFER_ENABLE_F16",
            "-DFLASHINFER_ENABLE_BF16",
            "-DFLASHINFER_ENABLE_FP8_E4M3",
            "-DFLASHINFER_ENABLE_FP8_E5M2",
            "-g",
            "-lineinfo",
            "--ptxas-options=-v",
            "--ptxas-options=--verbose,--register-usage-level=10,--warn-on-local-memory-usage",
            "-DCUTLASS_DEBUG_TRACE_LEVEL=2",
        ],
        &[
            "--generate-line-info",
            "-v",
            "--verbose",
            "--register-usage-level=10",
            "--warn-on-local-memory-usage",
        ],
    ),
    (
        // CMakeLists.txt's CUTLASS_CUDA_NVCC_FLAGS on Linux (RelWithDebInfo), for an example.
        "CUTLASS",
        &[
            "-DCUTLASS_ENABLE_TENSOR_CORE_MMA=1",
            "-DCUTLASS_VERSIONS_GENERATED",
            "--expt-relaxed-constexpr",
            "-DCUTE_USE_PACKED_TUPLE=1",
            "-DCUTLASS_TEST_LEVEL=0",
            "-DCUTLASS_TEST_ENABLE_CACHED_RESULTS=1",
            "-DCUTLASS_CONV_UNIT_TEST_RIGOROUS_SIZE_ENABLED=1",
            "-DCUTLASS_DEBUG_TRACE_LEVEL=0",
            "-Xcompiler=-Wconversion",
            "-Xcompiler=-fno-strict-aliasing",
            "-lineinfo",
            "-O2",
            "-g",
            "-DNDEBUG",
            "-std=c++17",
            "-Xcompiler=-fPIE",
        ],
        &["--generate-line-info"],
    ),
];

fn owned(flags: &[&str]) -> Vec<String> {
    flags.iter().map(|flag| (*flag).to_owned()).collect()
}

#[test]
fn real_libraries_nvcc_flags_pass_the_cu129_route() {
    for (library, flags, expected) in REAL_FLAG_SETS {
        let options = prebuilt::compile::ptxas::ptxas_options(&owned(flags))
            .unwrap_or_else(|refused| panic!("{library}: {refused}"));
        assert_eq!(options, *expected, "{library}");
    }
}

/// The options `nvcc -dryrun -cubin` (CUDA 13.0) gives its ptxas for `flags`, sorted, without
/// the target, the machine and the files, which the route sets itself; or nvcc's error.
fn nvcc_ptxas_options(nvcc: &Path, dir: &Path, flags: &[&str]) -> Result<Vec<String>, String> {
    let output = std::process::Command::new(nvcc)
        .current_dir(dir)
        .args(["-dryrun", "-cubin", "-arch=sm_90a"])
        .args(flags)
        .args(["k.cu", "-o", "k.cubin"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stderr).into_owned();
    if !output.status.success() || text.contains("fatal") {
        return Err(text);
    }
    let line = text
        .lines()
        .find_map(|line| line.strip_prefix("#$ ptxas "))
        .ok_or_else(|| text.clone())?;
    let mut words = line.split_whitespace();
    let mut options = Vec::new();
    while let Some(word) = words.next() {
        match word {
            "-o" | ">" => {
                words.next();
            }
            "-arch=sm_90a" | "-m64" => {}
            _ if word.starts_with('"') || word.starts_with("2>") => {}
            _ => options.push(word.to_owned()),
        }
    }
    options.sort();
    Ok(options)
}

#[test]
fn real_libraries_nvcc_flags_give_ptxas_on_the_cu129_route_what_nvcc_gives_it_on_cu130() {
    let Some((_, cu130)) = both_toolchains() else {
        return;
    };
    let nvcc = cu130.nvcc.as_ref().expect("the cu130 toolchain has nvcc");
    let dir = tempfile::tempdir().unwrap();
    fs::write(
        dir.path().join("k.cu"),
        "__global__ void k(float* x) { x[0] = 1; }\n",
    )
    .unwrap();
    for (library, flags, _) in REAL_FLAG_SETS {
        // nvcc takes the flags as they are (the cu130 build) ...
        let from_nvcc = nvcc_ptxas_options(nvcc, dir.path(), flags)
            .unwrap_or_else(|log| panic!("{library}: nvcc refuses its flags:\n{log}"));
        // ... and the route gives the 12.9 ptxas the same options (the cu129 build).
        let mut from_route = prebuilt::compile::ptxas::ptxas_options(&owned(flags)).unwrap();
        from_route.sort();
        assert_eq!(from_route, from_nvcc, "{library}");
    }
}

/// A ThunderKittens-style kernel: a C++ kernel in a namespace, an extended lambda and a
/// `constexpr` function called from device code, which need the flags it builds with.
const THUNDERKITTENS_LIKE: &str = r#"
namespace kittens {
constexpr int tile() { return 16; }
template <typename F>
__device__ float apply(F f, float x) { return f(x); }
}
__global__ void attend_ker(float* out, const float* in, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    auto scale = [=] __device__ (float v) { return v * kittens::tile() * __expf(v); };
    if (i < n) out[i] = kittens::apply(scale, in[i]);
}
void launch(float* out, const float* in, int n) {
    auto host = [=] __host__ __device__ (int v) { return v + 1; };
    attend_ker<<<host(n) / 128, 128>>>(out, in, n);
}
"#;

#[test]
fn thunderkittens_flags_build_through_the_cu129_route() {
    let Some((_, route)) = nvcc_and_route() else {
        return;
    };
    let (_, flags, _) = REAL_FLAG_SETS[0];
    let flags = owned(flags);
    let fixture = fixture(THUNDERKITTENS_LIKE);
    let key = fixture_key(&fixture, "thunderkittens");
    let mut request = request(&fixture, &key, false, "sm_90a", &[]);
    request.kernel = "attend_ker";
    request.job.flags = &flags;
    request.job.cxx_std = "c++20";
    let output = route
        .compile(&request)
        .unwrap_or_else(|error| panic!("{}", error_chain(&error)));
    let info = prebuilt::cubin::inspect_cubin(&output.cubin).unwrap();
    assert!(
        info.function("_Z10attend_kerPfPKfi").is_some(),
        "{:?}",
        info.symbols()
    );
    // `-Xptxas=--verbose` reached the 12.9 ptxas, which reports what it built.
    assert!(
        output.log.contains(
            "ptxas info    : Compiling entry function '_Z10attend_kerPfPKfi' for 'sm_90a'"
        ),
        "{}",
        output.log
    );
}

/// A library whose cubins carry everything that could name where it was built: `__FILE__`
/// through `assert`, internal-linkage kernels and device functions (whose symbols nvcc
/// prefixes with a hash of the compiled file's path), and a header found relative to the
/// source.
const PLACE_SENSITIVE: [(&str, &str); 2] = [
    (
        "ops/k.cu",
        r#"#include "../include/util.cuh"
#ifndef __CUDACC_RTC__
#include <cassert>
#endif
namespace {
__device__ __noinline__ float twice(float x) { return 2.0f * x; }
__global__ void hidden(float* out) { out[0] = twice(1.0f); }
}
static __global__ void hidden_static(float* out) { out[1] = thrice(2.0f); }
extern "C" __global__ void k(float* out, const float* in, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    assert(n > 0);
    if (i < n) out[i] = twice(in[i]) + thrice(in[i]);
}
#ifndef __CUDACC_RTC__
void launch(float* out) { hidden<<<1, 1>>>(out); hidden_static<<<1, 1>>>(out); }
#endif
"#,
    ),
    (
        "include/util.cuh",
        "#pragma once\nstatic __device__ __noinline__ float thrice(float x) {\n    \
         assert(x == x);\n    return 3.0f * x;\n}\n",
    ),
];

/// A copy of [`PLACE_SENSITIVE`] at `root`.
fn place_sensitive_library(root: &Path) -> SourceTree {
    for (path, text) in PLACE_SENSITIVE {
        fs::create_dir_all(root.join(path).parent().unwrap()).unwrap();
        fs::write(root.join(path), text).unwrap();
    }
    SourceTree {
        root: root.to_path_buf(),
        outside: Vec::new(),
    }
}

/// Every compiler of the two CUDA builds: cu130's nvcc, cu129's nvcc+ptxas route, cu129's
/// NVRTC.
fn every_compiler(cu129: &Toolchain, cu130: &Toolchain) -> Vec<Box<dyn Compiler>> {
    vec![
        compiler_for(cu130).unwrap(),
        Box::new(NvccPtxas::new(cu129, cu130).unwrap()),
        compiler_for(cu129).unwrap(),
    ]
}

/// The cubin of [`PLACE_SENSITIVE`]'s kernel in `tree`, for sm_90a with `flags`.
fn compile_place_sensitive(
    compiler: &dyn Compiler,
    key: &str,
    tree: &SourceTree,
    flags: &[String],
) -> Vec<u8> {
    let request = CompileRequest {
        kernel: "k",
        job: CompileJob {
            computed: Default::default(),
            key,
            tree,
            source: "ops/k.cu",
            include_dirs: &["include".to_owned()],
            defines: &BTreeMap::new(),
            flags,
            cxx_std: "c++17",
            arch: "sm_90a".parse().unwrap(),
            name_expressions: &[],
            preamble: "",
        },
    };
    compiler
        .compile(&request)
        .unwrap_or_else(|error| panic!("{}", error_chain(&error)))
        .cubin
}

/// `haystack` contains `needle`.
fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle)
}

#[test]
fn cubins_are_the_same_from_any_checkout_and_name_none() {
    let Some((cu129, cu130)) = both_toolchains() else {
        return;
    };
    let compilers = every_compiler(&cu129, &cu130);
    let dir = tempfile::tempdir().unwrap();
    let first = dir.path().join("checkout");
    let second = dir.path().join("elsewhere/deeper/checkout-2");
    let trees = [
        place_sensitive_library(&first),
        place_sensitive_library(&second),
    ];
    for compiler in &compilers {
        for flags in [Vec::new(), vec!["-lineinfo".to_owned()]] {
            let key = sha256_hex(format!("{} {flags:?}", compiler.id()).as_bytes());
            let build =
                |tree: &SourceTree| compile_place_sensitive(&**compiler, &key, tree, &flags);
            let what = format!("{} {flags:?}", compiler.id());
            // Cold twice from one checkout, then from another at another path.
            let cubin = build(&trees[0]);
            assert_eq!(cubin, build(&trees[0]), "{what}: a second build differs");
            assert_eq!(cubin, build(&trees[1]), "{what}: another checkout differs");
            for place in [dir.path(), &cu130.root, &cu129.root] {
                let place = place.display().to_string();
                assert!(!contains(&cubin, place.as_bytes()), "{what} names {place}");
            }
            // `assert`'s `__FILE__` is the library's own stable path.
            assert!(contains(&cubin, b"src/ops/k.cu"), "{what}");
            let symbols = prebuilt::cubin::inspect_cubin(&cubin).unwrap().symbols();
            assert!(
                symbols.iter().any(|symbol| symbol.contains("_GLOBAL__N_")),
                "{what}: no internal-linkage kernel among {symbols:?}"
            );
        }
    }
}

#[test]
fn lineinfo_cubins_do_not_carry_the_sources_modification_times() {
    // nvcc and NVRTC write each file's mtime into `-lineinfo` line tables, so a checkout, a
    // bundle's shipped sources and a JIT cache gave three byte strings for one key.
    let Some((cu129, cu130)) = both_toolchains() else {
        return;
    };
    let compilers = every_compiler(&cu129, &cu130);
    let dir = tempfile::tempdir().unwrap();
    let (old, new) = (dir.path().join("old"), dir.path().join("new"));
    let trees = [place_sensitive_library(&old), place_sensitive_library(&new)];
    testkit::tree::stamp(&old, 978_307_200); // 2001-01-01
    testkit::tree::stamp(&new, 1_796_149_005); // 2026-12-01
    let flags = ["-lineinfo".to_owned()];
    for compiler in &compilers {
        let key = sha256_hex(format!("{} mtimes", compiler.id()).as_bytes());
        let build = |tree: &SourceTree| compile_place_sensitive(&**compiler, &key, tree, &flags);
        let what = compiler.id();
        let cubin = build(&trees[0]);
        // The line table lists the library's two files (and any toolkit header), every time 0.
        let times = prebuilt::compile::lines::file_times(&cubin);
        assert!(times.len() >= 2, "{what}: {times:?}");
        assert!(times.iter().all(|&time| time == 0), "{what}: {times:?}");
        assert_eq!(cubin, build(&trees[1]), "{what}: other mtimes, other bytes");
    }
}

/// What a [`compile::ToolRunner`] is asked to run, recorded; it answers as nvcc would by
/// writing a real cubin (a fixture of nvcc 13.0.88's) where nvcc was told to.
#[derive(Default)]
struct Recorder {
    runs: std::sync::Mutex<Vec<(String, Vec<String>, bool)>>,
}

impl compile::ToolRunner for Recorder {
    fn run(&self, run: &compile::ToolRun<'_>) -> std::io::Result<std::process::Output> {
        use std::os::unix::process::ExitStatusExt as _;
        let arguments: Vec<String> = run
            .arguments
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        // The source is in the work folder, as the tool will read it.
        let source_there = run.work.join("src/scale.cu").is_file();
        self.runs
            .lock()
            .unwrap()
            .push((run.name.to_owned(), arguments.clone(), source_there));
        let output = arguments
            .iter()
            .position(|a| a == "-o")
            .map(|at| run.work.join(&arguments[at + 1]))
            .unwrap();
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../prebuilt/tests/fixtures/cubin/nvcc130_sm_90a.cubin");
        fs::copy(fixture, output)?;
        Ok(std::process::Output {
            status: std::process::ExitStatus::from_raw(0),
            stdout: Vec::new(),
            stderr: b"ptxas info : compiled\n".to_vec(),
        })
    }
}

/// The seam between what a compile runs and where: with a runner of its own, nvcc is not
/// started here; the runner gets the one nvcc command line a local compile runs, in the key's
/// work folder with the sources in it, and its output is what the compile returns.
#[test]
fn a_runner_runs_the_compile_command_and_its_output_is_the_cubin() {
    let toolchain = Toolchain {
        nvcc: Some(PathBuf::from("/no/such/toolkit/bin/nvcc")),
        host_compiler: Some("gcc (Debian 12.2.0-14+deb12u1) 12.2.0".to_owned()),
        ..described_toolchain(CUDA_13_0, CompilerKind::Nvcc, "13.0.88")
    };
    let recorder = std::sync::Arc::new(Recorder::default());
    let nvcc = Nvcc::new(&toolchain).unwrap().with_runner(recorder.clone());
    let fixture = fixture(KERNEL);
    let key = fixture_key(&fixture, "sm_90a");
    let output = nvcc
        .compile(&request(&fixture, &key, true, "sm_90a", &[]))
        .unwrap();
    let expected = fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../prebuilt/tests/fixtures/cubin/nvcc130_sm_90a.cubin"),
    )
    .unwrap();
    assert_eq!(output.cubin.len(), expected.len());
    prebuilt::cubin::validate_cubin(&output.cubin, "sm_90a".parse().unwrap(), &["kw_axpy"])
        .unwrap();
    let runs = recorder.runs.lock().unwrap();
    assert_eq!(runs.len(), 1, "{runs:?}");
    let (name, arguments, source_there) = &runs[0];
    assert_eq!(name, "nvcc");
    assert!(source_there);
    let line = arguments.join(" ");
    for piece in [
        "-cubin",
        "-arch=sm_90a",
        "-std=c++17",
        "-Isrc/include",
        "-DSCALE=2",
        "-o kernel.cubin",
        "-Xcicc --orig_src_path_name,",
        "-frandom-seed=kwheel-",
    ] {
        assert!(
            line.contains(piece) || arguments.iter().any(|a| a.starts_with(piece)),
            "{piece} not in {line}"
        );
    }
    assert_eq!(arguments.last().unwrap(), "src/scale.cu", "{line}");
}
