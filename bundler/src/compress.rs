//! Compression of a bundle's cubins against references: other cubins of their own family.
//!
//! A kernel library ships whole families of template instantiations: the cubins of one family
//! share most of their code and data, but one trained dictionary for the whole bundle captures
//! little of it (its size is capped and its content averaged over every family). Here each
//! cubin is compressed against the *raw bytes* of a similar cubin of its own family, so zstd
//! finds the long matches that a solid archive finds, while every cubin stays readable alone
//! with at most one extra read:
//!
//! ```text
//! corpus (streamed: one pass, only sketches kept) ─► MinHash sketch of every cubin
//!    │
//!    ▼
//! references: greedy coverage of the sketches, one per CUBINS_PER_REFERENCE cubins
//!    │
//!    ├─ References::Cubins (the writer's):  a reference IS a shipped cubin; its own artifact
//!    │     is a plain frame, and every cubin closest to it is one frame whose raw-content
//!    │     prefix is that cubin. No byte is stored twice; a reader decodes the reference's
//!    │     frame (one cubin) and then the frame it wants.
//!    └─ References::Dictionaries (format 3): a few references concatenated into a
//!          dictionary stored as its own plain frame, the prefix of the frames closest to it.
//! ```
//!
//! | step | rule | why |
//! | --- | --- | --- |
//! | sketch | 64 MinHashes of the cubin's distinct aligned 8-byte words | SASS and ELF tables are 8-byte aligned; the estimate costs one pass and 512 bytes a cubin |
//! | slices | corpora over [`MAX_SLICE`] cubins are cut into slices ordered by sketch | the pairwise similarities of a slice fit in memory; siblings share their first MinHashes |
//! | references | greedy facility location: add the cubin that raises the summed best similarity most, one per [`CUBINS_PER_REFERENCE`] cubins | every cubin gets a close reference, families big and small |
//! | frame | against its most similar reference; also plain when that reference is not close ([`CLOSE`]) or [`Settings::compare_plain`], the smaller kept | a cubin unlike its family pays nothing |
//! | levels | references and plain frames at [`Settings::level`], frames against a reference at [`Settings::member_level`] | the bundle writer gives both level 19: a frame against a close sibling is mostly long matches, which level 9 finds in a third of the time, but level 19 writes frames 11 % smaller |
//!
//! Memory: the plan never holds the corpus. It reads each cubin through a [`Corpus`] once to
//! sketch it and once more to compress it (a reference once per frame it is the prefix of, a
//! group at a time per thread), and keeps only sketches and the compressed frames.
//!
//! Everything is a pure function of the artifacts' keys and bytes: keys are sorted, every tie
//! is broken by key order, the hash constants are fixed, and the thread count changes only the
//! schedule. The reader needs, per frame, the sha256 of its prefix's raw content: a shipped
//! cubin's digest (its artifact is that prefix, as a plain frame) or a dictionary's
//! ([`Dictionary::digest`]); see [`prebuilt::bundle::read_prefix`]. The numbers on production
//! cubins come from `cargo bench -p bundler --bench production` and `--bench compression`.

use prebuilt::untrusted::Unreadable;
use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use rayon::prelude::*;
use sha2::{Digest as _, Sha256};
use zstd::zstd_safe::{self, CParameter};

use crate::error::Error;

/// Cubins per reference: one in eight keeps a close sibling within reach of nearly every cubin
/// of a family while the references' own frames stay a small part of the bundle.
pub const CUBINS_PER_REFERENCE: usize = 8;
/// References per dictionary, with [`References::Dictionaries`].
pub const MAX_GROUP_REFERENCES: usize = 4;
/// Upper bound of a dictionary's raw size, which is what a reader decompresses before the first
/// cubin of a family, with [`References::Dictionaries`].
pub const MAX_DICTIONARY_BYTES: usize = 256 * 1024;
/// Fewer cubins than this are compressed plain: there is no family to exploit.
pub const MIN_CUBINS: usize = 8;
/// Estimated similarity (in sixty-fourths) from which a frame against a reference is taken
/// without also compressing the cubin plain: at and above it the reference always won on
/// production cubins.
pub const CLOSE: u32 = 24;
/// Largest corpus slice whose pairwise similarities are computed at once; bigger corpora are cut
/// into slices of cubins ordered by sketch, so similar cubins land in the same slice.
const MAX_SLICE: usize = 4096;
/// MinHash functions per sketch.
const SKETCH_HASHES: usize = 64;

/// The cubins to compress: unique keys in ascending order, each read on demand.
pub trait Corpus: Sync {
    /// How many cubins there are.
    fn count(&self) -> usize;
    /// The key of cubin `index` (keys are unique and ascending).
    fn key(&self, index: usize) -> &str;
    /// The bytes of cubin `index`.
    fn read(&self, index: usize) -> Result<Cow<'_, [u8]>, Error>;
    /// The partition of cubin `index`: a frame's reference is always a cubin of its own
    /// partition, so what is shipped apart (a CUDA build and target of a slim wheel or a
    /// registry-sized part) decodes without the others. One partition unless overridden.
    fn partition(&self, _index: usize) -> &str {
        ""
    }
}

