//! Compression of a bundle's cubins against per-family reference dictionaries.
//!
//! A kernel library ships whole families of template instantiations: the cubins of one family
//! share most of their code and data, but one trained dictionary for the whole bundle captures
//! little of it (its size is capped and its content averaged over every family). Here each
//! cubin is compressed against the *raw bytes* of a few similar cubins of its own family, so
//! zstd finds the long matches that a solid archive finds, while every cubin stays readable
//! alone with one extra read:
//!
//! ```text
//! cubins ─► MinHash sketch ─► references (greedy coverage) ─► groups of similar references
//!    │                                                              │
//!    │                         dictionary = raw concatenation of one group's references,
//!    │                         stored once as its own plain zstd frame
//!    ▼                                                              ▼
//! frame of each cubin = zstd level 19, raw-content prefix = its group's dictionary (or none)
//! ```
//!
//! | step | rule | why |
//! | --- | --- | --- |
//! | sketch | 64 MinHashes of the cubin's distinct aligned 8-byte words | SASS and ELF tables are 8-byte aligned; the estimate costs one pass |
//! | references | greedy facility location: add the cubin that raises the summed best similarity most, one per [`CUBINS_PER_REFERENCE`] cubins | every cubin gets a close reference, families big and small |
//! | groups | a reference and its most similar unassigned references, up to [`MAX_GROUP_REFERENCES`] and [`MAX_DICTIONARY_BYTES`] (a larger single reference stands alone) | matches spread over several siblings; the cap bounds the one read |
//! | frame | against the group of its most similar reference, unless plain is smaller | a cubin unlike its family pays nothing |
//! | dictionary | kept only if it plus its frames are smaller than those cubins compressed plain | small or unrelated corpora fall back to plain frames |
//!
//! Everything is a pure function of the artifacts' digests and bytes: inputs are sorted by
//! digest, every tie is broken by digest order, the hash constants are fixed, and the thread
//! count changes only the schedule. The reader needs, per frame, which dictionary it was
//! compressed against; it decompresses that dictionary (a plain frame, whose sha256 is
//! [`Dictionary::digest`]), keeps it for the family's other cubins, and passes it to
//! [`prebuilt::bundle::decompress_with_prefix`]. The numbers on production cubins come from
//! `cargo bench -p bundler --bench compression`.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use rayon::prelude::*;
use sha2::{Digest as _, Sha256};
use zstd::zstd_safe::{self, CParameter};

/// Cubins per reference: one in eight keeps a close sibling within reach of nearly every cubin
/// of a family while the references' own bytes stay a small part of the bundle.
pub const CUBINS_PER_REFERENCE: usize = 8;
/// References per dictionary.
pub const MAX_GROUP_REFERENCES: usize = 4;
/// Upper bound of a dictionary's raw size, which is what a reader decompresses before the first
/// cubin of a family. On production GEMM cubins, 256 KiB (two typical cubins) gave 0.291 of
/// per-file deflate with a cold cubin (dictionary then frame) in 0.22 ms median; 512 KiB gave
/// 0.276 but twice the cold decode time.
pub const MAX_DICTIONARY_BYTES: usize = 256 * 1024;
/// Fewer cubins than this are compressed plain: there is no family to exploit.
pub const MIN_CUBINS: usize = 8;
/// Largest corpus slice whose pairwise similarities are computed at once; bigger corpora are cut
/// into slices of cubins ordered by sketch, so similar cubins land in the same slice.
const MAX_SLICE: usize = 4096;
/// MinHash functions per sketch.
const SKETCH_HASHES: usize = 64;

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

/// One artifact's zstd frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Index into [`CompressionPlan::dictionaries`] of the raw-content prefix the frame needs.
    pub dictionary: Option<usize>,
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

/// Compresses `artifacts` (key, bytes) at zstd `level` with per-family dictionaries where they
/// pay, on up to `jobs` threads. Keys must be unique; the output depends only on the keys and
/// bytes, not on their order or on `jobs`.
pub fn plan_compression(artifacts: &[(&str, &[u8])], level: i32, jobs: usize) -> CompressionPlan {
    let mut sorted: Vec<(&str, &[u8])> = artifacts.to_vec();
    sorted.sort_by(|a, b| a.0.cmp(b.0));
    let samples: Vec<&[u8]> = sorted.iter().map(|(_, bytes)| *bytes).collect();
    let plain = plain_frames(&samples, level, jobs);
    plan_with_plain(&sorted, &plain, level, jobs)
}

/// Each of `samples` alone as one zstd frame at `level` (checksum and content size on), in
/// order: what a cubin costs without a dictionary, which every plan compares against.
pub fn plain_frames(samples: &[&[u8]], level: i32, jobs: usize) -> Vec<Vec<u8>> {
    let work: Vec<(&[u8], Option<&[u8]>)> = samples.iter().map(|bytes| (*bytes, None)).collect();
    compress_many(&work, level, jobs)
}

