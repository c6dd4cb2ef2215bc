//! The loader's index, `kernels.idx`: what a first call reads to find one kernel, in time that
//! does not grow with the number of kernels in the bundle, and the whole index for tools, in
//! bytes that grow with what the kernels hold, not with how often they repeat it.
//!
//! `index.json` is the whole bundle as the build sees it: every kernel's key inputs (for a
//! CUTLASS kernel, hundreds of headers with their digests), variants and skips, each kernel's
//! written out in full. `kernels.idx` holds the same index, losslessly, split so the loader
//! reads one kernel's load record, and packed (see [`codec`] for the records):
//!
//! ```text
//! offset  size  field
//!      0     8  magic  "KWHEELIX"
//!      8     4  format (LOOKUP_FORMAT with skips, else OLDEST_LOOKUP_FORMAT; little-endian
//!                      like every number here)
//!     12     4  kernel count N
//!     16     8  meta offset    ─┐ JSON: package, torch, store, dictionary, index format,
//!     24     8  meta length    ─┘       CUDA builds; right after it, the records' vocabulary
//!     32     8  table offset         N entries of 32 bytes, sorted by kernel name (bytes)
//!     40     8  graph table offset   G entries of 16 bytes, one per distinct include graph
//!     48     8  names offset         the names, concatenated
//!     56     8  records offset       per kernel: its load record, then its inputs record;
//!                                    then every graph record
//!     64     8  file length          a cut or padded file is refused
//!     72     4  graph count G
//!     76     4  vocabulary length (its bytes, between the meta and the table)
//! table entry: name offset u64, name length u32, load length u32,
//!              record offset u64, inputs length u32, graph id u32
//! graph entry: record offset u64, length u32, reserved u32 (0)
//! ```
//!
//! A kernel's *load record* is what loading needs: `recipe` (whether the JIT can compile it),
//! `constants`, `variants`, `skipped`. Its *inputs record* is its key inputs but the include
//! graph (`entries`, `defines`, flags); the graph (`files`: every header with its digest) is a
//! graph record that every kernel with the same graph names by id, so thousands of kernels
//! built from one header tree store it once. Only the JIT, `dev explain` and tools read inputs.
//!
//! Opening reads the header and the meta only, whatever the number of kernels (a file of at
//! most 16 KiB is read whole instead, in one call, and its lookups read nothing more). The table's
//! rules are that the names are identifiers in strictly increasing order, every span lies end
//! to end in table order (kernels' records, then graphs'), every graph id names a graph and
//! every graph is named: no two kernels share record bytes, and work stays bounded by the
//! file's size, whatever it claims. What reads every entry (listing, the whole index) checks
//! all of that first, in one pass; finding one kernel is a binary search over the file that
//! checks what it reads, the entries it visits and the entries on either side of the one it
//! finds ([`table`]), then one positioned read of its record. Every record is checked as
//! `index.json`'s is ([`crate::untrusted`]) before it is used.
//!
//! The file is written from the bundle's index by one function ([`encode`]) and read back
//! whole by [`Lookup::index`], which gives that index again, so tools need no `index.json`
//! beside it. What that read decodes (each kernel's own copy of a shared graph included) is
//! charged to [`MAX_DECODED`] as it is made, and one kernel's records to
//! [`MAX_RECORD_DECODED`]: a small file cannot cost much memory by naming what it shares. It
//! is deterministic (sorted names, sorted vocabulary, no times). A reader refuses a format it
//! does not know, naming the file, the format found and the one it reads.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use crate::bundle::BundleError;
use crate::index::{Index, KernelInputs, KernelRecord, StoredFile};
use crate::target::CudaBuild;
use crate::untrusted::{
    check_index, check_kernel, check_stored, open_regular_file, Untrusted, MAX_DICTIONARY_SIZE,
    MAX_INDEX_SIZE,
};

mod catalog;
mod codec;
mod data;
mod folder;
mod table;
mod whole;
pub use catalog::Catalog;
use codec::Decoded;
use data::Data;
pub use folder::{
    bundle_at, find_bundle, holds_bundle, open_bundle, read_bundle_index, restore_index_json,
};
use table::{check_table, Layout, LazyTable, Sections, Span};

/// File name of the loader's index inside a bundle.
pub const LOOKUP_FILE: &str = "kernels.idx";
/// The newest format this reader reads and this writer writes. Bump it when the layout
/// changes. A file of this format differs from one of [`OLDEST_LOOKUP_FORMAT`] only in its
/// skips, which name their kind ([`crate::index::SkipKind`]): a file without skips is written
/// in the older format, byte for byte what it was, and a file with skips is refused by older
/// readers by its format. Format 1 held each kernel's records as JSON, key inputs included, once per kernel; format 2
/// wrote each skipped target's reason out, each kernel's entries in its inputs record again,
/// and every function name whole; format 3 kept the vocabulary in the JSON meta (an open
/// parsed every family's digest) and wrote each include graph file's folder out; format 4
/// wrote the first entry of each of a kernel's function sets out in full, most often a copy
/// of the kernel's own name; format 5 had no requirements in the inputs record; format 6 had
/// no computed constants (in function sets and inputs) and no struct layouts (in variants);
/// format 7 (still written for a file without skips) had no kind in its skips, which its
/// reasons' first words give ([`crate::index::SkipKind`]).
pub const LOOKUP_FORMAT: u32 = 8;
/// The oldest format this reader reads: the format of a file without skips.
pub const OLDEST_LOOKUP_FORMAT: u32 = 7;

const MAGIC: &[u8; 8] = b"KWHEELIX";
const HEADER_LEN: u64 = 80;
const ENTRY_LEN: u64 = 32;
const GRAPH_ENTRY_LEN: u64 = 16;
/// Caps on what a header may claim, so a crafted file cannot make the reader allocate.
const MAX_META_LEN: u64 = 16 << 20;
const MAX_KERNELS: u64 = 1 << 24;
/// Most bytes the whole index may take in memory once [`Lookup::index`] decoded it: every
/// record, every distinct include graph and each kernel's own copy of its graph (an
/// [`Index`] holds one per kernel), each string, vector and map entry counted with what it
/// holds besides its bytes ([`codec::HELD`]). Charged as they are decoded, and the copies
/// before any is made, so a file whose graphs many kernels name is refused after decoding
/// each graph once, and a crafted file costs at most this (and itself) in memory. An index
/// of FlashInfer's size (15,970 kernels, one graph each) counts about 47 MB; 2,000 kernels
/// that each copy one 300-header graph, about 154 MB (`docs/security.md`, Caps).
pub const MAX_DECODED: u64 = 160 << 20;
/// Most bytes one kernel's records (load, inputs and its graph) may decode to in a lookup:
/// far above any real kernel's (the embedded library's largest is a few KiB), and a bound on
/// what a first call can be made to allocate.
pub const MAX_RECORD_DECODED: u64 = 64 << 20;

/// Everything of the index but its kernels.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Meta {
    /// The `format` of the index this was written from (`index.json`'s).
    pub format: u32,
    /// The kernel library's Python package name.
    pub package: String,
    /// The torch pin of the build.
    pub torch: String,
    /// The store a slim wheel's artifacts can be fetched from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<String>,
    /// The zstd dictionary, if one was trained.
    pub dictionary: Option<StoredFile>,
    /// Every CUDA build a variant or skip names, in order: the runtime's default build is the
    /// newest of them the driver supports.
    pub builds: Vec<CudaBuild>,
    /// The extension modules ([`Index::modules`]): few and small, read whole at open, since
    /// the package's import loads them. Absent when there is none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub modules: BTreeMap<String, crate::index::ModuleRecord>,
}

impl Meta {
    /// The meta of a whole index.
    pub fn of(index: &Index) -> Meta {
        let builds: BTreeSet<CudaBuild> = index
            .kernels
            .values()
            .flat_map(|record| {
                let variants = record.variants.iter().map(|variant| variant.cuda);
                variants.chain(record.skipped.iter().map(|skip| skip.cuda))
            })
            .collect();
        Meta {
            format: index.format,
            package: index.package.clone(),
            torch: index.torch.clone(),
            store: index.store.clone(),
            dictionary: index.dictionary.clone(),
            builds: builds.into_iter().collect(),
            modules: index.modules.clone(),
        }
    }
}

/// Writes the loader's index for `index`.
pub fn encode(index: &Index) -> Vec<u8> {
    let words = codec::Vocabulary::of(index.kernels.values());
    let meta = serde_json::to_vec(&Meta::of(index)).expect("meta serializes");
    let mut file = Writing::default();
    // Graphs by first use, in name order: the same index gives the same ids.
    let mut graph_ids: BTreeMap<&BTreeMap<String, String>, u32> = BTreeMap::new();
    let mut graphs: Vec<&BTreeMap<String, String>> = Vec::new();
    // `index.kernels` is a BTreeMap: its order is the byte order the reader searches in.
    for (name, record) in &index.kernels {
        let graph = *graph_ids.entry(&record.inputs.files).or_insert_with(|| {
            graphs.push(&record.inputs.files);
            graphs.len() as u32 - 1
        });
        let load = codec::encode_load(name, record, &words);
        file.kernel(name, &load, &codec::encode_inputs(record), graph);
    }
    for graph in graphs {
        file.graph(&codec::encode_graph(graph, &words));
    }
    let skips = index
        .kernels
        .values()
        .any(|record| !record.skipped.is_empty());
    let format = if skips {
        LOOKUP_FORMAT
    } else {
        OLDEST_LOOKUP_FORMAT
    };
    file.assemble(format, &meta, &words.encode())
}

/// The tables and sections of a file being written, a kernel and then a graph at a time.
#[derive(Default)]
struct Writing {
    table: Vec<u8>,
    graph_table: Vec<u8>,
    names: Vec<u8>,
    records: Vec<u8>,
}

impl Writing {
    /// The next kernel (in name order): its table entry, name and records.
    fn kernel(&mut self, name: &str, load: &[u8], inputs: &[u8], graph: u32) {
        let table = &mut self.table;
        table.extend_from_slice(&(self.names.len() as u64).to_le_bytes());
        table.extend_from_slice(&(name.len() as u32).to_le_bytes());
        table.extend_from_slice(&(load.len() as u32).to_le_bytes());
        table.extend_from_slice(&(self.records.len() as u64).to_le_bytes());
        table.extend_from_slice(&(inputs.len() as u32).to_le_bytes());
        table.extend_from_slice(&graph.to_le_bytes());
        self.names.extend_from_slice(name.as_bytes());
        self.records.extend_from_slice(load);
        self.records.extend_from_slice(inputs);
    }

    /// The next graph record (after every kernel), by id order.
    fn graph(&mut self, bytes: &[u8]) {
        let table = &mut self.graph_table;
        table.extend_from_slice(&(self.records.len() as u64).to_le_bytes());
        table.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        table.extend_from_slice(&0u32.to_le_bytes());
        self.records.extend_from_slice(bytes);
    }

    fn assemble(self, format: u32, meta: &[u8], words: &[u8]) -> Vec<u8> {
        assemble(
            format,
            meta,
            words,
            &self.table,
            &self.graph_table,
            &self.names,
            &self.records,
        )
    }
}

