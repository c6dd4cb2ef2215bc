//! Writes a bundle directory (layout in [`prebuilt::bundle`]) and swaps it into place.
//!
//! Output is byte-identical for identical inputs: cubins are compressed one zstd frame each
//! at fixed levels, either with one dictionary trained on the bundle's own cubins or against
//! reference cubins of their own family ([`crate::compress`]), whichever makes the bundle
//! smaller; the index is sorted JSON; nothing records a time or a host path. A small library
//! (up to 1,024 cubins and 64 MiB) is weighed exactly in memory; a larger one is streamed
//! from its files ([`write_bundle_from`]): only sketches and compressed frames are held, and
//! the caller's [`crate::progress::Progress`] hears of each stage.
//!
//! # The output folder
//!
//! `--out` is replaced only when it is absent, empty, or holds exactly what kwheel writes there:
//! a bundle whose `index.json` parses as a kwheel index ([`parse_index`]) and whose every
//! entry is a file the writer makes for that index (`index.json`, `kernels.idx`,
//! `dictionary.zdict`, the artifacts and family dictionaries named by their digests, the
//! sources it lists), or a shard likewise by its `shard.json`. A symbolic link, another file,
//! or an index that is not kwheel's is an error naming the folder and the foreign entry, and
//! nothing in it is touched. The new content is assembled in a hidden sibling and swapped in:
//!
//! ```text
//! parent/
//! ├── .out.lock            empty; locked (flock) by the run writing `out`, released by the OS
//! ├── .out.tmp-XXXXXX/     the new content, filled here (with `.kwheel-staging` until done)
//! └── out/                 the old bundle until the swap, the new one after
//! ```
//!
//! The swap is one `renameat2(RENAME_EXCHANGE)` where the file system has it: `out` is the
//! old or the new bundle at every instant, and the old one, now in the sibling, is removed.
//! Elsewhere it is two renames (`out` → `.out.old-XXXXXX`, then the sibling → `out`); a kill
//! between them leaves the old bundle in `.out.old-*`, which the next run puts back before
//! anything else. Runs on one `out` take the lock first, so they serialize instead of racing,
//! and only the lock holder removes leftovers: a sibling with the run's prefix is removed only
//! when it is a staging folder (its marker, and nothing but the writer's file names, temporary
//! files included) or a bundle (shard) by the reading above; any other is left as it is, with
//! a warning naming it and the entry kwheel did not write.

use prebuilt::untrusted::Unreadable;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use std::fs::File;

// Called by path: `File` has inherent lock methods of the same names in newer Rust.
use crate::compress::{
    plain_frames, plan_corpus, thread_pool, CompressionPlan, Corpus, Partitioned, Prefix,
    References, Settings, Stage,
};
use fs4::fs_std::FileExt;
#[cfg(test)]
use prebuilt::bundle::ARTIFACTS_DIR;
use prebuilt::bundle::{
    artifact_path, dictionary_path, parse_index, prefix_path, DICTIONARY_FILE, INDEX_FILE,
    SOURCES_DIR,
};
use prebuilt::index::{Index, StoredFile};
use prebuilt::key::sha256_hex;
use prebuilt::lookup::LOOKUP_FILE;
use rayon::prelude::*;

use crate::error::Error;
use crate::progress::{Event, Progress};

mod output;
mod vocabulary;
pub use output::{check_output, stage_directory, OutputKind};
use output::{Output, Replaceable};
use vocabulary::{foreign_to, foreign_to_extraction, staging_leftover, vocabulary};

/// Written first into a staging folder and removed just before the swap: a leftover that
/// holds it is a killed run's, and may be removed.
const STAGING_MARKER: &str = ".kwheel-staging";

/// Written by `bundle extract` into the folder it fills and kept there: the size and path of
/// every file it wrote, one a line. A non-empty folder is replaced by another extraction only
/// when it holds this marker and nothing but the files the marker lists, each of its listed
/// size: what kwheel can show it wrote, never what merely has the shape of its files.
pub(crate) const EXTRACTION_MARKER: &str = ".kwheel-extraction";

