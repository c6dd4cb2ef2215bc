//! Every environment variable the runtime reads, and the policies they set.
//!
//! | variable | sets |
//! | --- | --- |
//! | `<PACKAGE>_JIT_FALLBACK` | [`JitPolicy`]: whether a kernel with no fitting cubin compiles from its sources |
//! | `<PACKAGE>_PTX_JIT` | [`PtxJitPolicy`]: whether the driver may compile a PTX variant |
//! | `<PACKAGE>_NO_DOWNLOAD` | [`DownloadPolicy`]: whether a slim wheel's store may be used |
//! | `<PACKAGE>_TRACE` | [`trace_enabled`]: whether every op call is marked in profiler and NVTX traces, a profiler running or not |
//! | `KWHEEL_CUDA_BUILD` | the runtime's CUDA build when torch is not asked ([`CUDA_BUILD_ENV`]) |
//! | `KWHEEL_JIT_CACHE`, `KWHEEL_ARTIFACT_CACHE` | where the caches live ([`crate::cache`]) |
//! | `KWHEEL_JIT_LOCK_TIMEOUT` | seconds the JIT waits for another process compiling the same key ([`crate::jit`]) |
//! | `KWHEEL_NVRTC`, `KWHEEL_SITE_PACKAGES` | where the JIT looks for NVRTC and toolchain wheels |
//! | `KWHEEL_STORE_TOKEN` | the bearer token sent to stores |
//! | `CUDA_VISIBLE_DEVICES` | which NVML devices are the process's CUDA ordinals, as torch reads it ([`crate::nvml`]) |
//! | `PATH` | where a program (nvcc, zig, a cargo subcommand) is found ([`programs_on_path`]) |
//!
//! Every per-package switch starts with the same prefix, spelled by one rule
//! ([`package_prefix`]).

/// The devices CUDA shows the process, by index or UUID: read (as torch reads it) to map
/// NVML's devices to CUDA ordinals without initialising CUDA ([`crate::nvml`]).
pub const CUDA_VISIBLE_DEVICES_ENV: &str = "CUDA_VISIBLE_DEVICES";

/// The package name as an environment-variable prefix: `af3-kernels` → `AF3_KERNELS`.
pub fn package_prefix(package: &str) -> String {
    package.to_ascii_uppercase().replace(['-', '.'], "_")
}

/// Whether the driver may compile a PTX variant for the device (its "PTX JIT"), which costs
/// a compile on the first load of each kernel (then the driver's own cache serves it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PtxJitPolicy {
    /// Read `<PACKAGE>_PTX_JIT`: `0`, `false`, `no` or `off` forbid PTX; anything else, or
    /// unset, allows it.
    #[default]
    FromEnvironment,
    /// PTX variants may load.
    Allowed,
    /// PTX variants never load: they are refused, saying so.
    Forbidden,
}

impl PtxJitPolicy {
    /// What this policy means for `package`: `None` when PTX may load, else the setting that
    /// forbids it (`AF3_KERNELS_PTX_JIT=0`), for the refusal to name.
    pub fn forbidden_by(self, package: &str) -> Option<String> {
        let variable = ptx_jit_variable(package);
        match self {
            PtxJitPolicy::Allowed => None,
            PtxJitPolicy::Forbidden => Some(format!("the loader's policy (as {variable}=0 would)")),
            PtxJitPolicy::FromEnvironment => {
                let value = std::env::var(&variable).ok()?;
                (switch(&value) == Some(false)).then(|| format!("{variable}={value}"))
            }
        }
    }
}

/// The variable that controls PTX loading for a package: `af3-kernels` → `AF3_KERNELS_PTX_JIT`.
pub fn ptx_jit_variable(package: &str) -> String {
    format!("{}_PTX_JIT", package_prefix(package))
}

/// Overrides where the artifact cache lives.
pub const ARTIFACT_CACHE_ENV: &str = "KWHEEL_ARTIFACT_CACHE";

/// Overrides where the JIT cache lives.
pub const JIT_CACHE_ENV: &str = "KWHEEL_JIT_CACHE";
/// How long (seconds) the JIT waits for another process's lock on a key it compiles.
pub const JIT_LOCK_TIMEOUT_ENV: &str = "KWHEEL_JIT_LOCK_TIMEOUT";
/// Points the search at one `libnvrtc.so.N`.
pub const NVRTC_ENV: &str = "KWHEEL_NVRTC";

