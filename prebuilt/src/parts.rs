//! Registry-sized wheels: a bundle whose artifacts ship in companion *part* packages, and how
//! the loader finds them wherever pip put them.
//!
//! ```text
//! site-packages/  (or a --target dir, or any sys.path entry)
//! ├── af3_kernels/_prebuilt/                  the main wheel's bundle
//! │   ├── index.json, kernels.idx, sources/   every kernel and variant, as ever
//! │   └── parts.json                          which part holds which artifact (PartsIndex)
//! ├── af3_kernels_kernels_cu130_sm90/         distribution `af3-kernels-kernels-cu130-sm90`
//! │   ├── __init__.py
//! │   └── _prebuilt/
//! │       ├── part.json                       package, version, name (PartStamp)
//! │       ├── artifacts/5a/5a0d…e1.cubin.zst  the same relative paths as in a whole bundle
//! │       └── dictionaries/…                  the family dictionaries its frames need
//! └── af3_kernels_kernels_cu130_sm100/…
//! ```
//!
//! Each part is its own top-level import package, so pip installs it as an ordinary
//! distribution: it never writes into another distribution's directory (which `pip install
//! --target` refuses to merge and an editable install never sees). The loader looks for
//! `<import>/_prebuilt/part.json` next to the main package first (site-packages, `--target`),
//! then in the directories it is given (the Python runtime passes `sys.path`, which covers an
//! editable main package whose parts are installed in site-packages), then in
//! `$KWHEEL_SITE_PACKAGES`, `$VIRTUAL_ENV`, `$CONDA_PREFIX` and `$PYTHONPATH`. A part found
//! must stamp the same package and exact version as the main wheel's `parts.json`.
//!
//! Parts are grouped by CUDA build and architecture family ([`group_of`]), so a user of one
//! GPU needs one part (`docs/registry-sized-wheels.md`). Every artifact is in exactly one part
//! (its `files`); the prefix a frame is compressed against (a family dictionary, or a
//! reference cubin another part owns) is copied into every part whose frames need it (its
//! `prefixes`), so each part decodes on its own. Nothing here trusts what it
//! reads: every name is checked before it joins a path, and the artifacts are verified against
//! the main index's digests as any other artifact is.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use serde::{Deserialize, Serialize};

use crate::bundle::{read_inside, BundleError};
use crate::target::{Arch, CudaBuild};
use crate::untrusted::{ArtifactPath, MAX_INDEX_SIZE};

/// The file in the main bundle that lists its parts.
pub const PARTS_FILE: &str = "parts.json";
/// The file in each part's `_prebuilt/` that says whose part it is.
pub const PART_FILE: &str = "part.json";
/// The format of [`PARTS_FILE`] and [`PART_FILE`]; bump it when their meaning changes.
pub const PARTS_FORMAT: u32 = 1;
/// What a part's distribution name adds to the main package's: `<package>-kernels-<group>`.
pub const PART_INFIX: &str = "kernels";

/// `parts.json`: the companion packages of a bundle and the files each holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartsIndex {
    /// [`PARTS_FORMAT`].
    pub format: u32,
    /// The main distribution (`af3-kernels`).
    pub package: String,
    /// Its version, which every part has exactly.
    pub version: String,
    /// The largest wheel file the set was cut for, in bytes.
    pub max_file_size: u64,
    /// The parts, sorted by name.
    pub parts: Vec<PartRecord>,
}

/// One companion package.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartRecord {
    /// Its distribution name (`af3-kernels-kernels-cu130-sm90`).
    pub name: String,
    /// Its top-level import package (`af3_kernels_kernels_cu130_sm90`).
    pub import: String,
    /// The CUDA build and architecture family it holds (`cu130-sm90`).
    pub group: String,
    /// The artifacts it holds (each in this part only), relative to `_prebuilt/`, sorted.
    pub files: Vec<String>,
    /// The prefixes its frames are compressed against that it holds too (family dictionaries,
    /// copies of reference cubins another part owns), relative to `_prebuilt/`, sorted.
    #[serde(default)]
    pub prefixes: Vec<String>,
}

/// `part.json`: whose part a directory is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartStamp {
    /// [`PARTS_FORMAT`].
    pub format: u32,
    /// The main distribution.
    pub package: String,
    /// The version, the main wheel's.
    pub version: String,
    /// The part's own distribution name.
    pub name: String,
}

