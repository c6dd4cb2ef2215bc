//! `kwheel release check`: the release checklist as one command.
//!
//! Each gate verifies one promise of a release and reports ✔ (passed), ✘ (failed), `?` (could
//! not run here: the check is *incomplete*, never passed) or `-` (optional and not asked for,
//! or turned off by name with `--skip GATE`), with the reason and, when it fails, the fix. A
//! gate never crashes the check: a broken tree is a failing gate. The check builds only what is
//! missing (and says so); with `no_rebuild` a missing artifact is a failure instead, and
//! nothing is compiled again (the `rebuild` gate is off). The gates and the commands behind them are listed in
//! `docs/release-checklist.md`.
//!
//! | gate | passes when |
//! | --- | --- |
//! | `version` | the version is semver, above the last release, and stated the same everywhere |
//! | `bundle` | the bundle exists (or was just built) and covers the whole matrix or declares each skip |
//! | `keys` | every bundled key matches the current sources |
//! | `cubins` | every artifact verifies against its digest and validates as a cubin for its target |
//! | `against` | with `--against OLD`: `release diff OLD <bundle>` keeps the manifest's `[release]` policy (registers, spills, coverage, removed targets, parameter layouts) |
//! | `rebuild` | a sample of variants (`--rebuild-sample N`, default 2, first by key) compiled again from source with an empty cache is byte-identical to the bundle's |
//! | `reproducible` | two builds of the wheel are byte-identical |
//! | `wheel` | `wheel verify` and the manylinux audit pass on the wheel |
//! | `parts` | a wheel cut to `[wheel] max-file-size` has every part beside it, each artifact in exactly one wheel of the set, every file within the limit, every part pinned |
//! | `install` | the wheels install into a fresh venv and every kernel selects on simulated devices |
//! | `gpu` | with a GPU: every kernel loads prebuilt with the JIT disabled |
//! | `size` | the wheel is within the size budget |
//! | `publish` | optional: the artifacts and wheels are in the store and read back intact |
//!
//! | module | gates |
//! | --- | --- |
//! | `source` | `version`, `bundle`, `keys`, `cubins`: the tree and the bundle built from it |
//! | `rebuild` | `rebuild`: the bundle's bytes against a fresh compile of a sample |
//! | `wheel` | `reproducible`, `wheel`, `parts`, `install`, `size`: the wheels built from the bundle |
//! | `delivery` | `gpu`, `publish`: the bundle on a device, the artifacts in the store |

mod against;
mod delivery;
mod rebuild;
mod source;
mod wheel;

use std::fmt;
use std::path::PathBuf;

use bundler::{BuildToolchain, Manifest};
use prebuilt::error_chain;
use serde::Serialize;

use against::check_against;
use delivery::{check_gpu, check_publish};
use rebuild::check_rebuild;
pub use rebuild::DEFAULT_REBUILD_SAMPLE;
use source::{check_bundle, check_cubins, check_keys, check_version};
use wheel::{check_install, check_parts, check_reproducible, check_size, check_wheel, part_wheels};

use crate::library::LibraryWheelOptions;

/// PyPI's default limit on one file, the default size budget.
pub const DEFAULT_SIZE_BUDGET: u64 = 100 * 1000 * 1000;

/// What `release check` checks.
#[derive(Clone)]
pub struct CheckOptions {
    /// The kernel manifest.
    pub manifest: PathBuf,
    /// The bundle.
    pub bundle: PathBuf,
    /// The directory holding the wheels.
    pub wheels: PathBuf,
    /// Override of the manifest's torch pin.
    pub torch: Option<String>,
    /// A missing bundle or wheel fails its gate instead of being built.
    pub no_rebuild: bool,
    /// Largest acceptable wheel, in bytes.
    pub size_budget: u64,
    /// Release tags are `<prefix><version>`.
    pub tag_prefix: String,
    /// The build cache, for what must be built.
    pub cache_dir: PathBuf,
    /// Parallel compile jobs, for what must be built.
    pub jobs: usize,
    /// Toolchains; `None` discovers them.
    pub toolchains: Option<Vec<BuildToolchain>>,
    /// The kwheel workspace to build the runtime wheel from when the wheel directory lacks
    /// one; `None` uses only a runtime wheel already there (and skips the install gate
    /// without one).
    pub runtime_workspace: Option<PathBuf>,
    /// The Python interpreter that makes the fresh environment.
    pub python: PathBuf,
    /// Publish the bundle's artifacts and the wheels to this store and verify them by
    /// download (the optional `publish` gate); `None` skips it.
    pub publish: Option<String>,
    /// How many compiled variants the `rebuild` gate compiles again from source (the first by
    /// key); 0 skips the gate.
    pub rebuild_sample: usize,
    /// An earlier release (wheel or bundle) the `against` gate compares this one with.
    pub against: Option<PathBuf>,
    /// Gates turned off by name (`--skip gpu`): reported as off, neither run nor required.
    pub skip: Vec<String>,
}

