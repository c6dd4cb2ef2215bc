//! The bundler's one error type, every module's failure named with what it was working on.

use std::path::PathBuf;

use prebuilt::{Arch, CudaBuild};

use crate::{compiler, include, toolchain, torch};

/// A failure of the bundler.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read.
    #[error(transparent)]
    Read(#[from] prebuilt::untrusted::Unreadable),
    /// A file read twice in one run (a build cache entry the writer streams) is no longer
    /// what it was when it was validated.
    #[error(
        "`{}` changed during the build: sha256 {actual}, validated as {expected}; run the build \
         again",
        path.display()
    )]
    ChangedFile {
        /// The file.
        path: PathBuf,
        /// The digest it had when validated.
        expected: String,
        /// The digest it has now.
        actual: String,
    },
    /// An output folder that kwheel may not replace (it holds something kwheel did not
    /// write), or that does not name a folder.
    #[error("refusing to replace `{}`: {reason}", path.display())]
    Output {
        /// The folder.
        path: PathBuf,
        /// Why, naming what is in it.
        reason: String,
    },
    /// A file could not be written.
    #[error("cannot write `{}`", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The manifest is not valid TOML, or has an unknown or mistyped key.
    #[error("{}:{line}:{column}: invalid manifest: {message}", path.display())]
    ManifestSyntax {
        /// The manifest.
        path: PathBuf,
        /// 1-based line of the problem.
        line: usize,
        /// 1-based column of the problem.
        column: usize,
        /// What is wrong.
        message: String,
    },
    /// A torch pin (`--torch`) that is not a PEP 440 specifier set.
    #[error(transparent)]
    TorchPin(#[from] prebuilt::select::InvalidPin),
    /// The manifest parses but says something impossible.
    #[error(
        "{}:{line}: invalid manifest{}: {message}",
        path.display(),
        kernel.as_ref().map(|k| format!(" (kernel `{k}`)")).unwrap_or_default()
    )]
    ManifestInvalid {
        /// The manifest.
        path: PathBuf,
        /// 1-based line of the table at fault.
        line: usize,
        /// The kernel at fault, if any.
        kernel: Option<String>,
        /// What is wrong.
        message: String,
    },
    /// An `[extensions.<name>]` table parses but says something impossible.
    #[error("{}:{line}: invalid manifest (extension `{extension}`): {message}", path.display())]
    ExtensionInvalid {
        /// The manifest.
        path: PathBuf,
        /// 1-based line of the table at fault.
        line: usize,
        /// The extension at fault.
        extension: String,
        /// What is wrong, naming the key.
        message: String,
    },
    /// A kernel's source is host code (torch op registration, a Python module) that a cubin
    /// would silently drop.
    #[error(
        "kernel `{kernel}`: `{}` {what}, host code that a cubin cannot hold and kwheel would \
         drop; build it as an extension module instead: move it to `[extensions.<name>]` \
         with `sources = [...]` and `abi = \"stable\"` or `\"torch\"` (docs/extensions.md)",
        file.display()
    )]
    HostCodeInKernel {
        /// The kernel.
        kernel: String,
        /// The file of its include graph that holds it.
        file: PathBuf,
        /// What marks it, `registers ops with `TORCH_LIBRARY``.
        what: String,
    },
    /// An extension module has no torch headers to compile with.
    #[error("cannot build extension module `{module}` without the pinned torch")]
    ModuleTorch {
        /// The module.
        module: String,
        /// Why.
        #[source]
        source: Box<torch::TorchError>,
    },
    /// No host compiler for a CPU's modules (this machine's `g++`, or `KWHEEL_CXX_<CPU>`).
    #[error("cannot build extension module `{module}` for {cpu}: {reason}")]
    ModuleCompiler {
        /// The module.
        module: String,
        /// The CPU.
        cpu: String,
        /// Why.
        reason: String,
    },
    /// An extension module failed to compile, link or check.
    #[error("failed to build extension module `{module}` for {build}: {reason}")]
    ModuleBuild {
        /// The module.
        module: String,
        /// The CUDA build (and CPU, where there is one: `cu130/aarch64`).
        build: String,
        /// What failed, with the compiler's log.
        reason: String,
    },
    /// An extension module's fatbin lacks a declared target, or holds a cubin or PTX that does
    /// not read as one (`docs/extensions.md`).
    #[error("extension module `{module}` for {build}: its device code is not what it declares")]
    ModuleDeviceCode {
        /// The module.
        module: String,
        /// The CUDA build.
        build: CudaBuild,
        /// What is wrong, naming the target.
        #[source]
        source: Box<prebuilt::module::fatbin::FatbinError>,
    },
    /// An extension module's compile or link failed.
    #[error("failed to build extension module `{module}` for {build}/{cpu}")]
    ModuleCompile {
        /// The module.
        module: String,
        /// The CUDA build.
        build: CudaBuild,
        /// The CPU.
        cpu: String,
        /// The step that failed, with the tail of its log.
        #[source]
        source: Box<prebuilt::module::ModuleCompileError>,
    },
    /// `--only` or `explain` named a kernel the manifest does not have.
    #[error("no kernel `{name}` in `{}` (it has: {})", manifest.display(), known.join(", "))]
    UnknownKernel {
        /// The name asked for.
        name: String,
        /// The manifest.
        manifest: PathBuf,
        /// The kernels it has.
        known: Vec<String>,
    },
    /// `explain` named neither a kernel nor an extension module of the manifest.
    #[error(
        "no kernel or extension module `{name}` in `{}` (kernels: {}; extension modules: {})",
        manifest.display(),
        or_none(kernels),
        or_none(modules)
    )]
    UnknownName {
        /// The name asked for.
        name: String,
        /// The manifest.
        manifest: PathBuf,
        /// The kernels it has.
        kernels: Vec<String>,
        /// The extension modules it has.
        modules: Vec<String>,
    },
    /// A kernel's include graph could not be scanned.
    #[error("cannot scan the includes of `{kernel}`")]
    Scan {
        /// The kernel.
        kernel: String,
        /// The cause.
        #[source]
        source: include::ScanError,
    },
    /// A CUDA build's toolchain is missing or unusable.
    #[error(transparent)]
    Toolchain(#[from] toolchain::ToolchainError),
    /// A compiler failed.
    #[error(transparent)]
    Compile(#[from] Box<compiler::CompileError>),
    /// A cubin failed validation.
    #[error("cubin of `{kernel}` for {arch} ({build}) is invalid")]
    InvalidCubin {
        /// The kernel.
        kernel: String,
        /// The target architecture.
        arch: Arch,
        /// The CUDA build.
        build: CudaBuild,
        /// What is wrong with it.
        #[source]
        source: prebuilt::cubin::CubinError,
    },
    /// A cubin lacks a value its compile was to compute (`computed`, `structs`).
    #[error("cubin of `{kernel}` for {arch} ({build}) lacks a computed value: {detail}")]
    ComputedMissing {
        /// The kernel.
        kernel: String,
        /// The target architecture.
        arch: Arch,
        /// The CUDA build.
        build: CudaBuild,
        /// What is missing.
        detail: String,
    },
    /// A declared entry point is not in the cubin.
    #[error(
        "cubin of `{kernel}` for {arch} ({build}) has no entry `{entry}` (its entries, as \
         `entries` spells them: {})",
        if found.is_empty() { "none".to_owned() } else { found.join("; ") }
    )]
    MissingEntry {
        /// The kernel.
        kernel: String,
        /// The target architecture.
        arch: Arch,
        /// The CUDA build.
        build: CudaBuild,
        /// The declared entry.
        entry: String,
        /// The cubin's entries, demangled the way `entries` spells them.
        found: Vec<String>,
    },
    /// A plain entry is the name of several kernels of the cubin (overloads, or instances of
    /// one template), so it names none of them alone.
    #[error(
        "cubin of `{kernel}` for {arch} ({build}) has {} kernels named `{entry}`, so the plain \
         entry names none of them alone; write the one meant as `entries` takes it: {}",
        candidates.len(),
        candidates.join("; ")
    )]
    AmbiguousEntry {
        /// The kernel.
        kernel: String,
        /// The target architecture.
        arch: Arch,
        /// The CUDA build.
        build: CudaBuild,
        /// The declared entry.
        entry: String,
        /// Each kernel of that name, spelled as `entries` takes it (a name expression, or the
        /// mangled symbol where overloads share one).
        candidates: Vec<String>,
    },
    /// A target whose compile failed in an earlier build with the same key: the build cache
    /// keeps the failure, so an unchanged target is not compiled again only to fail again.
    #[error("{}\n{}", kept.reason, Error::replay_note(record))]
    CachedFailure {
        /// The kernel.
        kernel: String,
        /// The target architecture.
        arch: Arch,
        /// The CUDA build.
        build: CudaBuild,
        /// The failure record in the build cache.
        record: PathBuf,
        /// The failure as that build kept it.
        kept: Box<KeptFailure>,
    },
    /// An extension module was skipped for a target while `--require` was given.
    #[error(
        "extension module `{module}` cannot be built for {target}: {reason} (--require makes \
         every skip an error)"
    )]
    ModuleSkipped {
        /// The module.
        module: String,
        /// The CUDA build and CPU (`cu130/aarch64`).
        target: String,
        /// Why it was skipped.
        reason: String,
    },
    /// A target was skipped while `--require` was given.
    #[error("`{kernel}` cannot be built for {arch} ({build}): {reason} (--require makes every skip an error)")]
    Skipped {
        /// The kernel.
        kernel: String,
        /// The target architecture.
        arch: Arch,
        /// The CUDA build.
        build: CudaBuild,
        /// Why it was skipped.
        reason: String,
    },
    /// No kernel was built for any target, so there is nothing to ship: the first kernel's
    /// reasons (a kernel without a variant beside others that have one is only recorded).
    #[error(
        "`{kernel}` was built for no target of the matrix:\n  {}",
        skips
            .iter()
            .map(|unbuilt| format!("{} ({}): {}", unbuilt.arch, unbuilt.cuda, unbuilt.reason))
            .collect::<Vec<_>>()
            .join("\n  ")
    )]
    NoTarget {
        /// The kernel.
        kernel: String,
        /// Each target, with why it has no variant.
        skips: Vec<Unbuilt>,
    },
    /// A folder of a kernel's `include-dirs` that is not there.
    #[error(
        "`{kernel}`'s `include-dirs` names {}, which is not a folder: create it, or take it out \
         of `include-dirs` (a folder that is not there would hide a header the build then \
         finds elsewhere)",
        dir.display()
    )]
    MissingIncludeDir {
        /// The kernel.
        kernel: String,
        /// The folder, as the manifest's root joins it.
        dir: PathBuf,
    },
    /// A kernel compiled as a torch extension has no torch headers to compile with.
    #[error("cannot compile `{kernel}` as a torch extension (`torch = true`)")]
    Torch {
        /// The kernel.
        kernel: String,
        /// Why.
        #[source]
        source: Box<torch::TorchError>,
    },
    /// A bundle could not be read.
    #[error(transparent)]
    Bundle(#[from] prebuilt::BundleError),
    /// The kwheel config file is not valid.
    #[error("invalid kwheel config `{}`: {message}", path.display())]
    Config {
        /// The config file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The remote cache's URL or client could not be set up.
    #[error(transparent)]
    Fetch(#[from] Box<prebuilt::fetch::FetchError>),
    /// The build farm's sccache daemon cannot be used.
    #[error("the build farm through `{}` cannot be used: {reason}", sccache.display())]
    Farm {
        /// The sccache executable.
        sccache: PathBuf,
        /// Why.
        reason: String,
    },
    /// `--shard` is not `i/N` with 1 ≤ i ≤ N.
    #[error("invalid shard `{text}`: {reason}")]
    InvalidShard {
        /// The text given.
        text: String,
        /// What is wrong.
        reason: String,
    },
    /// Shard directories that do not make one bundle.
    #[error("cannot merge shards: {reason}")]
    Merge {
        /// The shard directory at fault, when one is.
        shard: Option<PathBuf>,
        /// What is wrong, naming the shard and the kernel.
        reason: String,
    },
}

/// A target's failure as the build cache keeps it for the next build of the same key.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct KeptFailure {
    /// The error and its causes.
    pub reason: String,
    /// The target as the failure named it, with the compiler where one ran.
    pub target: String,
    /// What went wrong, without the heading that names the kernel and the target.
    pub log: String,
}

/// A target of a kernel that has no variant, and why: a skip, or a failure with its parts.
#[derive(Debug, Clone)]
pub struct Unbuilt {
    /// The architecture.
    pub arch: Arch,
    /// The CUDA build.
    pub cuda: CudaBuild,
    /// Why, as the index records it.
    pub reason: prebuilt::index::SkipReason,
    /// For a failed compile or validation: its whole error, the target with the compiler and
    /// the log apart, and whether it was replayed from the build cache.
    pub failure: Option<(KeptFailure, bool)>,
}

impl Error {
    /// The note under a failure replayed from the build cache: that it was not run again, and
    /// how to run it again.
    pub(crate) fn replay_note(record: &std::path::Path) -> String {
        format!(
            "(an earlier build with the same key failed this way and is not repeated; delete {} \
             to compile it again)",
            record.display()
        )
    }
}

/// `a, b`, or `none`.
fn or_none(names: &[String]) -> String {
    match names.is_empty() {
        true => "none".to_owned(),
        false => names.join(", "),
    }
}