/// Whether a kernel without a fitting prebuilt cubin may be compiled from its sources.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum JitPolicy {
    /// Read `<PACKAGE>_JIT_FALLBACK`: `0`, `false`, `no` or `off` forbid compiling; anything
    /// else, or unset, allows it.
    #[default]
    FromEnvironment,
    /// Compile when nothing fits.
    Allowed,
    /// Never compile: no fit is an error that says what was shipped and why it did not fit.
    Disabled,
}

impl JitPolicy {
    /// Whether compiling is allowed, reading `<PACKAGE>_JIT_FALLBACK` for
    /// [`JitPolicy::FromEnvironment`].
    pub fn allows_compiling(self, package: &str) -> bool {
        match self {
            JitPolicy::Allowed => true,
            JitPolicy::Disabled => false,
            JitPolicy::FromEnvironment => {
                let value = std::env::var_os(fallback_variable(package));
                value_allows(value.as_deref().and_then(|value| value.to_str()))
            }
        }
    }
}

fn value_allows(value: Option<&str>) -> bool {
    value.and_then(switch) != Some(false)
}

/// A switch as people write it: `0`, `false`, `no`, `off` → off; `1`, `true`, `yes`, `on` →
/// on; any case, surrounding spaces ignored; anything else → `None`.
fn switch(value: &str) -> Option<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "0" | "false" | "no" | "off" => Some(false),
        "1" | "true" | "yes" | "on" => Some(true),
        _ => None,
    }
}

/// The variable that controls the fallback for a package: `af3-kernels` →
/// `AF3_KERNELS_JIT_FALLBACK`.
pub fn fallback_variable(package: &str) -> String {
    format!("{}_JIT_FALLBACK", package_prefix(package))
}

/// The variable that holds the bearer token sent to stores and remote caches. Tokens are read
/// from the environment only, never from a command line (which other users can read).
pub const STORE_TOKEN_ENV: &str = "KWHEEL_STORE_TOKEN";

/// The variable that forbids a package's loader to download: `af3-kernels` →
/// `AF3_KERNELS_NO_DOWNLOAD`.
pub fn no_download_variable(package: &str) -> String {
    format!("{}_NO_DOWNLOAD", package_prefix(package))
}

/// Whether the loader may download a variant the bundle leaves in its store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DownloadPolicy {
    /// Read `<PACKAGE>_NO_DOWNLOAD`: `1`, `true`, `yes` or `on` forbid downloading; anything
    /// else, or unset, allows it.
    #[default]
    FromEnvironment,
    /// Download what the bundle and the cache lack.
    Allowed,
    /// Never download: a variant that is neither in the bundle nor in the cache does not
    /// count, and the JIT rules apply.
    Forbidden,
}

impl DownloadPolicy {
    /// Whether downloading is allowed, reading `<PACKAGE>_NO_DOWNLOAD` for
    /// [`DownloadPolicy::FromEnvironment`].
    pub fn allows_download(self, package: &str) -> bool {
        match self {
            DownloadPolicy::Allowed => true,
            DownloadPolicy::Forbidden => false,
            DownloadPolicy::FromEnvironment => {
                let value = std::env::var_os(no_download_variable(package));
                !value
                    .as_deref()
                    .and_then(|value| value.to_str())
                    .is_some_and(forbids)
            }
        }
    }
}

fn forbids(value: &str) -> bool {
    switch(value) == Some(true)
}

/// The variable that marks every op call and launch of a package in traces:
/// `af3-kernels` → `AF3_KERNELS_TRACE` (see `docs/provenance.md`).
pub fn trace_variable(package: &str) -> String {
    format!("{}_TRACE", package_prefix(package))
}

/// Whether `<PACKAGE>_TRACE` is on (`1`, `true`, `yes`, `on`); unset or anything else is off.
pub fn trace_enabled(package: &str) -> bool {
    let value = std::env::var_os(trace_variable(package));
    value
        .as_deref()
        .and_then(|value| value.to_str())
        .and_then(switch)
        == Some(true)
}

/// Extra site-packages directories to search, `:`-separated.
pub const SITE_PACKAGES_ENV: &str = "KWHEEL_SITE_PACKAGES";

/// Names the runtime's CUDA build (`cu129`) when [`RegistryOptions::cuda`] does not.
pub const CUDA_BUILD_ENV: &str = "KWHEEL_CUDA_BUILD";

