//! `bundle-kernels` as a pipeline, the way the loader decides a load: plan, execute,
//! assemble, write, and a report the caller renders.
//!
//! ```text
//! manifest ─► plan ─────────────► execute ───────────► assemble ─► write ─► BundleSummary
//!            (plan.rs:            (execute.rs: each     (assemble.rs:        (outcomes, for
//!             include graphs,      job compiled or      index from           the CLI's text
//!             keys, one job or     taken from a cache,  outcomes)            and JSON report:
//!             a skip per target)   validated; typed                          report.rs)
//!                                  Outcome per target)
//! ```
//!
//! | stage | input | output |
//! | --- | --- | --- |
//! | [`BuildPlan::new`] | the options, the manifest, the toolchains | kernels with key inputs, jobs, skipped targets with a [`SkipReason`] |
//! | `execute` | the plan, the build cache | one [`TargetOutcome`] per job: built (compiled, cached, remote), skipped (a stub), failed |
//! | `assemble` | the plan, the outcomes | the index, each variant's cubin in the cache, the first kernel with no variant |
//! | the writer | the index and the cubins | the bundle, swapped in atomically, or a shard |
//!
//! Nothing here writes to stdout or stderr: what a user should see on the way (a skipped
//! target, a stub kept) is a `tracing` event, progress goes to the caller's
//! [`crate::progress::Progress`] observer, and the summary is the caller's to render ([`report`]).
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

mod assemble;
mod execute;
pub mod outcome;
mod plan;
pub mod report;

pub use outcome::{Built, Failure, Outcome, Provenance, Target, TargetOutcome};
pub use plan::{
    narrowed_away, plan_kernel, target_key, target_keys, BuildPlan, PlannedKernel, TargetKey,
};
use plan::{Job, Work};

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prebuilt::compile::computed::{read_computed, ComputedPlan};
use prebuilt::compile::{resolve_entries, CompileJob, EntryError};
use prebuilt::cubin::{stub_entries, StubEntry};
use prebuilt::index::{
    CompilerRecord, Function, Index, KernelInputs, KernelRecord, Skip, SkipReason, SourceRecipe,
    StoredFile, StructLayout, Variant, INDEX_FORMAT,
};
use prebuilt::key::{sha256_hex, KeyInputs};
use prebuilt::{Arch, CudaBuild, KernelKey};