/// A corpus whose cubins are partitioned by a label per cubin (for the writer: the variant's
/// `cuda/arch`), given in the corpus's order.
pub struct Partitioned<'a> {
    /// The cubins.
    pub corpus: &'a dyn Corpus,
    /// One label per cubin of `corpus`.
    pub labels: Vec<String>,
}

impl Corpus for Partitioned<'_> {
    fn count(&self) -> usize {
        self.corpus.count()
    }
    fn key(&self, index: usize) -> &str {
        self.corpus.key(index)
    }
    fn read(&self, index: usize) -> Result<Cow<'_, [u8]>, Error> {
        self.corpus.read(index)
    }
    fn partition(&self, index: usize) -> &str {
        &self.labels[index]
    }
}

/// Cubins in memory, as (key, bytes) sorted by key.
impl Corpus for Vec<(&str, &[u8])> {
    fn count(&self) -> usize {
        self.len()
    }
    fn key(&self, index: usize) -> &str {
        self[index].0
    }
    fn read(&self, index: usize) -> Result<Cow<'_, [u8]>, Error> {
        Ok(Cow::Borrowed(self[index].1))
    }
}

/// Cubins in files, read when needed: (key, path), sorted by key and deduplicated here.
#[derive(Clone, Debug, Default)]
pub struct FileCorpus {
    entries: Vec<(String, PathBuf)>,
    /// Whether each key is the sha256 of its file, checked on every read.
    verified: bool,
}

impl FileCorpus {
    /// The corpus of these (key, path) pairs; a key given twice keeps its first path.
    pub fn new(mut entries: Vec<(String, PathBuf)>) -> FileCorpus {
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        entries.dedup_by(|later, earlier| later.0 == earlier.0);
        FileCorpus {
            entries,
            verified: false,
        }
    }

    /// [`FileCorpus::new`] of (sha256, path) pairs, each file checked against its digest
    /// whenever it is read: the build cache's entries, which another build may replace.
    pub fn verified(entries: Vec<(String, PathBuf)>) -> FileCorpus {
        FileCorpus {
            verified: true,
            ..FileCorpus::new(entries)
        }
    }
}

impl Corpus for FileCorpus {
    fn count(&self) -> usize {
        self.entries.len()
    }
    fn key(&self, index: usize) -> &str {
        &self.entries[index].0
    }
    fn read(&self, index: usize) -> Result<Cow<'_, [u8]>, Error> {
        let (key, path) = &self.entries[index];
        let bytes = std::fs::read(path).map_err(|source| {
            Error::Read(Unreadable {
                path: path.clone(),
                source,
            })
        })?;
        if self.verified {
            let actual = prebuilt::key::sha256_hex(&bytes);
            if actual != *key {
                return Err(Error::ChangedFile {
                    path: path.clone(),
                    expected: key.clone(),
                    actual,
                });
            }
        }
        Ok(Cow::Owned(bytes))
    }
}

/// What a frame's prefix is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum References {
    /// Shipped cubins: a reference's own frame is plain, and is the prefix (index format 4).
    Cubins,
    /// Dictionaries of up to [`MAX_GROUP_REFERENCES`] references, each its own plain frame
    /// (index format 3).
    Dictionaries,
}

/// How [`plan_corpus`] compresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// zstd level of plain frames (references, dictionaries, cubins without a close reference).
    pub level: i32,
    /// zstd level of frames against a reference.
    pub member_level: i32,
    /// What the prefixes are.
    pub references: References,
    /// Also compress every cubin plain and keep the smaller frame, and drop a dictionary that
    /// does not pay for itself: exact, for small corpora; otherwise only cubins without a close
    /// reference are compressed both ways.
    pub compare_plain: bool,
    /// Threads (the output does not depend on it).
    pub jobs: usize,
}

impl Settings {
    /// Everything at `level`, cubin references, every choice exact.
    pub fn exact(level: i32, jobs: usize) -> Settings {
        Settings {
            level,
            member_level: level,
            references: References::Cubins,
            compare_plain: true,
            jobs,
        }
    }
}

/// A plan's progress: the stage, and how many of its cubins are done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Reading and sketching every cubin.
    Sketch,
    /// Compressing every cubin.
    Compress,
}

/// The compressed form of a set of artifacts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompressionPlan {
    /// Dictionaries, in an order fixed by the artifacts' keys (by their first reference).
    pub dictionaries: Vec<Dictionary>,
    /// One frame per artifact, by the artifact's key as given.
    pub frames: BTreeMap<String, Frame>,
}

/// A raw-content dictionary: the concatenated bytes of a group of reference cubins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dictionary {
    /// sha256 (hex) of the raw dictionary content, which a reader verifies after decompressing.
    pub digest: String,
    /// Size of the raw content in bytes.
    pub size: u64,
    /// The raw content as one plain zstd frame (level as the cubins, checksum on).
    pub stored: Vec<u8>,
}

