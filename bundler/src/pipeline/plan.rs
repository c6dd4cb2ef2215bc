//! Planning a build: the kernels asked for, each one's key inputs and include graph, and one
//! job per target (compile, take from the cache, or skip with the reason).

use super::outcome::Target;
use super::*;
use prebuilt::compile::{precompiled_record, SourceTree};
use prebuilt::untrusted::Unreadable;

/// What a build does, decided before anything compiles: the kernels asked for with their key
/// inputs, one job per target to compile or take from a cache, and the targets skipped with
/// why. A function of the manifest, the options and the toolchains: it reads sources and
/// headers (the include graphs) and runs nothing.
pub struct BuildPlan {
    /// The manifest.
    pub manifest: Manifest,
    /// The torch pin the variants are keyed by.
    pub torch: String,
    /// The kernels asked for, in name order.
    pub kernels: Vec<PlannedKernel>,
    /// The targets to compile or take from a cache, in matrix order.
    pub(super) jobs: Vec<Job>,
    /// The targets skipped before anything runs (declared, or beyond the toolchains), as
    /// (kernel's position in `kernels`, arch, build, why), in matrix order.
    pub skipped: Vec<(usize, Arch, CudaBuild, SkipReason)>,
}

impl BuildPlan {
    /// Plans `options`' build: reads the manifest, discovers the toolchains it needs (unless
    /// `options` gives them), scans each kernel's include graph, and decides every target.
    /// With `require`, the first skipped target is an error.
    pub fn new(options: &BundleOptions) -> Result<BuildPlan, Error> {
        let manifest = Manifest::load(&options.manifest)?;
        let torch = options
            .torch
            .clone()
            .unwrap_or_else(|| manifest.library.torch.clone());
        let pin = prebuilt::select::TorchPin::parse(&torch).map_err(Error::TorchPin)?;
        if let Some(message) = manifest.needs_torch_under(&pin) {
            return Err(Error::ManifestInvalid {
                path: manifest.path.clone(),
                line: 1,
                kernel: None,
                message: format!("with --torch {torch}: {message}"),
            });
        }
        let selected = select_kernels(&manifest, &options.only)?;
        let toolchains = match &options.toolchains {
            Some(toolchains) => toolchains.clone(),
            None => {
                let needs_compiler = selected
                    .iter()
                    .any(|name| manifest.kernels[*name].cubins.is_empty());
                let builds: BTreeSet<CudaBuild> =
                    manifest.library.cuda_builds.iter().copied().collect();
                match needs_compiler {
                    true => builds
                        .into_iter()
                        .map(|build| {
                            let farm = options.farm.clone();
                            let runner = farm.map(|f| f as Arc<dyn prebuilt::compile::ToolRunner>);
                            BuildToolchain::discover_run_by(build, runner)
                        })
                        .collect::<Result<_, _>>()?,
                    false => Vec::new(),
                }
            }
        };
        let external_dirs: Vec<PathBuf> = toolchains
            .iter()
            .flat_map(|t| t.include_dirs.iter().cloned())
            .collect();
        let kernels = selected
            .iter()
            .map(|name| plan_kernel(&manifest, name, &manifest.kernels[*name], &external_dirs))
            .collect::<Result<Vec<_>, _>>()?;
        let mut jobs = Vec::new();
        let mut skipped = Vec::new();
        for (index, kernel) in kernels.iter().enumerate() {
            let spec = &manifest.kernels[&kernel.name];
            for &build in &manifest.library.cuda_builds {
                for &arch in &manifest.library.archs {
                    let planned = plan_job(
                        &manifest,
                        spec,
                        index,
                        kernel,
                        build,
                        arch,
                        &torch,
                        &toolchains,
                    );
                    match planned {
                        Ok(job) => jobs.push(job),
                        Err(why) if options.require => {
                            return Err(Error::Skipped {
                                kernel: kernel.name.clone(),
                                arch,
                                build,
                                reason: why.to_string(),
                            });
                        }
                        Err(why) => skipped.push((index, arch, build, why)),
                    }
                }
            }
        }
        Ok(BuildPlan {
            manifest,
            torch,
            kernels,
            jobs,
            skipped,
        })
    }

