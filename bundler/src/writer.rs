//! Writes a bundle directory (layout in [`prebuilt::bundle`]) and swaps it into place.
//!
//! Output is byte-identical for identical inputs: cubins are compressed one zstd frame each
//! at a fixed level, with a dictionary trained on the bundle's own cubins when that makes the
//! bundle smaller; the index is sorted JSON; nothing records a time or a host path.
//!
//! The new bundle is assembled in a hidden sibling directory and renamed over the old one, so
//! a killed run leaves the previous bundle (or none), never a half-written one. Leftover
//! siblings of an earlier killed run are removed first.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use prebuilt::bundle::{artifact_path, parse_index, DICTIONARY_FILE, INDEX_FILE, SOURCES_DIR};
use prebuilt::index::{Index, StoredFile};
use prebuilt::key::sha256_hex;

use crate::cache::write_atomically;
use crate::Error;

/// zstd level for artifacts: slow to write once, as fast as any level to read.
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
    mut index: Index,
    cubins: &BTreeMap<String, Vec<u8>>,
    sources: &BTreeMap<String, PathBuf>,
    jobs: usize,
) -> Result<(Index, WriteOutcome), Error> {
    if let Some(existing) = unchanged_bundle(out, &index) {
        return Ok((existing, WriteOutcome::Unchanged));
    }
    stage_directory(out, |root| {
        let samples: Vec<&[u8]> = cubins.values().map(Vec::as_slice).collect();
        let (dictionary, stored) = compress_all(&samples, jobs);
        if let Some(dictionary) = &dictionary {
            let digest = sha256_hex(dictionary);
            write_file(&root.join(DICTIONARY_FILE), dictionary)?;
            index.dictionary = Some(StoredFile {
                digest,
                size: dictionary.len() as u64,
                path: DICTIONARY_FILE.to_owned(),
                stored_size: dictionary.len() as u64,
            });
        }
        let mut stored_by_digest = BTreeMap::new();
        for (digest, compressed) in cubins.keys().zip(stored) {
            let path = artifact_path(digest);
            write_file(&root.join(&path), &compressed)?;
            stored_by_digest.insert(digest.clone(), (path, compressed.len() as u64));
        }
        for record in index.kernels.values_mut() {
            for variant in &mut record.variants {
                let (path, size) = &stored_by_digest[&variant.artifact.digest];
                variant.artifact.path = path.clone();
                variant.artifact.stored_size = *size;
            }
        }
        for (stable, path) in sources {
            let bytes = std::fs::read(path).map_err(|source| Error::Read {
                path: path.clone(),
                source,
            })?;
            write_file(&root.join(SOURCES_DIR).join(stable), &bytes)?;
        }
        write_file(&root.join(INDEX_FILE), index.to_json().as_bytes())
    })?;
    Ok((index, WriteOutcome::Written))
}

/// Fills a new directory through `fill` in a hidden sibling of `out`, then renames it over
/// `out`: a reader sees the old directory or the new one, never a half-written one, and a
/// killed run leaves a sibling that the next run removes.
pub fn stage_directory(
    out: &Path,
    fill: impl FnOnce(&Path) -> Result<(), Error>,
) -> Result<(), Error> {
    let parent = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(|source| Error::Write {
        path: parent.to_owned(),
        source,
    })?;
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "bundle".into());
    remove_leftovers(parent, &name);
    let staging = tempfile::Builder::new()
        .prefix(&format!(".{name}.tmp-"))
        .tempdir_in(parent)
        .map_err(|source| Error::Write {
            path: parent.to_owned(),
            source,
        })?;
    fill(staging.path())?;
    let staged = staging.keep();
    swap_into_place(&staged, out, parent, &name)
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
    let stored = existing.dictionary.iter().chain(
        existing
            .kernels
            .values()
            .flat_map(|k| k.variants.iter().map(|v| &v.artifact)),
    );
    for file in stored {
        let metadata = std::fs::metadata(out.join(&file.path)).ok()?;
        if metadata.len() != file.stored_size {
            return None;
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
        }
    }
    index
}

