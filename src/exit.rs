//! Exit codes that say what failed, so a script or CI step can tell a missing input from a
//! tampered artifact, a broken kernel or a down store without reading the message.
//!
//! The code comes from the error itself: its chain is walked from the outermost context inward,
//! and the first error of a library type that decides (`bundler`, `prebuilt`, `release`, or an
//! I/O error saying "not found") gives it. Wrappers the libraries mark `transparent` hide their
//! inner error from the chain, so those are unwrapped by hand.

use std::error::Error as StdError;
use std::fmt;
use std::io;

use bundler::compiler::CompileError;
use bundler::include::ScanError;
use bundler::toolchain::ToolchainError;
use prebuilt::fetch::{FailureCause, FetchError};
use prebuilt::BundleError;

/// The table in `kwheel --help`; [`Failure`] holds the same codes.
pub(crate) const EXIT_CODES_HELP: &str = "\
Exit codes:
  0  success
  1  any other failure
  2  usage: an unknown command or option, an invalid argument value, or an invalid manifest
  3  not found: a manifest (none given and none in the current directory), bundle, wheel,
     kernel, file or CUDA toolchain that is not there
  4  verification: a digest mismatch, a corrupt or refused bundle, a wheel or sdist that fails
     `wheel verify` or its audit, a failed `release check`
  5  build: a kernel that did not compile, an invalid cubin, an unusable CUDA toolchain
  6  network: the artifact store or remote cache could not be reached or answered an error
  7  incomplete: a `release check` in which nothing failed but a gate the release needs could
     not run here (no GPU, no kwheel runtime wheel); `--skip GATE` turns a gate off by name";

/// What kind of failure ended a command; the discriminant is the exit code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    /// Anything the other kinds do not name.
    Other = 1,
    /// Arguments the command cannot take (clap exits with this code itself).
    Usage = 2,
    /// An input that does not exist.
    NotFound = 3,
    /// An artifact that failed its checks.
    Verification = 4,
    /// A kernel or a toolchain that did not build.
    Build = 5,
    /// The store or the remote cache.
    Network = 6,
    /// A release check that could not run a gate the release needs, nothing failed.
    Incomplete = 7,
}

impl Failure {
    /// The kind of failure `error` is, from the first error in its chain that decides.
    pub(crate) fn of(error: &anyhow::Error) -> Failure {
        error.chain().find_map(failure_of).unwrap_or(Failure::Other)
    }

    /// The process exit code.
    pub(crate) fn code(self) -> u8 {
        self as u8
    }
}

/// A failure the command decides itself from a report, such as a release check with a failed
/// gate, carrying the kind of failure it is.
#[derive(Debug)]
pub(crate) struct CommandFailed {
    /// The kind.
    pub(crate) failure: Failure,
    /// What failed, for the user.
    pub(crate) message: String,
}

impl CommandFailed {
    pub(crate) fn new(failure: Failure, message: impl Into<String>) -> CommandFailed {
        CommandFailed {
            failure,
            message: message.into(),
        }
    }
}

impl fmt::Display for CommandFailed {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(&self.message)
    }
}

impl StdError for CommandFailed {}

