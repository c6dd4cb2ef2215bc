//! The loader's index, `kernels.idx`: what a first call reads to find one kernel, in time that
//! does not grow with the number of kernels in the bundle.
//!
//! `index.json` is the whole bundle as the build sees it: every kernel's key inputs (for a
//! CUTLASS kernel, hundreds of headers with their digests), variants and skips. A loader that
//! parses it pays for every kernel on every first call (18 MB and ~80 ms at 16,000 variants).
//! `kernels.idx` holds the same records, split so the loader reads one:
//!
//! ```text
//! offset  size  field
//!      0     8  magic  "KWHEELIX"
//!      8     4  format (LOOKUP_FORMAT, little-endian like every number here)
//!     12     4  kernel count N
//!     16     8  meta offset    ─┐ JSON: package, torch, store, dictionary, index format
//!     24     8  meta length    ─┘
//!     32     8  table offset      N entries of 32 bytes, sorted by kernel name (bytes)
//!     40     8  names offset      the names, concatenated
//!     48     8  records offset    per kernel: its load record, then its inputs record
//!     56     8  file length       a cut or padded file is refused
//! table entry: name offset u64, name length u32, load length u32,
//!              record offset u64, inputs length u32, reserved u32 (0)
//! ```
//!
//! A kernel's *load record* is compact JSON of what loading needs: `recipe` (whether the JIT
//! can compile it), `constants`, `variants`, `skipped`. Its *inputs record* is its key inputs
//! (`files`, `entries`, `defines`, flags), read only by the JIT, `dev explain` and tools.
//! Opening reads the header, the meta, the table and the names (tens of bytes per kernel:
//! 250 KB at 4,000 kernels) and refuses the file unless the names are identifiers in strictly
//! increasing order and every span lies end to end in table order, so no two kernels share
//! bytes and work stays bounded by the file's size, whatever it claims. Finding a kernel is a
//! binary search in memory, then one positioned read of its record. Every record is checked
//! as `index.json` is ([`crate::untrusted`]) before it is used.
//!
//! The file is written from the bundle's `index.json` by one function ([`encode`]), so the two
//! never disagree by construction, and `wheel verify` checks that they agree in every wheel.
//! It is deterministic (sorted names, sorted JSON, no times). A reader refuses a format it
//! does not know, naming the format it reads.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::bundle::{read_artifact, read_index, BundleError};
use crate::index::{
    Constant, Index, KernelInputs, KernelRecord, Skip, SourceRecipe, StoredFile, Variant,
};
use crate::target::CudaBuild;
use crate::untrusted::{
    check_kernel, check_stored, open_regular_file, KernelName, Untrusted, MAX_DICTIONARY_SIZE,
    MAX_INDEX_SIZE,
};

/// File name of the loader's index inside a bundle.
pub const LOOKUP_FILE: &str = "kernels.idx";
/// The format this reader reads and this writer writes. Bump it when the layout changes.
pub const LOOKUP_FORMAT: u32 = 1;

const MAGIC: &[u8; 8] = b"KWHEELIX";
const HEADER_LEN: u64 = 64;
const ENTRY_LEN: u64 = 32;
/// Caps on what a header may claim, so a crafted file cannot make the reader allocate.
const MAX_META_LEN: u64 = 1 << 20;
const MAX_KERNELS: u64 = 1 << 24;

/// Everything of the index but its kernels.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    /// The `format` of the `index.json` this was written from.
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

/// What loading one kernel needs.
#[derive(Serialize, Deserialize)]
struct LoadRecord {
    recipe: Option<SourceRecipe>,
    constants: BTreeMap<String, Constant>,
    variants: Vec<Variant>,
    skipped: Vec<Skip>,
}

