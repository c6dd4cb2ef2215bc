//! Targets whose cubin cannot run there: arch-conditional kernels compiled for the other GPU
//! are skips, never variants; failed targets are not compiled again while nothing changes.

use super::*;

use prebuilt::coverage::coverage;
use prebuilt::cubin::stub_entries;
use prebuilt::device::{DeviceQuery, DriverVersion};
use prebuilt::index::Index;

/// The real work on Blackwell only; DeepGEMM's `DG_DEVICE_ASSERT` stub elsewhere. No system
/// header, so CUDA 12.9 compiles it with NVRTC.
const BLACKWELL_ONLY: &str = r#"
#define DEVICE_ASSERT(cond)                                                            \
  do {                                                                                 \
    if (not(cond)) {                                                                   \
      printf("Assertion failed: %s:%d, condition: %s\n", "gemm.cuh", __LINE__, #cond); \
      asm("trap;");                                                                    \
    }                                                                                  \
  } while (0)

extern "C" __global__ void blackwell_only(float* out, const float* in, int n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] * 2.0f;
#else
  if (blockIdx.x == 0 and threadIdx.x == 0)
    DEVICE_ASSERT(false and "This kernel only support sm_100f");
#endif
}
"#;

/// The real work on Hopper only; CUTLASS's print-and-return stub elsewhere. `<cstdio>` is a
/// system header, so CUDA 12.9 compiles it with nvcc and its own ptxas.
const HOPPER_ONLY: &str = r#"
#include <cstdio>

extern "C" __global__ void hopper_only(float* out, const float* in, int n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 1000
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] + 1.0f;
#else
  printf("ERROR : Arch conditional MMA instruction used without targeting appropriate "
         "compute capability. Aborting.\n");
#endif
}
"#;

fn arch_conditional_manifest(allow_stub: bool) -> String {
    format!(
        "[library]\npackage = \"arch-conditional\"\narchs = [\"sm_90a\", \"sm_100a\"]\n\
         cuda-builds = [\"cu129\", \"cu130\"]\ntorch = \"2.13.*\"\n\
         [kernels.blackwell_only]\nsources = [\"blackwell_only.cu\"]\n\
         entries = [\"blackwell_only\"]\nallow-stub = {allow_stub}\n\
         [kernels.hopper_only]\nsources = [\"hopper_only.cu\"]\nentries = [\"hopper_only\"]\n"
    )
}

/// (label, text) pairs: a variant's compiler kind, a skip's reason.
type Labelled = Vec<(String, String)>;

/// (label, compiler kind) of each variant, and (label, reason) of each skip.
fn targets(index: &Index, kernel: &str) -> (Labelled, Labelled) {
    let record = &index.kernels[kernel];
    let variants = record
        .variants
        .iter()
        .map(|variant| (variant.label(), variant.compiler.kind.clone()))
        .collect();
    let skips = record
        .skipped
        .iter()
        .map(|skip| (format!("{}/{}", skip.cuda, skip.arch), skip.reason.clone()))
        .collect();
    (variants, skips)
}

fn pairs(items: &[(&str, &str)]) -> Labelled {
    items
        .iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect()
}

/// What loads on a device of capability `capability` with the cu130 runtime.
fn loads(index: &Index, kernel: &str, capability: (u32, u32)) -> Option<String> {
    let query = DeviceQuery {
        capability,
        driver: DriverVersion::parse("13.0").unwrap(),
        cuda: "cu130".parse().unwrap(),
        torch: None,
    };
    coverage(index, &query).kernels[kernel].loads.clone()
}

