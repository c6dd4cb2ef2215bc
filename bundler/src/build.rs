//! `bundle-kernels`: plan the (kernel × CUDA build × arch) matrix, compile what the cache
//! lacks, validate every cubin, and write the bundle.
//!
//! ```text
//! manifest ─► scan include graphs ─► keys ─► cache hit? ──yes──► validate ─┐
//!                                             │                           ├─► write bundle
//!                                             └─no─► compile ─► validate ─┘   (atomic swap)
//! ```
//!
//! Compile jobs run on `jobs` threads. A target a toolchain cannot build, or that a kernel
//! narrows away with `arch = [...]`, is a skip recorded in the index; `require` turns every
//! skip into an error.
//!
//! [`bundle_kernels_shared`] also takes a [`SharedBuild`]: a remote cache asked after the
//! local one and told about every compile ([`crate::remote`]), and a shard, which builds one
//! deterministic share of the jobs into a shard directory for [`crate::shard::merge_shards`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prebuilt::cubin::{inspect_cubin, validate_cubin};
use prebuilt::index::{
    CompilerRecord, Function, Index, KernelInputs, KernelRecord, Skip, SourceRecipe, StoredFile,
    Variant, INDEX_FORMAT,
};
use prebuilt::key::{sha256_hex, KeyInputs};
use prebuilt::{Arch, CudaBuild, KernelKey};

use crate::cache::BuildCache;
use crate::compiler::{compiler_for, CompileRequest, Compiler};
use crate::include::{scan_includes, IncludeGraph, ScanRoots};
use crate::manifest::{KernelSpec, Manifest};
use crate::remote::{RemoteCache, RemoteStats};
use crate::shard::{write_shard, PlannedJob, Shard, SharedBuild};
use crate::toolchain::{discover, CompilerId};
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
}

impl BuildToolchain {
    /// Discovers the installed toolchain of `build` (see [`crate::toolchain`]).
    pub fn discover(build: CudaBuild) -> Result<BuildToolchain, Error> {
        let toolchain = discover(build)?;
        let compiler = compiler_for(&toolchain).map_err(Box::new)?;
        Ok(BuildToolchain {
            build,
            compiler: Arc::from(compiler),
            supported_sms: toolchain.supported_archs.clone(),
            include_dirs: toolchain.include_dirs.clone(),
        })
    }

    fn record(&self) -> CompilerRecord {
        compiler_record(self.compiler.id())
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
}

enum Work {
    Compile {
        source: PathBuf,
        include_dirs: Vec<PathBuf>,
        toolchain: BuildToolchain,
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
        cxx_std: manifest.cxx_std_of(spec),
    };
    if !spec.cubins.is_empty() {
        // Precompiled cubins are keyed by their content; compile settings do not apply.
        inputs.defines.clear();
        inputs.flags.clear();
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
        });
    }
    let source = manifest.root.join(&spec.sources[0]);
    let roots = ScanRoots {
        root: manifest.root.clone(),
        include_dirs: include_dirs.clone(),
        external_dirs: external_dirs.to_vec(),
    };
    let graph =
        scan_includes(std::slice::from_ref(&source), &roots).map_err(|source| Error::Scan {
            kernel: name.to_owned(),
            source,
        })?;
    inputs.files = graph.files().clone();
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
    let results = run_jobs(&jobs, &kernels, &manifest, &cache, options)?;

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
                },
                functions: built.functions.clone(),
            });
            cubins.insert(digest, built.cubin.clone());
        }
        variants.sort_by_key(|v| (v.cuda, v.arch));
        let mut skips = skipped.remove(&position).unwrap_or_default();
        skips.sort_by_key(|s| (s.cuda, s.arch));
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
        if !toolchain.supported_sms.contains(&arch.sm) {
            return Err(format!("{} cannot target {arch}", toolchain.compiler.id()));
        }
        let recipe = kernel
            .recipe
            .as_ref()
            .expect("source kernels have a recipe");
        (
            toolchain.record(),
            Work::Compile {
                source: manifest.root.join(&recipe.source),
                include_dirs: manifest.include_dirs_of(spec),
                toolchain: toolchain.clone(),
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

fn run_jobs(
    jobs: &[Job],
    kernels: &[PlannedKernel],
    manifest: &Manifest,
    cache: &BuildCache,
    options: &BundleOptions,
) -> Result<Vec<Built>, Error> {
    let bar = progress_bar(jobs.len(), options.progress);
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let results: Mutex<Vec<Option<Result<Built, Error>>>> =
        Mutex::new((0..jobs.len()).map(|_| None).collect());
    let threads = options.jobs.max(1).min(jobs.len().max(1));
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                if failed.load(Ordering::Relaxed) {
                    break;
                }
                let n = next.fetch_add(1, Ordering::Relaxed);
                let Some(job) = jobs.get(n) else { break };
                let kernel = &kernels[job.kernel];
                bar.set_message(format!("{} {} {}", kernel.name, job.build, job.arch));
                let result = run_job(job, kernel, manifest, cache);
                if result.is_err() {
                    failed.store(true, Ordering::Relaxed);
                }
                results
                    .lock()
                    .expect("no job panics while holding the lock")[n] = Some(result);
                bar.inc(1);
            });
        }
    });
    bar.finish_and_clear();
    let mut built = Vec::with_capacity(jobs.len());
    for result in results.into_inner().expect("threads have finished") {
        match result {
            Some(Ok(done)) => built.push(done),
            Some(Err(error)) => return Err(error),
            // Not run because another job failed; that failure is returned above or below.
            None => {}
        }
    }
    Ok(built)
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

