//! The extension modules of two releases, module by module and target (`cu130/x86_64`) by
//! target: added, removed, rebuilt (with the key inputs that changed), unchanged, or skipped
//! (a new or removed module's skipped target), and what changed in each target's device code
//! (kernels, stubs, registers, stack: the index's [`prebuilt::index::ModuleDeviceCode`], read
//! from the fatbin when the module was built).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use serde::Serialize;

use prebuilt::index::{Index, ModuleDeviceCode, ModuleInputs, ModuleRecord, ModuleVariant};
use prebuilt::Arch;

use super::Change;

/// One side of a module row.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ModuleSide {
    /// The variant's key.
    pub key: String,
    /// The shared library's sha256.
    pub digest: String,
    /// Its size in bytes.
    pub size: u64,
    /// The torch versions it serves.
    pub torch: String,
}

/// One module × target either release has.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ModuleRow {
    /// The module (`_C`).
    pub module: String,
    /// The target, `cu130/x86_64`.
    pub target: String,
    /// What happened to it.
    pub change: Change,
    /// Why: the key inputs that changed, the skip reason of a side without a variant.
    pub why: Vec<String>,
    /// The old variant, if any.
    pub old: Option<ModuleSide>,
    /// The new variant, if any.
    pub new: Option<ModuleSide>,
    /// What changed in its fatbin, one line per arch: `sm_90a: kernels 147 → 150, stubs
    /// 0 → 2`. Empty where either side was recorded before fatbins were read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_code: Vec<String>,
}

/// Every module × target either index has, built or skipped, sorted; targets skipped alike
/// on both sides are left out.
pub(super) fn module_rows(old: &Index, new: &Index) -> Vec<ModuleRow> {
    let modules: BTreeSet<&String> = old.modules.keys().chain(new.modules.keys()).collect();
    let mut rows = Vec::new();
    for module in modules {
        let (old_record, new_record) = (old.modules.get(module), new.modules.get(module));
        let targets: BTreeSet<String> = [old_record, new_record]
            .into_iter()
            .flatten()
            .flat_map(|record| {
                let built = record.variants.iter().map(ModuleVariant::label);
                let skipped = record
                    .skipped
                    .iter()
                    .map(|s| format!("{}/{}", s.cuda, s.cpu));
                built.chain(skipped).collect::<Vec<_>>()
            })
            .collect();
        for target in targets {
            let target_of = |v: &&ModuleVariant| v.label() == target;
            let old_variant = old_record.and_then(|r| r.variants.iter().find(target_of));
            let new_variant = new_record.and_then(|r| r.variants.iter().find(target_of));
            let skip = |record: Option<&ModuleRecord>| {
                record.and_then(|r| {
                    r.skipped
                        .iter()
                        .find(|s| format!("{}/{}", s.cuda, s.cpu) == target)
                        .map(|s| s.reason.lines().next().unwrap_or_default().to_owned())
                })
            };
            let side = |variant: &ModuleVariant| ModuleSide {
                key: variant.key.clone(),
                digest: variant.artifact.digest.clone(),
                size: variant.artifact.size,
                torch: variant.torch.clone(),
            };
            let mut why = Vec::new();
            let change = match (old_variant, new_variant) {
                (None, Some(_)) => {
                    why.push(match (old_record, skip(old_record)) {
                        (None, _) => "a new module".to_owned(),
                        (_, Some(reason)) => format!("was skipped: {reason}"),
                        _ => "a new target".to_owned(),
                    });
                    Change::Added
                }
                (Some(_), None) => {
                    why.push(match (new_record, skip(new_record)) {
                        (None, _) => "the module is gone".to_owned(),
                        (_, Some(reason)) => format!("now skipped: {reason}"),
                        _ => "the target is no longer built".to_owned(),
                    });
                    Change::Removed
                }
                (Some(a), Some(b)) if a.key == b.key && a.artifact.digest == b.artifact.digest => {
                    Change::Unchanged
                }
                (Some(a), Some(b)) => {
                    if a.key == b.key {
                        why.push("same key, other bytes: the build is not reproducible".into());
                    } else {
                        let (old_inputs, new_inputs) = (
                            &old_record.expect("a variant's record").inputs,
                            &new_record.expect("a variant's record").inputs,
                        );
                        why.extend(input_changes(old_inputs, new_inputs));
                        if a.torch != b.torch {
                            why.push(format!("torch: {} → {}", a.torch, b.torch));
                        }
                        if a.compilers != b.compilers {
                            let names = |v: &ModuleVariant| {
                                v.compilers
                                    .iter()
                                    .map(ToString::to_string)
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            };
                            why.push(format!("compilers: {} → {}", names(a), names(b)));
                        }
                        if why.is_empty() {
                            why.push("the key's definition changed (another kwheel)".into());
                        }
                    }
                    Change::Rebuilt
                }
                // A target of a module that one release has and skips there.
                (None, None) if old_record.is_none() || new_record.is_none() => {
                    why.push(match (skip(old_record), skip(new_record)) {
                        (None, Some(reason)) => format!("a new module, skipped: {reason}"),
                        (Some(reason), None) => format!("the module is gone, skipped: {reason}"),
                        _ => continue,
                    });
                    Change::Skipped
                }
                (None, None) => {
                    let (before, after) = (skip(old_record), skip(new_record));
                    if before == after {
                        continue;
                    }
                    why.push(format!(
                        "skipped: {} → {}",
                        before.unwrap_or_else(|| "-".into()),
                        after.unwrap_or_else(|| "-".into())
                    ));
                    Change::Unchanged
                }
            };
            let device_code = match (old_variant, new_variant) {
                (Some(a), Some(b)) => device_code_changes(&a.device_code, &b.device_code),
                _ => Vec::new(),
            };
            rows.push(ModuleRow {
                module: module.clone(),
                target,
                change,
                why,
                old: old_variant.map(side),
                new: new_variant.map(side),
                device_code,
            });
        }
    }
    rows
}

