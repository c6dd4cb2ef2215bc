//! The bundler end to end, on the embedded default library and on small broken ones, with
//! the real CUDA toolchains that `ci/setup` installs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use bundler::compiler::{CompileError, CompileOutput, CompileRequest, Compiler};
use bundler::toolchain::{CompilerId, CompilerKind};
use bundler::{bundle_kernels, BuildToolchain, BundleOptions, BundleSummary, Error};
use prebuilt::cubin::validate_cubin;
use prebuilt::{Arch, Bundle};

use testkit::{default_manifest, skipped, thirdparty_root, toolchains, torch_pin, workspace};

fn options(
    manifest: &Path,
    out: &Path,
    cache: &Path,
    toolchains: Vec<BuildToolchain>,
) -> BundleOptions {
    BundleOptions {
        manifest: manifest.to_owned(),
        out: out.to_owned(),
        cache_dir: cache.to_owned(),
        jobs: 2,
        only: Vec::new(),
        require: false,
        torch: None,
        progress: None,
        toolchains: Some(toolchains),
        farm: None,
    }
}

/// [`options`] with the bundle at `dir/out` and the build cache at `dir/cache`.
fn options_in(dir: &Path, manifest: &Path, toolchains: Vec<BuildToolchain>) -> BundleOptions {
    options(manifest, &dir.join("out"), &dir.join("cache"), toolchains)
}

/// Copies the embedded library (sources and manifest, not the Rust references) to `dir`;
/// returns the copy's manifest.
fn copy_library(dir: &Path) -> PathBuf {
    testkit::copy_library(dir, &["reference", "target"]).join("kernels.toml")
}

/// The toolchains of `build` among `toolchains`.
fn of_build(toolchains: Vec<BuildToolchain>, build: &str) -> Vec<BuildToolchain> {
    toolchains
        .into_iter()
        .filter(|toolchain| toolchain.build.to_string() == build)
        .collect()
}

/// The nvcc of the installed cu130 toolchain.
fn cu130_nvcc() -> PathBuf {
    let toolchain = bundler::toolchain::discover("cu130".parse().unwrap()).unwrap();
    toolchain.nvcc.unwrap()
}

/// One cold build of the default library, shared by the tests that only read it.
struct DefaultBuild {
    _dir: tempfile::TempDir,
    cache: PathBuf,
    out: PathBuf,
    summary: BundleSummary,
}

fn default_build() -> Option<&'static DefaultBuild> {
    static BUILD: OnceLock<Option<DefaultBuild>> = OnceLock::new();
    BUILD
        .get_or_init(|| {
            let toolchains = toolchains()?;
            let dir = tempfile::tempdir().unwrap();
            let cache = dir.path().join("cache");
            let out = dir.path().join("bundle");
            let summary = bundle_kernels(&options(&default_manifest(), &out, &cache, toolchains))
                .expect("the default library bundles");
            Some(DefaultBuild {
                _dir: dir,
                cache,
                out,
                summary,
            })
        })
        .as_ref()
}

/// A fresh folder, options for the default library that bundle into its `bundle` from the
/// shared build's cache, and that build; `None` where the toolchains are missing.
fn from_default_build() -> Option<(tempfile::TempDir, BundleOptions, &'static DefaultBuild)> {
    let toolchains = toolchains()?;
    let build = default_build()?;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("bundle");
    let options = options(&default_manifest(), &out, &build.cache, toolchains);
    Some((dir, options, build))
}

/// Runs `nvcc -M …` and returns the files its dependency rule lists, canonical; the rule's
/// target is left out.
fn nvcc_dependencies(command: &mut std::process::Command) -> Vec<PathBuf> {
    let output = command.output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout)
        .unwrap()
        .replace("\\\n", " ");
    text.split_whitespace()
        .skip(1)
        .filter_map(|path| Path::new(path).canonicalize().ok())
        .collect()
}

/// `variant`'s cubin, read back from `bundle`, validated for its arch with the symbols the
/// index records.
fn validate_variant(
    bundle: &Bundle,
    kernel: &str,
    variant: &prebuilt::index::Variant,
) -> prebuilt::cubin::CubinInfo {
    let cubin = bundle.read_artifact(kernel, variant).unwrap();
    let symbols: Vec<&str> = variant
        .functions
        .iter()
        .map(|f| f.symbol.as_str())
        .collect();
    validate_cubin(&cubin, variant.arch, &symbols).unwrap()
}

#[test]
fn default_library_bundles_every_target_minus_declared_skips() {
    let Some(build) = default_build() else { return };
    let bundle = Bundle::open(&build.out).unwrap();
    let index = bundle.index();
    assert_eq!(index.package, "af3-kernels");
    assert_eq!(index.torch, "2.13.*");
    assert!(index.kernels.len() >= 6, "{:?}", index.kernels.keys());
    // A cold build: 7 kernels by 8 cells, less wgmma's 6 declared skips, nothing failed.
    let summary = &build.summary;
    assert_eq!(
        (
            summary.compiled().len(),
            summary.cached(),
            summary.skipped()
        ),
        (50, 0, 6)
    );
    assert!(summary.failed().is_empty(), "{:?}", summary.failed());
    let variants: usize = index.kernels.values().map(|r| r.variants.len()).sum();
    assert_eq!(variants, 50);
    for (name, record) in &index.kernels {
        let mut cells = BTreeSet::new();
        for variant in &record.variants {
            cells.insert((variant.cuda.to_string(), variant.arch.to_string()));
            validate_variant(&bundle, name, variant);
            assert_eq!(variant.functions.len(), record.inputs.entries.len());
            for function in &variant.functions {
                assert!(!function.param_sizes.is_empty(), "{name}: {function:?}");
            }
            let expected = match variant.cuda.to_string().as_str() {
                "cu129" => "nvrtc",
                _ => "nvcc",
            };
            assert_eq!(
                variant.compiler.kind,
                expected,
                "{name} {}",
                variant.label()
            );
        }
        for skip in &record.skipped {
            assert!(skip.reason.starts_with("declared"), "{name}: {skip:?}");
            cells.insert((skip.cuda.to_string(), skip.arch.to_string()));
        }
        // sm_90a, sm_100a, sm_100f and compute_90, with each of the two CUDA builds.
        assert_eq!(cells.len(), 8, "{name}: every cell is a variant or a skip");
    }
    let wgmma = &index.kernels["wgmma_matmul_bf16"];
    assert_eq!(wgmma.variants.len(), 2);
    assert!(wgmma
        .variants
        .iter()
        .all(|v| v.arch.to_string() == "sm_90a"));
    assert_eq!(wgmma.skipped.len(), 6);
    assert!(wgmma
        .skipped
        .iter()
        .all(|s| ["sm_100a", "sm_100f", "compute_90"].contains(&s.arch.to_string().as_str())));
    let layernorm = &index.kernels["layernorm_bf16"];
    assert_eq!(layernorm.variants.len(), 8);
    // The PTX variant is PTX, with the cubins' entries and parameter sizes.
    let ptx = layernorm
        .variants
        .iter()
        .find(|v| v.arch.to_string() == "compute_90")
        .unwrap();
    let text = bundle.read_artifact("layernorm_bf16", ptx).unwrap();
    assert!(String::from_utf8(text)
        .unwrap()
        .contains("\n.target sm_90\n"));
    assert_eq!(ptx.functions, layernorm.variants[1].functions);
    // Constants reach the index for callers.
    assert_eq!(layernorm.constants["BLOCK_SIZE"].to_string(), "256");
    // The layernorm entry takes (out, in, gamma, beta, rows, cols, eps).
    assert_eq!(
        layernorm.variants[0].functions[0].param_sizes,
        vec![8, 8, 8, 8, 4, 4, 4]
    );
    // Templated entries map to mangled symbols.
    let scale = &index.kernels["scale_rows"].variants[0].functions;
    assert_eq!(scale[0].name, "scale_rows<float>");
    assert!(scale[0].symbol.starts_with("_Z"), "{scale:?}");
    assert_ne!(scale[0].symbol, scale[1].symbol);
}

#[test]
fn second_run_compiles_nothing_and_rewrites_nothing() {
    let Some(build) = default_build() else { return };
    assert!(!build.summary.compiled().is_empty());
    let before = testkit::tree::bytes(&build.out);
    let again = bundle_kernels(&options(
        &default_manifest(),
        &build.out,
        &build.cache,
        toolchains().unwrap(),
    ))
    .unwrap();
    assert!(
        again.compiled().is_empty(),
        "recompiled {:?}",
        again.compiled()
    );
    assert_eq!(again.written, bundler::writer::WriteOutcome::Unchanged);
    assert_eq!(testkit::tree::bytes(&build.out), before);
}

#[test]
fn identical_inputs_give_identical_bundles() {
    let Some(build) = default_build() else { return };
    // A second bundle from the warm cache, and a third from a cold cache (so the compilers'
    // own output is deterministic too), byte for byte equal to the first.
    let dir = tempfile::tempdir().unwrap();
    let warm = dir.path().join("warm");
    bundle_kernels(&options(
        &default_manifest(),
        &warm,
        &build.cache,
        toolchains().unwrap(),
    ))
    .unwrap();
    assert_eq!(
        testkit::tree::bytes(&warm),
        testkit::tree::bytes(&build.out)
    );
    let cold = dir.path().join("cold");
    let summary = bundle_kernels(&options(
        &default_manifest(),
        &cold,
        &dir.path().join("cold-cache"),
        toolchains().unwrap(),
    ))
    .unwrap();
    assert_eq!(summary.cached(), 0);
    assert_eq!(
        testkit::tree::bytes(&cold),
        testkit::tree::bytes(&build.out)
    );
}

/// ggml's `softmax.cu` (llama.cpp) in miniature: `static` kernels, one a template its entry
/// names, a variable in an anonymous namespace, and a class template with a virtual function
/// instantiated with a class local to a `static` function, as ggml's `common.cuh` keys a static
/// `std::unordered_map` with local classes. That last makes nvcc's and NVRTC's front end name
/// the unit's internal symbols (`_INTERNAL_<hash>_<file>_<id>`) before it has seen an external
/// definition, and unseeded it draws `<id>` from its process id and the folder.
const SOFTMAX_STAND_IN: &str = r#"template <typename T> struct Holder {
    T value;
    __device__ virtual ~Holder() {}
};
static __device__ int local_value() {
    struct Local { int v; };
    Holder<Local> held{};
    return held.value.v;
}
namespace { __device__ float bias; }
template <typename T> static __global__ void soft_max(T* x) {
    x[threadIdx.x] = T(bias) + T(local_value());
}
"#;

