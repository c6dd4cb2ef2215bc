//! Kernels written as real libraries write them: torch extensions (`torch = true`, no torch
//! include dir or define copied into the manifest), library-level and per-arch defines and
//! flags, a `.cuh` translation unit, and a preamble the entries' names rely on.

use super::*;

use bundler::pipeline::{plan_kernel, target_key};
use bundler::torch::{TorchHeaders, TORCH_ENV};

/// The torch tests share `KWHEEL_TORCH`: one at a time.
fn torch_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs `body` with `KWHEEL_TORCH` set to `value` (or unset), then puts it back.
fn with_torch_env<T>(value: Option<&Path>, body: impl FnOnce() -> T) -> T {
    let _lock = torch_lock();
    let before = std::env::var_os(TORCH_ENV);
    match value {
        Some(value) => std::env::set_var(TORCH_ENV, value),
        None => std::env::remove_var(TORCH_ENV),
    }
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
    match before {
        Some(before) => std::env::set_var(TORCH_ENV, before),
        None => std::env::remove_var(TORCH_ENV),
    }
    result.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// The torch `ci/setup-torch` installs (or `KWHEEL_TORCH`'s), or `None` with the reason.
fn installed_torch() -> Option<TorchHeaders> {
    let found = {
        let _lock = torch_lock();
        TorchHeaders::find()
    };
    match found {
        Ok(torch) => Some(torch),
        Err(error) => {
            skipped!("skipped: {error}");
            None
        }
    }
}

/// A torch pin that allows `version` (`2.11.0+cu130` → `2.11.*`).
fn pin_for(version: &str) -> String {
    let mut parts = version.split('.');
    format!(
        "{}.{}.*",
        parts.next().unwrap(),
        parts.next().unwrap_or_default()
    )
}

fn torch_library(pin: &str, archs: &str, kernel: &str) -> String {
    format!(
        "[library]\npackage = \"torch-ext\"\narchs = [{archs}]\ncuda-builds = [\"cu129\", \
         \"cu130\"]\ntorch = \"{pin}\"\n\n[kernels.{kernel}]\nsources = [\"{kernel}.cu\"]\n\
         entries = [\"{kernel}\"]\ntorch = true\n"
    )
}

/// `c10::BFloat16` in a `__global__` kernel, as an extension's `.cu` file writes it: only
/// compiles with torch's include dirs, and its operators only with torch's defines in place.
const BF16_SCALE: &str = r#"#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>

#ifndef __CUDA_NO_BFLOAT16_CONVERSIONS__
#error "torch's cpp_extension defines are missing"
#endif

extern "C" __global__ void bf16_scale(c10::BFloat16* out, const c10::BFloat16* in, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = static_cast<float>(in[i]) * 2.0f;
}
"#;

const CUDA_CONTEXT: &str = r#"#include <ATen/cuda/CUDAContext.h>
#include <c10/util/BFloat16.h>

extern "C" __global__ void cuda_context(c10::BFloat16* out, const c10::BFloat16* in, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = static_cast<float>(in[i]) + 1.0f;
}
"#;

/// Builds `kernel` (source `text`) with `torch = true` for sm_90a with both CUDA builds and
/// checks what a torch extension must be: nvcc on cu130, the nvcc+ptxas route on cu129,
/// torch's defines recorded, torch's headers hashed under stable names.
fn build_torch_extension(
    torch: &TorchHeaders,
    toolchains: Vec<BuildToolchain>,
    kernel: &str,
    text: &str,
    headers: &[&str],
) {
    let dir = tempfile::tempdir().unwrap();
    let manifest = write_library(
        dir.path(),
        &torch_library(&pin_for(&torch.version), "\"sm_90a\"", kernel),
        &[(&format!("{kernel}.cu"), text)],
    );
    let summary = with_torch_env(None, || {
        bundle_kernels(&options_in(dir.path(), &manifest, toolchains))
            .map_err(|error| anyhow_like(&error))
    })
    .unwrap_or_else(|error| panic!("{error}"));
    assert!(summary.failed().is_empty(), "{:#?}", summary.failed());
    let record = &summary.index.kernels[kernel];
    let built: Vec<(String, String)> = record
        .variants
        .iter()
        .map(|v| (v.label(), v.compiler.kind.clone()))
        .collect();
    assert_eq!(
        built,
        [
            ("cu129/sm_90a".to_owned(), "nvcc+ptxas".to_owned()),
            ("cu130/sm_90a".to_owned(), "nvcc".to_owned())
        ]
    );
    let defines = &record.inputs.defines;
    for name in [
        "__CUDA_NO_HALF_OPERATORS__",
        "__CUDA_NO_HALF_CONVERSIONS__",
        "__CUDA_NO_BFLOAT16_CONVERSIONS__",
        "__CUDA_NO_HALF2_OPERATORS__",
        "TORCH_API_INCLUDE_EXTENSION_H",
    ] {
        assert_eq!(defines.get(name).map(String::as_str), Some("1"), "{name}");
    }
    assert_eq!(defines["TORCH_EXTENSION_NAME"], kernel);
    assert_eq!(record.inputs.nvcc_flags, ["--expt-relaxed-constexpr"]);
    let recipe = record.recipe.as_ref().unwrap();
    assert_eq!(recipe.include_dirs, ["[0]", "[1]"]);
    // Every torch header reached is hashed, by a name that is the same on every machine.
    for &header in headers {
        assert!(
            record.inputs.files.contains_key(header),
            "{header} not hashed"
        );
    }
    let index = std::fs::read_to_string(summary.out.join("index.json")).unwrap();
    let torch_path = torch.package.display().to_string();
    assert!(!index.contains(&torch_path), "the index names {torch_path}");
}

#[test]
fn a_torch_extension_kernel_builds_with_no_copied_include_dir_or_define() {
    let Some(toolchains) = toolchains() else {
        return;
    };
    let Some(torch) = installed_torch() else {
        return;
    };
    let headers = ["[0]/ATen/ATen.h", "[0]/c10/util/BFloat16.h"];
    build_torch_extension(&torch, toolchains, "bf16_scale", BF16_SCALE, &headers);
}

#[test]
fn a_kernel_including_cuda_context_builds_as_a_torch_extension() {
    let Some(toolchains) = toolchains() else {
        return;
    };
    let Some(torch) = installed_torch() else {
        return;
    };
    // `ATen/cuda/CUDAContext.h` includes cuBLAS, cuSPARSE and cuSOLVER headers.
    let missing: Vec<&str> = ["cublas_v2.h", "cusparse.h", "cusolverDn.h"]
        .into_iter()
        .filter(|header| {
            !toolchains
                .iter()
                .all(|t| t.include_dirs.iter().any(|dir| dir.join(header).is_file()))
        })
        .collect();
    if !missing.is_empty() {
        skipped!(
            "skipped: the provisioned toolkits lack the CUDA math-library headers {} that \
             ATen/cuda/CUDAContext.h includes",
            missing.join(", ")
        );
        return;
    }
    let headers = ["[0]/ATen/cuda/CUDAContext.h", "[0]/c10/util/BFloat16.h"];
    build_torch_extension(&torch, toolchains, "cuda_context", CUDA_CONTEXT, &headers);
}

/// A torch package folder with just what kwheel reads: `version.py`,
/// `utils/cpp_extension.py` (the lines torch 2.11's has) and one header.
fn fake_torch(site: &Path, version: &str, header: &str) -> PathBuf {
    let package = site.join("torch");
    let files = [
        (
            "version.py",
            format!("__version__ = '{version}'\ncuda = '13.0'\n"),
        ),
        (
            "utils/cpp_extension.py",
            "COMMON_NVCC_FLAGS = [\n    '-D__CUDA_NO_HALF_OPERATORS__',\n    \
             '-D__CUDA_NO_HALF_CONVERSIONS__',\n    '-D__CUDA_NO_BFLOAT16_CONVERSIONS__',\n    \
             '-D__CUDA_NO_HALF2_OPERATORS__',\n    '--expt-relaxed-constexpr'\n]\n\
             def f(name):\n    common_cflags.append(f'-DTORCH_EXTENSION_NAME={name}')\n    \
             common_cflags.append('-DTORCH_API_INCLUDE_EXTENSION_H')\n"
                .to_owned(),
        ),
        ("include/c10/util/Half.h", header.to_owned()),
        (
            "include/torch/csrc/api/include/torch/all.h",
            "#pragma once\n".to_owned(),
        ),
    ];
    for (path, text) in files {
        let path = package.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    package
}

/// The sm_90a/cu130 key of kernel `k` of `manifest`, planned with `KWHEEL_TORCH` = `torch`,
/// or the error as the command line prints it.
fn planned_key(
    manifest: &Path,
    torch: &Path,
) -> Result<(String, prebuilt::index::KernelInputs), String> {
    let manifest = bundler::Manifest::load(manifest).map_err(|error| anyhow_like(&error))?;
    let planned = with_torch_env(Some(torch), || {
        plan_kernel(&manifest, "k", &manifest.kernels["k"], &[]).map_err(|e| anyhow_like(&e))
    })?;
    let key = target_key(
        &planned,
        "cu130".parse().unwrap(),
        "sm_90a".parse().unwrap(),
        &manifest.library.torch,
        &testkit::fixtures::compiler("nvcc", "13.0.88"),
    );
    Ok((key.0, planned.inputs))
}

#[test]
fn torch_headers_are_hashed_by_stable_names_and_found_through_kwheel_torch() {
    let dir = tempfile::tempdir().unwrap();
    let library = dir.path().join("lib");
    let source = "#include <c10/util/Half.h>\nextern \"C\" __global__ void k() {}\n";
    let manifest = write_library(
        &library,
        &torch_library("2.11.*", "\"sm_90a\"", "k"),
        &[("k.cu", source)],
    );
    let site = dir.path().join("site-a");
    let package = fake_torch(&site, "2.11.0+cu130", "#pragma once\n");
    let (key, inputs) = planned_key(&manifest, &site).unwrap();
    assert_eq!(
        inputs.files.keys().collect::<Vec<_>>(),
        ["[0]/c10/util/Half.h", "k.cu"]
    );
    assert_eq!(
        inputs.defines,
        BTreeMap::from(
            [
                ("TORCH_API_INCLUDE_EXTENSION_H", "1"),
                ("TORCH_EXTENSION_NAME", "k"),
                ("__CUDA_NO_BFLOAT16_CONVERSIONS__", "1"),
                ("__CUDA_NO_HALF2_OPERATORS__", "1"),
                ("__CUDA_NO_HALF_CONVERSIONS__", "1"),
                ("__CUDA_NO_HALF_OPERATORS__", "1"),
            ]
            .map(|(name, value)| (name.to_owned(), value.to_owned()))
        )
    );
    assert_eq!(inputs.nvcc_flags, ["--expt-relaxed-constexpr"]);
    // The package folder itself is taken too, and the same torch elsewhere is the same key.
    assert_eq!(planned_key(&manifest, &package).unwrap().0, key);
    let moved = dir.path().join("site-b");
    fake_torch(&moved, "2.11.0+cu130", "#pragma once\n");
    assert_eq!(planned_key(&manifest, &moved).unwrap().0, key);
    // An edit to a torch header is a new key.
    let edited = dir.path().join("site-c");
    fake_torch(
        &edited,
        "2.11.0+cu130",
        "#pragma once\n#define C10_EDITED 1\n",
    );
    assert_ne!(planned_key(&manifest, &edited).unwrap().0, key);
    // A torch the pin does not allow is refused, naming both.
    let other = dir.path().join("site-d");
    fake_torch(&other, "2.9.1", "#pragma once\n");
    let error = planned_key(&manifest, &other).unwrap_err();
    assert_eq!(
        error,
        format!(
            "cannot compile `k` as a torch extension (`torch = true`): the torch at {} \
             (KWHEEL_TORCH) is 2.9.1, which the manifest's torch pin `2.11.*` does not allow: \
             point KWHEEL_TORCH at the torch the library is released for",
            other.join("torch").display()
        )
    );
    // None at all says how to provide one.
    let empty = dir.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let error = planned_key(&manifest, &empty).unwrap_err();
    assert!(
        error.starts_with(&format!(
            "cannot compile `k` as a torch extension (`torch = true`): no torch at {} \
             (KWHEEL_TORCH): set KWHEEL_TORCH to a site-packages folder",
            empty.display()
        )),
        "{error}"
    );
}

/// Library defines under the kernel's, per-arch tables for one target only, a `.cuh`
/// translation unit, and a preamble the entry's name needs: every `static_assert` holds only
/// where the layering is right, so a build of all four targets is the proof.
const LAYERED_LIBRARY: &str = r#"
[library]
package = "layered"
archs = ["sm_90a", "sm_100a"]
cuda-builds = ["cu129", "cu130"]
torch = "2.13.*"
defines = { GEN = "0", LIB_ONLY = "7", OVERRIDDEN = "library" }
preamble = "using namespace layered;"

[library.targets.sm_100a]
defines = { GEN = "10" }
flags = ["--fmad=false"]

[kernels.scale]
sources = ["scale.cuh"]
entries = ["scale<float>"]
constants = { BLOCK = 128 }
defines = { OVERRIDDEN = "2" }

[kernels.scale.targets.sm_90a]
defines = { GEN = "9" }
"#;

const LAYERED_SOURCE: &str = r#"#pragma once
#define library 1
namespace layered {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
static_assert(GEN == 10, "sm_100a compiles with the library's sm_100a GEN");
#elif defined(__CUDA_ARCH__)
static_assert(GEN == 9, "sm_90a compiles with the kernel's sm_90a GEN");
#endif
static_assert(LIB_ONLY == 7 && BLOCK == 128, "library defines and constants reach the kernel");
static_assert(OVERRIDDEN == 2, "the kernel's define replaces the library's");
template <typename T>
__global__ void scale(T* out, const T* in, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] * T(GEN);
}
}  // namespace layered
"#;

#[test]
fn library_and_per_arch_defines_a_header_unit_and_a_preamble_build_everywhere() {
    let Some(toolchains) = toolchains() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let manifest = write_library(
        dir.path(),
        LAYERED_LIBRARY,
        &[("scale.cuh", LAYERED_SOURCE)],
    );
    let summary = bundle_kernels(&options_in(dir.path(), &manifest, toolchains.clone()))
        .unwrap_or_else(|error| panic!("{}", anyhow_like(&error)));
    assert!(summary.failed().is_empty(), "{:#?}", summary.failed());
    let record = &summary.index.kernels["scale"];
    let built: Vec<(String, String)> = record
        .variants
        .iter()
        .map(|v| (v.label(), v.compiler.kind.clone()))
        .collect();
    // No system header and no nvcc-only flag: CUDA 12.9 compiles it with NVRTC.
    let expected = [
        ("cu129/sm_90a", "nvrtc"),
        ("cu129/sm_100a", "nvrtc"),
        ("cu130/sm_90a", "nvcc"),
        ("cu130/sm_100a", "nvcc"),
    ];
    let expected: Vec<(String, String)> = expected
        .iter()
        .map(|(label, kind)| ((*label).to_owned(), (*kind).to_owned()))
        .collect();
    assert_eq!(built, expected);
    let inputs = &record.inputs;
    assert_eq!(inputs.preamble, "using namespace layered;");
    assert_eq!(inputs.defines["GEN"], "0");
    assert_eq!(inputs.defines["OVERRIDDEN"], "2");
    let json = std::fs::read_to_string(summary.out.join("index.json")).unwrap();
    let index: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(
        index["kernels"]["scale"]["inputs"]["targets"],
        serde_json::json!({
            "sm_100a": { "defines": { "GEN": "10" }, "flags": ["--fmad=false"] },
            "sm_90a": { "defines": { "GEN": "9" } }
        })
    );
    // Without the preamble the entry names nothing: the build says so for every target.
    let text = LAYERED_LIBRARY.replace(
        "sources = [\"scale.cuh\"]",
        "sources = [\"scale.cuh\"]\npreamble = \"\"",
    );
    let bare = tempfile::tempdir().unwrap();
    let manifest = write_library(bare.path(), &text, &[("scale.cuh", LAYERED_SOURCE)]);
    let error = bundle_kernels(&options_in(bare.path(), &manifest, toolchains)).unwrap_err();
    assert!(matches!(error, Error::NoTarget { .. }), "{error}");
}

#[test]
fn per_arch_tables_torch_and_translation_units_are_checked_when_the_manifest_is_read() {
    const BASE: &str = "[library]\npackage = \"tiny\"\narchs = [\"sm_90a\", \"sm_100a\"]\n\
                        cuda-builds = [\"cu129\", \"cu130\"]\ntorch = \"2.13.*\"\n\n\
                        [kernels.add]\nsources = [\"add.cu\"]\nentries = [\"add\"]\n\
                        constants = { BLOCK = 1 }\n";
    let kernel_key = |extra: &str| {
        BASE.replace(
            "entries = [\"add\"]",
            &format!("entries = [\"add\"]\n{extra}"),
        )
    };
    let cases = [
        (
            format!("{BASE}[kernels.add.targets.sm_120a]\ndefines = {{ X = \"1\" }}\n"),
            "`targets.sm_120a` names sm_120a, which is not one of the library's `archs` \
             (sm_90a, sm_100a)",
        ),
        (
            format!(
                "{}[kernels.add.targets.sm_100a]\nflags = [\"-lineinfo\"]\n",
                kernel_key("arch = [\"sm_90a\"]")
            ),
            "`targets.sm_100a` names sm_100a, which is not one of the kernel's `arch` (sm_90a)",
        ),
        (
            format!("{BASE}[kernels.add.targets.sm_90a]\ndefines = {{ BLOCK = \"2\" }}\n"),
            "`targets.sm_90a` defines `BLOCK`, which is a constant of the kernel: a constant \
             is exported with one value for every target",
        ),
        (
            format!("{BASE}[kernels.add.targets.sm_90a]\nflags = [\"-DBLOCK=64\"]\n"),
            "`targets.sm_90a.flags` holds `-DBLOCK=64`, which sets `BLOCK`, a constant of the \
             kernel: a constant is compiled and exported with the one value `constants` gives it",
        ),
        (
            kernel_key("nvcc-flags = [\"-D\", \"BLOCK=2\"]"),
            "`nvcc-flags` holds `-D BLOCK=2`, which sets `BLOCK`",
        ),
        (
            BASE.replace(
                "torch = \"2.13.*\"",
                "torch = \"2.13.*\"\nflags = [\"--define-macro=BLOCK\"]",
            ),
            "`flags` holds `--define-macro=BLOCK`, which sets `BLOCK`",
        ),
        (
            format!("{BASE}[kernels.add.targets.sm_90a]\nnvcc-flags = [\"-Iinclude\"]\n"),
            "`targets.sm_90a.nvcc-flags` holds `-Iinclude`: headers found through `-I` would \
             be compiled but not hashed into the key",
        ),
        (
            BASE.replace(
                "torch = \"2.13.*\"",
                "torch = \"2.13.*\"\ndefines = { \"a-b\" = \"1\" }",
            ),
            "`defines` names `a-b`, which must be a C identifier",
        ),
        (
            kernel_key("torch = true").replace("torch = \"2.13.*\"", "torch = \"none\""),
            "`torch = \"none\"` says the library does not use torch, but kernel `add` compiles \
             as a torch extension: pin the torch it builds against",
        ),
        (
            kernel_key("torch = true\ncompiler = \"nvrtc\""),
            "`torch = true` needs nvcc: torch's headers include host code",
        ),
        (
            kernel_key(
                "torch = true\ncubins = [{ arch = \"sm_90a\", cuda = \"cu130\", path = \"k.cubin\" }]",
            )
            .replace("sources = [\"add.cu\"]\n", ""),
            "`torch` applies to compiled sources, not to `cubins`",
        ),
        (
            BASE.replace("\"add.cu\"", "\"/opt/lib/impl.cu\""),
            "source `/opt/lib/impl.cu` is not inside the library's folder",
        ),
        (
            BASE.replace("\"add.cu\"", "\"../other/add.cu\""),
            "source `../other/add.cu` is not inside the library's folder",
        ),
        (
            BASE.replace("add.cu", "add.txt"),
            "source `add.txt` is not a translation unit nvcc and NVRTC compile as CUDA (.cu, \
             .cuh, .h, .hpp)",
        ),
    ];
    for (text, expected) in cases {
        let dir = tempfile::tempdir().unwrap();
        let error = bundler::Manifest::load(&write_library(dir.path(), &text, &[]))
            .map(|_| "loaded".to_owned())
            .unwrap_or_else(|error| error.to_string());
        assert!(
            error.contains(expected),
            "{text}\n→ {error}\nwanted: {expected}"
        );
    }
    for unit in ["add.cuh", "add.h", "add.hpp"] {
        let dir = tempfile::tempdir().unwrap();
        let text = BASE.replace("add.cu", unit);
        bundler::Manifest::load(&write_library(dir.path(), &text, &[]))
            .unwrap_or_else(|error| panic!("{unit}: {error}"));
    }
}

#[test]
fn explain_shows_torch_include_dirs_defines_preamble_and_per_arch_values() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = write_library(
        &dir.path().join("layered"),
        LAYERED_LIBRARY,
        &[("scale.cuh", LAYERED_SOURCE)],
    );
    let explained = bundler::explain::explain(&manifest, "scale", None, None).unwrap();
    let text = explained.to_string();
    for line in [
        "\n  defines: BLOCK=128 GEN=0 LIB_ONLY=7 OVERRIDDEN=2\n",
        "\n  sm_90a adds: defines GEN=9\n  sm_100a adds: defines GEN=10; flags --fmad=false\n",
        "\n  preamble (compiled after the source, before the entries):\n    using namespace \
         layered;\n",
    ] {
        assert!(text.contains(line), "{line:?} not in\n{text}");
    }
    // Against an index of other inputs, each change is named.
    let mut index = prebuilt::index::Index {
        format: prebuilt::index::INDEX_FORMAT,
        package: "layered".into(),
        torch: "2.13.*".into(),
        store: None,
        dictionary: None,
        kernels: BTreeMap::new(),
        modules: Default::default(),
    };
    let mut old = explained.inputs.clone();
    old.preamble.clear();
    old.targets.remove(&"sm_90a".parse().unwrap());
    index.kernels.insert(
        "scale".into(),
        prebuilt::index::KernelRecord {
            inputs: old,
            recipe: None,
            constants: BTreeMap::new(),
            variants: Vec::new(),
            skipped: Vec::new(),
        },
    );
    let changes =
        bundler::explain::changes_since(&index, "scale", &explained.inputs, "2.13.*", &[]);
    assert_eq!(
        changes,
        [
            "preamble: \"\" → \"using namespace layered;\"",
            "sm_90a adds: nothing → defines GEN=9"
        ]
    );

    // A torch extension shows where torch's include dirs and defines come from.
    let site = dir.path().join("site");
    let package = fake_torch(&site, "2.11.0+cu130", "#pragma once\n");
    let source = "#include <c10/util/Half.h>\nextern \"C\" __global__ void k() {}\n";
    let manifest = write_library(
        &dir.path().join("ext"),
        &torch_library("2.11.*", "\"sm_90a\"", "k"),
        &[("k.cu", source)],
    );
    let text = with_torch_env(Some(&site), || {
        bundler::explain::explain(&manifest, "k", None, None)
            .map(|explained| explained.to_string())
            .map_err(|error| anyhow_like(&error))
    })
    .unwrap();
    let include = package.join("include");
    let expected = format!(
        "\n  torch extension: torch 2.11.0+cu130 at {} (KWHEEL_TORCH)\n    include dirs: [0] = \
         {}, [1] = {}\n    defines: TORCH_API_INCLUDE_EXTENSION_H=1 TORCH_EXTENSION_NAME=k \
         __CUDA_NO_BFLOAT16_CONVERSIONS__=1 __CUDA_NO_HALF2_OPERATORS__=1 \
         __CUDA_NO_HALF_CONVERSIONS__=1 __CUDA_NO_HALF_OPERATORS__=1\n    nvcc flags: \
         --expt-relaxed-constexpr\n",
        package.display(),
        include.display(),
        include.join("torch/csrc/api/include").display()
    );
    assert!(text.contains(&expected), "{expected}\nnot in\n{text}");
    assert!(
        text.contains("    [0]/c10/util/Half.h\n") || text.contains("  [0]/c10/util/Half.h"),
        "{text}"
    );
}
