//! `kwheel release diff OLD NEW`: what changed between two releases, kernel by kernel and
//! target by target.
//!
//! Each side is a bundle folder or a wheel (read once and verified, then its `_prebuilt/` and
//! its parts' artifacts unpacked from that reading into a private folder). One row per
//! kernel × target (`cu130/sm_90a`) that either side has, built or skipped:
//!
//! | change | when |
//! | --- | --- |
//! | `added` | only the new release has a variant (the old one had none, or skipped it) |
//! | `removed` | only the old release has a variant (the new one has none, or skipped it) |
//! | `unchanged` | the same key and the same cubin |
//! | `rebuilt` | another key (the row says why, as `dev explain --against` would), or the same key with other bytes |
//! | `skipped` | neither release has a variant, and the kernel is in one release only: a new kernel's skipped target, or a removed kernel's |
//!
//! A side without a variant where its kernel skips the target carries that skip, with its
//! kind (`declared`, `unsupported`, `stub`, `failed`).
//!
//! For cubins on both sides, the facts each entry asks of the GPU are compared
//! ([`prebuilt::cubin::EntryResources`]: registers, register cap, stack frame, static shared
//! memory, launch bounds, code size, parameter layout); a changed parameter list is an ABI
//! break for callers. A kernel whose requirements gained or changed a condition (its manifest's
//! `requires`) is called out too: callers may be refused shapes they passed before. With a
//! fleet, the coverage table of each side is compared too: a device that loaded a kernel and no
//! longer does is a coverage loss. Extension modules get rows of their own, module × target
//! (`cu130/x86_64`), with the key inputs that changed ([`modules`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use prebuilt::bundle::INDEX_FILE;
use prebuilt::coverage::{fleet_coverage, FleetDevice};
use prebuilt::cubin::{entry_resources, EntryResources};
use prebuilt::device::DeviceQuery;
use prebuilt::index::{Index, KernelRecord, SkipReason, Variant};
use prebuilt::lookup::LOOKUP_FILE;
use prebuilt::parts::PART_FILE;
use prebuilt::Bundle;

use crate::verify::VerifiedWheel;
use crate::Error;

mod modules;
mod policy;

pub use modules::{ModuleRow, ModuleSide};
pub use policy::{describe_breaches, Breaches, DiffPolicy};

/// A release opened for comparison: its bundle, and the scratch folder a wheel's bundle was
/// unpacked into (removed on drop).
pub struct Release {
    /// Where it came from, for messages.
    pub path: PathBuf,
    bundle: Bundle,
    _scratch: Option<tempfile::TempDir>,
}

impl Release {
    /// Opens a bundle folder, or a wheel after `wheel verify` passes it. A wheel is read once
    /// ([`VerifiedWheel`]): its bundle, and the artifacts of a registry-sized set's parts, are
    /// unpacked from that reading into a private folder, each name checked to stay inside it;
    /// the wheel's path is never read again.
    pub fn open(path: &Path) -> Result<Release, Error> {
        let compare = |reason: String| Error::Compare {
            path: path.to_owned(),
            reason,
        };
        if path.is_dir() {
            let bundle = Bundle::open(path).map_err(|error| Error::Bundle(Box::new(error)))?;
            return Ok(Release {
                path: path.to_owned(),
                bundle,
                _scratch: None,
            });
        }
        let wheel = VerifiedWheel::open_set(path)?.into_result()?;
        // A bundle is found by its `kernels.idx` (all a wheel needs to ship) or `index.json`.
        let suffixes = [INDEX_FILE, LOOKUP_FILE].map(|file| format!("/_prebuilt/{file}"));
        let roots: BTreeSet<&str> = wheel
            .files()
            .keys()
            .filter_map(|name| suffixes.iter().find_map(|suffix| name.strip_suffix(suffix)))
            .collect();
        let root = match roots.len() {
            1 => format!("{}/_prebuilt/", roots.iter().next().unwrap_or(&"")),
            0 => return Err(compare("it holds no `_prebuilt/` bundle".to_owned())),
            _ => {
                return Err(compare(
                    "it holds more than one `_prebuilt/` bundle".to_owned(),
                ))
            }
        };
        let scratch = tempfile::tempdir().map_err(|source| Error::Write {
            path: std::env::temp_dir(),
            source,
        })?;
        wheel.extract(&root, scratch.path())?;
        extract_parts(&wheel, scratch.path()).map_err(compare)?;
        // The bundle is read from the private folder from here on.
        drop(wheel);
        let bundle = prebuilt::lookup::restore_index_json(scratch.path())
            .and_then(|_| Bundle::open(scratch.path()))
            .map_err(|error| Error::Bundle(Box::new(error)))?;
        Ok(Release {
            path: path.to_owned(),
            bundle,
            _scratch: Some(scratch),
        })
    }

