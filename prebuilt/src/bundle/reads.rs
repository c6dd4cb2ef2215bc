//! What an open [`Bundle`] has decoded: each artifact file once, within a budget of the
//! sizes its index records (see the module above).

use super::*;
use crate::cache::PendingFile;

/// What an open bundle has decoded: each artifact file once, within a budget.
#[derive(Debug)]
pub(super) struct Reads {
    /// Decoded bytes still allowed: the recorded sizes of the distinct artifacts, summed at
    /// open, less what has been decoded.
    pub(super) budget: u64,
    /// The budget at open, for messages.
    pub(super) recorded: u64,
    /// By stored path: how each artifact file turned out, and how many variants naming it are
    /// still to read it.
    artifacts: BTreeMap<String, Decoded>,
    /// Dictionaries read and verified, by stored path or family digest.
    dictionaries: BTreeMap<String, Arc<Vec<u8>>>,
    /// Bytes held in `artifacts` and `dictionaries`.
    pub(super) held: u64,
}

#[derive(Debug)]
struct Decoded {
    /// Variants naming this file that have not read it yet.
    pending: usize,
    /// The outcome of its one decode.
    outcome: Outcome,
}

#[derive(Debug)]
enum Outcome {
    /// Not decoded yet.
    Unread,
    /// Verified as the digest and size recorded; the bytes while held.
    Verified {
        digest: String,
        size: u64,
        bytes: Option<Arc<Vec<u8>>>,
    },
    /// Decoded to other bytes than recorded (their sha256).
    Mismatch { actual: String },
    /// Did not decode (the decoder's message).
    Corrupt { message: String },
}

impl Reads {
    pub(super) fn of(index: &Index) -> Reads {
        let mut artifacts: BTreeMap<String, Decoded> = BTreeMap::new();
        let mut recorded = 0u64;
        for variant in index.kernels.values().flat_map(|record| &record.variants) {
            let entry = artifacts
                .entry(variant.artifact.path.clone())
                .or_insert_with(|| {
                    recorded = recorded.saturating_add(variant.artifact.size);
                    Decoded {
                        pending: 0,
                        outcome: Outcome::Unread,
                    }
                });
            entry.pending += 1;
        }
        Reads {
            budget: recorded,
            recorded,
            artifacts,
            dictionaries: BTreeMap::new(),
            held: 0,
        }
    }
}

/// What [`Bundle::reuse`] found for a variant.
pub(super) enum Reuse {
    /// Decode it; with `true`, the decode is charged to the budget: the index names the file
    /// for a variant that has not read it yet, so a decode now is one the index caused. A
    /// caller reading the file more often than the index names it pays for its own repeats.
    Decode(bool),
    /// Its bytes, decoded and verified already.
    Bytes(Vec<u8>),
    /// Verified already; the bytes are not kept.
    Verified,
}

impl Bundle {
    /// Decodes and verifies `variant`'s file with the dictionary it needs, within the decode
    /// budget when `charged`; with `keep`, its bytes are kept for the variants still to read it.
    pub(super) fn decode(
        &self,
        kernel: &str,
        variant: &Variant,
        keep: bool,
        charged: bool,
    ) -> Result<Vec<u8>, BundleError> {
        self.with_dictionary(kernel, variant, |dictionary, label| {
            if charged {
                self.charge(kernel, variant)?;
            }
            let read = read_stored(&self.root, &variant.artifact, dictionary, kernel, label);
            self.record(variant, read.as_ref().map(|bytes| Some(&bytes[..])), keep);
            read
        })
    }

    /// [`Bundle::decode`] into `sink` as it inflates ([`stream_stored`]), keeping nothing.
    pub(super) fn stream(
        &self,
        kernel: &str,
        variant: &Variant,
        charged: bool,
        sink: &mut dyn std::io::Write,
    ) -> Result<(), BundleError> {
        self.with_dictionary(kernel, variant, |dictionary, label| {
            if charged {
                self.charge(kernel, variant)?;
            }
            let read = stream_stored(
                &self.root,
                &variant.artifact,
                dictionary,
                kernel,
                label,
                sink,
            );
            self.record(variant, read.as_ref().map(|()| None), false);
            read
        })
    }

