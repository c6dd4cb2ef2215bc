//! The shared build cache: a server that many build machines read and write, speaking the
//! bazel-remote HTTP protocol (bazel-remote itself, or any WebDAV/HTTP server that accepts
//! `PUT`, such as nginx).
//!
//! ```text
//! kernel key K ─► GET <cache>/ac/K   404: miss, compile
//!                   │  {"outputFiles":[{"path":"<kernel>/<build>/<arch>.cubin",
//!                   │                   "digest":{"hash":D,"sizeBytes":"S"}}]}
//!                   └─► GET <cache>/cas/D   sha256 = D and size = S ─► validate ─► local cache
//!
//! after a compile:    PUT <cache>/cas/D  (the cubin, keyed by its sha256)
//!                     PUT <cache>/ac/K   (the entry above, written last)
//! ```
//!
//! The action-cache entry is the JSON form of the Remote Execution API's `ActionResult`,
//! which bazel-remote validates and stores (`Content-Type: application/json`) and a plain
//! WebDAV server stores as it is. It is not content-addressed, so nothing in it is trusted:
//! the cubin it points to is verified against the digest, then checked to be the key's
//! ([`prebuilt::cubin::identity`]: the kernel's entries, the target's SM and kind, the
//! toolkit release and assembler version the key's compiler record names) before it is used.
//! A cubin that fails is refused, counted as a miss (and as refused), reported, and compiled
//! here; only cubins that pass count as hits. The cubin's key
//! is the same one a release publishes under (`prebuilt::fetch`), so a store can be both.
//!
//! The remote cache only ever saves time. A miss, a 404, a server error, a timeout or a bad
//! entry means "compile it here"; an upload that fails (5xx, 507 when the server is full, no
//! answer) is skipped with a warning. After [`MAX_FAILURES`] failures in a row, reads (or
//! uploads) are turned off for the rest of the build, so an unreachable server costs seconds,
//! not a timeout per kernel. Nothing is written to the local cache before it is verified.
//!
//! The server comes from `--remote-cache <url>`, else `KWHEEL_REMOTE_CACHE`, else the
//! `[remote-cache]` table of `${XDG_CONFIG_HOME:-~/.config}/kwheel/config.toml`:
//!
//! ```toml
//! [remote-cache]
//! url = "https://cache.example.com"
//! upload = false        # read only (say, for pull requests); default true
//! ```
//!
//! The bearer token, if the server wants one, is `KWHEEL_STORE_TOKEN`.

use prebuilt::untrusted::Unreadable;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use prebuilt::error_chain;
use prebuilt::fetch::{FetchError, Store, StoreOptions};
use serde::{Deserialize, Serialize};

use crate::error::Error;

/// Names the remote cache when `--remote-cache` does not.
pub const REMOTE_CACHE_ENV: &str = "KWHEEL_REMOTE_CACHE";
/// Failures in a row after which reads (or uploads) stop for the rest of the build.
pub const MAX_FAILURES: u32 = 3;

/// Which server to use, and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteCacheOptions {
    /// The server's base URL.
    pub url: String,
    /// Upload what this build compiles (`false`: read only).
    pub upload: bool,
    /// Timeouts, retries and the token.
    pub store: StoreOptions,
}

impl RemoteCacheOptions {
    /// Options for `url` with uploads on, a short timeout and one retry: the remote cache
    /// must never make a build slower than compiling.
    pub fn new(url: impl Into<String>) -> RemoteCacheOptions {
        RemoteCacheOptions {
            url: url.into(),
            upload: true,
            store: StoreOptions {
                connect_timeout: Duration::from_secs(5),
                timeout: Duration::from_secs(30),
                attempts: 2,
                backoff: Duration::from_millis(200),
                ..StoreOptions::default()
            },
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct ConfigFile {
    #[serde(default)]
    remote_cache: Option<ConfigRemoteCache>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct ConfigRemoteCache {
    url: String,
    #[serde(default = "yes")]
    upload: bool,
}

fn yes() -> bool {
    true
}

/// `${XDG_CONFIG_HOME:-~/.config}/kwheel/config.toml`.
pub fn default_config_file() -> PathBuf {
    let config = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|dir| !dir.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".config")))
        .unwrap_or_else(|| PathBuf::from(".config"));
    config.join("kwheel").join("config.toml")
}

/// The remote cache to use: `flag` (`--remote-cache`), else `KWHEEL_REMOTE_CACHE`, else the
/// config file (`config`, or [`default_config_file`]); `None` when none names one.
pub fn resolve_remote_cache(
    flag: Option<&str>,
    config: Option<&Path>,
) -> Result<Option<RemoteCacheOptions>, Error> {
    if let Some(url) = flag.filter(|url| !url.trim().is_empty()) {
        return Ok(Some(RemoteCacheOptions::new(url)));
    }
    if let Ok(url) = std::env::var(REMOTE_CACHE_ENV) {
        if !url.trim().is_empty() {
            return Ok(Some(RemoteCacheOptions::new(url)));
        }
    }
    let path = config.map_or_else(default_config_file, Path::to_path_buf);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound && config.is_none() => {
            return Ok(None)
        }
        Err(source) => return Err(Error::Read(Unreadable { path, source })),
    };
    let file: ConfigFile = toml::from_str(&text).map_err(|error| Error::Config {
        path: path.clone(),
        message: error.message().to_owned(),
    })?;
    Ok(file.remote_cache.map(|table| RemoteCacheOptions {
        upload: table.upload,
        ..RemoteCacheOptions::new(table.url)
    }))
}

