//! What the workspace's tests share, written once: skips and requirements, the real toolchains,
//! copies of the embedded library, error chains, the loopback store and fixture builders.
//!
//! | need | here |
//! | --- | --- |
//! | a test that passes without testing, listed by `ci/test` | [`skipped!`], [`skipped`] |
//! | a tool a test needs; missing, a skip, or a failure under `KWHEEL_REQUIRE_TOOLCHAINS=1` | [`missing`], [`required`] |
//! | the CUDA toolchains `ci/setup` installs (feature `bundler`) | [`toolchains`] |
//! | third-party sources `ci/setup-thirdparty` fetches; the torch pin (feature `bundler`) | [`thirdparty_library`], [`thirdparty_root`], [`torch_pin`] |
//! | the embedded library, copied to edit | [`copy_library`], [`copy_tree`], [`NOT_SOURCES`] |
//! | an error and its causes in a failure message | [`error_chain`] |
//! | a store with faults on request | [`loopback_store`] |
//! | a folder's files by relative path, to compare or measure trees | [`tree`] |
//! | variants, records, indexes, device queries in code | [`fixtures`] |
//! | user-facing text with temp paths, digests and versions filtered | [`snapshot_filters`] |
//!
//! Not published; a dev-dependency only. The prebuilt crate's own unit tests use
//! `prebuilt::testing` directly, which [`fixtures`] re-exports.

use std::path::{Path, PathBuf};

pub mod loopback_store;
pub mod tree;

/// `text` with every regex metacharacter escaped, for a snapshot filter.
pub use regex::escape as regex_escape;

/// Variants, kernel records, indexes and device queries built in code (`prebuilt::testing`),
/// and the compiler records they carry.
pub mod fixtures {
    pub use prebuilt::testing::*;

    use prebuilt::index::CompilerRecord;

    /// The compiler record of `kind` (`nvcc`, `nvrtc`, `cubin`) at `version`.
    pub fn compiler(kind: &str, version: &str) -> CompilerRecord {
        CompilerRecord {
            kind: kind.to_owned(),
            version: version.to_owned(),
        }
    }
}

/// The environment variable that turns a missing toolchain from a skip into a failure (CI).
pub const REQUIRE_TOOLCHAINS: &str = "KWHEEL_REQUIRE_TOOLCHAINS";

/// Says that the running test passes without testing: `SKIPPED: <test>: <reason>`, written to
/// stderr past the test harness's capture, so that `ci/test` lists it in its summary. A reason
/// that starts with `skipped: ` is said without it.
pub fn skipped(reason: &str) {
    use std::io::Write as _;
    let reason = reason.strip_prefix("skipped: ").unwrap_or(reason);
    let test = std::thread::current()
        .name()
        .unwrap_or("(unnamed test)")
        .to_owned();
    let _ = writeln!(std::io::stderr(), "SKIPPED: {test}: {reason}");
}

/// [`skipped`] with `format!` arguments.
#[macro_export]
macro_rules! skipped {
    ($($arg:tt)*) => {
        $crate::skipped(&format!($($arg)*))
    };
}

/// Whether a missing toolchain must fail the test (`KWHEEL_REQUIRE_TOOLCHAINS=1`, as CI runs).
pub fn required() -> bool {
    std::env::var(REQUIRE_TOOLCHAINS).as_deref() == Ok("1")
}

/// A tool the test needs is missing: skips with the reason (returns `false`, for `if !…
/// { return }`), or fails the test under `KWHEEL_REQUIRE_TOOLCHAINS=1`.
pub fn missing(reason: &str) -> bool {
    assert!(!required(), "toolchain required but missing: {reason}");
    skipped(reason);
    false
}

/// The workspace's root directory.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// The embedded library's manifest, `kernels/kernels.toml`.
pub fn default_manifest() -> PathBuf {
    workspace().join("kernels/kernels.toml")
}

/// The real toolchains of both CUDA builds, or `None` (with the reason said by [`missing`])
/// where they are not installed. Discovered once per test binary.
#[cfg(feature = "bundler")]
pub fn toolchains() -> Option<Vec<bundler::BuildToolchain>> {
    use std::sync::OnceLock;
    static TOOLCHAINS: OnceLock<Result<Vec<bundler::BuildToolchain>, String>> = OnceLock::new();
    let found = TOOLCHAINS.get_or_init(|| {
        ["cu129", "cu130"]
            .iter()
            .map(|build| {
                bundler::BuildToolchain::discover(build.parse().unwrap())
                    .map_err(|error| format!("{error}"))
            })
            .collect()
    });
    match found {
        Ok(toolchains) => Some(toolchains.clone()),
        Err(reason) => {
            missing(reason);
            None
        }
    }
}

