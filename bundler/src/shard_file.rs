//! The shard directory's format, read by the merge and by the writer (which replaces a shard
//! folder only when every entry in it is one this format names):
//!
//! | item | what |
//! | --- | --- |
//! | [`SHARD_FILE`] | `shard.json`: format, `i/N`, the whole plan, this shard's index |
//! | [`CUBINS_DIR`] | `cubins/xx/<digest>.cubin`, raw |
//! | [`check_shard_file`] | every name, digest, path and size in a `shard.json`, as a merge reads it |

use prebuilt::untrusted::Unreadable;
use std::collections::BTreeSet;
use std::fmt;
use std::path::Path;
use std::str::FromStr;

use prebuilt::bundle::SOURCES_DIR;
use prebuilt::index::Index;
use prebuilt::untrusted::{check_index, read_regular_file, Digest, KernelName, MAX_INDEX_SIZE};
use prebuilt::{Arch, CudaBuild};
use serde::{Deserialize, Serialize};

use crate::error::Error;

/// Version of `shard.json`. Bump it when a field changes; the merge refuses others.
pub const SHARD_FORMAT: u32 = 1;
/// The shard's description file.
pub const SHARD_FILE: &str = "shard.json";
/// The directory of a shard's raw cubins.
pub const CUBINS_DIR: &str = "cubins";
/// The most shards a merge accepts (a shard file claiming more is refused).
pub const MAX_SHARDS: usize = 4096;

/// Shard `index` of `count` (both from 1: `--shard 2/4`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Shard {
    /// Which share, from 1.
    pub index: usize,
    /// How many shares.
    pub count: usize,
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl FromStr for Shard {
    type Err = Error;

    fn from_str(text: &str) -> Result<Shard, Error> {
        let invalid = |reason: &str| Error::InvalidShard {
            text: text.to_owned(),
            reason: reason.to_owned(),
        };
        let (index, count) = text
            .trim()
            .split_once('/')
            .ok_or_else(|| invalid("expected `i/N`, such as `1/4`"))?;
        let number = |part: &str| -> Result<usize, Error> {
            part.trim()
                .parse()
                .map_err(|_| invalid("expected `i/N` with whole numbers, such as `1/4`"))
        };
        let shard = Shard {
            index: number(index)?,
            count: number(count)?,
        };
        if shard.count == 0 || shard.index == 0 || shard.index > shard.count {
            return Err(invalid("shards count from 1: `i/N` needs 1 ≤ i ≤ N"));
        }
        Ok(shard)
    }
}

impl Shard {
    /// The keys of `all` this shard builds: round-robin over the keys in sorted order.
    pub fn owned_keys<'k>(&self, all: impl IntoIterator<Item = &'k str>) -> BTreeSet<&'k str> {
        let sorted: BTreeSet<&str> = all.into_iter().collect();
        sorted
            .into_iter()
            .enumerate()
            .filter(|(position, _)| position % self.count == self.index - 1)
            .map(|(_, key)| key)
            .collect()
    }
}

/// One job of the plan, as every shard records it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlannedJob {
    /// The job's key.
    pub key: String,
    /// The kernel.
    pub kernel: String,
    /// The CUDA build.
    pub cuda: CudaBuild,
    /// The architecture.
    pub arch: Arch,
}

/// `shard.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ShardFile {
    pub(crate) format: u32,
    pub(crate) shard: Shard,
    /// The whole plan, sorted by key.
    pub(crate) jobs: Vec<PlannedJob>,
    /// This shard's variants; every kernel's inputs, recipe, constants and skips.
    pub(crate) index: Index,
}

/// The raw cubin of `digest` inside a shard (a [`prebuilt::untrusted::Digest`] by the time
/// a shard file is read; any text still gives a path, never a panic).
/// Where a shard holds an extension module's shared library whole (shard 1 builds the
/// modules): `modules/<sha256>.so`.
pub(crate) fn shard_module_path(digest: &str) -> String {
    format!("modules/{digest}.so")
}

pub(crate) fn cubin_path(digest: &str) -> String {
    format!(
        "{CUBINS_DIR}/{}/{digest}.cubin",
        digest.get(..2).unwrap_or(digest)
    )
}

/// Every file [`crate::shard::write_shard`] writes into the shard directory `dir`, relative to it, as its
/// `shard.json` names them (cubins by digest, sources by stable path); an error when that
/// file is missing or is not a shard file this kwheel reads.
pub(crate) fn shard_files(dir: &Path) -> Result<Vec<String>, Error> {
    let file = read_shard(dir)?;
    let mut files = vec![SHARD_FILE.to_owned()];
    for record in file.index.kernels.values() {
        for variant in &record.variants {
            files.push(cubin_path(&variant.artifact.digest));
        }
        for stable in record.inputs.files.keys() {
            files.push(format!("{SOURCES_DIR}/{stable}"));
        }
    }
    Ok(files)
}

pub(crate) fn read_shard(dir: &Path) -> Result<ShardFile, Error> {
    let path = dir.join(SHARD_FILE);
    let bytes = read_regular_file(&path, MAX_INDEX_SIZE).map_err(|source| {
        Error::Read(Unreadable {
            path: path.clone(),
            source,
        })
    })?;
    parse_shard(dir, &bytes)
}

/// Checks the bytes of a `shard.json` of the shard directory `dir` as a merge does: its
/// format, shape, and every name, digest, path and size in it. The fuzz target `shard` calls
/// it; a merge reads shards with it.
pub fn check_shard_file(dir: &Path, bytes: &[u8]) -> Result<(), Error> {
    parse_shard(dir, bytes).map(|_| ())
}

fn parse_shard(dir: &Path, bytes: &[u8]) -> Result<ShardFile, Error> {
    let path = dir.join(SHARD_FILE);
    #[derive(Deserialize)]
    struct FormatOnly {
        format: u32,
    }
    let invalid = |reason: String| Error::Merge {
        shard: Some(dir.to_owned()),
        reason: format!("`{}` is not a shard file: {reason}", path.display()),
    };
    let format: FormatOnly =
        serde_json::from_slice(bytes).map_err(|error| invalid(error.to_string()))?;
    if format.format != SHARD_FORMAT {
        return Err(invalid(format!(
            "format {}, this kwheel merges format {SHARD_FORMAT}: rebuild the shard with this \
             version",
            format.format
        )));
    }
    let file: ShardFile =
        serde_json::from_slice(bytes).map_err(|error| invalid(error.to_string()))?;
    // The same checks as a bundle's index: kernel names, digests, source paths, sizes.
    check_index(&file.index).map_err(|refusal| invalid(refusal.to_string()))?;
    for job in &file.jobs {
        KernelName::parse(&job.kernel)
            .and_then(|_| Digest::parse(&job.key))
            .map_err(|refusal| invalid(format!("planned job: {refusal}")))?;
    }
    if file.shard.count == 0
        || file.shard.index == 0
        || file.shard.index > file.shard.count
        || file.shard.count > MAX_SHARDS
    {
        return Err(invalid(format!(
            "shard `{}` is not `i/N` with 1 ≤ i ≤ N ≤ {MAX_SHARDS}",
            file.shard
        )));
    }
    Ok(file)
}
