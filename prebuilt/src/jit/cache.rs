//! The JIT cache: one entry per kernel key, written whole, found by key (layout in the module
//! docs of [`crate::jit`]).

use super::*;
use std::time::Duration;
#[cfg(test)]
use std::time::Instant;

use crate::cache::LockFailure;
use crate::untrusted::{read_regular_file, MAX_ARTIFACT_SIZE};

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
    pub(super) format: u32,
    pub(super) kernel: String,
    pub(super) key: String,
    pub(super) arch: Arch,
    pub(super) cuda: CudaBuild,
    pub(super) torch: String,
    pub(super) compiler: CompilerRecord,
    pub(super) digest: String,
    pub(super) size: u64,
    pub(super) functions: Vec<Function>,
    /// The layouts of the structs the kernel declares (`[kernels.<name>] structs`), as the
    /// compiler computed them; absent for a kernel that declares none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) structs: BTreeMap<String, StructLayout>,
}

/// Whether a complete entry for `key` is in the cache (without verifying its cubin).
pub fn is_cached(cache_dir: &Path, key: &KernelKey) -> bool {
    let paths = entry_paths(cache_dir, key);
    real_dirs(cache_dir, &paths.dir).is_ok()
        && fs::symlink_metadata(&paths.metadata).is_ok_and(|metadata| metadata.is_file())
}

/// How long a process waits for another one's lock on a key when
/// `KWHEEL_JIT_LOCK_TIMEOUT` is unset: longer than any real compile.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(600);

/// Largest `.json` of an entry read (its entries' symbols and parameter sizes).
const MAX_ENTRY_METADATA: u64 = 4 << 20;

/// The lock wait from `KWHEEL_JIT_LOCK_TIMEOUT` (whole seconds; `0` does not wait), else
/// [`DEFAULT_LOCK_TIMEOUT`].
pub fn lock_timeout_from(env: impl Fn(&str) -> Option<OsString>) -> Result<Duration, JitError> {
    let Some(value) = env(JIT_LOCK_TIMEOUT_ENV).filter(|value| !value.is_empty()) else {
        return Ok(DEFAULT_LOCK_TIMEOUT);
    };
    let value = value.to_string_lossy();
    value
        .trim()
        .parse::<u64>()
        .map(Duration::from_secs)
        .map_err(|_| JitError::LockTimeoutSetting {
            value: value.into_owned(),
        })
}

/// The cubin of `request`: from the cache under `cache_dir`, else compiled with `compiler`
/// and cached. Needs no GPU. Safe to call from many processes and threads at once: one
/// compiles, the others wait for it (at most `KWHEEL_JIT_LOCK_TIMEOUT`) and read its result.
/// A kernel whose recorded flags are off the allowlist is refused first ([`check_inputs`]).
pub fn compile_cached(
    request: &JitRequest<'_>,
    compiler: &JitCompiler,
    cache_dir: &Path,
) -> Result<JitOutput, JitError> {
    check_inputs(request.kernel, request.record)?;
    let timeout = lock_timeout_from(|name| std::env::var_os(name))?;
    let record = compiler.record();
    let key = request.key(&record);
    let paths = entry_paths(cache_dir, &key);
    if let Some(hit) = read_entry(cache_dir, &paths, request, &key) {
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
    create_dirs(cache_dir, &paths.dir)?;
    let lock = lock_entry(request.kernel, &paths.lock, timeout)?;
    // Whoever held the lock before may have just written the entry.
    if let Some(hit) = read_entry(cache_dir, &paths, request, &key) {
        return Ok(hit);
    }
    remove_leftovers(&paths.dir, &key);
    if let Some(recipe) = &request.record.recipe {
        let sources = request.bundle_root.join(SOURCES_DIR);
        check_source_tree(request.kernel, &sources, recipe)?;
    }
    let (cubin, functions, structs) = compile(request, compiler)?;
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
        structs: structs.clone(),
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
        structs,
        compiled: true,
        path: paths.cubin,
    })
}

/// Checks that the layout folder and the shard folder under `cache_dir` are folders, not
/// links: an entry is written and read only inside the cache. (`cache_dir` itself is the
/// user's choice and may be a link.)
fn real_dirs(cache_dir: &Path, shard: &Path) -> std::io::Result<()> {
    real_dir(&cache_dir.join(CACHE_LAYOUT))?;
    real_dir(shard)
}

fn real_dir(dir: &Path) -> std::io::Result<()> {
    let metadata = fs::symlink_metadata(dir)?;
    if metadata.is_dir() {
        return Ok(());
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        format!(
            "{} is {}, not a folder: the JIT cache never follows a link out of its root; \
             remove it",
            dir.display(),
            if metadata.file_type().is_symlink() {
                "a symbolic link"
            } else {
                "a file"
            }
        ),
    ))
}