    /// The release's index.
    pub fn index(&self) -> &Index {
        self.bundle.index()
    }

    /// What each entry of a variant's cubin asks of the GPU (empty for PTX).
    fn resources(
        &self,
        kernel: &str,
        variant: &Variant,
    ) -> Result<BTreeMap<String, EntryResources>, Error> {
        let bytes = self
            .bundle
            .read_artifact(kernel, variant)
            .map_err(|error| Error::Bundle(Box::new(error)))?;
        entry_resources(&bytes).map_err(|error| Error::Compare {
            path: self.path.clone(),
            reason: format!("`{kernel}` {}: {error}", variant.label()),
        })
    }
}

/// Writes the artifacts of the verified parts of `wheel`'s set into its bundle at `bundle`,
/// where a whole bundle keeps them (a part's `_prebuilt/` has the bundle's relative paths). A
/// prefix several parts copy is written once; copies that differ are refused.
fn extract_parts(wheel: &VerifiedWheel, bundle: &Path) -> Result<(), String> {
    let mut files: BTreeMap<&str, (&str, &[u8])> = BTreeMap::new();
    for part in wheel.parts() {
        for (relative, bytes) in &part.files {
            if relative == PART_FILE {
                continue;
            }
            match files.get(relative.as_str()) {
                Some((owner, first)) if *first != bytes.as_slice() => {
                    return Err(format!(
                        "its parts hold two different `{relative}` (`{owner}` and `{}`)",
                        part.import
                    ))
                }
                Some(_) => {}
                None => {
                    files.insert(relative, (&part.import, bytes));
                }
            }
        }
    }
    for (relative, (part, bytes)) in files {
        let target = crate::verify::inside(bundle, relative)
            .map_err(|reason| format!("part `{part}`: `{relative}`: {reason}"))?;
        crate::verify::write_new(&target, bytes)
            .map_err(|error| format!("cannot write `{}`: {error}", target.display()))?;
    }
    Ok(())
}

/// How a kernel's target changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Change {
    /// Built in the new release only.
    Added,
    /// Built in the old release only.
    Removed,
    /// Another key, or other bytes under the same key.
    Rebuilt,
    /// The same key and the same cubin.
    Unchanged,
    /// No variant on either side, and the kernel (or module) is in one release only: a new
    /// one's skipped target, or a removed one's.
    Skipped,
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Change::Added => "added",
            Change::Removed => "removed",
            Change::Rebuilt => "rebuilt",
            Change::Unchanged => "unchanged",
            Change::Skipped => "skipped",
        })
    }
}

/// One side of a row: the variant's identity and its entries' resources.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Side {
    /// The variant's key.
    pub key: String,
    /// The cubin's sha256.
    pub digest: String,
    /// The cubin's size in bytes.
    pub size: u64,
    /// The compiler that built it.
    pub compiler: String,
    /// Each entry's resources, by symbol.
    pub entries: BTreeMap<String, EntryResources>,
}

