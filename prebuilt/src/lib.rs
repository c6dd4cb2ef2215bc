//! The prebuilt-kernel bundle: its on-disk format, its types, and how it is read.
//!
//! `prebuilt` owns the contract between building and loading, so both sides agree by
//! construction:
//!
//! Modules in floors; imports point down, never back up (a test checks that no module imports
//! one that imports it back):
//!
//! | floor | module | owns |
//! | --- | --- | --- |
//! | 1 | [`target`] | compile targets (`sm_90a`, `sm_100f`, `sm_90`, `compute_90`) and CUDA builds (`cu129`) |
//! | 1 | [`device`] | what the process has: compute capability, driver version ([`device::DeviceQuery`]), and how they parse |
//! | 1 | [`env`] | every environment variable the runtime reads, and the policies they set |
//! | 1 | [`site`] | the Python environment's site-packages |
//! | 2 | [`index`] | the bundle index: kernels, variants, skips, constants, where an artifact is |
//! | 2 | [`requires`] | what a kernel requires of its inputs: the condition language, its checks, the one evaluator |
//! | 2 | [`key`] | the versioned kernel key over the include graph and the target |
//! | 5 | [`module`] | extension modules: their records, key, choice for a torch, verified read, the device code of their fatbin |
//! | 2 | [`untrusted`] | names, paths, digests and sizes read from outside, checked, and the caps |
//! | 2 | [`cubin`] | cubin and PTX facts: SM number, kind, entry symbols, parameter sizes |
//! | 3 | [`cache`] | the user's cache directories, the one atomic writer, the artifact cache |
//! | 4 | [`bundle`] | the on-disk layout: open, read verified artifacts, list, extract, find |
//! | 5 | [`parts`] | registry-sized wheel sets: which companion package holds an artifact, found where pip put it |
//! | 3 | [`select`] | which variant fits a device, as a pure function, and why the others do not |
//! | 3 | [`compile`] | the one compile recipe the bundler and the JIT share |
//! | 5 | [`coverage`] | selection over a whole bundle, for one device or a fleet |
//! | 5 | [`module_coverage`] | whether a module's archs cover a device, and its `status()` |
//! | 5 | [`driver`], [`nvrtc`], [`nvml`] | the CUDA driver (cudarc), NVRTC (from an explicit path), NVML (devices without a CUDA context) |
//! | 5 | [`fetch`] | the store client (read-only in the runtime), fetching and prefetching |
//! | 6 | [`jit`] | the JIT fallback: compiler search, its cache, one compile |
//! | 7 | [`registry`] | the runtime: status, load in order (wheel, cache, store, JIT), launch |
//!
//! Foreign calls live in [`driver`], [`nvrtc`] and [`nvml`] only. It does not build bundles (that is the
//! `bundler` crate) and does not write wheels (the `release` crate). It stays small: no
//! command-line parsing, no network unless the cargo feature `fetch` asks for it, and no
//! uploads unless `upload` does (the build tools'; the runtime never writes to a store).
#![deny(missing_docs)]

pub mod bundle;
pub mod cache;
pub mod compile;
pub mod coverage;
pub mod cubin;
pub mod device;
pub mod driver;
pub mod env;
pub mod fetch;
pub mod index;
pub mod jit;
pub mod key;
#[cfg(test)]
mod layering;
pub mod lookup;
pub mod module;
pub mod module_coverage;
pub mod nvml;
pub mod nvrtc;
pub mod parts;
pub mod registry;
pub mod requires;
pub mod select;
pub mod site;
pub mod target;
// Fixture builders, also for other crates' tests through the `testing` feature (the test kit).
#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub mod testing;
pub mod untrusted;

pub use bundle::{Bundle, BundleError};
pub use env::{DownloadPolicy, JitPolicy, PtxJitPolicy};
pub use fetch::FetchError;
pub use index::ArtifactLocation;
pub use index::{Index, KernelInputs, KernelRecord, Variant};
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
