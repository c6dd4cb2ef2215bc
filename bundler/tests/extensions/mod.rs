//! Extension modules (`[extensions.*]`): the manifest's checks, the refusal of host code in a
//! kernel, and a stable-ABI module built with the cu130 nvcc and the host compiler against the
//! cached torch.

use super::*;

/// `small_manifest()` with an extension table of `body` after it.
fn with_extension(body: &str) -> String {
    format!("{}\n[extensions._C]\n{body}\n", small_manifest())
}

#[test]
fn extension_tables_are_checked_when_the_manifest_is_read_naming_the_extension_and_the_key() {
    let good = with_extension(
        "sources = [\"csrc/ops.cpp\", \"csrc/ops.cu\"]\nabi = \"stable\"\n\
         include-dirs = [\"csrc\"]\nnvcc-flags = [\"--expt-relaxed-constexpr\"]\n\
         cxx-flags = [\"-O3\"]\ndefines = { FAST = \"1\" }\narch = [\"sm_90a\"]\n\
         cuda-builds = [\"cu130\"]",
    );
    let manifest = load_manifest(&good).1.unwrap();
    let extension = &manifest.extensions["_C"];
    assert_eq!(extension.sources, ["csrc/ops.cpp", "csrc/ops.cu"]);
    assert_eq!(extension.abi, prebuilt::module::Abi::Stable);
    assert_eq!(extension.defines["FAST"], "1");

    let cases = [
        (
            "sources = []\nabi = \"stable\"",
            "`sources` must list at least one",
        ),
        (
            "sources = [\"../x.cpp\"]\nabi = \"stable\"",
            "`sources` holds `../x.cpp`, which is not inside the library's folder",
        ),
        (
            "sources = [\"ops.h\"]\nabi = \"torch\"",
            "`sources` holds `ops.h`, which is not a translation unit (.cu, .cpp, .cc, .cxx)",
        ),
        (
            "sources = [\"a.cpp\", \"a.cpp\"]\nabi = \"torch\"",
            "`sources` lists `a.cpp` twice",
        ),
        (
            "sources = [\"a.cpp\"]\nabi = \"stable\"\ncxx-flags = [\"-I/usr/include/python3\"]",
            "`cxx-flags` holds `-I/usr/include/python3`",
        ),
        (
            "sources = [\"a.cu\"]\nabi = \"stable\"\nnvcc-flags = [\"-isystem\", \"/x\"]",
            "`nvcc-flags` holds `-isystem`",
        ),
        (
            "sources = [\"a.cpp\"]\nabi = \"stable\"\ndefines = { \"1X\" = \"1\" }",
            "`defines` names `1X`, which must be a C identifier",
        ),
        (
            "sources = [\"a.cu\"]\nabi = \"stable\"\narch = [\"sm_80\"]",
            "`arch` names sm_80, which is not one of the library's `archs`",
        ),
        (
            "sources = [\"a.cu\"]\nabi = \"stable\"\ncuda-builds = [\"cu128\"]",
            "`cuda-builds` names cu128, which is not one of the library's `cuda-builds`",
        ),
    ];
    for (body, expected) in cases {
        let (path, loaded) = load_manifest(&with_extension(body));
        let error = loaded.unwrap_err();
        let line = with_extension(body)
            .lines()
            .position(|line| line == "[extensions._C]")
            .unwrap()
            + 1;
        assert_eq!(
            error,
            format!(
                "{}:{line}: invalid manifest (extension `_C`): {expected}{}",
                path.display(),
                error.split_once(expected).unwrap().1
            ),
            "{body}"
        );
    }
    // A key the table does not take, or an ABI it does not know, is named with its line.
    let error = load_manifest(&with_extension("sources = [\"a.cpp\"]\nabi = \"pybind\""))
        .1
        .unwrap_err();
    assert!(
        error.contains("unknown variant `pybind`, expected `stable` or `torch`"),
        "{error}"
    );
    let error = load_manifest(&with_extension(
        "sources = [\"a.cpp\"]\nabi = \"torch\"\nentries = []",
    ))
    .1
    .unwrap_err();
    assert!(error.contains("unknown field `entries`"), "{error}");
    let error = load_manifest(&with_extension("sources = [\"a.cpp\"]"))
        .1
        .unwrap_err();
    assert!(error.contains("missing field `abi`"), "{error}");
    // Kernels and modules share no name.
    let clash = small_manifest() + "\n[extensions.add]\nsources = [\"a.cpp\"]\nabi = \"torch\"\n";
    let error = load_manifest(&clash).1.unwrap_err();
    assert!(
        error.contains("(extension `add`): `add` names a kernel too"),
        "{error}"
    );
}

/// A kernel whose source registers torch ops or includes `<torch/extension.h>` is refused
/// before anything is compiled, pointing to `[extensions.*]`, instead of a cubin without its
/// host code (or a `Python.h` error from the scan).
#[test]
fn host_code_in_a_kernel_is_refused_pointing_to_extension_modules() {
    for (source, what) in [
        (
            "#include <torch/extension.h>\n__global__ void add() {}\n",
            "includes `<torch/extension.h>`",
        ),
        (
            "__global__ void add() {}\nTORCH_LIBRARY(tiny, m) { m.def(\"add(Tensor x) -> Tensor\"); }\n",
            "registers ops with `TORCH_LIBRARY`",
        ),
    ] {
        let (dir, manifest) = small_library(source);
        let options = BundleOptions {
            toolchains: Some(Vec::new()),
            ..BundleOptions::new(&manifest, &dir.path().join("out"), &dir.path().join("cache"))
        };
        let error = bundle_kernels(&options).unwrap_err();
        assert_eq!(
            error.to_string(),
            format!(
                "kernel `add`: `add.cu` {what}, host code that a cubin cannot hold and kwheel \
                 would drop; build it as an extension module instead: move it to \
                 `[extensions.<name>]` with `sources = [...]` and `abi = \"stable\"` or \
                 `\"torch\"` (docs/extensions.md)"
            )
        );
        assert!(!dir.path().join("out").exists());
    }
}