impl CheckOptions {
    /// The defaults of `kwheel release check` for the manifest at `manifest`.
    pub fn new(manifest: impl Into<PathBuf>) -> CheckOptions {
        let wheel = LibraryWheelOptions::new(PathBuf::new());
        CheckOptions {
            manifest: manifest.into(),
            bundle: wheel.bundle,
            wheels: wheel.out,
            torch: None,
            no_rebuild: false,
            size_budget: DEFAULT_SIZE_BUDGET,
            tag_prefix: "v".to_owned(),
            cache_dir: wheel.cache_dir,
            jobs: wheel.jobs,
            toolchains: None,
            runtime_workspace: crate::runtime::source_workspace(),
            python: PathBuf::from("python3"),
            publish: None,
            rebuild_sample: DEFAULT_REBUILD_SAMPLE,
            against: None,
            skip: Vec::new(),
        }
    }
}

/// The gates `--skip` can turn off, in the order the check runs them: every gate but
/// `bundle` and `reproducible`, which make what the others check.
pub const SKIPPABLE: [&str; 11] = [
    "version", "keys", "cubins", "rebuild", "against", "wheel", "parts", "install", "gpu", "size",
    "publish",
];

/// How a gate ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GateStatus {
    /// The promise holds.
    Pass,
    /// The promise is broken.
    Fail,
    /// The gate is optional and was not asked for, turned off by name, or has nothing to
    /// check (with the reason).
    Skip,
    /// A gate the release needs could not run here (with the reason and what would let it
    /// run): the check is incomplete, not passed.
    Incomplete,
}

/// How the whole check ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// Every gate passed, or was optional, turned off by name or had nothing to check.
    Passed,
    /// No gate failed, but at least one the release needs could not run here.
    Incomplete,
    /// At least one gate failed.
    Failed,
}

/// One line of the checklist.
#[derive(Clone, Debug, Serialize)]
pub struct Gate {
    /// The gate's name.
    pub name: &'static str,
    /// How it ended.
    pub status: GateStatus,
    /// What was found.
    pub reason: String,
    /// How to fix a failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

/// The whole checklist.
#[derive(Clone, Debug, Serialize)]
pub struct Checklist {
    /// The gates, in order.
    pub gates: Vec<Gate>,
    /// What the check built because it was missing.
    pub built: Vec<String>,
}

impl Checklist {
    /// Whether every gate passed, or was optional, off or had nothing to check: not when one
    /// failed or could not run.
    pub fn passed(&self) -> bool {
        self.outcome() == Outcome::Passed
    }

    /// How the check ended: failed when a gate failed, else incomplete when a gate could not
    /// run, else passed.
    pub fn outcome(&self) -> Outcome {
        let any = |status| self.gates.iter().any(|g| g.status == status);
        if any(GateStatus::Fail) {
            Outcome::Failed
        } else if any(GateStatus::Incomplete) {
            Outcome::Incomplete
        } else {
            Outcome::Passed
        }
    }

    /// The names of the gates that ended with `status`.
    pub fn named(&self, status: GateStatus) -> Vec<&'static str> {
        self.gates
            .iter()
            .filter(|g| g.status == status)
            .map(|g| g.name)
            .collect()
    }

    /// The gate named `name`.
    pub fn gate(&self, name: &str) -> Option<&Gate> {
        self.gates.iter().find(|g| g.name == name)
    }
}

impl fmt::Display for Checklist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for built in &self.built {
            writeln!(f, "  built {built}")?;
        }
        let width = self.gates.iter().map(|g| g.name.len()).max().unwrap_or(0);
        for gate in &self.gates {
            let mark = match gate.status {
                GateStatus::Pass => "✔",
                GateStatus::Fail => "✘",
                GateStatus::Skip => "-",
                GateStatus::Incomplete => "?",
            };
            writeln!(f, "{mark} {:<width$}  {}", gate.name, gate.reason)?;
            if let Some(fix) = &gate.fix {
                writeln!(f, "  {:<width$}  fix: {fix}", "")?;
            }
        }
        match self.outcome() {
            Outcome::Passed => writeln!(f, "release check passed"),
            Outcome::Failed => writeln!(
                f,
                "release check failed: {}",
                self.named(GateStatus::Fail).join(", ")
            ),
            Outcome::Incomplete => writeln!(
                f,
                "release check incomplete: {} could not run here (nothing failed; run it where \
                 they can, or turn a gate off by name with --skip)",
                self.named(GateStatus::Incomplete).join(", ")
            ),
        }
    }
}

struct Run {
    gates: Vec<Gate>,
    built: Vec<String>,
    /// Gates turned off by name.
    off: Vec<String>,
}

impl Run {
    fn new(off: &[String]) -> Run {
        Run {
            gates: Vec::new(),
            built: Vec::new(),
            off: off.to_vec(),
        }
    }

    /// Whether gate `name` is turned off by name; if so, it is reported as off.
    fn off(&mut self, name: &'static str) -> bool {
        let off = self.off.iter().any(|gate| gate == name);
        if off {
            self.skip(name, format!("off (--skip {name})"));
        }
        off
    }

