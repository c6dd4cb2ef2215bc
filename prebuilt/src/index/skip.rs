//! Targets of the matrix that have no variant: the skip record, its kind, and the reason
//! the bundler gives.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::{Arch, CudaBuild};

/// A target of the matrix that has no variant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Skip {
    /// The architecture.
    pub arch: Arch,
    /// The CUDA build.
    pub cuda: CudaBuild,
    /// Why it was not built, as a kind: what every decision reads.
    pub kind: SkipKind,
    /// Why it was not built, in words for people (the bundler's name the kind first:
    /// `declared: the kernel targets only sm_100a`). Shown, never parsed.
    pub reason: String,
}

/// Which kind of reason a [`Skip`] has; the index writes it as `kind`, in lowercase.
///
/// | kind | what it means |
/// | --- | --- |
/// | [`SkipKind::Declared`] | the manifest leaves the target out (`arch`, `cuda-builds`) |
/// | [`SkipKind::Unsupported`] | the toolchains at hand cannot build it (`nvrtc 12.9 cannot target sm_100a`), or the bundle carries recipes only |
/// | [`SkipKind::Stub`] | it compiled, but every entry is a stub on that target |
/// | [`SkipKind::Failed`] | its compile or validation failed; the reason holds the compiler's log, bounded |
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SkipKind {
    /// The manifest leaves the target out of the kernel.
    Declared,
    /// The toolchains cannot build the target.
    Unsupported,
    /// Every entry compiled for the target is a stub.
    Stub,
    /// The compile or its validation failed.
    Failed,
}

impl SkipKind {
    /// Every kind, in the order `kernels.idx` numbers them.
    pub const ALL: [SkipKind; 4] = [
        SkipKind::Declared,
        SkipKind::Unsupported,
        SkipKind::Stub,
        SkipKind::Failed,
    ];

    /// The kind's name: `declared`, `unsupported`, `stub`, `failed`.
    pub fn name(self) -> &'static str {
        match self {
            SkipKind::Declared => "declared",
            SkipKind::Unsupported => "unsupported",
            SkipKind::Stub => "stub",
            SkipKind::Failed => "failed",
        }
    }

    /// The words the bundler puts before a reason of this kind (`declared: `), if any.
    fn prefix(self) -> Option<&'static str> {
        match self {
            SkipKind::Declared => Some("declared: "),
            SkipKind::Stub => Some("stub: "),
            SkipKind::Failed => Some("failed: "),
            SkipKind::Unsupported => None,
        }
    }

    /// The kind of a skip written before skips carried one (index formats 1 to
    /// [`super::REQUIRES_INDEX_FORMAT`], `kernels.idx` format [`crate::lookup::LOOKUP_FORMAT`]):
    /// those writers put the kind's name before the reason and nothing before an unsupported
    /// one. Read only for such a record, never for one that names its kind.
    pub(crate) fn of_legacy_reason(reason: &str) -> SkipKind {
        [SkipKind::Declared, SkipKind::Stub, SkipKind::Failed]
            .into_iter()
            .find(|kind| {
                kind.prefix()
                    .is_some_and(|prefix| reason.starts_with(prefix))
            })
            .unwrap_or(SkipKind::Unsupported)
    }
}

/// Gives each skip of `index`, an `index.json` of a format before [`super::SKIP_KIND_INDEX_FORMAT`]
/// parsed as JSON, the `kind` its reason was written with ([`SkipKind::of_legacy_reason`]),
/// so that it reads as a [`Skip`]. What is not shaped like an index is left for the parse to
/// refuse.
pub(crate) fn kind_legacy_skips(index: &mut serde_json::Value) {
    let Some(kernels) = index.get_mut("kernels").and_then(|k| k.as_object_mut()) else {
        return;
    };
    let skips = kernels
        .values_mut()
        .filter_map(|record| record.get_mut("skipped")?.as_array_mut())
        .flatten()
        .filter_map(|skip| skip.as_object_mut());
    for skip in skips {
        if let Some(reason) = skip.get("reason").and_then(|reason| reason.as_str()) {
            let kind = SkipKind::of_legacy_reason(reason).name();
            skip.entry("kind").or_insert_with(|| kind.into());
        }
    }
}

impl fmt::Display for SkipKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a target of the matrix has no variant, as one type for the bundler, the release check
/// and the CLI: a [`SkipKind`] and its words. The index keeps both ([`Skip::new`]): the kind
/// as `kind`, and the words, after the kind's name, as `reason` (an unsupported reason's
/// words alone); [`Skip::why`] gives it back.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SkipReason {
    /// The manifest leaves the target out of the kernel.
    Declared(String),
    /// The toolchains cannot build the target.
    Unsupported(String),
    /// Every entry compiled for the target is a stub.
    Stub(String),
    /// The compile or its validation failed.
    Failed(String),
}

impl SkipReason {
    /// A reason of `kind` in `words`.
    pub fn new(kind: SkipKind, words: String) -> SkipReason {
        match kind {
            SkipKind::Declared => SkipReason::Declared(words),
            SkipKind::Unsupported => SkipReason::Unsupported(words),
            SkipKind::Stub => SkipReason::Stub(words),
            SkipKind::Failed => SkipReason::Failed(words),
        }
    }

    /// The reason's kind.
    pub fn kind(&self) -> SkipKind {
        match self {
            SkipReason::Declared(_) => SkipKind::Declared,
            SkipReason::Unsupported(_) => SkipKind::Unsupported,
            SkipReason::Stub(_) => SkipKind::Stub,
            SkipReason::Failed(_) => SkipKind::Failed,
        }
    }

    /// The words, without the kind's name.
    pub fn words(&self) -> &str {
        match self {
            SkipReason::Declared(words)
            | SkipReason::Unsupported(words)
            | SkipReason::Stub(words)
            | SkipReason::Failed(words) => words,
        }
    }
}

impl Serialize for SkipReason {
    /// As a build report shows it: `{"kind": "stub", "reason": "<the words>"}`.
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap as _;
        let mut map = serializer.serialize_map(Some(2))?;
        map.serialize_entry("kind", &self.kind())?;
        map.serialize_entry("reason", self.words())?;
        map.end()
    }
}

impl std::fmt::Display for SkipReason {
    /// The kind's name and the words (`declared: the kernel targets only sm_100a`); an
    /// unsupported reason's words alone. What the index keeps as [`Skip::reason`].
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(prefix) = self.kind().prefix() {
            f.write_str(prefix)?;
        }
        f.write_str(self.words())
    }
}

impl Skip {
    /// A skip of `arch` with `build` for `why`: its kind, and its words as people read them.
    pub fn new(arch: Arch, cuda: CudaBuild, why: &SkipReason) -> Skip {
        Skip {
            arch,
            cuda,
            kind: why.kind(),
            reason: why.to_string(),
        }
    }

    /// Why the target was skipped: [`Skip::kind`], with the reason's words (without the
    /// kind's name, where the reason starts with it).
    pub fn why(&self) -> SkipReason {
        let words = self
            .kind
            .prefix()
            .and_then(|prefix| self.reason.strip_prefix(prefix))
            .unwrap_or(&self.reason);
        SkipReason::new(self.kind, words.to_owned())
    }
}
