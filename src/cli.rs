//! The command line's shape: every verb, its arguments and their help. Parsing only; what each
//! command does is in `main.rs`.

use std::path::{Path, PathBuf};

use clap::{Args, Parser, Subcommand};

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
    Toolchains(ManifestArg),
    /// Download, verify and cache what a given device would load, for machines that go offline.
    Fetch(FetchArgs),
}

#[derive(Subcommand)]
pub(crate) enum DevCommand {
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
    /// The kwheel source tree [default: the one this binary was built from].
    #[arg(long)]
    pub(crate) workspace: Option<PathBuf>,
    /// Cargo's target directory for the cross builds [default: <workspace>/target/kwheel/runtime].
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
    /// Where the sdist goes.
    #[arg(long, default_value = "target/kwheel/sdist")]
    pub(crate) out: PathBuf,
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
    /// The build cache directory [default: ${XDG_CACHE_HOME:-~/.cache}/kwheel/build].
    #[arg(long)]
    pub(crate) cache_dir: Option<PathBuf>,
    /// Also publish the bundle's artifacts and the wheels to this store and verify them (a
    /// bearer token is read from $KWHEEL_STORE_TOKEN).
    #[arg(long)]
    pub(crate) publish: Option<String>,
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
pub(crate) struct ManifestArg {
    /// The kernel manifest [default: the embedded library, kernels/kernels.toml].
    #[arg(long)]
    pub(crate) manifest: Option<PathBuf>,
}

#[derive(Args)]
pub(crate) struct BundleKernelsArgs {
    #[command(flatten)]
    pub(crate) manifest: ManifestArg,
    /// The bundle directory to write.
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
    /// The build cache directory [default: ${XDG_CACHE_HOME:-~/.cache}/kwheel/build].
    #[arg(long)]
    pub(crate) cache_dir: Option<PathBuf>,
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
pub(crate) struct FetchArgs {
    /// An installed package (`af3_kernels`) or a bundle directory.
    pub(crate) package: String,
    /// The device: `sm_100`, or a compute capability such as `10.0`.
    #[arg(long)]
    pub(crate) device: String,
    /// The runtime's CUDA build: `13.0` or `cu130`.
    #[arg(long)]
    pub(crate) cuda: String,
    /// The runtime's torch version (not checked when absent).
    #[arg(long)]
    pub(crate) torch: Option<String>,
    /// The driver: the CUDA version it supports (`13.0`) or its release (`580.65`).
    #[arg(long)]
    pub(crate) driver: Option<String>,
    /// Print the report as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
pub(crate) struct ExplainArgs {
    /// The kernel.
    pub(crate) kernel: String,
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
    /// Parallel compile jobs when bundling [default: the number of cores].
    #[arg(long)]
    pub(crate) jobs: Option<usize>,
    /// The build cache directory [default: ${XDG_CACHE_HOME:-~/.cache}/kwheel/build].
    #[arg(long)]
    pub(crate) cache_dir: Option<PathBuf>,
    /// No progress output.
    #[arg(long)]
    pub(crate) quiet: bool,
}

#[derive(Args)]
#[command(group(clap::ArgGroup::new("devices").required(true).args(["device", "fleet"])))]
pub(crate) struct CoverageArgs {
    /// The bundle directory.
    pub(crate) bundle: PathBuf,
    /// The device: `sm_90`, `sm_100`, or a compute capability such as `9.0`.
    #[arg(long)]
    pub(crate) device: Option<String>,
    /// Several devices at once, comma-separated, printed as one table: known GPUs (`H100`,
    /// `B200`, `B300`, `Thor`, `RTX-PRO-6000`, `GB10`, ...), `NAME=10.3`, or capabilities.
    #[arg(long, value_delimiter = ',', conflicts_with = "device")]
    pub(crate) fleet: Vec<String>,
    /// Refuse PTX variants, as `<PACKAGE>_PTX_JIT=0` does at run time.
    #[arg(long)]
    pub(crate) no_ptx_jit: bool,
    /// The runtime's CUDA build: `12.9` or `cu129`.
    #[arg(long)]
    pub(crate) cuda: String,
    /// The runtime's torch version (not checked when absent).
    #[arg(long)]
    pub(crate) torch: Option<String>,
    /// The driver: the CUDA version it supports (`13.0`) or its release (`580.65`)
    /// [default: the minimum driver of the CUDA build].
    #[arg(long)]
    pub(crate) driver: Option<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
}

impl ManifestArg {
    /// The manifest given, else `kernels/kernels.toml` under the current directory, else the
    /// embedded library of this checkout.
    pub(crate) fn resolve(&self) -> PathBuf {
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
