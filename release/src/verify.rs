//! `kwheel wheel verify`: re-checks any wheel, whoever wrote it, and lists every problem.
//!
//! | check | a problem when |
//! | --- | --- |
//! | file name | it does not parse as `{name}-{version}(-{build})?-{python}-{abi}-{platform}.whl` |
//! | zip hygiene | an entry is absolute, has `..`/`.`/empty components, a `\`, a control character, is a directory or a symlink, or appears twice |
//! | `.dist-info` | there is not exactly one, named for the file name's distribution and version, with `METADATA`, `WHEEL` and `RECORD` |
//! | `METADATA` | its `Name`/`Version` are not the file name's |
//! | `WHEEL` | `Wheel-Version` is not 1.x, or its `Tag:` lines differ from the file name's expanded tags |
//! | `RECORD` | a file is unlisted, listed twice, listed but absent, or its hash (sha256/384/512) or size differs; RECORD does not list itself with an empty hash and size |
//! | bundles | under any `…/_prebuilt/index.json`: an artifact or the dictionary is missing, does not decompress, or does not match its digest; a shipped source does not match the index's hash |
//! | audit | a host ELF breaks the platform tag's policy ([`crate::audit`]) |
//!
//! Entries are read with the zip crate; names, modes, sizes and duplicates come from a walk of
//! the central directory itself, since a zip reader may hide a duplicate or decode a name.
//! Every entry is judged, and checked, under the one name both agree on: an entry whose
//! Info-ZIP Unicode Path extra field (0x7075) names another path than its raw name, or that
//! the zip crate names differently, is a problem and is never read or extracted (an extractor
//! would write the other name). Sizes are limits checked before anything is reserved: the
//! wheel at most [`MAX_WHEEL_SIZE`], an entry at most [`MAX_ENTRY_SIZE`] and
//! [`MAX_ENTRY_RATIO`] times its compressed size, all entries together [`MAX_WHEEL_CONTENT`];
//! inflation stops one byte past the recorded size.
//! Warnings (a should of the spec, such as `.dist-info` last) do not fail verification.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io::{Cursor, Read as _};
use std::path::{Path, PathBuf};

use base64::Engine as _;
use prebuilt::bundle::{BundleError, INDEX_FILE, SOURCES_DIR};
use prebuilt::key::sha256_hex;
use sha2::Digest as _;

use crate::audit::{audit_file, AuditTarget, ElfKind};
use crate::wheel::{parse_headers, parse_record, path_problem, WheelFilename};
use crate::Error;

/// Largest wheel file `wheel verify` reads.
pub const MAX_WHEEL_SIZE: u64 = 1 << 30;
/// Largest entry (uncompressed) of a wheel.
pub const MAX_ENTRY_SIZE: u64 = 256 << 20;
/// Largest sum of all entries' uncompressed sizes.
pub const MAX_WHEEL_CONTENT: u64 = 1 << 30;
/// Highest ratio of an entry's uncompressed to compressed size, for entries over 1 MiB
/// (deflate reaches about 1,000:1 on repeated bytes; real wheel files stay far below 100:1).
pub const MAX_ENTRY_RATIO: u64 = 200;

/// A problem with one file of a wheel (or with the wheel, named by its file name).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// The file, by its path inside the wheel, or the wheel's file name.
    pub file: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.file, self.message)
    }
}

/// What verification found in one `_prebuilt/` bundle of a wheel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BundleCheck {
    /// The bundle's directory inside the wheel (`af3_kernels/_prebuilt/`).
    pub root: String,
    /// Kernels in its index.
    pub kernels: usize,
    /// Variants whose artifacts were decompressed and matched their digests.
    pub variants: usize,
    /// Variants a slim wheel leaves in its store (the index records it): not in the wheel, so
    /// not checked here; `release publish` verifies them in the store.
    pub remote: usize,
    /// Whether it ships kernel sources (without them the JIT fallback cannot run).
    pub sources: bool,
}