    /// Runs `read` with the dictionary `variant`'s frame needs (read once and kept).
    fn with_dictionary<T>(
        &self,
        kernel: &str,
        variant: &Variant,
        read: impl FnOnce(FrameDictionary<'_>, &str) -> Result<T, BundleError>,
    ) -> Result<T, BundleError> {
        let label = variant.label();
        match (&variant.artifact.dictionary, &self.index.dictionary) {
            (Some(digest), _) => {
                let prefix = self.dictionary(digest, || {
                    read_prefix(&self.root, digest, true, kernel, &label)
                })?;
                read(FrameDictionary::Prefix(&prefix), &label)
            }
            (None, Some(stored)) => {
                let trained = self.dictionary(&stored.path, || {
                    read_dictionary(&self.root, stored, kernel, &label)
                })?;
                read(FrameDictionary::Trained(&trained), &label)
            }
            (None, None) => read(FrameDictionary::None, &label),
        }
    }

    /// Whether `variant` can be answered from an earlier decode of its file; with `bytes`,
    /// its bytes are wanted. Takes the variant's turn: it counts as having read the file.
    pub(super) fn reuse(
        &self,
        kernel: &str,
        variant: &Variant,
        bytes: bool,
    ) -> Result<Reuse, BundleError> {
        let mut reads = self.reads.lock().unwrap_or_else(PoisonError::into_inner);
        let reads = &mut *reads;
        let Some(decoded) = reads.artifacts.get_mut(&variant.artifact.path) else {
            // A variant not of this bundle's index: read it, within the budget.
            return Ok(Reuse::Decode(false));
        };
        let charged = decoded.pending > 0;
        decoded.pending = decoded.pending.saturating_sub(1);
        let path = self.root.join(&variant.artifact.path);
        let mismatch = |actual: &str| BundleError::DigestMismatch {
            kernel: kernel.to_owned(),
            variant: variant.label(),
            path: path.clone(),
            expected: variant.artifact.digest.clone(),
            actual: actual.to_owned(),
        };
        match &mut decoded.outcome {
            Outcome::Unread => Ok(Reuse::Decode(charged)),
            Outcome::Mismatch { actual } => Err(mismatch(actual)),
            Outcome::Corrupt { message } => Err(BundleError::Corrupt {
                kernel: kernel.to_owned(),
                variant: variant.label(),
                path: path.clone(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidData, message.clone()),
            }),
            Outcome::Verified {
                digest,
                size,
                bytes: held,
            } => {
                if *digest != variant.artifact.digest || *size != variant.artifact.size {
                    return Err(mismatch(digest));
                }
                let kept = if decoded.pending == 0 {
                    let kept = held.take();
                    if let Some(kept) = &kept {
                        reads.held -= kept.len() as u64;
                    }
                    kept
                } else {
                    held.clone()
                };
                match kept {
                    Some(kept) if bytes => Ok(Reuse::Bytes(
                        Arc::try_unwrap(kept).unwrap_or_else(|shared| (*shared).clone()),
                    )),
                    _ if !bytes => Ok(Reuse::Verified),
                    _ => Ok(Reuse::Decode(charged)),
                }
            }
        }
    }

    /// Takes `variant`'s recorded size from the decode budget, or refuses.
    pub(super) fn charge(&self, kernel: &str, variant: &Variant) -> Result<(), BundleError> {
        let mut reads = self.reads.lock().unwrap_or_else(PoisonError::into_inner);
        let size = variant.artifact.size;
        if size > reads.budget {
            return Err(BundleError::Refused {
                path: self.root.join(INDEX_FILE),
                source: Untrusted::new(
                    format!("decoding the artifact of `{kernel}` ({})", variant.label()),
                    &size.to_string(),
                    format!(
                        "would take the bytes decoded past the {} bytes the index records for                          its distinct artifacts",
                        reads.recorded
                    ),
                ),
            });
        }
        reads.budget -= size;
        Ok(())
    }

    /// Remembers how `variant`'s file decoded, keeping its bytes while other variants are
    /// still to read it.
    pub(super) fn record(
        &self,
        variant: &Variant,
        read: Result<Option<&[u8]>, &BundleError>,
        keep: bool,
    ) {
        let mut reads = self.reads.lock().unwrap_or_else(PoisonError::into_inner);
        let reads = &mut *reads;
        let Some(decoded) = reads.artifacts.get_mut(&variant.artifact.path) else {
            return;
        };
        if let Outcome::Verified {
            bytes: Some(held), ..
        } = &decoded.outcome
        {
            reads.held -= held.len() as u64;
        }
        decoded.outcome = match read {
            Ok(bytes) => {
                let kept = bytes.filter(|bytes| {
                    keep && decoded.pending > 0 && reads.held + bytes.len() as u64 <= MAX_HELD_BYTES
                });
                if let Some(kept) = kept {
                    reads.held += kept.len() as u64;
                }
                Outcome::Verified {
                    digest: variant.artifact.digest.clone(),
                    size: variant.artifact.size,
                    bytes: kept.map(|bytes| Arc::new(bytes.to_vec())),
                }
            }
            Err(BundleError::DigestMismatch { actual, .. }) => Outcome::Mismatch {
                actual: actual.clone(),
            },
            Err(BundleError::Corrupt { source, .. }) => Outcome::Corrupt {
                message: source.to_string(),
            },
            // A refusal or a read failure says nothing of the content: try again next time.
            Err(_) => Outcome::Unread,
        };
    }

    /// The dictionary under `key`, read with `read` the first time and kept (within
    /// [`MAX_HELD_BYTES`]).
    pub(super) fn dictionary(
        &self,
        key: &str,
        read: impl FnOnce() -> Result<Vec<u8>, BundleError>,
    ) -> Result<Arc<Vec<u8>>, BundleError> {
        if let Some(bytes) = self
            .reads
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .dictionaries
            .get(key)
        {
            return Ok(Arc::clone(bytes));
        }
        let bytes = Arc::new(read()?);
        let mut reads = self.reads.lock().unwrap_or_else(PoisonError::into_inner);
        if reads.held + bytes.len() as u64 <= MAX_HELD_BYTES {
            reads.held += bytes.len() as u64;
            reads
                .dictionaries
                .insert(key.to_owned(), Arc::clone(&bytes));
        }
        Ok(bytes)
    }
}

/// `to` as a hard link to `from` (a copy where links are not possible), put in place whole
/// through a [`PendingFile`] like every other file of a bundle.
pub(super) fn link_atomically(from: &Path, to: &Path) -> std::io::Result<()> {
    PendingFile::linked(from, to)?.persist()
}