/// zstd level of every frame, plain or against a reference: slow to write once, as fast as
/// any level to read. Against a reference it writes frames 11 % smaller than level 9 in 2.8×
/// the time (docs/benchmarks.md, "Frames against a reference at level 19").
const LEVEL: i32 = 19;
/// Upper bound of the trained dictionary's size.
const MAX_DICTIONARY: usize = 112 * 1024;

/// Whether [`write_bundle`] wrote anything.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteOutcome {
    /// A new bundle replaced the old one (or none).
    Written,
    /// The existing bundle already held exactly this content.
    Unchanged,
}

/// Writes the bundle for `index` (whose artifacts' `path`/`stored_size` are filled in here),
/// the `cubins` by digest, and the shipped `sources` by stable path.
pub fn write_bundle(
    out: &Path,
    index: Index,
    cubins: &BTreeMap<String, Vec<u8>>,
    sources: &BTreeMap<String, PathBuf>,
    jobs: usize,
    progress: &dyn Progress,
) -> Result<(Index, WriteOutcome), Error> {
    let corpus: Vec<(&str, &[u8])> = cubins
        .iter()
        .map(|(digest, bytes)| (digest.as_str(), bytes.as_slice()))
        .collect();
    let files = BundleFiles {
        sources,
        modules: &BTreeMap::new(),
    };
    write_bundle_streamed(out, index, &corpus, files, jobs, progress)
}

/// [`write_bundle`] of cubins read from `corpus` (by digest) as they are needed, with its
/// its progress told to `progress` (the cubins sketched, then compressed): what `dev bundle-kernels` writes from its build cache, in bounded memory.
pub fn write_bundle_streamed(
    out: &Path,
    index: Index,
    corpus: &dyn Corpus,
    files: BundleFiles<'_>,
    jobs: usize,
    progress: &dyn Progress,
) -> Result<(Index, WriteOutcome), Error> {
    progress.event(Event::Start {
        steps: corpus.count() as u64,
        stage: "sketching cubins",
    });
    let tell = |stage: Stage, done: usize, _of: usize| {
        if done == 1 {
            progress.event(Event::Stage(match stage {
                Stage::Sketch => "sketching cubins",
                Stage::Compress => "compressing cubins",
            }));
        }
        progress.event(Event::Position(done as u64));
    };
    let written = write_bundle_from(out, index, corpus, files, jobs, &tell);
    progress.event(Event::Finish);
    written
}