/// Everything [`verify_wheel`] found.
#[derive(Clone, Debug)]
pub struct VerifyReport {
    /// The wheel.
    pub wheel: PathBuf,
    /// Its parsed file name, when it parses.
    pub filename: Option<WheelFilename>,
    /// Files in it.
    pub files: usize,
    /// Its `_prebuilt/` bundles.
    pub bundles: Vec<BundleCheck>,
    /// Host ELF files audited, by path.
    pub host_elfs: Vec<String>,
    /// Cubins recognised (and skipped by the audit).
    pub cubins: usize,
    /// Problems: any makes the wheel fail verification.
    pub problems: Vec<Problem>,
    /// Departures from what the spec recommends, which do not fail it.
    pub warnings: Vec<Problem>,
}

impl VerifyReport {
    /// Whether the wheel passed.
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }

    /// The report when the wheel passed, else [`Error::Verification`] listing every problem.
    pub fn into_result(self) -> Result<VerifyReport, Error> {
        if self.is_ok() {
            Ok(self)
        } else {
            Err(Error::Verification {
                wheel: self.wheel,
                problems: self.problems,
            })
        }
    }

    fn problem(&mut self, file: impl Into<String>, message: impl Into<String>) {
        self.problems.push(Problem {
            file: file.into(),
            message: message.into(),
        });
    }

    fn warning(&mut self, file: impl Into<String>, message: impl Into<String>) {
        self.warnings.push(Problem {
            file: file.into(),
            message: message.into(),
        });
    }
}

impl fmt::Display for VerifyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = self.wheel.file_name().map_or_else(
            || self.wheel.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        writeln!(f, "{name}: {} files", self.files)?;
        if let Some(filename) = &self.filename {
            writeln!(f, "  tags: {}", filename.tags().join(", "))?;
        }
        for bundle in &self.bundles {
            let remote = if bundle.remote > 0 {
                format!(" ({} more in the store)", bundle.remote)
            } else {
                String::new()
            };
            writeln!(
                f,
                "  bundle {}: {} kernels, {} variants verified{remote}, {}",
                bundle.root,
                bundle.kernels,
                bundle.variants,
                if bundle.sources {
                    "sources shipped"
                } else {
                    "no sources (no JIT fallback)"
                }
            )?;
        }
        writeln!(
            f,
            "  audit: {} host ELF files, {} cubins skipped",
            self.host_elfs.len(),
            self.cubins
        )?;
        for warning in &self.warnings {
            writeln!(f, "  warning: {warning}")?;
        }
        if self.problems.is_empty() {
            writeln!(f, "ok")
        } else {
            writeln!(f, "{} problems:", self.problems.len())?;
            for problem in &self.problems {
                writeln!(f, "  {problem}")?;
            }
            Ok(())
        }
    }
}

/// One entry of the central directory, as stored.
struct RawEntry {
    name: Vec<u8>,
    /// The host that wrote the entry (3 is Unix, whose mode is in the external attributes).
    host: u8,
    external_attributes: u32,
    /// The name in an Info-ZIP Unicode Path extra field (0x7075), which zip readers prefer.
    unicode_path: Option<Vec<u8>>,
    /// Sizes as recorded (zip64 extra field included).
    compressed_size: u64,
    uncompressed_size: u64,
    /// Where its local header is: how an entry of the zip reader is matched to this one.
    local_offset: u64,
}

const S_IFMT: u32 = 0o170_000;
const S_IFLNK: u32 = 0o120_000;
const S_IFDIR: u32 = 0o040_000;
const S_IFREG: u32 = 0o100_000;

/// Verifies the wheel at `path`. Fails only when it cannot be read at all; everything wrong
/// inside it is a [`Problem`] of the report.
pub fn verify_wheel(path: &Path) -> Result<VerifyReport, Error> {
    let bytes = prebuilt::untrusted::read_regular_file(path, MAX_WHEEL_SIZE).map_err(|source| {
        Error::Read {
            path: path.to_owned(),
            source,
        }
    })?;
    Ok(verify_wheel_bytes(path, &bytes))
}