/// The file of these sections, with a header that locates them and counts the tables' entries.
fn assemble(
    format: u32,
    meta: &[u8],
    words: &[u8],
    table: &[u8],
    graph_table: &[u8],
    names: &[u8],
    records: &[u8],
) -> Vec<u8> {
    let count = table.len() as u64 / ENTRY_LEN;
    let graph_count = (graph_table.len() as u64 / GRAPH_ENTRY_LEN) as u32;
    let meta_offset = HEADER_LEN;
    let table_offset = meta_offset + (meta.len() + words.len()) as u64;
    let graph_table_offset = table_offset + table.len() as u64;
    let names_offset = graph_table_offset + graph_table.len() as u64;
    let records_offset = names_offset + names.len() as u64;
    let length = records_offset + records.len() as u64;
    let mut out = Vec::with_capacity(length as usize);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&format.to_le_bytes());
    out.extend_from_slice(&(count as u32).to_le_bytes());
    for field in [
        meta_offset,
        meta.len() as u64,
        table_offset,
        graph_table_offset,
        names_offset,
        records_offset,
        length,
    ] {
        out.extend_from_slice(&field.to_le_bytes());
    }
    out.extend_from_slice(&graph_count.to_le_bytes());
    out.extend_from_slice(&(words.len() as u32).to_le_bytes());
    for section in [meta, words, table, graph_table, names, records] {
        out.extend_from_slice(section);
    }
    out
}

/// An open `kernels.idx`: its header and meta read and checked; tables and records read on
/// demand, each checked when it is read (see [`table`]).
#[derive(Debug)]
pub struct Lookup {
    path: PathBuf,
    data: Data,
    layout: Layout,
    meta: Meta,
    words: codec::Words,
    /// Whether the skips of its load records name their kind (a file of [`LOOKUP_FORMAT`]).
    skip_kinds: bool,
    /// The whole table, read and checked once something needs every entry.
    whole: OnceLock<Tables>,
}

/// Both tables and the names, read whole and checked together ([`table::check_table`]).
#[derive(Debug)]
struct Tables {
    /// The names section: identifiers, concatenated in strictly increasing order.
    names: String,
    /// One per kernel, in table order.
    entries: Vec<Entry>,
    /// Each graph record's absolute span.
    graphs: Vec<Span>,
}

/// One table entry, located and checked: its name's bytes in the names section, its records'
/// absolute spans in the file, its graph's id.
#[derive(Clone, Debug)]
struct Entry {
    name: std::ops::Range<usize>,
    load: Span,
    inputs: Span,
    graph: u32,
}

impl Lookup {
    /// Opens `path`, reading its header and meta (a few hundred bytes) and checking that the
    /// header's sections lie in order inside the file, whose size it must give. Nothing of
    /// the tables is read here: a lookup checks the entries it reads ([`Lookup::record`]),
    /// and what reads every entry ([`Lookup::names`], [`Lookup::index`], [`Lookup::check`])
    /// checks the whole table first.
    pub fn open(path: &Path) -> Result<Lookup, BundleError> {
        let read_error = |source| BundleError::Read {
            path: path.to_owned(),
            source,
        };
        let folder = match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        if let Some(name) = path.file_name().and_then(|name| name.to_str()) {
            if let Ok(relative) = crate::untrusted::ArtifactPath::parse(name) {
                // The checks below, in fewer system calls; errors name `path` as given.
                return match crate::bundle::open_inside(folder, &relative) {
                    Ok((_, file, size)) => {
                        Lookup::of(path, Data::of_file(file, size).map_err(read_error)?)
                    }
                    Err(BundleError::Read { source, .. }) => Err(read_error(source)),
                    Err(other) => Err(other),
                };
            }
        }
        let file = open_regular_file(path).map_err(read_error)?;
        let size = file.metadata().map_err(read_error)?.len();
        Lookup::of(path, Data::of_file(file, size).map_err(read_error)?)
    }

    /// Reads a `kernels.idx` already in memory (a wheel's entry); `path` names it in errors.
    pub fn from_bytes(path: &Path, bytes: Vec<u8>) -> Result<Lookup, BundleError> {
        Lookup::of(path, Data::Bytes(bytes))
    }

    fn of(path: &Path, data: Data) -> Result<Lookup, BundleError> {
        let read_error = |source| BundleError::Read {
            path: path.to_owned(),
            source,
        };
        let size = data.len();
        let mut header = [0u8; HEADER_LEN as usize];
        let short = || {
            refused(
                path,
                "the loader index",
                &size.to_string(),
                &format!("is shorter than its {HEADER_LEN}-byte header"),
            )
        };
        // The header in one read, as much of it as the file holds.
        let head = size.min(HEADER_LEN) as usize;
        data.read_at(&mut header[..head], 0).map_err(read_error)?;
        // Magic and format first: a file of another format is named as such, whatever its
        // header's length is.
        if head < 12 {
            return Err(short());
        }
        if &header[..8] != MAGIC {
            return Err(refused(
                path,
                "the loader index's magic",
                &format!("{:?}", String::from_utf8_lossy(&header[..8])),
                "is not KWHEELIX",
            ));
        }
        let format = u32::from_le_bytes(header[8..12].try_into().unwrap());
        if !(OLDEST_LOOKUP_FORMAT..=LOOKUP_FORMAT).contains(&format) {
            return Err(BundleError::UnsupportedLookup {
                path: path.to_owned(),
                found: format,
                oldest: OLDEST_LOOKUP_FORMAT,
                reads: LOOKUP_FORMAT,
            });
        }
        if head < HEADER_LEN as usize {
            return Err(short());
        }
        let u32_at = |at: usize| u32::from_le_bytes(header[at..at + 4].try_into().unwrap());
        let u64_at = |at: usize| u64::from_le_bytes(header[at..at + 8].try_into().unwrap());
        let count = u64::from(u32_at(12));
        let (meta_offset, meta_len) = (u64_at(16), u64_at(24));
        let (table_offset, graph_table_offset, names_offset, records_offset, length) =
            (u64_at(32), u64_at(40), u64_at(48), u64_at(56), u64_at(64));
        let graph_count = u64::from(u32_at(72));
        let bad =
            |what: &str, value: u64, reason: &str| refused(path, what, &value.to_string(), reason);
        if length != size || length > MAX_INDEX_SIZE {
            return Err(bad(
                "the loader index's recorded length",
                length,
                &format!("is not its size on disk ({size}) or is over the cap"),
            ));
        }
        if count > MAX_KERNELS || graph_count > count || (count > 0) != (graph_count > 0) {
            return Err(bad(
                "the kernel count",
                count,
                &format!(
                    "is over the cap, or under the graph count ({graph_count}), or a table \
                     of kernels names no graph"
                ),
            ));
        }
        let words_len = u64::from(u32_at(76));
        if meta_offset != HEADER_LEN
            || meta_len > MAX_META_LEN
            || words_len > MAX_META_LEN
            || table_offset != meta_offset + meta_len + words_len
            || graph_table_offset != table_offset + count * ENTRY_LEN
            || names_offset != graph_table_offset + graph_count * GRAPH_ENTRY_LEN
            || records_offset < names_offset
            || records_offset > length
        {
            return Err(bad(
                "the loader index's layout",
                length,
                "has sections out of order or out of the file",
            ));
        }
        // The layout checks above put the meta and the vocabulary inside the file, whose size
        // is capped: reading them (in one read) reserves no more than the file holds.
        let mut meta = vec![0u8; (meta_len + words_len) as usize];
        data.read_at(&mut meta, meta_offset).map_err(read_error)?;
        let words = codec::Words::read(meta.split_off(meta_len as usize)).map_err(|reason| {
            refused(
                path,
                "the loader index's vocabulary",
                &format!("{words_len} bytes"),
                &reason,
            )
        })?;
        let meta: Meta =
            serde_json::from_slice(&meta).map_err(|source| BundleError::InvalidIndex {
                path: path.to_owned(),
                source,
            })?;
        if let Some(dictionary) = &meta.dictionary {
            check_stored(dictionary, MAX_DICTIONARY_SIZE, "the dictionary").map_err(|source| {
                BundleError::Refused {
                    path: path.to_owned(),
                    source,
                }
            })?;
        }
        let layout = Layout {
            count,
            graph_count,
            table_offset,
            graph_table_offset,
            names_offset,
            records_offset,
            length,
        };
        Ok(Lookup {
            path: path.to_owned(),
            data,
            layout,
            meta,
            words,
            skip_kinds: format == LOOKUP_FORMAT,
            whole: OnceLock::new(),
        })
    }

    /// Package, torch pin, store and dictionary.
    pub fn meta(&self) -> &Meta {
        &self.meta
    }

    /// How many kernels the table lists.
    pub fn len(&self) -> usize {
        self.layout.count as usize
    }

    /// Whether the bundle has no kernel.
    pub fn is_empty(&self) -> bool {
        self.layout.count == 0
    }

    /// How many distinct include graphs the kernels' inputs name.
    pub fn graph_count(&self) -> usize {
        self.layout.graph_count as usize
    }

    /// Reads both tables and the names whole and checks them: the table is refused unless its
    /// names are identifiers in strictly increasing byte order, its spans and the graphs' lie
    /// end to end, in table order, filling their sections exactly, and its graph ids name
    /// every graph and nothing else. So no two kernels share record bytes, a binary search
    /// finds every name the table lists, and reading every record once reads the file once.
    /// Runs once; [`Lookup::names`] and [`Lookup::index`] run it first.
    pub fn check(&self) -> Result<(), BundleError> {
        self.tables().map(|_| ())
    }

    fn tables(&self) -> Result<&Tables, BundleError> {
        if let Some(tables) = self.whole.get() {
            return Ok(tables);
        }
        let layout = &self.layout;
        let table = self.bytes((layout.table_offset, (layout.count * ENTRY_LEN) as u32))?;
        let graph_table = self.bytes((
            layout.graph_table_offset,
            (layout.graph_count * GRAPH_ENTRY_LEN) as u32,
        ))?;
        let names = self.bytes((
            layout.names_offset,
            (layout.records_offset - layout.names_offset) as u32,
        ))?;
        let tables = self.checked_tables(&table, &graph_table, names)?;
        Ok(self.whole.get_or_init(|| tables))
    }

    /// The tables of these sections' bytes, checked whole ([`check_table`]).
    fn checked_tables(
        &self,
        table: &[u8],
        graph_table: &[u8],
        names: Vec<u8>,
    ) -> Result<Tables, BundleError> {
        let layout = &self.layout;
        let sections = Sections {
            names: &names,
            records_offset: layout.records_offset,
            length: layout.length,
        };
        let (entries, graphs) = check_table(&self.path, table, graph_table, &sections)?;
        // Every name was checked as an identifier, so the section is ASCII.
        let names = String::from_utf8(names).map_err(|_| {
            refused(
                &self.path,
                "the name table",
                "(not UTF-8)",
                "holds something not a name",
            )
        })?;
        Ok(Tables {
            names,
            entries,
            graphs,
        })
    }

