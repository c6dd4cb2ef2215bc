//! Real libraries, fetched from the package registry by `ci/setup-thirdparty` (nothing of them
//! lives in this repository), built through the product as their authors write them, and the
//! include graph's key checked against what nvcc reads (`nvcc -M`). docs/real-libraries.md has
//! the table of what builds. Each test skips with the reason when the third-party cache or the
//! toolchains are missing, and fails then under `KWHEEL_REQUIRE_TOOLCHAINS=1` (CI, where
//! `ci/setup-tests` runs `ci/setup-thirdparty`).

use super::*;

/// The folder `ci/setup-thirdparty` fetched `name` into, or `None` (printing why).
fn thirdparty_dir(test: &str, name: &str) -> Option<PathBuf> {
    // `thirdparty` names the `include/` inside; these libraries keep more than headers, and
    // an sdist's sources (causal-conv1d's `csrc/`) have no `include/` at all.
    let dir = thirdparty_root().join(name);
    if dir.join(".kwheel-stamp").is_file() {
        return Some(dir);
    }
    thirdparty(test, name).map(|include| include.parent().unwrap().to_owned())
}

/// Every file `nvcc -M` lists for `source` that is neither the toolkit's nor the host
/// compiler's own (libstdc++, gcc's internal headers, glibc): what the key must hash.
fn library_files_nvcc_reads(
    nvcc: &Path,
    include_dirs: &[PathBuf],
    source: &Path,
) -> BTreeSet<PathBuf> {
    let toolkit_root = nvcc
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .canonicalize()
        .unwrap();
    let host = bundler::toolchain::host_include_dirs();
    let mut command = std::process::Command::new(nvcc);
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .args(["-M", "-arch=sm_90a", "-std=c++17"]);
    for dir in include_dirs {
        command.arg(format!("-I{}", dir.display()));
    }
    nvcc_dependencies(command.arg(source))
        .into_iter()
        .filter(|path| !path.starts_with(&toolkit_root))
        .filter(|path| !host.compiler.iter().any(|dir| path.starts_with(dir)))
        .collect()
}

/// The absolute files a kernel's key hashes (its graph), canonical.
fn hashed_files(planned: &bundler::pipeline::PlannedKernel) -> BTreeSet<PathBuf> {
    let graph = planned.graph.as_ref().unwrap();
    graph
        .files()
        .keys()
        .map(|stable| graph.absolute_path(stable).unwrap().canonicalize().unwrap())
        .collect()
}

/// A header directory under `/usr/local/include`, removed when dropped.
struct HostHeaders(PathBuf);

impl Drop for HostHeaders {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn headers_from_include_dirs_quoted_paths_and_a_host_dir_are_all_hashed_as_nvcc_reads_them() {
    let Some(toolchains) = toolchains() else {
        return;
    };
    let host_dir = Path::new("/usr/local/include");
    let host = bundler::toolchain::host_include_dirs();
    if !host.library.iter().any(|dir| dir == host_dir) {
        skipped!("skipped: the host compiler does not search /usr/local/include");
        return;
    }
    // A library installed where `make install` puts it: a unique folder, removed after.
    let name = format!("kwheel-host-test-{}", std::process::id());
    let installed = HostHeaders(host_dir.join(&name));
    if std::fs::create_dir_all(installed.0.join("detail")).is_err() {
        skipped!("skipped: /usr/local/include is not writable here");
        return;
    }
    std::fs::write(
        installed.0.join("api.h"),
        "#pragma once\n#include \"detail/impl.h\"\n",
    )
    .unwrap();
    std::fs::write(
        installed.0.join("detail/impl.h"),
        "#pragma once\n#define HOST_SCALE 3\n",
    )
    .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let vendor = tempfile::tempdir().unwrap();
    std::fs::write(
        vendor.path().join("vendored.cuh"),
        "#pragma once\n#include <cstdint>\n",
    )
    .unwrap();
    let manifest = write_library(
        dir.path(),
        &format!(
            "[library]\npackage = \"mixed\"\narchs = [\"sm_90a\"]\ncuda-builds = [\"cu130\"]\n\
             torch = \"2.13.*\"\ninclude-dirs = [\"{}\"]\n[kernels.k]\nsources = [\"ops/k.cu\"]\n\
             entries = [\"k\"]\n",
            vendor.path().display()
        ),
        &[
            (
                "ops/k.cu",
                &format!(
                    "#include \"../common/local.cuh\"\n#include <vendored.cuh>\n\
                     #include <{name}/api.h>\n#include <cuda_fp16.h>\n\
                     extern \"C\" __global__ void k(float* x) {{ x[0] *= HOST_SCALE * LOCAL; }}\n"
                ),
            ),
            ("common/local.cuh", "#pragma once\n#define LOCAL 2\n"),
        ],
    );
    let cu130 = of_build(toolchains, "cu130");
    let manifest_file = bundler::Manifest::load(&manifest).unwrap();
    let planned = bundler::pipeline::plan_kernel(
        &manifest_file,
        "k",
        &manifest_file.kernels["k"],
        &cu130[0].include_dirs,
    )
    .unwrap();
    let nvcc = cu130_nvcc();
    let nvcc_reads = library_files_nvcc_reads(
        &nvcc,
        &[vendor.path().to_owned()],
        &dir.path().join("ops/k.cu"),
    );
    assert!(
        nvcc_reads.contains(&installed.0.join("detail/impl.h")),
        "{nvcc_reads:?}"
    );
    assert_eq!(hashed_files(&planned), nvcc_reads);
    // The host dir's files are named after it as the kernel's include dir [1], not by path.
    let names: Vec<&String> = planned.inputs.files.keys().collect();
    assert_eq!(
        names,
        [
            "[0]/vendored.cuh".to_owned(),
            format!("[1]/{name}/api.h"),
            format!("[1]/{name}/detail/impl.h"),
            "common/local.cuh".to_owned(),
            "ops/k.cu".to_owned(),
        ]
        .iter()
        .collect::<Vec<_>>()
    );
    assert_eq!(
        planned.recipe.as_ref().unwrap().include_dirs,
        ["[0]", "[1]"]
    );