/// What a frame was compressed against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prefix {
    /// The dictionary at this index of [`CompressionPlan::dictionaries`].
    Dictionary(usize),
    /// The cubin with this key, whose own frame is plain.
    Cubin(String),
}

/// One artifact's zstd frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The raw-content prefix the frame needs, if any.
    pub prefix: Option<Prefix>,
    /// The zstd frame (checksum and content size in its header).
    pub bytes: Vec<u8>,
}

impl CompressionPlan {
    /// Total stored bytes: every frame plus every dictionary, each counted once.
    pub fn stored_size(&self) -> usize {
        self.dictionaries
            .iter()
            .map(|d| d.stored.len())
            .sum::<usize>()
            + self.frames.values().map(|f| f.bytes.len()).sum::<usize>()
    }
}

/// Compresses `artifacts` (key, bytes) at zstd `level` against cubin references where they
/// pay, every choice exact, on up to `jobs` threads. Keys must be unique; the output depends
/// only on the keys and bytes, not on their order or on `jobs`.
pub fn plan_compression(artifacts: &[(&str, &[u8])], level: i32, jobs: usize) -> CompressionPlan {
    plan_in_memory(artifacts, &Settings::exact(level, jobs))
}

/// [`plan_compression`] with these settings.
pub fn plan_in_memory(artifacts: &[(&str, &[u8])], settings: &Settings) -> CompressionPlan {
    let mut sorted: Vec<(&str, &[u8])> = artifacts.to_vec();
    sorted.sort_by(|a, b| a.0.cmp(b.0));
    plan_corpus(&sorted, settings, &|_, _, _| {}).expect("cubins in memory are always readable")
}

/// Each of `samples` alone as one zstd frame at `level` (checksum and content size on), in
/// order: what a cubin costs without a dictionary.
pub fn plain_frames(samples: &[&[u8]], level: i32, jobs: usize) -> Vec<Vec<u8>> {
    run_parallel(samples, jobs, |bytes| compress_one(bytes, None, level))
}

/// Plans the compression of `corpus` (see the module docs), reporting `progress(stage, done,
/// of)` as cubins are sketched and compressed. Fails only when a cubin cannot be read.
pub fn plan_corpus(
    corpus: &dyn Corpus,
    settings: &Settings,
    progress: &(dyn Fn(Stage, usize, usize) + Sync),
) -> Result<CompressionPlan, Error> {
    let count = corpus.count();
    debug_assert!((1..count).all(|i| corpus.key(i - 1) < corpus.key(i)));
    let indices: Vec<usize> = (0..count).collect();
    let done = AtomicUsize::new(0);
    let tick = |stage| progress(stage, done.fetch_add(1, Ordering::Relaxed) + 1, count);
    let key = |i: usize| corpus.key(i).to_owned();
    if count < MIN_CUBINS {
        let frames = run_parallel(&indices, settings.jobs, |&i| {
            let bytes = corpus.read(i)?;
            tick(Stage::Compress);
            Ok(compress_one(&bytes, None, settings.level))
        });
        let frames = frames.into_iter().collect::<Result<Vec<_>, Error>>()?;
        return Ok(CompressionPlan {
            dictionaries: Vec::new(),
            frames: frames
                .into_iter()
                .enumerate()
                .map(|(i, bytes)| {
                    let frame = Frame {
                        prefix: None,
                        bytes,
                    };
                    (key(i), frame)
                })
                .collect(),
        });
    }
    let sketched = run_parallel(&indices, settings.jobs, |&i| {
        let bytes = corpus.read(i)?;
        tick(Stage::Sketch);
        Ok((sketch(&bytes), bytes.len()))
    });
    let sketched = sketched.into_iter().collect::<Result<Vec<_>, Error>>()?;
    let (sketches, sizes): (Vec<Sketch>, Vec<usize>) = sketched.into_iter().unzip();
    let max_references = match settings.references {
        References::Cubins => 1,
        References::Dictionaries => MAX_GROUP_REFERENCES,
    };
    let mut groups = Vec::new();
    let mut grouped = vec![false; count];
    let pool = thread_pool(settings.jobs, count);
    for slice in slices(corpus, &sketches) {
        let slice_groups = pool.install(|| group_slice(&slice, &sketches, &sizes, max_references));
        for group in slice_groups {
            for &(member, _) in &group.members {
                grouped[member] = true;
            }
            groups.push(group);
        }
    }
    // Cubins no reference covers at all are groups of their own: plain frames.
    groups.extend((0..count).filter(|&i| !grouped[i]).map(|i| Group {
        references: Vec::new(),
        members: vec![(i, 0)],
    }));
    done.store(0, Ordering::Relaxed);
    let compressed = run_parallel(&groups, settings.jobs, |group| {
        compress_group(corpus, group, settings, &|| tick(Stage::Compress))
    });
    let mut dictionaries = Vec::new();
    let mut frames: BTreeMap<String, Frame> = BTreeMap::new();
    for (group, outcome) in groups.iter().zip(compressed) {
        let outcome = outcome?;
        let dictionary = outcome.dictionary.map(|dictionary| {
            dictionaries.push(dictionary);
            dictionaries.len() - 1
        });
        for (&(member, _), (bytes, against)) in group.members.iter().zip(outcome.frames) {
            let prefix = match (against, settings.references, dictionary) {
                (false, _, _) => None,
                (true, References::Cubins, _) => Some(Prefix::Cubin(key(group.references[0]))),
                (true, References::Dictionaries, Some(index)) => Some(Prefix::Dictionary(index)),
                (true, References::Dictionaries, None) => unreachable!("a frame of a kept group"),
            };
            frames.insert(key(member), Frame { prefix, bytes });
        }
    }
    Ok(CompressionPlan {
        dictionaries,
        frames,
    })
}

