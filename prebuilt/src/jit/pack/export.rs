//! `kwheel jit export`: a package's entries of this machine's JIT cache, checked one by one
//! against the package's shipped sources, written as a warm pack.

use super::*;
use crate::bundle::SOURCES_DIR;
use crate::index::StoredFile;
use crate::jit::cache::{CacheEntry, ENTRY_FORMAT};
use crate::untrusted::read_regular_file;

/// Largest cache entry `.json` read.
const MAX_ENTRY_METADATA: u64 = 4 << 20;

/// What [`export_pack`] wrote, and what it passed over.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ExportReport {
    /// The pack's folder.
    pub path: PathBuf,
    /// The package.
    pub package: String,
    /// Each entry written, `kernel cu129/sm_89`.
    pub entries: Vec<String>,
    /// Each cache entry of the package passed over, and why.
    pub skipped: Vec<String>,
}

/// Writes the JIT results `jit_cache` holds for `bundle`'s package as a warm pack at `out`.
///
/// Each cache entry of one of the package's kernels is taken only when its key is the one the
/// package's index gives for the entry's target and compiler, the shipped sources still have
/// the digests the index records, its cubin has the size and sha256 its entry records, is the
/// cubin of its target, toolkit and entries, and is not a stub; anything else is passed over
/// with the reason. `out` is replaced whole (by rename) when it is a pack, and refused when it
/// is anything else but an empty folder. A cache holding nothing of the package is an error.
pub fn export_pack(
    bundle: &Bundle,
    jit_cache: &Path,
    out: &Path,
) -> Result<ExportReport, PackError> {
    let index = bundle.index();
    let mut kernels: BTreeMap<String, PackKernel> = BTreeMap::new();
    let mut skipped = Vec::new();
    let mut sources_checked: BTreeMap<String, Result<(), String>> = BTreeMap::new();
    let mut cubins: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for (metadata_path, entry) in cache_entries(jit_cache) {
        let Some(record) = index.kernels.get(&entry.kernel) else {
            continue;
        };
        let label = format!("{}/{}", entry.cuda, entry.arch);
        let name = format!("`{}` {label} ({})", entry.kernel, metadata_path.display());
        let sources = sources_checked
            .entry(entry.kernel.clone())
            .or_insert_with(|| shipped_sources(bundle, &entry.kernel, record));
        if let Err(reason) = sources {
            skipped.push(format!("{name}: {reason}"));
            continue;
        }
        match exportable(bundle, record, &metadata_path, &entry) {
            Ok((variant, cubin)) => {
                cubins.insert(variant.artifact.digest.clone(), cubin);
                let kernel = kernels
                    .entry(entry.kernel.clone())
                    .or_insert_with(|| PackKernel {
                        inputs: inputs_digest(&record.inputs),
                        variants: Vec::new(),
                    });
                kernel.variants.push(variant);
            }
            Err(reason) => skipped.push(format!("{name}: {reason}")),
        }
    }
    if kernels.is_empty() {
        return Err(PackError::Empty {
            package: index.package.clone(),
            cache: jit_cache.to_path_buf(),
            skipped,
        });
    }
    for kernel in kernels.values_mut() {
        kernel
            .variants
            .sort_by(|a, b| (a.cuda, a.arch, &a.key).cmp(&(b.cuda, b.arch, &b.key)));
    }
    let pack = PackIndex {
        format: PACK_FORMAT,
        package: index.package.clone(),
        torch: index.torch.clone(),
        kernels,
    };
    write_pack(out, &pack, &cubins)?;
    Ok(ExportReport {
        path: out.to_path_buf(),
        package: pack.package.clone(),
        entries: entry_names(&pack),
        skipped,
    })
}

/// Every readable entry `.json` of the JIT cache, with its path, in key order.
fn cache_entries(jit_cache: &Path) -> Vec<(PathBuf, CacheEntry)> {
    let layout = jit_cache.join(CACHE_LAYOUT);
    let real_dir = |dir: &Path| fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir());
    if !real_dir(&layout) {
        return Vec::new();
    }
    let mut paths = Vec::new();
    for shard in fs::read_dir(&layout).into_iter().flatten().flatten() {
        if !real_dir(&shard.path()) {
            continue;
        }
        for file in fs::read_dir(shard.path()).into_iter().flatten().flatten() {
            let path = file.path();
            let is_entry = path.extension().is_some_and(|ext| ext == "json")
                && !file.file_name().to_string_lossy().starts_with('.');
            if is_entry && fs::symlink_metadata(&path).is_ok_and(|m| m.is_file()) {
                paths.push(path);
            }
        }
    }
    paths.sort();
    paths
        .into_iter()
        .filter_map(|path| {
            let bytes = read_regular_file(&path, MAX_ENTRY_METADATA).ok()?;
            let entry: CacheEntry = serde_json::from_slice(&bytes).ok()?;
            (entry.format == ENTRY_FORMAT).then_some((path, entry))
        })
        .collect()
}