    // It builds, and the shipped sources carry the host headers for the JIT.
    let opts = options_in(dir.path(), &manifest, cu130.clone());
    let summary = bundle_kernels(&opts).unwrap_or_else(|error| panic!("{}", anyhow_like(&error)));
    assert_eq!(summary.compiled().len(), 1, "{:?}", summary.failed());
    assert!(summary
        .out
        .join("sources/[1]")
        .join(&name)
        .join("detail/impl.h")
        .is_file());
    // An edit of the installed header is a new key.
    std::fs::write(
        installed.0.join("detail/impl.h"),
        "#pragma once\n#define HOST_SCALE 4\n",
    )
    .unwrap();
    let again = bundle_kernels(&opts).unwrap();
    assert_eq!(again.compiled().len(), 1, "the edit is a new key");
}

#[test]
fn cutlass_example_48_builds_for_hopper_and_its_blackwell_build_is_a_recorded_stub() {
    let test = "cutlass_example_48_builds_for_hopper_and_its_blackwell_build_is_a_recorded_stub";
    let Some(toolchains) = toolchains() else {
        return;
    };
    let Some(cutlass) = thirdparty_dir(test, "nvidia-cutlass-4.2.0.0") else {
        return;
    };
    let cu130 = of_build(toolchains, "cu130");
    // CUTLASS's own CMake options for its examples: the include dirs and
    // `--expt-relaxed-constexpr`. The example's `.cu` is taken from where it lies.
    let example = "examples/48_hopper_warp_specialized_gemm";
    let dir = tempfile::tempdir().unwrap();
    let manifest = write_library(
        dir.path(),
        &format!(
            "[library]\npackage = \"cutlass-examples\"\narchs = [\"sm_90a\", \"sm_100a\"]\n\
             cuda-builds = [\"cu130\"]\ntorch = \"2.13.*\"\ncxx-std = \"c++17\"\n\
             include-dirs = [\"{c}/include\", \"{c}/tools/util/include\", \"{c}/examples/common\", \"{c}/{example}\"]\n\
             nvcc-flags = [\"--expt-relaxed-constexpr\"]\n\
             [kernels.hopper_gemm]\nsources = [\"gemm.cu\"]\n\
             entries = [\"cutlass::device_kernel<GemmKernel>\"]\n",
            c = cutlass.display()
        ),
        &[(
            "gemm.cu",
            "// CUTLASS example 48, unmodified, as this library's translation unit.\n\
             #include \"48_hopper_warp_specialized_gemm.cu\"\n",
        )],
    );
    let mut opts = options_in(dir.path(), &manifest, cu130);
    opts.require = false;
    let started = std::time::Instant::now();
    let summary = bundle_kernels(&opts).unwrap_or_else(|error| panic!("{}", anyhow_like(&error)));
    eprintln!("cutlass example 48: {:?}", started.elapsed());
    let index = Bundle::open(&summary.out).unwrap().index().clone();
    let record = &index.kernels["hopper_gemm"];
    let built: Vec<String> = record.variants.iter().map(|v| v.label()).collect();
    assert_eq!(built, ["cu130/sm_90a"], "{:?}", record.skipped);
    let skips: Vec<(String, prebuilt::index::SkipKind)> = record
        .skipped
        .iter()
        .map(|skip| (format!("{}/{}", skip.cuda, skip.arch), skip.kind))
        .collect();
    assert_eq!(skips.len(), 1, "{skips:?}");
    assert_eq!(skips[0].0, "cu130/sm_100a");
    assert_eq!(skips[0].1, prebuilt::index::SkipKind::Stub, "{skips:?}");
    // The hashed files are every library file nvcc reads.
    let manifest_file = bundler::Manifest::load(&manifest).unwrap();
    let toolkit = bundler::toolchain::discover("cu130".parse().unwrap()).unwrap();
    let planned = bundler::pipeline::plan_kernel(
        &manifest_file,
        "hopper_gemm",
        &manifest_file.kernels["hopper_gemm"],
        &toolkit.include_dirs,
    )
    .unwrap();
    let include_dirs = manifest_file.include_dirs_of(&manifest_file.kernels["hopper_gemm"]);
    let nvcc_reads = library_files_nvcc_reads(
        toolkit.nvcc.as_ref().unwrap(),
        &include_dirs,
        &dir.path().join("gemm.cu"),
    );
    assert!(nvcc_reads.len() > 300, "{}", nvcc_reads.len());
    // The scanner takes every `#include` whatever `#if` surrounds it, so it hashes more than
    // one compile reads; it must miss nothing.
    let hashed = hashed_files(&planned);
    let missed: Vec<&PathBuf> = nvcc_reads.difference(&hashed).collect();
    assert!(
        missed.is_empty(),
        "nvcc reads files the key does not hash: {missed:?}"
    );
    eprintln!(
        "cutlass example 48: nvcc reads {} library files, the key hashes {}",
        nvcc_reads.len(),
        hashed.len()
    );
}

#[test]
fn causal_conv1d_forward_builds_as_a_torch_extension() {
    let test = "causal_conv1d_forward_builds_as_a_torch_extension";
    let Some(toolchains) = toolchains() else {
        return;
    };
    let Some(causal_conv1d) = thirdparty_dir(test, "causal-conv1d-1.5.2") else {
        return;
    };
    let Some(pin) = torch_pin() else {
        return;
    };
    let cu130 = of_build(toolchains, "cu130");
    // The library's own folder, as its setup.py compiles it: no include dir or define copied.
    let dir = tempfile::tempdir().unwrap();
    testkit::copy_tree(&causal_conv1d.join("csrc"), &dir.path().join("csrc"), &[]);
    let manifest = write_library(
        dir.path(),
        &format!(
            "[library]\npackage = \"causal-conv1d-kernels\"\narchs = [\"sm_90a\"]\n\
             cuda-builds = [\"cu130\"]\ntorch = \"{pin}\"\ncxx-std = \"c++17\"\n\
             [kernels.causal_conv1d_fwd]\nsources = [\"csrc/causal_conv1d_fwd.cu\"]\ntorch = true\n\
             entries = [\"causal_conv1d_fwd_kernel<Causal_conv1d_fwd_kernel_traits<128, 4, true, at::Half, at::Half>>\"]\n"
        ),
        &[],
    );
    let opts = options_in(dir.path(), &manifest, cu130);
    let started = std::time::Instant::now();
    let summary = bundle_kernels(&opts).unwrap_or_else(|error| panic!("{}", anyhow_like(&error)));
    eprintln!("causal-conv1d forward: {:?}", started.elapsed());
    assert_eq!(summary.compiled().len(), 1, "{:?}", summary.failed());
    let index = Bundle::open(&summary.out).unwrap().index().clone();
    let record = &index.kernels["causal_conv1d_fwd"];
    assert_eq!(record.variants[0].label(), "cu130/sm_90a");
    assert!(record.variants[0].functions[0]
        .symbol
        .starts_with("_Z24causal_conv1d_fwd_kernelI31Causal_conv1d_fwd_kernel_traits"));
    // torch's headers are in the key; its copy of the CUDA runtime headers is the toolkit's.
    let files = &record.inputs.files;
    assert!(
        files.keys().any(|f| f.ends_with("c10/util/Half.h")),
        "{files:?}"
    );
    assert!(
        !files.keys().any(|f| f.ends_with("/cuda_runtime.h")),
        "{files:?}"
    );
}

#[test]
fn mamba_selective_scan_forward_builds_with_its_setup_py_flags_and_no_defines_table() {
    let test = "mamba_selective_scan_forward_builds_with_its_setup_py_flags_and_no_defines_table";
    let Some(toolchains) = toolchains() else {
        return;
    };
    let Some(mamba) = thirdparty_dir(test, "mamba-ssm-2.2.6.post3") else {
        return;
    };
    let Some(pin) = torch_pin() else {
        return;
    };
    let cu130 = of_build(toolchains, "cu130");
    let dir = tempfile::tempdir().unwrap();
    let scan = "csrc/selective_scan";
    testkit::copy_tree(&mamba.join(scan), &dir.path().join(scan), &[]);
    // setup.py's nvcc options for selective_scan_cuda, as it writes them (its `-std=c++17` is
    // `cxx-std`, its `--threads 4` a build-speed option); torch's defines come from torch.
    let manifest = write_library(
        dir.path(),
        &format!(
            "[library]\npackage = \"mamba-kernels\"\narchs = [\"sm_90a\"]\n\
             cuda-builds = [\"cu130\"]\ntorch = \"{pin}\"\ncxx-std = \"c++17\"\n\
             [kernels.selective_scan_fwd_fp16]\n\
             sources = [\"csrc/selective_scan/selective_scan_fwd_fp16.cu\"]\ntorch = true\n\
             include-dirs = [\"csrc/selective_scan\"]\n\
             nvcc-flags = [\"-O3\", \"-U__CUDA_NO_HALF_OPERATORS__\", \"-U__CUDA_NO_HALF_CONVERSIONS__\",\n\
               \"-U__CUDA_NO_BFLOAT16_OPERATORS__\", \"-U__CUDA_NO_BFLOAT16_CONVERSIONS__\",\n\
               \"-U__CUDA_NO_BFLOAT162_OPERATORS__\", \"-U__CUDA_NO_BFLOAT162_CONVERSIONS__\",\n\
               \"--expt-relaxed-constexpr\", \"--expt-extended-lambda\", \"--use_fast_math\",\n\
               \"--ptxas-options=-v\", \"-lineinfo\"]\n\
             entries = [\"selective_scan_fwd_kernel<Selective_Scan_fwd_kernel_traits<128, 16, 1, true, true, true, true, at::Half, float>>\"]\n"
        ),
        &[],
    );
    let opts = options_in(dir.path(), &manifest, cu130);
    let started = std::time::Instant::now();
    let summary = bundle_kernels(&opts).unwrap_or_else(|error| panic!("{}", anyhow_like(&error)));
    eprintln!("mamba selective scan forward: {:?}", started.elapsed());
    assert_eq!(summary.compiled().len(), 1, "{:?}", summary.failed());
    let bundle = Bundle::open(&summary.out).unwrap();
    let record = &bundle.index().kernels["selective_scan_fwd_fp16"];
    let variant = &record.variants[0];
    assert_eq!(variant.label(), "cu130/sm_90a");
    assert!(variant.functions[0]
        .symbol
        .starts_with("_Z25selective_scan_fwd_kernelI32Selective_Scan_fwd_kernel_traits"));
    assert!(record
        .inputs
        .files
        .keys()
        .any(|f| f.ends_with("c10/util/Half.h")));
    // `-lineinfo` line tables name the work folder, never this checkout, and no file time.
    let cubin = bundle
        .read_artifact("selective_scan_fwd_fp16", variant)
        .unwrap();
    let checkout = dir.path().display().to_string();
    assert!(!cubin
        .windows(checkout.len())
        .any(|window| window == checkout.as_bytes()));
    let times = prebuilt::compile::lines::file_times(&cubin);
    assert!(
        !times.is_empty() && times.iter().all(|&time| time == 0),
        "{times:?}"
    );
}

/// A DeepGEMM checkout (`KWHEEL_DEEPGEMM`): DeepGEMM publishes no sources to the package
/// registry, so CI cannot fetch it and the test skips without one.
fn deep_gemm_checkout() -> Option<PathBuf> {
    match std::env::var_os("KWHEEL_DEEPGEMM").map(PathBuf::from) {
        Some(dir) if dir.join("deep_gemm/include/deep_gemm").is_dir() => Some(dir),
        Some(dir) => panic!(
            "KWHEEL_DEEPGEMM={} holds no deep_gemm/include/deep_gemm",
            dir.display()
        ),
        None => {
            skipped!("skipped: KWHEEL_DEEPGEMM names no DeepGEMM checkout");
            None
        }
    }
}

#[test]
fn deep_gemm_sm100_gemm_for_hopper_is_a_recorded_stub_and_loads_nowhere_there() {
    let test = "deep_gemm_sm100_gemm_for_hopper_is_a_recorded_stub_and_loads_nowhere_there";
    let Some(deep_gemm) = deep_gemm_checkout() else {
        return;
    };
    let Some(toolchains) = toolchains() else {
        return;
    };
    let Some(cutlass) = thirdparty_dir(test, "nvidia-cutlass-4.2.0.0") else {
        return;
    };
    let cu130 = of_build(toolchains, "cu130");
    // DeepGEMM's JIT flags (csrc/jit/compiler.hpp) and the unit it generates for
    // sm100_bf16_gemm (csrc/jit_kernels/impls/sm100_bf16_gemm.hpp): the impl header, `using
    // namespace deep_gemm;`, one instantiation. The unit lives in this library, the header
    // in the checkout, found through the include dir.
    let dir = tempfile::tempdir().unwrap();
    let manifest = write_library(
        dir.path(),
        &format!(
            "[library]\npackage = \"deep-gemm-kernels\"\narchs = [\"sm_90a\", \"sm_100a\"]\n\
             cuda-builds = [\"cu130\"]\ntorch = \"2.13.*\"\ncxx-std = \"c++20\"\n\
             include-dirs = [\"{d}/deep_gemm/include\", \"{c}/include\"]\n\
             nvcc-flags = [\"--diag-suppress=39,161,174,177,186,940\", \
             \"--ptxas-options=--register-usage-level=10\", \"-O3\", \
             \"--expt-relaxed-constexpr\", \"--expt-extended-lambda\"]\n\
             preamble = \"using namespace deep_gemm;\"\n\
             [kernels.sm100_bf16_gemm]\nsources = [\"sm100_bf16_gemm.cu\"]\n\
             entries = [\"sm100_bf16_gemm_impl<cute::UMMA::Major::K, cute::UMMA::Major::K, 0, 4096, 4096, \
             128, 256, 64, 1, 128, 128, 128, 4, 128, 128, 1, false, 148, 128, false, false, \
             GemmType::Normal, false, cutlass::bfloat16_t, 100>\"]\n",
            d = deep_gemm.display(),
            c = cutlass.display()
        ),
        &[(
            "sm100_bf16_gemm.cu",
            "#include <deep_gemm/impls/sm100_bf16_gemm.cuh>\n",
        )],
    );
    let mut opts = options_in(dir.path(), &manifest, cu130);
    opts.require = false;
    let summary = bundle_kernels(&opts).unwrap_or_else(|error| panic!("{}", anyhow_like(&error)));
    let bundle = Bundle::open(&summary.out).unwrap();
    let record = &bundle.index().kernels["sm100_bf16_gemm"];
    let built: Vec<String> = record.variants.iter().map(|v| v.label()).collect();
    assert_eq!(built, ["cu130/sm_100a"], "{:?}", record.skipped);
    assert_eq!(record.skipped.len(), 1, "{:?}", record.skipped);
    let skip = &record.skipped[0];
    assert_eq!(skip.arch.to_string(), "sm_90a");
    assert!(
        skip.kind == prebuilt::index::SkipKind::Stub
            && skip.reason.contains("its sm_90a body is a stub"),
        "{}",
        skip.reason
    );
    // `dev coverage --fleet H100,B200`: an H100 loads no cubin of it (the JIT's turn, which
    // refuses the stub too), a B200 the sm_100a one.
    for (capability, loads) in [((9, 0), None), ((10, 0), Some("cu130/sm_100a"))] {
        let query = prebuilt::device::DeviceQuery {
            capability,
            driver: prebuilt::device::DriverVersion::parse("13.0").unwrap(),
            cuda: "cu130".parse().unwrap(),
            torch: None,
        };
        let coverage = prebuilt::coverage::coverage(bundle.index(), &query);
        assert_eq!(
            coverage.kernels["sm100_bf16_gemm"].loads.as_deref(),
            loads,
            "{capability:?}"
        );
    }
}

#[test]
fn a_lineinfo_jit_cubin_is_the_bundles_byte_for_byte() {
    // The JIT compiles a bundle's shipped `sources/`, written when the bundle was (or the
    // wheel installed), not the checkout: `-lineinfo` line tables used to carry both mtimes.
    let Some(_) = toolchains() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let manifest = write_library(
        dir.path(),
        "[library]\npackage = \"lines\"\narchs = [\"sm_90a\"]\ncuda-builds = [\"cu130\"]\n\
         torch = \"2.13.*\"\n[kernels.k]\nsources = [\"ops/k.cu\"]\nentries = [\"k\"]\n\
         nvcc-flags = [\"-lineinfo\"]\n",
        &[
            (
                "ops/k.cu",
                "#include \"twice.cuh\"\n#include <cuda_fp16.h>\n\
                 extern \"C\" __global__ void k(float* x, __half* y) {\n\
                 x[threadIdx.x] = twice(x[threadIdx.x]);\n y[0] = __float2half(x[1]) + y[1];\n}\n",
            ),
            (
                "ops/twice.cuh",
                "#pragma once\n__device__ inline float twice(float x) { return 2 * x; }\n",
            ),
        ],
    );
    testkit::tree::stamp(&dir.path().join("ops"), 978_307_200); // 2001-01-01
    let cu130 = of_build(toolchains().unwrap(), "cu130");
    let summary = bundle_kernels(&options_in(dir.path(), &manifest, cu130))
        .unwrap_or_else(|error| panic!("{}", anyhow_like(&error)));
    let bundle = Bundle::open(&summary.out).unwrap();
    let record = &bundle.index().kernels["k"];
    let shipped = bundle.read_artifact("k", &record.variants[0]).unwrap();
    let nvcc = cu130_nvcc();
    let compiler = prebuilt::jit::JitCompiler::nvcc_at(&nvcc).unwrap();
    let request = prebuilt::jit::JitRequest {
        bundle_root: bundle.root(),
        kernel: "k",
        record,
        torch: &bundle.index().torch,
        arch: "sm_90a".parse().unwrap(),
        cuda: "cu130".parse().unwrap(),
    };
    let jit = prebuilt::jit::compile_cached(&request, &compiler, &dir.path().join("jit-cache"))
        .unwrap_or_else(|error| panic!("{error}"));
    assert!(jit.compiled);
    // The line table lists the library's files and cuda_fp16.hpp, with no file time.
    let times = prebuilt::compile::lines::file_times(&jit.cubin);
    assert!(
        times.len() >= 3 && times.iter().all(|&t| t == 0),
        "{times:?}"
    );
    assert!(
        jit.cubin == shipped,
        "the JIT's cubin differs from the bundle's"
    );
}

#[test]
fn apex_layer_norm_obeys_maxrregcount_on_cu129_and_cu130_alike() {
    // apex publishes no sources to the package registry: a checkout named by `KWHEEL_APEX`,
    // else the test skips.
    let Some(apex) = std::env::var_os("KWHEEL_APEX").map(PathBuf::from) else {
        skipped!("skipped: KWHEEL_APEX names no apex checkout");
        return;
    };
    let kernel_file = apex.join("csrc/layer_norm_cuda_kernel.cu");
    assert!(kernel_file.is_file(), "{} missing", kernel_file.display());
    let Some(toolchains) = toolchains() else {
        return;
    };
    let Some(pin) = torch_pin() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let csrc = dir.path().join("csrc");
    std::fs::create_dir(&csrc).unwrap();
    for entry in std::fs::read_dir(apex.join("csrc")).unwrap() {
        let entry = entry.unwrap();
        if entry.path().is_file() {
            std::fs::copy(entry.path(), csrc.join(entry.file_name())).unwrap();
        }
    }
    // setup.py's nvcc options for fused_layer_norm_cuda.
    let manifest = write_library(
        dir.path(),
        &format!(
            "[library]\npackage = \"apex-kernels\"\narchs = [\"sm_90a\"]\n\
             cuda-builds = [\"cu129\", \"cu130\"]\ntorch = \"{pin}\"\ntorch-extension = true\n\
             nvcc-flags = [\"-maxrregcount=50\", \"-O3\", \"--use_fast_math\"]\n\
             [kernels.layer_norm]\nsources = [\"csrc/layer_norm_cuda_kernel.cu\"]\n\
             entries = [\"cuApplyLayerNorm<float, float, float>\", \
             \"cuComputeGradInput<at::BFloat16, float, at::BFloat16, true>\"]\n"
        ),
        &[],
    );
    let summary = bundle_kernels(&options_in(dir.path(), &manifest, toolchains))
        .unwrap_or_else(|error| panic!("{}", anyhow_like(&error)));
    let bundle = Bundle::open(&summary.out).unwrap();
    let record = &bundle.index().kernels["layer_norm"];
    // Per variant, per entry: (registers, register cap).
    type Registers = BTreeMap<String, (Option<u32>, Option<u32>)>;
    let registers: BTreeMap<String, Registers> = record
        .variants
        .iter()
        .map(|variant| {
            let cubin = bundle.read_artifact("layer_norm", variant).unwrap();
            let entries = prebuilt::cubin::entry_resources(&cubin)
                .unwrap()
                .into_iter()
                .map(|(symbol, used)| (symbol, (used.registers, used.register_cap)))
                .collect();
            (variant.label(), entries)
        })
        .collect();
    assert_eq!(
        registers.keys().collect::<Vec<_>>(),
        ["cu129/sm_90a", "cu130/sm_90a"]
    );
    for (label, entries) in &registers {
        assert!(entries.len() > 10, "{label}: {entries:?}");
        for (symbol, (used, cap)) in entries {
            assert_eq!(*cap, Some(50), "{label} {symbol}");
            assert!(
                used.is_some_and(|used| used <= 50),
                "{label} {symbol}: {used:?}"
            );
        }
    }
    assert_eq!(registers["cu129/sm_90a"], registers["cu130/sm_90a"]);
}

/// What a real library's module test needs: the toolchains, the library's sources as
/// `ci/setup-thirdparty` fetched them (folder `name`) and the pinned torch's pin; `None`,
/// said, where one is missing.
fn module_test_inputs(
    test: &str,
    name: &str,
) -> Option<(Vec<BuildToolchain>, std::path::PathBuf, String)> {
    let toolchains = toolchains()?;
    let sources = thirdparty_dir(test, name)?;
    if bundler::torch::TorchHeaders::find().is_err() {
        testkit::missing("no torch (`bash ci/setup-torch` installs the pinned one)");
        return None;
    }
    Some((toolchains, sources, torch_pin()?))
}

/// vLLM 0.34's `silu_and_mul` from its sdist (`ci/setup-thirdparty`), its launcher file
/// unmodified, as a stable-ABI extension module with a registration file in the form of its
/// `csrc/torch_bindings.cpp`: built cold twice, from two folders with their own caches, to the
/// same bytes; sm_90a device code only, to bound the time (docs/real-libraries.md builds five
/// ops for sm_90a and sm_100a).
#[test]
fn vllm_silu_and_mul_builds_as_a_stable_abi_module_with_line_tables_byte_identical_from_two_folders(
) {
    let test = "vllm_silu_and_mul_builds_as_a_stable_abi_module_with_line_tables_byte_identical_from_two_folders";
    let Some((toolchains, vllm, pin)) = module_test_inputs(test, "vllm-0.34.0") else {
        return;
    };
    let bindings = "#include \"ops.h\"\n#include <torch/csrc/stable/library.h>\n\
        STABLE_TORCH_LIBRARY_FRAGMENT(_C, ops) {\n\
          ops.def(\"silu_and_mul(Tensor! result, Tensor input) -> ()\");\n}\n\
        STABLE_TORCH_LIBRARY_IMPL(_C, CUDA, ops) {\n\
          ops.impl(\"silu_and_mul\", TORCH_BOX(&silu_and_mul));\n}\n";
    let manifest = format!(
        "[library]\npackage = \"vllm-kernels\"\nversion = \"0.34.0\"\narchs = [\"sm_90a\"]\n\
         cuda-builds = [\"cu130\"]\ntorch = \"{pin}\"\n\
         [extensions._C]\nsources = [\"bindings.cpp\", \"csrc/activation_kernels.cu\"]\n\
         abi = \"stable\"\ninclude-dirs = [\"csrc\"]\n\
         defines = {{ USE_CUDA = \"1\", TORCH_TARGET_VERSION = \"0x020B000000000000ULL\" }}\n\
         nvcc-flags = [\"--expt-relaxed-constexpr\", \"--expt-extended-lambda\", \"-O3\", \"-lineinfo\"]\n\
         cxx-flags = [\"-O3\"]\n"
    );
    let build = || {
        let dir = tempfile::tempdir().unwrap();
        testkit::copy_tree(&vllm.join("csrc"), &dir.path().join("csrc"), &[]);
        let manifest = write_library(dir.path(), &manifest, &[("bindings.cpp", bindings)]);
        let opts = options_in(dir.path(), &manifest, of_build(toolchains.clone(), "cu130"));
        let started = std::time::Instant::now();
        let summary =
            bundle_kernels(&opts).unwrap_or_else(|error| panic!("{}", anyhow_like(&error)));
        eprintln!("vLLM silu_and_mul module: {:?}", started.elapsed());
        // Built for both CPUs: this machine's first, then the other (docs/extensions.md).
        let cpus: Vec<&str> = summary
            .modules_compiled
            .iter()
            .map(|(name, build, cpu)| {
                assert_eq!((name.as_str(), build.to_string()), ("_C", "cu130".into()));
                cpu.as_str()
            })
            .collect();
        let other = ["x86_64", "aarch64"]
            .into_iter()
            .find(|cpu| *cpu != std::env::consts::ARCH)
            .unwrap();
        assert_eq!(cpus, [std::env::consts::ARCH, other]);
        let record = summary.index.modules["_C"].clone();
        let variant = &record.variants[0];
        let bytes = prebuilt::module::read_module(&summary.out, "_C", variant).unwrap();
        (dir, record, bytes)
    };
    let (first_dir, first, bytes) = build();
    assert_eq!(first.abi, prebuilt::module::Abi::Stable);
    assert_eq!(&bytes[..4], b"\x7fELF");
    // Its fatbin holds one sm_90a cubin with the unit's kernels; some are stubs there
    // (recorded, not refused), most are real.
    let device_code = &first.variants[0].device_code;
    let sm_90a: prebuilt::Arch = "sm_90a".parse().unwrap();
    assert_eq!(device_code.keys().collect::<Vec<_>>(), [&sm_90a]);
    let code = &device_code[&sm_90a];
    eprintln!(
        "vLLM silu_and_mul module, sm_90a: {code}; stubs: {:?}",
        code.stubs
    );
    assert_eq!(code.images, 1, "{code}");
    assert!(
        code.kernels > 0 && code.stubs.len() * 2 < code.kernels as usize,
        "{code}"
    );
    assert!(code.max_registers.is_some(), "{code}");
    // The launcher's own file and vLLM's headers are in the module's key.
    let files = &first.inputs.files;
    for file in ["csrc/activation_kernels.cu", "csrc/ops.h", "bindings.cpp"] {
        assert!(files.contains_key(file), "{file} not in {files:?}");
    }
    // The registration and the launcher are in the module, and neither folder is.
    let text = String::from_utf8_lossy(&bytes);
    assert!(text.contains("silu_and_mul"));
    assert!(!text.contains(&*first_dir.path().to_string_lossy()));
    // `-lineinfo`: the cubin's line tables name the files under the key's work folder, never
    // the checkout, and with no file's time (the two checkouts' files have other times).
    let section = prebuilt::module::fatbin::fatbin_section(&bytes)
        .unwrap()
        .unwrap();
    let entries = prebuilt::module::fatbin::fatbin_entries(section).unwrap();
    let cubin = entries
        .iter()
        .find(|entry| entry.kind == prebuilt::module::fatbin::EntryKind::Cubin)
        .unwrap()
        .payload()
        .unwrap();
    let times = prebuilt::compile::lines::file_times(&cubin);
    assert!(!times.is_empty(), "no line table");
    assert!(times.iter().all(|&time| time == 0), "{times:?}");
    assert!(String::from_utf8_lossy(&cubin).contains("/tmp/kwheel-"));
    std::thread::sleep(std::time::Duration::from_secs(1));
    let (second_dir, second, again) = build();
    assert!(!String::from_utf8_lossy(&again).contains(&*second_dir.path().to_string_lossy()));
    assert!(bytes == again, "two cold builds differ");
    assert_eq!(first, second, "same key, same record");
}

/// GPTQModel 7.7's fast Hadamard transform from its sdist (`ci/setup-thirdparty`): a classic
/// `TORCH_LIBRARY` extension whose two files (`hadamard.cpp`, which includes
/// `<torch/extension.h>`, and `fast_hadamard_transform_cuda.cu`) build unmodified as an
/// `abi = "torch"` module, as `cpp_extension` builds them (its defines and nvcc flags), from a
/// manifest named by a relative path; sm_90a only, to bound the time (docs/real-libraries.md
/// builds sm_90a and sm_100a and runs it on a GPU).
#[test]
fn gptqmodels_hadamard_builds_as_a_classic_module_that_needs_no_python() {
    let test = "gptqmodels_hadamard_builds_as_a_classic_module_that_needs_no_python";
    let Some((toolchains, hadamard, pin)) = module_test_inputs(test, "gptqmodel-7.7.0") else {
        return;
    };
    let manifest = format!(
        "[library]\npackage = \"gptq-hadamard\"\nversion = \"7.7.0\"\narchs = [\"sm_90a\"]\n\
         cuda-builds = [\"cu130\"]\ntorch = \"{pin}\"\n\
         [extensions._C]\n\
         cpus = [\"x86_64\"]\n\
         sources = [\"hadamard/hadamard.cpp\", \"hadamard/fast_hadamard_transform_cuda.cu\"]\n\
         abi = \"torch\"\ninclude-dirs = [\"hadamard\"]\ndefines = {{ ENABLE_BF16 = \"1\" }}\n\
         nvcc-flags = [\"-O3\", \"-lineinfo\"]\ncxx-flags = [\"-O3\"]\n"
    );
    let dir = tempfile::tempdir().unwrap();
    testkit::copy_tree(
        &hadamard.join("hadamard"),
        &dir.path().join("hadamard"),
        &[],
    );
    let manifest = write_library(dir.path(), &manifest, &[]);
    let mut opts = options_in(dir.path(), &manifest, of_build(toolchains, "cu130"));
    // The manifest by a relative path, as `--manifest lib/kernels.toml` gives it: the
    // compilers run in the library's folder, so its include dirs must not stay relative.
    let relative = pathdiff(&manifest, &std::env::current_dir().unwrap());
    opts.manifest = relative;
    let started = std::time::Instant::now();
    let summary = bundle_kernels(&opts).unwrap_or_else(|error| panic!("{}", anyhow_like(&error)));
    eprintln!("GPTQModel hadamard module: {:?}", started.elapsed());
    let record = summary.index.modules["_C"].clone();
    assert_eq!(record.abi, prebuilt::module::Abi::Torch);
    // cpp_extension's defines and flags, under the library's own.
    let inputs = &record.inputs;
    assert_eq!(inputs.defines["TORCH_API_INCLUDE_EXTENSION_H"], "1");
    assert_eq!(inputs.defines["ENABLE_BF16"], "1");
    assert!(inputs
        .nvcc_flags
        .iter()
        .any(|f| f == "--expt-relaxed-constexpr"));
    assert!(inputs.files.contains_key("hadamard/hadamard.cpp"));
    let variant = &record.variants[0];
    assert!(variant.torch.starts_with("=="), "{}", variant.torch);
    // The `.cu` unit's sm_90a cubin, read from the module's fatbin: one kernel per
    // instantiation of the transform, each real on sm_90a.
    let sm_90a: prebuilt::Arch = "sm_90a".parse().unwrap();
    let code = &variant.device_code[&sm_90a];
    eprintln!("GPTQModel hadamard module, sm_90a: {code}");
    assert_eq!(variant.device_code.len(), 1);
    assert!(code.kernels > 100 && code.stubs.is_empty(), "{code}");
    let bytes = prebuilt::module::read_module(&summary.out, "_C", variant).unwrap();
    let text = String::from_utf8_lossy(&bytes);
    assert!(text.contains("gptqmodel_hadamard"));
    // `<torch/extension.h>` was read without its Python half: pybind11's headers would leave
    // the module needing this Python's symbols (`_PyThreadState_UncheckedGet`, gone in 3.13).
    for symbol in [
        "_PyThreadState_UncheckedGet",
        "PyInstanceMethod_Type",
        "_Py_Dealloc",
    ] {
        assert!(
            !text.contains(symbol),
            "the module needs Python's `{symbol}`"
        );
    }
    assert!(!text.contains(&*dir.path().to_string_lossy()));
}

/// `path` relative to `base` (both absolute), through `..` where needed.
fn pathdiff(path: &std::path::Path, base: &std::path::Path) -> std::path::PathBuf {
    let path: Vec<_> = path.components().collect();
    let base: Vec<_> = base.components().collect();
    let common = path.iter().zip(&base).take_while(|(a, b)| a == b).count();
    let mut relative = std::path::PathBuf::new();
    for _ in common..base.len() {
        relative.push("..");
    }
    relative.extend(&path[common..]);
    relative
}
