//! What each kernel entry of a cubin asks of the GPU, read from the ELF: the facts a release
//! compares between two builds of one kernel (`kwheel release diff`).
//!
//! | fact | where the cubin keeps it |
//! | --- | --- |
//! | registers | `.nv.info`: `EIATTR_REGCOUNT` (0x2f), SVAL (symbol index `u32`, count `u32`) |
//! | register cap | `.nv.info.<entry>`: `EIATTR_MAXREG_COUNT` (0x1b), HVAL (`-maxrregcount`, `__maxnreg__`; 255 when none) |
//! | stack frame | `.nv.info`: `EIATTR_FRAME_SIZE` (0x11), SVAL (symbol index, bytes): local memory, spills included |
//! | max threads | `.nv.info.<entry>`: `EIATTR_MAX_THREADS` (0x05), SVAL (x, y, z: `__launch_bounds__`) |
//! | static shared memory | the size of the `.nv.shared.<entry>` section |
//! | code size | the size of the `.text.<entry>` section |
//! | parameters | `.nv.info.<entry>`: the parameter records ([`super::nvinfo`]) |
//!
//! Attribute numbers were read against NVIDIA's `cuobjdump -elf` on cubins of nvcc 13.0 and
//! NVRTC 12.9. Spill byte counts are ptxas's own report and not in the cubin; a spilling
//! kernel shows as a stack frame.

use std::collections::BTreeMap;

use object::elf::{SHT_SYMTAB, STT_FUNC};
use object::read::elf::{SectionHeader, Sym};
use object::LittleEndian;

use super::nvinfo::{attributes, parameter_sizes};
use super::{
    elf_header, elf_sections, malformed, CubinError, EIFMT_HVAL, EIFMT_SVAL, STO_CUDA_ENTRY,
};

const EIATTR_MAX_THREADS: u8 = 0x05;
const EIATTR_FRAME_SIZE: u8 = 0x11;
const EIATTR_MAXREG_COUNT: u8 = 0x1b;
const EIATTR_REGCOUNT: u8 = 0x2f;

/// What one kernel entry asks of the GPU.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EntryResources {
    /// Registers per thread.
    pub registers: Option<u32>,
    /// The register cap it was compiled under (`-maxrregcount`), when one was set.
    pub register_cap: Option<u32>,
    /// Stack frame per thread in bytes: local arrays and register spills.
    pub stack_bytes: Option<u32>,
    /// Statically declared shared memory in bytes.
    pub static_shared_bytes: u64,
    /// `__launch_bounds__`: the most threads per block it was compiled for (x·y·z).
    pub max_threads: Option<u64>,
    /// Machine code in bytes.
    pub code_bytes: u64,
    /// The size of each parameter, in declaration order (the launch ABI).
    pub param_sizes: Vec<u32>,
}

/// The resources of every kernel entry of a cubin, by symbol. PTX has none: the driver
/// decides them when it compiles.
pub fn entry_resources(bytes: &[u8]) -> Result<BTreeMap<String, EntryResources>, CubinError> {
    super::with_aligned(bytes, aligned_entry_resources)
}

