//! Warm packs: what one machine's JIT cache holds for a package, as a verified bundle fragment
//! that other machines load as prebuilt cubins, with no compiler (`docs/warm-packs.md`).
//!
//! ```text
//! <pack>/                                  written by `kwheel jit export`
//! ├── pack.json                            format, package, torch pin, kernels → variants
//! └── artifacts/5a/5a0d…e1.cubin.zst       each cubin, one zstd frame, named by its sha256
//!
//! ${KWHEEL_JIT_CACHE:-~/.cache/kwheel/jit}/packs-v1/<package>/<id>/   `kwheel jit import`
//! <bundle>/packs/<id>/                                                 `dev build-wheel --add-pack`
//! ```
//!
//! `<id>` is the first 16 hex digits of `pack.json`'s sha256. A pack's variants are the
//! index's [`Variant`]s, stored as a bundle stores them ([`artifact_path`]); per kernel it also
//! records the sha256 of the kernel's key inputs as the package's index holds them, so that a
//! pack exported from another release of the package is recognised as such and passed over.
//!
//! Nothing of a pack is trusted. Every entry is checked where it is written, installed, shipped
//! and loaded alike ([`check_variant`], [`read_pack_cubin`]):
//!
//! | check | refused when |
//! | --- | --- |
//! | the key | the key recomputed from the package's own index (its shipped sources' digests, flags, defines) with the entry's architecture, CUDA build, torch pin and compiler is not the entry's |
//! | the torch pin | it is not the package's |
//! | the compiler | not `nvrtc` or `nvcc`: a pack holds JIT results only |
//! | the artifact | its size or sha256 is not the entry's |
//! | the cubin | not a cubin for the entry's target, toolkit and compiler version, or without its entries and their parameter sizes ([`check_identity`]) |
//! | stubs | every entry only reports and aborts on the target (the JIT's own rule) |
//!
//! A pack is read once ([`verify_pack`], [`install_pack`]): `pack.json` and each artifact are
//! opened once where no link leads out of the pack, capped ([`MAX_PACK_INDEX_SIZE`],
//! [`MAX_ARTIFACT_SIZE`], [`MAX_PACK_STORED`] in all), checked, and what is installed or
//! shipped is those very bytes, never the pack's files read again.

mod export;
pub mod testing;

pub use export::{export_pack, ExportReport};

use std::io::Write as _;

use super::*;
use crate::bundle::{artifact_path, decompress_bounded, read_inside, Bundle, BundleError};
use crate::cubin::identity::{check_identity, ExpectedCubin};
use crate::index::{CompilerKind, KernelInputs, Variant};
use crate::untrusted::{check_stored, ArtifactPath, KernelName, MAX_ARTIFACT_SIZE};

/// The pack's index file.
pub const PACK_FILE: &str = "pack.json";
/// Version of `pack.json`. Bump it when its fields change.
pub const PACK_FORMAT: u32 = 1;
/// The folder of installed packs under the JIT cache; bump with the install layout.
pub const PACKS_LAYOUT: &str = "packs-v1";
/// The folder of packs a wheel ships, inside its bundle.
pub const BUNDLE_PACKS_DIR: &str = "packs";

/// A warm pack's `pack.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PackIndex {
    /// [`PACK_FORMAT`].
    pub format: u32,
    /// The package whose JIT results these are (`af3-kernels`).
    pub package: String,
    /// The package's torch pin, which every key holds.
    pub torch: String,
    /// Each kernel's entries.
    pub kernels: BTreeMap<String, PackKernel>,
}

/// One kernel of a pack.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PackKernel {
    /// sha256 of the kernel's key inputs as the package's index records them
    /// ([`inputs_digest`]): another release's sources give another digest.
    pub inputs: String,
    /// The JIT results, one per target, as a bundle's variants.
    pub variants: Vec<Variant>,
}

/// A pack entry the loader may load: the pack's folder and the variant.
#[derive(Clone, Debug, PartialEq)]
pub struct PackEntry {
    /// The pack's folder.
    pub pack: PathBuf,
    /// The entry, checked against the package's key inputs.
    pub variant: Variant,
}

impl PackEntry {
    /// The pack's `pack.json`, as errors name it.
    pub fn file(&self) -> PathBuf {
        self.pack.join(PACK_FILE)
    }
}

