//! The on-disk bundle (`_prebuilt/`) and its read side.
//!
//! ```text
//! _prebuilt/                         layout version: index `format` (see index::INDEX_FORMAT)
//! ├── index.json                     kernels, variants, skips, constants (sorted JSON)
//! ├── dictionary.zdict               zstd dictionary trained on this bundle's cubins (optional)
//! ├── artifacts/
//! │   └── 5a/                        first two hex digits of the digest
//! │       └── 5a0d…e1.cubin.zst      one zstd frame per cubin, named by the cubin's sha256
//! └── sources/                       the kernels' include graphs, for the JIT fallback
//!     └── layernorm/layernorm.cu     by stable path
//! ```
//!
//! Every artifact is its own zstd frame (no solid archive), so a loader decompresses only
//! the cubin it picked, after at most one other frame: the raw-content prefix its record names
//! by sha256 ([`StoredFile::dictionary`]), which is either a family dictionary under
//! `dictionaries/` (index format 3) or, from format 4, another shipped cubin whose own
//! artifact is a plain frame, so a reference costs no byte of its own ([`read_prefix`]).
//! Identical cubins share one file. Nothing read from an artifact is handed out before its
//! sha256 matches the index.
//!
//! An index is untrusted input: [`parse_index`] checks every kernel name, path, digest and
//! size in it ([`crate::untrusted::check_index`]) before anything joins a path, only regular
//! files are read, never past a cap, and no file of the bundle (`index.json`, `kernels.idx`,
//! an artifact, a dictionary) is reached through `..` or a symbolic link that leads out of it.
//!
//! Work is bounded by what the index records, not by how often it names a file: an opened
//! [`Bundle`] decodes each artifact file once however many variants share it (their digests
//! and sizes must agree, [`crate::untrusted::check_index`]), checks its frame's declared size
//! once, and never decodes more bytes in all than the sizes its index records for its distinct
//! artifacts add up to. [`Bundle::extract_to`] writes a shared artifact once and links the
//! other variants' files to it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use crate::cache::ArtifactCache;
use crate::index::{
    ArtifactLocation, Index, StoredFile, Variant, INDEX_FORMAT, SKIP_KIND_INDEX_FORMAT,
};
use crate::key::sha256_hex;
use crate::target::Arch;
use crate::untrusted::{
    check_index, check_stored, check_stored_as, read_regular_file, refusal, resolve_inside,
    ArtifactPath, Digest, KernelName, Untrusted, MAX_ARTIFACT_SIZE, MAX_DICTIONARY_SIZE,
    MAX_INDEX_SIZE,
};

/// At most this many decoded bytes of shared artifacts and dictionaries are kept by an open
/// [`Bundle`] for the variants still to read them; past it, a re-read decodes again, and that
/// counts against the bundle's decode budget.
const MAX_HELD_BYTES: u64 = 512 << 20;

mod frames;
pub(crate) use frames::open_inside;
pub(crate) use frames::read_prefix_from;
use frames::{decompress_declared, new_context, with_kept_context, ZSTD_DICTIONARY_MAGIC};
pub use frames::{read_inside, read_prefix};
mod list;
pub use list::{
    list_bundle, BundleListing, ModuleListing, ModuleSkipListing, ModuleVariantListing,
};
mod reads;
use reads::{link_atomically, Reads, Reuse};
mod stream;
pub use stream::stream_stored;
use stream::write_streamed;

/// File name of the index inside a bundle.
pub const INDEX_FILE: &str = "index.json";
/// File name of the zstd dictionary inside a bundle.
pub const DICTIONARY_FILE: &str = "dictionary.zdict";
/// Directory of the compressed cubins.
pub const ARTIFACTS_DIR: &str = "artifacts";
/// Directory of the shipped kernel sources.
pub const SOURCES_DIR: &str = "sources";

/// The stored path of an artifact with this digest, relative to the bundle root. Meant for
/// a [`crate::untrusted::Digest`]; any other text still gives a path (never a panic), which
/// [`ArtifactPath::parse`] judges before it is used.
pub fn artifact_path(digest: &str) -> String {
    // Pushed, not `format!`ed: decoding a kernel's record builds one per variant.
    let shard = digest.get(..2).unwrap_or(digest);
    let mut path = String::with_capacity(ARTIFACTS_DIR.len() + shard.len() + digest.len() + 12);
    for part in [ARTIFACTS_DIR, "/", shard, "/", digest, ".cubin.zst"] {
        path.push_str(part);
    }
    path
}

impl StoredFile {
    /// The record of a plain artifact (a zstd frame of `stored_size` bytes, no family
    /// dictionary) whose content of `size` bytes has sha256 `digest`, at its
    /// [`artifact_path`].
    pub fn artifact(digest: String, size: u64, stored_size: u64) -> Self {
        StoredFile {
            path: artifact_path(&digest),
            digest,
            size,
            stored_size,
            dictionary: None,
        }
    }
}

/// The bundle's directory inside a kernel library's Python package.
pub const PREBUILT_DIR: &str = "_prebuilt";

