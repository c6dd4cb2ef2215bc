//! A build spread over machines: each builds a deterministic share of the compile jobs
//! (`--shard i/N`) into a shard directory, and a merge assembles the bundle that one machine
//! would have written, byte for byte.
//!
//! ```text
//! machine 1: bundle-kernels --shard 1/N ─► shard-1/ ─┐
//! machine 2: bundle-kernels --shard 2/N ─► shard-2/ ─┼─► merge-bundles ─► _prebuilt/
//! …          (all share a remote cache)              │   (identical to a single build)
//! machine N: bundle-kernels --shard N/N ─► shard-N/ ─┘
//! ```
//!
//! Every shard plans the whole matrix (scanning include graphs is cheap), sorts the jobs by
//! key, and builds the jobs at positions `i-1`, `i-1+N`, `i-1+2N`, … (round-robin over sorted
//! keys): the same plan gives every machine the same split, the shares differ in size by at
//! most one job, and a job's shard depends on nothing but the plan.
//!
//! A shard directory is not a bundle, and no loader reads it:
//!
//! ```text
//! shard-1/
//! ├── shard.json                 format, i/N, the whole plan (kernel, build, arch, key), and
//! │                              the index of this shard's variants (storage fields blank)
//! ├── cubins/5a/5a0d…e1.cubin    this shard's cubins, raw, named by their sha256
//! └── sources/…                  every kernel's shipped sources (the same in every shard)
//! ```
//!
//! Shards carry raw cubins because compression is the merge's job: the zstd dictionary is
//! trained on all of a bundle's cubins, which no shard has. The merge checks that the shards
//! are the `1/N … N/N` of one plan (same manifest, toolchains, torch pin, flags), that every
//! planned job has exactly one variant, that every cubin and source is a plain file (no
//! symbolic link on the way) matching the digest its index records, and that every cubin is
//! the one its key names ([`prebuilt::cubin::identity`]: entries and parameter sizes, SM and
//! kind, toolkit release and version); then it writes the bundle with the same writer a
//! single build uses.

use prebuilt::untrusted::Unreadable;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use prebuilt::bundle::SOURCES_DIR;
use prebuilt::cubin::identity::{check_identity, ExpectedCubin};
use prebuilt::index::{Index, KernelRecord};
use prebuilt::key::sha256_hex;
use prebuilt::untrusted::{read_regular_file, MAX_SOURCE_SIZE};

use crate::error::Error;
use crate::remote::RemoteCacheOptions;
pub use crate::shard_file::{
    check_shard_file, PlannedJob, Shard, CUBINS_DIR, MAX_SHARDS, SHARD_FILE, SHARD_FORMAT,
};
use crate::shard_file::{cubin_path, read_shard, shard_module_path, ShardFile};
use crate::writer::{
    stage_directory, write_bundle_streamed, write_sources, BundleFiles, OutputKind, WriteOutcome,
};

/// How a build shares work and results with other machines.
#[derive(Clone, Debug, Default)]
pub struct SharedBuild {
    /// Build only this share of the compile jobs and write a shard directory, not a bundle.
    pub shard: Option<Shard>,
    /// A remote build cache, read before compiling and written after.
    pub remote_cache: Option<RemoteCacheOptions>,
}

/// Writes the shard directory `out` (atomically, like a bundle): `shard.json`, this shard's
/// raw `cubins` by digest, and the `sources` by stable path.
pub fn write_shard(
    out: &Path,
    shard: Shard,
    mut jobs: Vec<PlannedJob>,
    index: &Index,
    cubins: &BTreeMap<String, Vec<u8>>,
    files: BundleFiles<'_>,
) -> Result<WriteOutcome, Error> {
    jobs.sort();
    let file = ShardFile {
        format: SHARD_FORMAT,
        shard,
        jobs,
        index: index.clone(),
    };
    let mut text = serde_json::to_string_pretty(&file).expect("a shard file serializes");
    text.push('\n');
    stage_directory(out, OutputKind::Shard, |root| {
        for (digest, cubin) in cubins {
            crate::cache::write_atomically(&root.join(cubin_path(digest)), cubin)?;
        }
        // Shard 1's modules, whole, each checked against its digest as read.
        for (digest, file) in files.modules {
            let bytes = std::fs::read(file).map_err(Unreadable::at(file))?;
            let actual = sha256_hex(&bytes);
            if actual != *digest {
                return Err(Error::ChangedFile {
                    path: file.clone(),
                    expected: digest.clone(),
                    actual,
                });
            }
            crate::cache::write_atomically(&root.join(shard_module_path(digest)), &bytes)?;
        }
        write_sources(root, files.sources)?;
        crate::cache::write_atomically(&root.join(SHARD_FILE), text.as_bytes())
    })?;
    Ok(WriteOutcome::Written)
}

