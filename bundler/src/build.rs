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
//! variant at all fails the build.
//!
//! Which compiler builds a target: the build's nvcc where it has one; otherwise NVRTC, or, for
//! a kernel whose include graph reaches a system header (or that says `compiler = "nvcc"`),
//! the newer toolkit's nvcc and this build's `ptxas` ([`crate::compiler::NvccPtxas`]).
//!
//! [`bundle_kernels_shared`] also takes a [`SharedBuild`]: a remote cache asked after the
//! local one and told about every compile ([`crate::remote`]), and a shard, which builds one
//! deterministic share of the jobs into a shard directory for [`crate::shard::merge_shards`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prebuilt::compile::{resolve_entries, EntryError};
use prebuilt::index::{
    CompilerRecord, Function, Index, KernelInputs, KernelRecord, Skip, SourceRecipe, StoredFile,
    Variant, INDEX_FORMAT,
};
use prebuilt::key::{sha256_hex, KeyInputs};
use prebuilt::{Arch, CudaBuild, KernelKey};

use crate::cache::BuildCache;
use crate::compiler::{compiler_for, CompileRequest, Compiler, NvccPtxas};
use crate::include::{scan_includes, IncludeGraph, ScanRoots};
use crate::manifest::{CompilerChoice, KernelSpec, Manifest};
use crate::remote::{RemoteCache, RemoteStats};
use crate::shard::{write_shard, PlannedJob, Shard, SharedBuild};
use crate::toolchain::{discover, front_end_for, CompilerId};
use crate::writer::{write_bundle, WriteOutcome};
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
            CompilerChoice::Auto => !kernel.system_headers.is_empty(),
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
    /// Show a progress bar on a terminal.
    pub progress: bool,
    /// The toolchains to use; `None` discovers the manifest's CUDA builds.
    pub toolchains: Option<Vec<BuildToolchain>>,
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

/// A kernel's planned inputs, shared by its jobs.
pub struct PlannedKernel {
    /// The kernel's name.
    pub name: String,
    /// Its include graph (`None` for precompiled cubins).
    pub graph: Option<IncludeGraph>,
    /// Its target-independent key inputs.
    pub inputs: KernelInputs,
    /// How to compile it from shipped sources.
    pub recipe: Option<SourceRecipe>,
    /// Angle includes found neither in the kernel's include dirs nor in a toolkit's: system
    /// headers (`cstdio`), which NVRTC does not have.
    pub system_headers: Vec<String>,
}

enum Work {
    Compile {
        source: PathBuf,
        include_dirs: Vec<PathBuf>,
        compiler: Arc<dyn Compiler>,
    },
    Precompiled {
        path: PathBuf,
    },
}

struct Job {
    kernel: usize,
    arch: Arch,
    build: CudaBuild,
    compiler: CompilerRecord,
    key: String,
    work: Work,
}

struct Built {
    cubin: Vec<u8>,
    functions: Vec<Function>,
    compiled: bool,
    remote: bool,
}

