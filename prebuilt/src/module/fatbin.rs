//! The device code inside an extension module: the `.nv_fatbin` section that nvcc's host
//! objects embed and the linker concatenates, read without CUDA, and what each of its cubins
//! (or PTX texts) holds.
//!
//! The section is a run of containers, one per translation unit with device code, each a
//! 16-byte header and then its entries back to back, each an entry header and its payload:
//!
//! ```text
//! .nv_fatbin ─► container ─► header: magic 0xba55ed50 (u32), version (u16), header size (u16), body size (u64)
//!           │             └► entry ─► header (0x40 bytes or more) ─► payload (padded to 8 bytes)
//!           │             └► entry ─► …
//!           └► (zeros: alignment) container (the next unit) …
//! ```
//!
//! | entry field | offset | what it is |
//! | --- | --- | --- |
//! | kind | 0x00, `u16` | 1 PTX, 2 an ELF cubin |
//! | header size | 0x04, `u32` | where the payload starts (0x40, 0x68, 0x98: it grew with CUDA 13) |
//! | padded payload size | 0x08, `u64` | where the next entry starts, after the payload |
//! | payload size | 0x10, `u32` | the stored payload without its padding (compressed entries) |
//! | SM | 0x1c, `u32` | 90, 100: the cubin's SM, or the PTX's virtual arch |
//! | flags | 0x28, `u64` | `0x2000` LZ4-compressed, `0x8000` zstd-compressed |
//! | uncompressed size | 0x38, `u64` | the payload's size once decompressed |
//!
//! Offsets were read on modules built by nvcc 13.0 (every entry zstd-compressed, flags
//! `0x108011`, the uncompressed size equal to the zstd frame's content size) and agree with
//! the published reverse-engineered layouts. nvcc 12 compresses with LZ4 when asked
//! (`-Xfatbin -compress-all`); such an entry is reported, not read.
//!
//! These bytes may come from a wheel built elsewhere: every size is checked against the
//! section before it is used, a payload is inflated only up to [`MAX_ENTRY_SIZE`] and its
//! declared size, and nothing panics on a truncated or crafted section.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::io::Read as _;

use object::elf::{FileHeader64, SHT_NOBITS};
use object::read::elf::{FileHeader, SectionHeader};
use object::LittleEndian;

use crate::cubin::{
    entry_resources, inspect_cubin, stub_entries, validate_cubin, with_aligned, CubinError,
};
use crate::index::ModuleDeviceCode;
use crate::untrusted::LittleEndianFields;
use crate::{Arch, ArchKind};

/// The ELF section of a host object or shared library that holds its fatbin.
pub const FATBIN_SECTION: &str = ".nv_fatbin";

/// The magic number that opens each fatbin container.
const CONTAINER_MAGIC: u32 = 0xba55_ed50;
/// The smallest container header: magic, version, header size, body size.
const CONTAINER_HEADER_SIZE: usize = 16;
/// The smallest entry header: every field this reader reads lies inside it.
const ENTRY_HEADER_SIZE: usize = 0x40;

const ENTRY_KIND_PTX: u16 = 1;
const ENTRY_KIND_CUBIN: u16 = 2;

const ENTRY_FLAG_LZ4: u64 = 0x2000;
const ENTRY_FLAG_ZSTD: u64 = 0x8000;
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// Largest payload inflated from one entry. Cubins built with `-lineinfo` are large (GPTQModel's
/// Hadamard transform: 45 MB for `sm_100a`); 256 MiB leaves room and still bounds what a
/// crafted entry can make the reader hold.
pub const MAX_ENTRY_SIZE: u64 = 256 << 20;

/// What an entry of a fatbin holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    /// PTX text.
    Ptx,
    /// An ELF cubin.
    Cubin,
    /// Something this reader does not read (the kind number).
    Other(u16),
}

/// How an entry's payload is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// As is.
    None,
    /// A zstd frame (nvcc 13).
    Zstd,
    /// LZ4 (nvcc 12 with `-compress-all`): reported, not read.
    Lz4,
}

