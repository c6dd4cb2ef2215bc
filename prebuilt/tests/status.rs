//! The registry without a GPU: what `status()` says on a machine without one, and a bad
//! `KWHEEL_CUDA_BUILD` refused when the registry opens (in a child process, which the variable
//! is set for).
//!
//! | test | runs where |
//! | --- | --- |
//! | `status_names_the_missing_gpu_for_every_kernel` | anywhere (with a GPU it checks the fit instead) |
//! | `a_bad_cuda_build_setting_is_refused_at_open` | anywhere |

mod common;

use common::*;

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