#[test]
fn arch_conditional_kernels_are_skips_on_the_other_target() {
    let Some(toolchains) = toolchains() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let files = [
        ("blackwell_only.cu", BLACKWELL_ONLY),
        ("hopper_only.cu", HOPPER_ONLY),
    ];
    let manifest = write_library(dir.path(), &arch_conditional_manifest(false), &files);
    let summary = bundle_kernels(&options_in(dir.path(), &manifest, toolchains.clone())).unwrap();
    assert!(summary.failed().is_empty(), "{:?}", summary.failed());
    assert_eq!(summary.skipped(), 4);
    let index = &summary.index;

    // Every compiler route: NVRTC 12.9, nvcc 13.0, and nvcc 13.0 with ptxas 12.9.
    let (variants, skips) = targets(index, "blackwell_only");
    assert_eq!(
        variants,
        pairs(&[("cu129/sm_100a", "nvrtc"), ("cu130/sm_100a", "nvcc")])
    );
    for (label, reason) in &skips {
        let (prefix, rest) = reason.split_once(" (`blackwell_only`: ").unwrap();
        assert_eq!(
            prefix,
            "stub: the source compiles `blackwell_only` only for other targets; its sm_90a body \
             is a stub that aborts",
            "{label}"
        );
        assert!(
            rest.ends_with(
                " instructions that call vprintf, then trap); `allow-stub = true` would keep it"
            ),
            "{label}: {reason}"
        );
    }
    let labels: Vec<&str> = skips.iter().map(|(label, _)| label.as_str()).collect();
    assert_eq!(labels, ["cu129/sm_90a", "cu130/sm_90a"]);

    let (variants, skips) = targets(index, "hopper_only");
    assert_eq!(
        variants,
        pairs(&[("cu129/sm_90a", "nvcc+ptxas"), ("cu130/sm_90a", "nvcc")])
    );
    for (label, reason) in &skips {
        assert!(
            reason.starts_with(
                "stub: the source compiles `hopper_only` only for other targets; its sm_100a \
                 body is a stub that prints and computes nothing (`hopper_only`: "
            ) && reason.contains(" instructions that call vprintf, then return)"),
            "{label}: {reason}"
        );
    }

    // `dev coverage --fleet H100,B200`: nothing loads where only a stub was built.
    assert_eq!(loads(index, "blackwell_only", (9, 0)), None);
    assert_eq!(
        loads(index, "blackwell_only", (10, 0)).as_deref(),
        Some("cu130/sm_100a")
    );
    assert_eq!(
        loads(index, "hopper_only", (9, 0)).as_deref(),
        Some("cu130/sm_90a")
    );
    assert_eq!(loads(index, "hopper_only", (10, 0)), None);

    // `allow-stub = true` keeps them; the key is the same, so the cache serves them.
    let manifest = write_library(dir.path(), &arch_conditional_manifest(true), &files);
    let summary = bundle_kernels(&options_in(dir.path(), &manifest, toolchains.clone())).unwrap();
    assert!(summary.compiled().is_empty(), "{:?}", summary.compiled());
    let (variants, skips) = targets(&summary.index, "blackwell_only");
    assert_eq!(variants.len(), 4, "{variants:?}");
    assert!(skips.is_empty(), "{skips:?}");
    assert_eq!(targets(&summary.index, "hopper_only").1.len(), 2);

    // With `--require` a stub target is an error naming it.
    let mut opts = options_in(dir.path(), &manifest, toolchains);
    opts.require = true;
    let error = bundle_kernels(&opts).unwrap_err().to_string();
    assert!(
        error.starts_with(
            "`hopper_only` cannot be built for sm_100a (cu129): stub: the source compiles \
             `hopper_only` only for other targets"
        ),
        "{error}"
    );
}

