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
//! | nothing but artifacts | a part's `__init__.py` is not the one kwheel writes (code runs at import), its `.dist-info` holds more than `METADATA`, `WHEEL` and `RECORD` (`entry_points.txt`: pip would install its scripts), or its `METADATA` has another field than `Metadata-Version`, `Name`, `Version`, `Summary` and `Requires-Python` (`Requires-Dist`: a dependency of its own) or text after its fields |
//! | exactly one | an artifact of the index is in no wheel of the set (and no store has it), or in more than one |
//! | sizes | a wheel of the set is over `max_file_size` |
//! | digests | an artifact in a part does not decompress (against the dictionary the part ships) to the digest the main index records; a prefix copy is not the bytes its digest names |
//!
//! Each part is read once, like the main wheel ([`super::reading`]): the files checked here
//! are the files of the reading that `wheel verify` passed, never the part's path read again.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use prebuilt::bundle::{read_artifact_with, read_dictionary, read_prefix};
use prebuilt::lookup::{Lookup, LOOKUP_FILE};
use prebuilt::parts::{find_part, PartStamp, PartsIndex, PARTS_FILE, PARTS_FORMAT, PART_FILE};

use super::reading::{after_check_of, inside, read_wheel_file, write_new, VerifiedPart};
use super::{verify_contents, Reading, VerifyReport, MAX_WHEEL_SIZE};
use crate::wheel::parts::part_init_text;
use crate::wheel::{normalize_name, parse_headers, WheelFilename};

