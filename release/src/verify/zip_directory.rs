//! The layout of a zip as stored, walked without trusting a zip reader's view of it, and held
//! to the one reading every reader agrees on.
//!
//! Zip readers disagree on archives whose records disagree: Python's `zipfile` (what pip
//! installs with) takes the zip64 end record directly before its locator whatever the locator
//! says, walks the central directory by its size and ignores the entry count, and shifts every
//! offset by the bytes it finds before the directory; a streaming reader walks local headers
//! and never looks at the directory. So an archive is read only when all of them must read it
//! alike (the rules uv and the package registry adopted):
//!
//! | record | must |
//! | --- | --- |
//! | end of central directory | be the last 22 bytes: no comment, nothing after it; one disk; its counts agree |
//! | zip64 locator, record | if a locator precedes the end record: one disk, pointing at a 56-byte record right before it, whose counts, size and offset the end record repeats (or saturates) |
//! | central directory | end exactly where the zip64 record (or the end record) begins, hold exactly the entries counted, each whole, on disk 0, without a comment, encryption or unknown flags, with well-formed extra fields (one zip64 field, sized for the fields it replaces) |
//! | local headers | agree with their directory entry on name, flags, method, CRC-32 and sizes (or a data descriptor that does) |
//! | coverage | the entries' local records tile the bytes before the directory: the first at 0, each starting where the one before ends, the last ending where the directory starts |

use prebuilt::untrusted::LittleEndianFields;

/// One entry of the central directory, as stored.
pub(super) struct RawEntry {
    pub(super) name: Vec<u8>,
    /// The host that wrote the entry (3 is Unix, whose mode is in the external attributes).
    pub(super) host: u8,
    pub(super) external_attributes: u32,
    /// The name in an Info-ZIP Unicode Path extra field (0x7075), which zip readers prefer.
    pub(super) unicode_path: Option<Vec<u8>>,
    /// Sizes as recorded (zip64 extra field included).
    pub(super) compressed_size: u64,
    pub(super) uncompressed_size: u64,
    /// Where its local header is: how an entry of the zip reader is matched to this one.
    pub(super) local_offset: u64,
    flags: u16,
    method: u16,
    crc32: u32,
}

/// The central directory, and where it starts.
pub(super) struct Directory {
    pub(super) entries: Vec<RawEntry>,
    offset: usize,
}

pub(super) const S_IFMT: u32 = 0o170_000;
pub(super) const S_IFLNK: u32 = 0o120_000;
pub(super) const S_IFDIR: u32 = 0o040_000;
pub(super) const S_IFREG: u32 = 0o100_000;

const EOCD: u32 = 0x0605_4b50;
const ZIP64_LOCATOR: u32 = 0x0706_4b50;
const ZIP64_EOCD: u32 = 0x0606_4b50;
const HEADER: u32 = 0x0201_4b50;
const LOCAL: u32 = 0x0403_4b50;
const DESCRIPTOR: u32 = 0x0807_4b50;
const EOCD_SIZE: usize = 22;
const LOCATOR_SIZE: usize = 20;
const ZIP64_EOCD_SIZE: usize = 56;
/// General-purpose flags a wheel may carry: deflate options (bits 1, 2), a data descriptor
/// (bit 3), UTF-8 names (bit 11). Anything else (encryption, patches, masked headers) is
/// refused.
const KNOWN_FLAGS: u16 = 0x0002 | 0x0004 | 0x0008 | 0x0800;
const DATA_DESCRIPTOR: u16 = 0x0008;
const UTF8_NAME: u16 = 0x0800;

/// The end records' view of the directory: where it is, how long, how many entries.
struct EndRecords {
    count: u64,
    size: u64,
    offset: u64,
    /// Where the directory must end: the zip64 record, else the end record.
    end: usize,
}

