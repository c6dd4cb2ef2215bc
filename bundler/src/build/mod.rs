//! `bundle-kernels`: plan the (kernel × CUDA build × arch) matrix, compile what the cache
//! lacks, validate every cubin, and write the bundle.
//!
//! ```text
//! manifest ─► scan include graphs ─► keys ─► cache hit? ──yes──► validate ─┐
//!                                             │                           ├─► write bundle
//!                                             └─no─► compile ─► validate ─┘   (atomic swap)
//! ```
//!
//! Compile jobs run on `jobs` threads and every target is attempted. A target a toolchain
//! cannot build, that a kernel narrows away with `arch = [...]` or `cuda-builds = [...]`, or
//! whose compile or validation fails, is a skip recorded in the index with its reason (a failure
//! with the compiler's log); `require` turns every skip into an error. A kernel left with no
//! variant at all (every target failed, say an entry that names nothing) is recorded with its
//! skips like any other and never ends the other kernels' variants; only a build in which no
//! kernel has a variant fails, having nothing to ship. A cubin whose every entry is a stub on
//! its target (a body that only prints, asserts or traps: [`prebuilt::cubin::stub_entries`]) is
//! a skip too, unless the kernel says `allow-stub = true`. A compile that failed because of its inputs is kept in
//! the build cache (`<key>.failed.json` beside the cubin's place) and replayed, not rerun,
//! while the key stays the same. See `docs/toolchains.md`.
//!
//! Which compiler builds a target: the build's nvcc where it has one; otherwise NVRTC, or, for
//! a kernel whose include graph reaches a system header (or that says `compiler = "nvcc"`),
//! the newer toolkit's nvcc and this build's `ptxas` ([`crate::compiler::NvccPtxas`]).
//!
//! [`bundle_kernels_shared`] also takes a [`SharedBuild`]: a remote cache asked after the
//! local one and told about every compile ([`crate::remote`]), and a shard, which builds one
//! deterministic share of the jobs into a shard directory for [`crate::shard::merge_shards`].

mod plan;
mod run;

pub use plan::FAILED;
use plan::{plan_job, select_kernels, Job, Work, DECLARED};
pub use plan::{plan_kernel, target_key, target_keys, PlannedKernel, TargetKey};
use run::{describe, index_reason, run_jobs, stub_reason};

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prebuilt::compile::{resolve_entries, CompileJob, EntryError};
use prebuilt::cubin::{stub_entries, StubEntry};
use prebuilt::index::{
    CompilerRecord, Function, Index, KernelInputs, KernelRecord, Skip, SourceRecipe, StoredFile,
    Variant, INDEX_FORMAT,
};
use prebuilt::key::{sha256_hex, KeyInputs};
use prebuilt::{Arch, CudaBuild, KernelKey};

use crate::cache::BuildCache;
use crate::compiler::{compiler_for, CompileRequest, Compiler, NvccPtxas};
use crate::compress::{Corpus as _, FileCorpus};
use crate::include::{scan_includes, IncludeGraph, ScanRoots};
use crate::manifest::{CompilerChoice, KernelSpec, Manifest};
use crate::remote::{RemoteCache, RemoteStats};
use crate::shard::{write_shard, PlannedJob, Shard, SharedBuild};
use crate::toolchain::{discover, front_end_for, CompilerId};
use crate::writer::{write_bundle_streamed, WriteOutcome};
use crate::Error;

/// A CUDA build ready to compile: the seam tests use to substitute compilers.
#[derive(Clone)]
pub struct BuildToolchain {
    /// The CUDA build.
    pub build: CudaBuild,
    /// The compiler of that build.
    pub compiler: Arc<dyn Compiler>,
    /// SM numbers the compiler can target.
    pub supported_sms: BTreeSet<u32>,
    /// The toolkit's own include directories (headers there are not part of the key: the
    /// compiler's exact version stands for them).
    pub include_dirs: Vec<PathBuf>,
    /// For a build without nvcc of its own: the newer toolkit's nvcc with this build's `ptxas`,
    /// for kernels NVRTC cannot compile (see [`NvccPtxas`]). `None` where there is none.
    pub nvcc_route: Option<Arc<dyn Compiler>>,
}

