//! The prebuilt-kernel bundle: its on-disk format, its types, and how it is read.
//!
//! `prebuilt` owns the contract between building and loading, so both sides agree by
//! construction:
//!
//! | module | owns |
//! | --- | --- |
//! | [`target`] | architectures (`sm_90a`) and CUDA builds (`cu129`) |
//! | [`index`] | the bundle index: kernels, variants, skips, constants |
//! | [`key`] | the versioned kernel key over the include graph and the target |
//! | [`cubin`] | cubin ELF facts: SM number, entry symbols, parameter sizes |
//! | [`bundle`] | the on-disk layout, and reading verified artifacts out of it |
//!
//! It does not build anything (that is the `bundler` crate) and does not write wheels (the
//! `release` crate). It stays small: no command-line parsing, no network.
#![deny(missing_docs)]

pub mod bundle;
pub mod cubin;
pub mod driver;
pub mod index;
pub mod jit;
pub mod key;
pub mod nvrtc;
pub mod registry;
pub mod select;
pub mod target;

pub use bundle::{Bundle, BundleError};
pub use index::{Index, KernelInputs, KernelRecord, Variant};
pub use key::KernelKey;
pub use target::{Arch, CudaBuild, ParseTargetError};