/// Reads the end-of-central-directory record and the zip64 records, refusing any
/// disagreement among them (see the module docs).
fn end_records(bytes: &[u8]) -> Result<EndRecords, String> {
    let fields = LittleEndianFields(bytes);
    let eocd = bytes
        .len()
        .checked_sub(EOCD_SIZE)
        .ok_or("too short for an end-of-central-directory record")?;
    if fields.u32(eocd) != Some(EOCD) {
        let lowest = bytes
            .len()
            .saturating_sub(EOCD_SIZE + usize::from(u16::MAX));
        return Err(
            match (lowest..eocd)
                .rev()
                .find(|&at| fields.u32(at) == Some(EOCD))
            {
                Some(at) => format!(
                    "{} bytes follow the end-of-central-directory record (a comment or appended \
                 data), which readers treat differently",
                    bytes.len() - at - EOCD_SIZE
                ),
                None => "no end-of-central-directory record".to_owned(),
            },
        );
    }
    let field = |at: usize| fields.u16(eocd + at).unwrap_or_default();
    if field(20) != 0 {
        return Err(format!("has a {}-byte archive comment", field(20)));
    }
    if field(4) != 0 || field(6) != 0 {
        return Err("spans several disks".to_owned());
    }
    if field(8) != field(10) {
        return Err(format!(
            "the end record counts {} entries on this disk and {} in all",
            field(8),
            field(10)
        ));
    }
    let count = u64::from(field(10));
    let size = u64::from(fields.u32(eocd + 12).unwrap_or_default());
    let offset = u64::from(fields.u32(eocd + 16).unwrap_or_default());
    let locator = eocd.checked_sub(LOCATOR_SIZE);
    let has_locator = locator.is_some_and(|at| fields.u32(at) == Some(ZIP64_LOCATOR));
    if !has_locator {
        if count == 0xffff || size == 0xffff_ffff || offset == 0xffff_ffff {
            return Err("the end record defers to zip64 records that are not there".to_owned());
        }
        return Ok(EndRecords {
            count,
            size,
            offset,
            end: eocd,
        });
    }
    let locator = locator.expect("checked above");
    // Python's zipfile reads the zip64 record right before the locator whatever the locator
    // says, the zip crate where the locator points: both must be the same 56 bytes.
    let record = locator
        .checked_sub(ZIP64_EOCD_SIZE)
        .ok_or("a zip64 locator with no room for its record")?;
    if fields.u32(locator + 4) != Some(0) || fields.u32(locator + 16) != Some(1) {
        return Err("the zip64 locator names another disk".to_owned());
    }
    let pointed = fields.u64(locator + 8).unwrap_or(u64::MAX);
    if pointed != record as u64 {
        return Err(format!(
            "the zip64 locator points at byte {pointed}, not at the zip64 record right \
             before it (byte {record})"
        ));
    }
    if fields.u32(record) != Some(ZIP64_EOCD) {
        return Err("no zip64 end record right before the zip64 locator".to_owned());
    }
    if fields.u64(record + 4) != Some((ZIP64_EOCD_SIZE - 12) as u64) {
        return Err("the zip64 end record has extensible data".to_owned());
    }
    if fields.u32(record + 16) != Some(0) || fields.u32(record + 20) != Some(0) {
        return Err("the zip64 end record names another disk".to_owned());
    }
    let value = |at: usize| fields.u64(record + at).unwrap_or(u64::MAX);
    let (on_disk, count64, size64, offset64) = (value(24), value(32), value(40), value(48));
    if on_disk != count64 {
        return Err(format!(
            "the zip64 end record counts {on_disk} entries on this disk and {count64} in all"
        ));
    }
    for (what, short, saturated, long) in [
        ("entry count", count, 0xffff, count64),
        ("directory size", size, 0xffff_ffff, size64),
        ("directory offset", offset, 0xffff_ffff, offset64),
    ] {
        if short != saturated && short != long {
            return Err(format!(
                "the end record's {what} is {short} and the zip64 record's {long}"
            ));
        }
    }
    Ok(EndRecords {
        count: count64,
        size: size64,
        offset: offset64,
        end: record,
    })
}