/// One kernel × target of the comparison.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Row {
    /// The kernel.
    pub kernel: String,
    /// The target, `cu130/sm_90a`.
    pub target: String,
    /// What happened to it.
    pub change: Change,
    /// Why: the key inputs that changed, the skip reason of a side without a variant.
    pub why: Vec<String>,
    /// Resource changes of entries on both sides, one line each (`registers 32 → 40 (+8)`).
    pub resource_changes: Vec<String>,
    /// The largest register increase of any entry (negative: a decrease).
    pub register_increase: Option<i64>,
    /// Whether an entry's parameter layout changed or an entry appeared or vanished.
    pub abi_break: bool,
    /// Whether a new-side entry has a stack frame the old one did not (local memory or
    /// spills).
    pub new_stack: bool,
    /// How the kernel's requirements changed on a target both sides built, when they gained
    /// a condition (or changed one, or their inputs): callers may now be refused shapes they
    /// passed before. Empty otherwise; the JSON says `requirements_changed: true|false`.
    #[serde(
        rename = "requirements_changed",
        serialize_with = "serialize_not_empty"
    )]
    pub requirement_changes: Vec<String>,
    /// The old variant, if any.
    pub old: Option<Side>,
    /// The new variant, if any.
    pub new: Option<Side>,
    /// Why the old release skips the target, where its kernel does.
    pub old_skip: Option<SkipReason>,
    /// Why the new release skips the target, where its kernel does.
    pub new_skip: Option<SkipReason>,
}

/// A device of the fleet that loaded a kernel in the old release and loads another target,
/// or nothing, in the new one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CoverageChange {
    /// The kernel.
    pub kernel: String,
    /// The device, as the fleet names it.
    pub device: String,
    /// What loaded there before (`cu130/sm_90a`), if anything.
    pub old: Option<String>,
    /// What loads there now, if anything.
    pub new: Option<String>,
}

impl CoverageChange {
    /// Whether the device loaded the kernel before and loads nothing now.
    pub fn is_loss(&self) -> bool {
        self.old.is_some() && self.new.is_none()
    }
}

/// The whole comparison.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReleaseDiff {
    /// The old release, as given.
    pub old: String,
    /// The new release, as given.
    pub new: String,
    /// Every kernel × target either side has, sorted by kernel and target.
    pub rows: Vec<Row>,
    /// Every extension module × target (`cu130/x86_64`) either side has, sorted; absent from
    /// the JSON when neither release has a module.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub modules: Vec<ModuleRow>,
    /// With a fleet: the devices whose loaded target changed.
    pub coverage: Vec<CoverageChange>,
}