/// One entry of a fatbin, its payload still as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FatbinEntry<'a> {
    /// Where its header starts in the section, for messages.
    pub offset: usize,
    /// What it holds.
    pub kind: EntryKind,
    /// The SM its header names (the PTX's virtual arch for PTX).
    pub sm: u32,
    /// How its payload is stored.
    pub compression: Compression,
    /// The payload's size once decompressed, as the header says.
    pub uncompressed_size: u64,
    stored: &'a [u8],
}

impl<'a> FatbinEntry<'a> {
    /// The payload, decompressed: never more than [`MAX_ENTRY_SIZE`] or the size the header
    /// declares, whichever is smaller, and exactly that size.
    pub fn payload(&self) -> Result<Cow<'a, [u8]>, FatbinError> {
        let malformed = |what: String| FatbinError::Malformed {
            offset: self.offset,
            what,
        };
        match self.compression {
            Compression::None => Ok(Cow::Borrowed(self.stored)),
            Compression::Lz4 => Err(FatbinError::Lz4 {
                offset: self.offset,
                sm: self.sm,
            }),
            Compression::Zstd => {
                if self.uncompressed_size > MAX_ENTRY_SIZE {
                    return Err(FatbinError::TooLarge {
                        offset: self.offset,
                        sm: self.sm,
                        size: self.uncompressed_size,
                    });
                }
                let decoder = zstd::stream::read::Decoder::with_buffer(self.stored)
                    .map_err(|error| malformed(format!("cannot start zstd: {error}")))?;
                let mut payload = Vec::new();
                // One byte past the declared size tells a frame that holds more.
                decoder
                    .take(self.uncompressed_size.saturating_add(1))
                    .read_to_end(&mut payload)
                    .map_err(|error| malformed(format!("the zstd payload is corrupt: {error}")))?;
                if payload.len() as u64 != self.uncompressed_size {
                    return Err(malformed(format!(
                        "the header declares {} bytes uncompressed, the payload inflates to {}{}",
                        self.uncompressed_size,
                        payload.len(),
                        if payload.len() as u64 > self.uncompressed_size {
                            " or more"
                        } else {
                            ""
                        }
                    )));
                }
                Ok(Cow::Owned(payload))
            }
        }
    }
}

/// Why a module's fatbin cannot be read, or does not hold what the module declares.
#[derive(Debug, thiserror::Error)]
pub enum FatbinError {
    /// The module is not an ELF file whose section table can be read.
    #[error("cannot read the module's sections: {what}")]
    Elf {
        /// What failed.
        what: String,
    },
    /// The section or a container or entry in it is cut short or does not add up.
    #[error("the fatbin is malformed at byte {offset} of `.nv_fatbin`: {what}")]
    Malformed {
        /// Where, in the section.
        offset: usize,
        /// What does not hold.
        what: String,
    },
    /// An LZ4-compressed entry, which this reader does not inflate.
    #[error(
        "the fatbin entry for SM {sm} at byte {offset} is LZ4-compressed (nvcc 12 \
         `-compress-all`), which kwheel does not read; build without it or with nvcc 13"
    )]
    Lz4 {
        /// Where the entry starts, in the section.
        offset: usize,
        /// The SM its header names.
        sm: u32,
    },
    /// An entry that declares more than [`MAX_ENTRY_SIZE`] uncompressed.
    #[error(
        "the fatbin entry for SM {sm} at byte {offset} declares {size} bytes uncompressed, \
         over the {MAX_ENTRY_SIZE}-byte cap"
    )]
    TooLarge {
        /// Where the entry starts, in the section.
        offset: usize,
        /// The SM its header names.
        sm: u32,
        /// The declared size.
        size: u64,
    },
    /// An entry whose payload is not the cubin or PTX its header says.
    #[error("the fatbin's {what} for SM {sm} (at byte {offset}) does not read as one")]
    Image {
        /// `cubin` or `PTX`.
        what: &'static str,
        /// Where the entry starts, in the section.
        offset: usize,
        /// The SM its header names.
        sm: u32,
        /// Why.
        #[source]
        source: CubinError,
    },
    /// An entry whose header names another SM than its cubin or PTX.
    #[error(
        "the fatbin entry at byte {offset} says SM {header_sm}, its {what} is for SM {image_sm}"
    )]
    SmMismatch {
        /// `cubin` or `PTX`.
        what: &'static str,
        /// Where the entry starts, in the section.
        offset: usize,
        /// The SM the entry header names.
        header_sm: u32,
        /// The SM the cubin or PTX says.
        image_sm: u32,
    },
    /// A declared target with no cubin (or PTX) in the fatbin.
    #[error("the fatbin has no {} for {arch}; it holds {found}", target_artifact(*.arch))]
    MissingArch {
        /// The declared target.
        arch: Arch,
        /// What the fatbin holds instead: `sm_90a, compute_90`, or `no device code`.
        found: String,
    },
}

