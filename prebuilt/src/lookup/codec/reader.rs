//! Reading a record's bytes: [`In`], which refuses a short or overlong field with a reason,
//! and [`Decoded`], the budget every string, vector and map entry it makes is charged to.

use std::borrow::Cow;
use std::cell::Cell;
use std::collections::BTreeMap;

use super::{hex_digest, Words};

/// What one decoded string, vector or map entry takes in memory besides its bytes: its
/// header and the allocator's rounding. Charged with every one a record makes, so that many
/// empty names cost what they hold in memory, not the nothing their bytes count.
pub(in crate::lookup) const HELD: u64 = 32;

/// The bytes that decoded records may still take in memory: one for a whole-index read, which
/// every record, every graph and every copy of a graph is charged to, or one per lookup. A
/// record is refused as soon as what it decodes to would pass the cap, before it is made.
#[derive(Debug)]
pub(in crate::lookup) struct Decoded {
    left: Cell<u64>,
    cap: u64,
    /// What the cap bounds, as a refusal names it (`a whole index`).
    of: &'static str,
}

impl Decoded {
    pub fn new(cap: u64, of: &'static str) -> Decoded {
        Decoded {
            left: Cell::new(cap),
            cap,
            of,
        }
    }

    /// Bytes charged so far.
    pub fn used(&self) -> u64 {
        self.cap - self.left.get()
    }

    /// Takes `bytes` from what is left, or refuses naming the cap.
    pub fn charge(&self, bytes: u64) -> Read<()> {
        let left = self.left.get();
        if bytes > left {
            return Err(format!(
                "decodes past the {}-byte cap on {} in memory",
                self.cap, self.of
            ));
        }
        self.left.set(left - bytes);
        Ok(())
    }
}

/// Bytes being read; every failure is a short reason.
pub(in crate::lookup) struct In<'a> {
    bytes: &'a [u8],
    pub at: usize,
    /// Bytes of vocabulary words the record may still copy out (a few bytes of the record
    /// name a word of up to the vocabulary's size): [`names_budget`] of the record.
    words_left: u64,
    /// What everything decoded is charged to.
    decoded: &'a Decoded,
}

pub(in crate::lookup) type Read<T> = Result<T, String>;

impl<'a> In<'a> {
    pub fn new(bytes: &'a [u8], decoded: &'a Decoded) -> In<'a> {
        In {
            bytes,
            at: 0,
            words_left: names_budget(bytes),
            decoded,
        }
    }

    /// Charges a value of `bytes` bytes held in one allocation.
    pub fn held(&self, bytes: u64) -> Read<()> {
        self.decoded.charge(bytes.saturating_add(HELD))
    }

    pub fn byte(&mut self) -> Read<u8> {
        let byte = *self
            .bytes
            .get(self.at)
            .ok_or_else(|| format!("ends inside a field at byte {}", self.at))?;
        self.at += 1;
        Ok(byte)
    }

    pub fn take(&mut self, length: u64) -> Read<&'a [u8]> {
        let left = (self.bytes.len() - self.at) as u64;
        if length > left {
            return Err(format!(
                "claims {length} bytes at byte {} where {left} are left",
                self.at
            ));
        }
        let slice = &self.bytes[self.at..self.at + length as usize];
        self.at += length as usize;
        Ok(slice)
    }

    pub fn number(&mut self) -> Read<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.byte()?;
            let bits = u64::from(byte & 0x7f);
            if shift == 63 && bits > 1 {
                break;
            }
            value |= bits << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(format!("has a number over 64 bits at byte {}", self.at))
    }

    /// A count of things of at least one byte each: never more than the bytes left.
    pub fn count(&mut self) -> Read<u64> {
        let count = self.number()?;
        if count > (self.bytes.len() - self.at) as u64 {
            return Err(format!(
                "counts {count} items at byte {} with fewer bytes left",
                self.at
            ));
        }
        Ok(count)
    }

    pub fn flag(&mut self) -> Read<bool> {
        match self.byte()? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(format!("has flag {other} at byte {}", self.at - 1)),
        }
    }

    pub fn text(&mut self) -> Read<String> {
        let length = self.number()?;
        let bytes = self.take(length)?;
        self.held(length)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| format!("has text that is not UTF-8 before byte {}", self.at))
    }

    pub fn texts(&mut self) -> Read<Vec<String>> {
        self.held(0)?;
        (0..self.count()?).map(|_| self.text()).collect()
    }

    pub fn map(&mut self) -> Read<BTreeMap<String, String>> {
        let mut map = BTreeMap::new();
        for _ in 0..self.count()? {
            // The map's node, beside its two strings.
            self.held(0)?;
            let name = self.text()?;
            let value = self.text()?;
            if map.insert(name, value).is_some() {
                return Err(format!("names a key twice before byte {}", self.at));
            }
        }
        Ok(map)
    }

    pub fn digest(&mut self) -> Read<String> {
        if self.flag()? {
            return self.text();
        }
        let raw = self.take(32)?;
        self.held(64)?;
        Ok(hex_digest(raw))
    }

    pub fn word<'w>(&mut self, words: &'w Words) -> Read<Cow<'w, str>> {
        let id = self.number()?;
        self.copied(words.get(id), || {
            format!("names word {id} of a vocabulary of {}", words.len())
        })
    }

    /// `word`, a vocabulary word the record names (`missing` when it names none), charged to
    /// what the record may copy out of the vocabulary.
    pub fn copied<'w>(
        &mut self,
        word: Option<Cow<'w, str>>,
        missing: impl FnOnce() -> String,
    ) -> Read<Cow<'w, str>> {
        let word = word.ok_or_else(missing)?;
        let length = word.len() as u64;
        if length > self.words_left {
            return Err(format!(
                "copies more than {} bytes of vocabulary words",
                names_budget(self.bytes)
            ));
        }
        self.words_left -= length;
        // Kept as a string of its own by most callers: charged as one.
        self.held(length)?;
        Ok(word)
    }

    pub fn parsed<T: std::str::FromStr>(&mut self, words: &Words) -> Read<T> {
        let word = self.word(words)?;
        word.parse()
            .map_err(|_| format!("names `{word}` where an arch or a CUDA build goes"))
    }

    pub fn end(&self) -> Read<()> {
        if self.at == self.bytes.len() {
            Ok(())
        } else {
            Err(format!(
                "has {} bytes past its last field",
                self.bytes.len() - self.at
            ))
        }
    }
}

/// The most bytes a load record's function names may repeat from earlier ones, the most its
/// variants' copies of their function sets may hold, and the most any record may copy out of
/// the vocabulary (skip reasons, family digests, graph folders), each: 1 MiB and 256 bytes
/// per byte of the record. A kernel's entries, however long their C++ names, come to far
/// less; a record cannot make reading it cost much more than its size.
pub(in crate::lookup) fn names_budget(record: &[u8]) -> u64 {
    (1 << 20) + 256 * record.len() as u64
}
