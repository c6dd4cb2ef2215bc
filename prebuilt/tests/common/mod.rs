//! What prebuilt's test binaries share: the fixture bundle written by hand from the cubin
//! fixtures, registry options that read nothing from the environment, the toolchains
//! `ci/setup` installs, child processes of a test binary, and the GPU test bundle and device.
//! The fixtures are built into each binary, so it runs from any directory (the GPU machine gets
//! the binaries, not the checkout they were built in).
//!
//! Each binary uses part of this kit; what one leaves unused is no dead code of the others.
#![allow(dead_code, unused_imports)]

pub use std::collections::BTreeMap;
pub use std::fs;
pub use std::path::{Path, PathBuf};
pub use std::process::{Child, Command, Stdio};
pub use std::time::{Duration, Instant};

pub use fs4::fs_std::FileExt;
pub use kernel_reference::{cases, Arg, Case};
pub use prebuilt::bundle::{Bundle, BundleError, INDEX_FILE, SOURCES_DIR};
pub use prebuilt::compile::{toolchain_dir, ToolkitLayout};
pub use prebuilt::cubin::inspect_cubin;
pub use prebuilt::driver::{DeviceBuffer, Driver, LaunchAttributes, LaunchConfig};
pub use prebuilt::index::{
    Function, Index, KernelInputs, KernelRecord, SourceRecipe, Variant, INDEX_FORMAT,
};
pub use prebuilt::jit::{compile_cached, entry_paths, CompilerSearch, JitCompiler, JitRequest};
pub use prebuilt::key::{sha256_hex, KernelKey, KeyInputs};
pub use prebuilt::registry::{
    KernelArg, LoadError, Provenance, ProvenanceKind, Registry, RegistryOptions, Status,
};
pub use prebuilt::{Arch, CudaBuild, JitPolicy, PtxJitPolicy};

pub use testkit::fixtures::{arch, build, compiler, variant, write_artifact};
pub use testkit::{error_chain, skipped};

/// The fixture source, built into the binary so that it runs from any directory (the GPU
/// machine gets this binary, not the checkout it was built in).
pub const FIXTURE_SOURCE: &[u8] = include_bytes!("../fixtures/cubin/kernels.cu");
/// Set in a child process: what it is to do.
pub const ROLE: &str = "KWHEEL_TEST_ROLE";
/// The first line of a child's answer on stdout.
pub const ANSWER: &str = "KWHEEL_TEST_ANSWER";

// ---------------------------------------------------------------------------------------------
// A small bundle written by hand from the cubin fixtures (the bundle writer is the bundler's).
// ---------------------------------------------------------------------------------------------

/// Two kernels of `kernels.cu`, each with the four fixture cubins as its variants.
pub const FIXTURE_KERNELS: [(&str, &[&str]); 2] = [
    ("fixture_axpy", &["kw_axpy", "kw_square<float>"]),
    ("fixture_scalars", &["kw_scalars", "kw_structs"]),
];

/// `(cubin, arch, build, compiler, version)` of each fixture cubin.
pub const FIXTURE_CUBINS: [(&[u8], &str, &str, &str, &str); 4] = [
    (
        include_bytes!("../fixtures/cubin/nvrtc129_sm_90a.cubin"),
        "sm_90a",
        "cu129",
        "nvrtc",
        "12.9.86",
    ),
    (
        include_bytes!("../fixtures/cubin/nvrtc129_sm_100a.cubin"),
        "sm_100a",
        "cu129",
        "nvrtc",
        "12.9.86",
    ),
    (
        include_bytes!("../fixtures/cubin/nvcc130_sm_90a.cubin"),
        "sm_90a",
        "cu130",
        "nvcc",
        "13.0.88",
    ),
    (
        include_bytes!("../fixtures/cubin/nvcc130_sm_100a.cubin"),
        "sm_100a",
        "cu130",
        "nvcc",
        "13.0.88",
    ),
];

