//! The `against` gate: `release diff OLD <this bundle>` held to the manifest's `[release]`
//! policy (`max-register-increase`, `allow-spills`, `allow-coverage-loss`, `allow-removed`,
//! `allow-abi-break`), failing with the rows that break it.

use std::path::Path;

use bundler::Manifest;
use prebuilt::coverage::FleetDevice;
use prebuilt::device::DeviceQuery;
use prebuilt::error_chain;

use super::Run;
use crate::diff::{describe_breaches, diff_releases, Breaches as _, Release};

pub(super) fn check_against(run: &mut Run, manifest: &Manifest, old: &Path, bundle: &Path) {
    let opened = Release::open(old).and_then(|old| Ok((old, Release::open(bundle)?)));
    let (old_release, new_release) = match opened {
        Ok(pair) => pair,
        Err(error) => {
            run.fail(
                "against",
                format!(
                    "cannot compare with {}: {}",
                    old.display(),
                    error_chain(&error)
                ),
                "give --against an earlier release's wheel or bundle folder",
            );
            return;
        }
    };
    let fleet: Result<Vec<FleetDevice>, _> = manifest
        .release
        .fleet
        .iter()
        .map(|device| FleetDevice::parse(device))
        .collect();
    let fleet = match fleet {
        Ok(fleet) => fleet,
        Err(error) => {
            run.fail(
                "against",
                format!("`[release] fleet`: {error}"),
                "name known GPUs (H100, B200, ...) or capabilities in `fleet`",
            );
            return;
        }
    };
    let build = prebuilt::device::default_build(&manifest.library.cuda_builds, None);
    let query = DeviceQuery::simulated((9, 0), build, None, None);
    let fleet = (!fleet.is_empty()).then_some((fleet.as_slice(), &query));
    let diff = match diff_releases(&old_release, &new_release, fleet) {
        Ok(diff) => diff,
        Err(error) => {
            run.fail(
                "against",
                error_chain(&error),
                "check that both releases are readable",
            );
            return;
        }
    };
    let changed = diff.changed().count();
    let breaches = manifest.release.breaches(&diff);
    if breaches.is_empty() {
        run.pass(
            "against",
            format!(
                "{changed} of {} kernel targets changed since {}, within the `[release]` policy",
                diff.rows.len(),
                old.display()
            ),
        );
    } else {
        run.fail(
            "against",
            format!(
                "{} breach(es) of the `[release]` policy since {}:\n{}",
                breaches.len(),
                old.display(),
                describe_breaches(&breaches).trim_end()
            ),
            "fix the kernels, or change the policy in kernels.toml's `[release]` table",
        );
    }
}