    /// Every job of the plan, as a shard directory records it.
    pub(super) fn planned_jobs(&self) -> Vec<PlannedJob> {
        self.jobs
            .iter()
            .map(|job| PlannedJob {
                key: job.key.clone(),
                kernel: self.kernels[job.kernel].name.clone(),
                cuda: job.build,
                arch: job.arch,
            })
            .collect()
    }

    /// Keeps only the jobs `shard` owns.
    pub(super) fn keep_shard(&mut self, shard: Shard) {
        let owned: BTreeSet<String> = shard
            .owned_keys(self.jobs.iter().map(|job| job.key.as_str()))
            .into_iter()
            .map(str::to_owned)
            .collect();
        self.jobs.retain(|job| owned.contains(&job.key));
    }

    /// The target of job `job`.
    pub(super) fn target(&self, job: &Job) -> Target {
        Target {
            kernel: self.kernels[job.kernel].name.clone(),
            cuda: job.build,
            arch: job.arch,
        }
    }
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
    /// Its include dirs (absolute), in `-I` order: the manifest's, then torch's for a torch
    /// extension.
    pub include_dirs: Vec<PathBuf>,
    /// The torch whose headers and defines it compiles with (`torch = true`).
    pub torch: Option<crate::torch::TorchHeaders>,
    /// What its compiles evaluate (`computed`, `structs`), decided once from its inputs.
    pub computed: ComputedPlan,
}

pub(super) enum Work {
    Compile {
        /// The library's files, as a bundle's `sources/` lays them out.
        tree: SourceTree,
        /// The translation unit's stable path.
        source: String,
        /// The include dirs' stable names.
        include_dirs: Vec<String>,
        compiler: Arc<dyn Compiler>,
    },
    Precompiled {
        path: PathBuf,
    },
}

pub(super) struct Job {
    pub(super) kernel: usize,
    pub(super) arch: Arch,
    pub(super) build: CudaBuild,
    pub(super) compiler: CompilerRecord,
    pub(super) key: String,
    pub(super) work: Work,
}