/// Scans a kernel's include graph and assembles its target-independent key inputs.
pub fn plan_kernel(
    manifest: &Manifest,
    name: &str,
    spec: &KernelSpec,
    external_dirs: &[PathBuf],
) -> Result<PlannedKernel, Error> {
    let include_dirs = manifest.include_dirs_of(spec);
    let mut inputs = KernelInputs {
        entries: spec.entries.clone(),
        files: BTreeMap::new(),
        defines: manifest.defines_of(spec),
        flags: manifest.flags_of(spec),
        nvcc_flags: manifest.nvcc_flags_of(spec),
        nvrtc_flags: manifest.nvrtc_flags_of(spec),
        cxx_std: manifest.cxx_std_of(spec),
    };
    if !spec.cubins.is_empty() {
        // Precompiled cubins are keyed by their content; compile settings do not apply.
        inputs.defines.clear();
        inputs.flags.clear();
        inputs.nvcc_flags.clear();
        inputs.nvrtc_flags.clear();
        inputs.cxx_std.clear();
        for cubin in &spec.cubins {
            let path = manifest.root.join(&cubin.path);
            let bytes = std::fs::read(&path).map_err(|source| Error::Read { path, source })?;
            inputs.files.insert(cubin.path.clone(), sha256_hex(&bytes));
        }
        return Ok(PlannedKernel {
            name: name.to_owned(),
            graph: None,
            inputs,
            recipe: None,
            system_headers: Vec::new(),
        });
    }
    let source = manifest.root.join(&spec.sources[0]);
    // Toolkit headers, then the host compiler's: followed for library files they reach, but
    // not hashed themselves (the compiler record names the toolkit and the host compiler).
    let roots = ScanRoots {
        root: manifest.root.clone(),
        include_dirs: include_dirs.clone(),
        external_dirs: external_dirs
            .iter()
            .cloned()
            .chain(crate::toolchain::host_include_dirs())
            .collect(),
    };
    let graph =
        scan_includes(std::slice::from_ref(&source), &roots).map_err(|source| Error::Scan {
            kernel: name.to_owned(),
            source,
        })?;
    inputs.files = graph.files().clone();
    let system_headers = graph
        .externals()
        .iter()
        .filter(|name| {
            !include_dirs
                .iter()
                .chain(external_dirs)
                .any(|dir| dir.join(name.as_str()).is_file())
        })
        .cloned()
        .collect();
    let stable_dirs = include_dirs
        .iter()
        .enumerate()
        .map(|(n, dir)| stable_dir(&manifest.root, dir, n))
        .collect();
    Ok(PlannedKernel {
        name: name.to_owned(),
        graph: Some(graph),
        inputs,
        recipe: Some(SourceRecipe {
            source: spec.sources[0].clone(),
            include_dirs: stable_dirs,
        }),
        system_headers,
    })
}

