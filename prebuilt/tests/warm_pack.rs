//! Warm packs on a GPU (compute 9.0, `KWHEEL_TEST_BUNDLE`, an NVRTC the search finds): every
//! kernel of a copy of the test bundle without anything that runs on 9.0 is JIT-compiled into
//! "machine A"'s cache, exported as a warm pack, installed under "machine B"'s cache, and then
//! loaded there with the JIT disabled and no compiler in reach; each loads from the pack
//! (provenance `pack`), and every reference case runs and matches on the device.

mod common;

use prebuilt::jit::pack::{export_pack, install_pack};
use testkit::fixtures::no_compiler;

use common::*;

#[test]
fn warm_pack_kernels_load_without_a_compiler_and_match_their_references() {
    let Some(bundle) = gpu_bundle() else { return };
    let dir = tempfile::tempdir().unwrap();
    let stripped = bundle_without_sm_90a(&bundle, dir.path());
    let cuda = jit_build();
    let names: Vec<String> = Bundle::open(&stripped)
        .unwrap()
        .index()
        .kernels
        .keys()
        .cloned()
        .collect();

    // Machine A compiles every kernel once.
    let a_cache = dir.path().join("a-jit");
    {
        let registry = Registry::open_with(
            &stripped,
            options(Some(&cuda), JitPolicy::Allowed, &a_cache),
        )
        .unwrap();
        for name in &names {
            let kernel = registry
                .load(name)
                .unwrap_or_else(|error| panic!("{name}: {}", error_chain(&error)));
            assert_eq!(
                kernel.provenance().kind(),
                ProvenanceKind::JitCompiled,
                "{name}"
            );
        }
    }
    let opened = Bundle::open(&stripped).unwrap();
    let pack = dir.path().join("pack");
    let report = export_pack(&opened, &a_cache, &pack)
        .unwrap_or_else(|error| panic!("{}", error_chain(&error)));
    assert_eq!(report.entries.len(), names.len(), "{report:?}");
    eprintln!("exported: {:?}", report.entries);

    // Machine B: its own cache, the pack installed, no compiler, the JIT off.
    let b_cache = dir.path().join("b-jit");
    install_pack(&pack, &opened, &b_cache)
        .unwrap_or_else(|error| panic!("{}", error_chain(&error)));
    let mut options = options(Some(&cuda), JitPolicy::Disabled, &b_cache);
    options.compilers = no_compiler(dir.path());
    let registry = Registry::open_with(&stripped, options).unwrap();
    for (name, status) in registry.status() {
        match status {
            Status::Available {
                variant,
                provenance,
                ..
            } => {
                assert_eq!(variant, format!("{cuda}/sm_90a"), "{name}");
                assert_eq!(provenance, ProvenanceKind::Pack, "{name}");
            }
            Status::Unavailable { reason } => panic!("{name}: {reason}"),
        }
    }
    for name in &names {
        let started = Instant::now();
        let kernel = registry
            .load(name)
            .unwrap_or_else(|error| panic!("{name}: {}", error_chain(&error)));
        eprintln!(
            "{name}: {} in {:.2} ms",
            kernel.provenance(),
            started.elapsed().as_secs_f64() * 1e3
        );
        assert_eq!(kernel.provenance().kind(), ProvenanceKind::Pack, "{name}");
        assert!(
            kernel.trace_label().contains(" pack "),
            "{}",
            kernel.trace_label()
        );
    }
    let mut checked = 0;
    for case in cases() {
        run_case(&registry.load(case.kernel).unwrap(), &case);
        checked += 1;
    }
    eprintln!("{checked} reference cases match, loaded from the warm pack");
    assert!(checked > 0);
    assert!(
        !b_cache.join(prebuilt::jit::CACHE_LAYOUT).exists(),
        "nothing was compiled on machine B"
    );
}
