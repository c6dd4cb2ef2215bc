//! The vocabulary: the short strings many records repeat, written once and named by position
//! ([`Vocabulary`] as the writer collects them, [`Words`] as an open file holds them).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use super::{hex_digest, hex_on_stack, Decoded, In, Out, Read};
use crate::index::KernelRecord;

/// The strings the records name by position: collected from the whole index, sorted, so the
/// same index always gives the same ids.
pub(in crate::lookup) struct Vocabulary {
    ids: BTreeMap<String, u64>,
}

impl Vocabulary {
    pub fn of<'a>(records: impl Iterator<Item = &'a KernelRecord>) -> Vocabulary {
        let mut words = BTreeSet::new();
        for record in records {
            for variant in &record.variants {
                words.insert(variant.arch.to_string());
                words.insert(variant.cuda.to_string());
                words.insert(variant.torch.clone());
                words.insert(variant.compiler.kind.clone());
                words.insert(variant.compiler.version.clone());
                if let Some(family) = &variant.artifact.dictionary {
                    words.insert(family.clone());
                }
            }
            for skip in &record.skipped {
                words.insert(skip.arch.to_string());
                words.insert(skip.cuda.to_string());
                // A reason is mostly one of a few (`declared: …`, a toolchain's refusal),
                // shared by thousands of kernels.
                words.insert(skip.reason.clone());
            }
            // An include graph's files sit in a few folders (every one of FlashInfer's 15,970
            // cubins in one of four).
            for stable in record.inputs.files.keys() {
                if let Some((folder, _)) = stable.rsplit_once('/') {
                    words.insert(folder.to_owned());
                }
            }
        }
        let ids = words.into_iter().zip(0..).collect();
        Vocabulary { ids }
    }

    /// The words, in id order, as the file stores them.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Out::default();
        out.number(self.ids.len() as u64);
        for word in self.ids.keys() {
            out.digest(word);
        }
        out.0
    }

    pub(super) fn id(&self, word: &str) -> u64 {
        self.ids[word]
    }
}

/// The vocabulary of an open file: its bytes and where each word lies. A word is decoded
/// when a record names it, so an open costs one pass over the words however many families a
/// library has.
#[derive(Debug)]
pub(in crate::lookup) struct Words {
    bytes: Vec<u8>,
    /// Each word's span in `bytes`, and whether it is a digest's 32 bytes (else UTF-8 text).
    spans: Vec<(u32, u32, bool)>,
}

impl Words {
    /// Indexes a vocabulary as [`Vocabulary::encode`] writes it, checking every word: a
    /// digest's 32 bytes or UTF-8 text, and nothing past the last word.
    pub fn read(bytes: Vec<u8>) -> Read<Words> {
        // Indexing decodes nothing: the words stay in `bytes`, spans are reserved below.
        let nothing = Decoded::new(u64::MAX, "the vocabulary");
        let mut input = In::new(&bytes, &nothing);
        let count = input.count()?;
        // A word takes at least two bytes: nothing reserved past what the section can hold.
        let mut spans = Vec::with_capacity(count.min(bytes.len() as u64 / 2) as usize);
        for _ in 0..count {
            let text = input.flag()?;
            let length = if text { input.number()? } else { 32 };
            let start = input.at as u32;
            let word = input.take(length)?;
            if text && std::str::from_utf8(word).is_err() {
                return Err(format!(
                    "has a word that is not UTF-8 before byte {}",
                    input.at
                ));
            }
            spans.push((start, input.at as u32, !text));
        }
        input.end()?;
        Ok(Words { bytes, spans })
    }

    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// Word `id` as stored: its text, or a digest's 32 bytes; `None` past the vocabulary.
    fn stored(&self, id: u64) -> Option<Result<&str, &[u8]>> {
        let &(start, end, digest) = self.spans.get(usize::try_from(id).ok()?)?;
        let bytes = &self.bytes[start as usize..end as usize];
        // Text was checked to be UTF-8 when the vocabulary was read.
        Some(if digest {
            Err(bytes)
        } else {
            Ok(std::str::from_utf8(bytes).ok()?)
        })
    }

    /// Word `id`, or `None` past the vocabulary.
    pub fn get(&self, id: u64) -> Option<Cow<'_, str>> {
        Some(match self.stored(id)? {
            Ok(text) => Cow::Borrowed(text),
            Err(raw) => Cow::Owned(hex_digest(raw)),
        })
    }

    /// Whether `word` is one of the words, which the writer sorts; `false` for a crafted,
    /// unsorted vocabulary. Allocates nothing.
    pub fn contains(&self, word: &str) -> bool {
        let (mut low, mut high) = (0, self.spans.len());
        let mut hex;
        while low < high {
            let middle = low + (high - low) / 2;
            let found = match self.stored(middle as u64) {
                None => return false,
                Some(Ok(text)) => text.as_bytes(),
                Some(Err(raw)) => {
                    hex = hex_on_stack(raw);
                    &hex[..]
                }
            };
            match found.cmp(word.as_bytes()) {
                std::cmp::Ordering::Less => low = middle + 1,
                std::cmp::Ordering::Greater => high = middle,
                std::cmp::Ordering::Equal => return true,
            }
        }
        false
    }
}
