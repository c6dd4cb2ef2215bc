//! The user's caches: where they live, how files enter them, and the artifact cache.
//!
//! Every kwheel cache sits under `<cache home>/kwheel/<bucket>` unless its own variable
//! overrides it ([`cache_dir_from`]), is never inside site-packages or a bundle, and has a
//! versioned layout directory, so a format change starts a new bucket instead of misreading
//! an old one. The cache home ([`cache_home`]) is `$XDG_CACHE_HOME` when it is an absolute
//! path, else `$HOME/.cache` when `HOME` is one; with neither, a cache that must have a
//! folder gets [`UNWRITABLE_CACHE_HOME`], where every write fails naming what to set:
//!
//! ```text
//! ~/.cache/kwheel/
//! ├── artifacts/cubins-v1/        verified cubins a slim wheel's store provided (ArtifactCache)
//! ├── jit/kernels-v1/             JIT-compiled cubins by kernel key (crate::jit)
//! └── build/                      the bundler's build cache (bundler::cache)
//! ```
//!
//! Every file another process may read is written through a [`PendingFile`] (bytes at once:
//! [`write_atomically`]): a temp file in the same directory, renamed over the target whole.
//! Work on one key by many processes is serialized by [`lock_file`]: the operating system's
//! lock (`flock`, gone with its process), on a regular file that is checked to be the one
//! opened, held at most a timeout, with the holder's pid written in so that a wait that ends
//! names who held it.
//!
//! # The artifact cache
//!
//! ```text
//! ${KWHEEL_ARTIFACT_CACHE:-${XDG_CACHE_HOME:-~/.cache}/kwheel/artifacts}/
//! └── cubins-v1/                  layout version (CACHE_LAYOUT): bump when an entry changes
//!     └── 5a/                     first two hex digits of the digest
//!         ├── 5a0d…e1.cubin       the cubin, named by its sha256, renamed into place whole
//!         └── .5a0d…e1.cubin.<pid>.<random>.tmp  a write in progress (never read as an entry)
//! ```
//!
//! An entry is checked against the index each time it is read, and a damaged one is removed.
//! Entry paths come from digests parsed as [`Digest`] (64 lowercase hex digits), so an index
//! cannot make the cache read, write or remove anything but its own entries.

use std::ffi::OsString;
use std::fs::{self, File};
use std::io::Write as _;
use std::io::{Seek as _, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

// Called by path: `File` has inherent lock methods of the same names in newer Rust.
use fs4::fs_std::FileExt;

use crate::env::ARTIFACT_CACHE_ENV;
use crate::index::StoredFile;
use crate::key::sha256_hex;
use crate::untrusted::{read_regular_file, Digest, MAX_ARTIFACT_SIZE};

/// A kwheel cache directory: `$<override_var>` when set, else `<cache home>/kwheel/<leaf>`
/// ([`cache_home_from`], or [`UNWRITABLE_CACHE_HOME`] where there is none); `env` reads the
/// environment (tests inject it).
pub fn cache_dir_from(
    env: impl Fn(&str) -> Option<OsString>,
    override_var: &str,
    leaf: &str,
) -> PathBuf {
    if let Some(dir) = env(override_var).filter(|value| !value.is_empty()) {
        return PathBuf::from(dir);
    }
    cache_home_from(env)
        .unwrap_or_else(|_| PathBuf::from(UNWRITABLE_CACHE_HOME))
        .join("kwheel")
        .join(leaf)
}

/// Where the caches go for a caller that cannot fail when there is no cache home: a path
/// under `/dev/null`, which is not a folder, so every read there misses and every write fails
/// with an error that names this path, and so says what to set. Never a temp folder (another
/// user could plant files there) or a relative one (it would follow the working folder).
pub const UNWRITABLE_CACHE_HOME: &str = "/dev/null/no-cache-home-set-HOME-or-XDG_CACHE_HOME";

/// Neither `XDG_CACHE_HOME` nor `HOME` is an absolute path.
#[derive(Debug, thiserror::Error)]
#[error(
    "no cache folder: neither XDG_CACHE_HOME nor HOME is set to an absolute path; set one of them"
)]
pub struct NoCacheHome;

/// The user's cache folder: `$XDG_CACHE_HOME` when it is an absolute path, else
/// `$HOME/.cache` when `HOME` is one, else an error: never a temp or a relative folder. Every
/// kwheel cache lives under its `kwheel/` (see the module docs).
pub fn cache_home() -> Result<PathBuf, NoCacheHome> {
    cache_home_from(|name| std::env::var_os(name))
}