/// A failure to read a bundle's parts or to find one of them.
#[derive(Debug, thiserror::Error)]
pub enum PartError {
    /// `parts.json` or `part.json` could not be read.
    #[error("cannot read `{}`", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// It is not valid JSON of the expected shape.
    #[error("invalid `{}`", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// It names something unsafe or contradicts itself.
    #[error("`{}` is refused: {reason}", path.display())]
    Refused {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The companion package holding an artifact is not installed where the loader looks.
    #[error(
        "the cubins for {} are in the companion package `{}` {version}, which is not \
         installed (looked for `{}/_prebuilt/{PART_FILE}` in {}): install it with `pip \
         install {}=={version}` (installing `{package}=={version}` with its dependencies \
         brings every part)",
        part.group,
        part.name,
        part.import,
        searched_list(searched),
        part.name
    )]
    Missing {
        /// The main distribution.
        package: String,
        /// The version needed.
        version: String,
        /// The part (its name, import package and group).
        part: Box<PartRecord>,
        /// The directories searched.
        searched: Vec<PathBuf>,
    },
    /// A directory of that name is installed but belongs to another package or version.
    #[error(
        "`{}` is {found}, but `{package}` {version} needs `{name}` {version}: install it with \
         `pip install {name}=={version}`",
        path.display()
    )]
    WrongPart {
        /// The main distribution.
        package: String,
        /// The part's distribution.
        name: String,
        /// The version needed.
        version: String,
        /// The part found.
        path: PathBuf,
        /// What it says it is (`part `x` 0.2.0 of `y``).
        found: String,
    },
}

