//! The checks `kernels.idx`'s tables pass, before any record they locate is read: see the
//! layout in [`super`].
//!
//! Two ways, one set of rules. [`check_table`] reads both tables whole and checks every entry
//! (what listing every kernel, or decoding the whole index, needs). [`find_entry`] checks only
//! what one lookup touches, reading entries one by one: each entry its binary search visits
//! (its name an identifier inside the names section), and around the entry it finds, the
//! entries before and after it: names in strictly increasing order, name and record spans that
//! meet theirs end to end, a graph id that names a graph. So a first call reads a few hundred
//! bytes of table whatever the bundle's size, never reads a record outside its own span, and a
//! crafted table is refused by the lookup that meets the lie (and by any whole read).

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

/// Where the sections are, from the header, checked at open to lie in order inside the file.
#[derive(Clone, Copy, Debug)]
pub(super) struct Layout {
    pub count: u64,
    pub graph_count: u64,
    pub table_offset: u64,
    pub graph_table_offset: u64,
    pub names_offset: u64,
    pub records_offset: u64,
    pub length: u64,
}

impl Layout {
    fn names_len(&self) -> u64 {
        self.records_offset - self.names_offset
    }

    fn records_len(&self) -> u64 {
        self.length - self.records_offset
    }
}

/// A table entry as stored, not yet checked; offsets relative to their sections.
#[derive(Clone, Copy)]
struct Stored {
    name_offset: u64,
    name_len: u64,
    load_len: u64,
    record_offset: u64,
    inputs_len: u64,
    graph: u32,
}

impl Stored {
    fn parse(bytes: &[u8]) -> Stored {
        let u32_at =
            |at: usize| u64::from(u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()));
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
        Stored {
            name_offset: u64_at(0),
            name_len: u32_at(8),
            load_len: u32_at(12),
            record_offset: u64_at(16),
            inputs_len: u32_at(24),
            graph: u32_at(28) as u32,
        }
    }

    /// Where its records end, when they do not overflow.
    fn records_end(&self) -> Option<u64> {
        self.record_offset
            .checked_add(self.load_len + self.inputs_len)
    }

    fn name_end(&self) -> Option<u64> {
        self.name_offset.checked_add(self.name_len)
    }

    fn entry(&self, layout: &Layout) -> Entry {
        let load = layout.records_offset + self.record_offset;
        Entry {
            name: self.name_offset as usize..(self.name_offset + self.name_len) as usize,
            load: (load, self.load_len as u32),
            inputs: (load + self.load_len, self.inputs_len as u32),
            graph: self.graph,
        }
    }
}

/// A graph entry as stored: offset relative to the records section, length, reserved field.
fn parse_graph(bytes: &[u8]) -> (u64, u64, u32) {
    let offset = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    let length = u64::from(u32::from_le_bytes(bytes[8..12].try_into().unwrap()));
    let reserved = u32::from_le_bytes(bytes[12..16].try_into().unwrap());
    (offset, length, reserved)
}

fn entry_refused(path: &Path, position: u64, reason: &str) -> BundleError {
    refused(
        path,
        "table entry",
        &position.to_string(),
        &format!("{reason}: the table is refused"),
    )
}

fn graph_refused(path: &Path, position: u64, reason: &str) -> BundleError {
    refused(
        path,
        "graph entry",
        &position.to_string(),
        &format!("{reason}: the graph table is refused"),
    )
}

/// Refuses `name` (of table entry `position`) unless it is a kernel name.
fn check_name(path: &Path, position: u64, name: &[u8]) -> Result<(), BundleError> {
    // The common case checked on bytes, with no allocation; a name it does not pass gets
    // `KernelName::parse`'s error.
    if is_short_identifier(name) {
        return Ok(());
    }
    let text = std::str::from_utf8(name).unwrap_or("(not UTF-8)");
    KernelName::parse(text).map_err(|source| BundleError::Refused {
        path: path.to_owned(),
        source: source.of(format!("the name of table entry {position}")),
    })?;
    Ok(())
}

fn out_of_order(path: &Path, position: u64, name: &[u8], previous: &[u8]) -> BundleError {
    refused(
        path,
        "the name table",
        std::str::from_utf8(name).unwrap_or("(not UTF-8)"),
        &format!(
            "is out of order at entry {position}: names must be sorted and unique (`{}` comes \
             before it)",
            String::from_utf8_lossy(previous)
        ),
    )
}

fn not_next_records(
    path: &Path,
    position: u64,
    stored: &Stored,
    expected: u64,
    records_len: u64,
) -> BundleError {
    entry_refused(
        path,
        position,
        &format!(
            "has records of {} bytes at {}, not the next ones, at {expected}, inside the \
             records section ({records_len} bytes)",
            stored.load_len + stored.inputs_len,
            stored.record_offset
        ),
    )
}