/// What differs between two records of a module variant's fatbin, one line per arch that
/// changed; nothing where a side has no record (an index from before they were kept).
fn device_code_changes(
    old: &BTreeMap<Arch, ModuleDeviceCode>,
    new: &BTreeMap<Arch, ModuleDeviceCode>,
) -> Vec<String> {
    if old.is_empty() || new.is_empty() {
        return Vec::new();
    }
    let archs: BTreeSet<&Arch> = old.keys().chain(new.keys()).collect();
    let mut lines = Vec::new();
    for arch in archs {
        let (a, b) = match (old.get(arch), new.get(arch)) {
            (Some(a), Some(b)) => (a, b),
            (None, Some(b)) => {
                lines.push(format!("{arch}: added ({b})"));
                continue;
            }
            (Some(_), None) => {
                lines.push(format!("{arch}: gone"));
                continue;
            }
            (None, None) => continue,
        };
        let show = |value: Option<u32>| value.map_or_else(|| "-".to_owned(), |v| v.to_string());
        let mut changes = Vec::new();
        if a.kernels != b.kernels {
            changes.push(format!("kernels {} → {}", a.kernels, b.kernels));
        }
        if a.stubs != b.stubs {
            let mut change = format!("stubs {} → {}", a.stubs.len(), b.stubs.len());
            let added: Vec<&String> = b.stubs.iter().filter(|s| !a.stubs.contains(s)).collect();
            if !added.is_empty() {
                let _ = write!(
                    change,
                    " (new: {})",
                    prebuilt::untrusted::listed_names(&added)
                );
            }
            changes.push(change);
        }
        if a.max_registers != b.max_registers {
            changes.push(format!(
                "max registers {} → {}",
                show(a.max_registers),
                show(b.max_registers)
            ));
        }
        if a.max_stack_bytes != b.max_stack_bytes {
            changes.push(format!(
                "max stack {} → {} bytes",
                show(a.max_stack_bytes),
                show(b.max_stack_bytes)
            ));
        }
        if a.max_static_shared_bytes != b.max_static_shared_bytes {
            let show = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
            changes.push(format!(
                "max static shared {} → {} bytes",
                show(a.max_static_shared_bytes),
                show(b.max_static_shared_bytes)
            ));
        }
        if !changes.is_empty() {
            lines.push(format!("{arch}: {}", changes.join(", ")));
        }
    }
    lines
}