/// The stable name of include dir `n`: relative to the root when under it, else `[n]`
/// (the same rule the scanner uses for file paths).
fn stable_dir(root: &Path, dir: &Path, n: usize) -> String {
    let root = root.canonicalize().unwrap_or_else(|_| root.to_owned());
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_owned());
    match dir.strip_prefix(&root) {
        Ok(relative) if relative.as_os_str().is_empty() => ".".to_owned(),
        Ok(relative) => relative.to_string_lossy().replace('\\', "/"),
        Err(_) => format!("[{n}]"),
    }
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
                        eprintln!("skipping `{}` for {arch} ({build}): {reason}", kernel.name);
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
    for (job, result) in jobs.iter().zip(&results) {
        if let Err(error) = result {
            let name = &kernels[job.kernel].name;
            let reason = describe(error);
            eprintln!(
                "failed: `{name}` for {} ({}), recorded as a skip:\n{reason}",
                job.arch, job.build
            );
            skipped.entry(job.kernel).or_default().push(Skip {
                arch: job.arch,
                cuda: job.build,
                reason: format!("failed: {}", index_reason(&reason)),
            });
            failed.push((name.clone(), job.build, job.arch, reason));
        }
    }

    let mut index = Index {
        format: INDEX_FORMAT,
        store: None,
        package: manifest.library.package.clone(),
        torch: torch.clone(),
        dictionary: None,
        kernels: BTreeMap::new(),
    };
    let mut cubins = BTreeMap::new();
    let mut compiled = Vec::new();
    let mut cached = 0;
    let mut from_remote = 0;
    for (position, kernel) in kernels.iter().enumerate() {
        let spec = &manifest.kernels[&kernel.name];
        let mut variants = Vec::new();
        for (job, built) in jobs
            .iter()
            .zip(&results)
            .filter(|(job, _)| job.kernel == position)
            .filter_map(|(job, result)| Some((job, result.as_ref().ok()?)))
        {
            let digest = sha256_hex(&built.cubin);
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
                    size: built.cubin.len() as u64,
                    path: String::new(),
                    stored_size: 0,
                    dictionary: None,
                },
                functions: built.functions.clone(),
            });
            cubins.insert(digest, built.cubin.clone());
        }
        variants.sort_by_key(|v| (v.cuda, v.arch));
        let mut skips = skipped.remove(&position).unwrap_or_default();
        skips.sort_by_key(|s| (s.cuda, s.arch));
        // A shard may own none of a kernel's jobs; the merged bundle is checked as a whole.
        if variants.is_empty() && shared.shard.is_none() {
            let reasons: Vec<String> = skips
                .iter()
                .map(|skip| format!("{} ({}): {}", skip.arch, skip.cuda, skip.reason))
                .collect();
            return Err(Error::NoTarget {
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
    let remote = cache.remote().map(RemoteCache::stats);
    let (index, written) = match shared.shard {
        Some(shard) => {
            let written = write_shard(&options.out, shard, plan, &index, &cubins, &sources)?;
            (index, written)
        }
        None => write_bundle(&options.out, index, &cubins, &sources, options.jobs)?,
    };
    Ok(BundleSummary {
        out: options.out.clone(),
        index,
        compiled,
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

fn select_kernels<'m>(manifest: &'m Manifest, only: &[String]) -> Result<Vec<&'m String>, Error> {
    if only.is_empty() {
        return Ok(manifest.kernels.keys().collect());
    }
    let mut selected = Vec::new();
    for name in only {
        match manifest.kernels.get_key_value(name) {
            Some((name, _)) => selected.push(name),
            None => {
                return Err(Error::UnknownKernel {
                    name: name.clone(),
                    manifest: manifest.path.clone(),
                    known: manifest.kernels.keys().cloned().collect(),
                })
            }
        }
    }
    selected.sort();
    selected.dedup();
    Ok(selected)
}

/// One cell of the matrix: its job, or why it is skipped.
#[allow(clippy::too_many_arguments)]
fn plan_job(
    manifest: &Manifest,
    spec: &KernelSpec,
    kernel_index: usize,
    kernel: &PlannedKernel,
    build: CudaBuild,
    arch: Arch,
    torch: &str,
    toolchains: &[BuildToolchain],
) -> Result<Job, String> {
    if !manifest.cuda_builds_of(spec).contains(&build) {
        let list: Vec<String> = manifest
            .cuda_builds_of(spec)
            .iter()
            .map(ToString::to_string)
            .collect();
        return Err(format!(
            "declared: the kernel builds only with {}",
            list.join(", ")
        ));
    }
    if let Some(narrowed) = &spec.arch {
        if !narrowed.contains(&arch) {
            let list: Vec<String> = narrowed.iter().map(ToString::to_string).collect();
            return Err(format!(
                "declared: the kernel targets only {}",
                list.join(", ")
            ));
        }
    }
    let (compiler, work) = if spec.cubins.is_empty() {
        let toolchain = toolchains
            .iter()
            .find(|t| t.build == build)
            .ok_or_else(|| format!("no toolchain for {build}"))?;
        let compiler = toolchain.compiler_for_kernel(manifest, spec, kernel);
        if !toolchain.supported_sms.contains(&arch.sm) {
            return Err(format!("{} cannot target {arch}", compiler.id()));
        }
        let recipe = kernel
            .recipe
            .as_ref()
            .expect("source kernels have a recipe");
        (
            compiler.record(),
            Work::Compile {
                source: manifest.root.join(&recipe.source),
                include_dirs: manifest.include_dirs_of(spec),
                compiler: compiler.clone(),
            },
        )
    } else {
        let cubin = spec
            .cubins
            .iter()
            .find(|c| c.arch == arch && c.cuda == build)
            .ok_or_else(|| "no precompiled cubin is listed for this target".to_owned())?;
        (
            CompilerRecord {
                kind: "cubin".into(),
                version: String::new(),
            },
            Work::Precompiled {
                path: manifest.root.join(&cubin.path),
            },
        )
    };
    let key = KernelKey::compute(&KeyInputs {
        kernel: &kernel.name,
        inputs: &kernel.inputs,
        arch,
        cuda: build,
        torch,
        compiler: &compiler,
    });
    Ok(Job {
        kernel: kernel_index,
        arch,
        build,
        compiler,
        key: key.0,
        work,
    })
}

/// Runs every job. A job whose compile or validation fails gives its error in place of a
/// result (with `require`, the first such error ends the run); any other error (the cache
/// cannot be read or written) ends the run.
fn run_jobs(
    jobs: &[Job],
    kernels: &[PlannedKernel],
    cache: &BuildCache,
    options: &BundleOptions,
) -> Result<Vec<Result<Built, Error>>, Error> {
    let bar = progress_bar(jobs.len(), options.progress);
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let results: Mutex<Vec<Option<Result<Built, Error>>>> =
        Mutex::new((0..jobs.len()).map(|_| None).collect());
    let threads = options.jobs.max(1).min(jobs.len().max(1));
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let n = next.fetch_add(1, Ordering::Relaxed);
                let Some(job) = jobs.get(n) else { break };
                let kernel = &kernels[job.kernel];
                bar.set_message(format!("{} {} {}", kernel.name, job.build, job.arch));
                let result = run_job(job, kernel, cache);
                if let Err(error) = &result {
                    if options.require || !is_target_failure(error) {
                        stop.store(true, Ordering::Relaxed);
                    }
                }
                results
                    .lock()
                    .expect("no job panics while holding the lock")[n] = Some(result);
                bar.inc(1);
            });
        }
    });
    bar.finish_and_clear();
    let results = results.into_inner().expect("threads have finished");
    let stopped = results.iter().flatten().find_map(|result| match result {
        Err(error) if options.require || !is_target_failure(error) => Some(()),
        _ => None,
    });
    if stopped.is_some() {
        let error = results
            .into_iter()
            .flatten()
            .find_map(|result| {
                result
                    .err()
                    .filter(|e| options.require || !is_target_failure(e))
            })
            .expect("found above");
        return Err(error);
    }
    Ok(results
        .into_iter()
        .map(|result| result.expect("every job ran"))
        .collect())
}

