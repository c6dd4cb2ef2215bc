//! The gates past the wheel: `gpu` (every kernel loads prebuilt on this machine's GPU) and
//! `publish` (the artifacts and wheels are in the store and read back intact).

use std::collections::BTreeMap;
use std::path::PathBuf;

use prebuilt::error_chain;
use prebuilt::Bundle;

use super::{CheckOptions, Run};

/// What lets the `gpu` gate run, or says it need not.
const NO_GPU: &str = "run the check on a machine with a GPU, or turn the gate off by name with \
                      --skip gpu (the load is then checked only on simulated devices, by `install`)";

pub(super) fn check_gpu(run: &mut Run, bundle: &Bundle) {
    let driver = match prebuilt::driver::Driver::get() {
        Ok(driver) => driver,
        Err(error) => {
            return run.incomplete("gpu", format!("not run: no GPU here: {error}"), NO_GPU)
        }
    };
    if !matches!(driver.device_count(), Ok(n) if n > 0) {
        return run.incomplete(
            "gpu",
            "not run: no GPU here: the driver sees no device",
            NO_GPU,
        );
    }
    let options = prebuilt::RegistryOptions {
        jit: prebuilt::JitPolicy::Disabled,
        ..prebuilt::RegistryOptions::default()
    };
    let registry = match prebuilt::Registry::open_with(bundle.root(), options) {
        Ok(registry) => registry,
        Err(error) => return run.fail("gpu", error_chain(&error), "see the error"),
    };
    let mut loaded = BTreeMap::new();
    let mut failures = Vec::new();
    for name in bundle.index().kernels.keys() {
        match registry.load(name) {
            Ok(kernel) => {
                loaded.insert(name.clone(), kernel.provenance().to_string());
            }
            Err(error) => failures.push(error_chain(&error)),
        }
    }
    if failures.is_empty() {
        run.pass(
            "gpu",
            format!(
                "{} kernels load prebuilt with the JIT disabled",
                loaded.len()
            ),
        );
    } else {
        run.fail(
            "gpu",
            failures.join("; "),
            "build the variants this GPU needs",
        );
    }
}

/// Publishes the bundle's artifacts and every wheel in the wheel directory; the publisher
/// verifies each object by downloading it again.
pub(super) fn check_publish(run: &mut Run, options: &CheckOptions, store: &str) {
    let wheels: Vec<PathBuf> = std::fs::read_dir(&options.wheels)
        .map(|entries| {
            let mut wheels: Vec<PathBuf> = entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "whl"))
                .collect();
            wheels.sort();
            wheels
        })
        .unwrap_or_default();
    let published = crate::publish::publish(&crate::publish::PublishOptions {
        bundles: vec![options.bundle.clone()],
        wheels,
        ..crate::publish::PublishOptions::new(store)
    });
    match published {
        Ok(report) => run.pass(
            "publish",
            format!(
                "{} objects in {store} and verified by download ({} uploaded now)",
                report.objects.len(),
                report.uploaded()
            ),
        ),
        Err(error) => run.fail(
            "publish",
            error_chain(&error),
            "check the store URL and $KWHEEL_STORE_TOKEN, then rerun",
        ),
    }
}