/// A warm pack that cannot be read, written, or trusted.
#[derive(Debug, thiserror::Error)]
pub enum PackError {
    /// A file or folder of a pack could not be read.
    #[error("cannot read the warm pack file {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// `pack.json` is not a pack index this reader knows.
    #[error("{} is not a warm pack: {reason}", path.display())]
    Format {
        /// The `pack.json`.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The pack is another package's.
    #[error(
        "the warm pack {} holds JIT results of `{pack}`, not of `{package}`; import it with \
         --package {pack}",
        path.display()
    )]
    Package {
        /// The `pack.json`.
        path: PathBuf,
        /// The package the pack names.
        pack: String,
        /// The package it was given for.
        package: String,
    },
    /// An entry that is not what the package's sources compile to.
    #[error(
        "the warm pack {} is refused: its `{kernel}`{} {reason}; export it again \
         from a machine with this release of the package, or remove it",
        path.display(),
        if variant.is_empty() { String::new() } else { format!(" ({variant})") }
    )]
    Entry {
        /// The `pack.json`.
        path: PathBuf,
        /// The kernel.
        kernel: String,
        /// The entry's target, `cu129/sm_89`.
        variant: String,
        /// Why.
        reason: String,
    },
    /// An entry's cubin is damaged, or is not the cubin its key names.
    #[error(
        "the warm pack {} is refused: the cubin of `{kernel}` ({variant}) is not the one its \
         entry names; export it again, or remove it",
        path.display()
    )]
    Cubin {
        /// The `pack.json`.
        path: PathBuf,
        /// The kernel.
        kernel: String,
        /// The entry's target.
        variant: String,
        /// What is wrong with it.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The JIT cache holds nothing of the package that can be exported.
    #[error(
        "the JIT cache {} holds no JIT result of `{package}` to export{}",
        cache.display(),
        if skipped.is_empty() { String::new() } else { format!("; passed over: {}", skipped.join("; ")) }
    )]
    Empty {
        /// The package.
        package: String,
        /// The JIT cache.
        cache: PathBuf,
        /// Each entry passed over, and why.
        skipped: Vec<String>,
    },
    /// Something the pack would be written into is in the way, or could not be written.
    #[error("cannot write the warm pack at {}", path.display())]
    Write {
        /// The file or folder.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

impl PackError {
    /// Whether the pack was refused (an input that failed a check: the CLI's exit code 4), as
    /// opposed to a pack that could not be read or written, or a cache with nothing to export.
    pub fn is_refusal(&self) -> bool {
        match self {
            PackError::Read { source, .. } => crate::untrusted::is_refusal(source),
            PackError::Write { .. } | PackError::Empty { .. } => false,
            PackError::Format { .. }
            | PackError::Package { .. }
            | PackError::Entry { .. }
            | PackError::Cubin { .. } => true,
        }
    }
}

/// sha256 of a kernel's key inputs, as its index records them.
pub fn inputs_digest(inputs: &KernelInputs) -> String {
    sha256_hex(&serde_json::to_vec(inputs).expect("key inputs serialize"))
}

/// Why `variant` is not a JIT result of `kernel` with `inputs` under the torch pin `torch`,
/// or `Ok` when its key is the one those inputs give.
pub fn check_variant(
    kernel: &str,
    inputs: &KernelInputs,
    torch: &str,
    variant: &Variant,
) -> Result<(), String> {
    if variant.torch != torch {
        return Err(format!(
            "is keyed for the torch pin `{}`, but the package pins `{torch}`",
            variant.torch
        ));
    }
    if !variant
        .functions
        .iter()
        .map(|function| function.name.as_str())
        .eq(inputs.entries.iter().map(String::as_str))
    {
        return Err(format!(
            "lists the entries {:?}, not the kernel's {:?}",
            variant
                .functions
                .iter()
                .map(|function| &function.name)
                .collect::<Vec<_>>(),
            inputs.entries
        ));
    }
    let compiler = variant.compiler.compiler_kind();
    if !matches!(compiler, Some(CompilerKind::Nvrtc | CompilerKind::Nvcc)) {
        return Err(format!(
            "names the compiler `{}`: a pack holds only what NVRTC or nvcc compiled",
            variant.compiler
        ));
    }
    let key = KernelKey::compute(&KeyInputs {
        kernel,
        inputs,
        arch: variant.arch,
        cuda: variant.cuda,
        torch,
        compiler: &variant.compiler,
    });
    if key.0 != variant.key {
        return Err(format!(
            "has the key {}, but the package's shipped sources compiled for {} with {} give {}",
            variant.key,
            variant.label(),
            variant.compiler,
            key.0
        ));
    }
    Ok(())
}

/// Reads the pack index of the pack at `dir`: a regular `pack.json` of a known format whose
/// names, paths, digests and sizes are well formed.
pub fn read_pack(dir: &Path) -> Result<PackIndex, PackError> {
    let (path, bytes) = read_pack_bytes(dir)?;
    parse_pack(&path, &bytes)
}

/// Largest `pack.json`: 2 KiB for each of [`MAX_PACK_ENTRIES`] entries (one as
/// `kwheel jit export` writes it, with a FlashInfer-length entry name, is about 1.2 KiB);
/// a file over it is refused by its size, before anything is read or reserved.
pub const MAX_PACK_INDEX_SIZE: u64 = 32 << 20;

/// The bytes of the pack's `pack.json`, opened once where no link leads out of the pack and
/// read no further than [`MAX_PACK_INDEX_SIZE`].
fn read_pack_bytes(dir: &Path) -> Result<(PathBuf, Vec<u8>), PackError> {
    let relative = ArtifactPath::parse(PACK_FILE).expect("a plain file name");
    read_pack_file(dir, &relative, MAX_PACK_INDEX_SIZE)
}

/// The file at `relative` in the pack at `dir`, opened once where no link leads out of it
/// and read whole, at most `cap` bytes.
fn read_pack_file(
    dir: &Path,
    relative: &ArtifactPath,
    cap: u64,
) -> Result<(PathBuf, Vec<u8>), PackError> {
    read_inside(dir, relative, cap).map_err(|error| match error {
        BundleError::Read { path, source } => PackError::Read { path, source },
        other => PackError::Read {
            path: relative.join_to(dir),
            source: std::io::Error::other(other.to_string()),
        },
    })
}

/// Most entries a pack may hold, and most bytes its cubins may decode to in all: far above a
/// machine's JIT cache for one package, and a bound on the work of verifying one.
pub const MAX_PACK_ENTRIES: usize = 16_384;
/// See [`MAX_PACK_ENTRIES`].
pub const MAX_PACK_DECODED: u64 = 4 << 30;
/// Most bytes a pack's artifacts may hold as stored, in all: what shipping a verified pack
/// keeps in memory (`dev build-wheel --add-pack`). A machine's JIT cache for one package,
/// even one of FlashInfer's 15,970 cubins (174 MB as a bundle stores them), is far below.
pub const MAX_PACK_STORED: u64 = 1 << 30;

/// Whether `name` can be a distribution name (PEP 508): letters, digits, `.`, `_`, `-`,
/// starting and ending with a letter or digit. A pack's package must be one, never a path.
fn is_distribution_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 128
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn parse_pack(path: &Path, bytes: &[u8]) -> Result<PackIndex, PackError> {
    let format = |reason: String| PackError::Format {
        path: path.to_path_buf(),
        reason,
    };
    let index: PackIndex =
        serde_json::from_slice(bytes).map_err(|error| format(error.to_string()))?;
    if index.format != PACK_FORMAT {
        return Err(format(format!(
            "format {}, this kwheel reads format {PACK_FORMAT}",
            index.format
        )));
    }
    if !is_distribution_name(&index.package) {
        return Err(format(format!(
            "its package `{}` is not a distribution name (letters, digits, `.`, `_`, `-`)",
            index.package
        )));
    }
    let entries: usize = index.kernels.values().map(|k| k.variants.len()).sum();
    if entries > MAX_PACK_ENTRIES {
        return Err(format(format!(
            "{entries} entries, over the cap of {MAX_PACK_ENTRIES}"
        )));
    }
    let decoded: u64 = index
        .kernels
        .values()
        .flat_map(|k| &k.variants)
        .map(|v| v.artifact.size)
        .sum();
    if decoded > MAX_PACK_DECODED {
        return Err(format(format!(
            "its cubins decode to {decoded} bytes, over the cap of {MAX_PACK_DECODED}"
        )));
    }
    let stored: u64 = index
        .kernels
        .values()
        .flat_map(|k| &k.variants)
        .map(|v| v.artifact.stored_size)
        .fold(0, u64::saturating_add);
    if stored > MAX_PACK_STORED {
        return Err(format(format!(
            "its artifacts hold {stored} bytes, over the cap of {MAX_PACK_STORED}"
        )));
    }
    let mut seen = std::collections::BTreeSet::new();
    for (kernel, record) in &index.kernels {
        KernelName::parse(kernel).map_err(|error| format(error.to_string()))?;
        for variant in &record.variants {
            let what = format!("`{kernel}` ({})", variant.label());
            if !seen.insert((kernel, variant.label()))
                || !seen.insert((kernel, variant.artifact.digest.clone()))
            {
                return Err(format(format!(
                    "{what} is listed twice, or shares its cubin with another entry"
                )));
            }
            check_stored(&variant.artifact, MAX_ARTIFACT_SIZE, &what)
                .map_err(|error| format(error.to_string()))?;
            let expected = artifact_path(&variant.artifact.digest);
            if variant.artifact.path != expected || variant.artifact.dictionary.is_some() {
                return Err(format(format!(
                    "the artifact of {what} is stored at `{}`, not `{expected}` as one plain frame",
                    variant.artifact.path
                )));
            }
        }
    }
    Ok(index)
}

/// The cubin of `variant` (an entry of `kernel` in the pack at `pack`): read once,
/// decompressed and verified (digest, target, toolkit, entries and their parameters, not a
/// stub), else the error naming the pack and the kernel.
pub fn read_pack_cubin(pack: &Path, kernel: &str, variant: &Variant) -> Result<Vec<u8>, PackError> {
    read_entry(pack, kernel, variant).map(|(cubin, _stored)| cubin)
}

/// [`read_pack_cubin`], with the artifact's bytes as read from the pack (one zstd frame), of
/// which the cubin is the content.
fn read_entry(
    pack: &Path,
    kernel: &str,
    variant: &Variant,
) -> Result<(Vec<u8>, Vec<u8>), PackError> {
    let label = variant.label();
    let refused = |source: Box<dyn std::error::Error + Send + Sync>| PackError::Cubin {
        path: pack.join(PACK_FILE),
        kernel: kernel.to_owned(),
        variant: label.clone(),
        source,
    };
    let bundle_error = |error: BundleError| refused(Box::new(error));
    let what = format!("`{kernel}` ({label})");
    check_stored(&variant.artifact, MAX_ARTIFACT_SIZE, &what).map_err(|source| {
        bundle_error(BundleError::Refused {
            path: pack.join(PACK_FILE),
            source,
        })
    })?;
    let relative = ArtifactPath::parse(&variant.artifact.path).map_err(|source| {
        bundle_error(BundleError::Refused {
            path: pack.join(PACK_FILE),
            source,
        })
    })?;
    let (path, stored) = read_inside(pack, &relative, MAX_ARTIFACT_SIZE).map_err(bundle_error)?;
    let cubin = decompress_bounded(&stored, None, variant.artifact.size).map_err(|source| {
        bundle_error(BundleError::Corrupt {
            kernel: kernel.to_owned(),
            variant: label.clone(),
            path: path.clone(),
            source,
        })
    })?;
    let actual = sha256_hex(&cubin);
    if cubin.len() as u64 != variant.artifact.size || actual != variant.artifact.digest {
        return Err(bundle_error(BundleError::DigestMismatch {
            kernel: kernel.to_owned(),
            variant: label.clone(),
            path,
            expected: variant.artifact.digest.clone(),
            actual,
        }));
    }
    let expected = ExpectedCubin {
        arch: variant.arch,
        cuda: variant.cuda,
        compiler: &variant.compiler,
        functions: &variant.functions,
    };
    check_identity(&cubin, &expected).map_err(|error| refused(Box::new(error)))?;
    let compiler = variant.compiler.to_string();
    run::refuse_stubs(kernel, variant.arch, &compiler, &cubin, &variant.functions)
        .map_err(|error| refused(Box::new(error)))?;
    Ok((cubin, stored))
}

/// A warm pack read once and verified against a bundle: its index, and `pack.json` and each
/// artifact as the bytes that were read and checked. Installing or shipping it writes these
/// bytes; nothing of the pack's folder is read again.
#[derive(Clone, Debug)]
pub struct VerifiedPack {
    /// The pack's folder, as errors name it.
    pub dir: PathBuf,
    /// The pack index, as verified.
    pub index: PackIndex,
    /// `/`-separated path inside the pack → the bytes read and checked, sorted.
    files: BTreeMap<String, Vec<u8>>,
}

impl VerifiedPack {
    /// The id it installs and ships under: 16 hex digits of its `pack.json`'s sha256.
    pub fn id(&self) -> String {
        sha256_hex(&self.files[PACK_FILE])[..16].to_owned()
    }

    /// `pack.json` and each entry's artifact, as (path inside the pack, bytes), sorted: the
    /// bytes verified.
    pub fn files(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.files
            .iter()
            .map(|(path, bytes)| (path.as_str(), bytes.as_slice()))
    }

    /// [`VerifiedPack::files`], owned.
    pub fn into_files(self) -> BTreeMap<String, Vec<u8>> {
        self.files
    }
}

/// Reads the pack at `dir` once and checks it whole against `bundle`: its package, and for
/// every entry the key its kernel's inputs give and its cubin. What it returns holds the
/// bytes read, which is what installing ([`install_pack`]) and shipping use.
pub fn verify_pack(dir: &Path, bundle: &Bundle) -> Result<VerifiedPack, PackError> {
    let (path, pack_json) = read_pack_bytes(dir)?;
    let index = parse_pack(&path, &pack_json)?;
    let mut files = BTreeMap::new();
    let mut stored = 0u64;
    verify_index(dir, &index, bundle, &mut |relative, bytes| {
        add_stored(&path, &mut stored, &bytes)?;
        files.insert(relative.to_owned(), bytes);
        Ok(())
    })?;
    files.insert(PACK_FILE.to_owned(), pack_json);
    testing::checked(dir);
    Ok(VerifiedPack {
        dir: dir.to_path_buf(),
        index,
        files,
    })
}

/// Where [`verify_index`] gives each artifact it read and checked: its path inside the pack
/// and its bytes.
type Keep<'k> = dyn FnMut(&str, Vec<u8>) -> Result<(), PackError> + 'k;

/// Checks `index`, the pack index read from `dir`, against `bundle`, reading each entry's
/// artifact once and giving its bytes, checked, to `keep`.
fn verify_index(
    dir: &Path,
    index: &PackIndex,
    bundle: &Bundle,
    keep: &mut Keep<'_>,
) -> Result<(), PackError> {
    let path = dir.join(PACK_FILE);
    let package = &bundle.index().package;
    if crate::site::normalize_package(&index.package) != crate::site::normalize_package(package) {
        return Err(PackError::Package {
            path,
            pack: index.package.clone(),
            package: package.clone(),
        });
    }
    for (kernel, record) in &index.kernels {
        let refuse = |variant: String, reason: String| PackError::Entry {
            path: path.clone(),
            kernel: kernel.clone(),
            variant,
            reason,
        };
        let first = record
            .variants
            .first()
            .map(Variant::label)
            .unwrap_or_default();
        let Some(shipped) = bundle.index().kernels.get(kernel) else {
            return Err(refuse(first, format!("is no kernel of `{package}`")));
        };
        if record.inputs != inputs_digest(&shipped.inputs) {
            return Err(refuse(
                first,
                "was compiled from other sources than this release of the package ships (its key \
                 inputs differ)"
                    .to_owned(),
            ));
        }
        for variant in &record.variants {
            check_variant(kernel, &shipped.inputs, &bundle.index().torch, variant)
                .map_err(|reason| refuse(variant.label(), reason))?;
            let (_cubin, stored) = read_entry(dir, kernel, variant)?;
            keep(&variant.artifact.path, stored)?;
        }
    }
    Ok(())
}

/// What [`install_pack`] did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Installed {
    /// Where the pack now is.
    pub path: PathBuf,
    /// The package.
    pub package: String,
    /// Each entry, `kernel cu129/sm_89`.
    pub entries: Vec<String>,
    /// Whether the same pack was installed already.
    pub already: bool,
}