/// [`verify_wheel`] on the bytes of the wheel, with `path` naming it (its file name is the
/// wheel's name). The fuzz target `wheel` calls it.
pub fn verify_wheel_bytes(path: &Path, bytes: &[u8]) -> VerifyReport {
    let wheel_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string());
    let mut report = VerifyReport {
        wheel: path.to_owned(),
        filename: None,
        files: 0,
        bundles: Vec::new(),
        host_elfs: Vec::new(),
        cubins: 0,
        problems: Vec::new(),
        warnings: Vec::new(),
    };
    match WheelFilename::parse(&wheel_name) {
        Ok(filename) => report.filename = Some(filename),
        Err(error) => report.problem(&wheel_name, error.to_string()),
    }

    let raw = match central_directory(bytes) {
        Ok(raw) => raw,
        Err(message) => {
            report.problem(&wheel_name, format!("is not a zip archive: {message}"));
            return report;
        }
    };
    let mut skip = BTreeSet::new();
    let mut seen = BTreeSet::new();
    let mut content = 0u64;
    for entry in &raw {
        let name = String::from_utf8_lossy(&entry.name).into_owned();
        if std::str::from_utf8(&entry.name).is_err() {
            report.problem(&name, "the name is not UTF-8");
            skip.insert(name.clone());
        }
        if let Some(unicode) = entry.unicode_path.as_ref().filter(|u| **u != entry.name) {
            report.problem(
                &name,
                format!(
                    "has an Info-ZIP Unicode Path extra field naming `{}`: an extractor \
                     would write that path, not this one",
                    String::from_utf8_lossy(unicode).escape_debug()
                ),
            );
            skip.insert(name.clone());
        }
        content = content.saturating_add(entry.uncompressed_size);
        if entry.uncompressed_size > MAX_ENTRY_SIZE {
            report.problem(
                &name,
                format!(
                    "claims {} bytes, over the {MAX_ENTRY_SIZE}-byte cap on a wheel entry",
                    entry.uncompressed_size
                ),
            );
            skip.insert(name.clone());
        } else if entry.uncompressed_size > 1 << 20
            && entry.uncompressed_size / entry.compressed_size.max(1) > MAX_ENTRY_RATIO
        {
            report.problem(
                &name,
                format!(
                    "inflates {} bytes to {}, more than {MAX_ENTRY_RATIO}:1; refused as a \
                     decompression bomb",
                    entry.compressed_size, entry.uncompressed_size
                ),
            );
            skip.insert(name.clone());
        }
        let mode = (entry.host == 3).then_some(entry.external_attributes >> 16);
        let kind = mode.map(|mode| mode & S_IFMT);
        if kind == Some(S_IFLNK) {
            report.problem(&name, "is a symbolic link; wheels hold regular files only");
            skip.insert(name.clone());
        } else if name.ends_with('/') || kind == Some(S_IFDIR) {
            report.problem(&name, "is a directory entry; wheels list files only");
            skip.insert(name.clone());
        } else if let Some(kind) = kind.filter(|&kind| kind != 0 && kind != S_IFREG) {
            report.problem(
                &name,
                format!("has file type {kind:#o}, not a regular file"),
            );
            skip.insert(name.clone());
        } else if let Some(reason) = path_problem(&name) {
            report.problem(&name, reason);
            skip.insert(name.clone());
        }
        if !seen.insert(name.clone()) {
            report.problem(&name, "appears twice in the archive");
        }
    }
    if content > MAX_WHEEL_CONTENT {
        report.problem(
            &wheel_name,
            format!(
                "holds {content} bytes uncompressed, over the {MAX_WHEEL_CONTENT}-byte cap; \
                 nothing was extracted"
            ),
        );
        return report;
    }

    let mut archive = match zip::ZipArchive::new(Cursor::new(bytes)) {
        Ok(archive) => archive,
        Err(error) => {
            report.problem(
                &wheel_name,
                format!("cannot be read as a zip archive: {error}"),
            );
            return report;
        }
    };
    // The zip reader's entries, matched to the central directory's by local header offset
    // (the reader may hide a duplicate, so positions can differ).
    let by_offset: BTreeMap<u64, &RawEntry> = raw
        .iter()
        .map(|entry| (entry.local_offset, entry))
        .collect();
    // Path → bytes of every readable regular file, and the archive order.
    let mut contents: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut order = Vec::new();
    for index in 0..archive.len() {
        let mut file = match archive.by_index(index) {
            Ok(file) => file,
            Err(error) => {
                let name = raw
                    .get(index)
                    .map(|e| String::from_utf8_lossy(&e.name).into_owned())
                    .unwrap_or_else(|| format!("entry {index}"));
                report.problem(name, format!("cannot be read: {error}"));
                continue;
            }
        };
        let Some(entry) = by_offset.get(&file.header_start()) else {
            report.problem(
                file.name().escape_debug().to_string(),
                "is not an entry of the central directory",
            );
            continue;
        };
        // The name the hygiene checks judged; the reader must agree on it.
        let name = String::from_utf8_lossy(&entry.name).into_owned();
        if skip.contains(&name) {
            continue;
        }
        if file.name() != name {
            report.problem(
                &name,
                format!(
                    "is named `{}` by the zip reader: an extractor would write that path",
                    file.name().escape_debug()
                ),
            );
            continue;
        }
        let size = entry.uncompressed_size;
        let mut data = Vec::with_capacity(size.min(8 << 20) as usize);
        if let Err(error) = (&mut file).take(size + 1).read_to_end(&mut data) {
            report.problem(&name, format!("cannot be read from the archive: {error}"));
            continue;
        }
        if data.len() as u64 > size {
            report.problem(
                &name,
                format!("inflates past its recorded size of {size} bytes"),
            );
            continue;
        }
        order.push(name.clone());
        contents.insert(name, data);
    }
    report.files = contents.len();

    let Some(filename) = report.filename.clone() else {
        return report;
    };
    check_dist_info(&mut report, &filename, &wheel_name, &order, &contents);
    check_bundles(&mut report, &contents);
    audit_contents(&mut report, &filename, &contents);
    report
}