/// Writes the loader's index for `index`.
pub fn encode(index: &Index) -> Vec<u8> {
    let meta = serde_json::to_vec(&Meta::of(index)).expect("meta serializes");
    let count = index.kernels.len() as u64;
    let meta_offset = HEADER_LEN;
    let table_offset = meta_offset + meta.len() as u64;
    let names_offset = table_offset + count * ENTRY_LEN;
    let mut table = Vec::with_capacity((count * ENTRY_LEN) as usize);
    let mut names = Vec::new();
    let mut records = Vec::new();
    // `index.kernels` is a BTreeMap: its order is the byte order the reader searches in.
    for (name, record) in &index.kernels {
        let load = serde_json::to_vec(&LoadRecord {
            recipe: record.recipe.clone(),
            constants: record.constants.clone(),
            variants: record.variants.clone(),
            skipped: record.skipped.clone(),
        })
        .expect("record serializes");
        let inputs = serde_json::to_vec(&record.inputs).expect("inputs serialize");
        table.extend_from_slice(&(names.len() as u64).to_le_bytes());
        table.extend_from_slice(&(name.len() as u32).to_le_bytes());
        table.extend_from_slice(&(load.len() as u32).to_le_bytes());
        table.extend_from_slice(&(records.len() as u64).to_le_bytes());
        table.extend_from_slice(&(inputs.len() as u32).to_le_bytes());
        table.extend_from_slice(&0u32.to_le_bytes());
        names.extend_from_slice(name.as_bytes());
        records.extend_from_slice(&load);
        records.extend_from_slice(&inputs);
    }
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
        names_offset,
        records_offset,
        length,
    ] {
        out.extend_from_slice(&field.to_le_bytes());
    }
    out.extend_from_slice(&meta);
    out.extend_from_slice(&table);
    out.extend_from_slice(&names);
    out.extend_from_slice(&records);
    out
}

/// An open `kernels.idx`: its header, meta and table read and checked, records read on demand.
#[derive(Debug)]
pub struct Lookup {
    path: PathBuf,
    file: File,
    /// The names section, checked: identifiers, concatenated in strictly increasing order.
    names: String,
    /// One per kernel, in table order.
    entries: Vec<Entry>,
    meta: Meta,
}

/// One table entry, located and checked: its name's bytes in [`Lookup::names`], its records'
/// absolute spans in the file.
#[derive(Debug)]
struct Entry {
    name: std::ops::Range<usize>,
    load: (u64, u32),
    inputs: (u64, u32),
}

impl Lookup {
    /// Opens `path`, reading its header, meta, table and names (tens of bytes per kernel) and
    /// checking them whole: the table is refused unless its names are identifiers in strictly
    /// increasing byte order and its spans lie end to end, in table order, filling their
    /// sections exactly. So no two kernels share bytes, a binary search finds every name the
    /// table lists, and reading every record once reads the file once.
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
        file.read_exact_at(&mut header, 0).map_err(|_| {
            refused(
                path,
                "the loader index",
                &metadata.len().to_string(),
                "is shorter than its 64-byte header",
            )
        })?;
        if &header[..8] != MAGIC {
            return Err(refused(
                path,
                "the loader index's magic",
                &format!("{:?}", String::from_utf8_lossy(&header[..8])),
                "is not KWHEELIX",
            ));
        }
        let u32_at = |at: usize| u32::from_le_bytes(header[at..at + 4].try_into().unwrap());
        let u64_at = |at: usize| u64::from_le_bytes(header[at..at + 8].try_into().unwrap());
        let format = u32_at(8);
        if format != LOOKUP_FORMAT {
            return Err(BundleError::UnsupportedLookup {
                path: path.to_owned(),
                found: format,
                reads: LOOKUP_FORMAT,
            });
        }
        let count = u64::from(u32_at(12));
        let (meta_offset, meta_len) = (u64_at(16), u64_at(24));
        let (table_offset, names_offset, records_offset, length) =
            (u64_at(32), u64_at(40), u64_at(48), u64_at(56));
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
        if count > MAX_KERNELS {
            return Err(bad("the kernel count", count, "is over the cap"));
        }
        if meta_offset != HEADER_LEN
            || meta_len > MAX_META_LEN
            || table_offset != meta_offset + meta_len
            || names_offset != table_offset + count * ENTRY_LEN
            || records_offset < names_offset
            || records_offset > length
        {
            return Err(bad(
                "the loader index's layout",
                length,
                "has sections out of order or out of the file",
            ));
        }
        let mut meta = vec![0u8; meta_len as usize];
        file.read_exact_at(&mut meta, meta_offset)
            .map_err(read_error)?;
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
        // The layout checks above put the table and the names inside the file, whose size is
        // capped: reading them reserves no more than the file holds.
        let mut table = vec![0u8; (count * ENTRY_LEN) as usize];
        file.read_exact_at(&mut table, table_offset)
            .map_err(read_error)?;
        let mut names = vec![0u8; (records_offset - names_offset) as usize];
        file.read_exact_at(&mut names, names_offset)
            .map_err(read_error)?;
        let entries = check_table(path, &table, &names, records_offset, length)?;
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
            names,
            entries,
            meta,
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

