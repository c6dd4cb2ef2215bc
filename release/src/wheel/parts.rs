//! Registry-sized wheel sets: a kernel library's wheel cut into a main wheel and companion
//! part wheels, each at most the file size limit (`dev build-wheel --max-file-size`, the
//! manifest's `[wheel] max-file-size`). The on-disk layout and how the loader finds a part
//! are [`prebuilt::parts`]'s; `docs/registry-sized-wheels.md` says when to use it.
//!
//! | step | rule |
//! | --- | --- |
//! | whether to cut | the wheel's files, counted at their uncompressed sizes with each entry's zip and RECORD overhead, do not fit under the limit |
//! | what moves | every cubin artifact (`_prebuilt/artifacts/…`) and family dictionary (`_prebuilt/dictionaries/…`); the index, loader table, trained dictionary, extension modules (the import loads them), sources and Python files stay in the main wheel |
//! | groups | an artifact goes to the group ([`prebuilt::parts::group_of`]) of the first variant naming it, in index order of the smallest group name: `cu130-sm90`, `cu130-sm100`, `cu129-ptx` |
//! | families | a frame compressed against a prefix (a family dictionary, or a reference cubin) is of that prefix's family, with the reference itself; a plain frame that is no reference is a family of its own. Families are taken in the order of their prefix's path (a plain frame's own), each reference first among its frames |
//! | size | a group too big for one file is filled family by family: a family goes whole into the part being filled, else starts a new part; only a family too big for one part is cut, artifact by artifact, a new part starting where the next would cross the limit. Parts are numbered from 1 (`…-cu130-sm90-1`) only then |
//! | prefixes | a part holds a copy of each prefix its frames need that it does not own (a family dictionary, which no part owns; a reference cubin, where its family was cut), so each part decodes alone; a family kept whole stores its prefix once |
//! | pins | the main wheel requires each part at exactly its version (`Requires-Dist: <part>==<version>`) |
//! | names | `<package>-kernels-<group>[-<n>]`, import package the same with `_` ([`prebuilt::parts::part_distribution`]) |
//!
//! Each wheel of the set is written by [`super::write_wheel`], so it is byte-identical on a
//! rebuild; the assignment reads only the index and the files' sizes.

use prebuilt::untrusted::Unreadable;
use std::collections::{BTreeMap, BTreeSet};

use prebuilt::bundle::{artifact_path, dictionary_path, ARTIFACTS_DIR, DICTIONARIES_DIR};
use prebuilt::lookup::LOOKUP_FILE;
use prebuilt::parts::{
    group_of, import_name, part_distribution, PartRecord, PartStamp, PartsIndex, PARTS_FILE,
    PARTS_FORMAT, PART_FILE,
};

use super::{Contents, Metadata, WheelFile, WheelFilename, WheelSpec};
use crate::Error;

/// Zip local header, central directory record and RECORD row of one entry, beyond its path
/// (counted three times) and its bytes: an upper bound for what the writer adds.
const ENTRY_OVERHEAD: u64 = 192;
/// METADATA, WHEEL, RECORD's own row and the end records of one wheel: an upper bound.
const WHEEL_OVERHEAD: u64 = 8 << 10;

/// Parses a file size: a whole number of bytes, or one with `KiB`, `MiB`, `GiB` (powers of
/// 1024) or `kB`, `MB`, `GB` (powers of 1000): `100MiB`, `64KiB`, `1GB`.
pub fn parse_file_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let digits = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(digits);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a size: write bytes or e.g. `100MiB`, `64KiB`"))?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "kB" | "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        other => {
            return Err(format!(
                "`{text}` has unit `{other}`; kwheel reads B, KiB, MiB, GiB, kB, MB, GB"
            ))
        }
    };
    let bytes = number
        .checked_mul(scale)
        .ok_or_else(|| format!("`{text}` is too large"))?;
    if bytes == 0 {
        return Err(format!("`{text}` is zero: no file fits"));
    }
    Ok(bytes)
}

