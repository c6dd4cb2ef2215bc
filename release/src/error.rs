//! The release crate's error type, and the stale-kernel record its checks report.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use crate::audit::Violation;
use crate::verify::Problem;

/// A kernel whose bundled variants no longer match its sources, and what changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StaleKernel {
    /// The kernel.
    pub kernel: String,
    /// One line per changed input (`file include/af3/common.cuh: content changed (…)`).
    pub changes: Vec<String>,
}

impl StaleKernel {
    /// The stale entries of one kind (kernels, or extension modules): each of the manifest's
    /// `entries` in which `changes` finds a change (one line each), in order, then a stale
    /// entry saying `gone` for each name the bundle records that the manifest no longer has.
    pub(crate) fn of_each<'a, Spec, Record>(
        entries: &'a BTreeMap<String, Spec>,
        recorded: &BTreeMap<String, Record>,
        mut changes: impl FnMut(&'a String, &'a Spec) -> Result<Vec<String>, Error>,
        gone: &str,
    ) -> Result<Vec<StaleKernel>, Error> {
        let mut stale = Vec::new();
        for (name, spec) in entries {
            let changes = changes(name, spec)?;
            if !changes.is_empty() {
                stale.push(StaleKernel {
                    kernel: name.clone(),
                    changes,
                });
            }
        }
        let no_longer = recorded.keys().filter(|name| !entries.contains_key(*name));
        stale.extend(no_longer.map(|name| StaleKernel {
            kernel: name.clone(),
            changes: vec![gone.to_owned()],
        }));
        Ok(stale)
    }
}