/// [`write_bundle`] for cubins read from `cubins` (by digest) as they are needed, so a library
/// of any size is bundled without holding its cubins in memory ([`crate::compress`]);
/// `progress` hears of every cubin sketched and compressed.
pub fn write_bundle_from(
    out: &Path,
    mut index: Index,
    cubins: &dyn Corpus,
    files: BundleFiles<'_>,
    jobs: usize,
    progress: &(dyn Fn(Stage, usize, usize) + Sync),
) -> Result<(Index, WriteOutcome), Error> {
    let sources = files.sources;
    let output = Output::lock(out, Replaceable::Bundle)?;
    if let Some(existing) = unchanged_bundle(out, &index) {
        return Ok((existing, WriteOutcome::Unchanged));
    }
    output.stage(|root| {
        // (digest, frame, the digest of the prefix it needs) for every cubin.
        let frames: Vec<(String, Vec<u8>, Option<String>)> =
            match compress_bundle(&partitioned(&index, cubins), jobs, progress)? {
                Compressed::Trained { dictionary, frames } => {
                    if let Some(dictionary) = &dictionary {
                        let digest = sha256_hex(dictionary);
                        crate::cache::write_atomically(&root.join(DICTIONARY_FILE), dictionary)?;
                        index.dictionary = Some(StoredFile {
                            digest,
                            size: dictionary.len() as u64,
                            path: DICTIONARY_FILE.to_owned(),
                            stored_size: dictionary.len() as u64,
                            dictionary: None,
                        });
                    }
                    (0..cubins.count())
                        .map(|i| cubins.key(i).to_owned())
                        .zip(frames)
                        .map(|(digest, frame)| (digest, frame, None))
                        .collect()
                }
                Compressed::References(plan) => {
                    for dictionary in &plan.dictionaries {
                        let path = root.join(dictionary_path(&dictionary.digest));
                        crate::cache::write_atomically(&path, &dictionary.stored)?;
                    }
                    plan.frames
                        .into_iter()
                        .map(|(digest, frame)| {
                            let prefix = frame.prefix.map(|prefix| match prefix {
                                Prefix::Dictionary(n) => plan.dictionaries[n].digest.clone(),
                                // The writer's keys are the cubins' digests.
                                Prefix::Cubin(reference) => reference,
                            });
                            (digest, frame.bytes, prefix)
                        })
                        .collect()
                }
            };
        let mut stored_by_digest = BTreeMap::new();
        for (digest, frame, family) in frames {
            let path = artifact_path(&digest);
            crate::cache::write_atomically(&root.join(&path), &frame)?;
            stored_by_digest.insert(digest, (path, frame.len() as u64, family));
        }
        for record in index.kernels.values_mut() {
            for variant in &mut record.variants {
                let (path, size, family) = &stored_by_digest[&variant.artifact.digest];
                variant.artifact.path = path.clone();
                variant.artifact.stored_size = *size;
                variant.artifact.dictionary = family.clone();
            }
        }
        write_modules(root, &mut index, files.modules)?;
        index.format = index.required_format();
        write_sources(root, sources)?;
        crate::cache::write_atomically(&root.join(INDEX_FILE), index.to_json().as_bytes())?;
        crate::cache::write_atomically(&root.join(LOOKUP_FILE), &prebuilt::lookup::encode(&index))
    })?;
    Ok((index, WriteOutcome::Written))
}

/// What a bundle ships besides its cubins, each a file on disk by name.
#[derive(Clone, Copy, Debug)]
pub struct BundleFiles<'a> {
    /// The kernels' sources, by stable path.
    pub sources: &'a BTreeMap<String, PathBuf>,
    /// The extension modules' shared libraries, by the sha256 of their bytes (the digests
    /// the index's module variants name).
    pub modules: &'a BTreeMap<String, PathBuf>,
}

/// Writes every module of `index` from `modules` (by digest) as one plain zstd frame with a
/// checksum at [`prebuilt::module::module_path`], each checked against its digest as read,
/// and records where.
fn write_modules(
    root: &Path,
    index: &mut Index,
    modules: &BTreeMap<String, PathBuf>,
) -> Result<(), Error> {
    for (name, record) in index.modules.iter_mut() {
        for variant in &mut record.variants {
            let Some(file) = modules.get(&variant.artifact.digest) else {
                return Err(Error::ModuleBuild {
                    module: name.clone(),
                    build: variant.label(),
                    reason: format!(
                        "the bundle's writer was given no file with sha256 {}",
                        variant.artifact.digest
                    ),
                });
            };
            let artifact = &mut variant.artifact;
            let bytes = std::fs::read(file).map_err(|source| {
                Error::Read(Unreadable {
                    path: file.clone(),
                    source,
                })
            })?;
            let actual = sha256_hex(&bytes);
            if actual != artifact.digest {
                return Err(Error::ChangedFile {
                    path: file.clone(),
                    expected: artifact.digest.clone(),
                    actual,
                });
            }
            let frame = crate::compress::compress_one(&bytes, None, LEVEL);
            let path = prebuilt::module::module_path(&artifact.digest);
            crate::cache::write_atomically(&root.join(&path), &frame)?;
            artifact.path = path;
            artifact.stored_size = frame.len() as u64;
        }
    }
    Ok(())
}

/// The shipped `sources` (stable path → file) copied under `root/sources/`, as a bundle and a
/// shard both carry them.
pub(crate) fn write_sources(root: &Path, sources: &BTreeMap<String, PathBuf>) -> Result<(), Error> {
    for (stable, path) in sources {
        let bytes = std::fs::read(path).map_err(Unreadable::at(path))?;
        crate::cache::write_atomically(&root.join(SOURCES_DIR).join(stable), &bytes)?;
    }
    Ok(())
}