/// Whether the bundle ships `kernel`'s sources with the digests its index records.
fn shipped_sources(bundle: &Bundle, kernel: &str, record: &KernelRecord) -> Result<(), String> {
    if record.recipe.is_none() {
        return Err("the package ships no sources of it, so its key cannot be checked".into());
    }
    verify_sources(
        kernel,
        &bundle.root().join(SOURCES_DIR),
        &record.inputs.files,
    )
    .map_err(|error| error_chain(&error))
}

/// The pack variant and cubin of one cache entry, or why it is passed over.
fn exportable(
    bundle: &Bundle,
    record: &KernelRecord,
    metadata_path: &Path,
    entry: &CacheEntry,
) -> Result<(Variant, Vec<u8>), String> {
    let torch = &bundle.index().torch;
    let cubin_path = metadata_path.with_extension("cubin");
    let cubin = read_regular_file(&cubin_path, entry.size.min(MAX_ARTIFACT_SIZE))
        .map_err(|error| format!("cannot read {}: {error}", cubin_path.display()))?;
    let digest = sha256_hex(&cubin);
    if cubin.len() as u64 != entry.size || digest != entry.digest {
        return Err(format!(
            "{} is damaged: {} bytes with sha256 {digest}, its entry records {} bytes with {}",
            cubin_path.display(),
            cubin.len(),
            entry.size,
            entry.digest
        ));
    }
    let stored = zstd::encode_all(cubin.as_slice(), 19)
        .map_err(|error| format!("cannot compress {}: {error}", cubin_path.display()))?;
    let variant = Variant {
        arch: entry.arch,
        cuda: entry.cuda,
        torch: entry.torch.clone(),
        compiler: entry.compiler.clone(),
        key: entry.key.clone(),
        artifact: StoredFile::artifact(digest, cubin.len() as u64, stored.len() as u64),
        functions: entry.functions.clone(),
        structs: entry.structs.clone(),
    };
    check_variant(&entry.kernel, &record.inputs, torch, &variant)?;
    if record
        .variants
        .iter()
        .any(|shipped| shipped.key == variant.key)
    {
        return Err("the package ships this cubin prebuilt already".into());
    }
    let expected = ExpectedCubin {
        arch: variant.arch,
        cuda: variant.cuda,
        compiler: &variant.compiler,
        functions: &variant.functions,
    };
    check_identity(&cubin, &expected).map_err(|error| error_chain(&error))?;
    let compiler = variant.compiler.to_string();
    run::refuse_stubs(
        &entry.kernel,
        variant.arch,
        &compiler,
        &cubin,
        &variant.functions,
    )
    .map_err(|error| error_chain(&error))?;
    Ok((variant, stored))
}

/// Writes `pack` and its (compressed) artifacts at `out`: into a temp folder beside it, then
/// renamed over it.
fn write_pack(
    out: &Path,
    pack: &PackIndex,
    stored: &BTreeMap<String, Vec<u8>>,
) -> Result<(), PackError> {
    let in_the_way = |reason: &str| PackError::Write {
        path: out.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::AlreadyExists, reason.to_owned()),
    };
    let old = match fs::symlink_metadata(out) {
        Err(_) => None,
        Ok(metadata) if metadata.is_dir() && out.join(PACK_FILE).is_file() => Some(true),
        Ok(metadata)
            if metadata.is_dir() && fs::read_dir(out).is_ok_and(|mut d| d.next().is_none()) =>
        {
            Some(false)
        }
        Ok(_) => {
            return Err(in_the_way(
                "it exists and is not a warm pack (nor an empty folder); give another --out",
            ))
        }
    };
    let parent = match out.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = out.file_name().unwrap_or_default().to_string_lossy();
    let temp = parent.join(format!(".{name}.{}.tmp", std::process::id()));
    let _ = fs::remove_dir_all(&temp);
    let written = (|| {
        for (digest, bytes) in stored {
            write_new(&temp.join(artifact_path(digest)), bytes)?;
        }
        let mut text = serde_json::to_string_pretty(pack).expect("a pack index serializes");
        text.push('\n');
        write_new(&temp.join(PACK_FILE), text.as_bytes())?;
        let failed = |source| PackError::Write {
            path: out.to_path_buf(),
            source,
        };
        match old {
            Some(true) => {
                let previous = parent.join(format!(".{name}.{}.old", std::process::id()));
                fs::rename(out, &previous).map_err(failed)?;
                fs::rename(&temp, out).map_err(failed)?;
                let _ = fs::remove_dir_all(&previous);
            }
            Some(false) => {
                fs::remove_dir(out).map_err(failed)?;
                fs::rename(&temp, out).map_err(failed)?;
            }
            None => fs::rename(&temp, out).map_err(failed)?,
        }
        Ok(())
    })();
    if written.is_err() {
        let _ = fs::remove_dir_all(&temp);
    }
    written
}