/// `$KWHEEL_THIRDPARTY`, else the user cache's `kwheel/thirdparty`: where
/// `ci/setup-thirdparty` fetches third-party libraries' sources and headers.
pub fn thirdparty_root() -> PathBuf {
    std::env::var_os("KWHEEL_THIRDPARTY")
        .map(PathBuf::from)
        .unwrap_or_else(|| prebuilt::cache::cache_home_or_unwritable().join("kwheel/thirdparty"))
}

/// The folder `ci/setup-thirdparty` fetched `name` (`causal-conv1d-1.5.2`) into, whole (its
/// stamp is written last), or `None` with the reason said by [`missing`].
pub fn thirdparty_library(name: &str) -> Option<PathBuf> {
    let dir = thirdparty_root().join(name);
    if dir.join(".kwheel-stamp").is_file() {
        return Some(dir);
    }
    missing(&format!(
        "{} missing (run `ci/setup-thirdparty`)",
        dir.display()
    ));
    None
}

/// The pin (`2.11.*`) of the torch whose headers a torch extension compiles with, or `None`
/// (skipped, with the reason; a failure where toolchains are required, as in CI) where there
/// is no torch.
#[cfg(feature = "bundler")]
pub fn torch_pin() -> Option<String> {
    let torch = match bundler::torch::TorchHeaders::find() {
        Ok(torch) => torch,
        Err(error) => {
            missing(&format!("{error} (`ci/setup-torch` installs it)"));
            return None;
        }
    };
    let mut version = torch.version.split('.');
    Some(format!(
        "{}.{}.*",
        version.next().unwrap(),
        version.next().unwrap()
    ))
}

/// What a copy of the library as its sources leaves out: the Rust CPU references, build
/// outputs and Python's byte-code caches.
pub const NOT_SOURCES: &[&str] = &["reference", "target", "__pycache__"];

/// Copies the tree at `from` to `to`, leaving out entries (at any depth) named in `leave_out`.
pub fn copy_tree(from: &Path, to: &Path, leave_out: &[&str]) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        if leave_out.iter().any(|left| name == *left) {
            continue;
        }
        let target = to.join(&name);
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target, leave_out);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// A copy of the embedded library at `dir/kernels`, without the entries named in `leave_out`
/// (usually [`NOT_SOURCES`]); returns the copy's root, whose manifest is `kernels.toml`.
pub fn copy_library(dir: &Path, leave_out: &[&str]) -> PathBuf {
    let to = dir.join("kernels");
    copy_tree(&workspace().join("kernels"), &to, leave_out);
    to
}

/// An error and each of its causes, one per line (`\n  caused by: …`), for a failure message.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(error) = cause {
        text.push_str(&format!("\n  caused by: {error}"));
        cause = error.source();
    }
    text
}

/// A snapshot filter's pattern that matches `text` literally (a test's own temp folder).
pub fn literal_pattern(text: &str) -> String {
    regex::escape(text)
}

/// insta filters (regex, replacement) for what changes from run to run or machine to machine
/// in text a user reads: temp directories, the workspace path, sha256 digests, durations and
/// the toolchains' exact versions. Applied in order.
pub fn snapshot_filters() -> Vec<(String, &'static str)> {
    vec![
        (
            regex::escape(&workspace().display().to_string()),
            "[WORKSPACE]",
        ),
        (
            regex::escape(&std::env::temp_dir().display().to_string()) + r"/\.tmp[^/\s]*",
            "[TEMP]",
        ),
        (r"\b[0-9a-f]{64}\b".to_owned(), "[SHA256]"),
        (r"\b[0-9a-f]{12,63}\b".to_owned(), "[HEX]"),
        (r"sha256=[A-Za-z0-9_-]{43}".to_owned(), "sha256=[HASH]"),
        (r"\b\d+(\.\d+)?\s?(ms|µs|s)\b".to_owned(), "[DURATION]"),
    ]
}
