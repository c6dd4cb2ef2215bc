//! The command line's shape: every verb, its arguments and their help. Parsing only; what each
//! command does is in `main.rs`.

use std::path::{Path, PathBuf};

use clap::{Args, Parser, Subcommand};

use crate::exit::{CommandFailed, Failure};

/// Ship prebuilt CUDA kernels in Python wheels.
#[derive(Parser)]
#[command(
    name = "kwheel",
    version,
    about,
    propagate_version = true,
    after_help = crate::exit::EXIT_CODES_HELP
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
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
    Toolchains(ToolchainsArgs),
    /// Download, verify and cache what a given device would load, for machines that go offline.
    Fetch(FetchArgs),
    /// Warm packs: carry what the JIT compiled here to machines without a compiler.
    #[command(subcommand)]
    Jit(JitCommand),
    /// The build backend's side of PEP 517 (`kwheel.build` calls it; answers in JSON).
    #[command(subcommand, hide = true)]
    Pep517(Pep517Command),
}

#[derive(Subcommand)]
pub(crate) enum JitCommand {
    /// Write what this machine's JIT cache holds for a package as a warm pack, each entry's
    /// key checked against the package's shipped sources.
    Export(JitExportArgs),
    /// Verify a warm pack against an installed package and install it where its loader looks,
    /// so those kernels load as prebuilt cubins (also with the JIT off and no compiler).
    Import(JitImportArgs),
}

#[derive(Args)]
pub(crate) struct JitExportArgs {
    /// An installed package (`af3_kernels`) or a bundle directory.
    #[arg(long)]
    pub(crate) package: String,
    /// The pack folder to write [default: ./<package>-warm-pack].
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
    /// The JIT cache to read [default: $KWHEEL_JIT_CACHE, else
    /// ${XDG_CACHE_HOME:-~/.cache}/kwheel/jit].
    #[arg(long)]
    pub(crate) jit_cache: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
pub(crate) struct JitImportArgs {
    /// The warm pack folder (`kwheel jit export` wrote it).
    pub(crate) pack: PathBuf,
    /// The installed package (`af3_kernels`) or bundle directory it is for [default: the
    /// package the pack names].
    #[arg(long)]
    pub(crate) package: Option<String>,
    /// The JIT cache it is installed under [default: $KWHEEL_JIT_CACHE, else
    /// ${XDG_CACHE_HOME:-~/.cache}/kwheel/jit].
    #[arg(long)]
    pub(crate) jit_cache: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Subcommand)]
