//! `dev explain` of an extension module: every input of its key, from the function that
//! computes the key ([`plan_variant`], the one [`build_modules`] builds with), and what
//! changed since an index's module record.
//!
//! [`build_modules`]: crate::extension::build::build_modules

use std::collections::BTreeSet;
use std::fmt::{self, Write};
use std::path::Path;

use prebuilt::index::{CompilerRecord, Index};
use prebuilt::module::{Abi, ModuleInputs, MODULE_KEY_FORMAT};
use prebuilt::CudaBuild;

use crate::error::Error;
use crate::extension::build::{
    host_cpu, module_host, module_toolchain, plan_module, plan_variant, PlannedVariant,
};
use crate::extension::cpu::{host_target, module_cpus, HostTarget};
use crate::manifest::Manifest;
use crate::torch::TorchHeaders;

use super::{diff_files_and_defines, diff_lists, write_changes};

/// Everything `dev explain` prints about one extension module.
#[derive(Debug)]
pub struct ModuleExplanation {
    /// The module (`[extensions.<name>]`).
    pub name: String,
    /// Its ABI.
    pub abi: Abi,
    /// The include tree of every translation unit.
    pub tree: String,
    /// Headers of the toolkit and the host compiler, which the compilers' versions stand for.
    pub externals: BTreeSet<String>,
    /// The key inputs common to its variants.
    pub inputs: ModuleInputs,
    /// The torch pin (the manifest's, or `--torch`).
    pub torch_pin: String,
    /// The extension's `torch-target`, when it names one.
    pub torch_target: Option<String>,
    /// The torch whose headers and libraries it builds against.
    pub torch: TorchHeaders,
    /// The CPU whose plan the inputs and the include tree are: this machine's, unless the
    /// module's `cpus` leave it out.
    pub cpu: String,
    /// One row per CUDA build and CPU.
    pub targets: Vec<ModuleTargetKey>,
    /// With `--against`: the inputs that differ from that index, one line each.
    pub changes: Option<Vec<String>>,
}

/// A module's key for one CUDA build and CPU, or why it has none.
#[derive(Clone, Debug)]
pub struct ModuleTargetKey {
    /// The CUDA build.
    pub build: CudaBuild,
    /// The CPU.
    pub cpu: String,
    /// The torch range it serves, its compilers and its key; or why it is not built.
    pub key: Result<(String, Vec<CompilerRecord>, String), String>,
}

/// Explains extension module `name` of `manifest` under the torch pin `torch_pin`, optionally
/// against an index (a bundle directory or its `index.json`).
pub fn explain_module(
    manifest: &Manifest,
    name: &str,
    torch_pin: &str,
    against: Option<&Path>,
) -> Result<ModuleExplanation, Error> {
    let spec = &manifest.extensions[name];
    // Each CPU of the module's `cpus`: this machine's must have its compiler and torch (as
    // the build requires); another's absence is a row saying why.
    let mut hosts: Vec<(String, Result<HostTarget, String>)> = Vec::new();
    for cpu in module_cpus(spec) {
        let target = match cpu == host_cpu() {
            true => Ok(module_host(manifest)?),
            false => host_target(manifest, &cpu).map_err(|error| error.to_string()),
        };
        hosts.push((cpu, target));
    }
    let Some(shown) = hosts
        .iter()
        .find_map(|(_, target)| target.as_ref().ok())
        .cloned()
    else {
        let (cpu, reason) = hosts
            .iter()
            .find_map(|(cpu, target)| target.as_ref().err().map(|reason| (cpu, reason)))
            .expect("an extension has at least one CPU");
        return Err(Error::ModuleCompiler {
            module: name.to_owned(),
            cpu: cpu.clone(),
            reason: reason.clone(),
        });
    };
    let builds = spec
        .cuda_builds
        .as_deref()
        .unwrap_or(&manifest.library.cuda_builds);
    let mut planned = None;
    let mut targets = Vec::new();
    for &build in builds {
        let toolchain = module_toolchain(build);
        for (cpu, target) in &hosts {
            let cpu = cpu.clone();
            let key = match (&toolchain, target.as_ref()) {
                (Ok(toolchain), Ok(target)) => {
                    let PlannedVariant {
                        planned: plan,
                        torch: served,
                        compilers,
                        key,
                    } = plan_variant(manifest, name, spec, target, torch_pin, toolchain)?;
                    if target.cpu == shown.cpu {
                        planned.get_or_insert(plan);
                    }
                    Ok((served, compilers, key))
                }
                (Err(reason), _) | (_, Err(reason)) => Err(reason.clone()),
            };
            targets.push(ModuleTargetKey { build, cpu, key });
        }
    }
    // No build has a toolchain: the inputs are still the manifest's and the sources'.
    let planned = match planned {
        Some(planned) => planned,
        None => plan_module(manifest, name, spec, &shown, &[])?,
    };
    let changes = match against {
        Some(path) => {
            let index = prebuilt::lookup::read_bundle_index(path)?;
            Some(module_changes_since(
                &index,
                name,
                planned.abi,
                &planned.inputs,
                &targets,
            ))
        }
        None => None,
    };
    Ok(ModuleExplanation {
        name: name.to_owned(),
        abi: planned.abi,
        tree: planned.graph.render_tree(),
        externals: planned.graph.externals().clone(),
        inputs: planned.inputs,
        torch_pin: torch_pin.to_owned(),
        torch_target: spec.torch_target.clone(),
        torch: shown.torch,
        cpu: shown.cpu,
        targets,
        changes,
    })
}

