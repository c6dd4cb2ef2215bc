//! Line tables without file times: nvcc and NVRTC (12.9 and 13.0) write each source file's
//! modification time into the `.debug_line` file table of a `-lineinfo` or `-G` cubin, the
//! library's files and the toolkit headers whose device code was inlined alike (measured:
//! `h.cuh` touched to 2001-01-01 gives `978307200` in the table; `cuda_fp16.hpp` its pip
//! install time). Those times differ between a checkout, a bundle's shipped `sources/` and
//! each user's toolkit, so the same key would give other bytes in the JIT than in the bundler.
//! [`without_file_times`] sets every such time to 0 in place. A cubin for sm_100 and later
//! (ptxas 12.9 and 13.0) has a second line table, `.nv.merc.debug_line`, with the same times;
//! both are cleared ([`LINE_TABLES`]).
//!
//! A DWARF 2–4 line program header lists its files as (name, directory index, time, length),
//! the last three ULEB128. Each time is rewritten as 0 in as many bytes as it had (ULEB128
//! allows the padded form `80 80 80 80 00`), so no offset, size or relocation moves. Times
//! from 1978 to 3058 take five bytes, so they all give the same bytes; a time below 2^28 s
//! (a file stamped near the epoch) keeps its shorter length. PTX needs nothing: nvcc's `.file`
//! directives carry no times, and ptxas writes none from them.

use object::elf::FileHeader64;
use object::read::elf::{FileHeader, SectionHeader};
use object::LittleEndian;

use crate::untrusted::LittleEndianFields;

/// The sections that hold DWARF line tables: every `-lineinfo` cubin's, and the copy that
/// cubins for sm_100 and later carry beside it.
pub const LINE_TABLES: [&str; 2] = [".debug_line", ".nv.merc.debug_line"];

/// `cubin` with every file time in its line tables set to 0; anything that is not an ELF with
/// one of [`LINE_TABLES`] (PTX, a cubin built without line info) is returned as it is.
pub fn without_file_times(mut cubin: Vec<u8>) -> Vec<u8> {
    clear_file_times(&mut cubin);
    cubin
}

/// [`without_file_times`] in place: for a cubin that sits inside other bytes (a module's
/// fatbin), whose size must not change.
pub fn clear_file_times(cubin: &mut [u8]) {
    for (start, end) in line_table_ranges(cubin) {
        for (offset, length) in file_time_fields(&cubin[start..end]) {
            let time = &mut cubin[start + offset..start + offset + length];
            time.fill(0x80);
            time[length - 1] = 0;
        }
    }
}

/// The file range of each of [`LINE_TABLES`] that the cubin has, in that order.
fn line_table_ranges(bytes: &[u8]) -> Vec<(usize, usize)> {
    let endian = LittleEndian;
    let Ok(header) = FileHeader64::<LittleEndian>::parse(bytes) else {
        return Vec::new();
    };
    let Ok(sections) = header.sections(endian, bytes) else {
        return Vec::new();
    };
    LINE_TABLES
        .iter()
        .filter_map(|name| {
            let (_, section) = sections.section_by_name(endian, name.as_bytes())?;
            let (offset, size) = section.file_range(endian)?;
            let start = usize::try_from(offset).ok()?;
            let end = start.checked_add(usize::try_from(size).ok()?)?;
            (end <= bytes.len()).then_some((start, end))
        })
        .collect()
}

/// The file times `cubin`'s line tables record, one per file entry, table by table in the
/// order of [`LINE_TABLES`] (none without line info).
pub fn file_times(cubin: &[u8]) -> Vec<u64> {
    line_table_ranges(cubin)
        .into_iter()
        .flat_map(|(start, end)| {
            let section = &cubin[start..end];
            file_time_fields(section)
                .into_iter()
                .map(move |(offset, length)| {
                    section[offset..offset + length]
                        .iter()
                        .rev()
                        .fold(0u64, |value, byte| value << 7 | u64::from(byte & 0x7f))
                })
        })
        .collect()
}

/// (offset, length) in `section` of every file time of every line program header in it. A
/// unit whose header does not parse, or of a DWARF version other than 2–4, is left out.
fn file_time_fields(section: &[u8]) -> Vec<(usize, usize)> {
    let mut found = Vec::new();
    let mut unit = 0;
    while unit < section.len() {
        let mut reader = Reader {
            bytes: section,
            at: unit,
            wide: false,
        };
        let Some(end) = reader.unit_end() else {
            break;
        };
        if let Some(times) = unit_file_times(&mut reader, end) {
            found.extend(times);
        }
        unit = end;
    }
    found
}