use crate::cache::BuildCache;
use crate::compiler::{compiler_run_by, CompileRequest, Compiler, NvccPtxas};
use crate::compress::{Corpus as _, FileCorpus};
use crate::error::Error;
use crate::include::{scan_includes, IncludeGraph, ScanRoots};
use crate::manifest::{CompilerChoice, KernelSpec, Manifest};
use crate::remote::{RemoteCache, RemoteCacheOptions, RemoteStats};
use crate::shard::{write_shard, PlannedJob, Shard, SharedBuild};
use crate::toolchain::{discover, front_end_for, CompilerId};
use crate::writer::{write_bundle_streamed, WriteOutcome};

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
        BuildToolchain::discover_run_by(build, None)
    }

    /// [`BuildToolchain::discover`], its nvcc and `ptxas` run by `runner` where one is given
    /// (a build farm, [`crate::farm`]).
    pub fn discover_run_by(
        build: CudaBuild,
        runner: Option<Arc<dyn prebuilt::compile::ToolRunner>>,
    ) -> Result<BuildToolchain, Error> {
        let toolchain = discover(build)?;
        let compiler = compiler_run_by(&toolchain, runner.clone()).map_err(Box::new)?;
        let nvcc_route = match (&toolchain.nvcc, &toolchain.ptxas) {
            (None, Some(_)) => front_end_for(build)
                .and_then(|front_end| NvccPtxas::new(&toolchain, &front_end).ok())
                .map(|route| match runner {
                    Some(runner) => Arc::new(route.with_runner(runner)) as Arc<dyn Compiler>,
                    None => Arc::new(route) as Arc<dyn Compiler>,
                }),
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
    /// Who hears of the compile jobs' and the writer's progress; `None`: nobody.
    pub progress: Option<Arc<dyn crate::progress::Progress>>,
    /// The toolchains to use; `None` discovers the manifest's CUDA builds.
    pub toolchains: Option<Vec<BuildToolchain>>,
    /// A build farm to run the discovered toolchains' nvcc and `ptxas` compiles on
    /// ([`crate::farm`]); `None` compiles here.
    pub farm: Option<Arc<crate::farm::Farm>>,
}

impl BundleOptions {
    /// The whole manifest bundled into `out` with the cache at `cache_dir`: one job per core,
    /// every kernel, skips allowed, the manifest's torch pin and CUDA builds, no progress observer.
    pub fn new(manifest: &Path, out: &Path, cache_dir: &Path) -> BundleOptions {
        BundleOptions {
            manifest: manifest.to_owned(),
            out: out.to_owned(),
            cache_dir: cache_dir.to_owned(),
            jobs: std::thread::available_parallelism().map_or(1, usize::from),
            only: Vec::new(),
            require: false,
            torch: None,
            progress: None,
            toolchains: None,
            farm: None,
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
    /// Every target of the matrix the run planned (a shard's own), with what became of it,
    /// by kernel, CUDA build and arch.
    pub targets: Vec<TargetOutcome>,
    /// Extension modules compiled in this run, as (module, build, CPU).
    pub modules_compiled: Vec<(String, CudaBuild, String)>,
    /// What the remote cache did, when there is one.
    pub remote: Option<RemoteStats>,
    /// The shard built, when this run built one (then `out` is a shard directory and `index`
    /// has only the shard's variants).
    pub shard: Option<Shard>,
    /// Whether the bundle was rewritten or already matched.
    pub written: WriteOutcome,
    /// What the build farm did, when the build used one.
    pub farm: Option<crate::farm::FarmReport>,
    /// Wall time of the whole run.
    pub elapsed: Duration,
}

impl BundleSummary {
    /// The variants compiled in this run, as (kernel, build, arch).
    pub fn compiled(&self) -> Vec<(String, CudaBuild, Arch)> {
        self.built(|source| source == Provenance::Compiled)
    }

    /// How many variants a build cache served (local or remote).
    pub fn cached(&self) -> usize {
        self.built(|source| source != Provenance::Compiled).len()
    }

    /// How many of those the remote cache served.
    pub fn from_remote(&self) -> usize {
        self.built(|source| source == Provenance::Remote).len()
    }

    /// How many targets were skipped: declared, beyond the toolchains, or stubs (not
    /// failures).
    pub fn skipped(&self) -> usize {
        self.targets
            .iter()
            .filter(|t| matches!(t.outcome, Outcome::Skipped { .. }))
            .count()
    }

    /// The targets whose compile or validation failed, as (kernel, build, arch, error with
    /// the compiler's log); each is also a skip in the index.
    pub fn failed(&self) -> Vec<(String, CudaBuild, Arch, String)> {
        self.targets
            .iter()
            .filter_map(|t| match &t.outcome {
                Outcome::Failed(failure) => Some((
                    t.target.kernel.clone(),
                    t.target.cuda,
                    t.target.arch,
                    failure.error.clone(),
                )),
                _ => None,
            })
            .collect()
    }

    /// Each target whose compile or validation failed, as its kernel and the failure.
    pub fn failures(&self) -> Vec<(&str, &Failure)> {
        self.targets
            .iter()
            .filter_map(|t| match &t.outcome {
                Outcome::Failed(failure) => Some((t.target.kernel.as_str(), failure)),
                _ => None,
            })
            .collect()
    }

    fn built(&self, source: impl Fn(Provenance) -> bool) -> Vec<(String, CudaBuild, Arch)> {
        self.targets
            .iter()
            .filter_map(|t| match &t.outcome {
                Outcome::Built(built) if source(built.source) => {
                    Some((t.target.kernel.clone(), t.target.cuda, t.target.arch))
                }
                _ => None,
            })
            .collect()
    }
}

/// The folder under the build cache that holds what farm builds compiled, apart from what
/// local builds compiled.
pub const FARM_CACHE: &str = "farm";

/// Runs `bundle-kernels`.
pub fn bundle_kernels(options: &BundleOptions) -> Result<BundleSummary, Error> {
    bundle_kernels_shared(options, &SharedBuild::default())
}

/// Runs `bundle-kernels` with a remote cache, or for one shard, as `shared` says: plans the
/// build, executes the plan, assembles the index from the outcomes and writes the bundle (or
/// the shard). Diagnostics on the way are `tracing` events; the result is the summary.
pub fn bundle_kernels_shared(
    options: &BundleOptions,
    shared: &SharedBuild,
) -> Result<BundleSummary, Error> {
    let started = Instant::now();
    crate::writer::check_output(&options.out, shared.shard.is_some())?;
    let farm_before = options.farm.as_ref().map(|farm| farm.check()).transpose()?;
    let mut plan = BuildPlan::new(options)?;
    report::announce_skips(&plan);

    // A farm build keeps its cubins apart and reads the remote cache only (as
    // `--remote-cache-read-only` does): where a unit spells its own path (`__FILE__`,
    // `assert`), the farm's compile names the path the farm resolved, so its bytes can differ
    // from a local compile of the same key.
    let mut cache = match options.farm {
        Some(_) => BuildCache::new(options.cache_dir.join(FARM_CACHE)),
        None => BuildCache::new(&options.cache_dir),
    };
    if let Some(remote) = &shared.remote_cache {
        let remote = RemoteCacheOptions {
            upload: remote.upload && options.farm.is_none(),
            ..remote.clone()
        };
        cache = cache.with_remote(Arc::new(RemoteCache::new(&remote)?));
    }
    let planned = plan.planned_jobs();
    if let Some(shard) = shared.shard {
        plan.keep_shard(shard);
    }
    let outcomes = execute::execute(&plan, &cache, options)?;
    let assembled = assemble::assemble(&plan, &outcomes, &cache);
    let mut index = assembled.index;
    // A shard may own none of a kernel's jobs; the merged bundle is checked as a whole.
    let nothing_built = index
        .kernels
        .values()
        .all(|kernel| kernel.variants.is_empty());
    if let Some(error) = assembled
        .unbuilt
        .filter(|_| nothing_built && shared.shard.is_none())
    {
        return Err(error);
    }

    let mut sources: BTreeMap<String, PathBuf> = plan
        .kernels
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
    // Modules are built after the kernels, on this machine, or by shard 1 of a split build
    // (docs/extensions.md).
    let modules = match shared.shard {
        Some(shard) if shard.index != 1 => crate::extension::build::BuiltModules::default(),
        _ => crate::extension::build::build_modules(&plan.manifest, &plan.torch, &cache)?,
    };
    if options.require {
        let skip = modules
            .records
            .iter()
            .find_map(|(name, record)| record.skipped.first().map(|skip| (name, skip)));
        if let Some((name, skip)) = skip {
            return Err(Error::ModuleSkipped {
                module: name.clone(),
                target: format!("{}/{}", skip.cuda, skip.cpu),
                reason: skip.reason.clone(),
            });
        }
    }
    index.modules = modules.records;
    // A module's own files ship beside the kernels' for the JIT fallback to rebuild it.
    sources.extend(modules.sources.clone());
    let remote = cache.remote().map(RemoteCache::stats);
    // The cubins stay in the build cache: the writer reads each when it needs it, and checks
    // that it is still the cubin the job validated.
    let corpus = FileCorpus::verified(assembled.cubins.into_iter().collect());
    let (index, written) = match shared.shard {
        Some(shard) => {
            // A shard's folder holds its cubins whole; a shard is a part of a build by design.
            let cubins = (0..corpus.count())
                .map(|i| Ok((corpus.key(i).to_owned(), corpus.read(i)?.into_owned())))
                .collect::<Result<BTreeMap<_, _>, Error>>()?;
            let files = crate::writer::BundleFiles {
                sources: &sources,
                modules: &modules.files,
            };
            let written = write_shard(&options.out, shard, planned, &index, &cubins, files)?;
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
            crate::progress::observer(&options.progress),
        )?,
    };
    let mut targets: Vec<TargetOutcome> = plan
        .skipped
        .iter()
        .map(|(kernel, arch, cuda, why)| TargetOutcome {
            target: Target {
                kernel: plan.kernels[*kernel].name.clone(),
                cuda: *cuda,
                arch: *arch,
            },
            outcome: Outcome::Skipped {
                reason: why.clone(),
            },
        })
        .chain(outcomes)
        .collect();
    targets.sort_by(|a, b| a.target.cmp(&b.target));
    let farm = match (&options.farm, &farm_before) {
        (Some(farm), Some(before)) => Some(farm.report(before)?),
        _ => None,
    };
    Ok(BundleSummary {
        out: options.out.clone(),
        index,
        targets,
        modules_compiled: modules.compiled,
        remote,
        shard: shared.shard,
        written,
        farm,
        elapsed: started.elapsed(),
    })
}