    /// Every kernel name, in order: identifiers, the whole table checked.
    pub fn names(&self) -> Result<Vec<String>, BundleError> {
        let tables = self.tables()?;
        Ok(tables
            .entries
            .iter()
            .map(|entry| tables.names[entry.name.clone()].to_owned())
            .collect())
    }

    /// The record of `kernel` without its key inputs (`inputs` is empty), or `None` when the
    /// bundle has no such kernel. Reads its load record only, and of the table only what
    /// finding it touches.
    pub fn record(&self, kernel: &str) -> Result<Option<KernelRecord>, BundleError> {
        let Some(entry) = self.find(kernel)? else {
            return Ok(None);
        };
        let load = self.bytes(entry.load)?;
        let decoded = Decoded::new(MAX_RECORD_DECODED, "one kernel's records");
        let record = self.decode(kernel, &load, None, &decoded)?;
        Ok(Some(record))
    }

    /// The key inputs of `kernel` (for the JIT and `dev explain`), or `None` when the bundle
    /// has no such kernel.
    pub fn inputs(&self, kernel: &str) -> Result<Option<KernelInputs>, BundleError> {
        Ok(self.with_inputs(kernel, true)?.map(|record| record.inputs))
    }

    /// The record of `kernel` with its key inputs, their include graph only if `graph` (what
    /// a requirement check reads is in the inputs record alone), or `None` when there is none.
    pub fn with_inputs(
        &self,
        kernel: &str,
        graph: bool,
    ) -> Result<Option<KernelRecord>, BundleError> {
        let Some(entry) = self.find(kernel)? else {
            return Ok(None);
        };
        let decoded = Decoded::new(MAX_RECORD_DECODED, "one kernel's records");
        let mut files = BTreeMap::new();
        if graph {
            let graph = match self.whole.get() {
                Some(tables) => tables.graphs[entry.graph as usize],
                None => self.lazy(|table| table.graph(entry.graph))?,
            };
            let graph = self.bytes(graph)?;
            files = codec::decode_graph(&graph, &self.words, &decoded)
                .map_err(|reason| self.bad_record(kernel, "graph", reason))?;
        }
        // The recipe decides which input paths must stay under `sources/`: check them
        // together. The load and inputs records are adjacent: one read.
        let both = self.bytes((entry.load.0, entry.load.1 + entry.inputs.1))?;
        let (load, inputs) = both.split_at(entry.load.1 as usize);
        let record = self.decode(kernel, load, Some((inputs, files)), &decoded)?;
        Ok(Some(record))
    }

    /// Decodes one kernel's load record and, given them, its inputs record and its graph's
    /// files, checking the result; what it decodes is charged to `decoded`.
    fn decode(
        &self,
        kernel: &str,
        load: &[u8],
        inputs: Option<(&[u8], BTreeMap<String, String>)>,
        decoded: &Decoded,
    ) -> Result<KernelRecord, BundleError> {
        let load = codec::decode_load(kernel, load, &self.words, self.skip_kinds, decoded)
            .map_err(|reason| self.bad_record(kernel, "load", reason))?;
        let inputs = match inputs {
            None => KernelInputs::default(),
            Some((inputs, files)) => {
                let mut inputs = codec::decode_inputs(inputs, &load, decoded)
                    .map_err(|reason| self.bad_record(kernel, "inputs", reason))?;
                inputs.files = files;
                inputs
            }
        };
        let record = KernelRecord {
            inputs,
            recipe: load.recipe,
            constants: load.constants,
            variants: load.variants,
            skipped: load.skipped,
        };
        check_kernel(kernel, &record).map_err(|source| self.refused_by(source))?;
        Ok(record)
    }

    /// The entry of `kernel`: a binary search over the table in memory once it was checked
    /// whole, else over the file, checking what the search reads ([`table::LazyTable`]).
    fn find(&self, kernel: &str) -> Result<Option<Entry>, BundleError> {
        let Some(tables) = self.whole.get() else {
            return self.lazy(|table| table.find(kernel));
        };
        let found = tables
            .entries
            .binary_search_by(|entry| {
                tables.names.as_bytes()[entry.name.clone()].cmp(kernel.as_bytes())
            })
            .ok()
            .map(|position| tables.entries[position].clone());
        Ok(found)
    }

    fn lazy<T>(
        &self,
        body: impl FnOnce(&LazyTable<'_>) -> Result<T, BundleError>,
    ) -> Result<T, BundleError> {
        let read = |offset: u64, buffer: &mut [u8]| {
            self.data
                .read_at(buffer, offset)
                .map_err(|source| BundleError::Read {
                    path: self.path.clone(),
                    source,
                })
        };
        body(&LazyTable {
            path: &self.path,
            layout: self.layout,
            read: &read,
        })
    }

    /// `length` bytes at `offset`: a span checked to lie inside the file.
    fn bytes(&self, (offset, length): Span) -> Result<Vec<u8>, BundleError> {
        let mut bytes = vec![0u8; length as usize];
        self.data
            .read_at(&mut bytes, offset)
            .map_err(|source| BundleError::Read {
                path: self.path.clone(),
                source,
            })?;
        Ok(bytes)
    }

    fn bad_record(&self, kernel: &str, which: &str, reason: String) -> BundleError {
        refused(
            &self.path,
            &format!("the {which} record of kernel"),
            kernel,
            &reason,
        )
    }

    fn refused_by(&self, source: Untrusted) -> BundleError {
        BundleError::Refused {
            path: self.path.clone(),
            source,
        }
    }
}

fn refused(path: &Path, what: &str, value: &str, reason: &str) -> BundleError {
    BundleError::Refused {
        path: path.to_owned(),
        source: Untrusted {
            what: what.to_owned(),
            value: value.to_owned(),
            reason: reason.to_owned(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bundle::read_index;
    use crate::index::Variant;
    use crate::index::{
        CompilerRecord, Constant, Skip, SkipKind, SkipReason, SourceRecipe, INDEX_FORMAT,
    };

    /// An index of `count` kernels `k00000`…, each with one variant and a few inputs.
    fn index(count: usize) -> Index {
        let kernels = (0..count)
            .map(|n| {
                let name = format!("k{n:05}");
                let digest = crate::key::sha256_hex(name.as_bytes());
                let record = KernelRecord {
                    inputs: KernelInputs {
                        entries: vec![name.clone()],
                        files: BTreeMap::from([(format!("{name}.cu"), digest.clone())]),
                        ..KernelInputs::default()
                    },
                    recipe: Some(SourceRecipe {
                        source: format!("{name}.cu"),
                        include_dirs: vec![".".to_owned()],
                    }),
                    constants: BTreeMap::from([("BLOCK".to_owned(), Constant::Integer(n as i64))]),
                    variants: vec![Variant {
                        structs: Default::default(),
                        arch: "sm_90a".parse().unwrap(),
                        cuda: "cu130".parse().unwrap(),
                        torch: "2.13.*".to_owned(),
                        compiler: CompilerRecord {
                            kind: "nvrtc".to_owned(),
                            version: "13.0.88".to_owned(),
                        },
                        key: digest.clone(),
                        artifact: StoredFile {
                            path: crate::bundle::artifact_path(&digest),
                            digest,
                            size: 10,
                            stored_size: 8,
                            dictionary: None,
                        },
                        functions: Vec::new(),
                    }],
                    skipped: Vec::new(),
                };
                (name, record)
            })
            .collect();
        Index {
            format: INDEX_FORMAT,
            package: "many-kernels".to_owned(),
            torch: "2.13.*".to_owned(),
            store: None,
            dictionary: None,
            kernels,
            modules: Default::default(),
        }
    }

    fn written(index: &Index) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOOKUP_FILE);
        std::fs::write(&path, encode(index)).unwrap();
        (dir, path)
    }

    #[test]
    fn every_kernel_is_found_with_its_record_and_inputs_and_nothing_else_is() {
        let index = index(3001);
        let (_dir, path) = written(&index);
        let lookup = Lookup::open(&path).unwrap();
        assert_eq!(lookup.len(), 3001);
        assert_eq!(lookup.meta(), &Meta::of(&index));
        for (name, record) in &index.kernels {
            let found = lookup.record(name).unwrap().unwrap();
            assert_eq!(found.variants, record.variants, "{name}");
            assert_eq!(found.constants, record.constants, "{name}");
            assert_eq!(found.recipe, record.recipe, "{name}");
            assert_eq!(found.inputs, KernelInputs::default(), "{name}");
            assert_eq!(
                lookup.inputs(name).unwrap().unwrap(),
                record.inputs,
                "{name}"
            );
        }
        for absent in ["", "a", "k", "k0300", "k030000", "k99999", "zzz"] {
            assert!(lookup.record(absent).unwrap().is_none(), "{absent}");
        }
        assert_eq!(
            lookup.names().unwrap(),
            index.kernels.keys().cloned().collect::<Vec<_>>()
        );
    }

    /// A function set's first entry is written as a piece of its kernel's name where the two
    /// share 4 bytes or more (an entry is mostly named after its kernel): a few bytes where
    /// format 4 wrote the whole name. Every kind of name reads back the same, and a record
    /// that takes more of the kernel's name than there is is refused.
    #[test]
    fn entries_named_after_their_kernel_cost_a_few_bytes_and_read_back_whole() {
        let long = "Bfloat16_E2m1E2m1_Fp32_Ab16_Bb16_t128x128x128_s3_et128x128_m128x128x64";
        let cases: Vec<(String, Vec<String>)> = vec![
            // FlashInfer's shape: the kernel's name has a prefix, the entry another case.
            (
                format!("k00000_Gemm_{long}"),
                vec![format!("gemm_{long}"), format!("gemm_{long}GetSmemSize")],
            ),
            (
                "layernorm_bf16".to_owned(),
                vec!["layernorm_bf16".to_owned()],
            ),
            ("swiglu".to_owned(), vec!["_Z6swigluPfS_i".to_owned()]),
            // Nothing shared (under 4 bytes), names that are not ASCII.
            (
                "k2".to_owned(),
                vec!["main".to_owned(), "é_k2_ü".to_owned()],
            ),
            (
                "matmul_kernel".to_owned(),
                vec!["ümatmul_kernelü".to_owned()],
            ),
            ("k3".to_owned(), vec!["ñandú_k3_ñ".to_owned()]),
        ];
        let mut bundle = index(0);
        for (kernel, names) in &cases {
            let mut record = index(1).kernels.remove("k00000").unwrap();
            record.variants[0].functions = names
                .iter()
                .map(|name| crate::index::Function {
                    computed: Default::default(),
                    name: name.clone(),
                    symbol: name.clone(),
                    param_sizes: vec![8, 960],
                })
                .collect();
            bundle.kernels.insert(kernel.clone(), record);
        }
        let (_dir, path) = written(&bundle);
        let lookup = Lookup::open(&path).unwrap();
        for (kernel, record) in &bundle.kernels {
            let found = lookup.record(kernel).unwrap().unwrap();
            assert_eq!(found.variants, record.variants, "{kernel}");
        }
        let words = codec::Vocabulary::of(bundle.kernels.values());
        let words_read = codec::Words::read(words.encode()).unwrap();
        let (kernel, record) = bundle.kernels.iter().next().unwrap();
        assert!(kernel.starts_with("k00000_Gemm_"));
        let load = codec::encode_load(kernel, record, &words);
        // The 75-byte first name in 5 bytes (the head `g`, an offset, a length, an empty
        // tail) where a kernel named otherwise has it written out in 79 (its length, itself,
        // and three bytes saying it takes nothing of the kernel's name).
        let first = record.variants[0].functions[0].name.len();
        assert_eq!(first, 75);
        let apart = codec::encode_load("unrelated", record, &words);
        assert_eq!(
            apart.len() - load.len(),
            79 - 5,
            "{} vs {}",
            apart.len(),
            load.len()
        );
        let decoded = Decoded::new(MAX_RECORD_DECODED, "one kernel's records");
        assert!(codec::decode_load(kernel, &load, &words_read, true, &decoded).is_ok());
        let error = codec::decode_load("k00000_Gemm", &load, &words_read, true, &decoded)
            .err()
            .unwrap();
        assert!(
            error.contains("of the kernel's name of 11 bytes"),
            "{error}"
        );
    }

    #[test]
    fn the_encoding_is_deterministic_and_an_empty_bundle_works() {
        assert_eq!(encode(&index(50)), encode(&index(50)));
        let (_dir, path) = written(&index(0));
        let lookup = Lookup::open(&path).unwrap();
        assert!(lookup.is_empty());
        assert!(lookup.record("anything").unwrap().is_none());
    }

    #[test]
    fn another_format_is_refused_naming_the_format_this_reads() {
        let mut bytes = encode(&index(3));
        bytes[8..12].copy_from_slice(&(LOOKUP_FORMAT + 1).to_le_bytes());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOOKUP_FILE);
        std::fs::write(&path, bytes).unwrap();
        let message = Lookup::open(&path).unwrap_err().to_string();
        assert!(
            message.contains(&format!("format {}", LOOKUP_FORMAT + 1)),
            "{message}"
        );
        assert!(
            message.contains(&format!(
                "reads formats {OLDEST_LOOKUP_FORMAT} to {LOOKUP_FORMAT}"
            )),
            "{message}"
        );
    }

    #[test]
    fn cut_padded_or_crafted_files_are_refused_never_read_past() {
        let good = encode(&index(40));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOOKUP_FILE);
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("cut", good[..good.len() - 1].to_vec()),
            ("padded", [good.clone(), vec![0]].concat()),
            ("header only", good[..30].to_vec()),
            ("magic", [b"NOTMAGIC".to_vec(), good[8..].to_vec()].concat()),
            ("count", {
                let mut bytes = good.clone();
                bytes[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
                bytes
            }),
        ];
        for (case, bytes) in cases {
            std::fs::write(&path, bytes).unwrap();
            assert!(Lookup::open(&path).is_err(), "{case}");
        }
        // A table entry pointing past the end: refused by the whole-table check and by the lookup
        // that reads it, never read.
        let mut bytes = good.clone();
        let table = u64::from_le_bytes(bytes[32..40].try_into().unwrap()) as usize;
        for entry in 0..40 {
            let at = table + entry * 32 + 16;
            bytes[at..at + 8].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
        }
        std::fs::write(&path, bytes).unwrap();
        let lookup = Lookup::open(&path).unwrap();
        let message = crate::error_chain(&lookup.check().unwrap_err());
        assert!(message.contains("refused"), "{message}");
        let message = crate::error_chain(&lookup.record("k00005").unwrap_err());
        assert!(message.contains("not the next ones"), "{message}");
        // A record whose kernel name would leave the bundle is refused like `index.json`'s.
        let mut crafted = index(1);
        let record = crafted.kernels.remove("k00000").unwrap();
        crafted.kernels.insert("../escape".to_owned(), record);
        std::fs::write(&path, encode(&crafted)).unwrap();
        assert!(Lookup::open(&path).unwrap().names().is_err());
        assert!(Lookup::open(&path).unwrap().index().is_err());
    }