/// A failure reading a bundle.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// A file of the bundle could not be read.
    #[error("cannot read `{}`", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The index is not valid JSON of the expected shape.
    #[error("invalid bundle index `{}`", path.display())]
    InvalidIndex {
        /// The index file.
        path: PathBuf,
        /// The cause, with line and column.
        #[source]
        source: serde_json::Error,
    },
    /// The index names a file outside the bundle, a digest that is not a sha256, a kernel
    /// name that is not an identifier, or a size over a cap.
    #[error("bundle index `{}` is refused", path.display())]
    Refused {
        /// The index file.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: Untrusted,
    },
    /// The index was written by a newer or older format.
    #[error(
        "bundle index `{}` has format {found}, this kwheel reads formats {INDEX_FORMAT} to {SKIP_KIND_INDEX_FORMAT}: rebuild the bundle with this version",
        path.display()
    )]
    UnsupportedFormat {
        /// The index file.
        path: PathBuf,
        /// The format found.
        found: u32,
    },
    /// A file could not be written (extraction).
    #[error("cannot write `{}`", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The loader's index was written by a newer or older format.
    #[error(
        "loader index `{}` has format {found}; this kwheel reads formats {oldest} to {reads}: install the kwheel the bundle was built with, or rebuild the bundle",
        path.display()
    )]
    UnsupportedLookup {
        /// The file.
        path: PathBuf,
        /// The format found.
        found: u32,
        /// The oldest format this reader reads.
        oldest: u32,
        /// The newest format this reader reads.
        reads: u32,
    },
    /// An artifact's stored bytes do not decompress.
    #[error("artifact of `{kernel}` ({variant}) at `{}` is corrupt", path.display())]
    Corrupt {
        /// The kernel.
        kernel: String,
        /// The variant label (`cu129/sm_90a`).
        variant: String,
        /// The stored file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// An artifact's content does not match the digest the index records.
    #[error(
        "artifact of `{kernel}` ({variant}) failed verification: expected sha256 {expected}, got {actual} (`{}`)",
        path.display()
    )]
    DigestMismatch {
        /// The kernel.
        kernel: String,
        /// The variant label (`cu129/sm_90a`).
        variant: String,
        /// The stored file.
        path: PathBuf,
        /// The digest the index records.
        expected: String,
        /// The digest of the bytes found.
        actual: String,
    },
}

/// No installed package has a bundle under the name given.
#[derive(Debug, thiserror::Error)]
#[error(
    "no installed package `{package}` with a `_prebuilt/` bundle in {}; give the bundle \
     directory instead",
    searched_list(searched)
)]
pub struct PackageNotFound {
    /// The name given.
    pub package: String,
    /// The site-packages directories searched.
    pub searched: Vec<PathBuf>,
}

/// The file extension of an extracted artifact: `ptx` for a `compute_XY` target, else `cubin`.
fn extension(arch: Arch) -> &'static str {
    if arch.is_ptx() {
        "ptx"
    } else {
        "cubin"
    }
}

/// An opened bundle: its index, and access to its verified artifacts.
#[derive(Debug)]
pub struct Bundle {
    root: PathBuf,
    index: Index,
    reads: Mutex<Reads>,
}

impl Bundle {
    /// Opens the bundle at `root`, reading and checking its index.
    pub fn open(root: impl Into<PathBuf>) -> Result<Bundle, BundleError> {
        let root = root.into();
        let path = bundle_file(&root, INDEX_FILE)?;
        let text =
            read_regular_file(&path, MAX_INDEX_SIZE).map_err(|source| BundleError::Read {
                path: path.clone(),
                source,
            })?;
        let index = parse_index(&path, &text)?;
        let reads = Mutex::new(Reads::of(&index));
        Ok(Bundle { root, index, reads })
    }

    /// The bundle at `root` with an index read and checked elsewhere: decoded from the
    /// bundle's `kernels.idx` (`lookup::open_bundle`), all a wheel ships.
    pub fn with_index(root: impl Into<PathBuf>, index: Index) -> Bundle {
        let reads = Mutex::new(Reads::of(&index));
        Bundle {
            root: root.into(),
            index,
            reads,
        }
    }

    /// The bundle's root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The bundle's index.
    pub fn index(&self) -> &Index {
        &self.index
    }

    /// Reads, decompresses and verifies the cubin of one variant of `kernel`. An artifact file
    /// that several variants share is decoded once: the others get its bytes (or its refusal)
    /// without decoding again.
    pub fn read_artifact(&self, kernel: &str, variant: &Variant) -> Result<Vec<u8>, BundleError> {
        match self.reuse(kernel, variant, true)? {
            Reuse::Bytes(bytes) => Ok(bytes),
            Reuse::Verified => self.decode(kernel, variant, true, false),
            Reuse::Decode(charged) => self.decode(kernel, variant, true, charged),
        }
    }

