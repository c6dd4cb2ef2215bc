//! What the `kwheel` binary's integration tests share: running the binary on the embedded
//! library, reading what it printed, skipping without toolchains, copying trees, and the exit
//! codes `kwheel --help` documents.

// Each test binary uses part of this module; the rest would be dead code in that binary.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// clap's exit code for arguments it cannot parse.
pub const USAGE: i32 = 2;
/// The exit code of a missing manifest, bundle, wheel, kernel, file or toolchain.
pub const NOT_FOUND: i32 = 3;
/// The exit code of an artifact that failed its checks.
pub const VERIFICATION: i32 = 4;
/// The exit code of a kernel that did not compile.
pub const BUILD: i32 = 5;
/// The exit code of a store that could not be reached.
pub const NETWORK: i32 = 6;

pub use testkit::workspace;

/// The binary under test, run from the workspace, where the embedded library is the default.
pub fn kwheel() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_kwheel"));
    command.current_dir(workspace());
    command
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Everything the command printed, stdout first.
pub fn text(output: &Output) -> String {
    format!("{}{}", stdout(output), stderr(output))
}

/// What a command that must fail with exit code `code` printed; it must not have panicked.
pub fn failure(output: &Output, code: i32) -> String {
    let text = text(output);
    assert_eq!(output.status.code(), Some(code), "{text}");
    assert!(!text.contains("panicked"), "{text}");
    text
}

/// What a user reads of a command: its exit code and its output (stdout, then stderr).
pub fn rendered(output: &Output) -> String {
    format!(
        "exit code: {}\n{}",
        output.status.code().unwrap_or(-1),
        text(output)
    )
}

/// The kit's snapshot filters, with `root` (a test's own folder) as `[ROOT]` first, so that a
/// path under it keeps its tail.
pub fn snapshot_settings(root: &Path) -> insta::Settings {
    let mut settings = insta::Settings::clone_current();
    settings.add_filter(
        &testkit::literal_pattern(&root.display().to_string()),
        "[ROOT]",
    );
    for (pattern, replacement) in testkit::snapshot_filters() {
        settings.add_filter(&pattern, replacement);
    }
    // A bundle's artifact is sharded by its digest's first two hex digits.
    settings.add_filter(
        r"artifacts/[0-9a-f]{2}/\[SHA256\]",
        "artifacts/[SHARD]/[SHA256]",
    );
    settings.set_prepend_module_to_snapshot(false);
    settings
}

/// What a command that must fail (with any exit code) printed; it must not have panicked.
pub fn failed(output: &Output) -> String {
    let text = text(output);
    assert!(!output.status.success(), "{text}");
    assert!(!text.contains("panicked"), "{text}");
    text
}

// Like the functions here, not every test binary uses both.
#[allow(unused_imports)]
pub use testkit::{copy_tree, skipped};

/// Whether the toolchains are installed; without them a test skips with the reason, unless
/// `KWHEEL_REQUIRE_TOOLCHAINS=1` (CI), where it fails.
pub fn have_toolchains() -> bool {
    let output = kwheel().arg("toolchains").output().unwrap();
    output.status.success()
        || testkit::missing(&format!("no toolchains ({})", stdout(&output).trim()))
}

/// A copy of the embedded library under `dir` (without its CPU references); its manifest is
/// `<returned>/kernels.toml`.
pub fn copy_library(dir: &Path) -> PathBuf {
    testkit::copy_library(dir, &["reference"])
}

/// `kwheel bundle list <bundle>`.
pub fn bundle_list(bundle: &Path) -> Output {
    kwheel()
        .args(["bundle", "list"])
        .arg(bundle)
        .output()
        .unwrap()
}

/// `kwheel bundle extract <bundle> --out <out>`.
pub fn bundle_extract(bundle: &Path, out: &Path) -> Output {
    kwheel()
        .args(["bundle", "extract"])
        .arg(bundle)
        .arg("--out")
        .arg(out)
        .output()
        .unwrap()
}

/// `kwheel dev bundle-kernels --quiet` into `out` with its build cache at `cache`; a test adds
/// what else it needs (`--only`, `--manifest`, `--shard`).
pub fn bundle_kernels(out: &Path, cache: &Path) -> Command {
    let mut command = kwheel();
    command
        .args(["dev", "bundle-kernels", "--quiet", "--out"])
        .arg(out)
        .arg("--cache-dir")
        .arg(cache);
    command
}

/// `kwheel dev coverage <bundle> <args>`.
pub fn coverage(bundle: &Path, args: &[&str]) -> Output {
    kwheel()
        .args(["dev", "coverage"])
        .arg(bundle)
        .args(args)
        .output()
        .unwrap()
}

/// `kwheel dev merge-bundles <shard> --out <out>`.
pub fn merge_bundles(shard: &Path, out: &Path) -> Output {
    kwheel()
        .args(["dev", "merge-bundles"])
        .arg(shard)
        .arg("--out")
        .arg(out)
        .output()
        .unwrap()
}