/// The `METADATA` fields kwheel writes for a part: no dependency, entry point or extra.
const PART_METADATA_FIELDS: [&str; 5] = [
    "Metadata-Version",
    "Name",
    "Version",
    "Summary",
    "Requires-Python",
];
/// The files kwheel writes into a part's `.dist-info`.
const PART_DIST_INFO_FILES: [&str; 3] = ["METADATA", "WHEEL", "RECORD"];

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
/// `contents` its files); with `keep_parts`, returns the `_prebuilt/` files of each part that
/// verified.
pub(super) fn check_set(
    report: &mut VerifyReport,
    path: &Path,
    size: u64,
    contents: &BTreeMap<String, Vec<u8>>,
    keep_parts: bool,
) -> Vec<VerifiedPart> {
    let mut kept = Vec::new();
    let suffix = format!("_prebuilt/{PARTS_FILE}");
    let roots: Vec<String> = contents
        .keys()
        .filter(|name| name.ends_with(&format!("/{suffix}")))
        .map(|name| name[..name.len() - PARTS_FILE.len()].to_owned())
        .collect();
    for root in roots {
        let before = report.problems.len();
        let limit = check_one(
            report,
            path,
            size,
            contents,
            &root,
            keep_parts.then_some(&mut kept),
        );
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
    kept
}

fn check_one(
    report: &mut VerifyReport,
    path: &Path,
    size: u64,
    contents: &BTreeMap<String, Vec<u8>>,
    root: &str,
    mut kept: Option<&mut Vec<VerifiedPart>>,
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
    let requires_python = metadata(contents, &filename)
        .into_iter()
        .find(|(name, _)| name == "Requires-Python")
        .map(|(_, value)| value);
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
    // A prefix's path → its digest, kernel and variant, to check each part's copy.
    let mut prefix_digests: BTreeMap<String, (&str, &str, String)> = BTreeMap::new();
    for (kernel, record) in &bundle_index.kernels {
        for variant in &record.variants {
            let artifact = variant.artifact.path.as_str();
            named.insert(artifact.to_owned());
            if let Some(prefix) = &variant.artifact.dictionary {
                for path in [
                    prebuilt::bundle::dictionary_path(prefix),
                    prebuilt::bundle::artifact_path(prefix),
                ] {
                    named.insert(path.clone());
                    prefix_digests.entry(path).or_insert((
                        prefix.as_str(),
                        kernel.as_str(),
                        variant.label(),
                    ));
                }
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
        if let Err(error) = extract(scratch.path(), name, bytes) {
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
        // Read once, like the main wheel: what is checked below is what this reading holds.
        let bytes = match read_wheel_file(&part_path, MAX_WHEEL_SIZE) {
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
        let size = bytes.len() as u64;
        let (part_report, files, _) = verify_contents(&part_path, &bytes, Reading::Part);
        drop(bytes);
        after_check_of(&part_path);
        for problem in &part_report.problems {
            report.problem(
                format!("{part_wheel}: {}", problem.file),
                problem.message.clone(),
            );
        }
        if !part_report.is_ok() {
            continue;
        }
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
        for name in files.keys() {
            if let Some(member) = name.strip_prefix(&dist_info) {
                if !PART_DIST_INFO_FILES.contains(&member) {
                    report.problem(format!("{part_wheel}: {name}"), dist_info_problem(member));
                }
            } else if !expected.contains(name) {
                report.problem(
                    format!("{part_wheel}: {name}"),
                    "is not a file the set gives this part",
                );
            }
        }
        let init = format!("{}/__init__.py", part.import);
        let written = part_init_text(&index.package, &index.version, &part.group);
        if files
            .get(&init)
            .is_some_and(|bytes| *bytes != written.as_bytes())
        {
            report.problem(
                format!("{part_wheel}: {init}"),
                "is not the `__init__.py` kwheel writes into a part (a docstring only): a part \
                 carries artifacts, and no code that runs when it is imported",
            );
        }
        let metadata_path = format!("{dist_info}METADATA");
        if let Some(bytes) = files.get(&metadata_path) {
            for message in part_metadata_problems(bytes, requires_python.as_deref()) {
                report.problem(format!("{part_wheel}: {metadata_path}"), message);
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
            if let Err(error) = extract(scratch.path(), name, bytes) {
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
        // A prefix copy no frame of this part needs is still a file the part ships: it must be
        // the bytes its digest names.
        for copy in &part.prefixes {
            let Some((digest, kernel, label)) = prefix_digests.get(copy) else {
                continue; // reported above: no variant names it
            };
            if let Err(error) = read_prefix(&part_root, digest, true, kernel, label) {
                let file = format!("{part_wheel}: {prefix}{copy}");
                if failed.insert(file.clone()) {
                    let message = prebuilt::error_chain(&error)
                        .replace(&format!("{}/", scratch.path().display()), "");
                    report.problem(file, message);
                }
            }
        }
        if let Some(kept) = kept.as_deref_mut() {
            kept.push(VerifiedPart {
                import: part.import.clone(),
                files: files
                    .into_iter()
                    .filter_map(|(name, bytes)| {
                        name.strip_prefix(&prefix)
                            .map(|relative| (relative.to_owned(), bytes))
                    })
                    .collect(),
            });
        }
        checked.push(PartCheck {
            name: part.name.clone(),
            wheel: part_wheel,
            size,
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

/// Writes `bytes` under `scratch` at `name`, a path of a verified reading, refused unless it
/// stays inside.
fn extract(scratch: &Path, name: &str, bytes: &[u8]) -> Result<(), String> {
    let target = inside(scratch, name)?;
    write_new(&target, bytes).map_err(|error| error.to_string())
}

/// Why a part's `.dist-info` must not hold `member`.
fn dist_info_problem(member: &str) -> String {
    if member == "entry_points.txt" {
        "declares entry points (pip would install its console scripts): a part carries \
         artifacts only, no commands"
            .to_owned()
    } else {
        format!(
            "is not a file kwheel writes into a part's `.dist-info` (only {}): a part carries \
             artifacts only",
            PART_DIST_INFO_FILES.join(", ")
        )
    }
}

/// What a part's `METADATA` holds beyond what kwheel writes for it: the fields of
/// [`PART_METADATA_FIELDS`], one line each, nothing after them; `Requires-Python` as the main
/// wheel's.
fn part_metadata_problems(bytes: &[u8], requires_python: Option<&str>) -> Vec<String> {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return vec!["is not UTF-8".to_owned()];
    };
    // kwheel writes `\n` line ends and no other control character; a `\r` would start a new
    // field for Python's email parser (what installers read METADATA with) and not here.
    if let Some(c) = text.chars().find(|&c| c.is_control() && c != '\n') {
        return vec![format!(
            "holds the control character {c:?}, which kwheel does not write (a reader may start \
             a new field there)"
        )];
    }
    let mut problems = Vec::new();
    let mut lines = text.split('\n');
    for line in lines.by_ref() {
        if line.trim().is_empty() {
            break;
        }
        if line.starts_with(' ') {
            problems
                .push("continues a field on another line, which kwheel does not write".to_owned());
            continue;
        }
        let Some((name, value)) = line.split_once(':') else {
            problems.push(format!(
                "has the line `{}`, which is no field",
                line.escape_debug()
            ));
            continue;
        };
        let (name, value) = (name.trim(), value.trim());
        if name.eq_ignore_ascii_case("Requires-Dist") {
            problems.push(format!(
                "requires `{value}`: a part carries artifacts only, no dependencies of its own"
            ));
        } else if !PART_METADATA_FIELDS
            .iter()
            .any(|field| field.eq_ignore_ascii_case(name))
        {
            problems.push(format!(
                "has the field `{name}`; kwheel writes only {} for a part",
                PART_METADATA_FIELDS.join(", ")
            ));
        } else if name.eq_ignore_ascii_case("Requires-Python") && Some(value) != requires_python {
            problems.push(format!(
                "has `Requires-Python: {value}`, not the main wheel's `{}`",
                requires_python.unwrap_or("(none)")
            ));
        }
    }
    if lines.any(|line| !line.trim().is_empty()) {
        problems.push("has text after its fields, which kwheel does not write".to_owned());
    }
    problems
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wheel::Metadata;

    /// The METADATA kwheel writes for a part (as `wheel::parts` does).
    fn written(requires_python: Option<&str>) -> String {
        Metadata {
            name: "af3-kernels-kernels-cu130-sm90".into(),
            version: "0.1.0".into(),
            summary: Some("Prebuilt CUDA kernels of af3-kernels for cu130-sm90".into()),
            requires_python: requires_python.map(str::to_owned),
            requires_dist: Vec::new(),
        }
        .to_text()
    }

    #[test]
    fn a_part_metadata_holds_only_what_kwheel_writes() {
        let ok = written(Some(">=3.9"));
        assert_eq!(
            part_metadata_problems(ok.as_bytes(), Some(">=3.9")),
            Vec::<String>::new()
        );
        for (added, expected) in [
            (
                "Requires-Dist: evil-helper\n",
                "requires `evil-helper`: a part carries artifacts only, no dependencies of its own",
            ),
            (
                "provides-extra: evil\n",
                "has the field `provides-extra`; kwheel writes only Metadata-Version, Name, \
                 Version, Summary, Requires-Python for a part",
            ),
            (
                " continued\n",
                "continues a field on another line, which kwheel does not write",
            ),
            (
                "\nA description.\n",
                "has text after its fields, which kwheel does not write",
            ),
            (
                "Summary: x\rRequires-Dist: evil-helper\n",
                "holds the control character '\\r', which kwheel does not write (a reader may \
                 start a new field there)",
            ),
        ] {
            let text = format!("{ok}{added}");
            assert_eq!(
                part_metadata_problems(text.as_bytes(), Some(">=3.9")),
                [expected],
                "{added:?}"
            );
        }
        assert_eq!(
            part_metadata_problems(ok.as_bytes(), Some(">=3.10")),
            ["has `Requires-Python: >=3.9`, not the main wheel's `>=3.10`"]
        );
    }
}
