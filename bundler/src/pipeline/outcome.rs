//! What became of each target of the matrix: the typed result that execution returns, the
//! index is assembled from, and the report renders. Nothing here is parsed back from text; the
//! index's skip (its kind, and its reason text) is written from a [`SkipReason`] in one place.

use prebuilt::index::{Function, SkipReason};
use prebuilt::{Arch, CudaBuild};
use serde::Serialize;

/// One cell of the matrix: a kernel for one CUDA build and architecture.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Target {
    /// The kernel.
    pub kernel: String,
    /// The CUDA build.
    pub cuda: CudaBuild,
    /// The architecture.
    pub arch: Arch,
}

impl std::fmt::Display for Target {
    /// `` `kernel` for sm_90a (cu130) ``, as the build's messages name a target.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`{}` for {} ({})", self.kernel, self.arch, self.cuda)
    }
}

/// What became of one target.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "outcome", rename_all = "lowercase")]
pub enum Outcome {
    /// It has a variant: compiled in this run or served by a build cache.
    Built(Built),
    /// It has none, for a reason that is not a failure of its compile: the manifest leaves it
    /// out, the toolchains cannot build it, or its every entry is a stub there.
    Skipped {
        /// Why.
        #[serde(flatten)]
        reason: SkipReason,
    },
    /// Its compile or validation failed; the index records it as unavailable.
    Failed(Failure),
}

/// A target that has a variant.
#[derive(Clone, Debug, Serialize)]
pub struct Built {
    /// Where its cubin came from.
    pub source: Provenance,
    /// The cubin's sha256.
    pub digest: String,
    /// The cubin's size in bytes.
    pub size: u64,
    /// Its entries, as the index records them.
    #[serde(skip)]
    pub functions: Vec<Function>,
    /// The struct layouts its compile computed.
    #[serde(skip)]
    pub structs: std::collections::BTreeMap<String, prebuilt::index::StructLayout>,
    /// Entries that are stubs on this target, kept for the kernel's other entries (launching
    /// one there fails), as (entry, what the stub does).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stub_entries: Vec<(String, String)>,
}

/// Where a built target's cubin came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Provenance {
    /// Compiled in this run.
    Compiled,
    /// The local build cache.
    Cached,
    /// The remote build cache.
    Remote,
}

/// A target whose compile or validation failed.
#[derive(Clone, Debug, Serialize)]
pub struct Failure {
    /// The error with its causes and the compiler's whole log.
    pub error: String,
    /// The target as the failure names it: its arch and CUDA build, with the compiler where
    /// one ran (`sm_90a (cu129, nvcc+ptxas 13.0.88/12.9.86)`).
    #[serde(skip)]
    pub target: String,
    /// What went wrong, without the heading that names the kernel and the target: the
    /// compiler's log for a compile the compiler rejected, else the whole error.
    #[serde(skip)]
    pub log: String,
    /// The failure as the index records it (bounded: first lines, error lines, the tail).
    #[serde(skip)]
    pub recorded: String,
    /// Whether it was replayed from the build cache (a failure kept from an earlier build of
    /// the same key) rather than run now.
    pub replayed: bool,
}

impl Outcome {
    /// Why the target has no variant, as the index records it; `None` when it has one.
    pub fn skip_reason(&self) -> Option<SkipReason> {
        match self {
            Outcome::Built(_) => None,
            Outcome::Skipped { reason } => Some(reason.clone()),
            Outcome::Failed(failure) => Some(SkipReason::Failed(failure.recorded.clone())),
        }
    }
}

/// A target and what became of it.
#[derive(Clone, Debug, Serialize)]
pub struct TargetOutcome {
    /// The target.
    #[serde(flatten)]
    pub target: Target,
    /// What became of it.
    #[serde(flatten)]
    pub outcome: Outcome,
}
