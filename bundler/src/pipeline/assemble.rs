//! Assembling the index from a plan and its outcomes: each kernel's variants (the built
//! targets) and skips (the rest, with why), and where each variant's cubin waits in the build
//! cache for the writer.

use super::*;

/// The index a build writes, before the writer places its files.
pub(super) struct Assembled {
    /// The index; artifacts have their digests and sizes, not yet their paths.
    pub(super) index: Index,
    /// Each variant's cubin in the build cache, by digest.
    pub(super) cubins: BTreeMap<String, PathBuf>,
    /// The first kernel with no variant, with why: the build's error when no kernel has one.
    pub(super) unbuilt: Option<Error>,
}

/// Assembles the index of `plan` from its jobs' `outcomes` (in job order) and its skips.
pub(super) fn assemble(
    plan: &BuildPlan,
    outcomes: &[TargetOutcome],
    cache: &BuildCache,
) -> Assembled {
    let mut index = Index {
        format: INDEX_FORMAT,
        store: None,
        package: plan.manifest.library.package.clone(),
        torch: plan.torch.clone(),
        dictionary: None,
        kernels: BTreeMap::new(),
        modules: Default::default(),
    };
    let mut skipped: BTreeMap<usize, Vec<(Arch, CudaBuild, Outcome)>> = BTreeMap::new();
    for (kernel, arch, build, why) in &plan.skipped {
        skipped.entry(*kernel).or_default().push((
            *arch,
            *build,
            Outcome::Skipped {
                reason: why.clone(),
            },
        ));
    }
    let mut variants: BTreeMap<usize, Vec<Variant>> = BTreeMap::new();
    let mut cubins = BTreeMap::new();
    for (job, done) in plan.jobs.iter().zip(outcomes) {
        match &done.outcome {
            Outcome::Built(built) => {
                variants.entry(job.kernel).or_default().push(Variant {
                    arch: job.arch,
                    cuda: job.build,
                    torch: plan.torch.clone(),
                    compiler: job.compiler.clone(),
                    key: job.key.clone(),
                    artifact: StoredFile {
                        digest: built.digest.clone(),
                        size: built.size,
                        path: String::new(),
                        stored_size: 0,
                        dictionary: None,
                    },
                    functions: built.functions.clone(),
                    structs: built.structs.clone(),
                });
                cubins.insert(built.digest.clone(), cache.entry_path(&job.key));
            }
            outcome => {
                skipped
                    .entry(job.kernel)
                    .or_default()
                    .push((job.arch, job.build, outcome.clone()));
            }
        }
    }
    let mut unbuilt = None;
    for (position, kernel) in plan.kernels.iter().enumerate() {
        let spec = &plan.manifest.kernels[&kernel.name];
        let mut variants = variants.remove(&position).unwrap_or_default();
        variants.sort_by_key(|v| (v.cuda, v.arch));
        let mut skips = skipped.remove(&position).unwrap_or_default();
        skips.sort_by_key(|(arch, cuda, _)| (*cuda, *arch));
        let records = skips
            .iter()
            .map(|(arch, cuda, outcome)| {
                Skip::new(*arch, *cuda, &outcome.skip_reason().expect("no variant"))
            })
            .collect();
        if variants.is_empty() && unbuilt.is_none() {
            unbuilt = Some(Error::NoTarget {
                kernel: kernel.name.clone(),
                skips: skips
                    .iter()
                    .map(|(arch, cuda, outcome)| crate::error::Unbuilt {
                        arch: *arch,
                        cuda: *cuda,
                        reason: outcome.skip_reason().expect("no variant"),
                        failure: match outcome {
                            Outcome::Failed(failure) => Some((
                                crate::error::KeptFailure {
                                    reason: failure.error.clone(),
                                    target: failure.target.clone(),
                                    log: failure.log.clone(),
                                },
                                failure.replayed,
                            )),
                            _ => None,
                        },
                    })
                    .collect(),
            });
        }
        index.kernels.insert(
            kernel.name.clone(),
            KernelRecord {
                inputs: kernel.inputs.clone(),
                recipe: kernel.recipe.clone(),
                constants: spec.constants.clone(),
                variants,
                skipped: records,
            },
        );
    }
    Assembled {
        index,
        cubins,
        unbuilt,
    }
}
