//! The loader on a GPU: every prebuilt cubin against its CPU reference, the JIT fallback for
//! real, `<PACKAGE>_JIT_FALLBACK=0`, and launches beyond the plain one.
//!
//! | test | runs where |
//! | --- | --- |
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
//! `KWHEEL_SITE_PACKAGES`, `VIRTUAL_ENV`, `CUDA_HOME`, …). The CPU tests of the loader are in
//! `status.rs`, `jit.rs`, `jit_flags.rs`, `fetch.rs`, `lookup.rs` and `properties.rs`; warm
//! packs on a GPU in `warm_pack.rs`.

mod common;

use common::*;

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
        kernels.insert(name.to_owned(), source_kernel(inputs, file, Vec::new()));
    }
    write_new_index(&root, "kwheel-launch-tests", kernels);
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
