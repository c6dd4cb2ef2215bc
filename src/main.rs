//! The `kwheel` command line: argument parsing and one library call per command.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};

/// Ship prebuilt CUDA kernels in Python wheels.
#[derive(Parser)]
#[command(name = "kwheel", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Kernel-library development: bundling, key inspection.
    #[command(subcommand)]
    Dev(DevCommand),
    /// Inspect a built bundle.
    #[command(subcommand)]
    Bundle(BundleCommand),
    /// Inspect a built wheel.
    #[command(subcommand)]
    Wheel(WheelCommand),
    /// Release gates.
    #[command(subcommand)]
    Release(ReleaseCommand),
    /// List the CUDA toolchains found for the manifest's CUDA builds.
    Toolchains(ManifestArg),
    /// Download, verify and cache what a given device would load, for machines that go offline.
    Fetch(FetchArgs),
}

#[derive(Subcommand)]
enum DevCommand {
    /// Compile every kernel × arch × CUDA build that the cache lacks and write the bundle.
    BundleKernels(BundleKernelsArgs),
    /// Print a kernel's include tree and every input of its key.
    Explain(ExplainArgs),
    /// Show, per kernel, which variant of a bundle would load on a given device, and why.
    Coverage(CoverageArgs),
    /// Write the kernel library's manylinux wheel with its bundle (bundling first if needed).
    BuildWheel(BuildWheelArgs),
    /// Write the kernel library's source distribution (PEP 625), which pip builds with kwheel's
    /// build backend (`kwheel.build`) into a wheel that JIT-compiles on first load.
    BuildSdist(BuildSdistArgs),
    /// Assemble shard directories into one bundle, identical to a single-machine build.
    MergeBundles(MergeArgs),
}

#[derive(Subcommand)]
enum ReleaseCommand {
    /// Run every release gate and print the checklist; fails if any gate fails.
    Check(CheckArgs),
    /// Upload wheels and bundle artifacts to a content-addressed HTTP store, skipping what is
    /// there, then verify by download.
    Publish(PublishArgs),
    /// Build kwheel's own wheels (the `kwheel` command, the runtime module and the build
    /// backend) for manylinux_2_28 from this source tree, with cargo zigbuild.
    BuildKwheel(BuildKwheelArgs),
}

#[derive(Args)]
struct BuildKwheelArgs {
    /// Where the wheels go.
    #[arg(long, default_value = "target/kwheel/wheels")]
    out: PathBuf,
    /// The architectures, comma-separated [default: this machine's].
    #[arg(long, value_delimiter = ',')]
    arch: Vec<release::RuntimeArch>,
    /// The kwheel source tree [default: the one this binary was built from].
    #[arg(long)]
    workspace: Option<PathBuf>,
    /// Cargo's target directory for the cross builds [default: <workspace>/target/kwheel/runtime].
    #[arg(long)]
    target_dir: Option<PathBuf>,
    /// Pack this already built Python module instead of building it (one architecture only).
    #[arg(long)]
    module: Option<PathBuf>,
    /// Pack this already built `kwheel` executable instead of building it (one architecture
    /// only).
    #[arg(long)]
    command: Option<PathBuf>,
    /// No cargo output.
    #[arg(long)]
    quiet: bool,
}

#[derive(Args)]
struct BuildSdistArgs {
    #[command(flatten)]
    manifest: ManifestArg,
    /// Where the sdist goes.
    #[arg(long, default_value = "target/kwheel/sdist")]
    out: PathBuf,
}

