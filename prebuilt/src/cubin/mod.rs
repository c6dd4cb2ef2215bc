//! Artifact inspection and validation: which GPU a cubin (or PTX) is for, of which target
//! kind, its kernel entries, and the sizes of their parameters.
//!
//! A cubin is a 64-bit little-endian ELF file with `e_machine` [`EM_CUDA`] (190). Four facts
//! about it matter here, each checked against NVIDIA's `cuobjdump` on the fixtures in
//! `tests/fixtures/cubin/`:
//!
//! - **The SM number is in `e_flags`, at a place that depends on the ELF ABI version**
//!   (`e_ident[EI_ABIVERSION]`). ABI 7 keeps it in the low byte; ABI 8 keeps it in bits 8–15.
//!   Both are current: CUDA 13 writes ABI 8 for every SM, while CUDA 12.9 writes ABI 7 for
//!   `sm_90`/`sm_90a` and ABI 8 from `sm_100` on.
//!
//! - **The target kind (`a`, `f`, plain) is in three places, none of them alone enough.** The
//!   `a` marker is an `e_flags` bit up to CUDA 12.9 (`0x800` with ABI 7, `0x8` with ABI 8);
//!   CUDA 13 leaves the flags alone and writes attribute `0x09` = 1 into the `.nv.compat`
//!   section instead (a run of `.nv.info`-style records). Family and plain cubins are
//!   byte-identical but for the `.note.nv.tkinfo` note, whose ptxas command line says
//!   `-arch sm_100f` or `-arch sm_100`; a cubin without that note (CUDA 12.9 for `sm_90`) does
//!   not say which of the two it is. So `sm_100a`, `sm_100f` and `sm_100` from nvcc 13.0 share
//!   `e_flags` `0x6006402`:
//!
//!   | compiler       | target    | ABI | `e_flags`   | `.nv.compat` 0x09 | tkinfo `-arch` |
//!   |----------------|-----------|-----|-------------|-------------------|----------------|
//!   | NVRTC 12.9     | `sm_90a`  | 7   | `0x5a0d5a`  | (no section)      | (no note)      |
//!   | ptxas 12.9     | `sm_90`   | 7   | `0x5a055a`  | (no section)      | (no note)      |
//!   | NVRTC 12.9     | `sm_100a` | 8   | `0x600640a` | absent            | `sm_100a`      |
//!   | ptxas 12.9     | `sm_100f` | 8   | `0x6006402` | absent            | `sm_100f`      |
//!   | nvcc 13.0      | `sm_90a`  | 8   | `0x6005a04` | 1                 | `sm_90a`       |
//!   | nvcc 13.0      | `sm_100a` | 8   | `0x6006402` | 1                 | `sm_100a`      |
//!   | nvcc 13.0      | `sm_100f` | 8   | `0x6006402` | 0                 | `sm_100f`      |
//!   | nvcc 13.0      | `sm_100`  | 8   | `0x6006402` | 0                 | `sm_100`       |
//!
//!   [`validate_cubin`] cross-checks the target's kind against every place that speaks.
//!
//! - **Kernel entries are the `STT_FUNC` symbols with `STO_CUDA_ENTRY` (0x10) in `st_other`.**
//!   Device functions are `STT_FUNC` symbols too (a whole-program build clones them into each
//!   caller as local `$kernel$function` symbols), so the symbol type alone would list functions
//!   that cannot be launched.
//!
//! - **Parameter sizes come from the entry's `.nv.info.<symbol>` section**, a run of attribute
//!   records, each 4-byte aligned: a format byte, an attribute byte, then by format
//!   `EIFMT_NVAL` (1) two padding bytes, `EIFMT_BVAL` (2) a byte and a padding byte,
//!   `EIFMT_HVAL` (3) a `u16`, or `EIFMT_SVAL` (4) a `u16` size and that many payload bytes.
//!   Each parameter has one 12-byte SVAL record, in no particular order:
//!
//!   | attribute                      | bytes 0–3 | 4–5     | 6–7    | 8–11                      |
//!   |--------------------------------|-----------|---------|--------|---------------------------|
//!   | `EIATTR_KPARAM_INFO` (0x17)    | index     | ordinal | offset | flags; size in bits 18–31 |
//!   | `EIATTR_KPARAM_INFO_V2` (0x45) | index     | ordinal | offset | size in bits 0–15; flags  |
//!
//!   Compilers switch a whole kernel to V2 records once its parameters pass about 4 KiB.
//!   `EIATTR_CBANK_PARAM_SIZE` (0x19, HVAL) gives the size of the whole parameter block, which
//!   every parameter must fit in. A kernel without parameters has no parameter records at all.
//!
//! A `compute_XY` target's artifact is PTX text instead, checked as PTX: a `.version`
//! directive first, `.target sm_XY` (no `a`/`f`: those run on no more devices than their
//! cubin), `.address_size 64`, and every declared entry as a `.entry` whose `.param` list gives
//! the parameter sizes. [`inspect_cubin`] and [`validate_cubin`] take either, by content.

mod globals;
pub mod identity;
mod nvinfo;
mod ptx;
mod resources;
mod stub;

pub use globals::read_global_integers;
use nvinfo::{attributes, parameter_sizes};
use ptx::inspect_ptx;
pub use resources::{entry_resources, EntryResources};
pub use stub::{stub_entries, StubEntry};

use std::collections::BTreeMap;

use object::elf::{
    FileHeader64, ELFCLASS64, ELFDATA2LSB, ELFDATA2MSB, ELFMAG, SHT_SYMTAB, STT_FUNC,
};
use object::read::elf::{FileHeader, SectionHeader, SectionTable, Sym};
use object::LittleEndian;

use crate::{Arch, ArchKind};

/// ELF machine number of CUDA cubins.
pub const EM_CUDA: u16 = 190;

/// The `st_other` bit that marks a function symbol as a kernel entry (`__global__`).
const STO_CUDA_ENTRY: u8 = 0x10;

/// Prefix of the per-function attribute sections.
const NV_INFO_PREFIX: &[u8] = b".nv.info.";

const EIFMT_NVAL: u8 = 0x01;
const EIFMT_BVAL: u8 = 0x02;
const EIFMT_HVAL: u8 = 0x03;
const EIFMT_SVAL: u8 = 0x04;

const EIATTR_KPARAM_INFO: u8 = 0x17;
const EIATTR_CBANK_PARAM_SIZE: u8 = 0x19;
const EIATTR_KPARAM_INFO_V2: u8 = 0x45;