/// Walks the central directory (zip64 included) without trusting a zip reader's view of it.
fn central_directory(bytes: &[u8]) -> Result<Vec<RawEntry>, String> {
    const EOCD: u32 = 0x0605_4b50;
    const ZIP64_LOCATOR: u32 = 0x0706_4b50;
    const ZIP64_EOCD: u32 = 0x0606_4b50;
    const HEADER: u32 = 0x0201_4b50;
    let u16_at = |at: usize| -> Option<u16> {
        Some(u16::from_le_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
    };
    let u32_at = |at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
    };
    let u64_at = |at: usize| -> Option<u64> {
        Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
    };
    let lowest = bytes.len().saturating_sub(22 + usize::from(u16::MAX));
    let eocd = (lowest..=bytes.len().saturating_sub(22))
        .rev()
        .find(|&at| u32_at(at) == Some(EOCD))
        .ok_or("no end-of-central-directory record")?;
    let mut count = u64::from(u16_at(eocd + 10).ok_or("truncated")?);
    let mut offset = u64::from(u32_at(eocd + 16).ok_or("truncated")?);
    if count == 0xffff || offset == 0xffff_ffff {
        let locator = eocd.checked_sub(20).ok_or("truncated zip64 locator")?;
        if u32_at(locator) != Some(ZIP64_LOCATOR) {
            return Err("zip64 sizes without a zip64 locator".into());
        }
        let record = u64_at(locator + 8).ok_or("truncated zip64 locator")? as usize;
        if u32_at(record) != Some(ZIP64_EOCD) {
            return Err("the zip64 locator points at no zip64 record".into());
        }
        count = u64_at(record + 32).ok_or("truncated zip64 record")?;
        offset = u64_at(record + 48).ok_or("truncated zip64 record")?;
    }
    let mut entries = Vec::new();
    let mut at = usize::try_from(offset).map_err(|_| "central directory out of range")?;
    for n in 0..count {
        if u32_at(at) != Some(HEADER) {
            return Err(format!(
                "central directory entry {n} is not where the directory says"
            ));
        }
        let field = |at: usize| u16_at(at).map(usize::from).ok_or("truncated entry");
        let host = bytes.get(at + 5).copied().ok_or("truncated entry")?;
        let name_length = field(at + 28)?;
        let extra_length = field(at + 30)?;
        let comment_length = field(at + 32)?;
        let external_attributes = u32_at(at + 38).ok_or("truncated entry")?;
        let mut compressed_size = u64::from(u32_at(at + 20).ok_or("truncated entry")?);
        let mut uncompressed_size = u64::from(u32_at(at + 24).ok_or("truncated entry")?);
        let mut local_offset = u64::from(u32_at(at + 42).ok_or("truncated entry")?);
        let name = bytes
            .get(at + 46..at + 46 + name_length)
            .ok_or("truncated entry name")?
            .to_vec();
        let extra = bytes
            .get(at + 46 + name_length..at + 46 + name_length + extra_length)
            .ok_or("truncated extra field")?;
        let mut unicode_path = None;
        for (id, data) in extra_fields(extra) {
            match id {
                // Info-ZIP Unicode Path: version 1, CRC-32 of the raw name, the UTF-8 name.
                0x7075 => unicode_path = Some(data.get(5..).unwrap_or_default().to_vec()),
                // Zip64: the 64-bit sizes of the fields that hold 0xffffffff, in order.
                0x0001 => {
                    let mut values = data
                        .chunks_exact(8)
                        .map(|v| u64::from_le_bytes(v.try_into().expect("8 bytes")));
                    if uncompressed_size == 0xffff_ffff {
                        uncompressed_size = values.next().unwrap_or(u64::MAX);
                    }
                    if compressed_size == 0xffff_ffff {
                        compressed_size = values.next().unwrap_or(u64::MAX);
                    }
                    if local_offset == 0xffff_ffff {
                        local_offset = values.next().unwrap_or(u64::MAX);
                    }
                }
                _ => {}
            }
        }
        entries.push(RawEntry {
            name,
            host,
            external_attributes,
            unicode_path,
            compressed_size,
            uncompressed_size,
            local_offset,
        });
        at += 46 + name_length + extra_length + comment_length;
    }
    Ok(entries)
}

