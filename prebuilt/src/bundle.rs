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
//! the cubin it picked. Identical cubins share one file. Nothing read from an artifact is
//! handed out before its sha256 matches the index.
//!
//! An index is untrusted input: [`parse_index`] checks every kernel name, path, digest and
//! size in it ([`crate::untrusted::check_index`]) before anything joins a path, only regular
//! files are read, never past a cap, and no stored path leads out of the bundle, through `..`
//! or a symbolic link.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::cache::{write_atomically, ArtifactCache};
use crate::index::{
    ArtifactLocation, Index, StoredFile, Variant, FAMILY_INDEX_FORMAT, INDEX_FORMAT,
};
use crate::key::sha256_hex;
use crate::target::Arch;
use crate::untrusted::{
    check_index, check_stored, read_regular_file, resolve_inside, ArtifactPath, Digest, KernelName,
    Untrusted, MAX_ARTIFACT_SIZE, MAX_DICTIONARY_SIZE, MAX_INDEX_SIZE,
};

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
    format!(
        "{ARTIFACTS_DIR}/{}/{digest}.cubin.zst",
        digest.get(..2).unwrap_or(digest)
    )
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
        "bundle index `{}` has format {found}, this kwheel reads formats {INDEX_FORMAT} to {FAMILY_INDEX_FORMAT}: rebuild the bundle with this version",
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
        "loader index `{}` has format {found}; this kwheel reads format {reads}: install the kwheel the bundle was built with, or rebuild the bundle",
        path.display()
    )]
    UnsupportedLookup {
        /// The file.
        path: PathBuf,
        /// The format found.
        found: u32,
        /// The format this reader reads.
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
}

impl Bundle {
    /// Opens the bundle at `root`, reading and checking its index.
    pub fn open(root: impl Into<PathBuf>) -> Result<Bundle, BundleError> {
        let root = root.into();
        let path = root.join(INDEX_FILE);
        let text =
            read_regular_file(&path, MAX_INDEX_SIZE).map_err(|source| BundleError::Read {
                path: path.clone(),
                source,
            })?;
        let index = parse_index(&path, &text)?;
        Ok(Bundle { root, index })
    }

    /// The bundle's root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The bundle's index.
    pub fn index(&self) -> &Index {
        &self.index
    }

    /// Reads, decompresses and verifies the cubin of one variant of `kernel`.
    pub fn read_artifact(&self, kernel: &str, variant: &Variant) -> Result<Vec<u8>, BundleError> {
        read_artifact(&self.root, self.index.dictionary.as_ref(), kernel, variant)
    }

    /// Writes every artifact, verified, as `root/<kernel>/<build>/<arch>.cubin` (`<arch>.ptx`
    /// for PTX); the paths written, relative to `root`. Kernel names are checked identifiers
    /// (one path component each), so nothing lands outside `root`.
    pub fn extract_to(&self, root: &Path) -> Result<Vec<PathBuf>, BundleError> {
        let mut written = Vec::new();
        for (kernel, record) in &self.index.kernels {
            let kernel_dir = KernelName::parse(kernel).map_err(|source| BundleError::Refused {
                path: self.root.join(INDEX_FILE),
                source,
            })?;
            for variant in &record.variants {
                let cubin = self.read_artifact(kernel, variant)?;
                let relative = Path::new(kernel_dir.as_str())
                    .join(variant.cuda.to_string())
                    .join(format!("{}.{}", variant.arch, extension(variant.arch)));
                let path = root.join(&relative);
                write_atomically(&path, &cubin)
                    .map_err(|source| BundleError::Write { path, source })?;
                written.push(relative);
            }
        }
        Ok(written)
    }
}

