//! Release machinery for prebuilt-kernel bundles: wheels that carry a bundle, the manylinux
//! audit of everything inside them, and verification of any wheel.
//!
//! ```text
//! kernels.toml ─► bundle fresh? ─► Python package + _prebuilt/ ─► audit ─► write_wheel ─► verify
//!                  (else refuse,      (library)                   (audit)   (wheel)       (verify)
//!                   or bundle first)
//! ```
//!
//! | module | owns |
//! | --- | --- |
//! | [`wheel`] | wheel file names and tags, `METADATA`, `WHEEL`, `RECORD`, the deterministic writer |
//! | [`library`] | a kernel library's wheel: bundle freshness, the Python package and `_prebuilt/` |
//! | [`audit`] | the manylinux_2_28 policy and the audit of host ELF files (cubins are skipped) |
//! | [`verify`] | re-checking any wheel: RECORD, tags, zip hygiene, bundles, the audit |
//! | [`check`] | the release checklist: every gate a release must pass, as one report |
//!
//! It reads bundles through `prebuilt` and builds them only through `bundler` (when a wheel is
//! asked for and the bundle is missing). The wheel layout is described in
//! `docs/wheel-format.md`.
#![deny(missing_docs)]

pub mod audit;
pub mod check;
pub mod library;
pub mod verify;
pub mod wheel;

use std::fmt::Write as _;
use std::path::PathBuf;

pub use audit::{audit_elf, Policy, Violation, MANYLINUX_2_28_X86_64};
pub use check::{release_check, CheckOptions, Checklist, Gate, GateStatus};
pub use library::{build_library_wheel, check_bundle_current, BuiltWheel, LibraryWheelOptions};
pub use verify::{verify_wheel, Problem, VerifyReport};
pub use wheel::{write_wheel, Metadata, WheelFile, WheelFilename, WheelSpec};

/// A kernel whose bundled variants no longer match its sources, and what changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StaleKernel {
    /// The kernel.
    pub kernel: String,
    /// One line per changed input (`file include/af3/common.cuh: content changed (…)`).
    pub changes: Vec<String>,
}

/// A failure of the release machinery.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read.
    #[error("cannot read `{}`", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
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
         `manylinux_2_28_x86_64`, `linux_*` or `any`"
    )]
    NoPolicy {
        /// The platform tag.
        tag: String,
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
    /// Bundling, planning or reading the manifest failed.
    #[error(transparent)]
    Bundler(Box<bundler::Error>),
    /// A bundle could not be read, or an artifact in it failed verification.
    #[error(transparent)]
    Bundle(Box<prebuilt::BundleError>),
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