/// A group's frames, in member order: (bytes, whether against the group's prefix); and its
/// dictionary, when it keeps one.
struct GroupFrames {
    frames: Vec<(Vec<u8>, bool)>,
    dictionary: Option<Dictionary>,
}

fn compress_group(
    corpus: &dyn Corpus,
    group: &Group,
    settings: &Settings,
    tick: &(dyn Fn() + Sync),
) -> Result<GroupFrames, Error> {
    let mut prefix = Vec::new();
    for &reference in &group.references {
        prefix.extend_from_slice(&corpus.read(reference)?);
    }
    let mut frames = Vec::with_capacity(group.members.len());
    let mut plain_total = 0;
    let mut tables = None;
    for &(member, similarity) in &group.members {
        let cubin = corpus.read(member)?;
        let is_reference =
            settings.references == References::Cubins && group.references.first() == Some(&member);
        let frame = if group.references.is_empty() || is_reference {
            (compress_one(&cubin, None, settings.level), false)
        } else {
            let tables = tables.get_or_insert_with(|| PrefixTables::new(&prefix, settings));
            let against = tables.compress(&cubin);
            if settings.compare_plain || similarity < CLOSE {
                let plain = compress_one(&cubin, None, settings.level);
                plain_total += plain.len();
                if plain.len() <= against.len() {
                    (plain, false)
                } else {
                    (against, true)
                }
            } else {
                (against, true)
            }
        };
        frames.push(frame);
        tick();
    }
    if settings.references == References::Cubins || group.references.is_empty() {
        return Ok(GroupFrames {
            frames,
            dictionary: None,
        });
    }
    // A dictionary (always against: a reference's own frame is tiny against it).
    let stored = compress_one(&prefix, None, settings.level);
    let chosen: usize = frames.iter().map(|(bytes, _)| bytes.len()).sum();
    if settings.compare_plain && stored.len() + chosen >= plain_total {
        // It does not pay: every member plain (the plain frames were made above).
        let mut plain = Vec::with_capacity(frames.len());
        for &(member, _) in &group.members {
            plain.push((
                compress_one(&corpus.read(member)?, None, settings.level),
                false,
            ));
        }
        return Ok(GroupFrames {
            frames: plain,
            dictionary: None,
        });
    }
    Ok(GroupFrames {
        frames,
        dictionary: Some(Dictionary {
            digest: hex::encode(Sha256::digest(&prefix)),
            size: prefix.len() as u64,
            stored,
        }),
    })
}

type Sketch = [u64; SKETCH_HASHES];

