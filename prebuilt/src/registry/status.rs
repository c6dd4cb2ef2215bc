//! What a load reports: where a kernel's cubin came from ([`Provenance`]) and, before a load,
//! whether and how it can load ([`Status`], which [`Plan::status`] renders).

use super::*;

/// Where a loaded kernel's cubin came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Provenance {
    /// A cubin of the bundle.
    Prebuilt {
        /// The variant's label, `cu129/sm_90a`.
        variant: String,
        /// The variant's key.
        key: String,
    },
    /// A JIT result found in the cache.
    JitCache {
        /// The key it is cached under.
        key: String,
    },
    /// Compiled from the shipped sources by this load.
    JitCompiled {
        /// The key it is now cached under.
        key: String,
    },
    /// A JIT result compiled elsewhere, loaded from a warm pack (`docs/warm-packs.md`).
    Pack {
        /// The target, `cu129/sm_89`.
        variant: String,
        /// The entry's key, checked against the shipped sources.
        key: String,
        /// The pack's folder.
        pack: PathBuf,
    },
}

impl Provenance {
    /// Which of the three it is.
    pub fn kind(&self) -> ProvenanceKind {
        match self {
            Provenance::Prebuilt { .. } => ProvenanceKind::Prebuilt,
            Provenance::JitCache { .. } => ProvenanceKind::JitCache,
            Provenance::JitCompiled { .. } => ProvenanceKind::JitCompiled,
            Provenance::Pack { .. } => ProvenanceKind::Pack,
        }
    }

    /// The key of the cubin.
    pub fn key(&self) -> &str {
        match self {
            Provenance::Prebuilt { key, .. }
            | Provenance::JitCache { key }
            | Provenance::JitCompiled { key }
            | Provenance::Pack { key, .. } => key,
        }
    }
}

impl fmt::Display for Provenance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Provenance::Prebuilt { variant, key } => write!(f, "prebuilt {variant} (key {key})"),
            Provenance::JitCache { key } => write!(f, "jit-cache (key {key})"),
            Provenance::JitCompiled { key } => write!(f, "jit-compiled (key {key})"),
            Provenance::Pack { variant, key, pack } => {
                write!(f, "pack {variant} (key {key}, from {})", pack.display())
            }
        }
    }
}

/// [`Provenance`] without its details, as [`Status`] reports it before a load.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProvenanceKind {
    /// A cubin of the bundle.
    Prebuilt,
    /// A JIT result in the cache.
    JitCache,
    /// Compiled from the shipped sources (on the first load, for a kernel not loaded yet).
    JitCompiled,
    /// A prebuilt cubin from a warm pack.
    Pack,
}

impl fmt::Display for ProvenanceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ProvenanceKind::Prebuilt => "prebuilt",
            ProvenanceKind::JitCache => "jit-cache",
            ProvenanceKind::JitCompiled => "jit-compiled",
            ProvenanceKind::Pack => "pack",
        })
    }
}

/// Whether a kernel can be loaded here, and how or why not.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Status {
    /// It loads (or has loaded).
    Available {
        /// The variant: `cu129/sm_90a`; for the JIT, the build and architecture it compiles for.
        variant: String,
        /// Why it fits, or why it is compiled.
        reason: String,
        /// Where the cubin comes from.
        provenance: ProvenanceKind,
        /// Where a prebuilt cubin is: in the wheel, in the cache, or only in the store (fetched
        /// on first load). `None` for the JIT.
        #[serde(skip_serializing_if = "Option::is_none")]
        location: Option<ArtifactLocation>,
    },
    /// It cannot load here.
    Unavailable {
        /// Why, in a sentence a user can act on.
        reason: String,
    },
}