/// The `.nv.compat` attribute whose value 1 marks an arch-specific (`a`) cubin (CUDA 13).
const COMPAT_ARCH_SPECIFIC: u8 = 0x09;
/// The `e_flags` bit that marks an arch-specific cubin, by ELF ABI version (up to CUDA 12.9).
const fn arch_specific_flag(abi_version: u8) -> u32 {
    match abi_version {
        7 => 0x800,
        8 => 0x8,
        _ => 0,
    }
}

/// What a cubin says about itself: the SM it was compiled for and its kernel entries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CubinInfo {
    /// The ELF ABI version (`e_ident[EI_ABIVERSION]`), which decides where `e_flags` keeps the
    /// SM number.
    pub abi_version: u8,
    /// The raw ELF header flags.
    pub elf_flags: u32,
    /// The SM number (90 for `sm_90a`).
    pub sm: u32,
    /// The target kind the artifact says it is: [`ArchKind::Ptx`] for PTX; for a cubin
    /// [`ArchKind::Specific`] when it carries the `a` marker, else `Family` or `Plain` by its
    /// ptxas command line. `None`: a cubin without the `a` marker that does not say whether
    /// it is a family or a plain one (no `.note.nv.tkinfo`).
    pub kind: Option<ArchKind>,
    /// Where [`CubinInfo::kind`] was read: `e_flags 0x600640a`, `.nv.compat attribute 0x09`,
    /// `ptxas options "-arch sm_100f -m 64"`, `.target sm_90`.
    pub kind_evidence: String,
    /// The kernel entries, sorted by symbol.
    pub functions: Vec<CubinFunction>,
}

/// A kernel entry of a cubin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CubinFunction {
    /// The symbol: the kernel's name for `extern "C"` kernels, the mangled name otherwise.
    pub symbol: String,
    /// The size in bytes of each parameter, in declaration order.
    pub param_sizes: Vec<u32>,
}

impl CubinInfo {
    /// The symbol of a declared entry: the entry itself when the cubin has it (`extern "C"`),
    /// else the mangled entry whose demangled name is the entry (`scale_rows<float>`). The
    /// bundler and the JIT resolve name expressions this one way, whichever compiler ran.
    pub fn resolve_entry(&self, entry: &str) -> Option<String> {
        if let Some(function) = self.function(entry) {
            return Some(function.symbol.clone());
        }
        let without_whitespace =
            |name: &str| -> String { name.chars().filter(|c| !c.is_whitespace()).collect() };
        let wanted = without_whitespace(entry);
        self.functions.iter().find_map(|function| {
            let symbol = cpp_demangle::Symbol::new(function.symbol.as_bytes()).ok()?;
            let options = cpp_demangle::DemangleOptions::new()
                .no_return_type()
                .no_params();
            let demangled = symbol.demangle(&options).ok()?;
            (without_whitespace(&demangled) == wanted).then(|| function.symbol.clone())
        })
    }

    /// The entry with this symbol, if the cubin has one.
    pub fn function(&self, symbol: &str) -> Option<&CubinFunction> {
        self.functions
            .iter()
            .find(|function| function.symbol == symbol)
    }

    /// The symbols of all entries, sorted.
    pub fn symbols(&self) -> Vec<String> {
        self.functions
            .iter()
            .map(|function| function.symbol.clone())
            .collect()
    }
}

/// Why bytes are not a usable cubin, or not the cubin that was expected.
#[derive(Debug, thiserror::Error)]
pub enum CubinError {
    /// The bytes are not an ELF file at all.
    #[error("not a cubin: the data is {found} ({size} bytes), not an ELF file")]
    NotElf {
        /// What the bytes look like instead: "PTX assembly", "a CUDA fatbinary", ...
        found: &'static str,
        /// Length of the data.
        size: usize,
    },
    /// An ELF file for another machine, such as a host shared library.
    #[error(
        "not a cubin: the ELF file is for machine {machine} ({}), not {EM_CUDA} (CUDA)",
        machine_name(*.machine)
    )]
    WrongMachine {
        /// The ELF `e_machine` found.
        machine: u16,
    },
    /// A cubin whose ELF ABI version does not say where the SM number is.
    #[error(
        "cubin has ELF ABI version {abi_version} (e_flags {elf_flags:#x}); only versions 7 and 8 \
         are understood, so its SM number cannot be read"
    )]
    UnknownAbiVersion {
        /// `e_ident[EI_ABIVERSION]`.
        abi_version: u8,
        /// The raw ELF header flags.
        elf_flags: u32,
    },
    /// An artifact of another kind than the target: an arch-specific cubin for a family or
    /// plain target (or the other way round), a family cubin for a plain target, PTX for a
    /// cubin target, a cubin for a PTX target.
    #[error(
        "the artifact is {found} ({evidence}), but the target {expected} is {}",
        describe_target(*.expected)
    )]
    KindMismatch {
        /// The target it was expected to be built for.
        expected: Arch,
        /// What the artifact says it is: `an arch-specific sm_100a cubin`.
        found: String,
        /// Where it says so.
        evidence: String,
    },
    /// PTX for another `.target` than the `compute_XY` target's `sm_XY`.
    #[error(
        "PTX is for `.target {target}`, but the target {expected} needs `.target sm_{}`",
        .expected.sm
    )]
    PtxTarget {
        /// The target.
        expected: Arch,
        /// The PTX's `.target`.
        target: String,
    },
    /// PTX text that is not what a PTX target must be.
    #[error("malformed PTX: {what}")]
    MalformedPtx {
        /// What is wrong.
        what: String,
    },
    /// A cubin for another SM than the target.
    #[error(
        "cubin is for sm_{found} but the target is {expected} (ELF ABI {abi_version}, e_flags \
         {elf_flags:#x})"
    )]
    SmMismatch {
        /// The target the cubin was expected to be built for.
        expected: Arch,
        /// The SM number in the cubin.
        found: u32,
        /// `e_ident[EI_ABIVERSION]`.
        abi_version: u8,
        /// The raw ELF header flags.
        elf_flags: u32,
    },
    /// An expected kernel entry is not in the cubin.
    #[error("cubin has no kernel entry `{symbol}`; {}", describe_entries(.symbol, .found))]
    MissingEntry {
        /// The symbol looked for.
        symbol: String,
        /// The entry symbols the cubin does have, sorted.
        found: Vec<String>,
    },
    /// An expected kernel entry is in the cubin as a device function, which cannot be launched.
    #[error(
        "`{symbol}` is a device function in the cubin, not a kernel entry; declare it \
         `__global__` to launch it"
    )]
    NotEntry {
        /// The symbol looked for.
        symbol: String,
    },
    /// The bytes start like a cubin but cannot be read as one.
    #[error("malformed cubin: {what}")]
    Malformed {
        /// What is wrong, and where.
        what: String,
    },
}

fn malformed(what: impl Into<String>) -> CubinError {
    CubinError::Malformed { what: what.into() }
}