fn searched_list(searched: &[PathBuf]) -> String {
    if searched.is_empty() {
        return "no directory".to_owned();
    }
    searched
        .iter()
        .map(|path| format!("`{}`", path.display()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The group of a variant: its CUDA build and architecture family, `cu130-sm90` for `sm_90a`,
/// `cu130-sm100` for `sm_100a`, `sm_100f` and `sm_103a` (one GPU generation), `cu130-ptx` for
/// PTX (which any newer GPU may load).
pub fn group_of(arch: Arch, cuda: CudaBuild) -> String {
    if arch.is_ptx() {
        return format!("{cuda}-ptx");
    }
    let (major, _) = arch.capability();
    format!("{cuda}-sm{}", major * 10)
}

/// The distribution name of a part: `af3-kernels-kernels-cu130-sm90`, with `-2`, `-3`, …
/// after it when a group is cut into several files (`number` from 1; `None`: one part).
pub fn part_distribution(package: &str, group: &str, number: Option<usize>) -> String {
    let base = format!(
        "{}-{PART_INFIX}-{group}",
        crate::site::normalize_package(package)
    );
    match number {
        Some(number) => format!("{base}-{number}"),
        None => base,
    }
}

/// The import package of a part's distribution: its normalized name with `_`.
pub fn import_name(distribution: &str) -> String {
    crate::site::normalize_package(distribution).replace('-', "_")
}

impl PartsIndex {
    /// The file's bytes: pretty JSON in field order, parts and files as they are (sorted by
    /// the writer), so equal indexes give equal bytes.
    pub fn to_json(&self) -> Vec<u8> {
        let mut text = serde_json::to_string_pretty(self).unwrap_or_default();
        text.push('\n');
        text.into_bytes()
    }

    /// Reads the `parts.json` of the bundle at `root`, `None` when it has none.
    pub fn read(root: &Path) -> Result<Option<PartsIndex>, PartError> {
        let Some((path, bytes)) = read_part_file(root, PARTS_FILE, MAX_INDEX_SIZE)? else {
            return Ok(None);
        };
        PartsIndex::parse(&path, &bytes).map(Some)
    }

    /// Parses and checks `parts.json` (read from `path`): the format, every name, that each
    /// file path stays inside a bundle and that no file is in two parts.
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<PartsIndex, PartError> {
        let index: PartsIndex =
            serde_json::from_slice(bytes).map_err(|source| PartError::Invalid {
                path: path.to_owned(),
                source,
            })?;
        let refused = |reason: String| PartError::Refused {
            path: path.to_owned(),
            reason,
        };
        if index.format != PARTS_FORMAT {
            return Err(refused(format!(
                "format {}, this kwheel reads format {PARTS_FORMAT}",
                index.format
            )));
        }
        let mut owner: BTreeMap<&str, &str> = BTreeMap::new();
        for part in &index.parts {
            if part.import.is_empty()
                || !part
                    .import
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_')
                || part.import.as_bytes()[0].is_ascii_digit()
                || import_name(&part.name) != part.import
            {
                return Err(refused(format!(
                    "part `{}` names the import package `{}`, not `{}`",
                    part.name,
                    part.import,
                    import_name(&part.name)
                )));
            }
            for file in part.files.iter().chain(&part.prefixes) {
                ArtifactPath::parse(file)
                    .map_err(|error| refused(format!("part `{}`: {error}", part.name)))?;
            }
            for file in &part.files {
                if let Some(first) = owner.insert(file, &part.name) {
                    return Err(refused(format!(
                        "`{file}` is in two parts, `{first}` and `{}`",
                        part.name
                    )));
                }
            }
        }
        Ok(index)
    }
}

impl PartStamp {
    /// The file's bytes.
    pub fn to_json(&self) -> Vec<u8> {
        let mut text = serde_json::to_string_pretty(self).unwrap_or_default();
        text.push('\n');
        text.into_bytes()
    }
}

/// Where the parts of the bundle at `bundle_root` are looked for, in order: the directory
/// that holds the main package, then `extra` (the Python runtime's `sys.path`), then the
/// environment's site-packages and `$PYTHONPATH`; duplicates dropped.
pub fn search_dirs(bundle_root: &Path, extra: &[PathBuf]) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(site) = bundle_root.parent().and_then(Path::parent) {
        dirs.push(site.to_owned());
    }
    dirs.extend(extra.iter().cloned());
    dirs.extend(crate::site::environment_site_packages(|name| {
        std::env::var_os(name)
    }));
    if let Some(list) = std::env::var_os("PYTHONPATH") {
        dirs.extend(std::env::split_paths(&list).filter(|dir| !dir.as_os_str().is_empty()));
    }
    let mut unique: Vec<PathBuf> = Vec::new();
    for dir in dirs {
        if !unique.contains(&dir) {
            unique.push(dir);
        }
    }
    unique
}

/// The `_prebuilt/` directory of `part` in the first of `search` that holds it, stamped for
/// `index`'s package and version.
pub fn find_part(
    index: &PartsIndex,
    part: &PartRecord,
    search: &[PathBuf],
) -> Result<PathBuf, PartError> {
    let mut wrong = None;
    for dir in search {
        let root = dir.join(&part.import).join(crate::bundle::PREBUILT_DIR);
        let Some((path, bytes)) = read_part_file(&root, PART_FILE, MAX_STAMP_SIZE)? else {
            continue;
        };
        let stamp: PartStamp =
            serde_json::from_slice(&bytes).map_err(|source| PartError::Invalid {
                path: path.clone(),
                source,
            })?;
        if stamp.format == PARTS_FORMAT
            && stamp.package == index.package
            && stamp.version == index.version
            && stamp.name == part.name
        {
            return Ok(root);
        }
        wrong.get_or_insert(PartError::WrongPart {
            package: index.package.clone(),
            name: part.name.clone(),
            version: index.version.clone(),
            path,
            found: format!(
                "part `{}` {} of `{}`",
                stamp.name, stamp.version, stamp.package
            ),
        });
    }
    Err(wrong.unwrap_or_else(|| PartError::Missing {
        package: index.package.clone(),
        version: index.version.clone(),
        part: Box::new(PartRecord {
            files: Vec::new(),
            prefixes: Vec::new(),
            ..part.clone()
        }),
        searched: search.to_vec(),
    }))
}

/// Largest `part.json`: four short fields.
const MAX_STAMP_SIZE: u64 = 64 << 10;

/// The file `name` of the folder `root` and its bytes, opened once where no link leads out of
/// `root` and read no further than `cap`; `None` when there is none.
fn read_part_file(
    root: &Path,
    name: &str,
    cap: u64,
) -> Result<Option<(PathBuf, Vec<u8>)>, PartError> {
    let relative = ArtifactPath::parse(name).expect("a plain file name");
    match read_inside(root, &relative, cap) {
        Ok(read) => Ok(Some(read)),
        Err(BundleError::Read { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            Ok(None)
        }
        Err(BundleError::Read { path, source }) => Err(PartError::Read { path, source }),
        Err(other) => Err(PartError::Read {
            path: relative.join_to(root),
            source: std::io::Error::other(other.to_string()),
        }),
    }
}

/// The parts of an opened bundle, found on first need and kept.
#[derive(Debug, Default)]
pub struct Parts {
    index: Option<PartsIndex>,
    /// Artifact path → its part's position in `index.parts`.
    owners: BTreeMap<String, usize>,
    search: Vec<PathBuf>,
    found: Mutex<BTreeMap<usize, PathBuf>>,
}

impl Parts {
    /// The parts of the bundle at `root` (none when it has no `parts.json`), looked for in
    /// [`search_dirs`] of `root` and `extra`.
    pub fn open(root: &Path, extra: &[PathBuf]) -> Result<Parts, PartError> {
        let Some(index) = PartsIndex::read(root)? else {
            return Ok(Parts::default());
        };
        let mut owners = BTreeMap::new();
        for (position, part) in index.parts.iter().enumerate() {
            for file in &part.files {
                owners.entry(file.clone()).or_insert(position);
            }
        }
        Ok(Parts {
            index: Some(index),
            owners,
            search: search_dirs(root, extra),
            found: Mutex::new(BTreeMap::new()),
        })
    }

    /// The bundle's `parts.json`, if it has one.
    pub fn index(&self) -> Option<&PartsIndex> {
        self.index.as_ref()
    }

    /// The part that holds the artifact at `relative` (its path in the index), if one does.
    pub fn part_of(&self, relative: &str) -> Option<&PartRecord> {
        let index = self.index.as_ref()?;
        self.owners.get(relative).map(|&n| &index.parts[n])
    }

    /// The directory to read the artifact at `relative` from: `bundle_root` when no part
    /// holds it, else the part's `_prebuilt/`, or why the part cannot be used.
    pub fn root_for(&self, bundle_root: &Path, relative: &str) -> Result<PathBuf, PartError> {
        let (Some(index), Some(&position)) = (&self.index, self.owners.get(relative)) else {
            return Ok(bundle_root.to_owned());
        };
        let found = || self.found.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(root) = found().get(&position) {
            return Ok(root.clone());
        }
        let root = find_part(index, &index.parts[position], &self.search)?;
        found().insert(position, root.clone());
        Ok(root)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(parts: Vec<PartRecord>) -> PartsIndex {
        PartsIndex {
            format: PARTS_FORMAT,
            package: "af3-kernels".into(),
            version: "0.1.0".into(),
            max_file_size: 1 << 20,
            parts,
        }
    }

    fn part(name: &str, files: &[&str]) -> PartRecord {
        PartRecord {
            name: name.into(),
            import: import_name(name),
            group: "cu130-sm90".into(),
            files: files.iter().map(|f| f.to_string()).collect(),
            prefixes: Vec::new(),
        }
    }

    #[test]
    fn groups_are_a_cuda_build_and_a_gpu_generation() {
        let cu130: CudaBuild = "cu130".parse().unwrap();
        let group = |arch: &str| group_of(arch.parse().unwrap(), cu130);
        assert_eq!(group("sm_90a"), "cu130-sm90");
        assert_eq!(group("sm_100a"), "cu130-sm100");
        assert_eq!(group("sm_103a"), "cu130-sm100");
        assert_eq!(group("sm_100f"), "cu130-sm100");
        assert_eq!(group("compute_90"), "cu130-ptx");
        assert_eq!(
            part_distribution("AF3_Kernels", "cu130-sm90", None),
            "af3-kernels-kernels-cu130-sm90"
        );
        assert_eq!(
            import_name(&part_distribution("af3-kernels", "cu129-sm100", Some(2))),
            "af3_kernels_kernels_cu129_sm100_2"
        );
    }

    #[test]
    fn a_part_index_that_escapes_or_repeats_is_refused() {
        let path = Path::new("parts.json");
        let parse = |index: &PartsIndex| PartsIndex::parse(path, &index.to_json());
        let good = index(vec![part(
            "a-kernels-cu130-sm90",
            &["artifacts/ab/ab.cubin.zst"],
        )]);
        assert_eq!(parse(&good).unwrap(), good);
        let escaping = index(vec![part("a-kernels-cu130-sm90", &["../x"])]);
        assert!(parse(&escaping).is_err());
        let mut renamed = good.clone();
        renamed.parts[0].import = "../elsewhere".into();
        assert!(parse(&renamed)
            .unwrap_err()
            .to_string()
            .contains("names the import package `../elsewhere`"));
        let twice = index(vec![
            part("a-kernels-cu130-sm90", &["artifacts/ab/ab.cubin.zst"]),
            part("a-kernels-cu130-sm100", &["artifacts/ab/ab.cubin.zst"]),
        ]);
        assert!(parse(&twice)
            .unwrap_err()
            .to_string()
            .contains("in two parts"));
    }

    /// A site with the main package's `_prebuilt/` (its `parts.json` naming one part, of one
    /// artifact) and the empty `_prebuilt/` of that part beside it: the site, the main
    /// bundle, the part's record and the part's bundle.
    fn site_with_a_part() -> (tempfile::TempDir, PathBuf, PartRecord, PathBuf) {
        let site = tempfile::tempdir().unwrap();
        let main = site.path().join("af3_kernels/_prebuilt");
        std::fs::create_dir_all(&main).unwrap();
        let record = part(
            "af3-kernels-kernels-cu130-sm90",
            &["artifacts/ab/ab.cubin.zst"],
        );
        std::fs::write(main.join(PARTS_FILE), index(vec![record.clone()]).to_json()).unwrap();
        let part_root = site
            .path()
            .join("af3_kernels_kernels_cu130_sm90")
            .join(crate::bundle::PREBUILT_DIR);
        std::fs::create_dir_all(&part_root).unwrap();
        (site, main, record, part_root)
    }

    #[test]
    fn a_part_is_found_beside_the_main_package_and_its_stamp_must_match() {
        let (_site, main, record, part_root) = site_with_a_part();
        let opened = Parts::open(&main, &[]).unwrap();
        let artifact = "artifacts/ab/ab.cubin.zst";
        assert_eq!(opened.part_of(artifact), Some(&record));
        assert_eq!(opened.root_for(&main, "index.json").unwrap(), main);

        let message = opened.root_for(&main, artifact).unwrap_err().to_string();
        assert!(
            message.starts_with(
                "the cubins for cu130-sm90 are in the companion package \
                 `af3-kernels-kernels-cu130-sm90` 0.1.0, which is not installed"
            ),
            "{message}"
        );
        assert!(message.contains("pip install af3-kernels-kernels-cu130-sm90==0.1.0"));

        let mut stamp = PartStamp {
            format: PARTS_FORMAT,
            package: "af3-kernels".into(),
            version: "0.0.9".into(),
            name: record.name.clone(),
        };
        std::fs::write(part_root.join(PART_FILE), stamp.to_json()).unwrap();
        let message = opened.root_for(&main, artifact).unwrap_err().to_string();
        assert!(message.contains("is part `af3-kernels-kernels-cu130-sm90` 0.0.9"));
        stamp.version = "0.1.0".into();
        std::fs::write(part_root.join(PART_FILE), stamp.to_json()).unwrap();
        assert_eq!(opened.root_for(&main, artifact).unwrap(), part_root);
    }

    #[test]
    fn a_part_json_that_is_a_link_out_of_its_part_is_refused_not_read() {
        let (site, main, record, part_root) = site_with_a_part();
        // A stamp that would match, outside the part.
        let outside = site.path().join("stamp.json");
        let stamp = PartStamp {
            format: PARTS_FORMAT,
            package: "af3-kernels".into(),
            version: "0.1.0".into(),
            name: record.name.clone(),
        };
        std::fs::write(&outside, stamp.to_json()).unwrap();
        std::os::unix::fs::symlink(&outside, part_root.join(PART_FILE)).unwrap();
        let opened = Parts::open(&main, &[]).unwrap();
        let error = opened
            .root_for(&main, "artifacts/ab/ab.cubin.zst")
            .unwrap_err();
        let message = crate::error_chain(&error);
        assert!(message.contains("leads out"), "{message}");
        assert!(message.contains(PART_FILE), "{message}");
        // `parts.json` likewise.
        std::fs::rename(main.join(PARTS_FILE), site.path().join("parts.json")).unwrap();
        std::os::unix::fs::symlink(site.path().join("parts.json"), main.join(PARTS_FILE)).unwrap();
        let message = crate::error_chain(&Parts::open(&main, &[]).unwrap_err());
        assert!(message.contains("leads out"), "{message}");
    }
}
