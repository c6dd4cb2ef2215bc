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

mod export;

pub use export::{export_pack, ExportReport};

use std::io::Write as _;

use super::*;
use crate::bundle::{artifact_path, read_stored, Bundle, BundleError, FrameDictionary};
use crate::cubin::identity::{check_identity, ExpectedCubin};
use crate::index::{KernelInputs, Variant};
use crate::untrusted::{
    check_stored, read_regular_file, ArtifactPath, KernelName, MAX_ARTIFACT_SIZE, MAX_INDEX_SIZE,
};

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
        "the warm pack {} is refused: its `{kernel}` ({variant}) {reason}; export it again \
         from a machine with this release of the package, or remove it",
        path.display()
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
    if !matches!(variant.compiler.kind.as_str(), "nvrtc" | "nvcc") {
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

/// The bytes of the pack's `pack.json` (a regular file inside the pack, no link leading out),
/// read once: what is verified is what is installed.
fn read_pack_bytes(dir: &Path) -> Result<(PathBuf, Vec<u8>), PackError> {
    let path = dir.join(PACK_FILE);
    let read_error = |source| PackError::Read {
        path: path.clone(),
        source,
    };
    let relative = ArtifactPath::parse(PACK_FILE).expect("a plain file name");
    crate::untrusted::resolve_inside(dir, &relative).map_err(read_error)?;
    let bytes = read_regular_file(&path, MAX_INDEX_SIZE).map_err(read_error)?;
    Ok((path, bytes))
}

/// Most entries a pack may hold, and most bytes its cubins may decode to in all: far above a
/// machine's JIT cache for one package, and a bound on the work of verifying one.
pub const MAX_PACK_ENTRIES: usize = 16_384;
/// See [`MAX_PACK_ENTRIES`].
pub const MAX_PACK_DECODED: u64 = 4 << 30;

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

/// The cubin of `variant` (an entry of `kernel` in the pack at `pack`): read, decompressed and
/// verified (digest, target, toolkit, entries and their parameters, not a stub), else the
/// error naming the pack and the kernel.
pub fn read_pack_cubin(pack: &Path, kernel: &str, variant: &Variant) -> Result<Vec<u8>, PackError> {
    let label = variant.label();
    let refused = |source: Box<dyn std::error::Error + Send + Sync>| PackError::Cubin {
        path: pack.join(PACK_FILE),
        kernel: kernel.to_owned(),
        variant: label.clone(),
        source,
    };
    let bytes = read_stored(
        pack,
        &variant.artifact,
        FrameDictionary::None,
        kernel,
        &label,
    )
    .map_err(|error: BundleError| refused(Box::new(error)))?;
    let expected = ExpectedCubin {
        arch: variant.arch,
        cuda: variant.cuda,
        compiler: &variant.compiler,
        functions: &variant.functions,
    };
    check_identity(&bytes, &expected).map_err(|error| refused(Box::new(error)))?;
    let compiler = variant.compiler.to_string();
    run::refuse_stubs(kernel, variant.arch, &compiler, &bytes, &variant.functions)
        .map_err(|error| refused(Box::new(error)))?;
    Ok(bytes)
}

/// Checks the whole pack at `dir` against `bundle`: its package, and for every entry the key
/// its kernel's inputs give and its cubin. Reads every cubin; used before a pack is installed
/// or shipped.
pub fn verify_pack(dir: &Path, bundle: &Bundle) -> Result<PackIndex, PackError> {
    verify_index(dir, read_pack(dir)?, bundle)
}

/// [`verify_pack`] of `index`, the pack index read from `dir`.
fn verify_index(dir: &Path, index: PackIndex, bundle: &Bundle) -> Result<PackIndex, PackError> {
    let path = dir.join(PACK_FILE);
    let package = &bundle.index().package;
    if crate::site::normalize_package(&index.package) != crate::site::normalize_package(package) {
        return Err(PackError::Package {
            path,
            pack: index.package,
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
            read_pack_cubin(dir, kernel, variant)?;
        }
    }
    Ok(index)
}

/// The id a pack installs under: 16 hex digits of its `pack.json`'s sha256.
pub fn pack_id(dir: &Path) -> Result<String, PackError> {
    let path = dir.join(PACK_FILE);
    let bytes = read_regular_file(&path, MAX_INDEX_SIZE)
        .map_err(|source| PackError::Read { path, source })?;
    Ok(sha256_hex(&bytes)[..16].to_owned())
}

/// The files of the pack at `dir`, as (`/`-separated path inside the pack, path): `pack.json`
/// and each entry's artifact, sorted.
pub fn pack_files(dir: &Path, index: &PackIndex) -> Vec<(String, PathBuf)> {
    let mut files = BTreeMap::new();
    files.insert(PACK_FILE.to_owned(), dir.join(PACK_FILE));
    for variant in index.kernels.values().flat_map(|kernel| &kernel.variants) {
        let relative = variant.artifact.path.clone();
        files.insert(relative.clone(), dir.join(&relative));
    }
    files.into_iter().collect()
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

/// Verifies the pack at `dir` against `bundle` ([`verify_pack`]) and installs a copy under
/// `jit_cache` where the loader looks ([`pack_dirs`]). Nothing is written unless every entry
/// verifies; the copy appears whole, by rename.
pub fn install_pack(dir: &Path, bundle: &Bundle, jit_cache: &Path) -> Result<Installed, PackError> {
    // `pack.json` is read once: the bytes verified are the bytes installed and named.
    let (pack_path, pack_json) = read_pack_bytes(dir)?;
    let index = verify_index(dir, parse_pack(&pack_path, &pack_json)?, bundle)?;
    let entries = entry_names(&index);
    let parent = installed_packs_dir(jit_cache, &index.package);
    let id = sha256_hex(&pack_json)[..16].to_owned();
    let path = parent.join(&id);
    let installed = |already| Installed {
        path: path.clone(),
        package: bundle.index().package.clone(),
        entries: entries.clone(),
        already,
    };
    if path.join(PACK_FILE).is_file() && read_pack(&path).is_ok_and(|found| found == index) {
        return Ok(installed(true));
    }
    let write_error = |path: &Path| {
        let path = path.to_path_buf();
        move |source| PackError::Write { path, source }
    };
    fs::create_dir_all(&parent).map_err(write_error(&parent))?;
    let temp = parent.join(format!(".{id}.{}.tmp", std::process::id()));
    let _ = fs::remove_dir_all(&temp);
    let copied = copy_pack(dir, &pack_json, &index, &temp);
    let placed = copied.and_then(|()| {
        let _ = fs::remove_dir_all(&path);
        fs::rename(&temp, &path).map_err(write_error(&path))
    });
    if placed.is_err() {
        let _ = fs::remove_dir_all(&temp);
    }
    placed.map(|()| installed(false))
}

/// Copies the files of the pack at `dir` into the new folder `to`.
pub(super) fn copy_pack(
    dir: &Path,
    pack_json: &[u8],
    index: &PackIndex,
    to: &Path,
) -> Result<(), PackError> {
    for (relative, from) in pack_files(dir, index) {
        let bytes = if relative == PACK_FILE {
            pack_json.to_vec()
        } else {
            read_regular_file(&from, MAX_ARTIFACT_SIZE).map_err(|source| PackError::Read {
                path: from.clone(),
                source,
            })?
        };
        let target = ArtifactPath::parse(&relative)
            .map_err(|error| PackError::Format {
                path: dir.join(PACK_FILE),
                reason: error.to_string(),
            })?
            .join_to(to);
        write_new(&target, &bytes)?;
    }
    Ok(())
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
/// `torch`) key, in pack order: what selection then chooses from. A pack of another package,
/// or exported from another release's sources, is passed over; a pack that cannot be read,
/// or an entry whose key its inputs do not give, is the error.
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
        let index = read_pack(dir)?;
        if crate::site::normalize_package(&index.package) != package {
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