/// [`plan_compression`] for artifacts already sorted by key, with their [`plain_frames`]
/// computed once by the caller (who may weigh other ways to store them against the same).
pub fn plan_with_plain(
    sorted: &[(&str, &[u8])],
    plain: &[Vec<u8>],
    level: i32,
    jobs: usize,
) -> CompressionPlan {
    debug_assert!(sorted.windows(2).all(|pair| pair[0].0 < pair[1].0));
    let mut frames: Vec<Frame> = plain
        .iter()
        .map(|bytes| Frame {
            dictionary: None,
            bytes: bytes.clone(),
        })
        .collect();
    let mut dictionaries = Vec::new();
    if sorted.len() >= MIN_CUBINS {
        let sketches: Vec<Sketch> = run_parallel(sorted, jobs, |(_, bytes)| sketch(bytes));
        let mut groups = Vec::new();
        for slice in slices(&sketches) {
            groups.extend(group_slice(&slice, &sketches, sorted));
        }
        // Compress every member of every group against that group's dictionary.
        let contents: Vec<Vec<u8>> = groups
            .iter()
            .map(|group| {
                group
                    .references
                    .iter()
                    .flat_map(|&r| sorted[r].1)
                    .copied()
                    .collect()
            })
            .collect();
        let mut work = Vec::new();
        for (group_index, group) in groups.iter().enumerate() {
            for &member in &group.members {
                work.push((sorted[member].1, Some(contents[group_index].as_slice())));
            }
        }
        work.extend(contents.iter().map(|content| (content.as_slice(), None)));
        let mut compressed = compress_many(&work, level, jobs).into_iter();
        let mut member_frames: Vec<Vec<Vec<u8>>> = groups
            .iter()
            .map(|group| compressed.by_ref().take(group.members.len()).collect())
            .collect();
        let stored: Vec<Vec<u8>> = compressed.collect();
        for (group_index, group) in groups.iter().enumerate() {
            let with: Vec<&Vec<u8>> = member_frames[group_index].iter().collect();
            // Per member the smaller frame; the group stays only if it pays for its dictionary.
            let chosen: usize = group
                .members
                .iter()
                .zip(&with)
                .map(|(&m, frame)| frame.len().min(plain[m].len()))
                .sum();
            let without: usize = group.members.iter().map(|&m| plain[m].len()).sum();
            if stored[group_index].len() + chosen >= without {
                continue;
            }
            let index = dictionaries.len();
            dictionaries.push(Dictionary {
                digest: hex::encode(Sha256::digest(&contents[group_index])),
                size: contents[group_index].len() as u64,
                stored: stored[group_index].clone(),
            });
            for (&member, frame) in group
                .members
                .iter()
                .zip(member_frames[group_index].drain(..))
            {
                if frame.len() < plain[member].len() {
                    frames[member] = Frame {
                        dictionary: Some(index),
                        bytes: frame,
                    };
                }
            }
        }
    }
    CompressionPlan {
        dictionaries,
        frames: sorted
            .iter()
            .zip(frames)
            .map(|((key, _), frame)| (key.to_string(), frame))
            .collect(),
    }
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

/// Cuts the corpus into slices of at most [`MAX_SLICE`] cubins, ordered by sketch so that
/// cubins sharing their first MinHashes (likely siblings) share a slice.
fn slices(sketches: &[Sketch]) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..sketches.len()).collect();
    if sketches.len() > MAX_SLICE {
        order.sort_by(|&a, &b| sketches[a].cmp(&sketches[b]).then(a.cmp(&b)));
    }
    let count = sketches.len().div_ceil(MAX_SLICE).max(1);
    let size = sketches.len().div_ceil(count).max(1);
    order
        .chunks(size)
        .map(|chunk| {
            let mut chunk = chunk.to_vec();
            chunk.sort_unstable();
            chunk
        })
        .collect()
}

/// A dictionary's references and the cubins compressed against it (references included).
struct Group {
    references: Vec<usize>,
    members: Vec<usize>,
}

/// Chooses references by greedy facility location (lazy evaluation, ties to the lower index),
/// groups them, and assigns every cubin of the slice to the group of its closest reference.
fn group_slice(slice: &[usize], sketches: &[Sketch], artifacts: &[(&str, &[u8])]) -> Vec<Group> {
    let n = slice.len();
    let matrix: Vec<u32> = (0..n * n)
        .map(|cell| similarity(&sketches[slice[cell / n]], &sketches[slice[cell % n]]))
        .collect();
    let at = |i: usize, j: usize| matrix[i * n + j];
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
        let mut bytes = artifacts[slice[first]].1.len();
        for k in candidates {
            if references.len() == MAX_GROUP_REFERENCES {
                break;
            }
            let size = artifacts[slice[k]].1.len();
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
        // Closest reference; ties to the lower index (max_by_key keeps the last maximum).
        let Some(&best) = chosen.iter().rev().max_by_key(|&&r| at(i, r)) else {
            continue;
        };
        groups[group_of[best]].members.push(i);
    }
    groups
        .into_iter()
        .map(|group| Group {
            references: group.references.iter().map(|&i| slice[i]).collect(),
            members: group.members.iter().map(|&i| slice[i]).collect(),
        })
        .collect()
}