/// Where packs of `package` are installed under the JIT cache `jit_cache`.
pub fn installed_packs_dir(jit_cache: &Path, package: &str) -> PathBuf {
    jit_cache
        .join(PACKS_LAYOUT)
        .join(crate::site::normalize_package(package))
}

/// Verifies the pack at `dir` against `bundle` and installs a copy under `jit_cache` where
/// the loader looks ([`pack_dirs`]). The pack is read once: each file, as soon as it is
/// checked, is written from the bytes checked into a hidden folder, which is renamed into
/// place only when every entry verified (and removed otherwise), so the copy appears whole
/// and holds only what was verified.
pub fn install_pack(dir: &Path, bundle: &Bundle, jit_cache: &Path) -> Result<Installed, PackError> {
    let (pack_path, pack_json) = read_pack_bytes(dir)?;
    let index = parse_pack(&pack_path, &pack_json)?;
    let parent = installed_packs_dir(jit_cache, &index.package);
    let id = sha256_hex(&pack_json)[..16].to_owned();
    let path = parent.join(&id);
    let staging = Staging {
        temp: parent.join(format!(".{id}.{}.tmp", std::process::id())),
        parent,
        made: std::cell::Cell::new(false),
    };
    let mut stored = 0u64;
    verify_index(dir, &index, bundle, &mut |relative, bytes| {
        // Written as it is checked: one artifact is held at a time.
        add_stored(&pack_path, &mut stored, &bytes)?;
        staging.write(&pack_path, relative, &bytes)
    })?;
    testing::checked(dir);
    let installed = |already| Installed {
        path: path.clone(),
        package: bundle.index().package.clone(),
        entries: entry_names(&index),
        already,
    };
    if path.join(PACK_FILE).is_file() && read_pack(&path).is_ok_and(|found| found == index) {
        return Ok(installed(true));
    }
    staging.write(&pack_path, PACK_FILE, &pack_json)?;
    let _ = fs::remove_dir_all(&path);
    fs::rename(&staging.temp, &path).map_err(|source| PackError::Write {
        path: path.clone(),
        source,
    })?;
    Ok(installed(false))
}