#[test]
fn the_embedded_library_has_no_stub() {
    let Some(build) = default_build() else { return };
    let bundle = Bundle::open(&build.out).unwrap();
    let mut checked = 0;
    for (name, record) in &bundle.index().kernels {
        for skip in &record.skipped {
            assert_ne!(
                skip.kind,
                prebuilt::index::SkipKind::Stub,
                "{name}: {skip:?}"
            );
        }
        for variant in &record.variants {
            let cubin = bundle.read_artifact(name, variant).unwrap();
            assert_eq!(
                stub_entries(&cubin).unwrap(),
                Vec::new(),
                "{name} {}",
                variant.label()
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 50);
}

/// Builds sm_100a (a real cubin of `kw_axpy`) and fails sm_90a as a compiler that rejects the
/// source does, counting the calls.
struct FailsOnHopper {
    id: CompilerId,
    cubin: Vec<u8>,
    calls: Mutex<usize>,
}

impl Compiler for FailsOnHopper {
    fn id(&self) -> &CompilerId {
        &self.id
    }

    fn compile(&self, request: &CompileRequest<'_>) -> Result<CompileOutput, CompileError> {
        *self.calls.lock().unwrap() += 1;
        if request.job.arch.sm == 100 {
            return Ok(CompileOutput {
                cubin: self.cubin.clone(),
                log: String::new(),
                lowered_names: BTreeMap::new(),
            });
        }
        Err(CompileError::Failed {
            kernel: request.kernel.to_owned(),
            arch: request.job.arch,
            build: "cu130".parse().unwrap(),
            compiler: self.id.clone(),
            log: "k.cu(3): error: identifier \"undefined_thing\" is undefined\n".into(),
        })
    }
}

#[test]
fn a_failed_target_is_not_compiled_again_until_its_key_changes() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = write_library(
        dir.path(),
        "[library]\npackage = \"failing\"\narchs = [\"sm_90a\", \"sm_100a\"]\n\
         cuda-builds = [\"cu130\"]\ntorch = \"2.13.*\"\n\
         [kernels.k]\nsources = [\"k.cu\"]\nentries = [\"kw_axpy\"]\n",
        &[("k.cu", "// k\n")],
    );
    let compiler = Arc::new(FailsOnHopper {
        id: CompilerId {
            kind: CompilerKind::Nvcc,
            version: "13.0.88".into(),
        },
        cubin: std::fs::read(
            workspace().join("prebuilt/tests/fixtures/cubin/nvcc130_sm_100a.cubin"),
        )
        .unwrap(),
        calls: Mutex::new(0),
    });
    let toolchain = BuildToolchain {
        build: "cu130".parse().unwrap(),
        compiler: compiler.clone(),
        supported_sms: BTreeSet::from([90, 100]),
        include_dirs: Vec::new(),
        nvcc_route: None,
    };
    let build = || {
        let opts = options_in(dir.path(), &manifest, vec![toolchain.clone()]);
        let summary = bundle_kernels(&opts).unwrap();
        let index = std::fs::read(dir.path().join("out/index.json")).unwrap();
        (summary, index)
    };
    let calls = || *compiler.calls.lock().unwrap();
    let (first, first_index) = build();
    assert_eq!((calls(), first.failed().len()), (2, 1));
    let (second, second_index) = build();
    assert_eq!(calls(), 2, "neither target is compiled again");
    // The index records the failure as the first build did; the log says it was kept.
    assert_eq!(first_index, second_index);
    let record = std::fs::read_dir(dir.path().join("cache/kernels-v1"))
        .unwrap()
        .flat_map(|shard| std::fs::read_dir(shard.unwrap().path()).unwrap())
        .map(|entry| entry.unwrap().path())
        .find(|path| path.to_string_lossy().ends_with(".failed.json"))
        .expect("a failure record in the build cache");
    let log = &second.failed()[0].3;
    assert!(
        log.starts_with(
            "failed to compile `k` for sm_90a (cu130, nvcc 13.0.88):\nk.cu(3): error: identifier"
        ),
        "{log}"
    );
    assert!(
        log.ends_with(&format!(
            "(an earlier build with the same key failed this way and is not repeated; delete {} \
             to compile it again)",
            record.display()
        )),
        "{log}"
    );

    // A changed source is a new key: compiled again.
    std::fs::write(dir.path().join("k.cu"), "// k, edited\n").unwrap();
    let (third, _) = build();
    assert_eq!(calls(), 4);
    assert_eq!(third.failed().len(), 1);
    assert!(
        !third.failed()[0].3.contains("an earlier build"),
        "{third:?}"
    );

    // Deleting the record compiles it again.
    let (fourth, _) = build();
    assert_eq!(calls(), 4);
    for path in std::fs::read_dir(dir.path().join("cache/kernels-v1"))
        .unwrap()
        .flat_map(|shard| std::fs::read_dir(shard.unwrap().path()).unwrap())
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.to_string_lossy().ends_with(".failed.json"))
    {
        std::fs::remove_file(path).unwrap();
    }
    assert!(fourth.failed()[0].3.contains("an earlier build"));
    build();
    assert_eq!(calls(), 5);
}