fn target_artifact(arch: Arch) -> &'static str {
    match arch.kind {
        ArchKind::Ptx => "PTX",
        _ => "cubin",
    }
}

/// The `.nv_fatbin` section of a module (a 64-bit little-endian ELF file), or `None` when it
/// has no device code.
pub fn fatbin_section(module: &[u8]) -> Result<Option<&[u8]>, FatbinError> {
    let elf = |what: String| FatbinError::Elf { what };
    let range = with_aligned(module, |aligned| {
        let endian = LittleEndian;
        let header = FileHeader64::<LittleEndian>::parse(aligned)
            .map_err(|error| elf(format!("cannot read the ELF header: {error}")))?;
        let sections = header
            .sections(endian, aligned)
            .map_err(|error| elf(format!("cannot read the section headers: {error}")))?;
        let Some((_, section)) = sections.section_by_name(endian, FATBIN_SECTION.as_bytes()) else {
            return Ok(None);
        };
        if section.sh_type(endian) == SHT_NOBITS {
            return Err(elf(format!(
                "its `{FATBIN_SECTION}` section holds no bytes"
            )));
        }
        Ok(Some((section.sh_offset(endian), section.sh_size(endian))))
    })?;
    let Some((offset, size)) = range else {
        return Ok(None);
    };
    let bytes = usize::try_from(offset)
        .ok()
        .zip(usize::try_from(size).ok())
        .and_then(|(offset, size)| module.get(offset..offset.checked_add(size)?))
        .ok_or_else(|| {
            elf(format!(
                "its `{FATBIN_SECTION}` section ({size} bytes at {offset}) runs past the end \
                 of the file ({} bytes)",
                module.len()
            ))
        })?;
    Ok(Some(bytes))
}

/// Sets to 0, in place, every file time in the line tables of `module`'s uncompressed cubins
/// ([`crate::compile::lines::clear_file_times`]), as a kernel's cubin has them cleared. Sizes do
/// not change, so nothing else moves. A compressed entry (nvcc's default) is left as it is;
/// in those nvcc 13 writes for a `-c` compile with `-lineinfo`, every file time is already 0
/// (vLLM's module, checked by its real-library test).
pub fn clear_line_table_times(module: &mut [u8]) -> Result<(), FatbinError> {
    let base = module.as_ptr() as usize;
    let cubins: Vec<std::ops::Range<usize>> = match fatbin_section(module)? {
        None => return Ok(()),
        Some(section) => fatbin_entries(section)?
            .iter()
            .filter(|entry| entry.kind == EntryKind::Cubin)
            .filter(|entry| entry.compression == Compression::None)
            .map(|entry| {
                let start = entry.stored.as_ptr() as usize - base;
                start..start + entry.stored.len()
            })
            .collect(),
    };
    for range in cubins {
        // A copy, so the ELF reader sees the cubin at an aligned address.
        let mut cubin = module[range.clone()].to_vec();
        crate::compile::lines::clear_file_times(&mut cubin);
        module[range].copy_from_slice(&cubin);
    }
    Ok(())
}