/// The failure one error of the chain decides, or `None` to look further in.
fn failure_of(error: &(dyn StdError + 'static)) -> Option<Failure> {
    if let Some(error) = error.downcast_ref::<CommandFailed>() {
        return Some(error.failure);
    }
    if let Some(error) = error.downcast_ref::<release::Error>() {
        return release_failure(error);
    }
    if let Some(error) = error.downcast_ref::<bundler::Error>() {
        return bundler_failure(error);
    }
    if error.is::<CompileError>() {
        return Some(Failure::Build);
    }
    if let Some(error) = error.downcast_ref::<ToolchainError>() {
        return Some(toolchain_failure(error));
    }
    if let Some(error) = error.downcast_ref::<bundler::torch::TorchError>() {
        // No torch where one is looked for is a missing input; any other torch error is
        // decided further down (an unreadable file by its I/O error).
        return matches!(error, bundler::torch::TorchError::NotFound { .. })
            .then_some(Failure::NotFound);
    }
    if let Some(error) = error.downcast_ref::<ScanError>() {
        return scan_failure(error);
    }
    if let Some(error) = error.downcast_ref::<BundleError>() {
        return bundle_failure(error);
    }
    if let Some(error) = error.downcast_ref::<FetchError>() {
        return fetch_failure(error);
    }
    if let Some(error) = error.downcast_ref::<io::Error>() {
        // A file refused for what it is (a FIFO or a device, a link out of its folder, over a
        // cap) is input that failed its checks, not a failure to read.
        if prebuilt::untrusted::is_refusal(error) {
            return Some(Failure::Verification);
        }
        return (error.kind() == io::ErrorKind::NotFound).then_some(Failure::NotFound);
    }
    None
}

fn release_failure(error: &release::Error) -> Option<Failure> {
    use release::Error;
    match error {
        Error::Verification { .. }
        | Error::SdistVerification { .. }
        | Error::Audit { .. }
        | Error::StaleBundle { .. }
        | Error::LoaderIndex { .. }
        | Error::OutsideFolder { .. } => Some(Failure::Verification),
        Error::Build { .. } => Some(Failure::Build),
        // A tool the command needs that is not installed (zig, cargo-zigbuild).
        Error::MissingTool { .. } => Some(Failure::NotFound),
        Error::Publish { .. } => Some(Failure::Network),
        Error::InvalidShipFilter { .. } => Some(Failure::Usage),
        Error::Bundler(inner) => bundler_failure(inner),
        Error::Bundle(inner) => bundle_failure(inner),
        Error::Fetch(inner) => fetch_failure(inner),
        // A refused pack is input that failed its checks; one that cannot be read is decided
        // by its I/O error, further down the chain.
        Error::Pack(inner) => inner.is_refusal().then_some(Failure::Verification),
        // Read and write failures are decided by their I/O error, further down the chain.
        _ => None,
    }
}

fn bundler_failure(error: &bundler::Error) -> Option<Failure> {
    use bundler::Error;
    match error {
        Error::UnknownKernel { .. }
        | Error::UnknownName { .. }
        | Error::MissingIncludeDir { .. } => Some(Failure::NotFound),
        Error::Compile(_)
        | Error::InvalidCubin { .. }
        | Error::MissingEntry { .. }
        | Error::AmbiguousEntry { .. }
        | Error::Skipped { .. }
        | Error::NoTarget { .. } => Some(Failure::Build),
        Error::Toolchain(inner) => Some(toolchain_failure(inner)),
        Error::Scan { source, .. } => scan_failure(source),
        Error::Bundle(inner) => bundle_failure(inner),
        Error::Fetch(inner) => fetch_failure(inner),
        // The manifest is the tool's input as much as its flags are: a bad one is a usage error.
        Error::InvalidShard { .. }
        | Error::ManifestSyntax { .. }
        | Error::ManifestInvalid { .. } => Some(Failure::Usage),
        _ => None,
    }
}

fn toolchain_failure(error: &ToolchainError) -> Failure {
    match error {
        ToolchainError::Missing { .. } => Failure::NotFound,
        _ => Failure::Build,
    }
}

fn scan_failure(error: &ScanError) -> Option<Failure> {
    match error {
        // An unreadable source: its I/O error says whether it is missing.
        ScanError::Read { .. } => None,
        // The compiler would fail on the same include.
        _ => Some(Failure::Build),
    }
}

fn bundle_failure(error: &BundleError) -> Option<Failure> {
    match error {
        BundleError::Read { .. }
        | BundleError::Write { .. }
        | BundleError::UnsupportedFormat { .. }
        | BundleError::UnsupportedLookup { .. } => None,
        BundleError::InvalidIndex { .. }
        | BundleError::Refused { .. }
        | BundleError::Corrupt { .. }
        | BundleError::DigestMismatch { .. } => Some(Failure::Verification),
    }
}

fn fetch_failure(error: &FetchError) -> Option<Failure> {
    match error.cause() {
        FailureCause::Network => Some(Failure::Network),
        FailureCause::Verification => Some(Failure::Verification),
        FailureCause::Other => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::path::PathBuf;

    #[test]
    fn the_outermost_deciding_error_wins() {
        let missing = io::Error::new(io::ErrorKind::NotFound, "gone");
        let error = anyhow::Error::new(missing).context("reading the manifest");
        assert_eq!(Failure::of(&error), Failure::NotFound);
        let error = anyhow::Error::new(CommandFailed::new(Failure::Verification, "failed"))
            .context("release check");
        assert_eq!(Failure::of(&error), Failure::Verification);
        let denied = io::Error::new(io::ErrorKind::PermissionDenied, "no");
        assert_eq!(Failure::of(&anyhow::Error::new(denied)), Failure::Other);
    }

    #[test]
    fn transparent_wrappers_are_unwrapped() {
        let mismatch = BundleError::DigestMismatch {
            kernel: "k".into(),
            variant: "cu129/sm_90a".into(),
            path: PathBuf::from("k.cubin.zst"),
            expected: "a".into(),
            actual: "b".into(),
        };
        let error = release::Error::Bundler(Box::new(bundler::Error::Bundle(mismatch)));
        assert_eq!(
            Failure::of(&anyhow::Error::new(error)),
            Failure::Verification
        );
    }

    #[test]
    fn files_refused_for_what_they_are_are_verification_failures() {
        for refusal in [
            prebuilt::untrusted::refusal(io::ErrorKind::InvalidInput, "not a regular file"),
            prebuilt::untrusted::refusal(io::ErrorKind::InvalidData, "over the cap"),
        ] {
            let error = BundleError::Read {
                path: PathBuf::from("index.json"),
                source: refusal,
            };
            assert_eq!(
                Failure::of(&anyhow::Error::new(error)),
                Failure::Verification
            );
        }
        // A plain read failure is not.
        let error = BundleError::Read {
            path: PathBuf::from("index.json"),
            source: io::Error::new(io::ErrorKind::PermissionDenied, "no"),
        };
        assert_eq!(Failure::of(&anyhow::Error::new(error)), Failure::Other);
    }

    #[test]
    fn an_incomplete_fetch_exits_as_what_failed() {
        let incomplete = |cause| FetchError::Incomplete {
            failed: 1,
            kernels: 2,
            names: vec!["k".into()],
            cause,
        };
        for (cause, failure) in [
            (FailureCause::Network, Failure::Network),
            (FailureCause::Verification, Failure::Verification),
            (FailureCause::Other, Failure::Other),
        ] {
            let error = anyhow::Error::new(incomplete(cause)).context("fetch");
            assert_eq!(Failure::of(&error), failure, "{cause:?}");
        }
    }

    #[test]
    fn the_help_table_lists_every_code() {
        for failure in [
            Failure::Other,
            Failure::Usage,
            Failure::NotFound,
            Failure::Verification,
            Failure::Build,
            Failure::Network,
        ] {
            let row = format!("\n  {}  ", failure.code());
            assert!(EXIT_CODES_HELP.contains(&row), "{failure:?}");
        }
    }
}