/// MinHash of the distinct little-endian 8-byte words at 8-byte offsets.
fn sketch(bytes: &[u8]) -> Sketch {
    let mut words: Vec<u64> = bytes
        .chunks_exact(8)
        .map(|word| u64::from_le_bytes(word.try_into().expect("chunks of eight")))
        .collect();
    words.sort_unstable();
    words.dedup();
    let mut out = [u64::MAX; SKETCH_HASHES];
    let mut state = 0x6b77_6865_656c_0001_u64;
    for slot in &mut out {
        // Fixed multipliers from splitmix64, so sketches are identical on every machine.
        let multiplier = splitmix64(&mut state) | 1;
        let offset = splitmix64(&mut state);
        for &word in &words {
            let mut hash = word.wrapping_mul(multiplier).wrapping_add(offset);
            hash ^= hash >> 31;
            *slot = (*slot).min(hash);
        }
    }
    out
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Estimated Jaccard similarity in sixty-fourths.
fn similarity(a: &Sketch, b: &Sketch) -> u32 {
    a.iter().zip(b).filter(|(x, y)| x == y).count() as u32
}

/// Cuts the corpus into slices: one partition each ([`Corpus::partition`], in label order), a
/// partition over [`MAX_SLICE`] cubins cut into slices ordered by sketch so that cubins sharing
/// their first MinHashes (likely siblings) share a slice.
fn slices(corpus: &dyn Corpus, sketches: &[Sketch]) -> Vec<Vec<usize>> {
    let mut partitions: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for index in 0..sketches.len() {
        partitions
            .entry(corpus.partition(index))
            .or_default()
            .push(index);
    }
    let mut slices = Vec::new();
    for mut order in partitions.into_values() {
        if order.len() > MAX_SLICE {
            order.sort_by(|&a, &b| sketches[a].cmp(&sketches[b]).then(a.cmp(&b)));
        }
        let count = order.len().div_ceil(MAX_SLICE).max(1);
        let size = order.len().div_ceil(count).max(1);
        slices.extend(order.chunks(size).map(|chunk| {
            let mut chunk = chunk.to_vec();
            chunk.sort_unstable();
            chunk
        }));
    }
    slices
}

/// A prefix's references (corpus indices) and the cubins compressed against it (references
/// included), each with its estimated similarity to its closest reference.
struct Group {
    references: Vec<usize>,
    members: Vec<(usize, u32)>,
}

/// Chooses references by greedy facility location (lazy evaluation, ties to the lower index),
/// groups up to `max_references` of them, and assigns every cubin of the slice to the group of
/// its closest reference.
fn group_slice(
    slice: &[usize],
    sketches: &[Sketch],
    sizes: &[usize],
    max_references: usize,
) -> Vec<Group> {
    let n = slice.len();
    let matrix: Vec<u8> = (0..n * n)
        .into_par_iter()
        .map(|cell| similarity(&sketches[slice[cell / n]], &sketches[slice[cell % n]]) as u8)
        .collect();
    let at = |i: usize, j: usize| u32::from(matrix[i * n + j]);
    let wanted = n.div_ceil(CUBINS_PER_REFERENCE);
    let mut cover = vec![0u32; n];
    let mut chosen: Vec<usize> = Vec::new();
    let gain = |j: usize, cover: &[u32]| -> u64 {
        (0..n)
            .map(|i| at(i, j).saturating_sub(cover[i]) as u64)
            .sum()
    };
    // Gains only shrink as references are added, so a stale gain is an upper bound.
    let mut heap: BinaryHeap<(u64, Reverse<usize>)> =
        (0..n).map(|j| (gain(j, &cover), Reverse(j))).collect();
    while chosen.len() < wanted {
        let Some((_, Reverse(j))) = heap.pop() else {
            break;
        };
        let fresh = gain(j, &cover);
        if heap.peek().is_some_and(|&top| top > (fresh, Reverse(j))) {
            heap.push((fresh, Reverse(j)));
            continue;
        }
        if fresh == 0 {
            break;
        }
        chosen.push(j);
        for (i, covered) in cover.iter_mut().enumerate() {
            *covered = (*covered).max(at(i, j));
        }
    }
    chosen.sort_unstable();
    // Groups: the lowest unassigned reference and its most similar unassigned references.
    let mut unassigned = chosen.clone();
    let mut groups: Vec<Group> = Vec::new();
    let mut group_of = vec![usize::MAX; n];
    while let Some(&first) = unassigned.first() {
        unassigned.remove(0);
        let mut candidates = unassigned.clone();
        candidates.sort_by_key(|&k| (Reverse(at(first, k)), k));
        let mut references = vec![first];
        let mut bytes = sizes[slice[first]];
        for k in candidates {
            if references.len() == max_references {
                break;
            }
            let size = sizes[slice[k]];
            if bytes + size <= MAX_DICTIONARY_BYTES {
                bytes += size;
                references.push(k);
            }
        }
        unassigned.retain(|k| !references.contains(k));
        for &r in &references {
            group_of[r] = groups.len();
        }
        groups.push(Group {
            references,
            members: Vec::new(),
        });
    }
    for i in 0..n {
        // Closest reference; ties to the lower index (max_by_key keeps the last maximum). A
        // reference is its own closest (similarity 64, lowest index among equals first).
        let Some(&best) = chosen.iter().rev().max_by_key(|&&r| (at(i, r), r == i)) else {
            continue;
        };
        groups[group_of[best]].members.push((i, at(i, best)));
    }
    groups
        .into_iter()
        .map(|group| Group {
            references: group.references.iter().map(|&i| slice[i]).collect(),
            members: group
                .members
                .iter()
                .map(|&(i, similarity)| (slice[i], similarity))
                .collect(),
        })
        .collect()
}

/// One zstd frame of `bytes` at `level` against the raw-content `prefix`, if any.
pub fn compress_one(bytes: &[u8], prefix: Option<&[u8]>, level: i32) -> Vec<u8> {
    let mut context = zstd_safe::CCtx::create();
    // The window must reach from the end of the cubin back to the start of its prefix; zstd
    // would otherwise shrink it to fit the cubin alone and forget the prefix.
    let reach = bytes.len() + prefix.map_or(0, <[u8]>::len);
    let window_log = (usize::BITS - reach.max(1).leading_zeros()).clamp(10, 27);
    for parameter in [
        CParameter::CompressionLevel(level),
        CParameter::WindowLog(window_log),
        CParameter::ChecksumFlag(true),
        CParameter::ContentSizeFlag(true),
    ] {
        context
            .set_parameter(parameter)
            .expect("zstd accepts the level, a window of 2^10..2^27 and the flags");
    }
    if let Some(prefix) = prefix {
        context
            .ref_prefix(prefix)
            .expect("zstd accepts any bytes as a raw-content prefix");
    }
    compress_frame(&mut context, bytes)
}

/// `bytes` as one frame of the configured `context`.
fn compress_frame(context: &mut zstd_safe::CCtx<'_>, bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(zstd_safe::compress_bound(bytes.len()));
    context
        .compress2(&mut out, bytes)
        .expect("the output buffer holds zstd's bound");
    // A plan holds every frame: at zstd's bound each would keep a cubin's size of memory.
    out.shrink_to_fit();
    out
}

/// A prefix indexed once at the member level, for every frame compressed against it: zstd
/// would otherwise index the prefix again for each frame, which costs as much as the frame.
/// Its raw content (no dictionary header) is referenced as a prefix is, so the frames decode
/// against the same bytes ([`prebuilt::bundle::decompress_with_prefix`]).
struct PrefixTables<'p> {
    prefix: &'p [u8],
    level: i32,
    /// `None` for content that starts like a zstd dictionary, which zstd would parse as one:
    /// such a prefix is referenced for each frame instead.
    tables: Option<zstd_safe::CDict<'static>>,
}