/// The action-cache entry: an `ActionResult` with the cubin as its one output file.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ActionResult {
    #[serde(default)]
    output_files: Vec<OutputFile>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct OutputFile {
    path: String,
    digest: Digest,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Digest {
    hash: String,
    /// An int64, which the protobuf JSON mapping writes as a string.
    #[serde(deserialize_with = "size_from_string_or_number")]
    size_bytes: u64,
}

fn size_from_string_or_number<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<u64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Size {
        Text(String),
        Number(u64),
    }
    match Size::deserialize(deserializer)? {
        Size::Number(size) => Ok(size),
        Size::Text(text) => text.parse().map_err(serde::de::Error::custom),
    }
}

impl Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut digest = serializer.serialize_struct("Digest", 2)?;
        digest.serialize_field("hash", &self.hash)?;
        digest.serialize_field("sizeBytes", &self.size_bytes.to_string())?;
        digest.end()
    }
}

/// The cubin an action-cache entry names: its digest and recorded size; `None` when the
/// entry is not an `ActionResult` (protobuf JSON) whose first output file has a sha256. The
/// size is a claim, which the download caps.
pub fn parse_action_result(entry: &[u8]) -> Option<(prebuilt::untrusted::Digest, u64)> {
    let result: ActionResult = serde_json::from_slice(entry).ok()?;
    let file = result.output_files.into_iter().next()?;
    let digest = prebuilt::untrusted::Digest::parse(&file.digest.hash).ok()?;
    Some((digest, file.digest.size_bytes))
}

/// What the remote cache did in one build.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RemoteStats {
    /// Cubins served by the remote cache (verified, and the key's).
    pub hits: usize,
    /// Keys it did not have (or could not serve, or served with a cubin that is not the key's).
    pub misses: usize,
    /// Of the misses, cubins refused as not the key's (another kernel's, target's, toolkit's).
    pub refused: usize,
    /// Cubins uploaded.
    pub uploads: usize,
    /// Uploads skipped after a failure, or because uploads were off.
    pub skipped_uploads: usize,
    /// Warnings printed.
    pub warnings: usize,
}

impl std::fmt::Display for RemoteStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} hits, {} misses ({} refused), {} uploaded, {} uploads skipped, {} warnings",
            self.hits, self.misses, self.refused, self.uploads, self.skipped_uploads, self.warnings
        )
    }
}

/// A remote build cache for one build: the client and its failure counters.
#[derive(Debug)]
pub struct RemoteCache {
    store: Store,
    upload: bool,
    read_failures: AtomicU32,
    upload_failures: AtomicU32,
    reads_off: AtomicBool,
    uploads_off: AtomicBool,
    hits: AtomicUsize,
    misses: AtomicUsize,
    refused: AtomicUsize,
    uploads: AtomicUsize,
    skipped_uploads: AtomicUsize,
    warnings: AtomicUsize,
}

impl RemoteCache {
    /// A client for the server `options` names.
    pub fn new(options: &RemoteCacheOptions) -> Result<RemoteCache, Error> {
        let store = Store::new(&options.url, options.store.clone()).map_err(Box::new)?;
        Ok(RemoteCache {
            store,
            upload: options.upload,
            read_failures: AtomicU32::new(0),
            upload_failures: AtomicU32::new(0),
            reads_off: AtomicBool::new(false),
            uploads_off: AtomicBool::new(false),
            hits: AtomicUsize::new(0),
            misses: AtomicUsize::new(0),
            refused: AtomicUsize::new(0),
            uploads: AtomicUsize::new(0),
            skipped_uploads: AtomicUsize::new(0),
            warnings: AtomicUsize::new(0),
        })
    }

