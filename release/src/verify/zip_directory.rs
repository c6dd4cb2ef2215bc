//! The central directory of a zip as stored, walked without trusting a zip reader's view of
//! it: names, modes, sizes, extra fields, zip64.

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
}

pub(super) const S_IFMT: u32 = 0o170_000;
pub(super) const S_IFLNK: u32 = 0o120_000;
pub(super) const S_IFDIR: u32 = 0o040_000;
pub(super) const S_IFREG: u32 = 0o100_000;
/// Walks the central directory (zip64 included) without trusting a zip reader's view of it.
pub(super) fn central_directory(bytes: &[u8]) -> Result<Vec<RawEntry>, String> {
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
pub(super) fn extra_fields(mut extra: &[u8]) -> Vec<(u16, &[u8])> {
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

/// The file name in the local header at `offset`, as stored; `None` when there is no local
/// header there. Readers that stream a zip (and pip, which compares the two) take this name.
pub(super) fn local_name(bytes: &[u8], offset: u64) -> Option<&[u8]> {
    const LOCAL: u32 = 0x0403_4b50;
    let at = usize::try_from(offset).ok()?;
    let u16_at = |at: usize| -> Option<usize> {
        Some(usize::from(u16::from_le_bytes(
            bytes.get(at..at + 2)?.try_into().ok()?,
        )))
    };
    let signature = u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?);
    if signature != LOCAL {
        return None;
    }
    let length = u16_at(at + 26)?;
    bytes.get(at + 30..at + 30 + length)
}