/// Counts `bytes`, an artifact read from the pack whose `pack.json` is `pack_json`, into
/// `stored`, the bytes read so far: refused past [`MAX_PACK_STORED`] whatever the entries
/// declared.
fn add_stored(pack_json: &Path, stored: &mut u64, bytes: &[u8]) -> Result<(), PackError> {
    *stored = stored.saturating_add(bytes.len() as u64);
    if *stored > MAX_PACK_STORED {
        return Err(PackError::Format {
            path: pack_json.to_path_buf(),
            reason: format!("its artifacts hold over the cap of {MAX_PACK_STORED} bytes"),
        });
    }
    Ok(())
}

/// The hidden folder beside the installed packs that an install is written into: made on the
/// first file (a pack refused before then leaves nothing), removed when dropped unless it was
/// renamed into place.
struct Staging {
    parent: PathBuf,
    temp: PathBuf,
    made: std::cell::Cell<bool>,
}

impl Staging {
    /// Writes the pack file `relative` with `bytes`; `pack_json` names the pack in a refusal.
    fn write(&self, pack_json: &Path, relative: &str, bytes: &[u8]) -> Result<(), PackError> {
        if !self.made.get() {
            fs::create_dir_all(&self.parent).map_err(|source| PackError::Write {
                path: self.parent.clone(),
                source,
            })?;
            // A folder of this process's name is a killed earlier run's.
            let _ = fs::remove_dir_all(&self.temp);
            self.made.set(true);
        }
        write_pack_file(pack_json, &self.temp, relative, bytes)
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if self.made.get() {
            let _ = fs::remove_dir_all(&self.temp);
        }
    }
}

