//! `dev explain`: what goes into a kernel's or an extension module's key, and which input
//! changed since an index.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Write};
use std::path::{Path, PathBuf};

use prebuilt::index::{Index, KernelInputs, Requirement, Requirements, TargetInputs};
use prebuilt::lookup::read_bundle_index;
use prebuilt::CudaBuild;

use crate::error::Error;
use crate::manifest::Manifest;
use crate::pipeline::{plan_kernel, target_keys, BuildToolchain};

pub use crate::pipeline::TargetKey;

mod module;

pub use module::{
    diff_module_inputs, explain_module, module_changes_since, ModuleExplanation, ModuleTargetKey,
};

/// What `dev explain` explains: a kernel, or an extension module.
#[derive(Debug)]
pub enum Explained {
    /// A kernel (`[kernels.<name>]`).
    Kernel(Explanation),
    /// An extension module (`[extensions.<name>]`).
    Module(ModuleExplanation),
}

impl fmt::Display for Explained {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Explained::Kernel(explanation) => explanation.fmt(f),
            Explained::Module(explanation) => explanation.fmt(f),
        }
    }
}

/// Explains `name` of the manifest at `manifest_path`, a kernel or an extension module
/// (kernels and modules share no name), optionally against an index.
pub fn explain_kernel_or_module(
    manifest_path: &Path,
    name: &str,
    torch: Option<&str>,
    against: Option<&Path>,
) -> Result<Explained, Error> {
    let manifest = Manifest::load(manifest_path)?;
    if manifest.kernels.contains_key(name) {
        return explain(manifest_path, name, torch, against).map(Explained::Kernel);
    }
    if !manifest.extensions.contains_key(name) {
        return Err(Error::UnknownName {
            name: name.to_owned(),
            manifest: manifest.path.clone(),
            kernels: manifest.kernels.keys().cloned().collect(),
            modules: manifest.extensions.keys().cloned().collect(),
        });
    }
    let torch = torch.unwrap_or(&manifest.library.torch).to_owned();
    explain_module(&manifest, name, &torch, against).map(Explained::Module)
}

/// Everything `dev explain` prints about one kernel.
#[derive(Debug)]
pub struct Explanation {
    /// The kernel.
    pub kernel: String,
    /// The rendered include tree (empty for precompiled cubins).
    pub tree: String,
    /// External headers (toolkit and system), which the compiler's version stands for.
    pub externals: BTreeSet<String>,
    /// The target-independent key inputs.
    pub inputs: KernelInputs,
    /// The torch pin.
    pub torch: String,
    /// For a torch extension: the torch whose headers and defines it compiles with, and the
    /// stable name of each of its include dirs.
    pub torch_headers: Option<(crate::torch::TorchHeaders, Vec<String>)>,
    /// One row per target of the matrix.
    pub targets: Vec<TargetKey>,
    /// With `--against`: the inputs that differ from that index, one line each.
    pub changes: Option<Vec<String>>,
}