/// [`cache_home`] in the environment `env` describes.
pub fn cache_home_from(env: impl Fn(&str) -> Option<OsString>) -> Result<PathBuf, NoCacheHome> {
    let absolute = |name: &str| {
        env(name)
            .map(PathBuf::from)
            .filter(|path| path.is_absolute())
    };
    absolute("XDG_CACHE_HOME")
        .or_else(|| absolute("HOME").map(|home| home.join(".cache")))
        .ok_or(NoCacheHome)
}

/// [`cache_home`], or [`UNWRITABLE_CACHE_HOME`] where there is none, for a caller that cannot
/// fail (a default).
pub fn cache_home_or_unwritable() -> PathBuf {
    cache_home().unwrap_or_else(|_| PathBuf::from(UNWRITABLE_CACHE_HOME))
}

/// A file being written beside its target, put in place whole by a rename when it is
/// complete: readers of the target see the old file or the new one, never a part.
///
/// The temp file sits in the target's folder (created when absent), so the rename never
/// crosses a file system, and is named `.<file name>.<pid>.<random>.tmp`, so the owner of a
/// lock over the target can find what a killed writer left. It is created with the mode a
/// plain `File::create` gives (`0o666` less the umask), not a temp file's `0o600`: bundles and
/// caches are read by other users. A pending file that is dropped without being persisted is
/// removed. There is no `fsync` unless the caller asks for one ([`PendingFile::sync`]): every
/// reader of the caches and bundles verifies them (by digest or validation), so a file cut
/// short by a power loss reads as a miss, never as a wrong cubin.
#[derive(Debug)]
pub struct PendingFile<F = File> {
    temp: tempfile::NamedTempFile<F>,
    target: PathBuf,
}

impl PendingFile {
    /// An empty file pending at `target`.
    pub fn new(target: &Path) -> std::io::Result<PendingFile> {
        let (folder, prefix) = temp_place(target)?;
        Ok(PendingFile {
            temp: temp_builder(&prefix).tempfile_in(folder)?,
            target: target.to_owned(),
        })
    }

    /// The open temp file, to write through.
    pub fn as_file(&self) -> &File {
        self.temp.as_file()
    }

    /// Flushes the file's bytes to the disk (`fsync`), for a file that must survive a power
    /// loss whole once it is in place.
    pub fn sync(&self) -> std::io::Result<()> {
        self.temp.as_file().sync_all()
    }
}

impl PendingFile<()> {
    /// `from` pending at `target` as a hard link, or as a copy where a link is not possible
    /// (another file system, a file system without links).
    pub fn linked(from: &Path, target: &Path) -> std::io::Result<PendingFile<()>> {
        let (folder, prefix) = temp_place(target)?;
        let temp =
            temp_builder(&prefix).make_in(folder, |temp| match fs::hard_link(from, temp) {
                // Taken: `make_in` tries another name; a copy must not write over it.
                Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => Err(error),
                Err(_) => fs::copy(from, temp).map(drop),
                Ok(()) => Ok(()),
            })?;
        Ok(PendingFile {
            temp,
            target: target.to_owned(),
        })
    }
}

impl<F> PendingFile<F> {
    /// The temp file's path (its mode can be set through it; never a path to keep).
    pub fn path(&self) -> &Path {
        self.temp.path()
    }

    /// Renames the file over its target, replacing any file there.
    pub fn persist(self) -> std::io::Result<()> {
        self.temp
            .persist(&self.target)
            .map(drop)
            .map_err(|error| error.error)
    }
}

impl std::io::Write for PendingFile {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.temp.write(bytes)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.temp.flush()
    }
}

/// The folder a temp file for `target` goes in (created) and the prefix of its name.
fn temp_place(target: &Path) -> std::io::Result<(&Path, String)> {
    let folder = match target.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    fs::create_dir_all(folder)?;
    let name = target
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok((folder, format!(".{name}.{}.", std::process::id())))
}

/// The builder of a temp file named `<prefix><random>.tmp`, with a plain file's mode.
fn temp_builder(prefix: &str) -> tempfile::Builder<'_, 'static> {
    use std::os::unix::fs::PermissionsExt;
    let mut builder = tempfile::Builder::new();
    builder
        .prefix(prefix)
        .suffix(".tmp")
        .rand_bytes(6)
        .permissions(fs::Permissions::from_mode(0o666));
    builder
}

/// Writes `bytes` to `path` through a [`PendingFile`], replacing any file there.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut pending = PendingFile::new(path)?;
    pending.write_all(bytes)?;
    pending.persist()
}