/// The limit to cut for: `given` (`--max-file-size`), else the manifest's `[wheel]
/// max-file-size`, else none.
pub fn file_size_limit(
    given: Option<u64>,
    manifest: &bundler::Manifest,
) -> Result<Option<u64>, Error> {
    if given.is_some() {
        return Ok(given);
    }
    let Some(text) = &manifest.wheel.max_file_size else {
        return Ok(None);
    };
    parse_file_size(text)
        .map(Some)
        .map_err(|reason| Error::FileSizeLimit {
            package: manifest.library.package.clone(),
            limit: text.clone(),
            reason: format!(
                "`[wheel] max-file-size` in `{}`: {reason}",
                manifest.path.display()
            ),
        })
}

/// A wheel cut into a set: the main wheel's spec and its parts', in name order.
#[derive(Clone, Debug)]
pub struct WheelSet {
    /// The main wheel: everything but the artifacts, plus `_prebuilt/parts.json`, and a pin on
    /// every part.
    pub main: WheelSpec,
    /// The parts.
    pub parts: Vec<WheelSpec>,
    /// What `parts.json` says.
    pub index: PartsIndex,
}

/// Cuts `spec` into a set whose every wheel is at most `limit` bytes, or `None` when the
/// whole wheel fits (see the module docs). Fails, naming the file, when one artifact cannot
/// fit in a part or the main wheel alone is over the limit.
pub fn split_wheel(spec: &WheelSpec, limit: u64) -> Result<Option<WheelSet>, Error> {
    let sizes: Vec<u64> = spec.files.iter().map(file_size).collect::<Result<_, _>>()?;
    let whole: u64 = WHEEL_OVERHEAD
        + spec
            .files
            .iter()
            .zip(&sizes)
            .map(|(file, size)| entry_cost(&file.path, *size))
            .sum::<u64>();
    if whole <= limit {
        return Ok(None);
    }
    let too_large = |reason: String| Error::FileSizeLimit {
        package: spec.metadata.name.clone(),
        limit: limit.to_string(),
        reason,
    };
    let index_suffix = format!("/{}/{LOOKUP_FILE}", prebuilt::bundle::PREBUILT_DIR);
    let Some(index_file) = spec.files.iter().find(|f| f.path.ends_with(&index_suffix)) else {
        return Err(too_large(format!(
            "the wheel is {whole} bytes and holds no `_prebuilt/{LOOKUP_FILE}` whose artifacts \
             could move to companion packages"
        )));
    };
    let root = index_file.path[..index_file.path.len() - LOOKUP_FILE.len()].to_owned();
    let index = prebuilt::lookup::Lookup::from_bytes(
        std::path::Path::new(&index_file.path),
        index_file.read()?.into_owned(),
    )?
    .index()?;

    // Artifact path → (group, the prefix digest its frame needs); the smallest group among
    // the variants naming it.
    let mut artifacts: BTreeMap<String, (String, Option<String>)> = BTreeMap::new();
    for record in index.kernels.values() {
        for variant in &record.variants {
            let group = group_of(variant.arch, variant.cuda);
            let entry = artifacts
                .entry(variant.artifact.path.clone())
                .or_insert_with(|| (group.clone(), variant.artifact.dictionary.clone()));
            if group < entry.0 {
                entry.0 = group;
            }
        }
    }
    // Extension modules stay in the main wheel: the import loads them.
    let modules: std::collections::BTreeSet<&str> = index
        .modules
        .values()
        .flat_map(|record| &record.variants)
        .map(|variant| variant.artifact.path.as_str())
        .collect();
    let moved = |path: &str| {
        path.strip_prefix(&root).is_some_and(|relative| {
            (relative.starts_with(&format!("{ARTIFACTS_DIR}/")) && !modules.contains(relative))
                || relative.starts_with(&format!("{DICTIONARIES_DIR}/"))
        })
    };
    let by_relative: BTreeMap<&str, (&WheelFile, u64)> = spec
        .files
        .iter()
        .zip(sizes.iter().copied())
        .filter(|(file, _)| moved(&file.path))
        .map(|(file, size)| (&file.path[root.len()..], (file, size)))
        .collect();

    // Group → artifacts, in path order (the map's).
    let mut groups: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (relative, (group, _)) in &artifacts {
        if by_relative.contains_key(relative.as_str()) {
            groups.entry(group).or_default().push(relative);
        }
    }
    let package = &spec.metadata.name;
    let version = &spec.metadata.version;
    let mut records = Vec::new();
    for (group, members) in &groups {
        // Paths inside a part are `<import>/_prebuilt/<relative>`; count the longest import.
        let prefix = import_name(&part_distribution(package, group, Some(99))).len() + 11;
        let path_cost =
            |relative: &str| entry_cost_of(prefix + relative.len(), by_relative[relative].1);
        let base = WHEEL_OVERHEAD + 2 * ENTRY_OVERHEAD + 1024;
        // Each artifact's family, keyed by the path of the prefix its frame needs, where the
        // loader looks for it; a plain frame's by its own path, so a reference shares its
        // frames' key. The reference comes first: the frames after it in its part need no copy.
        let mut families: BTreeMap<String, Vec<(&str, Option<String>)>> = BTreeMap::new();
        for relative in members {
            let prefix = artifacts[*relative].1.as_deref().and_then(|digest| {
                [dictionary_path(digest), artifact_path(digest)]
                    .into_iter()
                    .find(|path| by_relative.contains_key(path.as_str()))
            });
            let key = prefix.clone().unwrap_or_else(|| (*relative).to_owned());
            let family = families.entry(key.clone()).or_default();
            if *relative == key {
                family.insert(0, (relative, prefix));
            } else {
                family.push((relative, prefix));
            }
        }
        let fresh = || Cut {
            used: base,
            ..Cut::default()
        };
        let mut cuts: Vec<Cut> = Vec::new();
        for family in families.values() {
            // A family goes whole into the part being filled, else starts a new one; a family
            // too big for one part is then cut where its next artifact would cross the limit.
            let fits = |part: &Cut| part.used + part.family_cost(family, path_cost) <= limit;
            if !cuts.last().is_some_and(fits) {
                cuts.push(fresh());
            }
            for (relative, prefix) in family {
                let cost = |part: &Cut| part.cost(relative, prefix.as_deref(), path_cost);
                let alone = base + cost(&Cut::default());
                if alone > limit {
                    return Err(too_large(format!(
                        "`{root}{relative}` (with the prefix its frame needs) takes {alone} \
                         bytes in a wheel, more than fits in one part: raise the limit"
                    )));
                }
                let fits = |part: &Cut| part.used + cost(part) <= limit;
                if !cuts.last().is_some_and(fits) {
                    cuts.push(fresh());
                }
                let part = cuts.last_mut().expect("a part was just started");
                part.used += cost(part);
                if let Some(prefix) = prefix {
                    part.prefixes.insert(prefix.clone());
                }
                part.files.insert((*relative).to_owned());
            }
        }
        let numbered = cuts.len() > 1;
        for (n, mut cut) in cuts.into_iter().enumerate() {
            cut.prefixes.retain(|prefix| !cut.files.contains(prefix));
            let name = part_distribution(package, group, numbered.then_some(n + 1));
            records.push(PartRecord {
                import: import_name(&name),
                name,
                group: (*group).to_owned(),
                files: cut.files.into_iter().collect(),
                prefixes: cut.prefixes.into_iter().collect(),
            });
        }
    }
    records.sort_by(|a, b| a.name.cmp(&b.name));
    let parts_index = PartsIndex {
        format: PARTS_FORMAT,
        package: package.clone(),
        version: version.clone(),
        max_file_size: limit,
        parts: records,
    };

    let platform = spec.filename.platform_tags().join(".");
    let python = spec.filename.python_tags().join(".");
    let abi = spec.filename.abi_tags().join(".");
    let mut parts = Vec::new();
    for record in &parts_index.parts {
        let mut files = vec![
            WheelFile::from_bytes(
                format!("{}/__init__.py", record.import),
                part_init_text(package, version, &record.group),
            ),
            WheelFile::from_bytes(
                format!("{}/_prebuilt/{PART_FILE}", record.import),
                PartStamp {
                    format: PARTS_FORMAT,
                    package: package.clone(),
                    version: version.clone(),
                    name: record.name.clone(),
                }
                .to_json(),
            ),
        ];
        for relative in record.files.iter().chain(&record.prefixes) {
            let (file, _) = by_relative[relative.as_str()];
            files.push(WheelFile {
                path: format!("{}/_prebuilt/{relative}", record.import),
                contents: file.contents.clone(),
                executable: false,
            });
        }
        parts.push(WheelSpec {
            filename: WheelFilename::new(&record.name, version, &python, &abi, &platform)?,
            metadata: Metadata {
                name: record.name.clone(),
                version: version.clone(),
                summary: Some(format!(
                    "Prebuilt CUDA kernels of {package} for {} (a part of {package} {version})",
                    record.group
                )),
                requires_python: spec.metadata.requires_python.clone(),
                requires_dist: Vec::new(),
            },
            files,
            out_dir: spec.out_dir.clone(),
            modified: spec.modified,
        });
    }

    let mut main = spec.clone();
    main.files.retain(|file| !moved(&file.path));
    main.files.push(WheelFile::from_bytes(
        format!("{root}{PARTS_FILE}"),
        parts_index.to_json(),
    ));
    main.metadata.requires_dist.extend(
        parts_index
            .parts
            .iter()
            .map(|part| format!("{}=={version}", part.name)),
    );
    Ok(Some(WheelSet {
        main,
        parts,
        index: parts_index,
    }))
}

