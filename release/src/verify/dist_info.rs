//! `.dist-info`: exactly one, named for the wheel, with `METADATA`, `WHEEL` and a `RECORD`
//! whose every row matches its file.

use std::collections::{BTreeMap, BTreeSet};

use base64::Engine as _;
use sha2::Digest as _;

use super::VerifyReport;
use crate::wheel::{parse_headers, parse_record, WheelFilename};

pub(super) fn check_dist_info(
    report: &mut VerifyReport,
    filename: &WheelFilename,
    wheel_name: &str,
    order: &[String],
    contents: &BTreeMap<String, Vec<u8>>,
) {
    let expected = filename.dist_info();
    let dist_infos: BTreeSet<&str> = contents
        .keys()
        .filter_map(|name| name.split_once('/').map(|(top, _)| top))
        .filter(|top| top.ends_with(".dist-info"))
        .collect();
    let matching: Vec<&str> = dist_infos
        .iter()
        .copied()
        .filter(|dir| dist_info_matches(dir, filename))
        .collect();
    for dir in &dist_infos {
        if !matching.contains(dir) {
            report.problem(
                format!("{dir}/"),
                format!("is not the `.dist-info` of this wheel (`{expected}/`)"),
            );
        }
    }
    let dist_info = match matching[..] {
        [dir] => dir.to_owned(),
        [] => {
            report.problem(wheel_name, format!("has no `{expected}/`"));
            return;
        }
        _ => {
            report.problem(
                wheel_name,
                format!("has {} `.dist-info` directories for itself", matching.len()),
            );
            return;
        }
    };
    let member = |name: &str| format!("{dist_info}/{name}");

    // `.dist-info` last: a should of the spec, which lets installers stream.
    if let Some(first) = order
        .iter()
        .position(|name| name.starts_with(&format!("{dist_info}/")))
    {
        if let Some(after) = order[first..]
            .iter()
            .find(|name| !name.starts_with(&format!("{dist_info}/")))
        {
            report.warning(
                after,
                format!("comes after `{dist_info}/`, which should be last"),
            );
        }
    }

    match contents.get(&member("METADATA")) {
        None => report.problem(member("METADATA"), "is missing"),
        Some(bytes) => {
            let headers = parse_headers(&String::from_utf8_lossy(bytes));
            let value = |key: &str| {
                headers
                    .iter()
                    .find(|(name, _)| name.eq_ignore_ascii_case(key))
                    .map(|(_, value)| value.as_str())
            };
            match value("Name") {
                Some(name)
                    if crate::wheel::normalize_name(name)
                        == crate::wheel::normalize_name(filename.name()) => {}
                Some(name) => report.problem(
                    member("METADATA"),
                    format!("names `{name}`, not `{}` of the file name", filename.name()),
                ),
                None => report.problem(member("METADATA"), "has no `Name`"),
            }
            match value("Version") {
                Some(version) if version.replace('-', "_") == filename.version() => {}
                Some(version) => report.problem(
                    member("METADATA"),
                    format!(
                        "has version `{version}`, not `{}` of the file name",
                        filename.version()
                    ),
                ),
                None => report.problem(member("METADATA"), "has no `Version`"),
            }
        }
    }

    match contents.get(&member("WHEEL")) {
        None => report.problem(member("WHEEL"), "is missing"),
        Some(bytes) => {
            let headers = parse_headers(&String::from_utf8_lossy(bytes));
            let values = |key: &str| -> Vec<&str> {
                headers
                    .iter()
                    .filter(|(name, _)| name.eq_ignore_ascii_case(key))
                    .map(|(_, value)| value.as_str())
                    .collect()
            };
            match values("Wheel-Version")[..] {
                [version] if version.split('.').next() == Some("1") => {}
                [version] => report.problem(
                    member("WHEEL"),
                    format!("has Wheel-Version {version}; only 1.x is understood"),
                ),
                _ => report.problem(member("WHEEL"), "needs exactly one `Wheel-Version`"),
            }
            if values("Root-Is-Purelib").is_empty() {
                report.problem(member("WHEEL"), "has no `Root-Is-Purelib`");
            }
            let declared: BTreeSet<&str> = values("Tag").into_iter().collect();
            let named = filename.tags();
            let named: BTreeSet<&str> = named.iter().map(String::as_str).collect();
            for tag in named.difference(&declared) {
                report.problem(
                    member("WHEEL"),
                    format!("lacks `Tag: {tag}`, which the file name has"),
                );
            }
            for tag in declared.difference(&named) {
                report.problem(
                    member("WHEEL"),
                    format!("has `Tag: {tag}`, which the file name lacks"),
                );
            }
        }
    }

    let record_path = member("RECORD");
    let Some(record) = contents.get(&record_path) else {
        report.problem(&record_path, "is missing");
        return;
    };
    // Every row names one file of the wheel (and no file twice), so a RECORD of far more
    // lines than the wheel has files is refused before it is parsed: what its rows and their
    // problems cost in memory stays in proportion to the wheel's entries, which are capped.
    // (A few deflated megabytes of repeated lines would otherwise parse into gigabytes.) The
    // slack leaves a few wrong rows to be named one by one.
    let lines = record.iter().filter(|&&byte| byte == b'\n').count();
    if lines > 2 * contents.len() + 16 {
        report.problem(
            &record_path,
            format!(
                "has {lines} lines for the {} files of the wheel: a RECORD lists each file once",
                contents.len()
            ),
        );
        return;
    }
    let rows = match std::str::from_utf8(record)
        .map_err(|_| "is not UTF-8".to_owned())
        .and_then(|text| parse_record(text).map_err(|error| format!("is not valid CSV: {error}")))
    {
        Ok(rows) => rows,
        Err(message) => {
            report.problem(&record_path, message);
            return;
        }
    };
    let mut listed: BTreeMap<&str, (&str, &str)> = BTreeMap::new();
    for row in &rows {
        if listed.insert(&row.path, (&row.hash, &row.size)).is_some() {
            report.problem(&row.path, "is listed twice in RECORD");
        }
    }
    match listed.get(record_path.as_str()) {
        Some(("", "")) => {}
        Some(_) => report.problem(
            &record_path,
            "lists itself with a hash or size; its row must be `RECORD,,`",
        ),
        None => report.problem(&record_path, "does not list itself"),
    }
    let signatures = [member("RECORD.jws"), member("RECORD.p7s")];
    for (name, bytes) in contents {
        if *name == record_path || signatures.contains(name) {
            continue;
        }
        let Some((hash, size)) = listed.get(name.as_str()) else {
            report.problem(name, "is not listed in RECORD");
            continue;
        };
        if let Some(message) = hash_problem(hash, bytes) {
            report.problem(name, message);
        }
        if size.parse::<u64>().ok() != Some(bytes.len() as u64) {
            report.problem(
                name,
                format!("is {} bytes, RECORD says `{size}`", bytes.len()),
            );
        }
    }
    // A set of the files already named, not a search of the problems per row: a RECORD of
    // many rows naming nothing costs one pass.
    let named: BTreeSet<String> = report.problems.iter().map(|p| p.file.clone()).collect();
    for path in listed.keys() {
        if !contents.contains_key(*path) && !named.contains(*path) {
            report.problem(*path, "is listed in RECORD but not in the wheel");
        }
    }
}

