//! The loader end to end: on a CPU, what a machine without a GPU sees and how the JIT cache
//! behaves under many processes and a killed one; on a GPU, every prebuilt cubin against its
//! CPU reference, the JIT fallback for real, and `<PACKAGE>_JIT_FALLBACK=0`.
//!
//! | test | runs where |
//! | --- | --- |
//! | `status_names_the_missing_gpu_for_every_kernel` | anywhere (with a GPU it checks the fit instead) |
//! | `jit_compiles_once_across_processes` | NVRTC 12.9 toolchain installed |
//! | `jit_lock_dies_with_its_process` | NVRTC 12.9 toolchain installed |
//! | `jit_reproduces_the_bundled_cubins` | `KWHEEL_TEST_BUNDLE`, and the NVRTC 12.9 or nvcc 13.0 toolchain |
//! | `prebuilt_variants_match_their_references` | GPU (compute 9.0) and `KWHEEL_TEST_BUNDLE` |
//! | `jit_fallback_compiles_once_then_hits_the_cache` | GPU (9.0), `KWHEEL_TEST_BUNDLE`, an NVRTC the search finds |
//! | `jit_disabled_names_device_build_and_variants` | GPU (9.0) and `KWHEEL_TEST_BUNDLE` |
//! | `tampered_artifact_is_never_loaded` | GPU and `KWHEEL_TEST_BUNDLE` |
//! | `ptx_only_variants_load_through_the_driver_and_match` | GPU (9.0) and `KWHEEL_TEST_BUNDLE` with `compute_90` targets |
//! | `arguments_are_checked_before_launch` | GPU (9.0) and `KWHEEL_TEST_BUNDLE` |
//! | `dynamic_shared_memory_above_48_kb_launches_and_is_whole` | GPU (9.0), an NVRTC or nvcc the search finds |
//! | `a_cluster_of_two_shares_its_shared_memory` | GPU (9.0), an NVRTC or nvcc the search finds |
//! | `a_cooperative_launch_synchronizes_its_whole_grid` | GPU (9.0), an NVRTC or nvcc the search finds (with the CUDA headers) |
//! | `a_programmatic_dependent_launch_waits_where_it_reads` | GPU (9.0), an NVRTC or nvcc the search finds |
//!
//! Elsewhere a test prints `skipped: <reason>` and passes; `KWHEEL_REQUIRE_TOOLCHAINS=1` makes
//! a missing toolchain a failure. `KWHEEL_TEST_BUNDLE` is a bundle built with the torch pin of
//! the machine (`kwheel dev bundle-kernels --torch 2.11.*`); `KWHEEL_TEST_TORCH` (optional) is
//! that machine's torch version, checked against the pin. The JIT tests run as the CUDA build
//! `KWHEEL_TEST_JIT_CUDA` (default `cu130`) and find NVRTC as the loader does (`KWHEEL_NVRTC`,
//! `KWHEEL_SITE_PACKAGES`, `VIRTUAL_ENV`, `CUDA_HOME`, …). Tests that compile with NVRTC 12.9
//! do it in child processes (this binary, re-run with `KWHEEL_TEST_ROLE`), because one process
//! holds one libnvrtc and the GPU tests use the one a PyTorch install has. The fixtures are
//! built into the binary, so it runs from any directory.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fs4::fs_std::FileExt;
use kernel_reference::{cases, Arg, Case};
use prebuilt::bundle::{Bundle, BundleError, INDEX_FILE, SOURCES_DIR};
use prebuilt::compile::{toolchain_dir, ToolkitLayout};
use prebuilt::cubin::inspect_cubin;
use prebuilt::driver::{DeviceBuffer, Driver, LaunchAttributes, LaunchConfig};
use prebuilt::index::{
    Function, Index, KernelInputs, KernelRecord, SourceRecipe, Variant, INDEX_FORMAT,
};
use prebuilt::jit::{compile_cached, entry_paths, CompilerSearch, JitCompiler, JitRequest};
use prebuilt::key::{sha256_hex, KernelKey, KeyInputs};
use prebuilt::registry::{
    KernelArg, LoadError, Provenance, ProvenanceKind, Registry, RegistryOptions, Status,
};
use prebuilt::{Arch, CudaBuild, JitPolicy, PtxJitPolicy};

use testkit::fixtures::{arch, build, compiler, variant, write_artifact};
use testkit::{error_chain, skipped};

/// The fixture source, built into the binary so that it runs from any directory (the GPU
/// machine gets this binary, not the checkout it was built in).
const FIXTURE_SOURCE: &[u8] = include_bytes!("fixtures/cubin/kernels.cu");
/// Set in a child process: what it is to do.
const ROLE: &str = "KWHEEL_TEST_ROLE";
/// The first line of a child's answer on stdout.
const ANSWER: &str = "KWHEEL_TEST_ANSWER";

// ---------------------------------------------------------------------------------------------
// A small bundle written by hand from the cubin fixtures (the bundle writer is the bundler's).
// ---------------------------------------------------------------------------------------------

/// Two kernels of `kernels.cu`, each with the four fixture cubins as its variants.
const FIXTURE_KERNELS: [(&str, &[&str]); 2] = [
    ("fixture_axpy", &["kw_axpy", "kw_square<float>"]),
    ("fixture_scalars", &["kw_scalars", "kw_structs"]),
];

/// `(cubin, arch, build, compiler, version)` of each fixture cubin.
const FIXTURE_CUBINS: [(&[u8], &str, &str, &str, &str); 4] = [
    (
        include_bytes!("fixtures/cubin/nvrtc129_sm_90a.cubin"),
        "sm_90a",
        "cu129",
        "nvrtc",
        "12.9.86",
    ),
    (
        include_bytes!("fixtures/cubin/nvrtc129_sm_100a.cubin"),
        "sm_100a",
        "cu129",
        "nvrtc",
        "12.9.86",
    ),
    (
        include_bytes!("fixtures/cubin/nvcc130_sm_90a.cubin"),
        "sm_90a",
        "cu130",
        "nvcc",
        "13.0.88",
    ),
    (
        include_bytes!("fixtures/cubin/nvcc130_sm_100a.cubin"),
        "sm_100a",
        "cu130",
        "nvcc",
        "13.0.88",
    ),
];

/// Writes the fixture bundle under `dir` and returns its root.
fn fixture_bundle(dir: &Path) -> PathBuf {
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
            KernelRecord {
                inputs,
                recipe: Some(SourceRecipe {
                    source: "kernels.cu".to_owned(),
                    include_dirs: Vec::new(),
                }),
                constants: BTreeMap::new(),
                variants,
                skipped: Vec::new(),
            },
        );
    }
    let index = Index {
        format: INDEX_FORMAT,
        store: None,
        package: "kwheel-fixtures".to_owned(),
        torch: "2.13.*".to_owned(),
        dictionary: None,
        kernels,
        modules: Default::default(),
    };
    write_index(&root, &index);
    root
}

/// Options that read nothing from the environment.
fn options(cuda: Option<&str>, jit: JitPolicy, cache: &Path) -> RegistryOptions {
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

// ---------------------------------------------------------------------------------------------
// Without a GPU.
// ---------------------------------------------------------------------------------------------

#[test]
fn status_names_the_missing_gpu_for_every_kernel() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = fixture_bundle(dir.path());
    let cache = dir.path().join("jit");
    let registry = Registry::open_with(&bundle, options(None, JitPolicy::Allowed, &cache)).unwrap();
    let status = registry.status();
    assert_eq!(
        status.keys().map(String::as_str).collect::<Vec<_>>(),
        ["fixture_axpy", "fixture_scalars"]
    );
    let gpu = Driver::get().and_then(|driver| driver.device(0));
    match gpu {
        Err(driver_error) => {
            let reason = driver_error.to_string();
            assert!(
                reason.starts_with("no CUDA driver: libcuda.so.1")
                    || reason.starts_with("no CUDA device"),
                "{reason}"
            );
            for (name, status) in &status {
                assert_eq!(
                    status,
                    &Status::Unavailable {
                        reason: reason.clone()
                    },
                    "{name}"
                );
                assert_eq!(registry.unavailable_reason(name), Some(reason.clone()));
                assert!(!registry.is_available(name));
                let error = registry.load(name).unwrap_err();
                assert!(matches!(error, LoadError::NoGpu(_)), "{error}");
                assert_eq!(error.to_string(), reason);
            }
            // Nothing compiled, nothing cached: status never compiles.
            assert!(!cache.exists());
            // The same for every kernel of a real bundle, when one is given.
            if let Some(real) = std::env::var_os("KWHEEL_TEST_BUNDLE").filter(|p| !p.is_empty()) {
                let registry =
                    Registry::open_with(real, options(None, JitPolicy::Allowed, &cache)).unwrap();
                let status = registry.status();
                assert_eq!(status.len(), registry.index().unwrap().kernels.len());
                for (name, status) in status {
                    assert_eq!(
                        status,
                        Status::Unavailable {
                            reason: reason.clone()
                        },
                        "{name}"
                    );
                }
                assert!(!cache.exists());
            }
        }
        Ok(device) if device.capability() == (9, 0) => {
            // The fixture's pin is 2.13.*: no torch version, no torch check.
            let fixture_options = RegistryOptions {
                torch: None,
                ..options(Some("cu130"), JitPolicy::Disabled, &cache)
            };
            let registry = Registry::open_with(&bundle, fixture_options).unwrap();
            for (name, status) in registry.status() {
                let Status::Available {
                    variant,
                    provenance,
                    ..
                } = status
                else {
                    panic!("{name}: {status:?}");
                };
                assert_eq!(
                    (variant.as_str(), provenance),
                    ("cu130/sm_90a", ProvenanceKind::Prebuilt)
                );
            }
        }
        Ok(device) => skipped!(
            "skipped: a GPU of compute {:?} is present; this test checks machines without one \
             and 9.0 devices",
            device.capability()
        ),
    }
    let unknown = registry.unavailable_reason("nope").unwrap();
    assert!(
        unknown.starts_with("no kernel `nope` in the bundle at ")
            && unknown.ends_with("; it has `fixture_axpy`, `fixture_scalars`"),
        "{unknown}"
    );
}