/// The `__init__.py` of a part of `package` `version` holding `group`: a docstring, no code
/// (`wheel verify` of the set refuses a part whose `__init__.py` is anything else).
pub(crate) fn part_init_text(package: &str, version: &str, group: &str) -> String {
    format!(
        "\"\"\"Prebuilt CUDA kernels of {package} {version} for {group}: a part of `{package}`, \
         which reads it; nothing to import.\"\"\"\n"
    )
}

/// One part of a group as it is filled: its artifacts, the prefixes their frames need, and
/// what it takes in a wheel so far (an upper bound).
#[derive(Default)]
struct Cut {
    files: BTreeSet<String>,
    prefixes: BTreeSet<String>,
    used: u64,
}

impl Cut {
    /// What adding `relative`, whose frame needs `prefix`, adds: its entry, and a copy of the
    /// prefix unless the part has it.
    fn cost(&self, relative: &str, prefix: Option<&str>, path_cost: impl Fn(&str) -> u64) -> u64 {
        let missing = prefix.filter(|p| !self.holds(p));
        path_cost(relative) + missing.map_or(0, &path_cost)
    }

    /// What adding a whole family adds: each artifact's entry, and one copy of the prefix
    /// unless the part or the family has it.
    fn family_cost(
        &self,
        family: &[(&str, Option<String>)],
        path_cost: impl Fn(&str) -> u64,
    ) -> u64 {
        let own = family
            .iter()
            .map(|(relative, _)| path_cost(relative))
            .sum::<u64>();
        let missing = family
            .iter()
            .filter_map(|(_, prefix)| prefix.as_deref())
            .find(|p| !self.holds(p) && !family.iter().any(|(relative, _)| relative == p));
        own + missing.map_or(0, &path_cost)
    }