    /// Verifies the cubin of one variant of `kernel` as [`Bundle::read_artifact`] reads it,
    /// keeping nothing: `wheel verify`'s read. A file that several variants share is decoded
    /// once, and its outcome answers for the others.
    pub fn verify_artifact(&self, kernel: &str, variant: &Variant) -> Result<(), BundleError> {
        match self.reuse(kernel, variant, false)? {
            Reuse::Verified | Reuse::Bytes(_) => Ok(()),
            Reuse::Decode(charged) => self.stream(kernel, variant, charged, &mut std::io::sink()),
        }
    }
}

impl Bundle {
    /// Writes every artifact, verified, as `root/<kernel>/<build>/<arch>.cubin` (`<arch>.ptx`
    /// for PTX), and every extension module as `root/modules/<name>/<build>/<cpu>.so`; the
    /// paths written, relative to `root`. Kernel names are checked identifiers
    /// (one path component each), so nothing lands outside `root`. An artifact that several
    /// variants share is decoded and written once; the other variants' files are hard links
    /// to it (copies where the file system has no links).
    pub fn extract_to(&self, root: &Path) -> Result<Vec<PathBuf>, BundleError> {
        let mut written = Vec::new();
        let mut first: BTreeMap<&str, PathBuf> = BTreeMap::new();
        for (kernel, record) in &self.index.kernels {
            let kernel_dir = KernelName::parse(kernel).map_err(|source| BundleError::Refused {
                path: self.root.join(INDEX_FILE),
                source,
            })?;
            for variant in &record.variants {
                let relative = Path::new(kernel_dir.as_str())
                    .join(variant.cuda.to_string())
                    .join(format!("{}.{}", variant.arch, extension(variant.arch)));
                let path = root.join(&relative);
                let write_error = |source| BundleError::Write {
                    path: path.clone(),
                    source,
                };
                match first.get(variant.artifact.path.as_str()) {
                    Some(earlier) => {
                        // Same file, so same digest and size (the index was checked): take
                        // the variant's turn without decoding, then link.
                        match self.reuse(kernel, variant, false)? {
                            Reuse::Decode(charged) => write_streamed(&path, |file| {
                                self.stream(kernel, variant, charged, file)
                            })?,
                            Reuse::Verified | Reuse::Bytes(_) => {
                                link_atomically(earlier, &path).map_err(write_error)?;
                            }
                        }
                    }
                    None => {
                        // Inflated straight into the file, never held; the other variants of
                        // this file link to it. Verified earlier (by another call) is decoded
                        // again, as the caller's own repeat.
                        let charged = match self.reuse(kernel, variant, false)? {
                            Reuse::Decode(charged) => charged,
                            Reuse::Verified | Reuse::Bytes(_) => false,
                        };
                        write_streamed(&path, |file| self.stream(kernel, variant, charged, file))?;
                        first.insert(&variant.artifact.path, path.clone());
                    }
                }
                written.push(relative);
            }
        }
        for (name, record) in &self.index.modules {
            let module_dir = KernelName::parse(name).map_err(|source| BundleError::Refused {
                path: self.root.join(INDEX_FILE),
                source,
            })?;
            for variant in &record.variants {
                // `modules/<name>/<cuda>/<cpu>.so`: the module as a plain shared library,
                // its bytes verified against the index's sha256 as the loader reads them.
                let relative = Path::new(MODULES_DIR)
                    .join(module_dir.as_str())
                    .join(variant.cuda.to_string())
                    .join(format!("{}.so", variant.cpu));
                let bytes = read_stored(
                    &self.root,
                    &variant.artifact,
                    FrameDictionary::None,
                    name,
                    &variant.label(),
                )?;
                write_streamed(&root.join(&relative), |file| {
                    std::io::Write::write_all(file, &bytes).map_err(|source| BundleError::Write {
                        path: root.join(&relative),
                        source,
                    })
                })?;
                written.push(relative);
            }
        }
        Ok(written)
    }
}

/// The folder `bundle extract` writes extension modules under, beside the kernels' folders
/// (a kernel named `modules` writes `.cubin`/`.ptx` files there, never `.so` ones).
pub const MODULES_DIR: &str = "modules";

/// The file `name` at the top of the bundle at `root`, refused when a symbolic link leads it
/// out of the bundle (docs/security.md): `index.json`, `kernels.idx`.
pub fn bundle_file(root: &Path, name: &str) -> Result<PathBuf, BundleError> {
    let refused = |source| BundleError::Refused {
        path: root.join(name),
        source,
    };
    let relative = ArtifactPath::parse(name).map_err(refused)?;
    resolve_inside(root, &relative).map_err(|source| BundleError::Read {
        path: relative.join_to(root),
        source,
    })
}

