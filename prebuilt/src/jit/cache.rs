//! The JIT cache: one entry per kernel key, written whole, found by key (layout in the module
//! docs of [`crate::jit`]).

use super::*;

/// The cache layout's directory name. Bump it when the entry format or the file names change.
pub const CACHE_LAYOUT: &str = "kernels-v1";
/// Version of an entry's `.json`; an entry of another version is a miss.
pub(super) const ENTRY_FORMAT: u32 = 1;

/// The JIT cache directory: `$KWHEEL_JIT_CACHE`, else `${XDG_CACHE_HOME:-~/.cache}/kwheel/jit`.
pub fn default_cache_dir() -> PathBuf {
    cache_dir_from(|name| std::env::var_os(name))
}

pub(super) fn cache_dir_from(env: impl Fn(&str) -> Option<OsString>) -> PathBuf {
    cache_dir_in(env, JIT_CACHE_ENV, "jit")
}

/// The files of one cache entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheEntryPaths {
    /// `<cache>/kernels-v1/<key[..2]>/`.
    pub dir: PathBuf,
    /// `<key>.cubin`.
    pub cubin: PathBuf,
    /// `<key>.json`, written last: an entry without it does not exist.
    pub metadata: PathBuf,
    /// `<key>.lock`, locked while the key compiles.
    pub lock: PathBuf,
}

/// Where the entry for `key` lives under `cache_dir`.
pub fn entry_paths(cache_dir: &Path, key: &KernelKey) -> CacheEntryPaths {
    let key = key.0.as_str();
    let dir = cache_dir.join(CACHE_LAYOUT).join(&key[..2.min(key.len())]);
    CacheEntryPaths {
        cubin: dir.join(format!("{key}.cubin")),
        metadata: dir.join(format!("{key}.json")),
        lock: dir.join(format!("{key}.lock")),
        dir,
    }
}

/// What an entry's `.json` records.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CacheEntry {
    format: u32,
    kernel: String,
    key: String,
    arch: Arch,
    cuda: CudaBuild,
    torch: String,
    compiler: CompilerRecord,
    digest: String,
    size: u64,
    functions: Vec<Function>,
}

/// Whether a complete entry for `key` is in the cache (without verifying its cubin).
pub fn is_cached(cache_dir: &Path, key: &KernelKey) -> bool {
    entry_paths(cache_dir, key).metadata.is_file()
}

/// The cubin of `request`: from the cache under `cache_dir`, else compiled with `compiler`
/// and cached. Needs no GPU. Safe to call from many processes and threads at once: one
/// compiles, the others wait for it and read its result.
pub fn compile_cached(
    request: &JitRequest<'_>,
    compiler: &JitCompiler,
    cache_dir: &Path,
) -> Result<JitOutput, JitError> {
    let record = compiler.record();
    let key = request.key(&record);
    let paths = entry_paths(cache_dir, &key);
    if let Some(hit) = read_entry(&paths, request, &key) {
        return Ok(hit);
    }
    let cache_error = |action, path: &Path| {
        let path = path.to_path_buf();
        move |source| JitError::Cache {
            action,
            path,
            source,
        }
    };
    fs::create_dir_all(&paths.dir).map_err(cache_error("create", &paths.dir))?;
    let lock = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&paths.lock)
        .map_err(cache_error("open", &paths.lock))?;
    FileExt::lock_exclusive(&lock).map_err(cache_error("lock", &paths.lock))?;
    // Whoever held the lock before may have just written the entry.
    if let Some(hit) = read_entry(&paths, request, &key) {
        return Ok(hit);
    }
    remove_leftovers(&paths.dir, &key);
    let (cubin, functions) = compile(request, compiler)?;
    let entry = CacheEntry {
        format: ENTRY_FORMAT,
        kernel: request.kernel.to_owned(),
        key: key.0.clone(),
        arch: request.arch,
        cuda: request.cuda,
        torch: request.torch.to_owned(),
        compiler: record,
        digest: sha256_hex(&cubin),
        size: cubin.len() as u64,
        functions: functions.clone(),
    };
    let mut metadata = serde_json::to_string_pretty(&entry).expect("a cache entry serializes");
    metadata.push('\n');
    write_atomically(&paths.cubin, &cubin).map_err(cache_error("write", &paths.cubin))?;
    write_atomically(&paths.metadata, metadata.as_bytes())
        .map_err(cache_error("write", &paths.metadata))?;
    // Closing the file releases the lock too; unlocking first makes the order explicit.
    let _ = FileExt::unlock(&lock);
    Ok(JitOutput {
        key,
        cubin,
        functions,
        compiled: true,
        path: paths.cubin,
    })
}