/// A failure of the release machinery.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read.
    #[error(transparent)]
    Read(#[from] prebuilt::untrusted::Unreadable),
    /// A file could not be written.
    #[error("cannot write `{}`", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A zip archive could not be written.
    #[error("cannot write zip archive `{}`", path.display())]
    Zip {
        /// The archive.
        path: PathBuf,
        /// The cause.
        #[source]
        source: zip::result::ZipError,
    },
    /// A distribution name, version or tag cannot go into a wheel file name.
    #[error("invalid {what} `{value}` for a wheel: {reason}")]
    InvalidName {
        /// `distribution name`, `version`, `python tag`, `abi tag`, `platform tag` or `file name`.
        what: &'static str,
        /// The value given.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A file cannot be put into a wheel under the path asked for.
    #[error("cannot put `{path}` into a wheel: {reason}")]
    InvalidEntry {
        /// The path inside the wheel.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// `METADATA` and the file name disagree on the distribution.
    #[error("METADATA says `{metadata}` but the wheel file name says `{filename}`")]
    NameMismatch {
        /// Name and version as METADATA gives them.
        metadata: String,
        /// Name and version as the file name gives them.
        filename: String,
    },
    /// `SOURCE_DATE_EPOCH` is set to something that is not a time.
    #[error("SOURCE_DATE_EPOCH=`{value}` is not a whole number of seconds since 1970")]
    SourceDateEpoch {
        /// The value found.
        value: String,
    },
    /// A wheel's platform tag names a policy this audit does not know.
    #[error(
        "no audit policy for platform tag `{tag}`: kwheel writes wheels tagged \
         `manylinux_2_28_x86_64`, `manylinux_2_28_aarch64`, `linux_*` or `any`"
    )]
    NoPolicy {
        /// The platform tag.
        tag: String,
    },
    /// An extension module of the bundle has no build to ship.
    #[error("extension module `{module}` was built for no target: {}", reasons.join("; "))]
    ModuleUnbuilt {
        /// The module.
        module: String,
        /// Each target with why it was not built.
        reasons: Vec<String>,
    },
    /// The extension modules have no CPU architecture in common, so no wheel holds them all.
    #[error(
        "the extension modules share no CPU architecture: {}; give them a common one in `cpus`",
        modules.join("; ")
    )]
    ModulesShareNoCpu {
        /// Each module with the CPUs it is built for.
        modules: Vec<String>,
    },
    /// An extension module keeps to no manylinux policy kwheel knows.
    #[error(
        "extension module `{module}` ({variant}) fails the manylinux audit:{}",
        list(violations)
    )]
    ModuleAudit {
        /// The module.
        module: String,
        /// Its variant, `cu130/x86_64`.
        variant: String,
        /// What breaks the newest policy.
        violations: Vec<String>,
    },
    /// Host ELF files in a wheel break its platform's policy.
    #[error("`{wheel}` fails the {policy} audit:{}", list(violations))]
    Audit {
        /// The wheel's file name.
        wheel: String,
        /// The policy (`manylinux_2_28_x86_64`).
        policy: String,
        /// Every violation found.
        violations: Vec<Violation>,
    },
    /// A written or given wheel failed verification.
    #[error("`{}` failed verification:{}", wheel.display(), list(problems))]
    Verification {
        /// The wheel.
        wheel: PathBuf,
        /// Every problem found.
        problems: Vec<Problem>,
    },
    /// The manifest names no Python package to ship the bundle in.
    #[error(
        "`{}` has no `python-package` in `[library]`: a wheel needs the Python package that \
         `_prebuilt/` goes into",
        manifest.display()
    )]
    NoPythonPackage {
        /// The manifest.
        manifest: PathBuf,
    },
    /// The manifest's Python package directory is missing or unusable.
    #[error("Python package `{}` (`python-package` of `{}`) {reason}", path.display(), manifest.display())]
    PythonPackage {
        /// The package directory.
        path: PathBuf,
        /// The manifest.
        manifest: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The bundle was built for another library than the manifest's.
    #[error(
        "bundle `{}` is of package `{found}`, not `{expected}` of the manifest",
        bundle.display()
    )]
    PackageMismatch {
        /// The bundle directory.
        bundle: PathBuf,
        /// The package its index names.
        found: String,
        /// The manifest's package.
        expected: String,
    },
    /// The bundle's loader index is missing, or is not the one its `index.json` gives.
    #[error(
        "bundle `{}` has no `kernels.idx` matching its `index.json` (written by an older kwheel, \
         or edited by hand); rebuild it with `kwheel dev bundle-kernels`",
        bundle.display()
    )]
    LoaderIndex {
        /// The bundle directory.
        bundle: PathBuf,
    },
    /// The bundle's keys do not match the current sources.
    #[error(
        "bundle `{}` is stale; rebuild it with `kwheel dev bundle-kernels` before building the \
         wheel:{}",
        bundle.display(),
        stale_list(stale)
    )]
    StaleBundle {
        /// The bundle directory.
        bundle: PathBuf,
        /// Each kernel whose inputs changed since the bundle was built.
        stale: Vec<StaleKernel>,
    },
    /// A tool that builds the kwheel runtime's Python module is not installed.
    #[error("cannot build the kwheel Python module: `{tool}` is not installed; {hint}")]
    MissingTool {
        /// The tool (`cargo-zigbuild`).
        tool: String,
        /// How to install it.
        hint: String,
    },
    /// Building the kwheel runtime's Python module failed.
    #[error(
        "building the kwheel Python module failed: `{command}` {outcome}{}",
        indented(output)
    )]
    Build {
        /// The command, as it would be typed.
        command: String,
        /// What happened: `failed (exit status: 101)`, `could not start: …`.
        outcome: String,
        /// The end of its output.
        output: String,
    },
    /// A name from a wheel's verified reading would be written outside the folder it is
    /// extracted to (absolute, `..`, or not a plain relative path).
    #[error(
        "`{}`: refusing to extract `{name}` into `{}`: {reason}",
        wheel.display(),
        folder.display()
    )]
    OutsideFolder {
        /// The wheel.
        wheel: PathBuf,
        /// The entry's path inside the wheel.
        name: String,
        /// The folder it was to be extracted to.
        folder: PathBuf,
        /// Why its path leaves the folder.
        reason: String,
    },
    /// `release diff` cannot read one of the two releases.
    #[error("cannot compare `{}`: {reason}", path.display())]
    Compare {
        /// The wheel or bundle.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Bundling, planning or reading the manifest failed.
    #[error(transparent)]
    Bundler(Box<bundler::Error>),
    /// A bundle could not be read, or an artifact in it failed verification.
    #[error(transparent)]
    Bundle(Box<prebuilt::BundleError>),
    /// `--ship` is not a list of variants, or names none of the bundle's.
    #[error("invalid --ship filter `{filter}`: `{term}`: {reason}")]
    InvalidShipFilter {
        /// The whole filter.
        filter: String,
        /// The term at fault.
        term: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A slim wheel was asked for without a store to fetch the rest from.
    #[error(
        "`--ship {filter}` leaves {left_out} artifacts out of the wheel, so the wheel needs a \
         store to fetch them from: give `--store <url>` or `store = \"…\"` in `[library]` of `{}`",
        manifest.display()
    )]
    NoStore {
        /// The filter.
        filter: String,
        /// How many artifacts it leaves out.
        left_out: usize,
        /// The manifest.
        manifest: PathBuf,
    },
    /// An object could not be published.
    #[error("cannot publish {what} to {url}: {reason}")]
    Publish {
        /// What: a kernel's variant, or a wheel.
        what: String,
        /// Its URL in the store.
        url: String,
        /// What failed.
        reason: String,
    },
    /// A source distribution cannot be built from the manifest's tree.
    #[error("cannot build an sdist from `{}`: {reason}", path.display())]
    Sdist {
        /// The manifest.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A path the manifest names leads outside the library's root, which a build from source
    /// (an sdist, a recipes-only wheel) must stay inside.
    #[error(
        "`{}`: `{key}` names `{path}`, which {reason}; a build from source ships only files \
         under the manifest's directory",
        manifest.display()
    )]
    OutsideRoot {
        /// The manifest.
        manifest: PathBuf,
        /// The manifest key (`kernels.layernorm.include-dirs`).
        key: String,
        /// The path as the manifest (or the include graph) names it.
        path: String,
        /// Where it leads (`is absolute`, `resolves to /home/me/.ssh/id_rsa`).
        reason: String,
    },
    /// A written or given sdist failed verification.
    #[error("`{}` failed verification:{}", sdist.display(), list(problems))]
    SdistVerification {
        /// The sdist.
        sdist: PathBuf,
        /// Every problem found.
        problems: Vec<String>,
    },
    /// A wheel cannot be cut into files of at most the size limit, or the limit is not a size.
    #[error("cannot cut `{package}` into wheels of at most {limit} bytes: {reason}")]
    FileSizeLimit {
        /// The distribution.
        package: String,
        /// The limit, as given.
        limit: String,
        /// What does not fit, or what is wrong with the limit.
        reason: String,
    },
    /// The store's URL or client could not be set up.
    #[error(transparent)]
    Fetch(#[from] Box<prebuilt::fetch::FetchError>),
    /// A warm pack given to ship does not verify against the bundle.
    #[error(transparent)]
    Pack(#[from] Box<prebuilt::jit::pack::PackError>),
}

impl From<bundler::Error> for Error {
    fn from(error: bundler::Error) -> Error {
        Error::Bundler(Box::new(error))
    }
}

impl From<prebuilt::BundleError> for Error {
    fn from(error: prebuilt::BundleError) -> Error {
        Error::Bundle(Box::new(error))
    }
}

fn list<T: std::fmt::Display>(items: &[T]) -> String {
    let mut out = String::new();
    for item in items {
        let _ = write!(out, "\n  {item}");
    }
    out
}

fn stale_list(stale: &[StaleKernel]) -> String {
    let mut out = String::new();
    for kernel in stale {
        for change in &kernel.changes {
            let _ = write!(out, "\n  `{}`: {change}", kernel.kernel);
        }
    }
    out
}

/// Command output under an error message, indented; nothing when there is none.
fn indented(output: &str) -> String {
    let mut out = String::new();
    for line in output.lines() {
        let _ = write!(out, "\n    {line}");
    }
    out
}