/// `cubins` partitioned by the label (`cu130/sm_90a`) of the variants they are the artifact of
/// (the smallest label, for bytes two variants share): no frame is compressed against a cubin of
/// another CUDA build or target, so a slim wheel or a registry-sized part that ships one
/// variant label ships no reference of another.
fn partitioned<'a>(index: &Index, cubins: &'a dyn Corpus) -> Partitioned<'a> {
    let mut label_of: BTreeMap<&str, String> = BTreeMap::new();
    for variant in index.kernels.values().flat_map(|record| &record.variants) {
        let label = variant.label();
        label_of
            .entry(variant.artifact.digest.as_str())
            .and_modify(|first| {
                if label < *first {
                    first.clone_from(&label);
                }
            })
            .or_insert(label);
    }
    let labels = (0..cubins.count())
        .map(|i| label_of.get(cubins.key(i)).cloned().unwrap_or_default())
        .collect();
    Partitioned {
        corpus: cubins,
        labels,
    }
}

/// The existing bundle's index when it matches `planned` in everything but storage details,
/// and every artifact it names is present with its recorded size.
fn unchanged_bundle(out: &Path, planned: &Index) -> Option<Index> {
    let path = out.join(INDEX_FILE);
    let bytes = std::fs::read(&path).ok()?;
    let existing = parse_index(&path, &bytes).ok()?;
    if without_storage(&existing) != without_storage(planned) {
        return None;
    }
    // The loader's index is derived from `index.json`: a bundle without it, or with another,
    // is rewritten.
    if std::fs::read(out.join(LOOKUP_FILE)).ok()? != prebuilt::lookup::encode(&existing) {
        return None;
    }
    let modules = existing
        .modules
        .values()
        .flat_map(|m| m.variants.iter().map(|v| &v.artifact));
    let stored = existing
        .dictionary
        .iter()
        .chain(
            existing
                .kernels
                .values()
                .flat_map(|k| k.variants.iter().map(|v| &v.artifact)),
        )
        .chain(modules);
    for file in stored {
        let metadata = std::fs::metadata(out.join(&file.path)).ok()?;
        if metadata.len() != file.stored_size {
            return None;
        }
        if let Some(family) = &file.dictionary {
            prefix_path(out, family)?;
        }
    }
    let sources = planned.kernels.values().flat_map(|k| k.inputs.files.keys());
    for stable in sources {
        if !out.join(SOURCES_DIR).join(stable).is_file() {
            return None;
        }
    }
    Some(existing)
}

/// `index` with the fields only the writer knows blanked out.
pub fn without_storage(index: &Index) -> Index {
    let mut index = index.clone();
    index.dictionary = None;
    for record in index.kernels.values_mut() {
        for variant in &mut record.variants {
            variant.artifact.path.clear();
            variant.artifact.stored_size = 0;
            variant.artifact.dictionary = None;
        }
    }
    for record in index.modules.values_mut() {
        for variant in &mut record.variants {
            variant.artifact.path.clear();
            variant.artifact.stored_size = 0;
        }
    }
    // The format follows how the artifacts are stored.
    index.format = index.required_format();
    index
}

/// How a bundle's cubins are stored.
enum Compressed {
    /// One frame per cubin (in key order), with one dictionary trained on all of them when
    /// that pays.
    Trained {
        dictionary: Option<Vec<u8>>,
        frames: Vec<Vec<u8>>,
    },
    /// One frame per cubin, against a reference cubin where that pays ([`crate::compress`]).
    References(CompressionPlan),
}

/// Up to this many cubins and bytes, a bundle is compressed in memory and every choice is
/// exact: plain, one trained dictionary, or references, whichever is smallest. Past it, cubins
/// are streamed and compressed against references, the plain frame computed only for cubins
/// without a close reference (see [`crate::compress`]).
const EXACT_CUBINS: usize = 1024;
/// (Lower in tests, so that real fixture cubins take the streamed path too.)
const EXACT_BYTES: usize = if cfg!(test) { 256 << 10 } else { 64 << 20 };