/// The file times of the unit whose header `reader` is at, after its length field.
fn unit_file_times(reader: &mut Reader<'_>, end: usize) -> Option<Vec<(usize, usize)>> {
    let version = reader.u16()?;
    if !(2..=4).contains(&version) {
        return None;
    }
    let header_length = reader.offset()?;
    let header_end = reader.at.checked_add(header_length)?;
    if header_end > end {
        return None;
    }
    let reader = &mut Reader {
        bytes: &reader.bytes[..header_end],
        at: reader.at,
        wide: reader.wide,
    };
    // minimum_instruction_length, [maximum_operations_per_instruction], default_is_stmt,
    // line_base, line_range, then opcode_base and its standard_opcode_lengths.
    reader.skip(if version >= 4 { 5 } else { 4 })?;
    let opcode_base = reader.u8()?;
    reader.skip(usize::from(opcode_base).saturating_sub(1))?;
    while !reader.string()?.is_empty() {}
    let mut times = Vec::new();
    loop {
        if reader.string()?.is_empty() {
            return Some(times);
        }
        reader.uleb()?;
        let start = reader.at;
        reader.uleb()?;
        times.push((start, reader.at - start));
        reader.uleb()?;
    }
}

/// A cursor over `.debug_line` bytes; every read is bounds-checked.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    /// The unit is of DWARF's 64-bit format (8-byte offsets).
    wide: bool,
}

impl Reader<'_> {
    fn take(&mut self, count: usize) -> Option<&[u8]> {
        let end = self.at.checked_add(count)?;
        let taken = self.bytes.get(self.at..end)?;
        self.at = end;
        Some(taken)
    }

    fn skip(&mut self, count: usize) -> Option<()> {
        self.take(count).map(|_| ())
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|bytes| bytes[0])
    }

    fn u16(&mut self) -> Option<u16> {
        LittleEndianFields(self.take(2)?).u16(0)
    }

    /// The unit's end, reading its `unit_length` (32-bit, or 64-bit after `0xffffffff`).
    fn unit_end(&mut self) -> Option<usize> {
        let short = LittleEndianFields(self.take(4)?).u32(0)?;
        let length = if short == u32::MAX {
            self.wide = true;
            LittleEndianFields(self.take(8)?).u64(0)?
        } else {
            self.wide = false;
            u64::from(short)
        };
        let end = self.at.checked_add(usize::try_from(length).ok()?)?;
        (end <= self.bytes.len()).then_some(end)
    }

    /// A section offset: 32-bit, or 64-bit in a unit of the 64-bit format.
    fn offset(&mut self) -> Option<usize> {
        if self.wide {
            usize::try_from(LittleEndianFields(self.take(8)?).u64(0)?).ok()
        } else {
            usize::try_from(LittleEndianFields(self.take(4)?).u32(0)?).ok()
        }
    }

    /// A NUL-terminated string, without its NUL.
    fn string(&mut self) -> Option<&[u8]> {
        let rest = self.bytes.get(self.at..)?;
        let length = rest.iter().position(|&byte| byte == 0)?;
        self.at += length + 1;
        Some(&rest[..length])
    }

    /// An unsigned LEB128 number, skipped (at most 10 bytes).
    fn uleb(&mut self) -> Option<()> {
        for _ in 0..10 {
            if self.u8()? & 0x80 == 0 {
                return Some(());
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `.debug_line` unit NVRTC 12.9 wrote for `k.cu` including `h.cuh`, both touched to
    /// 2001-01-01 (as `readelf --debug-dump=rawline` prints it), up to its line program.
    fn nvrtc_header(times: [&[u8]; 2]) -> Vec<u8> {
        let mut files = Vec::new();
        for (name, time, size) in [(&b"k.cu"[..], times[0], 123u8), (b"h.cuh", times[1], 70)] {
            files.extend([name, b"\0\x01", time, &[size]].concat());
        }
        files.push(0);
        let directory = b"/tmp/kwheel-c972fc7373802041/src\0\0";
        let mut header = vec![1, 1, 0xfb, 14, 10];
        header.extend([0, 1, 1, 1, 1, 0, 0, 0, 1]);
        header.extend(directory);
        header.extend(files);
        let program = [0u8, 9, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1];
        let mut unit = 2u16.to_le_bytes().to_vec();
        unit.extend(u32::try_from(header.len()).unwrap().to_le_bytes());
        unit.extend(header);
        unit.extend(program);
        let mut section = u32::try_from(unit.len()).unwrap().to_le_bytes().to_vec();
        section.extend(unit);
        section
    }

    /// 978307200 (2001-01-01) as ULEB128.
    const TIME_2001: &[u8] = &[0x80, 0x91, 0xbf, 0xd2, 0x03];

    #[test]
    fn each_file_entrys_time_is_found_with_its_length() {
        let section = nvrtc_header([TIME_2001, &[0x01]]);
        let fields = file_time_fields(&section);
        assert_eq!(fields.len(), 2, "{fields:?}");
        assert_eq!(&section[fields[0].0..][..fields[0].1], TIME_2001);
        assert_eq!(fields[1].1, 1);
        // Two units one after the other: both are read.
        let twice = [section.clone(), section].concat();
        assert_eq!(file_time_fields(&twice).len(), 4);
    }

    #[test]
    fn a_cut_or_foreign_header_yields_no_times_and_no_panic() {
        let section = nvrtc_header([TIME_2001, TIME_2001]);
        for cut in 0..section.len() - 14 {
            assert!(file_time_fields(&section[..cut]).len() <= 2);
        }
        let mut version_5 = section.clone();
        version_5[4] = 5;
        assert!(file_time_fields(&version_5).is_empty());
        assert_eq!(without_file_times(b"not an ELF".to_vec()), b"not an ELF");
    }
}