    fn pass(&mut self, name: &'static str, reason: impl Into<String>) {
        self.push(name, GateStatus::Pass, reason.into(), None);
    }

    fn fail(&mut self, name: &'static str, reason: impl Into<String>, fix: impl Into<String>) {
        self.push(name, GateStatus::Fail, reason.into(), Some(fix.into()));
    }

    fn skip(&mut self, name: &'static str, reason: impl Into<String>) {
        self.push(name, GateStatus::Skip, reason.into(), None);
    }

    /// A gate the release needs that could not run here, and what would let it run.
    fn incomplete(
        &mut self,
        name: &'static str,
        reason: impl Into<String>,
        fix: impl Into<String>,
    ) {
        self.push(
            name,
            GateStatus::Incomplete,
            reason.into(),
            Some(fix.into()),
        );
    }

    fn push(
        &mut self,
        name: &'static str,
        status: GateStatus,
        reason: String,
        fix: Option<String>,
    ) {
        self.gates.push(Gate {
            name,
            status,
            reason,
            fix,
        });
    }
}

/// The `against` gate alone: `release diff OLD <bundle>` held to the manifest's `[release]`
/// policy.
pub fn against_gate(manifest: &Manifest, old: &std::path::Path, bundle: &std::path::Path) -> Gate {
    let mut run = Run::new(&[]);
    check_against(&mut run, manifest, old, bundle);
    run.gates.remove(0)
}

/// Runs every gate.
pub fn release_check(options: &CheckOptions) -> Checklist {
    let mut run = Run::new(&options.skip);
    let manifest = match Manifest::load(&options.manifest) {
        Ok(manifest) => manifest,
        Err(error) => {
            run.fail(
                "manifest",
                format!("{:#}", error_chain(&error)),
                "fix the manifest",
            );
            return Checklist {
                gates: run.gates,
                built: run.built,
            };
        }
    };
    let torch = options
        .torch
        .clone()
        .unwrap_or_else(|| manifest.library.torch.clone());

    if !run.off("version") {
        check_version(&mut run, &manifest, &options.tag_prefix);
    }
    let bundle = check_bundle(&mut run, &manifest, options, &torch);
    match &bundle {
        Some(bundle) => {
            if !run.off("keys") {
                check_keys(&mut run, &manifest, options, &torch);
            }
            if !run.off("cubins") {
                check_cubins(&mut run, bundle);
            }
            if options.no_rebuild {
                run.skip("rebuild", "off (--no-rebuild: nothing is compiled)");
            } else if !run.off("rebuild") {
                check_rebuild(&mut run, &manifest, options, &torch, bundle);
            }
            match &options.against {
                _ if run.off("against") => {}
                Some(old) => check_against(&mut run, &manifest, old, &options.bundle),
                None => run.skip("against", "optional: give --against <earlier release>"),
            }
        }
        None => {
            for name in ["keys", "cubins", "rebuild", "against"] {
                run.skip(name, "no bundle to check");
            }
        }
    }
    let wheel = if bundle.is_some() {
        // Builds the wheel the later gates check: never off.
        check_reproducible(&mut run, options)
    } else {
        run.skip("reproducible", "no bundle to build wheels from");
        None
    };
    let mut parts = Vec::new();
    match &wheel {
        Some(wheel) => {
            let report = if run.off("wheel") {
                None
            } else {
                check_wheel(&mut run, wheel)
            };
            match &report {
                _ if run.off("parts") => {}
                Some(report) => check_parts(&mut run, report),
                None => run.skip("parts", "the wheel was not verified"),
            }
            parts = part_wheels(wheel, report.as_ref());
            if !run.off("install") {
                check_install(&mut run, &manifest, options, wheel, &parts);
            }
        }
        None => {
            for name in ["wheel", "parts", "install"] {
                run.skip(name, "no wheel to check");
            }
        }
    }
    match &bundle {
        _ if run.off("gpu") => {}
        Some(bundle) => check_gpu(&mut run, bundle),
        None => run.skip("gpu", "no bundle to load from"),
    }
    match &wheel {
        _ if run.off("size") => {}
        Some(wheel) => check_size(&mut run, wheel, &parts, options.size_budget),
        None => run.skip("size", "no wheel to measure"),
    }
    match (&options.publish, &wheel) {
        _ if run.off("publish") => {}
        (None, _) => run.skip(
            "publish",
            "optional: give --publish <store URL> to publish and verify",
        ),
        (Some(_), None) => run.skip("publish", "no wheel to publish"),
        (Some(store), Some(_)) if run.gates.iter().any(|g| g.status == GateStatus::Fail) => run
            .skip(
                "publish",
                format!("not publishing to {store}: an earlier gate failed"),
            ),
        (Some(store), Some(_)) => check_publish(&mut run, options, store),
    }
    Checklist {
        gates: run.gates,
        built: run.built,
    }
}