/// Compares two releases; with `fleet`, also what each device of it loads (under `query`'s
/// CUDA build, driver and torch).
pub fn diff_releases(
    old: &Release,
    new: &Release,
    fleet: Option<(&[FleetDevice], &DeviceQuery)>,
) -> Result<ReleaseDiff, Error> {
    let (old_index, new_index) = (old.index(), new.index());
    let kernels: BTreeSet<&String> = old_index
        .kernels
        .keys()
        .chain(new_index.kernels.keys())
        .collect();
    let mut rows = Vec::new();
    for kernel in kernels {
        let old_record = old_index.kernels.get(kernel);
        let new_record = new_index.kernels.get(kernel);
        let targets: BTreeSet<String> = [old_record, new_record]
            .into_iter()
            .flatten()
            .flat_map(|record| {
                let built = record.variants.iter().map(Variant::label);
                let skipped = record
                    .skipped
                    .iter()
                    .map(|s| format!("{}/{}", s.cuda, s.arch));
                built.chain(skipped).collect::<Vec<_>>()
            })
            .collect();
        for target in targets {
            let skip = |record: Option<&KernelRecord>| {
                record.and_then(|r| {
                    r.skipped
                        .iter()
                        .find(|s| format!("{}/{}", s.cuda, s.arch) == target)
                        .map(|s| s.why())
                })
            };
            let (old_skip, new_skip) = (skip(old_record), skip(new_record));
            let reason =
                |skip: &Option<SkipReason>| skip.as_ref().map(|skip| first_line(&skip.to_string()));
            let (old_variant, new_variant) = (
                find_variant(old_record, &target),
                find_variant(new_record, &target),
            );
            let side = |release: &Release, variant: &Variant| -> Result<Side, Error> {
                Ok(Side {
                    key: variant.key.clone(),
                    digest: variant.artifact.digest.clone(),
                    size: variant.artifact.size,
                    compiler: variant.compiler.to_string(),
                    entries: release.resources(kernel, variant)?,
                })
            };
            let old_side = old_variant.map(|v| side(old, v)).transpose()?;
            let new_side = new_variant.map(|v| side(new, v)).transpose()?;
            let mut why = Vec::new();
            let change = match (&old_side, &new_side) {
                (None, Some(_)) => {
                    match (old_record, reason(&old_skip)) {
                        (None, _) => why.push("a new kernel".to_owned()),
                        (_, Some(reason)) => why.push(format!("was skipped: {reason}")),
                        _ => why.push("a new target".to_owned()),
                    }
                    Change::Added
                }
                (Some(_), None) => {
                    match (new_record, reason(&new_skip)) {
                        (None, _) => why.push("the kernel is gone".to_owned()),
                        (_, Some(reason)) => why.push(format!("now skipped: {reason}")),
                        _ => why.push("the target is no longer built".to_owned()),
                    }
                    Change::Removed
                }
                (Some(old_side), Some(new_side)) => {
                    if old_side.key == new_side.key && old_side.digest == new_side.digest {
                        Change::Unchanged
                    } else {
                        if old_side.key == new_side.key {
                            why.push("same key, other bytes: the build is not reproducible".into());
                        } else {
                            why.extend(key_changes(
                                old_index, new_index, kernel, old_side, new_side,
                            ));
                        }
                        Change::Rebuilt
                    }
                }
                // A target of a kernel that one release has and skips there.
                (None, None) if old_record.is_none() || new_record.is_none() => {
                    let (whose, skip) = match (&old_skip, &new_skip) {
                        (None, Some(skip)) => ("a new kernel", skip),
                        (Some(skip), None) => ("the kernel is gone", skip),
                        _ => continue,
                    };
                    why.push(skipped_why(whose, skip));
                    Change::Skipped
                }
                // Skipped on both sides: no row unless the reason changed.
                (None, None) => {
                    let (old_reason, new_reason) = (reason(&old_skip), reason(&new_skip));
                    if old_reason == new_reason {
                        continue;
                    }
                    why.push(format!(
                        "skipped: {} → {}",
                        old_reason.unwrap_or_else(|| "-".into()),
                        new_reason.unwrap_or_else(|| "-".into())
                    ));
                    Change::Unchanged
                }
            };
            let mut row = Row {
                kernel: kernel.clone(),
                target,
                change,
                why,
                resource_changes: Vec::new(),
                register_increase: None,
                abi_break: false,
                new_stack: false,
                requirement_changes: if old_side.is_some() && new_side.is_some() {
                    requirement_changes(old_record, new_record)
                } else {
                    Vec::new()
                },
                old: old_side,
                new: new_side,
                old_skip,
                new_skip,
            };
            compare_resources(&mut row);
            rows.push(row);
        }
    }
    let coverage = match fleet {
        Some((fleet, query)) => coverage_changes(old_index, new_index, fleet, query),
        None => Vec::new(),
    };
    Ok(ReleaseDiff {
        old: old.path.display().to_string(),
        new: new.path.display().to_string(),
        rows,
        modules: modules::module_rows(old_index, new_index),
        coverage,
    })
}

/// Why a variant's key changed: the key inputs, the torch pin, the compiler.
fn key_changes(
    old_index: &Index,
    new_index: &Index,
    kernel: &str,
    old_side: &Side,
    new_side: &Side,
) -> Vec<String> {
    let (Some(old_record), Some(new_record)) =
        (old_index.kernels.get(kernel), new_index.kernels.get(kernel))
    else {
        return Vec::new();
    };
    let mut why = bundler::explain::diff_inputs(&old_record.inputs, &new_record.inputs);
    if old_index.torch != new_index.torch {
        why.push(format!(
            "torch pin: {} → {}",
            old_index.torch, new_index.torch
        ));
    }
    if old_side.compiler != new_side.compiler {
        why.push(format!(
            "compiler: {} → {}",
            old_side.compiler, new_side.compiler
        ));
    }
    if why.is_empty() {
        why.push("the key's definition changed (another kwheel)".to_owned());
    }
    why
}

