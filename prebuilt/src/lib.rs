//! The prebuilt-kernel bundle: its on-disk format, its types, and how it is read.
#![deny(missing_docs)]

pub mod cubin;
pub mod target;

pub use target::{Arch, CudaBuild, ParseTargetError};