#[derive(Args)]
struct CheckArgs {
    #[command(flatten)]
    manifest: ManifestArg,
    /// The bundle to check (built first when missing, unless --no-rebuild).
    #[arg(long, default_value = "target/kwheel/_prebuilt")]
    bundle: PathBuf,
    /// The directory of the wheels to check.
    #[arg(long, default_value = "target/kwheel/wheels")]
    wheels: PathBuf,
    /// Override the manifest's torch pin.
    #[arg(long)]
    torch: Option<String>,
    /// Fail instead of building a missing bundle or wheel.
    #[arg(long)]
    no_rebuild: bool,
    /// The largest acceptable wheel, in bytes.
    #[arg(long, default_value_t = release::check::DEFAULT_SIZE_BUDGET)]
    size_budget: u64,
    /// Release tags are this prefix and the version.
    #[arg(long, default_value = "v")]
    tag_prefix: String,
    /// The build cache directory [default: ${XDG_CACHE_HOME:-~/.cache}/kwheel/build].
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// Also publish the bundle's artifacts and the wheels to this store and verify them (a
    /// bearer token is read from $KWHEEL_STORE_TOKEN).
    #[arg(long)]
    publish: Option<String>,
    /// Print the checklist as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum WheelCommand {
    /// Re-check a wheel: RECORD, tags, zip hygiene, bundle digests, manylinux audit; or an
    /// sdist (`.tar.gz`): name, layout, PKG-INFO, pyproject.toml, and every kernel's sources.
    Verify {
        /// The wheel or sdist file.
        wheel: PathBuf,
    },
}

#[derive(Subcommand)]
enum BundleCommand {
    /// Print one row per variant and per skip.
    List {
        /// The bundle directory.
        bundle: PathBuf,
    },
    /// Write the cubins as plain files: DIR/<kernel>/<build>/<arch>.cubin.
    Extract {
        /// The bundle directory.
        bundle: PathBuf,
        /// Where to write.
        #[arg(long)]
        out: PathBuf,
    },
}

#[derive(Args)]
struct ManifestArg {
    /// The kernel manifest [default: the embedded library, kernels/kernels.toml].
    #[arg(long)]
    manifest: Option<PathBuf>,
}

#[derive(Args)]
struct BundleKernelsArgs {
    #[command(flatten)]
    manifest: ManifestArg,
    /// The bundle directory to write.
    #[arg(long, default_value = "target/kwheel/_prebuilt")]
    out: PathBuf,
    /// Parallel compile jobs [default: the number of cores].
    #[arg(long)]
    jobs: Option<usize>,
    /// Build only these kernels (comma-separated) [default: $KWHEEL_KERNELS, else all].
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Make every skipped or failed target an error (also `KWHEEL_REQUIRE=1`).
    #[arg(long)]
    require: bool,
    /// Override the manifest's torch pin (for example `2.11.*`).
    #[arg(long)]
    torch: Option<String>,
    /// The build cache directory [default: ${XDG_CACHE_HOME:-~/.cache}/kwheel/build].
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    /// Build only shard I of N of the compile jobs (`2/4`), into a shard directory for
    /// `dev merge-bundles`.
    #[arg(long)]
    shard: Option<String>,
    /// A shared build cache speaking the bazel-remote HTTP protocol [default:
    /// $KWHEEL_REMOTE_CACHE, then ~/.config/kwheel/config.toml].
    #[arg(long)]
    remote_cache: Option<String>,
    /// Read the remote cache but never upload to it.
    #[arg(long)]
    remote_cache_read_only: bool,
}

#[derive(Args)]
struct MergeArgs {
    /// The shard directories written by `bundle-kernels --shard`.
    #[arg(required = true)]
    shards: Vec<PathBuf>,
    /// The bundle directory to write.
    #[arg(long)]
    out: PathBuf,
    /// Parallel compression jobs [default: the number of cores].
    #[arg(long)]
    jobs: Option<usize>,
}