/// Writes the pack file `relative` (a path the pack index gave, checked again here) with
/// `bytes` into the new pack folder `to`; `pack_json` names the pack in a refusal.
fn write_pack_file(
    pack_json: &Path,
    to: &Path,
    relative: &str,
    bytes: &[u8],
) -> Result<(), PackError> {
    let target = ArtifactPath::parse(relative)
        .map_err(|error| PackError::Format {
            path: pack_json.to_path_buf(),
            reason: error.to_string(),
        })?
        .join_to(to);
    write_new(&target, bytes)
}

/// Writes a new file (and its folders), flushed.
pub(super) fn write_new(path: &Path, bytes: &[u8]) -> Result<(), PackError> {
    let failed = |source| PackError::Write {
        path: path.to_path_buf(),
        source,
    };
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).map_err(failed)?;
    }
    let mut file = File::create_new(path).map_err(failed)?;
    file.write_all(bytes).map_err(failed)?;
    file.sync_all().map_err(failed)
}

/// `kernel cu129/sm_89` for each entry.
pub(super) fn entry_names(index: &PackIndex) -> Vec<String> {
    index
        .kernels
        .iter()
        .flat_map(|(kernel, record)| {
            record
                .variants
                .iter()
                .map(move |variant| format!("{kernel} {}", variant.label()))
        })
        .collect()
}