fn not_next_name(
    path: &Path,
    position: u64,
    stored: &Stored,
    expected: u64,
    names_len: u64,
) -> BundleError {
    entry_refused(
        path,
        position,
        &format!(
            "names {} bytes at {}, not the next name, at {expected}, inside the names section \
             ({names_len} bytes)",
            stored.name_len, stored.name_offset
        ),
    )
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
    let layout = Layout {
        count: (table.len() as u64) / ENTRY_LEN,
        graph_count: (graph_table.len() as u64) / GRAPH_ENTRY_LEN,
        table_offset: 0,
        graph_table_offset: 0,
        names_offset: records_offset - names.len() as u64,
        records_offset,
        length,
    };
    let records_len = layout.records_len();
    let graph_count = layout.graph_count as usize;
    let mut named = vec![false; graph_count];
    let mut entries = Vec::with_capacity(table.len() / ENTRY_LEN as usize);
    let (mut name_end, mut record_end) = (0u64, 0u64);
    let mut previous: Option<&[u8]> = None;
    for (position, bytes) in table.chunks_exact(ENTRY_LEN as usize).enumerate() {
        let position = position as u64;
        let stored = Stored::parse(bytes);
        if stored.graph as usize >= graph_count {
            return Err(entry_refused(
                path,
                position,
                &format!(
                    "names graph {}, not one of the {graph_count} graphs",
                    stored.graph
                ),
            ));
        }
        named[stored.graph as usize] = true;
        if stored.name_offset != name_end || stored.name_len > names.len() as u64 - name_end {
            return Err(not_next_name(
                path,
                position,
                &stored,
                name_end,
                names.len() as u64,
            ));
        }
        let total = stored.load_len + stored.inputs_len;
        if stored.record_offset != record_end || total > records_len - record_end {
            return Err(not_next_records(
                path,
                position,
                &stored,
                record_end,
                records_len,
            ));
        }
        let name = &names[name_end as usize..(name_end + stored.name_len) as usize];
        check_name(path, position, name)?;
        if let Some(previous) = previous.filter(|previous| *previous >= name) {
            return Err(out_of_order(path, position, name, previous));
        }
        previous = Some(name);
        entries.push(stored.entry(&layout));
        name_end += stored.name_len;
        record_end += total;
    }
    let mut graphs = Vec::with_capacity(graph_count);
    for (position, bytes) in graph_table
        .chunks_exact(GRAPH_ENTRY_LEN as usize)
        .enumerate()
    {
        let (offset, graph_len, reserved) = parse_graph(bytes);
        if offset != record_end || graph_len > records_len - record_end || reserved != 0 {
            return Err(graph_refused(
                path,
                position as u64,
                &format!(
                    "has a record of {graph_len} bytes at {offset}, not the next one, at \
                     {record_end}, inside the records section ({records_len} bytes), or a \
                     reserved field that is not 0"
                ),
            ));
        }
        if !named[position] {
            return Err(graph_refused(
                path,
                position as u64,
                "is named by no kernel",
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

/// Reads `buffer.len()` bytes at an absolute offset of the file.
pub(super) type ReadAt<'a> = dyn Fn(u64, &mut [u8]) -> Result<(), BundleError> + 'a;

/// The table as one lookup reads it: entry by entry, each checked when it is read.
pub(super) struct LazyTable<'a> {
    pub path: &'a Path,
    pub layout: Layout,
    pub read: &'a ReadAt<'a>,
}

impl LazyTable<'_> {
    /// Entries `first..first + count`, as stored.
    fn stored(&self, first: u64, count: u64) -> Result<Vec<Stored>, BundleError> {
        let mut bytes = vec![0u8; (count * ENTRY_LEN) as usize];
        (self.read)(self.layout.table_offset + first * ENTRY_LEN, &mut bytes)?;
        Ok(bytes
            .chunks_exact(ENTRY_LEN as usize)
            .map(Stored::parse)
            .collect())
    }

    /// The name of entry `position`, checked: inside the names section, a kernel name.
    fn name(&self, position: u64, stored: &Stored) -> Result<Vec<u8>, BundleError> {
        let names_len = self.layout.names_len();
        if stored.name_len > MAX_NAME_LEN as u64
            || stored.name_end().is_none_or(|end| end > names_len)
        {
            return Err(entry_refused(
                self.path,
                position,
                &format!(
                    "names {} bytes at {}, not a name inside the names section ({names_len} \
                     bytes)",
                    stored.name_len, stored.name_offset
                ),
            ));
        }
        let mut name = vec![0u8; stored.name_len as usize];
        (self.read)(self.layout.names_offset + stored.name_offset, &mut name)?;
        check_name(self.path, position, &name)?;
        Ok(name)
    }

    /// The entry of `kernel`, checked with its neighbours, or `None` when the table has no
    /// such name: a binary search that reads one entry and one name per step.
    pub fn find(&self, kernel: &str) -> Result<Option<Entry>, BundleError> {
        if !is_short_identifier(kernel.as_bytes()) {
            return Ok(None);
        }
        let (mut low, mut high) = (0, self.layout.count);
        while low < high {
            let middle = low + (high - low) / 2;
            let stored = self.stored(middle, 1)?[0];
            let name = self.name(middle, &stored)?;
            match name.as_slice().cmp(kernel.as_bytes()) {
                std::cmp::Ordering::Less => low = middle + 1,
                std::cmp::Ordering::Greater => high = middle,
                std::cmp::Ordering::Equal => return self.found(middle, stored, &name).map(Some),
            }
        }
        Ok(None)
    }

    /// Checks the entry at `position` against the entries around it and the sections' ends.
    fn found(&self, position: u64, stored: Stored, name: &[u8]) -> Result<Entry, BundleError> {
        let Layout {
            count, graph_count, ..
        } = self.layout;
        let (names_len, records_len) = (self.layout.names_len(), self.layout.records_len());
        if u64::from(stored.graph) >= graph_count {
            return Err(entry_refused(
                self.path,
                position,
                &format!(
                    "names graph {}, not one of the {graph_count} graphs",
                    stored.graph
                ),
            ));
        }
        let first = position.saturating_sub(1);
        let last = (position + 1).min(count - 1);
        let around = self.stored(first, last - first + 1)?;
        // Where this entry's name and records must start: where the previous entry's end.
        let (name_start, record_start) = if position == 0 {
            (0, 0)
        } else {
            let previous = around[0];
            let previous_name = self.name(position - 1, &previous)?;
            if previous_name.as_slice() >= name {
                return Err(out_of_order(self.path, position, name, &previous_name));
            }
            let ends = previous.name_end().zip(previous.records_end());
            ends.ok_or_else(|| {
                not_next_records(self.path, position - 1, &previous, 0, records_len)
            })?
        };
        if stored.name_offset != name_start {
            return Err(not_next_name(
                self.path, position, &stored, name_start, names_len,
            ));
        }
        let record_end = stored.records_end().filter(|end| *end <= records_len);
        let Some(record_end) = record_end.filter(|_| stored.record_offset == record_start) else {
            return Err(not_next_records(
                self.path,
                position,
                &stored,
                record_start,
                records_len,
            ));
        };
        let name_end = stored.name_offset + stored.name_len;
        if position + 1 < count {
            let next = *around.last().expect("the next entry was read");
            if next.name_offset != name_end {
                return Err(not_next_name(
                    self.path,
                    position + 1,
                    &next,
                    name_end,
                    names_len,
                ));
            }
            if next.record_offset != record_end {
                return Err(not_next_records(
                    self.path,
                    position + 1,
                    &next,
                    record_end,
                    records_len,
                ));
            }
            let next_name = self.name(position + 1, &next)?;
            if next_name.as_slice() <= name {
                return Err(out_of_order(self.path, position + 1, &next_name, name));
            }
        } else {
            // The last kernel: its name ends the names section, its records meet the first
            // graph's (a table with a kernel has a graph: its id was checked above).
            let (graph_start, _, _) = self.graph_stored(0)?;
            if name_end != names_len || record_end != graph_start {
                return Err(refused(
                    self.path,
                    "the loader index's sections",
                    &format!("{name_end} + {record_end} bytes"),
                    &format!(
                        "are not what the table spans: the names section holds {names_len} \
                         bytes and the kernels' records end where the graphs' start, at \
                         {graph_start}"
                    ),
                ));
            }
        }
        Ok(stored.entry(&self.layout))
    }

    fn graph_stored(&self, id: u64) -> Result<(u64, u64, u32), BundleError> {
        let mut bytes = [0u8; GRAPH_ENTRY_LEN as usize];
        (self.read)(
            self.layout.graph_table_offset + id * GRAPH_ENTRY_LEN,
            &mut bytes,
        )?;
        Ok(parse_graph(&bytes))
    }

    /// The absolute span of graph `id`, checked against the graphs around it: it starts where
    /// the previous graph (or the last kernel's records) ends and ends where the next graph
    /// starts (or the file ends).
    pub fn graph(&self, id: u32) -> Result<Span, BundleError> {
        let id = u64::from(id);
        let records_len = self.layout.records_len();
        let (offset, length, reserved) = self.graph_stored(id)?;
        let start = if id == 0 {
            let last = self.stored(self.layout.count - 1, 1)?[0];
            last.records_end()
        } else {
            let (previous, previous_len, _) = self.graph_stored(id - 1)?;
            previous.checked_add(previous_len)
        };
        let end = if id + 1 < self.layout.graph_count {
            self.graph_stored(id + 1)?.0
        } else {
            records_len
        };
        if Some(offset) != start
            || offset.checked_add(length) != Some(end)
            || end > records_len
            || reserved != 0
        {
            return Err(graph_refused(
                self.path,
                id,
                &format!(
                    "has a record of {length} bytes at {offset}, not the next one, at {}, \
                     ending where the next starts ({end}), inside the records section \
                     ({records_len} bytes), or a reserved field that is not 0",
                    start.map_or("(past the end)".to_owned(), |start| start.to_string())
                ),
            ));
        }
        Ok((self.layout.records_offset + offset, length as u32))
    }
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