/// Cold builds of ggml's softmax kernel gave another cubin each time (its internal symbols'
/// names), and `-lineinfo` builds for sm_100a from two checkouts differed in the second line
/// table, `.nv.merc.debug_line`, which holds the files' times. Two folders, two caches, files
/// of other times, every compiler (nvcc, the cu129 nvcc+ptxas route, NVRTC): the same bytes.
#[test]
fn cold_builds_of_ggmls_softmax_pattern_from_two_folders_are_the_same_bytes() {
    let Some(toolchains) = toolchains() else {
        return;
    };
    let manifest = r#"[library]
package = "softmax-stand-in"
archs = ["sm_90a", "sm_100a"]
cuda-builds = ["cu129", "cu130"]
torch = "none"
flags = ["-lineinfo"]

[kernels.soft_max]
sources = ["ggml/softmax.cu"]
entries = ["soft_max<float>"]
compiler = "nvcc"

[kernels.soft_max_nvrtc]
sources = ["ggml/softmax.cu"]
entries = ["soft_max<float>"]
compiler = "nvrtc"
cuda-builds = ["cu129"]
"#;
    let dir = tempfile::tempdir().unwrap();
    let build = |folder: &str, stamp: u64| {
        let root = dir.path().join(folder);
        let manifest = write_library(&root, manifest, &[("ggml/softmax.cu", SOFTMAX_STAND_IN)]);
        testkit::tree::stamp(&root, stamp);
        let out = root.join("out");
        let summary = bundle_kernels(&options(
            &manifest,
            &out,
            &root.join("cache"),
            toolchains.clone(),
        ))
        .unwrap();
        assert!(summary.failed().is_empty(), "{:?}", summary.failed());
        assert_eq!((summary.compiled().len(), summary.cached()), (6, 0));
        out
    };
    let first = build("checkout", 978_307_200); // 2001-01-01
    let second = build("elsewhere/deeper/checkout-2", 1_796_149_005); // 2026-12-01
    assert_eq!(
        testkit::tree::bytes(&first),
        testkit::tree::bytes(&second),
        "two cold builds differ"
    );
    // The pattern is there: internal symbols, and line tables (two for sm_100a) with times.
    let bundle = Bundle::open(&first).unwrap();
    for (kernel, record) in &bundle.index().kernels {
        for variant in &record.variants {
            let cubin = bundle.read_artifact(kernel, variant).unwrap();
            let what = format!("{kernel} {}", variant.label());
            let holds = |name: &[u8]| cubin.windows(name.len()).any(|window| window == name);
            assert!(holds(b"_INTERNAL_"), "{what}: no internal symbol");
            let sm_100a = variant.arch.to_string() == "sm_100a";
            assert_eq!(holds(b".nv.merc.debug_line"), sm_100a, "{what}");
            let times = prebuilt::compile::lines::file_times(&cubin);
            assert!(!times.is_empty(), "{what}");
            assert!(times.iter().all(|&time| time == 0), "{what}: {times:?}");
        }
    }
}

#[test]
fn editing_a_shared_header_recompiles_exactly_its_includers() {
    let Some(toolchains) = toolchains() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let manifest = copy_library(dir.path());
    let cache = dir.path().join("cache");
    let out = dir.path().join("bundle");
    let first = bundle_kernels(&options(&manifest, &out, &cache, toolchains.clone())).unwrap();
    let header = "include/af3/activations.cuh";
    let includers: BTreeSet<String> = first
        .index
        .kernels
        .iter()
        .filter(|(_, record)| record.inputs.files.contains_key(header))
        .map(|(name, _)| name.clone())
        .collect();
    assert_eq!(
        includers,
        BTreeSet::from([
            "sigmoid_gate".to_owned(),
            "sigmoid_gate_backward".to_owned(),
            "swiglu".to_owned()
        ]),
        "the library's include structure changed; update this test"
    );
    let path = manifest.parent().unwrap().join(header);
    // Rewriting a file with the same bytes (a new mtime, as a checkout or `touch` gives)
    // changes no key.
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::write(&path, std::fs::read(&path).unwrap()).unwrap();
    let touched = bundle_kernels(&options(&manifest, &out, &cache, toolchains.clone())).unwrap();
    assert!(touched.compiled().is_empty(), "{:?}", touched.compiled());
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str("\n// an edit that changes no code, but changes the key\n");
    std::fs::write(&path, text).unwrap();

    let second = bundle_kernels(&options(&manifest, &out, &cache, toolchains)).unwrap();
    let recompiled: BTreeSet<String> = second
        .compiled()
        .iter()
        .map(|(k, _, _)| k.clone())
        .collect();
    assert_eq!(recompiled, includers);
    // Each includer is rebuilt for all eight targets (four archs, two builds); nothing else is.
    assert_eq!(second.compiled().len(), 8 * includers.len());
}

#[test]
fn scanned_includes_are_a_superset_of_nvcc_dependencies() {
    let Some(toolchains) = toolchains() else {
        return;
    };
    let Some(build) = default_build() else { return };
    let nvcc = cu130_nvcc();
    drop(toolchains);
    let kernels_dir = workspace().join("kernels").canonicalize().unwrap();
    let manifest = bundler::Manifest::load(&default_manifest()).unwrap();
    for (name, spec) in &manifest.kernels {
        let mut command = std::process::Command::new(&nvcc);
        command.arg("-M").arg("-arch=sm_90a").arg("-std=c++17");
        for dir in manifest.include_dirs_of(spec) {
            command.arg(format!("-I{}", dir.display()));
        }
        for (define, value) in manifest.defines_of(spec) {
            command.arg(format!("-D{define}={value}"));
        }
        command.arg(manifest.root.join(&spec.sources[0]));
        let nvcc_files: BTreeSet<String> = nvcc_dependencies(&mut command)
            .into_iter()
            .filter_map(|path| {
                path.strip_prefix(&kernels_dir)
                    .ok()
                    .map(|p| p.to_string_lossy().into_owned())
            })
            .collect();
        assert!(
            !nvcc_files.is_empty(),
            "{name}: nvcc -M listed no library file"
        );
        let ours: BTreeSet<String> = build.summary.index.kernels[name]
            .inputs
            .files
            .keys()
            .cloned()
            .collect();
        let missing: Vec<&String> = nvcc_files.difference(&ours).collect();
        assert!(
            missing.is_empty(),
            "{name}: nvcc -M lists {missing:?} that the scanner missed"
        );
    }
}

#[test]
fn only_builds_a_subset_and_unknown_names_are_errors() {
    let Some((_dir, mut opts, _)) = from_default_build() else {
        return;
    };
    opts.only = vec!["swiglu".into(), "sigmoid_gate".into()];
    let summary = bundle_kernels(&opts).unwrap();
    let names: Vec<&String> = summary.index.kernels.keys().collect();
    assert_eq!(names, ["sigmoid_gate", "swiglu"]);
    assert!(summary.compiled().is_empty(), "served by the shared cache");

    opts.only = vec!["no_such_kernel".into()];
    let error = bundle_kernels(&opts).unwrap_err().to_string();
    assert!(error.contains("no kernel `no_such_kernel`"), "{error}");
    assert!(
        error.contains("layernorm_bf16"),
        "lists the known kernels: {error}"
    );
}

#[test]
fn require_turns_a_declared_skip_into_an_error() {
    let Some((dir, mut opts, _)) = from_default_build() else {
        return;
    };
    opts.require = true;
    opts.only = vec!["wgmma_matmul_bf16".into()];
    let error = bundle_kernels(&opts).unwrap_err().to_string();
    assert!(
        error.contains("`wgmma_matmul_bf16` cannot be built for sm_100a"),
        "{error}"
    );
    assert!(error.contains("--require"), "{error}");
    assert!(
        !dir.path().join("bundle").exists(),
        "nothing is written on error"
    );
}

#[test]
fn torch_pin_override_changes_keys_and_the_index() {
    let Some((_dir, mut opts, build)) = from_default_build() else {
        return;
    };
    opts.torch = Some("2.11.*".into());
    opts.only = vec!["swiglu".into()];
    let summary = bundle_kernels(&opts).unwrap();
    assert_eq!(summary.index.torch, "2.11.*");
    let old = &build.summary.index.kernels["swiglu"].variants[0];
    let new = &summary.index.kernels["swiglu"].variants[0];
    assert_eq!(new.torch, "2.11.*");
    assert_ne!(old.key, new.key);
    // Same code: the cubin itself is identical, so it is stored once either way.
    assert_eq!(old.artifact.digest, new.artifact.digest);
}

// ---- bad input -------------------------------------------------------------------------