/// Fills a row's resource lines, register increase, ABI break and new stack frames.
fn compare_resources(row: &mut Row) {
    let (Some(old), Some(new)) = (&row.old, &row.new) else {
        return;
    };
    let symbols: BTreeSet<&String> = old.entries.keys().chain(new.entries.keys()).collect();
    for symbol in symbols {
        let (before, after) = match (old.entries.get(symbol), new.entries.get(symbol)) {
            (Some(before), Some(after)) => (before, after),
            (None, Some(_)) => {
                row.abi_break = true;
                row.resource_changes.push(format!("{symbol}: new entry"));
                continue;
            }
            (Some(_), None) => {
                row.abi_break = true;
                row.resource_changes.push(format!("{symbol}: entry gone"));
                continue;
            }
            (None, None) => continue,
        };
        let mut changed = |what: &str, before: String, after: String, delta: Option<i64>| {
            if before != after {
                let delta = delta.map(|d| format!(" ({d:+})")).unwrap_or_default();
                row.resource_changes
                    .push(format!("{symbol}: {what} {before} → {after}{delta}"));
            }
        };
        let optional = |value: Option<u32>| value.map_or("-".to_owned(), |v| v.to_string());
        if let (Some(b), Some(a)) = (before.registers, after.registers) {
            let increase = i64::from(a) - i64::from(b);
            row.register_increase =
                Some(row.register_increase.map_or(increase, |r| r.max(increase)));
            changed("registers", b.to_string(), a.to_string(), Some(increase));
        }
        changed(
            "register cap",
            optional(before.register_cap),
            optional(after.register_cap),
            None,
        );
        changed(
            "stack bytes",
            optional(before.stack_bytes),
            optional(after.stack_bytes),
            None,
        );
        changed(
            "static shared bytes",
            before.static_shared_bytes.to_string(),
            after.static_shared_bytes.to_string(),
            None,
        );
        changed(
            "max threads",
            before.max_threads.map_or("-".into(), |v| v.to_string()),
            after.max_threads.map_or("-".into(), |v| v.to_string()),
            None,
        );
        #[allow(clippy::cast_possible_wrap)]
        let code_delta = after.code_bytes as i64 - before.code_bytes as i64;
        changed(
            "code bytes",
            before.code_bytes.to_string(),
            after.code_bytes.to_string(),
            Some(code_delta),
        );
        if before.param_sizes != after.param_sizes {
            row.abi_break = true;
            changed(
                "parameters (ABI)",
                format!("{:?}", before.param_sizes),
                format!("{:?}", after.param_sizes),
                None,
            );
        }
        if after.stack_bytes.unwrap_or(0) > 0 && before.stack_bytes.unwrap_or(0) == 0 {
            row.new_stack = true;
        }
    }
}

/// The fleet cells whose loaded target differs between the two indexes.
fn coverage_changes(
    old: &Index,
    new: &Index,
    fleet: &[FleetDevice],
    query: &DeviceQuery,
) -> Vec<CoverageChange> {
    let before = fleet_coverage(old, fleet, query, None);
    let after = fleet_coverage(new, fleet, query, None);
    let mut changes = Vec::new();
    for (old_entry, new_entry) in before.devices.iter().zip(&after.devices) {
        let kernels: BTreeSet<&String> = old_entry
            .report
            .kernels
            .keys()
            .chain(new_entry.report.kernels.keys())
            .collect();
        for kernel in kernels {
            let loads = |entry: &prebuilt::coverage::FleetEntry| {
                entry
                    .report
                    .kernels
                    .get(kernel)
                    .and_then(|k| k.loads.clone())
            };
            let (old_loads, new_loads) = (loads(old_entry), loads(new_entry));
            if old_loads != new_loads {
                changes.push(CoverageChange {
                    kernel: kernel.clone(),
                    device: old_entry.device.name.clone(),
                    old: old_loads,
                    new: new_loads,
                });
            }
        }
    }
    changes.sort_by(|a, b| (&a.kernel, &a.device).cmp(&(&b.kernel, &b.device)));
    changes
}

/// Each change of the requirements ([`bundler::explain::diff_requirements`]'s words) when the
/// new record's have a condition the old one's do not, or other inputs; else none.
fn requirement_changes(old: Option<&KernelRecord>, new: Option<&KernelRecord>) -> Vec<String> {
    let (Some(old), Some(new)) = (old, new) else {
        return Vec::new();
    };
    let (before, after) = (&old.inputs.requires, &new.inputs.requires);
    let gained = before.inputs != after.inputs
        || after.rules.iter().any(|rule| !before.rules.contains(rule));
    if !gained {
        return Vec::new();
    }
    bundler::explain::diff_requirements(before, after)
}

/// A list as whether it has anything.
fn serialize_not_empty<S: serde::Serializer>(
    list: &[String],
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.serialize_bool(!list.is_empty())
}