/// Walks the central directory the end records describe, refusing any disagreement between
/// them and it (see the module docs).
pub(super) fn central_directory(bytes: &[u8]) -> Result<Directory, String> {
    let end = end_records(bytes)?;
    let start = usize::try_from(end.offset)
        .ok()
        .filter(|&start| start <= end.end)
        .ok_or_else(|| {
            format!(
                "the central directory offset {} is past the end records",
                end.offset
            )
        })?;
    if (end.end - start) as u64 != end.size {
        return Err(format!(
            "the central directory is recorded as {} bytes at byte {start}, but {} bytes lie \
             between it and the end records",
            end.size,
            end.end - start
        ));
    }
    let mut entries = Vec::new();
    let mut at = start;
    while at < end.end {
        let n = entries.len();
        let directory = &bytes[..end.end];
        let entry = LittleEndianFields(directory);
        if entry.u32(at) != Some(HEADER) {
            return Err(format!(
                "central directory entry {n} (byte {at}) does not start with its signature"
            ));
        }
        let truncated = || format!("central directory entry {n} runs past the directory");
        let name_length = usize::from(entry.u16(at + 28).ok_or_else(truncated)?);
        let extra_length = usize::from(entry.u16(at + 30).ok_or_else(truncated)?);
        let comment_length = usize::from(entry.u16(at + 32).ok_or_else(truncated)?);
        let next = at + 46 + name_length + extra_length + comment_length;
        if next > end.end {
            return Err(truncated());
        }
        let name = bytes[at + 46..at + 46 + name_length].to_vec();
        let shown = String::from_utf8_lossy(&name).escape_debug().to_string();
        let refuse = |reason: &str| Err(format!("`{shown}` {reason}"));
        let flags = entry.u16(at + 8).unwrap_or_default();
        let method = entry.u16(at + 10).unwrap_or_default();
        if comment_length != 0 {
            return refuse("has a comment in the central directory");
        }
        if flags & !KNOWN_FLAGS != 0 {
            return refuse(&format!(
                "has general-purpose flags {flags:#06x}: encrypted or otherwise not plainly \
                 readable"
            ));
        }
        if flags & UTF8_NAME == 0 && !name.is_ascii() {
            return refuse(
                "has a non-ASCII name without the UTF-8 flag: readers decode it as CP437",
            );
        }
        if method != 0 && method != 8 {
            return refuse(&format!(
                "uses compression method {method}, not stored (0) or deflate (8)"
            ));
        }
        if method == 0 && flags & DATA_DESCRIPTOR != 0 {
            // A deflate stream marks its own end; stored bytes do not, so a reader of local
            // headers finds the end only by searching for a descriptor the data may hold.
            return refuse(
                "is stored uncompressed with a data descriptor: a streaming reader finds its \
                 end by searching its data for a signature, and may stop elsewhere",
            );
        }
        if entry.u16(at + 34) != Some(0) {
            return refuse("starts on another disk");
        }
        let mut compressed_size = u64::from(entry.u32(at + 20).unwrap_or_default());
        let mut uncompressed_size = u64::from(entry.u32(at + 24).unwrap_or_default());
        let mut local_offset = u64::from(entry.u32(at + 42).unwrap_or_default());
        let extra = &bytes[at + 46 + name_length..at + 46 + name_length + extra_length];
        let records = extra_fields(extra).map_err(|reason| format!("`{shown}` {reason}"))?;
        let mut unicode_path = None;
        let mut zip64 = None;
        for (id, data) in records {
            match id {
                // Info-ZIP Unicode Path: version 1, CRC-32 of the raw name, the UTF-8 name.
                0x7075 => unicode_path = Some(data.get(5..).unwrap_or_default().to_vec()),
                0x0001 => zip64 = Some(data),
                _ => {}
            }
        }
        // Zip64: the 64-bit values of the fields that hold 0xffffffff, in this order, and
        // nothing else (readers disagree on a field too short or too long).
        let saturated = [
            uncompressed_size == 0xffff_ffff,
            compressed_size == 0xffff_ffff,
            local_offset == 0xffff_ffff,
        ];
        let wanted = saturated.iter().filter(|&&s| s).count() * 8;
        match zip64 {
            None if wanted > 0 => return refuse("defers its sizes to a zip64 field it lacks"),
            Some(data) if data.len() != wanted => {
                return refuse(&format!(
                    "has a {}-byte zip64 extra field where its header defers {wanted} bytes \
                     of sizes",
                    data.len()
                ))
            }
            Some(data) => {
                let mut values = data
                    .chunks_exact(8)
                    .map(|v| u64::from_le_bytes(v.try_into().expect("8 bytes")));
                for (field, is_saturated) in [
                    &mut uncompressed_size,
                    &mut compressed_size,
                    &mut local_offset,
                ]
                .into_iter()
                .zip(saturated)
                {
                    if is_saturated {
                        *field = values.next().expect("sized above");
                    }
                }
            }
            None => {}
        }
        if method == 0 && compressed_size != uncompressed_size {
            return refuse(&format!(
                "is stored uncompressed but records {compressed_size} bytes stored and \
                 {uncompressed_size} bytes of content"
            ));
        }
        entries.push(RawEntry {
            name,
            host: bytes[at + 5],
            external_attributes: entry.u32(at + 38).unwrap_or_default(),
            unicode_path,
            compressed_size,
            uncompressed_size,
            local_offset,
            flags,
            method,
            crc32: entry.u32(at + 16).unwrap_or_default(),
        });
        at = next;
    }
    if entries.len() as u64 != end.count {
        return Err(format!(
            "the end records count {} entries but the central directory holds {}: readers \
             that trust the count see fewer files than pip installs",
            end.count,
            entries.len()
        ));
    }
    Ok(Directory {
        entries,
        offset: start,
    })
}