/// Explains `kernel` of the manifest at `manifest_path`, optionally against an index (a
/// bundle directory or its `index.json`).
pub fn explain(
    manifest_path: &Path,
    kernel: &str,
    torch: Option<&str>,
    against: Option<&Path>,
) -> Result<Explanation, Error> {
    let manifest = Manifest::load(manifest_path)?;
    let spec = manifest
        .kernels
        .get(kernel)
        .ok_or_else(|| Error::UnknownKernel {
            name: kernel.to_owned(),
            manifest: manifest.path.clone(),
            known: manifest.kernels.keys().cloned().collect(),
        })?;
    let torch = torch.unwrap_or(&manifest.library.torch).to_owned();
    let toolchains: Vec<(CudaBuild, Result<BuildToolchain, String>)> = manifest
        .library
        .cuda_builds
        .iter()
        .map(|&build| {
            let toolchain = if spec.cubins.is_empty() {
                BuildToolchain::discover(build).map_err(|error| format!("{error}"))
            } else {
                Err(String::new())
            };
            (build, toolchain)
        })
        .collect();
    let external_dirs: Vec<PathBuf> = toolchains
        .iter()
        .filter_map(|(_, t)| t.as_ref().ok())
        .flat_map(|t| t.include_dirs.iter().cloned())
        .collect();
    let planned = plan_kernel(&manifest, kernel, spec, &external_dirs)?;

    let found: Vec<(CudaBuild, Result<&BuildToolchain, String>)> = toolchains
        .iter()
        .map(|(build, toolchain)| (*build, toolchain.as_ref().map_err(Clone::clone)))
        .collect();
    let targets = target_keys(&manifest, spec, &planned, &torch, &found);

    let changes = match against {
        Some(path) => {
            let index = read_bundle_index(path)?;
            Some(changes_since(
                &index,
                kernel,
                &planned.inputs,
                &torch,
                &targets,
            ))
        }
        None => None,
    };
    let torch_headers = planned.torch.clone().map(|headers| {
        let stable = headers
            .include_dirs
            .iter()
            .map(|dir| {
                let position = planned.include_dirs.iter().position(|d| d == dir);
                let recipe = planned.recipe.as_ref();
                position
                    .and_then(|n| recipe.and_then(|r| r.include_dirs.get(n)).cloned())
                    .unwrap_or_else(|| dir.display().to_string())
            })
            .collect();
        (headers, stable)
    });
    Ok(Explanation {
        torch_headers,
        kernel: kernel.to_owned(),
        tree: planned
            .graph
            .as_ref()
            .map(|g| g.render_tree())
            .unwrap_or_default(),
        externals: planned
            .graph
            .as_ref()
            .map(|g| g.externals().clone())
            .unwrap_or_default(),
        inputs: planned.inputs,
        torch,
        targets,
        changes,
    })
}

/// The differences between what `index` recorded for `kernel` and its current inputs, one
/// line each; empty when nothing changed.
pub fn changes_since(
    index: &Index,
    kernel: &str,
    inputs: &KernelInputs,
    torch: &str,
    targets: &[TargetKey],
) -> Vec<String> {
    let Some(record) = index.kernels.get(kernel) else {
        return vec![format!("kernel `{kernel}` is not in the index")];
    };
    let mut changes = diff_inputs(&record.inputs, inputs);
    if index.torch != torch {
        changes.push(format!("torch pin: {} → {torch}", index.torch));
    }
    if changes.is_empty() && record.inputs != *inputs {
        // An input this listing does not spell out yet: the key still changed.
        changes.push("key inputs: changed (see `index.json`'s `inputs` for the old ones)".into());
    }
    let described = !changes.is_empty();
    for target in targets {
        let Ok((compiler, key)) = &target.key else {
            continue;
        };
        let old = record
            .variants
            .iter()
            .find(|v| v.cuda == target.build && v.arch == target.arch);
        match old {
            Some(old) if &old.compiler != compiler => changes.push(format!(
                "compiler for {}/{}: {} → {compiler}",
                target.build, target.arch, old.compiler
            )),
            // Whatever changed the key is listed above; a key that changed with nothing listed
            // (an input of the key this listing does not spell out) is still a change.
            Some(old) if old.key != key.0 && !described => changes.push(format!(
                "key for {}/{}: {} → {}",
                target.build,
                target.arch,
                &old.key[..12.min(old.key.len())],
                &key.0[..12.min(key.0.len())]
            )),
            Some(_) => {}
            None if !record
                .skipped
                .iter()
                .any(|s| s.cuda == target.build && s.arch == target.arch) =>
            {
                changes.push(format!(
                    "variant {}/{}: not in the index",
                    target.build, target.arch
                ))
            }
            None => {}
        }
    }
    changes
}

/// An include graph (stable path → sha256) and a set of defines, as a key has them.
pub type FilesAndDefines<'a> = (&'a BTreeMap<String, String>, &'a BTreeMap<String, String>);

/// Line-by-line differences between two include graphs and two define sets: what kernels'
/// and extension modules' inputs share.
pub fn diff_files_and_defines(old: FilesAndDefines<'_>, new: FilesAndDefines<'_>) -> Vec<String> {
    let mut changes = Vec::new();
    let paths: BTreeSet<&String> = old.0.keys().chain(new.0.keys()).collect();
    for path in paths {
        match (old.0.get(path), new.0.get(path)) {
            (Some(a), Some(b)) if a != b => changes.push(format!(
                "file {path}: content changed (sha256 {} → {})",
                &a[..12.min(a.len())],
                &b[..12.min(b.len())]
            )),
            (Some(_), None) => changes.push(format!("file {path}: no longer included")),
            (None, Some(_)) => changes.push(format!("file {path}: newly included")),
            _ => {}
        }
    }
    let names: BTreeSet<&String> = old.1.keys().chain(new.1.keys()).collect();
    for name in names {
        match (old.1.get(name), new.1.get(name)) {
            (Some(a), Some(b)) if a != b => changes.push(format!("define {name}: {a} → {b}")),
            (Some(a), None) => changes.push(format!("define {name}: {a} → (removed)")),
            (None, Some(b)) => changes.push(format!("define {name}: (new) → {b}")),
            _ => {}
        }
    }
    changes
}