/// Every entry of every container of a `.nv_fatbin` section, in order, payloads as stored.
/// Zero bytes between containers are padding.
pub fn fatbin_entries(section: &[u8]) -> Result<Vec<FatbinEntry<'_>>, FatbinError> {
    let fields = LittleEndianFields(section);
    let malformed = |offset: usize, what: String| FatbinError::Malformed { offset, what };
    let mut entries = Vec::new();
    // Zeros before the first container are padding too.
    let mut at = section
        .iter()
        .position(|&byte| byte != 0)
        .unwrap_or(section.len());
    while at < section.len() {
        let header = fields
            .u32(at)
            .zip(fields.u16(at + 6))
            .zip(fields.u64(at + 8));
        let Some(((magic, header_size), body_size)) = header else {
            return Err(malformed(at, "a container header is cut short".into()));
        };
        if magic != CONTAINER_MAGIC {
            return Err(malformed(
                at,
                format!("a container opens with {magic:#010x}, not {CONTAINER_MAGIC:#010x}"),
            ));
        }
        let header_size = usize::from(header_size);
        let end = usize::try_from(body_size)
            .ok()
            .and_then(|body| at.checked_add(header_size)?.checked_add(body))
            .filter(|&end| end <= section.len());
        let Some(end) = end.filter(|_| header_size >= CONTAINER_HEADER_SIZE) else {
            return Err(malformed(
                at,
                format!(
                    "a container declares a {header_size}-byte header and a {body_size}-byte \
                     body; the section has {} bytes from there",
                    section.len() - at
                ),
            ));
        };
        let mut entry = at + header_size;
        while entry < end {
            let (parsed, next) = read_entry(section, entry, end)?;
            entries.push(parsed);
            entry = next;
        }
        // The linker aligns each unit's container; a container opens with its magic, so
        // zeros before the next one are padding.
        at = section[end..]
            .iter()
            .position(|&byte| byte != 0)
            .map_or(section.len(), |zeros| end + zeros);
    }
    Ok(entries)
}

/// The entry whose header starts at `at`, inside a container that ends at `end`, and where
/// the next entry starts.
fn read_entry(
    section: &[u8],
    at: usize,
    end: usize,
) -> Result<(FatbinEntry<'_>, usize), FatbinError> {
    let malformed = |what: String| FatbinError::Malformed { offset: at, what };
    let container = &section[..end];
    let fields = LittleEndianFields(container);
    let header = (
        fields.u16(at),
        fields.u32(at + 0x04),
        fields.u64(at + 0x08),
        fields.u32(at + 0x10),
        fields.u32(at + 0x1c),
        fields.u64(at + 0x28),
        fields.u64(at + 0x38),
    );
    let (
        Some(kind),
        Some(header_size),
        Some(padded_size),
        Some(payload_size),
        Some(sm),
        Some(flags),
        Some(uncompressed_size),
    ) = header
    else {
        return Err(malformed(format!(
            "an entry header is cut short: {} bytes left in its container, at least \
             {ENTRY_HEADER_SIZE} needed",
            end - at
        )));
    };
    let payload_start = usize::try_from(header_size)
        .ok()
        .filter(|&size| size >= ENTRY_HEADER_SIZE)
        .and_then(|size| at.checked_add(size));
    let next = payload_start
        .zip(usize::try_from(padded_size).ok())
        .and_then(|(start, padded)| start.checked_add(padded))
        .filter(|&next| next <= end);
    let (Some(payload_start), Some(next)) = (payload_start, next) else {
        return Err(malformed(format!(
            "an entry declares a {header_size}-byte header and a {padded_size}-byte payload; \
             its container has {} bytes from there",
            end - at
        )));
    };
    let padded = &container[payload_start..next];
    let compression = if flags & ENTRY_FLAG_ZSTD != 0 || padded.starts_with(&ZSTD_MAGIC) {
        Compression::Zstd
    } else if flags & ENTRY_FLAG_LZ4 != 0 {
        Compression::Lz4
    } else {
        Compression::None
    };
    let stored = match compression {
        Compression::None => padded,
        // A compressed payload is followed by padding the decompressor must not see.
        Compression::Zstd | Compression::Lz4 => {
            padded.get(..payload_size as usize).ok_or_else(|| {
                malformed(format!(
                    "an entry declares a {payload_size}-byte payload in {padded_size} bytes"
                ))
            })?
        }
    };
    if compression == Compression::Zstd && !stored.starts_with(&ZSTD_MAGIC) {
        return Err(malformed(
            "an entry flagged zstd-compressed does not hold a zstd frame".into(),
        ));
    }
    let kind = match kind {
        ENTRY_KIND_PTX => EntryKind::Ptx,
        ENTRY_KIND_CUBIN => EntryKind::Cubin,
        other => EntryKind::Other(other),
    };
    let entry = FatbinEntry {
        offset: at,
        kind,
        sm,
        compression,
        uncompressed_size,
        stored,
    };
    Ok((entry, next))
}