/// Compresses every sample, with a trained dictionary when that is smaller in total
/// (dictionary included). Returns the dictionary, if used, and the frames in input order.
fn compress_all(samples: &[&[u8]], jobs: usize) -> (Option<Vec<u8>>, Vec<Vec<u8>>) {
    let plain = compress_parallel(samples, None, jobs);
    let total: usize = samples.iter().map(|s| s.len()).sum();
    let dictionary_size = (total / 10).min(MAX_DICTIONARY);
    // zstd's trainer needs several samples and some bytes to say anything useful.
    if samples.len() < 8 || dictionary_size < 1024 {
        return (None, plain);
    }
    let Ok(dictionary) = zstd::dict::from_samples(samples, dictionary_size) else {
        return (None, plain);
    };
    let with_dictionary = compress_parallel(samples, Some(&dictionary), jobs);
    let plain_size: usize = plain.iter().map(Vec::len).sum();
    let dictionary_total: usize =
        dictionary.len() + with_dictionary.iter().map(Vec::len).sum::<usize>();
    if dictionary_total < plain_size {
        (Some(dictionary), with_dictionary)
    } else {
        (None, plain)
    }
}

fn compress_parallel(samples: &[&[u8]], dictionary: Option<&[u8]>, jobs: usize) -> Vec<Vec<u8>> {
    let threads = jobs.max(1).min(samples.len().max(1));
    let chunk = samples.len().div_ceil(threads).max(1);
    std::thread::scope(|scope| {
        let handles: Vec<_> = samples
            .chunks(chunk)
            .map(|part| {
                scope.spawn(move || {
                    let mut compressor = match dictionary {
                        Some(dictionary) => {
                            zstd::bulk::Compressor::with_dictionary(LEVEL, dictionary)
                        }
                        None => zstd::bulk::Compressor::new(LEVEL),
                    }
                    .expect("zstd accepts a valid level and a trained dictionary");
                    // Checksums and sizes make every frame self-describing on its own.
                    compressor
                        .set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(true))
                        .expect("valid parameter");
                    part.iter()
                        .map(|sample| compressor.compress(sample).expect("in-memory compression"))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|handle| handle.join().expect("compression does not panic"))
            .collect()
    })
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| Error::Write {
            path: dir.to_owned(),
            source,
        })?;
    }
    std::fs::write(path, bytes).map_err(|source| Error::Write {
        path: path.to_owned(),
        source,
    })
}

fn swap_into_place(staged: &Path, out: &Path, parent: &Path, name: &str) -> Result<(), Error> {
    let write_error = |source| Error::Write {
        path: out.to_owned(),
        source,
    };
    if out.exists() {
        let old = tempfile::Builder::new()
            .prefix(&format!(".{name}.old-"))
            .tempdir_in(parent)
            .map_err(write_error)?
            .keep();
        std::fs::remove_dir(&old).map_err(write_error)?;
        std::fs::rename(out, &old).map_err(write_error)?;
        std::fs::rename(staged, out).map_err(write_error)?;
        let _ = std::fs::remove_dir_all(&old);
    } else {
        std::fs::rename(staged, out).map_err(write_error)?;
    }
    Ok(())
}

fn remove_leftovers(parent: &Path, name: &str) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    let prefixes = [format!(".{name}.tmp-"), format!(".{name}.old-")];
    for entry in entries.flatten() {
        let file_name = entry.file_name().to_string_lossy().into_owned();
        if prefixes.iter().any(|p| file_name.starts_with(p.as_str())) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Writes the cubins of a bundle as plain files `DIR/<kernel>/<build>/<arch>.cubin`.
pub fn extract_bundle(bundle: &prebuilt::Bundle, out: &Path) -> Result<Vec<PathBuf>, Error> {
    let mut written = Vec::new();
    for (kernel, record) in &bundle.index().kernels {
        for variant in &record.variants {
            let cubin = bundle.read_artifact(kernel, variant)?;
            let path = out
                .join(kernel)
                .join(variant.cuda.to_string())
                .join(format!("{}.cubin", variant.arch));
            write_atomically(&path, &cubin)?;
            written.push(path);
        }
    }
    Ok(written)
}