/// Whether `error` is about one target (a compile or its cubin), so the build records it as a
/// skip and goes on, rather than about the machine (a cache it cannot write).
fn is_target_failure(error: &Error) -> bool {
    matches!(
        error,
        Error::Compile(_) | Error::InvalidCubin { .. } | Error::MissingEntry { .. }
    )
}

/// An error and its causes, one per line, as a skip's reason and the failure report.
fn describe(error: &Error) -> String {
    prebuilt::error_chain(error)
}

/// A failure's reason as the index keeps it: the whole message when short, else its first line
/// and the last lines of the log (the full log is printed by the build).
fn index_reason(reason: &str) -> String {
    const LIMIT: usize = 2000;
    if reason.len() <= LIMIT {
        return reason.to_owned();
    }
    let first = reason.lines().next().unwrap_or_default();
    let mut start = reason.len() - (LIMIT - first.len()).min(reason.len());
    while !reason.is_char_boundary(start) {
        start += 1;
    }
    format!("{first}\n[…]\n{}", &reason[start..])
}

fn progress_bar(len: usize, enabled: bool) -> indicatif::ProgressBar {
    if !enabled {
        return indicatif::ProgressBar::hidden();
    }
    // indicatif draws nothing when stderr is not a terminal.
    let bar = indicatif::ProgressBar::new(len as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} [{elapsed}] {wide_msg}")
            .expect("valid template"),
    );
    bar
}