/// The key inputs of a module that differ between two releases, one line each.
fn input_changes(old: &ModuleInputs, new: &ModuleInputs) -> Vec<String> {
    let mut why = Vec::new();
    let list = |items: &[String]| items.join(" ");
    if old.sources != new.sources {
        why.push(format!(
            "sources: {} → {}",
            list(&old.sources),
            list(&new.sources)
        ));
    }
    let files: BTreeSet<&String> = old.files.keys().chain(new.files.keys()).collect();
    for file in files {
        match (old.files.get(file), new.files.get(file)) {
            (Some(a), Some(b)) if a != b => why.push(format!("{file} changed")),
            (None, Some(_)) => why.push(format!("{file} added")),
            (Some(_), None) => why.push(format!("{file} removed")),
            _ => {}
        }
    }
    if old.defines != new.defines {
        let show = |defines: &std::collections::BTreeMap<String, String>| {
            defines
                .iter()
                .map(|(name, value)| format!("{name}={value}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        why.push(format!(
            "defines: {} → {}",
            show(&old.defines),
            show(&new.defines)
        ));
    }
    for (what, a, b) in [
        ("nvcc flags", &old.nvcc_flags, &new.nvcc_flags),
        ("host flags", &old.cxx_flags, &new.cxx_flags),
    ] {
        if a != b {
            why.push(format!("{what}: {} → {}", list(a), list(b)));
        }
    }
    if old.cxx_std != new.cxx_std {
        why.push(format!("C++ standard: {} → {}", old.cxx_std, new.cxx_std));
    }
    if old.archs != new.archs {
        let archs = |archs: &[prebuilt::Arch]| {
            archs
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(" ")
        };
        why.push(format!(
            "device archs: {} → {}",
            archs(&old.archs),
            archs(&new.archs)
        ));
    }
    why
}

#[cfg(test)]
mod tests {
    use super::*;
    use prebuilt::index::{Abi, CompilerRecord, ModuleSkip, StoredFile, INDEX_FORMAT};

    fn variant(cuda: &str, key: &str, digest: &str) -> ModuleVariant {
        ModuleVariant {
            cuda: cuda.parse().unwrap(),
            cpu: "x86_64".into(),
            torch: ">=2.11".into(),
            compilers: vec![CompilerRecord {
                kind: "nvcc".into(),
                version: "13.0.88".into(),
            }],
            key: key.into(),
            artifact: StoredFile {
                digest: digest.into(),
                size: 1000,
                path: String::new(),
                stored_size: 0,
                dictionary: None,
            },
            device_code: BTreeMap::new(),
        }
    }

    fn index(modules: Vec<(&str, ModuleRecord)>) -> Index {
        Index {
            format: INDEX_FORMAT,
            store: None,
            package: "lib".into(),
            torch: "2.13.*".into(),
            dictionary: None,
            kernels: Default::default(),
            modules: modules
                .into_iter()
                .map(|(name, record)| (name.to_owned(), record))
                .collect(),
        }
    }

    fn record(files: &[(&str, &str)], variants: Vec<ModuleVariant>) -> ModuleRecord {
        ModuleRecord {
            abi: Abi::Stable,
            inputs: ModuleInputs {
                sources: vec!["csrc/ops.cu".into()],
                files: files
                    .iter()
                    .map(|(file, digest)| ((*file).to_owned(), (*digest).to_owned()))
                    .collect(),
                cxx_std: "c++17".into(),
                ..ModuleInputs::default()
            },
            variants,
            skipped: Vec::new(),
        }
    }

    /// A module one release has and skips on a target once read as `unchanged` there.
    #[test]
    fn a_new_or_removed_modules_skipped_target_is_skipped_not_unchanged() {
        let mut skipping = record(&[], vec![variant("cu130", "k1", "d1")]);
        skipping.skipped.push(ModuleSkip {
            cuda: "cu129".parse().unwrap(),
            cpu: "x86_64".into(),
            reason: "no nvcc for cu129\nmore".into(),
        });
        let (without, with) = (index(Vec::new()), index(vec![("_new", skipping)]));
        let rows = |old: &Index, new: &Index| -> Vec<(String, Change, String)> {
            module_rows(old, new)
                .into_iter()
                .map(|row| (row.target, row.change, row.why.join("; ")))
                .collect()
        };
        let row = |target: &str, change, why: &str| (target.to_owned(), change, why.to_owned());
        assert_eq!(
            rows(&without, &with),
            [
                row(
                    "cu129/x86_64",
                    Change::Skipped,
                    "a new module, skipped: no nvcc for cu129"
                ),
                row("cu130/x86_64", Change::Added, "a new module"),
            ]
        );
        assert_eq!(
            rows(&with, &without),
            [
                row(
                    "cu129/x86_64",
                    Change::Skipped,
                    "the module is gone, skipped: no nvcc for cu129"
                ),
                row("cu130/x86_64", Change::Removed, "the module is gone"),
            ]
        );
    }

    #[test]
    fn modules_are_compared_target_by_target_with_why() {
        let old = index(vec![
            (
                "_C",
                record(
                    &[("csrc/ops.cu", "a1")],
                    vec![variant("cu129", "k1", "d1"), variant("cu130", "k2", "d2")],
                ),
            ),
            ("_gone", record(&[], vec![variant("cu130", "k9", "d9")])),
        ]);
        let mut changed = record(
            &[("csrc/ops.cu", "b2"), ("csrc/new.cuh", "c3")],
            vec![variant("cu130", "k3", "d3")],
        );
        changed.skipped.push(ModuleSkip {
            cuda: "cu129".parse().unwrap(),
            cpu: "x86_64".into(),
            reason: "no nvcc for cu129\nmore".into(),
        });
        let new = index(vec![
            ("_C", changed),
            ("_new", record(&[], vec![variant("cu130", "k8", "d8")])),
        ]);
        let rows: Vec<(String, String, Change, String)> = module_rows(&old, &new)
            .into_iter()
            .map(|row| (row.module, row.target, row.change, row.why.join("; ")))
            .collect();
        let row = |module: &str, target: &str, change, why: &str| {
            (module.to_owned(), target.to_owned(), change, why.to_owned())
        };
        assert_eq!(
            rows,
            [
                row(
                    "_C",
                    "cu129/x86_64",
                    Change::Removed,
                    "now skipped: no nvcc for cu129"
                ),
                row(
                    "_C",
                    "cu130/x86_64",
                    Change::Rebuilt,
                    "csrc/new.cuh added; csrc/ops.cu changed"
                ),
                row(
                    "_gone",
                    "cu130/x86_64",
                    Change::Removed,
                    "the module is gone"
                ),
                row("_new", "cu130/x86_64", Change::Added, "a new module"),
            ]
        );
        // `allow-removed = false` holds for modules as for kernels.
        use super::super::{Breaches as _, DiffPolicy, ReleaseDiff};
        let diff = ReleaseDiff {
            old: "old".into(),
            new: "new".into(),
            rows: Vec::new(),
            modules: module_rows(&old, &new),
            coverage: Vec::new(),
        };
        let strict = DiffPolicy {
            allow_removed: Some(false),
            ..DiffPolicy::default()
        };
        assert_eq!(
            strict.breaches(&diff),
            [
                "module `_C` cu129/x86_64: removed (now skipped: no nvcc for cu129), and \
                 allow-removed = false",
                "module `_gone` cu130/x86_64: removed (the module is gone), and allow-removed = \
                 false"
            ]
        );
        let markdown = diff.to_string();
        assert!(
            markdown.contains(
                "## Extension modules\n\n| module | target | change | why | device code |\n| \
                 --- | --- | --- | --- | --- |\n| `_C` | cu129/x86_64 | removed | now skipped: no \
                 nvcc for cu129 |  |"
            ),
            "{markdown}"
        );
        // The same index on both sides: every target unchanged, no reason given.
        assert!(module_rows(&new, &new)
            .iter()
            .all(|row| row.change == Change::Unchanged && row.why.is_empty()));
    }

    #[test]
    fn device_code_is_compared_arch_by_arch() {
        let code = |kernels: u32, stubs: &[&str], registers: u32| ModuleDeviceCode {
            images: 1,
            kernels,
            stubs: stubs.iter().map(|stub| (*stub).to_owned()).collect(),
            max_registers: Some(registers),
            max_stack_bytes: Some(24),
            max_static_shared_bytes: Some(1024),
        };
        let arch = |name: &str| name.parse::<Arch>().unwrap();
        let mut before = variant("cu130", "k1", "d1");
        before.device_code = BTreeMap::from([
            (arch("sm_90a"), code(147, &[], 128)),
            (arch("sm_100a"), code(147, &[], 255)),
        ]);
        let mut after = variant("cu130", "k2", "d2");
        after.device_code = BTreeMap::from([
            (arch("sm_90a"), code(150, &["only100_trap"], 255)),
            (arch("sm_120a"), code(3, &[], 64)),
        ]);
        let old = index(vec![("_C", record(&[("csrc/ops.cu", "a")], vec![before]))]);
        let new = index(vec![("_C", record(&[("csrc/ops.cu", "b")], vec![after]))]);
        let rows = module_rows(&old, &new);
        assert_eq!(
            rows[0].device_code,
            [
                "sm_90a: kernels 147 → 150, stubs 0 → 1 (new: `only100_trap`), max registers \
                 128 → 255",
                "sm_100a: gone",
                "sm_120a: added (3 kernels in 1 image, 0 stubs, up to 64 registers, 24-byte \
                 stack, 1024 bytes of static shared memory)",
            ]
        );
        // An index written before fatbins were read compares nothing.
        let unrecorded = index(vec![(
            "_C",
            record(&[("csrc/ops.cu", "a")], vec![variant("cu130", "k1", "d1")]),
        )]);
        assert!(module_rows(&unrecorded, &new)[0].device_code.is_empty());
    }
}
