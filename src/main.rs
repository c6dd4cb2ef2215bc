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
    /// Re-check a wheel: RECORD, tags, zip hygiene, bundle digests, manylinux audit.
    Verify {
        /// The wheel file.
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
    /// Build only these kernels (comma-separated).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Make every skipped target an error.
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
    /// Build only the library's wheel, not the kwheel runtime wheel.
    #[arg(long)]
    no_runtime: bool,
    /// Pack this already built Python module into the runtime wheel instead of building it.
    #[arg(long)]
    runtime_module: Option<PathBuf>,
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
struct CoverageArgs {
    /// The bundle directory.
    bundle: PathBuf,
    /// The device: `sm_90`, `sm_100`, or a compute capability such as `9.0`.
    #[arg(long)]
    device: String,
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
        Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels/kernels.toml")
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
        Command::Wheel(WheelCommand::Verify { wheel }) => {
            let report = release::verify_wheel(&wheel)?;
            print!("{report}");
            report.into_result()?;
            Ok(())
        }
        Command::Bundle(BundleCommand::List { bundle }) => {
            let bundle = prebuilt::Bundle::open(&bundle)?;
            print!("{}", bundler::explain::list_bundle(bundle.index()));
            Ok(())
        }
        Command::Bundle(BundleCommand::Extract { bundle, out }) => {
            let bundle = prebuilt::Bundle::open(&bundle)?;
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
        ..release::LibraryWheelOptions::new(args.manifest.resolve())
    };
    let built = release::build_library_wheel(&options)
        .with_context(|| format!("build-wheel for `{}` failed", options.manifest.display()))?;
    println!(
        "{} ({} files, {} bytes), verified",
        built.path.display(),
        built.files,
        built.size
    );
    if args.no_runtime {
        return Ok(());
    }
    // The kwheel runtime the library's wheel requires, built from this checkout's
    // prebuilt/python with cargo zigbuild for glibc 2.28.
    let Some(workspace) = release::runtime::source_workspace() else {
        eprintln!("note: no kwheel sources here; the kwheel runtime wheel was not built");
        return Ok(());
    };
    let mut runtime_options = release::RuntimeWheelOptions {
        progress: !args.quiet,
        ..release::RuntimeWheelOptions::new(workspace, &options.out)
    };
    if let Some(module) = args.runtime_module {
        runtime_options.module = release::runtime::NativeModule::Prebuilt(module);
    }
    let runtime = release::build_runtime_wheel(&runtime_options)
        .context("building the kwheel runtime wheel failed")?;
    println!(
        "{} ({} files, {} bytes), verified",
        runtime.path.display(),
        runtime.files,
        runtime.size
    );
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
        only: args.only,
        require: args.require,
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
    let skipped: usize = summary
        .index
        .kernels
        .values()
        .map(|k| k.skipped.len())
        .sum();
    println!(
        "{} kernels, {variants} variants ({} compiled, {} from cache), {skipped} skipped; bundle {} {} in {:.2}s",
        summary.index.kernels.len(),
        summary.compiled.len(),
        summary.cached,
        summary.out.display(),
        written(summary.written),
        summary.elapsed.as_secs_f64(),
    );
    Ok(())
}

fn device_query(
    device: &str,
    cuda: &str,
    driver: Option<&str>,
    torch: Option<String>,
) -> Result<prebuilt::select::DeviceQuery> {
    use prebuilt::select::{DeviceQuery, DriverVersion};
    let cuda: prebuilt::CudaBuild = if cuda.starts_with("cu") {
        cuda.parse()?
    } else {
        prebuilt::CudaBuild::from_version(cuda)?
    };
    let driver = match driver {
        Some(text) => DriverVersion::parse(text)?,
        None => DriverVersion {
            major: cuda.major,
            minor: cuda.minor,
        },
    };
    Ok(DeviceQuery {
        capability: DeviceQuery::parse_device(device)?,
        driver,
        cuda,
        torch,
    })
}

fn coverage(args: CoverageArgs) -> Result<()> {
    let query = device_query(&args.device, &args.cuda, args.driver.as_deref(), args.torch)?;
    let bundle = prebuilt::Bundle::open(&args.bundle)?;
    let cache = prebuilt::fetch::ArtifactCache::default();
    let report = prebuilt::fetch::coverage(&bundle, &query, &cache);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{report}");
    }
    Ok(())
}

fn fetch(args: FetchArgs) -> Result<()> {
    let query = device_query(&args.device, &args.cuda, args.driver.as_deref(), args.torch)?;
    let bundle = prebuilt::Bundle::open(prebuilt::fetch::find_bundle(&args.package)?)?;
    let report = prebuilt::fetch::prefetch(
        &bundle,
        &query,
        &prebuilt::fetch::ArtifactCache::default(),
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