/// What [`merge_shards`] did.
#[derive(Debug)]
pub struct MergeSummary {
    /// The bundle directory.
    pub out: PathBuf,
    /// The index written (or found unchanged).
    pub index: Index,
    /// How many shards were merged.
    pub shards: usize,
    /// Whether the bundle was rewritten or already matched.
    pub written: WriteOutcome,
}

/// Merges the shard directories `shards` (`1/N` … `N/N` of one plan, in any order) into the
/// bundle `out`, byte-identical to the bundle one machine builds with the same inputs.
/// `jobs` is the number of compression threads; `progress` hears of the cubins written.
pub fn merge_shards(
    shards: &[PathBuf],
    out: &Path,
    jobs: usize,
    progress: &dyn crate::progress::Progress,
) -> Result<MergeSummary, Error> {
    let merge_error = |shard: Option<&Path>, reason: String| Error::Merge {
        shard: shard.map(Path::to_path_buf),
        reason,
    };
    if shards.is_empty() {
        return Err(merge_error(None, "no shard directories given".into()));
    }
    let mut read = Vec::new();
    for dir in shards {
        read.push((dir.clone(), read_shard(dir)?));
    }
    read.sort_by_key(|(_, file)| file.shard.index);
    let (first_dir, first) = &read[0];
    let count = first.shard.count;

    let mut seen = BTreeMap::new();
    for (dir, file) in &read {
        let name = dir.display();
        if file.shard.count != count {
            return Err(merge_error(
                Some(dir),
                format!(
                    "`{name}` is shard {} but `{}` is shard {}: every shard must come from the \
                     same `--shard i/N` split",
                    file.shard,
                    first_dir.display(),
                    first.shard
                ),
            ));
        }
        if let Some(other) = seen.insert(file.shard.index, dir.clone()) {
            return Err(merge_error(
                Some(dir),
                format!(
                    "`{name}` and `{}` are both shard {}",
                    other.display(),
                    file.shard
                ),
            ));
        }
        if file.jobs != first.jobs
            || without_variants(&file.index) != without_variants(&first.index)
        {
            return Err(merge_error(
                Some(dir),
                format!(
                    "`{name}` was planned differently from `{}` (another manifest, source, \
                     toolchain, torch pin or `--only`): rebuild every shard from the same inputs",
                    first_dir.display()
                ),
            ));
        }
    }
    let missing: Vec<String> = (1..=count)
        .filter(|index| !seen.contains_key(index))
        .map(|index| format!("{index}/{count}"))
        .collect();
    if !missing.is_empty() {
        return Err(merge_error(
            None,
            format!("shard {} missing", missing.join(", ")),
        ));
    }

    let mut index = without_variants(&first.index);
    let mut cubins = BTreeMap::new();
    let mut found: BTreeMap<&str, &Path> = BTreeMap::new();
    for (dir, file) in &read {
        let owned = file
            .shard
            .owned_keys(file.jobs.iter().map(|job| job.key.as_str()));
        for (kernel, record) in &file.index.kernels {
            for variant in &record.variants {
                let planned = file.jobs.iter().any(|job| {
                    job.key == variant.key
                        && &job.kernel == kernel
                        && job.cuda == variant.cuda
                        && job.arch == variant.arch
                });
                if !planned || !owned.contains(variant.key.as_str()) {
                    return Err(merge_error(
                        Some(dir),
                        format!(
                            "`{}` has `{kernel}` ({}) with key {}, which is not its share of \
                             the plan",
                            dir.display(),
                            variant.label(),
                            variant.key
                        ),
                    ));
                }
                if let Some(other) = found.insert(&variant.key, dir) {
                    return Err(merge_error(
                        Some(dir),
                        format!(
                            "`{kernel}` ({}) is in both `{}` and `{}`",
                            variant.label(),
                            other.display(),
                            dir.display()
                        ),
                    ));
                }
                let relative = cubin_path(&variant.artifact.digest);
                let path = dir.join(&relative);
                if let Some(link) = link_inside(dir, &relative) {
                    return Err(merge_error(
                        Some(dir),
                        format!(
                            "the cubin of `{kernel}` ({}) in `{}` is reached through the \
                             symbolic link `{}`: a shard holds its cubins as plain files",
                            variant.label(),
                            dir.display(),
                            link.display()
                        ),
                    ));
                }
                let cubin = read_regular_file(&path, variant.artifact.size).map_err(|source| {
                    Error::Read(Unreadable {
                        path: path.clone(),
                        source,
                    })
                })?;
                let actual = sha256_hex(&cubin);
                if actual != variant.artifact.digest || cubin.len() as u64 != variant.artifact.size
                {
                    return Err(merge_error(
                        Some(dir),
                        format!(
                            "the cubin of `{kernel}` ({}) at `{}` has sha256 {actual}, but the \
                             shard's index records {}",
                            variant.label(),
                            path.display(),
                            variant.artifact.digest
                        ),
                    ));
                }
                // The digest only says the file is the one the shard file names; the shard file
                // itself must be right about whose cubin it is.
                let expected = ExpectedCubin {
                    arch: variant.arch,
                    cuda: variant.cuda,
                    compiler: &variant.compiler,
                    functions: &variant.functions,
                };
                if let Err(error) = check_identity(&cubin, &expected) {
                    return Err(merge_error(
                        Some(dir),
                        format!(
                            "the cubin of `{kernel}` ({}) in `{}` is not the one its key names: \
                             {error}",
                            variant.label(),
                            dir.display()
                        ),
                    ));
                }
                cubins.insert(actual, cubin);
                index
                    .kernels
                    .get_mut(kernel)
                    .expect("every shard lists every kernel")
                    .variants
                    .push(variant.clone());
            }
        }
    }
    if let Some(job) = first
        .jobs
        .iter()
        .find(|job| !found.contains_key(job.key.as_str()))
    {
        return Err(merge_error(
            None,
            format!(
                "no shard has `{}` ({}/{}), key {}",
                job.kernel, job.cuda, job.arch, job.key
            ),
        ));
    }
    for record in index.kernels.values_mut() {
        record
            .variants
            .sort_by_key(|variant| (variant.cuda, variant.arch));
    }

    // Extension modules: shard 1's, each a plain file of the shard, read once here to check
    // that it is the shared library its record names (the writer checks its digest again as
    // it compresses the bytes it reads).
    index.modules = first.index.modules.clone();
    let mut modules = BTreeMap::new();
    for (name, record) in &index.modules {
        for variant in &record.variants {
            let relative = shard_module_path(&variant.artifact.digest);
            if let Some(link) = link_inside(first_dir, &relative) {
                return Err(merge_error(
                    Some(first_dir),
                    format!(
                        "extension module `{name}` ({}) in `{}` is reached through the symbolic \
                         link `{}`: a shard holds its modules as plain files",
                        variant.label(),
                        first_dir.display(),
                        link.display()
                    ),
                ));
            }
            let path = first_dir.join(&relative);
            let bytes = read_regular_file(&path, prebuilt::untrusted::MAX_ARTIFACT_SIZE).map_err(
                |source| {
                    Error::Read(Unreadable {
                        path: path.clone(),
                        source,
                    })
                },
            )?;
            let actual = sha256_hex(&bytes);
            let fault = match actual == variant.artifact.digest {
                false => Some(format!(
                    "has sha256 {actual}, but the shard's index records {}",
                    variant.artifact.digest
                )),
                true => crate::extension::build::check_module(&bytes, &variant.cpu).err(),
            };
            if let Some(fault) = fault {
                return Err(merge_error(
                    Some(first_dir),
                    format!(
                        "extension module `{name}` ({}) at `{}` {fault}",
                        variant.label(),
                        path.display()
                    ),
                ));
            }
            modules.insert(actual, path);
        }
    }

    // Sources: every file of every compiled kernel's include graph, and of every module's
    // (but torch's headers, which the JIT takes from the running torch), checked against the
    // digest the index records for it.
    let mut sources = BTreeMap::new();
    let kernel_files = index
        .kernels
        .iter()
        .filter(|(_, record)| record.recipe.is_some())
        .map(|(kernel, record)| (kernel.clone(), &record.inputs.files));
    let module_files = index
        .modules
        .iter()
        .map(|(name, record)| (format!("extension module {name}"), &record.inputs.files));
    for (kernel, files) in kernel_files.chain(module_files) {
        for (stable, digest) in files.iter().filter(|(stable, _)| !stable.starts_with('[')) {
            let path = first_dir.join(SOURCES_DIR).join(stable);
            if let Some(link) = link_inside(first_dir, &format!("{SOURCES_DIR}/{stable}")) {
                return Err(merge_error(
                    Some(first_dir),
                    format!(
                        "source `{stable}` of `{kernel}` in `{}` is reached through the symbolic \
                         link `{}`: a shard holds its sources as plain files",
                        first_dir.display(),
                        link.display()
                    ),
                ));
            }
            let bytes = read_regular_file(&path, MAX_SOURCE_SIZE).map_err(|source| {
                Error::Read(Unreadable {
                    path: path.clone(),
                    source,
                })
            })?;
            if sha256_hex(&bytes) != *digest {
                return Err(merge_error(
                    Some(first_dir),
                    format!(
                        "source `{stable}` of `{kernel}` at `{}` does not match the digest its \
                         index records",
                        path.display()
                    ),
                ));
            }
            sources.insert(stable.clone(), path);
        }
    }
    let corpus: Vec<(&str, &[u8])> = cubins
        .iter()
        .map(|(digest, bytes)| (digest.as_str(), bytes.as_slice()))
        .collect();
    let files = BundleFiles {
        sources: &sources,
        modules: &modules,
    };
    let (index, written) = write_bundle_streamed(out, index, &corpus, files, jobs, progress)?;
    Ok(MergeSummary {
        out: out.to_owned(),
        index,
        shards: read.len(),
        written,
    })
}