#[derive(Args)]
struct PublishArgs {
    /// The store's base URL; artifacts go to `<url>/cas/<sha256>`. A bearer token is read
    /// from $KWHEEL_STORE_TOKEN.
    #[arg(long)]
    to: String,
    /// Bundles whose artifacts to publish.
    #[arg(long)]
    bundle: Vec<PathBuf>,
    /// Wheels to publish.
    wheels: Vec<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct FetchArgs {
    /// An installed package (`af3_kernels`) or a bundle directory.
    package: String,
    /// The device: `sm_100`, or a compute capability such as `10.0`.
    #[arg(long)]
    device: String,
    /// The runtime's CUDA build: `13.0` or `cu130`.
    #[arg(long)]
    cuda: String,
    /// The runtime's torch version (not checked when absent).
    #[arg(long)]
    torch: Option<String>,
    /// The driver: the CUDA version it supports (`13.0`) or its release (`580.65`).
    #[arg(long)]
    driver: Option<String>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct ExplainArgs {
    /// The kernel.
    kernel: String,
    #[command(flatten)]
    manifest: ManifestArg,
    /// Compare with this index (a bundle directory or its index.json).
    #[arg(long)]
    against: Option<PathBuf>,
    /// Override the manifest's torch pin.
    #[arg(long)]
    torch: Option<String>,
}

#[derive(Args)]
struct BuildWheelArgs {
    #[command(flatten)]
    manifest: ManifestArg,
    /// The bundle to ship (built first when missing).
    #[arg(long, default_value = "target/kwheel/_prebuilt")]
    bundle: PathBuf,
    /// Where the wheel goes.
    #[arg(long, default_value = "target/kwheel/wheels")]
    out: PathBuf,
    /// Override the manifest's torch pin (for example `2.11.*`).
    #[arg(long)]
    torch: Option<String>,
    /// Leave the kernel sources out (no JIT fallback from this wheel).
    #[arg(long)]
    no_sources: bool,
    /// Ship no cubins: the sources and an index of recipes only, so every kernel JIT-compiles
    /// on first load (what the build backend does for an sdist or git install). Needs no
    /// CUDA toolchain.
    #[arg(long, conflicts_with_all = ["no_sources", "ship"])]
    recipes_only: bool,
    /// Accepted for older scripts: `dev build-wheel` builds only the library's wheel (kwheel's
    /// own wheels come from `kwheel release build-kwheel`).
    #[arg(long, hide = true)]
    no_runtime: bool,
    /// Ship only these variants in the wheel (`sm_90a`, `cu130:sm_100a`, comma-separated);
    /// the index lists the rest with the store they are fetched from.
    #[arg(long)]
    ship: Option<String>,
    /// The store that holds the variants left out [default: the manifest's `store`].
    #[arg(long)]
    store: Option<String>,
    /// Parallel compile jobs when bundling [default: the number of cores].
    #[arg(long)]
    jobs: Option<usize>,
    /// The build cache directory [default: ${XDG_CACHE_HOME:-~/.cache}/kwheel/build].
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// No progress output.
    #[arg(long)]
    quiet: bool,
}

#[derive(Args)]
#[command(group(clap::ArgGroup::new("devices").required(true).args(["device", "fleet"])))]
struct CoverageArgs {
    /// The bundle directory.
    bundle: PathBuf,
    /// The device: `sm_90`, `sm_100`, or a compute capability such as `9.0`.
    #[arg(long)]
    device: Option<String>,
    /// Several devices at once, comma-separated, printed as one table: known GPUs (`H100`,
    /// `B200`, `B300`, `Thor`, `RTX-PRO-6000`, `GB10`, ...), `NAME=10.3`, or capabilities.
    #[arg(long, value_delimiter = ',', conflicts_with = "device")]
    fleet: Vec<String>,
    /// Refuse PTX variants, as `<PACKAGE>_PTX_JIT=0` does at run time.
    #[arg(long)]
    no_ptx_jit: bool,
    /// The runtime's CUDA build: `12.9` or `cu129`.
    #[arg(long)]
    cuda: String,
    /// The runtime's torch version (not checked when absent).
    #[arg(long)]
    torch: Option<String>,
    /// The driver: the CUDA version it supports (`13.0`) or its release (`580.65`)
    /// [default: the minimum driver of the CUDA build].
    #[arg(long)]
    driver: Option<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

impl ManifestArg {
    /// The manifest given, else `kernels/kernels.toml` under the current directory, else the
    /// embedded library of this checkout.
    fn resolve(&self) -> PathBuf {
        if let Some(path) = &self.manifest {
            return path.clone();
        }
        let local = Path::new("kernels/kernels.toml");
        if local.is_file() {
            return local.to_owned();
        }
        // An installed `kwheel` (pip, cargo install) has no checkout to fall back to: then the
        // error names the file looked for here.
        let embedded = Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels/kernels.toml");
        if embedded.is_file() {
            embedded
        } else {
            local.to_owned()
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Dev(DevCommand::BundleKernels(args)) => bundle_kernels(args),
        Command::Dev(DevCommand::Explain(args)) => {
            let explanation = bundler::explain::explain(
                &args.manifest.resolve(),
                &args.kernel,
                args.torch.as_deref(),
                args.against.as_deref(),
            )?;
            print!("{explanation}");
            Ok(())
        }
        Command::Dev(DevCommand::Coverage(args)) => coverage(args),
        Command::Dev(DevCommand::BuildWheel(args)) => build_wheel(args),
        Command::Dev(DevCommand::BuildSdist(args)) => {
            let manifest = args.manifest.resolve();
            let sdist = release::build_sdist(&release::SdistOptions {
                manifest: manifest.clone(),
                out: args.out,
            })
            .with_context(|| format!("build-sdist for `{}` failed", manifest.display()))?;
            println!(
                "{} ({} files, {} bytes), verified",
                sdist.path.display(),
                sdist.files.len(),
                sdist.size
            );
            Ok(())
        }
        Command::Release(ReleaseCommand::BuildKwheel(args)) => build_kwheel(args),
        Command::Dev(DevCommand::MergeBundles(args)) => {
            let summary = bundler::merge_shards(&args.shards, &args.out, default_jobs(args.jobs))?;
            println!(
                "merged {} shards: {} kernels; bundle {} {}",
                summary.shards,
                summary.index.kernels.len(),
                summary.out.display(),
                written(summary.written)
            );
            Ok(())
        }
        Command::Release(ReleaseCommand::Publish(args)) => {
            let report = release::publish(&release::PublishOptions {
                bundles: args.bundle,
                wheels: args.wheels,
                ..release::PublishOptions::new(args.to)
            })?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{report}");
            }
            Ok(())
        }
        Command::Fetch(args) => fetch(args),
        Command::Release(ReleaseCommand::Check(args)) => release_check(args),
        Command::Wheel(WheelCommand::Verify { wheel })
            if wheel.to_string_lossy().ends_with(".tar.gz") =>
        {
            let sdist = release::verify_sdist(&wheel)?;
            print!("{sdist}");
            sdist.into_result()?;
            Ok(())
        }
        Command::Wheel(WheelCommand::Verify { wheel }) => {
            let report = release::verify_wheel(&wheel)?;
            print!("{report}");
            report.into_result()?;
            Ok(())
        }
        Command::Bundle(BundleCommand::List { bundle }) => {
            let bundle = open_bundle(&bundle)?;
            print!("{}", prebuilt::bundle::list_bundle(bundle.index()));
            Ok(())
        }
        Command::Bundle(BundleCommand::Extract { bundle, out }) => {
            let bundle = open_bundle(&bundle)?;
            let written = bundler::writer::extract_bundle(&bundle, &out)?;
            println!("wrote {} cubins under {}", written.len(), out.display());
            Ok(())
        }
        Command::Toolchains(args) => toolchains(&args.resolve()),
    }
}

fn default_jobs(jobs: Option<usize>) -> usize {
    jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

fn release_check(args: CheckArgs) -> Result<()> {
    let options = release::CheckOptions {
        bundle: args.bundle,
        wheels: args.wheels,
        torch: args.torch,
        no_rebuild: args.no_rebuild,
        size_budget: args.size_budget,
        tag_prefix: args.tag_prefix,
        publish: args.publish,
        cache_dir: args
            .cache_dir
            .unwrap_or_else(bundler::cache::default_cache_dir),
        ..release::CheckOptions::new(args.manifest.resolve())
    };
    let checklist = release::release_check(&options);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&checklist)?);
    } else {
        print!("{checklist}");
    }
    if !checklist.passed() {
        anyhow::bail!("release check failed");
    }
    Ok(())
}

fn build_wheel(args: BuildWheelArgs) -> Result<()> {
    let options = release::LibraryWheelOptions {
        bundle: args.bundle,
        out: args.out,
        torch: args.torch,
        ship_sources: !args.no_sources,
        cache_dir: args
            .cache_dir
            .unwrap_or_else(bundler::cache::default_cache_dir),
        jobs: default_jobs(args.jobs),
        progress: !args.quiet,
        ship: args
            .ship
            .as_deref()
            .map(str::parse::<release::ShipFilter>)
            .transpose()?,
        store: args.store,
        recipes_only: args.recipes_only,
        ..release::LibraryWheelOptions::new(args.manifest.resolve())
    };
    if args.no_runtime {
        eprintln!(
            "note: --no-runtime is no longer needed: `dev build-wheel` builds only the library's \
             wheel (`kwheel release build-kwheel` builds kwheel's own)"
        );
    }
    let built = release::build_library_wheel(&options)
        .with_context(|| format!("build-wheel for `{}` failed", options.manifest.display()))?;
    println!(
        "{} ({} files, {} bytes), verified",
        built.path.display(),
        built.files,
        built.size
    );
    Ok(())
}

fn build_kwheel(args: BuildKwheelArgs) -> Result<()> {
    let workspace = match args.workspace {
        Some(workspace) => workspace,
        None => release::runtime::source_workspace().context(
            "no kwheel source tree here: kwheel's own wheels are built from a clone of kwheel \
             (give it with --workspace)",
        )?,
    };
    let archs = if args.arch.is_empty() {
        vec![release::RuntimeArch::host().context(
            "this machine is neither x86_64 nor aarch64: give --arch x86_64 or --arch aarch64",
        )?]
    } else {
        args.arch
    };
    if archs.len() > 1 && (args.module.is_some() || args.command.is_some()) {
        anyhow::bail!("--module and --command are built for one architecture: give one --arch");
    }
    for arch in archs {
        let options = release::RuntimeWheelOptions {
            arch,
            module: match &args.module {
                Some(module) => release::NativeModule::Prebuilt(module.clone()),
                None => release::NativeModule::Build {
                    target_dir: args.target_dir.clone(),
                },
            },
            command: match &args.command {
                Some(command) => release::NativeCommand::Prebuilt(command.clone()),
                None => release::NativeCommand::Build,
            },
            progress: !args.quiet,
            ..release::RuntimeWheelOptions::new(&workspace, &args.out)
        };
        let built = release::build_runtime_wheel(&options)
            .with_context(|| format!("building kwheel's {arch} wheel failed"))?;
        println!(
            "{} ({} files, {} bytes), verified",
            built.path.display(),
            built.files,
            built.size
        );
    }
    Ok(())
}

fn bundle_kernels(args: BundleKernelsArgs) -> Result<()> {
    let jobs = default_jobs(args.jobs);
    let options = bundler::BundleOptions {
        manifest: args.manifest.resolve(),
        out: args.out,
        cache_dir: args
            .cache_dir
            .unwrap_or_else(bundler::cache::default_cache_dir),
        jobs,
        only: if args.only.is_empty() {
            kernels_from_env(std::env::var("KWHEEL_KERNELS").ok().as_deref())
        } else {
            args.only
        },
        require: args.require || std::env::var_os("KWHEEL_REQUIRE").is_some_and(|v| v == "1"),
        torch: args.torch,
        progress: !args.quiet,
        toolchains: None,
    };
    let shared = bundler::SharedBuild {
        shard: args.shard.as_deref().map(str::parse).transpose()?,
        remote_cache: bundler::remote::resolve_remote_cache(args.remote_cache.as_deref(), None)?
            .map(|mut remote| {
                remote.upload = !args.remote_cache_read_only;
                remote
            }),
    };
    let summary = bundler::bundle_kernels_shared(&options, &shared)
        .with_context(|| format!("bundle-kernels for `{}` failed", options.manifest.display()))?;
    if let Some(remote) = &summary.remote {
        println!("remote cache: {remote}");
    }
    let variants: usize = summary
        .index
        .kernels
        .values()
        .map(|k| k.variants.len())
        .sum();
    for (kernel, build, arch, _) in &summary.failed {
        eprintln!("warning: `{kernel}` failed for {arch} ({build}); recorded as unavailable");
    }
    println!(
        "{} kernels, {variants} variants: {} built, {} from cache, {} skipped, {} failed; bundle {} {} in {:.2}s",
        summary.index.kernels.len(),
        summary.compiled.len(),
        summary.cached,
        summary.skipped,
        summary.failed.len(),
        summary.out.display(),
        written(summary.written),
        summary.elapsed.as_secs_f64(),
    );
    Ok(())
}

/// `KWHEEL_KERNELS=a,b` as `--only a,b`.
fn kernels_from_env(value: Option<&str>) -> Vec<String> {
    value
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
        .collect()
}

fn device_query(
    device: &str,
    cuda: &str,
    driver: Option<&str>,
    torch: Option<String>,
) -> Result<prebuilt::device::DeviceQuery> {
    use prebuilt::device::{parse_cuda_build, DeviceQuery, DriverVersion};
    let driver = driver.map(DriverVersion::parse).transpose()?;
    Ok(DeviceQuery::simulated(
        DeviceQuery::parse_device(device)?,
        parse_cuda_build(cuda)?,
        driver,
        torch,
    ))
}

fn coverage(args: CoverageArgs) -> Result<()> {
    use prebuilt::coverage::{fleet_coverage, FleetDevice};
    use prebuilt::env::ptx_jit_variable;
    let bundle = open_bundle(&args.bundle)?;
    let ptx_forbidden_by = args.no_ptx_jit.then(|| {
        let variable = ptx_jit_variable(&bundle.index().package);
        format!("--no-ptx-jit (as {variable}=0)")
    });
    if !args.fleet.is_empty() {
        let fleet = args
            .fleet
            .iter()
            .map(|text| FleetDevice::parse(text))
            .collect::<Result<Vec<_>, _>>()?;
        // Each device's capability replaces this one's.
        let query = device_query("9.0", &args.cuda, args.driver.as_deref(), args.torch)?;
        refuse_unbuilt_cuda(&bundle, &query)?;
        let report = fleet_coverage(bundle.index(), &fleet, &query, ptx_forbidden_by.as_deref());
        if args.json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            print!("{report}");
        }
        return Ok(());
    }
    let device = args.device.as_deref().unwrap_or_default();
    let query = device_query(device, &args.cuda, args.driver.as_deref(), args.torch)?;
    refuse_unbuilt_cuda(&bundle, &query)?;
    let cache = prebuilt::cache::ArtifactCache::default();
    let mut report = prebuilt::coverage::bundle_coverage(&bundle, &query, &cache);
    if let Some(by) = &ptx_forbidden_by {
        let locations = report.kernels.clone();
        report = prebuilt::coverage::coverage_with(bundle.index(), &query, Some(by));
        for (name, kernel) in &mut report.kernels {
            if kernel.loads == locations[name].loads {
                kernel.location = locations[name].location;
            }
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{report}");
    }
    jit_note(&bundle, &report)
}

/// Opens a bundle directory; when it is not one, says where the bundle probably is.
fn open_bundle(path: &Path) -> Result<prebuilt::Bundle> {
    prebuilt::Bundle::open(path).map_err(|error| {
        let nested = path.join("_prebuilt");
        let hint = if nested.join("index.json").is_file() {
            format!(
                "`{}` holds a bundle in `_prebuilt/`: give `{}`",
                path.display(),
                nested.display()
            )
        } else {
            "a bundle is the directory with `index.json` that `kwheel dev bundle-kernels` \
             writes (default `target/kwheel/_prebuilt`), or a wheel's `<package>/_prebuilt`"
                .to_owned()
        };
        anyhow::Error::new(error).context(format!("`{}` is not a bundle; {hint}", path.display()))
    })
}

/// Refuses a runtime CUDA build that no variant or target of the bundle was built for: every
/// kernel would be refused for the same reason, which the table would hide.
fn refuse_unbuilt_cuda(
    bundle: &prebuilt::Bundle,
    query: &prebuilt::device::DeviceQuery,
) -> Result<()> {
    let mut builds: Vec<prebuilt::CudaBuild> = bundle
        .index()
        .kernels
        .values()
        .flat_map(|record| {
            let variants = record.variants.iter().map(|variant| variant.cuda);
            variants.chain(record.skipped.iter().map(|skip| skip.cuda))
        })
        .collect();
    builds.sort();
    builds.dedup();
    if builds.is_empty() || builds.contains(&query.cuda) {
        return Ok(());
    }
    let list: Vec<String> = builds.iter().map(ToString::to_string).collect();
    anyhow::bail!(
        "the bundle was built for CUDA builds {} only; the runtime's CUDA build {} is none of \
         them, so no cubin of it loads there (give --cuda with one of those, or bundle for {} \
         with `cuda-builds` in the manifest)",
        list.join(", "),
        query.cuda,
        query.cuda
    )
}

/// After a coverage table: what happens to kernels that load no prebuilt cubin (the JIT
/// fallback compiles them from the shipped sources, if the bundle has them), and an error
/// when no kernel loads at all.
fn jit_note(bundle: &prebuilt::Bundle, report: &prebuilt::coverage::CoverageReport) -> Result<()> {
    let none: Vec<&String> = report
        .kernels
        .iter()
        .filter(|(_, kernel)| kernel.loads.is_none())
        .map(|(name, _)| name)
        .collect();
    if none.is_empty() {
        return Ok(());
    }
    let sources = bundle.root().join(prebuilt::bundle::SOURCES_DIR).is_dir();
    let variable = prebuilt::env::fallback_variable(&bundle.index().package);
    let fallback = if sources {
        format!(
            "load() would JIT-compile them from the shipped sources on first use (unless \
             {variable}=0)"
        )
    } else {
        "the bundle ships no sources, so they cannot load here".to_owned()
    };
    eprintln!(
        "{} of {} kernels load no prebuilt cubin on this device: {fallback}",
        none.len(),
        report.kernels.len()
    );
    if none.len() == report.kernels.len() {
        anyhow::bail!("no kernel of the bundle has a prebuilt cubin for this device");
    }
    Ok(())
}

fn fetch(args: FetchArgs) -> Result<()> {
    let query = device_query(&args.device, &args.cuda, args.driver.as_deref(), args.torch)?;
    let bundle = prebuilt::Bundle::open(prebuilt::bundle::find_bundle(&args.package)?)?;
    let report = prebuilt::fetch::prefetch(
        &bundle,
        &query,
        &prebuilt::cache::ArtifactCache::default(),
        &prebuilt::fetch::StoreOptions::default(),
    )?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{report}");
    }
    if !report.complete() {
        anyhow::bail!("not everything this device would load could be fetched");
    }
    Ok(())
}

fn written(outcome: bundler::writer::WriteOutcome) -> &'static str {
    match outcome {
        bundler::writer::WriteOutcome::Written => "written",
        bundler::writer::WriteOutcome::Unchanged => "unchanged",
    }
}

fn toolchains(manifest: &Path) -> Result<()> {
    let manifest = bundler::Manifest::load(manifest)?;
    let mut missing = 0;
    for &build in &manifest.library.cuda_builds {
        match bundler::toolchain::discover(build) {
            Ok(toolchain) => {
                let sms: Vec<String> = toolchain
                    .supported_archs
                    .iter()
                    .map(|sm| format!("sm_{sm}"))
                    .collect();
                println!(
                    "{build}  {}  {}  (targets {})",
                    toolchain.compiler,
                    toolchain.root.display(),
                    sms.join(" ")
                );
            }
            Err(error) => {
                missing += 1;
                println!("{build}  missing: {error}");
            }
        }
    }
    if missing > 0 {
        anyhow::bail!("{missing} CUDA build(s) have no toolchain");
    }
    Ok(())
}