/// Writes the fixture bundle under `dir` and returns its root.
pub fn fixture_bundle(dir: &Path) -> PathBuf {
    let root = dir.join("_prebuilt");
    fs::create_dir_all(root.join(SOURCES_DIR)).unwrap();
    fs::write(root.join(SOURCES_DIR).join("kernels.cu"), FIXTURE_SOURCE).unwrap();
    let mut kernels = BTreeMap::new();
    for (name, entries) in FIXTURE_KERNELS {
        let inputs = KernelInputs {
            entries: entries.iter().map(|entry| entry.to_string()).collect(),
            files: BTreeMap::from([("kernels.cu".to_owned(), sha256_hex(FIXTURE_SOURCE))]),
            defines: BTreeMap::new(),
            flags: Vec::new(),
            nvcc_flags: Vec::new(),
            nvrtc_flags: Vec::new(),
            cxx_std: "c++17".to_owned(),
            ..KernelInputs::default()
        };
        let mut variants = Vec::new();
        for (bytes, target, cuda, kind, version) in FIXTURE_CUBINS {
            // Owned, so aligned: the ELF reader needs an aligned header.
            let cubin = bytes.to_vec();
            let artifact = write_artifact(&root, &cubin);
            let info = inspect_cubin(&cubin).unwrap();
            let functions = entries
                .iter()
                .map(|entry| {
                    let symbol = if *entry == "kw_square<float>" {
                        "_Z9kw_squareIfEvPT_i"
                    } else {
                        entry
                    };
                    Function {
                        computed: Default::default(),
                        name: entry.to_string(),
                        symbol: symbol.to_owned(),
                        param_sizes: info.function(symbol).unwrap().param_sizes.clone(),
                    }
                })
                .collect();
            let compiler = compiler(kind, version);
            let key = KernelKey::compute(&KeyInputs {
                kernel: name,
                inputs: &inputs,
                arch: arch(target),
                cuda: build(cuda),
                torch: "2.13.*",
                compiler: &compiler,
            });
            variants.push(Variant {
                compiler,
                key: key.0,
                artifact,
                functions,
                ..variant(&format!("{cuda}/{target}"))
            });
        }
        variants.sort_by_key(|variant| (variant.cuda, variant.arch));
        kernels.insert(
            name.to_owned(),
            source_kernel(inputs, "kernels.cu", variants),
        );
    }
    write_new_index(&root, "kwheel-fixtures", kernels);
    root
}

/// The record of a kernel compiled from `source` (a file under `_sources/`), with `variants`
/// and no skips.
pub fn source_kernel(inputs: KernelInputs, source: &str, variants: Vec<Variant>) -> KernelRecord {
    KernelRecord {
        inputs,
        recipe: Some(SourceRecipe {
            source: source.to_owned(),
            include_dirs: Vec::new(),
        }),
        constants: BTreeMap::new(),
        variants,
        skipped: Vec::new(),
    }
}

/// Writes the index (and its lookup) of a bundle at `root` of `kernels` only, for the library
/// `package` built against torch `2.13.*`: no store, no dictionary, no modules.
pub fn write_new_index(root: &Path, package: &str, kernels: BTreeMap<String, KernelRecord>) {
    let index = Index {
        format: INDEX_FORMAT,
        store: None,
        package: package.to_owned(),
        torch: "2.13.*".to_owned(),
        dictionary: None,
        kernels,
        modules: Default::default(),
    };
    write_index(root, &index);
}

/// Options that read nothing from the environment.
pub fn options(cuda: Option<&str>, jit: JitPolicy, cache: &Path) -> RegistryOptions {
    RegistryOptions {
        cuda: cuda.map(build),
        torch: std::env::var("KWHEEL_TEST_TORCH").ok(),
        jit,
        jit_cache: cache.to_path_buf(),
        compilers: CompilerSearch::from_env(),
        device: 0,
        ..RegistryOptions::default()
    }
}

/// A file of the `build` toolchain `ci/setup` installs, as `pick` finds it in the toolkit's
/// layout, or `None` (with the reason printed) when it is not there; with
/// `KWHEEL_REQUIRE_TOOLCHAINS=1`, a failure. Looked up where the bundler looks.
pub fn toolchain_file(
    build: &str,
    what: &str,
    pick: impl Fn(ToolkitLayout) -> Option<PathBuf>,
) -> Option<PathBuf> {
    let root = toolchain_dir(build.parse().unwrap());
    let found = pick(ToolkitLayout::scan(&root));
    if found.is_none() {
        let message = format!(
            "no {what} under {} (run `ci/setup`, or set KWHEEL_CUDA_{})",
            root.display(),
            build.to_uppercase()
        );
        if std::env::var("KWHEEL_REQUIRE_TOOLCHAINS").as_deref() == Ok("1") {
            panic!("{message}");
        }
        skipped!("skipped: {message}");
    }
    found
}

/// `libnvrtc.so.12` of the CUDA 12.9 toolchain.
pub fn nvrtc_12_9() -> Option<PathBuf> {
    toolchain_file("cu129", "libnvrtc.so.12", |layout| layout.nvrtc)
}

/// nvcc of the CUDA 13.0 toolchain.
pub fn nvcc_13_0() -> Option<PathBuf> {
    toolchain_file("cu130", "nvcc", |layout| layout.nvcc)
}

/// This test binary, re-run for one test in the role `role`.
pub fn test_child(test: &str, role: &str) -> Command {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .stdin(Stdio::null());
    command
}

/// The child's answer: what follows [`ANSWER`] on its stdout.
pub fn answer(stdout: &[u8]) -> String {
    let stdout = String::from_utf8_lossy(stdout);
    stdout
        .lines()
        .find_map(|line| Some(&line[line.find(ANSWER)? + ANSWER.len()..]))
        .map(|answer| answer.trim().to_owned())
        .unwrap_or_else(|| panic!("no answer in the child's output:\n{stdout}"))
}

pub const JIT_KERNEL: &str = "fixture_axpy";

/// The JIT's request for `kernel` of the opened bundle, on `arch` and `cuda`.
pub fn jit_request<'a>(
    opened: &'a Bundle,
    kernel: &'a str,
    arch: Arch,
    cuda: CudaBuild,
) -> JitRequest<'a> {
    let index = opened.index();
    JitRequest {
        bundle_root: opened.root(),
        kernel,
        record: &index.kernels[kernel],
        torch: &index.torch,
        arch,
        cuda,
    }
}