/// The first symbolic link on the way from `dir` to `relative` inside it (the file itself
/// included), wherever it points; `None` when there is none (or nothing there, which the read
/// then reports).
fn link_inside(dir: &Path, relative: &str) -> Option<PathBuf> {
    let mut path = dir.to_owned();
    for part in relative.split('/') {
        path.push(part);
        match std::fs::symlink_metadata(&path) {
            Ok(metadata) if metadata.file_type().is_symlink() => return Some(path),
            Ok(_) => {}
            Err(_) => return None,
        }
    }
    None
}

/// `index` with no variants: what every shard of one plan has in common.
fn without_variants(index: &Index) -> Index {
    let mut index = index.clone();
    // Shard 1 alone builds the extension modules.
    index.modules = BTreeMap::new();
    for record in index.kernels.values_mut() {
        *record = KernelRecord {
            variants: Vec::new(),
            ..record.clone()
        };
    }
    index
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_parse_from_one() {
        assert_eq!(
            "2/4".parse::<Shard>().unwrap(),
            Shard { index: 2, count: 4 }
        );
        for bad in ["0/4", "5/4", "1/0", "1", "a/b", "1/2/3"] {
            let error = bad.parse::<Shard>().unwrap_err();
            assert!(error.to_string().contains(bad), "{error}");
        }
    }

    #[test]
    fn shards_split_sorted_keys_round_robin() {
        let keys = ["e", "a", "d", "c", "b"];
        let shares: Vec<Vec<&str>> = (1..=2)
            .map(|index| {
                Shard { index, count: 2 }
                    .owned_keys(keys.iter().copied())
                    .into_iter()
                    .collect()
            })
            .collect();
        assert_eq!(shares, [vec!["a", "c", "e"], vec!["b", "d"]]);
        // Every key in exactly one shard, whatever the count.
        for count in 1..=7 {
            let mut all: Vec<&str> = (1..=count)
                .flat_map(|index| Shard { index, count }.owned_keys(keys.iter().copied()))
                .collect();
            all.sort();
            assert_eq!(all, ["a", "b", "c", "d", "e"]);
        }
    }
}