impl<'p> PrefixTables<'p> {
    fn new(prefix: &'p [u8], settings: &Settings) -> PrefixTables<'p> {
        let raw = prefix.get(..4) != Some(&0xEC30_A437u32.to_le_bytes()[..]);
        PrefixTables {
            prefix,
            level: settings.member_level,
            tables: raw.then(|| zstd_safe::CDict::create(prefix, settings.member_level)),
        }
    }

    fn compress(&self, bytes: &[u8]) -> Vec<u8> {
        let Some(tables) = &self.tables else {
            return compress_one(bytes, Some(self.prefix), self.level);
        };
        let mut context = zstd_safe::CCtx::create();
        for parameter in [
            CParameter::ChecksumFlag(true),
            CParameter::ContentSizeFlag(true),
        ] {
            context
                .set_parameter(parameter)
                .expect("zstd accepts the flags");
        }
        context
            .ref_cdict(tables)
            .expect("zstd accepts its own tables");
        compress_frame(&mut context, bytes)
    }
}

/// Maps `items` on a pool of up to `jobs` threads, keeping input order.
fn run_parallel<T: Sync, R: Send>(items: &[T], jobs: usize, f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    thread_pool(jobs, items.len()).install(|| items.par_iter().map(&f).collect())
}

/// The bundler's pool for `work` items: `jobs` threads (at least one), no more than there are
/// items. Results come back in input order whatever the pool's size, so the size changes only
/// the schedule, never a byte of output.
pub(crate) fn thread_pool(jobs: usize, work: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(jobs.max(1).min(work.max(1)))
        .build()
        .expect("the system starts the bundler's threads")
}

#[cfg(test)]
mod tests {
    use super::*;
    use prebuilt::bundle::decompress_with_prefix;

    /// Incompressible bytes on their own, from a fixed seed.
    fn noise(seed: u64, len: usize) -> Vec<u8> {
        let mut state = seed;
        (0..len.div_ceil(8))
            .flat_map(|_| splitmix64(&mut state).to_le_bytes())
            .take(len)
            .collect()
    }

    /// `families` families of `members` cubins each: a shared random template with a few
    /// member-specific patches, like template instantiations of one kernel.
    fn family_corpus(families: u64, members: u64) -> Vec<(String, Vec<u8>)> {
        let mut corpus = Vec::new();
        for family in 0..families {
            let template = noise(family + 1, 24 * 1024);
            for member in 0..members {
                let mut cubin = template.clone();
                let patch = noise(1000 + family * 100 + member, 512);
                let at = (member as usize * 997) % (cubin.len() - patch.len());
                cubin[at..at + patch.len()].copy_from_slice(&patch);
                corpus.push((format!("family{family}-member{member}"), cubin));
            }
        }
        corpus
    }

    fn borrowed(corpus: &[(String, Vec<u8>)]) -> Vec<(&str, &[u8])> {
        corpus
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect()
    }

    /// The raw content of a frame's prefix, as a reader gets it: a dictionary's plain frame,
    /// or the referenced cubin's own frame, which must be plain.
    fn prefix_content(
        plan: &CompressionPlan,
        prefix: &Prefix,
        sizes: &BTreeMap<&str, usize>,
    ) -> Vec<u8> {
        let content = match prefix {
            Prefix::Dictionary(index) => {
                let dictionary = &plan.dictionaries[*index];
                let content =
                    decompress_with_prefix(&dictionary.stored, &[], dictionary.size).unwrap();
                assert_eq!(hex::encode(Sha256::digest(&content)), dictionary.digest);
                content
            }
            Prefix::Cubin(key) => {
                let frame = &plan.frames[key];
                assert_eq!(frame.prefix, None, "a reference's own frame is plain");
                decompress_with_prefix(&frame.bytes, &[], sizes[key.as_str()] as u64).unwrap()
            }
        };
        content
    }