/// The cache layout's directory name. Bump it when the entry format or the file names change.
pub const CACHE_LAYOUT: &str = "cubins-v1";
/// The artifact cache directory: `$KWHEEL_ARTIFACT_CACHE`, else
/// `${XDG_CACHE_HOME:-~/.cache}/kwheel/artifacts`.
pub fn default_artifact_cache_dir() -> PathBuf {
    cache_dir_from(
        |name| std::env::var_os(name),
        ARTIFACT_CACHE_ENV,
        "artifacts",
    )
}

/// The user's cache of verified cubins, by digest (layout in the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArtifactCache {
    root: PathBuf,
}

impl Default for ArtifactCache {
    /// The cache at [`default_artifact_cache_dir`].
    fn default() -> Self {
        ArtifactCache::new(default_artifact_cache_dir())
    }
}

impl ArtifactCache {
    /// The cache under `dir` (created on first write).
    pub fn new(dir: impl Into<PathBuf>) -> ArtifactCache {
        ArtifactCache {
            root: dir.into().join(CACHE_LAYOUT),
        }
    }

    /// The directory the cache was made with (holding [`CACHE_LAYOUT`]).
    pub fn dir(&self) -> &Path {
        self.root.parent().unwrap_or(&self.root)
    }

    /// Where the cubin with sha256 `digest` lives; `None` when `digest` is not a sha256 (so
    /// no text from an index becomes a path outside the cache).
    pub fn entry_path(&self, digest: &str) -> Option<PathBuf> {
        let digest = Digest::parse(digest).ok()?;
        Some(self.entry_path_of(&digest))
    }

    fn entry_path_of(&self, digest: &Digest) -> PathBuf {
        self.root
            .join(digest.prefix())
            .join(format!("{digest}.cubin"))
    }

    /// Whether an entry of the right size is present (not verified: [`ArtifactCache::read`]
    /// verifies).
    pub fn contains(&self, stored: &StoredFile) -> bool {
        self.entry_path(&stored.digest)
            .and_then(|path| std::fs::symlink_metadata(path).ok())
            .is_some_and(|metadata| metadata.is_file() && metadata.len() == stored.size)
    }

    /// The cached cubin for `stored`, verified against its digest and size. A damaged entry
    /// (a regular file of the cache whose bytes do not match its digest) is removed and reads
    /// as absent; a valid one that `stored` gives another size reads as absent and stays.
    pub fn read(&self, stored: &StoredFile) -> Option<Vec<u8>> {
        let path = self.entry_path(&stored.digest)?;
        let metadata = std::fs::symlink_metadata(&path).ok()?;
        if !metadata.is_file() {
            return None;
        }
        let bytes = read_regular_file(&path, MAX_ARTIFACT_SIZE).ok();
        match bytes {
            // Bytes with the digest are the entry, whatever size `stored` claims: a claim of
            // another size is wrong and reads as absent, but removes nothing.
            Some(bytes) if sha256_hex(&bytes) == stored.digest => {
                (bytes.len() as u64 == stored.size).then_some(bytes)
            }
            _ => {
                let _ = std::fs::remove_file(&path);
                None
            }
        }
    }

    /// Stores verified `bytes` under `digest` with [`write_atomically`]; the entry's path.
    pub fn write(&self, digest: &str, bytes: &[u8]) -> std::io::Result<PathBuf> {
        let parsed = Digest::parse(digest)
            .map_err(|refusal| std::io::Error::new(std::io::ErrorKind::InvalidInput, refusal))?;
        let path = self.entry_path_of(&parsed);
        write_atomically(&path, bytes)?;
        Ok(path)
    }
}

/// Why [`lock_file`] did not take its lock.
#[derive(Debug, thiserror::Error)]
pub enum LockFailure {
    /// The path is a link, a FIFO, a device or a folder, or was swapped while being opened.
    #[error(
        "`{}` is not a regular file (a link, a FIFO or a device has no place there; remove it)",
        path.display()
    )]
    NotRegular {
        /// The lock file.
        path: PathBuf,
    },
    /// Opening, locking or writing the file failed.
    #[error("cannot {action} the lock `{}`", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The lock file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Another process held the lock for longer than the timeout.
    #[error(
        "waited {}s for the lock `{}`, held by {}",
        waited.as_secs(),
        path.display(),
        holder.map_or_else(|| "another process".to_owned(), |pid| format!("process {pid}"))
    )]
    Timeout {
        /// The lock file.
        path: PathBuf,
        /// How long this process waited.
        waited: Duration,
        /// The holder's pid, as it wrote it into the file.
        holder: Option<u32>,
    },
}

