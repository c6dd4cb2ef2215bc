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
        (
            "sources = [\"a.cpp\"]\nabi = \"torch\"\ntorch-target = \"2.11\"",
            "`torch-target = \"2.11\"` is for `abi = \"stable\"` only",
        ),
        (
            "sources = [\"a.cpp\"]\nabi = \"stable\"\ntorch-target = \"2.11.0\"",
            "`torch-target = \"2.11.0\"` must be a torch version `MAJOR.MINOR` (`2.11`)",
        ),
        (
            "sources = [\"a.cpp\"]\nabi = \"stable\"\ntorch-target = \"2.14\"",
            "`torch-target = \"2.14\"` is newer than the library's torch pin `2.13.*`",
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

/// The stable-ABI fixture library (`testkit/fixtures/stable_module`) copied into a fresh folder.
fn stable_module_library() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    testkit::copy_tree(
        &workspace().join("testkit/fixtures/stable_module"),
        dir.path(),
        &[],
    );
    let manifest = dir.path().join("kernels.toml");
    (dir, manifest)
}

/// Whether the cu130 nvcc, a host `g++` and the pinned torch are here (else skipped).
fn module_tools() -> bool {
    if toolchains().is_none() {
        return false;
    }
    if bundler::torch::TorchHeaders::find().is_err() {
        return testkit::missing("no torch (`bash ci/setup-torch` installs the pinned one)");
    }
    // The other CPU's compiler and torch, as `ci/setup-aarch64` unpacks them.
    let other = ["x86_64", "aarch64"]
        .into_iter()
        .find(|cpu| *cpu != std::env::consts::ARCH)
        .unwrap();
    let place = bundler::extension::cpu::torch_place(other);
    let env = |name: &str| std::env::var_os(name);
    let cross = bundler::torch::TorchHeaders::find_where(env, place).is_ok()
        && (env(&bundler::extension::cpu::compiler_variable(other)).is_some()
            || prebuilt::cache::cache_home().is_ok_and(|home| {
                home.join(format!("kwheel/cross/{other}/bin/{other}-linux-gnu-g++"))
                    .is_file()
            }));
    if !cross {
        return testkit::missing(&format!(
            "no g++ or torch for {other} (`bash ci/setup-aarch64` unpacks them)"
        ));
    }
    true
}

/// `torch-target`: a library that pins a newer torch (`2.13.*`) than the one at hand (2.11)
/// builds its stable-ABI module with `TORCH_TARGET_VERSION` for 2.11, serving every torch from
/// 2.11 on; without it the torch at hand is refused against the pin, and a target newer than
/// that torch is refused naming the extension.
#[test]
fn torch_target_builds_a_stable_module_for_a_newer_pin_with_the_torch_at_hand() {
    if !module_tools() {
        return;
    }
    let found = bundler::torch::TorchHeaders::find().unwrap().version;
    if !found.starts_with("2.11.") {
        testkit::missing(&format!("torch {found} at hand, the test wants 2.11"));
        return;
    }
    let (dir, manifest) = stable_module_library();
    let text = std::fs::read_to_string(&manifest).unwrap();
    let narrowed = text
        .replace("torch = \"2.11.*\"", "torch = \"2.13.*\"")
        .replace("archs = [\"sm_90a\", \"sm_100a\"]", "archs = [\"sm_90a\"]")
        .replace(
            "cuda-builds = [\"cu129\", \"cu130\"]",
            "cuda-builds = [\"cu130\"]",
        );
    let build = |extra: &str| {
        std::fs::write(&manifest, format!("{narrowed}{extra}")).unwrap();
        let options = BundleOptions::new(
            &manifest,
            &dir.path().join("out"),
            &dir.path().join("cache"),
        );
        bundle_kernels(&options).map_err(|error| testkit::error_chain(&error))
    };
    let error = build("").unwrap_err();
    assert!(
        error.contains("which the manifest's torch pin `2.13.*` does not allow"),
        "{error}"
    );
    let error = build("torch-target = \"2.12\"\n").unwrap_err();
    assert!(
        error.contains("older than extension `_C`'s `torch-target = \"2.12\"`"),
        "{error}"
    );
    let summary = build("torch-target = \"2.11\"\n").unwrap();
    let record = &summary.index.modules["_C"];
    assert_eq!(record.variants[0].torch, ">=2.11");
    assert_eq!(
        record.inputs.defines["TORCH_TARGET_VERSION"],
        "0x020b000000000000"
    );
}