/// Compresses each (bytes, raw-content prefix) pair at `level`, in input order.
fn compress_many(work: &[(&[u8], Option<&[u8]>)], level: i32, jobs: usize) -> Vec<Vec<u8>> {
    run_parallel(work, jobs, |(bytes, prefix)| {
        compress_one(bytes, *prefix, level)
    })
}

fn compress_one(bytes: &[u8], prefix: Option<&[u8]>, level: i32) -> Vec<u8> {
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
    let mut out = Vec::with_capacity(zstd_safe::compress_bound(bytes.len()));
    context
        .compress2(&mut out, bytes)
        .expect("the output buffer holds zstd's bound");
    out
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

    fn dictionary_content(plan: &CompressionPlan, index: usize) -> Vec<u8> {
        let dictionary = &plan.dictionaries[index];
        let content = decompress_with_prefix(&dictionary.stored, &[], dictionary.size).unwrap();
        assert_eq!(hex::encode(Sha256::digest(&content)), dictionary.digest);
        content
    }

    #[test]
    fn every_frame_decodes_with_only_its_own_dictionary() {
        let corpus = family_corpus(3, 12);
        let plan = plan_compression(&borrowed(&corpus), 3, 2);
        assert!(
            !plan.dictionaries.is_empty(),
            "families of near-copies share a dictionary"
        );
        for (key, bytes) in &corpus {
            let frame = &plan.frames[key];
            let content = frame.dictionary.map(|i| dictionary_content(&plan, i));
            let decoded = decompress_with_prefix(
                &frame.bytes,
                content.as_deref().unwrap_or_default(),
                bytes.len() as u64,
            )
            .unwrap();
            assert_eq!(&decoded, bytes, "{key}");
        }
        let raw: usize = corpus.iter().map(|(_, v)| v.len()).sum();
        // Random templates do not compress alone; against a sibling they nearly vanish.
        assert!(
            plan.stored_size() * 4 < raw,
            "{} of {raw}",
            plan.stored_size()
        );
    }

    #[test]
    fn plan_depends_only_on_keys_and_bytes() {
        let corpus = family_corpus(2, 10);
        let mut reversed = corpus.clone();
        reversed.reverse();
        let one = plan_compression(&borrowed(&corpus), 3, 1);
        let other = plan_compression(&borrowed(&reversed), 3, 3);
        assert_eq!(one, other);
    }

    #[test]
    fn small_or_unrelated_corpora_use_no_dictionary() {
        let few = family_corpus(1, (MIN_CUBINS - 1) as u64);
        assert!(plan_compression(&borrowed(&few), 3, 2)
            .dictionaries
            .is_empty());
        let unrelated: Vec<(String, Vec<u8>)> = (0..12)
            .map(|i| (format!("k{i}"), noise(77 + i, 8 * 1024)))
            .collect();
        let plan = plan_compression(&borrowed(&unrelated), 3, 2);
        assert!(plan.dictionaries.is_empty());
        for (key, bytes) in &unrelated {
            let frame = &plan.frames[key];
            assert_eq!(frame.dictionary, None);
            assert_eq!(
                &decompress_with_prefix(&frame.bytes, &[], bytes.len() as u64).unwrap(),
                bytes
            );
        }
    }

    #[test]
    fn frame_needs_its_dictionary_and_respects_the_bound() {
        let corpus = family_corpus(1, 10);
        let plan = plan_compression(&borrowed(&corpus), 3, 2);
        let (key, bytes) = &corpus[3];
        let frame = &plan.frames[key];
        let index = frame
            .dictionary
            .expect("a family member uses the family dictionary");
        assert!(decompress_with_prefix(&frame.bytes, &[], bytes.len() as u64).is_err());
        let mut wrong = dictionary_content(&plan, index);
        // A dictionary of the same size but other bytes: the frame's checksum catches it.
        wrong.iter_mut().for_each(|byte| *byte ^= 0x55);
        assert!(decompress_with_prefix(&frame.bytes, &wrong, bytes.len() as u64).is_err());
        let content = dictionary_content(&plan, index);
        assert_eq!(
            &decompress_with_prefix(&frame.bytes, &content, bytes.len() as u64).unwrap(),
            bytes
        );
        // A frame that declares more than the recorded size is refused before decoding.
        let error = decompress_with_prefix(&frame.bytes, &content, bytes.len() as u64 - 1);
        assert!(error.unwrap_err().to_string().contains("more than"));
        assert!(decompress_with_prefix(b"not a frame", &[], 1024).is_err());
    }
}