/// Every executable file named `program` in the folders of `path` (a `PATH` value), in
/// `PATH` order, so the first is the one a shell runs: the one rule by which kwheel finds a
/// program on `PATH` (the `which` crate's). No `path`, or no such program, finds none.
pub fn programs_on_path(program: &str, path: Option<&std::ffi::OsStr>) -> Vec<std::path::PathBuf> {
    let Some(path) = path else {
        return Vec::new();
    };
    match which::which_in_global(program, Some(path)) {
        Ok(found) => found.collect(),
        Err(_) => Vec::new(),
    }
}

/// The program a shell runs for `program` with this process's `PATH`
/// ([`programs_on_path`]'s first).
pub fn program_on_path(program: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH");
    programs_on_path(program, path.as_deref())
        .into_iter()
        .next()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Programs are found in `PATH` order, executable files only.
    #[test]
    fn programs_on_path_are_executables_in_path_order() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let program = |folder: &str, mode: u32| {
            let path = dir.path().join(folder).join("tool");
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, b"#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            path
        };
        let first = program("a", 0o755);
        program("b", 0o644);
        let second = program("c", 0o755);
        let folders = ["a", "b", "missing", "c"].map(|folder| dir.path().join(folder));
        let path = std::env::join_paths(folders).unwrap();
        assert_eq!(programs_on_path("tool", Some(&path)), [first, second]);
        assert_eq!(
            programs_on_path("other", Some(&path)),
            Vec::<std::path::PathBuf>::new()
        );
        assert_eq!(
            programs_on_path("tool", None),
            Vec::<std::path::PathBuf>::new()
        );
    }

    #[test]
    fn separators_become_underscores_and_letters_upper_case() {
        assert_eq!(package_prefix("af3-kernels"), "AF3_KERNELS");
        assert_eq!(package_prefix("my.kernels_lib"), "MY_KERNELS_LIB");
    }

    #[test]
    fn ptx_jit_policy_reads_its_variable() {
        assert_eq!(ptx_jit_variable("af3-kernels"), "AF3_KERNELS_PTX_JIT");
        assert_eq!(ptx_jit_variable("my.lib"), "MY_LIB_PTX_JIT");
        assert_eq!(PtxJitPolicy::Allowed.forbidden_by("af3-kernels"), None);
        assert_eq!(
            PtxJitPolicy::Forbidden
                .forbidden_by("af3-kernels")
                .as_deref(),
            Some("the loader's policy (as AF3_KERNELS_PTX_JIT=0 would)")
        );
        // A package name no other test uses, so its variable is this test's alone.
        let package = "kwheel-ptx-policy-test";
        for (value, forbidden) in [("0", true), ("off", true), (" No ", true), ("1", false)] {
            std::env::set_var("KWHEEL_PTX_POLICY_TEST_PTX_JIT", value);
            assert_eq!(
                PtxJitPolicy::FromEnvironment.forbidden_by(package),
                forbidden.then(|| format!("KWHEEL_PTX_POLICY_TEST_PTX_JIT={value}")),
                "{value:?}"
            );
        }
        std::env::remove_var("KWHEEL_PTX_POLICY_TEST_PTX_JIT");
        assert_eq!(PtxJitPolicy::FromEnvironment.forbidden_by(package), None);
    }

    #[test]
    fn the_variable_follows_the_package_name() {
        assert_eq!(
            no_download_variable("af3-kernels"),
            "AF3_KERNELS_NO_DOWNLOAD"
        );
        assert!(forbids("1") && forbids(" TRUE ") && forbids("on"));
        assert!(!forbids("0") && !forbids("") && !forbids("no"));
    }

    #[test]
    fn fallback_variable_is_the_package_upper_cased() {
        assert_eq!(fallback_variable("af3-kernels"), "AF3_KERNELS_JIT_FALLBACK");
        assert_eq!(fallback_variable("my.ops"), "MY_OPS_JIT_FALLBACK");
    }

    #[test]
    fn zero_and_its_spellings_forbid_compiling() {
        for value in ["0", "false", "OFF", " no "] {
            assert!(!value_allows(Some(value)), "{value}");
        }
        for value in [None, Some("1"), Some(""), Some("yes")] {
            assert!(value_allows(value), "{value:?}");
        }
        assert!(JitPolicy::Allowed.allows_compiling("x"));
        assert!(!JitPolicy::Disabled.allows_compiling("x"));
    }
}