/// Parses an index, refusing formats this reader does not know and anything
/// [`check_index`] refuses.
pub fn parse_index(path: &Path, bytes: &[u8]) -> Result<Index, BundleError> {
    let refused = |source| BundleError::Refused {
        path: path.to_owned(),
        source,
    };
    if bytes.len() as u64 > MAX_INDEX_SIZE {
        return Err(refused(Untrusted {
            what: "the index's size".into(),
            value: bytes.len().to_string(),
            reason: format!("is over the {MAX_INDEX_SIZE}-byte cap"),
        }));
    }
    #[derive(serde::Deserialize)]
    struct FormatOnly {
        format: u32,
    }
    let format: FormatOnly =
        serde_json::from_slice(bytes).map_err(|source| BundleError::InvalidIndex {
            path: path.to_owned(),
            source,
        })?;
    if !(INDEX_FORMAT..=SKIP_KIND_INDEX_FORMAT).contains(&format.format) {
        return Err(BundleError::UnsupportedFormat {
            path: path.to_owned(),
            found: format.format,
        });
    }
    let invalid = |source| BundleError::InvalidIndex {
        path: path.to_owned(),
        source,
    };
    let index: Index = if format.format < SKIP_KIND_INDEX_FORMAT {
        // Its skips have no `kind`: give each the one its reason was written with.
        let mut index: serde_json::Value = serde_json::from_slice(bytes).map_err(invalid)?;
        crate::index::kind_legacy_skips(&mut index);
        serde_json::from_value(index).map_err(invalid)?
    } else {
        serde_json::from_slice(bytes).map_err(invalid)?
    };
    check_index(&index).map_err(refused)?;
    Ok(index)
}

/// Where `stored` lives under `root`, refused when its record is unsafe (a path leading out,
/// a size over `cap`) or a symbolic link on the way leads out of `root`.
fn stored_path(
    root: &Path,
    stored: &StoredFile,
    cap: u64,
    what: &str,
) -> Result<PathBuf, BundleError> {
    let refused = |source| BundleError::Refused {
        path: root.join(INDEX_FILE),
        source,
    };
    check_stored(stored, cap, what).map_err(refused)?;
    let relative = ArtifactPath::parse(&stored.path).map_err(refused)?;
    resolve_inside(root, &relative).map_err(|source| BundleError::Read {
        path: relative.join_to(root),
        source,
    })
}

/// The checked path of `kernel`'s `variant`'s stored artifact under `root`.
fn artifact_file(
    root: &Path,
    stored: &StoredFile,
    kernel: &str,
    variant: &str,
) -> Result<PathBuf, BundleError> {
    stored_path(
        root,
        stored,
        MAX_ARTIFACT_SIZE,
        &format!("`{kernel}` ({variant})"),
    )
}

/// The path and bytes of `kernel`'s `variant`'s stored artifact under `root`, its record
/// checked as [`stored_path`] checks it and the file read as [`read_inside`] reads it.
fn read_artifact_file(
    root: &Path,
    stored: &StoredFile,
    kernel: &str,
    variant: &str,
) -> Result<(PathBuf, Vec<u8>), BundleError> {
    let refused = |source| BundleError::Refused {
        path: root.join(INDEX_FILE),
        source,
    };
    // The name is built only for a refusal's message: this runs on every load.
    let what = || format!("`{kernel}` ({variant})");
    check_stored_as(stored, MAX_ARTIFACT_SIZE, &what).map_err(refused)?;
    let relative = ArtifactPath::parse(&stored.path).map_err(refused)?;
    read_inside(root, &relative, MAX_ARTIFACT_SIZE)
}

/// The error of `kernel`'s `variant`, whose frame at `path` does not decode.
fn corrupt_artifact<'a>(
    kernel: &'a str,
    variant: &'a str,
    path: &'a Path,
) -> impl Fn(std::io::Error) -> BundleError + 'a {
    move |source| BundleError::Corrupt {
        kernel: kernel.to_owned(),
        variant: variant.to_owned(),
        path: path.to_owned(),
        source,
    }
}

/// Reads a stored artifact under `root`, decompresses it and verifies it against `stored`.
pub fn read_stored(
    root: &Path,
    stored: &StoredFile,
    dictionary: FrameDictionary<'_>,
    kernel: &str,
    variant: &str,
) -> Result<Vec<u8>, BundleError> {
    let (path, compressed) = read_artifact_file(root, stored, kernel, variant)?;
    let corrupt = corrupt_artifact(kernel, variant, &path);
    let bytes = match dictionary {
        FrameDictionary::None => decompress_bounded(&compressed, None, stored.size),
        FrameDictionary::Trained(dictionary) => {
            decompress_bounded(&compressed, Some(dictionary), stored.size)
        }
        FrameDictionary::Prefix(prefix) => decompress_with_prefix(&compressed, prefix, stored.size),
    }
    .map_err(corrupt)?;
    verify(&bytes, stored, &path, kernel, variant)?;
    Ok(bytes)
}

/// Reads one variant's artifact from the bundle at `root` with whichever dictionary its frame
/// needs (`trained`: the bundle's trained dictionary, when it has one), every file verified:
/// the tools' read, which names a bad dictionary file. The loader keeps dictionaries instead.
pub fn read_artifact(
    root: &Path,
    trained: Option<&StoredFile>,
    kernel: &str,
    variant: &Variant,
) -> Result<Vec<u8>, BundleError> {
    read_artifact_with(
        root,
        kernel,
        variant,
        |digest, label| read_prefix(root, digest, true, kernel, label),
        |label| {
            trained
                .map(|stored| read_dictionary(root, stored, kernel, label))
                .transpose()
        },
    )
}

