//! `dev explain`: what goes into a kernel's key, and which input changed since an index.

use std::collections::BTreeSet;
use std::fmt::{self, Write};
use std::path::{Path, PathBuf};

use prebuilt::bundle::read_index;
use prebuilt::index::{Index, KernelInputs};
use prebuilt::CudaBuild;

use crate::build::{plan_kernel, target_keys, BuildToolchain};
use crate::manifest::Manifest;
use crate::Error;

pub use crate::build::TargetKey;

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
            let index = read_index(path)?;
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
    Ok(Explanation {
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
    for target in targets {
        let Ok((compiler, _)) = &target.key else {
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

/// Line-by-line differences between two sets of target-independent key inputs.
pub fn diff_inputs(old: &KernelInputs, new: &KernelInputs) -> Vec<String> {
    let mut changes = Vec::new();
    if old.entries != new.entries {
        changes.push(format!("entries: {:?} → {:?}", old.entries, new.entries));
    }
    let paths: BTreeSet<&String> = old.files.keys().chain(new.files.keys()).collect();
    for path in paths {
        match (old.files.get(path), new.files.get(path)) {
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
    let names: BTreeSet<&String> = old.defines.keys().chain(new.defines.keys()).collect();
    for name in names {
        match (old.defines.get(name), new.defines.get(name)) {
            (Some(a), Some(b)) if a != b => changes.push(format!("define {name}: {a} → {b}")),
            (Some(a), None) => changes.push(format!("define {name}: {a} → (removed)")),
            (None, Some(b)) => changes.push(format!("define {name}: (new) → {b}")),
            _ => {}
        }
    }
    if old.flags != new.flags {
        changes.push(format!("flags: {:?} → {:?}", old.flags, new.flags));
    }
    if old.cxx_std != new.cxx_std {
        changes.push(format!("C++ standard: {} → {}", old.cxx_std, new.cxx_std));
    }
    changes
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
        writeln!(
            out,
            "  flags: {}",
            if self.inputs.flags.is_empty() {
                "none".into()
            } else {
                self.inputs.flags.join(" ")
            }
        )?;
        writeln!(out, "  C++ standard: {}", self.inputs.cxx_std)?;
        writeln!(out, "  torch pin: {}", self.torch)?;
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
        if let Some(changes) = &self.changes {
            if changes.is_empty() {
                writeln!(out, "\nunchanged since the index")?;
            } else {
                writeln!(out, "\nchanged since the index:")?;
                for change in changes {
                    writeln!(out, "  {change}")?;
                }
            }
        }
        f.write_str(&out)
    }
}
