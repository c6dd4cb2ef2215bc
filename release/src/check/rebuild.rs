//! The `rebuild` gate: a sample of the bundle's variants compiled again from source, with an
//! empty build cache and no remote cache, must give the same bytes.
//!
//! Builds are reproducible, so a cubin that differs from a fresh compile of its own key is
//! not what its sources make: it came from a cache that served another cubin under that key
//! (an impostor with the right entry names, target and toolkit passes every other check), or
//! the build is not reproducible, which is a bug to fix before releasing either way.
//!
//! The sample is the first `N` compiled variants in key order (precompiled cubins have no
//! source to rebuild), so two runs check the same variants and a release engineer can rerun
//! one. The rebuild is the bundler's own build ([`bundler::bundle_kernels`]) of the sampled
//! kernels, narrowed to the sampled CUDA builds and SM numbers, into a scratch folder.

use std::collections::{BTreeMap, BTreeSet};

use bundler::{BuildToolchain, BundleOptions, Manifest};
use prebuilt::{error_chain, Bundle, CudaBuild, Variant};

use super::{CheckOptions, Run};

/// How many variants `release check` rebuilds unless told otherwise (`--rebuild-sample`).
pub const DEFAULT_REBUILD_SAMPLE: usize = 2;

pub(super) fn check_rebuild(
    run: &mut Run,
    manifest: &Manifest,
    options: &CheckOptions,
    torch: &str,
    bundle: &Bundle,
) {
    let count = options.rebuild_sample;
    if count == 0 {
        return run.skip("rebuild", "off (--rebuild-sample 0)");
    }
    let sample = sample(bundle, count);
    if sample.is_empty() {
        return run.skip(
            "rebuild",
            "the bundle has no compiled variant (only precompiled cubins)",
        );
    }
    match rebuild(manifest, options, torch, &sample) {
        Ok(problems) if problems.is_empty() => {
            let names: Vec<String> = sample
                .iter()
                .map(|(kernel, variant)| format!("`{kernel}` ({})", variant.label()))
                .collect();
            run.pass(
                "rebuild",
                format!(
                    "{} variant(s) compiled again from source with an empty cache are \
                     byte-identical to the bundle's: {}",
                    sample.len(),
                    names.join(", ")
                ),
            );
        }
        Ok(problems) => run.fail(
            "rebuild",
            problems.join("; "),
            "rebuild the bundle with an empty build cache and no remote cache (`kwheel dev \
             bundle-kernels --cache-dir <new folder>`); if a fresh build still differs, the \
             build is not reproducible",
        ),
        Err(reason) => run.fail(
            "rebuild",
            format!("the sample could not be compiled: {reason}"),
            "fix the toolchain or the build error, then run the check again",
        ),
    }
}

/// The first `count` variants by key that were compiled from source.
fn sample(bundle: &Bundle, count: usize) -> Vec<(String, Variant)> {
    let mut compiled: Vec<(String, Variant)> = bundle
        .index()
        .kernels
        .iter()
        .filter(|(_, record)| record.recipe.is_some())
        .flat_map(|(name, record)| {
            record
                .variants
                .iter()
                .filter(|variant| {
                    variant.compiler.compiler_kind()
                        != Some(prebuilt::index::CompilerKind::Precompiled)
                })
                .map(move |variant| (name.clone(), variant.clone()))
        })
        .collect();
    compiled.sort_by(|a, b| a.1.key.cmp(&b.1.key));
    compiled.truncate(count);
    compiled
}