    /// Every kernel name, in order: identifiers, checked at open.
    pub fn names(&self) -> Result<Vec<String>, BundleError> {
        Ok(self
            .entries
            .iter()
            .map(|entry| self.names[entry.name.clone()].to_owned())
            .collect())
    }

    /// The record of `kernel` without its key inputs (`inputs` is empty), or `None` when the
    /// bundle has no such kernel.
    pub fn record(&self, kernel: &str) -> Result<Option<KernelRecord>, BundleError> {
        let Some(entry) = self.find(kernel) else {
            return Ok(None);
        };
        let load: LoadRecord = self.json(entry.load)?;
        let record = KernelRecord {
            inputs: KernelInputs::default(),
            recipe: load.recipe,
            constants: load.constants,
            variants: load.variants,
            skipped: load.skipped,
        };
        check_kernel(kernel, &record).map_err(|source| self.refused_by(source))?;
        Ok(Some(record))
    }

    /// The key inputs of `kernel` (for the JIT and `dev explain`), or `None` when the bundle
    /// has no such kernel.
    pub fn inputs(&self, kernel: &str) -> Result<Option<KernelInputs>, BundleError> {
        let Some(entry) = self.find(kernel) else {
            return Ok(None);
        };
        // The recipe decides which input paths must stay under `sources/`: check them together.
        let load: LoadRecord = self.json(entry.load)?;
        let record = KernelRecord {
            inputs: self.json(entry.inputs)?,
            recipe: load.recipe,
            constants: load.constants,
            variants: load.variants,
            skipped: load.skipped,
        };
        check_kernel(kernel, &record).map_err(|source| self.refused_by(source))?;
        Ok(Some(record.inputs))
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

    fn json<T: for<'de> Deserialize<'de>>(&self, span: (u64, u32)) -> Result<T, BundleError> {
        let bytes = self.bytes(span)?;
        serde_json::from_slice(&bytes).map_err(|source| BundleError::InvalidIndex {
            path: self.path.clone(),
            source,
        })
    }

    fn refused_by(&self, source: Untrusted) -> BundleError {
        BundleError::Refused {
            path: self.path.clone(),
            source,
        }
    }
}

/// Checks the whole table against its names section (`names`) and records section
/// (`records_offset..length`): every entry's name follows the previous one's in the names
/// section and is an identifier greater than it; every entry's load and inputs records follow
/// the previous entry's; both sections end where the last entry's spans do; reserved fields
/// are 0. One pass, one comparison per entry: the checks cost what reading the table costs.
fn check_table(
    path: &Path,
    table: &[u8],
    names: &[u8],
    records_offset: u64,
    length: u64,
) -> Result<Vec<Entry>, BundleError> {
    let records_len = length - records_offset;
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
        if u32_at(28) != 0 {
            return Err(entry("has a reserved field that is not 0"));
        }
        if name_offset != name_end || name_len > names.len() as u64 - name_end {
            return Err(entry(&format!(
                "names {name_len} bytes at {name_offset}, not the next name, at {name_end},                  inside the names section ({} bytes)",
                names.len()
            )));
        }
        let total = load_len + inputs_len;
        if record_offset != record_end || total > records_len - record_end {
            return Err(entry(&format!(
                "has records of {total} bytes at {record_offset}, not the next ones, at                  {record_end}, inside the records section ({records_len} bytes)"
            )));
        }
        let name = &names[name_end as usize..(name_end + name_len) as usize];
        let text = std::str::from_utf8(name).unwrap_or("(not UTF-8)");
        KernelName::parse(text).map_err(|source| BundleError::Refused {
            path: path.to_owned(),
            source: source.of(format!("the name of table entry {position}")),
        })?;
        if previous.is_some_and(|previous| previous >= name) {
            return Err(refused(
                path,
                "the name table",
                text,
                &format!(
                    "is out of order at entry {position}: names must be sorted and unique                      (`{}` comes before it)",
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
        });
        name_end += name_len;
        record_end += total;
    }
    if name_end != names.len() as u64 || record_end != records_len {
        return Err(refused(
            path,
            "the loader index's sections",
            &format!("{name_end} + {record_end} bytes"),
            &format!(
                "are not what the table spans: the names section holds {} bytes and the                  records section {records_len}",
                names.len()
            ),
        ));
    }
    Ok(entries)
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

    /// The whole index (`index.json`), for tools and `status()` over every kernel.
    pub fn index(&self) -> Result<Index, BundleError> {
        match &self.source {
            Source::Lookup(_) => read_index(&self.root),
            Source::Index(index) => Ok((**index).clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::{CompilerRecord, INDEX_FORMAT};

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
    /// file looks like when only its table lies.
    fn crafted(entries: &[(u64, u32, u32, u64, u32)], names: &[u8], records: &[u8]) -> Vec<u8> {
        let meta = serde_json::to_vec(&Meta::of(&index(0))).unwrap();
        let table_offset = HEADER_LEN + meta.len() as u64;
        let names_offset = table_offset + entries.len() as u64 * ENTRY_LEN;
        let records_offset = names_offset + names.len() as u64;
        let length = records_offset + records.len() as u64;
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&LOOKUP_FORMAT.to_le_bytes());
        out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
        for field in [
            HEADER_LEN,
            meta.len() as u64,
            table_offset,
            names_offset,
            records_offset,
            length,
        ] {
            out.extend_from_slice(&field.to_le_bytes());
        }
        out.extend_from_slice(&meta);
        for &(name_offset, name_len, load_len, record_offset, inputs_len) in entries {
            out.extend_from_slice(&name_offset.to_le_bytes());
            out.extend_from_slice(&name_len.to_le_bytes());
            out.extend_from_slice(&load_len.to_le_bytes());
            out.extend_from_slice(&record_offset.to_le_bytes());
            out.extend_from_slice(&inputs_len.to_le_bytes());
            out.extend_from_slice(&0u32.to_le_bytes());
        }
        out.extend_from_slice(names);
        out.extend_from_slice(records);
        out
    }

    /// A load record of about `size` bytes (a long `skipped` list), valid JSON of its shape.
    fn big_load_record(size: usize) -> Vec<u8> {
        let skip = r#"{"arch":"sm_90a","cuda":"cu130","reason":"x"}"#;
        let skips = vec![skip; size / (skip.len() + 1)].join(",");
        format!(r#"{{"recipe":null,"constants":{{}},"variants":[],"skipped":[{skips}]}}"#)
            .into_bytes()
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
        let (result, _) = opened(&crafted(&entries, &names[..999 * 6], &b"{}".repeat(1000)));
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
}