/// Takes an exclusive lock on the regular file `path` (created when absent), waiting at most
/// `timeout` for another process to release it, then writes this process's pid into it.
///
/// The file must be a regular file before and after opening, and the same one (device and
/// inode): a link or a FIFO in its place, or one swapped in while it is opened, is refused,
/// so a lock in a shared folder such as `/tmp` cannot be pointed at another file.
pub fn lock_file(path: &Path, timeout: Duration) -> Result<File, LockFailure> {
    use std::os::unix::fs::MetadataExt;
    let io = |action: &'static str| {
        move |source| LockFailure::Io {
            action,
            path: path.to_path_buf(),
            source,
        }
    };
    let not_regular = || LockFailure::NotRegular {
        path: path.to_path_buf(),
    };
    if let Ok(metadata) = fs::symlink_metadata(path) {
        if !metadata.is_file() {
            return Err(not_regular());
        }
    }
    let mut lock = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(io("open"))?;
    // The file opened is the one at `path` now, looked at without following a link.
    let opened = lock.metadata().map_err(io("open"))?;
    let at_path = fs::symlink_metadata(path).map_err(io("open"))?;
    if !opened.is_file()
        || !at_path.is_file()
        || opened.dev() != at_path.dev()
        || opened.ino() != at_path.ino()
    {
        return Err(not_regular());
    }
    let started = Instant::now();
    let mut pause = Duration::from_millis(5);
    loop {
        match FileExt::try_lock_exclusive(&lock) {
            Ok(true) => break,
            Ok(false) => {}
            Err(source) => return Err(io("lock")(source)),
        }
        let waited = started.elapsed();
        if waited >= timeout {
            return Err(LockFailure::Timeout {
                path: path.to_path_buf(),
                waited,
                holder: lock_holder(path),
            });
        }
        std::thread::sleep(pause.min(timeout - waited));
        pause = (pause * 2).min(Duration::from_millis(200));
    }
    let pid = format!("{}\n", std::process::id());
    lock.set_len(0)
        .and_then(|()| lock.seek(SeekFrom::Start(0)))
        .and_then(|_| lock.write_all(pid.as_bytes()))
        .map_err(io("write"))?;
    Ok(lock)
}