/// Compiles the sample's kernels for its builds and SM numbers, and compares each sampled
/// variant with the one its key gives now: one problem per variant that differs.
fn rebuild(
    manifest: &Manifest,
    options: &CheckOptions,
    torch: &str,
    sample: &[(String, Variant)],
) -> Result<Vec<String>, String> {
    let mut sms: BTreeMap<CudaBuild, BTreeSet<u32>> = BTreeMap::new();
    for (_, variant) in sample {
        sms.entry(variant.cuda).or_default().insert(variant.arch.sm);
    }
    let mut toolchains = Vec::new();
    for (&build, sms) in &sms {
        let given = options
            .toolchains
            .as_ref()
            .and_then(|given| given.iter().find(|toolchain| toolchain.build == build));
        let mut toolchain = match given {
            Some(toolchain) => toolchain.clone(),
            None => BuildToolchain::discover(build).map_err(|error| error_chain(&error))?,
        };
        // Only the sampled SM numbers: the other targets are skipped, not compiled.
        toolchain.supported_sms = toolchain.supported_sms.intersection(sms).copied().collect();
        toolchains.push(toolchain);
    }
    let only: BTreeSet<String> = sample.iter().map(|(kernel, _)| kernel.clone()).collect();
    let scratch = tempfile::tempdir().map_err(|error| format!("no scratch folder: {error}"))?;
    let summary = bundler::bundle_kernels(&BundleOptions {
        manifest: manifest.path.clone(),
        out: scratch.path().join("bundle"),
        cache_dir: scratch.path().join("cache"),
        jobs: options.jobs,
        only: only.into_iter().collect(),
        require: false,
        torch: Some(torch.to_owned()),
        progress: None,
        toolchains: Some(toolchains),
        // The sample is rebuilt here, never on a farm: it checks what a farm built.
        farm: None,
    })
    .map_err(|error| error_chain(&error))?;
    let mut problems = Vec::new();
    for (kernel, variant) in sample {
        let label = variant.label();
        let rebuilt = summary.index.kernels.get(kernel).and_then(|record| {
            record
                .variants
                .iter()
                .find(|rebuilt| rebuilt.key == variant.key)
        });
        let Some(rebuilt) = rebuilt else {
            let failure = summary
                .failed()
                .iter()
                .find(|(name, build, arch, _)| {
                    name == kernel && *build == variant.cuda && *arch == variant.arch
                })
                .map(|(_, _, _, reason)| format!(": it failed to compile: {reason}"))
                .unwrap_or_else(|| {
                    " (the sources, toolchain or torch pin give another key now: see the \
                     `keys` gate)"
                        .to_owned()
                });
            problems.push(format!(
                "`{kernel}` ({label}), key {}, was not rebuilt{failure}",
                variant.key
            ));
            continue;
        };
        if rebuilt.artifact.digest != variant.artifact.digest
            || rebuilt.artifact.size != variant.artifact.size
        {
            problems.push(format!(
                "`{kernel}` ({label}) compiles from source to sha256 {} ({} bytes), but the \
                 bundle holds sha256 {} ({} bytes) under the same key {}",
                rebuilt.artifact.digest,
                rebuilt.artifact.size,
                variant.artifact.digest,
                variant.artifact.size,
                variant.key
            ));
        }
    }
    Ok(problems)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::{Gate, GateStatus};
    use std::path::Path;
    use testkit::{copy_tree, toolchains, workspace};

    fn build(manifest: &Path, out: &Path, toolchains: &[BuildToolchain]) -> prebuilt::Index {
        bundler::bundle_kernels(&BundleOptions {
            manifest: manifest.to_owned(),
            out: out.to_owned(),
            cache_dir: out.with_extension("cache"),
            jobs: 2,
            only: vec!["swiglu".into()],
            require: false,
            torch: None,
            progress: None,
            toolchains: Some(toolchains.to_vec()),
            farm: None,
        })
        .unwrap()
        .index
    }

    fn gate(bundle: &Path, toolchains: &[BuildToolchain], sample: usize) -> Gate {
        let manifest = Manifest::load(&workspace().join("kernels/kernels.toml")).unwrap();
        let options = CheckOptions {
            toolchains: Some(toolchains.to_vec()),
            rebuild_sample: sample,
            jobs: 2,
            ..CheckOptions::new(&manifest.path)
        };
        let mut run = Run::new(&[]);
        let torch = manifest.library.torch.clone();
        check_rebuild(
            &mut run,
            &manifest,
            &options,
            &torch,
            &Bundle::open(bundle).unwrap(),
        );
        run.gates.pop().unwrap()
    }

    /// What a remote cache that answers a key with another build's cubin of the same kernel
    /// (same entry, target and toolkit: it passes every other check) leaves in a bundle.
    #[test]
    fn the_rebuild_gate_catches_a_cubin_its_sources_do_not_make() {
        let Some(toolchains) = toolchains() else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let manifest = workspace().join("kernels/kernels.toml");
        let bundle = dir.path().join("bundle");
        let mut index = build(&manifest, &bundle, &toolchains);

        let passed = gate(&bundle, &toolchains, 2);
        assert_eq!(passed.status, GateStatus::Pass, "{passed:?}");
        assert!(passed.reason.contains("2 variant(s)"), "{passed:?}");
        assert_eq!(gate(&bundle, &toolchains, 0).status, GateStatus::Skip);

        // The impostor: swiglu built with another block size.
        let library = dir.path().join("library");
        copy_tree(&workspace().join("kernels"), &library, &[]);
        let text = std::fs::read_to_string(library.join("kernels.toml")).unwrap();
        let swiglu = "entries = [\"swiglu\"]\nconstants = { BLOCK_SIZE = 256 }";
        assert!(text.contains(swiglu));
        let text = text.replace(
            swiglu,
            "entries = [\"swiglu\"]\nconstants = { BLOCK_SIZE = 128 }",
        );
        std::fs::write(library.join("kernels.toml"), text).unwrap();
        let other = build(
            &library.join("kernels.toml"),
            &dir.path().join("other"),
            &toolchains,
        );

        let original = Bundle::open(&bundle).unwrap();
        let (_, sampled) = sample(&original, 1).remove(0);
        let impostor = other.kernels["swiglu"]
            .variants
            .iter()
            .find(|variant| variant.cuda == sampled.cuda && variant.arch == sampled.arch)
            .unwrap()
            .clone();
        assert_ne!(impostor.artifact.digest, sampled.artifact.digest);
        assert_eq!(impostor.functions, sampled.functions);
        let mut cubins = BTreeMap::new();
        for variant in &index.kernels["swiglu"].variants {
            let bytes = original.read_artifact("swiglu", variant).unwrap();
            cubins.insert(variant.artifact.digest.clone(), bytes);
        }
        let other_bundle = Bundle::open(dir.path().join("other")).unwrap();
        cubins.insert(
            impostor.artifact.digest.clone(),
            other_bundle.read_artifact("swiglu", &impostor).unwrap(),
        );
        for variant in &mut index.kernels.get_mut("swiglu").unwrap().variants {
            if variant.key == sampled.key {
                variant.artifact = impostor.artifact.clone();
            }
        }
        let sources = index.kernels["swiglu"]
            .inputs
            .files
            .keys()
            .map(|stable| (stable.clone(), bundle.join("sources").join(stable)))
            .collect();
        // The forgery is of a kernel: the library's extension module is left out of it.
        index.modules.clear();
        let forged = dir.path().join("forged");
        bundler::writer::write_bundle(
            &forged,
            index,
            &cubins,
            &sources,
            2,
            &bundler::progress::Silent,
        )
        .unwrap();

        let failed = gate(&forged, &toolchains, 2);
        assert_eq!(failed.status, GateStatus::Fail, "{failed:?}");
        let expected = format!(
            "`swiglu` ({}) compiles from source to sha256 {}",
            sampled.label(),
            sampled.artifact.digest
        );
        assert!(
            failed.reason.contains(&expected)
                && failed
                    .reason
                    .contains(&format!("bundle holds sha256 {}", impostor.artifact.digest)),
            "{failed:?}"
        );
    }
}