fn dist_info_matches(dir: &str, filename: &WheelFilename) -> bool {
    let Some(stem) = dir.strip_suffix(".dist-info") else {
        return false;
    };
    let Some((name, version)) = stem.rsplit_once('-') else {
        return false;
    };
    crate::wheel::normalize_name(name) == crate::wheel::normalize_name(filename.name())
        && version.replace('-', "_") == filename.version()
}

/// Why `bytes` do not match a RECORD hash (`sha256=…`), if they do not.
fn hash_problem(hash: &str, bytes: &[u8]) -> Option<String> {
    let Some((algorithm, expected)) = hash.split_once('=') else {
        return Some(format!(
            "has RECORD hash `{hash}`, which is not `<algorithm>=<digest>`"
        ));
    };
    let actual = match algorithm {
        "sha256" => sha2::Sha256::digest(bytes).to_vec(),
        "sha384" => sha2::Sha384::digest(bytes).to_vec(),
        "sha512" => sha2::Sha512::digest(bytes).to_vec(),
        "md5" | "sha1" => {
            return Some(format!(
                "is hashed with {algorithm} in RECORD, which wheels must not use"
            ))
        }
        other => {
            return Some(format!(
                "is hashed with `{other}` in RECORD, which kwheel cannot check"
            ))
        }
    };
    let actual = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(actual);
    (actual != expected).then(|| {
        format!("has {algorithm} {actual}, but RECORD says {expected}: the file changed after the wheel was built")
    })
}
