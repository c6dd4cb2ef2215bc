//! What a build reports: the events it sends on the way (a target the plan skips), and the
//! summary as a documented JSON report (`kwheel dev bundle-kernels --json`, docs/bundling.md).
//! The text a person reads is the CLI's rendering of the same summary.

use std::collections::BTreeMap;

use prebuilt::index::SkipReason;
use prebuilt::{Arch, CudaBuild};
use serde::Serialize;

use super::{BuildPlan, BundleSummary, Outcome, TargetOutcome};

/// The version of [`BuildReport`]'s layout.
pub const REPORT_FORMAT: u32 = 1;

/// Sends an event for each target `plan` skips: the ones the manifest leaves out listed when
/// few, else summed up by reason (FlashInfer's 15,970 cubins each leave out three), and each
/// other skip (a target beyond the toolchains) on its own.
pub(super) fn announce_skips(plan: &BuildPlan) {
    for (kernel, arch, build, why) in &plan.skipped {
        if !matches!(why, SkipReason::Declared(_)) {
            let name = &plan.kernels[*kernel].name;
            tracing::info!("skipping `{name}` for {arch} ({build}): {why}");
        }
    }
    for line in declared_lines(&plan.skipped, |index| &plan.kernels[index].name) {
        tracing::info!("{line}");
    }
}

/// A build as `--json` reports it.
#[derive(Debug, Serialize)]
pub struct BuildReport<'a> {
    /// [`REPORT_FORMAT`].
    pub format: u32,
    /// The bundle (or shard) folder.
    pub out: String,
    /// `written` or `unchanged`.
    pub bundle: &'static str,
    /// Wall time of the run, in seconds.
    pub seconds: f64,
    /// Targets by outcome: `built`, `cached` (of which `remote`), `skipped`, `failed`.
    pub counts: BTreeMap<&'static str, usize>,
    /// Every target with its outcome.
    pub targets: &'a [TargetOutcome],
    /// Extension modules compiled in this run, as `module/cuXYZ/cpu`.
    pub modules_compiled: Vec<String>,
    /// What the build farm did, when the build used one (`--farm`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub farm: Option<&'a crate::farm::FarmReport>,
}

impl<'a> BuildReport<'a> {
    /// The report of `summary`; `written` is how the CLI words its write outcome.
    pub fn new(summary: &'a BundleSummary, written: &'static str) -> BuildReport<'a> {
        let mut counts = BTreeMap::from([
            ("built", 0),
            ("cached", 0),
            ("remote", 0),
            ("skipped", 0),
            ("failed", 0),
        ]);
        for target in &summary.targets {
            let kind = match &target.outcome {
                Outcome::Built(built) => match built.source {
                    super::Provenance::Compiled => "built",
                    super::Provenance::Cached => "cached",
                    super::Provenance::Remote => {
                        *counts.get_mut("cached").expect("listed") += 1;
                        "remote"
                    }
                },
                Outcome::Skipped { .. } => "skipped",
                Outcome::Failed(_) => "failed",
            };
            *counts.get_mut(kind).expect("listed") += 1;
        }
        BuildReport {
            format: REPORT_FORMAT,
            out: summary.out.display().to_string(),
            bundle: written,
            seconds: summary.elapsed.as_secs_f64(),
            counts,
            targets: &summary.targets,
            modules_compiled: summary
                .modules_compiled
                .iter()
                .map(|(module, build, cpu)| format!("{module}/{build}/{cpu}"))
                .collect(),
            farm: summary.farm.as_ref(),
        }
    }
}

/// What to say of the targets the manifest leaves out of kernels (the plan's skips whose
/// reason is [`SkipReason::Declared`]): each one when they are few, else how many each reason
/// leaves out, with the first it does.
fn declared_lines<'a>(
    skipped: &[(usize, Arch, CudaBuild, SkipReason)],
    name: impl Fn(usize) -> &'a str,
) -> Vec<String> {
    const LISTED: usize = 20;
    let declared: Vec<(usize, Arch, CudaBuild, String)> = skipped
        .iter()
        .filter(|(.., why)| matches!(why, SkipReason::Declared(_)))
        .map(|(index, arch, build, why)| (*index, *arch, *build, why.to_string()))
        .collect();
    if declared.len() <= LISTED {
        return declared
            .iter()
            .map(|(index, arch, build, reason)| {
                format!("skipping `{}` for {arch} ({build}): {reason}", name(*index))
            })
            .collect();
    }
    let mut by_reason: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for (at, (.., reason)) in declared.iter().enumerate() {
        by_reason.entry(reason).or_insert((0, at)).0 += 1;
    }
    let mut reasons: Vec<_> = by_reason.into_iter().collect();
    reasons.sort_by_key(|(_, (count, first))| (std::cmp::Reverse(*count), *first));
    let mut lines = vec![format!(
        "skipping {} targets the manifest leaves out of kernels (the index records each), by \
         reason:",
        declared.len()
    )];
    for (reason, (count, first)) in reasons.iter().take(LISTED) {
        let (index, arch, build, _) = &declared[*first];
        lines.push(format!(
            "  {count} × {reason} (first: `{}` for {arch} ({build}))",
            name(*index)
        ));
    }
    if reasons.len() > LISTED {
        lines.push(format!("  and {} more reasons", reasons.len() - LISTED));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declared_skips_are_listed_when_few_and_summed_up_by_reason_when_many() {
        let names: Vec<String> = (0..3000).map(|n| format!("k{n:05}")).collect();
        let (sm_100, sm_100a): (Arch, Arch) =
            ("sm_100".parse().unwrap(), "sm_100a".parse().unwrap());
        let cu130: CudaBuild = "cu130".parse().unwrap();
        let only = |arch: &str| SkipReason::Declared(format!("the kernel targets only {arch}"));
        // A skip of another kind is said on its own line, not here.
        let unsupported = SkipReason::Unsupported("nvrtc 12.9 cannot target sm_100a".into());
        let few = vec![
            (7, sm_100, cu130, only("sm_100f")),
            (7, sm_100a, cu130, unsupported),
        ];
        assert_eq!(
            declared_lines(&few, |index| &names[index]),
            ["skipping `k00007` for sm_100 (cu130): declared: the kernel targets only sm_100f"]
        );
        // FlashInfer's shape: thousands of kernels, each leaving out targets for a few reasons.
        let mut many = Vec::new();
        for index in 0..3000 {
            many.push((index, sm_100, cu130, only("sm_100f")));
            if index % 3 == 0 {
                many.push((index, sm_100a, cu130, only("sm_103a")));
            }
            // And 30 reasons of one kernel each: the 20 most common are shown.
            if index < 30 {
                many.push((index, sm_100a, cu130, only(&format!("sm_{index}"))));
            }
        }
        let lines = declared_lines(&many, |index| &names[index]);
        assert_eq!(lines.len(), 1 + 20 + 1, "{lines:#?}");
        assert_eq!(
            lines[0],
            "skipping 4030 targets the manifest leaves out of kernels (the index records each), \
             by reason:"
        );
        assert_eq!(
            lines[1],
            "  3000 × declared: the kernel targets only sm_100f (first: `k00000` for sm_100 \
             (cu130))"
        );
        assert_eq!(
            lines[2],
            "  1000 × declared: the kernel targets only sm_103a (first: `k00000` for sm_100a \
             (cu130))"
        );
        assert!(lines[3].starts_with("  1 × declared: the kernel targets only sm_0 "));
        assert_eq!(lines[21], "  and 12 more reasons");
    }
}