impl BuildToolchain {
    /// Discovers the installed toolchain of `build` (see [`crate::toolchain`]).
    pub fn discover(build: CudaBuild) -> Result<BuildToolchain, Error> {
        let toolchain = discover(build)?;
        let compiler = compiler_for(&toolchain).map_err(Box::new)?;
        let nvcc_route = match (&toolchain.nvcc, &toolchain.ptxas) {
            (None, Some(_)) => front_end_for(build)
                .and_then(|front_end| NvccPtxas::new(&toolchain, &front_end).ok())
                .map(|route| Arc::new(route) as Arc<dyn Compiler>),
            _ => None,
        };
        Ok(BuildToolchain {
            build,
            compiler: Arc::from(compiler),
            supported_sms: toolchain.supported_archs.clone(),
            include_dirs: toolchain.include_dirs.clone(),
            nvcc_route,
        })
    }

    /// The compiler this build uses for `kernel`: its nvcc or NVRTC, or for a kernel NVRTC
    /// cannot compile (it reaches system headers, or asks for nvcc) the nvcc route, when the
    /// build has one.
    pub fn compiler_for_kernel(
        &self,
        manifest: &Manifest,
        spec: &KernelSpec,
        kernel: &PlannedKernel,
    ) -> &Arc<dyn Compiler> {
        let wants_nvcc = match manifest.compiler_of(spec) {
            CompilerChoice::Nvrtc => false,
            CompilerChoice::Nvcc => true,
            // `nvcc-flags` are meant for nvcc: NVRTC would drop them.
            CompilerChoice::Auto => {
                !kernel.system_headers.is_empty()
                    || kernel.inputs.has_nvcc_flags()
                    || kernel.torch.is_some()
            }
        };
        match &self.nvcc_route {
            Some(route) if wants_nvcc => route,
            _ => &self.compiler,
        }
    }

    /// The record (and key input) of the compiler that builds `kernel` with this build.
    pub fn record_for(
        &self,
        manifest: &Manifest,
        spec: &KernelSpec,
        kernel: &PlannedKernel,
    ) -> CompilerRecord {
        self.compiler_for_kernel(manifest, spec, kernel).record()
    }
}

/// What to print of the targets the manifest leaves out of kernels (the skips, by kernel,
/// whose reason is [`DECLARED`]): each one when they are few, else how many each reason
/// leaves out, with the first it does.
fn declared_lines<'a>(
    skipped: &BTreeMap<usize, Vec<Skip>>,
    name: impl Fn(usize) -> &'a str,
) -> Vec<String> {
    const LISTED: usize = 20;
    let declared: Vec<(usize, &Skip)> = skipped
        .iter()
        .flat_map(|(&index, skips)| skips.iter().map(move |skip| (index, skip)))
        .filter(|(_, skip)| skip.reason.starts_with(DECLARED))
        .collect();
    if declared.len() <= LISTED {
        return declared
            .iter()
            .map(|(index, skip)| {
                let (arch, build, reason) = (skip.arch, skip.cuda, &skip.reason);
                format!("skipping `{}` for {arch} ({build}): {reason}", name(*index))
            })
            .collect();
    }
    let mut by_reason: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for (at, (_, skip)) in declared.iter().enumerate() {
        by_reason.entry(&skip.reason).or_insert((0, at)).0 += 1;
    }
    let mut reasons: Vec<_> = by_reason.into_iter().collect();
    reasons.sort_by_key(|(_, (count, first))| (std::cmp::Reverse(*count), *first));
    let mut lines = vec![format!(
        "skipping {} targets the manifest leaves out of kernels (the index records each), by \
         reason:",
        declared.len()
    )];
    for (reason, (count, first)) in reasons.iter().take(LISTED) {
        let (index, skip) = declared[*first];
        let (arch, build) = (skip.arch, skip.cuda);
        lines.push(format!(
            "  {count} × {reason} (first: `{}` for {arch} ({build}))",
            name(index)
        ));
    }
    if reasons.len() > LISTED {
        lines.push(format!("  and {} more reasons", reasons.len() - LISTED));
    }
    lines
}

