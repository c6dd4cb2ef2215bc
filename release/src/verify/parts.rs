//! The set of a registry-sized wheel: a main wheel whose bundle has `_prebuilt/parts.json`
//! is verified with its companion part wheels, looked for beside it under the file names the
//! set gives them.
//!
//! | check | a problem when |
//! | --- | --- |
//! | parts.json | it does not parse, or its package or version are not the wheel's |
//! | pins | the main wheel's METADATA lacks `Requires-Dist: <part>==<version>` for a part |
//! | every part present | a part's wheel is not beside the main wheel |
//! | each part | it fails `wheel verify` on its own, holds another file than its list, `__init__.py` and `part.json`, or its `part.json` names another package, version or part |
//! | exactly one | an artifact of the index is in no wheel of the set (and no store has it), or in more than one |
//! | sizes | a wheel of the set is over `max_file_size` |
//! | digests | an artifact in a part does not decompress (against the dictionary the part ships) to the digest the main index records |

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read as _;
use std::path::Path;

use prebuilt::bundle::{read_artifact_with, read_dictionary, read_prefix};
use prebuilt::lookup::{Lookup, LOOKUP_FILE};
use prebuilt::parts::{find_part, PartStamp, PartsIndex, PARTS_FILE, PARTS_FORMAT, PART_FILE};

use super::{verify_wheel_bytes, VerifyReport, MAX_WHEEL_SIZE};
use crate::wheel::{normalize_name, parse_headers, WheelFilename};

/// One companion wheel of a set, as verified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartCheck {
    /// Its distribution name.
    pub name: String,
    /// Its wheel's file name.
    pub wheel: String,
    /// Its size in bytes.
    pub size: u64,
    /// Variants whose artifacts it holds, decompressed and matched to their digests.
    pub variants: usize,
}

/// What [`check_set`] found: the set's limit, its parts, and the problems that are the set's
/// (also among the report's problems).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetCheck {
    /// The largest file the set was cut for.
    pub max_file_size: u64,
    /// The parts found, in name order.
    pub parts: Vec<PartCheck>,
    /// The set's problems.
    pub problems: Vec<super::Problem>,
}

/// The files the `parts.json` of the bundle at `root` (`af3_kernels/_prebuilt/`) gives to
/// parts, relative to the bundle; empty when there is none or it does not parse (then
/// [`check_set`] reports it).
pub(super) fn part_files(contents: &BTreeMap<String, Vec<u8>>, root: &str) -> BTreeSet<String> {
    let path = format!("{root}{PARTS_FILE}");
    contents
        .get(&path)
        .and_then(|bytes| PartsIndex::parse(Path::new(&path), bytes).ok())
        .map(|index| {
            index
                .parts
                .into_iter()
                .flat_map(|part| part.files)
                .collect()
        })
        .unwrap_or_default()
}

/// Checks the set of every bundle with a `parts.json` in the wheel at `path` (`size` bytes,
/// `contents` its files).
pub(super) fn check_set(
    report: &mut VerifyReport,
    path: &Path,
    size: u64,
    contents: &BTreeMap<String, Vec<u8>>,
) {
    let suffix = format!("_prebuilt/{PARTS_FILE}");
    let roots: Vec<String> = contents
        .keys()
        .filter(|name| name.ends_with(&format!("/{suffix}")))
        .map(|name| name[..name.len() - PARTS_FILE.len()].to_owned())
        .collect();
    for root in roots {
        let before = report.problems.len();
        let limit = check_one(report, path, size, contents, &root);
        let problems = report.problems[before..].to_vec();
        let set = report.set.get_or_insert(SetCheck {
            max_file_size: limit.unwrap_or_default(),
            parts: Vec::new(),
            problems: Vec::new(),
        });
        if let Some(limit) = limit {
            set.max_file_size = limit;
        }
        set.problems.extend(problems);
    }
}