fn run_job(job: &Job, kernel: &PlannedKernel, cache: &BuildCache) -> Result<Built, Error> {
    let symbols_key = symbols_key(&job.key);
    let symbols_path = cache.entry_path(&job.key).with_extension("entries.json");
    if let Some(cubin) = cache.get(&job.key)? {
        let symbols = std::fs::read(&symbols_path)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default();
        match check_cubin(&cubin, job, kernel, &symbols) {
            Ok(functions) => {
                return Ok(Built {
                    cubin,
                    functions,
                    compiled: false,
                    remote: false,
                })
            }
            // A damaged entry (or one whose entry symbols were lost) is rebuilt, not bundled.
            Err(_) => cache.remove(&job.key)?,
        }
    }
    let what = format!("`{}` for {} ({})", kernel.name, job.arch, job.build);
    let output = format!("{}/{}/{}.cubin", kernel.name, job.build, job.arch);
    let compiles = matches!(job.work, Work::Compile { .. });
    if compiles {
        if let Some(cubin) = cache.get_remote(&job.key, &what) {
            let symbols = cache
                .get_remote(&symbols_key, &what)
                .and_then(|bytes| serde_json::from_slice(&bytes).ok())
                .unwrap_or_default();
            match check_cubin(&cubin, job, kernel, &symbols) {
                Ok(functions) => {
                    cache.put(&job.key, &cubin)?;
                    put_symbols(cache, &symbols_path, &symbols, None)?;
                    return Ok(Built {
                        cubin,
                        functions,
                        compiled: false,
                        remote: true,
                    });
                }
                Err(error) => eprintln!(
                    "warning: the remote cache's cubin of {what} is not valid ({}); compiling it \
                     here",
                    prebuilt::error_chain(&error)
                ),
            }
        }
    }
    let (cubin, symbols) = match &job.work {
        Work::Precompiled { path } => {
            let cubin = std::fs::read(path).map_err(|source| Error::Read {
                path: path.clone(),
                source,
            })?;
            (cubin, BTreeMap::new())
        }
        Work::Compile {
            source,
            include_dirs,
            compiler,
        } => {
            let name_expressions: Vec<String> = kernel
                .inputs
                .entries
                .iter()
                .filter(|entry| prebuilt::compile::is_name_expression(entry))
                .cloned()
                .collect();
            let flags = kernel.inputs.flags_for(&job.compiler.kind);
            let request = CompileRequest {
                kernel: &kernel.name,
                source,
                include_dirs,
                defines: &kernel.inputs.defines,
                flags: &flags,
                cxx_std: &kernel.inputs.cxx_std,
                arch: job.arch,
                name_expressions: &name_expressions,
            };
            let output = compiler.compile(&request).map_err(Box::new)?;
            (output.cubin, output.lowered_names)
        }
    };
    let functions = check_cubin(&cubin, job, kernel, &symbols)?;
    cache.put(&job.key, &cubin)?;
    put_symbols(cache, &symbols_path, &symbols, None)?;
    if compiles {
        cache.put_remote(&job.key, &cubin, &output, &what);
        let remote = (symbols_key.as_str(), output.as_str(), what.as_str());
        put_symbols(cache, &symbols_path, &symbols, Some(remote))?;
    }
    Ok(Built {
        cubin,
        functions,
        compiled: true,
        remote: false,
    })
}

/// The remote cache's key for the symbols the compiler gave a variant's name expressions
/// (locally they sit beside the cubin, `<key>.entries.json`): derived from the variant's key.
fn symbols_key(key: &str) -> String {
    sha256_hex(format!("entry symbols of {key}").as_bytes())
}

/// Keeps `symbols` beside the cached cubin at `path`, or with `remote` = (key, output, what)
/// in the remote cache.
fn put_symbols(
    cache: &BuildCache,
    path: &Path,
    symbols: &BTreeMap<String, String>,
    remote: Option<(&str, &str, &str)>,
) -> Result<(), Error> {
    if symbols.is_empty() {
        return Ok(());
    }
    let bytes = serde_json::to_vec(symbols).expect("a map of strings serializes");
    match remote {
        None => crate::cache::write_atomically(path, &bytes),
        Some((key, output, what)) => {
            cache.put_remote(key, &bytes, &format!("{output}.entries.json"), what);
            Ok(())
        }
    }
}

/// Validates a cubin for its job and maps each declared entry to its symbol and parameters:
/// the symbol the compiler gave a name expression (`symbols`), else the entry itself or the
/// mangled symbol that demangles to it.
fn check_cubin(
    cubin: &[u8],
    job: &Job,
    kernel: &PlannedKernel,
    symbols: &BTreeMap<String, String>,
) -> Result<Vec<Function>, Error> {
    resolve_entries(cubin, job.arch, &kernel.inputs.entries, symbols).map_err(|error| match error {
        EntryError::Invalid(source) => Error::InvalidCubin {
            kernel: kernel.name.clone(),
            arch: job.arch,
            build: job.build,
            source,
        },
        EntryError::Missing { entry, found } => Error::MissingEntry {
            kernel: kernel.name.clone(),
            arch: job.arch,
            build: job.build,
            entry,
            found,
        },
    })
}