/// One line per key input of a module that differs between `old` (an index's) and `new`.
pub fn diff_module_inputs(old: &ModuleInputs, new: &ModuleInputs) -> Vec<String> {
    let mut changes =
        diff_files_and_defines((&old.files, &old.defines), (&new.files, &new.defines));
    changes.extend(diff_lists(&[
        ("sources", &old.sources, &new.sources),
        ("nvcc-flags", &old.nvcc_flags, &new.nvcc_flags),
        ("cxx-flags", &old.cxx_flags, &new.cxx_flags),
    ]));
    if old.cxx_std != new.cxx_std {
        changes.push(format!("cxx-std: {} → {}", old.cxx_std, new.cxx_std));
    }
    if old.archs != new.archs {
        changes.push(format!("arch: {:?} → {:?}", old.archs, new.archs));
    }
    changes
}

/// The differences between what `index` recorded for module `name` and its current ABI,
/// inputs and per-build keys, one line each; empty when nothing changed.
pub fn module_changes_since(
    index: &Index,
    name: &str,
    abi: Abi,
    inputs: &ModuleInputs,
    targets: &[ModuleTargetKey],
) -> Vec<String> {
    let Some(record) = index.modules.get(name) else {
        return vec![format!("extension module `{name}` is not in the index")];
    };
    let mut changes = Vec::new();
    if record.abi != abi {
        changes.push(format!("abi: {} → {abi}", record.abi));
    }
    changes.extend(diff_module_inputs(&record.inputs, inputs));
    // The include dirs are recorded for the JIT, not keyed: what they resolved to is.
    let keyed = |inputs: &ModuleInputs| ModuleInputs {
        include_dirs: Vec::new(),
        ..inputs.clone()
    };
    if changes.is_empty() && keyed(&record.inputs) != keyed(inputs) {
        changes.push("key inputs: changed (see `index.json`'s module `inputs`)".into());
    }
    let described = !changes.is_empty();
    for target in targets {
        let Ok((served, compilers, key)) = &target.key else {
            continue;
        };
        let cpu = &target.cpu;
        let label = format!("{}/{cpu}", target.build);
        let old = record
            .variants
            .iter()
            .find(|v| v.cuda == target.build && &v.cpu == cpu);
        let Some(old) = old else {
            let skipped = record
                .skipped
                .iter()
                .any(|s| s.cuda == target.build && &s.cpu == cpu);
            if !skipped {
                changes.push(format!("variant {label}: not in the index"));
            }
            continue;
        };
        let before = changes.len();
        if &old.torch != served {
            changes.push(format!("torch served by {label}: {} → {served}", old.torch));
        }
        if &old.compilers != compilers {
            changes.push(format!(
                "compilers for {label}: {} → {}",
                compiler_list(&old.compilers),
                compiler_list(compilers)
            ));
        }
        // Whatever changed the key is listed above; a key that changed with nothing listed is
        // still a change.
        if &old.key != key && !described && changes.len() == before {
            changes.push(format!(
                "key for {label}: {} → {}",
                &old.key[..12.min(old.key.len())],
                &key[..12.min(key.len())]
            ));
        }
    }
    changes
}