/// One line for each list, named, that differs: `flags: [..] → [..]`.
pub fn diff_lists(lists: &[(&str, &Vec<String>, &Vec<String>)]) -> Vec<String> {
    lists
        .iter()
        .filter(|(_, before, after)| before != after)
        .map(|(what, before, after)| format!("{what}: {before:?} → {after:?}"))
        .collect()
}

/// Line-by-line differences between two sets of target-independent key inputs.
pub fn diff_inputs(old: &KernelInputs, new: &KernelInputs) -> Vec<String> {
    let mut changes = Vec::new();
    if old.entries != new.entries {
        changes.push(format!("entries: {:?} → {:?}", old.entries, new.entries));
    }
    changes.extend(diff_files_and_defines(
        (&old.files, &old.defines),
        (&new.files, &new.defines),
    ));
    changes.extend(diff_lists(&[
        ("flags", &old.flags, &new.flags),
        ("nvcc flags", &old.nvcc_flags, &new.nvcc_flags),
        ("NVRTC flags", &old.nvrtc_flags, &new.nvrtc_flags),
    ]));
    if old.cxx_std != new.cxx_std {
        changes.push(format!("C++ standard: {} → {}", old.cxx_std, new.cxx_std));
    }
    if old.preamble != new.preamble {
        changes.push(format!("preamble: {:?} → {:?}", old.preamble, new.preamble));
    }
    changes.extend(diff_requirements(&old.requires, &new.requires));
    if old.computed.template != new.computed.template {
        changes.push(format!(
            "template: {:?} → {:?}",
            old.computed.template, new.computed.template
        ));
    }
    if old.computed.constants != new.computed.constants {
        changes.push(format!(
            "computed: {:?} → {:?}",
            old.computed.constants, new.computed.constants
        ));
    }
    if old.computed.structs != new.computed.structs {
        changes.push(format!(
            "structs: {:?} → {:?}",
            old.computed.structs, new.computed.structs
        ));
    }
    let archs: BTreeSet<&prebuilt::Arch> = old.targets.keys().chain(new.targets.keys()).collect();
    for arch in archs {
        let (before, after) = (old.targets.get(arch), new.targets.get(arch));
        if before != after {
            let show = |target: Option<&TargetInputs>| {
                target.map_or("nothing".to_owned(), describe_target)
            };
            changes.push(format!("{arch} adds: {} → {}", show(before), show(after)));
        }
    }
    changes
}

/// Each requirement on a line: `` `dim % BLOCK_M == 0` (dim must be a multiple of BLOCK_M) ``.
pub fn describe_requirements(requires: &Requirements) -> Vec<String> {
    requires
        .rules
        .iter()
        .map(|rule| match &rule.reason {
            Some(reason) => format!("`{}` ({reason})", rule.when),
            None => format!("`{}`", rule.when),
        })
        .collect()
}

/// How a kernel's requirements changed, one line each: its inputs, each condition it gained
/// (`requires: new `cols <= 4096``: what a caller may now be refused) and each it lost.
/// Conditions are compared by their text, in any order; a changed reason is a change too.
pub fn diff_requirements(old: &Requirements, new: &Requirements) -> Vec<String> {
    let mut changes = Vec::new();
    if old.inputs != new.inputs {
        changes.push(format!("inputs: {:?} → {:?}", old.inputs, new.inputs));
    }
    let (before, after): (BTreeSet<&Requirement>, BTreeSet<&Requirement>) =
        (old.rules.iter().collect(), new.rules.iter().collect());
    let show = |rule: &Requirement| {
        describe_requirements(&Requirements {
            inputs: Vec::new(),
            rules: vec![rule.clone()],
        })
        .concat()
    };
    for rule in after.difference(&before) {
        changes.push(format!("requires: new {}", show(rule)));
    }
    for rule in before.difference(&after) {
        changes.push(format!("requires: dropped {}", show(rule)));
    }
    changes
}