fn malformed_ptx(what: impl Into<String>) -> CubinError {
    CubinError::MalformedPtx { what: what.into() }
}

/// `an arch-specific cubin`, `PTX`: what a target builds, for messages.
fn describe_target(arch: Arch) -> String {
    match arch.kind {
        ArchKind::Ptx => "PTX".to_owned(),
        kind => format!("{} {} cubin", article(kind.describe()), kind.describe()),
    }
}

fn article(word: &str) -> &'static str {
    if word.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    }
}

/// What an artifact says it is, for messages: `an arch-specific sm_100a cubin`, `PTX for
/// .target sm_90`, `a cubin for sm_100 that does not say whether it is family or plain`.
fn describe_found(sm: u32, kind: Option<ArchKind>) -> String {
    match kind {
        Some(ArchKind::Ptx) => format!("PTX for sm_{sm}"),
        Some(kind) => {
            let arch = Arch { sm, kind };
            format!(
                "{} {} {arch} cubin",
                article(kind.describe()),
                kind.describe()
            )
        }
        None => format!("a family or plain sm_{sm} cubin"),
    }
}

fn machine_name(machine: u16) -> &'static str {
    match machine {
        0 => "no machine",
        3 => "x86",
        20 => "PowerPC",
        21 => "PowerPC64",
        40 => "ARM",
        62 => "x86-64",
        183 => "AArch64",
        243 => "RISC-V",
        _ => "an unknown machine",
    }
}

fn describe_entries(symbol: &str, found: &[String]) -> String {
    if found.is_empty() {
        return "it has no kernel entries".to_owned();
    }
    let list = found
        .iter()
        .map(|entry| format!("`{entry}`"))
        .collect::<Vec<_>>()
        .join(", ");
    // Itanium mangling writes a name as its length then the name: `_Z9kw_squareIfEvPT_i`.
    let mangled = format!("{}{symbol}", symbol.len());
    match found
        .iter()
        .find(|entry| entry.starts_with("_Z") && entry.contains(&mangled))
    {
        Some(entry) => format!(
            "its entries are {list}. C++ kernel names are mangled: list `{entry}`, or declare \
             the kernel `extern \"C\"`"
        ),
        None => format!("its entries are {list}"),
    }
}

/// Whether `bytes` is an ELF file for machine 190 (CUDA). Reads only the ELF header, so it is
/// cheap enough to run on every file of a wheel.
pub fn is_cubin(bytes: &[u8]) -> bool {
    matches!(elf_machine(bytes), Ok(EM_CUDA))
}

/// Reads a cubin's (or PTX's) target SM and kind, and its kernel entries with their parameter
/// sizes.
pub fn inspect_cubin(bytes: &[u8]) -> Result<CubinInfo, CubinError> {
    inspect_artifact(bytes).map(|inspection| inspection.info)
}

/// A cubin, or PTX text when the bytes are not ELF but read as PTX.
fn inspect_artifact(bytes: &[u8]) -> Result<Inspection, CubinError> {
    match inspect(bytes) {
        Err(CubinError::NotElf {
            found: "PTX assembly",
            ..
        }) => inspect_ptx(bytes),
        other => other,
    }
}

/// Validates an artifact against an expected target: for a cubin target, ELF machine 190, SM
/// equal to `arch.sm` and the kind of `arch` (`a`, `f`, plain) wherever the cubin records one;
/// for a `compute_XY` target, PTX for `.target sm_XY`; and every symbol in `entries` present
/// as a kernel entry. Returns what the artifact holds.
pub fn validate_cubin(bytes: &[u8], arch: Arch, entries: &[&str]) -> Result<CubinInfo, CubinError> {
    let Inspection {
        info,
        device_functions,
    } = inspect_artifact(bytes)?;
    let kind_mismatch = || CubinError::KindMismatch {
        expected: arch,
        found: describe_found(info.sm, info.kind),
        evidence: info.kind_evidence.clone(),
    };
    match (arch.kind, info.kind) {
        (ArchKind::Ptx, Some(ArchKind::Ptx)) => {}
        (ArchKind::Ptx, _) | (_, Some(ArchKind::Ptx)) => return Err(kind_mismatch()),
        // Without the note, a cubin that is not arch-specific may be either.
        (ArchKind::Family | ArchKind::Plain, None) => {}
        (expected, Some(found)) if expected == found => {}
        _ => return Err(kind_mismatch()),
    }
    if arch.is_ptx() {
        // `.version 9.0, .target sm_90a`: the target directive's own words.
        let target = info
            .kind_evidence
            .rsplit_once(".target ")
            .map_or("", |(_, target)| target);
        if target != format!("sm_{}", arch.sm) {
            return Err(CubinError::PtxTarget {
                expected: arch,
                target: target.to_owned(),
            });
        }
    }
    if info.sm != arch.sm {
        return Err(CubinError::SmMismatch {
            expected: arch,
            found: info.sm,
            abi_version: info.abi_version,
            elf_flags: info.elf_flags,
        });
    }
    for &symbol in entries {
        if info.function(symbol).is_some() {
            continue;
        }
        if device_functions.iter().any(|function| function == symbol) {
            return Err(CubinError::NotEntry {
                symbol: symbol.to_owned(),
            });
        }
        return Err(CubinError::MissingEntry {
            symbol: symbol.to_owned(),
            found: info.symbols(),
        });
    }
    Ok(info)
}

/// The SM number in `e_flags`, for the ELF ABI versions whose layout is known.
fn sm_from_flags(abi_version: u8, elf_flags: u32) -> Option<u32> {
    match abi_version {
        7 => Some(elf_flags & 0xff),
        8 => Some((elf_flags >> 8) & 0xff),
        _ => None,
    }
}

/// The ELF `e_machine` of `bytes`, read in the file's own byte order.
fn elf_machine(bytes: &[u8]) -> Result<u16, CubinError> {
    if bytes.get(..4) != Some(&ELFMAG[..]) {
        return Err(CubinError::NotElf {
            found: describe_non_elf(bytes),
            size: bytes.len(),
        });
    }
    let (Some(&data), Some(&[low, high])) = (bytes.get(5), bytes.get(18..20)) else {
        return Err(malformed(format!(
            "the file is {} bytes long, too short for an ELF header",
            bytes.len()
        )));
    };
    Ok(if data == ELFDATA2MSB {
        u16::from_be_bytes([low, high])
    } else {
        u16::from_le_bytes([low, high])
    })
}