/// Every pack folder the loader reads for `package`'s bundle at `bundle_root`: those the wheel
/// ships (`<bundle>/packs/*`), then those installed under `jit_cache`, each list sorted. Links
/// and folders without a `pack.json` are passed over.
pub fn pack_dirs(bundle_root: &Path, jit_cache: &Path, package: &str) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for parent in [
        bundle_root.join(BUNDLE_PACKS_DIR),
        installed_packs_dir(jit_cache, package),
    ] {
        let Ok(entries) = fs::read_dir(&parent) else {
            continue;
        };
        let mut found: Vec<PathBuf> = entries
            .flatten()
            .filter(|entry| !entry.file_name().to_string_lossy().starts_with('.'))
            .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_dir()))
            .map(|entry| entry.path())
            .filter(|dir| fs::symlink_metadata(dir.join(PACK_FILE)).is_ok_and(|m| m.is_file()))
            .collect();
        found.sort();
        dirs.extend(found);
    }
    dirs
}

/// The entries of `kernel` in the packs at `dirs` that its `inputs` (under the torch pin
/// `torch`) key, in pack order: what selection then chooses from. A pack that cannot be read,
/// of another package, exported under another torch pin or from another release's sources,
/// is passed over; an entry whose key its inputs do not give is the error.
pub fn pack_entries(
    dirs: &[PathBuf],
    package: &str,
    kernel: &str,
    inputs: &KernelInputs,
    torch: &str,
) -> Result<Vec<PackEntry>, PackError> {
    let digest = inputs_digest(inputs);
    let package = crate::site::normalize_package(package);
    let mut entries = Vec::new();
    for dir in dirs {
        // A pack that cannot be read offers nothing: the kernel falls back as if it were not
        // there (a refused entry of a readable pack is still the error below).
        let Ok(index) = read_pack(dir) else {
            continue;
        };
        // Another package's, or exported under another torch pin (the package's pin moved
        // since): honest, but none of its keys can be this release's.
        if crate::site::normalize_package(&index.package) != package || index.torch != torch {
            continue;
        }
        let Some(record) = index.kernels.get(kernel) else {
            continue;
        };
        if record.inputs != digest {
            continue;
        }
        for variant in &record.variants {
            check_variant(kernel, inputs, torch, variant).map_err(|reason| PackError::Entry {
                path: dir.join(PACK_FILE),
                kernel: kernel.to_owned(),
                variant: variant.label(),
                reason,
            })?;
            entries.push(PackEntry {
                pack: dir.clone(),
                variant: variant.clone(),
            });
        }
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::testing::{after_check, clear_after_check, fixture_pack, FixturePack};
    use super::*;

    /// After the check, before the use: the pack's file at `relative` becomes a link to a
    /// file outside the pack (`dir/outside`, holding a secret).
    fn swap_for_a_link_out(dir: &Path, relative: &str) {
        let outside = dir.join("outside");
        fs::write(&outside, b"a private key").unwrap();
        let relative = relative.to_owned();
        after_check(move |pack| {
            let file = pack.join(&relative);
            fs::remove_file(&file).unwrap();
            std::os::unix::fs::symlink(&outside, &file).unwrap();
        });
    }

    /// A fixture pack in a new folder whose `swapped` file (`artifact` or [`PACK_FILE`]) will
    /// become a link out right after its check, and its `pack.json` as verified.
    fn swapped_after_the_check(swapped: &str) -> (tempfile::TempDir, FixturePack, Vec<u8>) {
        let dir = tempfile::tempdir().unwrap();
        let fixture = fixture_pack(dir.path());
        let pack_json = fs::read(fixture.pack.join(PACK_FILE)).unwrap();
        let relative = if swapped == "artifact" {
            fixture.artifact.0.as_str()
        } else {
            PACK_FILE
        };
        swap_for_a_link_out(dir.path(), relative);
        (dir, fixture, pack_json)
    }

    #[test]
    fn a_pack_file_swapped_for_a_link_after_the_check_is_not_what_ships() {
        for swapped in ["artifact", PACK_FILE] {
            let (_dir, fixture, pack_json) = swapped_after_the_check(swapped);
            let (artifact, stored) = fixture.artifact.clone();
            let verified = verify_pack(&fixture.pack, &fixture.bundle);
            clear_after_check();
            let verified = verified.unwrap_or_else(|e| panic!("{}", crate::error_chain(&e)));
            let files: BTreeMap<&str, &[u8]> = verified.files().collect();
            assert_eq!(
                files,
                BTreeMap::from([
                    (artifact.as_str(), &stored[..]),
                    (PACK_FILE, &pack_json[..])
                ]),
                "{swapped}: the bytes verified, not the link's"
            );
            assert_eq!(verified.id(), sha256_hex(&pack_json)[..16]);
        }
    }

    #[test]
    fn a_pack_file_swapped_for_a_link_after_the_check_is_not_what_installs() {
        for swapped in ["artifact", PACK_FILE] {
            let (dir, fixture, pack_json) = swapped_after_the_check(swapped);
            let (artifact, stored) = fixture.artifact.clone();
            let cache = dir.path().join("jit");
            let installed = install_pack(&fixture.pack, &fixture.bundle, &cache);
            clear_after_check();
            let installed = installed.unwrap_or_else(|e| panic!("{}", crate::error_chain(&e)));
            assert!(!installed.already);
            for (relative, bytes) in [(artifact.as_str(), &stored), (PACK_FILE, &pack_json)] {
                let file = installed.path.join(relative);
                assert!(fs::symlink_metadata(&file).unwrap().is_file(), "{swapped}");
                assert_eq!(&fs::read(&file).unwrap(), bytes, "{swapped}: {relative}");
            }
            // What the loader then reads from the copy is the verified cubin.
            let variant = &installed_index(&installed.path).kernels["axpy"].variants[0];
            assert_eq!(
                read_pack_cubin(&installed.path, "axpy", variant).unwrap(),
                fixture.cubin
            );
        }
    }

    fn installed_index(dir: &Path) -> PackIndex {
        read_pack(dir).unwrap()
    }

    #[test]
    fn a_pack_file_that_is_a_link_out_before_the_check_is_refused_and_installs_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let fixture = fixture_pack(dir.path());
        let (artifact, stored) = fixture.artifact.clone();
        // The very frame, outside: only where it lies is wrong.
        let outside = dir.path().join("outside.zst");
        fs::write(&outside, &stored).unwrap();
        fs::remove_file(fixture.pack.join(&artifact)).unwrap();
        std::os::unix::fs::symlink(&outside, fixture.pack.join(&artifact)).unwrap();
        let cache = dir.path().join("jit");
        for error in [
            verify_pack(&fixture.pack, &fixture.bundle).unwrap_err(),
            install_pack(&fixture.pack, &fixture.bundle, &cache).unwrap_err(),
        ] {
            assert!(error.is_refusal(), "{error:?}");
            let message = crate::error_chain(&error);
            assert!(message.contains("leads out"), "{message}");
            assert!(message.contains("`axpy` (cu129/sm_90a)"), "{message}");
        }
        let installed = installed_packs_dir(&cache, "af3-kernels");
        assert!(
            fs::read_dir(&installed).map_or(true, |mut dir| dir.next().is_none()),
            "a refused pack installs nothing"
        );
    }

    #[test]
    fn an_oversized_pack_json_is_refused_unread() {
        let dir = tempfile::tempdir().unwrap();
        let fixture = fixture_pack(dir.path());
        // 120 MiB, sparse: refused by its size, before anything is reserved for it.
        let file = fs::File::create(fixture.pack.join(PACK_FILE)).unwrap();
        file.set_len(120 << 20).unwrap();
        let started = std::time::Instant::now();
        let error = read_pack(&fixture.pack).unwrap_err();
        assert!(started.elapsed().as_secs() < 2);
        assert!(error.is_refusal(), "{error:?}");
        let message = crate::error_chain(&error);
        assert!(message.contains("cap"), "{message}");
        assert!(message.contains(PACK_FILE), "{message}");
    }

    #[test]
    fn stale_or_unreadable_packs_are_passed_over_for_the_fallback() {
        let dir = tempfile::tempdir().unwrap();
        let fixture = fixture_pack(dir.path());
        let inputs = &fixture.bundle.index().kernels["axpy"].inputs;
        let dirs = [fixture.pack.clone()];
        let entries = |torch: &str| pack_entries(&dirs, "af3-kernels", "axpy", inputs, torch);
        assert_eq!(entries("2.13.*").unwrap().len(), 1);
        // The package's torch pin moved since the pack was exported: honest, and stale.
        assert_eq!(entries("2.14.*").unwrap(), Vec::new());
        // A `pack.json` that does not parse offers nothing, and blocks nothing.
        fs::write(fixture.pack.join(PACK_FILE), b"{ not json").unwrap();
        assert_eq!(entries("2.13.*").unwrap(), Vec::new());
    }
}