/// The index's record of a compiler.
pub fn compiler_record(id: &CompilerId) -> CompilerRecord {
    CompilerRecord {
        kind: id.kind.to_string(),
        version: id.version.clone(),
    }
}

/// What `bundle-kernels` does.
#[derive(Clone)]
pub struct BundleOptions {
    /// The manifest.
    pub manifest: PathBuf,
    /// Where the bundle goes (replaced atomically).
    pub out: PathBuf,
    /// The build cache directory.
    pub cache_dir: PathBuf,
    /// Parallel compile jobs.
    pub jobs: usize,
    /// Build only these kernels (all when empty).
    pub only: Vec<String>,
    /// Make every skip an error.
    pub require: bool,
    /// Override the manifest's torch pin.
    pub torch: Option<String>,
    /// Show a progress bar on a terminal.
    pub progress: bool,
    /// The toolchains to use; `None` discovers the manifest's CUDA builds.
    pub toolchains: Option<Vec<BuildToolchain>>,
}

impl BundleOptions {
    /// The whole manifest bundled into `out` with the cache at `cache_dir`: one job per core,
    /// every kernel, skips allowed, the manifest's torch pin and CUDA builds, no progress bar.
    pub fn new(manifest: &Path, out: &Path, cache_dir: &Path) -> BundleOptions {
        BundleOptions {
            manifest: manifest.to_owned(),
            out: out.to_owned(),
            cache_dir: cache_dir.to_owned(),
            jobs: std::thread::available_parallelism().map_or(1, usize::from),
            only: Vec::new(),
            require: false,
            torch: None,
            progress: false,
            toolchains: None,
        }
    }
}

/// What a `bundle-kernels` run did.
#[derive(Debug)]
pub struct BundleSummary {
    /// The bundle directory.
    pub out: PathBuf,
    /// The index written (or found unchanged).
    pub index: Index,
    /// Variants compiled in this run, as (kernel, build, arch).
    pub compiled: Vec<(String, CudaBuild, Arch)>,
    /// Extension modules compiled in this run, as (module, build).
    pub modules_compiled: Vec<(String, CudaBuild)>,
    /// Targets skipped as declared or unbuildable with the toolchains at hand (not failures).
    pub skipped: usize,
    /// Targets whose compile or validation failed, as (kernel, build, arch, error with the
    /// compiler's log); each is also a skip in the index.
    pub failed: Vec<(String, CudaBuild, Arch, String)>,
    /// Variants served by the build cache (local or remote).
    pub cached: usize,
    /// Of those, variants the remote cache served.
    pub from_remote: usize,
    /// What the remote cache did, when there is one.
    pub remote: Option<RemoteStats>,
    /// The shard built, when this run built one (then `out` is a shard directory and `index`
    /// has only the shard's variants).
    pub shard: Option<Shard>,
    /// Whether the bundle was rewritten or already matched.
    pub written: WriteOutcome,
    /// Wall time of the whole run.
    pub elapsed: Duration,
}

/// Runs `bundle-kernels`.
pub fn bundle_kernels(options: &BundleOptions) -> Result<BundleSummary, Error> {
    bundle_kernels_shared(options, &SharedBuild::default())
}