    /// A `kernels.idx` made of these parts, with a header that agrees with them: what a crafted
    /// file looks like when only its table lies. Every entry names graph 0, an empty graph
    /// stored after `records`.
    fn crafted(entries: &[(u64, u32, u32, u64, u32)], names: &[u8], records: &[u8]) -> Vec<u8> {
        let graphs = [(records.len() as u64, 1)];
        crafted_with(entries, &[0; 0], &graphs, names, &[records, &[0]].concat())
    }

    /// [`crafted`] with each entry's graph id (0 where `graph_ids` has none) and the graph
    /// table given.
    fn crafted_with(
        entries: &[(u64, u32, u32, u64, u32)],
        graph_ids: &[u32],
        graphs: &[(u64, u32)],
        names: &[u8],
        records: &[u8],
    ) -> Vec<u8> {
        let meta = serde_json::to_vec(&Meta::of(&index(0))).unwrap();
        let mut table = Vec::new();
        for (position, &(name_offset, name_len, load_len, record_offset, inputs_len)) in
            entries.iter().enumerate()
        {
            table.extend_from_slice(&name_offset.to_le_bytes());
            table.extend_from_slice(&name_len.to_le_bytes());
            table.extend_from_slice(&load_len.to_le_bytes());
            table.extend_from_slice(&record_offset.to_le_bytes());
            table.extend_from_slice(&inputs_len.to_le_bytes());
            let graph = graph_ids.get(position).copied().unwrap_or(0);
            table.extend_from_slice(&graph.to_le_bytes());
        }
        let mut graph_table = Vec::new();
        for &(offset, length) in graphs {
            graph_table.extend_from_slice(&offset.to_le_bytes());
            graph_table.extend_from_slice(&length.to_le_bytes());
            graph_table.extend_from_slice(&0u32.to_le_bytes());
        }
        assemble(
            LOOKUP_FORMAT,
            &meta,
            &codec::Vocabulary::of(std::iter::empty()).encode(),
            &table,
            &graph_table,
            names,
            records,
        )
    }

    /// A load record of about `size` bytes (one long string constant), valid for its shape.
    fn big_load_record(size: usize) -> Vec<u8> {
        let mut record = vec![0, 1, 1, b'X', 3];
        let mut length = size as u64;
        while length >= 0x80 {
            record.push((length as u8 & 0x7f) | 0x80);
            length >>= 7;
        }
        record.push(length as u8);
        record.resize(record.len() + size, b'x');
        record.extend_from_slice(&[0, 0, 0]);
        record
    }