/// A guess at what non-ELF bytes are, for the error message.
fn describe_non_elf(bytes: &[u8]) -> &'static str {
    // The fatbinary container that `nvcc -fatbin` writes and host objects embed.
    const FATBIN_MAGIC: [u8; 4] = 0xba55_ed50_u32.to_le_bytes();
    if bytes.is_empty() {
        return "empty";
    }
    if bytes.starts_with(&FATBIN_MAGIC) {
        return "a CUDA fatbinary";
    }
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(4096)]);
    if text.lines().any(|line| {
        let line = line.trim_start();
        line.starts_with(".version") || line.starts_with(".target")
    }) {
        return "PTX assembly";
    }
    "unrecognized"
}

/// A cubin's header and entries, plus the device functions, which only validation needs.
struct Inspection {
    info: CubinInfo,
    device_functions: Vec<String>,
}

/// `read` run on `bytes` 8-byte aligned: `object` reads ELF structures in place and needs them
/// so, and bytes from `include_bytes!` or a slice into a larger buffer may not be. The bytes
/// themselves where they are aligned, else an aligned copy.
pub(crate) fn with_aligned<T>(bytes: &[u8], read: impl FnOnce(&[u8]) -> T) -> T {
    if bytes.as_ptr().align_offset(8) == 0 {
        return read(bytes);
    }
    let mut words = vec![0u64; bytes.len().div_ceil(8)];
    let aligned = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..bytes.len()];
    aligned.copy_from_slice(bytes);
    read(aligned)
}

/// The ELF header of a cubin, which is 64-bit little-endian; `bytes` aligned ([`with_aligned`]).
fn elf_header(bytes: &[u8]) -> Result<&FileHeader64<LittleEndian>, CubinError> {
    FileHeader64::<LittleEndian>::parse(bytes)
        .map_err(|error| malformed(format!("cannot read the ELF header: {error}")))
}

/// The section table that `header`, read from `bytes`, points to.
fn elf_sections<'a>(
    header: &FileHeader64<LittleEndian>,
    bytes: &'a [u8],
) -> Result<SectionTable<'a, FileHeader64<LittleEndian>>, CubinError> {
    header
        .sections(LittleEndian, bytes)
        .map_err(|error| malformed(format!("cannot read the section headers: {error}")))
}

fn inspect(bytes: &[u8]) -> Result<Inspection, CubinError> {
    with_aligned(bytes, inspect_aligned)
}

fn inspect_aligned(bytes: &[u8]) -> Result<Inspection, CubinError> {
    let machine = elf_machine(bytes)?;
    if machine != EM_CUDA {
        return Err(CubinError::WrongMachine { machine });
    }
    let header = elf_header(bytes)?;
    let ident = header.e_ident();
    if ident.class != ELFCLASS64 || ident.data != ELFDATA2LSB {
        return Err(malformed(
            "the ELF file is not 64-bit little-endian, as every cubin is",
        ));
    }
    let endian = LittleEndian;
    let abi_version = ident.abi_version;
    let elf_flags = header.e_flags(endian);
    let sm = sm_from_flags(abi_version, elf_flags).ok_or(CubinError::UnknownAbiVersion {
        abi_version,
        elf_flags,
    })?;

    let sections = elf_sections(header, bytes)?;
    let mut nv_info = BTreeMap::new();
    let mut compat_specific = None;
    let mut ptxas_arch = None;
    for section in sections.iter() {
        let name = sections
            .section_name(endian, section)
            .map_err(|error| malformed(format!("cannot read a section name: {error}")))?;
        if name == b".nv.compat" || name == b".note.nv.tkinfo" {
            let data = section.data(endian, bytes).map_err(|error| {
                malformed(format!(
                    "cannot read section `{}`: {error}",
                    String::from_utf8_lossy(name)
                ))
            })?;
            if name == b".nv.compat" {
                let records = attributes(data)
                    .map_err(|what| malformed(format!("in `.nv.compat`: {what}")))?;
                compat_specific = records
                    .iter()
                    .find(|record| record.attribute == COMPAT_ARCH_SPECIFIC)
                    .map(|record| record.value.first() == Some(&1));
            } else {
                ptxas_arch = ptxas_arch_option(data);
            }
        }
        if let Some(function) = name.strip_prefix(NV_INFO_PREFIX) {
            let data = section.data(endian, bytes).map_err(|error| {
                malformed(format!(
                    "cannot read section `{}`: {error}",
                    String::from_utf8_lossy(name)
                ))
            })?;
            nv_info.insert(function, data);
        }
    }

    let symbols = sections
        .symbols(endian, bytes, SHT_SYMTAB)
        .map_err(|error| malformed(format!("cannot read the symbol table: {error}")))?;
    let mut functions = Vec::new();
    let mut device_functions = Vec::new();
    for symbol in symbols.iter() {
        if symbol.st_type() != STT_FUNC {
            continue;
        }
        let name = symbol
            .name(endian, symbols.strings())
            .map_err(|error| malformed(format!("cannot read a symbol name: {error}")))?;
        let name = std::str::from_utf8(name).map_err(|_| {
            malformed(format!(
                "function symbol `{}` is not UTF-8",
                String::from_utf8_lossy(name)
            ))
        })?;
        if symbol.st_other() & STO_CUDA_ENTRY == 0 {
            device_functions.push(name.to_owned());
            continue;
        }
        let info = nv_info.get(name.as_bytes()).ok_or_else(|| {
            malformed(format!(
                "kernel entry `{name}` has no `.nv.info.{name}` section, so its parameters are \
                 unknown"
            ))
        })?;
        functions.push(CubinFunction {
            symbol: name.to_owned(),
            param_sizes: parameter_sizes(name, info)?,
        });
    }
    if let Some(twice) = sort_by_symbol(&mut functions) {
        return Err(malformed(format!(
            "kernel entry `{twice}` is defined twice"
        )));
    }
    device_functions.sort();

    let (kind, kind_evidence) = cubin_kind(abi_version, elf_flags, compat_specific, ptxas_arch);
    Ok(Inspection {
        info: CubinInfo {
            abi_version,
            elf_flags,
            sm,
            kind,
            kind_evidence,
            functions,
        },
        device_functions,
    })
}