fn write_library(dir: &Path, manifest: &str, files: &[(&str, &str)]) -> PathBuf {
    for (path, text) in files {
        let path = dir.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    let path = dir.join("kernels.toml");
    std::fs::write(&path, manifest).unwrap();
    path
}

/// A library's `[library]` table for sm_90a and sm_100a with both CUDA builds and the torch
/// pin, then `rest`: further library keys, then its kernels.
fn matrix_library(package: &str, rest: &str) -> String {
    format!(
        "[library]\npackage = \"{package}\"\narchs = [\"sm_90a\", \"sm_100a\"]\n\
         cuda-builds = [\"cu129\", \"cu130\"]\ntorch = \"2.13.*\"\n{rest}"
    )
}

/// One kernel, `add`, whose source includes `tiny/common.cuh` from the include dir.
fn small_manifest() -> String {
    matrix_library(
        "tiny",
        "include-dirs = [\"include\"]\n\n[kernels.add]\nsources = [\"add.cu\"]\nentries = [\"add\"]\n",
    )
}

/// `text` loaded as a library's manifest from a fresh folder: the manifest's path (which the
/// messages name) and the manifest, or the error's text.
fn load_manifest(text: &str) -> (PathBuf, Result<bundler::Manifest, String>) {
    let dir = tempfile::tempdir().unwrap();
    let path = write_library(dir.path(), text, &[]);
    let loaded = bundler::Manifest::load(&path).map_err(|error| error.to_string());
    (path, loaded)
}

/// A library of `manifest` and `files` in a fresh folder: the folder and the manifest.
fn library_in(manifest: &str, files: &[(&str, &str)]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let manifest = write_library(dir.path(), manifest, files);
    (dir, manifest)
}

const ADD_KERNEL: &str = r#"#include "tiny/common.cuh"
extern "C" __global__ void add(float* out, const float* in, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = twice(in[i]);
}
"#;

const COMMON_HEADER: &str =
    "#pragma once\n__device__ inline float twice(float x) { return 2.0f * x; }\n";

#[test]
fn manifest_syntax_error_names_file_line_and_column() {
    let (manifest, loaded) = load_manifest("[library]\npackage = \"tiny\"\narchs = [\"sm_90a\"\n");
    let error = loaded.unwrap_err();
    let expected_prefix = format!("{}:", manifest.display());
    assert!(error.starts_with(&expected_prefix), "{error}");
    assert!(
        error.contains(":4:") || error.contains(":3:"),
        "line in {error}"
    );
}

/// Include paths given as compiler flags are read by nvcc but not by the include scanner, so
/// the headers found there would escape the key: the manifest refuses them by name.
#[test]
fn include_dirs_in_flags_are_refused_naming_the_key_and_the_flag() {
    let cases = [
        (
            "nvcc-flags = [\"-Ithird_party/cutlass/include\"]",
            "`nvcc-flags` holds `-Ithird_party",
        ),
        (
            "nvcc-flags = [\"-isystem\", \"/opt/x\"]",
            "`nvcc-flags` holds `-isystem`",
        ),
        (
            "flags = [\"--include-path=inc\"]",
            "`flags` holds `--include-path=inc`",
        ),
        (
            "nvcc-flags = [\"-include\", \"pre.h\"]",
            "`nvcc-flags` holds `-include`",
        ),
        (
            "nvcc-flags = [\"--pre-include=pre.h\"]",
            "`nvcc-flags` holds `--pre-include=pre.h`",
        ),
        (
            "nvcc-flags = [\"-idirafter/x\"]",
            "`nvcc-flags` holds `-idirafter/x`",
        ),
        (
            "nvcc-flags = [\"-Xcompiler=-O2,-I/x\"]",
            "`nvcc-flags` holds `-Xcompiler=-O2,-I/x`",
        ),
        (
            "nvrtc-flags = [\"--system-include=/x\"]",
            "`nvrtc-flags` holds `--system-include=/x`",
        ),
    ];
    for (line, expected) in cases {
        let text = small_manifest().replace(
            "entries = [\"add\"]",
            &format!("entries = [\"add\"]\n{line}"),
        );
        let error = load_manifest(&text).1.unwrap_err();
        assert!(error.contains("(kernel `add`)"), "{line}: {error}");
        assert!(error.contains(expected), "{line}: {error}");
        assert!(error.contains("`include-dirs`"), "{line}: {error}");
        // The same at library level.
        let text = small_manifest().replace(
            "include-dirs = [\"include\"]",
            &format!("include-dirs = [\"include\"]\n{line}"),
        );
        let error = load_manifest(&text).1.unwrap_err();
        assert!(
            error.contains(expected) && !error.contains("(kernel"),
            "{line}: {error}"
        );
    }
    // Flags that only look alike pass.
    let text = small_manifest().replace(
        "entries = [\"add\"]",
        "entries = [\"add\"]\nnvcc-flags = [\"-Xptxas=-v\", \"--use_fast_math\", \"-lineinfo\"]",
    );
    load_manifest(&text).1.unwrap();
}

/// A torch pin is a PEP 440 specifier set, checked when the manifest is read.
#[test]
fn torch_pins_are_checked_when_the_manifest_is_read() {
    for pin in [">=2.9", "~=2.11", "==2.11.*", "2.13.*", ">=2.11,<2.14"] {
        let text = small_manifest().replace("torch = \"2.13.*\"", &format!("torch = \"{pin}\""));
        let manifest = load_manifest(&text)
            .1
            .unwrap_or_else(|error| panic!("{pin}: {error}"));
        assert_eq!(manifest.library.torch, pin);
    }
    for pin in ["latest", "=>2.9", ">=", "2.x"] {
        let text = small_manifest().replace("torch = \"2.13.*\"", &format!("torch = \"{pin}\""));
        let error = load_manifest(&text).1.unwrap_err();
        assert!(
            error.contains(&format!("`torch`: invalid torch pin `{pin}`")),
            "{error}"
        );
    }
}

#[test]
fn unknown_manifest_key_names_line_and_column() {
    let text = small_manifest().replace(
        "entries = [\"add\"]",
        "entries = [\"add\"]\nentry-points = [\"x\"]",
    );
    let (manifest, loaded) = load_manifest(&text);
    let error = loaded.unwrap_err();
    assert!(error.contains("entry-points"), "{error}");
    assert!(
        error.contains(&format!("{}:", manifest.display())),
        "{error}"
    );
    let line = text
        .lines()
        .position(|l| l.starts_with("entry-points"))
        .unwrap()
        + 1;
    assert!(
        error.contains(&format!(":{line}:")),
        "line {line} in {error}"
    );
}

/// `requires` conditions are parsed and type-checked when the manifest is read: a fault is
/// an error naming the manifest, the condition's own line, the kernel and the condition; a
/// kernel that declares them carries them, as the index records them.
#[test]
fn requirements_are_checked_when_the_manifest_is_read_naming_their_line() {
    let with = |requires: &str| {
        small_manifest().replace(
            "entries = [\"add\"]",
            &format!(
                "entries = [\"add\"]\nconstants = {{ BLOCK = 128, SCALE = 0.5 }}\n\
                 inputs = [\"n\", \"packed\"]\nrequires = [\n{requires}]"
            ),
        )
    };
    let good = with(
        "  { when = \"n % BLOCK == 0\", reason = \"n must be a multiple of BLOCK\" },\n  \
         { when = \"not packed or n <= 8192\" },\n",
    );
    let manifest = load_manifest(&good).1.unwrap();
    let requirements = bundler::Manifest::requirements_of(&manifest.kernels["add"]);
    assert_eq!(requirements.inputs, ["n", "packed"]);
    assert_eq!(requirements.rules[1].when, "not packed or n <= 8192");
    assert_eq!(
        requirements.rules[0].reason.as_deref(),
        Some("n must be a multiple of BLOCK")
    );
    for (rule, message) in [
        (
            "{ when = \"n % BLOCKS == 0\" }",
            "requirement 2 `n % BLOCKS == 0`: unknown name `BLOCKS`: it is neither an input (`n`, \
             `packed`) nor an integer or boolean constant of the kernel (`BLOCK`)",
        ),
        (
            "{ when = \"packed + 1 > 0\" }",
            "requirement 2 `packed + 1 > 0`: the input `packed` (by an earlier use) is a \
             boolean, where an integer is needed",
        ),
        (
            "{ when = \"n * SCALE > 1\" }",
            "requirement 2 `n * SCALE > 1`: the constant `SCALE` is a floating-point number",
        ),
        (
            "{ when = \"n + 1\" }",
            "a `+` is an integer, where a boolean is needed",
        ),
        (
            "{ when = \"n > 0\", reason = \" \" }",
            "its `reason` is empty",
        ),
        (
            "{ when = \"BLOCK > 256\" }",
            "requirement 2 `BLOCK > 256`: it is false whatever the inputs",
        ),
        (
            "{ when = \"n % (BLOCK - 128) == 0\" }",
            "requirement 2 `n % (BLOCK - 128) == 0`: its `%` divides by zero whatever the inputs",
        ),
    ] {
        let text = with(&format!("  {{ when = \"not packed\" }},\n  {rule},\n"));
        let (path, loaded) = load_manifest(&text);
        let error = loaded.unwrap_err();
        let line = text.lines().position(|l| l.contains(rule)).unwrap() + 1;
        assert!(
            error.starts_with(&format!(
                "{}:{line}: invalid manifest (kernel `add`): ",
                path.display()
            )),
            "line {line}: {error}"
        );
        assert!(error.contains(message), "{error}");
    }
    let unknown_key = with("  { when = \"n > 0\", why = \"x\" },\n");
    assert!(load_manifest(&unknown_key).1.unwrap_err().contains("why"));
    // A fault in `inputs` names the `inputs` line, not the kernel's header.
    let twice = with("").replace("[\"n\", \"packed\"]", "[\"n\", \"n\"]");
    let inputs_line = twice
        .lines()
        .position(|l| l.starts_with("inputs ="))
        .unwrap()
        + 1;
    let (path, loaded) = load_manifest(&twice);
    assert_eq!(
        loaded.unwrap_err(),
        format!(
            "{}:{inputs_line}: invalid manifest (kernel `add`): `inputs`: `n` is listed twice",
            path.display()
        )
    );
    let reserved = with("").replace("[\"n\", \"packed\"]", "[\"n\", \"device\"]");
    assert!(load_manifest(&reserved)
        .1
        .unwrap_err()
        .contains("`device` cannot be an input"));
}

#[test]
fn invalid_arch_in_manifest_is_refused() {
    let text = small_manifest().replace("\"sm_100a\"]", "\"sm100a\"]");
    let error = load_manifest(&text).1.unwrap_err();
    assert!(
        error.contains("`sm100a` is not a valid architecture"),
        "{error}"
    );
}

#[test]
fn missing_header_names_the_include_chain() {
    let Some(toolchains) = toolchains() else {
        return;
    };
    let (dir, manifest) = library_in(
        &small_manifest(),
        &[
            ("add.cu", ADD_KERNEL),
            (
                "include/tiny/common.cuh",
                "#pragma once\n#include \"tiny/helpers.cuh\"\n",
            ),
        ],
    );
    let error = bundle_kernels(&options_in(dir.path(), &manifest, toolchains)).unwrap_err();
    let text = format!("{:#}", anyhow_like(&error));
    assert!(text.contains("`add`"), "{text}");
    assert!(text.contains("tiny/helpers.cuh"), "{text}");
    assert!(text.contains("add.cu"), "{text}");
    assert!(text.contains("include/tiny/common.cuh"), "{text}");
    assert!(!dir.path().join("out").exists());
}

#[test]
fn an_include_dir_that_does_not_exist_is_an_error_naming_it() {
    let Some(toolchains) = toolchains() else {
        return;
    };
    let manifest = small_manifest().replace(
        "include-dirs = [\"include\"]",
        "include-dirs = [\"include\", \"third_party/cutlass/include\"]",
    );
    let (dir, manifest) = library_in(
        &manifest,
        &[
            ("add.cu", ADD_KERNEL),
            ("include/tiny/common.cuh", "#pragma once\n"),
        ],
    );
    let error = bundle_kernels(&options_in(dir.path(), &manifest, toolchains)).unwrap_err();
    let text = anyhow_like(&error);
    assert!(
        text.contains("`add`")
            && text.contains("include-dirs")
            && text.contains("third_party/cutlass/include")
            && text.contains("not a folder"),
        "{text}"
    );
    assert!(!dir.path().join("out").exists());
}

#[test]
fn computed_include_is_refused_with_its_location() {
    let Some(toolchains) = toolchains() else {
        return;
    };
    let (dir, manifest) = small_library(&format!(
        "#define HEADER \"tiny/common.cuh\"\n#include HEADER\n{ADD_KERNEL}"
    ));
    let error = bundle_kernels(&options_in(dir.path(), &manifest, toolchains)).unwrap_err();
    let text = anyhow_like(&error);
    assert!(text.contains("add.cu:2"), "{text}");
    assert!(text.contains("HEADER"), "{text}");
}

#[test]
fn compile_error_shows_the_log_with_kernel_arch_and_build() {
    let Some(toolchains) = toolchains() else {
        return;
    };
    let (dir, manifest) =
        small_library(&ADD_KERNEL.replace("twice(in[i])", "undeclared_function(in[i])"));
    for toolchain in toolchains {
        let build = toolchain.build;
        let mut opts = options_in(dir.path(), &manifest, vec![toolchain]);
        let text = std::fs::read_to_string(&manifest)
            .unwrap()
            .replace("[\"cu129\", \"cu130\"]", &format!("[\"{build}\"]"));
        std::fs::write(&manifest, text).unwrap();
        opts.jobs = 1;
        let error = bundle_kernels(&opts).unwrap_err();
        let text = anyhow_like(&error);
        assert!(text.contains("`add`"), "{text}");
        assert!(
            text.contains("sm_90a") || text.contains("sm_100a"),
            "{text}"
        );
        assert!(text.contains(&build.to_string()), "{text}");
        assert!(
            text.contains("undeclared_function"),
            "the compiler's log: {text}"
        );
        assert!(!dir.path().join("out").exists());
        let text = std::fs::read_to_string(&manifest)
            .unwrap()
            .replace(&format!("[\"{build}\"]"), "[\"cu129\", \"cu130\"]");
        std::fs::write(&manifest, text).unwrap();
    }
}

#[test]
fn missing_toolchain_names_the_build_and_the_install_command() {
    let dir = tempfile::tempdir().unwrap();
    let error =
        bundler::toolchain::discover_at("cu129".parse().unwrap(), &dir.path().join("nothing"))
            .unwrap_err()
            .to_string();
    assert!(error.contains("cu129"), "{error}");
    assert!(error.contains("ci/setup"), "{error}");
}

#[test]
fn precompiled_cubins_are_validated_keyed_by_content_and_bundled() {
    let fixtures = workspace().join("prebuilt/tests/fixtures/cubin");
    let dir = tempfile::tempdir().unwrap();
    let mut cubins = Vec::new();
    for entry in std::fs::read_dir(&fixtures).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "cubin") {
            cubins.push(path);
        }
    }
    cubins.sort();
    let pick = |needle: &str| {
        cubins
            .iter()
            .find(|p| p.file_name().unwrap().to_string_lossy().contains(needle))
            .unwrap_or_else(|| panic!("no fixture matching {needle} in {cubins:?}"))
            .clone()
    };
    let sm90 = pick("sm_90a");
    std::fs::copy(&sm90, dir.path().join("vendor.cubin")).unwrap();
    let info = prebuilt::cubin::inspect_cubin(&std::fs::read(&sm90).unwrap()).unwrap();
    let entry = info.functions[0].symbol.clone();
    let manifest = write_library(
        dir.path(),
        &format!(
            r#"
[library]
package = "vendor"
archs = ["sm_90a", "sm_100a"]
cuda-builds = ["cu130"]
torch = "2.13.*"

[kernels.vendor]
entries = ["{entry}"]
cubins = [{{ arch = "sm_90a", cuda = "cu130", path = "vendor.cubin" }}]
"#
        ),
        &[],
    );
    let out = dir.path().join("out");
    let summary =
        bundle_kernels(&options(&manifest, &out, &dir.path().join("c"), Vec::new())).unwrap();
    let record = &summary.index.kernels["vendor"];
    assert_eq!(record.variants.len(), 1);
    assert_eq!(record.variants[0].compiler.kind, "cubin");
    assert_eq!(record.skipped.len(), 1, "sm_100a has no cubin listed");
    let bundle = Bundle::open(&out).unwrap();
    assert_eq!(
        bundle.read_artifact("vendor", &record.variants[0]).unwrap(),
        std::fs::read(&sm90).unwrap()
    );

    // A cubin listed for the wrong arch fails validation, naming kernel, arch and build.
    let wrong = manifest.parent().unwrap().join("kernels.toml");
    let text = std::fs::read_to_string(&wrong)
        .unwrap()
        .replace("arch = \"sm_90a\", cuda", "arch = \"sm_100a\", cuda");
    std::fs::write(&wrong, text).unwrap();
    let error = bundle_kernels(&options(
        &manifest,
        &dir.path().join("out2"),
        &dir.path().join("c"),
        Vec::new(),
    ))
    .unwrap_err();
    let text = anyhow_like(&error);
    assert!(
        text.contains("`vendor`") && text.contains("sm_100a") && text.contains("cu130"),
        "{text}"
    );
}