/// The (id, data) records of a zip extra field; a truncated record or an id that appears
/// twice is refused (readers disagree on which copy counts).
fn extra_fields(mut extra: &[u8]) -> Result<Vec<(u16, &[u8])>, String> {
    let mut fields: Vec<(u16, &[u8])> = Vec::new();
    while !extra.is_empty() {
        let Some(header) = extra.get(..4) else {
            return Err(format!(
                "has {} stray bytes at the end of its extra field",
                extra.len()
            ));
        };
        let id = u16::from_le_bytes([header[0], header[1]]);
        let length = usize::from(u16::from_le_bytes([header[2], header[3]]));
        let Some(data) = extra.get(4..4 + length) else {
            return Err(format!("has a truncated extra field record {id:#06x}"));
        };
        if fields.iter().any(|(seen, _)| *seen == id) {
            return Err(format!("has extra field record {id:#06x} twice"));
        }
        fields.push((id, data));
        extra = &extra[4 + length..];
    }
    Ok(fields)
}

/// What is wrong with one entry's local record, or with the bytes the entries leave
/// unclaimed: (the entry's index, or `None` for the archive, and the problem).
pub(super) fn local_problems(bytes: &[u8], directory: &Directory) -> Vec<(Option<usize>, String)> {
    let mut problems = case_collisions(directory);
    // (start, end, index) of every local record that could be measured.
    let mut spans = Vec::new();
    for (index, entry) in directory.entries.iter().enumerate() {
        match local_record(bytes, entry, directory.offset) {
            Ok(end) => spans.push((entry.local_offset as usize, end, index)),
            Err(problem) => problems.push((Some(index), problem)),
        }
    }
    if spans.len() < directory.entries.len() {
        return problems;
    }
    spans.sort_unstable();
    let mut expected = 0usize;
    for &(start, end, index) in &spans {
        let name = String::from_utf8_lossy(&directory.entries[index].name)
            .escape_debug()
            .to_string();
        if start < expected {
            problems.push((
                Some(index),
                format!("overlaps the entry before it (its local header is at byte {start})"),
            ));
        } else if start > expected {
            problems.push((
                None,
                format!(
                    "bytes {expected}..{start}, before `{name}`, belong to no entry: a \
                     reader of local headers may find another file there"
                ),
            ));
        }
        expected = expected.max(end);
    }
    if expected < directory.offset {
        problems.push((
            None,
            format!(
                "bytes {expected}..{}, before the central directory, belong to no entry: a \
                 reader of local headers may find another file there",
                directory.offset
            ),
        ));
    }
    problems
}