/// Creates the layout and shard folders of an entry, each checked before the next is made
/// in it, so that nothing is created through a link.
fn create_dirs(cache_dir: &Path, shard: &Path) -> Result<(), JitError> {
    let failed = |dir: &Path| {
        let path = dir.to_path_buf();
        move |source| JitError::Cache {
            action: "use",
            path,
            source,
        }
    };
    fs::create_dir_all(cache_dir).map_err(|source| JitError::Cache {
        action: "create",
        path: cache_dir.to_path_buf(),
        source,
    })?;
    for dir in [&cache_dir.join(CACHE_LAYOUT), shard] {
        match fs::create_dir(dir) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(source) => {
                return Err(JitError::Cache {
                    action: "create",
                    path: dir.to_path_buf(),
                    source,
                })
            }
        }
        real_dir(dir).map_err(failed(dir))?;
    }
    Ok(())
}

/// Opens and locks `<key>.lock` (a regular file, not a link), waiting at most `timeout` for
/// another holder, then records this process's pid in it for whoever waits next.
pub(super) fn lock_entry(kernel: &str, path: &Path, timeout: Duration) -> Result<File, JitError> {
    crate::cache::lock_file(path, timeout).map_err(|failure| match failure {
        LockFailure::Timeout {
            path,
            waited,
            holder,
        } => JitError::LockTimeout {
            kernel: kernel.to_owned(),
            path,
            waited_s: waited.as_secs(),
            holder,
        },
        LockFailure::NotRegular { path } => JitError::Cache {
            action: "lock",
            path,
            source: not_a_cache_file(),
        },
        LockFailure::Io {
            action,
            path,
            source,
        } => JitError::Cache {
            action,
            path,
            source,
        },
    })
}

fn not_a_cache_file() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        "not a regular file (a link, a FIFO or a device has no place in the JIT cache; remove \
         it)",
    )
}

/// A cache file's bytes: a regular file (not a link, a FIFO or a device), at most `cap`.
fn read_cache_file(path: &Path, cap: u64) -> Option<Vec<u8>> {
    if !fs::symlink_metadata(path).ok()?.is_file() {
        return None;
    }
    read_regular_file(path, cap).ok()
}