    /// The server's base URL.
    pub fn url(&self) -> &str {
        self.store.url()
    }

    /// What happened so far.
    pub fn stats(&self) -> RemoteStats {
        RemoteStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            uploads: self.uploads.load(Ordering::Relaxed),
            skipped_uploads: self.skipped_uploads.load(Ordering::Relaxed),
            warnings: self.warnings.load(Ordering::Relaxed),
        }
    }

    fn warn(&self, message: &str) {
        self.warnings.fetch_add(1, Ordering::Relaxed);
        tracing::warn!("warning: remote cache {}: {message}", self.url());
    }

    /// The cubin stored under `key`, verified against the digest its entry names and accepted
    /// by `check` (which says why not otherwise), with what `check` made of it; `None` on a
    /// miss, a refusal or any failure (with a warning). Only an accepted cubin is a hit. `what`
    /// names the kernel and target.
    pub fn get<T>(
        &self,
        key: &str,
        what: &str,
        check: impl FnOnce(&[u8]) -> Result<T, String>,
    ) -> Option<(Vec<u8>, T)> {
        let Some(cubin) = self.fetch(key, what) else {
            self.misses.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        match check(&cubin) {
            Ok(checked) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                Some((cubin, checked))
            }
            Err(reason) => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                self.refused.fetch_add(1, Ordering::Relaxed);
                self.warn(&format!(
                    "refused the cubin it serves for {what} (key {key}): {reason}; compiling it \
                     here"
                ));
                None
            }
        }
    }

    /// A file stored beside a cubin under `key` (the symbols of its name expressions), verified
    /// against its digest; not a cubin, so neither a hit nor a miss.
    pub fn get_file(&self, key: &str, what: &str) -> Option<Vec<u8>> {
        self.fetch(key, what)
    }

    /// The bytes under `key`, verified against their digest.
    fn fetch(&self, key: &str, what: &str) -> Option<Vec<u8>> {
        if self.reads_off.load(Ordering::Relaxed) {
            return None;
        }
        match self.try_get(key, what) {
            Ok(Some(cubin)) => {
                self.read_failures.store(0, Ordering::Relaxed);
                Some(cubin)
            }
            Ok(None) => {
                self.read_failures.store(0, Ordering::Relaxed);
                None
            }
            Err(error) => {
                let unreachable = matches!(
                    error,
                    FetchError::Transport { .. } | FetchError::Status { .. }
                );
                self.warn(&format!("{}; compiling it here", error_chain(&error)));
                if unreachable
                    && self.read_failures.fetch_add(1, Ordering::Relaxed) + 1 >= MAX_FAILURES
                    && !self.reads_off.swap(true, Ordering::Relaxed)
                {
                    self.warn(&format!(
                        "{MAX_FAILURES} failures in a row: not read again in this build"
                    ));
                }
                None
            }
        }
    }

    fn try_get(&self, key: &str, what: &str) -> Result<Option<Vec<u8>>, FetchError> {
        let Some(entry) = self.store.get_ac(key, what)? else {
            return Ok(None);
        };
        let Some((digest, size)) = parse_action_result(&entry) else {
            self.warn(&format!(
                "the entry of {what} at {} is not an action result naming a cubin; compiling \
                 it here",
                self.store.ac_url(key)
            ));
            return Ok(None);
        };
        // `get_cas` refuses a size over the artifact cap before asking for anything.
        self.store.get_cas(digest.as_str(), Some(size), what)
    }

    /// Uploads `cubin` under `key`: the cubin to the CAS, then the entry. Failures are
    /// warnings; `path` names the output (`<kernel>/<build>/<arch>.cubin`).
    pub fn put(&self, key: &str, cubin: &[u8], path: &str, what: &str) {
        if !self.upload || self.uploads_off.load(Ordering::Relaxed) {
            self.skipped_uploads.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let digest = prebuilt::key::sha256_hex(cubin);
        let entry = ActionResult {
            output_files: vec![OutputFile {
                path: path.to_owned(),
                digest: Digest {
                    hash: digest.clone(),
                    size_bytes: cubin.len() as u64,
                },
            }],
        };
        let entry = serde_json::to_vec(&entry).expect("an action result serializes");
        let uploaded = self
            .store
            .put_cas(&digest, cubin, what)
            .and_then(|()| self.store.put_ac(key, &entry, what));
        match uploaded {
            Ok(()) => {
                self.upload_failures.store(0, Ordering::Relaxed);
                self.uploads.fetch_add(1, Ordering::Relaxed);
            }
            Err(error) => {
                self.skipped_uploads.fetch_add(1, Ordering::Relaxed);
                self.warn(&format!("upload skipped: {}", error_chain(&error)));
                // A full server, or one refusing our credentials, will not change its mind
                // during this build.
                let give_up = matches!(
                    error,
                    FetchError::Status {
                        status: 401 | 403 | 405 | 507,
                        ..
                    }
                ) || self.upload_failures.fetch_add(1, Ordering::Relaxed) + 1
                    >= MAX_FAILURES;
                if give_up && !self.uploads_off.swap(true, Ordering::Relaxed) {
                    self.warn("no more uploads in this build");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_action_results_in_protobuf_json() {
        let entry = ActionResult {
            output_files: vec![OutputFile {
                path: "swiglu/cu130/sm_90a.cubin".into(),
                digest: Digest {
                    hash: "ab".repeat(32),
                    size_bytes: 1234,
                },
            }],
        };
        let text = serde_json::to_string(&entry).unwrap();
        assert_eq!(
            text,
            format!(
                r#"{{"outputFiles":[{{"path":"swiglu/cu130/sm_90a.cubin","digest":{{"hash":"{}","sizeBytes":"1234"}}}}]}}"#,
                "ab".repeat(32)
            )
        );
        // bazel-remote may answer with more fields and a number for the size.
        let answer = format!(
            r#"{{"outputFiles":[{{"path":"x","digest":{{"hash":"{}","sizeBytes":99}},"isExecutable":false}}],"exitCode":0}}"#,
            "cd".repeat(32)
        );
        let parsed: ActionResult = serde_json::from_str(&answer).unwrap();
        assert_eq!(parsed.output_files[0].digest.size_bytes, 99);
    }

    /// A loopback server whose action-cache entry claims a 1.5 GiB cubin; it counts the CAS
    /// requests it gets.
    #[test]
    fn an_entry_claiming_more_than_the_artifact_cap_is_not_downloaded() {
        use std::io::{BufRead as _, BufReader, Write as _};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let cas_requests = std::sync::Arc::new(AtomicUsize::new(0));
        let counter = cas_requests.clone();
        let entry = format!(
            r#"{{"outputFiles":[{{"path":"x","digest":{{"hash":"{}","sizeBytes":"1610612736"}}}}]}}"#,
            "ab".repeat(32)
        );
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let mut request = String::new();
                let _ = BufReader::new(&stream).read_line(&mut request);
                let body = if request.contains("/cas/") {
                    counter.fetch_add(1, Ordering::Relaxed);
                    String::new()
                } else {
                    entry.clone()
                };
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        let cache = RemoteCache::new(&RemoteCacheOptions {
            url,
            upload: false,
            store: StoreOptions {
                attempts: 1,
                ..StoreOptions::default()
            },
        })
        .unwrap();
        assert_eq!(
            cache.get(&"cd".repeat(32), "`k` (cu130/sm_90a)", |_| Ok(())),
            None
        );
        assert_eq!(cache.stats().warnings, 1);
        assert_eq!(cas_requests.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn the_config_file_names_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        std::fs::write(
            &path,
            "[remote-cache]\nurl = \"https://cache.example.com\"\nupload = false\n",
        )
        .unwrap();
        // The flag wins over the file.
        let flag = resolve_remote_cache(Some("http://127.0.0.1:1"), Some(&path))
            .unwrap()
            .unwrap();
        assert_eq!(flag.url, "http://127.0.0.1:1");
        if std::env::var_os(REMOTE_CACHE_ENV).is_none() {
            let file = resolve_remote_cache(None, Some(&path)).unwrap().unwrap();
            assert_eq!(file.url, "https://cache.example.com");
            assert!(!file.upload);
            std::fs::write(&path, "[remote-cache]\nurl = 1\n").unwrap();
            let error = resolve_remote_cache(None, Some(&path)).unwrap_err();
            assert!(error.to_string().contains("config.toml"), "{error}");
        }
    }
}