/// The small library in a fresh folder with `add_cu` as its kernel's source, beside its common
/// header: the folder and the manifest.
fn small_library(add_cu: &str) -> (tempfile::TempDir, PathBuf) {
    library_in(
        &small_manifest(),
        &[
            ("add.cu", add_cu),
            ("include/tiny/common.cuh", COMMON_HEADER),
        ],
    )
}

/// An error with its whole source chain, as the CLI prints it.
fn anyhow_like(error: &Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

// ---- the scheduler, with a fake compiler -----------------------------------------------

/// Compiles by copying a real cubin, counting calls and the largest number in flight.
struct FakeCompiler {
    id: CompilerId,
    cubin: Vec<u8>,
    calls: Mutex<Vec<String>>,
    in_flight: std::sync::atomic::AtomicUsize,
    max_in_flight: std::sync::atomic::AtomicUsize,
}

impl Compiler for FakeCompiler {
    fn id(&self) -> &CompilerId {
        &self.id
    }

    fn compile(&self, request: &CompileRequest<'_>) -> Result<CompileOutput, CompileError> {
        use std::sync::atomic::Ordering;
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        std::thread::sleep(std::time::Duration::from_millis(50));
        self.calls
            .lock()
            .unwrap()
            .push(format!("{} {}", request.kernel, request.job.arch));
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        Ok(CompileOutput {
            cubin: self.cubin.clone(),
            log: String::new(),
            lowered_names: BTreeMap::new(),
        })
    }
}

#[test]
fn jobs_run_in_parallel_up_to_the_limit_and_hit_the_cache_after() {
    let library = fake_library(8);
    let fake = &library.fake;
    let mut opts = library.options("jobs");
    opts.jobs = 3;
    let summary = bundle_kernels(&opts).unwrap();
    assert_eq!(summary.compiled().len(), 8);
    assert_eq!(fake.calls.lock().unwrap().len(), 8);
    assert_eq!(
        fake.max_in_flight.load(std::sync::atomic::Ordering::SeqCst),
        3
    );
    // Eight kernels with one identical cubin: stored once.
    let bundle = testkit::tree::bytes(&opts.out);
    assert_eq!(
        bundle
            .keys()
            .filter(|k| k.starts_with("artifacts/"))
            .count(),
        1
    );

    let again = bundle_kernels(&opts).unwrap();
    assert!(again.compiled().is_empty());
    assert_eq!(
        fake.calls.lock().unwrap().len(),
        8,
        "the second run compiled nothing"
    );
    let _ = Arch {
        sm: 90,
        kind: prebuilt::ArchKind::Specific,
    };
}

// ---- many machines: shards, and the remote cache ------------------------------------------
//
// The fault cases run against the fault-injecting loopback store of
// `testkit::loopback_store`; `remote_cache_on_a_real_server_*` runs against
// the server `.ci/run` starts (nginx with WebDAV `PUT`), named by `KWHEEL_TEST_STORE`, and is
// skipped without it unless `KWHEEL_REQUIRE_STORE=1`.

use bundler::progress::Silent;
use bundler::remote::RemoteCacheOptions;
use bundler::shard::{merge_shards, Shard, SharedBuild};
use testkit::loopback_store::{Fault, LoopbackStore};

mod remote_identity;

/// A fake library of `count` kernels that all compile (by copying) to one real sm_90a cubin.
struct FakeLibrary {
    dir: tempfile::TempDir,
    manifest: PathBuf,
    fake: Arc<FakeCompiler>,
    cubin: Vec<u8>,
}

fn fake_library(count: usize) -> FakeLibrary {
    let fixtures = workspace().join("prebuilt/tests/fixtures/cubin");
    let cubin = std::fs::read(fixtures.join("nvcc130_sm_90a.cubin")).unwrap();
    let entry = prebuilt::cubin::inspect_cubin(&cubin).unwrap().functions[0]
        .symbol
        .clone();
    let dir = tempfile::tempdir().unwrap();
    let mut manifest_text = "[library]\npackage = \"fake\"\narchs = [\"sm_90a\"]\ncuda-builds = [\"cu130\"]\ntorch = \"2.13.*\"\n".to_owned();
    let mut files = Vec::new();
    for n in 0..count {
        manifest_text.push_str(&format!(
            "[kernels.k{n}]\nsources = [\"k{n}.cu\"]\nentries = [\"{entry}\"]\n"
        ));
        files.push((format!("k{n}.cu"), format!("// kernel {n}\n")));
    }
    let file_refs: Vec<(&str, &str)> = files
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    let manifest = write_library(dir.path(), &manifest_text, &file_refs);
    let fake = Arc::new(FakeCompiler {
        id: CompilerId {
            kind: CompilerKind::Nvcc,
            version: "13.0.88".into(),
        },
        cubin: cubin.clone(),
        calls: Mutex::new(Vec::new()),
        in_flight: 0.into(),
        max_in_flight: 0.into(),
    });
    FakeLibrary {
        dir,
        manifest,
        fake,
        cubin,
    }
}

impl FakeLibrary {
    fn options(&self, name: &str) -> BundleOptions {
        let toolchain = BuildToolchain {
            build: "cu130".parse().unwrap(),
            compiler: self.fake.clone(),
            supported_sms: BTreeSet::from([90, 100]),
            include_dirs: Vec::new(),
            nvcc_route: None,
        };
        options(
            &self.manifest,
            &self.dir.path().join(name).join("out"),
            &self.dir.path().join(name).join("cache"),
            vec![toolchain],
        )
    }

    fn calls(&self) -> usize {
        self.fake.calls.lock().unwrap().len()
    }
}

/// Remote-cache options with short timeouts, for the loopback store.
fn quick_remote(url: &str) -> RemoteCacheOptions {
    let mut options = RemoteCacheOptions::new(url);
    options.store.timeout = std::time::Duration::from_millis(300);
    options.store.connect_timeout = std::time::Duration::from_millis(300);
    options.store.backoff = std::time::Duration::from_millis(10);
    options.store.token = None;
    options
}

fn remote(url: &str) -> SharedBuild {
    SharedBuild {
        shard: None,
        remote_cache: Some(quick_remote(url)),
    }
}

/// Every local build-cache entry is a whole cubin equal to `cubin`: nothing partial, nothing
/// unverified, no temporary file left.
fn assert_cache_holds_only(cache: &Path, cubin: &[u8]) {
    let files = testkit::tree::bytes(cache);
    assert!(!files.is_empty());
    for (path, bytes) in files {
        assert!(path.ends_with(".cubin"), "{path}");
        assert_eq!(bytes, cubin, "{path}");
    }
}

/// What an observer hears of a build, one line per event (a step's detail left out).
#[derive(Default)]
struct Heard(Mutex<Vec<String>>);

impl bundler::Progress for Heard {
    fn event(&self, event: bundler::Event<'_>) {
        let line = match event {
            bundler::Event::Start { steps, stage } => format!("start {stage} ({steps} steps)"),
            bundler::Event::Stage(stage) => format!("stage {stage}"),
            bundler::Event::Detail(_) => return,
            bundler::Event::Position(done) => format!("position {done}"),
            bundler::Event::Step => "step".to_owned(),
            bundler::Event::Finish => "finish".to_owned(),
        };
        self.0.lock().unwrap().push(line);
    }
}

/// The progress of a build goes to the observer in the options, and only there: the compile
/// jobs, one step each, then the writer's cubins, each piece of work started and finished.
#[test]
fn progress_is_told_to_the_callers_observer() {
    let library = fake_library(3);
    let heard = Arc::new(Heard::default());
    let options = BundleOptions {
        progress: Some(heard.clone()),
        ..library.options("observed")
    };
    bundle_kernels(&options).unwrap();
    let heard = heard.0.lock().unwrap().clone();
    assert_eq!(
        heard[..5],
        ["start targets (3 steps)", "step", "step", "step", "finish"],
        "{heard:?}"
    );
    assert_eq!(heard[5], "start sketching cubins (1 steps)", "{heard:?}");
    assert_eq!(heard.last().unwrap(), "finish", "{heard:?}");
    assert_eq!(
        heard
            .iter()
            .filter(|line| line.starts_with("start"))
            .count(),
        2
    );
}

#[test]
fn shard_specs_are_checked() {
    assert_eq!(
        "2/3".parse::<Shard>().unwrap(),
        Shard { index: 2, count: 3 }
    );
    let error = "3/2".parse::<Shard>().unwrap_err();
    assert_eq!(
        error.to_string(),
        "invalid shard `3/2`: shards count from 1: `i/N` needs 1 ≤ i ≤ N"
    );
}

#[test]
fn fake_shards_merge_into_the_single_build_and_bad_sets_are_refused() {
    let library = fake_library(7);
    let single = bundle_kernels(&library.options("single")).unwrap();
    assert_eq!(single.compiled().len(), 7);
    let mut dirs = Vec::new();
    let mut built = 0;
    for index in 1..=3 {
        let options = library.options(&format!("shard-{index}"));
        let shared = SharedBuild {
            shard: Some(Shard { index, count: 3 }),
            remote_cache: None,
        };
        let summary = bundler::bundle_kernels_shared(&options, &shared).unwrap();
        // Round-robin over 7 sorted keys: 3, 2, 2.
        assert_eq!(summary.compiled().len(), [3, 2, 2][index - 1]);
        built += summary.compiled().len();
        assert!(options.out.join("shard.json").is_file());
        dirs.push(options.out);
    }
    assert_eq!(built, 7);
    let out = library.dir.path().join("merged");
    let merged = merge_shards(
        &[dirs[2].clone(), dirs[0].clone(), dirs[1].clone()],
        &out,
        2,
        &Silent,
    )
    .unwrap();
    assert_eq!(merged.shards, 3);
    assert_eq!(
        testkit::tree::bytes(&out),
        testkit::tree::bytes(&single.out)
    );

    let error = merge_shards(&dirs[..2], &library.dir.path().join("bad"), 2, &Silent).unwrap_err();
    assert_eq!(error.to_string(), "cannot merge shards: shard 3/3 missing");
    let error = merge_shards(
        &[dirs[0].clone(), dirs[0].clone(), dirs[1].clone()],
        &library.dir.path().join("bad"),
        2,
        &Silent,
    )
    .unwrap_err();
    assert!(error.to_string().contains("are both shard 1/3"), "{error}");
    assert!(!library.dir.path().join("bad").exists());
}

#[test]
fn real_shards_merge_into_the_single_machine_bundle_byte_for_byte() {
    let Some(single) = default_build() else {
        return;
    };
    let toolchains = toolchains().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut shards = Vec::new();
    for index in 1..=2 {
        // Shard 1 compiles its share from nothing; shard 2 has a warm cache, as a machine of
        // a CI matrix sharing a remote cache would.
        let cache = if index == 1 {
            dir.path().join("cache-1")
        } else {
            single.cache.clone()
        };
        let out = dir.path().join(format!("shard-{index}"));
        let options = options(&default_manifest(), &out, &cache, toolchains.clone());
        let shared = SharedBuild {
            shard: Some(Shard { index, count: 2 }),
            remote_cache: None,
        };
        let summary = bundler::bundle_kernels_shared(&options, &shared).unwrap();
        assert_eq!(summary.shard, Some(Shard { index, count: 2 }));
        shards.push(out);
    }
    let out = dir.path().join("_prebuilt");
    merge_shards(&shards, &out, 2, &Silent).unwrap();
    let (merged, single) = (
        testkit::tree::bytes(&out),
        testkit::tree::bytes(&single.out),
    );
    assert_eq!(
        merged.keys().collect::<Vec<_>>(),
        single.keys().collect::<Vec<_>>()
    );
    for (path, bytes) in &single {
        assert!(merged[path] == *bytes, "{path} differs");
    }
    // Compressed with a trained dictionary, or against reference cubins (a frame whose prefix
    // is another shipped artifact), the same in both.
    let index = prebuilt::bundle::read_index(&out).unwrap();
    let artifacts = || index.kernels.values().flat_map(|record| &record.variants);
    let digests: std::collections::BTreeSet<&str> =
        artifacts().map(|v| v.artifact.digest.as_str()).collect();
    let referenced = artifacts().any(|variant| {
        (variant.artifact.dictionary.as_deref()).is_some_and(|prefix| digests.contains(prefix))
    });
    assert!(
        merged.keys().any(|path| path == "dictionary.zdict") || referenced,
        "format {}",
        index.format
    );
}

#[test]
fn the_remote_cache_serves_a_second_machine() {
    let store = LoopbackStore::start();
    let library = fake_library(4);
    let first =
        bundler::bundle_kernels_shared(&library.options("one"), &remote(&store.url())).unwrap();
    assert_eq!(first.compiled().len(), 4);
    assert_eq!(first.remote.unwrap().uploads, 4);
    // Each upload: the cubin under its sha256, then the entry under the key.
    let cas = format!("/cas/{}", prebuilt::key::sha256_hex(&library.cubin));
    assert_eq!(store.object(&cas).unwrap(), library.cubin);
    assert_eq!(
        store
            .paths()
            .iter()
            .filter(|p| p.starts_with("/ac/"))
            .count(),
        4
    );

    // Another machine: empty local cache, same remote: nothing compiles.
    let second =
        bundler::bundle_kernels_shared(&library.options("two"), &remote(&store.url())).unwrap();
    assert!(second.compiled().is_empty());
    assert_eq!(second.from_remote(), 4);
    assert_eq!(library.calls(), 4);
    assert_eq!(
        testkit::tree::bytes(&second.out),
        testkit::tree::bytes(&first.out)
    );
    assert_cache_holds_only(&library.dir.path().join("two/cache"), &library.cubin);
}

/// Builds the fake library with a remote cache behind `fault` (after a healthy first build
/// filled it, when `filled`), from an empty local cache: the build must succeed, compiling
/// what the remote could not serve, and leave only whole, valid cubins in the local cache.
fn build_through_fault(
    fault: Fault,
    filled: bool,
    kernels: usize,
) -> (BundleSummary, FakeLibrary, LoopbackStore) {
    let store = LoopbackStore::start();
    let library = fake_library(kernels);
    if filled {
        bundler::bundle_kernels_shared(&library.options("fill"), &remote(&store.url())).unwrap();
    }
    store.fail_always(Some(fault));
    let started = std::time::Instant::now();
    let summary =
        bundler::bundle_kernels_shared(&library.options("faulty"), &remote(&store.url())).unwrap();
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    assert_eq!(
        summary.compiled().len(),
        kernels,
        "everything compiled here"
    );
    assert_eq!(summary.from_remote(), 0);
    assert_cache_holds_only(&library.dir.path().join("faulty/cache"), &library.cubin);
    (summary, library, store)
}

#[test]
fn remote_cache_server_errors_never_fail_the_build() {
    let (summary, _library, store) = build_through_fault(Fault::Status(500), false, 12);
    let stats = summary.remote.unwrap();
    assert_eq!((stats.uploads, stats.skipped_uploads), (0, 12));
    // Reads and uploads stop after three failures in a row (give or take the two jobs in
    // flight), two attempts each: not 12 × 2 × 2 = 48 requests.
    let requests = store.requests().len();
    assert!(
        requests <= (3 + 2) * 2 * 2,
        "{requests}: {:?}",
        store.requests()
    );
}

#[test]
fn remote_cache_507_skips_uploads_with_a_warning() {
    let (summary, _library, store) = build_through_fault(Fault::Status(507), false, 8);
    let stats = summary.remote.unwrap();
    assert_eq!(stats.uploads, 0);
    assert_eq!(stats.skipped_uploads, 8);
    let puts = store
        .requests()
        .iter()
        .filter(|request| request.starts_with("PUT"))
        .count();
    assert!(
        puts <= 2,
        "the first 507 turns uploads off (2 jobs in flight): {puts}"
    );
}

#[test]
fn remote_cache_dropped_connections_and_slow_servers_mean_compiling() {
    build_through_fault(Fault::DropMidBody, true, 4);
    build_through_fault(Fault::Slow(std::time::Duration::from_millis(1200)), true, 4);
}

#[test]
fn remote_cache_wrong_bytes_are_never_used() {
    let store = LoopbackStore::start();
    let library = fake_library(2);
    bundler::bundle_kernels_shared(&library.options("fill"), &remote(&store.url())).unwrap();
    // The entries are intact; the cubin they point to is not.
    let cas = format!("/cas/{}", prebuilt::key::sha256_hex(&library.cubin));
    let mut wrong = library.cubin.clone();
    wrong[100] ^= 1;
    store.insert(&cas, &wrong);
    let summary =
        bundler::bundle_kernels_shared(&library.options("faulty"), &remote(&store.url())).unwrap();
    assert_eq!(summary.compiled().len(), 2);
    assert_eq!(summary.from_remote(), 0);
    assert!(summary.remote.unwrap().warnings >= 2);
    assert_cache_holds_only(&library.dir.path().join("faulty/cache"), &library.cubin);
    // The rebuild repaired the store.
    assert_eq!(store.object(&cas).unwrap(), library.cubin);
}

/// The server `.ci/run` starts, or `None` (skipped) when there is none.
fn test_store() -> Option<String> {
    match std::env::var("KWHEEL_TEST_STORE") {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var("KWHEEL_REQUIRE_STORE").as_deref() == Ok("1") => {
            panic!("KWHEEL_REQUIRE_STORE=1 but KWHEEL_TEST_STORE names no server")
        }
        _ => {
            skipped!("skipped: KWHEEL_TEST_STORE names no server (`.ci/run` starts one)");
            None
        }
    }
}

/// A fresh path prefix on the shared test server, so that runs do not see each other.
fn unique_prefix(url: &str, test: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{url}/{test}-{}-{nanos}", std::process::id())
}

#[test]
fn remote_cache_on_a_real_server_serves_a_second_machine() {
    let Some(url) = test_store() else { return };
    let url = unique_prefix(&url, "remote-cache");
    let library = fake_library(4);
    let first = bundler::bundle_kernels_shared(&library.options("one"), &remote(&url)).unwrap();
    assert_eq!(first.remote.unwrap().uploads, 4, "{url}");
    let second = bundler::bundle_kernels_shared(&library.options("two"), &remote(&url)).unwrap();
    assert!(second.compiled().is_empty());
    assert_eq!(second.from_remote(), 4);
    assert_eq!(
        testkit::tree::bytes(&second.out),
        testkit::tree::bytes(&first.out)
    );
}

/// `cargo test --release -p bundler --test run bench_remote_cache -- --ignored --nocapture`:
/// the default library built cold, then rebuilt on an empty local cache entirely from the
/// remote cache at `KWHEEL_TEST_STORE` (see docs/benchmarks.md).
#[test]
#[ignore = "a benchmark: run it by name with --ignored"]
fn bench_remote_cache_rebuild() {
    let Some(url) = test_store() else { return };
    let Some(toolchains) = toolchains() else {
        return;
    };
    let url = unique_prefix(&url, "bench");
    let dir = tempfile::tempdir().unwrap();
    let build = |name: &str| {
        let options = options(
            &default_manifest(),
            &dir.path().join(name).join("out"),
            &dir.path().join(name).join("cache"),
            toolchains.clone(),
        );
        let shared = SharedBuild {
            shard: None,
            remote_cache: Some(RemoteCacheOptions::new(url.clone())),
        };
        bundler::bundle_kernels_shared(&options, &shared).unwrap()
    };
    let cold = build("cold");
    let warm = build("warm");
    assert_eq!(warm.from_remote(), cold.compiled().len());
    assert!(warm.compiled().is_empty());
    assert_eq!(
        testkit::tree::bytes(&warm.out),
        testkit::tree::bytes(&cold.out)
    );
    println!(
        "| cold build, {} cubins compiled, uploaded | {:.2} s |\n| rebuild on an empty local \
         cache, {} from the remote cache | {:.2} s |",
        cold.compiled().len(),
        cold.elapsed.as_secs_f64(),
        warm.from_remote(),
        warm.elapsed.as_secs_f64()
    );
}

// ---- real libraries: host code, failures that do not abort, entries as C++ spells them ----

/// Where `ci/setup-thirdparty` puts third-party headers, or `None` (printing why) when it has
/// not run; with `KWHEEL_REQUIRE_TOOLCHAINS=1` (CI) their absence fails the test.
fn thirdparty(test: &str, name: &str) -> Option<PathBuf> {
    let dir = thirdparty_root().join(name).join("include");
    if dir.is_dir() {
        return Some(dir);
    }
    if testkit::required() {
        panic!("{} missing: run `ci/setup-thirdparty`", dir.display());
    }
    eprintln!(
        "SKIPPED: {test}: {} missing (run `ci/setup-thirdparty`)",
        dir.display()
    );
    None
}

#[test]
fn flashinfer_activation_norm_and_quantization_build_for_the_whole_matrix() {
    let test = "flashinfer_activation_norm_and_quantization_build_for_the_whole_matrix";
    let Some(toolchains) = toolchains() else {
        return;
    };
    // Its cuBLASLt and cuRAND headers are the toolchains' (`ci/setup`).
    let Some(flashinfer) = thirdparty(test, "flashinfer-python-0.7.4") else {
        return;
    };
    let fixture = workspace().join("bundler/tests/fixtures/flashinfer");
    let dir = tempfile::tempdir().unwrap();
    for name in ["activation.cu", "norm.cu", "quantization.cu"] {
        std::fs::copy(fixture.join(name), dir.path().join(name)).unwrap();
    }
    let manifest = std::fs::read_to_string(fixture.join("kernels.toml"))
        .unwrap()
        .replace("@FLASHINFER_INCLUDE@", &flashinfer.display().to_string());
    std::fs::write(dir.path().join("kernels.toml"), manifest).unwrap();
    let mut opts = options_in(dir.path(), &dir.path().join("kernels.toml"), toolchains);
    opts.require = true;
    let started = std::time::Instant::now();
    let summary = bundle_kernels(&opts).unwrap_or_else(|error| panic!("{}", anyhow_like(&error)));
    eprintln!("flashinfer: 12 variants in {:?}", started.elapsed());
    assert_eq!(summary.compiled().len(), 12);
    assert!(summary.failed().is_empty());
    let bundle = Bundle::open(&summary.out).unwrap();
    for (name, record) in &bundle.index().kernels {
        let targets: Vec<(String, String)> = record
            .variants
            .iter()
            .map(|v| (v.label(), v.compiler.kind.clone()))
            .collect();
        assert_eq!(
            targets,
            [
                ("cu129/sm_90a".to_owned(), "nvcc+ptxas".to_owned()),
                ("cu129/sm_100a".to_owned(), "nvcc+ptxas".to_owned()),
                ("cu130/sm_90a".to_owned(), "nvcc".to_owned()),
                ("cu130/sm_100a".to_owned(), "nvcc".to_owned()),
            ],
            "{name}"
        );
        for variant in &record.variants {
            // Each cubin validates for its arch with the symbols the compiler named, and a
            // cu129 one is what CUDA 12.9's ptxas writes (ABI 7 for sm_90a, as NVRTC 12.9).
            let info = validate_variant(&bundle, name, variant);
            if variant.label() == "cu129/sm_90a" {
                assert_eq!((info.abi_version, info.elf_flags), (7, 0x5a0d5a), "{name}");
            }
            assert!(
                variant.compiler.version.contains(", host "),
                "{}",
                variant.compiler
            );
        }
    }
    let symbols = |kernel: &str| -> Vec<String> {
        bundle.index().kernels[kernel].variants[0]
            .functions
            .iter()
            .map(|f| f.symbol.clone())
            .collect()
    };
    // A typedef (`floatX` is `half`), a function without and with `&`, `8` and `8u`, an enum.
    assert_eq!(
        symbols("silu_and_mul"),
        [
            "_ZN10flashinfer10activation18act_and_mul_kernelI6__halfXadL_ZN11kwheel_test4siluERKfEELj8EEEvPT_PKS6_i",
            "_ZN10flashinfer10activation18act_and_mul_kernelI13__nv_bfloat16XadL_ZN11kwheel_test9gelu_tanhERKfEELj8EEEvPT_PKS6_i"
        ]
    );
    assert_eq!(
        symbols("rmsnorm"),
        [
            "_ZN10flashinfer4norm13RMSNormKernelILj8E6__halfEEvPT0_S4_S4_jjjff",
            "_ZN10flashinfer4norm21FusedAddRMSNormKernelILj8E13__nv_bfloat16EEvPT0_S4_S4_jjjff"
        ]
    );
    assert_eq!(
        symbols("packbits"),
        ["_ZN10flashinfer12quantization14PackBitsKernelILNS0_8BitOrderE1EEEvPbPhl"]
    );

    // The hashed files are exactly the library files nvcc reads (`nvcc -M`), those reached
    // through toolkit and system headers included.
    let nvcc = cu130_nvcc();
    let library_roots = [
        dir.path().canonicalize().unwrap(),
        flashinfer.canonicalize().unwrap(),
    ];
    for (name, record) in &bundle.index().kernels {
        let recipe = record.recipe.as_ref().unwrap();
        let nvcc_files: BTreeSet<PathBuf> = nvcc_dependencies(
            std::process::Command::new(&nvcc)
                .args(["-M", "-arch=sm_90a", "-std=c++17"])
                .arg(format!("-I{}", flashinfer.display()))
                .arg(dir.path().join(&recipe.source)),
        )
        .into_iter()
        .filter(|path| library_roots.iter().any(|root| path.starts_with(root)))
        .collect();
        let ours: BTreeSet<PathBuf> = record
            .inputs
            .files
            .keys()
            .map(|stable| {
                let path = if let Some(rest) = stable.strip_prefix("[0]/") {
                    flashinfer.join(rest)
                } else {
                    dir.path().join(stable)
                };
                path.canonicalize().unwrap()
            })
            .collect();
        assert!(nvcc_files.len() > 2, "{name}: {nvcc_files:?}");
        assert_eq!(
            ours, nvcc_files,
            "{name}: hashed files differ from nvcc -M's"
        );
    }
}

#[test]
fn a_library_header_reached_through_a_toolkit_header_is_in_the_key() {
    let Some(toolchains) = toolchains() else {
        return;
    };
    // `<cuda/std/utility>` is the toolkit's; it includes `<cuda/std/detail/__config>`, which
    // this library's include dir shadows (as a library vendoring a newer CCCL does).
    let (dir, manifest) = library_in(
        "[library]\npackage = \"shadow\"\narchs = [\"sm_90a\"]\ncuda-builds = [\"cu130\"]\ntorch = \"2.13.*\"\ninclude-dirs = [\"vendor\"]\n[kernels.k]\nsources = [\"k.cu\"]\nentries = [\"k\"]\n",
        &[
            (
                "k.cu",
                "#include <cuda/std/utility>\nextern \"C\" __global__ void k(int* x) { \
                 x[0] = cuda::std::move(x[1]); }\n",
            ),
            (
                "vendor/cuda/std/detail/__config",
                "// the library's own CCCL configuration\n#include_next <cuda/std/detail/__config>\n",
            ),
        ],
    );
    let cu130 = of_build(toolchains, "cu130");
    let manifest_file = bundler::Manifest::load(&manifest).unwrap();
    let spec = &manifest_file.kernels["k"];
    let toolkit: Vec<PathBuf> = cu130[0].include_dirs.clone();
    let plan = |manifest_file: &bundler::Manifest| {
        bundler::pipeline::plan_kernel(manifest_file, "k", spec, &toolkit).unwrap()
    };
    let before = plan(&manifest_file);
    assert!(
        before
            .inputs
            .files
            .contains_key("vendor/cuda/std/detail/__config"),
        "{:?}",
        before.inputs.files.keys().collect::<Vec<_>>()
    );
    // nvcc reads that file too.
    let nvcc = cu130_nvcc();
    let output = std::process::Command::new(&nvcc)
        .args(["-M", "-arch=sm_90a", "-std=c++17"])
        .arg(format!("-I{}", dir.path().join("vendor").display()))
        .arg(dir.path().join("k.cu"))
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("vendor/cuda/std/detail/__config"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let opts = options_in(dir.path(), &manifest, cu130.clone());
    let first = bundle_kernels(&opts).unwrap_or_else(|error| panic!("{}", anyhow_like(&error)));
    assert_eq!(first.compiled().len(), 1);
    std::fs::write(
        dir.path().join("vendor/cuda/std/detail/__config"),
        "// edited\n#include_next <cuda/std/detail/__config>\n",
    )
    .unwrap();
    let second = bundle_kernels(&opts).unwrap();
    assert_eq!(
        second.compiled().len(),
        1,
        "the edit is a new key, so a new compile"
    );
    assert_ne!(
        first.index.kernels["k"].variants[0].key,
        second.index.kernels["k"].variants[0].key
    );
}

/// Three kernels: `fill` builds everywhere, `picky` everywhere but with nvcc for sm_100a,
/// `newest` only with cu130.
fn partly_buildable() -> String {
    matrix_library(
        "partly",
        r#"# nvcc rejects this NVRTC option: it reaches NVRTC only.
nvrtc-flags = ["-default-device"]

[kernels.fill]
sources = ["fill.cu"]
entries = ["fill<floatX, 4>"]

[kernels.picky]
sources = ["picky.cu"]
entries = ["picky"]

[kernels.newest]
sources = ["newest.cu"]
entries = ["newest"]
cuda-builds = ["cu130"]
"#,
    )
}

const FILL_KERNEL: &str = r#"#include <cuda_fp16.h>
template <typename T, int N>
__global__ void fill(T* out) { out[threadIdx.x] = T(N); }
using floatX = half;
"#;

/// Builds everywhere but with nvcc for sm_100a.
const PICKY_KERNEL: &str = r#"
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000 && !defined(__CUDACC_RTC__)
#error "picky: nvcc builds for sm_100 are not supported"
#endif
extern "C" __global__ void picky(float* out) { out[threadIdx.x] = 1.0f; }
"#;

const NEWEST_KERNEL: &str = r#"extern "C" __global__ void newest(float* out) { out[0] = 2.0f; }
"#;

#[test]
fn a_target_that_fails_is_recorded_and_the_rest_is_bundled() {
    let Some(toolchains) = toolchains() else {
        return;
    };
    let (dir, manifest) = library_in(
        &partly_buildable(),
        &[
            ("fill.cu", FILL_KERNEL),
            ("picky.cu", PICKY_KERNEL),
            ("newest.cu", NEWEST_KERNEL),
        ],
    );
    let opts = options_in(dir.path(), &manifest, toolchains);
    let summary = bundle_kernels(&opts).unwrap_or_else(|error| panic!("{}", anyhow_like(&error)));
    assert_eq!(summary.compiled().len(), 9);
    assert_eq!(summary.skipped(), 2, "newest is declared cu130-only");
    let failed: Vec<String> = summary
        .failed()
        .iter()
        .map(|(kernel, build, arch, _)| format!("{kernel} {build} {arch}"))
        .collect();
    assert_eq!(failed, ["picky cu130 sm_100a"]);
    let index = &summary.index;
    let picky = &index.kernels["picky"];
    assert_eq!(picky.variants.len(), 3);
    assert_eq!(picky.skipped.len(), 1);
    let reason = &picky.skipped[0].reason;
    assert!(
        reason.starts_with("failed: failed to compile `picky` for sm_100a (cu130, nvcc 13.0.88):"),
        "{reason}"
    );
    assert!(
        reason.contains("picky: nvcc builds for sm_100 are not supported"),
        "{reason}"
    );
    let newest = &index.kernels["newest"];
    let declared: Vec<String> = newest
        .skipped
        .iter()
        .map(|s| format!("{}/{}: {}", s.cuda, s.arch, s.reason))
        .collect();
    assert_eq!(
        declared,
        [
            "cu129/sm_90a: declared: the kernel builds only with cu130",
            "cu129/sm_100a: declared: the kernel builds only with cu130"
        ]
    );
    // A typedef'd template entry: lowered by NVRTC for cu129, named by nvcc for cu130.
    let fill = &index.kernels["fill"];
    let compilers: Vec<String> = fill
        .variants
        .iter()
        .map(|v| format!("{} {}", v.label(), v.compiler.kind))
        .collect();
    assert_eq!(
        compilers,
        [
            "cu129/sm_90a nvrtc",
            "cu129/sm_100a nvrtc",
            "cu130/sm_90a nvcc",
            "cu130/sm_100a nvcc"
        ]
    );
    for variant in &fill.variants {
        assert_eq!(variant.functions[0].symbol, "_Z4fillI6__halfLi4EEvPT_");
    }

    // The cached rerun reports the same failure (failures are not cached) and nothing else.
    let again = bundle_kernels(&opts).unwrap();
    assert_eq!((again.compiled().len(), again.cached()), (0, 9));
    assert_eq!(again.failed().len(), 1);

    // `require` makes the failure the build's error (as it does a declared skip).
    let mut strict = opts.clone();
    strict.require = true;
    strict.only = vec!["picky".into()];
    let error = bundle_kernels(&strict).unwrap_err();
    let text = anyhow_like(&error);
    assert!(
        text.starts_with("failed to compile `picky` for sm_100a (cu130, nvcc 13.0.88):"),
        "{text}"
    );
}

/// Fails every compile, naming the target.
struct FailingCompiler(CompilerId);

impl Compiler for FailingCompiler {
    fn id(&self) -> &CompilerId {
        &self.0
    }

    fn compile(&self, request: &CompileRequest<'_>) -> Result<CompileOutput, CompileError> {
        Err(CompileError::Failed {
            kernel: request.kernel.to_owned(),
            arch: request.job.arch,
            build: "cu130".parse().unwrap(),
            compiler: self.0.clone(),
            log: "error: nothing compiles here\n".into(),
        })
    }
}

#[test]
fn a_build_that_builds_no_kernel_for_any_target_fails() {
    let (dir, manifest) = library_in(
        "[library]\npackage = \"none\"\narchs = [\"sm_90a\", \"sm_100a\"]\ncuda-builds = [\"cu130\"]\ntorch = \"2.13.*\"\n[kernels.k]\nsources = [\"k.cu\"]\nentries = [\"k\"]\n",
        &[("k.cu", "// k\n")],
    );
    let toolchain = BuildToolchain {
        build: "cu130".parse().unwrap(),
        compiler: Arc::new(FailingCompiler(CompilerId {
            kind: CompilerKind::Nvcc,
            version: "13.0.88".into(),
        })),
        supported_sms: BTreeSet::from([90, 100]),
        include_dirs: Vec::new(),
        nvcc_route: None,
    };
    let opts = options_in(dir.path(), &manifest, vec![toolchain]);
    let error = bundle_kernels(&opts).unwrap_err();
    assert_eq!(
        error.to_string(),
        "`k` was built for no target of the matrix:\n  \
         sm_90a (cu130): failed: failed to compile `k` for sm_90a (cu130, nvcc 13.0.88):\n\
         error: nothing compiles here\n\n  \
         sm_100a (cu130): failed: failed to compile `k` for sm_100a (cu130, nvcc 13.0.88):\n\
         error: nothing compiles here\n"
    );
    assert!(!dir.path().join("out").exists(), "no bundle is written");
}

/// A library of kernels that each compile (by copying) to the fixture cubin of
/// `prebuilt/tests/fixtures/cubin/kernels.cu`, which has `extern "C"` kernels and one C++
/// template instance, `kw_square<float>`; each kernel is `(name, entries)`.
fn fixture_cubin_library(kernels: &[(&str, &str)]) -> (FakeLibrary, BundleOptions) {
    let library = fake_library(0);
    let mut text = std::fs::read_to_string(&library.manifest).unwrap();
    for (name, entries) in kernels {
        text.push_str(&format!(
            "[kernels.{name}]\nsources = [\"{name}.cu\"]\nentries = {entries}\n"
        ));
        std::fs::write(library.dir.path().join(format!("{name}.cu")), "// k\n").unwrap();
    }
    std::fs::write(&library.manifest, text).unwrap();
    let options = library.options("build");
    (library, options)
}

#[test]
fn a_plain_entry_naming_one_cpp_kernel_resolves_to_it() {
    // `kw_square` is a C++ kernel (`_Z9kw_squareIfEvPT_i`), named the way llm.c and ggml
    // manifests name theirs (`gelu_forward`, `soft_max_back_f32`).
    let (_library, options) = fixture_cubin_library(&[("square", r#"["kw_square", "kw_axpy"]"#)]);
    let summary =
        bundle_kernels(&options).unwrap_or_else(|error| panic!("{}", anyhow_like(&error)));
    let square = &summary.index.kernels["square"];
    assert_eq!(square.variants.len(), 1, "{:?}", square.skipped);
    let functions: Vec<(&str, &str)> = square.variants[0]
        .functions
        .iter()
        .map(|function| (function.name.as_str(), function.symbol.as_str()))
        .collect();
    assert_eq!(
        functions,
        [
            ("kw_square", "_Z9kw_squareIfEvPT_i"),
            ("kw_axpy", "kw_axpy")
        ]
    );
}

#[test]
fn a_kernel_whose_entry_names_nothing_does_not_end_the_other_kernels() {
    // ggml's norm kernel builds although its sibling's entry is misspelt.
    let (_library, options) = fixture_cubin_library(&[
        ("norm", r#"["kw_axpy"]"#),
        ("soft_max", r#"["kw_soft_max"]"#),
    ]);
    let summary =
        bundle_kernels(&options).unwrap_or_else(|error| panic!("{}", anyhow_like(&error)));
    let failed: Vec<String> = summary
        .failed()
        .iter()
        .map(|(kernel, build, arch, error)| format!("{kernel} {build} {arch}: {error}"))
        .collect();
    assert_eq!(
        failed,
        [
            "soft_max cu130 sm_90a: cubin of `soft_max` for sm_90a (cu130) has no entry \
          `kw_soft_max` (its entries, as `entries` spells them: kw_square<float>; kw_axpy; \
          kw_empty; kw_large; kw_scalars; kw_structs)"
        ]
    );
    let index = &summary.index;
    assert_eq!(index.kernels["norm"].variants.len(), 1);
    let soft_max = &index.kernels["soft_max"];
    assert!(soft_max.variants.is_empty());
    let skips: Vec<String> = soft_max
        .skipped
        .iter()
        .map(|skip| format!("{}/{}: {}", skip.cuda, skip.arch, skip.reason))
        .collect();
    assert_eq!(skips.len(), 1);
    assert!(
        skips[0].starts_with("cu130/sm_90a: failed: cubin of `soft_max` for sm_90a (cu130) has no entry `kw_soft_max`"),
        "{skips:?}"
    );
    // The bundle on disk has both kernels: the failed one as a recorded skip.
    let bundle = Bundle::open(&summary.out).unwrap();
    assert_eq!(bundle.index().kernels.len(), 2);

    // `--require` makes the failure the build's error.
    let mut strict = options.clone();
    strict.require = true;
    strict.out = options.out.with_file_name("strict");
    strict.cache_dir = options.cache_dir.with_file_name("strict-cache");
    let error = bundle_kernels(&strict).unwrap_err();
    assert!(matches!(error, Error::MissingEntry { .. }), "{error}");
}

/// The shape of ggml's `softmax.cu`: a `static` kernel, and a template kernel its host code
/// launches with two sets of arguments.
const GGML_SOFTMAX: &str = r#"
static __global__ void soft_max_back_f32(const float * grad, const float * dstf, float * dst,
                                         const int ncols, const float scale) {
    const int col = threadIdx.x;
    if (col < ncols) dst[col] = scale * grad[col] * dstf[col];
}
template <bool use_shared, int ncols_template, int block_size_template, typename T>
static __global__ void soft_max_f32(const float * x, const T * mask, float * dst, const int ncols) {
    const int col = threadIdx.x;
    const int n = ncols_template == 0 ? ncols : ncols_template;
    if (col < n) dst[col] = x[col] + (use_shared ? float(mask[col]) : 0.0f);
}
void soft_max_f32_cuda(const float * x, const float * mask, float * dst, int ncols) {
    if (ncols == 32) {
        soft_max_f32<false, 32, 32, float><<<1, 32>>>(x, mask, dst, ncols);
    } else {
        soft_max_f32<true, 0, 0, float><<<1, 1024>>>(x, mask, dst, ncols);
    }
}
"#;

/// The shape of llm.c's GELU: a C++ kernel with external linkage.
const LLMC_GELU: &str = r#"
#define GELU_SCALING_FACTOR 0.7978845608f
__global__ void gelu_forward_kernel2(float* out, const float* inp, int N) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + tanhf(GELU_SCALING_FACTOR * (x + 0.044715f * x * x * x)));
    }
}
"#;

#[test]
fn plain_cpp_entries_of_ggml_and_llmc_resolve_and_an_ambiguous_one_lists_its_kernels() {
    let Some(toolchains) = toolchains() else {
        return;
    };
    let manifest = |soft_max_entry: &str| {
        format!(
            "[library]\npackage = \"ggml-llmc\"\narchs = [\"sm_90a\"]\ncuda-builds = [\"cu130\"]\n\
             torch = \"2.13.*\"\n\n\
             [kernels.soft_max_back]\nsources = [\"softmax.cu\"]\nentries = [\"soft_max_back_f32\"]\n\n\
             [kernels.soft_max]\nsources = [\"softmax.cu\"]\nentries = [\"{soft_max_entry}\"]\n\n\
             [kernels.gelu]\nsources = [\"gelu.cu\"]\nentries = [\"gelu_forward_kernel2\"]\n"
        )
    };
    let (dir, manifest_path) = library_in(
        &manifest("soft_max_f32"),
        &[("softmax.cu", GGML_SOFTMAX), ("gelu.cu", LLMC_GELU)],
    );
    let opts = options_in(dir.path(), &manifest_path, of_build(toolchains, "cu130"));
    let summary = bundle_kernels(&opts).unwrap_or_else(|error| panic!("{}", anyhow_like(&error)));
    let symbols = |summary: &BundleSummary, kernel: &str| -> Vec<String> {
        summary.index.kernels[kernel]
            .variants
            .iter()
            .flat_map(|variant| variant.functions.iter().map(|f| f.symbol.clone()))
            .collect()
    };
    assert_eq!(
        symbols(&summary, "soft_max_back"),
        ["_Z17soft_max_back_f32PKfS0_Pfif"]
    );
    assert_eq!(
        symbols(&summary, "gelu"),
        ["_Z20gelu_forward_kernel2PfPKfi"]
    );
    // Two instances of one template: the plain name is a failed target listing both.
    let failures = summary.failed();
    let failed: Vec<&str> = failures
        .iter()
        .map(|(kernel, _, _, error)| {
            assert_eq!(kernel, "soft_max");
            error.as_str()
        })
        .collect();
    assert_eq!(
        failed,
        [
            "cubin of `soft_max` for sm_90a (cu130) has 2 kernels named `soft_max_f32`, so the \
          plain entry names none of them alone; write the one meant as `entries` takes it: \
          soft_max_f32<false, 32, 32, float>; soft_max_f32<true, 0, 0, float>"
        ]
    );
    assert!(summary.index.kernels["soft_max"].variants.is_empty());

    // Either spelling, pasted, builds.
    std::fs::write(&manifest_path, manifest("soft_max_f32<true, 0, 0, float>")).unwrap();
    let summary = bundle_kernels(&opts).unwrap_or_else(|error| panic!("{}", anyhow_like(&error)));
    assert!(summary.failed().is_empty(), "{:?}", summary.failed());
    assert_eq!(
        symbols(&summary, "soft_max"),
        ["_Z12soft_max_f32ILb1ELi0ELi0EfEvPKfPKT2_Pfi"]
    );
}

#[test]
fn an_unknown_entry_lists_the_candidates_as_entries_spell_them() {
    let Some(toolchains) = toolchains() else {
        return;
    };
    let (dir, manifest) = library_in(
        "[library]\npackage = \"typo\"\narchs = [\"sm_90a\"]\ncuda-builds = [\"cu130\"]\ntorch = \"2.13.*\"\n[kernels.k]\nsources = [\"k.cu\"]\nentries = [\"scale<float>\", \"scale_rows\"]\n",
        &[(
            "k.cu",
            "template <typename T, unsigned N, float (*F)(const float&)>\n\
             __global__ void scale(T* x) { x[0] = F(N); }\n\
             __device__ float twice(const float& v) { return 2 * v; }\n\
             template __global__ void scale<float, 8, twice>(float*);\n",
        )],
    );
    let mut opts = options_in(dir.path(), &manifest, of_build(toolchains, "cu130"));
    opts.require = true;
    let error = bundle_kernels(&opts).unwrap_err();
    let text = anyhow_like(&error);
    // nvcc is asked for `scale<float>` and rejects it, naming the entry.
    assert!(text.contains("entry `scale<float>`"), "{text}");

    let fixed = std::fs::read_to_string(&manifest)
        .unwrap()
        .replace("\"scale<float>\", ", "");
    std::fs::write(&manifest, fixed).unwrap();
    let error = bundle_kernels(&opts).unwrap_err();
    assert_eq!(
        error.to_string(),
        "cubin of `k` for sm_90a (cu130) has no entry `scale_rows` (its entries, as `entries` \
         spells them: scale<float, (unsigned int)8, &twice>)"
    );
}
mod computed;
mod extensions;
mod real;
mod stubs;
mod torch_ext;