/// Checks an entry's local header (and data descriptor) against its directory entry; where
/// its record ends.
fn local_record(bytes: &[u8], entry: &RawEntry, directory: usize) -> Result<usize, String> {
    let local = LittleEndianFields(&bytes[..directory]);
    let at = usize::try_from(entry.local_offset)
        .ok()
        .filter(|&at| local.u32(at) == Some(LOCAL))
        .ok_or("has no local header where the central directory says")?;
    let truncated = || "has a local header that runs into the central directory".to_owned();
    let name_length = usize::from(local.u16(at + 26).ok_or_else(truncated)?);
    let extra_length = usize::from(local.u16(at + 28).ok_or_else(truncated)?);
    let data = at + 30 + name_length + extra_length;
    if data > directory {
        return Err(truncated());
    }
    let name = &bytes[at + 30..at + 30 + name_length];
    if name != entry.name.as_slice() {
        return Err(format!(
            "is named `{}` by its local header: a reader of local headers would write that \
             path, and pip refuses the wheel",
            String::from_utf8_lossy(name).escape_debug()
        ));
    }
    let flags = local.u16(at + 6).unwrap_or_default();
    let method = local.u16(at + 8).unwrap_or_default();
    if flags != entry.flags {
        return Err(format!(
            "has flags {flags:#06x} in its local header and {:#06x} in the central directory",
            entry.flags
        ));
    }
    if method != entry.method {
        return Err(format!(
            "is compressed with method {method} by its local header and {} by the central \
             directory",
            entry.method
        ));
    }
    let extra = extra_fields(&bytes[at + 30 + name_length..data])?;
    let local_zip64 = extra.iter().find(|(id, _)| *id == 0x0001).map(|(_, d)| *d);
    let mut crc32 = local.u32(at + 14).unwrap_or_default();
    let mut compressed = u64::from(local.u32(at + 18).unwrap_or_default());
    let mut uncompressed = u64::from(local.u32(at + 22).unwrap_or_default());
    if let Some(zip64) = local_zip64 {
        // A local zip64 field holds both sizes, uncompressed first.
        let value = |n: usize| LittleEndianFields(zip64).u64(n * 8);
        if uncompressed == 0xffff_ffff {
            uncompressed = value(0).unwrap_or(u64::MAX);
        }
        if compressed == 0xffff_ffff {
            compressed = value(1).unwrap_or(u64::MAX);
        }
    }
    let end = usize::try_from(entry.compressed_size)
        .ok()
        .and_then(|size| data.checked_add(size))
        .filter(|&end| end <= directory)
        .ok_or("has data that runs into the central directory")?;
    let mut record_end = end;
    if flags & DATA_DESCRIPTOR != 0 {
        // The header's own values must be unset or already right.
        for (what, value, central) in [
            ("CRC-32", u64::from(crc32), u64::from(entry.crc32)),
            ("compressed size", compressed, entry.compressed_size),
            ("size", uncompressed, entry.uncompressed_size),
        ] {
            if value != 0 && value != central {
                return Err(format!(
                    "has {what} {value} in its local header and {central} in the central \
                     directory: readers would extract different bytes"
                ));
            }
        }
        // Sizes in the local header are zero (or already right); the descriptor after the
        // data holds them, with or without its signature, 8-byte sizes under zip64.
        let signed = local.u32(end) == Some(DESCRIPTOR);
        let mut at = end + if signed { 4 } else { 0 };
        crc32 = local
            .u32(at)
            .ok_or("has a data descriptor past the archive")?;
        at += 4;
        let wide = local_zip64.is_some();
        let (c, u) = if wide {
            (local.u64(at), local.u64(at + 8))
        } else {
            (
                local.u32(at).map(u64::from),
                local.u32(at + 4).map(u64::from),
            )
        };
        let (Some(c), Some(u)) = (c, u) else {
            return Err("has a data descriptor past the archive".to_owned());
        };
        (compressed, uncompressed) = (c, u);
        record_end = at + if wide { 16 } else { 8 };
    }
    for (what, local, central) in [
        ("CRC-32", u64::from(crc32), u64::from(entry.crc32)),
        ("compressed size", compressed, entry.compressed_size),
        ("size", uncompressed, entry.uncompressed_size),
    ] {
        if local != central {
            return Err(format!(
                "has {what} {local} in its local record and {central} in the central \
                 directory: readers would extract different bytes"
            ));
        }
    }
    Ok(record_end)
}

/// Entries whose path, or a folder on it, differs from an earlier entry's only by letter case
/// (`demo/A.py` after `demo/a.py`, `Demo/x.py` after `demo/y.py`): one file or folder on the
/// case-insensitive file systems of macOS and Windows, where what pip installs would then
/// depend on archive order. Names that are equal are the caller's duplicates.
fn case_collisions(directory: &Directory) -> Vec<(Option<usize>, String)> {
    let mut seen: std::collections::BTreeMap<String, String> = Default::default();
    let mut problems = Vec::new();
    for (index, entry) in directory.entries.iter().enumerate() {
        let name = String::from_utf8_lossy(&entry.name);
        let ends = name
            .match_indices('/')
            .map(|(at, _)| at)
            .chain(std::iter::once(name.len()));
        for end in ends {
            let path = &name[..end];
            let earlier = seen
                .entry(path.to_lowercase())
                .or_insert_with(|| path.to_owned());
            if earlier != path {
                problems.push((
                    Some(index),
                    format!(
                        "differs from `{}` only by letter case: they are one {} on \
                         case-insensitive file systems, where an install keeps one of them",
                        earlier.escape_debug(),
                        if end == name.len() { "file" } else { "folder" }
                    ),
                ));
                break;
            }
        }
    }
    problems
}