/// What a `targets.<arch>` table adds, on one line: `defines X=1; nvcc flags -lineinfo`.
fn describe_target(target: &TargetInputs) -> String {
    let mut parts = Vec::new();
    if !target.defines.is_empty() {
        let defines: Vec<String> = target
            .defines
            .iter()
            .map(|(name, value)| format!("{name}={value}"))
            .collect();
        parts.push(format!("defines {}", defines.join(" ")));
    }
    for (label, flags) in [
        ("flags", &target.flags),
        ("nvcc flags", &target.nvcc_flags),
        ("NVRTC flags", &target.nvrtc_flags),
    ] {
        if !flags.is_empty() {
            parts.push(format!("{label} {}", flags.join(" ")));
        }
    }
    parts.join("; ")
}

impl fmt::Display for Explanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = String::new();
        writeln!(out, "kernel `{}`", self.kernel)?;
        if !self.tree.is_empty() {
            writeln!(out, "\ninclude tree:")?;
            for line in self.tree.lines() {
                writeln!(out, "  {line}")?;
            }
        }
        writeln!(
            out,
            "\nkey inputs (key format {}):",
            prebuilt::key::KEY_FORMAT
        )?;
        writeln!(out, "  entries: {}", self.inputs.entries.join(", "))?;
        writeln!(out, "  files:")?;
        for (path, digest) in &self.inputs.files {
            writeln!(out, "    {digest}  {path}")?;
        }
        if !self.externals.is_empty() {
            let externals: Vec<&str> = self.externals.iter().map(String::as_str).collect();
            writeln!(
                out,
                "  external headers (toolkit or system; followed for library files, keyed by the \
                 compiler record: toolkit version, and for nvcc the host compiler): {}",
                externals.join(", ")
            )?;
        }
        let defines: Vec<String> = self
            .inputs
            .defines
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        writeln!(
            out,
            "  defines: {}",
            if defines.is_empty() {
                "none".into()
            } else {
                defines.join(" ")
            }
        )?;
        let list = |flags: &[String]| {
            if flags.is_empty() {
                "none".to_owned()
            } else {
                flags.join(" ")
            }
        };
        let own_flags = !self.inputs.nvcc_flags.is_empty() || !self.inputs.nvrtc_flags.is_empty();
        let label = if own_flags {
            "flags (every compiler)"
        } else {
            "flags"
        };
        writeln!(out, "  {label}: {}", list(&self.inputs.flags))?;
        if !self.inputs.nvcc_flags.is_empty() {
            writeln!(out, "  nvcc flags: {}", list(&self.inputs.nvcc_flags))?;
        }
        if !self.inputs.nvrtc_flags.is_empty() {
            writeln!(out, "  NVRTC flags: {}", list(&self.inputs.nvrtc_flags))?;
        }
        for (arch, target) in &self.inputs.targets {
            writeln!(out, "  {arch} adds: {}", describe_target(target))?;
        }
        writeln!(out, "  C++ standard: {}", self.inputs.cxx_std)?;
        if !self.inputs.preamble.is_empty() {
            writeln!(
                out,
                "  preamble (compiled after the source, before the entries):"
            )?;
            for line in self.inputs.preamble.lines() {
                writeln!(out, "    {line}")?;
            }
        }
        let requires = &self.inputs.requires;
        if !requires.is_empty() {
            writeln!(out, "  inputs: {}", list(&requires.inputs))?;
            writeln!(
                out,
                "  requires (checked in order; the first that fails is reported):"
            )?;
            for line in describe_requirements(requires) {
                writeln!(out, "    {line}")?;
            }
        }
        writeln!(out, "  torch pin: {}", self.torch)?;
        if let Some((headers, stable)) = &self.torch_headers {
            writeln!(
                out,
                "  torch extension: torch {} at {} ({})",
                headers.version,
                headers.package.display(),
                headers.found_by
            )?;
            let dirs: Vec<String> = stable
                .iter()
                .zip(&headers.include_dirs)
                .map(|(name, dir)| format!("{name} = {}", dir.display()))
                .collect();
            writeln!(out, "    include dirs: {}", dirs.join(", "))?;
            let defines: Vec<String> = headers
                .defines_for(&self.kernel)
                .iter()
                .map(|(name, value)| format!("{name}={value}"))
                .collect();
            writeln!(out, "    defines: {}", defines.join(" "))?;
            writeln!(out, "    nvcc flags: {}", list(&headers.nvcc_flags))?;
        }
        writeln!(out, "\ntargets:")?;
        for target in &self.targets {
            match &target.key {
                Ok((compiler, key)) => writeln!(
                    out,
                    "  {}/{}  {compiler}  key {key}",
                    target.build, target.arch
                )?,
                Err(reason) => {
                    writeln!(out, "  {}/{}  no key: {reason}", target.build, target.arch)?
                }
            }
        }
        write_changes(&mut out, self.changes.as_deref())?;
        f.write_str(&out)
    }
}