fn aligned_entry_resources(bytes: &[u8]) -> Result<BTreeMap<String, EntryResources>, CubinError> {
    if !super::is_cubin(bytes) {
        return Ok(BTreeMap::new());
    }
    let endian = LittleEndian;
    let sections = elf_sections(elf_header(bytes)?, bytes)?;
    let symbols = sections
        .symbols(endian, bytes, SHT_SYMTAB)
        .map_err(|error| malformed(format!("cannot read the symbol table: {error}")))?;

    // Symbol index → entry name, for the records of `.nv.info` that name a function.
    let mut entries: BTreeMap<u32, String> = BTreeMap::new();
    for (index, symbol) in symbols.iter().enumerate() {
        if symbol.st_type() != STT_FUNC || symbol.st_other() & STO_CUDA_ENTRY == 0 {
            continue;
        }
        let name = symbol
            .name(endian, symbols.strings())
            .map_err(|error| malformed(format!("cannot read a symbol name: {error}")))?;
        if let (Ok(index), Ok(name)) = (u32::try_from(index), std::str::from_utf8(name)) {
            entries.insert(index, name.to_owned());
        }
    }
    let mut resources: BTreeMap<String, EntryResources> = entries
        .values()
        .map(|name| (name.clone(), EntryResources::default()))
        .collect();

    for section in sections.iter() {
        let name = sections
            .section_name(endian, section)
            .map_err(|error| malformed(format!("cannot read a section name: {error}")))?;
        let name = String::from_utf8_lossy(name);
        let data = || {
            section
                .data(endian, bytes)
                .map_err(|error| malformed(format!("cannot read section `{name}`: {error}")))
        };
        if let Some(entry) = name.strip_prefix(".text.") {
            if let Some(resource) = resources.get_mut(entry) {
                resource.code_bytes = section.sh_size(endian);
            }
        } else if let Some(entry) = name.strip_prefix(".nv.shared.") {
            if let Some(resource) = resources.get_mut(entry) {
                resource.static_shared_bytes = section.sh_size(endian);
            }
        } else if name == ".nv.info" {
            let records =
                attributes(data()?).map_err(|what| malformed(format!("in `.nv.info`: {what}")))?;
            for record in records {
                if record.format != EIFMT_SVAL {
                    continue;
                }
                let Some((symbol, value)) = symbol_and_value(record.value) else {
                    continue;
                };
                let Some(resource) = entries
                    .get(&symbol)
                    .and_then(|entry| resources.get_mut(entry))
                else {
                    continue;
                };
                match record.attribute {
                    EIATTR_REGCOUNT => resource.registers = Some(value),
                    EIATTR_FRAME_SIZE => resource.stack_bytes = Some(value),
                    _ => {}
                }
            }
        } else if let Some(entry) = name.strip_prefix(".nv.info.") {
            let Some(resource) = resources.get_mut(entry) else {
                continue;
            };
            let data = data()?;
            resource.param_sizes = parameter_sizes(entry, data)?;
            let records =
                attributes(data).map_err(|what| malformed(format!("in `{name}`: {what}")))?;
            for record in records {
                match (record.format, record.attribute) {
                    (EIFMT_HVAL, EIATTR_MAXREG_COUNT) => {
                        if let &[low, high] = record.value {
                            let cap = u32::from(u16::from_le_bytes([low, high]));
                            // 255 is the hardware's limit: no cap was asked for.
                            resource.register_cap = (cap < 255).then_some(cap);
                        }
                    }
                    (EIFMT_SVAL, EIATTR_MAX_THREADS) => {
                        let dimensions: Vec<u64> = record
                            .value
                            .chunks_exact(4)
                            .map(|word| {
                                u64::from(u32::from_le_bytes([word[0], word[1], word[2], word[3]]))
                            })
                            .collect();
                        if dimensions.len() == 3 {
                            resource.max_threads = Some(dimensions.iter().product());
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    Ok(resources)
}

/// An SVAL payload of (symbol index `u32`, value `u32`).
fn symbol_and_value(value: &[u8]) -> Option<(u32, u32)> {
    let &[s0, s1, s2, s3, v0, v1, v2, v3] = value else {
        return None;
    };
    Some((
        u32::from_le_bytes([s0, s1, s2, s3]),
        u32::from_le_bytes([v0, v1, v2, v3]),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fixtures' entries as NVIDIA's `cuobjdump -res-usage` reports them (REG, STACK).
    #[test]
    fn resources_agree_with_cuobjdump() {
        let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/cubin");
        for file in [
            "nvcc130_sm_90a.cubin",
            "nvrtc129_sm_90a.cubin",
            "nvcc130_sm_100a.cubin",
        ] {
            let bytes = std::fs::read(format!("{fixtures}/{file}")).unwrap();
            let resources = entry_resources(&bytes).unwrap();
            let registers: BTreeMap<&str, Option<u32>> = resources
                .iter()
                .map(|(name, resource)| (name.as_str(), resource.registers))
                .collect();
            assert_eq!(registers["_Z9kw_squareIfEvPT_i"], Some(8), "{file}");
            assert_eq!(registers["kw_large"], Some(8), "{file}");
            assert_eq!(registers["kw_empty"], Some(4), "{file}");
            let axpy = &resources["kw_axpy"];
            assert_eq!(axpy.stack_bytes, Some(0), "{file}");
            assert_eq!(axpy.code_bytes, 512, "{file}");
            assert_eq!(axpy.register_cap, None, "{file}");
            assert_eq!(
                resources["kw_empty"].param_sizes,
                Vec::<u32>::new(),
                "{file}"
            );
            assert_eq!(resources["kw_empty"].code_bytes, 256, "{file}");
        }
    }

    /// Launch bounds, shared memory, a stack frame and a register cap, as ptxas reported them
    /// when the fixture was built.
    #[test]
    fn bounds_shared_stack_and_cap_are_read() {
        let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/cubin");
        let bytes = std::fs::read(format!("{fixtures}/nvcc130_sm_90a_resources.cubin")).unwrap();
        let resources = entry_resources(&bytes).unwrap();
        let bounded = &resources["lb"];
        assert_eq!(bounded.registers, Some(32));
        assert_eq!(bounded.stack_bytes, Some(256));
        // The section, as the driver reserves it and `cuobjdump` reports it (SHARED:3072).
        assert_eq!(bounded.static_shared_bytes, 3072);
        assert_eq!(bounded.max_threads, Some(256));
        assert_eq!(bounded.register_cap, None);
        assert_eq!(bounded.param_sizes, vec![8, 8, 4]);
        let capped = &resources["capped"];
        assert_eq!(capped.registers, Some(10));
        assert_eq!(capped.register_cap, Some(32));
        assert_eq!(capped.max_threads, None);
    }

    #[test]
    fn ptx_has_no_resources() {
        let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/cubin");
        let ptx = std::fs::read(format!("{fixtures}/nvcc130_compute_90.ptx")).unwrap();
        assert!(entry_resources(&ptx).unwrap().is_empty());
    }
}
