//! The JIT cache under many processes and a killed one, on a CPU, and the JIT's
//! reproduction of the bundled cubins.
//!
//! | test | runs where |
//! | --- | --- |
//! | `jit_compiles_once_across_processes` | NVRTC 12.9 toolchain installed |
//! | `jit_lock_dies_with_its_process` | NVRTC 12.9 toolchain installed |
//! | `jit_reproduces_the_bundled_cubins` | `KWHEEL_TEST_BUNDLE`, and the NVRTC 12.9 or nvcc 13.0 toolchain |
//!
//! Elsewhere a test prints `skipped: <reason>` and passes; `KWHEEL_REQUIRE_TOOLCHAINS=1` makes
//! a missing toolchain a failure. Tests that compile with NVRTC 12.9 do it in child processes
//! (this binary, re-run with `KWHEEL_TEST_ROLE`), because one process holds one libnvrtc.

mod common;

use common::*;

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