/// The kind a cubin records, and where: the `a` marker in `e_flags` or `.nv.compat`, then
/// the `-arch` of the ptxas command line in `.note.nv.tkinfo`. Sources that disagree make the
/// `a` marker win (it is what the driver acts on) and the evidence shows both.
fn cubin_kind(
    abi_version: u8,
    elf_flags: u32,
    compat_specific: Option<bool>,
    ptxas_arch: Option<String>,
) -> (Option<ArchKind>, String) {
    let flag_specific = elf_flags & arch_specific_flag(abi_version) != 0;
    let options = ptxas_arch
        .as_ref()
        .map(|arch| format!("ptxas `-arch {arch}`"));
    let with_options = |text: String| match &options {
        Some(options) => format!("{text}, {options}"),
        None => text,
    };
    if flag_specific {
        return (
            Some(ArchKind::Specific),
            with_options(format!("e_flags {elf_flags:#x}")),
        );
    }
    if compat_specific == Some(true) {
        return (
            Some(ArchKind::Specific),
            with_options(".nv.compat attribute 0x09 = 1".to_owned()),
        );
    }
    let from_options = ptxas_arch
        .as_deref()
        .and_then(|arch| arch.parse::<Arch>().ok())
        .map(|arch| arch.kind)
        .filter(|kind| *kind != ArchKind::Ptx);
    match (from_options, options) {
        (Some(kind), Some(options)) => (Some(kind), options),
        _ => (
            None,
            format!("e_flags {elf_flags:#x} without the `a` bit, and no ptxas command line"),
        ),
    }
}

/// The `-arch` value of the ptxas command line a `.note.nv.tkinfo` note records
/// (`-arch sm_100f -m 64` → `sm_100f`).
fn ptxas_arch_option(note: &[u8]) -> Option<String> {
    note.split(|&byte| byte == 0)
        .filter_map(|text| std::str::from_utf8(text).ok())
        .find_map(|text| {
            let mut words = text.split_whitespace();
            words.find(|word| *word == "-arch")?;
            words.next().map(str::to_owned)
        })
}