/// The cached entry, if it is complete, matches the request and verifies: its `.json` names
/// the key and the architecture, and the `.cubin` has the size and sha256 the `.json` records
/// and validates with every entry. Anything else is a miss.
pub(super) fn read_entry(
    cache_dir: &Path,
    paths: &CacheEntryPaths,
    request: &JitRequest<'_>,
    key: &KernelKey,
) -> Option<JitOutput> {
    real_dirs(cache_dir, &paths.dir).ok()?;
    let metadata = read_cache_file(&paths.metadata, MAX_ENTRY_METADATA)?;
    let entry: CacheEntry = serde_json::from_slice(&metadata).ok()?;
    if entry.format != ENTRY_FORMAT || entry.key != key.0 || entry.arch != request.arch {
        return None;
    }
    let cubin = read_cache_file(&paths.cubin, entry.size.min(MAX_ARTIFACT_SIZE))?;
    if cubin.len() as u64 != entry.size || sha256_hex(&cubin) != entry.digest {
        return None;
    }
    let symbols: Vec<&str> = entry.functions.iter().map(|f| f.symbol.as_str()).collect();
    validate_cubin(&cubin, request.arch, &symbols).ok()?;
    // An entry that lacks a layout of a struct the kernel declares is not this kernel's.
    let declared = &request.record.inputs.computed.structs;
    if declared
        .keys()
        .any(|name| !entry.structs.contains_key(name))
    {
        return None;
    }
    Some(JitOutput {
        key: key.clone(),
        cubin,
        functions: entry.functions,
        structs: entry.structs,
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

    fn mkfifo(path: &Path) {
        let status = std::process::Command::new("mkfifo")
            .arg(path)
            .status()
            .unwrap();
        assert!(status.success());
    }

    fn request_fixture() -> KernelRecord {
        KernelRecord {
            inputs: crate::index::KernelInputs {
                entries: vec!["k".into()],
                cxx_std: "c++17".into(),
                ..Default::default()
            },
            recipe: None,
            constants: BTreeMap::new(),
            variants: Vec::new(),
            skipped: Vec::new(),
        }
    }

    fn request(record: &KernelRecord) -> JitRequest<'_> {
        JitRequest {
            bundle_root: Path::new("/nonexistent-bundle"),
            kernel: "k",
            record,
            torch: "2.13.*",
            arch: "sm_90a".parse().unwrap(),
            cuda: "cu130".parse().unwrap(),
        }
    }

    /// A key and its entry's paths under `cache`, the entry's folder created.
    fn entry_folder(cache: &Path) -> (KernelKey, CacheEntryPaths) {
        let key = KernelKey("5a".repeat(32));
        let paths = entry_paths(cache, &key);
        fs::create_dir_all(&paths.dir).unwrap();
        (key, paths)
    }

    #[test]
    fn case_9_a_fifo_cache_entry_is_a_miss_not_a_hang() {
        let cache = tempfile::tempdir().unwrap();
        let record = request_fixture();
        let request = request(&record);
        let (key, paths) = entry_folder(cache.path());
        mkfifo(&paths.metadata);
        mkfifo(&paths.cubin);
        let started = Instant::now();
        assert!(read_entry(cache.path(), &paths, &request, &key).is_none());
        assert!(started.elapsed() < Duration::from_secs(5));
        // A `.json` linked to a regular file is not an entry either.
        fs::remove_file(&paths.metadata).unwrap();
        let elsewhere = cache.path().join("planted.json");
        fs::write(&elsewhere, b"{}").unwrap();
        std::os::unix::fs::symlink(&elsewhere, &paths.metadata).unwrap();
        assert!(!is_cached(cache.path(), &key));
        assert!(read_entry(cache.path(), &paths, &request, &key).is_none());
    }

    #[test]
    fn case_9_a_tampered_cubin_is_a_miss() {
        let cache = tempfile::tempdir().unwrap();
        let record = request_fixture();
        let request = request(&record);
        let (key, paths) = entry_folder(cache.path());
        let cubin = b"not what the json records".to_vec();
        let entry = CacheEntry {
            format: ENTRY_FORMAT,
            kernel: "k".into(),
            key: key.0.clone(),
            arch: request.arch,
            cuda: request.cuda,
            torch: request.torch.into(),
            compiler: CompilerRecord {
                kind: "nvrtc".into(),
                version: "13.0.88".into(),
            },
            digest: sha256_hex(b"another cubin"),
            size: cubin.len() as u64,
            functions: Vec::new(),
            structs: BTreeMap::new(),
        };
        fs::write(&paths.metadata, serde_json::to_vec(&entry).unwrap()).unwrap();
        fs::write(&paths.cubin, &cubin).unwrap();
        // The `.json` is complete, but the cubin is not the one it records.
        assert!(is_cached(cache.path(), &key));
        assert!(read_entry(cache.path(), &paths, &request, &key).is_none());
    }

    #[test]
    fn case_9_a_symlinked_shard_folder_is_never_followed() {
        let cache = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let record = request_fixture();
        let request = request(&record);
        let compiler = crate::jit::tests::nvcc_with_host("gcc 12");
        let key = request.key(&compiler.record());
        let paths = entry_paths(cache.path(), &key);
        fs::create_dir_all(paths.dir.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), &paths.dir).unwrap();
        let error = compile_cached(&request, &compiler, cache.path()).unwrap_err();
        let message = error_chain(&error);
        assert!(
            matches!(error, JitError::Cache { action: "use", .. })
                && message.contains("is a symbolic link, not a folder"),
            "{message}"
        );
        assert_eq!(fs::read_dir(elsewhere.path()).unwrap().count(), 0);

        // The layout folder linked away is refused the same way.
        let cache = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), cache.path().join(CACHE_LAYOUT)).unwrap();
        let error = error_chain(&compile_cached(&request, &compiler, cache.path()).unwrap_err());
        assert!(error.contains("is a symbolic link"), "{error}");
        assert_eq!(fs::read_dir(elsewhere.path()).unwrap().count(), 0);
    }

    #[test]
    fn case_9_a_held_lock_times_out_naming_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.lock");
        let held = lock_entry("k", &path, Duration::from_secs(1)).unwrap();
        assert_eq!(
            fs::read_to_string(&path).unwrap(),
            format!("{}\n", std::process::id())
        );
        let started = Instant::now();
        let error = lock_entry("k", &path, Duration::from_millis(300)).unwrap_err();
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(300) && waited < Duration::from_secs(5),
            "{waited:?}"
        );
        let message = error.to_string();
        assert!(
            matches!(error, JitError::LockTimeout { holder: Some(pid), .. } if pid == std::process::id()),
            "{message}"
        );
        assert!(
            message.contains(&format!("process {} holds it", std::process::id()))
                && message.contains("KWHEEL_JIT_LOCK_TIMEOUT"),
            "{message}"
        );
        drop(held);
        // Released, the lock is taken at once.
        lock_entry("k", &path, Duration::ZERO).unwrap();
    }

    #[test]
    fn case_9_a_lock_file_that_is_a_fifo_or_a_link_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo.lock");
        mkfifo(&fifo);
        let error = lock_entry("k", &fifo, Duration::ZERO).unwrap_err();
        assert!(
            error_chain(&error).contains("not a regular file"),
            "{error}"
        );
        // A dangling link would otherwise create its target, wherever it points.
        let target = dir.path().join("outside").join("created");
        fs::create_dir_all(target.parent().unwrap()).unwrap();
        let link = dir.path().join("link.lock");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(lock_entry("k", &link, Duration::ZERO).is_err());
        assert!(!target.exists());
    }

    #[test]
    fn lock_timeout_follows_the_environment() {
        assert_eq!(lock_timeout_from(env(&[])).unwrap(), DEFAULT_LOCK_TIMEOUT);
        let pairs = [("KWHEEL_JIT_LOCK_TIMEOUT", "5")];
        assert_eq!(
            lock_timeout_from(env(&pairs)).unwrap(),
            Duration::from_secs(5)
        );
        let pairs = [("KWHEEL_JIT_LOCK_TIMEOUT", "soon")];
        let error = lock_timeout_from(env(&pairs)).unwrap_err();
        assert_eq!(
            error.to_string(),
            "KWHEEL_JIT_LOCK_TIMEOUT=`soon` is not a whole number of seconds"
        );
    }
}