/// `nvcc 13.0.88 + g++ (Debian 12.2.0-14+deb12u1) 12.2.0`.
fn compiler_list(compilers: &[CompilerRecord]) -> String {
    let names: Vec<String> = compilers.iter().map(ToString::to_string).collect();
    names.join(" + ")
}

fn list(items: &[String]) -> String {
    match items.is_empty() {
        true => "none".to_owned(),
        false => items.join(" "),
    }
}

impl fmt::Display for ModuleExplanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = String::new();
        writeln!(out, "extension module `{}`", self.name)?;
        writeln!(out, "\ninclude tree:")?;
        for line in self.tree.lines() {
            writeln!(out, "  {line}")?;
        }
        writeln!(out, "\nkey inputs (module key format {MODULE_KEY_FORMAT}):")?;
        writeln!(out, "  name: {}", self.name)?;
        let abi = match self.abi {
            Abi::Stable => "stable (LibTorch's stable ABI)",
            Abi::Torch => {
                "torch (ATen; kwheel's `torch/extension.h` without the Python half, hashed)"
            }
        };
        writeln!(out, "  ABI: {abi}")?;
        writeln!(out, "  sources: {}", self.inputs.sources.join(", "))?;
        writeln!(
            out,
            "  files (include graph of every unit, torch's headers too):"
        )?;
        for (path, digest) in &self.inputs.files {
            writeln!(out, "    {digest}  {path}")?;
        }
        if !self.externals.is_empty() {
            let externals: Vec<&str> = self.externals.iter().map(String::as_str).collect();
            writeln!(
                out,
                "  external headers (toolkit or host compiler; followed for library files, keyed \
                 by the compilers' versions): {}",
                externals.join(", ")
            )?;
        }
        let defines: Vec<String> = self
            .inputs
            .defines
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        writeln!(out, "  defines: {}", list(&defines))?;
        writeln!(out, "  nvcc flags: {}", list(&self.inputs.nvcc_flags))?;
        writeln!(out, "  host flags: {}", list(&self.inputs.cxx_flags))?;
        writeln!(out, "  C++ standard: {}", self.inputs.cxx_std)?;
        let archs: Vec<String> = self.inputs.archs.iter().map(ToString::to_string).collect();
        let device = match prebuilt::module_coverage::has_device_code(&self.inputs) {
            true => "",
            false => " (no .cu unit: no device code)",
        };
        writeln!(out, "  archs: {}{device}", archs.join(", "))?;
        let cpus: BTreeSet<&str> = self.targets.iter().map(|t| t.cpu.as_str()).collect();
        let others: Vec<&str> = cpus.into_iter().filter(|cpu| *cpu != self.cpu).collect();
        match others.is_empty() {
            true => writeln!(out, "  CPU: {}", self.cpu)?,
            false => writeln!(
                out,
                "  CPUs: {} (the tree and files above), {}",
                self.cpu,
                others.join(", ")
            )?,
        }
        match &self.torch_target {
            Some(target) => writeln!(
                out,
                "  torch: pin {}, torch-target {target} (the range each build serves starts there)",
                self.torch_pin
            )?,
            None => writeln!(
                out,
                "  torch: pin {} (the range each build serves starts at its minor)",
                self.torch_pin
            )?,
        }
        writeln!(
            out,
            "    built against torch {} at {} ({}); its headers are in the include graph",
            self.torch.version,
            self.torch.package.display(),
            self.torch.found_by
        )?;
        let mut dirs = self.inputs.include_dirs.clone();
        dirs.extend(
            self.torch
                .include_dirs
                .iter()
                .map(|dir| dir.display().to_string()),
        );
        // Numbered as the graph's stable names number them (`[1]/torch/…`).
        let dirs: Vec<String> = dirs
            .iter()
            .enumerate()
            .map(|(n, dir)| format!("[{n}] {dir}"))
            .collect();
        writeln!(
            out,
            "  include dirs (-I order; not keyed, the files they resolve to are): {}",
            dirs.join(", ")
        )?;
        writeln!(out, "\ntargets:")?;
        for target in &self.targets {
            let label = format!("{}/{}", target.build, target.cpu);
            match &target.key {
                Ok((served, compilers, key)) => writeln!(
                    out,
                    "  {label}  torch {served}  {}  key {key}",
                    compiler_list(compilers)
                )?,
                Err(reason) => writeln!(out, "  {label}  no key: {reason}")?,
            }
        }
        write_changes(&mut out, self.changes.as_deref())?;
        f.write_str(&out)
    }
}