/// Sorts entries by symbol; returns a symbol that appears twice, if any.
fn sort_by_symbol(functions: &mut [CubinFunction]) -> Option<String> {
    functions.sort_by(|a, b| a.symbol.cmp(&b.symbol));
    functions
        .windows(2)
        .find(|pair| pair[0].symbol == pair[1].symbol)
        .map(|pair| pair[0].symbol.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/cubin");

    const fn target(sm: u32, kind: ArchKind) -> Arch {
        Arch { sm, kind }
    }

    const SM_90A: Arch = target(90, ArchKind::Specific);
    const SM_100A: Arch = target(100, ArchKind::Specific);
    const SM_90: Arch = target(90, ArchKind::Plain);
    const SM_100F: Arch = target(100, ArchKind::Family);
    const SM_100: Arch = target(100, ArchKind::Plain);
    const COMPUTE_90: Arch = target(90, ArchKind::Ptx);

    /// (file, target, ELF ABI version, e_flags), as `cuobjdump -elf` reports them.
    const CUBINS: [(&str, Arch, u8, u32); 8] = [
        ("nvrtc129_sm_90a.cubin", SM_90A, 7, 0x5a0d5a),
        ("nvrtc129_sm_100a.cubin", SM_100A, 8, 0x600640a),
        ("nvcc130_sm_90a.cubin", SM_90A, 8, 0x6005a04),
        ("nvcc130_sm_100a.cubin", SM_100A, 8, 0x6006402),
        ("nvcc130_sm_100f.cubin", SM_100F, 8, 0x6006402),
        ("nvcc130_sm_100.cubin", SM_100, 8, 0x6006402),
        ("ptxas129_sm_90.cubin", SM_90, 7, 0x5a055a),
        ("ptxas129_sm_100f.cubin", SM_100F, 8, 0x6006402),
    ];

    /// PTX of the same source for `compute_90`.
    const PTX: &str = "nvcc130_compute_90.ptx";

    /// The kernels of `kernels.cu` and their parameter sizes, sorted by symbol.
    const KERNELS: [(&str, &[u32]); 6] = [
        ("_Z9kw_squareIfEvPT_i", &[8, 4]),
        ("kw_axpy", &[8, 4, 8]),
        ("kw_empty", &[]),
        ("kw_large", &[4608, 8]),
        ("kw_scalars", &[8, 1, 2, 4, 8]),
        ("kw_structs", &[8, 12, 16]),
    ];

    fn fixture(name: &str) -> Vec<u8> {
        let path = format!("{FIXTURES}/{name}");
        std::fs::read(&path).unwrap_or_else(|error| panic!("cannot read {path}: {error}"))
    }

    fn nv_info_section(bytes: &[u8], symbol: &str) -> Vec<u8> {
        let header = FileHeader64::<LittleEndian>::parse(bytes).unwrap();
        let sections = header.sections(LittleEndian, bytes).unwrap();
        let name = format!(".nv.info.{symbol}");
        let (_, section) = sections
            .section_by_name(LittleEndian, name.as_bytes())
            .unwrap();
        section.data(LittleEndian, bytes).unwrap().to_vec()
    }

    /// An `.nv.info` SVAL record.
    fn sval(attribute: u8, payload: &[u8]) -> Vec<u8> {
        let size = u16::try_from(payload.len()).unwrap().to_le_bytes();
        [&[EIFMT_SVAL, attribute, size[0], size[1]], payload].concat()
    }

    /// An `EIATTR_KPARAM_INFO` record laid out as the compilers write it.
    fn kparam(ordinal: u16, offset: u16, size: u32) -> Vec<u8> {
        let mut payload = vec![0; 4];
        payload.extend(ordinal.to_le_bytes());
        payload.extend(offset.to_le_bytes());
        payload.extend((size << 18 | 0x1f000).to_le_bytes());
        sval(EIATTR_KPARAM_INFO, &payload)
    }

    fn cbank_param_size(size: u16) -> Vec<u8> {
        let size = size.to_le_bytes();
        vec![EIFMT_HVAL, EIATTR_CBANK_PARAM_SIZE, size[0], size[1]]
    }

    #[test]
    fn header_matches_the_compiler_output() {
        for (name, arch, abi_version, elf_flags) in CUBINS {
            let bytes = fixture(name);
            assert!(is_cubin(&bytes), "{name}");
            let info = inspect_cubin(&bytes).unwrap();
            assert_eq!(info.abi_version, abi_version, "{name}");
            assert_eq!(info.elf_flags, elf_flags, "{name}");
            assert_eq!(info.sm, arch.sm, "{name}");
        }
    }

    #[test]
    fn sm_is_read_from_the_byte_the_abi_version_names() {
        assert_eq!(sm_from_flags(7, 0x5a0d5a), Some(90));
        assert_eq!(sm_from_flags(8, 0x600640a), Some(100));
        assert_eq!(sm_from_flags(8, 0x6005a04), Some(90));
        assert_eq!(sm_from_flags(8, 0x6006402), Some(100));
        assert_eq!(sm_from_flags(6, 0x5a0d5a), None);
    }

    #[test]
    fn entries_and_parameter_sizes_are_exact() {
        for (name, _, _, _) in CUBINS {
            let info = inspect_cubin(&fixture(name)).unwrap();
            let found: Vec<(&str, &[u32])> = info
                .functions
                .iter()
                .map(|function| (function.symbol.as_str(), function.param_sizes.as_slice()))
                .collect();
            assert_eq!(found, KERNELS, "{name}");
            assert_eq!(
                info.function("kw_scalars").unwrap().param_sizes,
                [8, 1, 2, 4, 8]
            );
            assert!(info.function("kw_missing").is_none());
        }
    }

    #[test]
    fn device_functions_are_not_entries() {
        for (name, _, _, _) in CUBINS {
            let inspection = inspect(&fixture(name)).unwrap();
            // `kw_scale` is cloned into its callers as local `$kw_axpy$kw_scale` and so on.
            assert!(
                inspection
                    .device_functions
                    .iter()
                    .any(|function| function.contains("kw_scale")),
                "{name}: {:?}",
                inspection.device_functions
            );
            assert!(
                inspection
                    .info
                    .functions
                    .iter()
                    .all(|function| !function.symbol.contains("kw_scale")),
                "{name}"
            );
        }
    }

    #[test]
    fn large_parameter_lists_use_kparam_info_v2() {
        for (name, _, _, _) in CUBINS {
            let bytes = fixture(name);
            let large = nv_info_section(&bytes, "kw_large");
            let small = nv_info_section(&bytes, "kw_axpy");
            let kinds = |section: &[u8]| -> Vec<u8> {
                attributes(section)
                    .unwrap()
                    .iter()
                    .map(|record| record.attribute)
                    .filter(|&attribute| {
                        attribute == EIATTR_KPARAM_INFO || attribute == EIATTR_KPARAM_INFO_V2
                    })
                    .collect()
            };
            assert_eq!(kinds(&large), [EIATTR_KPARAM_INFO_V2; 2], "{name}");
            assert_eq!(kinds(&small), [EIATTR_KPARAM_INFO; 3], "{name}");
        }
    }

    #[test]
    fn validate_accepts_the_target_it_was_built_for() {
        let entries: Vec<&str> = KERNELS.iter().map(|(symbol, _)| *symbol).collect();
        for (name, arch, _, _) in CUBINS {
            let info = validate_cubin(&fixture(name), arch, &entries).unwrap();
            assert_eq!(info.functions.len(), KERNELS.len());
        }
        let info = validate_cubin(&fixture(PTX), COMPUTE_90, &entries).unwrap();
        assert_eq!(info.functions.len(), KERNELS.len());
    }

    #[test]
    fn the_kind_is_read_where_each_toolkit_writes_it() {
        use ArchKind::{Family, Plain, Ptx, Specific};
        #[rustfmt::skip]
        let table = [
            ("nvrtc129_sm_90a.cubin", Some(Specific), "e_flags 0x5a0d5a"),
            ("nvrtc129_sm_100a.cubin", Some(Specific), "e_flags 0x600640a, ptxas `-arch sm_100a`"),
            ("nvcc130_sm_90a.cubin", Some(Specific), ".nv.compat attribute 0x09 = 1, ptxas `-arch sm_90a`"),
            ("nvcc130_sm_100a.cubin", Some(Specific), ".nv.compat attribute 0x09 = 1, ptxas `-arch sm_100a`"),
            ("nvcc130_sm_100f.cubin", Some(Family), "ptxas `-arch sm_100f`"),
            ("nvcc130_sm_100.cubin", Some(Plain), "ptxas `-arch sm_100`"),
            ("ptxas129_sm_100f.cubin", Some(Family), "ptxas `-arch sm_100f`"),
            ("ptxas129_sm_90.cubin", None, "e_flags 0x5a055a without the `a` bit, and no ptxas command line"),
            (PTX, Some(Ptx), ".version 9.0, .target sm_90"),
        ];
        for (name, kind, evidence) in table {
            let info = inspect_cubin(&fixture(name)).unwrap();
            assert_eq!(
                (info.kind, info.kind_evidence.as_str()),
                (kind, evidence),
                "{name}"
            );
        }
    }

    #[test]
    fn validate_rejects_another_kind() {
        let message = |name: &str, arch: Arch| {
            validate_cubin(&fixture(name), arch, &[])
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            message("nvcc130_sm_100a.cubin", SM_100F),
            "the artifact is an arch-specific sm_100a cubin (.nv.compat attribute 0x09 = 1, \
             ptxas `-arch sm_100a`), but the target sm_100f is a family cubin"
        );
        assert_eq!(
            message("nvcc130_sm_100f.cubin", SM_100A),
            "the artifact is a family sm_100f cubin (ptxas `-arch sm_100f`), but the target \
             sm_100a is an arch-specific cubin"
        );
        assert_eq!(
            message("nvcc130_sm_100.cubin", SM_100F),
            "the artifact is a plain sm_100 cubin (ptxas `-arch sm_100`), but the target sm_100f \
             is a family cubin"
        );
        assert_eq!(
            message("nvrtc129_sm_90a.cubin", SM_90),
            "the artifact is an arch-specific sm_90a cubin (e_flags 0x5a0d5a), but the target \
             sm_90 is a plain cubin"
        );
        assert_eq!(
            message("ptxas129_sm_90.cubin", SM_90A),
            "the artifact is a family or plain sm_90 cubin (e_flags 0x5a055a without the `a` bit, \
             and no ptxas command line), but the target sm_90a is an arch-specific cubin"
        );
        assert_eq!(
            message(PTX, SM_90A),
            "the artifact is PTX for sm_90 (.version 9.0, .target sm_90), but the target sm_90a \
             is an arch-specific cubin"
        );
        assert_eq!(
            message("nvcc130_sm_90a.cubin", COMPUTE_90),
            "the artifact is an arch-specific sm_90a cubin (.nv.compat attribute 0x09 = 1, \
             ptxas `-arch sm_90a`), but the target compute_90 is PTX"
        );
        // Without a note, a cubin that is not arch-specific passes as family or plain.
        validate_cubin(&fixture("ptxas129_sm_90.cubin"), SM_90, &["kw_axpy"]).unwrap();
    }

    #[test]
    fn ptx_entries_and_parameter_sizes_are_the_cubins() {
        let info = inspect_cubin(&fixture(PTX)).unwrap();
        let found: Vec<(&str, &[u32])> = info
            .functions
            .iter()
            .map(|function| (function.symbol.as_str(), function.param_sizes.as_slice()))
            .collect();
        assert_eq!(found, KERNELS);
        assert_eq!((info.sm, info.abi_version, info.elf_flags), (90, 0, 0));
        assert!(!is_cubin(&fixture(PTX)));
        let inspection = inspect_artifact(&fixture(PTX)).unwrap();
        assert_eq!(inspection.device_functions, ["kw_scale"]);
        let error = validate_cubin(&fixture(PTX), COMPUTE_90, &["kw_scale"]).unwrap_err();
        assert!(matches!(error, CubinError::NotEntry { .. }), "{error:?}");
        // A trailing NUL, as the driver wants it, reads the same.
        let mut terminated = fixture(PTX);
        terminated.push(0);
        assert_eq!(inspect_cubin(&terminated).unwrap(), info);
    }

    #[test]
    fn ptx_is_checked_as_ptx() {
        let ptx = String::from_utf8(fixture(PTX)).unwrap();
        let message = |text: &str, arch: Arch| {
            validate_cubin(text.as_bytes(), arch, &["kw_axpy"])
                .unwrap_err()
                .to_string()
        };
        let compute_100 = target(100, ArchKind::Ptx);
        assert_eq!(
            message(&ptx, compute_100),
            "PTX is for `.target sm_90`, but the target compute_100 needs `.target sm_100`"
        );
        // (what the PTX says instead, the message), each on the PTX for compute_90.
        let edits = [
            (
                (".target sm_90", ".target sm_90a"),
                "PTX is for `.target sm_90a`, but the target compute_90 needs `.target sm_90`",
            ),
            (
                (".version 9.0", ""),
                "malformed PTX: `.target` comes before `.version`",
            ),
            (
                (".version 9.0", ".version nine"),
                "malformed PTX: `.version nine` is not a version",
            ),
            (
                (".target sm_90", ""),
                "malformed PTX: no `.target` directive",
            ),
            (
                (".address_size 64", ".address_size 32"),
                "malformed PTX: `.address_size 32`: kernels are loaded as 64-bit code only",
            ),
            (
                (".entry kw_axpy", ".entry kw_axpz"),
                "cubin has no kernel entry `kw_axpy`; its entries are `_Z9kw_squareIfEvPT_i`, \
                 `kw_axpz`, `kw_empty`, `kw_large`, `kw_scalars`, `kw_structs`",
            ),
            (
                (".version", "\0.version"),
                "malformed PTX: it contains a NUL byte before its end",
            ),
            (
                ("kw_structs_param_1[12]", "kw_structs_param_1[twelve]"),
                "malformed PTX: in `.entry kw_structs`: array size `twelve` is not a number",
            ),
        ];
        for ((from, to), expected) in edits {
            let edited = ptx.replacen(from, to, 1);
            assert_eq!(message(&edited, COMPUTE_90), expected, "{from:?} → {to:?}");
        }
        // A declaration before the definition is not a second entry.
        let declared = ptx.replacen(
            ".visible .entry kw_empty()",
            ".visible .entry kw_axpy;\n.visible .entry kw_empty(.param .u64 p);\n\
             .visible .entry kw_empty()",
            1,
        );
        let info = inspect_cubin(declared.as_bytes()).unwrap();
        assert_eq!(info, inspect_cubin(ptx.as_bytes()).unwrap());
        // Comments do not count: a `.entry` in one is not an entry.
        let commented = ptx.replace(
            ".visible .entry kw_axpy(",
            "// .entry kw_fake(\n.visible .entry kw_axpy(",
        );
        assert!(inspect_cubin(commented.as_bytes())
            .unwrap()
            .function("kw_fake")
            .is_none());
    }

    #[test]
    fn damaged_ptx_never_panics() {
        let ptx = fixture(PTX);
        for length in 0..ptx.len() {
            let _ = inspect_cubin(&ptx[..length]);
        }
        for position in (0..ptx.len()).step_by(3) {
            let mut damaged = ptx.clone();
            damaged[position] = b'(';
            let _ = inspect_cubin(&damaged);
        }
    }

    #[test]
    fn validate_rejects_another_sm() {
        let error = validate_cubin(&fixture("nvcc130_sm_100a.cubin"), SM_90A, &[]).unwrap_err();
        assert!(matches!(
            error,
            CubinError::SmMismatch {
                expected: SM_90A,
                found: 100,
                abi_version: 8,
                elf_flags: 0x6006402,
            }
        ));
        assert_eq!(
            error.to_string(),
            "cubin is for sm_100 but the target is sm_90a (ELF ABI 8, e_flags 0x6006402)"
        );

        let error = validate_cubin(&fixture("nvrtc129_sm_90a.cubin"), SM_100A, &[]).unwrap_err();
        assert_eq!(
            error.to_string(),
            "cubin is for sm_90 but the target is sm_100a (ELF ABI 7, e_flags 0x5a0d5a)"
        );
    }

    #[test]
    fn validate_names_the_entries_it_found() {
        let bytes = fixture("nvcc130_sm_90a.cubin");
        let error = validate_cubin(&bytes, SM_90A, &["kw_axpy", "kw_missing"]).unwrap_err();
        let CubinError::MissingEntry { symbol, found } = &error else {
            panic!("expected MissingEntry, got {error:?}");
        };
        assert_eq!(symbol, "kw_missing");
        assert_eq!(*found, KERNELS.map(|(symbol, _)| symbol.to_owned()));
        assert_eq!(
            error.to_string(),
            "cubin has no kernel entry `kw_missing`; its entries are `_Z9kw_squareIfEvPT_i`, \
             `kw_axpy`, `kw_empty`, `kw_large`, `kw_scalars`, `kw_structs`"
        );
    }

    #[test]
    fn validate_points_at_the_mangled_name_of_a_template() {
        let bytes = fixture("nvrtc129_sm_100a.cubin");
        let error = validate_cubin(&bytes, SM_100A, &["kw_square"]).unwrap_err();
        assert!(
            error.to_string().ends_with(
                "C++ kernel names are mangled: list `_Z9kw_squareIfEvPT_i`, or declare the \
                 kernel `extern \"C\"`"
            ),
            "{error}"
        );
    }

    #[test]
    fn validate_rejects_a_device_function() {
        let bytes = fixture("nvcc130_sm_90a.cubin");
        let error = validate_cubin(&bytes, SM_90A, &["$kw_axpy$kw_scale"]).unwrap_err();
        assert!(
            matches!(&error, CubinError::NotEntry { symbol } if symbol == "$kw_axpy$kw_scale"),
            "{error:?}"
        );
    }

    #[test]
    fn rejects_what_is_not_an_elf_file() {
        // Deterministic noise (xorshift), which cannot start with the ELF magic.
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let noise: Vec<u8> = (0..4096)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state.to_le_bytes()[0]
            })
            .collect();
        let error = inspect_cubin(&noise).unwrap_err();
        assert!(
            matches!(
                error,
                CubinError::NotElf {
                    found: "unrecognized",
                    size: 4096
                }
            ),
            "{error:?}"
        );
        assert!(!is_cubin(&noise));

        // PTX is read as PTX: this one has no `.address_size 64`.
        let ptx = b"//\n// Generated by NVIDIA NVVM Compiler\n.version 8.8\n.target sm_90a\n";
        assert_eq!(
            inspect_cubin(ptx).unwrap_err().to_string(),
            "malformed PTX: no `.address_size` (32, the default): kernels are loaded as 64-bit \
             code only"
        );
        let fatbin = [0x50, 0xed, 0x55, 0xba, 1, 0, 0x10, 0];
        assert!(matches!(
            inspect_cubin(&fatbin),
            Err(CubinError::NotElf {
                found: "a CUDA fatbinary",
                ..
            })
        ));
        assert!(matches!(
            inspect_cubin(&[]),
            Err(CubinError::NotElf { found: "empty", .. })
        ));
    }

    #[test]
    fn rejects_a_truncated_cubin() {
        let bytes = fixture("nvcc130_sm_90a.cubin");
        let error = inspect_cubin(&bytes[..100]).unwrap_err();
        assert!(matches!(error, CubinError::Malformed { .. }), "{error:?}");
        // The ELF header is whole, so this is still recognisably a cubin.
        assert!(is_cubin(&bytes[..100]));
        let error = inspect_cubin(&bytes[..10]).unwrap_err();
        assert_eq!(
            error.to_string(),
            "malformed cubin: the file is 10 bytes long, too short for an ELF header"
        );
    }

    #[test]
    fn rejects_a_host_elf_file() {
        let exe = std::env::current_exe().unwrap();
        let bytes = std::fs::read(&exe).unwrap();
        assert!(!is_cubin(&bytes));
        let error = inspect_cubin(&bytes).unwrap_err();
        let CubinError::WrongMachine { machine } = error else {
            panic!("expected WrongMachine, got {error:?}");
        };
        if cfg!(target_arch = "x86_64") {
            assert_eq!(machine, 62);
            assert_eq!(
                error.to_string(),
                "not a cubin: the ELF file is for machine 62 (x86-64), not 190 (CUDA)"
            );
        }
        let error = validate_cubin(&bytes, SM_90A, &["kw_axpy"]).unwrap_err();
        assert!(matches!(error, CubinError::WrongMachine { .. }));
    }

    #[test]
    fn rejects_an_unknown_abi_version() {
        let mut bytes = fixture("nvrtc129_sm_90a.cubin");
        bytes[8] = 9;
        let error = inspect_cubin(&bytes).unwrap_err();
        assert!(matches!(
            error,
            CubinError::UnknownAbiVersion {
                abi_version: 9,
                elf_flags: 0x5a0d5a
            }
        ));
    }

    #[test]
    fn damaged_cubins_never_panic() {
        for (name, _, _, _) in CUBINS {
            let bytes = fixture(name);
            for length in (0..bytes.len()).step_by(7) {
                let _ = inspect_cubin(&bytes[..length]);
            }
        }
        // Every byte of one cubin, overwritten in turn.
        let bytes = fixture("nvcc130_sm_90a.cubin");
        for position in 0..bytes.len() {
            for value in [0x00, 0x7f, 0xff] {
                let mut damaged = bytes.clone();
                damaged[position] = value;
                let _ = inspect_cubin(&damaged);
            }
        }
    }

    #[test]
    fn damaged_nv_info_sections_never_panic() {
        let bytes = fixture("nvrtc129_sm_100a.cubin");
        for (symbol, _) in KERNELS {
            let section = nv_info_section(&bytes, symbol);
            for length in 0..section.len() {
                let _ = parameter_sizes(symbol, &section[..length]);
            }
            for position in 0..section.len() {
                let mut damaged = section.clone();
                damaged[position] ^= 0xff;
                let _ = parameter_sizes(symbol, &damaged);
            }
        }
    }

    #[test]
    fn parameter_sizes_come_in_ordinal_order() {
        let section = [
            sval(0x37, &[0x82, 0, 0, 0]),
            kparam(1, 8, 4),
            kparam(0, 0, 8),
            vec![EIFMT_NVAL, 0x3e, 0, 0],
            vec![EIFMT_BVAL, 0x4a, 0, 0],
            cbank_param_size(12),
        ]
        .concat();
        assert_eq!(parameter_sizes("k", &section).unwrap(), [8, 4]);
        assert_eq!(parameter_sizes("k", &[]).unwrap(), Vec::<u32>::new());
    }

    #[test]
    fn parameter_records_must_be_consistent() {
        let message = |section: Vec<Vec<u8>>| {
            parameter_sizes("k", &section.concat())
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            message(vec![kparam(0, 0, 8), kparam(2, 8, 4)]),
            "malformed cubin: in `.nv.info.k`: parameter ordinals are [0, 2], not 0 to 1"
        );
        assert_eq!(
            message(vec![kparam(0, 0, 8), kparam(0, 8, 4)]),
            "malformed cubin: in `.nv.info.k`: parameter ordinals are [0, 0], not 0 to 1"
        );
        assert_eq!(
            message(vec![kparam(0, 0, 8), kparam(1, 8, 8), cbank_param_size(12)]),
            "malformed cubin: in `.nv.info.k`: parameters end at byte 16 of a 12-byte parameter \
             block"
        );
        assert_eq!(
            message(vec![cbank_param_size(8)]),
            "malformed cubin: in `.nv.info.k`: a 8-byte parameter block but no parameter records"
        );
        assert_eq!(
            message(vec![sval(EIATTR_KPARAM_INFO, &[0; 8])]),
            "malformed cubin: in `.nv.info.k`: parameter record 0x17 is 8 bytes, not 12"
        );
        assert_eq!(
            message(vec![vec![0x07, 0x17, 0, 0]]),
            "malformed cubin: in `.nv.info.k`: attribute 0x17 at byte 0 has unknown format 0x07"
        );
        assert_eq!(
            message(vec![kparam(0, 0, 8), vec![EIFMT_SVAL, 0x17, 12, 0, 0]]),
            "malformed cubin: in `.nv.info.k`: attribute 0x17 at byte 16 claims 12 bytes but \
             only 1 remain"
        );
        assert_eq!(
            message(vec![kparam(0, 0, 8), vec![EIFMT_HVAL, 0x19]]),
            "malformed cubin: in `.nv.info.k`: attribute record at byte 16 is cut short (2 bytes \
             left)"
        );
    }

    #[test]
    fn unaligned_bytes_are_read_like_aligned_ones() {
        let bytes = fixture("nvcc130_sm_90a.cubin");
        let mut shifted = vec![0u8; bytes.len() + 1];
        shifted[1..].copy_from_slice(&bytes);
        assert_eq!(
            inspect_cubin(&shifted[1..]).unwrap(),
            inspect_cubin(&bytes).unwrap()
        );
    }
}
