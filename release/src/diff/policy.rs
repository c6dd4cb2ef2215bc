//! The release gate on a diff: what the manifest's `[release]` table forbids, as one line per
//! row or coverage change that breaks it.

use std::fmt::Write as _;

use super::{Change, ReleaseDiff};

/// A release gate on a diff: the manifest's `[release]` table
/// ([`bundler::manifest::ReleasePolicy`]); an absent field allows the change.
pub type DiffPolicy = bundler::manifest::ReleasePolicy;

/// What a policy finds wrong with a diff.
pub trait Breaches {
    /// The rows and coverage changes that break the policy, one line each; empty: it holds.
    fn breaches(&self, diff: &ReleaseDiff) -> Vec<String>;
}

impl Breaches for DiffPolicy {
    fn breaches(&self, diff: &ReleaseDiff) -> Vec<String> {
        let mut breaches = Vec::new();
        for row in &diff.rows {
            let at = format!("`{}` {}", row.kernel, row.target);
            if let (Some(limit), Some(increase)) =
                (self.max_register_increase, row.register_increase)
            {
                if increase > i64::from(limit) {
                    breaches.push(format!(
                        "{at}: registers +{increase}, over max-register-increase = {limit}"
                    ));
                }
            }
            if self.allow_spills == Some(false) && row.new_stack {
                breaches.push(format!(
                    "{at}: a new stack frame (local memory or spills), and allow-spills = false"
                ));
            }
            if self.allow_removed == Some(false) && row.change == Change::Removed {
                breaches.push(format!(
                    "{at}: removed ({}), and allow-removed = false",
                    row.why.join("; ")
                ));
            }
            if self.allow_abi_break == Some(false) && row.abi_break {
                breaches.push(format!(
                    "{at}: the entry parameters changed, and allow-abi-break = false"
                ));
            }
            if self.allow_requirement_change == Some(false) && !row.requirement_changes.is_empty() {
                breaches.push(format!(
                    "{at}: the kernel's requirements changed ({}), and allow-requirement-change \
                     = false",
                    row.requirement_changes.join("; ")
                ));
            }
        }
        if self.allow_removed == Some(false) {
            for row in diff.modules.iter().filter(|r| r.change == Change::Removed) {
                breaches.push(format!(
                    "module `{}` {}: removed ({}), and allow-removed = false",
                    row.module,
                    row.target,
                    row.why.join("; ")
                ));
            }
        }
        if self.allow_coverage_loss == Some(false) {
            for change in diff.coverage.iter().filter(|c| c.is_loss()) {
                breaches.push(format!(
                    "`{}` on {}: loaded {} and now nothing, and allow-coverage-loss = false",
                    change.kernel,
                    change.device,
                    change.old.as_deref().unwrap_or("-")
                ));
            }
        }
        breaches
    }
}

/// Writes `breaches` as the gate's message.
pub fn describe_breaches(breaches: &[String]) -> String {
    let mut text = String::new();
    for breach in breaches {
        let _ = writeln!(text, "  - {breach}");
    }
    text
}
