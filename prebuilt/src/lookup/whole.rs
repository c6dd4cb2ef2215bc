//! The whole index read back from one `kernels.idx` ([`Lookup::index`]): what tools read
//! when a bundle ships no `index.json`, every byte it decodes charged to [`MAX_DECODED`].

use std::collections::BTreeMap;

use super::codec::{self, Decoded};
use super::data::Data;
use super::table::Span;
use super::{check_index, refused, Lookup, ENTRY_LEN, GRAPH_ENTRY_LEN, MAX_DECODED};
use crate::bundle::BundleError;
use crate::index::{Index, KernelRecord};

impl Lookup {
    /// The whole index this file was written from, as [`encode`] was given it, checked as
    /// `index.json` is: what tools read when a bundle ships no `index.json`. Reads the file
    /// once and decodes each graph once; what it all takes in memory is charged to
    /// [`MAX_DECODED`] as it is decoded, each kernel's copy of its graph before any is made.
    pub fn index(&self) -> Result<Index, BundleError> {
        // One read of the whole file (none for bytes already read), whose own tables are
        // checked and decoded: a file changed in place since a lookup read it cannot make
        // this read records at spans checked on other bytes.
        let read;
        let bytes: &[u8] = match &self.data {
            Data::Bytes(bytes) => bytes,
            // Capped at open: the length fits the span's `u32`.
            Data::File(..) => {
                read = self.bytes((0, self.layout.length as u32))?;
                &read
            }
        };
        let layout = &self.layout;
        let section = |offset: u64, length: u64| &bytes[offset as usize..][..length as usize];
        let tables = self.checked_tables(
            section(layout.table_offset, layout.count * ENTRY_LEN),
            section(
                layout.graph_table_offset,
                layout.graph_count * GRAPH_ENTRY_LEN,
            ),
            section(
                layout.names_offset,
                layout.records_offset - layout.names_offset,
            )
            .to_vec(),
        )?;
        let tables = &tables;
        let span = |(offset, length): Span| section(offset, u64::from(length));
        let decoded = Decoded::new(MAX_DECODED, "a whole index");
        // How many kernels name each graph (the table check made every graph named), and
        // the first of them, which a graph's refusal names.
        let mut users = vec![(0u64, None); tables.graphs.len()];
        for (position, entry) in tables.entries.iter().enumerate() {
            let (count, first) = &mut users[entry.graph as usize];
            *count += 1;
            first.get_or_insert(position);
        }
        let mut graphs = Vec::with_capacity(tables.graphs.len());
        let mut copies = 0u64;
        for (id, &graph) in tables.graphs.iter().enumerate() {
            let (count, first) = users[id];
            let name = first.map_or("", |position| {
                &tables.names[tables.entries[position].name.clone()]
            });
            let before = decoded.used();
            let files = codec::decode_graph(span(graph), &self.words, &decoded)
                .map_err(|reason| self.bad_record(name, "graph", reason))?;
            // Every kernel but the last that names it holds a copy.
            let each = decoded.used() - before;
            copies = copies.saturating_add(each.saturating_mul(count.saturating_sub(1)));
            graphs.push((files, count));
        }
        decoded.charge(copies).map_err(|_| {
            refused(
                &self.path,
                "the loader index's include graphs, copied once per kernel that names them",
                &format!("{} bytes", decoded.used().saturating_add(copies)),
                &format!("decode past the {MAX_DECODED}-byte cap on a whole index in memory"),
            )
        })?;
        let mut kernels = BTreeMap::new();
        for entry in &tables.entries {
            let name = &tables.names[entry.name.clone()];
            // Its name and record in the map's node, which is at least half full.
            let held =
                name.len() as u64 + codec::HELD + 2 * std::mem::size_of::<KernelRecord>() as u64;
            decoded
                .charge(held)
                .map_err(|reason| self.bad_record(name, "load", reason))?;
            let (files, left) = &mut graphs[entry.graph as usize];
            *left -= 1;
            // The last kernel naming a graph takes it; the others copy it (charged above).
            let files = if *left == 0 {
                std::mem::take(files)
            } else {
                files.clone()
            };
            let inputs = Some((span(entry.inputs), files));
            let record = self.decode(name, span(entry.load), inputs, &decoded)?;
            kernels.insert(name.to_owned(), record);
        }
        let index = Index {
            format: self.meta.format,
            package: self.meta.package.clone(),
            torch: self.meta.torch.clone(),
            store: self.meta.store.clone(),
            dictionary: self.meta.dictionary.clone(),
            kernels,
            modules: self.meta.modules.clone(),
        };
        check_index(&index).map_err(|source| self.refused_by(source))?;
        Ok(index)
    }
}
