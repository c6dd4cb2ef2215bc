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
//!      8     4  format (LOOKUP_FORMAT, little-endian like every number here)
//!     12     4  kernel count N
//!     16     8  meta offset    ─┐ JSON: package, torch, store, dictionary, index format,
//!     24     8  meta length    ─┘       CUDA builds, and the records' vocabulary
//!     32     8  table offset         N entries of 32 bytes, sorted by kernel name (bytes)
//!     40     8  graph table offset   G entries of 16 bytes, one per distinct include graph
//!     48     8  names offset         the names, concatenated
//!     56     8  records offset       per kernel: its load record, then its inputs record;
//!                                    then every graph record
//!     64     8  file length          a cut or padded file is refused
//!     72     4  graph count G
//!     76     4  reserved (0)
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
//! Opening reads the header, the meta, the tables and the names (tens of bytes per kernel)
//! and refuses the file unless the names are identifiers in strictly increasing order, every
//! span lies end to end in table order (kernels' records, then graphs'), every graph id names
//! a graph and every graph is named: no two kernels share record bytes, and work stays
//! bounded by the file's size, whatever it claims. Finding a kernel is a binary search in
//! memory, then one positioned read of its record. Every record is checked as `index.json`'s
//! is ([`crate::untrusted`]) before it is used.
//!
//! The file is written from the bundle's index by one function ([`encode`]) and read back
//! whole by [`Lookup::index`], which gives that index again, so tools need no `index.json`
//! beside it. It is deterministic (sorted names, sorted vocabulary, no times). A reader
//! refuses a format it does not know, naming the file, the format found and the one it reads.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::bundle::{read_artifact, read_index, BundleError};
use crate::index::{Index, KernelInputs, KernelRecord, StoredFile, Variant};
use crate::target::CudaBuild;
use crate::untrusted::{
    check_index, check_kernel, check_stored, open_regular_file, Untrusted, MAX_DICTIONARY_SIZE,
    MAX_INDEX_SIZE,
};

mod codec;
mod table;
use table::{check_table, Sections};

/// File name of the loader's index inside a bundle.
pub const LOOKUP_FILE: &str = "kernels.idx";
/// The format this reader reads and this writer writes. Bump it when the layout changes.
/// Format 1 held each kernel's records as JSON, key inputs included, once per kernel.
pub const LOOKUP_FORMAT: u32 = 2;

const MAGIC: &[u8; 8] = b"KWHEELIX";
const HEADER_LEN: u64 = 80;
const ENTRY_LEN: u64 = 32;
const GRAPH_ENTRY_LEN: u64 = 16;
/// Caps on what a header may claim, so a crafted file cannot make the reader allocate.
const MAX_META_LEN: u64 = 16 << 20;
const MAX_KERNELS: u64 = 1 << 24;
/// Most bytes of records [`Lookup::index`] decodes, a graph counted once per kernel naming
/// it: the whole index in memory stays proportional to this, whatever the file shares.
const MAX_EXPANDED: u64 = 8 * MAX_INDEX_SIZE;

/// Everything of the index but its kernels.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
        }
    }
}

/// The meta section as stored: the meta and the vocabulary the records name by position.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct MetaSection {
    meta: Meta,
    words: Vec<String>,
}