    /// Every frame of `plan` decodes to its cubin with at most one prefix read.
    fn assert_round_trip(plan: &CompressionPlan, corpus: &[(&str, &[u8])]) {
        let sizes: BTreeMap<&str, usize> = corpus.iter().map(|(k, v)| (*k, v.len())).collect();
        assert_eq!(plan.frames.len(), corpus.len());
        for (key, bytes) in corpus {
            let frame = &plan.frames[*key];
            let content = frame
                .prefix
                .as_ref()
                .map(|prefix| prefix_content(plan, prefix, &sizes));
            let decoded = decompress_with_prefix(
                &frame.bytes,
                content.as_deref().unwrap_or_default(),
                bytes.len() as u64,
            )
            .unwrap();
            assert_eq!(&decoded, bytes, "{key}");
        }
    }

    #[test]
    fn every_frame_decodes_with_only_its_own_prefix() {
        let corpus = family_corpus(3, 12);
        let raw: usize = corpus.iter().map(|(_, v)| v.len()).sum();
        for references in [References::Cubins, References::Dictionaries] {
            let settings = Settings {
                references,
                ..Settings::exact(3, 2)
            };
            let plan = plan_in_memory(&borrowed(&corpus), &settings);
            assert_round_trip(&plan, &borrowed(&corpus));
            let against = plan.frames.values().filter(|f| f.prefix.is_some()).count();
            assert!(
                against >= 30,
                "{references:?}: {against} frames use a prefix"
            );
            assert_eq!(
                plan.dictionaries.is_empty(),
                references == References::Cubins,
                "{references:?}"
            );
            // Random templates do not compress alone; against a sibling they nearly vanish.
            assert!(
                plan.stored_size() * 4 < raw,
                "{references:?}: {} of {raw}",
                plan.stored_size()
            );
        }
    }

    #[test]
    fn references_stay_inside_their_partition() {
        // One family whose members alternate between two labels (two CUDA builds of one
        // kernel, say): unpartitioned, members reference across labels.
        let corpus = family_corpus(1, 16);
        let label = |key: &str| {
            let member: u64 = key.rsplit("member").next().unwrap().parse().unwrap();
            ["cu129/sm_90a", "cu130/sm_90a"][(member % 2) as usize].to_owned()
        };
        let in_memory = borrowed(&corpus);
        let mut sorted = in_memory.clone();
        sorted.sort_by_key(|(key, _)| *key);
        let labels: Vec<String> = sorted.iter().map(|(key, _)| label(key)).collect();
        let crosses = |plan: &CompressionPlan| {
            plan.frames
                .iter()
                .filter(|(key, frame)| {
                    matches!(&frame.prefix, Some(Prefix::Cubin(r)) if label(r) != label(key))
                })
                .count()
        };
        let whole = plan_compression(&in_memory, 3, 2);
        assert!(crosses(&whole) > 0, "the family is one partition here");
        let partitioned = Partitioned {
            corpus: &sorted,
            labels,
        };
        let plan = plan_corpus(&partitioned, &Settings::exact(3, 2), &|_, _, _| {}).unwrap();
        assert_eq!(crosses(&plan), 0);
        assert_round_trip(&plan, &in_memory);
        for wanted in ["cu129/sm_90a", "cu130/sm_90a"] {
            let against = plan
                .frames
                .iter()
                .filter(|(key, frame)| label(key) == wanted && frame.prefix.is_some())
                .count();
            assert!(against >= 6, "{wanted}: {against} frames use a prefix");
        }
    }

    #[test]
    fn plan_depends_only_on_keys_and_bytes() {
        let corpus = family_corpus(2, 10);
        let mut reversed = corpus.clone();
        reversed.reverse();
        for references in [References::Cubins, References::Dictionaries] {
            let one = Settings {
                references,
                ..Settings::exact(3, 1)
            };
            let other = Settings { jobs: 3, ..one };
            assert_eq!(
                plan_in_memory(&borrowed(&corpus), &one),
                plan_in_memory(&borrowed(&reversed), &other)
            );
        }
    }

    #[test]
    fn small_or_unrelated_corpora_use_no_prefix() {
        let few = family_corpus(1, (MIN_CUBINS - 1) as u64);
        let plan = plan_compression(&borrowed(&few), 3, 2);
        assert!(plan.frames.values().all(|f| f.prefix.is_none()));
        let unrelated: Vec<(String, Vec<u8>)> = (0..12)
            .map(|i| (format!("k{i}"), noise(77 + i, 8 * 1024)))
            .collect();
        for references in [References::Cubins, References::Dictionaries] {
            let settings = Settings {
                references,
                ..Settings::exact(3, 2)
            };
            let plan = plan_in_memory(&borrowed(&unrelated), &settings);
            assert!(plan.dictionaries.is_empty());
            assert!(plan.frames.values().all(|f| f.prefix.is_none()));
            assert_round_trip(&plan, &borrowed(&unrelated));
        }
    }