    fn opened(bytes: &[u8]) -> (Result<Lookup, BundleError>, std::time::Duration) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOOKUP_FILE);
        std::fs::write(&path, bytes).unwrap();
        let started = std::time::Instant::now();
        let result = Lookup::open(&path).and_then(|lookup| lookup.check().map(|()| lookup));
        (result, started.elapsed())
    }

    /// Issue case 7: a 1.1 MB file whose 1,000 entries all point at the same 1 MB record cost
    /// 2 GiB once every kernel was read (`status()`); a 1.3 MB one whose records overlap cost
    /// 6.3 GB and 31 s. Both are refused before any record is read
    /// (by the whole-table check that listing runs), in milliseconds, having read the table once.
    #[test]
    fn kernels_idx_with_overlapping_spans_is_refused_before_a_record_is_read() {
        let record = big_load_record(1 << 20);
        let names: Vec<u8> = (0..1000)
            .flat_map(|n| format!("k{n:05}").into_bytes())
            .collect();
        let shared: Vec<_> = (0..1000u64)
            .map(|n| (n * 6, 6, record.len() as u32, 0, 0))
            .collect();
        let bytes = crafted(&shared, &names, &record);
        assert!(bytes.len() < 1_200_000, "{}", bytes.len());
        let (result, elapsed) = opened(&bytes);
        let message = crate::error_chain(&result.unwrap_err());
        assert!(message.contains(LOOKUP_FILE), "{message}");
        assert!(message.contains("table entry `1`"), "{message}");
        assert!(message.contains("not the next ones"), "{message}");
        assert!(elapsed.as_secs_f64() < 1.0, "{elapsed:?}");
        // Overlapping by a little: each record starts inside the previous one.
        let mut records = Vec::new();
        let mut entries = Vec::new();
        for n in 0..1000u64 {
            entries.push((n * 6, 6, 1300, n * 1300 / 2, 0));
        }
        records.resize(1000 * 1300 / 2 + 1300, b' ');
        let (result, _) = opened(&crafted(&entries, &names, &records));
        assert!(crate::error_chain(&result.unwrap_err()).contains("not the next ones"));
        // Names that share bytes are refused the same way.
        let mut entries: Vec<_> = (0..1000u64).map(|n| (n * 6, 6, 2, n * 2, 0)).collect();
        entries[1].0 = 0;
        let (result, _) = opened(&crafted(&entries, &names, &b"{}".repeat(1000)));
        assert!(crate::error_chain(&result.unwrap_err()).contains("not the next name"));
        // Bytes no entry claims are refused too (a table that spans less than its sections).
        let entries: Vec<_> = (0..999u64).map(|n| (n * 6, 6, 2, n * 2, 0)).collect();
        let records = [b"{}".repeat(1000), vec![0]].concat();
        let unclaimed = crafted_with(&entries, &[], &[(1998, 1)], &names[..999 * 6], &records);
        let (result, _) = opened(&unclaimed);
        assert!(crate::error_chain(&result.unwrap_err()).contains("not what the table spans"));
    }

    /// `bytes` with the `u64` at `at` set to `value`.
    fn patched(bytes: &[u8], at: usize, value: &[u8]) -> Vec<u8> {
        let mut bytes = bytes.to_vec();
        bytes[at..at + value.len()].copy_from_slice(value);
        bytes
    }

    fn header_u64(bytes: &[u8], at: usize) -> usize {
        u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize
    }

    /// Open checked the whole table (204 µs at 4,000 kernels against 19 µs for the embedded
    /// library): a lookup now checks only the entries it reads, so a lie far from the kernel
    /// asked for costs nothing, and the lookups that meet it, and every whole read, refuse it.
    #[test]
    fn a_lookup_checks_what_it_touches_and_refuses_the_lie_it_meets() {
        let good = encode(&index(1000));
        let table = header_u64(&good, 32);
        // Entry 700's records moved onto entry 100's.
        let moved = patched(&good, table + 700 * 32 + 16, &(100u64 * 2).to_le_bytes());
        let (result, _) = opened(&moved);
        assert!(crate::error_chain(&result.unwrap_err()).contains("not the next ones"));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOOKUP_FILE);
        std::fs::write(&path, &moved).unwrap();
        let lookup = Lookup::open(&path).unwrap();
        assert_eq!(lookup.len(), 1000);
        assert!(lookup.record("k00100").unwrap().is_some());
        assert!(lookup.record("k00123").unwrap().is_some());
        for touching in ["k00699", "k00700", "k00701"] {
            let message = crate::error_chain(&lookup.record(touching).unwrap_err());
            assert!(
                message.contains("not the next ones"),
                "{touching}: {message}"
            );
            assert!(message.contains(LOOKUP_FILE), "{touching}: {message}");
            assert!(lookup.inputs(touching).is_err(), "{touching}");
        }
        assert!(lookup.names().is_err());
        assert!(lookup.index().is_err());
        // A name the binary search visits first (the middle one) that is no identifier:
        // every lookup is refused, naming the entry.
        let names = header_u64(&good, 48);
        let slashed = patched(&good, names + 500 * 6, b"k/0500");
        std::fs::write(&path, &slashed).unwrap();
        let lookup = Lookup::open(&path).unwrap();
        for kernel in ["k00001", "k00999"] {
            let message = crate::error_chain(&lookup.record(kernel).unwrap_err());
            assert!(message.contains("table entry 500"), "{message}");
        }
        // Two neighbours swapped: the one found is out of order with the other.
        let mut swapped = patched(&good, names + 500 * 6, b"k00501");
        swapped = patched(&swapped, names + 501 * 6, b"k00500");
        std::fs::write(&path, &swapped).unwrap();
        let lookup = Lookup::open(&path).unwrap();
        for kernel in ["k00500", "k00501"] {
            match lookup.record(kernel) {
                Ok(None) => {}
                Ok(Some(_)) => panic!("{kernel} was read from a swapped table"),
                Err(error) => {
                    let message = crate::error_chain(&error);
                    assert!(message.contains("out of order"), "{kernel}: {message}");
                }
            }
        }
        assert!(lookup.record("k00400").unwrap().is_some());
        // A graph entry that lies is refused by what reads the graph, not by a load.
        let graphs = header_u64(&good, 40);
        let graph = patched(&good, graphs + 5 * 16 + 12, &1u32.to_le_bytes());
        std::fs::write(&path, &graph).unwrap();
        let lookup = Lookup::open(&path).unwrap();
        assert!(lookup.record("k00005").unwrap().is_some());
        let message = crate::error_chain(&lookup.inputs("k00005").unwrap_err());
        assert!(message.contains("graph entry `5`"), "{message}");
        assert!(lookup.inputs("k00006").unwrap().is_some());
        // A graph id past the graphs, on the kernel read.
        let id = patched(&good, table + 300 * 32 + 28, &5000u32.to_le_bytes());
        std::fs::write(&path, &id).unwrap();
        let message =
            crate::error_chain(&Lookup::open(&path).unwrap().record("k00300").unwrap_err());
        assert!(message.contains("not one of the 1000 graphs"), "{message}");
    }

    /// The first and the last entries meet the sections' ends: a name or a record section
    /// that runs past what the table spans is refused by the lookup of either end.
    #[test]
    fn a_lookup_of_the_first_or_last_kernel_checks_the_sections_ends() {
        let good = encode(&index(10));
        let table = header_u64(&good, 32);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOOKUP_FILE);
        let first = patched(&good, table + 16, &1u64.to_le_bytes());
        std::fs::write(&path, &first).unwrap();
        let message =
            crate::error_chain(&Lookup::open(&path).unwrap().record("k00000").unwrap_err());
        assert!(message.contains("not the next ones, at 0"), "{message}");
        // The last kernel one byte shorter: its records no longer meet the first graph's.
        let load = u32::from_le_bytes(good[table + 9 * 32 + 12..][..4].try_into().unwrap());
        let last = patched(&good, table + 9 * 32 + 24, &{
            let inputs = u32::from_le_bytes(good[table + 9 * 32 + 24..][..4].try_into().unwrap());
            (inputs - 1).to_le_bytes()
        });
        assert!(load > 0);
        std::fs::write(&path, &last).unwrap();
        let lookup = Lookup::open(&path).unwrap();
        let message = crate::error_chain(&lookup.record("k00009").unwrap_err());
        assert!(message.contains("not what the table spans"), "{message}");
        assert!(lookup.record("k00005").unwrap().is_some());
        // The same answers lazily and once the table is checked whole.
        std::fs::write(&path, &good).unwrap();
        let lookup = Lookup::open(&path).unwrap();
        let lazily: Vec<_> = (0..10)
            .map(|n| lookup.record(&format!("k{n:05}")).unwrap().unwrap())
            .collect();
        let inputs_lazily = lookup.inputs("k00009").unwrap().unwrap();
        lookup.check().unwrap();
        for (n, record) in lazily.iter().enumerate() {
            assert_eq!(
                &lookup.record(&format!("k{n:05}")).unwrap().unwrap(),
                record
            );
        }
        assert_eq!(lookup.inputs("k00009").unwrap().unwrap(), inputs_lazily);
    }

    /// A wheel's `kernels.idx`, read from the archive's bytes, gives what the file gives, and
    /// its errors name the path it was given.
    #[test]
    fn kernels_idx_from_bytes_reads_as_the_file_does() {
        let index = rich_index(30, 3);
        let bytes = encode(&index);
        let lookup = Lookup::from_bytes(Path::new("wheel/_prebuilt/kernels.idx"), bytes.clone());
        assert_eq!(lookup.unwrap().index().unwrap(), index);
        let cut = Lookup::from_bytes(
            Path::new("w/kernels.idx"),
            bytes[..bytes.len() - 1].to_vec(),
        );
        let message = crate::error_chain(&cut.unwrap_err());
        assert!(message.contains("w/kernels.idx"), "{message}");
    }

    /// Issue case 7: 6,000 names out of order made `status()` quadratic (24 s, 396 MB of
    /// error text for the names a binary search missed). Refused before any record
    /// is read (by the whole-table check that listing runs), with a short message.
    #[test]
    fn kernels_idx_with_an_unsorted_name_table_is_refused_before_a_record_is_read() {
        let mut names = Vec::new();
        let mut entries = Vec::new();
        for n in (0..6000u64).rev() {
            let name = format!("k{n:05}");
            entries.push((names.len() as u64, 6, 2, (5999 - n) * 2, 0));
            names.extend_from_slice(name.as_bytes());
        }
        let (result, elapsed) = opened(&crafted(&entries, &names, &b"{}".repeat(6000)));
        let message = crate::error_chain(&result.unwrap_err());
        assert!(message.contains("out of order at entry 1"), "{message}");
        assert!(message.len() < 1000, "{}", message.len());
        assert!(elapsed.as_secs_f64() < 1.0, "{elapsed:?}");
        // A name twice is out of order too.
        let entries = [(0, 6, 2, 0, 0), (6, 6, 2, 2, 0)];
        let (result, _) = opened(&crafted(&entries, b"k00001k00001", b"{}{}"));
        assert!(crate::error_chain(&result.unwrap_err()).contains("sorted and unique"));
    }

    /// Issue case 10: `.kernels` listed names with `/`, straight from the table. Every name is
    /// checked as a kernel name before a listing is made, so no listing can hold one.
    #[test]
    fn kernels_idx_names_with_a_slash_are_refused_before_a_record_is_read() {
        for bad in ["a/b", "../up", "", "1x", "a.b"] {
            let entries = [(0, bad.len() as u32, 2, 0, 0)];
            let (result, _) = opened(&crafted(&entries, bad.as_bytes(), b"{}"));
            let message = crate::error_chain(&result.unwrap_err());
            assert!(message.contains("table entry 0"), "{bad}: {message}");
        }
    }

    /// Issue case 10: `kernels.idx` (and `index.json`) as a symbolic link out of the bundle was
    /// followed.
    #[test]
    fn kernels_idx_linked_out_of_the_bundle_is_refused() {
        let outside = tempfile::tempdir().unwrap();
        let target = outside.path().join(LOOKUP_FILE);
        std::fs::write(&target, encode(&index(3))).unwrap();
        std::fs::write(
            outside.path().join(crate::bundle::INDEX_FILE),
            index(3).to_json(),
        )
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join(LOOKUP_FILE)).unwrap();
        let error = Catalog::open(dir.path()).unwrap_err();
        let message = crate::error_chain(&error);
        assert!(message.contains("leads out of the bundle"), "{message}");
        let BundleError::Read { source, .. } = &error else {
            panic!("{message}");
        };
        assert!(crate::untrusted::is_refusal(source), "{message}");
        assert!(Lookup::open(&dir.path().join(LOOKUP_FILE)).is_err());
        // A dangling link is not taken for "no loader index".
        std::fs::remove_file(&target).unwrap();
        std::fs::write(
            dir.path().join(crate::bundle::INDEX_FILE),
            index(3).to_json(),
        )
        .unwrap();
        assert!(Catalog::open(dir.path()).is_err());
        // index.json linked out: refused by every reader of it.
        std::fs::remove_file(dir.path().join(LOOKUP_FILE)).unwrap();
        std::fs::remove_file(dir.path().join(crate::bundle::INDEX_FILE)).unwrap();
        std::os::unix::fs::symlink(
            outside.path().join(crate::bundle::INDEX_FILE),
            dir.path().join(crate::bundle::INDEX_FILE),
        )
        .unwrap();
        for message in [
            crate::error_chain(&Catalog::open(dir.path()).unwrap_err()),
            crate::error_chain(&crate::Bundle::open(dir.path()).unwrap_err()),
            crate::error_chain(&read_index(dir.path()).unwrap_err()),
            crate::error_chain(
                &read_index(&dir.path().join(crate::bundle::INDEX_FILE)).unwrap_err(),
            ),
        ] {
            assert!(message.contains("leads out of the bundle"), "{message}");
        }
        // A link that stays inside the bundle is followed.
        let inside = tempfile::tempdir().unwrap();
        std::fs::write(inside.path().join("real.idx"), encode(&index(3))).unwrap();
        std::os::unix::fs::symlink("real.idx", inside.path().join(LOOKUP_FILE)).unwrap();
        assert_eq!(
            Catalog::open(inside.path()).unwrap().names().unwrap().len(),
            3
        );
    }

    #[test]
    fn a_fifo_in_its_place_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOOKUP_FILE);
        let status = std::process::Command::new("mkfifo")
            .arg(&path)
            .status()
            .unwrap();
        assert!(status.success());
        let message = crate::error_chain(&Catalog::open(dir.path()).unwrap_err());
        assert!(message.contains("not a regular file"), "{message}");
    }

    #[test]
    fn a_bundle_without_the_loader_index_is_read_from_index_json() {
        let dir = tempfile::tempdir().unwrap();
        let index = index(5);
        std::fs::write(dir.path().join(crate::bundle::INDEX_FILE), index.to_json()).unwrap();
        let catalog = Catalog::open(dir.path()).unwrap();
        assert_eq!(catalog.meta(), &Meta::of(&index));
        let record = catalog.record("k00003").unwrap().unwrap();
        assert_eq!(record.variants, index.kernels["k00003"].variants);
        assert_eq!(
            catalog.inputs("k00003").unwrap().unwrap(),
            index.kernels["k00003"].inputs
        );
        // With it, the same answers.
        std::fs::write(dir.path().join(LOOKUP_FILE), encode(&index)).unwrap();
        let catalog = Catalog::open(dir.path()).unwrap();
        assert_eq!(catalog.record("k00003").unwrap().unwrap(), record);
        assert_eq!(catalog.names().unwrap().len(), 5);
    }

    /// `index(4)` with one skip of each kind, each with words that start like another
    /// kind's (or like none), in the format that goes with it.
    fn index_with_every_skip_kind() -> Index {
        let mut index = index(4);
        let skips = [
            (SkipKind::Declared, "stub: words that open like a stub's"),
            (
                SkipKind::Unsupported,
                "declared: words that open like a declared one's",
            ),
            (SkipKind::Stub, "failed: words that open like a failure's"),
            (SkipKind::Failed, "words that open like nothing"),
        ];
        for (record, (kind, reason)) in index.kernels.values_mut().zip(skips) {
            record.skipped.push(Skip {
                arch: "sm_90a".parse().unwrap(),
                cuda: "cu129".parse().unwrap(),
                kind,
                reason: reason.to_owned(),
            });
        }
        index.format = index.required_format();
        index
    }

    #[test]
    fn a_skip_of_each_kind_reads_back_its_kind_from_index_json_and_kernels_idx() {
        let index = index_with_every_skip_kind();
        assert_eq!(index.format, crate::index::SKIP_KIND_INDEX_FORMAT);
        let json = index.to_json();
        assert!(json.contains(r#""kind": "declared""#), "{json}");
        let path = Path::new("index.json");
        let parsed = crate::bundle::parse_index(path, json.as_bytes()).unwrap();
        assert_eq!(parsed, index);
        let bytes = encode(&index);
        assert_eq!(bytes[8..12], LOOKUP_FORMAT.to_le_bytes());
        let lookup = Lookup::from_bytes(Path::new(LOOKUP_FILE), bytes).unwrap();
        assert_eq!(lookup.index().unwrap(), index);
        for (name, record) in &index.kernels {
            let found = lookup.record(name).unwrap().unwrap();
            assert_eq!(found.skipped, record.skipped, "{name}");
        }
        // The kind decides, never the words: words that open like a stub's are declared.
        for read in [&parsed, &lookup.index().unwrap()] {
            let skip = &read.kernels["k00000"].skipped[0];
            assert_eq!(skip.kind, SkipKind::Declared);
            assert_eq!(
                skip.why(),
                SkipReason::Declared("stub: words that open like a stub's".into())
            );
            let kinds: Vec<SkipKind> = read
                .kernels
                .values()
                .map(|record| record.skipped[0].kind)
                .collect();
            assert_eq!(kinds, SkipKind::ALL);
        }
    }

    #[test]
    fn an_index_without_skips_keeps_the_formats_and_bytes_it_had() {
        let mut index = index(4);
        index.format = index.required_format();
        assert_eq!(index.format, INDEX_FORMAT);
        let json = index.to_json();
        for kind in SkipKind::ALL {
            assert!(!json.contains(&format!(r#""kind": "{kind}""#)), "{json}");
        }
        let bytes = encode(&index);
        assert_eq!(bytes[8..12], OLDEST_LOOKUP_FORMAT.to_le_bytes());
        assert_eq!(
            Lookup::from_bytes(Path::new(LOOKUP_FILE), bytes)
                .unwrap()
                .index()
                .unwrap(),
            index
        );
    }

    #[test]
    fn a_skip_written_before_skips_had_a_kind_reads_it_from_its_reasons_first_words() {
        let written = [
            (
                "declared: the kernel targets only sm_100a",
                SkipKind::Declared,
            ),
            ("stub: every entry is a stub", SkipKind::Stub),
            ("failed: failed to compile `k`", SkipKind::Failed),
            ("nvrtc 12.9 cannot target sm_100a", SkipKind::Unsupported),
        ];
        let mut index = index(4);
        for (record, (reason, kind)) in index.kernels.values_mut().zip(written) {
            record.skipped.push(Skip {
                arch: "sm_90a".parse().unwrap(),
                cuda: "cu129".parse().unwrap(),
                kind,
                reason: reason.to_owned(),
            });
        }
        // An index.json of format 5, whose skips have no `kind`.
        index.format = crate::index::REQUIRES_INDEX_FORMAT;
        let mut json = serde_json::to_value(&index).unwrap();
        for record in json["kernels"].as_object_mut().unwrap().values_mut() {
            for skip in record["skipped"].as_array_mut().unwrap() {
                skip.as_object_mut().unwrap().remove("kind").unwrap();
            }
        }
        let text = serde_json::to_vec(&json).unwrap();
        let parsed = crate::bundle::parse_index(Path::new("index.json"), &text).unwrap();
        assert_eq!(parsed, index);
        // In the format it is written now, such an index must name its kinds.
        json["format"] = crate::index::SKIP_KIND_INDEX_FORMAT.into();
        let text = serde_json::to_vec(&json).unwrap();
        let error = crate::bundle::parse_index(Path::new("index.json"), &text).unwrap_err();
        assert!(
            crate::error_chain(&error).contains("missing field `kind`"),
            "{}",
            crate::error_chain(&error)
        );
        // A load record of kernels.idx format 7: each skip ends at its reason.
        let vocabulary = codec::Vocabulary::of(index.kernels.values());
        let words = codec::Words::read(vocabulary.encode()).unwrap();
        for (name, record) in &index.kernels {
            let mut load = codec::encode_load(name, record, &vocabulary);
            assert_eq!(load.pop(), Some(codec_kind_number(record.skipped[0].kind)));
            let decoded = Decoded::new(MAX_RECORD_DECODED, "one kernel's records");
            let read = codec::decode_load(name, &load, &words, false, &decoded).unwrap();
            assert_eq!(read.skipped, record.skipped, "{name}");
            // The same bytes read as format 8 are cut short.
            assert!(codec::decode_load(name, &load, &words, true, &decoded).is_err());
        }
    }

    /// The byte a load record writes a skip's kind as.
    fn codec_kind_number(kind: SkipKind) -> u8 {
        SkipKind::ALL.iter().position(|each| *each == kind).unwrap() as u8
    }

    /// An index with every kind of field set, whose kernels share include graphs in groups.
    fn rich_index(count: usize, graphs: usize) -> Index {
        let mut index = index(count);
        let family = crate::key::sha256_hex(b"family");
        for (n, record) in index.kernels.values_mut().enumerate() {
            let group = n % graphs.max(1);
            record.inputs.files = (0..40)
                .map(|file| {
                    let path = format!("include/group{group}/header{file}.cuh");
                    let digest = crate::key::sha256_hex(path.as_bytes());
                    (path, digest)
                })
                .collect();
            record.inputs.defines.insert("N".into(), n.to_string());
            record.inputs.flags = vec!["-O3".into()];
            record.inputs.nvrtc_flags = vec!["--use_fast_math".into()];
            record.inputs.cxx_std = "c++17".into();
            record.inputs.preamble = "using namespace x;".into();
            record.inputs.targets.insert(
                "sm_100a".parse().unwrap(),
                crate::index::TargetInputs {
                    defines: BTreeMap::from([("WIDE".into(), "1".into())]),
                    nvcc_flags: vec!["-lineinfo".into()],
                    ..Default::default()
                },
            );
            record.constants.extend([
                ("NEG".to_owned(), Constant::Integer(-5)),
                ("F".to_owned(), Constant::Float(0.25)),
                ("B".to_owned(), Constant::Bool(true)),
                ("S".to_owned(), Constant::String("bf16".into())),
            ]);
            let mut second = record.variants[0].clone();
            second.arch = "sm_100a".parse().unwrap();
            second.artifact.dictionary = Some(family.clone());
            second.artifact.path = format!("elsewhere/{n}.zst");
            second.functions = vec![crate::index::Function {
                computed: Default::default(),
                name: "scale<float>".into(),
                symbol: "_Z5scaleIfEvPT_".into(),
                param_sizes: vec![8, 4],
            }];
            record.variants.push(second);
            record.skipped.push(Skip {
                arch: "sm_90a".parse().unwrap(),
                cuda: "cu129".parse().unwrap(),
                kind: SkipKind::Unsupported,
                reason: format!("no toolchain for kernel {n}"),
            });
        }
        index
    }

    #[test]
    fn a_shared_skip_reason_entries_named_by_functions_and_shared_prefixes_are_written_once() {
        let mut index = rich_index(300, 1);
        let reason = "declared: the kernel targets only sm_100a";
        for (n, record) in index.kernels.values_mut().enumerate() {
            record.skipped[0].reason = reason.into();
            let function = |name: String| crate::index::Function {
                computed: Default::default(),
                symbol: name.clone(),
                name,
                param_sizes: vec![8],
            };
            // A second entry that extends the first: its name shares the first's bytes.
            let names = [
                format!("entry_of_kernel_{n:05}"),
                format!("entry_of_kernel_{n:05}GetSmemSize"),
            ];
            record.variants[0].functions = names.iter().cloned().map(function).collect();
            record.inputs.entries = names.to_vec();
        }
        // One kernel declares entries its first variant's functions are not named by.
        let odd = index.kernels.values_mut().next().unwrap();
        odd.inputs.entries = vec!["an_entry_of_its_own".into()];
        let bytes = encode(&index);
        let count = |text: &str| {
            bytes
                .windows(text.len())
                .filter(|w| *w == text.as_bytes())
                .count()
        };
        assert_eq!(count(reason), 1, "once, in the vocabulary");
        assert_eq!(
            count("entry_of_kernel_"),
            300,
            "once each, in the load records"
        );
        assert_eq!(
            count("GetSmemSize"),
            300,
            "the first name's bytes, then this"
        );
        assert_eq!(count("an_entry_of_its_own"), 1);
        let (_dir, path) = written(&index);
        let lookup = Lookup::open(&path).unwrap();
        assert_eq!(lookup.index().unwrap(), index);
        for (name, record) in &index.kernels {
            assert_eq!(lookup.inputs(name).unwrap().unwrap(), record.inputs);
        }
    }

    /// Format 3 wrote every include graph file's folder out (an imported cubin's graph is its
    /// one file: 130 of FlashInfer's ~280 bytes a kernel) and kept the vocabulary in the JSON
    /// meta, which an open parsed whole: 93 µs for FlashInfer's 2,000 family digests.
    #[test]
    fn graph_folders_are_words_and_the_vocabulary_is_read_without_decoding_it() {
        let folder = "/home/builder/checkout/third_party/cubins/fmha/trtllm-gen";
        let mut index = index(300);
        for (n, record) in index.kernels.values_mut().enumerate() {
            let path = format!("{folder}/kernel{n:05}.cubin");
            let digest = crate::key::sha256_hex(path.as_bytes());
            record.inputs.files = BTreeMap::from([(path, digest)]);
            // Imported, as FlashInfer's cubins are: no recipe, so its inputs may lie anywhere.
            record.recipe = None;
            // A family per kernel, as a dense corpus has thousands: each a digest word.
            let family = crate::key::sha256_hex(format!("family {n}").as_bytes());
            record.variants[0].artifact.dictionary = Some(family);
        }
        // A file in no folder, and one whose folder is the root.
        let first = index.kernels.values_mut().next().unwrap();
        first
            .inputs
            .files
            .insert("top.cuh".into(), crate::key::sha256_hex(b"top"));
        first
            .inputs
            .files
            .insert("/abs.cuh".into(), crate::key::sha256_hex(b"abs"));
        let bytes = encode(&index);
        let count = |text: &[u8]| bytes.windows(text.len()).filter(|w| *w == text).count();
        assert_eq!(count(folder.as_bytes()), 1, "once, in the vocabulary");
        assert_eq!(count(b"kernel00299.cubin"), 1);
        // Family digests are 32 raw bytes, never hex.
        let family = &index.kernels["k00299"].variants[0].artifact.dictionary;
        let family = family.as_deref().unwrap();
        assert_eq!(count(family.as_bytes()), 0);
        assert_eq!(count(&hex::decode(family).unwrap()), 1);
        let (_dir, path) = written(&index);
        let lookup = Lookup::open(&path).unwrap();
        assert_eq!(lookup.words.len(), 300 + 7);
        assert_eq!(lookup.index().unwrap(), index);
        for (name, record) in &index.kernels {
            assert_eq!(lookup.inputs(name).unwrap().unwrap(), record.inputs);
        }
        let catalog = Catalog::open(path.parent().unwrap()).unwrap();
        assert!(catalog.is_reference(family));
        assert!(!catalog.is_reference(&crate::key::sha256_hex(b"no family")));
        assert!(
            catalog.is_reference(folder),
            "a word, though no digest: harmless"
        );
    }

    /// A few bytes of a record name a word of up to the vocabulary's size: 2,000 files of one
    /// 256 KiB folder (a 0.3 MB file) decoded to 0.5 GB of paths, and skips that each name a
    /// 256 KiB reason as much.
    #[test]
    fn records_that_copy_more_than_their_budget_of_vocabulary_words_are_refused() {
        let folder = "d".repeat(256 << 10);
        let mut graph = index(1);
        let record = graph.kernels.values_mut().next().unwrap();
        record.recipe = None;
        record.inputs.files = (0..2000)
            .map(|n| (format!("{folder}/{n}"), crate::key::sha256_hex(b"x")))
            .collect();
        let mut skips = index(1);
        let record = skips.kernels.values_mut().next().unwrap();
        let skip = Skip {
            arch: "sm_90a".parse().unwrap(),
            cuda: "cu129".parse().unwrap(),
            kind: SkipKind::Unsupported,
            reason: folder.clone(),
        };
        record.skipped = vec![skip; 2000];
        for (case, index, read) in [
            ("graph", graph, Lookup::inputs as fn(&Lookup, &str) -> _),
            ("skips", skips, |lookup: &Lookup, kernel: &str| {
                lookup.record(kernel).map(|record| record.map(|r| r.inputs))
            }),
        ] {
            let (_dir, path) = written(&index);
            assert!(std::fs::metadata(&path).unwrap().len() < 400_000, "{case}");
            let lookup = Lookup::open(&path).unwrap();
            let message = crate::error_chain(&read(&lookup, "k00000").unwrap_err());
            assert!(message.contains("k00000"), "{case}: {message}");
            assert!(
                message.contains("bytes of vocabulary words"),
                "{case}: {message}"
            );
        }
    }

    #[test]
    fn a_vocabulary_that_lies_is_refused_at_open_naming_it() {
        let index = rich_index(3, 1);
        let bytes = encode(&index);
        let words_len = u32::from_le_bytes(bytes[76..80].try_into().unwrap()) as usize;
        let meta_len = u64::from_le_bytes(bytes[24..32].try_into().unwrap()) as usize;
        let words = HEADER_LEN as usize + meta_len;
        // The first word (`2.11.*`'s text, say) made invalid UTF-8; then a count past the
        // section; then a last word cut short.
        let mut not_utf8 = bytes.clone();
        let text = (words + 1..words + words_len)
            .find(|&at| not_utf8[at] == 1 && not_utf8[at + 1] > 0)
            .unwrap();
        not_utf8[text + 2] = 0xff;
        let mut overcounted = bytes.clone();
        overcounted[words] = 0x7f;
        let mut cut = bytes.clone();
        let table = u64::from_le_bytes(bytes[32..40].try_into().unwrap());
        cut[76..80].copy_from_slice(&(words_len as u32 - 1).to_le_bytes());
        cut[32..40].copy_from_slice(&(table - 1).to_le_bytes());
        for (case, bytes) in [("not UTF-8", not_utf8), ("overcounted", overcounted)] {
            let message = crate::error_chain(&opened(&bytes).0.unwrap_err());
            assert!(message.contains("vocabulary"), "{case}: {message}");
            assert!(message.contains(LOOKUP_FILE), "{case}: {message}");
        }
        // A vocabulary whose length the header changes moves the table: refused too.
        assert!(opened(&cut).0.is_err());
    }

    #[test]
    fn function_names_that_repeat_more_than_the_records_budget_are_refused() {
        // 6,000 names, each the last one and a byte more: 24 KB in the record, 18 MB read.
        let mut index = index(1);
        let record = index.kernels.values_mut().next().unwrap();
        let mut name = String::new();
        record.variants[0].functions = (0..6000)
            .map(|_| {
                name.push('x');
                crate::index::Function {
                    computed: Default::default(),
                    name: name.clone(),
                    symbol: name.clone(),
                    param_sizes: vec![],
                }
            })
            .collect();
        let (_dir, path) = written(&index);
        assert!(std::fs::metadata(&path).unwrap().len() < 100_000);
        let lookup = Lookup::open(&path).unwrap();
        let message = crate::error_chain(&lookup.record("k00000").unwrap_err());
        assert!(message.contains("k00000"), "{message}");
        assert!(message.contains("bytes of its function names"), "{message}");
    }

    #[test]
    fn variants_that_copy_more_than_the_records_budget_of_function_names_are_refused() {
        // One 100 KB name, named by 300 variants: each would hold its own copy (60 MB).
        let mut index = index(1);
        let record = index.kernels.values_mut().next().unwrap();
        let name = "x".repeat(100_000);
        record.variants[0].functions = vec![crate::index::Function {
            computed: Default::default(),
            name: name.clone(),
            symbol: name,
            param_sizes: vec![],
        }];
        record.variants = vec![record.variants[0].clone(); 300];
        let (_dir, path) = written(&index);
        assert!(std::fs::metadata(&path).unwrap().len() < 200_000);
        let lookup = Lookup::open(&path).unwrap();
        let message = crate::error_chain(&lookup.record("k00000").unwrap_err());
        assert!(
            message.contains("gives its variants more than"),
            "{message}"
        );
    }

    #[test]
    fn the_whole_index_comes_back_from_kernels_idx_as_it_was_written() {
        for (count, graphs) in [(0, 1), (1, 1), (37, 3), (500, 1)] {
            let index = rich_index(count, graphs);
            let (_dir, path) = written(&index);
            let lookup = Lookup::open(&path).unwrap();
            assert_eq!(lookup.graph_count(), graphs.min(count), "{count}");
            assert_eq!(lookup.index().unwrap(), index, "{count} kernels");
            for (name, record) in &index.kernels {
                assert_eq!(lookup.inputs(name).unwrap().unwrap(), record.inputs);
                let load = lookup.record(name).unwrap().unwrap();
                assert_eq!(load.variants, record.variants);
                assert_eq!(load.skipped, record.skipped);
                assert_eq!(load.constants, record.constants);
            }
        }
    }

    /// 3 KB per kernel, mostly key inputs a first call never reads, was what format 1 cost:
    /// a graph that every kernel shares is stored once, and a load record is tens of bytes
    /// per variant.
    #[test]
    fn a_shared_include_graph_is_stored_once() {
        let shared = encode(&rich_index(1000, 1));
        let apart = encode(&rich_index(1000, 1000));
        let one = &rich_index(1, 1).kernels["k00000"];
        let one_graph = codec::encode_graph(
            &one.inputs.files,
            &codec::Vocabulary::of(std::iter::once(one)),
        );
        // 40 headers, each a folder id, a file name and a digest.
        assert!(one_graph.len() > 1500, "{}", one_graph.len());
        assert!(
            apart.len() - shared.len() >= 999 * one_graph.len(),
            "{} vs {}",
            apart.len(),
            shared.len()
        );
        let record = &rich_index(1, 1).kernels["k00000"];
        let words = codec::Vocabulary::of(std::iter::once(record));
        let load = codec::encode_load("k00000", record, &words);
        let json = serde_json::to_vec(&record.variants).unwrap();
        assert!(
            load.len() * 2 < json.len(),
            "{} vs {}",
            load.len(),
            json.len()
        );
        assert!(load.len() < 160 * record.variants.len(), "{}", load.len());
    }

    #[test]
    fn a_format_1_file_is_refused_naming_the_file_and_both_formats() {
        // What format 1 wrote: a 64-byte header, format 1, JSON records.
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&1u32.to_le_bytes());
        bytes.extend_from_slice(&0u32.to_le_bytes());
        bytes.resize(64, 0);
        let (result, _) = opened(&bytes);
        let error = result.unwrap_err();
        assert!(matches!(
            error,
            BundleError::UnsupportedLookup {
                found: 1,
                reads: LOOKUP_FORMAT,
                ..
            }
        ));
        let message = error.to_string();
        assert!(message.contains(LOOKUP_FILE), "{message}");
        assert!(message.contains("has format 1"), "{message}");
        assert!(
            message.contains(&format!(
                "reads formats {OLDEST_LOOKUP_FORMAT} to {LOOKUP_FORMAT}"
            )),
            "{message}"
        );
        // A newer one, even one too short for this format's header, is named by its format.
        let newer = LOOKUP_FORMAT + 1;
        bytes[8..12].copy_from_slice(&newer.to_le_bytes());
        let message = opened(&bytes[..12]).0.unwrap_err().to_string();
        assert!(
            message.contains(&format!("has format {newer}")),
            "{message}"
        );
    }

    #[test]
    fn graph_tables_that_lie_are_refused_before_a_record_is_read() {
        let names = b"k00000k00001";
        let entries = [(0, 6, 2, 0, 0), (6, 6, 2, 2, 0)];
        let records = [b"{}{}".to_vec(), vec![0, 0]].concat();
        type Case<'a> = (&'a str, &'a [u32], &'a [(u64, u32)], &'a str);
        let cases: [Case; 4] = [
            (
                "past the graphs",
                &[0, 2],
                &[(4, 1), (5, 1)],
                "not one of the 2 graphs",
            ),
            (
                "named by none",
                &[0, 0],
                &[(4, 1), (5, 1)],
                "is named by no kernel",
            ),
            (
                "overlapping",
                &[0, 1],
                &[(4, 2), (4, 2)],
                "not the next one",
            ),
            (
                "more graphs than kernels",
                &[0, 1],
                &[(4, 1), (5, 1), (6, 0)],
                "graph count",
            ),
        ];
        for (case, ids, graphs, expected) in cases {
            let (result, elapsed) = opened(&crafted_with(&entries, ids, graphs, names, &records));
            let message = crate::error_chain(&result.unwrap_err());
            assert!(message.contains(expected), "{case}: {message}");
            assert!(message.contains(LOOKUP_FILE), "{case}: {message}");
            assert!(elapsed.as_secs_f64() < 1.0, "{case}");
        }
        // The good one opens.
        let good = crafted_with(&entries, &[0, 1], &[(4, 1), (5, 1)], names, &records);
        assert!(opened(&good).0.is_ok());
    }

    /// A graph of 1 MB that 16,000 kernels name is 16 GB once every kernel's inputs are made:
    /// the whole index is refused by what the copies would take, having decoded the graph
    /// once.
    #[test]
    fn a_graph_shared_past_the_cap_is_refused_whole_but_read_one_kernel_at_a_time() {
        let mut files = BTreeMap::new();
        for n in 0..20_000 {
            files.insert(format!("h/{n:040}.cuh"), crate::key::sha256_hex(b"x"));
        }
        let bytes = shared_graphs_file(1100, 1, |_| files.clone());
        assert!(bytes.len() < 2 << 20, "{}", bytes.len());
        let (result, _) = opened(&bytes);
        let lookup = result.unwrap();
        assert_eq!(
            lookup.inputs("k00500").unwrap().unwrap().files.len(),
            20_000
        );
        let message = crate::error_chain(&lookup.index().unwrap_err());
        assert!(message.contains("cap on a whole index"), "{message}");
    }

    #[test]
    fn records_that_lie_about_their_fields_are_refused_naming_the_kernel() {
        let index = index(2);
        let good = encode(&index);
        let (result, _) = opened(&good);
        let lookup = result.unwrap();
        let (offset, length) = lookup.tables().unwrap().entries[1].load;
        for (case, patch) in [
            (
                "a length past the end",
                vec![(1usize, 0xffu8), (2, 0xff), (3, 0x7f)],
            ),
            ("a flag that is not 0 or 1", vec![(0, 7)]),
        ] {
            let mut bytes = good.clone();
            for (at, value) in patch {
                bytes[offset as usize + at] = value;
            }
            let (result, _) = opened(&bytes);
            let message = crate::error_chain(&result.unwrap().record("k00001").unwrap_err());
            assert!(message.contains("k00001"), "{case}: {message}");
            assert!(message.contains("load record"), "{case}: {message}");
        }
        assert!(length > 0);
    }

    #[test]
    fn a_bundle_with_only_kernels_idx_gives_its_whole_index_and_can_restore_index_json() {
        let dir = tempfile::tempdir().unwrap();
        let index = rich_index(12, 2);
        std::fs::write(dir.path().join(LOOKUP_FILE), encode(&index)).unwrap();
        assert_eq!(read_bundle_index(dir.path()).unwrap(), index);
        assert_eq!(
            read_bundle_index(&dir.path().join(LOOKUP_FILE)).unwrap(),
            index
        );
        assert!(restore_index_json(dir.path()).unwrap());
        assert_eq!(read_index(dir.path()).unwrap(), index);
        assert!(!restore_index_json(dir.path()).unwrap());
        // With neither, the error names index.json, as before.
        let empty = tempfile::tempdir().unwrap();
        let message = crate::error_chain(&read_bundle_index(empty.path()).unwrap_err());
        assert!(message.contains(crate::bundle::INDEX_FILE), "{message}");
    }

    /// A `kernels.idx` of `count` kernels (`k00000`…, each `index(1)`'s record but its key
    /// inputs), kernel `n` naming graph `n % graphs` and graph `g` being `graph(g)`, whose
    /// folders are all graph 0's: what [`encode`] writes for such an index, made one graph at
    /// a time, without a copy of a graph per kernel.
    fn shared_graphs_file(
        count: usize,
        graphs: usize,
        graph: impl Fn(usize) -> BTreeMap<String, String>,
    ) -> Vec<u8> {
        let mut template = index(1).kernels.into_values().next().unwrap();
        template.recipe = None;
        template.inputs.files = BTreeMap::new();
        let mut with_folders = template.clone();
        with_folders.inputs.files = graph(0);
        let words = codec::Vocabulary::of([&with_folders].into_iter());
        let meta = serde_json::to_vec(&Meta::of(&index(1))).unwrap();
        let mut file = Writing::default();
        for n in 0..count {
            let name = format!("k{n:05}");
            let load = codec::encode_load(&name, &template, &words);
            file.kernel(
                &name,
                &load,
                &codec::encode_inputs(&template),
                (n % graphs) as u32,
            );
        }
        for id in 0..graphs {
            file.graph(&codec::encode_graph(&graph(id), &words));
        }
        file.assemble(LOOKUP_FORMAT, &meta, &words.encode())
    }

    /// Round 3, case 5: a 3.2 MB file whose include graphs thousands of kernels name was
    /// decoded with a copy of its graph per kernel, each charged by the graph's encoded bytes
    /// (its folder words to a budget of their own), and exhausted 4 GB. Here 4,000 kernels
    /// name 4 graphs of 5,000 files in one long folder: 0.76 GB counted as encoded, within the
    /// old 1 GiB cap, 7 GB decoded. Charged by what it decodes to, the whole read is refused
    /// in a fraction of a second, having decoded each graph once, and a lookup of one kernel
    /// still reads its graph.
    #[test]
    fn a_small_index_whose_graphs_many_kernels_name_is_refused_quickly() {
        let folder = format!("include/{}", "cutlass_gemm_collective_".repeat(8));
        let graph = |graph: usize| -> BTreeMap<String, String> {
            (0..5_000)
                .map(|file| {
                    let path = format!("{folder}/g{graph}_{file:05}.hpp");
                    (path, crate::key::sha256_hex(&[graph as u8]))
                })
                .collect()
        };
        let bytes = shared_graphs_file(4_000, 4, graph);
        assert!(bytes.len() < 4 << 20, "{}", bytes.len());
        let lookup = Lookup::from_bytes(Path::new(LOOKUP_FILE), bytes).unwrap();
        lookup.check().unwrap();
        let started = std::time::Instant::now();
        let message = crate::error_chain(&lookup.index().unwrap_err());
        let elapsed = started.elapsed();
        assert!(elapsed.as_secs_f64() < 2.0, "{elapsed:?}");
        assert!(
            message.contains("include graphs, copied once per kernel that names them")
                && message.contains(&format!("{MAX_DECODED}-byte cap on a whole index")),
            "{message}"
        );
        let inputs = lookup.inputs("k03999").unwrap().unwrap();
        assert_eq!(inputs.files, graph(3999 % 4));
        // The same file with few enough kernels reads whole, each kernel with its graph.
        let bytes = shared_graphs_file(8, 4, graph);
        let index = Lookup::from_bytes(Path::new(LOOKUP_FILE), bytes)
            .unwrap()
            .index()
            .unwrap();
        assert_eq!(index.kernels["k00006"].inputs.files, graph(2));
    }

    /// Graphs no two kernels share, each naming a 300 KB folder word three times: every graph
    /// record is a few bytes and within its own budget of vocabulary words, and 1,500 of them
    /// decoded to 1.35 GB. The words are charged to the whole read's one budget: refused at the
    /// cap.
    #[test]
    fn folder_words_copied_by_every_graph_are_charged_to_the_whole_index() {
        let folder = "d".repeat(300_000);
        let graph = |graph: usize| -> BTreeMap<String, String> {
            (0..3)
                .map(|file| {
                    (
                        format!("{folder}/{graph}_{file}"),
                        crate::key::sha256_hex(b"x"),
                    )
                })
                .collect()
        };
        let bytes = shared_graphs_file(1_500, 1_500, graph);
        assert!(bytes.len() < 1 << 20, "{}", bytes.len());
        let lookup = Lookup::from_bytes(Path::new(LOOKUP_FILE), bytes).unwrap();
        // One kernel at a time, each is fine.
        assert_eq!(lookup.inputs("k01499").unwrap().unwrap().files.len(), 3);
        let started = std::time::Instant::now();
        let message = crate::error_chain(&lookup.index().unwrap_err());
        assert!(started.elapsed().as_secs() < 5, "{:?}", started.elapsed());
        assert!(
            message.contains(&format!("{MAX_DECODED}-byte cap on a whole index")),
            "{message}"
        );
    }

    /// A function set of 20,000 functions with empty names, named by 1,000 variants: 0 bytes
    /// of names to copy, so nothing was charged, and one lookup (a first call's) made 20
    /// million functions, 1.4 GB. Each function is charged what it holds in memory.
    #[test]
    fn variants_that_copy_a_set_of_many_empty_functions_are_refused() {
        let mut record = index(1).kernels.into_values().next().unwrap();
        record.recipe = None;
        let empty = crate::index::Function {
            computed: Default::default(),
            name: String::new(),
            symbol: String::new(),
            param_sizes: vec![],
        };
        record.variants[0].functions = vec![empty; 20_000];
        let words = codec::Vocabulary::of([&record].into_iter());
        // The record's bytes for 1,000 variants, from those for one and two (the variants are
        // written last, before the skips' count): built without holding 1,000 copies here.
        let one = codec::encode_load("k00000", &record, &words);
        record.variants.push(record.variants[0].clone());
        let two = codec::encode_load("k00000", &record, &words);
        let variant = &two[one.len() - 1..two.len() - 1];
        let head = &one[..one.len() - 1 - variant.len() - 1];
        let mut load = head.to_vec();
        load.extend_from_slice(&[0xe8, 0x07]);
        for _ in 0..1_000 {
            load.extend_from_slice(variant);
        }
        load.push(0);
        record.variants.truncate(1);
        let inputs = codec::encode_inputs(&record);
        let graph = codec::encode_graph(&BTreeMap::new(), &words);
        let meta = serde_json::to_vec(&Meta::of(&index(1))).unwrap();
        let mut table = Vec::new();
        table.extend_from_slice(&0u64.to_le_bytes());
        table.extend_from_slice(&6u32.to_le_bytes());
        table.extend_from_slice(&(load.len() as u32).to_le_bytes());
        table.extend_from_slice(&0u64.to_le_bytes());
        table.extend_from_slice(&(inputs.len() as u32).to_le_bytes());
        table.extend_from_slice(&0u32.to_le_bytes());
        let mut graph_table = Vec::new();
        graph_table.extend_from_slice(&((load.len() + inputs.len()) as u64).to_le_bytes());
        graph_table.extend_from_slice(&(graph.len() as u32).to_le_bytes());
        graph_table.extend_from_slice(&0u32.to_le_bytes());
        let records = [&load[..], &inputs, &graph].concat();
        let bytes = assemble(
            LOOKUP_FORMAT,
            &meta,
            &words.encode(),
            &table,
            &graph_table,
            b"k00000",
            &records,
        );
        assert!(bytes.len() < 400_000, "{}", bytes.len());
        let lookup = Lookup::from_bytes(Path::new(LOOKUP_FILE), bytes).unwrap();
        let started = std::time::Instant::now();
        let message = crate::error_chain(&lookup.record("k00000").unwrap_err());
        assert!(started.elapsed().as_secs() < 2, "{:?}", started.elapsed());
        assert!(message.contains("k00000"), "{message}");
        assert!(
            message.contains("gives its variants more than"),
            "{message}"
        );
    }

    /// The embedded library's `kernels.idx` (the fuzz seed) reads whole, far within the cap.
    #[test]
    fn the_embedded_librarys_index_reads_whole_within_the_cap() {
        let seed =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/lookup/default-library.idx");
        let lookup = Lookup::from_bytes(&seed, std::fs::read(&seed).unwrap()).unwrap();
        let index = lookup.index().unwrap();
        assert_eq!(index.kernels.len(), lookup.len());
        assert_eq!(lookup.index().unwrap(), index);
    }
}
