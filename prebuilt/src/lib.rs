//! The prebuilt-kernel bundle: its on-disk format, its types, and how it is read.
//!
//! `prebuilt` owns the contract between building and loading, so both sides agree by
//! construction:
//!
//! | module | owns |
//! | --- | --- |
//! | [`target`] | compile targets (`sm_90a`, `sm_100f`, `sm_90`, `compute_90`) and CUDA builds (`cu129`) |
//! | [`index`] | the bundle index: kernels, variants, skips, constants |
//! | [`key`] | the versioned kernel key over the include graph and the target |
//! | [`cubin`] | cubin ELF facts: SM number, entry symbols, parameter sizes |
//! | [`bundle`] | the on-disk layout, and reading verified artifacts out of it |
//! | [`select`] | which variant fits a device, as a pure function, and why the others do not |
//! | [`registry`] | the runtime: status, load, launch with checked arguments |
//! | [`driver`] | the CUDA driver, loaded at run time (no GPU or no driver is an error, not a panic) |
//! | [`env`] | environment-variable names derived from a package name (`<PACKAGE>_JIT_FALLBACK`, …) |
//! | [`nvrtc`] | NVRTC, loaded at run time from an explicit path |
//! | [`jit`] | the JIT fallback from shipped sources, cached under the user's cache dir |
//! | [`fetch`] | artifacts a slim wheel leaves in its store: locating, downloading, caching |
//! | [`untrusted`] | names, paths, digests and sizes read from outside, checked, and the caps |
//!
//! Foreign calls live in [`driver`] and [`nvrtc`] only. It does not build bundles (that is the
//! `bundler` crate) and does not write wheels (the `release` crate). It stays small: no
//! command-line parsing, and no network unless the cargo feature `fetch` asks for it.
#![deny(missing_docs)]

pub mod bundle;
pub mod cubin;
pub mod driver;
pub mod env;
pub mod fetch;
pub mod index;
pub mod jit;
pub mod key;
pub mod nvrtc;
pub mod registry;
pub mod select;
pub mod target;
pub mod untrusted;

pub use bundle::{Bundle, BundleError};
pub use fetch::{ArtifactLocation, DownloadPolicy, FetchError};
pub use index::{Index, KernelInputs, KernelRecord, Variant};
pub use jit::JitPolicy;
pub use key::KernelKey;
pub use registry::{Kernel, KernelArg, LoadError, Provenance, Registry, RegistryOptions, Status};
pub use target::{Arch, ArchKind, CudaBuild, ParseTargetError};

/// An error and every cause, on one line: `outer: inner: innermost`. A transparent wrapper
/// whose source repeats its own message is said once.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(error) = cause {
        let next = error.to_string();
        if !text.ends_with(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        cause = error.source();
    }
    text
}

/// A kwheel cache directory: `$<override_var>` when set, else
/// `${XDG_CACHE_HOME:-~/.cache}/kwheel/<leaf>`; `env` reads the environment (tests inject it).
pub(crate) fn cache_dir_from(
    env: impl Fn(&str) -> Option<std::ffi::OsString>,
    override_var: &str,
    leaf: &str,
) -> std::path::PathBuf {
    use std::path::PathBuf;
    let env = |name: &str| env(name).filter(|value| !value.is_empty());
    if let Some(dir) = env(override_var) {
        return PathBuf::from(dir);
    }
    let cache = env("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| env("HOME").map(|home| PathBuf::from(home).join(".cache")))
        .unwrap_or_else(|| std::env::temp_dir().join("kwheel-cache"));
    cache.join("kwheel").join(leaf)
}