    #[test]
    fn frame_needs_its_reference_and_respects_the_bound() {
        let corpus = family_corpus(1, 10);
        let plan = plan_compression(&borrowed(&corpus), 3, 2);
        let (key, bytes) = corpus
            .iter()
            .find(|(key, _)| plan.frames[key].prefix.is_some())
            .expect("a family member is compressed against a sibling");
        let frame = &plan.frames[key];
        let Some(Prefix::Cubin(reference)) = &frame.prefix else {
            panic!("{:?}", frame.prefix)
        };
        let sizes = corpus.iter().map(|(k, v)| (k.as_str(), v.len())).collect();
        let content = prefix_content(&plan, frame.prefix.as_ref().unwrap(), &sizes);
        assert_eq!(
            &content,
            &corpus.iter().find(|(k, _)| k == reference).unwrap().1
        );
        assert!(decompress_with_prefix(&frame.bytes, &[], bytes.len() as u64).is_err());
        // A prefix of the same size but other bytes: the frame's checksum catches it.
        let wrong: Vec<u8> = content.iter().map(|byte| byte ^ 0x55).collect();
        assert!(decompress_with_prefix(&frame.bytes, &wrong, bytes.len() as u64).is_err());
        assert_eq!(
            &decompress_with_prefix(&frame.bytes, &content, bytes.len() as u64).unwrap(),
            bytes
        );
        // A frame that declares more than the recorded size is refused before decoding.
        let error = decompress_with_prefix(&frame.bytes, &content, bytes.len() as u64 - 1);
        assert!(error.unwrap_err().to_string().contains("more than"));
        assert!(decompress_with_prefix(b"not a frame", &[], 1024).is_err());
    }

    /// Real cubins: the repository's fixtures (every toolkit and arch the product builds), and
    /// with `ci/bench-setup` run, a production GEMM family.
    fn real_cubins() -> Vec<(String, Vec<u8>)> {
        let workspace = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap();
        let mut found = Vec::new();
        for dir in [
            workspace.join("prebuilt/tests/fixtures/cubin"),
            workspace.join("prebuilt/tests/fixtures/stub"),
            prebuilt::cache::cache_home_or_unwritable().join(
                "kwheel/bench/flashinfer-cubin/cubins/flashinfer_cubin/cubins/\
                 10f64528a1172dae8e29601a3b99ab9dc78d37be/gemm-91e0ba0-2710384",
            ),
        ] {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                eprintln!(
                    "real cubins: {} absent (`bash ci/bench-setup`)",
                    dir.display()
                );
                continue;
            };
            let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
            paths.sort();
            for path in paths
                .into_iter()
                .filter(|p| p.extension().is_some_and(|e| e == "cubin"))
                .take(40)
            {
                let bytes = std::fs::read(&path).unwrap();
                found.push((hex::encode(Sha256::digest(&bytes)), bytes));
            }
        }
        found.sort();
        found.dedup_by(|a, b| a.0 == b.0);
        found
    }

    #[test]
    fn real_cubins_round_trip_and_plan_alike_from_files_and_memory() {
        let cubins = real_cubins();
        assert!(cubins.len() >= 12, "{} fixture cubins", cubins.len());
        let dir = tempfile::tempdir().unwrap();
        let files = FileCorpus::new(
            cubins
                .iter()
                .rev()
                .map(|(key, bytes)| {
                    let path = dir.path().join(key);
                    std::fs::write(&path, bytes).unwrap();
                    (key.clone(), path)
                })
                .collect(),
        );
        let settings = Settings {
            member_level: 1,
            compare_plain: false,
            ..Settings::exact(3, 2)
        };
        let in_memory = plan_in_memory(&borrowed(&cubins), &settings);
        assert_round_trip(&in_memory, &borrowed(&cubins));
        let from_files = plan_corpus(
            &files,
            &Settings {
                jobs: 1,
                ..settings
            },
            &|_, _, _| {},
        );
        assert_eq!(from_files.unwrap(), in_memory);
        let plain: usize = cubins
            .iter()
            .map(|(_, b)| compress_one(b, None, 3).len())
            .sum();
        assert!(
            in_memory.stored_size() < plain,
            "{} vs {plain}",
            in_memory.stored_size()
        );
    }

    #[test]
    fn an_unreadable_cubin_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("gone.cubin");
        let files = FileCorpus::new(vec![("a".repeat(64), missing.clone())]);
        let error = plan_corpus(&files, &Settings::exact(3, 1), &|_, _, _| {}).unwrap_err();
        assert!(
            matches!(&error, Error::Read(Unreadable { path, .. }) if *path == missing),
            "{error}"
        );
    }
}
