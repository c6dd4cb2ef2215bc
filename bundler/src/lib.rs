//! Builds prebuilt-kernel bundles.
#![deny(missing_docs)]

pub mod compiler;
pub mod include;
pub mod toolchain;