/// Writes the loader's index for `index`.
pub fn encode(index: &Index) -> Vec<u8> {
    let words = codec::Vocabulary::of(index.kernels.values());
    let meta = serde_json::to_vec(&MetaSection {
        meta: Meta::of(index),
        words: words.words(),
    })
    .expect("meta serializes");
    let count = index.kernels.len() as u64;
    let mut table = Vec::with_capacity((count * ENTRY_LEN) as usize);
    let mut names = Vec::new();
    let mut records = Vec::new();
    // Graphs by first use, in name order: the same index gives the same ids.
    let mut graph_ids: BTreeMap<&BTreeMap<String, String>, u32> = BTreeMap::new();
    let mut graphs: Vec<&BTreeMap<String, String>> = Vec::new();
    // `index.kernels` is a BTreeMap: its order is the byte order the reader searches in.
    for (name, record) in &index.kernels {
        let load = codec::encode_load(record, &words);
        let inputs = codec::encode_inputs(&record.inputs);
        let graph = *graph_ids.entry(&record.inputs.files).or_insert_with(|| {
            graphs.push(&record.inputs.files);
            graphs.len() as u32 - 1
        });
        table.extend_from_slice(&(names.len() as u64).to_le_bytes());
        table.extend_from_slice(&(name.len() as u32).to_le_bytes());
        table.extend_from_slice(&(load.len() as u32).to_le_bytes());
        table.extend_from_slice(&(records.len() as u64).to_le_bytes());
        table.extend_from_slice(&(inputs.len() as u32).to_le_bytes());
        table.extend_from_slice(&graph.to_le_bytes());
        names.extend_from_slice(name.as_bytes());
        records.extend_from_slice(&load);
        records.extend_from_slice(&inputs);
    }
    let mut graph_table = Vec::with_capacity(graphs.len() * GRAPH_ENTRY_LEN as usize);
    for graph in &graphs {
        let bytes = codec::encode_graph(graph);
        graph_table.extend_from_slice(&(records.len() as u64).to_le_bytes());
        graph_table.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        graph_table.extend_from_slice(&0u32.to_le_bytes());
        records.extend_from_slice(&bytes);
    }
    assemble(
        &meta,
        count,
        graphs.len() as u32,
        &table,
        &graph_table,
        &names,
        &records,
    )
}

/// The file of these sections, with a header that locates them.
fn assemble(
    meta: &[u8],
    count: u64,
    graph_count: u32,
    table: &[u8],
    graph_table: &[u8],
    names: &[u8],
    records: &[u8],
) -> Vec<u8> {
    let meta_offset = HEADER_LEN;
    let table_offset = meta_offset + meta.len() as u64;
    let graph_table_offset = table_offset + table.len() as u64;
    let names_offset = graph_table_offset + graph_table.len() as u64;
    let records_offset = names_offset + names.len() as u64;
    let length = records_offset + records.len() as u64;
    let mut out = Vec::with_capacity(length as usize);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&LOOKUP_FORMAT.to_le_bytes());
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
    out.extend_from_slice(&0u32.to_le_bytes());
    for section in [meta, table, graph_table, names, records] {
        out.extend_from_slice(section);
    }
    out
}

/// An open `kernels.idx`: its header, meta and tables read and checked, records read on demand.
#[derive(Debug)]
pub struct Lookup {
    path: PathBuf,
    file: File,
    /// The file's length, checked at open against its header.
    length: u64,
    /// The names section, checked: identifiers, concatenated in strictly increasing order.
    names: String,
    /// One per kernel, in table order.
    entries: Vec<Entry>,
    /// Each graph record's absolute span.
    graphs: Vec<(u64, u32)>,
    meta: Meta,
    words: Vec<String>,
}

/// One table entry, located and checked: its name's bytes in [`Lookup::names`], its records'
/// absolute spans in the file, its graph's id.
#[derive(Debug)]
struct Entry {
    name: std::ops::Range<usize>,
    load: (u64, u32),
    inputs: (u64, u32),
    graph: u32,
}

