//! The local build cache: validated cubins by kernel key.
//!
//! ```text
//! <cache dir>/                       default: ${XDG_CACHE_HOME:-~/.cache}/kwheel/build
//! └── kernels-v1/                    bump the suffix when the entry format changes
//!     └── 3f/                        first two hex digits of the key
//!         └── 3f9c…a2.cubin          the cubin, exactly as the compiler produced it
//! ```
//!
//! An entry appears only once complete: it is written to a temporary file in its shard
//! directory and renamed into place, so a killed build leaves at worst an unnamed temporary
//! file, never a torn entry. Entries are validated again when read, so a damaged entry is
//! recompiled rather than bundled.
//!
//! A cache may also have a [`RemoteCache`] behind it, shared by many machines: asked when
//! the local cache misses, told about every cubin compiled (see [`crate::remote`]).

use prebuilt::untrusted::Unreadable;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::Error;
use crate::remote::RemoteCache;

/// Name of the versioned layout directory.
pub const LAYOUT: &str = "kernels-v1";

/// The default cache directory: `${XDG_CACHE_HOME:-~/.cache}/kwheel/build`.
pub fn default_cache_dir() -> PathBuf {
    prebuilt::cache::cache_home_or_unwritable()
        .join("kwheel")
        .join("build")
}

/// A content-addressed store of cubins by key.
#[derive(Clone, Debug)]
pub struct BuildCache {
    root: PathBuf,
    remote: Option<Arc<RemoteCache>>,
}

impl BuildCache {
    /// The cache rooted at `dir` (created on first write).
    pub fn new(dir: impl Into<PathBuf>) -> BuildCache {
        BuildCache {
            root: dir.into().join(LAYOUT),
            remote: None,
        }
    }

    /// This cache with `remote` behind it.
    pub fn with_remote(self, remote: Arc<RemoteCache>) -> BuildCache {
        BuildCache {
            remote: Some(remote),
            ..self
        }
    }

    /// The remote cache behind this one, if any.
    pub fn remote(&self) -> Option<&RemoteCache> {
        self.remote.as_deref()
    }

    /// The remote cache's cubin for `key`, verified against its digest and accepted by `check`
    /// (the caller's test that it is the key's cubin, see [`RemoteCache::get`]), with what
    /// `check` made of it; `None` without a remote cache, on a miss, on a refusal, or on any
    /// failure, which is a warning and never an error. The caller then [`BuildCache::put`]s it.
    pub fn get_remote<T>(
        &self,
        key: &str,
        what: &str,
        check: impl FnOnce(&[u8]) -> Result<T, String>,
    ) -> Option<(Vec<u8>, T)> {
        self.remote.as_ref()?.get(key, what, check)
    }

    /// A file the remote cache keeps beside a cubin (see [`RemoteCache::get_file`]).
    pub fn get_remote_file(&self, key: &str, what: &str) -> Option<Vec<u8>> {
        self.remote.as_ref()?.get_file(key, what)
    }

    /// Shares a compiled cubin with the remote cache, if any; `path` names the output
    /// (`<kernel>/<build>/<arch>.cubin`). A failed upload is a warning.
    pub fn put_remote(&self, key: &str, cubin: &[u8], path: &str, what: &str) {
        if let Some(remote) = &self.remote {
            remote.put(key, cubin, path, what);
        }
    }

    /// Where the entry for `key` lives.
    pub fn entry_path(&self, key: &str) -> PathBuf {
        self.root.join(&key[..2]).join(format!("{key}.cubin"))
    }

    /// Where the extension module with `key` lives: beside the cubins, as `<key>.so`.
    pub fn module_path(&self, key: &str) -> PathBuf {
        self.root.join(&key[..2]).join(format!("{key}.so"))
    }

    /// The cached cubin for `key`, if there is one.
    pub fn get(&self, key: &str) -> Result<Option<Vec<u8>>, Error> {
        let path = self.entry_path(key);
        match std::fs::read(&path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(Error::Read(Unreadable { path, source })),
        }
    }

    /// Stores `cubin` under `key`, atomically.
    pub fn put(&self, key: &str, cubin: &[u8]) -> Result<(), Error> {
        write_atomically(&self.entry_path(key), cubin)
    }

    /// Removes the entry for `key` (a damaged entry found on read).
    pub fn remove(&self, key: &str) -> Result<(), Error> {
        let path = self.entry_path(key);
        match std::fs::remove_file(&path) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(Error::Write {
                path,
                source: error,
            }),
            _ => Ok(()),
        }
    }
}

/// [`prebuilt::cache::write_atomically`], its failure naming `path`.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    prebuilt::cache::write_atomically(path, bytes).map_err(|source| Error::Write {
        path: path.to_owned(),
        source,
    })
}