    /// Whether the part holds `path`, as its own or as a copy.
    fn holds(&self, path: &str) -> bool {
        self.files.contains(path) || self.prefixes.contains(path)
    }
}

fn entry_cost(path: &str, size: u64) -> u64 {
    entry_cost_of(path.len(), size)
}

fn entry_cost_of(path_length: usize, size: u64) -> u64 {
    size + 3 * path_length as u64 + ENTRY_OVERHEAD
}

fn file_size(file: &WheelFile) -> Result<u64, Error> {
    match &file.contents {
        Contents::Bytes(bytes) => Ok(bytes.len() as u64),
        Contents::Disk(path) => std::fs::metadata(path)
            .map(|metadata| metadata.len())
            .map_err(|source| {
                Error::Read(Unreadable {
                    path: path.clone(),
                    source,
                })
            }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_in_binary_and_decimal_units() {
        assert_eq!(parse_file_size("100MiB"), Ok(100 << 20));
        assert_eq!(parse_file_size("64KiB"), Ok(64 << 10));
        assert_eq!(parse_file_size(" 1GB "), Ok(1_000_000_000));
        assert_eq!(parse_file_size("4096"), Ok(4096));
        assert_eq!(
            parse_file_size("10 mb"),
            Err("`10 mb` has unit `mb`; kwheel reads B, KiB, MiB, GiB, kB, MB, GB".into())
        );
        assert!(parse_file_size("MiB").is_err());
        assert!(parse_file_size("0").is_err());
    }
}