/// The pid the holder of the lock at `path` wrote into it, if any.
pub fn lock_holder(path: &Path) -> Option<u32> {
    let bytes = read_regular_file(path, 64).ok()?;
    std::str::from_utf8(&bytes).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lock in a shared folder cannot be pointed at another file: a link (to a file or
    /// nowhere) or a FIFO in its place is refused, and the file it points at is untouched.
    #[test]
    fn a_lock_planted_as_a_link_or_fifo_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        fs::write(&victim, b"precious").unwrap();
        let link = dir.path().join("k.lock");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        let failure = lock_file(&link, Duration::ZERO).unwrap_err();
        assert!(
            matches!(failure, LockFailure::NotRegular { .. }),
            "{failure}"
        );
        assert_eq!(fs::read(&victim).unwrap(), b"precious");
        let dangling = dir.path().join("d.lock");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &dangling).unwrap();
        assert!(lock_file(&dangling, Duration::ZERO).is_err());
        assert!(
            !dir.path().join("nowhere").exists(),
            "nothing made through the link"
        );
        let fifo = dir.path().join("f.lock");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if made.is_ok_and(|status| status.success()) {
            let failure = lock_file(&fifo, Duration::ZERO).unwrap_err();
            assert!(
                matches!(failure, LockFailure::NotRegular { .. }),
                "{failure}"
            );
        }
    }

    /// A held lock ends the wait at the timeout, naming the holder's pid.
    #[test]
    fn a_held_lock_times_out_naming_its_holder() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.lock");
        let _held = lock_file(&path, Duration::ZERO).unwrap();
        let failure = lock_file(&path, Duration::from_millis(50)).unwrap_err();
        let LockFailure::Timeout { holder, .. } = &failure else {
            panic!("{failure}");
        };
        assert_eq!(*holder, Some(std::process::id()));
        assert!(
            failure
                .to_string()
                .contains(&format!("held by process {}", std::process::id())),
            "{failure}"
        );
    }

    /// A pending file is invisible until persisted, gone when dropped, named so that a lock's
    /// owner can find it, and readable by others like a plain file (not a temp file's 0600).
    #[test]
    fn a_pending_file_appears_whole_or_not_at_all() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("sub/entry.cubin");
        let mut pending = PendingFile::new(&target).unwrap();
        pending.write_all(b"bytes").unwrap();
        let name = pending
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let prefix = format!(".entry.cubin.{}.", std::process::id());
        assert!(
            name.starts_with(&prefix) && name.ends_with(".tmp"),
            "{name}"
        );
        assert!(!target.exists());
        pending.persist().unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"bytes");
        let plain = dir.path().join("plain");
        File::create(&plain).unwrap();
        let mode = |path: &Path| fs::metadata(path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&target), mode(&plain));

        drop(PendingFile::new(&dir.path().join("dropped")).unwrap());
        let linked = dir.path().join("linked");
        PendingFile::linked(&target, &linked)
            .unwrap()
            .persist()
            .unwrap();
        assert_eq!(fs::read(&linked).unwrap(), b"bytes");
        let mut left: Vec<_> = fs::read_dir(dir.path().join("sub"))
            .unwrap()
            .chain(fs::read_dir(dir.path()).unwrap())
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["entry.cubin", "linked", "plain", "sub"]);
    }

    #[test]
    fn the_cache_dir_follows_the_environment() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(key, _)| *key == name)
                    .map(|(_, value)| OsString::from(value))
            }
        };
        assert_eq!(
            cache_dir_from(
                env(&[("KWHEEL_ARTIFACT_CACHE", "/a"), ("HOME", "/h")]),
                ARTIFACT_CACHE_ENV,
                "artifacts"
            ),
            PathBuf::from("/a")
        );
        assert_eq!(
            cache_dir_from(
                env(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")]),
                ARTIFACT_CACHE_ENV,
                "artifacts"
            ),
            PathBuf::from("/x/kwheel/artifacts")
        );
        assert_eq!(
            cache_dir_from(
                env(&[("XDG_CACHE_HOME", ""), ("HOME", "/h")]),
                ARTIFACT_CACHE_ENV,
                "artifacts"
            ),
            PathBuf::from("/h/.cache/kwheel/artifacts")
        );
        assert_eq!(
            cache_dir_from(env(&[("HOME", "h")]), ARTIFACT_CACHE_ENV, "artifacts"),
            PathBuf::from(UNWRITABLE_CACHE_HOME).join("kwheel/artifacts")
        );
    }

    /// The cache home is an absolute `XDG_CACHE_HOME`, else an absolute `HOME`'s `.cache`,
    /// else none: never a relative or temp folder.
    #[test]
    fn the_cache_home_is_absolute_or_none() {
        let home = |pairs: &[(&str, &str)]| {
            cache_home_from(|name| {
                pairs
                    .iter()
                    .find(|(key, _)| *key == name)
                    .map(|(_, value)| OsString::from(value))
            })
            .ok()
        };
        let some = |path: &str| Some(PathBuf::from(path));
        assert_eq!(
            home(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")]),
            some("/x")
        );
        assert_eq!(
            home(&[("XDG_CACHE_HOME", "x"), ("HOME", "/h")]),
            some("/h/.cache")
        );
        assert_eq!(
            home(&[("XDG_CACHE_HOME", ""), ("HOME", "/h")]),
            some("/h/.cache")
        );
        assert_eq!(home(&[("XDG_CACHE_HOME", "x"), ("HOME", "h")]), None);
        assert_eq!(home(&[("HOME", "")]), None);
        assert_eq!(home(&[]), None);
        // Every write under the fallback fails, naming it.
        let failure =
            write_atomically(&Path::new(UNWRITABLE_CACHE_HOME).join("kwheel/x"), b"").unwrap_err();
        assert_eq!(
            failure.kind(),
            std::io::ErrorKind::NotADirectory,
            "{failure}"
        );
    }

    #[test]
    fn a_damaged_cache_entry_reads_as_absent_and_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ArtifactCache::new(dir.path());
        let bytes = b"cubin bytes".to_vec();
        let stored = StoredFile {
            digest: sha256_hex(&bytes),
            size: bytes.len() as u64,
            path: String::new(),
            stored_size: 0,
            dictionary: None,
        };
        let path = cache.write(&stored.digest, &bytes).unwrap();
        assert_eq!(cache.read(&stored), Some(bytes));
        std::fs::write(&path, b"cubin bytez").unwrap();
        assert!(cache.contains(&stored));
        assert_eq!(cache.read(&stored), None);
        assert!(!path.exists());
    }
}