/// A stable-ABI module built by `bundle-kernels`: one cu130 module for this CPU that serves
/// torch from the pin's minor on, with sm_90a and sm_100a device code inside; cu129 recorded
/// as a skip saying why; the same bytes from a second checkout with its own cache; a second
/// run compiles nothing; editing a header the units include changes the key.
#[test]
fn a_stable_abi_module_is_built_keyed_cached_and_reproducible_from_another_checkout() {
    if !module_tools() {
        return;
    }
    let (dir, manifest) = stable_module_library();
    let options = BundleOptions::new(
        &manifest,
        &dir.path().join("out"),
        &dir.path().join("cache"),
    );
    let summary = bundle_kernels(&options).unwrap();
    // One module per CPU, this machine's first (its plan is the record's inputs).
    let other = ["x86_64", "aarch64"]
        .into_iter()
        .find(|cpu| *cpu != std::env::consts::ARCH)
        .unwrap();
    let cu130: prebuilt::CudaBuild = "cu130".parse().unwrap();
    assert_eq!(
        summary.modules_compiled,
        [
            ("_C".to_owned(), cu130, std::env::consts::ARCH.to_owned()),
            ("_C".to_owned(), cu130, other.to_owned())
        ]
    );
    let record = &summary.index.modules["_C"];
    assert_eq!(record.abi, prebuilt::module::Abi::Stable);
    assert_eq!(record.variants.len(), 2);
    let variant = &record.variants[0];
    assert_eq!(variant.label(), format!("cu130/{}", std::env::consts::ARCH));
    assert_eq!(record.variants[1].label(), format!("cu130/{other}"));
    assert_ne!(record.variants[1].key, variant.key);
    assert_eq!(variant.torch, ">=2.11");
    assert_eq!(variant.compilers[0].kind, "nvcc");
    assert_eq!(variant.compilers[1].kind, "g++");
    // The cross compiler's C library is part of its identity.
    assert!(
        record.variants[1].compilers[1].version.contains("glibc 2."),
        "{:?}",
        record.variants[1].compilers
    );
    assert_eq!(record.skipped.len(), 2, "cu129 on both CPUs");
    assert!(
        record.skipped.iter().all(|skip| skip
            .reason
            .starts_with("the cu129 toolchain has no nvcc front end")),
        "{:?}",
        record.skipped
    );
    // The include graph of both units, the fixture's header and torch's stable headers.
    let files = &record.inputs.files;
    assert!(files.contains_key("csrc/ops.cpp") && files.contains_key("csrc/axpby.h"));
    assert!(
        files
            .keys()
            .any(|path| path.ends_with("torch/csrc/stable/library.h")),
        "{files:?}"
    );
    // Stored compressed, named by digest, and read back verified.
    let bundle = dir.path().join("out");
    let stored = bundle.join(&variant.artifact.path);
    assert!(
        variant.artifact.path.ends_with(".so.zst"),
        "{}",
        variant.artifact.path
    );
    assert!(variant.artifact.stored_size < variant.artifact.size);
    assert_eq!(
        stored.metadata().unwrap().len(),
        variant.artifact.stored_size
    );
    let bytes = prebuilt::module::read_module(&bundle, "_C", variant).unwrap();
    assert_eq!(&bytes[..4], b"\x7fELF");
    // `bundle extract` writes it as a plain shared library, beside the kernels' cubins.
    let extracted = dir.path().join("extracted");
    let written =
        bundler::writer::extract_bundle(&prebuilt::Bundle::open(&bundle).unwrap(), &extracted)
            .unwrap();
    let module = extracted.join(format!("modules/_C/cu130/{}.so", std::env::consts::ARCH));
    assert!(written.contains(&module), "{written:?}");
    assert_eq!(std::fs::read(&module).unwrap(), bytes);
    // The library's folder and torch's never appear in the module.
    let text = String::from_utf8_lossy(&bytes);
    assert!(!text.contains(&*dir.path().to_string_lossy()));
    assert!(
        !text.contains("/.cache/"),
        "an absolute torch path is in the module"
    );
    // The loader's index carries the modules.
    let catalog = prebuilt::lookup::Catalog::open(&bundle).unwrap();
    assert_eq!(catalog.meta().modules, summary.index.modules);

    let again = bundle_kernels(&options).unwrap();
    assert!(again.modules_compiled.is_empty());

    let (other, other_manifest) = stable_module_library();
    let other_options = BundleOptions::new(
        &other_manifest,
        &other.path().join("out"),
        &other.path().join("cache"),
    );
    let rebuilt = bundle_kernels(&other_options).unwrap();
    assert_eq!(
        rebuilt.modules_compiled.len(),
        2,
        "its own cache: compiled again"
    );
    assert_eq!(
        rebuilt.index.modules, summary.index.modules,
        "same key, same bytes"
    );

    let header = other.path().join("csrc/axpby.h");
    let text = std::fs::read_to_string(&header).unwrap();
    std::fs::write(&header, text.replace("differ in size", "differ in length")).unwrap();
    let edited = bundle_kernels(&other_options).unwrap();
    assert_eq!(edited.modules_compiled.len(), 2);
    assert_ne!(edited.index.modules["_C"].variants[0].key, variant.key);
}