/// Scans a kernel's include graph and assembles its target-independent key inputs.
pub fn plan_kernel(
    manifest: &Manifest,
    name: &str,
    spec: &KernelSpec,
    external_dirs: &[PathBuf],
) -> Result<PlannedKernel, Error> {
    let mut include_dirs = manifest.include_dirs_of(spec);
    if spec.cubins.is_empty() {
        if let Some(dir) = include_dirs.iter().find(|dir| !dir.is_dir()) {
            return Err(Error::MissingIncludeDir {
                kernel: name.to_owned(),
                dir: dir.clone(),
            });
        }
    }
    let mut inputs = KernelInputs {
        entries: spec.entries.clone(),
        files: BTreeMap::new(),
        defines: manifest.defines_of(spec),
        flags: manifest.flags_of(spec),
        nvcc_flags: manifest.nvcc_flags_of(spec),
        nvrtc_flags: manifest.nvrtc_flags_of(spec),
        cxx_std: manifest.cxx_std_of(spec),
        preamble: manifest.preamble_of(spec),
        targets: manifest.targets_of(spec),
        requires: Manifest::requirements_of(spec),
        computed: Manifest::computed_of(spec),
    };
    let torch = if manifest.torch_of(spec) {
        let torch = crate::torch::find_pinned(manifest).map_err(|source| Error::Torch {
            kernel: name.to_owned(),
            source: Box::new(source),
        })?;
        // Under everything the manifest says, as `cpp_extension` puts them before extra flags.
        let mut defines = torch.defines_for(name);
        defines.append(&mut inputs.defines);
        inputs.defines = defines;
        inputs.nvcc_flags = torch
            .nvcc_flags
            .iter()
            .cloned()
            .chain(std::mem::take(&mut inputs.nvcc_flags))
            .collect();
        include_dirs.extend(torch.include_dirs.iter().cloned());
        Some(torch)
    } else {
        None
    };
    if !spec.cubins.is_empty() {
        // Precompiled cubins are keyed by their content; compile settings do not apply.
        inputs.defines.clear();
        inputs.flags.clear();
        inputs.nvcc_flags.clear();
        inputs.nvrtc_flags.clear();
        inputs.cxx_std.clear();
        inputs.preamble.clear();
        inputs.targets.clear();
        for cubin in &spec.cubins {
            let path = manifest.root.join(&cubin.path);
            let bytes =
                std::fs::read(&path).map_err(|source| Error::Read(Unreadable { path, source }))?;
            inputs.files.insert(cubin.path.clone(), sha256_hex(&bytes));
        }
        return Ok(PlannedKernel {
            name: name.to_owned(),
            graph: None,
            inputs,
            recipe: None,
            system_headers: Vec::new(),
            include_dirs: Vec::new(),
            torch: None,
            computed: ComputedPlan::default(),
        });
    }
    let source = manifest.root.join(&spec.sources[0]);
    // Before the scan: `<torch/extension.h>` would fail there on `Python.h`, naming nothing
    // the maintainer can act on.
    let text = std::fs::read_to_string(&source).map_err(|error| {
        Error::Read(Unreadable {
            path: source.clone(),
            source: error,
        })
    })?;
    if let Some(what) = crate::extension::host_code_in(&text) {
        return Err(Error::HostCodeInKernel {
            kernel: name.to_owned(),
            file: PathBuf::from(&spec.sources[0]),
            what: what.to_owned(),
        });
    }
    // Toolkit headers, then the host compiler's own: followed for library files they reach,
    // but not hashed themselves (the compiler record names the toolkit and the host compiler).
    // The host's other search dirs (`/usr/local/include`) hold library files: searched after
    // the manifest's include dirs, and kept as include dirs where the kernel reads from one.
    let host = crate::toolchain::host_include_dirs();
    let mut scan_dirs = include_dirs.clone();
    for dir in host.library_outside(external_dirs) {
        if !scan_dirs.contains(&dir) {
            scan_dirs.push(dir);
        }
    }
    let roots = ScanRoots {
        root: manifest.root.clone(),
        include_dirs: scan_dirs.clone(),
        external_dirs: external_dirs.iter().cloned().chain(host.compiler).collect(),
    };
    let graph =
        scan_includes(std::slice::from_ref(&source), &roots).map_err(|source| Error::Scan {
            kernel: name.to_owned(),
            source,
        })?;
    inputs.files = graph.files().clone();
    let include_dirs = graph.needed_include_dirs(&scan_dirs, include_dirs.len());
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
    let computed = ComputedPlan::new(&inputs.computed, &inputs.entries);
    Ok(PlannedKernel {
        name: name.to_owned(),
        graph: Some(graph),
        inputs,
        recipe: Some(SourceRecipe {
            source: spec.sources[0].clone(),
            include_dirs: stable_dirs,
        }),
        system_headers,
        include_dirs,
        torch,
        computed,
    })
}

/// The library as a compile sees it: the root, with each include dir outside it as `[n]` (the
/// layout of a bundle's `sources/`, so the bundler and the JIT compile the same paths).
pub(super) fn source_tree(root: &Path, include_dirs: &[PathBuf]) -> SourceTree {
    SourceTree {
        root: root.to_path_buf(),
        outside: include_dirs
            .iter()
            .enumerate()
            .filter(|(n, dir)| stable_dir(root, dir, *n).starts_with('['))
            .map(|(n, dir)| (n, dir.clone()))
            .collect(),
    }
}