fn run_job(
    job: &Job,
    kernel: &PlannedKernel,
    manifest: &Manifest,
    cache: &BuildCache,
) -> Result<Built, Error> {
    if let Some(cubin) = cache.get(&job.key)? {
        match check_cubin(&cubin, job, kernel) {
            Ok(functions) => {
                return Ok(Built {
                    cubin,
                    functions,
                    compiled: false,
                    remote: false,
                })
            }
            // A damaged entry is rebuilt, not bundled.
            Err(_) => cache.remove(&job.key)?,
        }
    }
    let what = format!("`{}` for {} ({})", kernel.name, job.arch, job.build);
    let output = format!("{}/{}/{}.cubin", kernel.name, job.build, job.arch);
    let compiles = matches!(job.work, Work::Compile { .. });
    if compiles {
        if let Some(cubin) = cache.get_remote(&job.key, &what) {
            match check_cubin(&cubin, job, kernel) {
                Ok(functions) => {
                    cache.put(&job.key, &cubin)?;
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
                    prebuilt::fetch::error_chain(&error)
                ),
            }
        }
    }
    let cubin = match &job.work {
        Work::Precompiled { path } => std::fs::read(path).map_err(|source| Error::Read {
            path: path.clone(),
            source,
        })?,
        Work::Compile {
            source,
            include_dirs,
            toolchain,
        } => {
            let name_expressions: Vec<String> = kernel
                .inputs
                .entries
                .iter()
                .filter(|entry| entry.contains('<'))
                .cloned()
                .collect();
            let spec = &manifest.kernels[&kernel.name];
            let request = CompileRequest {
                kernel: &kernel.name,
                source,
                include_dirs,
                defines: &kernel.inputs.defines,
                flags: &kernel.inputs.flags,
                cxx_std: &manifest.cxx_std_of(spec),
                arch: job.arch,
                name_expressions: &name_expressions,
            };
            toolchain
                .compiler
                .compile(&request)
                .map_err(Box::new)?
                .cubin
        }
    };
    let functions = check_cubin(&cubin, job, kernel)?;
    cache.put(&job.key, &cubin)?;
    if compiles {
        cache.put_remote(&job.key, &cubin, &output, &what);
    }
    Ok(Built {
        cubin,
        functions,
        compiled: true,
        remote: false,
    })
}

/// Validates a cubin for its job and maps each declared entry to its symbol and parameters.
fn check_cubin(cubin: &[u8], job: &Job, kernel: &PlannedKernel) -> Result<Vec<Function>, Error> {
    let invalid = |source| Error::InvalidCubin {
        kernel: kernel.name.clone(),
        arch: job.arch,
        build: job.build,
        source,
    };
    let info = inspect_cubin(cubin).map_err(invalid)?;
    let mut symbols = Vec::new();
    for entry in &kernel.inputs.entries {
        let symbol = info
            .resolve_entry(entry)
            .ok_or_else(|| Error::MissingEntry {
                kernel: kernel.name.clone(),
                arch: job.arch,
                build: job.build,
                entry: entry.clone(),
                found: info.functions.iter().map(|f| f.symbol.clone()).collect(),
            })?;
        symbols.push(symbol);
    }
    let symbol_refs: Vec<&str> = symbols.iter().map(String::as_str).collect();
    let info = validate_cubin(cubin, job.arch, &symbol_refs).map_err(invalid)?;
    Ok(kernel
        .inputs
        .entries
        .iter()
        .zip(symbols)
        .map(|(name, symbol)| Function {
            name: name.clone(),
            param_sizes: info
                .function(&symbol)
                .map(|f| f.param_sizes.clone())
                .unwrap_or_default(),
            symbol,
        })
        .collect())
}