/// The smaller of the ways to store `cubins` (by digest): a library of a few unrelated kernels
/// is best served by one trained dictionary, one of whole template families by references
/// (docs/benchmarks.md, "Bundle size"). Every way is deterministic, so the choice is.
fn compress_bundle(
    cubins: &dyn Corpus,
    jobs: usize,
    progress: &(dyn Fn(Stage, usize, usize) + Sync),
) -> Result<Compressed, Error> {
    let streamed = Settings {
        level: LEVEL,
        member_level: LEVEL,
        references: References::Cubins,
        compare_plain: false,
        jobs,
    };
    if cubins.count() > EXACT_CUBINS {
        return Ok(Compressed::References(plan_corpus(
            cubins, &streamed, progress,
        )?));
    }
    let mut held = Vec::with_capacity(cubins.count());
    let mut total = 0;
    for i in 0..cubins.count() {
        let bytes = cubins.read(i)?;
        total += bytes.len();
        if total > EXACT_BYTES {
            drop(held);
            return Ok(Compressed::References(plan_corpus(
                cubins, &streamed, progress,
            )?));
        }
        held.push(bytes.into_owned());
    }
    let samples: Vec<&[u8]> = held.iter().map(Vec::as_slice).collect();
    let plain = plain_frames(&samples, LEVEL, jobs);
    let plain_size: usize = plain.iter().map(Vec::len).sum();
    let trained = train_dictionary(&samples, plain_size, jobs);
    let trained_size = trained.as_ref().map_or(plain_size, |(dictionary, frames)| {
        dictionary.len() + frames.iter().map(Vec::len).sum::<usize>()
    });
    let keyed: Vec<(&str, &[u8])> = (0..cubins.count())
        .map(|i| cubins.key(i))
        .zip(samples.iter().copied())
        .collect();
    let exact = Settings {
        compare_plain: true,
        ..streamed
    };
    let keyed = Partitioned {
        corpus: &keyed,
        labels: (0..cubins.count())
            .map(|i| cubins.partition(i).to_owned())
            .collect(),
    };
    let plan = plan_corpus(&keyed, &exact, progress)?;
    let uses_prefix = plan.frames.values().any(|frame| frame.prefix.is_some());
    if uses_prefix && plan.stored_size() < trained_size {
        return Ok(Compressed::References(plan));
    }
    Ok(match trained {
        Some((dictionary, frames)) => Compressed::Trained {
            dictionary: Some(dictionary),
            frames,
        },
        None => Compressed::Trained {
            dictionary: None,
            frames: plain,
        },
    })
}

/// A dictionary trained on `samples` and their frames compressed with it, when that is
/// smaller in total (dictionary included) than `plain_size`, the samples' plain frames.
fn train_dictionary(
    samples: &[&[u8]],
    plain_size: usize,
    jobs: usize,
) -> Option<(Vec<u8>, Vec<Vec<u8>>)> {
    let total: usize = samples.iter().map(|s| s.len()).sum();
    let dictionary_size = (total / 10).min(MAX_DICTIONARY);
    // zstd's trainer needs several samples and some bytes to say anything useful.
    if samples.len() < 8 || dictionary_size < 1024 {
        return None;
    }
    let dictionary = zstd::dict::from_samples(samples, dictionary_size).ok()?;
    let frames = compress_with(samples, &dictionary, jobs);
    let size = dictionary.len() + frames.iter().map(Vec::len).sum::<usize>();
    (size < plain_size).then_some((dictionary, frames))
}

