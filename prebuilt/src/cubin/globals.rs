//! The initial values of 8-byte device variables, read from a cubin's ELF or a PTX text: how
//! the values the compiler computes ([`crate::compile::computed`]) come back.
//!
//! | output | where a variable's value is |
//! | --- | --- |
//! | cubin | an `OBJECT` symbol of size 8: its bytes in the section it names (`.nv.global.init`), at the symbol's value, little-endian; zero in a `NOBITS` section (`.nv.global`) |
//! | PTX | `.global .align 8 .u64 <name> = <value>;`, zero without an initializer |

use std::collections::BTreeMap;

use object::elf::{SHT_NOBITS, SHT_SYMTAB, STT_OBJECT};
use object::read::elf::{SectionHeader, Sym};
use object::LittleEndian;

use super::{elf_header, elf_sections, is_cubin, malformed, malformed_ptx, CubinError};

/// Every 8-byte variable whose name starts with `prefix`, with its initial value.
pub fn read_global_integers(
    bytes: &[u8],
    prefix: &str,
) -> Result<BTreeMap<String, i64>, CubinError> {
    if is_cubin(bytes) {
        super::with_aligned(bytes, |bytes| cubin_globals(bytes, prefix))
    } else {
        ptx_globals(bytes, prefix)
    }
}

fn cubin_globals(bytes: &[u8], prefix: &str) -> Result<BTreeMap<String, i64>, CubinError> {
    let endian = LittleEndian;
    let sections = elf_sections(elf_header(bytes)?, bytes)?;
    let symbols = sections
        .symbols(endian, bytes, SHT_SYMTAB)
        .map_err(|error| malformed(format!("cannot read the symbol table: {error}")))?;
    let mut found = BTreeMap::new();
    for symbol in symbols.iter() {
        if symbol.st_type() != STT_OBJECT {
            continue;
        }
        let name = symbol
            .name(endian, symbols.strings())
            .map_err(|error| malformed(format!("cannot read a symbol name: {error}")))?;
        let Some(name) = std::str::from_utf8(name)
            .ok()
            .filter(|name| name.starts_with(prefix))
        else {
            continue;
        };
        if symbol.st_size(endian) != 8 {
            return Err(malformed(format!(
                "`{name}` is {} bytes, not the 8 of a `long long`",
                symbol.st_size(endian)
            )));
        }
        let section = sections
            .section(object::SectionIndex(usize::from(symbol.st_shndx(endian))))
            .map_err(|error| malformed(format!("`{name}` names no section: {error}")))?;
        let value = if section.sh_type(endian) == SHT_NOBITS {
            0
        } else {
            let data = section.data(endian, bytes).map_err(|error| {
                malformed(format!("cannot read the section of `{name}`: {error}"))
            })?;
            let at = usize::try_from(symbol.st_value(endian)).unwrap_or(usize::MAX);
            let word = at
                .checked_add(8)
                .and_then(|end| data.get(at..end))
                .ok_or_else(|| malformed(format!("`{name}` lies past the end of its section")))?;
            i64::from_le_bytes(word.try_into().expect("8 bytes"))
        };
        found.insert(name.to_owned(), value);
    }
    Ok(found)
}

fn ptx_globals(bytes: &[u8], prefix: &str) -> Result<BTreeMap<String, i64>, CubinError> {
    let text = std::str::from_utf8(bytes).map_err(|_| malformed_ptx("the PTX is not UTF-8"))?;
    let mut found = BTreeMap::new();
    for line in text.lines() {
        let line = line.trim();
        if !line.starts_with(".global") && !line.starts_with(".visible .global") {
            continue;
        }
        let Some(at) = line.find(prefix) else {
            continue;
        };
        let declaration = line[at..].trim_end_matches(';');
        let (name, value) = match declaration.split_once('=') {
            Some((name, value)) => (name.trim(), value.trim()),
            None => (declaration.trim(), "0"),
        };
        let value = value
            .parse::<i64>()
            .or_else(|_| value.parse::<u64>().map(|value| value as i64))
            .map_err(|_| malformed_ptx(format!("`{name}` has no integer value: `{value}`")))?;
        found.insert(name.to_owned(), value);
    }
    Ok(found)
}
