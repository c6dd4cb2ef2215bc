//! The runtime's view of a bundle, over `kernels.idx` or an older bundle's `index.json`.

use std::path::{Path, PathBuf};

use super::{Lookup, Meta, LOOKUP_FILE};
use crate::bundle::{read_artifact, read_index, BundleError};
use crate::index::{Index, KernelInputs, KernelRecord, Variant};

/// The runtime's view of a bundle: its meta at once, one kernel at a time after that. Reads
/// `kernels.idx`; a bundle written before it existed is read from `index.json` whole.
#[derive(Debug)]
pub struct Catalog {
    root: PathBuf,
    source: Source,
    /// Read from `kernels.idx`'s header, or made from the whole index once.
    meta: Meta,
}

#[derive(Debug)]
enum Source {
    Lookup(Box<Lookup>),
    Index(Box<Index>),
}

impl Catalog {
    /// Opens the bundle at `root`: the loader index's header and meta only.
    pub fn open(root: impl Into<PathBuf>) -> Result<Catalog, BundleError> {
        let root = root.into();
        let path = root.join(LOOKUP_FILE);
        // `Lookup::open` checks that no link leads out, as `bundle_file` would again. Only
        // when nothing is there is the bundle one without a loader index: a link in its place
        // (dangling, too) is opened, and refused, never taken for "no loader index".
        let (source, meta) = match Lookup::open(&path) {
            Ok(lookup) => {
                let meta = lookup.meta().clone();
                (Source::Lookup(Box::new(lookup)), meta)
            }
            Err(BundleError::Read { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound
                    && std::fs::symlink_metadata(&path).is_err() =>
            {
                let index = read_index(&root)?;
                let meta = Meta::of(&index);
                (Source::Index(Box::new(index)), meta)
            }
            Err(error) => return Err(error),
        };
        Ok(Catalog { root, source, meta })
    }

    /// The bundle's root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Package, torch pin, store, dictionary and CUDA builds.
    pub fn meta(&self) -> &Meta {
        &self.meta
    }

    /// Every kernel name, in order.
    pub fn names(&self) -> Result<Vec<String>, BundleError> {
        match &self.source {
            Source::Lookup(lookup) => lookup.names(),
            Source::Index(index) => Ok(index.kernels.keys().cloned().collect()),
        }
    }

    /// The record of `kernel` without its key inputs, or `None` when there is none.
    pub fn record(&self, kernel: &str) -> Result<Option<KernelRecord>, BundleError> {
        match &self.source {
            Source::Lookup(lookup) => lookup.record(kernel),
            Source::Index(index) => Ok(index.kernels.get(kernel).map(|record| KernelRecord {
                inputs: KernelInputs::default(),
                ..record.clone()
            })),
        }
    }

    /// Whether a frame may be compressed against the cubin with sha256 `digest`, so that its
    /// bytes are worth keeping once loaded; `false` for a bundle read from `index.json`.
    pub fn is_reference(&self, digest: &str) -> bool {
        match &self.source {
            // Every family dictionary's digest is a word (a crafted, unsorted list: `false`).
            Source::Lookup(lookup) => lookup.words.contains(digest),
            Source::Index(_) => false,
        }
    }

    /// The record of `kernel` with what its requirements are checked against (its constants,
    /// and its key inputs less their include graph), or `None` when there is none.
    pub fn requirements(&self, kernel: &str) -> Result<Option<KernelRecord>, BundleError> {
        match &self.source {
            Source::Lookup(lookup) => lookup.with_inputs(kernel, false),
            Source::Index(index) => Ok(index.kernels.get(kernel).cloned()),
        }
    }

    /// The key inputs of `kernel`, or `None` when there is none.
    pub fn inputs(&self, kernel: &str) -> Result<Option<KernelInputs>, BundleError> {
        match &self.source {
            Source::Lookup(lookup) => lookup.inputs(kernel),
            Source::Index(index) => Ok(index.kernels.get(kernel).map(|r| r.inputs.clone())),
        }
    }

    /// Reads, decompresses and verifies the artifact of one variant of `kernel` (and the
    /// dictionary it needs, verified too).
    pub fn read_artifact(&self, kernel: &str, variant: &Variant) -> Result<Vec<u8>, BundleError> {
        read_artifact(&self.root, self.meta().dictionary.as_ref(), kernel, variant)
    }

    /// The whole index, for tools and `status()` over every kernel: decoded from
    /// `kernels.idx`, which holds all of it.
    pub fn index(&self) -> Result<Index, BundleError> {
        match &self.source {
            Source::Lookup(lookup) => lookup.index(),
            Source::Index(index) => Ok((**index).clone()),
        }
    }
}