pub(crate) enum DevCommand {
    /// Compile every kernel × arch × CUDA build that the cache lacks and write the bundle.
    BundleKernels(BundleKernelsArgs),
    /// Print a kernel's or an extension module's include tree and every input of its key.
    Explain(ExplainArgs),
    /// Show, per kernel and extension module, which variant of a bundle would load on a given
    /// device, and why.
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
pub(crate) enum ReleaseCommand {
    /// Run every release gate and print the checklist; fails if any gate fails.
    Check(CheckArgs),
    /// Upload wheels and bundle artifacts to a content-addressed HTTP store, skipping what is
    /// there, then verify by download.
    Publish(PublishArgs),
    /// Build kwheel's own wheels (the `kwheel` command, the runtime module and the build
    /// backend) for manylinux_2_28 from this source tree, with cargo zigbuild.
    BuildKwheel(BuildKwheelArgs),
    /// Compare two releases (wheels or bundles) kernel by kernel: targets added, removed or
    /// rebuilt and why, and each entry's registers, stack, shared memory, launch bounds, code
    /// size and parameter layout.
    Diff(DiffArgs),
}

#[derive(Args)]
pub(crate) struct DiffArgs {
    /// The old release: a wheel or a bundle folder.
    pub(crate) old: PathBuf,
    /// The new release: a wheel or a bundle folder.
    pub(crate) new: PathBuf,
    /// Also compare what each device of this fleet loads (comma-separated, as `dev coverage
    /// --fleet` takes them).
    #[arg(long, value_delimiter = ',')]
    pub(crate) fleet: Vec<String>,
    /// The runtime's CUDA build for `--fleet`.
    #[arg(long, value_parser = parse_cuda, default_value = "13.0")]
    pub(crate) cuda: prebuilt::CudaBuild,
    /// Print JSON instead of Markdown.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
pub(crate) struct BuildKwheelArgs {
    /// Where the wheels go.
    #[arg(long, default_value = "target/kwheel/wheels")]
    pub(crate) out: PathBuf,
    /// The architectures, comma-separated [default: this machine's].
    #[arg(long, value_delimiter = ',')]
    pub(crate) arch: Vec<release::RuntimeArch>,
    /// The kwheel source tree [default: the kwheel clone at or above the current directory].
    #[arg(long)]
    pub(crate) workspace: Option<PathBuf>,
    /// Cargo's target directory for the cross builds [default: $KWHEEL_PYTHON_TARGET_DIR,
    /// else ${XDG_CACHE_HOME:-~/.cache}/kwheel/runtime-target, which the tests share].
    #[arg(long)]
    pub(crate) target_dir: Option<PathBuf>,
    /// Pack this already built Python module instead of building it (one architecture only).
    #[arg(long)]
    pub(crate) module: Option<PathBuf>,
    /// Pack this already built `kwheel` executable instead of building it (one architecture
    /// only).
    #[arg(long)]
    pub(crate) command: Option<PathBuf>,
    /// No cargo output.
    #[arg(long)]
    pub(crate) quiet: bool,
}

#[derive(Args)]
pub(crate) struct BuildSdistArgs {
    #[command(flatten)]
    pub(crate) manifest: ManifestArg,
    /// Where the sdist goes (relative to the current directory).
    #[arg(long, default_value = "target/kwheel/sdist")]
    pub(crate) out: PathBuf,
    /// Print what was written as one JSON object (`path`, `files`, `size`).
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
pub(crate) struct CheckArgs {
    #[command(flatten)]
    pub(crate) manifest: ManifestArg,
    /// The bundle to check (built first when missing, unless --no-rebuild).
    #[arg(long, default_value = "target/kwheel/_prebuilt")]
    pub(crate) bundle: PathBuf,
    /// The directory of the wheels to check.
    #[arg(long, default_value = "target/kwheel/wheels")]
    pub(crate) wheels: PathBuf,
    /// Override the manifest's torch pin.
    #[arg(long)]
    pub(crate) torch: Option<String>,
    /// Fail instead of building a missing bundle or wheel.
    #[arg(long)]
    pub(crate) no_rebuild: bool,
    /// The largest acceptable wheel, in bytes.
    #[arg(long, default_value_t = release::check::DEFAULT_SIZE_BUDGET)]
    pub(crate) size_budget: u64,
    /// Release tags are this prefix and the version.
    #[arg(long, default_value = "v")]
    pub(crate) tag_prefix: String,
    #[command(flatten)]
    pub(crate) cache: CacheDirArg,
    /// Also publish the bundle's artifacts and the wheels to this store and verify them (a
    /// bearer token is read from $KWHEEL_STORE_TOKEN).
    #[arg(long)]
    pub(crate) publish: Option<String>,
    /// Compile this many variants (the first by key) again from source with an empty cache
    /// and require the bundle's bytes (0: skip the `rebuild` gate).
    #[arg(long, value_name = "N", default_value_t = release::check::DEFAULT_REBUILD_SAMPLE)]
    pub(crate) rebuild_sample: usize,
    /// Compare with an earlier release (its wheel or bundle folder) and hold the changes to
    /// the manifest's `[release]` policy (the `against` gate).
    #[arg(long, value_name = "OLD")]
    pub(crate) against: Option<PathBuf>,
    /// Turn a gate off by name (repeatable): it is reported as off, neither run nor required.
    /// Without it, a gate that cannot run here (no GPU, no kwheel runtime wheel) makes the
    /// check incomplete (exit code 7).
    #[arg(long, value_name = "GATE", value_parser = clap::builder::PossibleValuesParser::new(release::check::SKIPPABLE))]
    pub(crate) skip: Vec<String>,
    /// Print the checklist as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Subcommand)]
pub(crate) enum WheelCommand {
    /// Re-check a wheel: RECORD, tags, zip hygiene, bundle digests, manylinux audit; or an
    /// sdist (`.tar.gz`): name, layout, PKG-INFO, pyproject.toml, and every kernel's sources.
    Verify {
        /// The wheel or sdist file.
        wheel: PathBuf,
    },
}

#[derive(Subcommand)]
pub(crate) enum BundleCommand {
    /// Print one row per variant and per skip.
    List {
        /// The bundle directory.
        bundle: PathBuf,
        /// Print one JSON object instead: every kernel with its constants, inputs,
        /// requirements, variants and skips.
        #[arg(long)]
        json: bool,
    },
    /// Write the cubins and modules as plain files: DIR/<kernel>/<build>/<arch>.cubin, DIR/modules/<module>/<build>/<cpu>.so.
    Extract {
        /// The bundle directory.
        bundle: PathBuf,
        /// Where to write.
        #[arg(long)]
        out: PathBuf,
    },
}

#[derive(Args)]
pub(crate) struct ToolchainsArgs {
    #[command(flatten)]
    pub(crate) manifest: ManifestArg,
    /// Print one JSON object (every build, found or missing) instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `kwheel pep517 …` (see `pep517.rs`).
#[derive(Subcommand)]
pub(crate) enum Pep517Command {
    /// Build the library's wheel into a folder (PEP 517 `build_wheel`).
    BuildWheel(Pep517BuildWheelArgs),
    /// Write the `.dist-info` the wheel will have into a folder, compiling nothing (PEP 517
    /// `prepare_metadata_for_build_wheel`).
    PrepareMetadata(Pep517PrepareMetadataArgs),
    /// Build the library's sdist into a folder (PEP 517 `build_sdist`).
    BuildSdist(Pep517BuildSdistArgs),
}

#[derive(Args)]
pub(crate) struct Pep517BuildWheelArgs {
    #[command(flatten)]
    pub(crate) manifest: ManifestArg,
    /// The folder the wheel goes into.
    #[arg(long)]
    pub(crate) wheel_directory: PathBuf,
    /// Override the manifest's torch pin.
    #[arg(long)]
    pub(crate) torch: Option<String>,
    /// Bundle prebuilt cubins when the manifest's CUDA toolchains are found (else the wheel
    /// JIT-compiles, and the answer says why).
    #[arg(long)]
    pub(crate) prebuilt: bool,
}

#[derive(Args)]
pub(crate) struct Pep517PrepareMetadataArgs {
    #[command(flatten)]
    pub(crate) manifest: ManifestArg,
    /// The folder the `.dist-info` goes into.
    #[arg(long)]
    pub(crate) metadata_directory: PathBuf,
    /// Override the manifest's torch pin.
    #[arg(long)]
    pub(crate) torch: Option<String>,
}

#[derive(Args)]
pub(crate) struct Pep517BuildSdistArgs {
    #[command(flatten)]
    pub(crate) manifest: ManifestArg,
    /// The folder the sdist goes into.
    #[arg(long)]
    pub(crate) sdist_directory: PathBuf,
}

#[derive(Args)]
pub(crate) struct ManifestArg {
    /// The kernel manifest [default: ./kernels.toml, else ./kernels/kernels.toml, under the
    /// current directory].
    #[arg(long)]
    pub(crate) manifest: Option<PathBuf>,
}

#[derive(Args)]
pub(crate) struct BundleKernelsArgs {
    #[command(flatten)]
    pub(crate) manifest: ManifestArg,
    /// The bundle directory to write (relative to the current directory).
    #[arg(long, default_value = "target/kwheel/_prebuilt")]
    pub(crate) out: PathBuf,
    /// Parallel compile jobs [default: the number of cores].
    #[arg(long)]
    pub(crate) jobs: Option<usize>,
    /// Build only these kernels (comma-separated) [default: $KWHEEL_KERNELS, else all].
    #[arg(long, value_delimiter = ',')]
    pub(crate) only: Vec<String>,
    /// Make every skipped or failed target an error (also `KWHEEL_REQUIRE=1`).
    #[arg(long)]
    pub(crate) require: bool,
    /// Override the manifest's torch pin (for example `2.11.*`).
    #[arg(long)]
    pub(crate) torch: Option<String>,
    #[command(flatten)]
    pub(crate) cache: CacheDirArg,
    /// No progress bar.
    #[arg(long)]
    pub(crate) quiet: bool,
    /// Build only shard I of N of the compile jobs (`2/4`), into a shard directory for
    /// `dev merge-bundles`.
    #[arg(long)]
    pub(crate) shard: Option<String>,
    /// A shared build cache speaking the bazel-remote HTTP protocol [default:
    /// $KWHEEL_REMOTE_CACHE, then ~/.config/kwheel/config.toml].
    #[arg(long)]
    pub(crate) remote_cache: Option<String>,
    /// Read the remote cache but never upload to it.
    #[arg(long)]
    pub(crate) remote_cache_read_only: bool,
    /// Print every failed target's whole compiler log (by default each distinct error is
    /// printed once, shortened, and the logs go to target/kwheel/logs/bundle-kernels.log).
    #[arg(long)]
    pub(crate) verbose: bool,
    /// Print the build report as JSON on stdout instead of the summary: every target with its
    /// outcome (built, cached, remote, skipped with its kind, failed with its log); see
    /// docs/bundling.md.
    #[arg(long)]
    pub(crate) json: bool,
    /// Run the nvcc and ptxas compiles on a build farm through an sccache-dist client daemon
    /// (SCCACHE_SERVER_UDS or SCCACHE_SERVER_PORT names it), with $KWHEEL_SCCACHE, else
    /// `sccache` on PATH; see docs/distributed-builds.md.
    #[arg(long)]
    pub(crate) farm: bool,
}

#[derive(Args)]
pub(crate) struct MergeArgs {
    /// The shard directories written by `bundle-kernels --shard`.
    #[arg(required = true)]
    pub(crate) shards: Vec<PathBuf>,
    /// The bundle directory to write.
    #[arg(long)]
    pub(crate) out: PathBuf,
    /// Parallel compression jobs [default: the number of cores].
    #[arg(long)]
    pub(crate) jobs: Option<usize>,
}

#[derive(Args)]
pub(crate) struct PublishArgs {
    /// The store's base URL; artifacts go to `<url>/cas/<sha256>`. A bearer token is read
    /// from $KWHEEL_STORE_TOKEN.
    #[arg(long)]
    pub(crate) to: String,
    /// Bundles whose artifacts to publish.
    #[arg(long)]
    pub(crate) bundle: Vec<PathBuf>,
    /// Wheels to publish.
    pub(crate) wheels: Vec<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
#[command(mut_arg("driver", |driver| driver.help(
    "The driver: the CUDA version it supports (`13.0`) or its release (`580.65`)"
)))]
pub(crate) struct FetchArgs {
    /// An installed package (`af3_kernels`) or a bundle directory.
    pub(crate) package: String,
    /// The device: a GPU (`B200`, `H100`, ...), `sm_100`, or a compute capability such as
    /// `10.0`.
    #[arg(long, value_parser = parse_device)]
    pub(crate) device: (u32, u32),
    #[command(flatten)]
    pub(crate) runtime: RuntimeArgs,
    /// Print the report as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
pub(crate) struct ExplainArgs {
    /// The kernel, or the extension module (`[extensions.<name>]`).
    pub(crate) name: String,
    #[command(flatten)]
    pub(crate) manifest: ManifestArg,
    /// Compare with this index (a bundle directory or its index.json).
    #[arg(long)]
    pub(crate) against: Option<PathBuf>,
    /// Override the manifest's torch pin.
    #[arg(long)]
    pub(crate) torch: Option<String>,
}

#[derive(Args)]
pub(crate) struct BuildWheelArgs {
    #[command(flatten)]
    pub(crate) manifest: ManifestArg,
    /// The bundle to ship (built first when missing).
    #[arg(long, default_value = "target/kwheel/_prebuilt")]
    pub(crate) bundle: PathBuf,
    /// Where the wheel goes.
    #[arg(long, default_value = "target/kwheel/wheels")]
    pub(crate) out: PathBuf,
    /// Override the manifest's torch pin (for example `2.11.*`).
    #[arg(long)]
    pub(crate) torch: Option<String>,
    /// Leave the kernel sources out (no JIT fallback from this wheel).
    #[arg(long)]
    pub(crate) no_sources: bool,
    /// Ship no cubins: the sources and an index of recipes only, so every kernel JIT-compiles
    /// on first load (what the build backend does for an sdist or git install). Needs no
    /// CUDA toolchain.
    #[arg(long, conflicts_with_all = ["no_sources", "ship"])]
    pub(crate) recipes_only: bool,
    /// Accepted for older scripts: `dev build-wheel` builds only the library's wheel (kwheel's
    /// own wheels come from `kwheel release build-kwheel`).
    #[arg(long, hide = true)]
    pub(crate) no_runtime: bool,
    /// Ship only these variants in the wheel (`sm_90a`, `cu130:sm_100a`, comma-separated);
    /// the index lists the rest with the store they are fetched from.
    #[arg(long)]
    pub(crate) ship: Option<String>,
    /// The store that holds the variants left out [default: the manifest's `store`].
    #[arg(long)]
    pub(crate) store: Option<String>,
    /// The largest wheel file (`100MiB`, `64KiB`, bytes): artifacts that do not fit go into
    /// companion part wheels `<package>-kernels-<group>` that the wheel pins
    /// [default: the manifest's `[wheel] max-file-size`, else no limit].
    #[arg(long, value_parser = release::wheel::parts::parse_file_size)]
    pub(crate) max_file_size: Option<u64>,
    /// Ship this warm pack (`kwheel jit export` wrote it) in the wheel, verified against the
    /// bundle, so its kernels load as prebuilt where nothing else fits (repeatable).
    #[arg(long, value_name = "PACK")]
    pub(crate) add_pack: Vec<PathBuf>,
    /// Parallel compile jobs when bundling [default: the number of cores].
    #[arg(long)]
    pub(crate) jobs: Option<usize>,
    #[command(flatten)]
    pub(crate) cache: CacheDirArg,
    /// No progress output.
    #[arg(long)]
    pub(crate) quiet: bool,
    /// Print what was written as one JSON object (`path`, `files`, `size`).
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
#[command(group(clap::ArgGroup::new("devices").required(true).args(["device", "fleet"])))]
#[command(mut_arg("cuda", |cuda| cuda.help("The runtime's CUDA build: `12.9` or `cu129`")))]
pub(crate) struct CoverageArgs {
    /// The bundle directory.
    pub(crate) bundle: PathBuf,
    /// The device: a GPU (`H100`, `B200`, ...), `sm_90`, `sm_100`, or a compute capability
    /// such as `9.0`.
    #[arg(long, value_parser = parse_device)]
    pub(crate) device: Option<(u32, u32)>,
    /// Several devices at once, comma-separated, printed as one table: known GPUs (`H100`,
    /// `B200`, `B300`, `Thor`, `RTX-PRO-6000`, `GB10`, ...), `NAME=10.3`, or capabilities.
    #[arg(long, value_delimiter = ',', conflicts_with = "device")]
    pub(crate) fleet: Vec<String>,
    /// Refuse PTX variants, as `<PACKAGE>_PTX_JIT=0` does at run time.
    #[arg(long)]
    pub(crate) no_ptx_jit: bool,
    #[command(flatten)]
    pub(crate) runtime: RuntimeArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
pub(crate) struct CacheDirArg {
    /// The build cache directory [default: ${XDG_CACHE_HOME:-~/.cache}/kwheel/build].
    #[arg(long)]
    pub(crate) cache_dir: Option<PathBuf>,
}

impl CacheDirArg {
    /// The build cache given, else the user's default.
    pub(crate) fn resolve(&self) -> PathBuf {
        self.cache_dir
            .clone()
            .unwrap_or_else(bundler::cache::default_cache_dir)
    }
}

/// The runtime a command answers for, on a device it is given: `dev coverage` and `fetch`
/// describe it the same way, and it becomes the same query. Where one of them has always
/// worded a help line of its own, its `mut_arg` keeps those words.
#[derive(Args)]
pub(crate) struct RuntimeArgs {
    /// The runtime's CUDA build: `13.0` or `cu130`.
    #[arg(long, value_parser = parse_cuda)]
    pub(crate) cuda: prebuilt::CudaBuild,
    /// The runtime's torch version (not checked when absent).
    #[arg(long)]
    pub(crate) torch: Option<String>,
    /// The driver: the CUDA version it supports (`13.0`) or its release (`580.65`)
    /// [default: the minimum driver of the CUDA build].
    #[arg(long, value_parser = parse_driver)]
    pub(crate) driver: Option<prebuilt::device::DriverVersion>,
}

impl RuntimeArgs {
    /// This runtime on a device of compute capability `capability`.
    pub(crate) fn query(&self, capability: (u32, u32)) -> prebuilt::device::DeviceQuery {
        prebuilt::device::DeviceQuery::simulated(
            capability,
            self.cuda,
            self.driver,
            self.torch.clone(),
        )
    }
}

/// Where a command looks for the manifest when not given `--manifest`, in order, relative to
/// the current directory: a library's own folder (`kernels.toml` beside `pyproject.toml`), then
/// a project that keeps its kernels in `kernels/` (as a clone of kwheel does).
pub(crate) const DEFAULT_MANIFESTS: [&str; 2] = ["kernels.toml", "kernels/kernels.toml"];

impl ManifestArg {
    /// The manifest given, else the first of [`DEFAULT_MANIFESTS`] under the current directory;
    /// none there is a not-found error naming where it looked and how to give one. Nothing
    /// outside the current directory is ever a default.
    pub(crate) fn resolve(&self) -> Result<PathBuf, CommandFailed> {
        if let Some(path) = &self.manifest {
            return Ok(path.clone());
        }
        find_default_manifest(Path::new("."))
    }
}

/// The default manifest under `dir`, or the error `resolve` gives.
pub(crate) fn find_default_manifest(dir: &Path) -> Result<PathBuf, CommandFailed> {
    for candidate in DEFAULT_MANIFESTS {
        let path = dir.join(candidate);
        if path.is_file() {
            return Ok(Path::new(candidate).to_owned());
        }
    }
    let here = std::env::current_dir()
        .map(|dir| dir.display().to_string())
        .unwrap_or_else(|_| ".".to_owned());
    Err(CommandFailed::new(
        Failure::NotFound,
        format!(
            "no kernel manifest in {here}: looked for `{}` and `{}`; run the command in the \
             library's folder or give the manifest with `--manifest path/to/kernels.toml`",
            DEFAULT_MANIFESTS[0], DEFAULT_MANIFESTS[1]
        ),
    ))
}

/// `--device`: a GPU by name as `--fleet` takes it (`H100`, `B200`, ...), an SM number
/// (`sm_90`) or a compute capability (`9.0`); a bad value is a usage error (exit 2).
pub(crate) fn parse_device(text: &str) -> Result<(u32, u32), String> {
    use prebuilt::coverage::{FleetDevice, KNOWN_DEVICES};
    match FleetDevice::parse(text) {
        Ok(device) if !text.contains('=') => Ok(device.capability),
        _ => {
            let known: Vec<&str> = KNOWN_DEVICES.iter().map(|(name, _)| *name).collect();
            Err(format!(
                "`{text}` is not a device (expected a GPU ({}), an SM number like `sm_90` or a \
                 compute capability like `9.0`)",
                known.join(", ")
            ))
        }
    }
}

/// `--cuda`: a CUDA build (`12.9`, `cu129`); a bad value is a usage error (exit 2).
pub(crate) fn parse_cuda(text: &str) -> Result<prebuilt::CudaBuild, String> {
    prebuilt::device::parse_cuda_build(text).map_err(|error| error.to_string())
}

/// `--driver`: the CUDA version a driver supports (`13.0`) or its release (`580.65`); a bad
/// value is a usage error (exit 2).
pub(crate) fn parse_driver(text: &str) -> Result<prebuilt::device::DriverVersion, String> {
    prebuilt::device::DriverVersion::parse(text).map_err(|error| error.to_string())
}