/// The stable name of include dir `n`: relative to the root when under it, else `[n]`
/// (the same rule the scanner uses for file paths).
pub(super) fn stable_dir(root: &Path, dir: &Path, n: usize) -> String {
    let root = root.canonicalize().unwrap_or_else(|_| root.to_owned());
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_owned());
    match dir.strip_prefix(&root) {
        Ok(relative) if relative.as_os_str().is_empty() => ".".to_owned(),
        Ok(relative) => relative.to_string_lossy().replace('\\', "/"),
        Err(_) => format!("[{n}]"),
    }
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
pub(super) fn plan_job(
    manifest: &Manifest,
    spec: &KernelSpec,
    kernel_index: usize,
    kernel: &PlannedKernel,
    build: CudaBuild,
    arch: Arch,
    torch: &str,
    toolchains: &[BuildToolchain],
) -> Result<Job, SkipReason> {
    if !manifest.cuda_builds_of(spec).contains(&build) {
        let list: Vec<String> = manifest
            .cuda_builds_of(spec)
            .iter()
            .map(ToString::to_string)
            .collect();
        return Err(SkipReason::Declared(format!(
            "the kernel builds only with {}",
            list.join(", ")
        )));
    }
    if let Some(skip) = narrowed_away(spec.arch.as_deref(), arch) {
        return Err(skip);
    }
    let (compiler, work) = if spec.cubins.is_empty() {
        let toolchain = toolchains
            .iter()
            .find(|t| t.build == build)
            .ok_or_else(|| SkipReason::Unsupported(format!("no toolchain for {build}")))?;
        let compiler = toolchain.compiler_for_kernel(manifest, spec, kernel);
        if !toolchain.supported_sms.contains(&arch.sm) {
            return Err(SkipReason::Unsupported(format!(
                "{} cannot target {arch}",
                compiler.id()
            )));
        }
        let recipe = kernel
            .recipe
            .as_ref()
            .expect("source kernels have a recipe");
        (
            compiler.record(),
            Work::Compile {
                tree: source_tree(&manifest.root, &kernel.include_dirs),
                source: recipe.source.clone(),
                include_dirs: recipe.include_dirs.clone(),
                compiler: compiler.clone(),
            },
        )
    } else {
        let cubin = spec
            .cubins
            .iter()
            .find(|c| c.arch == arch && c.cuda == build)
            .ok_or_else(|| {
                SkipReason::Unsupported("no precompiled cubin is listed for this target".into())
            })?;
        (
            precompiled_record(),
            Work::Precompiled {
                path: manifest.root.join(&cubin.path),
            },
        )
    };
    let key = target_key(kernel, build, arch, torch, &compiler);
    Ok(Job {
        kernel: kernel_index,
        arch,
        build,
        compiler,
        key: key.0,
        work,
    })
}

/// One (CUDA build, arch) cell of a kernel: its compiler and key, or why it has none.
#[derive(Debug)]
pub struct TargetKey {
    /// The CUDA build.
    pub build: CudaBuild,
    /// The architecture.
    pub arch: Arch,
    /// The compiler and the key, or why there is none.
    pub key: Result<(CompilerRecord, KernelKey), String>,
}

/// The key of `kernel` for one target compiled by `compiler`: the one definition the build,
/// `dev explain` and the release checks share.
pub fn target_key(
    kernel: &PlannedKernel,
    build: CudaBuild,
    arch: Arch,
    torch: &str,
    compiler: &CompilerRecord,
) -> KernelKey {
    KernelKey::compute(&KeyInputs {
        kernel: &kernel.name,
        inputs: &kernel.inputs,
        arch,
        cuda: build,
        torch,
        compiler,
    })
}

/// Every target of `kernel` (each of `toolchains`' builds × the manifest's archs) with its
/// compiler record and key: a precompiled cubin's record (`cubin`), else the compiler its
/// build's toolchain picks for the kernel, or the reason there is no toolchain.
pub fn target_keys(
    manifest: &Manifest,
    spec: &KernelSpec,
    kernel: &PlannedKernel,
    torch: &str,
    toolchains: &[(CudaBuild, Result<&BuildToolchain, String>)],
) -> Vec<TargetKey> {
    let mut targets = Vec::new();
    for (build, toolchain) in toolchains {
        for &arch in &manifest.library.archs {
            let compiler = if spec.cubins.is_empty() {
                toolchain
                    .as_ref()
                    .map(|toolchain| toolchain.record_for(manifest, spec, kernel))
                    .map_err(Clone::clone)
            } else {
                Ok(precompiled_record())
            };
            let key = compiler.map(|compiler| {
                let key = target_key(kernel, *build, arch, torch, &compiler);
                (compiler, key)
            });
            targets.push(TargetKey {
                build: *build,
                arch,
                key,
            });
        }
    }
    targets
}

/// The declared skip of `arch` for a kernel whose manifest narrows its archs to `narrowed`
/// (`arch = [...]`) without it; `None` where it builds for `arch`. The bundler's plan and the
/// recipes-only index of an sdist's wheel both record it.
pub fn narrowed_away(narrowed: Option<&[Arch]>, arch: Arch) -> Option<SkipReason> {
    let narrowed = narrowed?;
    if narrowed.contains(&arch) {
        return None;
    }
    let list: Vec<String> = narrowed.iter().map(ToString::to_string).collect();
    Some(SkipReason::Declared(format!(
        "the kernel targets only {}",
        list.join(", ")
    )))
}