/// The cached entry, if it is complete, matches the request and verifies.
pub(super) fn read_entry(
    paths: &CacheEntryPaths,
    request: &JitRequest<'_>,
    key: &KernelKey,
) -> Option<JitOutput> {
    let metadata = fs::read(&paths.metadata).ok()?;
    let entry: CacheEntry = serde_json::from_slice(&metadata).ok()?;
    if entry.format != ENTRY_FORMAT || entry.key != key.0 || entry.arch != request.arch {
        return None;
    }
    let cubin = fs::read(&paths.cubin).ok()?;
    if cubin.len() as u64 != entry.size || sha256_hex(&cubin) != entry.digest {
        return None;
    }
    let symbols: Vec<&str> = entry.functions.iter().map(|f| f.symbol.as_str()).collect();
    validate_cubin(&cubin, request.arch, &symbols).ok()?;
    Some(JitOutput {
        key: key.clone(),
        cubin,
        functions: entry.functions,
        compiled: false,
        path: paths.cubin.clone(),
    })
}

/// Removes temp files a killed writer of `key` left. Only called with the key's lock held, so
/// no live process is writing them.
pub(super) fn remove_leftovers(dir: &Path, key: &KernelKey) {
    let prefix = format!(".{}.", key.0);
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(&prefix) && name.ends_with(".tmp") {
            let _ = fs::remove_file(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jit::tests::env;

    #[test]
    fn cache_dir_follows_the_environment() {
        let pairs = [("KWHEEL_JIT_CACHE", "/jit"), ("HOME", "/home/me")];
        assert_eq!(cache_dir_from(env(&pairs)), PathBuf::from("/jit"));
        let pairs = [("XDG_CACHE_HOME", "/xdg"), ("HOME", "/home/me")];
        assert_eq!(
            cache_dir_from(env(&pairs)),
            PathBuf::from("/xdg/kwheel/jit")
        );
        let pairs = [("HOME", "/home/me"), ("KWHEEL_JIT_CACHE", "")];
        assert_eq!(
            cache_dir_from(env(&pairs)),
            PathBuf::from("/home/me/.cache/kwheel/jit")
        );
    }

    #[test]
    fn entries_are_sharded_by_key_prefix() {
        let key = KernelKey("5a0de1".repeat(10) + "abcd");
        let paths = entry_paths(Path::new("/cache"), &key);
        assert_eq!(paths.dir, PathBuf::from("/cache/kernels-v1/5a"));
        assert_eq!(paths.cubin, paths.dir.join(format!("{}.cubin", key.0)));
        assert_eq!(paths.metadata, paths.dir.join(format!("{}.json", key.0)));
        assert_eq!(paths.lock, paths.dir.join(format!("{}.lock", key.0)));
    }

    #[test]
    fn atomic_writes_leave_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.cubin");
        write_atomically(&path, b"one").unwrap();
        write_atomically(&path, b"two").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|entry| entry.unwrap().file_name())
            .collect();
        assert_eq!(names, ["k.cubin"]);
    }

    #[test]
    fn leftovers_of_a_key_are_removed_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let key = KernelKey("ab".repeat(32));
        let other = KernelKey("cd".repeat(32));
        let leftover = dir.path().join(format!(".{}.cubin.123.0.tmp", key.0));
        let foreign = dir.path().join(format!(".{}.cubin.123.0.tmp", other.0));
        let entry = dir.path().join(format!("{}.cubin", key.0));
        for path in [&leftover, &foreign, &entry] {
            fs::write(path, b"x").unwrap();
        }
        remove_leftovers(dir.path(), &key);
        assert!(!leftover.exists());
        assert!(foreign.exists() && entry.exists());
    }
}