fn check_one(
    report: &mut VerifyReport,
    path: &Path,
    size: u64,
    contents: &BTreeMap<String, Vec<u8>>,
    root: &str,
) -> Option<u64> {
    let filename = report.filename.clone()?;
    let wheel_name = filename.to_string();
    let parts_path = format!("{root}{PARTS_FILE}");
    let index = match PartsIndex::parse(Path::new(&parts_path), &contents[&parts_path]) {
        Ok(index) => index,
        Err(error) => {
            report.problem(&parts_path, prebuilt::error_chain(&error));
            return None;
        }
    };
    if normalize_name(&index.package) != filename.name()
        || index.version != metadata_version(contents, &filename)
    {
        report.problem(
            &parts_path,
            format!(
                "lists the parts of `{}` {}, not of this wheel",
                index.package, index.version
            ),
        );
        return None;
    }
    if size > index.max_file_size {
        report.problem(
            &wheel_name,
            format!(
                "is {size} bytes, over the set's limit of {} bytes",
                index.max_file_size
            ),
        );
    }
    let requirements = requirements(contents, &filename);
    let bundle_index = match contents.get(&format!("{root}{LOOKUP_FILE}")) {
        Some(bytes) => match Lookup::from_bytes(Path::new(LOOKUP_FILE), bytes.clone())
            .and_then(|lookup| lookup.index())
        {
            Ok(index) => index,
            Err(_) => return Some(index.max_file_size), // the bundle check names it
        },
        None => return Some(index.max_file_size),
    };

    // Where every artifact of the index is: the main wheel, or the parts listing it.
    let mut holders: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut prefixes: BTreeMap<&str, &str> = BTreeMap::new();
    for part in &index.parts {
        for file in &part.files {
            holders.entry(file).or_default().push(&part.name);
        }
        for prefix in &part.prefixes {
            prefixes.insert(prefix, &part.name);
        }
    }
    let mut named = BTreeSet::new();
    for record in bundle_index.kernels.values() {
        for variant in &record.variants {
            let artifact = variant.artifact.path.as_str();
            named.insert(artifact.to_owned());
            if let Some(prefix) = &variant.artifact.dictionary {
                named.insert(prebuilt::bundle::dictionary_path(prefix));
                named.insert(prebuilt::bundle::artifact_path(prefix));
            }
            let mut count = holders.get(artifact).map_or(0, Vec::len);
            if contents.contains_key(&format!("{root}{artifact}")) {
                count += 1;
            }
            let file = format!("{root}{artifact}");
            if count == 0 && bundle_index.store.is_none() {
                report.problem(&file, "is in no wheel of the set, but the index lists it");
            } else if count > 1 {
                report.problem(&file, format!("is in {count} wheels of the set, not one"));
            }
        }
    }
    let listed = holders
        .iter()
        .map(|(file, parts)| (*file, parts[0]))
        .chain(prefixes);
    for (file, part) in listed {
        if !named.contains(file) {
            report.problem(
                format!("{root}{file}"),
                format!("is listed for part `{part}`, but no variant of the index names it"),
            );
        }
    }

    let scratch = match tempfile::Builder::new()
        .prefix("kwheel-verify-set-")
        .tempdir()
    {
        Ok(dir) => dir,
        Err(error) => {
            report.problem(
                &parts_path,
                format!("cannot be checked: no temporary directory ({error})"),
            );
            return Some(index.max_file_size);
        }
    };
    let main_root = scratch.path().join(root);
    for (name, bytes) in contents.range(root.to_owned()..) {
        if !name.starts_with(root) {
            break;
        }
        if let Err(error) = write_file(&scratch.path().join(name), bytes) {
            report.problem(name, format!("cannot be extracted to check it: {error}"));
            return Some(index.max_file_size);
        }
    }
    let directory = path.parent().unwrap_or(Path::new("."));
    let python = filename.python_tags().join(".");
    let abi = filename.abi_tags().join(".");
    let platform = filename.platform_tags().join(".");
    let mut checked = Vec::new();
    for part in &index.parts {
        let requirement = format!("{}=={}", part.name, index.version);
        if !requirements.contains(&requirement) {
            report.problem(
                &wheel_name,
                format!(
                    "does not pin its part `{}` (`Requires-Dist: {requirement}`)",
                    part.name
                ),
            );
        }
        let part_wheel =
            match WheelFilename::new(&part.name, &index.version, &python, &abi, &platform) {
                Ok(name) => name.to_string(),
                Err(error) => {
                    report.problem(&parts_path, error.to_string());
                    continue;
                }
            };
        let part_path = directory.join(&part_wheel);
        let bytes = match prebuilt::untrusted::read_regular_file(&part_path, MAX_WHEEL_SIZE) {
            Ok(bytes) => bytes,
            Err(error) => {
                report.problem(
                    &part_wheel,
                    format!(
                        "is missing beside `{wheel_name}` ({error}): the set needs it, as \
                         `{parts_path}` lists it"
                    ),
                );
                continue;
            }
        };
        if bytes.len() as u64 > index.max_file_size {
            report.problem(
                &part_wheel,
                format!(
                    "is {} bytes, over the set's limit of {} bytes",
                    bytes.len(),
                    index.max_file_size
                ),
            );
        }
        let part_report = verify_wheel_bytes(&part_path, &bytes);
        for problem in &part_report.problems {
            report.problem(
                format!("{part_wheel}: {}", problem.file),
                problem.message.clone(),
            );
        }
        if !part_report.is_ok() {
            continue;
        }
        let files = match read_entries(&bytes) {
            Ok(files) => files,
            Err(error) => {
                report.problem(&part_wheel, format!("cannot be read: {error}"));
                continue;
            }
        };
        let prefix = format!("{}/_prebuilt/", part.import);
        let mut expected: BTreeSet<String> = part
            .files
            .iter()
            .chain(&part.prefixes)
            .map(|file| format!("{prefix}{file}"))
            .collect();
        expected.insert(format!("{prefix}{PART_FILE}"));
        expected.insert(format!("{}/__init__.py", part.import));
        let dist_info = format!(
            "{}/",
            part_report
                .filename
                .as_ref()
                .map(WheelFilename::dist_info)
                .unwrap_or_default()
        );
        for name in files.keys().filter(|name| !name.starts_with(&dist_info)) {
            if !expected.contains(name) {
                report.problem(
                    format!("{part_wheel}: {name}"),
                    "is not a file the set gives this part",
                );
            }
        }
        for name in &expected {
            if !files.contains_key(name) {
                report.problem(
                    format!("{part_wheel}: {name}"),
                    "is missing: the set gives it to this part",
                );
            }
        }
        let stamp = files
            .get(&format!("{prefix}{PART_FILE}"))
            .and_then(|bytes| serde_json::from_slice::<PartStamp>(bytes).ok());
        let wanted = PartStamp {
            format: PARTS_FORMAT,
            package: index.package.clone(),
            version: index.version.clone(),
            name: part.name.clone(),
        };
        if stamp.as_ref() != Some(&wanted) {
            report.problem(
                format!("{part_wheel}: {prefix}{PART_FILE}"),
                format!(
                    "does not stamp part `{}` {} of `{}`",
                    part.name, index.version, index.package
                ),
            );
        }
        for (name, bytes) in files.iter().filter(|(name, _)| name.starts_with(&prefix)) {
            if let Err(error) = write_file(&scratch.path().join(name), bytes) {
                report.problem(
                    format!("{part_wheel}: {name}"),
                    format!("cannot be extracted: {error}"),
                );
            }
        }
        let part_root = match find_part(&index, part, &[scratch.path().to_owned()]) {
            Ok(root) => root,
            Err(error) => {
                report.problem(&part_wheel, prebuilt::error_chain(&error));
                continue;
            }
        };
        let mut variants = 0;
        let mut failed = BTreeSet::new();
        for (kernel, record) in &bundle_index.kernels {
            for variant in &record.variants {
                if !part.files.contains(&variant.artifact.path) {
                    continue;
                }
                let read = read_artifact_with(
                    &part_root,
                    kernel,
                    variant,
                    |digest, label| read_prefix(&part_root, digest, true, kernel, label),
                    |label| {
                        bundle_index
                            .dictionary
                            .as_ref()
                            .map(|stored| read_dictionary(&main_root, stored, kernel, label))
                            .transpose()
                    },
                );
                match read {
                    Ok(_) => variants += 1,
                    Err(error) => {
                        let file = format!("{part_wheel}: {prefix}{}", variant.artifact.path);
                        if failed.insert(file.clone()) {
                            let message = prebuilt::error_chain(&error)
                                .replace(&format!("{}/", scratch.path().display()), "");
                            report.problem(file, message);
                        }
                    }
                }
            }
        }
        checked.push(PartCheck {
            name: part.name.clone(),
            wheel: part_wheel,
            size: bytes.len() as u64,
            variants,
        });
    }
    report
        .set
        .get_or_insert(SetCheck {
            max_file_size: index.max_file_size,
            parts: Vec::new(),
            problems: Vec::new(),
        })
        .parts
        .extend(checked);
    Some(index.max_file_size)
}

