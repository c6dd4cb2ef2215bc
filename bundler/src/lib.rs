//! Builds prebuilt-kernel bundles from a kernel manifest.
//!
//! ```text
//! manifest ─► include graph ─► key ─► build cache ─► compile (nvcc / NVRTC) ─► validate ─► bundle
//! ```
//!
//! | module | owns |
//! | --- | --- |
//! | [`manifest`] | `kernels.toml`: library defaults, kernel tables, checks with line numbers |
//! | [`include`](mod@include) | the include-graph scanner |
//! | [`toolchain`] | finding each CUDA build's toolkit, its compiler and exact version |
//! | [`compiler`] | nvcc and NVRTC behind one trait |
//! | [`cache`] | the local content-addressed build cache |
//! | [`remote`] | the shared build cache on a bazel-remote HTTP server |
//! | [`pipeline`] | a build as plan → execute → assemble → write → report, with typed outcomes, or one shard of it |
//! | [`writer`] | writing the bundle directory atomically |
//! | [`shard`] | shard directories of a build spread over machines, and merging them |
//! | [`explain`] | what goes into a kernel's key, and what changed since an index |
//! | [`torch`] | torch's include dirs and defines for `torch = true` kernels |
//! | [`extension`] | extension modules: `[extensions.*]`, their key, compile and link |
//! | [`farm`] | compile actions on a build farm (sccache-dist) through the compile executor's runner seam |
//! | [`progress`] | long work's progress as events to the caller's observer (this crate draws nothing) |
//!
//! The bundle format itself belongs to `prebuilt`; this crate only writes it.
#![deny(missing_docs)]

pub mod compiler;
pub mod include;
pub mod toolchain;

pub mod cache;
pub mod compress;
pub mod explain;
pub mod extension;
pub mod farm;
pub mod manifest;
pub mod pipeline;
pub mod progress;
pub mod remote;
pub mod shard;
pub mod shard_file;
pub mod torch;
pub mod writer;

mod error;

pub use error::{Error, KeptFailure, Unbuilt};
pub use manifest::Manifest;
pub use pipeline::{
    bundle_kernels, bundle_kernels_shared, BuildPlan, BuildToolchain, BundleOptions, BundleSummary,
};
pub use progress::{Event, Progress};
pub use remote::{RemoteCache, RemoteCacheOptions};
pub use shard::{merge_shards, Shard, SharedBuild};