/// [`read_artifact`] with the dictionaries from `prefix(digest, label)` (a family
/// dictionary's raw content) and `trained(label)` (the bundle's trained one, if any), which
/// may keep what they read: the one choice of the dictionary a variant's frame needs.
pub fn read_artifact_with<P: AsRef<[u8]>, T: AsRef<[u8]>>(
    root: &Path,
    kernel: &str,
    variant: &Variant,
    prefix: impl FnOnce(&str, &str) -> Result<P, BundleError>,
    trained: impl FnOnce(&str) -> Result<Option<T>, BundleError>,
) -> Result<Vec<u8>, BundleError> {
    let label = variant.label();
    let read = |dictionary| read_stored(root, &variant.artifact, dictionary, kernel, &label);
    match &variant.artifact.dictionary {
        Some(digest) => read(FrameDictionary::Prefix(prefix(digest, &label)?.as_ref())),
        None => match trained(&label)? {
            Some(bytes) => read(FrameDictionary::Trained(bytes.as_ref())),
            None => read(FrameDictionary::None),
        },
    }
}

/// What an artifact's zstd frame was compressed against.
#[derive(Clone, Copy, Debug)]
pub enum FrameDictionary<'d> {
    /// Nothing: a plain frame.
    None,
    /// The bundle's trained zstd dictionary (`dictionary.zdict`, bundles of index format 1
    /// and 2).
    Trained(&'d [u8]),
    /// The raw content of its family's dictionary (`dictionaries/…`, index format 3): the
    /// frame's matches reach back into it as into a prefix.
    Prefix(&'d [u8]),
}

/// Decompresses one zstd frame compressed against the raw-content `prefix`. The frame must
/// declare its content size, and at most `size` (the recorded size, at most
/// [`MAX_ARTIFACT_SIZE`]) before anything is allocated; the window is capped, so a crafted
/// frame cannot make the decoder allocate more.
pub fn decompress_with_prefix(
    compressed: &[u8],
    prefix: &[u8],
    size: u64,
) -> std::io::Result<Vec<u8>> {
    use zstd::zstd_safe;
    let invalid = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
    let zstd = |code| invalid(zstd_safe::get_error_name(code).to_owned());
    let declared = match zstd_safe::get_frame_content_size(compressed) {
        Ok(Some(declared)) => declared,
        _ => return Err(invalid("the frame does not declare its size".to_owned())),
    };
    let limit = size.min(MAX_ARTIFACT_SIZE);
    if declared > limit {
        return Err(invalid(format!(
            "the frame declares {declared} bytes, more than the {limit} recorded"
        )));
    }
    let mut bytes = Vec::with_capacity(declared as usize);
    // Content that starts like a zstd dictionary would be read as one, not as raw content:
    // such a prefix takes a fresh context that is told it is a prefix.
    let decoded = if prefix.get(..4) == Some(&ZSTD_DICTIONARY_MAGIC[..]) {
        let mut context = new_context()?;
        context.ref_prefix(prefix).map_err(zstd)?;
        context.decompress(&mut bytes, compressed).map_err(zstd)?
    } else {
        // Raw content is only referenced, never copied (ZSTD_decompress_usingDict).
        with_kept_context(|context| {
            context
                .decompress_using_dict(&mut bytes, compressed, prefix)
                .map_err(zstd)
        })?
    };
    if decoded as u64 != declared {
        return Err(invalid(format!(
            "the frame declares {declared} bytes but holds {decoded}"
        )));
    }
    Ok(bytes)
}

/// Directory of the family dictionaries.
pub const DICTIONARIES_DIR: &str = "dictionaries";

/// The stored path of the family dictionary whose raw content has sha256 `digest`.
pub fn dictionary_path(digest: &str) -> String {
    format!(
        "{DICTIONARIES_DIR}/{}/{digest}.zst",
        digest.get(..2).unwrap_or(digest)
    )
}

/// Where the prefix with raw-content sha256 `digest` is stored in the bundle at `root`, relative
/// to it: a dictionary file (index format 3), else the artifact of the shipped cubin with that
/// digest (format 4), whose frame is plain; `None` when neither is a file. Both are one plain
/// zstd frame of the same bytes, so a reader need not know which it found.
pub fn prefix_path(root: &Path, digest: &str) -> Option<String> {
    [dictionary_path(digest), artifact_path(digest)]
        .into_iter()
        .find(|relative| root.join(relative).is_file())
}

/// Reads and verifies the bundle's zstd dictionary; `label` names the variant that needs it.
pub fn read_dictionary(
    root: &Path,
    dictionary: &StoredFile,
    kernel: &str,
    label: &str,
) -> Result<Vec<u8>, BundleError> {
    let path = stored_path(root, dictionary, MAX_DICTIONARY_SIZE, "the dictionary")?;
    let bytes =
        read_regular_file(&path, MAX_DICTIONARY_SIZE).map_err(|source| BundleError::Read {
            path: path.clone(),
            source,
        })?;
    verify(
        &bytes,
        dictionary,
        &path,
        kernel,
        &format!("{label} dictionary"),
    )?;
    Ok(bytes)
}

/// Decompresses one zstd frame, stopping one byte past `size` (the recorded size, at most
/// [`MAX_ARTIFACT_SIZE`]): a frame that claims or holds more is never inflated whole, and
/// "longer than recorded" becomes a digest mismatch.
pub fn decompress_bounded(
    compressed: &[u8],
    dictionary: Option<&[u8]>,
    size: u64,
) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    if let Some(bytes) = decompress_declared(compressed, dictionary, size) {
        return Ok(bytes);
    }
    let limit = size.min(MAX_ARTIFACT_SIZE).saturating_add(1);
    let mut decoder = match dictionary {
        Some(dictionary) => zstd::stream::read::Decoder::with_dictionary(compressed, dictionary)?,
        None => zstd::stream::read::Decoder::with_buffer(compressed)?,
    }
    .single_frame();
    // The recorded size is only a claim: reserve what it says up to a few MiB, grow past that.
    let mut bytes = Vec::with_capacity(limit.min(8 << 20) as usize);
    (&mut decoder).take(limit).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Checks that `bytes` are `kernel`'s `variant`'s cubin, as its record in the bundle at `root`
/// gives its size and sha256: what every read of an artifact checks, for bytes had otherwise
/// (a family reference a sibling's load decoded).
pub fn verify_artifact(
    bytes: &[u8],
    root: &Path,
    kernel: &str,
    variant: &Variant,
) -> Result<(), BundleError> {
    let stored = &variant.artifact;
    let path = root.join(&stored.path);
    verify(bytes, stored, &path, kernel, &variant.label())
}

fn verify(
    bytes: &[u8],
    stored: &StoredFile,
    path: &Path,
    kernel: &str,
    variant: &str,
) -> Result<(), BundleError> {
    use sha2::Digest as _;
    let hash = sha2::Sha256::digest(bytes);
    // Compared as hex on the stack: a String of it is only made for a mismatch.
    let mut text = [0u8; 64];
    let matches = bytes.len() as u64 == stored.size
        && hex::encode_to_slice(hash, &mut text).is_ok()
        && text[..] == *stored.digest.as_bytes();
    if !matches {
        let actual = hex::encode(hash);
        return Err(BundleError::DigestMismatch {
            kernel: kernel.to_owned(),
            variant: variant.to_owned(),
            path: path.to_owned(),
            expected: stored.digest.clone(),
            actual,
        });
    }
    Ok(())
}

fn searched_list(searched: &[PathBuf]) -> String {
    if searched.is_empty() {
        return "no site-packages directory (none found)".to_owned();
    }
    searched
        .iter()
        .map(|path| format!("`{}`", path.display()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Reads an index from a bundle directory or an `index.json` path.
pub fn read_index(path: &Path) -> Result<Index, BundleError> {
    let file = if path.is_dir() {
        bundle_file(path, INDEX_FILE)?
    } else {
        let folder = match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        match path.file_name().and_then(|name| name.to_str()) {
            Some(name) => bundle_file(folder, name)?,
            None => path.to_owned(),
        }
    };
    let bytes = read_regular_file(&file, MAX_INDEX_SIZE).map_err(|source| BundleError::Read {
        path: file.clone(),
        source,
    })?;
    parse_index(&file, &bytes)
}

/// Where `variant`'s cubin is: the bundle at `root`, the cache, the bundle's `store`, or
/// nowhere. Looks at file presence and sizes only; reading verifies.
pub fn locate(
    root: &Path,
    store: Option<&str>,
    variant: &Variant,
    cache: &ArtifactCache,
) -> ArtifactLocation {
    if root.join(&variant.artifact.path).is_file() {
        ArtifactLocation::Bundle
    } else if cache.contains(&variant.artifact) {
        ArtifactLocation::Cache
    } else if store.is_some() {
        ArtifactLocation::Store
    } else {
        ArtifactLocation::Missing
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::os::unix::fs::MetadataExt as _;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::index::{CompilerRecord, KernelInputs, KernelRecord, REFERENCE_INDEX_FORMAT};

    /// A bundle under `dir` of `kernels` kernels whose every variant (cu129 and cu130 of
    /// `sm_90a`) names the one plain frame of `content`, recorded at its true size.
    fn shared_bundle(dir: &Path, kernels: usize, content: &[u8]) -> PathBuf {
        let frame = zstd::bulk::compress(content, 1).unwrap();
        let digest = sha256_hex(content);
        let stored = StoredFile::artifact(digest.clone(), content.len() as u64, frame.len() as u64);
        let variant = |cuda: &str| Variant {
            structs: Default::default(),
            arch: "sm_90a".parse().unwrap(),
            cuda: cuda.parse().unwrap(),
            torch: "2.13.*".to_owned(),
            compiler: CompilerRecord {
                kind: "nvrtc".to_owned(),
                version: "13.0.88".to_owned(),
            },
            key: digest.clone(),
            artifact: stored.clone(),
            functions: Vec::new(),
        };
        let record = KernelRecord {
            inputs: KernelInputs::default(),
            recipe: None,
            constants: BTreeMap::new(),
            variants: vec![variant("cu129"), variant("cu130")],
            skipped: Vec::new(),
        };
        let index = Index {
            format: INDEX_FORMAT,
            package: "shared".to_owned(),
            torch: "2.13.*".to_owned(),
            store: None,
            dictionary: None,
            modules: Default::default(),
            kernels: (0..kernels)
                .map(|n| (format!("k{n:03}"), record.clone()))
                .collect(),
        };
        let root = dir.join("bundle");
        let file = root.join(&stored.path);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, &frame).unwrap();
        std::fs::write(root.join(INDEX_FILE), index.to_json()).unwrap();
        root
    }

    fn decoded(bundle: &Bundle) -> u64 {
        let reads = bundle.reads.lock().unwrap();
        reads.recorded - reads.budget
    }

    /// Issue case 7: one 8 KB frame holding 256 MiB, shared by many variants, made
    /// `wheel verify` take ~1 s per variant and `bundle extract` write 256 MiB per variant.
    /// It is decoded once, and extracted once with the other variants' files linked to it.
    #[test]
    fn a_frame_shared_by_many_variants_is_decoded_and_written_once() {
        let dir = tempfile::tempdir().unwrap();
        let content = vec![0u8; MAX_ARTIFACT_SIZE as usize];
        let root = shared_bundle(dir.path(), 40, &content);
        let index = read_index(&root).unwrap();
        let stored = &index.kernels["k000"].variants[0].artifact;
        assert!(stored.stored_size < 16 << 10, "{}", stored.stored_size);
        drop(content);

        let bundle = Bundle::open(&root).unwrap();
        let started = Instant::now();
        for (kernel, record) in &bundle.index().kernels {
            for variant in &record.variants {
                bundle.verify_artifact(kernel, variant).unwrap();
            }
        }
        let verify = started.elapsed();
        assert_eq!(decoded(&bundle), MAX_ARTIFACT_SIZE);

        let bundle = Bundle::open(&root).unwrap();
        let out = dir.path().join("out");
        let started = Instant::now();
        let written = bundle.extract_to(&out).unwrap();
        let extract = started.elapsed();
        assert_eq!(written.len(), 80);
        assert_eq!(decoded(&bundle), MAX_ARTIFACT_SIZE);
        let inodes: std::collections::BTreeSet<u64> = written
            .iter()
            .map(|relative| std::fs::metadata(out.join(relative)).unwrap().ino())
            .collect();
        assert_eq!(inodes.len(), 1, "every variant's file is one file on disk");
        // One decode and one sha256 of 256 MiB, not 80.
        for elapsed in [verify, extract] {
            assert!(elapsed < Duration::from_secs(8), "{verify:?} {extract:?}");
        }
    }

    /// The variants sharing a file get its bytes from one decode; a caller that reads every
    /// variant again (a second pass) is not refused for it.
    #[test]
    fn shared_artifacts_are_read_from_one_decode_and_may_be_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let content: Vec<u8> = (0..1 << 20).map(|n: u32| (n % 251) as u8).collect();
        let root = shared_bundle(dir.path(), 5, &content);
        let bundle = Bundle::open(&root).unwrap();
        for pass in 0..2 {
            for (kernel, record) in &bundle.index().kernels {
                for variant in &record.variants {
                    assert_eq!(bundle.read_artifact(kernel, variant).unwrap(), content);
                }
            }
            assert_eq!(bundle.reads.lock().unwrap().held, 0, "pass {pass}");
        }
        // The first pass decoded once; the second pass is the caller's own.
        assert_eq!(bundle.reads.lock().unwrap().recorded, 1 << 20);
        assert_eq!(bundle.reads.lock().unwrap().budget, 0);
    }

    /// A shared file that does not verify is refused for every variant naming it, decoded once.
    #[test]
    fn a_shared_artifact_that_fails_verification_fails_every_variant_from_one_decode() {
        let dir = tempfile::tempdir().unwrap();
        let content = vec![7u8; 1 << 20];
        let root = shared_bundle(dir.path(), 4, &content);
        let index = read_index(&root).unwrap();
        let file = root.join(&index.kernels["k000"].variants[0].artifact.path);
        std::fs::write(&file, zstd::bulk::compress(&vec![8u8; 1 << 20], 1).unwrap()).unwrap();
        let bundle = Bundle::open(&root).unwrap();
        for (kernel, record) in &bundle.index().kernels {
            for variant in &record.variants {
                let error = bundle.verify_artifact(kernel, variant).unwrap_err();
                assert!(
                    matches!(error, BundleError::DigestMismatch { .. }),
                    "{error}"
                );
            }
        }
        assert_eq!(decoded(&bundle), 1 << 20);
    }

    /// A bundle of two kernels: `k0`'s cubin stored plain, `k1`'s compressed against it (its
    /// prefix is `k0`'s cubin, index format 4).
    fn reference_bundle(dir: &Path, reference: &[u8], member: &[u8]) -> (PathBuf, Index) {
        use zstd::zstd_safe::{CCtx, CParameter};
        let mut context = CCtx::create();
        context
            .set_parameter(CParameter::ContentSizeFlag(true))
            .unwrap();
        context
            .set_parameter(CParameter::ChecksumFlag(true))
            .unwrap();
        context.ref_prefix(reference).unwrap();
        let mut against = Vec::with_capacity(zstd::zstd_safe::compress_bound(member.len()));
        context.compress2(&mut against, member).unwrap();
        let root = shared_bundle(dir, 2, reference);
        let mut index = read_index(&root).unwrap();
        let member_digest = sha256_hex(member);
        let variant = &mut index.kernels.get_mut("k001").unwrap().variants;
        variant.truncate(1);
        variant[0].key = member_digest.clone();
        variant[0].artifact = StoredFile {
            path: artifact_path(&member_digest),
            digest: member_digest,
            size: member.len() as u64,
            stored_size: against.len() as u64,
            dictionary: Some(sha256_hex(reference)),
        };
        let file = root.join(&variant[0].artifact.path);
        index.format = index.required_format();
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, &against).unwrap();
        std::fs::write(root.join(INDEX_FILE), index.to_json()).unwrap();
        (root, index)
    }

    /// A frame whose prefix is another shipped cubin reads back through that cubin's artifact,
    /// with no dictionary file; a damaged reference fails the read, naming its file.
    #[test]
    fn a_frame_against_a_reference_cubin_reads_through_its_artifact() {
        let dir = tempfile::tempdir().unwrap();
        let reference: Vec<u8> = (0..64 << 10).map(|n: u32| (n * 7 % 253) as u8).collect();
        let mut member = reference.clone();
        member[1000..1100].fill(9);
        let (root, index) = reference_bundle(dir.path(), &reference, &member);
        assert_eq!(index.format, REFERENCE_INDEX_FORMAT);
        assert!(!root.join(DICTIONARIES_DIR).exists());
        let bundle = Bundle::open(&root).unwrap();
        let variant = &bundle.index().kernels["k001"].variants[0];
        assert!(
            variant.artifact.stored_size < 1024,
            "{}",
            variant.artifact.stored_size
        );
        assert_eq!(bundle.read_artifact("k001", variant).unwrap(), member);
        let digest = sha256_hex(&reference);
        assert_eq!(
            prefix_path(&root, &digest).as_deref(),
            Some(artifact_path(&digest).as_str())
        );

        let damaged = zstd::bulk::compress(&vec![1u8; reference.len()], 1).unwrap();
        std::fs::write(root.join(artifact_path(&digest)), damaged).unwrap();
        let error = read_artifact(&root, None, "k001", variant).unwrap_err();
        let message = crate::error_chain(&error);
        assert!(
            matches!(error, BundleError::DigestMismatch { .. })
                && message.contains(&artifact_path(&digest)),
            "{message}"
        );
        // The loader's read (the prefix not hashed) still never hands out other bytes.
        let bundle = Bundle::open(&root).unwrap();
        let loader = read_artifact_with(
            &root,
            "k001",
            variant,
            |digest, label| read_prefix(&root, digest, false, "k001", label),
            |_| Ok(None::<Vec<u8>>),
        );
        assert!(loader.is_err());
        drop(bundle);
    }

    /// A reader refuses an index of a newer format by its number, saying what it reads.
    #[test]
    fn an_index_of_a_newer_format_is_refused_by_its_number() {
        let dir = tempfile::tempdir().unwrap();
        let root = shared_bundle(dir.path(), 1, b"cubin bytes");
        let mut index = read_index(&root).unwrap();
        index.format = SKIP_KIND_INDEX_FORMAT + 1;
        std::fs::write(root.join(INDEX_FILE), index.to_json()).unwrap();
        let message = crate::error_chain(&Bundle::open(&root).unwrap_err());
        assert!(
            message.contains("has format 7, this kwheel reads formats 1 to 6"),
            "{message}"
        );
    }

    /// One digest, two sizes: one of the claims is false, so the index is refused at open.
    #[test]
    fn an_index_recording_two_sizes_for_one_digest_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = shared_bundle(dir.path(), 2, b"cubin bytes");
        let mut index = read_index(&root).unwrap();
        index.kernels.get_mut("k001").unwrap().variants[1]
            .artifact
            .size += 1;
        std::fs::write(root.join(INDEX_FILE), index.to_json()).unwrap();
        let message = crate::error_chain(&Bundle::open(&root).unwrap_err());
        assert!(
            message.contains("is not the 11 bytes recorded for the same digest"),
            "{message}"
        );
    }
}