/// The bundle a command means: a bundle directory (with `index.json`), a package directory
/// (with `_prebuilt/index.json`), or the name of an installed package, looked up in the
/// site-packages of `$KWHEEL_SITE_PACKAGES`, `$VIRTUAL_ENV`, `$CONDA_PREFIX` and
/// `python3`'s own.
pub fn find_bundle(package_or_path: &str) -> Result<PathBuf, PackageNotFound> {
    let path = Path::new(package_or_path);
    for candidate in [path.to_path_buf(), path.join(PREBUILT_DIR)] {
        if candidate.join(INDEX_FILE).is_file() {
            return Ok(candidate);
        }
    }
    let searched = crate::site::site_packages();
    let wanted = crate::site::normalize_package(package_or_path);
    for site in &searched {
        let Ok(entries) = std::fs::read_dir(site) else {
            continue;
        };
        let mut dirs: Vec<PathBuf> = entries.flatten().map(|entry| entry.path()).collect();
        dirs.sort();
        for dir in dirs {
            let bundle = dir.join(PREBUILT_DIR);
            let Ok(opened) = Bundle::open(&bundle) else {
                continue;
            };
            if crate::site::normalize_package(&opened.index().package) == wanted {
                return Ok(bundle);
            }
        }
    }
    Err(PackageNotFound {
        package: package_or_path.to_owned(),
        searched,
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
    if !(INDEX_FORMAT..=FAMILY_INDEX_FORMAT).contains(&format.format) {
        return Err(BundleError::UnsupportedFormat {
            path: path.to_owned(),
            found: format.format,
        });
    }
    let index: Index =
        serde_json::from_slice(bytes).map_err(|source| BundleError::InvalidIndex {
            path: path.to_owned(),
            source,
        })?;
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

/// Reads a stored artifact under `root`, decompresses it and verifies it against `stored`.
pub fn read_stored(
    root: &Path,
    stored: &StoredFile,
    dictionary: FrameDictionary<'_>,
    kernel: &str,
    variant: &str,
) -> Result<Vec<u8>, BundleError> {
    let path = stored_path(
        root,
        stored,
        MAX_ARTIFACT_SIZE,
        &format!("`{kernel}` ({variant})"),
    )?;
    let compressed =
        read_regular_file(&path, MAX_ARTIFACT_SIZE).map_err(|source| BundleError::Read {
            path: path.clone(),
            source,
        })?;
    let corrupt = |source| BundleError::Corrupt {
        kernel: kernel.to_owned(),
        variant: variant.to_owned(),
        path: path.clone(),
        source,
    };
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
    use zstd::zstd_safe::{self, DParameter};
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
    let mut context = zstd_safe::DCtx::create();
    // The writer's window reaches from a cubin back over its prefix: a dictionary is at most
    // MAX_DICTIONARY_SIZE and a cubin MAX_ARTIFACT_SIZE, so 2^29 covers every frame it writes.
    context
        .set_parameter(DParameter::WindowLogMax(29))
        .map_err(zstd)?;
    context.ref_prefix(prefix).map_err(zstd)?;
    let mut bytes = Vec::with_capacity(declared as usize);
    let decoded = context.decompress(&mut bytes, compressed).map_err(zstd)?;
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

/// Reads the family dictionary with raw-content sha256 `digest` (a plain zstd frame) and
/// decompresses it; with `verify`, checks its sha256 too. The loader does not: a frame
/// decompressed against other bytes fails its checksum or the cubin's own sha256, which is
/// always checked, so hashing the dictionary would only name the file in the error.
pub fn read_prefix(
    root: &Path,
    digest: &str,
    verify_digest: bool,
    kernel: &str,
    variant: &str,
) -> Result<Vec<u8>, BundleError> {
    let index = root.join(INDEX_FILE);
    let refused = |source| BundleError::Refused {
        path: index.clone(),
        source,
    };
    Digest::parse(digest)
        .map_err(|e| refused(e.of(format!("the dictionary of `{kernel}` ({variant})"))))?;
    let relative = ArtifactPath::parse(&dictionary_path(digest)).map_err(refused)?;
    let path = resolve_inside(root, &relative).map_err(|source| BundleError::Read {
        path: relative.join_to(root),
        source,
    })?;
    let stored =
        read_regular_file(&path, MAX_DICTIONARY_SIZE).map_err(|source| BundleError::Read {
            path: path.clone(),
            source,
        })?;
    let corrupt = |source| BundleError::Corrupt {
        kernel: kernel.to_owned(),
        variant: format!("{variant} dictionary"),
        path: path.clone(),
        source,
    };
    let bytes = decompress_with_prefix(&stored, &[], MAX_DICTIONARY_SIZE).map_err(corrupt)?;
    if verify_digest {
        let actual = sha256_hex(&bytes);
        if actual != digest {
            return Err(BundleError::DigestMismatch {
                kernel: kernel.to_owned(),
                variant: format!("{variant} dictionary"),
                path,
                expected: digest.to_owned(),
                actual,
            });
        }
    }
    Ok(bytes)
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

fn verify(
    bytes: &[u8],
    stored: &StoredFile,
    path: &Path,
    kernel: &str,
    variant: &str,
) -> Result<(), BundleError> {
    let actual = sha256_hex(bytes);
    if actual != stored.digest || bytes.len() as u64 != stored.size {
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
        path.join(INDEX_FILE)
    } else {
        path.to_owned()
    };
    let bytes = read_regular_file(&file, MAX_INDEX_SIZE).map_err(|source| BundleError::Read {
        path: file.clone(),
        source,
    })?;
    parse_index(&file, &bytes)
}

/// The `bundle list` table: one row per variant and per skip.
pub fn list_bundle(index: &Index) -> String {
    let mut rows = vec![[
        "kernel".to_owned(),
        "build".into(),
        "arch".into(),
        "compiler".into(),
        "size".into(),
        "stored".into(),
        "key".into(),
        "skipped because".into(),
    ]];
    for (kernel, record) in &index.kernels {
        for variant in &record.variants {
            rows.push([
                kernel.clone(),
                variant.cuda.to_string(),
                variant.arch.to_string(),
                variant.compiler.to_string(),
                variant.artifact.size.to_string(),
                variant.artifact.stored_size.to_string(),
                variant.key[..12.min(variant.key.len())].to_owned(),
                String::new(),
            ]);
        }
        for skip in &record.skipped {
            rows.push([
                kernel.clone(),
                skip.cuda.to_string(),
                skip.arch.to_string(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                skip.reason.clone(),
            ]);
        }
    }
    let mut widths = [0usize; 8];
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in &rows {
        let mut line = String::new();
        for (n, (cell, width)) in row.iter().zip(widths).enumerate() {
            if n > 0 {
                line.push_str("  ");
            }
            if n == 4 || n == 5 {
                let _ = write!(line, "{cell:>width$}");
            } else {
                let _ = write!(line, "{cell:<width$}");
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
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