/// What a module's fatbin holds for each target, checked against the targets it declares:
/// every cubin must read as a cubin and every PTX as PTX, for the SM its entry names, and
/// every declared target must have its cubin (of its kind: `sm_90a`, `sm_100f`) or its PTX
/// (`compute_90`). An image that fits no declared target is summarised under the target it
/// says it is. Stubs are recorded, not refused. Entries are inflated one at a time.
pub fn module_device_code(
    module: &[u8],
    archs: &[Arch],
) -> Result<BTreeMap<Arch, ModuleDeviceCode>, FatbinError> {
    let mut device_code: BTreeMap<Arch, ModuleDeviceCode> = BTreeMap::new();
    let section = fatbin_section(module)?;
    for entry in fatbin_entries(section.unwrap_or_default())? {
        let what = match entry.kind {
            EntryKind::Ptx => "PTX",
            EntryKind::Cubin => "cubin",
            EntryKind::Other(_) => continue,
        };
        let image_error = |source| FatbinError::Image {
            what,
            offset: entry.offset,
            sm: entry.sm,
            source,
        };
        let payload = entry.payload()?;
        let image: &[u8] = match entry.kind {
            // PTX in a fatbin is NUL-terminated and padded.
            EntryKind::Ptx => {
                let length = payload
                    .iter()
                    .rposition(|&byte| byte != 0)
                    .map_or(0, |at| at + 1);
                &payload[..length]
            }
            _ => &payload,
        };
        let info = inspect_cubin(image).map_err(image_error)?;
        let is_ptx = info.kind == Some(ArchKind::Ptx);
        if is_ptx != (entry.kind == EntryKind::Ptx) {
            return Err(image_error(CubinError::Malformed {
                what: format!(
                    "the entry says {what}, its payload is {}",
                    if is_ptx { "PTX" } else { "a cubin" }
                ),
            }));
        }
        if info.sm != entry.sm {
            return Err(FatbinError::SmMismatch {
                what,
                offset: entry.offset,
                header_sm: entry.sm,
                image_sm: info.sm,
            });
        }
        let arch = archs
            .iter()
            .copied()
            .find(|&arch| arch.sm == info.sm && validate_cubin(image, arch, &[]).is_ok())
            .unwrap_or(Arch {
                sm: info.sm,
                kind: info.kind.unwrap_or(ArchKind::Plain),
            });
        let summary = device_code.entry(arch).or_default();
        summary.images += 1;
        summary.kernels += u32::try_from(info.functions.len()).unwrap_or(u32::MAX);
        if is_ptx {
            continue;
        }
        for resources in entry_resources(image).map_err(image_error)?.values() {
            summary.max_registers = summary.max_registers.max(resources.registers);
            summary.max_stack_bytes = summary.max_stack_bytes.max(resources.stack_bytes);
            summary.max_static_shared_bytes = summary
                .max_static_shared_bytes
                .max(Some(resources.static_shared_bytes));
        }
        let stubs = stub_entries(image).map_err(image_error)?;
        summary
            .stubs
            .extend(stubs.into_iter().map(|stub| stub.symbol));
    }
    for summary in device_code.values_mut() {
        summary.stubs.sort();
        summary.stubs.dedup();
    }
    if let Some(&arch) = archs.iter().find(|arch| !device_code.contains_key(arch)) {
        let found = if device_code.is_empty() {
            "no device code".to_owned()
        } else {
            device_code
                .keys()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        return Err(FatbinError::MissingArch { arch, found });
    }
    Ok(device_code)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fuzz target's seeds are fatbins this reader reads: an uncompressed container with
    /// a cubin and a PTX, and the same cubin zstd-compressed.
    #[test]
    fn the_fuzz_seeds_read_as_fatbins() {
        let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
        let cubin = std::fs::read(corpus.join("cubin/nvcc130_sm_90a.cubin")).unwrap();
        for (seed, kinds) in [
            ("uncompressed", vec![EntryKind::Cubin, EntryKind::Ptx]),
            ("zstd", vec![EntryKind::Cubin]),
        ] {
            let bytes = std::fs::read(corpus.join("fatbin").join(seed)).unwrap();
            let entries = fatbin_entries(&bytes).unwrap();
            let read: Vec<EntryKind> = entries.iter().map(|entry| entry.kind).collect();
            assert_eq!(read, kinds, "{seed}");
            assert_eq!(entries[0].payload().unwrap().as_ref(), &cubin[..], "{seed}");
        }
    }

    use proptest::prelude::*;

    const STUB_SM90A: &[u8] = include_bytes!("../../tests/fixtures/stub/nvcc130_sm_90a.cubin");
    const STUB_SM100A: &[u8] = include_bytes!("../../tests/fixtures/stub/nvcc130_sm_100a.cubin");
    const PTX_COMPUTE90: &[u8] =
        include_bytes!("../../tests/fixtures/cubin/nvcc130_compute_90.ptx");

    /// A 64-bit little-endian shared library whose only sections are `.nv_fatbin` (holding
    /// `fatbin`) and the section names.
    fn module_with(fatbin: &[u8]) -> Vec<u8> {
        let names = b"\0.nv_fatbin\0.shstrtab\0";
        let mut bytes = vec![0u8; 64];
        bytes[..4].copy_from_slice(b"\x7fELF");
        bytes[4] = 2; // ELFCLASS64
        bytes[5] = 1; // little-endian
        bytes[6] = 1; // EV_CURRENT
        bytes[16..18].copy_from_slice(&3u16.to_le_bytes()); // ET_DYN
        bytes[18..20].copy_from_slice(&62u16.to_le_bytes()); // x86-64
        bytes[20..24].copy_from_slice(&1u32.to_le_bytes());
        bytes[52..54].copy_from_slice(&64u16.to_le_bytes()); // e_ehsize
        bytes[58..60].copy_from_slice(&64u16.to_le_bytes()); // e_shentsize
        bytes[60..62].copy_from_slice(&3u16.to_le_bytes()); // e_shnum
        bytes[62..64].copy_from_slice(&2u16.to_le_bytes()); // e_shstrndx
        let fatbin_at = bytes.len();
        bytes.extend_from_slice(fatbin);
        let names_at = bytes.len();
        bytes.extend_from_slice(names);
        bytes.resize(bytes.len().div_ceil(8) * 8, 0);
        let headers_at = bytes.len();
        bytes[40..48].copy_from_slice(&(headers_at as u64).to_le_bytes()); // e_shoff
        let header = |name: u32, kind: u32, offset: usize, size: usize| {
            let mut header = vec![0u8; 64];
            header[0..4].copy_from_slice(&name.to_le_bytes());
            header[4..8].copy_from_slice(&kind.to_le_bytes());
            header[24..32].copy_from_slice(&(offset as u64).to_le_bytes());
            header[32..40].copy_from_slice(&(size as u64).to_le_bytes());
            header
        };
        bytes.extend(header(0, 0, 0, 0));
        bytes.extend(header(1, 1, fatbin_at, fatbin.len()));
        bytes.extend(header(12, 3, names_at, names.len()));
        bytes
    }

    fn arch(name: &str) -> Arch {
        name.parse().unwrap()
    }

    #[test]
    fn summarises_each_declared_arch_with_its_stubs() {
        let mut ptx = PTX_COMPUTE90.to_vec();
        ptx.extend_from_slice(&[0; 5]);
        let fatbin = [
            container(&[zstd_entry(2, 90, STUB_SM90A), entry(1, 90, 0x11, &ptx, 0)]),
            container(&[entry(2, 100, 0x11, STUB_SM100A, 0)]),
        ]
        .concat();
        let module = module_with(&fatbin);
        let archs = [arch("sm_90a"), arch("sm_100a"), arch("compute_90")];
        let code = module_device_code(&module, &archs).unwrap();
        assert_eq!(
            code.keys().map(ToString::to_string).collect::<Vec<_>>(),
            ["compute_90", "sm_90a", "sm_100a"]
        );
        let on_90 = &code[&arch("sm_90a")];
        assert_eq!(on_90.images, 1);
        assert_eq!(on_90.stubs.len(), 6, "{on_90:?}");
        assert!(on_90.kernels as usize > on_90.stubs.len(), "{on_90:?}");
        assert!(on_90.max_registers.is_some());
        assert_eq!(
            code[&arch("sm_100a")].stubs,
            ["only90_deepgemm", "only90_trap"]
        );
        let ptx = &code[&arch("compute_90")];
        assert_eq!((ptx.images, ptx.max_registers), (1, None));

        // A declared target the fatbin lacks, and a cubin of another kind than declared.
        let error = module_device_code(&module, &[arch("sm_90a"), arch("sm_120a")])
            .unwrap_err()
            .to_string();
        assert_eq!(
            error,
            "the fatbin has no cubin for sm_120a; it holds compute_90, sm_90a, sm_100a"
        );
        let error = module_device_code(&module, &[arch("sm_100f")])
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("the fatbin has no cubin for sm_100f"),
            "{error}"
        );
    }

    #[test]
    fn a_cubin_that_does_not_parse_or_names_another_sm_is_refused() {
        let module = module_with(&container(&[zstd_entry(2, 90, b"\x7fELF garbage")]));
        let error = module_device_code(&module, &[]).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("the fatbin's cubin for SM 90 (at byte 16)"),
            "{error}"
        );
        let module = module_with(&container(&[zstd_entry(2, 100, STUB_SM90A)]));
        let error = module_device_code(&module, &[]).unwrap_err().to_string();
        assert_eq!(
            error,
            "the fatbin entry at byte 16 says SM 100, its cubin is for SM 90"
        );
    }

    fn entry(kind: u16, sm: u32, flags: u64, payload: &[u8], uncompressed: u64) -> Vec<u8> {
        let padded = payload.len().div_ceil(8) * 8;
        let mut header = vec![0u8; 0x48];
        header[0..2].copy_from_slice(&kind.to_le_bytes());
        header[2..4].copy_from_slice(&0x0101u16.to_le_bytes());
        header[4..8].copy_from_slice(&0x48u32.to_le_bytes());
        header[8..16].copy_from_slice(&(padded as u64).to_le_bytes());
        header[0x10..0x14].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        header[0x1c..0x20].copy_from_slice(&sm.to_le_bytes());
        header[0x28..0x30].copy_from_slice(&flags.to_le_bytes());
        header[0x38..0x40].copy_from_slice(&uncompressed.to_le_bytes());
        header.extend_from_slice(payload);
        header.resize(0x48 + padded, 0);
        header
    }

    fn container(entries: &[Vec<u8>]) -> Vec<u8> {
        let body: Vec<u8> = entries.concat();
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&CONTAINER_MAGIC.to_le_bytes());
        bytes.extend_from_slice(&1u16.to_le_bytes());
        bytes.extend_from_slice(&16u16.to_le_bytes());
        bytes.extend_from_slice(&(body.len() as u64).to_le_bytes());
        bytes.extend_from_slice(&body);
        bytes
    }

    fn zstd_entry(kind: u16, sm: u32, payload: &[u8]) -> Vec<u8> {
        let compressed = zstd::bulk::compress(payload, 3).unwrap();
        entry(kind, sm, 0x10_8011, &compressed, payload.len() as u64)
    }

    #[test]
    fn reads_entries_of_every_container() {
        let ptx = b".version 9.0\n.target sm_90\n.address_size 64\n\0\0\0";
        let section = [
            container(&[
                zstd_entry(2, 90, b"cubin bytes"),
                entry(1, 90, 0x11, ptx, 0),
            ]),
            vec![0; 8],
            container(&[entry(2, 100, 0x2011, b"lz4", 3)]),
        ]
        .concat();
        let entries = fatbin_entries(&section).unwrap();
        let summary: Vec<_> = entries
            .iter()
            .map(|entry| (entry.kind, entry.sm, entry.compression))
            .collect();
        assert_eq!(
            summary,
            [
                (EntryKind::Cubin, 90, Compression::Zstd),
                (EntryKind::Ptx, 90, Compression::None),
                (EntryKind::Cubin, 100, Compression::Lz4),
            ]
        );
        assert_eq!(&*entries[0].payload().unwrap(), b"cubin bytes");
        assert!(entries[1].payload().unwrap().starts_with(b".version 9.0"));
        assert!(matches!(
            entries[2].payload(),
            Err(FatbinError::Lz4 { sm: 100, .. })
        ));
    }

    #[test]
    fn a_payload_larger_than_declared_is_refused_without_inflating_it_whole() {
        let compressed = zstd::bulk::compress(&vec![7u8; 1 << 20], 3).unwrap();
        let section = container(&[entry(2, 90, 0x8000, &compressed, 100)]);
        let entries = fatbin_entries(&section).unwrap();
        let error = entries[0].payload().unwrap_err().to_string();
        assert!(
            error.contains("declares 100 bytes uncompressed, the payload inflates to 101 or more"),
            "{error}"
        );
        let section = container(&[entry(2, 90, 0x8000, &compressed, MAX_ENTRY_SIZE + 1)]);
        let entries = fatbin_entries(&section).unwrap();
        assert!(matches!(
            entries[0].payload(),
            Err(FatbinError::TooLarge { sm: 90, .. })
        ));
    }

    #[test]
    fn sizes_past_the_container_are_refused() {
        let mut section = container(&[zstd_entry(2, 90, b"cubin")]);
        // The entry's padded size, past its container.
        section[16 + 8..16 + 16].copy_from_slice(&u64::MAX.to_le_bytes());
        let error = fatbin_entries(&section).unwrap_err().to_string();
        assert!(error.contains("at byte 16 of `.nv_fatbin`"), "{error}");
        let mut section = container(&[zstd_entry(2, 90, b"cubin")]);
        section[8..16].copy_from_slice(&(1u64 << 40).to_le_bytes());
        assert!(fatbin_entries(&section).is_err());
        assert!(fatbin_entries(b"\x50\xed\x55\xba\x01\x00").is_err());
        assert!(fatbin_entries(b"not a fatbin").is_err());
        assert!(fatbin_entries(&[0; 64]).unwrap().is_empty());
    }

    #[test]
    fn a_module_without_device_code_lacks_every_declared_arch() {
        let module = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert!(module_device_code(&module, &[]).unwrap().is_empty());
        let error = module_device_code(&module, &["sm_90a".parse().unwrap()])
            .unwrap_err()
            .to_string();
        assert_eq!(
            error,
            "the fatbin has no cubin for sm_90a; it holds no device code"
        );
    }

    proptest! {
        #[test]
        fn truncated_or_altered_sections_never_panic(
            cut in 0usize..400,
            flip in 0usize..400,
            byte in any::<u8>(),
        ) {
            let ptx = b".version 9.0\n.target sm_90\n.address_size 64\n";
            let mut section = [
                container(&[zstd_entry(2, 90, STUB_SM90A), entry(1, 90, 0, ptx, 0)]),
                container(&[zstd_entry(2, 100, b"x")]),
            ]
            .concat();
            let flip = flip % section.len();
            section[flip] = byte;
            section.truncate(cut.min(section.len()));
            if let Ok(entries) = fatbin_entries(&section) {
                for entry in entries {
                    let _ = entry.payload();
                }
            }
            let _ = module_device_code(&module_with(&section), &[arch("sm_90a")]);
        }
    }
}