/// The bundle the GPU tests (and the reproduction test) use, or `None` with the reason.
pub fn test_bundle() -> Option<PathBuf> {
    match std::env::var_os("KWHEEL_TEST_BUNDLE") {
        Some(path) if !path.is_empty() => Some(PathBuf::from(path)),
        _ => {
            skipped!(
                "skipped: KWHEEL_TEST_BUNDLE is not set (a bundle from `kwheel dev \
                 bundle-kernels`)"
            );
            None
        }
    }
}

/// The test bundle and the device, when there is a 9.0 GPU and a bundle; else `None` with the
/// reason printed.
pub fn gpu_bundle() -> Option<PathBuf> {
    if !device_0_is_9_0("these tests load sm_90a cubins") {
        return None;
    }
    test_bundle()
}

/// Whether device 0 is a compute 9.0 GPU; else prints why the test skips (`why`: what the
/// tests need a 9.0 device for).
pub fn device_0_is_9_0(why: &str) -> bool {
    let device = match Driver::get().and_then(|driver| driver.device(0)) {
        Ok(device) => device,
        Err(error) => {
            skipped!("skipped: {error}");
            return false;
        }
    };
    if device.capability() != (9, 0) {
        skipped!(
            "skipped: device 0 ({}) is compute {:?}; {why}",
            device.name(),
            device.capability()
        );
        return false;
    }
    true
}

/// Runs one reference case with `kernel`: device buffers in, launch, outputs back, check.
pub fn run_case(kernel: &prebuilt::registry::Kernel, case: &Case) {
    let context = kernel.context().expect("a CUDA kernel has a context");
    let mut buffers = Vec::new();
    let mut args = Vec::new();
    let mut outputs = Vec::new();
    for arg in &case.args {
        match arg {
            Arg::Input(bytes) => {
                let buffer = DeviceBuffer::from_host(context, bytes).unwrap();
                args.push(KernelArg::from(&buffer));
                buffers.push(buffer);
            }
            Arg::Output { bytes } => {
                // NaN bytes everywhere: an element the kernel fails to write cannot pass.
                let buffer = DeviceBuffer::from_host(context, &vec![0xff; *bytes]).unwrap();
                args.push(KernelArg::from(&buffer));
                outputs.push(buffers.len());
                buffers.push(buffer);
            }
            Arg::I32(value) => args.push(KernelArg::I32(*value)),
            Arg::F32(value) => args.push(KernelArg::F32(*value)),
        }
    }
    // SAFETY: every pointer is a live device buffer of exactly the size the case computes its
    // launch geometry for, and all of them outlive the synchronize below.
    unsafe {
        kernel
            .launch(
                case.entry,
                case.grid,
                case.block,
                case.shared_mem_bytes,
                &args,
            )
            .unwrap_or_else(|error| panic!("{}: {}", case.entry, error_chain(&error)));
    }
    context
        .synchronize()
        .unwrap_or_else(|error| panic!("{}: {error}", case.entry));
    let bytes: Vec<Vec<u8>> = outputs
        .iter()
        .map(|&index| buffers[index].copy_to_host().unwrap())
        .collect();
    (case.check)(&bytes)
        .unwrap_or_else(|mismatch| panic!("{} ({}): {mismatch}", case.entry, kernel.provenance()));
}

/// A copy of `bundle` under `dir` with no variant that runs on 9.0: no `sm_90a` cubin and no
/// PTX (which the driver would compile for it).
pub fn bundle_without_sm_90a(bundle: &Path, dir: &Path) -> PathBuf {
    bundle_keeping(bundle, dir, |variant| {
        !prebuilt::select::runs_on(variant.arch, (9, 0))
    })
}

/// Writes `index` as a bundle does: `index.json` and the loader index derived from it.
pub fn write_index(root: &Path, index: &Index) {
    fs::write(root.join(INDEX_FILE), index.to_json()).unwrap();
    fs::write(
        root.join(prebuilt::lookup::LOOKUP_FILE),
        prebuilt::lookup::encode(index),
    )
    .unwrap();
}

/// A copy of `bundle` under `dir` whose index keeps only the variants `keep` accepts.
pub fn bundle_keeping(bundle: &Path, dir: &Path, keep: impl Fn(&Variant) -> bool) -> PathBuf {
    let copy = dir.join("_prebuilt");
    copy_dir(bundle, &copy);
    let opened = Bundle::open(&copy).unwrap();
    let mut index = opened.index().clone();
    for record in index.kernels.values_mut() {
        record.variants.retain(&keep);
    }
    write_index(&copy, &index);
    copy
}

pub fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// The CUDA build the JIT tests run as: `KWHEEL_TEST_JIT_CUDA`, else `cu130`.
pub fn jit_build() -> String {
    std::env::var("KWHEEL_TEST_JIT_CUDA").unwrap_or_else(|_| "cu130".to_owned())
}