fn find_variant<'r>(record: Option<&'r KernelRecord>, target: &str) -> Option<&'r Variant> {
    record.and_then(|r| r.variants.iter().find(|v| v.label() == target))
}

fn first_line(text: &str) -> String {
    text.lines().next().unwrap_or_default().to_owned()
}

/// The why of a [`Change::Skipped`] row: whose target it is (`a new kernel`) and the skip,
/// with its kind (`a new kernel, skipped (declared): the kernel targets only sm_90a`).
fn skipped_why(whose: &str, skip: &SkipReason) -> String {
    format!(
        "{whose}, skipped ({}): {}",
        skip.kind(),
        first_line(skip.words())
    )
}

impl ReleaseDiff {
    /// The rows that are not `unchanged`.
    pub fn changed(&self) -> impl Iterator<Item = &Row> {
        self.rows
            .iter()
            .filter(|row| row.change != Change::Unchanged || !row.why.is_empty())
    }
}

impl fmt::Display for ReleaseDiff {
    /// Markdown: a summary line, a table of the rows that changed (why and resources in the
    /// last columns), then the fleet's coverage changes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut counts: BTreeMap<Change, usize> = BTreeMap::new();
        for row in &self.rows {
            *counts.entry(row.change).or_default() += 1;
        }
        let summary: Vec<String> = [
            Change::Added,
            Change::Removed,
            Change::Rebuilt,
            Change::Unchanged,
            Change::Skipped,
        ]
        .iter()
        .map(|change| format!("{} {change}", counts.get(change).copied().unwrap_or(0)))
        .collect();
        writeln!(f, "# {} → {}\n", self.old, self.new)?;
        writeln!(
            f,
            "{} kernel targets: {}\n",
            self.rows.len(),
            summary.join(", ")
        )?;
        let changed: Vec<&Row> = self.changed().collect();
        if changed.is_empty() {
            writeln!(f, "No kernel target changed.")?;
        } else {
            writeln!(f, "| kernel | target | change | why | resources |")?;
            writeln!(f, "| --- | --- | --- | --- | --- |")?;
            for row in changed {
                let mut resources = row.resource_changes.join("; ");
                if row.abi_break {
                    resources.insert_str(0, "**ABI break** ");
                }
                if !row.requirement_changes.is_empty() {
                    resources.insert_str(0, "**requirements changed** ");
                }
                writeln!(
                    f,
                    "| `{}` | {} | {} | {} | {} |",
                    row.kernel,
                    row.target,
                    row.change,
                    escape(&row.why.join("; ")),
                    escape(&resources)
                )?;
            }
        }
        let modules: Vec<&ModuleRow> = self
            .modules
            .iter()
            .filter(|row| {
                row.change != Change::Unchanged
                    || !row.why.is_empty()
                    || !row.device_code.is_empty()
            })
            .collect();
        if !self.modules.is_empty() {
            writeln!(f, "\n## Extension modules\n")?;
            if modules.is_empty() {
                writeln!(f, "No module target changed ({}).", self.modules.len())?;
            } else {
                writeln!(f, "| module | target | change | why | device code |")?;
                writeln!(f, "| --- | --- | --- | --- | --- |")?;
                for row in modules {
                    writeln!(
                        f,
                        "| `{}` | {} | {} | {} | {} |",
                        row.module,
                        row.target,
                        row.change,
                        escape(&row.why.join("; ")),
                        escape(&row.device_code.join("; "))
                    )?;
                }
            }
        }
        if !self.coverage.is_empty() {
            writeln!(f, "\n## Coverage\n")?;
            writeln!(f, "| kernel | device | before | after |")?;
            writeln!(f, "| --- | --- | --- | --- |")?;
            for change in &self.coverage {
                let mut after = change.new.clone().unwrap_or_else(|| "none".into());
                if change.is_loss() {
                    after.push_str(" (**lost**)");
                }
                writeln!(
                    f,
                    "| `{}` | {} | {} | {after} |",
                    change.kernel,
                    change.device,
                    change.old.as_deref().unwrap_or("none")
                )?;
            }
        }
        Ok(())
    }
}

/// Text safe inside a Markdown table cell.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '|' => out.push_str("\\|"),
            '\n' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}
