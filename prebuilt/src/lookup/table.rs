//! The checks `kernels.idx`'s tables pass at open, before any record is read: see the
//! layout in [`super`].

use std::path::Path;

use super::{refused, Entry, ENTRY_LEN, GRAPH_ENTRY_LEN};
use crate::bundle::BundleError;
use crate::untrusted::{KernelName, MAX_NAME_LEN};

/// An absolute span of the file: offset and length.
pub(super) type Span = (u64, u32);

/// Where the table's spans must lie: the names section, and the records section
/// (`records_offset..length`).
pub(super) struct Sections<'a> {
    pub names: &'a [u8],
    pub records_offset: u64,
    pub length: u64,
}

/// Checks the whole table and the graph table against the names and records sections: every
/// entry's name follows the previous one's in the names section and is an identifier greater
/// than it; every entry's load and inputs records follow the previous entry's; every graph
/// record follows the last kernel's records or the previous graph's; both sections end where
/// the last spans do; every graph id names a graph and every graph is named; reserved fields
/// are 0. One pass over each table, one comparison per entry: the checks cost what reading
/// the tables costs.
pub(super) fn check_table(
    path: &Path,
    table: &[u8],
    graph_table: &[u8],
    sections: &Sections<'_>,
) -> Result<(Vec<Entry>, Vec<Span>), BundleError> {
    let Sections {
        names,
        records_offset,
        length,
    } = *sections;
    let records_len = length - records_offset;
    let graph_count = graph_table.len() / GRAPH_ENTRY_LEN as usize;
    let mut named = vec![false; graph_count];
    let mut entries = Vec::with_capacity(table.len() / ENTRY_LEN as usize);
    let (mut name_end, mut record_end) = (0u64, 0u64);
    let mut previous: Option<&[u8]> = None;
    for (position, bytes) in table.chunks_exact(ENTRY_LEN as usize).enumerate() {
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
        let entry = |reason: &str| {
            refused(
                path,
                "table entry",
                &position.to_string(),
                &format!("{reason}: the table is refused"),
            )
        };
        let (name_offset, name_len) = (u64_at(0), u64::from(u32_at(8)));
        let (load_len, record_offset, inputs_len) =
            (u64::from(u32_at(12)), u64_at(16), u64::from(u32_at(24)));
        let graph = u32_at(28);
        if graph as usize >= graph_count {
            return Err(entry(&format!(
                "names graph {graph}, not one of the {graph_count} graphs"
            )));
        }
        named[graph as usize] = true;
        if name_offset != name_end || name_len > names.len() as u64 - name_end {
            return Err(entry(&format!(
                "names {name_len} bytes at {name_offset}, not the next name, at {name_end}, \
                 inside the names section ({} bytes)",
                names.len()
            )));
        }
        let total = load_len + inputs_len;
        if record_offset != record_end || total > records_len - record_end {
            return Err(entry(&format!(
                "has records of {total} bytes at {record_offset}, not the next ones, at \
                 {record_end}, inside the records section ({records_len} bytes)"
            )));
        }
        let name = &names[name_end as usize..(name_end + name_len) as usize];
        // The common case checked on bytes, with no allocation (this runs for every kernel at
        // every open); a name it does not pass gets `KernelName::parse`'s error.
        if !is_short_identifier(name) {
            let text = std::str::from_utf8(name).unwrap_or("(not UTF-8)");
            KernelName::parse(text).map_err(|source| BundleError::Refused {
                path: path.to_owned(),
                source: source.of(format!("the name of table entry {position}")),
            })?;
        }
        if previous.is_some_and(|previous| previous >= name) {
            let text = std::str::from_utf8(name).unwrap_or("(not UTF-8)");
            return Err(refused(
                path,
                "the name table",
                text,
                &format!(
                    "is out of order at entry {position}: names must be sorted and unique \
                     (`{}` comes before it)",
                    String::from_utf8_lossy(previous.unwrap_or_default())
                ),
            ));
        }
        previous = Some(name);
        let load = records_offset + record_offset;
        entries.push(Entry {
            name: name_end as usize..(name_end + name_len) as usize,
            load: (load, load_len as u32),
            inputs: (load + load_len, inputs_len as u32),
            graph,
        });
        name_end += name_len;
        record_end += total;
    }
    let mut graphs = Vec::with_capacity(graph_count);
    for (position, bytes) in graph_table
        .chunks_exact(GRAPH_ENTRY_LEN as usize)
        .enumerate()
    {
        let offset = u64::from_le_bytes(bytes[..8].try_into().unwrap());
        let graph_len = u64::from(u32::from_le_bytes(bytes[8..12].try_into().unwrap()));
        let reserved = u32::from_le_bytes(bytes[12..16].try_into().unwrap());
        if offset != record_end || graph_len > records_len - record_end || reserved != 0 {
            return Err(refused(
                path,
                "graph entry",
                &position.to_string(),
                &format!(
                    "has a record of {graph_len} bytes at {offset}, not the next one, at \
                     {record_end}, inside the records section ({records_len} bytes), or a \
                     reserved field that is not 0: the graph table is refused"
                ),
            ));
        }
        if !named[position] {
            return Err(refused(
                path,
                "graph entry",
                &position.to_string(),
                "is named by no kernel: the graph table is refused",
            ));
        }
        graphs.push((records_offset + offset, graph_len as u32));
        record_end += graph_len;
    }
    if name_end != names.len() as u64 || record_end != records_len {
        return Err(refused(
            path,
            "the loader index's sections",
            &format!("{name_end} + {record_end} bytes"),
            &format!(
                "are not what the table spans: the names section holds {} bytes and the \
                 records section {records_len}",
                names.len()
            ),
        ));
    }
    Ok((entries, graphs))
}

/// Whether `name` is what [`KernelName::parse`] accepts: an ASCII identifier of at most
/// [`MAX_NAME_LEN`] bytes.
fn is_short_identifier(name: &[u8]) -> bool {
    name.len() <= MAX_NAME_LEN
        && name
            .first()
            .is_some_and(|&first| first == b'_' || first.is_ascii_alphabetic())
        && name
            .iter()
            .all(|&byte| byte == b'_' || byte.is_ascii_alphanumeric())
}
