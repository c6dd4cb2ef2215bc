//! Extension modules in a library's wheel: each one read verified from the bundle, audited
//! with torch's and CUDA's libraries external, and the wheel's platform tag taken from them.
//!
//! A wheel without modules holds no host code and keeps [`crate::library::PLATFORM_TAG`]
//! (both CPU architectures, glibc 2.28). A wheel with modules is tagged for the CPUs its
//! modules are built for, with the newest manylinux policy any of them needs
//! ([`crate::audit::module_platform_tag`]): `manylinux_2_28` for a module kwheel built
//! (`prebuilt::module::compile` keeps its glibc symbols at 2.28), a newer one for a module
//! whose own code calls newer glibc functions. See `docs/extensions.md`.

use std::collections::BTreeSet;

use bundler::extension::build::{module_target, plan_module, toolkit_include_dirs};
use bundler::extension::cpu::module_cpus;
use bundler::Manifest;
use prebuilt::module::read_module;
use prebuilt::{Bundle, Index};

use crate::audit::module_platform_tag;
use crate::{Error, StaleKernel};

/// The extension modules of `index` that the manifest would build differently now: each
/// planned again (its include graph scanned, its flags and defines read) and compared with
/// the inputs the index records, one line per change; modules only one side has.
pub fn stale_modules(manifest: &Manifest, index: &Index) -> Result<Vec<StaleKernel>, Error> {
    if manifest.extensions.is_empty() && index.modules.is_empty() {
        return Ok(Vec::new());
    }
    // Planned for the first CPU of the first module (this machine's, unless `cpus` leaves it
    // out): the inputs an index records are that CPU's.
    let host = match manifest.extensions.values().next() {
        None => None,
        Some(spec) => Some(module_target(manifest, &module_cpus(spec)[0])?),
    };
    StaleKernel::of_each(
        &manifest.extensions,
        &index.modules,
        |name, spec| {
            let Some(record) = index.modules.get(name) else {
                return Ok(vec![
                    "an extension module of the manifest that the bundle lacks".into(),
                ]);
            };
            // Built for no target, the record has no inputs to compare: say why instead.
            if record.variants.is_empty() {
                return Err(Error::ModuleUnbuilt {
                    module: name.clone(),
                    reasons: record
                        .skipped
                        .iter()
                        .map(|skip| format!("{}/{}: {}", skip.cuda, skip.cpu, skip.reason))
                        .collect(),
                });
            }
            let host = host.as_ref().expect("found for the manifest's extensions");
            let build = record.variants.first().map(|variant| variant.cuda);
            let external = build.map(toolkit_include_dirs).unwrap_or_default();
            let planned = plan_module(manifest, name, spec, host, &external)?;
            let mut changes = bundler::explain::diff_module_inputs(&record.inputs, &planned.inputs);
            if record.abi != planned.abi {
                changes.push(format!("abi: {} → {}", record.abi, planned.abi));
            }
            Ok(changes)
        },
        "an extension module no longer in the manifest",
    )
}

/// The platform tag of a wheel that ships `bundle`'s modules, or `None` when it has none.
/// Every module is read and verified against its sha256 first; a module with no build, or
/// one that no vendored policy admits, is an error naming it.
pub fn modules_platform_tag(bundle: &Bundle) -> Result<Option<String>, Error> {
    let modules = &bundle.index().modules;
    if modules.is_empty() {
        return Ok(None);
    }
    // Per CPU, the newest policy any module needs (policies order by their glibc).
    let mut tags: BTreeSet<(String, (u32, u32), String)> = BTreeSet::new();
    for (name, record) in modules {
        if record.variants.is_empty() {
            let reasons: Vec<String> = record
                .skipped
                .iter()
                .map(|skip| format!("{}/{}: {}", skip.cuda, skip.cpu, skip.reason))
                .collect();
            return Err(Error::ModuleUnbuilt {
                module: name.clone(),
                reasons,
            });
        }
        for variant in &record.variants {
            let bytes = read_module(bundle.root(), name, variant)?;
            let path = format!("{name} ({})", variant.label());
            let tag = module_platform_tag(&variant.cpu, &path, &bytes).map_err(|violations| {
                Error::ModuleAudit {
                    module: name.clone(),
                    variant: variant.label(),
                    violations: violations.iter().map(ToString::to_string).collect(),
                }
            })?;
            tags.insert((variant.cpu.clone(), glibc_of(&tag), tag));
        }
    }
    // The wheel is for the CPUs every module has a build for.
    let shared: BTreeSet<&String> = tags.iter().map(|(cpu, _, _)| cpu).collect();
    let shared: Vec<String> = shared
        .into_iter()
        .filter(|cpu| {
            modules
                .values()
                .all(|record| record.variants.iter().any(|variant| &variant.cpu == *cpu))
        })
        .cloned()
        .collect();
    if shared.is_empty() {
        return Err(Error::ModulesShareNoCpu {
            modules: modules
                .iter()
                .map(|(name, record)| {
                    let cpus: BTreeSet<&str> =
                        record.variants.iter().map(|v| v.cpu.as_str()).collect();
                    format!(
                        "{name}: {}",
                        cpus.into_iter().collect::<Vec<_>>().join(", ")
                    )
                })
                .collect(),
        });
    }
    let mut newest: Vec<(String, (u32, u32), String)> = Vec::new();
    for (cpu, glibc, tag) in tags {
        if !shared.contains(&cpu) {
            continue;
        }
        match newest.iter_mut().find(|(known, _, _)| *known == cpu) {
            Some(entry) if entry.1 < glibc => *entry = (cpu, glibc, tag),
            Some(_) => {}
            None => newest.push((cpu, glibc, tag)),
        }
    }
    // x86_64 first, as the tag of a wheel without modules has it.
    newest.sort_by_key(|(cpu, _, _)| {
        prebuilt::module::MODULE_CPUS
            .iter()
            .position(|known| known == cpu)
    });
    let tags: Vec<String> = newest.into_iter().map(|(_, _, tag)| tag).collect();
    Ok(Some(tags.join(".")))
}

/// The glibc version of a manylinux tag: `manylinux_2_34_x86_64` → (2, 34).
fn glibc_of(tag: &str) -> (u32, u32) {
    let mut parts = tag.trim_start_matches("manylinux_").split('_');
    let major = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let minor = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    (major, minor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_glibc_of_a_tag_orders_policies() {
        assert_eq!(glibc_of("manylinux_2_34_x86_64"), (2, 34));
        assert!(glibc_of("manylinux_2_28_aarch64") < glibc_of("manylinux_2_31_aarch64"));
    }
}