fn write_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, bytes)
}

/// The files of a wheel that passed `verify_wheel_bytes` (so its sizes are within the caps).
fn read_entries(bytes: &[u8]) -> Result<BTreeMap<String, Vec<u8>>, String> {
    let mut archive =
        zip::ZipArchive::new(std::io::Cursor::new(bytes)).map_err(|e| e.to_string())?;
    let mut files = BTreeMap::new();
    for index in 0..archive.len() {
        let mut file = archive.by_index(index).map_err(|e| e.to_string())?;
        let mut data = Vec::new();
        file.read_to_end(&mut data).map_err(|e| e.to_string())?;
        files.insert(file.name().to_owned(), data);
    }
    Ok(files)
}

fn metadata(
    contents: &BTreeMap<String, Vec<u8>>,
    filename: &WheelFilename,
) -> Vec<(String, String)> {
    contents
        .get(&format!("{}/METADATA", filename.dist_info()))
        .map(|bytes| parse_headers(&String::from_utf8_lossy(bytes)))
        .unwrap_or_default()
}

fn metadata_version(contents: &BTreeMap<String, Vec<u8>>, filename: &WheelFilename) -> String {
    metadata(contents, filename)
        .into_iter()
        .find(|(name, _)| name == "Version")
        .map(|(_, value)| value)
        .unwrap_or_default()
}

fn requirements(
    contents: &BTreeMap<String, Vec<u8>>,
    filename: &WheelFilename,
) -> BTreeSet<String> {
    metadata(contents, filename)
        .into_iter()
        .filter(|(name, _)| name == "Requires-Dist")
        .map(|(_, value)| value.replace(' ', ""))
        .collect()
}