impl Lookup {
    /// Opens `path`, reading its header, meta, tables and names (tens of bytes per kernel)
    /// and checking them whole: the table is refused unless its names are identifiers in
    /// strictly increasing byte order, its spans and the graphs' lie end to end, in table
    /// order, filling their sections exactly, and its graph ids name every graph and nothing
    /// else. So no two kernels share record bytes, a binary search finds every name the table
    /// lists, and reading every record once reads the file once.
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
                crate::untrusted::resolve_inside(folder, &relative).map_err(read_error)?;
            }
        }
        let file = open_regular_file(path).map_err(read_error)?;
        let metadata = file.metadata().map_err(read_error)?;
        let mut header = [0u8; HEADER_LEN as usize];
        let short = |_| {
            refused(
                path,
                "the loader index",
                &metadata.len().to_string(),
                &format!("is shorter than its {HEADER_LEN}-byte header"),
            )
        };
        // Magic and format first: a file of another format is named as such, whatever its
        // header's length is.
        file.read_exact_at(&mut header[..12], 0).map_err(short)?;
        if &header[..8] != MAGIC {
            return Err(refused(
                path,
                "the loader index's magic",
                &format!("{:?}", String::from_utf8_lossy(&header[..8])),
                "is not KWHEELIX",
            ));
        }
        let format = u32::from_le_bytes(header[8..12].try_into().unwrap());
        if format != LOOKUP_FORMAT {
            return Err(BundleError::UnsupportedLookup {
                path: path.to_owned(),
                found: format,
                reads: LOOKUP_FORMAT,
            });
        }
        file.read_exact_at(&mut header, 0).map_err(short)?;
        let u32_at = |at: usize| u32::from_le_bytes(header[at..at + 4].try_into().unwrap());
        let u64_at = |at: usize| u64::from_le_bytes(header[at..at + 8].try_into().unwrap());
        let count = u64::from(u32_at(12));
        let (meta_offset, meta_len) = (u64_at(16), u64_at(24));
        let (table_offset, graph_table_offset, names_offset, records_offset, length) =
            (u64_at(32), u64_at(40), u64_at(48), u64_at(56), u64_at(64));
        let graph_count = u64::from(u32_at(72));
        let bad =
            |what: &str, value: u64, reason: &str| refused(path, what, &value.to_string(), reason);
        if length != metadata.len() || length > MAX_INDEX_SIZE {
            return Err(bad(
                "the loader index's recorded length",
                length,
                &format!(
                    "is not its size on disk ({}) or is over the cap",
                    metadata.len()
                ),
            ));
        }
        if count > MAX_KERNELS || graph_count > count {
            return Err(bad(
                "the kernel count",
                count,
                &format!("is over the cap, or under the graph count ({graph_count})"),
            ));
        }
        if u32_at(76) != 0 {
            return Err(bad(
                "the loader index's reserved field",
                u64::from(u32_at(76)),
                "is not 0",
            ));
        }
        if meta_offset != HEADER_LEN
            || meta_len > MAX_META_LEN
            || table_offset != meta_offset + meta_len
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
        // The layout checks above put the meta, the tables and the names inside the file,
        // whose size is capped: reading them reserves no more than the file holds.
        let section = |offset: u64, end: u64| -> Result<Vec<u8>, BundleError> {
            let mut bytes = vec![0u8; (end - offset) as usize];
            file.read_exact_at(&mut bytes, offset).map_err(read_error)?;
            Ok(bytes)
        };
        let meta = section(meta_offset, table_offset)?;
        let MetaSection { meta, words } =
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
        let table = section(table_offset, graph_table_offset)?;
        let graph_table = section(graph_table_offset, names_offset)?;
        let names = section(names_offset, records_offset)?;
        let sections = Sections {
            names: &names,
            records_offset,
            length,
        };
        let (entries, graphs) = check_table(path, &table, &graph_table, &sections)?;
        // Every name was checked as an identifier, so the section is ASCII.
        let names = String::from_utf8(names).map_err(|_| {
            refused(
                path,
                "the name table",
                "(not UTF-8)",
                "holds something not a name",
            )
        })?;
        Ok(Lookup {
            path: path.to_owned(),
            file,
            length,
            names,
            entries,
            graphs,
            meta,
            words,
        })
    }

    /// Package, torch pin, store and dictionary.
    pub fn meta(&self) -> &Meta {
        &self.meta
    }

    /// How many kernels the bundle has.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the bundle has no kernel.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// How many distinct include graphs the kernels' inputs name.
    pub fn graph_count(&self) -> usize {
        self.graphs.len()
    }

    /// Every kernel name, in order: identifiers, checked at open.
    pub fn names(&self) -> Result<Vec<String>, BundleError> {
        Ok(self
            .entries
            .iter()
            .map(|entry| self.names[entry.name.clone()].to_owned())
            .collect())
    }

    /// The record of `kernel` without its key inputs (`inputs` is empty), or `None` when the
    /// bundle has no such kernel. Reads its load record only.
    pub fn record(&self, kernel: &str) -> Result<Option<KernelRecord>, BundleError> {
        let Some(entry) = self.find(kernel) else {
            return Ok(None);
        };
        let load = self.bytes(entry.load)?;
        let record = self.decode(kernel, &load, None)?;
        Ok(Some(record))
    }

    /// The key inputs of `kernel` (for the JIT and `dev explain`), or `None` when the bundle
    /// has no such kernel.
    pub fn inputs(&self, kernel: &str) -> Result<Option<KernelInputs>, BundleError> {
        let Some(entry) = self.find(kernel) else {
            return Ok(None);
        };
        // The recipe decides which input paths must stay under `sources/`: check them
        // together. The load and inputs records are adjacent: one read.
        let both = self.bytes((entry.load.0, entry.load.1 + entry.inputs.1))?;
        let graph = self.bytes(self.graphs[entry.graph as usize])?;
        let files = codec::decode_graph(&graph)
            .map_err(|reason| self.bad_record(kernel, "graph", reason))?;
        let (load, inputs) = both.split_at(entry.load.1 as usize);
        let record = self.decode(kernel, load, Some((inputs, files)))?;
        Ok(Some(record.inputs))
    }

    /// The whole index this file was written from, as [`encode`] was given it, checked as
    /// `index.json` is: what tools read when a bundle ships no `index.json`. Reads the file
    /// once and decodes each graph once.
    pub fn index(&self) -> Result<Index, BundleError> {
        let expanded: u64 = self
            .entries
            .iter()
            .map(|entry| {
                u64::from(entry.load.1)
                    + u64::from(entry.inputs.1)
                    + u64::from(self.graphs[entry.graph as usize].1)
            })
            .sum();
        if expanded > MAX_EXPANDED {
            return Err(refused(
                &self.path,
                "the loader index's records, graphs counted once per kernel",
                &format!("{expanded} bytes"),
                &format!("are over the {MAX_EXPANDED}-byte cap on a whole index"),
            ));
        }
        // Capped at open: the length fits the span's `u32`.
        let bytes = self.bytes((0, self.length as u32))?;
        let span = |(offset, length): (u64, u32)| &bytes[offset as usize..][..length as usize];
        let mut graphs: Vec<Option<BTreeMap<String, String>>> = vec![None; self.graphs.len()];
        let mut kernels = BTreeMap::new();
        for entry in &self.entries {
            let name = &self.names[entry.name.clone()];
            let slot = &mut graphs[entry.graph as usize];
            if slot.is_none() {
                let graph = codec::decode_graph(span(self.graphs[entry.graph as usize]))
                    .map_err(|reason| self.bad_record(name, "graph", reason))?;
                *slot = Some(graph);
            }
            let files = slot.clone().unwrap_or_default();
            let record = self.decode(name, span(entry.load), Some((span(entry.inputs), files)))?;
            kernels.insert(name.to_owned(), record);
        }
        let index = Index {
            format: self.meta.format,
            package: self.meta.package.clone(),
            torch: self.meta.torch.clone(),
            store: self.meta.store.clone(),
            dictionary: self.meta.dictionary.clone(),
            kernels,
        };
        check_index(&index).map_err(|source| self.refused_by(source))?;
        Ok(index)
    }

    /// Decodes one kernel's load record and, given them, its inputs record and its graph's
    /// files, checking the result.
    fn decode(
        &self,
        kernel: &str,
        load: &[u8],
        inputs: Option<(&[u8], BTreeMap<String, String>)>,
    ) -> Result<KernelRecord, BundleError> {
        let load = codec::decode_load(load, &self.words)
            .map_err(|reason| self.bad_record(kernel, "load", reason))?;
        let inputs = match inputs {
            None => KernelInputs::default(),
            Some((inputs, files)) => {
                let mut inputs = codec::decode_inputs(inputs)
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

    /// Binary search over the table, checked sorted at open.
    fn find(&self, kernel: &str) -> Option<&Entry> {
        self.entries
            .binary_search_by(|entry| {
                self.names.as_bytes()[entry.name.clone()].cmp(kernel.as_bytes())
            })
            .ok()
            .map(|position| &self.entries[position])
    }

    /// `length` bytes at `offset`: a span checked at open to lie inside the file.
    fn bytes(&self, (offset, length): (u64, u32)) -> Result<Vec<u8>, BundleError> {
        let mut bytes = vec![0u8; length as usize];
        self.file
            .read_exact_at(&mut bytes, offset)
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

/// The whole index of a bundle directory, of its `kernels.idx` or of an `index.json`: read
/// from `kernels.idx` wherever the bundle has one (a wheel need ship nothing else), else from
/// `index.json` (a bundle written before `kernels.idx` existed).
pub fn read_bundle_index(path: &Path) -> Result<Index, BundleError> {
    let lookup = if path.is_dir() {
        let lookup = path.join(LOOKUP_FILE);
        // A link in its place is opened (and refused when it leads out).
        std::fs::symlink_metadata(&lookup)
            .is_ok()
            .then(|| crate::bundle::bundle_file(path, LOOKUP_FILE))
            .transpose()?
    } else {
        (path.file_name() == Some(LOOKUP_FILE.as_ref())).then(|| path.to_owned())
    };
    match lookup {
        Some(lookup) => Lookup::open(&lookup)?.index(),
        None => read_index(path),
    }
}

/// Writes `index.json` into a copy of a bundle that ships only `kernels.idx` (a wheel's,
/// extracted), decoded from it, so readers of the whole bundle open it; returns whether it
/// wrote one. A bundle with an `index.json` is left as it is.
pub fn restore_index_json(root: &Path) -> Result<bool, BundleError> {
    let index_json = root.join(crate::bundle::INDEX_FILE);
    if std::fs::symlink_metadata(&index_json).is_ok()
        || std::fs::symlink_metadata(root.join(LOOKUP_FILE)).is_err()
    {
        return Ok(false);
    }
    let index = read_bundle_index(root)?;
    std::fs::write(&index_json, index.to_json()).map_err(|source| BundleError::Write {
        path: index_json.clone(),
        source,
    })?;
    Ok(true)
}

/// The runtime's view of a bundle: its meta at once, one kernel at a time after that. Reads
/// `kernels.idx`; a bundle written before it existed is read from `index.json` whole.
#[derive(Debug)]
pub struct Catalog {
    root: PathBuf,
    source: Source,
    /// Read from `kernels.idx`'s header, or made from the whole index once.
    meta: Meta,
}

#[derive(Debug)]
enum Source {
    Lookup(Box<Lookup>),
    Index(Box<Index>),
}

impl Catalog {
    /// Opens the bundle at `root`: the loader index's header and meta only.
    pub fn open(root: impl Into<PathBuf>) -> Result<Catalog, BundleError> {
        let root = root.into();
        let lookup = root.join(LOOKUP_FILE);
        // A link in its place is opened (and refused when it leads out), never taken for
        // "no loader index".
        let (source, meta) = if std::fs::symlink_metadata(&lookup).is_ok() {
            let lookup = Lookup::open(&crate::bundle::bundle_file(&root, LOOKUP_FILE)?)?;
            let meta = lookup.meta().clone();
            (Source::Lookup(Box::new(lookup)), meta)
        } else {
            let index = read_index(&root)?;
            let meta = Meta::of(&index);
            (Source::Index(Box::new(index)), meta)
        };
        Ok(Catalog { root, source, meta })
    }

    /// The bundle's root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Package, torch pin, store, dictionary and CUDA builds.
    pub fn meta(&self) -> &Meta {
        &self.meta
    }

    /// Every kernel name, in order.
    pub fn names(&self) -> Result<Vec<String>, BundleError> {
        match &self.source {
            Source::Lookup(lookup) => lookup.names(),
            Source::Index(index) => Ok(index.kernels.keys().cloned().collect()),
        }
    }

    /// The record of `kernel` without its key inputs, or `None` when there is none.
    pub fn record(&self, kernel: &str) -> Result<Option<KernelRecord>, BundleError> {
        match &self.source {
            Source::Lookup(lookup) => lookup.record(kernel),
            Source::Index(index) => Ok(index.kernels.get(kernel).map(|record| KernelRecord {
                inputs: KernelInputs::default(),
                ..record.clone()
            })),
        }
    }

    /// The key inputs of `kernel`, or `None` when there is none.
    pub fn inputs(&self, kernel: &str) -> Result<Option<KernelInputs>, BundleError> {
        match &self.source {
            Source::Lookup(lookup) => lookup.inputs(kernel),
            Source::Index(index) => Ok(index.kernels.get(kernel).map(|r| r.inputs.clone())),
        }
    }

    /// Reads, decompresses and verifies the artifact of one variant of `kernel` (and the
    /// dictionary it needs, verified too).
    pub fn read_artifact(&self, kernel: &str, variant: &Variant) -> Result<Vec<u8>, BundleError> {
        read_artifact(&self.root, self.meta().dictionary.as_ref(), kernel, variant)
    }

    /// The whole index, for tools and `status()` over every kernel: decoded from
    /// `kernels.idx`, which holds all of it.
    pub fn index(&self) -> Result<Index, BundleError> {
        match &self.source {
            Source::Lookup(lookup) => lookup.index(),
            Source::Index(index) => Ok((**index).clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::{CompilerRecord, Constant, Skip, SourceRecipe, INDEX_FORMAT};

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
        bytes[8..12].copy_from_slice(&7u32.to_le_bytes());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOOKUP_FILE);
        std::fs::write(&path, bytes).unwrap();
        let message = Lookup::open(&path).unwrap_err().to_string();
        assert!(message.contains("format 7"), "{message}");
        assert!(
            message.contains(&format!("reads format {LOOKUP_FORMAT}")),
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
        // A table entry pointing past the end: refused at open, never read.
        let mut bytes = good.clone();
        let table = u64::from_le_bytes(bytes[32..40].try_into().unwrap()) as usize;
        for entry in 0..40 {
            let at = table + entry * 32 + 16;
            bytes[at..at + 8].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
        }
        std::fs::write(&path, bytes).unwrap();
        let message = crate::error_chain(&Lookup::open(&path).unwrap_err());
        assert!(message.contains("refused"), "{message}");
        // A record whose kernel name would leave the bundle is refused like `index.json`'s.
        let mut crafted = index(1);
        let record = crafted.kernels.remove("k00000").unwrap();
        crafted.kernels.insert("../escape".to_owned(), record);
        std::fs::write(&path, encode(&crafted)).unwrap();
        assert!(Lookup::open(&path).is_err());
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
        let meta = serde_json::to_vec(&MetaSection {
            meta: Meta::of(&index(0)),
            words: Vec::new(),
        })
        .unwrap();
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
        let count = entries.len() as u64;
        let graph_count = graphs.len() as u32;
        assemble(
            &meta,
            count,
            graph_count,
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
        let result = Lookup::open(&path);
        (result, started.elapsed())
    }

    /// Issue case 7: a 1.1 MB file whose 1,000 entries all point at the same 1 MB record cost
    /// 2 GiB once every kernel was read (`status()`); a 1.3 MB one whose records overlap cost
    /// 6.3 GB and 31 s. Both are refused at open, in milliseconds, having read the table once.
    #[test]
    fn kernels_idx_with_overlapping_spans_is_refused_at_open() {
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

    /// Issue case 7: 6,000 names out of order made `status()` quadratic (24 s, 396 MB of
    /// error text for the names a binary search missed). Refused at open, with a short message.
    #[test]
    fn kernels_idx_with_an_unsorted_name_table_is_refused_at_open() {
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
    /// checked as a kernel name at open, so no listing can hold one.
    #[test]
    fn kernels_idx_names_with_a_slash_are_refused_at_open() {
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
                name: "scale<float>".into(),
                symbol: "_Z5scaleIfEvPT_".into(),
                param_sizes: vec![8, 4],
            }];
            record.variants.push(second);
            record.skipped.push(Skip {
                arch: "sm_90a".parse().unwrap(),
                cuda: "cu129".parse().unwrap(),
                reason: format!("no toolchain for kernel {n}"),
            });
        }
        index
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
        let one_graph = codec::encode_graph(&rich_index(1, 1).kernels["k00000"].inputs.files);
        assert!(one_graph.len() > 2000, "{}", one_graph.len());
        assert!(
            apart.len() - shared.len() >= 999 * one_graph.len(),
            "{} vs {}",
            apart.len(),
            shared.len()
        );
        let record = &rich_index(1, 1).kernels["k00000"];
        let words = codec::Vocabulary::of(std::iter::once(record));
        let load = codec::encode_load(record, &words);
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
        assert!(message.contains("reads format 2"), "{message}");
        // A newer one, even one too short for this format's header, is named by its format.
        bytes[8..12].copy_from_slice(&3u32.to_le_bytes());
        let message = opened(&bytes[..12]).0.unwrap_err().to_string();
        assert!(message.contains("has format 3"), "{message}");
    }

    #[test]
    fn graph_tables_that_lie_are_refused_at_open() {
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
    /// the whole index is refused by what it would expand to, before anything is decoded.
    #[test]
    fn a_graph_shared_past_the_cap_is_refused_whole_but_read_one_kernel_at_a_time() {
        let mut files = BTreeMap::new();
        for n in 0..20_000 {
            files.insert(format!("h/{n:040}.cuh"), crate::key::sha256_hex(b"x"));
        }
        let mut index = index(1100);
        for record in index.kernels.values_mut() {
            record.inputs.files = files.clone();
            record.recipe = None;
        }
        let bytes = encode(&index);
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
        let (offset, length) = lookup.entries[1].load;
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
}