/// The (id, data) records of a zip extra field; a truncated record ends the walk.
fn extra_fields(mut extra: &[u8]) -> Vec<(u16, &[u8])> {
    let mut fields = Vec::new();
    while extra.len() >= 4 {
        let id = u16::from_le_bytes([extra[0], extra[1]]);
        let length = usize::from(u16::from_le_bytes([extra[2], extra[3]]));
        let Some(data) = extra.get(4..4 + length) else {
            break;
        };
        fields.push((id, data));
        extra = &extra[4 + length..];
    }
    fields
}

fn check_dist_info(
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
    for path in listed.keys() {
        if !contents.contains_key(*path) && !report.problems.iter().any(|p| p.file == *path) {
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

fn check_bundles(report: &mut VerifyReport, contents: &BTreeMap<String, Vec<u8>>) {
    let index_suffix = format!("_prebuilt/{INDEX_FILE}");
    let roots: Vec<String> = contents
        .keys()
        .filter(|name| *name == &index_suffix || name.ends_with(&format!("/{index_suffix}")))
        .map(|name| name[..name.len() - INDEX_FILE.len()].to_owned())
        .collect();
    for root in roots {
        check_bundle(report, contents, &root);
    }
}

/// Checks the bundle at `root` (`af3_kernels/_prebuilt/`) by extracting it and reading every
/// artifact the way the loader does.
fn check_bundle(report: &mut VerifyReport, contents: &BTreeMap<String, Vec<u8>>, root: &str) {
    let index_path = format!("{root}{INDEX_FILE}");
    let scratch = match tempfile::Builder::new().prefix("kwheel-verify-").tempdir() {
        Ok(dir) => dir,
        Err(error) => {
            report.problem(
                &index_path,
                format!("cannot be checked: no temporary directory ({error})"),
            );
            return;
        }
    };
    for (name, bytes) in contents.range(root.to_owned()..) {
        let Some(relative) = name.strip_prefix(root) else {
            break;
        };
        let target = scratch.path().join(relative);
        let written = target
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(&target, bytes));
        if let Err(error) = written {
            report.problem(name, format!("cannot be extracted to check it: {error}"));
            return;
        }
    }
    let bundle = match prebuilt::Bundle::open(scratch.path()) {
        Ok(bundle) => bundle,
        Err(error) => {
            report.problem(&index_path, bundle_message(&error, scratch.path(), root));
            return;
        }
    };
    let index = bundle.index();
    let mut failed = BTreeSet::new();
    let mut variants = 0;
    let mut remote = 0;
    for (kernel, record) in &index.kernels {
        for variant in &record.variants {
            let shipped = contents.contains_key(&format!("{root}{}", variant.artifact.path));
            if !shipped && index.store.is_some() {
                remote += 1;
                continue;
            }
            match bundle.read_artifact(kernel, variant) {
                Ok(_) => variants += 1,
                Err(error) => {
                    let file = error_path(&error)
                        .strip_prefix(scratch.path())
                        .ok()
                        .map(|path| format!("{root}{}", path.to_string_lossy()))
                        .unwrap_or_else(|| format!("{root}{}", variant.artifact.path));
                    if failed.insert(file.clone()) {
                        report.problem(file, bundle_message(&error, scratch.path(), root));
                    }
                }
            }
        }
    }

    let sources_root = format!("{root}{SOURCES_DIR}/");
    let sources = contents.keys().any(|name| name.starts_with(&sources_root));
    if sources {
        for (kernel, record) in &index.kernels {
            if record.recipe.is_none() {
                continue;
            }
            for (stable, digest) in &record.inputs.files {
                let path = format!("{sources_root}{stable}");
                match contents.get(&path) {
                    None => report.problem(
                        &path,
                        format!("is missing: kernel `{kernel}` includes it, and the JIT fallback compiles it"),
                    ),
                    Some(bytes) if sha256_hex(bytes) != *digest => report.problem(
                        &path,
                        format!(
                            "has sha256 {}, but the index records {digest} for kernel `{kernel}`",
                            sha256_hex(bytes)
                        ),
                    ),
                    Some(_) => {}
                }
            }
        }
    }
    report.bundles.push(BundleCheck {
        root: root.to_owned(),
        kernels: index.kernels.len(),
        variants,
        remote,
        sources,
    });
}

fn error_path(error: &BundleError) -> &Path {
    match error {
        BundleError::Read { path, .. }
        | BundleError::InvalidIndex { path, .. }
        | BundleError::UnsupportedFormat { path, .. }
        | BundleError::Refused { path, .. }
        | BundleError::Corrupt { path, .. }
        | BundleError::DigestMismatch { path, .. }
        | BundleError::Write { path, .. }
        | BundleError::UnsupportedLookup { path, .. } => path,
    }
}

/// A bundle error as a message about a file of the wheel: scratch paths become wheel paths.
fn bundle_message(error: &BundleError, scratch: &Path, root: &str) -> String {
    match error {
        BundleError::Read { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            "is missing, but the index lists it".to_owned()
        }
        BundleError::DigestMismatch {
            kernel,
            variant,
            expected,
            actual,
            ..
        } => format!(
            "decompresses to sha256 {actual}, but the index records {expected} (kernel `{kernel}`, {variant})"
        ),
        BundleError::Corrupt {
            kernel,
            variant,
            source,
            ..
        } => format!("does not decompress (kernel `{kernel}`, {variant}): {source}"),
        other => {
            let mut message = other.to_string();
            let mut cause = std::error::Error::source(other);
            while let Some(error) = cause {
                message.push_str(&format!(": {error}"));
                cause = error.source();
            }
            message.replace(&format!("{}/", scratch.display()), root)
        }
    }
}

fn audit_contents(
    report: &mut VerifyReport,
    filename: &WheelFilename,
    contents: &BTreeMap<String, Vec<u8>>,
) {
    let mut targets = Vec::new();
    for tag in filename.platform_tags() {
        match AuditTarget::for_platform(tag) {
            Some(target) => targets.push(target),
            None => report.warning(
                filename.to_string(),
                format!(
                    "no audit policy for platform tag `{tag}`: its host ELF files are not audited"
                ),
            ),
        }
    }
    for (name, bytes) in contents {
        let mut kind = None;
        for target in &targets {
            let audit = audit_file(target, name, bytes);
            kind = kind.or(audit.kind);
            for violation in audit.violations {
                report.problem(name, violation.message());
            }
        }
        let kind = kind.or_else(|| {
            bytes.starts_with(&object::elf::ELFMAG).then(|| {
                if prebuilt::cubin::is_cubin(bytes) {
                    ElfKind::Cubin
                } else {
                    ElfKind::Host
                }
            })
        });
        match kind {
            Some(ElfKind::Cubin) => report.cubins += 1,
            Some(ElfKind::Host) => report.host_elfs.push(name.clone()),
            None => {}
        }
    }
}