fn compress_with(samples: &[&[u8]], dictionary: &[u8], jobs: usize) -> Vec<Vec<u8>> {
    thread_pool(jobs, samples.len()).install(|| {
        samples
            .par_iter()
            .map_init(
                || {
                    let mut compressor = zstd::bulk::Compressor::with_dictionary(LEVEL, dictionary)
                        .expect("zstd accepts a valid level and a trained dictionary");
                    // Checksums and sizes make every frame self-describing on its own.
                    compressor
                        .set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(true))
                        .expect("valid parameter");
                    compressor
                },
                |compressor, sample| compressor.compress(sample).expect("in-memory compression"),
            )
            .collect()
    })
}

/// Writes the cubins of a bundle as plain files `DIR/<kernel>/<build>/<arch>.cubin` (PTX as
/// `<arch>.ptx`): all of them into a staging folder, renamed to `out` once every one is
/// verified, so a failure leaves nothing half-written. `out` must be absent, empty, or an earlier extraction.
/// Kernel names come from the index, which [`prebuilt::bundle::parse_index`] checked to be
/// identifiers (one path component each).
pub fn extract_bundle(bundle: &prebuilt::Bundle, out: &Path) -> Result<Vec<PathBuf>, Error> {
    let output = Output::lock(out, Replaceable::Extracted)?;
    let mut written = Vec::new();
    output.stage(|root| {
        let relatives = bundle.extract_to(root)?;
        // Sizes as written into this run's own staging folder.
        let mut marker = String::new();
        for relative in &relatives {
            let path = root.join(relative);
            let size = std::fs::symlink_metadata(&path)
                .map_err(Unreadable::at(&path))?
                .len();
            marker.push_str(&format!("{size} {}\n", relative.display()));
            written.push(out.join(relative));
        }
        let path = root.join(EXTRACTION_MARKER);
        std::fs::write(&path, marker).map_err(|source| Error::Write { path, source })
    })?;
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bundle of cubins only.
    fn no_files() -> BundleFiles<'static> {
        static NONE: BTreeMap<String, PathBuf> = BTreeMap::new();
        BundleFiles {
            sources: &NONE,
            modules: &NONE,
        }
    }

    /// Samples that share runs of bytes, as cubins of one library do, from a fixed seed.
    fn samples() -> Vec<Vec<u8>> {
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as u8
        };
        let shared: Vec<u8> = (0..2048).map(|_| next()).collect();
        (0..16)
            .map(|_| {
                let mut sample = shared.clone();
                sample.extend((0..2048).map(|_| next() % 16));
                sample
            })
            .collect()
    }

    /// Real cubins: the repository's fixtures and, where a default bundle was built in this
    /// tree (`target/kwheel/_prebuilt`), the default library's, by digest.
    fn real_cubins() -> BTreeMap<String, Vec<u8>> {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let mut cubins = BTreeMap::new();
        for dir in [
            "prebuilt/tests/fixtures/cubin",
            "prebuilt/tests/fixtures/stub",
        ] {
            for entry in std::fs::read_dir(workspace.join(dir)).unwrap().flatten() {
                let bytes = std::fs::read(entry.path()).unwrap();
                cubins.insert(sha256_hex(&bytes), bytes);
            }
        }
        match prebuilt::Bundle::open(workspace.join("target/kwheel/_prebuilt")) {
            Ok(bundle) => {
                for (kernel, record) in &bundle.index().kernels {
                    for variant in &record.variants {
                        let bytes = bundle.read_artifact(kernel, variant).unwrap();
                        cubins.insert(sha256_hex(&bytes), bytes);
                    }
                }
            }
            Err(error) => eprintln!("default library's cubins left out: {error}"),
        }
        cubins
    }

    /// One kernel per cubin, one variant each.
    fn index_of(cubins: &BTreeMap<String, Vec<u8>>) -> Index {
        let kernels = cubins
            .iter()
            .enumerate()
            .map(|(n, (digest, bytes))| {
                let variant = prebuilt::Variant {
                    structs: Default::default(),
                    arch: "sm_90a".parse().unwrap(),
                    cuda: "cu130".parse().unwrap(),
                    torch: "2.13.*".to_owned(),
                    compiler: prebuilt::index::CompilerRecord {
                        kind: "cubin".to_owned(),
                        version: String::new(),
                    },
                    key: digest.clone(),
                    artifact: StoredFile {
                        digest: digest.clone(),
                        size: bytes.len() as u64,
                        path: String::new(),
                        stored_size: 0,
                        dictionary: None,
                    },
                    functions: Vec::new(),
                };
                let record = prebuilt::KernelRecord {
                    inputs: prebuilt::KernelInputs::default(),
                    recipe: None,
                    constants: BTreeMap::new(),
                    variants: vec![variant],
                    skipped: Vec::new(),
                };
                (format!("k{n:03}"), record)
            })
            .collect();
        Index {
            format: prebuilt::index::INDEX_FORMAT,
            package: "real".to_owned(),
            torch: "2.13.*".to_owned(),
            store: None,
            dictionary: None,
            kernels,
            modules: Default::default(),
        }
    }

    fn files_under(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
        let mut files = BTreeMap::new();
        let mut dirs = vec![root.to_owned()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(dir).unwrap().flatten() {
                if entry.path().is_dir() {
                    dirs.push(entry.path());
                } else {
                    let relative = entry.path().strip_prefix(root).unwrap().to_owned();
                    files.insert(relative, std::fs::read(entry.path()).unwrap());
                }
            }
        }
        files
    }

    /// Streamed from files on three threads or from memory on one, real cubins give the same
    /// bundle byte for byte, its frames against reference cubins (index format 4), and every
    /// cubin reads back verified.
    #[test]
    fn streamed_bundles_are_identical_whatever_the_threads_and_read_back() {
        let cubins = real_cubins();
        assert!(cubins.len() >= 12, "{} real cubins", cubins.len());
        let dir = tempfile::tempdir().unwrap();
        let index = index_of(&cubins);
        let one = dir.path().join("one");
        write_bundle(
            &one,
            index.clone(),
            &cubins,
            &BTreeMap::new(),
            1,
            &crate::progress::Silent,
        )
        .unwrap();
        let files = crate::compress::FileCorpus::new(
            cubins
                .iter()
                .map(|(digest, bytes)| {
                    let path = dir.path().join(format!("{digest}.cubin"));
                    std::fs::write(&path, bytes).unwrap();
                    (digest.clone(), path)
                })
                .collect(),
        );
        let three = dir.path().join("three");
        let (written, _) =
            write_bundle_from(&three, index, &files, no_files(), 3, &|_, _, _| {}).unwrap();
        assert!(
            files_under(&one) == files_under(&three),
            "the two bundles differ"
        );
        assert_eq!(written.format, prebuilt::index::REFERENCE_INDEX_FORMAT);
        let bundle = prebuilt::Bundle::open(&three).unwrap();
        let mut against = 0;
        for (kernel, record) in &bundle.index().kernels {
            for variant in &record.variants {
                against += usize::from(variant.artifact.dictionary.is_some());
                let bytes = bundle.read_artifact(kernel, variant).unwrap();
                assert_eq!(bytes, cubins[&variant.artifact.digest], "{kernel}");
            }
        }
        assert!(against > 0, "some frame is against a reference cubin");
        // Nothing but artifacts, the two indexes: a reference costs no file of its own.
        assert!(files_under(&three)
            .keys()
            .all(|path| path.starts_with(ARTIFACTS_DIR)
                || path == Path::new(INDEX_FILE)
                || path == Path::new(LOOKUP_FILE)));
    }

    #[test]
    fn dictionary_frames_do_not_depend_on_the_thread_count() {
        let samples = samples();
        let samples: Vec<&[u8]> = samples.iter().map(Vec::as_slice).collect();
        let dictionary = zstd::dict::from_samples(&samples, 4096).unwrap();
        let one = compress_with(&samples, &dictionary, 1);
        assert_eq!(one.len(), samples.len());
        for jobs in [2, 5, 64] {
            assert!(
                compress_with(&samples, &dictionary, jobs) == one,
                "{jobs} threads"
            );
        }
        for (frame, sample) in one.iter().zip(&samples) {
            let mut decompressor = zstd::bulk::Decompressor::with_dictionary(&dictionary).unwrap();
            assert_eq!(
                &decompressor.decompress(frame, sample.len()).unwrap(),
                sample
            );
        }
    }

    /// A bundle of one kernel, `axpy`, whose one variant is a real cubin, at `dir/bundle`.
    fn one_cubin_bundle(dir: &Path) -> prebuilt::Bundle {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let cubin =
            std::fs::read(workspace.join("prebuilt/tests/fixtures/cubin/nvrtc129_sm_90a.cubin"))
                .unwrap();
        let root = dir.join("bundle");
        let mut variant = prebuilt::testing::variant("cu129/sm_90a");
        variant.artifact = prebuilt::testing::write_artifact(&root, &cubin);
        let mut index = prebuilt::testing::index();
        index.kernels = BTreeMap::from([("axpy".to_owned(), prebuilt::testing::record(&[], &[]))]);
        index.kernels.get_mut("axpy").unwrap().variants = vec![variant];
        prebuilt::Bundle::with_index(root, index)
    }

    #[test]
    fn bundle_extract_leaves_a_folder_it_did_not_write_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let bundle = one_cubin_bundle(dir.path());
        // Shaped like an extraction, and the user's own.
        let out = dir.path().join("cubins");
        let handtuned = out.join("proj/v1/handtuned.cubin");
        std::fs::create_dir_all(handtuned.parent().unwrap()).unwrap();
        std::fs::write(&handtuned, b"two weeks of work").unwrap();
        let message = extract_bundle(&bundle, &out).unwrap_err().to_string();
        assert!(
            message.contains(&format!("refusing to replace `{}`", out.display()))
                && message.contains("`proj`")
                && message.contains(EXTRACTION_MARKER),
            "{message}"
        );
        assert_eq!(std::fs::read(&handtuned).unwrap(), b"two weeks of work");
        assert_eq!(files_under(&out).len(), 1);
        // A marker that is a link to one kwheel wrote elsewhere proves nothing.
        let other = dir.path().join("other");
        extract_bundle(&bundle, &other).unwrap();
        std::os::unix::fs::symlink(other.join(EXTRACTION_MARKER), out.join(EXTRACTION_MARKER))
            .unwrap();
        let message = extract_bundle(&bundle, &out).unwrap_err().to_string();
        assert!(message.contains(EXTRACTION_MARKER), "{message}");
        assert_eq!(std::fs::read(&handtuned).unwrap(), b"two weeks of work");
    }

    #[test]
    fn bundle_extract_replaces_only_an_extraction_as_it_left_it() {
        let dir = tempfile::tempdir().unwrap();
        let bundle = one_cubin_bundle(dir.path());
        let out = dir.path().join("cubins");
        let written = extract_bundle(&bundle, &out).unwrap();
        assert_eq!(written, [out.join("axpy/cu129/sm_90a.cubin")]);
        let size = std::fs::metadata(&written[0]).unwrap().len();
        assert_eq!(
            std::fs::read_to_string(out.join(EXTRACTION_MARKER)).unwrap(),
            format!("{size} axpy/cu129/sm_90a.cubin\n")
        );
        // Again, over itself.
        extract_bundle(&bundle, &out).unwrap();
        // A file the user added, or a cubin they changed, is not what kwheel wrote.
        let handtuned = out.join("proj/v1/handtuned.cubin");
        std::fs::create_dir_all(handtuned.parent().unwrap()).unwrap();
        std::fs::write(&handtuned, b"mine").unwrap();
        let message = extract_bundle(&bundle, &out).unwrap_err().to_string();
        assert!(message.contains("`proj`"), "{message}");
        std::fs::remove_dir_all(out.join("proj")).unwrap();
        std::fs::write(&written[0], b"hand-patched").unwrap();
        let message = extract_bundle(&bundle, &out).unwrap_err().to_string();
        assert!(message.contains("`axpy/cu129/sm_90a.cubin`"), "{message}");
        assert_eq!(std::fs::read(&written[0]).unwrap(), b"hand-patched");
    }
}