/// What changed since the index, one line each, after a blank line; nothing without an
/// index to compare with.
fn write_changes(out: &mut String, changes: Option<&[String]>) -> std::fmt::Result {
    use std::fmt::Write as _;
    match changes {
        None => Ok(()),
        Some([]) => writeln!(out, "\nunchanged since the index"),
        Some(changes) => {
            writeln!(out, "\nchanged since the index:")?;
            for change in changes {
                writeln!(out, "  {change}")?;
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use prebuilt::index::{CompilerRecord, KernelRecord};
    use prebuilt::KernelKey;
    use testkit::fixtures;

    use super::*;

    fn inputs(nvcc_flags: &[&str]) -> KernelInputs {
        KernelInputs {
            entries: vec!["k".into()],
            files: BTreeMap::from([("k.cu".into(), "ab".repeat(32))]),
            nvcc_flags: nvcc_flags.iter().map(|f| (*f).to_owned()).collect(),
            cxx_std: "c++17".into(),
            ..KernelInputs::default()
        }
    }

    fn nvcc() -> CompilerRecord {
        fixtures::compiler("nvcc", "13.0.88")
    }

    /// An index holding `kernel` built for cu130/sm_90a with `inputs` under `key`.
    fn index(inputs: KernelInputs, key: &str) -> Index {
        let mut variant = fixtures::variant("cu130/sm_90a");
        variant.compiler = nvcc();
        variant.key = key.into();
        let record = KernelRecord {
            inputs,
            variants: vec![variant],
            ..fixtures::record(&[], &[])
        };
        Index {
            kernels: BTreeMap::from([("k".into(), record)]),
            ..fixtures::index()
        }
    }

    fn target(key: &str) -> TargetKey {
        TargetKey {
            build: "cu130".parse().unwrap(),
            arch: "sm_90a".parse().unwrap(),
            key: Ok((nvcc(), KernelKey(key.into()))),
        }
    }

    #[test]
    fn a_changed_nvcc_flag_is_a_change() {
        let old = inputs(&["-maxrregcount=64"]);
        let new = inputs(&["-maxrregcount=50"]);
        let changes = changes_since(&index(old, "1111"), "k", &new, "2.13.*", &[target("2222")]);
        assert_eq!(
            changes,
            ["nvcc flags: [\"-maxrregcount=64\"] → [\"-maxrregcount=50\"]"]
        );
    }

    #[test]
    fn a_changed_key_is_never_unchanged() {
        // Inputs alike (an input of the key that the listing does not spell out changed).
        let same = inputs(&[]);
        let changes = changes_since(
            &index(same.clone(), "1111"),
            "k",
            &same,
            "2.13.*",
            &[target("2222")],
        );
        assert_eq!(changes, ["key for cu130/sm_90a: 1111 → 2222"]);
        let unchanged = changes_since(
            &index(same.clone(), "1111"),
            "k",
            &same,
            "2.13.*",
            &[target("1111")],
        );
        assert!(unchanged.is_empty(), "{unchanged:?}");
    }

    #[test]
    fn compiler_specific_flags_are_shown() {
        let mut inputs = inputs(&["-maxrregcount=50"]);
        inputs.nvrtc_flags = vec!["-default-device".into()];
        let explanation = Explanation {
            kernel: "k".into(),
            tree: String::new(),
            externals: BTreeSet::new(),
            inputs,
            torch: "2.13.*".into(),
            torch_headers: None,
            targets: Vec::new(),
            changes: None,
        };
        let text = explanation.to_string();
        assert!(text.contains("\n  flags (every compiler): none\n  nvcc flags: -maxrregcount=50\n  NVRTC flags: -default-device\n"), "{text}");
    }
}