#[test]
fn a_bad_cuda_build_setting_is_refused_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = fixture_bundle(dir.path());
    // The variable is read only when the options leave the build open; set it for a child.
    if std::env::var_os(ROLE).is_some() {
        let error = Registry::open(&bundle).unwrap_err();
        println!("{ANSWER} {error}");
        return;
    }
    let output = test_child("a_bad_cuda_build_setting_is_refused_at_open", "open")
        .env("KWHEEL_CUDA_BUILD", "12.9")
        .output()
        .unwrap();
    let answer = answer(&output.stdout);
    assert_eq!(
        answer,
        "KWHEEL_CUDA_BUILD=`12.9` is not a CUDA build: `12.9` is not a valid CUDA build \
         (expected `cu` and the CUDA version without its dot, like `cu129`)"
    );
}

// ---------------------------------------------------------------------------------------------
// The JIT cache, many processes at once, on a CPU.
// ---------------------------------------------------------------------------------------------

/// A file of the `build` toolchain `ci/setup` installs, as `pick` finds it in the toolkit's
/// layout, or `None` (with the reason printed) when it is not there; with
/// `KWHEEL_REQUIRE_TOOLCHAINS=1`, a failure. Looked up where the bundler looks.
fn toolchain_file(
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
fn nvrtc_12_9() -> Option<PathBuf> {
    toolchain_file("cu129", "libnvrtc.so.12", |layout| layout.nvrtc)
}

/// nvcc of the CUDA 13.0 toolchain.
fn nvcc_13_0() -> Option<PathBuf> {
    toolchain_file("cu130", "nvcc", |layout| layout.nvcc)
}

/// This test binary, re-run for one test in the role `role`.
fn test_child(test: &str, role: &str) -> Command {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .stdin(Stdio::null());
    command
}

/// The child's answer: what follows [`ANSWER`] on its stdout.
fn answer(stdout: &[u8]) -> String {
    let stdout = String::from_utf8_lossy(stdout);
    stdout
        .lines()
        .find_map(|line| Some(&line[line.find(ANSWER)? + ANSWER.len()..]))
        .map(|answer| answer.trim().to_owned())
        .unwrap_or_else(|| panic!("no answer in the child's output:\n{stdout}"))
}

fn child_env(name: &str) -> PathBuf {
    PathBuf::from(std::env::var_os(name).unwrap_or_else(|| panic!("{name} is not set")))
}

/// A child's part: compile `KWHEEL_TEST_KERNEL` of the bundle for `KWHEEL_TEST_ARCH` with the
/// NVRTC at `KWHEEL_TEST_NVRTC` into `KWHEEL_TEST_CACHE`, once `KWHEEL_TEST_GO` exists; answer
/// `compiled|cached <key> <cubin sha256>`.
fn child_compile() {
    let bundle = Bundle::open(child_env("KWHEEL_TEST_BUNDLE_DIR")).unwrap();
    let kernel = std::env::var("KWHEEL_TEST_KERNEL").unwrap();
    let compiler = JitCompiler::nvrtc_at(&child_env("KWHEEL_TEST_NVRTC")).unwrap();
    if let Some(go) = std::env::var_os("KWHEEL_TEST_GO") {
        let started = Instant::now();
        while !Path::new(&go).exists() {
            assert!(started.elapsed() < Duration::from_secs(60), "no go signal");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let request = jit_request(
        &bundle,
        &kernel,
        arch(&std::env::var("KWHEEL_TEST_ARCH").unwrap()),
        build(&std::env::var("KWHEEL_TEST_CUDA").unwrap()),
    );
    match compile_cached(&request, &compiler, &child_env("KWHEEL_TEST_CACHE")) {
        Ok(output) => println!(
            "{ANSWER} {} {} {}",
            if output.compiled {
                "compiled"
            } else {
                "cached"
            },
            output.key,
            sha256_hex(&output.cubin)
        ),
        Err(error) => println!(
            "{ANSWER} error {}",
            error_chain(&error).replace('\n', " | ")
        ),
    }
}

/// A child's part: hold the lock `KWHEEL_TEST_LOCK` with half a cubin written to
/// `KWHEEL_TEST_TEMP`, as a process killed mid-write would, then say so and wait to be killed.
fn child_hold_lock() {
    let lock = fs::File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(child_env("KWHEEL_TEST_LOCK"))
        .unwrap();
    FileExt::lock_exclusive(&lock).unwrap();
    fs::write(child_env("KWHEEL_TEST_TEMP"), [0x7f, b'E', b'L']).unwrap();
    fs::write(child_env("KWHEEL_TEST_READY"), b"").unwrap();
    std::thread::sleep(Duration::from_secs(120));
}

/// Everything a JIT child needs to compile `kernel` of the fixture bundle.
struct JitFixture {
    dir: tempfile::TempDir,
    bundle: PathBuf,
    cache: PathBuf,
    nvrtc: PathBuf,
    key: KernelKey,
}

const JIT_KERNEL: &str = "fixture_axpy";

/// The JIT's request for `kernel` of the opened bundle, on `arch` and `cuda`.
fn jit_request<'a>(
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

fn jit_fixture() -> Option<JitFixture> {
    let nvrtc = nvrtc_12_9()?;
    let dir = tempfile::tempdir().unwrap();
    let bundle = fixture_bundle(dir.path());
    let cache = dir.path().join("jit-cache");
    // The key, without loading NVRTC here: the version comes from the wheel's metadata.
    let search = CompilerSearch {
        nvrtc: Some(nvrtc.clone()),
        ..CompilerSearch::default()
    };
    let version = search.candidates()[0].version.clone().unwrap();
    assert_eq!(version, "12.9.86");
    let opened = Bundle::open(&bundle).unwrap();
    let request = jit_request(&opened, JIT_KERNEL, arch("sm_90a"), build("cu129"));
    let key = request.key(&compiler("nvrtc", &version));
    Some(JitFixture {
        dir,
        bundle,
        cache,
        nvrtc,
        key,
    })
}

impl JitFixture {
    fn compile_child(&self, test: &str) -> Command {
        let mut command = test_child(test, "compile");
        command
            .env("KWHEEL_TEST_BUNDLE_DIR", &self.bundle)
            .env("KWHEEL_TEST_KERNEL", JIT_KERNEL)
            .env("KWHEEL_TEST_NVRTC", &self.nvrtc)
            .env("KWHEEL_TEST_ARCH", "sm_90a")
            .env("KWHEEL_TEST_CUDA", "cu129")
            .env("KWHEEL_TEST_CACHE", &self.cache);
        command
    }
}

fn run_role() -> bool {
    match std::env::var(ROLE).as_deref() {
        Ok("compile") => child_compile(),
        Ok("hold-lock") => child_hold_lock(),
        _ => return false,
    }
    true
}

#[test]
fn jit_compiles_once_across_processes() {
    const TEST: &str = "jit_compiles_once_across_processes";
    if run_role() {
        return;
    }
    let Some(fixture) = jit_fixture() else { return };
    let go = fixture.dir.path().join("go");
    let children: Vec<Child> = (0..8)
        .map(|_| {
            fixture
                .compile_child(TEST)
                .env("KWHEEL_TEST_GO", &go)
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    // Every child is waiting; let them all go at once.
    std::thread::sleep(Duration::from_millis(300));
    fs::write(&go, b"").unwrap();
    let answers: Vec<String> = children
        .into_iter()
        .map(|child| answer(&child.wait_with_output().unwrap().stdout))
        .collect();
    let compiled = answers
        .iter()
        .filter(|a| a.starts_with("compiled "))
        .count();
    let cached = answers.iter().filter(|a| a.starts_with("cached ")).count();
    assert_eq!((compiled, cached), (1, 7), "{answers:#?}");
    // One key, one cubin, for everybody.
    let results: Vec<&str> = answers
        .iter()
        .map(|a| a.split_once(' ').unwrap().1)
        .collect();
    assert!(results.iter().all(|r| *r == results[0]), "{results:#?}");
    assert!(results[0].starts_with(&fixture.key.0));
    let paths = entry_paths(&fixture.cache, &fixture.key);
    let mut names: Vec<String> = fs::read_dir(&paths.dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let key = &fixture.key.0;
    assert_eq!(
        names,
        [
            format!("{key}.cubin"),
            format!("{key}.json"),
            format!("{key}.lock")
        ]
    );
    // A later process finds it too.
    let output = fixture.compile_child(TEST).output().unwrap();
    assert!(answer(&output.stdout).starts_with("cached "));
}

#[test]
fn jit_lock_dies_with_its_process() {
    const TEST: &str = "jit_lock_dies_with_its_process";
    if run_role() {
        return;
    }
    let Some(fixture) = jit_fixture() else { return };
    let paths = entry_paths(&fixture.cache, &fixture.key);
    fs::create_dir_all(&paths.dir).unwrap();
    let temp = paths
        .dir
        .join(format!(".{}.cubin.999999.0.tmp", fixture.key.0));
    let ready = fixture.dir.path().join("ready");

    // A process takes the lock, writes half a cubin, and is killed.
    let mut holder = test_child(TEST, "hold-lock")
        .env("KWHEEL_TEST_LOCK", &paths.lock)
        .env("KWHEEL_TEST_TEMP", &temp)
        .env("KWHEEL_TEST_READY", &ready)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while !ready.exists() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "holder never took the lock"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let lock = fs::File::open(&paths.lock).unwrap();
    assert!(
        !FileExt::try_lock_exclusive(&lock).unwrap(),
        "the holder has the lock"
    );
    holder.kill().unwrap(); // SIGKILL
    holder.wait().unwrap();
    // The operating system released it with the process.
    assert!(FileExt::try_lock_exclusive(&lock).unwrap());
    FileExt::unlock(&lock).unwrap();
    assert!(!paths.cubin.exists() && !paths.metadata.exists());

    // The next process is not blocked, compiles, and clears the leftover.
    let started = Instant::now();
    let output = fixture.compile_child(TEST).output().unwrap();
    let answer_text = answer(&output.stdout);
    assert!(answer_text.starts_with("compiled "), "{answer_text}");
    assert!(started.elapsed() < Duration::from_secs(60));
    assert!(!temp.exists(), "the killed writer's temp file is removed");
    let cubin = fs::read(&paths.cubin).unwrap();
    assert!(answer_text.ends_with(&sha256_hex(&cubin)));

    // A compile killed at a random point while holding the lock leaves the entry whole or
    // absent, never torn, and the next process completes it.
    let other_cache = fixture.dir.path().join("jit-cache-kill");
    for delay_ms in [0u64, 20, 60, 120] {
        let _ = fs::remove_dir_all(&other_cache);
        let mut victim = fixture
            .compile_child(TEST)
            .env("KWHEEL_TEST_CACHE", &other_cache)
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let other = entry_paths(&other_cache, &fixture.key);
        let started = Instant::now();
        // Wait until the victim holds the lock (or has finished), then wait `delay_ms`.
        loop {
            if let Ok(lock) = fs::File::open(&other.lock) {
                if !FileExt::try_lock_exclusive(&lock).unwrap() {
                    break;
                }
                FileExt::unlock(&lock).unwrap();
            }
            if victim.try_wait().unwrap().is_some() || started.elapsed() > Duration::from_secs(60) {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(delay_ms));
        let _ = victim.kill();
        victim.wait().unwrap();
        if other.metadata.exists() {
            // Complete: the json is written last and names the cubin's digest.
            let entry: serde_json::Value =
                serde_json::from_slice(&fs::read(&other.metadata).unwrap()).unwrap();
            let cubin = fs::read(&other.cubin).unwrap();
            assert_eq!(entry["digest"], sha256_hex(&cubin));
        }
        let output = fixture
            .compile_child(TEST)
            .env("KWHEEL_TEST_CACHE", &other_cache)
            .output()
            .unwrap();
        let answer_text = answer(&output.stdout);
        assert!(
            answer_text.starts_with("compiled ") || answer_text.starts_with("cached "),
            "after a kill at {delay_ms} ms: {answer_text}"
        );
        let leftovers: Vec<_> = fs::read_dir(&other.dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name())
            .filter(|name| name.to_string_lossy().ends_with(".tmp"))
            .collect();
        if answer_text.starts_with("compiled ") {
            assert!(leftovers.is_empty(), "{leftovers:?}");
        }
    }
}

/// The bundle the GPU tests (and the reproduction test) use, or `None` with the reason.
fn test_bundle() -> Option<PathBuf> {
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

#[test]
fn jit_reproduces_the_bundled_cubins() {
    const TEST: &str = "jit_reproduces_the_bundled_cubins";
    if run_role() {
        return;
    }
    let Some(bundle) = test_bundle() else { return };
    let opened = Bundle::open(&bundle).unwrap();
    let index = opened.index();
    let cache = tempfile::tempdir().unwrap();
    let mut compared = 0;
    // NVRTC 12.9, in a child per variant (this process keeps its libnvrtc slot free).
    if let Some(nvrtc) = nvrtc_12_9() {
        let version = CompilerSearch {
            nvrtc: Some(nvrtc.clone()),
            ..CompilerSearch::default()
        }
        .candidates()[0]
            .version
            .clone()
            .unwrap();
        for (name, record) in &index.kernels {
            for variant in &record.variants {
                if variant.compiler.kind != "nvrtc" || variant.compiler.version != version {
                    continue;
                }
                let output = test_child(TEST, "compile")
                    .env("KWHEEL_TEST_BUNDLE_DIR", &bundle)
                    .env("KWHEEL_TEST_KERNEL", name)
                    .env("KWHEEL_TEST_NVRTC", &nvrtc)
                    .env("KWHEEL_TEST_ARCH", variant.arch.to_string())
                    .env("KWHEEL_TEST_CUDA", variant.cuda.to_string())
                    .env("KWHEEL_TEST_CACHE", cache.path())
                    .output()
                    .unwrap();
                // The same key as the bundler's, and the same bytes.
                assert_eq!(
                    answer(&output.stdout),
                    format!("compiled {} {}", variant.key, variant.artifact.digest),
                    "{name} {}",
                    variant.label()
                );
                compared += 1;
            }
        }
    }
    // nvcc 13.0, in this process. Every nvcc variant of this nvcc is compared: its record names
    // the host compiler, which the JIT probes the bundler's way, so a bundle built on this
    // machine has the JIT's keys. (`nvcc+ptxas` variants are the bundler's route for a build
    // without nvcc; the JIT compiles with an nvcc or NVRTC it finds, never through that route.)
    if let Some(nvcc) = nvcc_13_0() {
        let compiler = JitCompiler::nvcc_at(&nvcc).unwrap();
        let same_nvcc = format!("{}, host ", compiler.version());
        for (name, record) in &index.kernels {
            for variant in &record.variants {
                if variant.compiler.kind != "nvcc"
                    || !variant.compiler.version.starts_with(&same_nvcc)
                {
                    continue;
                }
                assert_eq!(
                    variant.compiler,
                    compiler.record(),
                    "{name} {}: the bundle's nvcc record is not the JIT's on this machine (was \
                     the bundle built with another host compiler?)",
                    variant.label()
                );
                let request = JitRequest {
                    bundle_root: opened.root(),
                    kernel: name,
                    record,
                    torch: &index.torch,
                    arch: variant.arch,
                    cuda: variant.cuda,
                };
                let output = compile_cached(&request, &compiler, cache.path())
                    .unwrap_or_else(|error| panic!("{name}: {}", error_chain(&error)));
                assert_eq!(output.key.0, variant.key, "{name} {}", variant.label());
                assert_eq!(
                    sha256_hex(&output.cubin),
                    variant.artifact.digest,
                    "{name} {}",
                    variant.label()
                );
                assert_eq!(
                    output.functions,
                    variant.functions,
                    "{name} {}",
                    variant.label()
                );
                compared += 1;
            }
        }
    }
    eprintln!("{compared} JIT cubins are byte-identical to the bundle's, under the same keys");
}

// ---------------------------------------------------------------------------------------------
// On a GPU.
// ---------------------------------------------------------------------------------------------

/// The test bundle and the device, when there is a 9.0 GPU and a bundle; else `None` with the
/// reason printed.
fn gpu_bundle() -> Option<PathBuf> {
    if !device_0_is_9_0("these tests load sm_90a cubins") {
        return None;
    }
    test_bundle()
}

/// Whether device 0 is a compute 9.0 GPU; else prints why the test skips (`why`: what the
/// tests need a 9.0 device for).
fn device_0_is_9_0(why: &str) -> bool {
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
fn run_case(kernel: &prebuilt::registry::Kernel, case: &Case) {
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

#[test]
fn prebuilt_variants_match_their_references() {
    let Some(bundle) = gpu_bundle() else { return };
    let cache = tempfile::tempdir().unwrap();
    let sm_90a = arch("sm_90a");
    for cuda in ["cu129", "cu130"] {
        let registry = Registry::open_with(
            &bundle,
            options(Some(cuda), JitPolicy::Disabled, cache.path()),
        )
        .unwrap();
        let mut loaded = Vec::new();
        for (name, record) in &registry.index().unwrap().kernels.clone() {
            let Some(variant) = record
                .variants
                .iter()
                .find(|variant| variant.cuda == build(cuda) && variant.arch == sm_90a)
            else {
                continue;
            };
            let kernel = registry
                .load(name)
                .unwrap_or_else(|error| panic!("{name} {cuda}: {}", error_chain(&error)));
            assert_eq!(
                kernel.provenance(),
                &Provenance::Prebuilt {
                    variant: format!("{cuda}/sm_90a"),
                    key: variant.key.clone(),
                },
                "{name}"
            );
            assert_eq!(kernel.constants(), &record.constants);
            loaded.push(name.clone());
        }
        let cases = cases();
        for case in &cases {
            assert!(
                loaded.iter().any(|name| name == case.kernel),
                "{cuda}: the bundle has no sm_90a variant of `{}`",
                case.kernel
            );
            let kernel = registry.load(case.kernel).unwrap();
            run_case(&kernel, case);
        }
        eprintln!(
            "{cuda}: {} kernels loaded prebuilt, {} cases match their references",
            loaded.len(),
            cases.len()
        );
        // Nothing was compiled.
        assert!(!cache.path().join(prebuilt::jit::CACHE_LAYOUT).exists());
    }
}

/// Two GPUs: every case on device 1 from a registry whose own device is 0, in device 1's
/// context, and device 0's kernels modules of their own.
#[test]
fn every_case_runs_on_the_second_device_of_a_registry_opened_for_the_first() {
    let Some(bundle) = gpu_bundle() else { return };
    let count = Driver::get().and_then(|driver| driver.device_count());
    if !matches!(count, Ok(count) if count >= 2) {
        skipped!("skipped: one GPU here ({count:?}); this test needs two");
        return;
    }
    let cache = tempfile::tempdir().unwrap();
    let registry =
        Registry::open_with(&bundle, options(None, JitPolicy::Disabled, cache.path())).unwrap();
    assert_eq!(registry.options().device, 0);
    let cases = cases();
    for case in &cases {
        let kernel = registry.load_on(case.kernel, 1).unwrap();
        let context = kernel.context().unwrap();
        assert_eq!((kernel.device(), context.device().ordinal()), (1, 1));
        run_case(&kernel, case);
        let first = registry.load(case.kernel).unwrap();
        assert_eq!(first.context().unwrap().device().ordinal(), 0);
        assert!(!std::sync::Arc::ptr_eq(first.context().unwrap(), context));
        run_case(&first, case);
    }
    eprintln!(
        "{} cases match their references on device 1 and on device 0",
        cases.len()
    );
}

/// A copy of `bundle` under `dir` with no variant that runs on 9.0: no `sm_90a` cubin and no
/// PTX (which the driver would compile for it).
fn bundle_without_sm_90a(bundle: &Path, dir: &Path) -> PathBuf {
    bundle_keeping(bundle, dir, |variant| {
        !prebuilt::select::runs_on(variant.arch, (9, 0))
    })
}

/// A copy of `bundle` under `dir` whose index keeps only the variants `keep` accepts.
/// Writes `index` as a bundle does: `index.json` and the loader index derived from it.
fn write_index(root: &Path, index: &Index) {
    fs::write(root.join(INDEX_FILE), index.to_json()).unwrap();
    fs::write(
        root.join(prebuilt::lookup::LOOKUP_FILE),
        prebuilt::lookup::encode(index),
    )
    .unwrap();
}

fn bundle_keeping(bundle: &Path, dir: &Path, keep: impl Fn(&Variant) -> bool) -> PathBuf {
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

#[test]
fn ptx_only_variants_load_through_the_driver_and_match() {
    let Some(bundle) = gpu_bundle() else { return };
    let dir = tempfile::tempdir().unwrap();
    let compute_90 = arch("compute_90");
    let ptx_only = bundle_keeping(&bundle, dir.path(), |variant| variant.arch == compute_90);
    let cache = dir.path().join("jit-cache");
    let cases = cases();
    for cuda in ["cu129", "cu130"] {
        // The kwheel JIT is disabled: PTX reaches the device through the driver alone.
        let mut options = options(Some(cuda), JitPolicy::Disabled, &cache);
        options.ptx_jit = PtxJitPolicy::Allowed;
        let registry = Registry::open_with(&ptx_only, options.clone()).unwrap();
        let status = registry.status();
        let mut loaded = Vec::new();
        for (name, record) in &registry.index().unwrap().kernels.clone() {
            let Some(variant) = record.variants.iter().find(|v| v.cuda == build(cuda)) else {
                continue;
            };
            let Status::Available { reason, .. } = &status[name] else {
                panic!("{name} {cuda}: {:?}", status[name]);
            };
            assert!(
                reason.starts_with(
                    "compute_90 PTX for a 9.0 device, compiled by the driver on first load"
                ),
                "{name}: {reason}"
            );
            let started = Instant::now();
            let kernel = registry
                .load(name)
                .unwrap_or_else(|error| panic!("{name} {cuda}: {}", error_chain(&error)));
            eprintln!(
                "{cuda}: `{name}` loaded from PTX in {:.1} ms",
                started.elapsed().as_secs_f64() * 1e3
            );
            assert_eq!(
                kernel.provenance(),
                &Provenance::Prebuilt {
                    variant: format!("{cuda}/compute_90"),
                    key: variant.key.clone(),
                },
                "{name}"
            );
            loaded.push(name.clone());
        }
        assert!(
            !loaded.is_empty(),
            "{cuda}: the bundle has no compute_90 variant"
        );
        let mut checked = 0;
        for case in cases
            .iter()
            .filter(|case| loaded.iter().any(|n| n == case.kernel))
        {
            run_case(&registry.load(case.kernel).unwrap(), case);
            checked += 1;
        }
        eprintln!(
            "{cuda}: {} kernels loaded from compute_90 PTX, {checked} cases match their references",
            loaded.len()
        );
        assert!(!cache.exists(), "nothing was compiled by kwheel");

        // `<PACKAGE>_PTX_JIT=0`: the same bundle has nothing this device may load.
        options.ptx_jit = PtxJitPolicy::Forbidden;
        let registry = Registry::open_with(&ptx_only, options).unwrap();
        let error = registry.load(&loaded[0]).unwrap_err();
        let message = error.to_string();
        assert!(matches!(error, LoadError::NoFit { .. }), "{message}");
        assert!(
            message.contains(&format!(
                "{cuda}/compute_90: fits, but the loader's policy (as AF3_KERNELS_PTX_JIT=0 \
                 would) forbids the driver's PTX JIT"
            )),
            "{message}"
        );
    }
}

fn copy_dir(from: &Path, to: &Path) {
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
fn jit_build() -> String {
    std::env::var("KWHEEL_TEST_JIT_CUDA").unwrap_or_else(|_| "cu130".to_owned())
}

#[test]
fn jit_fallback_compiles_once_then_hits_the_cache() {
    let Some(bundle) = gpu_bundle() else { return };
    let dir = tempfile::tempdir().unwrap();
    let stripped = bundle_without_sm_90a(&bundle, dir.path());
    let cache = dir.path().join("jit-cache");
    let cuda = jit_build();
    let cases = cases();
    let mut keys: BTreeMap<String, String> = BTreeMap::new();
    for (round, expected) in [ProvenanceKind::JitCompiled, ProvenanceKind::JitCache]
        .into_iter()
        .enumerate()
    {
        let registry =
            Registry::open_with(&stripped, options(Some(&cuda), JitPolicy::Allowed, &cache))
                .unwrap();
        for (name, status) in registry.status() {
            match status {
                Status::Available {
                    variant,
                    provenance,
                    reason,
                    ..
                } => {
                    assert_eq!(variant, format!("{cuda}/sm_90a"), "{name}");
                    assert_eq!(provenance, expected, "{name}: {reason}");
                }
                Status::Unavailable { reason } => panic!("{name}: {reason}"),
            }
        }
        for name in registry.index().unwrap().kernels.keys() {
            let started = Instant::now();
            let kernel = registry
                .load(name)
                .unwrap_or_else(|error| panic!("{name}: {}", error_chain(&error)));
            eprintln!(
                "round {round}: {name} {} in {:?}",
                kernel.provenance(),
                started.elapsed()
            );
            assert_eq!(kernel.provenance().kind(), expected, "{name}");
            let key = kernel.provenance().key().to_owned();
            assert!(entry_paths(&cache, &KernelKey(key.clone()))
                .metadata
                .is_file());
            match keys.get(name) {
                Some(first) => assert_eq!(first, &key, "{name}: the same key both times"),
                None => {
                    keys.insert(name.clone(), key);
                }
            }
        }
        for case in &cases {
            run_case(&registry.load(case.kernel).unwrap(), case);
        }
    }
}

#[test]
fn jit_disabled_names_device_build_and_variants() {
    const TEST: &str = "jit_disabled_names_device_build_and_variants";
    let Some(bundle) = gpu_bundle() else { return };
    // In a child, the policy comes from `<PACKAGE>_JIT_FALLBACK=0` as a user sets it.
    if std::env::var(ROLE).as_deref() == Ok("no-fit") {
        let variable = std::env::var("KWHEEL_TEST_VARIABLE").unwrap();
        check_no_fit(
            &bundle,
            JitPolicy::FromEnvironment,
            &format!("{variable}=0"),
        );
        println!("{ANSWER} ok");
        return;
    }
    check_no_fit(
        &bundle,
        JitPolicy::Disabled,
        "the loader's JIT policy (as AF3_KERNELS_JIT_FALLBACK=0 would)",
    );
    let package = Bundle::open(&bundle).unwrap().index().package.clone();
    let variable = prebuilt::env::fallback_variable(&package);
    let output = test_child(TEST, "no-fit")
        .env(&variable, "0")
        .env("KWHEEL_TEST_VARIABLE", &variable)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(answer(&output.stdout), "ok");
}

/// On a copy of `bundle` without sm_90a cubins, with the fallback disabled by `policy`: every
/// kernel fails to load with an error naming the device, the build, and every shipped variant;
/// `status()` says the same; nothing compiles.
fn check_no_fit(bundle: &Path, policy: JitPolicy, disabled_by: &str) {
    let dir = tempfile::tempdir().unwrap();
    let stripped = bundle_without_sm_90a(bundle, dir.path());
    let cache = dir.path().join("jit-cache");
    let cuda = jit_build();
    let registry = Registry::open_with(&stripped, options(Some(&cuda), policy, &cache)).unwrap();
    assert!(!registry.jit_allowed());
    let status = registry.status();
    for (name, record) in &registry.index().unwrap().kernels.clone() {
        let error = registry.load(name).unwrap_err();
        assert!(matches!(error, LoadError::NoFit { .. }), "{name}: {error}");
        let message = error.to_string();
        assert!(
            message.starts_with(&format!(
                "`{name}` has no prebuilt cubin for this GPU and {disabled_by} forbids \
                 compiling: device 0 (sm_90, compute 9.0), CUDA build {cuda}, driver "
            )),
            "{message}"
        );
        for variant in &record.variants {
            assert!(
                message.contains(&format!("{}: ", variant.label())),
                "{message}"
            );
        }
        for skip in &record.skipped {
            assert!(message.contains(&format!("{}/{}: not built", skip.cuda, skip.arch)));
        }
        assert_eq!(
            status[name],
            Status::Unavailable {
                reason: message.clone()
            }
        );
        eprintln!("{message}");
    }
    assert!(!cache.exists(), "nothing was compiled");
}

#[test]
fn tampered_artifact_is_never_loaded() {
    let Some(bundle) = gpu_bundle() else { return };
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("_prebuilt");
    copy_dir(&bundle, &copy);
    let opened = Bundle::open(&copy).unwrap();
    let index = opened.index();
    let cuda = jit_build();
    // The artifact `layernorm_bf16` would load, replaced by another kernel's (a valid frame).
    let (name, record) = index
        .kernels
        .iter()
        .find(|(_, record)| record.variants.iter().any(|v| v.cuda == build(&cuda)))
        .unwrap();
    let victim = record
        .variants
        .iter()
        .find(|variant| variant.cuda == build(&cuda) && variant.arch == arch("sm_90a"))
        .unwrap();
    // The smallest other cubin decompresses within the victim's recorded size, so the check
    // that fails is the digest; a larger one, or one of another family, would fail
    // decompression first. Every way refuses.
    let donor = index
        .kernels
        .values()
        .flat_map(|record| &record.variants)
        .filter(|variant| variant.artifact.digest != victim.artifact.digest)
        .min_by_key(|variant| variant.artifact.size)
        .unwrap();
    fs::copy(
        copy.join(&donor.artifact.path),
        copy.join(&victim.artifact.path),
    )
    .unwrap();
    let registry = Registry::open_with(
        &copy,
        options(Some(&cuda), JitPolicy::Disabled, &dir.path().join("jit")),
    )
    .unwrap();
    let error = registry.load(name).unwrap_err();
    let LoadError::Bundle(bundle_error) = &error else {
        panic!(
            "expected a verification failure, got {}",
            error_chain(&error)
        );
    };
    match bundle_error.as_ref() {
        BundleError::DigestMismatch {
            kernel,
            variant,
            expected,
            actual,
            ..
        } => {
            assert_eq!(
                (kernel, variant, expected, actual),
                (
                    name,
                    &victim.label(),
                    &victim.artifact.digest,
                    &donor.artifact.digest
                )
            );
        }
        // A larger donor, or one compressed against another family's dictionary, fails to
        // decompress (size bound, frame checksum) before its digest can be checked.
        BundleError::Corrupt {
            kernel, variant, ..
        } if donor.artifact.size > victim.artifact.size
            || donor.artifact.dictionary != victim.artifact.dictionary =>
        {
            assert_eq!((kernel, variant), (name, &victim.label()));
        }
        other => panic!("expected a digest mismatch, got {}", error_chain(other)),
    }
    eprintln!("{error}");
}

#[test]
fn arguments_are_checked_before_launch() {
    let Some(bundle) = gpu_bundle() else { return };
    let cache = tempfile::tempdir().unwrap();
    let registry = Registry::open_with(
        &bundle,
        options(Some(&jit_build()), JitPolicy::Disabled, cache.path()),
    )
    .unwrap();
    let kernel = registry.load("sigmoid_gate").unwrap();
    let function = kernel.function("sigmoid_gate").unwrap();
    assert_eq!(function.param_sizes(), [8, 8, 8, 4]);
    let too_few = [KernelArg::Ptr(0), KernelArg::Ptr(0), KernelArg::Ptr(0)];
    // SAFETY: the count is wrong, so nothing is launched.
    let error =
        unsafe { kernel.launch("sigmoid_gate", [1, 1, 1], [1, 1, 1], 0, &too_few) }.unwrap_err();
    assert!(matches!(error, LoadError::ArgumentCount { .. }), "{error}");
    let wrong_size = [
        KernelArg::Ptr(0),
        KernelArg::Ptr(0),
        KernelArg::Ptr(0),
        KernelArg::I64(4),
    ];
    // SAFETY: parameter 3 has the wrong size, so nothing is launched.
    let error =
        unsafe { kernel.launch("sigmoid_gate", [1, 1, 1], [1, 1, 1], 0, &wrong_size) }.unwrap_err();
    assert_eq!(
        error.to_string(),
        "argument 3 of `sigmoid_gate` (kernel `sigmoid_gate`) is 8 bytes, but parameter 3 is 4 \
         bytes"
    );
    let error = kernel.function("nope").unwrap_err();
    assert_eq!(
        error.to_string(),
        "`sigmoid_gate` has no entry `nope`; its entries are `sigmoid_gate`"
    );
    kernel.context().unwrap().synchronize().unwrap();
    // Loading again returns the same kernel.
    let again = registry.load("sigmoid_gate").unwrap();
    assert_eq!(again.provenance(), kernel.provenance());
}

// ---------------------------------------------------------------------------------------------
// Launches beyond the plain one, on a 9.0 GPU: more than 48 KB of dynamic shared memory, a
// cluster, a cooperative grid, programmatic dependent launch. The kernels are this file's own,
// shipped as sources only and compiled by the JIT for the device (no test bundle needed).
// ---------------------------------------------------------------------------------------------

/// Kernels that use what their launches ask for: each result is right only if the launch did
/// what its attribute says. No header: NVRTC compiles it with any include path.
const LAUNCH_SOURCE: &str = r#"
// Fills `n` floats of dynamic shared memory, then writes them out reversed: right only if the
// whole tile is there.
extern "C" __global__ void kw_big_shared(float* out, int n) {
    extern __shared__ float tile[];
    for (int i = threadIdx.x; i < n; i += blockDim.x) tile[i] = 2.0f * i + 1.0f;
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = tile[n - 1 - i];
}

// Per block: its rank in its cluster, the cluster's size, and the value its peer (rank ^ 1)
// put in the peer's own shared memory, read through distributed shared memory.
extern "C" __global__ void kw_cluster_ranks(unsigned int* out) {
    __shared__ unsigned int mine;
    unsigned int rank, size;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(size));
    if (threadIdx.x == 0) mine = blockIdx.x * 1000u + rank;
    asm volatile("barrier.cluster.arrive;\n\tbarrier.cluster.wait;" ::: "memory");
    if (threadIdx.x == 0) {
        unsigned int local, remote, peer_value;
        asm volatile("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }"
                     : "=r"(local) : "l"(&mine));
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                     : "=r"(remote) : "r"(local), "r"(rank ^ 1u));
        asm volatile("ld.shared::cluster.u32 %0, [%1];"
                     : "=r"(peer_value) : "r"(remote) : "memory");
        out[3 * blockIdx.x] = rank;
        out[3 * blockIdx.x + 1] = size;
        out[3 * blockIdx.x + 2] = peer_value;
    }
    // The peer's shared memory must outlive the read.
    asm volatile("barrier.cluster.arrive;\n\tbarrier.cluster.wait;" ::: "memory");
}

// Lets its dependent start at once, then takes a while before it writes `data`, and counts
// its finished blocks in `done`.
extern "C" __global__ void kw_pdl_producer(float* data, int n, unsigned int* done) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    long long start = clock64();
    while (clock64() - start < 2000000) {
    }
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) data[i] = (float)(i + 1);
    __syncthreads();
    if (threadIdx.x == 0) atomicAdd(done, 1u);
}

// Records how many producer blocks had finished when it started, waits for the producer grid
// (`griddepcontrol.wait`, which `cudaGridDependencySynchronize()` is), then doubles its data.
extern "C" __global__ void kw_pdl_consumer(const float* data, float* out, int n,
                                           const unsigned int* done, unsigned int* seen) {
    if (blockIdx.x == 0 && threadIdx.x == 0) seen[0] = *(const volatile unsigned int*)done;
    asm volatile("griddepcontrol.wait;" ::: "memory");
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = 2.0f * data[i];
}
"#;

/// A grid-wide barrier of its own (an arrival counter after the blocks' words), which only a
/// cooperative launch makes safe: a block spinning on it waits for blocks that must already be
/// resident. Every block's sum of every block's word is right only if all wrote before any read.
/// (No cooperative groups: their header needs CCCL, which a torch install's NVRTC lacks.)
const GRID_SYNC_SOURCE: &str = r#"
extern "C" __global__ void kw_grid_sync(unsigned int* slots, unsigned int* out) {
    if (threadIdx.x == 0) {
        slots[blockIdx.x] = blockIdx.x + 1u;
        __threadfence();
        atomicAdd(&slots[gridDim.x], 1u);
        while (((volatile unsigned int*)slots)[gridDim.x] < gridDim.x) {
        }
        __threadfence();
        unsigned int sum = 0;
        for (unsigned int block = 0; block < gridDim.x; ++block) {
            sum += ((volatile unsigned int*)slots)[block];
        }
        out[2 * blockIdx.x] = sum;
        out[2 * blockIdx.x + 1] = ((volatile unsigned int*)slots)[gridDim.x];
    }
}
"#;

/// `(kernel, source file, source, entries)` of the launch bundle.
const LAUNCH_KERNELS: [(&str, &str, &str, &[&str]); 2] = [
    (
        "launch_features",
        "launch_features.cu",
        LAUNCH_SOURCE,
        &[
            "kw_big_shared",
            "kw_cluster_ranks",
            "kw_pdl_producer",
            "kw_pdl_consumer",
        ],
    ),
    (
        "launch_grid_sync",
        "launch_grid_sync.cu",
        GRID_SYNC_SOURCE,
        &["kw_grid_sync"],
    ),
];

/// A bundle under `dir` with the launch kernels as sources only: every load is the JIT's.
fn launch_bundle(dir: &Path) -> PathBuf {
    let root = dir.join("_prebuilt");
    fs::create_dir_all(root.join(SOURCES_DIR)).unwrap();
    let mut kernels = BTreeMap::new();
    for (name, file, source, entries) in LAUNCH_KERNELS {
        fs::write(root.join(SOURCES_DIR).join(file), source).unwrap();
        let inputs = KernelInputs {
            entries: entries.iter().map(|entry| entry.to_string()).collect(),
            files: BTreeMap::from([(file.to_owned(), sha256_hex(source.as_bytes()))]),
            cxx_std: "c++17".to_owned(),
            ..KernelInputs::default()
        };
        kernels.insert(
            name.to_owned(),
            KernelRecord {
                inputs,
                recipe: Some(SourceRecipe {
                    source: file.to_owned(),
                    include_dirs: Vec::new(),
                }),
                constants: BTreeMap::new(),
                variants: Vec::new(),
                skipped: Vec::new(),
            },
        );
    }
    let index = Index {
        format: INDEX_FORMAT,
        store: None,
        package: "kwheel-launch-tests".to_owned(),
        torch: "2.13.*".to_owned(),
        dictionary: None,
        kernels,
        modules: Default::default(),
    };
    write_index(&root, &index);
    root
}

/// The launch kernel `name`, JIT-compiled for device 0, when it is a 9.0 GPU and a compiler is
/// found; else `None` with the reason printed. The directory holds the bundle and the cache.
fn launch_kernel(name: &str) -> Option<(prebuilt::registry::Kernel, tempfile::TempDir)> {
    if !device_0_is_9_0("these launches need 9.0") {
        return None;
    }
    // The compiler the JIT will take, found now so that a machine without one skips.
    let driver = Driver::get().unwrap().version();
    if let Err(error) = CompilerSearch::from_env().find(
        build(&jit_build()),
        Some(prebuilt::device::DriverVersion::from_api(driver)),
    ) {
        skipped!(
            "skipped: no compiler for the launch kernels: {}",
            error_chain(&error)
        );
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let bundle = launch_bundle(dir.path());
    let registry = Registry::open_with(
        &bundle,
        RegistryOptions {
            torch: None,
            ..options(
                Some(&jit_build()),
                JitPolicy::Allowed,
                &dir.path().join("jit"),
            )
        },
    )
    .unwrap();
    let kernel = registry
        .load(name)
        .unwrap_or_else(|error| panic!("{name}: {}", error_chain(&error)));
    Some((kernel, dir))
}

/// Launch geometry on the legacy default stream.
fn geometry(grid: [u32; 3], block: [u32; 3], shared_mem_bytes: u32) -> LaunchConfig {
    LaunchConfig {
        grid,
        block,
        shared_mem_bytes,
        stream: 0,
    }
}

fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|word| f32::from_ne_bytes(word.try_into().unwrap()))
        .collect()
}

fn words(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|word| u32::from_ne_bytes(word.try_into().unwrap()))
        .collect()
}

#[test]
fn dynamic_shared_memory_above_48_kb_launches_and_is_whole() {
    let Some((kernel, _dir)) = launch_kernel("launch_features") else {
        return;
    };
    let context = kernel.context().unwrap();
    // 100 KB of floats.
    let n: u32 = 25_600;
    let out = DeviceBuffer::from_host(context, &vec![0xff; n as usize * 4]).unwrap();
    let args = [KernelArg::from(&out), KernelArg::I32(n as i32)];
    let config = geometry([1, 1, 1], [256, 1, 1], n * 4);
    // SAFETY: `out` holds `n` floats, all the kernel writes; it outlives the synchronize.
    unsafe { kernel.launch_with("kw_big_shared", &config, &args) }
        .unwrap_or_else(|error| panic!("{}", error_chain(&error)));
    context.synchronize().unwrap();
    let got = floats(&out.copy_to_host().unwrap());
    for (index, value) in got.iter().enumerate() {
        let expected = 2.0 * (n as usize - 1 - index) as f32 + 1.0;
        assert_eq!(*value, expected, "element {index}");
    }
    // Less after more: the limit stays raised, the launch needs no raise.
    let smaller = geometry([1, 1, 1], [256, 1, 1], 64 * 1024);
    let args = [KernelArg::from(&out), KernelArg::I32(16 * 1024)];
    // SAFETY: as above, for fewer elements.
    unsafe { kernel.launch_with("kw_big_shared", &smaller, &args) }.unwrap();
    context.synchronize().unwrap();
    // Above the device's opt-in limit: refused before the driver sees it, naming the limit.
    let optin = context.limits().unwrap().shared_memory_per_block_optin;
    let too_much = geometry([1, 1, 1], [256, 1, 1], optin + 4);
    // SAFETY: refused before anything is launched.
    let error = unsafe { kernel.launch_with("kw_big_shared", &too_much, &args) }.unwrap_err();
    let message = error_chain(&error);
    assert!(matches!(error, LoadError::Launch(_)), "{message}");
    assert!(
        message.contains(&format!(
            "it asks for {} bytes of dynamic shared memory, but at most {optin} are possible",
            optin + 4
        )),
        "{message}"
    );
    assert!(
        message.contains("`kw_big_shared` of `launch_features`"),
        "{message}"
    );
    eprintln!("{message}");
}

#[test]
fn a_cluster_of_two_shares_its_shared_memory() {
    let Some((kernel, _dir)) = launch_kernel("launch_features") else {
        return;
    };
    let context = kernel.context().unwrap();
    let blocks: u32 = 8;
    let out = DeviceBuffer::from_host(context, &vec![0xff; blocks as usize * 12]).unwrap();
    let args = [KernelArg::from(&out)];
    let pairs = LaunchAttributes {
        cluster: Some([2, 1, 1]),
        ..LaunchAttributes::default()
    };
    let config = geometry([blocks, 1, 1], [64, 1, 1], 0);
    // SAFETY: `out` holds three words per block, all the kernel writes.
    unsafe { kernel.launch_with_attributes("kw_cluster_ranks", &config, &pairs, &args) }
        .unwrap_or_else(|error| panic!("{}", error_chain(&error)));
    context.synchronize().unwrap();
    let got = words(&out.copy_to_host().unwrap());
    for block in 0..blocks {
        let rank = block % 2;
        let peer = block ^ 1;
        assert_eq!(
            got[3 * block as usize..3 * block as usize + 3],
            [rank, 2, peer * 1000 + (rank ^ 1)],
            "block {block}"
        );
    }
    // A grid that is not a whole number of clusters: refused, nothing launched.
    let odd = geometry([blocks - 1, 1, 1], [64, 1, 1], 0);
    // SAFETY: refused before anything is launched.
    let error = unsafe { kernel.launch_with_attributes("kw_cluster_ranks", &odd, &pairs, &args) }
        .unwrap_err();
    let message = error_chain(&error);
    assert!(
        message.ends_with(
            "the grid (7, 1, 1) is not divisible by the cluster (2, 1, 1): each grid dimension \
             must be a multiple of the cluster's"
        ),
        "{message}"
    );
}

#[test]
fn a_cooperative_launch_synchronizes_its_whole_grid() {
    let Some((kernel, _dir)) = launch_kernel("launch_grid_sync") else {
        return;
    };
    let context = kernel.context().unwrap();
    let multiprocessors = context.limits().unwrap().multiprocessors;
    // One block per multiprocessor, so that the barrier spans the whole device.
    let blocks = multiprocessors;
    // A word per block, then the barrier's arrival counter.
    let slots = DeviceBuffer::from_host(context, &vec![0; (blocks as usize + 1) * 4]).unwrap();
    let out = DeviceBuffer::from_host(context, &vec![0xff; blocks as usize * 8]).unwrap();
    let args = [KernelArg::from(&slots), KernelArg::from(&out)];
    let cooperative = LaunchAttributes {
        cooperative: true,
        ..LaunchAttributes::default()
    };
    let config = geometry([blocks, 1, 1], [256, 1, 1], 0);
    // SAFETY: `slots` holds a word per block and the counter, `out` two words per block; both
    // outlive the synchronize.
    unsafe { kernel.launch_with_attributes("kw_grid_sync", &config, &cooperative, &args) }
        .unwrap_or_else(|error| panic!("{}", error_chain(&error)));
    context.synchronize().unwrap();
    let got = words(&out.copy_to_host().unwrap());
    let sum = blocks * (blocks + 1) / 2;
    for block in 0..blocks as usize {
        assert_eq!(
            got[2 * block..2 * block + 2],
            [sum, blocks],
            "block {block}"
        );
    }
    // More blocks than fit at once: refused with the numbers, before the driver sees it.
    let too_many = geometry([multiprocessors * 64, 1, 1], [1024, 1, 1], 0);
    // SAFETY: refused before anything is launched.
    let error =
        unsafe { kernel.launch_with_attributes("kw_grid_sync", &too_many, &cooperative, &args) }
            .unwrap_err();
    let message = error_chain(&error);
    assert!(
        message.contains("a cooperative launch needs every block resident at once"),
        "{message}"
    );
    eprintln!("{message}");
}

#[test]
fn a_programmatic_dependent_launch_waits_where_it_reads() {
    let Some((kernel, _dir)) = launch_kernel("launch_features") else {
        return;
    };
    let context = kernel.context().unwrap();
    let n: u32 = 4096;
    let block = 256;
    let grid = n / block;
    let data = DeviceBuffer::from_host(context, &vec![0; n as usize * 4]).unwrap();
    let out = DeviceBuffer::from_host(context, &vec![0xff; n as usize * 4]).unwrap();
    let done = DeviceBuffer::from_host(context, &[0; 4]).unwrap();
    let seen = DeviceBuffer::from_host(context, &[0xff; 4]).unwrap();
    let config = geometry([grid, 1, 1], [block, 1, 1], 0);
    let programmatic = LaunchAttributes {
        programmatic: true,
        ..LaunchAttributes::default()
    };
    // SAFETY: every buffer holds what the kernels index (`n` floats, one word each for the
    // counters) and outlives the synchronize; both launches are on the same stream.
    unsafe {
        kernel
            .launch_with(
                "kw_pdl_producer",
                &config,
                &[
                    KernelArg::from(&data),
                    KernelArg::I32(n as i32),
                    KernelArg::from(&done),
                ],
            )
            .unwrap_or_else(|error| panic!("{}", error_chain(&error)));
        kernel
            .launch_with_attributes(
                "kw_pdl_consumer",
                &config,
                &programmatic,
                &[
                    KernelArg::from(&data),
                    KernelArg::from(&out),
                    KernelArg::I32(n as i32),
                    KernelArg::from(&done),
                    KernelArg::from(&seen),
                ],
            )
            .unwrap_or_else(|error| panic!("{}", error_chain(&error)));
    }
    context.synchronize().unwrap();
    let got = floats(&out.copy_to_host().unwrap());
    for (index, value) in got.iter().enumerate() {
        assert_eq!(*value, 2.0 * (index + 1) as f32, "element {index}");
    }
    // Whether the consumer started early is the driver's choice; what it read is not.
    let seen = words(&seen.copy_to_host().unwrap())[0];
    eprintln!(
        "the consumer started with {seen} of {grid} producer blocks done{}",
        if seen < grid {
            " (it overlapped the producer)"
        } else {
            ""
        }
    );
}

// ---------------------------------------------------------------------------------------------
// Slim bundles: artifacts fetched from a store (the `fetch` feature). The store is the
// fault-injecting loopback server of `testkit::loopback_store`; the fault cases run on a CPU
// through `prebuilt::fetch`, which is what the loader calls; the last test loads on a GPU.
// ---------------------------------------------------------------------------------------------

#[cfg(feature = "fetch")]
use testkit::loopback_store;

#[cfg(feature = "fetch")]
mod slim {
    use super::loopback_store::{Fault, LoopbackStore};
    use super::*;
    use prebuilt::cache::ArtifactCache;
    use prebuilt::coverage::bundle_coverage as coverage;
    use prebuilt::device::{DeviceQuery, DriverVersion};
    use prebuilt::fetch::{
        obtain_remote, prefetch, FetchError, Prefetched, StoreHandle, StoreOptions,
    };
    use prebuilt::index::ArtifactLocation;
    use prebuilt::DownloadPolicy;

    /// Short timeouts and backoff, so that the fault cases take well under a second each.
    pub(super) fn quick() -> StoreOptions {
        StoreOptions {
            connect_timeout: Duration::from_millis(500),
            timeout: Duration::from_millis(400),
            attempts: 3,
            backoff: Duration::from_millis(10),
            token: None,
        }
    }

    /// The fixture bundle without the artifacts of `arch`, recording `store`, with every
    /// cubin in the store under its sha256.
    pub(super) fn slim_bundle(dir: &Path, arch_left_out: &str, store: &LoopbackStore) -> PathBuf {
        let root = fixture_bundle(dir);
        let mut index = Bundle::open(&root).unwrap().index().clone();
        for (bytes, ..) in FIXTURE_CUBINS {
            store.insert(&format!("/cas/{}", sha256_hex(bytes)), bytes);
        }
        for record in index.kernels.values() {
            for variant in &record.variants {
                if variant.arch == arch(arch_left_out) {
                    let _ = fs::remove_file(root.join(&variant.artifact.path));
                }
            }
        }
        index.set_store(Some(store.url()));
        write_index(&root, &index);
        root
    }

    pub(super) fn files_under(dir: &Path) -> Vec<PathBuf> {
        let mut found = Vec::new();
        let Ok(entries) = fs::read_dir(dir) else {
            return found;
        };
        for entry in entries.flatten() {
            if entry.file_type().unwrap().is_dir() {
                found.extend(files_under(&entry.path()));
            } else {
                found.push(entry.path());
            }
        }
        found
    }

    fn sm_100(cuda: &str) -> DeviceQuery {
        DeviceQuery {
            capability: (10, 0),
            driver: DriverVersion {
                major: 13,
                minor: 0,
            },
            cuda: build(cuda),
            torch: None,
        }
    }

    #[test]
    fn prefetch_brings_a_devices_variants_into_the_cache_and_they_turn_local() {
        let dir = tempfile::tempdir().unwrap();
        let store = LoopbackStore::start();
        let bundle = Bundle::open(slim_bundle(dir.path(), "sm_100a", &store)).unwrap();
        assert!(bundle.index().format >= prebuilt::index::STORE_INDEX_FORMAT);
        assert_eq!(bundle.index().format, bundle.index().required_format());
        let cache = ArtifactCache::new(dir.path().join("artifacts"));
        let query = sm_100("cu130");

        let before = coverage(&bundle, &query, None, &cache);
        for (name, kernel) in &before.kernels {
            assert_eq!(kernel.loads.as_deref(), Some("cu130/sm_100a"), "{name}");
            assert_eq!(kernel.location, Some(ArtifactLocation::Store), "{name}");
        }
        assert!(before.to_string().contains("remote"), "{before}");

        let report = prefetch(&bundle, &query, &cache, &quick()).unwrap();
        assert!(report.complete(), "{report}");
        // Both fixture kernels share their cubins: the second finds the first's download.
        let fetched = report
            .kernels
            .values()
            .filter(|outcome| matches!(outcome, Prefetched::Fetched { .. }))
            .count();
        assert_eq!(fetched, 1, "{report}");
        let cubin = FIXTURE_CUBINS[3].0;
        let entry = cache.entry_path(&sha256_hex(cubin)).unwrap();
        assert_eq!(fs::read(&entry).unwrap(), cubin);

        let after = coverage(&bundle, &query, None, &cache);
        for (name, kernel) in &after.kernels {
            assert_eq!(kernel.location, Some(ArtifactLocation::Cache), "{name}");
        }
        assert!(after.to_string().contains("local (cache)"), "{after}");
        // sm_90a stays in the wheel; nothing is fetched for it.
        let h100 = DeviceQuery {
            capability: (9, 0),
            ..query.clone()
        };
        for kernel in coverage(&bundle, &h100, None, &cache).kernels.values() {
            assert_eq!(kernel.location, Some(ArtifactLocation::Bundle));
        }

        // Offline now: a second prefetch needs the store no more.
        let gets = store.requests().len();
        store.fail_always(Some(Fault::Status(503)));
        let again = prefetch(&bundle, &query, &cache, &quick()).unwrap();
        assert!(again
            .kernels
            .values()
            .all(|outcome| matches!(outcome, Prefetched::Cached { .. })));
        assert_eq!(store.requests().len(), gets);
    }

    /// Asks for `fixture_axpy`'s cu130/sm_100a cubin through a store answering with `faults`,
    /// into a fresh cache; returns the result and the cache directory.
    fn fetch_with(
        faults: &[Fault],
        always: Option<Fault>,
    ) -> (Result<Vec<u8>, FetchError>, tempfile::TempDir, String) {
        let dir = tempfile::tempdir().unwrap();
        let store = LoopbackStore::start();
        let bundle = Bundle::open(slim_bundle(dir.path(), "sm_100a", &store)).unwrap();
        store.fail_next(faults.iter().cloned());
        store.fail_always(always);
        let cache = ArtifactCache::new(dir.path().join("artifacts"));
        let record = &bundle.index().kernels["fixture_axpy"];
        let variant = record
            .variants
            .iter()
            .find(|v| v.label() == "cu130/sm_100a")
            .unwrap();
        let url = format!("{}/cas/{}", store.url(), variant.artifact.digest);
        let connect = || StoreHandle::connect(&store.url(), &quick());
        let result = obtain_remote(
            bundle.root(),
            bundle.index().store.as_deref(),
            "fixture_axpy",
            variant,
            &cache,
            &connect,
        )
        .map(|(bytes, _)| bytes);
        (result, dir, url)
    }

    fn assert_fails_cleanly(faults: &[Fault], always: Option<Fault>, says: &str) {
        let started = Instant::now();
        let (result, dir, url) = fetch_with(faults, always);
        let error = result.unwrap_err();
        let text = error_chain(&error);
        assert!(text.contains(&url), "{text}");
        assert!(text.contains("`fixture_axpy` (cu130/sm_100a)"), "{text}");
        assert!(text.contains(says), "{text}");
        // Nothing partial, nothing unverified: the cache is empty, temp files included.
        assert_eq!(
            files_under(&dir.path().join("artifacts")),
            Vec::<PathBuf>::new()
        );
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn server_errors_are_retried_then_named() {
        // One 500 and one 503, then the object: retried, verified, cached.
        let (result, dir, _) = fetch_with(&[Fault::Status(500), Fault::Status(503)], None);
        assert_eq!(result.unwrap(), FIXTURE_CUBINS[3].0);
        assert_eq!(files_under(&dir.path().join("artifacts")).len(), 1);
        // 500 every time: three attempts, then an error naming the URL and the kernel.
        assert_fails_cleanly(&[], Some(Fault::Status(500)), "answered 500 (3 attempts)");
    }

    #[test]
    fn a_connection_dropped_mid_body_leaves_nothing() {
        let (result, _dir, _) = fetch_with(&[Fault::DropMidBody], None);
        assert_eq!(
            result.unwrap(),
            FIXTURE_CUBINS[3].0,
            "retried after the drop"
        );
        assert_fails_cleanly(&[], Some(Fault::DropMidBody), "3 attempts");
    }

    #[test]
    fn wrong_bytes_with_a_200_are_never_cached() {
        assert_fails_cleanly(
            &[],
            Some(Fault::WrongBytes),
            "failed verification: expected sha256",
        );
    }

    #[test]
    fn a_slow_server_times_out() {
        assert_fails_cleanly(
            &[],
            Some(Fault::Slow(Duration::from_millis(1500))),
            "3 attempts",
        );
    }

    #[test]
    fn a_missing_object_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let store = LoopbackStore::start();
        let bundle = Bundle::open(slim_bundle(dir.path(), "sm_100a", &store)).unwrap();
        for path in store.paths() {
            store.insert(&path, b"");
        }
        let empty = LoopbackStore::start();
        let cache = ArtifactCache::new(dir.path().join("artifacts"));
        let variant = &bundle.index().kernels["fixture_scalars"].variants[1];
        let connect = || StoreHandle::connect(&empty.url(), &quick());
        let error = obtain_remote(
            bundle.root(),
            bundle.index().store.as_deref(),
            "fixture_scalars",
            variant,
            &cache,
            &connect,
        )
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("answered 404; the store does not have it"),
            "{error}"
        );
        assert!(
            error.contains("`fixture_scalars` (cu129/sm_100a)"),
            "{error}"
        );
    }

    #[test]
    fn the_no_download_variable_follows_the_package() {
        assert!(DownloadPolicy::Allowed.allows_download("kwheel-fixtures"));
        assert!(!DownloadPolicy::Forbidden.allows_download("kwheel-fixtures"));
        assert_eq!(
            prebuilt::env::no_download_variable("kwheel-fixtures"),
            "KWHEEL_FIXTURES_NO_DOWNLOAD"
        );
    }

    /// On a 9.0 GPU: a slim bundle without sm_90a loads sm_90a from the store on first call,
    /// verified; a store serving wrong bytes loads nothing; with downloads forbidden and the
    /// JIT off, the error says what was not fetched.
    #[test]
    fn slim_bundle_fetches_verifies_and_loads_on_a_gpu() {
        match Driver::get().and_then(|driver| driver.device(0)) {
            Ok(device) if device.capability() == (9, 0) => {}
            Ok(device) => {
                return skipped!("skipped: device 0 is compute {:?}", device.capability())
            }
            Err(error) => return skipped!("skipped: {error}"),
        }
        let dir = tempfile::tempdir().unwrap();
        let store = LoopbackStore::start();
        let bundle = slim_bundle(dir.path(), "sm_90a", &store);
        let registry_options = |cache: &str, downloads| RegistryOptions {
            torch: None,
            downloads,
            artifact_cache: dir.path().join(cache),
            store: quick(),
            ..options(Some("cu130"), JitPolicy::Disabled, &dir.path().join("jit"))
        };

        let registry =
            Registry::open_with(&bundle, registry_options("good", DownloadPolicy::Allowed))
                .unwrap();
        let Status::Available { location, .. } = &registry.status()["fixture_axpy"] else {
            panic!("{:?}", registry.status());
        };
        assert_eq!(*location, Some(ArtifactLocation::Store));
        let started = Instant::now();
        let kernel = registry.load("fixture_axpy").unwrap();
        let first_call = started.elapsed();
        assert_eq!(kernel.location(), Some(ArtifactLocation::Cache));
        assert_eq!(
            kernel.provenance(),
            &Provenance::Prebuilt {
                variant: "cu130/sm_90a".into(),
                key: registry.index().unwrap().kernels["fixture_axpy"].variants[2]
                    .key
                    .clone(),
            }
        );
        eprintln!("first call with a loopback fetch: {first_call:?}");
        assert_eq!(files_under(&dir.path().join("good")).len(), 1);

        store.fail_always(Some(Fault::WrongBytes));
        let registry =
            Registry::open_with(&bundle, registry_options("wrong", DownloadPolicy::Allowed))
                .unwrap();
        let error = registry.load("fixture_axpy").unwrap_err();
        let text = error_chain(&error);
        assert!(matches!(error, LoadError::Fetch { .. }), "{text}");
        assert!(
            text.contains(&store.url()) && text.contains("`fixture_axpy`"),
            "{text}"
        );
        assert!(text.contains("KWHEEL_FIXTURES_NO_DOWNLOAD=1"), "{text}");
        assert!(files_under(&dir.path().join("wrong")).is_empty());

        let registry =
            Registry::open_with(&bundle, registry_options("none", DownloadPolicy::Forbidden))
                .unwrap();
        let error = registry.load("fixture_axpy").unwrap_err().to_string();
        assert!(
            error.contains("cu130/sm_90a: fits, but is only in the store"),
            "{error}"
        );
        assert!(files_under(&dir.path().join("none")).is_empty());
    }
}

// A bundle never steers the compiler; the JIT reads its inputs checked.
mod jit_flags;

// Property tests of the round trips: keys and torch pins; kernels.idx.
mod lookup_roundtrip;
mod properties;
// Warm packs: JIT results carried to a machine without a compiler, launched.
mod warm_pack;