/// Runs `bundle-kernels` with a remote cache, or for one shard, as `shared` says.
pub fn bundle_kernels_shared(
    options: &BundleOptions,
    shared: &SharedBuild,
) -> Result<BundleSummary, Error> {
    let started = Instant::now();
    crate::writer::check_output(&options.out, shared.shard.is_some())?;
    let manifest = Manifest::load(&options.manifest)?;
    let torch = options
        .torch
        .clone()
        .unwrap_or_else(|| manifest.library.torch.clone());
    prebuilt::select::TorchPin::parse(&torch).map_err(Error::TorchPin)?;
    let selected = select_kernels(&manifest, &options.only)?;

    let toolchains = match &options.toolchains {
        Some(toolchains) => toolchains.clone(),
        None => {
            let builds: BTreeSet<CudaBuild> =
                manifest.library.cuda_builds.iter().copied().collect();
            let needs_compiler = selected
                .iter()
                .any(|name| manifest.kernels[*name].cubins.is_empty());
            if needs_compiler {
                builds
                    .into_iter()
                    .map(BuildToolchain::discover)
                    .collect::<Result<_, _>>()?
            } else {
                Vec::new()
            }
        }
    };
    let external_dirs: Vec<PathBuf> = toolchains
        .iter()
        .flat_map(|t| t.include_dirs.iter().cloned())
        .collect();

    let mut kernels = Vec::new();
    for name in &selected {
        kernels.push(plan_kernel(
            &manifest,
            name,
            &manifest.kernels[*name],
            &external_dirs,
        )?);
    }

    let mut jobs = Vec::new();
    let mut skipped_count = 0;
    let mut skipped: BTreeMap<usize, Vec<Skip>> = BTreeMap::new();
    for (index, kernel) in kernels.iter().enumerate() {
        let spec = &manifest.kernels[&kernel.name];
        for &build in &manifest.library.cuda_builds {
            for &arch in &manifest.library.archs {
                match plan_job(
                    &manifest,
                    spec,
                    index,
                    kernel,
                    build,
                    arch,
                    &torch,
                    &toolchains,
                ) {
                    Ok(job) => jobs.push(job),
                    Err(reason) => {
                        skipped_count += 1;
                        if options.require {
                            return Err(Error::Skipped {
                                kernel: kernel.name.clone(),
                                arch,
                                build,
                                reason,
                            });
                        }
                        // Targets the manifest itself leaves out are printed after the loop:
                        // listed when few, else summed up by reason (FlashInfer's 15,970 cubins
                        // each leave out three).
                        if !reason.starts_with(DECLARED) {
                            eprintln!("skipping `{}` for {arch} ({build}): {reason}", kernel.name);
                        }
                        skipped.entry(index).or_default().push(Skip {
                            arch,
                            cuda: build,
                            reason,
                        });
                    }
                }
            }
        }
    }

    for line in declared_lines(&skipped, |index| &kernels[index].name) {
        eprintln!("{line}");
    }

    let mut cache = BuildCache::new(&options.cache_dir);
    if let Some(remote) = &shared.remote_cache {
        cache = cache.with_remote(Arc::new(RemoteCache::new(remote)?));
    }
    let plan: Vec<PlannedJob> = jobs
        .iter()
        .map(|job| PlannedJob {
            key: job.key.clone(),
            kernel: kernels[job.kernel].name.clone(),
            cuda: job.build,
            arch: job.arch,
        })
        .collect();
    if let Some(shard) = shared.shard {
        let owned: BTreeSet<String> = shard
            .owned_keys(plan.iter().map(|job| job.key.as_str()))
            .into_iter()
            .map(str::to_owned)
            .collect();
        jobs.retain(|job| owned.contains(&job.key));
    }
    let results = run_jobs(&jobs, &kernels, &cache, options)?;
    let mut failed = Vec::new();
    // Jobs whose cubin is a stub on its target: skips, not variants.
    let mut stubs = BTreeSet::new();
    for (n, (job, result)) in jobs.iter().zip(&results).enumerate() {
        let name = &kernels[job.kernel].name;
        match result {
            Err(error) => {
                // Not printed here: the summary the caller gets (`BundleSummary::failed`) is
                // printed once per distinct error with the targets it hit (`kwheel`'s report).
                let reason = describe(error);
                // A failure kept from an earlier build is recorded as that build recorded it.
                let recorded = match error {
                    Error::CachedFailure { reason, .. } => reason,
                    _ => &reason,
                };
                skipped.entry(job.kernel).or_default().push(Skip {
                    arch: job.arch,
                    cuda: job.build,
                    reason: format!("{FAILED}{}", index_reason(recorded)),
                });
                failed.push((name.clone(), job.build, job.arch, reason));
            }
            Ok(built) if built.stubs.is_empty() || manifest.kernels[name].allow_stub => {}
            Ok(built) if built.stubs.len() < built.functions.len() => {
                let entries: Vec<String> = built
                    .stubs
                    .iter()
                    .map(|(entry, stub)| format!("`{entry}` ({})", stub.describe()))
                    .collect();
                eprintln!(
                    "warning: `{name}` for {} ({}): {} a stub there, kept for the kernel's other \
                     entries; launching it there fails",
                    job.arch,
                    job.build,
                    if entries.len() == 1 {
                        format!("entry {} is", entries[0])
                    } else {
                        format!("entries {} are", entries.join(", "))
                    }
                );
            }
            Ok(built) => {
                let reason = stub_reason(name, job.arch, &built.stubs);
                if options.require {
                    return Err(Error::Skipped {
                        kernel: name.clone(),
                        arch: job.arch,
                        build: job.build,
                        reason,
                    });
                }
                eprintln!(
                    "skipping `{name}` for {} ({}): {reason}",
                    job.arch, job.build
                );
                skipped_count += 1;
                stubs.insert(n);
                skipped.entry(job.kernel).or_default().push(Skip {
                    arch: job.arch,
                    cuda: job.build,
                    reason,
                });
            }
        }
    }

    let mut index = Index {
        format: INDEX_FORMAT,
        store: None,
        package: manifest.library.package.clone(),
        torch: torch.clone(),
        dictionary: None,
        kernels: BTreeMap::new(),
        modules: Default::default(),
    };
    let mut cubins = BTreeMap::new();
    let mut compiled = Vec::new();
    // The first kernel with no variant, with why, for a build in which no kernel has one.
    let mut unbuilt: Option<Error> = None;
    let mut cached = 0;
    let mut from_remote = 0;
    for (position, kernel) in kernels.iter().enumerate() {
        let spec = &manifest.kernels[&kernel.name];
        let mut variants = Vec::new();
        for (job, built) in jobs
            .iter()
            .zip(&results)
            .enumerate()
            .filter(|(n, (job, _))| job.kernel == position && !stubs.contains(n))
            .filter_map(|(_, (job, result))| Some((job, result.as_ref().ok()?)))
        {
            let digest = built.digest.clone();
            if built.compiled {
                compiled.push((kernel.name.clone(), job.build, job.arch));
            } else {
                cached += 1;
                from_remote += usize::from(built.remote);
            }
            variants.push(Variant {
                arch: job.arch,
                cuda: job.build,
                torch: torch.clone(),
                compiler: job.compiler.clone(),
                key: job.key.clone(),
                artifact: StoredFile {
                    digest: digest.clone(),
                    size: built.size,
                    path: String::new(),
                    stored_size: 0,
                    dictionary: None,
                },
                functions: built.functions.clone(),
            });
            cubins.insert(digest, cache.entry_path(&job.key));
        }
        variants.sort_by_key(|v| (v.cuda, v.arch));
        let mut skips = skipped.remove(&position).unwrap_or_default();
        skips.sort_by_key(|s| (s.cuda, s.arch));
        if variants.is_empty() && unbuilt.is_none() {
            let reasons: Vec<String> = skips
                .iter()
                .map(|skip| format!("{} ({}): {}", skip.arch, skip.cuda, skip.reason))
                .collect();
            unbuilt = Some(Error::NoTarget {
                kernel: kernel.name.clone(),
                reasons,
            });
        }
        index.kernels.insert(
            kernel.name.clone(),
            KernelRecord {
                inputs: kernel.inputs.clone(),
                recipe: kernel.recipe.clone(),
                constants: spec.constants.clone(),
                variants,
                skipped: skips,
            },
        );
    }

    // A shard may own none of a kernel's jobs; the merged bundle is checked as a whole.
    let nothing_built = index
        .kernels
        .values()
        .all(|kernel| kernel.variants.is_empty());
    if let Some(error) = unbuilt.filter(|_| nothing_built && shared.shard.is_none()) {
        return Err(error);
    }

    let sources: BTreeMap<String, PathBuf> = kernels
        .iter()
        .filter_map(|k| k.graph.as_ref())
        .flat_map(|graph| {
            graph.files().keys().filter_map(|stable| {
                graph
                    .absolute_path(stable)
                    .map(|path| (stable.clone(), path.to_owned()))
            })
        })
        .collect();
    // Modules are built after the kernels, on this machine only: a shard carries none
    // (docs/extensions.md).
    let modules = match shared.shard {
        Some(_) => crate::extension::build::BuiltModules::default(),
        None => crate::extension::build::build_modules(&manifest, &torch, &cache)?,
    };
    index.modules = modules.records;
    let remote = cache.remote().map(RemoteCache::stats);
    // The cubins stay in the build cache: the writer reads each when it needs it, and checks
    // that it is still the cubin the job validated.
    let corpus = FileCorpus::verified(cubins.into_iter().collect());
    let (index, written) = match shared.shard {
        Some(shard) => {
            // A shard's folder holds its cubins whole; a shard is a part of a build by design.
            let cubins = (0..corpus.count())
                .map(|i| Ok((corpus.key(i).to_owned(), corpus.read(i)?.into_owned())))
                .collect::<Result<BTreeMap<_, _>, Error>>()?;
            let written = write_shard(&options.out, shard, plan, &index, &cubins, &sources)?;
            (index, written)
        }
        None => write_bundle_streamed(
            &options.out,
            index,
            &corpus,
            crate::writer::BundleFiles {
                sources: &sources,
                modules: &modules.files,
            },
            options.jobs,
            options.progress,
        )?,
    };
    Ok(BundleSummary {
        out: options.out.clone(),
        index,
        compiled,
        modules_compiled: modules.compiled,
        skipped: skipped_count,
        failed,
        cached,
        from_remote,
        remote,
        shard: shared.shard,
        written,
        elapsed: started.elapsed(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declared_skips_are_listed_when_few_and_summed_up_by_reason_when_many() {
        let names: Vec<String> = (0..3000).map(|n| format!("k{n:05}")).collect();
        let (sm_100, sm_100a): (Arch, Arch) =
            ("sm_100".parse().unwrap(), "sm_100a".parse().unwrap());
        let cu130: CudaBuild = "cu130".parse().unwrap();
        let only = |arch: &str| format!("{DECLARED}the kernel targets only {arch}");
        let skip = |arch: Arch, reason: String| Skip {
            arch,
            cuda: cu130,
            reason,
        };
        // A skip of another kind is printed where it happens, not here.
        let failed = skip(sm_100a, "failed: nvcc exited with 1".into());
        let few = BTreeMap::from([(7, vec![skip(sm_100, only("sm_100f")), failed])]);
        assert_eq!(
            declared_lines(&few, |index| &names[index]),
            ["skipping `k00007` for sm_100 (cu130): declared: the kernel targets only sm_100f"]
        );
        // FlashInfer's shape: thousands of kernels, each leaving out targets for a few reasons.
        let mut many: BTreeMap<usize, Vec<Skip>> = BTreeMap::new();
        for index in 0..3000 {
            let skips = many.entry(index).or_default();
            skips.push(skip(sm_100, only("sm_100f")));
            if index % 3 == 0 {
                skips.push(skip(sm_100a, only("sm_103a")));
            }
        }
        // And 30 reasons of one kernel each: the 20 most common are shown.
        for index in 0..30 {
            let reason = only(&format!("sm_{index}"));
            many.get_mut(&index).unwrap().push(skip(sm_100a, reason));
        }
        let lines = declared_lines(&many, |index| &names[index]);
        assert_eq!(lines.len(), 1 + 20 + 1, "{lines:#?}");
        assert_eq!(
            lines[0],
            "skipping 4030 targets the manifest leaves out of kernels (the index records each), \
             by reason:"
        );
        assert_eq!(
            lines[1],
            "  3000 × declared: the kernel targets only sm_100f (first: `k00000` for sm_100 \
             (cu130))"
        );
        assert_eq!(
            lines[2],
            "  1000 × declared: the kernel targets only sm_103a (first: `k00000` for sm_100a \
             (cu130))"
        );
        assert!(lines[3].starts_with("  1 × declared: the kernel targets only sm_0 "));
        assert_eq!(lines[21], "  and 12 more reasons");
    }
}
